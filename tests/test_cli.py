"""`supervisor checkpoints list|verify|prune` on real checkpoints."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from helpers import make_checkpoints
from supervisor.checkpoint.discovery import candidates
from supervisor.cli import main


@pytest.fixture
def root(tmp_path):
    make_checkpoints(tmp_path / "ckpt", steps=(1, 2, 3), keep=10)
    return tmp_path / "ckpt"


def corrupt(ckpt):
    shard = max(ckpt.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))


def test_list_shows_every_column(root, capsys):
    (root / ".tmp-step-0000000004-abc123").mkdir()
    (root / "step-0000000002" / "manifest.json").write_text("{")
    assert main(["checkpoints", "list", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "STEP", "STATUS", "WORLD", "SIZE", "AGE", "VERIFICATION"]
    rows = {line.split()[0]: line for line in out[1:]}
    assert "complete" in rows["step-0000000003"] and "ok (fast)" in rows["step-0000000003"]
    assert "KiB" in rows["step-0000000003"]
    assert "invalid" in rows["step-0000000002"] and "not valid JSON" in rows["step-0000000002"]
    assert "in-flight/partial" in rows[".tmp-step-0000000004-abc123"]


def test_list_json(root, capsys):
    corrupt(root / "step-0000000003")
    assert main(["checkpoints", "list", str(root), "--full", "--json"]) == 0
    recs = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert recs["step-0000000003"]["status"] == "invalid"
    assert recs["step-0000000002"]["status"] == "complete" and recs["step-0000000002"]["writer_world_size"] == 1


def test_verify_ok_and_full(root, capsys):
    assert main(["checkpoints", "verify", str(root), "--full"]) == 0
    assert "OK step-0000000003" in capsys.readouterr().out


def test_verify_step_fails_with_reason(root, capsys):
    corrupt(root / "step-0000000003")
    assert main(["checkpoints", "verify", str(root), "--step", "3"]) == 0  # sizes are fine
    assert main(["checkpoints", "verify", str(root), "--step", "3", "--full"]) == 1
    assert "FAILED step-0000000003" in capsys.readouterr().out
    # the newest fails: exit 1 (a FAILED line never comes with exit 0), and the fallback is named
    assert main(["checkpoints", "verify", str(root), "--full"]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert "FAILED step-0000000003" in out and "checksum" in out and "OK step-0000000002" in out
    assert "would fall back to step-0000000002" in captured.err
    assert main(["checkpoints", "verify", str(root), "--full", "--strict"]) == 1
    assert main(["checkpoints", "verify", str(root)]) == 0  # fast: sizes are fine, the newest passes


def test_verify_one_checkpoint_directory(root, capsys):
    assert main(["checkpoints", "verify", str(root / "step-0000000001"), "--full"]) == 0
    (root / "step-0000000001" / "manifest.json").write_text('{"format_version": 9}')
    assert main(["checkpoints", "verify", str(root / "step-0000000001")]) == 1
    assert "unknown manifest format_version 9" in capsys.readouterr().out


def test_verify_nothing_good(tmp_path, root, capsys):
    for c in candidates(root):
        shutil.rmtree(c.path / "rng")
    assert main(["checkpoints", "verify", str(root)]) == 1
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["checkpoints", "verify", str(tmp_path / "missing")]) == 1
    assert main(["checkpoints", "verify", str(root), "--step", "77"]) == 1


def test_prune(root, capsys):
    assert main(["checkpoints", "prune", str(root), "--keep", "2", "--dry-run"]) == 0
    assert "would remove step-0000000001" in capsys.readouterr().out
    assert len(candidates(root)) == 3
    assert main(["checkpoints", "prune", str(root), "--keep", "2"]) == 0
    assert [c.step for c in candidates(root)] == [3, 2]
    assert main(["checkpoints", "prune", str(root), "--keep", "1"]) == 2
    assert "at least 2" in capsys.readouterr().err


def test_console_script_help():
    proc = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "verify", "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "--full" in proc.stdout and "--step" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints"], capture_output=True, text=True)
    assert proc.returncode == 2 and "list" in proc.stdout


@pytest.mark.parametrize("argv, says", [
    (["--slots", "-3"], "--slots -3: must be >= 0"),
    (["--nnodes", "3:2"], "--nnodes 3:2: MIN (3) is above MAX (2)"),
    (["--nproc-per-node", "many"], "--nproc-per-node 'many' is not a number or 'auto'"),
    (["--port", "99999"], "--port 99999"),
])
def test_launch_errors_name_the_flag_the_user_typed(argv, says, capsys):
    assert main(["launch", *argv, "--", "python", "x.py"]) == 2
    assert says in capsys.readouterr().err


def test_torchrun_spellings_and_every_default_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # as read, not as wrapped
    assert "--nproc_per_node" in out and "--standalone" in out and "--max_restarts" in out
    assert "(default: checkpoints)" in out and "(default: supervisor-logs)" in out
    with pytest.raises(SystemExit):
        main(["drill", "--help"])
    assert "(default: drill-out)" in " ".join(capsys.readouterr().out.split())


def test_a_slurm_drill_outside_an_allocation_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    job = tmp_path / "drill.yaml"
    job.write_text("job: d\nplatform: {kind: slurm, host: auto}\nintake: {host: auto}\nhttp: {host: auto}\n"
                   "nodes: {min: 2, max: 2}\ncommand: [python, train.py]\n")
    out = tmp_path / "out"
    assert main(["drill", "--config", str(job), "--fault", "kind=node-stop,rank=1,step=3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "runs inside its allocation" in err and "sbatch --no-kill" in err
    assert not out.exists()  # neither run started


def test_a_config_without_command_and_yaml_1_1_numbers(tmp_path, capsys):
    from supervisor.config import ConfigError, load

    bad = tmp_path / "job.yaml"
    bad.write_text("nodes: {min: 1, max: 1}\n")
    with pytest.raises(ConfigError, match="command: required"):
        load(bad)
    good = tmp_path / "ok.yaml"
    good.write_text("command: [python, x.py]\nrestart: {budget_s: 1e3}\n")  # YAML 1.1 reads 1e3 as a string
    assert load(good).restart.budget_s == 1000.0


def test_prune_with_the_log_dir_keeps_the_supervisors_restore_point_and_suspects(tmp_path, capsys):
    """Issue 11/13 §4: what the supervisor's state names is never deleted, and a suspect (here the
    newest: it may verify, but the ranks refused it) never counts toward --keep."""
    from supervisor.controller.state import STATE_FILE, save

    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3, 4, 5), keep=10)
    logs = tmp_path / "logs"
    logs.mkdir()
    save(logs / STATE_FILE, {
        "job": "j", "phase": "running", "attempt": 3, "nodes": ["node0"], "restore_from": "step-0000000001",
        "history": {"restarts": 3, "suspects": ["step-0000000005"], "suspect_why": {"step-0000000005": "refused"}},
        "intake_port": 0, "http_port": 0, "platform": {"nodes": {}}, "pid": 1, "updated": 1.0})
    # without the state, --keep 2 would leave steps 5 and 4 only
    assert main(["checkpoints", "prune", str(root), "--keep", "2", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "would remove step-0000000001" in captured.out and "without --log-dir" in captured.err
    assert main(["checkpoints", "prune", str(root), "--keep", "2", "--log-dir", str(logs)]) == 0
    out = capsys.readouterr().out
    assert "protected by the supervisor's state: step-0000000001, step-0000000005" in out
    assert "removed step-0000000002" in out
    # kept: the suspect (not counted), the two newest that verify, and the restore point
    assert [c.step for c in candidates(root)] == [5, 4, 3, 1]
    # an unreadable state is an error, never a prune that protects nothing
    (logs / STATE_FILE).write_text("{")
    assert main(["checkpoints", "prune", str(root), "--keep", "2", "--log-dir", str(logs)]) == 1
    assert "unreadable" in capsys.readouterr().err and [c.step for c in candidates(root)] == [5, 4, 3, 1]
