"""What version a config runs, its code's snapshot, and the ledger on disk
(supervisor.controller.release_store), on real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.controller import release_store as store

PY = sys.executable


def ident(tmp: Path, command: list[str], **kw):
    args = dict(command=command, env={}, trained={}, log_dir=tmp / "logs", checkpoint_dir=tmp / "ckpt",
                max_code_bytes=1 << 20, cwd=tmp)
    return store.identify(**(args | kw))


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("import pkg.model\n")
    (folder / "pkg" / "model.py").write_text("WIDTH = 64\n")
    return folder


def test_the_version_follows_the_code_the_command_and_the_env_and_nothing_else(tmp_path, code):
    cmd = [PY, "code/train.py", "--steps", "9"]
    v = ident(tmp_path, cmd)
    assert v.entry == 1 and v.code_dir == str(code.resolve()) and len(v.id) == 12
    assert ident(tmp_path, cmd).id == v.id  # deterministic
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0" * 10)
    (tmp_path / "logs").mkdir()
    assert ident(tmp_path, cmd).id == v.id  # caches and the job's own logs are not code
    (code / "pkg" / "model.py").write_text("WIDTH = 128\n")  # a module the script imports
    changed = ident(tmp_path, cmd)
    assert changed.id != v.id
    assert ident(tmp_path, cmd + ["--lr", "1"]).id != changed.id
    assert ident(tmp_path, cmd, env={"LR": "1"}).id != changed.id
    # on Kubernetes the image is the code: nothing on this filesystem is read
    kube = ident(tmp_path, cmd, platform_parts={"image": "trainer:2", "template": "t"}, hash_code=False)
    assert "code" not in kube.parts and kube.image == "trainer:2"


def test_what_training_writes_beside_the_code_is_not_code(tmp_path, code):
    cmd = [PY, "code/train.py"]
    v = ident(tmp_path, cmd)
    for out in ("wandb/run-1/files.json", "outputs/2026-12-05/config.yaml", "runs/events.out", "train.log"):
        (code / out).parent.mkdir(parents=True, exist_ok=True)
        (code / out).write_text("written by a run\n")
    # a log directory inside the code folder (--log-dir code/logs) is the job's, not code
    inside = code / "logs"
    (inside / "ranks").mkdir(parents=True)
    (inside / "events.jsonl").write_text("{}\n")
    assert ident(tmp_path, cmd, log_dir=inside).id == v.id


def test_a_code_folder_that_is_the_log_or_checkpoint_directory_is_refused_with_what_to_do(tmp_path, code):
    cmd = [PY, "code/train.py"]
    for kw, where in ((dict(log_dir=code), "log directory"), (dict(checkpoint_dir=code), "checkpoint directory")):
        with pytest.raises(store.ReleaseError, match=rf"is the job's {where}.*--code-dir.*--no-rollback"):
            ident(tmp_path, cmd, **kw)
    # the code in its own folder under the log directory is fine: the snapshots go beside it
    assert ident(tmp_path, cmd, log_dir=tmp_path).code_dir == str(code.resolve())


def test_a_code_folder_past_the_cap_is_a_clear_error(tmp_path, code):
    (code / "weights.bin").write_bytes(b"\0" * (2 << 20))
    with pytest.raises(store.ReleaseError, match=r"more than 1 MiB.*release.code_dir \(--code-dir\).*--no-rollback"):
        ident(tmp_path, [PY, "code/train.py"])
    small = tmp_path / "small"
    small.mkdir()
    (small / "train.py").write_text("")
    assert ident(tmp_path, [PY, "code/train.py"], code_dir="small").code_dir == str(small.resolve())
    with pytest.raises(store.ReleaseError, match="is not a directory"):
        ident(tmp_path, [PY, "code/train.py"], code_dir="nowhere")


def test_a_rollback_runs_the_snapshot_of_the_code_as_it_was_when_released(tmp_path, code):
    v1 = ident(tmp_path, [PY, "code/train.py"])
    snap = store.snapshot(tmp_path / "logs", v1, tmp_path / "ckpt")
    assert store.snapshot(tmp_path / "logs", v1, tmp_path / "ckpt") == snap  # taken once
    (code / "train.py").write_text("raise SystemExit('v2')\n")  # edited in place afterwards
    cmd = store.launch_command(tmp_path / "logs", v1, cwd=tmp_path)
    assert cmd[1] == str(snap / "train.py") and cmd[0] == PY
    ran = subprocess.run([*cmd[:1], "-c", "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
                          "import pkg.model; print(pkg.model.WIDTH)", str(snap)], capture_output=True, text=True)
    assert ran.stdout.strip() == "64" and (snap / "train.py").read_text() == "import pkg.model\n"
    # a version without a snapshot (a baseline, a Kubernetes image) runs its command as given
    other = ident(tmp_path, [PY, "-c", "pass"])
    assert store.launch_command(tmp_path / "logs", other, cwd=tmp_path) == (PY, "-c", "pass")


def test_an_unreadable_ledger_says_how_to_start_over(tmp_path):
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "ledger.json").write_text("{not json")
    with pytest.raises(store.ReleaseError, match="not readable.*move it aside"):
        store.load(tmp_path)
    assert store.load(tmp_path / "elsewhere").releases == {}


def test_an_allow_mark_is_taken_once(tmp_path):
    store.ask_allow(tmp_path, "0123456789ab")
    assert store.allowed(tmp_path) == ["0123456789ab"]
    store.taken(tmp_path, "0123456789ab")
    assert store.allowed(tmp_path) == []
