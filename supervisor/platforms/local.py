"""The ``local`` platform: every node is a real torchrun agent in its own process group.

The embedded default: a job with several "nodes" on one machine and no cluster at all. Each
agent runs torchrun (``python -m supervisor.platforms.node.forking_agent``) with c10d rendezvous on the controller's
TCPStore (``--nnodes N:N``, ``--max-restarts 0``: recovery is the controller's job), in
a new session so that a controller crash kills nothing. torchrun puts every rank in a session of its own,
so the platform tracks each agent's descendants and signals the agent's group and every
rank's: killing a node kills all its processes. Agents' output goes to
``LOG_DIR/attempt-K/NODE.log``. Each agent records how each of its ranks ended the moment it
ends (``LOG_DIR/attempt-K/NODE-exits/PID``, :data:`~supervisor.protocol.Env.RANK_EXITS`); a
running node reports those as ``NodeStatus.exit_codes``, ~1 s before the agent's own exit.

After a controller restart the gang is adopted from the state file: pids are checked in
``/proc`` (a zombie counts as gone; this machine's PID 1 reaps slowly) and exit codes of
adopted agents are unknown (``LOST`` unless the ranks reported completion). Every pid is saved
with its process start time and signalled or adopted only while that still matches: a pid
reused by an unrelated process (after a reboot or a long outage) is never adopted nor killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from supervisor.files import set_aside
from supervisor.platforms.node.agent import (AGENT_MODULE, agent_env, failure_fields, node_rank, note_uncopied_output,
                                             torchrun_argv)
from supervisor.platforms.base import LaunchSpec, NodeState, NodeStatus, Platform, PlatformError
from supervisor.procfs import children, descendants, pid_alive, proc_state, process_tree, start_time
from supervisor.protocol import Env, ranklog

log = logging.getLogger("supervisor.platform.local")


def read_rank_exit(directory: Path, pid: int) -> tuple[float, int] | None:
    """(when, exit status) of rank process ``pid`` as its agent recorded it, or None (not yet, or
    not readable: the agent's exit tells then)."""
    try:
        with open(directory / str(pid), "rb") as f:
            record = json.loads(f.read(4096))
        code, at = record["exit_code"], record["at"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(code, bool) or not isinstance(code, int) or not isinstance(at, (int, float)):
        return None
    return float(at), code


class _Node:
    def __init__(self, name: str, attempt: int, pid: int, popen: subprocess.Popen | None,
                 started: int | None) -> None:
        self.name = name
        self.attempt = attempt
        self.pid = pid
        self.popen = popen
        self.started = started
        """The agent's start time (clock ticks since boot, from /proc): tells a reused pid apart."""
        self.killed_by_us = False
        self.exit_code: int | None = None
        self.gone = False
        self.report: dict = {}  # what the agent's log says of its failed ranks, read once (agent.failure_fields)
        # torchrun starts every worker in a session of its own, so killing the agent's process
        # group does not reach the ranks: remember them (pid -> start time, against pid reuse)
        self.ranks: dict[int, int | None] = {}
        # the agent's own children (its ranks) and those that ended while it ran on: an agent
        # allowed to restart in place starts new ones
        self.workers: dict[int, int | None] = {}
        self.exited: list[int] = []
        self.exit_dir: Path | None = None  # where the agent records its ranks' ends (Env.RANK_EXITS)
        self.exit_codes: dict[int, tuple[float, int]] = {}  # pid -> (when, exit status), as the agent recorded them

    def agent_is_ours(self) -> bool:
        """The agent's pid still names the process this node started (running, or a zombie not
        yet reaped), not another one that got the pid since."""
        return self.started is not None and start_time(self.pid) == self.started

    def track_ranks(self, tree: dict[int, list[int]] | None = None) -> None:
        if not self.agent_is_ours():  # a stranger's children are not our ranks
            return
        tree = process_tree() if tree is None else tree
        for pid in descendants(self.pid, tree):
            if pid not in self.ranks:
                self.ranks[pid] = start_time(pid)
        for pid in children(self.pid, tree):
            if pid not in self.workers:
                self.workers[pid] = self.ranks.get(pid) or start_time(pid)

    def track_exits(self) -> None:
        """Note the agent's ranks that ended (the agent itself still running)."""
        for pid, started in self.workers.items():
            if pid not in self.exited and not (pid_alive(pid) and start_time(pid) == started):
                self.exited.append(pid)
        if self.exit_dir is not None:
            for pid in self.exited:
                if pid not in self.exit_codes and (told := read_rank_exit(self.exit_dir, pid)) is not None:
                    self.exit_codes[pid] = told

    def told_exits(self) -> tuple[tuple[int, int, float], ...]:
        """(pid, exit status, when) of the ended ranks whose status the agent recorded, oldest first."""
        return tuple(sorted(((pid, code, at) for pid, (at, code) in self.exit_codes.items()), key=lambda e: e[2]))

    def live_ranks(self) -> list[int]:
        return [pid for pid, started in self.ranks.items()
                if started is not None and pid_alive(pid) and start_time(pid) == started]


class LocalPlatform(Platform):
    kind = "local"
    kills_ranks = True

    def __init__(self, slots: int, log_dir: Path, python: str = sys.executable, *, warm_agents: bool = False) -> None:
        if slots < 1:
            raise ValueError("the local platform needs at least one node slot")
        self._slots = [f"node{i}" for i in range(slots)]
        self.log_dir = Path(log_dir)
        self.python = python
        self.nodes: dict[str, _Node] = {}
        self._launched: set[int] = set()  # attempts this object launched (a retried launch appends)
        self.warm_agents = warm_agents
        self._warm: list[subprocess.Popen] = []
        """Agents that have imported torch (or are importing it), waiting for a node (warm_agent)."""

    def warm_up(self) -> list[int]:
        """Keep one waiting agent per slot (:mod:`supervisor.platforms.node.warm_agent`): a launch then
        hands each node to one that has already imported torch. They carry the job's log marker
        in their environment (``--fresh`` finds them) and end by themselves when this process
        goes (their stdin is a pipe from it)."""
        if not self.warm_agents:
            return []
        self._warm = [p for p in self._warm if p.poll() is None]
        env = dict(os.environ) | {Env.LOG_DIR: str(self.log_dir.resolve() / ranklog.RANKS_DIR)}
        while len(self._warm) < len(self._slots):
            try:
                p = subprocess.Popen([self.python, "-m", "supervisor.platforms.node.warm_agent"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, cwd=os.getcwd())
            except OSError as exc:
                log.warning("event=warm_agent_failed error=%s (agents start cold)", exc)
                break
            self._warm.append(p)
        return self.warm_pids

    @property
    def warm_pids(self) -> list[int]:
        """The waiting agents' pids (alive or not yet reaped)."""
        return [p.pid for p in self._warm]

    def _hand_over(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen | None:
        """A waiting agent made this node's agent, or None (none alive: the caller starts one cold)."""
        if argv[1:3] != ["-m", AGENT_MODULE]:
            return None
        while self._warm:
            p = self._warm.pop(0)
            if p.poll() is not None:
                continue
            line = json.dumps({"argv": argv[3:], "env": env, "log": str(log_path), "cwd": os.getcwd()}) + "\n"
            try:
                assert p.stdin is not None
                p.stdin.write(line.encode())
                p.stdin.close()
            except (OSError, ValueError):
                p.kill()
                continue
            return p
        return None

    def slots(self) -> list[str]:
        return list(self._slots)

    def banner(self, cfg) -> str:
        return (f"supervisor: job {cfg.job}: {cfg.nodes.min}-{cfg.nodes.max} nodes x {cfg.nproc_per_node} "
                f"(slots: {cfg.node_slots}); events and state in {cfg.log_dir}; the job's own output in "
                f"{cfg.log_dir}/attempt-K/NODE.log (each line prefixed [rankN]:); watch with "
                f"`supervisor status --log-dir {cfg.log_dir}`")

    async def launch(self, spec: LaunchSpec) -> None:
        unknown = set(spec.nodes) - set(self._slots)
        if unknown:
            raise PlatformError(f"unknown node slots {sorted(unknown)}")
        out_dir = self.log_dir / f"attempt-{spec.attempt}"
        if spec.attempt not in self._launched and out_dir.exists():
            # an earlier run of this log directory used this attempt number: keep its output
            # apart (its failures must not be read as this run's)
            aside = set_aside(out_dir, "before", when=out_dir.stat().st_mtime)
            log.info("event=node_logs_set_aside attempt=%d old=%s", spec.attempt, aside)
        self._launched.add(spec.attempt)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.nodes = {}
        for name in spec.nodes:
            argv = torchrun_argv(self.python, spec, rank=node_rank(spec.nodes, name))
            exit_dir = out_dir / f"{name}-exits"
            env = dict(os.environ) | agent_env(spec, name, out_dir / f"{name}-tmp") | {Env.RANK_EXITS: str(exit_dir)}
            Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
            popen = self._hand_over(argv, env, out_dir / f"{name}.log")
            if popen is None:
                out = open(out_dir / f"{name}.log", "ab")
                try:
                    popen = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True, cwd=os.getcwd())
                except OSError as exc:
                    raise PlatformError(f"cannot start the agent of {name}: {exc}") from exc
                finally:
                    out.close()
            # not reaped yet, so /proc still has it even if it already exited
            self.nodes[name] = _Node(name, spec.attempt, popen.pid, popen, start_time(popen.pid))
            self.nodes[name].exit_dir = exit_dir
            log.info("event=node_launched node=%s attempt=%d pid=%d warm=%s", name, spec.attempt, popen.pid,
                     "yes" if popen.stdin is not None else "no")

    async def observe(self) -> dict[str, NodeStatus]:
        result = {}
        tree = process_tree() if any(not n.gone for n in self.nodes.values()) else {}
        for name, node in self.nodes.items():
            if not node.gone:
                node.track_ranks(tree)
            if not node.gone:
                if node.popen is not None:
                    code = node.popen.poll()
                    if code is not None:
                        node.gone, node.exit_code = True, code
                elif not (pid_alive(node.pid) and node.agent_is_ours()):
                    node.gone = True
            if node.gone:
                state = NodeState.EXITED if node.exit_code is not None else NodeState.LOST
            else:
                state = NodeState.RUNNING
                node.track_exits()
            result[name] = NodeStatus(
                name=name, attempt=node.attempt, state=state, exit_code=node.exit_code,
                killed_by_us=node.killed_by_us, pid=node.pid, exited_pids=tuple(node.exited),
                exit_codes=node.told_exits() if state == NodeState.RUNNING else (),
                stopped=not node.gone and proc_state(node.pid) == "T",
                **await failure_fields(self.log_dir / f"attempt-{node.attempt}" / f"{name}.log",
                                 node.exit_code if node.gone else None, node.report),
            )
        return result

    def _signal_group(self, node: _Node, sig: int) -> None:
        """Signal the node: the agent's process group and each rank's own session, and each
        process of the node by pid. Only pids whose start time is still the one recorded: a pid
        that another process holds now (the agent reaped, a reboot) is never signalled."""
        if not node.gone:
            node.track_ranks()
        groups = [node.pid] if node.agent_is_ours() else []
        tracked = node.live_ranks()
        for pgid in (*groups, *tracked):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:  # gone, or not a group leader (signalled by pid below)
                pass
            except PermissionError as exc:
                raise PlatformError(f"cannot signal {node.name}: {exc}") from exc
        for pid in tracked:  # what is left of a reaped agent's group
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    async def kill_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        node.killed_by_us = True
        self._signal_group(node, signal.SIGKILL)
        self._signal_group(node, signal.SIGCONT)  # a stopped process only dies once continued
        await self._wait_gone([node], timeout=10)
        await asyncio.to_thread(self._note_uncopied_output, [node])

    async def kill_ranks(self, name: str, pids) -> bool:
        node = self.nodes.get(name)
        if node is None or node.gone or not pids:
            return False
        node.track_ranks()
        mine = set(node.live_ranks())
        if not set(pids) <= mine:
            log.warning("event=kill_ranks_refused node=%s pids=%s (not this node's live ranks: %s)", name,
                        list(pids), sorted(mine))
            return False
        for pid in pids:
            for sig in (signal.SIGKILL, signal.SIGCONT):  # a stopped process only dies once continued
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        log.info("event=ranks_killed node=%s pids=%s (its agent runs on)", name, list(pids))
        return True

    async def teardown(self, grace_s: float) -> None:
        """SIGTERM every process of the gang; once its ranks have ended (or ``grace_s`` ran out)
        SIGKILL what is left. The grace is the ranks' (an emergency checkpoint, a last heartbeat):
        an agent whose ranks are gone is not waited for (its orderly exit cost ~1.2 s a restart)."""
        live = [n for n in self.nodes.values() if not n.gone]
        for node in live:
            node.killed_by_us = True
            self._signal_group(node, signal.SIGTERM)
            self._signal_group(node, signal.SIGCONT)
        await self._wait_gone(live, timeout=grace_s, agents=False)
        for node in live:
            self._signal_group(node, signal.SIGKILL)
        await self._wait_gone(live, timeout=10)
        for node in live:  # ranks that outlived their agent
            self._signal_group(node, signal.SIGKILL)
        await asyncio.to_thread(self._note_uncopied_output, live)

    def _note_uncopied_output(self, nodes: list[_Node]) -> None:
        """A killed agent may not have copied its ranks' last lines (a traceback) to its node log:
        the log then names the files that hold them."""
        for node in nodes:
            if node.exit_code == -signal.SIGKILL:
                out_dir = self.log_dir / f"attempt-{node.attempt}"
                if note_uncopied_output(out_dir / f"{node.name}.log", out_dir / f"{node.name}-tmp"):
                    log.info("event=node_log_incomplete node=%s attempt=%d (its ranks' own files are named at "
                             "its end)", node.name, node.attempt)

    async def _wait_gone(self, nodes: list[_Node], timeout: float, *, agents: bool = True) -> None:
        """Until every rank of ``nodes`` has ended, and their agents too unless ``agents`` is False."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await self.observe()
            if all((n.gone or not agents) and not n.live_ranks() for n in nodes):
                return
            await asyncio.sleep(0.05)

    def lock_owner(self):
        # a local job may run inside a Slurm allocation (supervisor launch under sbatch): its lock
        # then names that run, so that a requeued one takes the job over at once
        from supervisor.platforms.slurm.lock import SlurmLockOwner

        return SlurmLockOwner(os.environ)

    def describe(self) -> dict:
        return {"nodes": {n.name: {"pid": n.pid, "start": n.started, "attempt": n.attempt,
                                   "ranks": {str(p): t for p, t in n.ranks.items()}} for n in self.nodes.values()}}

    async def adopt(self, saved: dict, attempt: int) -> bool:
        nodes = (saved or {}).get("nodes") or {}
        self.nodes = {}
        for name, info in nodes.items():
            if name not in self._slots or info.get("attempt") != attempt:
                continue
            started = info.get("start")
            node = _Node(name, attempt, int(info["pid"]), None, started if type(started) is int else None)
            node.ranks = {int(p): t for p, t in (info.get("ranks") or {}).items()}
            node.gone = not (pid_alive(node.pid) and node.agent_is_ours())
            if node.gone and pid_alive(node.pid):
                log.warning("event=adopt_refused node=%s pid=%d reason=%s (left alone)", name, node.pid,
                            "no start time saved" if node.started is None else
                            f"the pid now belongs to another process (started at {start_time(node.pid)}, "
                            f"the agent at {node.started})")
            self.nodes[name] = node
        return any(not n.gone for n in self.nodes.values())


def from_config(cfg, log_dir: Path) -> LocalPlatform:
    """The platform of a JobConfig with ``platform.kind: local`` (the registry's builder)."""
    return LocalPlatform(cfg.node_slots, log_dir, warm_agents=cfg.platform.warm_agents)
