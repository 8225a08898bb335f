"""The job's state as one value: what the state file holds, what a replacement controller
continues from, and what every view of the job reads.

The controller replaces the value whole on every change (its attributes of the same names read
and write it: :class:`InState`); the state file is the value serialized (:meth:`JobState.to_saved`),
with what only the running controller knows (its ports, the platform's record) beside it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from supervisor.controller.decide import History, JobPhase
from supervisor.controller.recovery import Recovery


@dataclass(frozen=True)
class JobState:
    job: str
    phase: JobPhase = JobPhase.STARTING
    run: int = 1
    run_started: float = 0.0
    attempt: int = 0
    launch_attempt: int = 0
    """The attempt the running agents were launched with (restarts in place raise ``attempt``)."""
    in_place_allowed: int = 0
    """Restarts in place the running agents allow (their --max-restarts)."""
    in_place_used: int = 0
    launch_id: str = ""
    """The random id of the running gang's launch (Env.LAUNCH): only its frames are taken."""
    nodes: tuple[str, ...] = ()
    restore_from: str | None = None
    restored: str | None = None
    restored_step: int = 0
    ckpt_step_at_attempt_start: int = -1
    ckpt_root: str = ""
    last_checkpoint: dict[str, Any] | None = None
    stop_reason: str = ""
    require_checkpoint: bool = False
    """The running attempt must restore a checkpoint (the job has had one): ranks refuse a fresh start."""
    skip_steps: tuple[int, ...] = ()
    """Steps whose batches the running attempt skips (a non-finite loss that came back)."""
    history: History = field(default_factory=History)
    recovery: Recovery | None = None
    """The fault being recovered from, at its stage (:mod:`~supervisor.controller.recovery`)."""

    def to_saved(self, to_unix: Callable[[float], float]) -> dict[str, Any]:
        """The fields of the state file this value fills (``to_unix``: controller clock -> wall clock)."""
        return {
            "job": self.job, "phase": self.phase.value, "attempt": self.attempt, "nodes": list(self.nodes),
            "restore_from": self.restore_from, "restored": self.restored, "restored_step": self.restored_step,
            "ckpt_step_at_attempt_start": self.ckpt_step_at_attempt_start, "history": self.history,
            "stop_reason": self.stop_reason, "ckpt_root": self.ckpt_root, "last_checkpoint": self.last_checkpoint,
            "run": self.run, "run_started": self.run_started, "launch_attempt": self.launch_attempt,
            "in_place_allowed": self.in_place_allowed, "in_place_used": self.in_place_used,
            "launch_id": self.launch_id,
        } | ({} if self.recovery is None else {"recovery": self.recovery.to_saved(to_unix)})

    def continued(self, saved: dict[str, Any], from_unix: Callable[[float], float]) -> "JobState":
        """This value with what a replacement controller takes over from a saved state (as
        :func:`supervisor.controller.state.load` gives it, this version's or the previous one's):
        the attempt, the running launch and the run's history. Not what the ranks re-report
        (what they restored) nor what is looked at again (the newest checkpoint)."""
        raw = saved.get("recovery")
        return dataclasses.replace(
            self, attempt=int(saved["attempt"]), launch_attempt=int(saved.get("launch_attempt", saved["attempt"])),
            in_place_allowed=int(saved.get("in_place_allowed", 0)), in_place_used=int(saved.get("in_place_used", 0)),
            # a gang saved without a launch id (an older controller's) speaks another wire: it is
            # heard as silent and relaunched
            launch_id=saved.get("launch_id", ""), history=saved["history"], nodes=tuple(saved.get("nodes", [])),
            restore_from=saved.get("restore_from"), restored_step=int(saved.get("restored_step", 0)),
            ckpt_step_at_attempt_start=int(saved.get("ckpt_step_at_attempt_start", -1)),
            recovery=None if raw is None else Recovery.from_saved(raw, from_unix))


@dataclass
class Heard:
    """What this controller has heard of the running attempt, from its ranks: replaced whole at
    each launch (an attempt's ranks start from nothing)."""

    ahead_attempt: int | None = None
    """Ranks of a later attempt were heard (their agents restarted them in place)."""
    report: Any = None
    """The ranks' restore report (:class:`~supervisor.controller.decide.RestoreReport`), once all sent one."""
    root_judged: bool = False
    """Where the ranks save was checked before any restore report (ranks that save without restoring)."""
    stepped: bool = False
    """Every rank of the attempt has taken a step (the ``training`` event was said)."""
    saved_step: int = -1
    """The newest step every rank of the attempt has said it saved (``save_blocked`` was said for it)."""
    progress_at: float = -math.inf
    """When the gang-wide progress reads run next (:func:`~.decide.progress_every_s`)."""
    step_marks: list[tuple[float, int]] = field(default_factory=list)
    """(when, the slowest rank's step) over the last minute: the step rate."""

    def mark_step(self, now: float, step: int, window_s: float = 60.0) -> None:
        self.step_marks.append((now, step))
        self.step_marks = [m for m in self.step_marks if now - m[0] <= window_s]

    def step_rate(self) -> float:
        """Steps per second over the window (0 before two marks; negative across a resume from an
        older checkpoint: the views show 0 then)."""
        if len(self.step_marks) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self.step_marks[0], self.step_marks[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def step_time(self) -> float:
        """The loop's wall time per step over the window: the median over the marks between
        which the gang moved on. 0 before that. Coarse (a mark sees a step only when a heartbeat
        says it, and an interval that moved on may hold part of a save's stall): only for ranks
        that do not say their own (``Registry.loop_step_time``)."""
        per = sorted((t1 - t0) / (s1 - s0) for (t0, s0), (t1, s1) in zip(self.step_marks, self.step_marks[1:])
                     if s1 > s0 and t1 > t0)
        return per[len(per) // 2] if per else 0.0


class InState:
    """A controller attribute that is a field of a frozen value it holds (its :class:`JobState`,
    ``owner.state``, unless told): read from the value, written by replacing the value."""

    def __init__(self, name: str | None = None, *, to_state: Callable[[Any], Any] | None = None,
                 from_state: Callable[[Any], Any] | None = None, holder: str = "state") -> None:
        self.field = name
        self.to_state, self.from_state = to_state, from_state
        self.holder = holder
        """The owner's attribute holding the value (``state``; the looks' ``memory``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = self.field or name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = getattr(getattr(obj, self.holder), self.field)
        return value if self.from_state is None else self.from_state(value)

    def __set__(self, obj: Any, value: Any) -> None:
        value = value if self.to_state is None else self.to_state(value)
        setattr(obj, self.holder, dataclasses.replace(getattr(obj, self.holder), **{self.field: value}))


def as_tuple(value: Any) -> tuple:
    return tuple(value)


def as_path(value: str) -> Path:
    return Path(value)
