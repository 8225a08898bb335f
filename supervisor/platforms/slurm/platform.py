"""The ``slurm`` platform's state machine: :class:`SlurmPlatform`, one ``srun`` step per node.

It keeps what it knows of the job (its nodes' steps, srun clients, exit codes, the nodes found
unresponsive, Slurm's last answer) and decides from it; every Slurm command it needs goes
through its :class:`~supervisor.platforms.slurm.client.SlurmClient`. The traps it is built
around are listed in :mod:`supervisor.platforms.slurm`.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from supervisor.files import set_aside
from supervisor.platforms.node.agent import agent_env, failure_fields, node_rank, torchrun_argv
from supervisor.platforms.base import LaunchSpec, NodeState, NodeStatus, Platform, PlatformError
from supervisor.platforms.slurm.client import (SlurmClient, node_state_is_bad, srun_env, srun_exit_code,
                                               srun_log_says_node_failed)
from supervisor.platforms.slurm.hostlist import expand_hostlist
from supervisor.platforms.slurm.lock import SlurmLockOwner
from supervisor.platforms.slurm.guard import MARKER, GuardConfig, guard_argv
from supervisor.procfs import pid_alive, proc_state, start_time

log = logging.getLogger("supervisor.platform.slurm")


# ---------------------------------------------------------------------------- state
@dataclass
class _Node:
    name: str
    attempt: int
    step_name: str
    log_path: Path
    popen: subprocess.Popen | None = None
    srun_pid: int | None = None
    srun_start: int | None = None       # the srun client's start time (/proc): tells a reused pid apart
    step_id: str | None = None          # "J.S" once Slurm lists it
    killed_by_us: bool = False
    exit_code: int | None = None
    lost: bool = False
    gone: bool = False                  # the srun client has ended (or, adopted, the step vanished)
    cancelled_at: float | None = None
    report: dict = field(default_factory=dict)  # the agent's account of its failed ranks, read once


@dataclass
class _Guard:
    """A node's standing guard: its srun client on this host."""

    node: str
    popen: subprocess.Popen


@dataclass
class _View:
    """What Slurm said at the last successful poll."""

    at: float = 0.0
    job_state: str = ""
    alloc_nodes: list[str] = field(default_factory=list)
    steps: dict[str, tuple[str, str]] = field(default_factory=dict)   # step name -> (step id, nodes)
    node_states: dict[str, str] = field(default_factory=dict)


