"""Adoption on the local platform never touches a stranger's process: a pid from the state file
is adopted and signalled only while its start time is the one saved. Real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from supervisor.platforms.base import NodeState
from supervisor.platforms.local import LocalPlatform
from supervisor.procfs import proc_state, start_time


@pytest.fixture
def stranger():
    """A process that exits 7 once its stdin closes; killed by a signal, it returns -N instead.
    It leads its own session and process group, the worst case for a stray killpg."""
    proc = subprocess.Popen(["sh", "-c", "read line; exit 7"], stdin=subprocess.PIPE, start_new_session=True)
    assert start_time(proc.pid) is not None
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def finish(proc: subprocess.Popen) -> int:
    """Close its stdin and wait: 7 if no signal ever reached it (a signal sent earlier is
    pending before the end of input, so it would end the process first)."""
    proc.stdin.close()
    return proc.wait(timeout=10)


def saved(pid: int, start, ranks=None) -> dict:
    info = {"pid": pid, "attempt": 1, "ranks": ranks or {}}
    if start is not None:
        info["start"] = start
    return {"nodes": {"node0": info}}


@pytest.mark.parametrize("start", [lambda st: st + 1, lambda st: None], ids=["wrong-start-time", "no-start-time"])
def test_a_reused_pid_is_neither_adopted_nor_signalled(tmp_path, stranger, start):
    platform = LocalPlatform(1, tmp_path)

    async def scenario():
        adopted = await platform.adopt(saved(stranger.pid, start(start_time(stranger.pid))), 1)
        status = await platform.observe()
        await platform.kill_node("node0")
        await platform.teardown(0.2)
        return adopted, status

    adopted, status = asyncio.run(scenario())
    assert adopted is False
    assert status["node0"].state == NodeState.LOST
    assert finish(stranger) == 7  # no signal reached it


def test_a_saved_rank_pid_held_by_a_stranger_is_not_signalled(tmp_path, stranger):
    agent = subprocess.Popen(["sh", "-c", "read line; exit 0"], stdin=subprocess.PIPE, start_new_session=True)
    try:
        platform = LocalPlatform(1, tmp_path)
        state = saved(agent.pid, start_time(agent.pid), ranks={str(stranger.pid): start_time(stranger.pid) - 1})

        async def scenario():
            assert await platform.adopt(state, 1) is True
            await platform.teardown(5)

        asyncio.run(scenario())
        assert agent.wait(timeout=10) == -15  # the adopted agent got the teardown's SIGTERM
        assert finish(stranger) == 7
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait()


def test_the_right_start_time_is_adopted_and_the_description_carries_it(tmp_path, stranger):
    platform = LocalPlatform(1, tmp_path)
    started = start_time(stranger.pid)

    async def scenario():
        assert await platform.adopt(saved(stranger.pid, started), 1) is True
        status = await platform.observe()
        assert status["node0"].state == NodeState.RUNNING and status["node0"].pid == stranger.pid
        assert platform.describe()["nodes"]["node0"]["start"] == started
        await platform.kill_node("node0")

    asyncio.run(scenario())
    assert stranger.wait(timeout=10) == -9  # adopted, so it is ours to kill


def launch_one_until_it_ends(platform: LocalPlatform, spec) -> tuple[int, "NodeStatus"]:
    """Launch ``spec``'s single node ``node0``; its agent's pid and its status once it ended."""

    async def scenario():
        await platform.launch(spec)
        pid = platform.nodes["node0"].pid
        for _ in range(600):
            status = (await platform.observe())["node0"]
            if status.state != NodeState.RUNNING:
                return pid, status
            await asyncio.sleep(0.1)
        raise AssertionError("the agent did not end")

    return asyncio.run(scenario())


def test_a_launch_hands_its_nodes_to_warm_agents_and_starts_cold_when_none_is_alive(tmp_path):
    """Warm agents (already past ``import torch``) become the nodes' agents: the node's pid is the
    warm process, its output is the node log, its environment the launch's; with none alive the
    agent starts cold, and a warm agent nobody needs ends when its platform's pipe closes."""
    import sys

    from supervisor.platforms.base import LaunchSpec
    from supervisor.platforms.base import free_port

    platform = LocalPlatform(2, tmp_path, warm_agents=True)
    platform.warm_up()
    warm = set(platform.warm_pids)
    assert len(warm) == 2
    spec = LaunchSpec(attempt=0, nodes=["node0"], nnodes_min=1, nnodes_max=1, nproc_per_node=1,
                      command=[sys.executable, "-c", "import os; print('env', os.environ['SUPERVISOR_JOB'])"],
                      env={"SUPERVISOR_JOB": "warm-test"}, rdzv_endpoint=f"127.0.0.1:{free_port('127.0.0.1')}",
                      rdzv_id="warm-0")

    pid, status = launch_one_until_it_ends(platform, spec)
    assert pid in warm and status.state == NodeState.EXITED and status.exit_code == 0
    out = (tmp_path / "attempt-0" / "node0.log").read_text()
    assert "env warm-test" in out  # the rank ran with the launch's environment; its output in the node log
    (other,) = set(platform.warm_pids) - {pid}  # the other one still waits
    # a waiting agent whose platform goes away (its pipe closes) ends, having done nothing
    lone = subprocess.Popen([sys.executable, "-m", "supervisor.platforms.node.warm_agent"], stdin=subprocess.PIPE)
    lone.stdin.close()
    assert lone.wait(timeout=60) == 0
    # none alive (the last one killed): the next launch starts its agent cold
    import os
    import signal

    os.kill(other, signal.SIGKILL)
    deadline = time.monotonic() + 60
    # our child: dead once waitable (a zombie leader is not, while its other threads still exit)
    while os.waitid(os.P_PID, other, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, proc_state(other)
        time.sleep(0.05)
    spec1 = LaunchSpec(**{**spec.__dict__, "attempt": 1, "rdzv_id": "warm-1",
                          "rdzv_endpoint": f"127.0.0.1:{free_port('127.0.0.1')}"})
    asyncio.run(platform.launch(spec1))
    assert platform.nodes["node0"].pid not in warm
    asyncio.run(platform.teardown(0.5))


def test_a_warm_agent_imported_under_another_environment_becomes_a_cold_one_for_the_node(tmp_path):
    """A warm agent imported torch under the controller's environment; a job whose environment
    differs in what an import may read (here PYTHONPATH) gets an agent that imported under its
    own: the same pid (still the node the platform tracks), its ranks see the job's sys.path."""
    import sys

    from supervisor.platforms.base import LaunchSpec
    from supervisor.platforms.base import free_port

    extra = tmp_path / "job-site"
    extra.mkdir()
    platform = LocalPlatform(1, tmp_path, warm_agents=True)
    platform.warm_up()
    (warm,) = platform.warm_pids
    env = {"SUPERVISOR_JOB": "env-test", "PYTHONPATH": f"{extra}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    spec = LaunchSpec(attempt=0, nodes=["node0"], nnodes_min=1, nnodes_max=1, nproc_per_node=1,
                      command=[sys.executable, "-c", "import sys; print('on path', sys.argv[1] in sys.path)", str(extra)],
                      env=env, rdzv_endpoint=f"127.0.0.1:{free_port('127.0.0.1')}", rdzv_id="env-0")

    pid, status = launch_one_until_it_ends(platform, spec)
    assert pid == warm and status.state == NodeState.EXITED and status.exit_code == 0
    assert "on path True" in (tmp_path / "attempt-0" / "node0.log").read_text()


RANKS_THAT_END = """
import os, signal, sys, time
from pathlib import Path
here = Path(sys.argv[1])
if os.environ["LOCAL_RANK"] == "0":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its agent's stop cannot end it: the agent stays up
    (here / "rank0.pid").write_text(str(os.getpid()))
    time.sleep(300)
else:
    while not (here / "rank0.pid").exists():
        time.sleep(0.02)
    (here / "rank1.pid").write_text(str(os.getpid()))
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(7)
"""


@pytest.mark.skipif(not (hasattr(os, "pidfd_open") and hasattr(os, "P_PIDFD")),
                    reason="no pidfds here (Linux < 5.4): the agents' exits tell a rank's end, later")
@pytest.mark.parametrize("fork, how, status", [(True, "exit", 7), (True, "kill", -9), (False, "kill", -9)],
                         ids=["forked-exit-7", "forked-sigkill", "new-interpreter-sigkill"])
def test_the_agent_tells_how_a_rank_ended_while_it_still_runs(tmp_path, fork, how, status):
    """A rank's end reaches the platform from its agent at once (``NodeStatus.exit_codes``), while
    the agent itself still runs (here it waits on a sibling that ignores its SIGTERM, as a rank
    stuck in a collective does): the controller names the fault from it without waiting for the
    agent's exit, exactly as that exit would have named it."""
    import sys

    from supervisor.controller.decide import rank_ended
    from supervisor.platforms.base import LaunchSpec, free_port

    script = tmp_path / "ranks.py"
    script.write_text(RANKS_THAT_END)
    platform = LocalPlatform(1, tmp_path / "logs")
    spec = LaunchSpec(attempt=0, nodes=["node0"], nnodes_min=1, nnodes_max=1, nproc_per_node=2,
                      command=[sys.executable, str(script), str(tmp_path), how], env={"SUPERVISOR_JOB": "ends"},
                      rdzv_endpoint=f"127.0.0.1:{free_port('127.0.0.1')}", rdzv_id="ends-0", fork_ranks=fork)

    async def scenario():
        await platform.launch(spec)
        try:
            for _ in range(1200):
                node = (await platform.observe())["node0"]
                assert node.state == NodeState.RUNNING, f"the agent ended first: {node}"
                if node.exit_codes:
                    return node
                await asyncio.sleep(0.05)
            raise AssertionError("no rank's end was told")
        finally:
            await platform.teardown(0.2)

    node = asyncio.run(scenario())
    pids = {r: int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)}
    assert [(pid, code) for pid, code, _ in node.exit_codes] == [(pids[1], status)]
    assert pids[1] in node.exited_pids and pids[0] not in node.exited_pids
    where = {0: "node0", 1: "node0"}
    if how == "exit":  # a failure code is named once the rank's own last words are in (these ranks have none)
        assert rank_ended({"node0": node}, now=1.0, rank_pids=pids, rank_nodes=where) is None
    said = {"failed_ranks": {1: False}, "failed_errors": {1: "SystemExit: 7"}} if how == "exit" else {}
    fault = rank_ended({"node0": node}, now=1.0, rank_pids=pids, rank_nodes=where, **said)
    assert fault is not None and fault.ranks == (1,) and fault.nodes == ("node0",)
    assert fault.detail == ("rank 1 killed by signal 9 (SIGKILL)" if how == "kill" else "rank 1 crashed: SystemExit: 7")
