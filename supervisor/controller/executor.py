"""The one place the controller acts on the gang: a recovery's actions
(:mod:`supervisor.controller.recovery`), every launch and the restart in place.

Each action says what it does in its own event; the controller saves the recovery before it
hands an action here, so a controller killed while one runs is replaced by one that carries
it out again (every action is safe to repeat)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import json
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from supervisor.checkpoint.discovery import parse_name
from supervisor.controller.decide import (
    RUNG_KILL_NODE,
    TERMINAL,
    Fault,
    JobPhase,
    Relaunch,
    RestartTimer,
    Stop,
    evidence_awaited,
    in_place_ok,
    next_attempt,
    relay_flush_s,
    rendezvous_backend,
)
from supervisor.controller.job_state import Heard
from supervisor.controller.recovery import (
    AbortRanks,
    Action,
    AskForStacks,
    KillNodes,
    Launch,
    PlanNext,
    Recovery,
    Stage,
    TearDown,
    TryInPlace,
    WriteEvidence,
)
from supervisor.files import prune_oldest, write_atomic
from supervisor.platforms.base import LaunchRefused, LaunchSpec, PlatformError
from supervisor.protocol import Env, aggregate_setting, control_message

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller

log = logging.getLogger("supervisor.controller")
LAUNCH_TRIES = 3
"""A launch the platform refused is torn down and tried again this many times, then the job fails."""
CONTROLLER_FAULT = "SUPERVISOR_CONTROLLER_FAULT"
"""A drill for the controller itself: ``die_before=ACTION`` (an action's class name, e.g.
``TearDown``) makes it SIGKILL itself once, just before it carries out the first such action
(the recovery already saved): what a replacement controller must then finish."""
EVIDENCE_MAX_BYTES = 512 << 20
"""The evidence folder's size at most: past it the oldest evidence files go (an event names them).
A fault's file at 16,384 ranks is ~10 MB (every rank's last heartbeat)."""


class Executor:
    """Carries out a recovery's actions for one controller; keeps what the next step observes
    (whether the asked ranks have dumped their stacks, whether a restart in place was taken)."""

    def __init__(self, controller: "Controller") -> None:
        self.c = controller
        self.asked: dict[int, int] = {}  # rank -> the sequence number of the dump order it was sent
        self.awaited: frozenset[int] = frozenset()
        self.in_place: bool | None = None
        self.launching: asyncio.Task | None = None
        """A launch under way (it may wait minutes for its pods): the loop goes on meanwhile (the
        lease, a stop, the HTTP API, the intake) and takes its outcome as its next observation."""
        fault = os.environ.get(CONTROLLER_FAULT, "")
        self._die_before = fault.removeprefix("die_before=") if fault.startswith("die_before=") else ""

    def answered(self) -> bool:
        """Every rank the evidence waits for has dumped its stacks (a heartbeat naming the order)."""
        ranks = self.c.registry.ranks
        return all(r in ranks and ranks[r].hb.dump_seq >= self.asked[r] for r in self.awaited)

    # ------------------------------------------------------------------ the launch, a task
    def start_launch(self, body: Awaitable[None]) -> None:
        """Run ``body`` (a launch, with what follows it) as the task the loop waits on."""
        assert self.launching is None or self.launching.done(), "one launch at a time"
        self.launching = asyncio.ensure_future(body)
        self.launching.add_done_callback(lambda _task: self.c.wake())  # its outcome is looked at at once

    def launch_settled(self) -> bool:
        """Whether no launch is under way; a launch that ended is taken in (what it raised is
        raised here: a first launch's platform error ends the controller, as it always did)."""
        task = self.launching
        if task is None:
            return True
        if not task.done():
            return False
        self.launching = None
        task.result()
        return True

    async def settle_launch(self, *, abandon: bool) -> None:
        """Before the controller stops: a launch under way is let end (a stop: the teardown then
        finds every process it made) or abandoned at once (a SIGTERM hand-off: its pods may wait
        minutes for a node; the state says the restart is unfinished and the next controller
        finishes it)."""
        task, self.launching = self.launching, None
        if task is None:
            return
        if not abandon or task.done():
            try:
                await task
            except PlatformError as exc:
                log.error("event=launch_failed error=%s (stopping)", exc)
            return
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, PlatformError):
            pass
        c = self.c
        log.warning("event=launch_abandoned attempt=%d (SIGTERM hand-off: the next controller finishes the restart)",
                    c.attempt)
        c.event("launch_abandoned", attempt=c.attempt,
                detail="SIGTERM hand-off during the launch: the next controller finishes this restart")

    async def run(self, action: Action, rec: Recovery, *, resumed: bool = False) -> None:
        """Carry out ``action`` of ``rec`` (``resumed``: again, by a controller that replaced the
        one killed while it was under way; its event says so)."""
        c = self.c
        fault = rec.fault
        if self._die_before and type(action).__name__ == self._die_before:
            log.error("event=controller_fault %s=die_before=%s (a drill: this controller is killed now)",
                      CONTROLLER_FAULT, self._die_before)
            os.kill(os.getpid(), signal.SIGKILL)
        if isinstance(action, AskForStacks):
            self._ask_for_stacks(rec)
        elif isinstance(action, WriteEvidence):
            await self._write_evidence(rec)
        elif isinstance(action, TryInPlace):
            self.in_place = await self.try_in_place(fault, c.restarts.current)
        elif isinstance(action, AbortRanks):
            for rank in action.ranks:
                c.intake.send(control_message("abort", attempt=c.attempt, rank=rank, seq=c.wire.control_seq.next(),
                                              reason=f"{fault.kind}: {fault.detail}"[:400]), c.registry.address(rank))
            c.event("action", attempt=c.attempt, action="abort_ranks", ranks=list(action.ranks), reason=fault.kind,
                    **_resumed(resumed))
        elif isinstance(action, KillNodes):
            for node in action.nodes:
                c.event("action", attempt=c.attempt, action="kill_node", node=node, reason=fault.kind,
                        **_resumed(resumed))
                await c.platform.kill_node(node)
        elif isinstance(action, TearDown):
            c.event("action", attempt=c.attempt, action="tear_down", reason=fault.kind, **_resumed(resumed))
            c.check_lease()
            await c.platform.teardown(c.cfg.restart.teardown_grace_s)
        elif isinstance(action, PlanNext):
            await self._plan_next(rec)
        elif isinstance(action, Launch):
            c.attempt = action.attempt
            self.start_launch(self.launch_retrying(list(action.nodes), action.restore_from, c.restarts.current))
        else:  # pragma: no cover - every action of recovery.Action is handled above
            raise TypeError(f"no executor for {action!r}")

    def _ask_for_stacks(self, rec: Recovery) -> None:
        """Before anything is killed: every rank heard from dumps its stacks."""
        c = self.c
        self.asked = {}
        for rank, addr in c.registry.addresses().items():
            self.asked[rank] = c.wire.control_seq.next()
            c.intake.send(control_message("dump", attempt=c.attempt, rank=rank, seq=self.asked[rank],
                                          reason=rec.fault.kind), addr)
        reg = c.registry
        self.awaited = evidence_awaited(rec.fault, {r: (rec_.hb.phase, rec_.received) for r, rec_ in reg.ranks.items()
                                                    if r in self.asked},
                                        # an interval of slack past the last beat; a relayed one is dated back
                                        # to its send, so a live rank's reads older by up to the relay's flush
                                        now=c.clock(), fresh_s=2 * c.cfg.heartbeat.interval_s + (self.relay_flush_s or 0.0))

    async def _write_evidence(self, rec: Recovery) -> None:
        c = self.c
        fault = rec.fault
        asked, reg = dict(self.asked), c.registry

        def answered(rank: int) -> bool:
            r = reg.ranks.get(rank)
            return r is not None and r.hb.dump_seq >= asked[rank]

        path = c.log_dir / "evidence" / f"attempt-{c.attempt}-{int(time.time())}-{fault.kind}.json"
        head = {"fault": fault.to_dict(), "attempt": c.attempt, "time": time.time(),
                "findings": list(c.detection.findings), "nodes": dict(c.node_status)}
        # built, encoded and written in a worker thread (16,384 ranks' heartbeats are megabytes)
        pruned = await asyncio.to_thread(_write_evidence, path, head, list(reg.ranks.items()), asked,
                                         self.awaited, answered, c.clock(), c.log_dir / "ranks")
        c.event("evidence_saved", attempt=c.attempt, path=str(path))
        if pruned:
            c.event("evidence_rotated", removed=[p.name for p in pruned[:20]], count=len(pruned),
                    cap_bytes=EVIDENCE_MAX_BYTES, detail="the oldest evidence files of this log directory, past "
                    "its cap")

    async def _plan_next(self, rec: Recovery) -> None:
        """The gang is down: what comes next (:func:`~supervisor.controller.decide.plan_next`).
        A relaunch becomes the ``launch`` stage, saved with the history it updated."""
        c = self.c
        fault = rec.fault
        timer = c.restarts.current
        if timer is not None and timer.torn_down_at is None:
            timer.torn_down_at = c.clock()
        if not fault.node_failure:
            # a platform may learn only while tearing down that a node cannot answer (Slurm: a
            # cancel it could not confirm): count that node, and only it, as failed
            stopped = tuple(sorted(n for n, st in (await c.platform.observe()).items() if st.stopped))
            if stopped:
                fault = dataclasses.replace(fault, nodes=stopped, node_failure=True)
                c.event("nodes_unresponsive", attempt=c.attempt, nodes=list(stopped), reason=fault.kind)
        await c.look_at_checkpoints()
        suspects_before = set(c.history.suspects)
        rollback = c.roll_back()  # the fault rejected the running release: the earlier version runs
        decision, c.history = c.plan(fault, c.history, rolled_back=rollback is not None)
        if rollback is not None:
            c.tell_rollback(rollback, decision)
        c.tell_suspects(suspects_before)
        c.restarts.active = None
        if isinstance(decision, Stop):
            c.recovery = None
            c.finish(decision.phase, decision.reason)
            return
        assert isinstance(decision, Relaunch)
        if decision.newly_excluded:
            c.event("nodes_excluded", nodes=list(decision.newly_excluded), reason=fault.kind)
        c.platform.exclude(list(c.history.excluded))
        c.require_checkpoint = decision.require_checkpoint
        if decision.skip_steps and decision.skip_steps != tuple(c.skip_steps):
            c.event("batches_skipped", steps=list(decision.skip_steps),
                    detail="a non-finite loss recurred at these steps: the ranks skip their batches")
        c.skip_steps = list(decision.skip_steps)
        attempt = next_attempt(c.attempt, c.launch_attempt, c.in_place_allowed)
        c.recovery = dataclasses.replace(rec, stage=Stage.LAUNCH, acted=False,
                                         launch=(attempt, tuple(decision.nodes), decision.restore_from))
        c.save_state()

    async def tear_down_saving(self, grace_s: float, saved: str = "") -> None:
        """The gang goes with ``grace_s`` to answer SIGTERM (the ranks may save on the way out),
        then the root is looked at; a checkpoint newer than before is said, with ``saved``."""
        c = self.c
        before = c.latest_ckpt["step"] if c.latest_ckpt else -1
        await c.platform.teardown(grace_s)
        await c.look_at_checkpoints()  # off the loop (a worker thread), as every decision's look
        if saved and c.latest_ckpt and c.latest_ckpt["step"] > before:
            c.event("emergency_checkpoint", name=c.latest_ckpt["name"], step=c.latest_ckpt["step"], detail=saved)

    async def relaunch(self, nodes: list[str], *, grace_s: float, timer: RestartTimer | None = None,
                       saved: str = "", then: Callable[[], Awaitable[None]] | None = None) -> None:
        """A planned relaunch on ``nodes`` (not a fault's): the gang goes (``grace_s``; with the
        ranks' SIGTERM grace they save on the way out, and ``saved`` says so in an event when they
        did), the root is looked at, and the next attempt resumes from its newest usable
        checkpoint (launched as the loop's task; ``then`` follows a launch that did not end the
        job); with none left the job stops."""
        c = self.c
        await self.tear_down_saving(grace_s, saved)
        pick = c.choose_checkpoint()
        if isinstance(pick, Stop):
            c.finish(pick.phase, pick.reason)
            return
        c.attempt = next_attempt(c.attempt, c.launch_attempt, c.in_place_allowed)

        async def launch_then() -> None:
            await self.launch_retrying(list(nodes), pick, timer)
            if then is not None and c.phase not in TERMINAL and not c.signals.stopping:
                await then()

        self.start_launch(launch_then())

    async def launch_retrying(self, nodes: list[str], restore_from: str | None, timer: RestartTimer | None) -> None:
        """A relaunch: a failed launch is torn down and tried again (LAUNCH_TRIES, with a back-off
        a stop cuts short), then the job fails."""
        c = self.c
        for attempt_no in range(1, LAUNCH_TRIES + 1):
            try:
                await self.launch(nodes, restore_from, timer)
                return
            except PlatformError as exc:
                log.error("event=launch_failed try=%d/%d error=%s", attempt_no, LAUNCH_TRIES, exc)
                c.event("launch_failed", attempt=c.attempt, error=str(exc), try_=attempt_no)
                await c.platform.teardown(c.cfg.restart.teardown_grace_s)
                if c.signals.stopping:
                    return  # stopped or handed off: the loop ends the job, or leaves it to the next controller
                if await c.signals.stopped_within(min(30.0, 2.0 ** attempt_no)):
                    return
        c.finish(JobPhase.FAILED, f"the platform could not launch attempt {c.attempt} ({LAUNCH_TRIES} tries)")

    async def try_in_place(self, fault: Fault, timer: RestartTimer) -> bool:
        """Rung 0: let the node agents restart the ranks in place, when :func:`in_place_ok` says
        the same gang may go on. The checkpoint is chosen exactly as for a full restart (on a
        copy of the history, kept only if this path is taken); the ranks still running are
        aborted, and their agents restart them with the rest; the new ranks carry the next
        attempt number and ask for the restore point. Returns False (nothing done) otherwise."""
        c = self.c
        c.node_status = await c.platform.observe()
        await c.look_at_checkpoints()
        decision, preview = c.plan(fault, c.history)  # kept only if this path is taken
        why_not = in_place_ok(fault=fault, decision=decision, nodes=c.node_status, previous_nodes=c.nodes,
                              allowed=c.in_place_allowed, used=c.in_place_used, skip_steps=c.skip_steps,
                              last_failed=c.in_place_failed, kills_ranks=c.platform.kills_ranks)
        if not why_not and fault.rung == RUNG_KILL_NODE:
            # a silent rank cannot obey an abort: its process is killed, and its agent restarts it
            by_node: dict[str, list[int]] = {}
            for r in fault.ranks:
                rec = c.registry.ranks.get(r)
                if rec is not None and rec.hb.pid:
                    by_node.setdefault(rec.hb.node, []).append(rec.hb.pid)
            for node, pids in sorted(by_node.items()):
                c.event("action", attempt=c.attempt, action="kill_ranks", node=node, pids=pids,
                        ranks=[r for r in fault.ranks if r in c.registry.ranks
                               and c.registry.ranks[r].hb.node == node], reason=fault.kind)
                if not await c.platform.kill_ranks(node, pids):
                    why_not = f"the platform could not kill the silent ranks' processes on {node}"
                    break
            else:
                if not by_node:
                    why_not = "the silent ranks' processes are not known"
        if why_not:
            log.info("event=in_place_declined attempt=%d kind=%s reason=%s", c.attempt, fault.kind, why_not)
            c.event("in_place_declined", attempt=c.attempt, kind=fault.kind, reason=why_not)
            return False
        assert isinstance(decision, Relaunch)
        suspects_before = set(c.history.suspects)
        c.history = preview
        c.tell_suspects(suspects_before)
        c.restarts.active = None
        c.require_checkpoint = decision.require_checkpoint
        for rank, addr in c.registry.addresses().items():  # whoever still runs goes, to be restarted with the rest
            c.intake.send(control_message("abort", attempt=c.attempt, rank=rank, seq=c.wire.control_seq.next(),
                                          reason=f"restart in place: {fault.kind}"), addr)
        c.in_place_used += 1
        c.event("action", attempt=c.attempt, action="restart_in_place", reason=fault.kind,
                restore_from=decision.restore_from, left=c.in_place_allowed - c.in_place_used)
        timer.torn_down_at = c.clock()
        c.attempt = max(c.attempt + 1, c.heard.ahead_attempt or 0)
        await self.arm(list(decision.nodes), decision.restore_from, timer, None)
        c.in_place_deadline = c.clock() + c.cfg.restart.in_place_timeout_s
        return True

    async def launch(self, nodes: list[str], restore_from: str | None, timer: RestartTimer | None = None) -> None:
        c = self.c
        try:
            await self.arm(nodes, restore_from, timer, c.platform.launch)
        except LaunchRefused as exc:
            # no retry changes it: the job stops as when the dry run of its workers is refused
            log.error("event=workers_refused attempt=%d error=%s", c.attempt, exc)
            c.event("workers_refused", attempt=c.attempt, error=str(exc))
            await c.platform.teardown(c.cfg.restart.teardown_grace_s)
            c.finish(JobPhase.STOPPED_STARTUP_FAILURE, str(exc))

    async def arm(self, nodes: list[str], restore_from: str | None, timer: RestartTimer | None,
                   launch: Callable[[LaunchSpec], Awaitable[None]] | None) -> None:
        """Make ``c.attempt`` the running attempt on ``nodes``, resuming from ``restore_from``:
        launched through ``launch`` (the platform's), or restarted in place by the running
        agents (None: nothing to launch; the ranks already carry this attempt number)."""
        c = self.c
        c.check_lease()
        c.nodes = nodes
        c.restore_from = restore_from
        parsed = parse_name(restore_from) if restore_from else None  # verify() ties a name to its step
        c.restored_step = parsed[0] if parsed else 0
        c.ckpt_step_at_attempt_start = c.latest_ckpt["step"] if c.latest_ckpt else -1
        world = len(nodes) * c.cfg.nproc_per_node
        c.registry.reset(c.attempt, world)
        c.heard = Heard()  # this attempt's ranks start from nothing (its step rate too: a resume goes back)
        c.restored = None
        c.capacity_since, c.capacity_message = None, ""
        spec = None
        if launch is not None:
            c.new_launch()  # from here the old gang's frames are a stale attempt's
            spec = self.launch_spec(nodes)
            await launch(spec)
            c.launch_attempt = c.attempt
            c.in_place_allowed = c.cfg.restart.in_place_restarts
            c.in_place_used, c.in_place_failed, c.in_place_deadline = 0, False, None
        now = c.clock()
        c.launched_at = now
        if timer is not None:
            timer.scheduled_at = now
        c.phase = JobPhase.STARTING
        c.event("launched", attempt=c.attempt, nodes=nodes, world_size=world, restore_from=restore_from,
                require_checkpoint=c.require_checkpoint, excluded=c.history.excluded, launch=c.launch_id,
                release=c.releases.current,
                **({"rendezvous": spec.rendezvous} if spec is not None else {"in_place": True}))
        log.info("event=launched attempt=%d nodes=%s world_size=%d restore_from=%s%s", c.attempt, nodes, world,
                 restore_from, f" rendezvous={spec.rendezvous}" if spec is not None
                 else " in_place=true (the running agents restart the ranks)")
        c.recovery = None  # launched (or restarted in place): the recovery is over, in the same write
        c.save_state()

    @property
    def relay_flush_s(self) -> float | None:
        """How often the node relays send their ranks' heartbeats up (None: each rank sends its own)."""
        hb = self.c.cfg.heartbeat
        return relay_flush_s(hb.interval_s, hb.timeout_s) if hb.aggregate else None

    def launch_spec(self, nodes: list[str]) -> LaunchSpec:
        c = self.c
        rank_log_dir = c.log_dir / "ranks"
        in_place = c.cfg.restart.in_place_restarts
        command, job_env, image = c.release_launch()  # the running release's (a rollback: an earlier one's)
        env = job_env | {
            Env.RELEASE: c.releases.current,
            Env.JOB: c.cfg.job,
            Env.ATTEMPT: str(c.attempt),
            Env.LAUNCH: c.launch_id,
            Env.HEARTBEAT_ADDR: f"{c.platform.controller_address(c.cfg.intake.host)}:{c.intake_port}",
            Env.API: f"http://{c.platform.controller_address(c.cfg.http.host)}:{c.http_port}",
            **c.platform.token_env(c.log_dir / "token"),
            Env.LOG_DIR: str(rank_log_dir),
            Env.CHECKPOINT_DIR: str(c.ckpt_root),
            Env.HEARTBEAT_INTERVAL: str(c.cfg.heartbeat.interval_s),
            Env.AGGREGATE: aggregate_setting(self.relay_flush_s),
            Env.WATCHDOG: c.detection.timeouts.watchdog_env(),
            Env.INSTRUMENT: "on" if c.cfg.instrument.enabled else "off",
            Env.FR_BUFFER: str(c.cfg.instrument.fr_buffer),
        } | ({Env.SKIP_STEPS: ",".join(map(str, c.skip_steps))} if c.skip_steps else {}) \
          | ({Env.IN_PLACE: str(in_place)} if in_place else {})
        return LaunchSpec(
            attempt=c.attempt, nodes=nodes,
            # the controller chose the world: every agent it launched must join (--nnodes N:N). With a
            # range, agents that joined first start training smaller after torch's last call (1 s) and
            # a late one (still importing) then restarts them all as a membership change, on a
            # SIGTERM the ranks answer with an emergency checkpoint (seen: 30 s lost, then SIGKILL);
            # restarting in place, a lost agent would leave the others training smaller on their own
            nnodes_min=len(nodes), nnodes_max=len(nodes),
            nproc_per_node=c.cfg.nproc_per_node, command=command, env=env, image=image,
            rdzv_endpoint=c.platform.rendezvous_endpoint(c.attempt, c.cfg.platform.host),
            rdzv_id=f"{c.cfg.job}-{c.attempt}", max_restarts=in_place,
            rendezvous=rendezvous_backend(c.cfg.platform.rendezvous_backend, len(nodes),
                                          static_from=c.cfg.platform.static_rendezvous_nodes,
                                          in_place_restarts=in_place),
            fork_ranks=c.cfg.platform.fork_ranks,
            check_command=not c.platform.checks_command_here,  # then each agent checks it where it runs
        )


