"""A fault's recovery as a value, and the one pure step that moves it on.

A recovery walks these stages, each saved before its action is carried out
(:mod:`supervisor.controller.executor`), so that a controller killed at any of them is replaced by
one that resumes there, with the same fault and the same timer:

``evidence``  every live rank is asked for its stacks; moves on once the ranks that can answer
              have (or after ``evidence_wait_s``).
``record``    the evidence file is written (before anything is killed).
``in_place``  the agents restart the ranks in place, where the job allows it and the fault is one
              they can fix; declined, the ladder follows.
``rung``      the escalation ladder (:func:`~supervisor.controller.decide.ladder`): abort the
              culprits, kill their nodes, tear the gang down. A rung whose nodes exit in time
              skips the rungs left before the teardown.
``plan``      what follows the torn-down gang (:func:`~supervisor.controller.decide.plan_next`).
``launch``    the next gang, at the desired attempt: a replacement controller launches it again
              unless a gang of that attempt runs (a restart is a number, as in JobSet).

Plain data in, a recovery and actions out: no I/O, no clock, no platform.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from supervisor.controller.decide import (
    ACTION_ABORT,
    ACTION_KILL_NODE,
    Fault,
    ladder,
    rung_worked,
)


class Stage(str, enum.Enum):
    EVIDENCE = "evidence"
    RECORD = "record"
    IN_PLACE = "in_place"
    RUNG = "rung"
    PLAN = "plan"
    LAUNCH = "launch"


# ---------------------------------------------------------------------------- actions
@dataclass(frozen=True)
class AskForStacks:
    """Every rank heard from dumps its stacks (a ``dump`` order each)."""


@dataclass(frozen=True)
class WriteEvidence:
    """The fault's evidence file: every rank's last heartbeat, the stack files, the node states."""


@dataclass(frozen=True)
class TryInPlace:
    """Let the agents restart the ranks in place; its result is the next observation's ``in_place``."""


@dataclass(frozen=True)
class AbortRanks:
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class KillNodes:
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class TearDown:
    """The whole gang goes (``restart.teardown_grace_s``)."""


@dataclass(frozen=True)
class PlanNext:
    """Decide what follows the torn-down gang: relaunch (a ``launch`` stage) or stop."""


@dataclass(frozen=True)
class Launch:
    """Launch the gang of ``attempt`` on ``nodes``, resuming from ``restore_from``."""

    attempt: int
    nodes: tuple[str, ...]
    restore_from: str | None


Action = AskForStacks | WriteEvidence | TryInPlace | AbortRanks | KillNodes | TearDown | PlanNext | Launch