class SlurmPlatform(Platform):
    kind = "slurm"

    def __init__(self, job_id: str, log_dir: Path, *, job: str = "job", python: str = sys.executable,
                 command_timeout_s: float = 20.0, poll_interval_s: float = 2.0, launch_timeout_s: float = 60.0,
                 kill_confirm_s: float = 10.0, overlap: bool = True, srun_args: Sequence[str] = (),
                 bin_dir: str = "", base_env: Mapping[str, str] | None = None, controller_timeout_s: float = 60.0,
                 controller_probe_s: float = 5.0, requeue_on_loss: bool = False,
                 warning_signal: str = "USR1") -> None:
        if not job_id:
            raise PlatformError("no Slurm job: run inside an sbatch allocation (SLURM_JOB_ID) or set "
                                "platform.slurm.job_id")
        self.job_id = str(job_id)
        self.log_dir = Path(log_dir)
        self.job = job
        self.python = python
        self.timeout = command_timeout_s
        self.poll_interval = poll_interval_s
        self.launch_timeout = launch_timeout_s
        self.kill_confirm = kill_confirm_s
        self.overlap = overlap
        self.srun_args = list(srun_args)
        self.bin_dir = bin_dir
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.restart_count = self.base_env.get("SLURM_RESTART_COUNT", "0")
        self.nodes: dict[str, _Node] = {}
        self.unresponsive: set[str] = set()
        self.view = _View()
        self.addrs: dict[str, str] = {}
        self.batch_host = ""
        self.last_error = ""
        self._last_error_logged = 0.0
        self._poll_lock = asyncio.Lock()
        self._launched_attempts: set[int] = set()
        self._notices: list[tuple[str, dict]] = []
        self._loss_picked_up = False  # the controller-lost marker is read at the first notices()
        # a standing node guard per node for the job's life (0: none): ends the job when the controller is lost
        self.controller_timeout = controller_timeout_s
        self.controller_probe = controller_probe_s
        self.guards: dict[str, _Guard] = {}
        self.guard_api = ""
        self.requeue_on_loss = requeue_on_loss
        self.warning_signal = signal.Signals["SIG" + warning_signal.upper().removeprefix("SIG")]
        # every Slurm command of this platform goes through its client
        self.client = SlurmClient(bin_dir=bin_dir, timeout=command_timeout_s, base_env=self.base_env)

    # ------------------------------------------------------------------ start-up
    def start(self) -> "SlurmPlatform":
        """Read the allocation once (synchronously, at start-up): nodes, addresses, batch host."""
        fields = self.client.show_job_sync(self.job_id)
        state = fields.get("JobState", "")
        if state not in ("RUNNING", "COMPLETING", "CONFIGURING"):
            raise PlatformError(f"Slurm job {self.job_id} is {state or 'unknown'}, not running")
        self.batch_host = fields.get("BatchHost", "")
        # the controller-lost marker is not read here but at the first notices(): the controller
        # asks for them only once it holds the job's lock, so a second submission refused by that
        # lock never sets aside the running job's marker
        self.restart_count = fields.get("Restarts", self.restart_count)
        nodes = expand_hostlist(fields.get("NodeList", ""))
        self.view = _View(at=time.monotonic(), job_state=state, alloc_nodes=nodes)
        self._read_addrs_sync(nodes)
        log.info("event=slurm_allocation job=%s nodes=%s batch_host=%s", self.job_id, nodes, self.batch_host)
        return self

    def _read_addrs_sync(self, nodes: list[str]) -> None:
        if not nodes:
            return
        for name, f in self.client.show_nodes_sync(nodes).items():
            self.addrs[name] = f.get("NodeAddr") or name
            self.view.node_states[name] = f.get("State", "").lower()

    def node_addr(self, name: str) -> str:
        return self.addrs.get(name, name)

    # ------------------------------------------------------------------ observation
    async def poll(self, force: bool = False) -> _View:
        """Refresh the live node list, node states and steps; PlatformError if Slurm does not answer."""
        async with self._poll_lock:
            now = time.monotonic()
            if not force and now - self.view.at < self.poll_interval:
                return self.view
            job = await self.client.job(self.job_id)
            if job is None:
                view = _View(at=time.monotonic(), job_state="GONE")
            else:
                state, alloc_nodes = job
                view = _View(at=0.0, job_state=state, alloc_nodes=alloc_nodes)
                view.steps.update(await self.client.steps(self.job_id))
                if view.alloc_nodes:
                    view.node_states.update(await self.client.node_states(view.alloc_nodes))
                view.at = time.monotonic()
            self.view = view
            if self.last_error:
                log.warning("event=slurm_answering_again job=%s (after: %s)", self.job_id, self.last_error)
                self.last_error = ""
            for name, st in view.node_states.items():
                if node_state_is_bad(st):
                    if name not in self.unresponsive:
                        log.warning("event=node_unresponsive node=%s slurm_state=%s", name, st)
                    self.unresponsive.add(name)
            for name in [n for n in self.nodes if n not in view.alloc_nodes and view.job_state != "GONE"]:
                self.unresponsive.add(name)
            return view

    async def _poll_quietly(self) -> None:
        try:
            await self.poll()
        except PlatformError as exc:
            self.last_error = str(exc)
            now = time.monotonic()
            if now - self._last_error_logged > 30:
                self._last_error_logged = now
                log.error("event=slurm_unavailable job=%s error=%s (the steps keep running; state kept; retrying)",
                          self.job_id, exc)
            self.view.at = now  # do not hammer a controller that is down: retry after poll_interval

    def slots(self) -> list[str]:
        """The allocation's live nodes (Slurm's current list, not SLURM_JOB_NODELIST), less the
        nodes found unresponsive."""
        return [n for n in self.view.alloc_nodes if n not in self.unresponsive]

    async def observe(self) -> dict[str, NodeStatus]:
        await self._poll_quietly()
        result = {}
        for name, node in self.nodes.items():
            self._update(node)
            if node.gone:
                state = NodeState.LOST if node.lost or node.exit_code is None else NodeState.EXITED
            else:
                state = NodeState.RUNNING
            result[name] = NodeStatus(
                name=name, attempt=node.attempt, state=state,
                exit_code=None if state == NodeState.LOST else node.exit_code,
                killed_by_us=node.killed_by_us, pid=node.srun_pid,
                stopped=name in self.unresponsive or (not node.gone and node.popen is not None
                                                      and proc_state(node.popen.pid) == "T"),
                **await failure_fields(node.log_path, node.exit_code if state == NodeState.EXITED else None, node.report),
            )
        return result

    def _update(self, node: _Node) -> None:
        if node.step_id is None and node.step_name in self.view.steps:
            node.step_id = self.view.steps[node.step_name][0]
        if node.gone:
            return
        if node.popen is not None:
            code = node.popen.poll()
            if code is None:
                return
            node.gone = True
            node.exit_code = srun_exit_code(code)
            if code != 0 and (node.name in self.unresponsive or srun_log_says_node_failed(node.log_path)):
                node.lost = True
            if code != 0:
                log.warning("event=step_ended node=%s attempt=%d step=%s srun_exit=%d lost=%s", node.name,
                            node.attempt, node.step_id, code, node.lost)
        else:  # adopted: no client of ours; the step's presence is all we know
            alive = _client_is_ours(node)
            if not alive and self.view.at and node.step_name not in self.view.steps and not self.last_error:
                node.gone, node.lost = True, True

    # ------------------------------------------------------------------ the standing node guards
    async def serving(self, api: str) -> None:
        """The controller holds the job and answers at ``api``: start the standing node guards
        (:mod:`supervisor.platforms.slurm.guard`), one step per node of the allocation, before
        anything is launched. They are not the agents' steps (no teardown touches them), so they
        watch the controller through the job's whole life: start-up, a teardown and the relaunch
        after it, launch retries. Guards a previous controller of this run left (a supervisor
        restarted inside the allocation) watch that one's address: they are cancelled first. Never
        raises: a node whose guard cannot start now gets one at the next launch."""
        if not self.controller_timeout > 0:
            return
        host, _, port = api.removeprefix("http://").rpartition(":")
        if host.strip("[]") in ("0.0.0.0", "::", "") and self.batch_host:
            api = f"http://{self.node_addr(self.batch_host)}:{port}"  # a wildcard: the nodes dial the batch host
        self.guard_api = api
        try:
            view = await self.poll(force=True)
            old = [sid for name, (sid, _) in view.steps.items()
                   if name.startswith(self.guard_step_name("")) and sid.startswith(f"{self.job_id}.")]
            if old:
                log.warning("event=old_node_guards_cancelled steps=%s (a previous controller's)", old)
                await self.client.scancel(old, "KILL", ctld=True)
        except PlatformError as exc:
            log.error("event=node_guards_unchecked error=%s (starting them anyway)", exc)
        self._start_guards()

    def guard_step_name(self, node: str) -> str:
        return f"sv-{self.job}-guard-{node}"

    def _start_guards(self) -> None:
        """A guard on every live node of the allocation that has none running."""
        if not (self.controller_timeout > 0 and self.guard_api):
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in self.slots():
            running = self.guards.get(name)
            if running is not None and running.popen.poll() is None:
                continue
            cfg = GuardConfig(job_id=self.job_id, api=self.guard_api, job=self.job, node=name,
                              log_dir=self.log_dir.parent, timeout_s=self.controller_timeout,
                              probe_s=self.controller_probe, action="requeue" if self.requeue_on_loss else "cancel",
                              restart_count=str(self.restart_count), command_timeout_s=self.timeout,
                              bin_dir=self.bin_dir)
            # --overlap: it shares the node's CPUs, memory and GRES with every step, the agents' too
            # (with or without their own --overlap): it neither holds nor waits for what they need
            argv = [*self.client.srun_argv(self.job_id, name, self.guard_step_name(name), overlap=True),
                    *guard_argv(self.python, cfg)]
            out = open(self.log_dir / f"guard-{name}.srun.log", "ab")  # srun's own lines; the guard's go to guard-NODE.log
            try:
                popen = self.client.start_step(argv, env=srun_env(self.base_env, {}), output=out)
            except OSError as exc:
                log.error("event=node_guard_not_started node=%s error=%s", name, exc.strerror or exc)
                continue
            finally:
                out.close()
            self.guards[name] = _Guard(name, popen)
            log.info("event=node_guard_started node=%s srun_pid=%d api=%s", name, popen.pid, self.guard_api)

    async def stop_guards(self, wait_s: float = 5.0) -> None:
        """End the standing guards: the controller is ending, and so is the job. ``scancel --ctld
        --signal=TERM`` of their steps (a SIGTERM to an srun client makes it kill its step at once):
        a guard ends on it at once, without acting. A client still there after ``wait_s`` is
        killed (Slurm ends the step with the job)."""
        live = [g for g in self.guards.values() if g.popen.poll() is None]
        if not live:
            return
        try:
            view = await self.poll(force=True)
            names = [self.guard_step_name(g.node) for g in live]
            await self.client.scancel([view.steps[n][0] for n in names if n in view.steps], "TERM", ctld=True)
        except PlatformError as exc:
            log.warning("event=node_guards_unsignalled error=%s (ending their srun clients)", exc)
        deadline = time.monotonic() + wait_s
        while any(g.popen.poll() is None for g in live) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for g in live:
            if g.popen.poll() is None:
                try:
                    os.killpg(g.popen.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        log.info("event=node_guards_stopped nodes=%s", [g.node for g in live])

    # ------------------------------------------------------------------ launch
    def agent_argv(self, spec: LaunchSpec, node: str, host_node: str) -> list[str]:
        port = spec.rdzv_endpoint.rsplit(":", 1)[1]
        endpoint = f"{self.node_addr(host_node)}:{port}"
        srun = self.client.srun_argv(self.job_id, node, self.step_name(spec.attempt, node), overlap=self.overlap,
                                     srun_args=self.srun_args)
        # the host node's agent serves the rendezvous store; every other agent is its client
        return [*srun, *torchrun_argv(self.python, spec, endpoint=endpoint, is_host=node == host_node,
                                      rank=node_rank(spec.nodes, node, host_node))]

    def step_name(self, attempt: int, node: str) -> str:
        return f"sv-{self.job}-a{attempt}-{node}"

    async def launch(self, spec: LaunchSpec) -> None:
        view = await self.poll(force=True)
        missing = [n for n in spec.nodes if n not in view.alloc_nodes]
        if missing:
            raise PlatformError(f"nodes {missing} are not in allocation {self.job_id} (live: {view.alloc_nodes})")
        if any(n not in self.addrs for n in spec.nodes):
            await self._read_addrs(list(spec.nodes))
        host_node = self.batch_host if self.batch_host in spec.nodes else spec.nodes[0]
        self._start_guards()  # a node whose guard could not start (or ended) gets one again
        out_dir = self._attempt_dir(spec.attempt)
        self.nodes = {}
        for name in spec.nodes:
            node = _Node(name, spec.attempt, self.step_name(spec.attempt, name), out_dir / f"{name}.log")
            tmp = out_dir / f"{name}-tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            env = srun_env(self.base_env, agent_env(spec, name, tmp))
            argv = self.agent_argv(spec, name, host_node)
            out = open(node.log_path, "ab")
            try:
                node.popen = self.client.start_step(argv, env=env, output=out)
            except OSError as exc:
                await self._abort_launch()
                raise PlatformError(f"cannot start srun for {name}: {exc.strerror or exc}") from None
            finally:
                out.close()
            node.srun_pid = node.popen.pid
            node.srun_start = start_time(node.popen.pid)  # not reaped yet: /proc still has it
            self.nodes[name] = node
            log.info("event=node_launched node=%s attempt=%d srun_pid=%d step_name=%s", name, spec.attempt,
                     node.srun_pid, node.step_name)
        await self._wait_steps_listed()

    def _attempt_dir(self, attempt: int) -> Path:
        """``LOG_DIR/slurm/attempt-K``, holding this platform's own node logs only.

        A requeued job (or a new run in the same log directory) starts again at attempt 0: its
        srun output appended to the old ``attempt-0/NODE.log`` would show every line twice, the
        old run's and the new one's. The first launch of an attempt by this platform object sets
        an older folder of that name aside (``attempt-K.before-TIME``); a retried launch of the
        same attempt keeps appending."""
        out_dir = self.log_dir / f"attempt-{attempt}"
        if attempt not in self._launched_attempts and out_dir.exists():
            aside = set_aside(out_dir, "before", when=out_dir.stat().st_mtime)
            log.info("event=node_logs_set_aside attempt=%d old=%s (written by an earlier run of this log directory)",
                     attempt, aside)
        self._launched_attempts.add(attempt)
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir

    async def _read_addrs(self, nodes: list[str]) -> None:
        for name, f in (await self.client.show_nodes(nodes)).items():
            self.addrs[name] = f.get("NodeAddr") or name

    async def _wait_steps_listed(self) -> None:
        deadline = time.monotonic() + self.launch_timeout
        while True:
            view = await self.poll(force=True)
            for node in self.nodes.values():
                self._update(node)
                if node.gone and node.step_id is None and node.exit_code not in (0, None):
                    tail = _tail_file(node.log_path)
                    await self._abort_launch()
                    raise PlatformError(f"srun for {node.name} exited {node.exit_code} before its step started: {tail}")
            if all(n.step_id is not None or n.gone for n in self.nodes.values()):
                return
            if time.monotonic() > deadline:
                waiting = [n.name for n in self.nodes.values() if n.step_id is None]
                tails = "; ".join(f"{n}: {_tail_file(self.nodes[n].log_path)}" for n in waiting)
                await self._abort_launch()
                raise PlatformError(f"steps for {waiting} not started after {self.launch_timeout:g}s ({tails})")
            await asyncio.sleep(0.1 if view.steps else 0.2)

    async def _abort_launch(self) -> None:
        try:
            await self.teardown(1.0)
        except PlatformError as exc:
            log.error("event=launch_cleanup_failed error=%s", exc)

    # ------------------------------------------------------------------ killing
    def _listed_ids(self, nodes: list[_Node]) -> list[str]:
        """Step ids worth cancelling: those Slurm still lists (all we know of, if it does not answer)."""
        for n in nodes:
            self._update(n)
        return [n.step_id for n in nodes if n.step_id and (n.step_name in self.view.steps or self.last_error)]

    def _kill_client(self, node: _Node) -> None:
        if node.popen is not None:
            if node.popen.returncode is not None:
                return  # ended and reaped: its pid may be another process's by now
            pid = node.popen.pid
        elif _client_is_ours(node):  # adopted: only while the pid is still that srun
            pid = node.srun_pid
        else:
            return
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    async def kill_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        node.killed_by_us = True
        await self._kill([node])

    async def _kill(self, nodes: list[_Node]) -> None:
        """SIGKILL the steps through slurmctld, end our srun clients, wait for Slurm to confirm.

        ``scancel --ctld --signal=KILL J.S`` (no SIGTERM first, no ``KillWait``) is answered by
        slurmctld at once, on a dead node too; without ``--ctld`` scancel waits on the node's
        slurmd (``MessageTimeout``, docs/slurm.md). A failed scancel is logged, not raised: the
        clients are ended anyway and a step that Slurm still lists kill_confirm_s after the
        cancel marks its node unresponsive."""
        try:
            await self.poll(force=True)
        except PlatformError as exc:
            self.last_error = str(exc)
        ids = self._listed_ids([n for n in nodes if n.name not in self.unresponsive])
        try:
            await self.client.scancel(ids, "KILL", ctld=True)
        except PlatformError as exc:
            log.warning("event=scancel_failed steps=%s error=%s", ids, exc)
        now = time.monotonic()
        for n in nodes:
            n.cancelled_at = n.cancelled_at or now
            self._kill_client(n)
        await self._confirm_gone(nodes)

    async def _confirm_gone(self, nodes: list[_Node]) -> None:
        """Wait until our clients ended and Slurm no longer lists the steps; a step still listed
        after kill_confirm_s is on a node that cannot answer."""
        deadline = time.monotonic() + self.kill_confirm
        while True:
            for n in nodes:
                self._update(n)
            try:
                view = await self.poll(force=True)
            except PlatformError as exc:
                self.last_error = str(exc)
                log.error("event=kill_unconfirmed error=%s", exc)
                return
            # a node already found unresponsive (its state ends in '*', or it left the
            # allocation) cannot confirm: Slurm may list its step until it gives the node up
            listed = [n for n in nodes if n.step_name in view.steps and n.name not in self.unresponsive]
            if not listed and all(n.gone or n.popen is None for n in nodes):
                return
            if time.monotonic() > deadline:
                for n in listed:
                    if n.name not in self.unresponsive:
                        log.warning("event=node_unresponsive node=%s step=%s (cancelled %.1fs ago, still listed)",
                                    n.name, n.step_id, time.monotonic() - (n.cancelled_at or 0))
                    self.unresponsive.add(n.name)
                    n.gone, n.lost = True, True
                return
            await asyncio.sleep(0.1)

    async def teardown(self, grace_s: float) -> None:
        try:
            await self.poll(force=True)
        except PlatformError as exc:
            self.last_error = str(exc)
        for n in self.nodes.values():
            self._update(n)
        live = [n for n in self.nodes.values() if not n.gone or n.step_name in self.view.steps]
        if not live:
            return
        for n in live:
            n.killed_by_us = True
        healthy = [n for n in live if n.name not in self.unresponsive]
        ids = self._listed_ids(healthy)
        # With a node unresponsive, `scancel --signal` of the healthy steps waits on it too
        # (MessageTimeout, docs/slurm.md): signal through our srun clients, which forward it.
        direct = bool(self.unresponsive) and bool(healthy) and all(n.popen is not None for n in healthy)
        try:
            if direct:
                raise PlatformError(f"nodes {sorted(self.unresponsive)} unresponsive")
            await self.client.scancel(ids, "CONT")
            await self.client.scancel(ids, "TERM")  # ranks write their emergency checkpoint, if they can
        except PlatformError as exc:
            if not direct:
                log.warning("event=scancel_failed steps=%s error=%s (signalling through the srun clients)", ids, exc)
            for n in live:  # srun forwards SIGCONT and SIGTERM to its step
                if n.popen is not None and n.popen.poll() is None:
                    for sig in (signal.SIGCONT, signal.SIGTERM):
                        try:
                            n.popen.send_signal(sig)
                        except ProcessLookupError:
                            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            for n in live:
                self._update(n)
            if all(n.gone for n in live):
                break
            await asyncio.sleep(0.05)
        await self._kill(live)

    async def requeue(self) -> None:
        """``scontrol requeue`` this job: Slurm ends it and queues it again (same job id)."""
        await self.client.requeue(self.job_id)

    def _pick_up_controller_loss(self) -> None:
        """A node guard that ended this job because its controller was lost left a marker: report it
        once and set it aside, so that the guards of this run can claim the next loss. Called by the
        first :meth:`notices`, which the controller makes after it took the job's lock (a controller
        refused by the lock must leave the marker to the one that holds it)."""
        self._loss_picked_up = True
        marker = self.log_dir / MARKER
        try:
            record = json.loads(marker.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            record = {"error": f"unreadable marker: {exc}"}
        aside = set_aside(marker, "handled")
        self._notices.append(("controller_loss_recovered", {
            "lost": record if isinstance(record, dict) else {}, "marker": str(aside),
            "detail": "the previous controller of this job was lost (its batch host stopped answering) and a node "
                      "guard ended the job; this run continues from the newest verified checkpoint"}))

    def notices(self) -> list[tuple[str, dict]]:
        if not self._loss_picked_up:
            self._pick_up_controller_loss()
        out, self._notices = self._notices, []
        return out

    # ------------------------------------------------------------------ the controller's life here
    def prepare(self, cfg):
        return resolve_hosts(cfg, self)

    def banner(self, cfg) -> str:
        requeue = " and requeue" if self.requeue_on_loss else ""
        return (f"supervisor: job {cfg.job}: {cfg.nodes.min}-{cfg.nodes.max} nodes x {cfg.nproc_per_node} in Slurm job "
                f"{self.job_id} (nodes {self.slots()}, batch host {self.batch_host}, listening on {cfg.intake.host}); "
                f"on {self.warning_signal.name}: emergency checkpoint{requeue}; logs and events in {cfg.log_dir}")

    async def supervise(self, job) -> int:
        """The time-limit warning signal (``--signal=B:SIG@T``) stops the gang with SIGTERM (every rank
        writes its emergency checkpoint) and, with ``requeue_on_warning``, requeues the job."""
        warned: list[float] = []
        warning = self.warning_signal

        def on_warning() -> None:
            warned.append(time.time())
            job.requeue_planned = self.requeue_on_loss
            job.event("slurm_warning_signal", signal=warning.name, action="emergency checkpoint: stop the gang "
                      "with SIGTERM" + (", then requeue" if self.requeue_on_loss else ""))
            job.request_stop(warning)  # teardown with restart.kill_grace_s: ranks save, then exit

        if warning not in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(warning, on_warning)
        try:
            code = await job.run()
        finally:
            await self.stop_guards()  # the job ends with its controller: no guard may take that for a loss
        if not (warned and self.requeue_on_loss):
            return code
        try:
            await self.requeue()
        except PlatformError as exc:
            job.event("slurm_requeue_failed", error=str(exc),
                      detail="the job stopped for a requeue that did not happen: submit it again")
            log.error("event=slurm_requeue_failed error=%s", exc)
            return 1
        job.event("slurm_requeued", job_id=self.job_id, detail="the requeued job resumes from the newest verified "
                  "checkpoint")
        # the controller's code for a planned requeue (9, `requeued`): Slurm has queued the job
        # again already, so this exit code changes nothing but this run's record (sacct)
        return code

    # ------------------------------------------------------------------ adoption
    def describe(self) -> dict:
        return {
            "job_id": self.job_id, "restart_count": str(self.restart_count), "unresponsive": sorted(self.unresponsive),
            # where the controller runs: `supervisor status` from a login node reaches it there when
            # http.host is a wildcard (0.0.0.0 / ::)
            "batch_host": self.batch_host, "batch_addr": self.node_addr(self.batch_host) if self.batch_host else "",
            "nodes": {n.name: {"attempt": n.attempt, "step_name": n.step_name, "step_id": n.step_id,
                               "srun_pid": n.srun_pid, "srun_start": n.srun_start, "log": str(n.log_path)}
                      for n in self.nodes.values()},
        }

    def lock_owner(self) -> SlurmLockOwner:
        return SlurmLockOwner(self.base_env)

    async def adopt(self, saved: dict, attempt: int) -> bool:
        saved = saved or {}
        if str(saved.get("job_id")) != self.job_id or str(saved.get("restart_count", "0")) != str(self.restart_count):
            return False  # another allocation (or this job requeued): nothing of it survives
        try:
            view = await self.poll(force=True)
        except PlatformError as exc:
            log.error("event=adopt_failed error=%s", exc)
            return False
        self.unresponsive |= set(saved.get("unresponsive", []))
        self.nodes = {}
        for name, info in (saved.get("nodes") or {}).items():
            if info.get("attempt") != attempt:
                continue
            srun_start = info.get("srun_start")
            node = _Node(name, attempt, info["step_name"], Path(info.get("log") or self.log_dir / f"{name}.log"),
                         srun_pid=info.get("srun_pid"), srun_start=srun_start if type(srun_start) is int else None,
                         step_id=info.get("step_id"))
            listed = view.steps.get(node.step_name)
            # the step must still be this job's, and the very step we started (same id)
            ours = listed is not None and listed[0].startswith(f"{self.job_id}.") and (
                node.step_id is None or listed[0] == node.step_id)
            if listed is not None and not ours:
                log.warning("event=adopt_refused node=%s step_name=%s listed_step=%s saved_step=%s (not ours: left "
                            "alone)", name, node.step_name, listed[0], node.step_id)
                node.step_id = None  # never cancel a step by a name that is not ours
                node.step_name = ""
            elif ours:
                node.step_id = listed[0]
            if node.srun_pid is not None and not _client_is_ours(node):
                node.srun_pid = None  # a pid reused by another process: never signal it
            node.gone = not ours
            node.lost = node.gone
            self.nodes[name] = node
            self._launched_attempts.add(attempt)  # its steps still write to attempt-K: never set it aside
        return any(not n.gone for n in self.nodes.values())


def _client_is_ours(node: _Node) -> bool:
    """An adopted node's srun client pid still names that srun (same start time), not a
    process that got the pid since."""
    return (node.srun_pid is not None and node.srun_start is not None and pid_alive(node.srun_pid)
            and start_time(node.srun_pid) == node.srun_start)


def _tail_file(path: Path, n: int = 600) -> str:
    try:
        data = path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return "(no output)"
    return " ".join(data.split()) or "(no output)"


def from_config(cfg, log_dir: Path, env: Mapping[str, str] | None = None) -> SlurmPlatform:
    """The platform of a JobConfig with ``platform.kind: slurm`` (reads the allocation now)."""
    env = dict(os.environ if env is None else env)
    s = cfg.platform.slurm
    job_id = s.job_id or env.get("SLURM_JOB_ID", "")
    return SlurmPlatform(
        job_id, log_dir, job=cfg.job, command_timeout_s=s.command_timeout_s, poll_interval_s=s.poll_interval_s,
        launch_timeout_s=s.launch_timeout_s, kill_confirm_s=s.kill_confirm_s, overlap=s.overlap,
        srun_args=s.srun_args, bin_dir=s.bin_dir, base_env=env, controller_timeout_s=s.controller_timeout_s,
        controller_probe_s=s.controller_probe_s, requeue_on_loss=s.requeue_on_warning, warning_signal=s.warning_signal,
    ).start()


def build(cfg, log_dir: Path) -> SlurmPlatform:
    """The registry's builder: the platform keeps its own files under ``LOG_DIR/slurm``."""
    return from_config(cfg, log_dir / "slurm")


def reached_at(described: dict) -> str:
    """Where a login node reaches the controller (listening on a wildcard): the batch host's
    address, as :meth:`SlurmPlatform.describe` saved it."""
    return str(described.get("batch_addr") or "")


def drill_problem(cfg, env: Mapping[str, str]) -> str:
    """A drill's two runs go to the allocation the drill runs in: it must run inside one."""
    if cfg.platform.slurm.job_id or env.get("SLURM_JOB_ID"):
        return ""
    return ("a drill on the slurm platform runs inside its allocation: submit it, e.g. sbatch --no-kill "
            "--nodes=3 --wrap \"supervisor drill --config JOB.yaml --fault ...\" (or set platform.slurm.job_id)")


def resolve_hosts(cfg, platform: SlurmPlatform):
    """Replace ``auto`` in platform.host / intake.host / http.host by the batch host's NodeAddr."""
    import dataclasses

    if "auto" not in (cfg.platform.host, cfg.intake.host, cfg.http.host):
        return cfg
    here = platform.base_env.get("SLURMD_NODENAME") or platform.batch_host
    if not here:
        raise PlatformError("platform.host is 'auto' but the batch host is unknown: set platform.host")
    if here not in platform.addrs:
        platform._read_addrs_sync([here])
    addr = platform.node_addr(here)
    pick = (lambda h: addr if h == "auto" else h)
    return dataclasses.replace(
        cfg, platform=dataclasses.replace(cfg.platform, host=pick(cfg.platform.host)),
        intake=dataclasses.replace(cfg.intake, host=pick(cfg.intake.host)),
        http=dataclasses.replace(cfg.http, host=pick(cfg.http.host)))
