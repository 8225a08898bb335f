"""Never lose progress: real `supervisor launch` runs of the example job (real torchrun, gloo)
in which a good checkpoint used to be called suspect, forgotten, deleted or ignored.

Each test injects the fault for real and checks what the supervisor decided (events.jsonl),
what the ranks really did (their step logs) and what is left on disk.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, TRAIN, job_env, kill_tree

pytestmark = pytest.mark.slow
C10, C15 = "step-0000000010", "step-0000000015"


def wait_for_checkpoint(run, name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run.ckpt / name / "manifest.json").exists():
            return
        assert run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint {name}")


def flip_a_bit(ckpt_dir) -> None:
    shard = max(ckpt_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))


def test_a_crash_one_step_after_a_good_restore_never_sends_the_job_back_to_step_0(supervisor_run):
    # fires in every attempt: each resumed attempt restores step 10, takes step 11, dies at 12
    run = supervisor_run(["--steps", "40", "--checkpoint-every", "10", "--step-sleep", "0.05"],
                         fault="kind=crash,rank=1,step=12", extra=["--max-restarts", "2"])
    assert run.wait() == 4, run.output()[-3000:]
    relaunches = [e for e in run.events("launched") if e["attempt"] > 0]
    assert len(relaunches) == 2
    assert all(e["restore_from"] == C10 and e["require_checkpoint"] for e in relaunches), relaunches
    assert run.events("checkpoint_suspect") == []  # twice restored, and a step each time: not suspect
    restored = run.events("checkpoint_restored")
    assert [e["name"] for e in restored if e["attempt"] > 0] == [C10] * 2
    # what the ranks really did: no attempt after the first trained from random weights
    resumed = [r for r in run.rank_log(0) if r["attempt"] > 0]
    assert resumed and min(r["step"] for r in resumed) == 11
    finished = run.events("job_finished")[-1]
    assert finished["phase"] == "stopped_max_restarts"
    # each restart got to its first step (step 11): its restore and first step are timed by the
    # ranks' own clocks, not rounded to a heartbeat sample (first step used to read 0.00)
    done = run.events("restart_complete")
    assert len(done) == 2 and all(0 < e["phases"]["first_step"] < 5 and e["phases"]["restore"] > 0 for e in done)


def test_a_rerun_after_a_finished_run_starts_a_new_history(supervisor_run):
    limit = ["--max-restarts", "1"]
    failing = supervisor_run(["--steps", "20", "--checkpoint-every", "100"], fault="kind=crash,rank=0,step=3",
                             extra=limit)
    assert failing.wait() == 4, failing.output()[-3000:]
    assert failing.events("job_finished")[-1]["phase"] == "stopped_max_restarts"
    # the same log directory, a one-off fault: the old run's restart and no-progress counts must
    # not stop it (they did: the new run inherited them and stopped at its first fault)
    rerun = supervisor_run(["--steps", "20", "--checkpoint-every", "100"], fault="kind=crash,rank=0,step=3,attempt=0",
                           extra=limit)
    assert rerun.wait() == 0, rerun.output()[-3000:]
    started = rerun.events("run_started")[-1]
    assert started["run"] == 2 and started["previous_run"]["phase"] == "stopped_max_restarts"
    assert "nothing" in started["inherited"]
    archived = rerun.log_dir / os.path.basename(started["previous_run"]["state"])
    assert json.loads(archived.read_text())["phase"] == "stopped_max_restarts"  # kept for the post-mortem
    # the old run's node output is kept apart, not appended to (its failures are not this run's)
    assert list(rerun.log_dir.glob("attempt-0.before-*/node0.log"))
    mine = [e for e in rerun.events() if e.get("run") == 2]
    assert [e["attempt"] for e in mine if e["event"] == "launched"] == [0, 1]
    assert mine[-1]["event"] == "job_finished" and mine[-1]["phase"] == "completed"


def test_the_supervisor_judges_progress_where_the_ranks_save(supervisor_run, tmp_path):
    own = tmp_path / "myckpt"  # given to the script only: the supervisor was told its default
    run = supervisor_run(["--steps", "25", "--checkpoint-every", "5", "--step-sleep", "0.05",
                          "--checkpoint-dir", str(own)], fault="kind=kill,rank=1,step=13,attempt=0")
    assert run.wait() == 0, run.output()[-3000:]
    adopted = run.wait_event("checkpoint_root_adopted")
    assert adopted["root"] == str(own.resolve()) and adopted["watched"] == str(run.ckpt.resolve())
    assert run.wait_event("launched", attempt=1)["restore_from"] == C10
    assert {e["name"] for e in run.events("checkpoint_complete")} >= {C10}
    assert not list(run.ckpt.glob("step-*"))  # nothing was ever saved where it was told to look


def test_a_corrupt_newest_checkpoint_is_named_made_suspect_and_the_good_one_kept(supervisor_run):
    run = supervisor_run(["--steps", "19", "--checkpoint-every", "5", "--keep", "2", "--step-sleep", "0.05"],
                         fault="kind=hang,rank=1,step=17,attempt=0")
    wait_for_checkpoint(run, C15)
    flip_a_bit(run.ckpt / C15)
    assert run.wait() == 0, run.output()[-3000:]
    assert run.wait_event("launched", attempt=1)["restore_from"] == C15  # sizes are fine: fast verification
    restored = run.wait_event("checkpoint_restored", attempt=1)
    assert restored["name"] == C10 and restored["announced"] == C15
    assert "checksum" in restored["refused"][C15]
    suspect = run.wait_event("checkpoint_suspect", name=C15)
    assert "refused" in suspect["detail"]
    assert [r["step"] for r in run.rank_log(0) if r["attempt"] == 1][0] == 11
    # the job's own pruning (keep 2) counted the corrupt step 15 as good and deleted step 10
    left = sorted(p.name for p in run.ckpt.iterdir() if p.name.startswith("step-"))
    assert C10 in left and C15 in left, left  # the good one, and the corrupt one as evidence
    status = subprocess.run([PYTHON, "-m", "supervisor", "status", "--log-dir", str(run.log_dir)],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "phase completed" in status.stdout and "exit code 0" in status.stdout
    assert f"suspect checkpoint: {C15}" in status.stdout and "last checkpoint: step-0000000015-1" in status.stdout


def test_one_job_one_controller_and_a_taken_http_port_is_replaced(supervisor_run, tmp_path):
    run = supervisor_run(["--steps", "60", "--checkpoint-every", "10", "--step-sleep", "0.15"])
    run.wait_event("running")
    second = subprocess.run(run.cmd, env=run.env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert second.returncode == 2
    assert f"another supervisor (pid {run.proc.pid}" in second.stderr and "supervisor status" in second.stderr
    # kill -9 the controller; hold its HTTP port; the next one adopts and serves elsewhere
    port = json.loads((run.log_dir / "supervisor-state.json").read_text())["http_port"]
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        run.start()
        run.wait_event("adopted")
        changed = run.wait_event("http_port_changed")
        assert changed["old"] == port
        assert run.wait() == 0, run.output()[-3000:]
    finally:
        squatter.close()
    assert [e["attempt"] for e in run.events("launched")] == [0]  # the gang was adopted, not relaunched
    assert run.events("fault_detected") == []


def test_an_unreadable_state_is_refused_until_fresh_and_fresh_leaves_no_stray(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "supervisor-state.json").write_text('{"job": "local", "phase": "running", "attem')  # torn write
    stray = subprocess.Popen(["sleep", "300"], env={"SUPERVISOR_LOG_DIR": str(log_dir / "ranks")},
                             start_new_session=True)
    cmd = [PYTHON, "-m", "supervisor", "launch", "--nnodes", "1", "--log-dir", str(log_dir),
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-linger", "0", "--heartbeat-interval", "0.5",
           "--heartbeat-timeout", "3", "--", PYTHON, str(TRAIN), "--steps", "5"]
    try:
        refused = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert "unreadable" in refused.stderr and "--fresh" in refused.stderr
        assert stray.poll() is None  # nothing was touched without --fresh
        fresh = subprocess.run(cmd[:4] + ["--fresh"] + cmd[4:], env=job_env(tmp_path), capture_output=True, text=True,
                               timeout=180, cwd=tmp_path)
        assert fresh.returncode == 0, fresh.stderr[-3000:]
        assert stray.wait(timeout=10) == -signal.SIGKILL  # the old gang's leftover was stopped first
        assert list(log_dir.glob("supervisor-state.unreadable-*.json"))
        assert json.loads((log_dir / "supervisor-state.json").read_text())["phase"] == "completed"
    finally:
        kill_tree(stray.pid)


def test_a_drill_whose_fault_never_fires_fails(tmp_path):
    out = tmp_path / "drill"
    cmd = [sys.executable, "-m", "supervisor", "drill", "--nnodes", "1", "--out", str(out),
           "--fault", "kind=kill,rank=0,step=999", "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
           "--", sys.executable, str(TRAIN), "--steps", "6", "--checkpoint-every", "3"]
    proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the fault never fired" in proc.stdout and "drill PASSED" not in proc.stdout


# ------------------------------------------------------------------ verdicts (issue: a verdict you can trust)
def test_a_nan_stop_is_never_completion_it_restarts_from_the_last_checkpoint(supervisor_run):
    job = ["--steps", "20", "--checkpoint-every", "4", "--step-sleep", "0.02"]
    once = supervisor_run(job, fault="kind=nan,rank=0,step=9,attempt=0")
    assert once.wait() == 0, once.output()[-3000:]
    fault = once.wait_event("fault_detected")
    assert fault["kind"] == "nonfinite" and fault["detail"] == "rank 0: non-finite loss at step 9", fault
    assert once.wait_event("launched", attempt=1)["restore_from"] == "step-0000000008"
    finished = once.events("job_finished")
    assert len(finished) == 1 and finished[0]["phase"] == "completed"
    assert sorted({r["step"] for r in once.rank_log(0)}) == list(range(1, 21))  # it did finish its work


def test_a_nan_at_the_same_step_after_a_restart_stops_in_its_own_state(supervisor_run):
    # the same NaN in every attempt: transient once, then a named stop (exit 7), not a loop
    again = supervisor_run(["--steps", "20", "--checkpoint-every", "4", "--step-sleep", "0.02"],
                           fault="kind=nan,rank=0,step=9")
    assert again.wait() == 7, again.output()[-3000:]
    end = again.events("job_finished")[-1]
    assert end["phase"] == "stopped_nonfinite" and "step 9 again" in end["reason"]
    assert [e["attempt"] for e in again.events("launched")] == [0, 1]


def test_a_job_that_cannot_start_stops_at_once_with_the_ranks_own_error(tmp_path):
    cmd = [PYTHON, "-m", "supervisor", "launch", "--nnodes", "2", "--log-dir", str(tmp_path / "logs"),
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-linger", "0", "--heartbeat-interval", "0.5",
           "--heartbeat-timeout", "3", "--", PYTHON, "-c", "import torch_but_misspelled"]
    proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 8, proc.stderr[-3000:]
    events = [json.loads(x) for x in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    faults = [e for e in events if e["event"] == "fault_detected"]
    assert faults and "ModuleNotFoundError: No module named 'torch_but_misspelled'" in faults[0]["detail"]
    assert faults[0]["kind"] == "rank_error"
    end = events[-1]
    assert end["event"] == "job_finished" and end["phase"] == "stopped_startup_failure"
    assert "torch_but_misspelled" in end["reason"] and "before its first step" in end["reason"]
    assert len([e for e in events if e["event"] == "launched"]) == 2  # not the whole restart budget
    # each line says whose it is: a node's log holds its own rank's lines only. The first rank to die
    # ends the attempt, and torchrun copies a rank's output to its node's log ~0.1 s late: a node
    # torn down sooner has its log name the rank's own file, which holds the traceback.
    attempt = tmp_path / "logs" / "attempt-0"
    logs = [(attempt / f"node{n}.log").read_text() for n in (0, 1)]
    prefixed = [{r for r in (0, 1) if f"[rank{r}]:" in log} for log in logs]
    assert all(len(ranks) <= 1 for ranks in prefixed) and (prefixed[0] != prefixed[1] or not prefixed[0]), prefixed
    for log in logs:
        copied = any(line.startswith("[rank") and "torch_but_misspelled" in line for line in log.splitlines())
        named = [attempt / name for line in log.splitlines() if line.startswith("supervisor: ")
                 for name in line.split(": ")[-1].split(", ")]
        assert copied or any("torch_but_misspelled" in p.read_text() for p in named), log[-2000:]


@pytest.mark.parametrize("fault, slots, resized", [
    ("kind=node-kill,rank=1,step=8,attempt=0", 2, True),     # no spare: the job continues smaller
    ("kind=node-stop,rank=1,step=8,attempt=0", 3, False),    # a frozen node, a spare takes its place
])
def test_drill_node_faults_with_and_without_a_spare(tmp_path, fault, slots, resized):
    out = tmp_path / "drill"
    cmd = [sys.executable, "-m", "supervisor", "drill", "--nnodes", "1:2", "--slots", str(slots), "--out", str(out),
           "--fault", fault, "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
           "--", sys.executable, str(TRAIN), "--steps", "14", "--checkpoint-every", "5", "--step-sleep", "0.05"]
    proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "drill PASSED" in proc.stdout
    events = [json.loads(x) for x in (out / "drill" / "logs" / "events.jsonl").read_text().splitlines()]
    fault_ev = next(e for e in events if e["event"] == "fault_detected")
    assert fault_ev["nodes"] == ["node1"], fault_ev
    relaunch = next(e for e in events if e["event"] == "launched" and e["attempt"] == 1)
    assert relaunch["world_size"] == (1 if resized else 2)
    assert ("compared within relative tolerance" in proc.stdout) == resized


def test_the_command_returns_when_the_job_ends_unless_a_scraper_was_seen(tmp_path):
    import urllib.request

    def launch(name: str, scrape: bool) -> list[dict]:
        log_dir = tmp_path / name
        cmd = [PYTHON, "-m", "supervisor", "launch", "--nnodes", "1", "--log-dir", str(log_dir), "--checkpoint-dir",
               str(tmp_path / f"{name}-ckpt"), "--metrics-linger", "2", "--heartbeat-interval", "0.5",
               "--heartbeat-timeout", "3", "--", PYTHON, str(TRAIN), "--steps", "30", "--step-sleep", "0.1"]
        proc = subprocess.Popen(cmd, env=job_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=tmp_path)
        if scrape:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    port = json.loads((log_dir / "supervisor-state.json").read_text())["http_port"]
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                    break
                except (OSError, ValueError, KeyError):
                    time.sleep(0.2)
        assert proc.wait(timeout=180) == 0
        return [json.loads(x)["event"] for x in (log_dir / "events.jsonl").read_text().splitlines()]

    assert "metrics_linger" not in launch("quiet", scrape=False)  # nobody scraped: no wait
    assert "metrics_linger" in launch("scraped", scrape=True)


def test_a_controller_whose_job_was_taken_over_stops_without_touching_the_gang(supervisor_run):
    run = supervisor_run(["--steps", "400", "--checkpoint-every", "50", "--step-sleep", "0.1"])
    run.wait_event("running")
    owner = run.log_dir / "supervisor.owner.json"
    record = json.loads(owner.read_text())
    # what a controller on another host does when it takes over a lease it found stale
    owner.write_text(json.dumps(record | {"owner": "someone-else", "host": "login-7", "renewed": time.time()}))
    assert run.wait(timeout=60) == 2
    lost = run.wait_event("job_lease_lost")
    assert "login-7" in lost["detail"] or "someone-else" in lost["detail"]
    assert run.events("job_finished") == [] and run.events("fault_detected") == []
    steps = len(run.rank_log(0))
    deadline = time.monotonic() + 30
    while len(run.rank_log(0)) <= steps and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(run.rank_log(0)) > steps, "the gang must go on, for its new owner"
    assert json.loads((run.log_dir / "supervisor-state.json").read_text())["phase"] == "running"


STOPS_EARLY = """
import sys
from supervisor.worker import Worker
w = Worker.from_env().start()
with w.step(1):
    pass
