"""What one look at the running gang decides: the job has completed, a fault is to be recovered
from, or nothing yet; with what the looks remember between them (:class:`Memory`).

Plain data in (the nodes as the platform reports them, the ranks' last heartbeats, the clock), a
verdict out: no I/O, no clock of its own, no platform. The controller observes, calls
:func:`ended` and :func:`fault`, and acts on what they say.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping

from supervisor.controller.decide import (
    RUNG_TEARDOWN,
    CapacityWait,
    RestoreReport,
    Fault,
    Shrink,
    Stop,
    calibration_every_s,
    calibration_stride,
    capacity,
    classify,
    completed,
    rank_ended,
    restarted_in_place,
    restore_report,
)
from supervisor.health import Registry, Timeouts, calibrate, detect, straggler_scores
from supervisor.model import WAIT_CANNOT_START, NodeState, NodeStatus


@dataclass(frozen=True)
class Memory:
    """What the looks remember between them."""

    agents_ended_at: float | None = None
    """Since when no agent of the gang has been running."""
    secondary_since: float | None = None
    """Since when only ranks that lost a peer have failed (the culprit gets a moment to show up)."""
    in_place_deadline: float | None = None
    """The ranks restarted in place report in by then, or the gang is torn down."""
    in_place_failed: bool = False
    """The last restart in place did not come back in time (the next fault is not restarted in place)."""
    capacity_since: float | None = None
    """Since when the cluster could not place the gang (None: placed, or not on such a platform)."""
    capacity_message: str = ""
    """What the cluster says of the wait (its scheduler's own words)."""
    launched_at: float = 0.0
    """When the running attempt was placed (its startup timeout runs from then)."""
    standby_at: float | None = None
    """When the platform's warm agents are refilled (the gang has been running a while)."""
    pending_stop: tuple[Any, str] | None = None
    """(phase, reason): the job stops at the next look, its gang torn down first."""


@dataclass(frozen=True)
class Policy:
    heartbeat_timeout_s: float
    in_place_timeout_s: float
    secondary_grace_s: float = 2.0
    """How long, at least, a fault seen only through ranks that lost a peer waits for the culprit
    (and at most the heartbeat timeout + 1 s, so that a silent culprit is seen)."""


@dataclass(frozen=True)
class Look:
    """One look at the gang."""

    now: float
    nodes: Mapping[str, NodeStatus]
    registry: Registry
    """The ranks' last heartbeats (read, never changed)."""
    attempt: int
    gang: tuple[str, ...]
    """The nodes of the running attempt."""
    in_place_allowed: int = 0
    ahead_attempt: int | None = None
    """Ranks of a later attempt were heard (restarted in place by their agents)."""
    logged_steps: Mapping[int, int] = None  # type: ignore[assignment]
    """Ranks that ended: the last step their own log recorded in this attempt (see :func:`ended_ranks`)."""
    timeouts: Timeouts | None = None
    launched_at: float = 0.0


@dataclass(frozen=True)
class Detection:
    """What the detectors run with and last found: the phase timeouts (calibrated from the ranks'
    step times), each rank's straggler score, and the last look's findings."""

    timeouts: Timeouts
    stragglers: Mapping[int, float] = field(default_factory=dict)
    findings: tuple = ()
    calibrated_at: float | None = None


@dataclass(frozen=True)
class Calibration:
    heartbeat_s: float
    startup_s: float
    checkpoint_s: float
    factor: float
    floor_s: float
    ceiling_s: float
    every_s: float = 2.0
    """Step-time statistics move slowly: every few seconds is enough (at 16k ranks recomputing
    them on every look would cost more than the detectors themselves)."""


def calibration_due(det: Detection, now: float, registry: Registry, cal: Calibration) -> bool:
    """Whether :func:`calibrated` would recompute at ``now``."""
    return det.calibrated_at is None or now - det.calibrated_at >= calibration_every_s(cal.every_s, registry.world_size)


def calibrated(det: Detection, now: float, registry: Registry, cal: Calibration) -> Detection:
    """The phase timeouts and straggler scores, recomputed from the ranks' step times when
    ``cal.every_s`` has passed since the last time (longer for a large gang:
    :func:`~.decide.calibration_every_s`; its step-time median from a sample of the ranks:
    :func:`~.decide.calibration_stride`)."""
    if not calibration_due(det, now, registry, cal):
        return det
    ranks = registry.ranks
    stride = calibration_stride(len(ranks))
    sample = ranks.values() if stride == 1 else filter(None, map(ranks.get, range(0, max(ranks) + 1, stride)))
    step_times = [t for t in (rec.hb.step_median_s for rec in sample) if t > 0]  # each rank's median of its last steps
    timeouts = calibrate(step_times, heartbeat_s=cal.heartbeat_s, startup_s=cal.startup_s,
                         checkpoint_s=cal.checkpoint_s, factor=cal.factor, floor_s=cal.floor_s,
                         ceiling_s=cal.ceiling_s)
    return replace(det, timeouts=timeouts, stragglers=straggler_scores(registry), calibrated_at=now)


@dataclass(frozen=True)
class Completed:
    missing: tuple[int, ...]
    """Ranks whose last heartbeat (saying they finished) never arrived."""
    heard: bool
    """Some rank sent a heartbeat (else the command never started the worker SDK)."""


def ended(mem: Memory, look: Look, policy: Policy) -> tuple[Memory, Completed | None]:
    """Whether the job has completed: every agent exited 0 and every rank said it finished (or
    the agents ended long enough ago that a last word would have arrived)."""
    nodes, now, reg = look.nodes, look.now, look.registry
    if nodes and all(n.state != NodeState.RUNNING for n in nodes.values()):
        mem = replace(mem, agents_ended_at=mem.agents_ended_at or now)
    elif mem.agents_ended_at is not None:
        mem = replace(mem, agents_ended_at=None)
    if not nodes or any(n.state == NodeState.RUNNING for n in nodes.values()):
        return mem, None  # an agent runs (completed()'s first rule): no need to read every rank
    outcomes = {r: rec.hb.outcome for r, rec in reg.ranks.items()}
    world = reg.world_size
    # less than the heartbeat timeout: a rank silent that long would read as dead
    if not completed(nodes, outcomes, world, waited_s=now - (mem.agents_ended_at or now),
                     grace_s=policy.heartbeat_timeout_s / 2):
        return mem, None
    missing = sorted(set(range(world)) - {r for r, o in outcomes.items() if o}) if outcomes else []
    return mem, Completed(tuple(missing), bool(reg.ranks))


def ended_ranks(nodes: Mapping[str, NodeStatus], registry: Registry) -> set[int]:
    """The ranks known to have ended: their agent recorded the end or failed them, or their node
    was OOM-killed (every rank of it). The controller reads their own logs' last step for
    :attr:`Look.logged_steps` (heartbeats are sampled; a rank killed mid-step leaves its log
    one step behind its last heartbeat's step or ahead of it)."""
    ranks = registry.ranks
    exited = {pid for st in nodes.values() for pid, _, _ in st.exit_codes}
    # every rank is read only when some process exited or a node ran out of memory (else O(nodes))
    by_pid = {rec.hb.pid: r for r, rec in ranks.items() if rec.hb.pid and rec.hb.pid in exited} if exited else {}
    oom = {n for n, st in nodes.items() if st.out_of_memory}
    return ({f.rank for st in nodes.values() for f in st.failures}
            | {by_pid[pid] for st in nodes.values() for pid, _, _ in st.exit_codes if pid in by_pid}
            | ({r for r, rec in ranks.items() if rec.hb.node in oom} if oom else set()))


class PerRank(Mapping[int, Any]):
    """One field of every rank's record, read when asked (``get`` of the record). The pure
    decisions look up a few ranks, and iterate only where a node was lost; a dict of every rank
    built for each look cost ~60 ms a field at 131,072 ranks (the records cold in the caches).
    Valid while the records stay as they are: within one synchronous call."""

    __slots__ = ("_ranks", "_get")

    def __init__(self, ranks: Mapping[int, Any], get: Callable[[Any], Any]) -> None:
        self._ranks, self._get = ranks, get

    def __getitem__(self, rank: int) -> Any:
        return self._get(self._ranks[rank])

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)