def _resumed(resumed: bool) -> dict:
    return {"resumed": True} if resumed else {}


def _write_evidence(path: Path, head: dict, records: list, asked: dict[int, int], awaited, answered,
                    now: float, rank_log_dir: Path) -> list[Path]:
    """The evidence file of a fault (off the event loop), then the oldest evidence files past
    :data:`EVIDENCE_MAX_BYTES` removed (never this one); returns those."""
    ranks = {r: {"heartbeat": rec.hb.to_payload(), "age_s": round(now - rec.received, 3)} for r, rec in sorted(records)}
    doc = {
        "fault": head["fault"], "attempt": head["attempt"], "time": head["time"],
        "findings": [f.to_dict() for f in head["findings"]],
        "nodes": {n: asdict(st) for n, st in head["nodes"].items()},
        "ranks": ranks, "stack_files": sorted({v["heartbeat"]["stack_file"] for v in ranks.values()} - {""}),
        # the flight recorder's traces the ranks wrote with their stacks (ranks watched through torch's records)
        "trace_files": sorted({v["heartbeat"].get("trace_file", "") for v in ranks.values()} - {""}),
        # asked to dump their stacks; of those, the ones that could answer; the ones that did
        "asked": sorted(asked), "awaited": sorted(awaited),
        "answered": sorted(filter(answered, asked)),
        "rank_log_dir": str(rank_log_dir),
    }
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, default=str).encode(), mode=0o644)
    return prune_oldest(path.parent, EVIDENCE_MAX_BYTES, suffix=".json", keep=[path.name])
