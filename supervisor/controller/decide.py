"""Pure decisions of the controller: what went wrong, where the ladder starts, what comes next.

The job's phases::

    STARTING --all ranks heard from--> RUNNING --fault--> RECOVERING --relaunch--> STARTING
        |                                 |                    |
        |                                 +--all ranks done--> COMPLETED (exit 0)
        +--fault--> RECOVERING             RECOVERING --guard--> STOPPED_NO_PROGRESS (3)
                                                      --guard--> STOPPED_MAX_RESTARTS (4)
                                                      --no capacity--> STOPPED_NO_CAPACITY (5)

A fault is handled by an escalation ladder whose first rung depends on the fault: rung 1
aborts the stuck ranks in place (they obey the SDK's abort order), rung 2 kills their nodes,
rung 3 tears the gang down. A silent rank cannot obey an order, so it starts at rung 2; a
node that already failed leaves a broken gang, so it starts at rung 3.

Nothing here performs I/O or reads a clock: every function takes what it needs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from supervisor.health import Finding, Kind
from supervisor.platforms.base import NodeState, NodeStatus


class JobPhase(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    STOPPED_NO_PROGRESS = "stopped_no_progress"
    STOPPED_MAX_RESTARTS = "stopped_max_restarts"
    STOPPED_NO_CAPACITY = "stopped_no_capacity"
    FAILED = "failed"


TERMINAL = frozenset({JobPhase.COMPLETED, JobPhase.STOPPED_NO_PROGRESS, JobPhase.STOPPED_MAX_RESTARTS,
                      JobPhase.STOPPED_NO_CAPACITY, JobPhase.FAILED})
EXIT_CODES = {
    JobPhase.COMPLETED: 0,
    JobPhase.FAILED: 1,
    JobPhase.STOPPED_NO_PROGRESS: 3,
    JobPhase.STOPPED_MAX_RESTARTS: 4,
    JobPhase.STOPPED_NO_CAPACITY: 5,
}
RUNG_ABORT, RUNG_KILL_NODE, RUNG_TEARDOWN = 1, 2, 3

# Rank exit codes the SDK and the example use; anything else is a plain crash.
_EXIT_KINDS = {17: "crash", 18: "nonfinite", 143: "preempted"}


@dataclass(frozen=True)
class Fault:
    kind: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    detail: str
    rung: int
    node_failure: bool
    fault_at: float
    secondary: bool = False
    """Every failed rank said a peer broke it: the culprit has probably not shown up yet."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "ranks": list(self.ranks), "nodes": list(self.nodes), "detail": self.detail,
                "rung": self.rung, "node_failure": self.node_failure}


def completed(nodes: Mapping[str, NodeStatus], ranks_done: bool) -> bool:
    """Every agent exited 0, or (adopted agents, no exit codes) every rank reported done."""
    if not nodes:
        return False
    if all(n.state == NodeState.EXITED and n.exit_code == 0 for n in nodes.values()):
        return True
    return ranks_done and all(n.state != NodeState.RUNNING for n in nodes.values())