class _Steps(Mapping[int, int]):
    """Each rank's step; for a rank that ended, the one after the last its log recorded, if later."""

    __slots__ = ("_ranks", "_logged")

    def __init__(self, ranks: Mapping[int, Any], logged: Mapping[int, int]) -> None:
        self._ranks, self._logged = ranks, logged

    def __getitem__(self, rank: int) -> int:
        rec, logged = self._ranks.get(rank), self._logged.get(rank)
        if logged is None:
            if rec is None:
                raise KeyError(rank)
            return rec.hb.step
        return max(rec.hb.step if rec is not None else 0, logged + 1)

    def __iter__(self) -> Iterator[int]:
        yield from self._ranks
        yield from (r for r in self._logged if r not in self._ranks)

    def __len__(self) -> int:
        return len(self._ranks) + sum(1 for r in self._logged if r not in self._ranks)


_RECEIVED = operator.attrgetter("received")
_NODE, _PID = operator.attrgetter("hb.node"), operator.attrgetter("hb.pid")


def _phase_started(rec: Any) -> float:
    return rec.received - rec.hb.phase_s


def ranks_said(look: Look) -> dict[str, Any]:
    """What the ranks' last heartbeats say, as the pure decisions (classify, restarted_in_place,
    rank_ended) take it: where each rank runs, which are done, which failed (and whether a peer
    broke them, and their error), whose loss was not finite, and each rank's step (for a rank
    that ended, the one after the last its log recorded, if later). Where they run and their
    steps are views, read when asked (:class:`PerRank`); the others come off the registry's
    index (O(the ranks in them))."""
    reg = look.registry
    ranks = reg.ranks
    failed = reg.failed()
    return {
        "rank_nodes": PerRank(ranks, _NODE),
        "done_ranks": reg.done(),
        "failed_ranks": {r: ranks[r].hb.error_peer for r in failed},
        "failed_errors": {r: ranks[r].hb.error for r in failed},
        "nonfinite_ranks": reg.nonfinite(),
        "rank_steps": _Steps(ranks, look.logged_steps or {}),
    }


