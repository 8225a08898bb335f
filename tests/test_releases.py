"""Safe releases on the local platform, with real torchrun agents and gloo ranks: a job trained
on v1 is started again on the same directories as another version; one that cannot train goes
back to the last known-good version on its own, from a checkpoint no rejected version wrote,
and the job ends as an uninterrupted v1 would have.

Each version is a real edit of the training script (its content hash is the version's); v1's
code is snapshotted when it is first released, so an edit in place cannot make it unrunnable.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, TRAIN, SupervisorRun, job_env, read_log

pytestmark = pytest.mark.slow
JOB = ["--steps", "40", "--checkpoint-every", "2", "--step-sleep", "0.05"]


def code_dir(tmp: Path) -> Path:
    """v1: a copy of the example job, in a folder of its own (the version hashes that folder)."""
    code = tmp / "code"
    code.mkdir()
    shutil.copy(TRAIN, code / "train.py")
    return code


def edit(script: Path, *, first_line: str) -> None:
    """A new version of the script, edited in place (what a deploy to the same path does): a
    line that runs first (after its ``from __future__`` import)."""
    lines = script.read_text().splitlines(keepends=True)
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("from __future__")), 0)
    script.write_text("".join(lines[:at] + [first_line + "\n"] + lines[at:]))


def start(tmp: Path, script: Path, *, fault: str | None = None, extra: list[str] | None = None) -> SupervisorRun:
    return SupervisorRun(tmp, JOB, script=script, fault=fault, extra=extra)


def train_then_stop(tmp: Path, script: Path, *, past: int, known_good: bool = True) -> SupervisorRun:
    """Run the job until every rank is past step ``past`` (and, with ``known_good``, its version
    has passed its probation), then stop it (SIGTERM: the ranks save on the way out), as an
    operator stops a job to release a new version."""
    run = start(tmp, script)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        steps = [max((r["step"] for r in _log(run.log_dir / "ranks", rank)), default=0) for rank in (0, 1)]
        if min(steps) > past and (not known_good or run.events("release_known_good")):
            break
        assert run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.05)
    else:
        raise AssertionError(f"the job never passed step {past}:\n{run.output()[-3000:]}")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 10, run.output()[-3000:]  # cancelled
    return run


def _log(folder: Path, rank: int) -> list[dict]:
    try:
        return read_log(folder, rank)
    except (OSError, ValueError):
        return []


def loss_path(log_dir: Path, rank: int = 0) -> dict[int, float]:
    """Each step's loss as the job finally took it, over all its runs (older runs' rank logs are
    set aside as ranks.runN-*; a resumed attempt's steps replace the ones it recomputed)."""
    folders = sorted(log_dir.glob("ranks.run*"), key=lambda p: p.stat().st_mtime) + [log_dir / "ranks"]
    out: dict[int, float] = {}
    for folder in folders:
        for rec in _log(folder, rank):
            if "loss" in rec:
                out[rec["step"]] = rec["loss"]
    return out


def control_path(tmp: Path) -> dict[int, float]:
    control = tmp / "control"
    control.mkdir()
    run = start(control, code_dir(control) / "train.py")
    assert run.wait() == 0, run.output()[-3000:]
    path = loss_path(run.log_dir)
    run.kill()
    return path


def ledger(run: SupervisorRun) -> dict:
    return json.loads((run.log_dir / "releases" / "ledger.json").read_text())


def states(run: SupervisorRun) -> dict[str, str]:
    return {r["id"]: r["state"] for r in ledger(run)["releases"]}