# ---------------------------------------------------------------------------- the value
@dataclass(frozen=True)
class Recovery:
    fault: Fault
    stage: Stage = Stage.EVIDENCE
    rung: int = 0
    """The rung of ``ladder(fault)`` the ``rung`` stage is at."""
    acted: bool = False
    """This stage's action has been carried out: a replacement controller does not repeat it."""
    deadline: float = 0.0
    """Controller clock: the stage moves on by then (evidence wait, a rung's grace)."""
    in_place: bool = False
    """The running agents may restart ranks in place (the job's restart.in_place_restarts)."""
    launch: tuple[int, tuple[str, ...], str | None] | None = None
    """``launch`` stage: the desired attempt, its nodes and its checkpoint."""
    resumed: bool = False
    """Continued by a controller that replaced the one that began it, until its first action."""
    hold_until: float = 0.0
    """A replacement that adopted the gang waits until then for the ranks' first heartbeats (their
    reply addresses) before it asks them for stacks or orders an abort."""
    sweep: bool = False
    """``launch`` stage: tear down what a replacement found running before launching."""

    def to_saved(self, to_unix) -> dict[str, Any]:
        """The value as the state file keeps it (``to_unix``: controller clock -> wall clock)."""
        f = self.fault
        return {"stage": self.stage.value, "rung": self.rung, "acted": self.acted,
                "deadline_unix": to_unix(self.deadline) if self.deadline else 0.0, "in_place": self.in_place,
                "launch": None if self.launch is None else
                {"attempt": self.launch[0], "nodes": list(self.launch[1]), "restore_from": self.launch[2]},
                "fault": {"kind": f.kind, "ranks": list(f.ranks), "nodes": list(f.nodes), "detail": f.detail,
                          "rung": f.rung, "node_failure": f.node_failure, "fault_unix": to_unix(f.fault_at),
                          "secondary": f.secondary, "step": f.step, "exclude_now": f.exclude_now}}

    @classmethod
    def from_saved(cls, raw: Mapping[str, Any], from_unix) -> "Recovery":
        """The saved value (:meth:`to_saved`); ``from_unix``: wall clock -> this controller's clock.
        ValueError naming the field when it is not one."""
        try:
            f = raw["fault"]
            fault = Fault(_text(f["kind"], "fault.kind"), tuple(_whole(r, "fault.ranks") for r in _list(f["ranks"])),
                          tuple(_text(n, "fault.nodes") for n in _list(f["nodes"])), _text(f["detail"], "fault.detail"),
                          _whole(f["rung"], "fault.rung"), _flag(f["node_failure"]), from_unix(_number(f["fault_unix"])),
                          _flag(f.get("secondary", False)), None if f.get("step") is None else _whole(f["step"], "step"),
                          _flag(f.get("exclude_now", False)))
            stage = Stage(raw["stage"])
            rung = _whole(raw.get("rung", 0), "rung")
            if not 0 <= rung < len(ladder(fault, abort_grace_s=0.0)):
                raise ValueError(f"rung {rung} is not a rung of this fault's ladder")
            launch = raw.get("launch")
            if launch is not None:
                ckpt = launch.get("restore_from")
                if ckpt is not None and not isinstance(ckpt, str):
                    raise ValueError("launch.restore_from is not a checkpoint name")
                launch = (_whole(launch["attempt"], "launch.attempt"),
                          tuple(_text(n, "launch.nodes") for n in _list(launch["nodes"])), ckpt)
            elif stage == Stage.LAUNCH:
                raise ValueError("the launch stage names no launch")
            return cls(fault, stage, rung, _flag(raw.get("acted", False)),
                       from_unix(_number(raw["deadline_unix"])) if raw.get("deadline_unix") else 0.0,
                       _flag(raw.get("in_place", False)), launch)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"recovery: {exc!s:.200}") from None


def _list(v: Any) -> list:
    if not isinstance(v, list):
        raise ValueError(f"{v!r:.40} is not a list")
    return v


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what}: {v!r:.40} is not a string")
    return v