def classify(
    nodes: Mapping[str, NodeStatus],
    findings: Iterable[Finding],
    *,
    now: float,
    last_heard: Mapping[int, float],
    phase_started: Mapping[int, float],
    rank_nodes: Mapping[int, str],
    done_ranks: frozenset[int] | set[int] = frozenset(),
    failed_ranks: Mapping[int, bool] | None = None,
    failed_errors: Mapping[int, str] | None = None,
) -> Fault | None:
    """The fault to act on now, if any. Node failures win over findings (the gang is broken).

    A node that vanished without an exit code (an adopted agent: not our child) is a fault
    unless all its ranks said they were done; it does not count toward excluding the node,
    since its cause is unknown. A node killed by a signal we did not send does.

    ``failed_ranks`` maps the ranks that reported their own end (phase ``failed``) to whether
    a peer caused it; ``failed_errors`` holds their messages for the fault's detail. A fault
    whose failed ranks all lost a peer is ``secondary``: the caller may wait for the culprit
    to show, either as its node's exit or as a silent rank (a dead or frozen node), which
    then wins.
    """
    failed = failed_ranks or {}
    candidates = []
    for name, n in sorted(nodes.items()):
        if n.killed_by_us or n.state == NodeState.RUNNING:
            continue
        if n.state == NodeState.EXITED and n.exit_code == 0:
            continue  # finished; completion is decided when all have
        ranks = tuple(sorted(r for r, node in rank_nodes.items() if node == name))
        if n.state == NodeState.LOST and ranks and all(r in done_ranks for r in ranks):
            continue  # an adopted agent that finished its work
        # The culprit first: a node killed by a signal, or with a rank that died without a
        # word; then one whose rank failed on its own error; last, one whose ranks all lost a
        # peer (when one rank is killed, the others fail "connection reset by peer" at once,
        # and their agent may exit first).
        reported = [r for r in ranks if r in failed]
        if (n.exit_code is not None and n.exit_code < 0) or not ranks or len(reported) < len(ranks):
            order = 0
        elif not all(failed[r] for r in reported):
            order = 1
        else:
            order = 2
        candidates.append((order, name, n, ranks))
    # A rank that said it failed and then went quiet is not a silent culprit: it is gone, and
    # its node's exit (or its peers') says so.
    findings = [f for f in findings if f.kind != Kind.NONFINITE  # the job stops itself on NaN
                and not (f.kind == Kind.DEAD and all(r in failed for r in f.ranks))]
    if candidates:
        order, name, n, ranks = min(candidates, key=lambda c: (c[0], c[1]))
        silent_culprits = [f for f in findings if f.kind in (Kind.DEAD, Kind.NOT_STARTED)]
        if order < 2 or not silent_culprits:
            errors = "; ".join(f"rank {r}: {failed_errors.get(r, '')}"[:240] for r in ranks if r in failed) \
                if failed_errors else ""
            suffix = f" ({errors})" if errors else ""
            if n.state == NodeState.LOST:
                return Fault("node_lost", ranks, (name,), f"node {name} vanished (exit code unknown){suffix}",
                             RUNG_TEARDOWN, False, now, secondary=order == 2)
            if n.exit_code is not None and n.exit_code < 0:
                return Fault("node_lost", ranks, (name,), f"node {name} killed by signal {-n.exit_code}",
                             RUNG_TEARDOWN, True, now)
            kind = _EXIT_KINDS.get(n.exit_code or 0, "rank_exit")
            return Fault(kind, ranks, (name,), f"node {name}: a rank exited with code {n.exit_code}{suffix}",
                         RUNG_TEARDOWN, False, now, secondary=order == 2)
        # only peers of the culprit have failed, and the culprit is a silent rank (its whole
        # node died or froze, so no agent exit tells of it): name it
        findings = silent_culprits
    if not findings:
        return None
    # Prefer named culprits; among them, the silent ones (they cannot be aborted).
    order = {Kind.DEAD: 0, Kind.NOT_STARTED: 1, Kind.COLLECTIVE_HANG: 2, Kind.HANG: 3, Kind.DATA_STALL: 4,
             Kind.CHECKPOINT_STALL: 5, Kind.STARTUP_STALL: 6}
    f = min(findings, key=lambda x: (not x.culprit, order.get(x.kind, 9)))
    silent = f.kind in (Kind.DEAD, Kind.NOT_STARTED)
    stopped_nodes = {name for name in f.nodes if nodes.get(name) and nodes[name].stopped}
    if silent:
        fault_at = min((last_heard.get(r, now) for r in f.ranks), default=now)
    else:
        fault_at = min((phase_started.get(r, now) for r in f.ranks), default=now)
    return Fault(
        kind=f.kind.value, ranks=f.ranks, nodes=f.nodes or tuple(sorted({rank_nodes.get(r, "") for r in f.ranks} - {""})),
        detail=f.detail, rung=RUNG_KILL_NODE if silent else RUNG_ABORT,
        node_failure=bool(stopped_nodes) and stopped_nodes == set(f.nodes), fault_at=fault_at,
    )


@dataclass(frozen=True)
class Relaunch:
    nodes: tuple[str, ...]
    restore_from: str | None
    exclude_checkpoints: tuple[str, ...]
    newly_excluded: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stop:
    phase: JobPhase
    reason: str


@dataclass
class History:
    """What the progress guard and node exclusion remember across attempts."""

    restarts: int = 0
    attempts_without_progress: int = 0
    node_failures: dict[str, int] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    suspects: list[str] = field(default_factory=list)


