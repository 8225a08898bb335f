"""Adoption on the local platform never touches a stranger's process: a pid from the state file
is adopted and signalled only while its start time is the one saved. Real processes."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from supervisor.platforms.base import NodeState
from supervisor.platforms.local import LocalPlatform
from supervisor.procfs import start_time


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
