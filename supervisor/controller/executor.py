"""The one place a recovery's actions (:mod:`supervisor.controller.recovery`) are carried out.

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
from typing import TYPE_CHECKING

from supervisor.controller.decide import Relaunch, Stop, evidence_awaited
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
from supervisor.protocol import control_message

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller

log = logging.getLogger("supervisor.controller")
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
        fault = os.environ.get(CONTROLLER_FAULT, "")
        self._die_before = fault.removeprefix("die_before=") if fault.startswith("die_before=") else ""

    def answered(self) -> bool:
        """Every rank the evidence waits for has dumped its stacks (a heartbeat naming the order)."""
        ranks = self.c.registry.ranks
        return all(r in ranks and ranks[r].hb.dump_seq >= self.asked[r] for r in self.awaited)

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
            self.in_place = None
            self.in_place = await c._restart_in_place(fault, c.current_timer)
        elif isinstance(action, AbortRanks):
            for rank in action.ranks:
                c.intake.send(control_message("abort", attempt=c.attempt, rank=rank, seq=c.control_seq.next(),
                                              reason=f"{fault.kind}: {fault.detail}"[:400]), c.addr_by_rank.get(rank))
            c.event("action", attempt=c.attempt, action="abort_ranks", ranks=list(action.ranks), reason=fault.kind,
                    **_resumed(resumed))
        elif isinstance(action, KillNodes):
            for node in action.nodes:
                c.event("action", attempt=c.attempt, action="kill_node", node=node, reason=fault.kind, **_resumed(resumed))
                await c.platform.kill_node(node)
        elif isinstance(action, TearDown):
            c.event("action", attempt=c.attempt, action="tear_down", reason=fault.kind, **_resumed(resumed))
            c._check_lease()
            await c.platform.teardown(c.cfg.restart.teardown_grace_s)
        elif isinstance(action, PlanNext):
            await self._plan_next(rec)
        elif isinstance(action, Launch):
            c.attempt = action.attempt
            await c._launch_retrying(list(action.nodes), action.restore_from, c.current_timer)
        else:  # pragma: no cover - every action of recovery.Action is handled above
            raise TypeError(f"no executor for {action!r}")

    def _ask_for_stacks(self, rec: Recovery) -> None:
        """Before anything is killed: every rank heard from dumps its stacks."""
        c = self.c
        self.asked = {}
        for rank, addr in c.addr_by_rank.items():
            self.asked[rank] = c.control_seq.next()
            c.intake.send(control_message("dump", attempt=c.attempt, rank=rank, seq=self.asked[rank],
                                          reason=rec.fault.kind), addr)
        reg = c.registry
        self.awaited = evidence_awaited(rec.fault, {r: (rec_.hb.phase, rec_.received) for r, rec_ in reg.ranks.items()
                                                    if r in self.asked},
                                        now=c.clock(), fresh_s=2 * c.cfg.heartbeat.interval_s)

    async def _write_evidence(self, rec: Recovery) -> None:
        c = self.c
        fault = rec.fault
        asked, reg = dict(self.asked), c.registry

        def answered(rank: int) -> bool:
            r = reg.ranks.get(rank)
            return r is not None and r.hb.dump_seq >= asked[rank]

        path = c.log_dir / "evidence" / f"attempt-{c.attempt}-{int(time.time())}-{fault.kind}.json"
        head = {"fault": fault.to_dict(), "attempt": c.attempt, "time": time.time(),
                "findings": list(c.findings), "nodes": dict(c.node_status)}
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
        timer = c.current_timer
        if timer is not None and timer.torn_down_at is None:
            timer.torn_down_at = c.clock()
        if not fault.node_failure:
            # a platform may learn only while tearing down that a node cannot answer (Slurm: a
            # cancel it could not confirm): count that node, and only it, as failed
            stopped = tuple(sorted(n for n, st in (await c.platform.observe()).items() if st.stopped))
            if stopped:
                fault = dataclasses.replace(fault, nodes=stopped, node_failure=True)
                c.event("nodes_unresponsive", attempt=c.attempt, nodes=list(stopped), reason=fault.kind)
        await c._scan_checkpoints()
        suspects_before = set(c.history.suspects)
        decision, c.history = c._plan(fault, c.history)
        c._tell_suspects(suspects_before)
        c.active_hang = None
        if isinstance(decision, Stop):
            c.recovery = None
            c._finish(decision.phase, decision.reason)
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
        # every message and process of the next gang carries the new number, above any the old
        # agents could still give a rank they restart in place
        attempt = max(c.attempt + 1, c.launch_attempt + c.in_place_allowed + 1)
        c.recovery = dataclasses.replace(rec, stage=Stage.LAUNCH, acted=False,
                                         launch=(attempt, tuple(decision.nodes), decision.restore_from))
        c._save_state()


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
        # asked to dump their stacks; of those, the ones that could answer; the ones that did
        "asked": sorted(asked), "awaited": sorted(awaited),
        "answered": sorted(filter(answered, asked)),
        "rank_log_dir": str(rank_log_dir),
    }
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, default=str).encode(), mode=0o644)
    return prune_oldest(path.parent, EVIDENCE_MAX_BYTES, suffix=".json", keep=[path.name])