def fault(mem: Memory, look: Look, policy: Policy) -> tuple[Memory, Fault | None, list]:
    """The fault to recover from now, if any, and the detectors' findings (for the evidence and
    ``/status``; None when they did not run: a rank's end was read first).

    In order: with restarts in place allowed, the agents' own restarts (and a restart in place
    that did not come back in time); without, a rank that ended in failure (its agent's exit
    follows ~1 s later); then the detectors and the node states (:func:`classify`). A fault
    seen only through ranks that lost a peer waits a moment for the culprit's own."""
    now, reg, nodes = look.now, look.registry, look.nodes
    if look.in_place_allowed:
        ahead = look.ahead_attempt if (look.ahead_attempt or 0) > look.attempt else None
        if mem.in_place_deadline is not None and ahead is None:
            if now > mem.in_place_deadline:
                missing = sorted(set(range(reg.world_size)) - set(reg.ranks))
                return replace(mem, in_place_deadline=None, in_place_failed=True), Fault(
                    "startup_stall", tuple(missing), look.gang,
                    f"the restart in place did not report in within {policy.in_place_timeout_s:g} s "
                    f"(ranks {missing} silent): tearing the gang down", RUNG_TEARDOWN, False, now), None
            # else the restarted ranks are on their way: exits seen now are the old ones'
        else:
            found = restarted_in_place(nodes, now=now, ahead_attempt=ahead, rank_pids=_pids(reg), **ranks_said(look))
            if found is not None:
                return mem, found, None
    elif any(code for st in nodes.values() for _, code, _ in st.exit_codes):
        found = rank_ended(nodes, now=now, rank_pids=_pids(reg), **ranks_said(look))
        if found is not None:
            return mem, found, None
    findings = detect(reg, now, look.timeouts, launched_at=look.launched_at)
    if not findings and all(n.state == NodeState.RUNNING and n.waiting != WAIT_CANNOT_START for n in nodes.values()):
        return mem, None, findings
    found = classify(
        nodes, findings, now=now,
        last_heard=PerRank(reg.ranks, _RECEIVED),
        phase_started=PerRank(reg.ranks, _phase_started),
        **ranks_said(look),
        stopped_ranks={r: reg.ranks[r].hb.error for r in reg.stopped()},
    )
    if found is not None and found.secondary:
        # only ranks that lost a peer have failed so far: give the culprit's node a moment to exit
        # too, so that it (not its victim) is named and counted against its node (a whole node that
        # died or froze shows only as silence: up to the heartbeat timeout)
        since = now if mem.secondary_since is None else mem.secondary_since
        if now - since < max(policy.secondary_grace_s, policy.heartbeat_timeout_s + 1.0):
            return replace(mem, secondary_since=since), None, findings
    return replace(mem, secondary_since=None), found, findings


def _pids(registry: Registry) -> Mapping[int, int]:
    """Each rank's process, as its last heartbeat says (a view: :class:`PerRank`)."""
    return PerRank(registry.ranks, _PID)


