"""The controller's state file and job lock (supervisor.controller.state), on real files and a
real second process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import record_durability
from supervisor.controller.decide import History
from supervisor.controller.state import JobLock, StateError, archive, load, save

GOOD = {"job": "j", "phase": "running", "attempt": 2, "nodes": ["node0"], "restore_from": "step-0000000010",
        "history": {"restarts": 2, "suspects": ["step-0000000020"], "suspect_why": {"step-0000000020": "x"},
                    "no_step_after": {"step-0000000010": 1}, "had_checkpoint": True},
        "intake_port": 5000, "http_port": 5001, "platform": {"nodes": {}}, "pid": 1, "updated": 1.5}


def test_save_then_load_round_trips_with_a_typed_history(tmp_path):
    path = tmp_path / "supervisor-state.json"
    save(path, GOOD | {"history": History(restarts=1, excluded=["node1"])})
    got = load(path)
    assert isinstance(got["history"], History) and got["history"].excluded == ("node1",)
    assert got["attempt"] == 2 and list(tmp_path.iterdir()) == [path]  # no temporary left behind
    save(path, GOOD)
    assert load(path)["history"].no_step_after == {"step-0000000010": 1}
    assert load(tmp_path / "missing.json") is None


@pytest.mark.parametrize("text, says", [
    ('{"job": "j", "phase": "running", "att', "unreadable"),  # a torn write
    ("", "unreadable"),
    (json.dumps(GOOD | {"attempt": "2"}), "attempt"),
    (json.dumps(GOOD | {"phase": "dancing"}), "phase"),
    (json.dumps(GOOD | {"from_the_future": 1}), "from_the_future: unknown field"),
    (json.dumps(GOOD | {"history": {"restarts": 1, "hats": []}}), "history.hats"),
    (json.dumps(GOOD | {"history": {"suspects": "step-1"}}), "history.suspects"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "job"}), "job: missing"),
    (json.dumps(GOOD | {"capacity_since": float("inf")}), "capacity_since: inf is not a finite number"),
    (json.dumps(GOOD | {"capacity_since": "yesterday"}), "capacity_since: 'yesterday' is not a number"),
    (json.dumps(GOOD | {"capacity_since": 1.7e9, "capacity_message": "x" * 5000}), "capacity_message: longer than"),
])
def test_a_state_that_cannot_be_used_is_refused_with_the_way_out(tmp_path, text, says):
    path = tmp_path / "supervisor-state.json"
    path.write_text(text)
    with pytest.raises(StateError) as exc:
        load(path)
    assert says in str(exc.value) and "--fresh" in str(exc.value)


def test_archive_keeps_the_old_state_beside_the_new(tmp_path):
    path = tmp_path / "supervisor-state.json"
    save(path, GOOD)
    first = archive(path, "run1")
    save(path, GOOD)
    second = archive(path, "run1")
    assert first != second and not path.exists()
    assert load(first)["attempt"] == 2 and load(second)["attempt"] == 2


def test_a_second_controller_is_refused_while_the_first_holds_the_lock(tmp_path):
    lock = JobLock(tmp_path)
    lock.acquire()
    probe = ("import sys; from pathlib import Path; from supervisor.controller.state import JobLock, StateError\n"
             "try:\n    JobLock(Path(sys.argv[1])).acquire()\nexcept StateError as e:\n    print(e); sys.exit(3)\n")
    other = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 3 and "another supervisor (pid" in other.stdout and "supervisor status" in other.stdout
    lock.release()  # (the kernel also drops it when the holder dies, kill -9 included)
    again = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr


# ----------------------------------------------------------------- the owner lease across hosts
# A flock may not reach other hosts on a shared filesystem; the owner record must. Each "host" is
# a real process in its own UTS namespace (`unshare --uts`, its own hostname) sharing this log
# directory, as two hosts share an NFS folder. A holder killed with SIGKILL drops its flock at
# once, exactly as a holder on another host whose flock this host never sees: only its lease is left.
# the owner is the Slurm platform's (SLURM_* from the environment), as a controller under Slurm has it
OWNER = "from supervisor.platforms.slurm.lock import SlurmLockOwner; owner = SlurmLockOwner(os.environ)\n"
HOLD = ("import os, sys, time; from pathlib import Path; from supervisor.controller.state import JobLock\n" + OWNER +
        "lock = JobLock(Path(sys.argv[1]), lease_s=float(sys.argv[2]), owner=owner); "
        "lock.elected = os.environ.get('ELECTED', '')\n"
        "lock.acquire()\nprint('held', flush=True); time.sleep(600)\n")
TAKE = ("import json, os, sys; from pathlib import Path; from supervisor.controller.state import JobLock, StateError\n"
        + OWNER + "lock = JobLock(Path(sys.argv[1]), lease_s=float(sys.argv[2]), owner=owner); "
        "lock.elected = os.environ.get('ELECTED', '')\n"
        "try:\n    lock.acquire()\nexcept StateError as e:\n    print(e); sys.exit(3)\n"
        "print(json.dumps(lock.took_over)); lock.release()\n")


def _on_host(host: str, code: str, *args: str, env: dict | None = None, **kw):
    import os

    argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, sys.executable, "-c", code, *args]
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | (env or {})
    return argv, e


def _start_holder(tmp_path, host: str, lease: float, env: dict) -> subprocess.Popen:
    argv, e = _on_host(host, HOLD, str(tmp_path), str(lease), env=env)
    proc = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        err = proc.communicate()[1]
        if "unshare" in err or "Operation not permitted" in err:
            pytest.skip(f"no UTS namespace here: {err.strip()[-200:]}")
        raise AssertionError(err)
    return proc


def _take(tmp_path, host: str, lease: float, env: dict) -> subprocess.CompletedProcess:
    argv, e = _on_host(host, TAKE, str(tmp_path), str(lease), env=env)
    return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=60)


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def test_a_holder_on_another_host_is_refused_while_its_lease_is_renewed_and_taken_over_once_stale(tmp_path):
    import time

    lease = 2.0
    holder = _start_holder(tmp_path, "host-a", lease, {"SLURM_JOB_ID": "101", "SLURMD_NODENAME": "a1"})
    try:
        first = json.loads((tmp_path / "supervisor.owner.json").read_text())
        assert first["host"] == "host-a" and first["slurm_job_id"] == "101" and first["node"] == "a1"
        # the holder renews its lease by itself: still fresh three lease periods later
        deadline = time.monotonic() + 10 * lease
        while time.monotonic() < deadline:
            rec = json.loads((tmp_path / "supervisor.owner.json").read_text())
            if rec["renewed"] > first["acquired"] + 3 * lease:
                break
            time.sleep(0.1)
        assert rec["renewed"] > first["acquired"] + 3 * lease and time.time() - rec["renewed"] < lease
    finally:
        _kill(holder)  # its flock is gone; its lease is all that is left, as for a host cut off
    refused = _take(tmp_path, "host-b", lease, {"SLURM_JOB_ID": "202"})
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "host host-a (Slurm node a1), Slurm job 101" in refused.stdout and "scancel 101" in refused.stdout
    # once the lease has run out (nobody renews it), the other host takes the job over
    deadline = time.monotonic() + 10 * lease
    while (took := _take(tmp_path, "host-b", lease, {"SLURM_JOB_ID": "202"})).returncode == 3:
        assert time.monotonic() < deadline, took.stdout
        time.sleep(0.2)
    assert took.returncode == 0, took.stderr
    prev = json.loads(took.stdout)
    assert prev["host"] == "host-a" and prev["slurm_job_id"] == "101" and "lease expired" in prev["reason"]
    assert time.time() - rec["renewed"] > lease  # not before it was stale
    assert not (tmp_path / "supervisor.owner.json").exists()  # released: nothing left behind


def test_the_requeued_run_of_the_same_slurm_job_takes_over_at_once_and_a_same_host_crash_too(tmp_path):
    lease = 600.0  # a lease that never runs out during the test: only the holder being known gone frees it
    holder = _start_holder(tmp_path, "host-a", lease, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"})
    _kill(holder)
    # the same Slurm job on another host, not requeued: it could be a second copy, refused
    same = _take(tmp_path, "host-b", lease, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"})
    assert same.returncode == 3 and "Slurm job 7" in same.stdout
    # requeued by Slurm (a higher restart count): the earlier run is over
    requeued = _take(tmp_path, "host-b", lease, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"})
    assert requeued.returncode == 0, requeued.stdout
    assert "requeued" in json.loads(requeued.stdout)["reason"]
    # a holder that crashed on this very host: its pid is gone, taken over at once
    holder = _start_holder(tmp_path, "host-c", lease, {})
    _kill(holder)
    again = _take(tmp_path, "host-c", lease, {})
    assert again.returncode == 0, again.stdout
    assert "is gone" in json.loads(again.stdout)["reason"]


def test_a_controller_elected_by_the_platform_takes_over_at_once_from_one_elected_before_it(tmp_path):
    # Kubernetes: the controller's pod died with its node; its file lease is still fresh, but the
    # new controller holds the Lease, which the dead one no longer does
    lease = 600.0
    holder = _start_holder(tmp_path, "ctrl-pod-a", lease, {"ELECTED": "Lease ml/j-controller held by ctrl-pod-a_1"})
    _kill(holder)
    unelected = _take(tmp_path, "ctrl-pod-b", lease, {})  # no election to prove anything: wait for the lease
    assert unelected.returncode == 3, unelected.stdout
    elected = _take(tmp_path, "ctrl-pod-b", lease, {"ELECTED": "Lease ml/j-controller held by ctrl-pod-b_2"})
    assert elected.returncode == 0, elected.stdout + elected.stderr
    prev = json.loads(elected.stdout)
    assert prev["host"] == "ctrl-pod-a" and "held by ctrl-pod-b_2" in prev["reason"], prev


def test_the_state_file_is_fsynced_whole_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    """Issue 11: a state file lost or torn by a power cut made the next controller start afresh
    beside a live gang. The new bytes reach the disk under a temporary name, the rename
    publishes them, and the directory's fsync makes the rename itself durable."""
    path = tmp_path / "supervisor-state.json"
    save(path, GOOD | {"attempt": 1})
    ops = record_durability(monkeypatch)
    save(path, GOOD)
    monkeypatch.undo()
    size = path.stat().st_size
    renames = [i for i, op in enumerate(ops) if op[0] == "replace"]
    assert len(renames) == 1 and ops[renames[0]][2] == str(path)
    at = renames[0]
    tmp = ops[at][1]
    assert tmp != str(path) and Path(tmp).parent == tmp_path
    assert ("fsync", tmp, size) in ops[:at], ops  # all of the new file, before it replaces the old
    assert ("fsync", str(tmp_path), "dir") in ops[at + 1:], ops
    assert load(path)["attempt"] == 2
