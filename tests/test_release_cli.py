"""``supervisor releases`` and ``supervisor release allow`` as an operator runs them: real
subprocesses on a ledger written by the store the controller uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import job_env
from supervisor.controller import release_store
from supervisor.controller import releases as rel

PY = sys.executable
V1 = rel.Version("0123456789ab", {"code": "1"}, (PY, "train.py", "--steps", "40"))
V2 = rel.Version("0123abcdef99", {"code": "2"}, (PY, "train.py", "--steps", "40"))
V3 = rel.Version("fedcba987654", {"code": "3"}, (PY, "train.py"), image="trainer:3")


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "supervisor", *args], env=job_env(tmp), capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    ledger = rel.Ledger({V1.id: rel.Release(V1, rel.KNOWN_GOOD, 1.7e9, 1.7e9, "trained 25 steps", 25, (),
                                            ("step-0000000020", "step-0000000024")),
                         V2.id: rel.Release(V2, rel.REJECTED, 1.7e9 + 60, 1.7e9 + 70,
                                            "it failed before its first step: rank_error: No module named 'x'"),
                         V3.id: rel.Release(V3, rel.PROBATION, 1.7e9 + 80, 1.7e9 + 80)},
                        V1.id, 1, {"startup_failure": 1},
                        last_rollback={"unix": 1.7e9 + 70, "from": V2.id, "to": V1.id, "reason": "startup_failure"})
    logs = tmp_path / "logs"
    release_store.save(logs, ledger)
    return logs


def test_the_listing_names_each_version_its_state_steps_checkpoints_and_why(log_dir, tmp_path):
    out = cli(tmp_path, "releases", "--log-dir", str(log_dir))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["VERSION", "STATE", "RELEASED", "STEPS", "CHECKPOINTS", "RUNS"]
    assert lines[1].startswith(f"* {V1.id}") and "known_good" in lines[1] and "2 (newest step-0000000024)" in lines[1]
    assert "2023-11-14 22:13:20Z" in lines[1] and " 25 " in lines[1]
    assert lines[2].startswith(f"  {V2.id}") and "rejected" in lines[2]
    assert "trainer:3" in lines[3]  # on Kubernetes a version runs its image
    assert f"rejected {V2.id} at 2023-11-14 22:14:30Z: it failed before its first step" in out.stdout
    assert f"known-good: {V1.id}" in out.stdout
    assert f"rollbacks: 1 (startup_failure 1); the newest at 2023-11-14 22:14:30Z: {V2.id} -> {V1.id}" in out.stdout
    raw = json.loads(cli(tmp_path, "releases", "--log-dir", str(log_dir), "--json").stdout)
    assert raw == release_store.load(log_dir).to_saved()


def test_no_ledger_is_said_in_one_line_and_a_broken_one_is_an_error(tmp_path):
    empty = cli(tmp_path, "releases", "--log-dir", str(tmp_path / "nothing-here"))
    assert empty.returncode == 0 and "no release recorded" in empty.stdout
    broken = tmp_path / "broken"
    (broken / "releases").mkdir(parents=True)
    (broken / "releases" / "ledger.json").write_text('{"format": 1, "releases": "many"}')
    out = cli(tmp_path, "releases", "--log-dir", str(broken))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: the release ledger") and "releases: a list" in out.stderr


def test_allow_marks_a_rejected_version_by_a_unique_prefix(log_dir, tmp_path):
    out = cli(tmp_path, "release", "allow", "0123a", "--log-dir", str(log_dir))
    assert out.returncode == 0, out.stderr
    assert f"version {V2.id} is allowed again" in out.stdout and "next start" in out.stdout
    assert release_store.allowed(log_dir) == [V2.id]


@pytest.mark.parametrize("given, says", [
    ("0123", "names several versions (0123456789ab, 0123abcdef99)"),
    ("beef", f"no version 'beef' in this job's ledger; its versions: {V1.id} (known_good)"),
    (V1.id, f"version {V1.id} is known_good, not rejected"),
])
def test_allow_refuses_what_it_cannot_allow_and_says_why(log_dir, tmp_path, given, says):
    out = cli(tmp_path, "release", "allow", given, "--log-dir", str(log_dir))
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert release_store.allowed(log_dir) == []
