"""The controller's state file and job lock (supervisor.controller.state), on real files and a
real second process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
    assert isinstance(got["history"], History) and got["history"].excluded == ["node1"]
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