w.stop_requested = True  # what the SDK's SIGTERM handler does (a preemption notice to the ranks)
w.close()                # the rank's last word: stopped before its training finished
sys.exit(0)              # and the script exits 0, as a hand-written loop may
"""


def test_a_gang_that_exits_0_after_stopping_early_is_restarted_not_waited_for_forever(tmp_path):
    script = tmp_path / "stops_early.py"
    script.write_text(STOPS_EARLY)
    cmd = [PYTHON, "-m", "supervisor", "launch", "--nnodes", "1", "--log-dir", str(tmp_path / "logs"),
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--max-restarts", "1", "--metrics-linger", "0",
           "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3", "--", PYTHON, str(script)]
    proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr[-3000:]  # stopped_max_restarts, not a hang and never "completed"
    events = [json.loads(x) for x in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    faults = [e for e in events if e["event"] == "fault_detected"]
    assert [f["kind"] for f in faults] == ["stopped_early", "stopped_early"]
    assert "stopped before its training finished: stop requested (SIGTERM)" in faults[0]["detail"]
    assert not [e for e in events if e["event"] == "job_finished" and e["phase"] == "completed"]


def test_fresh_over_a_live_run_stops_its_gang_first(supervisor_run):
    from supervisor.procfs import pid_alive

    run = supervisor_run(["--steps", "400", "--checkpoint-every", "50", "--step-sleep", "0.1"])
    run.wait_event("running")
    old = json.loads((run.log_dir / "supervisor-state.json").read_text())["platform"]["nodes"]
    os.kill(run.proc.pid, signal.SIGKILL)  # the controller dies; its gang trains on
    run.proc.wait()
    assert all(pid_alive(n["pid"]) for n in old.values())
    run.cmd = run.cmd[:4] + ["--fresh"] + run.cmd[4:]
    run.start()
    started = run.wait_event("run_started", run=2)
    # on this machine its processes are found by their environment; elsewhere (Slurm steps on
    # other nodes) the platform adopts and tears down what the old state names
    assert run.events("strays_killed") or run.events("old_gang_stopped")
    assert started["fresh"] is True and started["previous_run"]["phase"] == "running"
    run.wait_event("launched", run=2)
    assert not any(pid_alive(n["pid"]) for n in old.values())  # nothing of the old gang trains beside the new


def test_a_script_that_saves_without_ever_restoring_is_watched_where_it_saves(tmp_path):
    """Issue 13 §3: the root used to come with the restore report only, so a script that saves
    through the SDK but never restores left the supervisor watching a directory nobody writes."""
    own, logs = tmp_path / "own", tmp_path / "logs"
    workload = os.path.join(os.path.dirname(__file__), "workloads", "save_only.py")
    cmd = [PYTHON, "-m", "supervisor", "launch", "--nnodes", "1", "--checkpoint-dir", str(tmp_path / "told"),
           "--log-dir", str(logs), "--heartbeat-interval", "0.5", "--metrics-linger", "0",
           "--", PYTHON, workload, str(own), "8"]
    done = subprocess.run(cmd, env=job_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    events = [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]
    adopted = [e for e in events if e["event"] == "checkpoint_root_adopted"]
    assert adopted and adopted[0]["root"] == str(own.resolve()), events
    assert not [e for e in events if e["event"] in ("restore_failed", "checkpoint_restored")]  # it never restored
    assert [e for e in events if e["event"] == "checkpoint_complete"]  # progress judged where it saves
