"""Each drill produces the failure it claims, with real torchrun agents and gloo.

Without a supervisor the SDK writes each rank's heartbeat to LOG_DIR/heartbeat-rank-R.json,
which is what these tests observe (the supervisor reads the same fields over UDP).
"""

from __future__ import annotations

import socket
import time

import pytest

from conftest import read_heartbeat, read_log, run_job
from supervisor.checkpoint import latest_complete
from supervisor.protocol import control_message, decode_heartbeat, derive_keys, encode, new_launch_id

pytestmark = pytest.mark.slow
FAST_HB = {"SUPERVISOR_HEARTBEAT_INTERVAL": "0.2"}


def args(tmp, *extra):
    return ["--steps", "200", "--log-dir", str(tmp / "log"), "--step-sleep", "0.02", *extra]


def hb(tmp, rank):
    return read_heartbeat(tmp / "log", rank)


def test_skip_collective_leaves_peers_blocked_inside_the_allreduce(tmp_path, background_job):
    job = background_job(2, args(tmp_path), fault="kind=skip-collective,rank=1,step=3", env=FAST_HB)

    def stuck():
        a, b = hb(tmp_path, 0), hb(tmp_path, 1)
        if a and b and a["phase"] == "collective" and a["phase_s"] > 1.0 and b["step"] == 3:
            return a, b
        return None

    peer, culprit = job.wait_for(stuck, what="rank 0 blocked in a collective")
    assert peer["coll_inside"] and peer["coll_op"] == "allreduce" and peer["step"] == 3
    assert not culprit["coll_inside"] and culprit["phase"] == "data"
    assert culprit["coll_seq"] == peer["coll_seq"] - 1  # the one it never entered
    # it stays that way: the peer's heartbeat keeps flowing while it waits
    time.sleep(1.0)
    later = hb(tmp_path, 0)
    assert later["seq"] > peer["seq"] and later["coll_seq"] == peer["coll_seq"] and later["phase"] == "collective"


def test_stop_silences_the_heartbeats(tmp_path, background_job):
    job = background_job(2, args(tmp_path), fault="kind=stop,rank=1,step=3", env=FAST_HB)
    job.wait_for(lambda: (h := hb(tmp_path, 0)) and h["phase"] == "collective" and h["phase_s"] > 1.0,
                 what="the peer to block")
    stopped = hb(tmp_path, 1)
    time.sleep(1.5)
    assert hb(tmp_path, 1)["seq"] == stopped["seq"], "a stopped rank must go silent"
    assert time.time() - hb(tmp_path, 1)["time"] > 1.0
    assert hb(tmp_path, 0)["seq"] > 0 and time.time() - hb(tmp_path, 0)["time"] < 1.0


def test_hang_keeps_heartbeats_with_the_phase_stuck_and_the_watchdog_dumps_stacks(tmp_path, background_job):
    env = FAST_HB | {"SUPERVISOR_WATCHDOG": "compute=1.5,collective=1.5"}
    job = background_job(2, args(tmp_path), fault="kind=hang,rank=1,step=3", env=env)
    first = job.wait_for(lambda: (h := hb(tmp_path, 1)) and h["step"] == 3 and h["phase"] == "compute" and h, what="hang")
    culprit = job.wait_for(lambda: (h := hb(tmp_path, 1)) and h["watchdog"] and h, what="the watchdog to fire")
    assert culprit["seq"] > first["seq"] and culprit["phase"] == "compute" and culprit["phase_s"] > 1.5
    assert "compute running" in culprit["watchdog"]
    stacks = (tmp_path / "log" / "stacks-rank-1.txt").read_text()
    assert "watchdog: compute running" in stacks and "fault_point" in stacks and "supervisor-heartbeat" not in stacks.split("watchdog")[0]
    peer = job.wait_for(lambda: (h := hb(tmp_path, 0)) and h["watchdog"] and h, what="the peer's watchdog")
    assert "allreduce" in peer["watchdog"] and peer["coll_seq"] == culprit["coll_seq"] + 1
    assert (tmp_path / "log" / "stacks-rank-0.txt").exists()


