"""What a real torchrun agent prints about its failed ranks, parsed (supervisor.platforms.node.agent_output)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from supervisor.platforms.node.agent import note_uncopied_output
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


def test_a_log_missing_a_rank_s_last_lines_names_the_rank_s_own_files(tmp_path):
    # a real agent's output and its ranks' own files; the log then loses the lines torchrun had
    # not yet copied when the agent was killed (it copies them ~0.1 s late)
    log = tmp_path / "node0.log"
    log.write_text(torchrun(tmp_path, "raise"))
    assert note_uncopied_output(log, tmp_path) == []  # the agent ended on its own: the log is complete
    assert "supervisor:" not in log.read_text()
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(x for x in lines if not x.startswith("[rank1]:")))
    named = note_uncopied_output(log, tmp_path)
    assert [p.parent.name for p in named if "torch_nightly" in p.read_text()] == ["1"]  # local rank 1's stderr
    last = log.read_text().splitlines()[-1]
    assert last.startswith("supervisor: ") and all(str(p.relative_to(tmp_path)) in last for p in named)
    assert note_uncopied_output(tmp_path / "absent.log", tmp_path / "no-such-tmp") == []
