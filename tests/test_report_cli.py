"""``supervisor report`` and the goodput line of ``supervisor status`` as an operator runs them:
real subprocesses on an events.jsonl written as the controller writes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import job_env
from test_goodput import RUN

PY = sys.executable


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "supervisor", *args], env=job_env(tmp), capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A finished run (test_goodput's: 1,000 s, ETTR 85.6%), a torn last line after it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [json.dumps(e) for e in RUN]
    (logs / "events.jsonl").write_text("\n".join(lines) + '\n{"time": "2026-12-0')
    return logs


def test_the_report_prints_the_breakdown_and_the_advice_and_writes_the_timeline(tmp_path, log_dir):
    png = tmp_path / "timeline.png"
    out = cli(tmp_path, "report", "--log-dir", str(log_dir), "--png", str(png))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["wall", "productive", "ETTR", "startup", "waiting_for_capacity", "restart",
                                "restore", "save_stall", "wasted_progress"]
    assert lines[1].split()[:6] == ["run", "1", "16.7", "min", "14.3", "min"] and "85.6%" in lines[1]
    assert "steps recomputed after restores 20" in out.stdout
    assert "fewer than 3 to fit its own rate" in out.stdout  # one fault: the prior, said as such
    assert "advised interval:" in out.stdout and f"timeline written to {png}" in out.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    js = json.loads(cli(tmp_path, "report", "--log-dir", str(log_dir), "--json", "--mtbf-hours", "1").stdout)
    assert js["total"]["ettr"] == 0.856 and js["advice"]["mtbf_source"].startswith("prior: --mtbf-hours (the job had 1 fault(s)")
    assert js["advice"]["mtbf_s"] == 3600.0 and js["runs"][0]["wasted_steps"] == 20


@pytest.mark.parametrize("args, says", [
    (["--mtbf-hours", "0"], "--mtbf-hours 0.0: must be a finite number > 0"),
    (["--restart-s", "nan"], "--restart-s nan: must be a finite number"),
    (["--persist-s", "-1"], "--persist-s -1.0: must be a finite number"),
])
def test_bad_numbers_are_refused_naming_the_flag(tmp_path, log_dir, args, says):
    out = cli(tmp_path, "report", "--log-dir", str(log_dir), *args)
    assert out.returncode == 2 and says in out.stderr and not out.stdout


def test_a_directory_without_events_says_which_to_give(tmp_path):
    out = cli(tmp_path, "report", "--log-dir", str(tmp_path))
    assert out.returncode == 2 and "give the job's --log-dir" in out.stderr
    (tmp_path / "events.jsonl").write_text('{"event": "nothing"}\n')
    out = cli(tmp_path, "report", "--log-dir", str(tmp_path))
    assert out.returncode == 1 and "no run of a job in these events" in out.stderr


def test_status_of_a_finished_job_shows_its_goodput(tmp_path, log_dir):
    from supervisor.controller.state import STATE_FILE, save

    save(log_dir / STATE_FILE, {
        "job": "j", "phase": "completed", "attempt": 1, "nodes": ["node0"], "restore_from": "step-0000000100",
        "history": {"restarts": 1}, "intake_port": 0, "http_port": 0, "platform": {"nodes": {}}, "pid": 1,
        "updated": 1.0})
    out = cli(tmp_path, "status", "--log-dir", str(log_dir))
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("goodput:")), None)
    assert line is not None, out.stdout + out.stderr
    assert line.startswith("goodput: ETTR 85.6% of 16.7m (badput: waiting for capacity 1.0m, restart 32s, "
                           "startup 30s)")
    assert "advised" in line and "`supervisor report`" in line
