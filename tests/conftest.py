"""Shared fixtures: real torchrun launches of the example job, and log readers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"
PYTHON = sys.executable


def torchrun_cmd(nproc: int) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def run_job(tmp: Path, nproc: int, args: list[str], *, fault: str | None = None, expect_ok: bool = True,
            timeout: float = 240, script: Path = TRAIN) -> subprocess.CompletedProcess:
    """Run ``script`` under a real torchrun agent (gloo, CPU) with its own TMPDIR."""
    env = dict(os.environ)
    env.pop("SUPERVISOR_FAULT", None)
    if fault:
        env["SUPERVISOR_FAULT"] = fault
    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(parents=True, exist_ok=True)
    env.update(TMPDIR=str(tmpdir), OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    cmd = torchrun_cmd(nproc) + [str(script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"job failed rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    if not expect_ok and proc.returncode == 0:
        raise AssertionError(f"job was expected to fail but succeeded\n{proc.stderr[-3000:]}")
    return proc


def read_log(log_dir: Path, rank: int = 0) -> list[dict]:
    path = Path(log_dir) / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses_by_step(records: list[dict], attempt_filter=None) -> dict[int, dict]:
    """Last record per step (a resumed run re-logs the steps after its checkpoint)."""
    out: dict[int, dict] = {}
    for r in records:
        out[r["step"]] = r
    return out


def copy_root_upto(src: Path, dst: Path, max_step: int) -> Path:
    """A copy of a checkpoint root holding only checkpoints of steps <= max_step."""
    from supervisor.checkpoint.discovery import candidates

    dst.mkdir(parents=True)
    for c in candidates(src):
        if c.step <= max_step:
            shutil.copytree(c.path, dst / c.name)
    return dst


@pytest.fixture
def job_tmp(tmp_path: Path) -> Path:
    return tmp_path