def test_a_release_that_dies_at_import_rolls_back_to_the_snapshot_of_v1(tmp_path):
    script = code_dir(tmp_path) / "train.py"
    v1 = train_then_stop(tmp_path, script, past=22)
    known = v1.wait_event("release_known_good")
    v1_id = known["version"]
    assert known["steps"] >= 20
    v1.kill()
    # v2: the same path, edited in place: it imports a module this environment lacks
    edit(script, first_line="import a_module_the_new_image_lacks  # v2")
    v2 = start(tmp_path, script)
    try:
        assert v2.wait(timeout=240) == 0, v2.output()[-4000:]
        started = v2.wait_event("release_started", run=2)
        v2_id = started["version"]
        assert v2_id != v1_id and started["previous"] == v1_id
        back = v2.wait_event("release_rolled_back")
        assert back["from"] == v2_id and back["to"] == v1_id and back["reason"] == "startup_failure", back
        assert "a_module_the_new_image_lacks" in back["why"]
        relaunch = v2.wait_event("launched", attempt=1)
        assert relaunch["release"] == v1_id and relaunch["restore_from"] == back["checkpoint"]
        assert states(v2) == {v1_id: "known_good", v2_id: "rejected"}
        # the edited file is not what ran: v1's snapshot did
        snap = v2.log_dir / "releases" / v1_id / "code" / "train.py"
        assert snap.is_file() and "a_module_the_new_image_lacks" not in snap.read_text()
        assert v2.events("job_finished")[-1]["phase"] == "completed"
        path = loss_path(v2.log_dir)
        # where on-call looks: the status names the running release, the rejected one and why
        shown = subprocess.run([PYTHON, "-m", "supervisor", "status", "--log-dir", str(v2.log_dir)], env=v2.env,
                               capture_output=True, text=True, timeout=60)
        assert f"release: {v1_id} known_good" in shown.stdout and f"rejected: {v2_id}" in shown.stdout, shown
    finally:
        v2.kill()
    # started once more as the rejected v2: it is not tried again; v1 runs (and finds its work done)
    again = start(tmp_path, script)
    try:
        assert again.wait(timeout=120) == 0, again.output()[-3000:]
        refused = again.wait_event("release_still_rejected", run=3)
        assert refused["version"] == v2_id and refused["runs_instead"] == v1_id
        assert again.wait_event("launched", run=3)["release"] == v1_id
    finally:
        again.kill()
    # the operator allows it again (`supervisor release allow`): on probation at the next start,
    # where it fails as before and is rolled back again
    allowed = subprocess.run([PYTHON, "-m", "supervisor", "release", "allow", v2_id[:6], "--log-dir",
                              str(again.log_dir)], env=again.env, capture_output=True, text=True, timeout=60)
    assert allowed.returncode == 0 and "allowed again" in allowed.stdout, allowed.stderr
    retry = start(tmp_path, script)
    try:
        assert retry.wait(timeout=120) == 0, retry.output()[-3000:]
        assert retry.wait_event("release_allowed", run=4)["version"] == v2_id
        assert retry.wait_event("launched", run=4, attempt=0)["release"] == v2_id
        assert retry.wait_event("release_rolled_back", run=4)["to"] == v1_id
    finally:
        retry.kill()
    control = control_path(tmp_path)
    assert sorted(path) == list(range(1, 41))
    assert path == control  # bit for bit: the job took exactly the steps v1 alone would have


def test_a_release_whose_loss_goes_nonfinite_is_rolled_back_and_its_checkpoint_not_restored(tmp_path):
    script = code_dir(tmp_path) / "train.py"
    v1 = train_then_stop(tmp_path, script, past=22)
    v1_id = v1.wait_event("release_known_good")["version"]
    resumed_at = v1.events("job_finished")[-1]
    v1.kill()
    last = max(p for p in (tmp_path / "sv-ckpt").glob("step-*"))
    step = int(last.name.split("-")[1])
    # v2 (a changed script) turns NaN at its 3rd step; only in its own attempt (0 of the new run)
    edit(script, first_line="# v2: a new loss scaling")
    v2 = start(tmp_path, script, fault=f"kind=nan,rank=0,step={step + 3},attempt=0")
    try:
        assert v2.wait(timeout=240) == 0, v2.output()[-4000:]
        v2_id = v2.wait_event("release_started", run=2)["version"]
        back = v2.wait_event("release_rolled_back")
        assert back["from"] == v2_id and back["to"] == v1_id and back["reason"] == "nonfinite", back
        # v2 saved a checkpoint before its NaN; it is not what v1 resumes from
        v2_wrote = [e["name"] for e in v2.events("checkpoint_complete") if e.get("release") == v2_id]
        assert v2_wrote, v2.events("checkpoint_complete")
        assert back["checkpoint"] == last.name and back["checkpoint"] not in v2_wrote
        assert v2.wait_event("launched", attempt=1)["restore_from"] == last.name
        # and the ranks are told to pass over what v2 wrote: were v1's checkpoint unreadable
        # to them, their own scan of the root would not fall back on one of v2's
        told = [line for p in sorted((v2.log_dir / "attempt-1").glob("*.log"))
                for line in p.read_text(errors="replace").splitlines() if "restore_point_from_supervisor" in line]
        assert told and all(name in told[0] for name in v2_wrote), told
        assert states(v2)[v2_id] == "rejected"
        path = loss_path(v2.log_dir)
    finally:
        v2.kill()
    assert resumed_at["phase"] == "cancelled"
    control = control_path(tmp_path)
    assert path == control


