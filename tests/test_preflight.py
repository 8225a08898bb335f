"""Preflight: the commonest mistakes as one clear line before anything is launched (real
interpreters, a real read-only directory, the real `supervisor launch`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, TRAIN, job_env
from controller_venv import controller_env, controller_python
from supervisor.controller.preflight import PreflightError, check
from supervisor.platforms.node.agent import agent_env, torchrun_argv
from supervisor.platforms.base import LaunchSpec
from supervisor.protocol import EXIT_PREFLIGHT


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory):
    """A real interpreter whose environment lacks torch: what `python` is outside the venv."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


def test_an_interpreter_without_torch_is_one_clear_line_within_seconds(tmp_path, python_without_torch):
    t0 = time.monotonic()
    cmd = [PYTHON, "-m", "supervisor", "launch", "--nnodes", "2", "--log-dir", str(tmp_path / "logs"),
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--", str(python_without_torch), str(TRAIN)]
    proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot import torch" in proc.stderr and str(python_without_torch) in proc.stderr
    assert not list((tmp_path / "logs").glob("attempt-*"))  # nothing was launched
    assert time.monotonic() - t0 < 30


def test_preflight_checks(tmp_path, python_without_torch):
    env = dict(os.environ)
    with pytest.raises(PreflightError, match="'no-such-program' is not found"):
        check(["no-such-program"], env, tmp_path / "ckpt")
    with pytest.raises(PreflightError, match="cannot import torch"):
        check([str(python_without_torch), "x.py"], env, tmp_path / "ckpt")
    assert check([PYTHON, "x.py"], env, tmp_path / "ckpt") == [] and (tmp_path / "ckpt").is_dir()
    assert check(["sleep", "1"], env, tmp_path / "ckpt") == []  # not Python: nothing to import
    (tmp_path / "a-file").write_text("x")  # (a mode cannot stop root, which CI runs as)
    with pytest.raises(PreflightError, match="not writable"):
        check([PYTHON], env, tmp_path / "a-file" / "ckpt")


def test_the_controllers_own_interpreter_is_asked_in_process(tmp_path, monkeypatch):
    """The job's python is the controller's, same search path: no second Python on the cold
    start's serial path. Another interpreter, or another PYTHONPATH, still gets its own probe."""
    env = dict(os.environ)
    started = []
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: started.append(a[0]) or real_run(*a, **k))
    assert check([sys.executable, "x.py"], env, tmp_path / "ckpt") == []
    assert started == []
    check([sys.executable, "x.py"], env | {"PYTHONPATH": str(tmp_path)}, tmp_path / "ckpt")
    assert len(started) == 1 and started[0][0] == sys.executable


def test_the_worker_sdk_does_not_import_the_checkpoint_manager():
    """`import supervisor.worker` leaves torch.distributed.checkpoint (~1 s) and tenacity to the
    script that uses them: the SDK's import is on every rank's cold start."""
    code = ("import sys, supervisor.worker\n"
            "print(sorted(m for m in ('torch.distributed.checkpoint', 'tenacity', 'supervisor.checkpoint.manager')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_where_the_command_runs_elsewhere_only_the_checkpoint_root_is_checked(tmp_path, python_without_torch):
    """Kubernetes: the controller's image is not the workers', so their interpreter is not asked here."""
    env = dict(os.environ)
    assert check([str(python_without_torch), "x.py"], env, tmp_path / "ckpt", command_here=False) == []
    assert check(["no-such-program"], env, tmp_path / "ckpt", command_here=False) == []
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(PreflightError, match="not writable"):
        check(["no-such-program"], env, tmp_path / "a-file" / "ckpt", command_here=False)


def agent(tmp_path, python, command, *, check_command=True):
    """A node agent started as every platform starts it, for a job whose command it checks (or not)."""
    spec = LaunchSpec(attempt=0, nodes=["n0"], nnodes_min=1, nnodes_max=1, nproc_per_node=1, command=command,
                      env={}, rdzv_endpoint="127.0.0.1:0", rdzv_id="j-0", check_command=check_command)
    env = controller_env(job_env(tmp_path)) | agent_env(spec, "n0", tmp_path / "tmp")
    return subprocess.run(torchrun_argv(str(python), spec), env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("python, command, says", [
    # a worker image without torch: the job's interpreter is named, before the agent imports torch
    ("no-torch", ["no-torch", "x.py"], "PreflightError: the job's interpreter {no_torch} cannot import torch"),
    # the agent's own interpreter without torch (the job's has it)
    ("no-torch", [PYTHON, "x.py"], "PreflightError: the node agent's interpreter {no_torch} cannot import torch"),
    # a program the node's PATH does not have
    (PYTHON, ["no-such-program", "x"], "PreflightError: the command's program 'no-such-program' is not found"),
])
def test_the_node_agent_checks_the_command_before_torch_and_exits_with_one_line(tmp_path, tmp_path_factory,
                                                                              python, command, says):
    no_torch = str(controller_python(tmp_path_factory))  # this package and its requirements, no torch
    python = no_torch if python == "no-torch" else python
    command = [no_torch if c == "no-torch" else c for c in command]
    t0 = time.monotonic()
    proc = agent(tmp_path, python, command)
    assert proc.returncode == EXIT_PREFLIGHT, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()  # one line, no traceback
    assert line.startswith(says.format(no_torch=no_torch)), line
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_without_the_platforms_word_the_agent_leaves_the_command_to_the_controller(tmp_path):
    """Local and Slurm: the controller checked the command; the agent runs it as given (a program
    it cannot find fails as torchrun fails it, not as a preflight)."""
    proc = agent(tmp_path, PYTHON, ["no-such-program", "x"], check_command=False)
    assert proc.returncode not in (0, EXIT_PREFLIGHT) and "PreflightError" not in proc.stderr, proc.stderr[-3000:]
