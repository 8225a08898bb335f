"""The node agent that forks Python ranks with torch already imported (supervisor.platforms.node.forking_agent).

A forked rank must be what a fresh interpreter would have made of the same command: these run
the real agent (torch's, through the module) on real ranks and look at what each rank saw and
how each ending reached the agent's own failure summary (which the platforms read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.platforms.node.agent_output import parse
from supervisor.platforms.node.forking_agent import forkable

PY = sys.executable
PROBE = Path(__file__).parent / "workloads" / "fork_probe.py"
BIN = os.path.dirname(os.path.abspath(PY))


@pytest.mark.parametrize("cmd, args, expected", [
    (PY, ["train.py", "--steps", "3"], ("path", "train.py", ["--steps", "3"])),
    (PY, ["-u", "train.py"], ("path", "train.py", [])),
    (PY, ["-m", "pkg.train", "--x"], ("module", "pkg.train", ["--x"])),
    (PY, ["-c", "print(1)", "a"], ("code", "print(1)", ["a"])),
    (PY, ["-X", "dev", "train.py"], None),          # a flag a fork cannot honour: a real interpreter
    (PY, ["-m"], None),
    (PY, [], None),
    ("/bin/sleep", ["5"], None),                     # not Python
    ("no-such-command-anywhere", ["x.py"], None),
])
def test_which_commands_are_forked(cmd, args, expected):
    assert forkable(cmd, args) == expected


def test_a_bare_interpreter_name_is_looked_up_on_path_and_another_venv_is_not_this_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", BIN)
    name = os.path.basename(PY)
    assert forkable(name, ["t.py"]) == ("path", "t.py", [])
    # another environment's python links to the same binary but has other packages: not ours
    other = tmp_path / "venv" / "bin"
    other.mkdir(parents=True)
    (other / "python").symlink_to(os.path.realpath(PY))
    assert forkable(str(other / "python"), ["t.py"]) is None


def run_agent(tmp_path: Path, *script_args: str, fork: bool = True, restarts: int = 1) -> tuple[int, str, list[dict]]:
    env = dict(os.environ, SUPERVISOR_FORK_RANKS="1" if fork else "0", LOGLEVEL="WARNING",
               TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]:")
    env.pop("OMP_NUM_THREADS", None)  # torchrun sets it for its ranks (after the agent imported torch)
    cmd = [PY, "-m", "supervisor.platforms.node.forking_agent", "--standalone", "--nproc-per-node=2",
           f"--max-restarts={restarts}", "--monitor-interval=0.2", "--tee=3", "--no-python",
           PY, str(PROBE), "--atexit", str(tmp_path / "atexit.txt"), *script_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    probes = [json.loads(line.split("probe ", 1)[1]) for line in out.splitlines() if "]:probe {" in line]
    return proc.returncode, out, probes


def test_a_forked_rank_starts_with_torch_imported_and_otherwise_as_a_fresh_interpreter(tmp_path):
    rc, out, probes = run_agent(tmp_path)
    assert rc == 0, out[-3000:]
    assert sorted(p["rank"] for p in probes) == [0, 1]
    for p in probes:
        assert p["torch_was_imported"], p  # the point: no `import torch` per rank
        assert p["argv"] == [str(PROBE), "--atexit", str(tmp_path / "atexit.txt")]
        assert p["path0"] == str(PROBE.parent) and p["name"] == "__main__"
        assert p["sigterm_default"] and p["sigint_default"]  # not the agent's handlers
        assert p["own_session"]  # as torchrun starts its workers
        assert p["comm"] == f"rank{p['rank']}"  # ps tells it from its agent
        assert p["process_name"] == "MainProcess" and not p["parent"]  # and it may set its own start method
        assert p["sockets"] == 0  # none of the agent's (its store's listening socket) held open
        assert p["threads"] == 1  # the rank's OMP_NUM_THREADS (torchrun sets 1), not the agent's count
        assert p["main_file"] == str(PROBE)
    assert probes[0]["numpy_draw"] != probes[1]["numpy_draw"]  # not one random stream copied into every rank
    assert sorted((tmp_path / "atexit.txt").read_text().split("\n")[:-1]) == ["rank0 restart0", "rank1 restart0"]


def test_a_forked_rank_that_ends_with_os_exit_0_has_finished(tmp_path):
    # torch's agent waits for a forked rank's return value; a status 0 without one is success too
    rc, out, probes = run_agent(tmp_path, "--fail-rank", "1", "--how", "os-exit-0", restarts=0)
    assert rc == 0, out[-3000:]
    assert sorted(p["rank"] for p in probes) == [0, 1]


def test_with_fork_off_every_rank_is_a_new_interpreter(tmp_path):
    rc, out, probes = run_agent(tmp_path, fork=False)
    assert rc == 0, out[-3000:]
    assert len(probes) == 2 and not any(p["torch_was_imported"] for p in probes)


@pytest.mark.parametrize("how, exit_code, error", [
    ("raise", 1, "ValueError: boom from rank 1"),   # printed by sys.excepthook, exit status 1
    ("exit", 18, ""),                                # sys.exit(18): status 18
    ("kill", -9, ""),                                # killed by a signal
])
def test_how_a_forked_rank_ended_reaches_the_agent_and_it_restarts_in_place(tmp_path, how, exit_code, error):
    rc, out, probes = run_agent(tmp_path, "--fail-rank", "1", "--how", how)
    assert rc == 0, out[-3000:]  # restarted in place once, then both ranks finished
    assert sorted((p["rank"], p["restart"]) for p in probes) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(p["torch_was_imported"] for p in probes)  # a restarted rank is forked too
    ran = (tmp_path / "atexit.txt").read_text().split("\n")[:-1]
    assert ("rank1 restart0" in ran) == (how != "kill") and "rank1 restart1" in ran
    # with no restart left the agent fails and its summary names the rank as for a subprocess
    rc, out, _ = run_agent(tmp_path, "--fail-rank", "1", "--how", how, restarts=0)
    assert rc == 1
    failures = parse(out)
    assert failures and failures[0].rank == 1 and failures[0].exit_code == exit_code, out[-3000:]
    assert failures[0].error == error  # the rank's own words, never the agent's exception about it