def _whole(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{what}: {v!r:.40} is not a whole number")
    return v


def _number(v: Any) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{v!r:.40} is not a time")
    return float(v)


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{v!r:.40} is not true or false")
    return v


@dataclass(frozen=True)
class Observation:
    """What one step of a recovery looks at."""

    now: float
    nodes: Mapping[str, Any] = field(default_factory=dict)
    """The gang's node states (:class:`~supervisor.platforms.base.NodeStatus` by name)."""
    rank_pids: Mapping[int, int] = field(default_factory=dict)
    """Each rank's pid (its last heartbeat's)."""
    answered: bool = False
    """Every rank the evidence waits for has dumped its stacks."""
    in_place: bool | None = None
    """The result of the last :class:`TryInPlace` (None: none was carried out)."""
    heard: bool = False
    """Every rank of the gang has been heard from (its reply address is known)."""


@dataclass(frozen=True)
class Policy:
    abort_grace_s: float
    evidence_wait_s: float


def begin(fault: Fault, *, in_place: bool) -> Recovery:
    """The recovery of a fault just detected (its first step asks for the stacks)."""
    return Recovery(fault, in_place=in_place)


def resume(rec: Recovery, *, gang_found: bool, now: float = 0.0, hold_s: float = 0.0) -> Recovery:
    """The recovery a replacement controller continues. Without the gang (gone meanwhile) there
    is nothing left to gather or stop: it plans. Otherwise the stage's action is carried out
    again (the value is saved before an action, so it may have been cut short): asking for
    stacks, writing the evidence, an abort, a node kill and a teardown are all safe to repeat;
    the stacks and an abort wait up to ``hold_s`` for the adopted ranks' first heartbeats.
    A gang found at the plan or the launch (its teardown did not take) goes first."""
    acted = rec.acted
    rec = replace(rec, resumed=True, acted=False)
    if rec.stage == Stage.LAUNCH and rec.launch is not None:
        attempt, nodes, restore_from = rec.launch
        # a launch cut short may have made some of its gang: the next number fences them as strays
        return replace(rec, launch=(attempt + 1 if acted else attempt, nodes, restore_from), sweep=gang_found)
    if not gang_found:
        return replace(rec, stage=Stage.PLAN)
    if rec.stage == Stage.PLAN:
        return replace(rec, stage=Stage.RUNG, rung=len(ladder(rec.fault, abort_grace_s=0.0)) - 1)
    if rec.stage == Stage.IN_PLACE:
        # the agents may or may not have been told: the ladder is the safe way on
        rec = replace(rec, stage=Stage.RUNG, rung=0)
    return replace(rec, hold_until=now + hold_s)


_LOOK_AFTER = (AskForStacks, WriteEvidence, TryInPlace, AbortRanks, KillNodes, TearDown, PlanNext, Launch)
"""Actions after which a step stops (each is saved before it is carried out, and its outcome is
the next step's to observe): every action."""


def step(rec: Recovery, obs: Observation, policy: Policy) -> tuple[Recovery | None, list[Action]]:
    """The recovery as it is after ``obs``, and what to carry out now, in order: stages move on
    until one waits (for the ranks' stacks, a rung's grace) or an action's outcome must be seen
    first. None: the recovery is over (restarted in place, or the next gang launched)."""
    actions: list[Action] = []
    while True:
        new, acts = _one_step(rec, obs, policy)
        actions += acts
        if acts and new is not None and new.resumed:
            new = replace(new, resumed=False)  # "resumed" tells of the first action only
        if new is None or new == rec or any(isinstance(a, _LOOK_AFTER) for a in acts):
            return new, actions
        rec = new


def _one_step(rec: Recovery, obs: Observation, policy: Policy) -> tuple[Recovery | None, list[Action]]:
    fault = rec.fault
    if rec.hold_until:
        if obs.now < rec.hold_until and not obs.heard:
            return rec, []
        rec = replace(rec, hold_until=0.0)
    if rec.stage == Stage.EVIDENCE:
        if not rec.acted:
            return replace(rec, acted=True, deadline=obs.now + policy.evidence_wait_s), [AskForStacks()]
        if obs.answered or obs.now >= rec.deadline:
            return replace(rec, stage=Stage.RECORD, acted=False, deadline=0.0), []
        return rec, []
    if rec.stage == Stage.RECORD:
        if not rec.acted:
            return replace(rec, acted=True), [WriteEvidence()]
        nxt = Stage.IN_PLACE if rec.in_place else Stage.RUNG
        return replace(rec, stage=nxt, rung=0, acted=False), []
    if rec.stage == Stage.IN_PLACE:
        if not rec.acted:
            return replace(rec, acted=True), [TryInPlace()]
        if obs.in_place:
            return None, []
        return replace(rec, stage=Stage.RUNG, rung=0, acted=False), []
    if rec.stage == Stage.RUNG:
        rungs = ladder(fault, abort_grace_s=policy.abort_grace_s)
        rung = rungs[min(rec.rung, len(rungs) - 1)]
        if not rec.acted:
            if rung.action == ACTION_ABORT:
                act: Action = AbortRanks(rung.ranks)
            elif rung.action == ACTION_KILL_NODE:
                act = KillNodes(rung.nodes)
            else:
                act = TearDown()
            return replace(rec, acted=True, deadline=obs.now + rung.wait_s), [act]
        worked = rung.wait_s > 0 and rung_worked(rung, obs.nodes, obs.rank_pids)
        if rung.wait_s > 0 and not worked and obs.now < rec.deadline:
            return rec, []
        if rec.rung >= len(rungs) - 1:
            return replace(rec, stage=Stage.PLAN, acted=False, deadline=0.0), []
        # a cheaper rung that worked goes straight to the teardown
        return replace(rec, rung=len(rungs) - 1 if worked else rec.rung + 1, acted=False, deadline=0.0), []
    if rec.stage == Stage.PLAN:
        if not rec.acted:
            return replace(rec, acted=True), [PlanNext()]
        return rec, []
    # LAUNCH: the desired attempt (the executor ends the recovery once it is launched)
    if rec.launch is None:
        return None, []
    if rec.sweep:
        return replace(rec, sweep=False), [TearDown()]
    if not rec.acted:
        return replace(rec, acted=True), [Launch(*rec.launch)]
    return rec, []


def poll_s(rec: Recovery | None, tick_s: float) -> float:
    """How soon the loop looks again at the latest: often while a rung waits for its nodes to
    exit (the platform is asked), and while the evidence or an adopted gang waits on the ranks
    (their heartbeats also wake the loop at once); else the tick."""
    if rec is None:
        return tick_s
    if rec.hold_until or (rec.stage in (Stage.EVIDENCE, Stage.RUNG) and rec.acted):
        return 0.05
    return 0.0 if not rec.acted else tick_s
