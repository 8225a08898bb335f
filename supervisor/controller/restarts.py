"""The run's restarts as the views show them: each one's timer, the count by fault kind, the most
recent fault (kept after it was handled: the alerts name its culprits), and whether the budget
was exceeded. Pure: the controller gives the clock and says what it saw; :meth:`Restarts.progress`
says which of the restart's marks a look completes, and what to tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from supervisor.controller.decide import Fault, RestartTimer


@dataclass(frozen=True)
class Told:
    """Something a look completed that the controller says (an event and its fields)."""

    event: str
    fields: dict[str, Any]


@dataclass
class Restarts:
    timers: list[RestartTimer] = field(default_factory=list)
    """This run's restarts, the current one last."""
    by_reason: dict[str, int] = field(default_factory=dict)
    budget_exceeded: bool = False
    active: Fault | None = None
    """The fault being recovered from (until its gang is torn down)."""
    last: Fault | None = None
    """The most recent fault, kept after it was handled."""
    last_attempt: int = -1
    last_unix: float = 0.0
    last_culprits: list[tuple[int, str]] = field(default_factory=list)
    """(rank, node) of the last fault's culprits (-1: the fault named no rank)."""

    @property
    def current(self) -> RestartTimer | None:
        return self.timers[-1] if self.timers else None

    @property
    def open(self) -> RestartTimer | None:
        """The restart under way (its first step after the restore not yet seen), if any."""
        t = self.current
        return t if t is not None and not t.done else None

    def begin(self, fault: Fault, attempt: int, timer: RestartTimer | None, *, unix: float,
              culprits: Iterable[tuple[int, str]]) -> None:
        """A fault is being recovered from: its restart's ``timer`` (new, or a previous controller's;
        None when that one saved none) is the current one, and it is the last fault."""
        if timer is not None:
            self.timers.append(timer)
        self.active = self.last = fault
        self.last_attempt, self.last_unix, self.last_culprits = attempt, unix, list(culprits)
        self.by_reason[fault.kind] = self.by_reason.get(fault.kind, 0) + 1

    def budget_remaining(self, budget_s: float, now: float) -> float:
        t = self.open
        return budget_s if t is None else t.budget_remaining(budget_s, now)

    def progress(self, now: float, *, attempt: int, all_heard: bool, steps_done: Iterable[int],
                 first_step_s: Iterable[float], restore_s: Iterable[float], budget_s: float) -> list[Told]:
        """One look at the gang during a restart: its rendezvous once every rank is heard, its end
        once every rank has taken a step (the ranks say, from their own clocks, how long the restore
        and the first step took); or the budget gone by."""
        t = self.open
        if t is None:
            return []
        if t.rendezvous_at is None and all_heard:
            t.rendezvous_at = now
        steps = list(steps_done)
        if t.rendezvous_at is not None and all_heard and steps and all(s > 0 for s in steps):
            t.first_step_at = now
            first, restore = max(first_step_s), max(restore_s)
            # ranks faster than a tick from their start to their first step (forked, torch
            # imported) are first heard in this very look: their own clocks then say when the
            # restore began, which the gang's rendezvous preceded
            launched = max(m for m in (t.detected_at, t.torn_down_at, t.scheduled_at) if m is not None)
            t.rendezvous_at = max(launched, min(t.rendezvous_at, now - first - restore))
            t.restored_at = max(t.rendezvous_at, now - first)
            total = t.total(now)
            self.budget_exceeded = total > budget_s
            return [Told("restart_complete", {"attempt": attempt, "reason": t.reason, "phases": t.durations(),
                                              "total_s": round(total, 3), "within_budget": total <= budget_s})]
        if now - t.fault_at > budget_s and not self.budget_exceeded:
            self.budget_exceeded = True
            return [Told("budget_exceeded", {"attempt": attempt, "budget_s": budget_s})]
        return []