def plan_next(
    *,
    history: History,
    fault: Fault,
    made_progress: bool,
    attempt_restored_from: str | None,
    first_step_done: bool,
    slots: list[str],
    previous_nodes: Iterable[str],
    nodes_min: int,
    nodes_max: int,
    max_restarts: int,
    guard_attempts: int,
    exclude_after: int,
    latest_checkpoint: str | None,
    straggler_nodes: Iterable[str] = (),
) -> Relaunch | Stop:
    """Decide the next attempt after a failed one; updates ``history`` in place.

    * a checkpoint the failed attempt restored from but never got past is suspect;
    * nodes with ``exclude_after`` node-level failures (and persistent stragglers, if asked)
      are excluded;
    * the progress guard stops the job after ``guard_attempts`` failed attempts in a row
      with no new complete checkpoint, or after ``max_restarts``;
    * the next gang is the largest healthy one in [min, max], keeping the nodes that were
      fine and adding spares in slot order.
    """
    if attempt_restored_from and not first_step_done and attempt_restored_from not in history.suspects:
        history.suspects.append(attempt_restored_from)
    newly: list[str] = []
    if fault.node_failure:
        for node in fault.nodes:
            history.node_failures[node] = history.node_failures.get(node, 0) + 1
            if history.node_failures[node] >= exclude_after and node not in history.excluded:
                history.excluded.append(node)
                newly.append(node)
    for node in straggler_nodes:
        if node not in history.excluded:
            history.excluded.append(node)
            newly.append(node)
    history.attempts_without_progress = 0 if made_progress else history.attempts_without_progress + 1
    history.restarts += 1
    if history.restarts > max_restarts:
        return Stop(JobPhase.STOPPED_MAX_RESTARTS, f"{history.restarts - 1} restarts reached restart.max_restarts={max_restarts}")
    if history.attempts_without_progress >= guard_attempts:
        return Stop(JobPhase.STOPPED_NO_PROGRESS,
                    f"{history.attempts_without_progress} attempts in a row without a new complete checkpoint "
                    f"(last fault: {fault.kind})")
    healthy = [s for s in slots if s not in history.excluded]
    if len(healthy) < nodes_min:
        return Stop(JobPhase.STOPPED_NO_CAPACITY,
                    f"{len(healthy)} healthy node slots left, nodes.min is {nodes_min} (excluded: {history.excluded})")
    keep = [n for n in previous_nodes if n in healthy]
    spares = [s for s in healthy if s not in keep]
    chosen = (keep + spares)[:nodes_max]
    pick = latest_checkpoint if latest_checkpoint not in history.suspects else None
    return Relaunch(tuple(chosen), pick, tuple(history.suspects), tuple(newly))


@dataclass
class RestartTimer:
    """One restart's phase times (controller clock): fault -> detected -> torn down ->
    scheduled -> rendezvous -> restored -> first step."""

    attempt_from: int
    reason: str
    fault_at: float
    detected_at: float
    torn_down_at: float | None = None
    scheduled_at: float | None = None
    rendezvous_at: float | None = None
    restored_at: float | None = None
    first_step_at: float | None = None

    PHASES = ("detect", "teardown", "schedule", "rendezvous", "restore", "first_step")

    def durations(self) -> dict[str, float]:
        marks = [self.fault_at, self.detected_at, self.torn_down_at, self.scheduled_at, self.rendezvous_at,
                 self.restored_at, self.first_step_at]
        out = {}
        for name, a, b in zip(self.PHASES, marks, marks[1:]):
            if a is not None and b is not None:
                out[name] = max(0.0, b - a)
        return out

    @property
    def done(self) -> bool:
        return self.first_step_at is not None

    def total(self, now: float) -> float:
        return (self.first_step_at if self.first_step_at is not None else now) - self.fault_at

    def budget_remaining(self, budget_s: float, now: float) -> float:
        return budget_s - self.total(now)

    def to_dict(self, now: float, budget_s: float) -> dict:
        return {"attempt_from": self.attempt_from, "reason": self.reason, "phases": self.durations(),
                "total_s": round(self.total(now), 3), "done": self.done,
                "within_budget": self.total(now) <= budget_s}
