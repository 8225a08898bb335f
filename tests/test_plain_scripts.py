"""Training scripts that never import ``supervisor``, under ``supervisor launch`` (issue 26).

tests/workloads/plain_train.py is torch only: DDP or FSDP2 on gloo, optionally its own
``torch.save`` resume. The supervisor watches it through the instrumentation it installs in
every rank (torch's optimizer step hook and flight recorder). Faults are real: SIGSTOP and
SIGKILL of a rank's process from outside, and from inside the script a rank that raises or that
skips a step's collectives (its peers wait inside the all-reduce). Each job is then found, named,
restarted and completed, with the loss path of the same script run uninterrupted under torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, losses_by_step, read_log, run_job

pytestmark = pytest.mark.slow
PLAIN = Path(__file__).parent / "workloads" / "plain_train.py"
STEPS = 40


def plain_args(out: Path, *extra: str, steps: int = STEPS) -> list[str]:
    return ["--steps", str(steps), "--out", str(out), *extra]


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """The same script, uninterrupted, under plain torchrun: 2 ranks."""
    tmp = tmp_path_factory.mktemp("plain-control")
    run_job(tmp, 2, plain_args(tmp / "out"), script=PLAIN)
    return losses_by_step(read_log(tmp / "out", 0))


def start(supervisor_run, tmp_path: Path, *extra: str, env: dict | None = None, launch: list | None = None,
          steps: int = STEPS):
    run = supervisor_run(plain_args(tmp_path / "out", *extra, steps=steps), script=PLAIN, env=env, extra=launch)
    run.plain_out = tmp_path / "out"
    return run


def rank_pid(run, rank: int, at_least_step: int, timeout: float = 60) -> int:
    """The pid of ``rank`` once it has logged ``at_least_step`` (from the script's own log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            records = read_log(run.plain_out, rank)
        except (OSError, ValueError):
            records = []
        if records and records[-1]["step"] >= at_least_step:
            return records[-1]["pid"]
        assert run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never logged step {at_least_step}")


def assert_completed_like(run, control) -> None:
    assert run.wait() == 0, run.output()[-3000:]
    assert run.events("job_finished")[-1]["phase"] == "completed"
    got = losses_by_step(read_log(run.plain_out, 0))
    assert sorted(got) == list(range(1, STEPS + 1))
    assert {s: r["loss_hex"] for s, r in got.items()} == {s: r["loss_hex"] for s, r in control.items()}


def evidence(run) -> dict:
    return json.loads(Path(run.wait_event("evidence_saved")["path"]).read_text())


QUIET_PEERS = ["--hang-timeout-floor", "10"]
"""For the tests of a stopped rank's silence: its peers wait for it in a collective, and with the hang
floor at the heartbeat timeout (3 s) the two detectors race on a loaded host (both name the stopped
rank, as dead or as the culprit of a collective hang)."""


def test_a_sigstopped_rank_is_found_in_time_named_with_stacks_and_a_trace(supervisor_run, tmp_path, control):
    run = start(supervisor_run, tmp_path, launch=QUIET_PEERS)
    started = run.wait_event("running")
    assert started["reported_by"] == {"torch": 2}, started  # no SDK: the instrumentation reports
    os.kill(rank_pid(run, 1, 8), signal.SIGSTOP)
    fault = run.wait_event("fault_detected")
    assert (fault["kind"], fault["ranks"]) == ("dead", [1]) and fault["reported_by"] == {"torch": [1]}, fault
    assert fault["detection_s"] <= 3 + 1.0, fault  # heartbeat timeout + 1 s
    ev = evidence(run)
    assert (ev["asked"], ev["awaited"], ev["answered"]) == ([0, 1], [0], [0]), ev
    assert ev["stack_files"] and "stack dump requested" in Path(ev["stack_files"][0]).read_text()
    trace = json.loads(Path(ev["trace_files"][0]).read_text())  # rank 0's flight recorder, waiting on rank 1
    assert trace["pg_status"]["0"]["last_enqueued_collective"] > trace["pg_status"]["0"]["last_completed_collective"]
    assert ev["ranks"]["0"]["heartbeat"]["coll_inside"] is True
    assert_completed_like(run, control)
    # what torch was told in every rank: the recorder on, and NCCL's dump and fail-on-timeout variables
    told = json.loads((run.plain_out / "env-rank-1.json").read_text())
    assert told["TORCH_FR_BUFFER_SIZE"] == "2000" and told["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert told["TORCH_FR_DUMP_TEMP_FILE"] == str(run.log_dir / "ranks" / "nccl-trace-rank-")
    assert told["TORCH_NCCL_ASYNC_ERROR_HANDLING"] in ("1", "3")  # torchrun's agent sets 1 itself: tear down


def test_a_rank_that_skips_an_all_reduce_is_the_culprit_not_the_waiters(supervisor_run, tmp_path, control):
    run = start(supervisor_run, tmp_path, env={"PLAIN_FAULT": "skip@12:1", "PLAIN_FAULT_ONCE": str(tmp_path / "once")})
    fault = run.wait_event("fault_detected")
    assert (fault["kind"], fault["ranks"]) == ("collective_hang", [1]), fault
    assert "rank 1 never entered it" in fault["detail"] and "ranks 0 wait in gloo:all_reduce" in fault["detail"]
    assert run.wait_event("action", action="abort_ranks")["ranks"] == [1]
    ev = evidence(run)
    assert (ev["awaited"], ev["answered"]) == ([0, 1], [0, 1]), ev  # the culprit idles: it answers too
    assert len(ev["trace_files"]) == 2
    assert_completed_like(run, control)


def test_a_killed_rank_and_a_raising_rank_are_named(supervisor_run, tmp_path, control):
    run = start(supervisor_run, tmp_path, env={"PLAIN_FAULT": "raise@25:0", "PLAIN_FAULT_ONCE": str(tmp_path / "once")})
    os.kill(rank_pid(run, 1, 8), signal.SIGKILL)
    killed = run.wait_event("fault_detected")
    assert (killed["kind"], killed["ranks"]) == ("rank_killed", [1]), killed
    assert killed["detail"].startswith("rank 1 killed by signal 9 (SIGKILL)")
    raised = run.wait_event("fault_detected", attempt=1)
    assert raised["ranks"] == [0] and "RuntimeError: injected failure at step 25" in raised["detail"], raised
    assert_completed_like(run, control)


def test_an_fsdp2_script_with_a_stopped_rank(supervisor_run, tmp_path, tmp_path_factory):
    ctl = tmp_path_factory.mktemp("fsdp-control")
    run_job(ctl, 2, plain_args(ctl / "out", "--mode", "fsdp"), script=PLAIN)
    run = start(supervisor_run, tmp_path, "--mode", "fsdp", launch=QUIET_PEERS)
    os.kill(rank_pid(run, 0, 8), signal.SIGSTOP)
    fault = run.wait_event("fault_detected")
    assert (fault["kind"], fault["ranks"]) == ("dead", [0]) and fault["detection_s"] <= 4.0, fault
    ev = evidence(run)
    # FSDP2's all-gathers and reduce-scatters are numbered by the recorder like DDP's all-reduces
    assert ev["ranks"]["1"]["heartbeat"]["coll_groups"] and ev["trace_files"], ev
    assert_completed_like(run, losses_by_step(read_log(ctl / "out", 0)))


def test_a_script_with_its_own_resume_resumes_itself(supervisor_run, tmp_path, control):
    run = start(supervisor_run, tmp_path, "--save-dir", str(tmp_path / "own"), "--save-every", "5")
    os.kill(rank_pid(run, 1, 17), signal.SIGKILL)
    assert run.wait_event("fault_detected")["kind"] == "rank_killed"
    assert_completed_like(run, control)
    # the relaunch ran the script's own resume: its first step after the restart is past 1
    steps = [r["step"] for r in read_log(run.plain_out, 0)]
    restart_at = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    assert steps[restart_at] > 1 and (steps[restart_at] - 1) % 5 == 0, steps
    # its goodput is what can be seen without the SDK: the restart is measured; its own saves
    # and the steps its resume went back over are not (not said to be nothing either: absent)
    out = subprocess.run([PYTHON, "-m", "supervisor", "report", "--log-dir", str(run.log_dir), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    total = json.loads(out.stdout)["total"]
    assert total["faults"] == 1 and total["restarts"] == 1 and total["badput_s"]["restart"] > 0
    assert total["wasted_steps"] == 0 and total["badput_s"]["save_stall"] == 0 and 0 < total["ettr"] < 1


def test_instrumentation_off_runs_the_script_as_torchrun_would(supervisor_run, tmp_path):
    run = start(supervisor_run, tmp_path, steps=5, launch=["--no-instrument"])
    assert run.wait() == 0, run.output()[-3000:]
    assert run.wait_event("no_heartbeats")
    told = json.loads((run.plain_out / "env-rank-0.json").read_text())
    assert set(told) <= {"TORCH_NCCL_ASYNC_ERROR_HANDLING"}, told  # only torchrun's own: nothing of ours


def test_ranks_started_as_new_interpreters_are_instrumented_too(supervisor_run, tmp_path, control):
    # --no-fork-ranks: each rank is a new interpreter; the boot sitecustomize on its PYTHONPATH installs
    run = start(supervisor_run, tmp_path, env={"PLAIN_FAULT": "skip@12:0", "PLAIN_FAULT_ONCE": str(tmp_path / "once")},
                launch=["--no-fork-ranks"])
    assert run.wait_event("running")["reported_by"] == {"torch": 2}
    fault = run.wait_event("fault_detected")
    assert (fault["kind"], fault["ranks"]) == ("collective_hang", [0]) and "rank 0 never entered it" in fault["detail"]
    assert_completed_like(run, control)