# ---------------------------------------------------------------------------- the gang's start
@dataclass(frozen=True)
class Running:
    """Every rank of the starting gang has been heard: it runs."""

    world_size: int


@dataclass(frozen=True)
class Reported:
    """Every rank has said how its restore went (the attempt's first report)."""

    report: RestoreReport


@dataclass(frozen=True)
class SavesTo:
    """Ranks that save without restoring (no restore report comes) have said where they save."""

    report: RestoreReport


def started(registry: Registry, *, starting: bool, reported: bool, root_judged: bool) -> list[Running | Reported | SavesTo]:
    """What the ranks' heartbeats say of the attempt's start, once each: it runs (``starting``:
    the controller still says it starts), how the restore went (``reported``: already said), or,
    without a restore, where the ranks save (``root_judged``: already checked)."""
    ranks = registry.ranks
    world = registry.world_size
    if not (world > 0 and len(ranks) == world):
        return []
    out: list[Running | Reported | SavesTo] = [Running(world)] if starting else []
    if reported:
        return out
    # each all() stops at the first rank that has not said it yet (no list of every rank on every look)
    if all(rec.hb.restore_state for rec in ranks.values()):
        out.append(Reported(restore_report(rec.hb for rec in ranks.values())))
    elif not root_judged and all(rec.hb.ckpt_root for rec in ranks.values()):
        out.append(SavesTo(restore_report(rec.hb for rec in ranks.values())))
    return out


# ---------------------------------------------------------------------------- placement
@dataclass(frozen=True)
class CapacityPolicy:
    wait_limit_s: float
    """restart.capacity_wait_s (or the restart budget): past it the job stops."""
    shrink_after_s: float
    nodes_min: int
    nodes_max: int
    nproc_per_node: int
    world_sizes: Iterable[int] = ()
    world_size_multiple_of: int = 1


@dataclass(frozen=True)
class Placed:
    """The gang waited for capacity and no longer does."""

    waited_s: float
    found: bool
    """Placed (False: a placed node ended meanwhile, which the fault that follows names)."""


@dataclass(frozen=True)
class Waiting:
    """The cluster cannot place the gang yet: not a fault; the startup timeout waits too."""

    first: bool
    """The wait begins now."""
    nodes: tuple[str, ...]
    message: str


def placement(mem: Memory, nodes: Mapping[str, NodeStatus], now: float,
              policy: CapacityPolicy) -> tuple[Memory, list[Placed | Waiting | Shrink | Stop]]:
    """Whether the gang waits for capacity (:func:`~supervisor.controller.decide.capacity`), and
    what follows, in order: the wait beginning or going on, then, past ``shrink_after_s``, an
    elastic gang relaunched at the size placed (:class:`Shrink`), or past ``wait_limit_s`` the
    job stopping (:class:`Stop`); or the gang placed after a wait. Nothing while a node cannot
    start at all (a startup failure, :func:`fault`'s) or nothing waits."""
    since = mem.capacity_since
    verdict = capacity(nodes, waited_s=now - (now if since is None else since), wait_limit_s=policy.wait_limit_s,
                       shrink_after_s=policy.shrink_after_s, nodes_min=policy.nodes_min, nodes_max=policy.nodes_max,
                       nproc_per_node=policy.nproc_per_node, world_sizes=policy.world_sizes,
                       world_size_multiple_of=policy.world_size_multiple_of)
    if any(st.waiting == WAIT_CANNOT_START for st in nodes.values()):
        return mem, []
    # a placed node that ended meanwhile (crashed, rejected by its node) is a fault now, whatever waits
    broken = any(st.state != NodeState.RUNNING and not (st.state == NodeState.EXITED and st.exit_code == 0)
                 for st in nodes.values())
    if verdict is None or broken:
        if since is None:
            return mem, []
        return replace(mem, capacity_since=None, capacity_message=""), [Placed(now - since, verdict is None)]
    message = verdict.message if isinstance(verdict, CapacityWait) else verdict.reason
    said: list[Placed | Waiting | Shrink | Stop] = [
        Waiting(since is None, tuple(verdict.waiting) if isinstance(verdict, CapacityWait) else (), message)]
    mem = replace(mem, capacity_since=now if since is None else since, capacity_message=message)
    if isinstance(verdict, Shrink):
        return replace(mem, capacity_since=None, capacity_message=""), said + [verdict]
    if isinstance(verdict, Stop):
        said.append(verdict)
    return mem, said
