"""What a real torchrun agent prints about its failed ranks, parsed (supervisor.platforms.node.agent_output)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from supervisor.platforms.node.agent_output import RANK_PREFIX, last_error, parse

SCRIPT = """
import os, signal, sys, time
if int(os.environ["RANK"]) == 1:
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ModuleNotFoundError("No module named 'torch_nightly'")
time.sleep(30)
"""


def torchrun(tmp_path, how: str) -> str:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=RANK_PREFIX, TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "--max-restarts=0", "--monitor-interval=0.2", "--tee=3", "--no-python", sys.executable,
                           str(script), how], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1  # torchrun's agent: 1 for any failed worker, whatever happened
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("how, code, error", [
    ("kill", -9, ""),
    ("raise", 1, "ModuleNotFoundError: No module named 'torch_nightly'"),
])
def test_the_root_cause_rank_its_exit_and_its_own_error(tmp_path, how, code, error):
    failures = parse(torchrun(tmp_path, how))
    root = failures[0]
    assert root.root_cause and root.rank == 1 and root.exit_code == code and root.error == error
    assert [f.rank for f in failures[1:]] == [0] and not failures[1].root_cause  # stopped by its agent


def test_output_without_a_summary():
    assert parse("just some output\n") == ()
    text = "Traceback (most recent call last):\n  File x\nModuleNotFoundError: No module named 'torch'\n"
    assert last_error(text) == "ModuleNotFoundError: No module named 'torch'"
    assert last_error("all fine\n") == ""