def test_a_good_release_becomes_known_good_and_a_later_bad_one_rolls_back_to_it(tmp_path):
    script = code_dir(tmp_path) / "train.py"
    v1 = train_then_stop(tmp_path, script, past=4, known_good=False)  # v1 is stopped on probation
    v1_id = v1.events("release_started")[0]["version"]
    v1.kill()
    edit(script, first_line="# v2: a harmless change")
    v2 = train_then_stop(tmp_path, script, past=28)
    v2_id = v2.wait_event("release_known_good", run=2)["version"]
    assert v2_id != v1_id
    v2.kill()
    edit(script, first_line="raise SystemExit('v3: a config file the new image lacks')")
    v3 = start(tmp_path, script)
    try:
        assert v3.wait(timeout=240) == 0, v3.output()[-4000:]
        back = v3.wait_event("release_rolled_back")
        assert back["to"] == v2_id and back["reason"] == "startup_failure", back
        assert v3.wait_event("launched", attempt=1)["release"] == v2_id
        assert states(v3)[back["from"]] == "rejected" and states(v3)[v2_id] == "known_good"
        assert states(v3)[v1_id] == "probation"
        # started again as v3 (still rejected): v2 runs at once, said so
        assert v3.events("job_finished")[-1]["phase"] == "completed"
    finally:
        v3.kill()


def test_a_first_release_that_cannot_start_runs_the_operators_baseline(tmp_path):
    """No version of the job is known-good yet: ``release.baseline`` names what serves."""
    code = code_dir(tmp_path)
    edit(code / "train.py", first_line="import a_module_the_new_image_lacks  # the first version, broken")
    good = tmp_path / "baseline"
    good.mkdir()
    shutil.copy(TRAIN, good / "train.py")
    cfg = {"command": [PYTHON, str(code / "train.py"), *JOB], "job": "base", "nodes": {"min": 2, "max": 2},
           "platform": {"kind": "local", "nodes": 2}, "checkpoint_dir": str(tmp_path / "ckpt"),
           "log_dir": str(tmp_path / "logs"), "heartbeat": {"interval_s": 0.5, "timeout_s": 3},
           "metrics_linger_s": 0, "release": {"baseline": {"command": [PYTHON, str(good / "train.py"), *JOB]}}}
    (tmp_path / "job.json").write_text(json.dumps(cfg))
    proc = subprocess.run([PYTHON, "-m", "supervisor", "run", "--config", str(tmp_path / "job.json")],
                          env=job_env(tmp_path), capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = [json.loads(x) for x in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    (back,) = [e for e in events if e["event"] == "release_rolled_back"]
    assert back["to"] == "baseline" and back["reason"] == "startup_failure" and back["checkpoint"] is None
    assert [e["release"] for e in events if e["event"] == "launched"][-1] == "baseline"
    assert events[-1]["event"] == "job_finished" and events[-1]["phase"] == "completed"


def test_a_code_folder_that_is_the_log_directory_is_refused_and_no_rollback_runs_it_untracked(tmp_path):
    """The training code kept in the log directory: every start would be a new release (what
    the job writes there is hashed), so the controller refuses with what to do before anything
    is launched; ``--no-rollback`` runs the job with no version told, hashed or snapshotted."""
    code = code_dir(tmp_path)
    refused = SupervisorRun(tmp_path, ["--steps", "4"], script=code / "train.py", log_dir=code)
    assert refused.wait() == 2, refused.output()[-3000:]
    assert "is the job's log directory" in refused.output() and "--no-rollback" in refused.output()
    assert not (code / "attempt-0").exists()  # nothing was launched
    untracked = SupervisorRun(tmp_path, ["--steps", "4"], script=code / "train.py", log_dir=code,
                              extra=["--no-rollback"])
    try:
        assert untracked.wait() == 0, untracked.output()[-3000:]
        assert not (code / "releases").exists() and not untracked.events("release_started")
        assert untracked.wait_event("job_finished")["phase"] == "completed"
    finally:
        untracked.kill()