def test_abort_order_kills_the_rank_after_dumping_its_stacks(tmp_path, background_job):
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(30)
    token = b"job-token"
    keys, launch = derive_keys(token), new_launch_id()
    env = FAST_HB | {"SUPERVISOR_HEARTBEAT_ADDR": f"127.0.0.1:{srv.getsockname()[1]}",
                     "SUPERVISOR_TOKEN": token.decode(), "SUPERVISOR_ATTEMPT": "4", "SUPERVISOR_LAUNCH": launch}
    job = background_job(2, args(tmp_path), fault="kind=hang,rank=1,step=3", env=env)
    addr = None
    while True:
        frame, src = srv.recvfrom(8192)
        h = decode_heartbeat(frame, keys.heartbeat)  # authenticated with the heartbeat key of the job's token
        assert h.attempt == 4 and h.launch == launch
        if h.rank == 1 and h.step == 3 and h.phase == "compute":
            addr, pid = src, h.pid
            break
    srv.sendto(encode(control_message("abort", launch=launch, attempt=3, rank=1, reason="stale attempt"),
                      keys.control), addr)
    srv.sendto(encode(control_message("abort", launch=launch, attempt=4, rank=1, reason="forged"), b"wrong"), addr)
    srv.sendto(encode(control_message("abort", launch=new_launch_id(), attempt=4, rank=1, reason="another launch"),
                      keys.control), addr)
    time.sleep(1.0)
    assert job.proc.poll() is None, "an abort for another attempt or launch, or with a bad MAC, must be ignored"
    srv.sendto(encode(control_message("abort", launch=launch, attempt=4, rank=1, reason="hang in compute"),
                      keys.control), addr)
    job.proc.wait(timeout=60)
    out = job.output()
    assert "Signal 9 (SIGKILL)" in out or "exitcode  : -9" in out, out[-3000:]
    stacks = (tmp_path / "log" / "stacks-rank-1.txt").read_text()
    assert "abort ordered by the supervisor: hang in compute" in stacks and "fault_point" in stacks
    srv.close()


def test_crash_exits_nonzero(tmp_path):
    proc = run_job(tmp_path, 2, args(tmp_path), fault="kind=crash,rank=0,step=2", expect_ok=False)
    assert "exitcode  : 17" in proc.stderr
    assert max(r["step"] for r in read_log(tmp_path / "log", 0)) == 1


def test_slow_rank_is_a_straggler(tmp_path):
    run_job(tmp_path, 2, ["--steps", "8", "--log-dir", str(tmp_path / "log")], fault="kind=slow,rank=1,step=3,ms=300")
    slow = [r for r in read_log(tmp_path / "log", 1) if r["step"] >= 3]
    fast = [r for r in read_log(tmp_path / "log", 0) if r["step"] >= 3]
    assert all(r["compute_s"] >= 0.3 for r in slow)
    assert all(r["compute_s"] < 0.3 for r in fast)
    assert sum(r["collective_s"] for r in fast) > sum(r["collective_s"] for r in slow)  # it waited for the straggler


def test_nan_stops_before_the_optimizer_step(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = run_job(tmp_path, 2, ["--steps", "10", "--log-dir", str(tmp_path / "log"), "--checkpoint-dir", str(ckpt),
                                 "--checkpoint-every", "1"], fault="kind=nan,rank=1,step=4", expect_ok=False)
    assert "exitcode  : 18" in proc.stderr and "non-finite loss at step 4" in proc.stderr
    for rank in (0, 1):
        assert max(r["step"] for r in read_log(tmp_path / "log", rank)) == 3
        last = hb(tmp_path, rank)
        # every rank stopped early and says so; only the rank whose own loss was NaN is named
        assert last["outcome"] == "stopped" and last["error"] == "non-finite loss at step 4"
        assert last["loss_ok"] is (rank != 1)
    assert latest_complete(ckpt, "full").checkpoint.step == 3


def test_sigterm_saves_an_emergency_checkpoint_and_resume_matches(tmp_path, background_job):
    ckpt = tmp_path / "ckpt"
    common = ["--steps", "30", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "100"]
    job = background_job(2, [*common, "--log-dir", str(tmp_path / "log"), "--step-sleep", "0.1"])
    job.wait_for(lambda: (tmp_path / "log" / "rank-0.jsonl").exists() and len(read_log(tmp_path / "log", 0)) >= 5,
                 what="five steps")
    import os
    import signal

    os.kill(job.proc.pid, signal.SIGTERM)  # the torchrun agent forwards it to the workers
    job.proc.wait(timeout=60)
    found = latest_complete(ckpt, "full").checkpoint
    assert found is not None, job.output()[-3000:]
    assert "emergency_checkpoint" in job.output()
    saved = found.step
    assert saved == max(r["step"] for r in read_log(tmp_path / "log", 0))
    run_job(tmp_path, 2, [*common, "--log-dir", str(tmp_path / "log")])
    control = tmp_path / "control"
    run_job(control, 2, ["--steps", "30", "--log-dir", str(control / "log")])
    c = {r["step"]: r["loss_hex"] for r in read_log(control / "log", 0)}
    r = {x["step"]: x["loss_hex"] for x in read_log(tmp_path / "log", 0)}
    assert r == c
