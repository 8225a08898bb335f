"""The supervisor daemon on the local platform, with real torchrun agents and gloo.

Every test runs `supervisor launch` as a subprocess on the example job, injects a real fault
(SIGKILL, SIGSTOP, a skipped collective, a hang, a killed node, a crash mid-save, a flipped
bit) and checks what the supervisor observed, decided and did (events.jsonl), and that the
resumed loss path matches an uninterrupted control.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest

from conftest import kill_tree, losses_by_step, read_log, run_job
from supervisor.protocol import Heartbeat, derive_keys, encode

pytestmark = pytest.mark.slow
STEPS = 30
JOB = ["--steps", str(STEPS), "--checkpoint-every", "5", "--step-sleep", "0.05"]


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """The uninterrupted control: the same job under plain torchrun, 2 ranks."""
    tmp = tmp_path_factory.mktemp("control")
    run_job(tmp, 2, [*JOB, "--log-dir", str(tmp / "log")])
    return {r["step"]: r for r in read_log(tmp / "log", 0)}


SLOW_JOB = [*JOB[:-1], "0.15"]


def wait_for_checkpoint(run, step: int, timeout: float = 90) -> None:
    from supervisor.checkpoint import latest_complete

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = latest_complete(run.ckpt).checkpoint
        if found is not None and found.step >= step:
            return
        assert run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of step {step}")


def wait_for_steps(run, n: int, timeout: float = 60) -> None:
    """Rank 0 has logged ``n`` steps (whatever the supervisor is doing meanwhile)."""
    deadline = time.monotonic() + timeout
    # "running" is the ranks' first heartbeats: the script may not have opened its log yet
    while len(run.rank_log(0) if (run.log_dir / "ranks" / "rank-0.jsonl").exists() else []) < n:
        assert time.monotonic() < deadline, f"rank 0 logged {len(run.rank_log(0))} steps, not {n}"
        time.sleep(0.05)


def final_losses(run) -> dict[int, dict]:
    return losses_by_step(run.rank_log(0))


def assert_same_path(run, control, exact=True):
    got = final_losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, rec in control.items():
        if exact:
            assert got[step]["loss_hex"] == rec["loss_hex"], step
        else:
            assert math.isclose(got[step]["loss"], rec["loss"], rel_tol=1e-4), step


def test_kill_9_a_rank_mid_step(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=kill,rank=1,step=13,attempt=0")
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["attempt"] == 0 and fault["nodes"] == ["node1"] and fault["kind"] == "rank_killed"
    # named from the rank's own end (torchrun's agent exits 1 whatever happened); the step from
    # the rank's own log, not from a sampled heartbeat
    assert fault["detail"] == "rank 1 killed by signal 9 (SIGKILL) at step 13" and fault["ranks"] == [1]
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["restore_from"] == "step-0000000010" and relaunch["world_size"] == 2
    done = run.wait_event("restart_complete")
    assert set(done["phases"]) == {"detect", "teardown", "schedule", "rendezvous", "restore", "first_step"}
    assert done["within_budget"]
    assert run.events("job_finished")[-1]["phase"] == "completed"
    assert_same_path(run, control)


def test_sigstop_a_rank_is_detected_named_killed_and_resumed(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=stop,rank=1,step=13,attempt=0")
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "dead" and fault["ranks"] == [1] and fault["rung"] == 2
    assert fault["detection_s"] <= 3 + 1.0, fault  # heartbeat timeout + 1 s
    assert run.wait_event("action", action="kill_node")["node"] == "node1"
    evidence = json.loads(open(run.wait_event("evidence_saved")["path"]).read())
    # the stopped rank cannot answer the stack-dump request: only rank 0 is waited for
    assert (evidence["asked"], evidence["awaited"], evidence["answered"]) == ([0, 1], [0], [0]), evidence
    assert_same_path(run, control)


def test_skip_collective_names_the_culprit_not_the_waiters(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=skip-collective,rank=1,step=13,attempt=0")
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "collective_hang" and fault["ranks"] == [1], fault
    assert "rank 1 never entered it" in fault["detail"] and "ranks 0 wait in allreduce" in fault["detail"]
    assert run.wait_event("action", action="abort_ranks")["ranks"] == [1]
    evidence = json.loads(open(run.wait_event("evidence_saved")["path"]).read())
    assert evidence["ranks"]["0"]["heartbeat"]["coll_inside"] is True
    # both ranks run (the culprit idles outside the collective): both were waited for, both answered
    assert (evidence["awaited"], evidence["answered"]) == ([0, 1], [0, 1]), evidence
    stacks = (run.log_dir / "ranks" / "stacks-rank-1.txt").read_text()
    assert "abort ordered by the supervisor" in stacks  # its stacks were kept before it died
    assert_same_path(run, control)


def test_hang_in_compute_with_heartbeats_alive(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=hang,rank=0,step=13,attempt=0")
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "hang" and fault["ranks"] == [0], fault
    assert "phase compute" in fault["detail"] or "in phase compute" in fault["detail"]
    assert_same_path(run, control)


def test_kill_a_node_relaunches_smaller_from_last_checkpoint(supervisor_run, control):
    run = supervisor_run(SLOW_JOB, slots=2, nnodes="1:2")
    wait_for_checkpoint(run, 10)
    state = json.loads((run.log_dir / "supervisor-state.json").read_text())
    kill_tree(state["platform"]["nodes"]["node1"]["pid"])  # the whole node: the agent and its ranks
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "node_lost" and fault["nodes"] == ["node1"]
    assert run.wait_event("nodes_excluded")["nodes"] == ["node1"]
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["nodes"] == ["node0"] and relaunch["world_size"] == 1
    resumed = [r for r in run.rank_log(0) if r["attempt"] == 1]
    assert resumed[0]["step"] == int(relaunch["restore_from"].split("-")[1]) + 1 and resumed[0]["world_size"] == 1
    assert_same_path(run, control, exact=False)


def test_kill_a_node_uses_a_spare(supervisor_run, control):
    run = supervisor_run(SLOW_JOB, slots=3, nnodes="1:2")
    wait_for_checkpoint(run, 10)
    state = json.loads((run.log_dir / "supervisor-state.json").read_text())
    kill_tree(state["platform"]["nodes"]["node1"]["pid"])
    assert run.wait() == 0, run.output()[-3000:]
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["nodes"] == ["node0", "node2"] and relaunch["world_size"] == 2
    assert_same_path(run, control)


def test_crash_mid_save_resumes_from_previous(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=crash-in-save,rank=1,step=10,attempt=0")
    assert run.wait() == 0, run.output()[-3000:]
    assert run.wait_event("launched", attempt=1)["restore_from"] == "step-0000000005"
    assert_same_path(run, control)


def test_corrupt_newest_checkpoint_falls_back_to_previous_good(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=hang,rank=1,step=23,attempt=0")
    wait_for_checkpoint(run, 20)
    ckpt = run.ckpt / "step-0000000020"
    shard = max(ckpt.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    assert run.wait() == 0, run.output()[-3000:]
    assert run.wait_event("launched", attempt=1)["restore_from"] == "step-0000000020"  # fast-verified pick
    resumed = [r for r in run.rank_log(0) if r["attempt"] == 1]
    assert resumed[0]["step"] == 16  # the workers' full verification fell back to step 15
    node_log = (run.log_dir / "attempt-1" / "node0.log").read_text()
    assert "preferred_checkpoint" in node_log or "checkpoint_skipped name=step-0000000020" in node_log
    assert_same_path(run, control)


def test_fault_on_every_attempt_stops_with_the_progress_guard(supervisor_run):
    run = supervisor_run(["--steps", "50", "--checkpoint-every", "100"], fault="kind=crash,rank=0,step=3")
    assert run.wait() == 3, run.output()[-3000:]
    finished = run.events("job_finished")[-1]
    assert finished["phase"] == "stopped_no_progress" and "without a new complete checkpoint" in finished["reason"]
    assert len(run.events("launched")) == 3


def test_kill_9_the_supervisor_then_a_new_one_adopts_the_gang(supervisor_run, control):
    job = [*JOB[:-1], "0.15"]
    run = supervisor_run(job)
    run.wait_event("running")
    wait_for_steps(run, 1)
    pids_before = json.loads((run.log_dir / "supervisor-state.json").read_text())["platform"]["nodes"]
    os.kill(run.proc.pid, signal.SIGKILL)  # only the supervisor: the agents are in their own sessions
    run.proc.wait()
    wait_for_steps(run, len(run.rank_log(0)) + 1)  # training goes on without its supervisor
    run.start()  # the same command again
    adopted = run.wait_event("adopted")
    assert adopted["attempt"] == 0
    assert run.wait() == 0, run.output()[-3000:]
    assert [e["attempt"] for e in run.events("launched")] == [0]  # nothing relaunched
    state = json.loads((run.log_dir / "supervisor-state.json").read_text())
    assert state["platform"]["nodes"] == pids_before and state["phase"] == "completed"
    got = final_losses(run)
    assert all(got[s]["loss_hex"] == control[s]["loss_hex"] for s in control)


def test_bad_heartbeats_are_rejected_counted_and_harmless(supervisor_run, control):
    run = supervisor_run(JOB)
    run.wait_event("running")
    state = json.loads((run.log_dir / "supervisor-state.json").read_text())
    port, http = state["intake_port"], state["http_port"]
    key = derive_keys((run.log_dir / "token").read_bytes()).heartbeat
    good = Heartbeat(job="local", attempt=0, rank=0, world_size=2, seq=10**9, step=10**6, phase="compute", phase_s=0,
                     launch=state["launch_id"])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for frame in (b"garbage", encode(good.to_payload(), b"wrong-token"), b"SV2" + os.urandom(9000),
                  encode(good.to_payload() | {"attempt": 7}, key), encode(good.to_payload() | {"rank": 5}, key)):
        s.sendto(frame, ("127.0.0.1", port))
    time.sleep(1.0)
    st = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=5).read())
    rej = st["rejected_heartbeats"]
    assert rej.get("malformed") == 1 and rej.get("unauthenticated") == 1 and rej.get("oversized") == 1
    assert rej.get("stale_attempt") == 1 and rej.get("schema") == 1
    assert all(r["step"] < 10**6 for r in st["ranks"])
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"http://127.0.0.1:{http}/v1/restore-point?attempt=0", timeout=5)
    assert exc.value.code == 401
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5).read().decode()
    assert 'supervisor_heartbeats_rejected_total{job="local",reason="unauthenticated"} 1.0' in metrics
    assert run.wait() == 0
    assert run.events("fault_detected") == []
    assert_same_path(run, control)


def test_drill_command_compares_loss_paths(tmp_path):
    import subprocess
    import sys

    from conftest import TRAIN, job_env

    out = tmp_path / "drill"
    cmd = [sys.executable, "-m", "supervisor", "drill", "--nnodes", "2", "--out", str(out),
           "--fault", "kind=kill,rank=1,step=8,attempt=0", "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
           "--", sys.executable, str(TRAIN), "--steps", "15", "--checkpoint-every", "5"]
    proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "drill PASSED" in proc.stdout
    row = proc.stdout.split("MISSING")[1].split()
    assert row[:4] == ["15", "15", "15", "15"]  # every step compared and bit-identical
    assert "fault (attempt 0): rank_killed ranks [1]" in proc.stdout and "FIRST_STEP" in proc.stdout
    bad = subprocess.run(cmd[:-4] + ["--checkpoint-dir", "x"], env=job_env(tmp_path), capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert bad.returncode == 2 and "leave --checkpoint-dir" in bad.stderr


def test_agents_stand_by_once_the_gang_runs_and_the_next_relaunch_takes_them(supervisor_run):
    # a relaunch finds agents that imported torch while the job trained, not ones it starts then
    from supervisor.controller.daemon import STANDBY_AFTER_S

    run = supervisor_run(["--steps", "100000", "--checkpoint-every", "20", "--step-sleep", "0.05"], slots=3)
    standby = run.wait_event("agents_standing_by", attempt=0, timeout=STANDBY_AFTER_S + 90)
    launched = run.events("launched")
    assert len(standby["pids"]) == 3 and len(launched) == 1  # one per slot (a spare's too), no relaunch yet
    wait_for_checkpoint(run, 20)
    state = json.loads((run.log_dir / "supervisor-state.json").read_text())
    (victim,) = state["platform"]["nodes"]["node1"]["ranks"]  # its one rank process
    os.kill(int(victim), signal.SIGKILL)
    run.wait_event("running", attempt=1)
    nodes = json.loads((run.log_dir / "supervisor-state.json").read_text())["platform"]["nodes"]
    assert {info["attempt"] for info in nodes.values()} == {1}
    assert {info["pid"] for info in nodes.values()} <= set(standby["pids"]), (nodes, standby)
    run.wait_event("restart_complete", attempt=1)  # and they train: the first resumed step was taken
