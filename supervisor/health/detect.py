"""Findings from heartbeats: who is dead, who is stuck, and who everybody is waiting for.

Rules, in order of precedence for one rank (a rank gets at most one finding):

1. ``not_started``: launched ``startup_s`` ago and never heard from.
2. ``dead``: heard from, then silent for ``heartbeat_s`` (SIGSTOP, frozen or lost node).
3. ``collective_hang``: some ranks have waited inside collective N longer than
   ``collective_s``; the *culprits* are the live ranks that never entered N (their
   ``coll_seq`` is below N) or are stuck inside an earlier one. If every rank is inside N
   there is no culprit to name and all waiting ranks are reported (``culprit=False``).
4. ``hang`` / ``data_stall`` / ``checkpoint_stall`` / ``startup_stall``: a phase running
   longer than its timeout while heartbeats flow.
5. ``nonfinite``: the rank reported a non-finite loss.

Timeouts: data/compute/collective are calibrated from observed step times (factor x median,
clamped to [floor, ceiling]); until a step has been seen they are ``startup_s``. The
checkpoint phase has its own generous timeout so a long save is never a false alarm.
Documented ordering: rank watchdog (0.8 x) < supervisor timeout < restart budget.

Every finding but ``not_started`` needs some rank past a deadline its last heartbeat set (its
silence, its collective wait or its phase reaching a timeout; a non-finite loss at once), and
the registry indexes those as heartbeats arrive: on a look where none has come, :func:`detect`
answers [] without visiting the ranks (5 looks a second at 131,072 ranks).
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass

from supervisor.health.registry import Registry
from supervisor.protocol import (
    PHASE_CHECKPOINT,
    PHASE_COLLECTIVE,
    PHASE_COMPUTE,
    PHASE_DATA,
    PHASE_DONE,
    PHASE_INIT,
    PHASE_RESTORE,
    PHASE_TRAINING,
    TIMED_PHASES,
    ProtocolError,
    decode_groups,
    encode_watchdog,
)


class Kind(str, enum.Enum):
    NOT_STARTED = "not_started"
    DEAD = "dead"
    COLLECTIVE_HANG = "collective_hang"
    HANG = "hang"
    DATA_STALL = "data_stall"
    CHECKPOINT_STALL = "checkpoint_stall"
    STARTUP_STALL = "startup_stall"
    NONFINITE = "nonfinite"


@dataclass(frozen=True)
class Timeouts:
    heartbeat_s: float = 5.0
    startup_s: float = 300.0
    checkpoint_s: float = 900.0
    data_s: float = 300.0
    compute_s: float = 300.0
    collective_s: float = 300.0

    def for_phase(self, phase: str) -> float | None:
        field_name = _PHASE_TIMEOUTS.get(phase) or _DETECTOR_ONLY.get(phase)
        return None if field_name is None else getattr(self, field_name)

    def watchdog_env(self, fraction: float = 0.8) -> str:
        """The rank watchdog's timeouts: below ours, so stacks are dumped before we act."""
        return encode_watchdog({p: fraction * getattr(self, f) for p, f in _PHASE_TIMEOUTS.items()})


_PHASE_TIMEOUTS = {PHASE_INIT: "startup_s", PHASE_RESTORE: "startup_s", PHASE_DATA: "data_s",
                   PHASE_COMPUTE: "compute_s", PHASE_COLLECTIVE: "collective_s", PHASE_CHECKPOINT: "checkpoint_s"}
"""The :class:`Timeouts` field that times each phase of :data:`~supervisor.protocol.TIMED_PHASES`
(in its order: the order of ``SUPERVISOR_WATCHDOG``)."""
assert tuple(_PHASE_TIMEOUTS) == TIMED_PHASES
_DETECTOR_ONLY = {PHASE_TRAINING: "compute_s"}
"""Phases timed by the controller only (no SDK watchdog in the rank): an instrumented rank's
``training`` (no step and no collective progress) has the compute timeout."""


def calibrate(
    step_times: list[float], *, heartbeat_s: float, startup_s: float, checkpoint_s: float,
    factor: float, floor_s: float, ceiling_s: float,
) -> Timeouts:
    """Phase timeouts from observed step times; ``startup_s`` until a step has been seen."""
    if not step_times:
        phase = max(floor_s, startup_s)
    else:
        phase = min(ceiling_s, max(floor_s, factor * statistics.median(step_times)))
    return Timeouts(heartbeat_s=heartbeat_s, startup_s=startup_s, checkpoint_s=checkpoint_s,
                    data_s=phase, compute_s=phase, collective_s=phase)


@dataclass(frozen=True)
class Finding:
    kind: Kind
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    detail: str
    culprit: bool = True

    def to_dict(self) -> dict:
        return {"kind": self.kind.value, "ranks": list(self.ranks), "nodes": list(self.nodes),
                "detail": self.detail, "culprit": self.culprit}


_PHASE_KINDS = {PHASE_INIT: Kind.STARTUP_STALL, PHASE_RESTORE: Kind.STARTUP_STALL, PHASE_DATA: Kind.DATA_STALL,
                PHASE_COMPUTE: Kind.HANG, PHASE_COLLECTIVE: Kind.HANG, PHASE_CHECKPOINT: Kind.CHECKPOINT_STALL,
                PHASE_TRAINING: Kind.HANG}
"""The phases with a timeout (``Timeouts.for_phase``) and the finding past it."""


def detect(registry: Registry, now: float, timeouts: Timeouts, *, launched_at: float,
           rank_nodes: dict[int, str] | None = None) -> list[Finding]:
    """The findings at ``now``, always :func:`detect_full`'s, without its pass over every rank
    where the registry's index shows it is not needed: [] at once (O(1)) while no rank's deadline
    has come (:meth:`Registry.due`) and every rank has been heard or the startup timeout runs;
    the silent ranks alone, read from the index, while no rank still heard could be past another
    deadline (:meth:`Registry.due_besides_silence`: ranks that went silent stay silent until
    the gang is torn down, and each look must not then visit every rank)."""
    unheard = bool(registry.world_size) and now - launched_at > timeouts.startup_s and not registry.all_heard()
    if not registry.due(now, timeouts) and not unheard:
        return []
    if registry.due_besides_silence(now, timeouts):
        return detect_full(registry, now, timeouts, launched_at=launched_at, rank_nodes=rank_nodes)
    findings: list[Finding] = []
    if unheard:
        findings.append(_not_started(registry, now, timeouts, launched_at, rank_nodes or {}))
    findings += [_dead(registry, rank, now, timeouts.heartbeat_s)
                 for rank in registry.silent(now, timeouts.heartbeat_s)]
    return findings


def _not_started(registry: Registry, now: float, timeouts: Timeouts, launched_at: float,
                 rank_nodes: dict[int, str]) -> Finding:
    missing = tuple(r for r in range(registry.world_size) if r not in registry.ranks)
    nodes = tuple(sorted({rank_nodes.get(r, "") for r in missing} - {""}))
    return Finding(Kind.NOT_STARTED, missing, nodes,
                   f"no heartbeat {now - launched_at:.0f}s after launch (> {timeouts.startup_s:.0f}s)")


def _dead(registry: Registry, rank: int, now: float, heartbeat_s: float) -> Finding:
    rec = registry.ranks[rank]
    hb = rec.hb
    return Finding(Kind.DEAD, (rank,), (hb.node,) if hb.node else (),
                   f"silent for {now - rec.received:.1f}s (> {heartbeat_s:.1f}s) at step {hb.step}, last phase {hb.phase}")


def detect_full(registry: Registry, now: float, timeouts: Timeouts, *, launched_at: float,
                rank_nodes: dict[int, str] | None = None) -> list[Finding]:
    """The findings at ``now``, from a pass over every rank (what :func:`detect` does when
    something is due; tests and benchmarks compare the two)."""
    rank_nodes = rank_nodes or {}
    findings: list[Finding] = []
    claimed: set[int] = set()

    def node_of(rank: int) -> str:
        rec = registry.ranks.get(rank)
        return rec.hb.node if rec else rank_nodes.get(rank, "")

    def add(kind: Kind, ranks: list[int], detail: str, culprit: bool = True) -> None:
        ranks = sorted(set(ranks) - claimed)
        if not ranks:
            return
        claimed.update(ranks)
        nodes = tuple(sorted({node_of(r) for r in ranks} - {""}))
        findings.append(Finding(kind, tuple(ranks), nodes, detail, culprit))

    # 1. never started
    if registry.world_size and now - launched_at > timeouts.startup_s and not registry.all_heard():
        found = _not_started(registry, now, timeouts, launched_at, rank_nodes)
        findings.append(found)
        claimed.update(found.ranks)

    # 2. silent; the same pass over every rank notes who waits in a collective, who is past
    # its phase timeout and who reported a non-finite loss (rules 3-5 below, in order)
    heartbeat_s, collective_s = timeouts.heartbeat_s, timeouts.collective_s
    limits = {p: timeouts.for_phase(p) for p in _PHASE_KINDS}
    alive = {}
    inside = {}
    waiting = {}
    overdue: list[int] = []
    nan: list[int] = []
    dead: list[int] = []
    for rank, rec in registry.ranks.items():
        hb = rec.hb
        if hb.phase == PHASE_DONE:
            continue
        silent = now - rec.received
        if silent > heartbeat_s:
            dead.append(rank)
            continue
        alive[rank] = rec
        if silent < 0.0:
            silent = 0.0
        if hb.coll_inside:
            inside[rank] = rec
            if hb.coll_s + silent > collective_s:  # _coll_waited
                waiting[rank] = rec
        limit = limits.get(hb.phase)
        if limit is not None and hb.phase_s + silent > limit:  # _phase_elapsed
            overdue.append(rank)
        if not hb.loss_ok:
            nan.append(rank)

    findings += [_dead(registry, rank, now, heartbeat_s) for rank in sorted(dead)]  # (never started: not here)
    claimed.update(dead)

    # 3. collective hang and its culprit
    borrowed = False
    if not waiting and any(alive[r].hb.phase in (PHASE_TRAINING, PHASE_DATA) and not alive[r].hb.coll_inside
                           for r in overdue):
        # a rank made no progress past its timeout (an instrumented one, or one idle in data): if
        # peers wait in a collective it never entered (however briefly yet: it went idle before they
        # arrived), it is their culprit, whichever of the two deadlines came first
        waiting, borrowed = inside, True
    if waiting:
        # the ranks the others wait for are compared in the one process group the waiters wait in
        # (an instrumented rank's flight recorder numbers each group apart; the SDK counts one stream)
        group = max(waiting.values(), key=lambda rec: _coll_waited(rec, now)).hb.coll_group
        waiting = {r: rec for r, rec in waiting.items() if rec.hb.coll_group == group}
        n = max(rec.hb.coll_seq for rec in waiting.values())
        in_n = sorted(r for r, rec in waiting.items() if rec.hb.coll_seq == n)
        op = registry.ranks[in_n[0]].hb.coll_op or "collective"
        waited = max(_coll_waited(registry.ranks[r], now) for r in in_n)
        entered = {r: _entered(rec, group) for r, rec in alive.items()}
        culprits = [r for r, seq in entered.items() if seq is not None and seq < n]
        dead_culprits = [f for f in findings if f.kind in (Kind.DEAD, Kind.NOT_STARTED)]
        where_n = f"{op} #{n}" + (f" of process group {group}" if group not in ("", "0") else "")
        head = f"ranks {_span(in_n)} wait in {where_n} for {waited:.1f}s"
        saving = [r for r in culprits if alive[r].hb.phase == PHASE_CHECKPOINT
                  and _phase_elapsed(alive[r], now) <= timeouts.checkpoint_s]
        if culprits and len(saving) == len(culprits):
            pass  # they wait for ranks that are saving a checkpoint: a checkpoint stall, if anything, later
        elif culprits:
            parts = []
            for r in sorted(culprits):
                hb = alive[r].hb
                where = f"inside {hb.coll_op} #{hb.coll_seq}" if hb.coll_inside else f"in phase {hb.phase}"
                parts.append(f"rank {r} never entered it ({where}, step {hb.step}, {_phase_elapsed(alive[r], now):.1f}s)")
            # A culprit stuck in compute past its own timeout is a hang found by the phase timeout;
            # one idling elsewhere (data) while its peers wait is a skipped collective.
            # (its clock, extrapolated from its last heartbeat, can read a few ms short of the others' wait
            # that it caused: computing for 90 % of it is computing all along)
            hung = [r for r in culprits if alive[r].hb.phase == PHASE_COMPUTE and not alive[r].hb.coll_inside
                    and (_phase_elapsed(alive[r], now) > timeouts.compute_s
                         or _phase_elapsed(alive[r], now) >= 0.9 * waited)]
            kind = Kind.HANG if hung and len(hung) == len(culprits) else Kind.COLLECTIVE_HANG
            add(kind, culprits, f"{head}; " + "; ".join(parts))
        elif dead_culprits or borrowed:
            pass  # the silent ranks are the culprits, the waiting ones victims; or no rank is behind the
            # peers that are inside a collective (not yet past its timeout): the phase timeout speaks
        else:
            add(Kind.COLLECTIVE_HANG, in_n, f"{head}; every rank is inside it: no rank to blame "
                "(a rank died inside the collective, or the network)", culprit=False)
        victims = set() if borrowed and not culprits else set(in_n) | set(waiting)
    else:
        victims = set()

    # 4. phase timeouts (victims of a named culprit are not hung themselves)
    for rank in overdue:
        if rank in victims:
            continue
        rec = alive[rank]
        phase = rec.hb.phase
        add(_PHASE_KINDS[phase], [rank], f"phase {phase} running {_phase_elapsed(rec, now):.1f}s "
            f"(> {limits[phase]:.1f}s) at step {rec.hb.step}"
            + (f"; watchdog: {rec.hb.watchdog}" if rec.hb.watchdog else ""))

    # 5. non-finite loss
    if nan:
        add(Kind.NONFINITE, nan, "non-finite loss reported")
    return findings


def straggler_scores(registry: Registry) -> dict[int, float]:
    """Each rank's median exposed work time (data + compute, over its last steps: the
    heartbeat's ``work_median_s``) over the median of its peers' (the others, so that one slow
    rank of two still stands out).

    1.0 is typical; 2.0 means twice as slow as the middle rank. Ranks that have not yet said
    theirs (fewer than :data:`~supervisor.protocol.MEDIAN_MIN_STEPS` steps, or an SDK older than
    the field) are left out. Exposed work excludes time waiting in collectives, so the ranks that
    wait for a straggler do not look slow themselves.
    """
    medians = {r: rec.hb.work_median_s for r, rec in registry.ranks.items() if rec.hb.work_median_s > 0}
    if len(medians) < 2:
        return {r: 1.0 for r in medians}
    # One sort, then each rank's peers' median by index arithmetic: O(n log n), not O(n^2).
    order = sorted(medians, key=medians.__getitem__)
    values = [medians[r] for r in order]
    scores = {}
    for i, r in enumerate(order):
        peers = _median_without(values, i)
        scores[r] = medians[r] / peers if peers > 0 else 1.0
    return scores


def _median_without(values: list[float], skip: int) -> float:
    """The median of sorted ``values`` with the element at index ``skip`` left out."""
    n = len(values) - 1

    def at(k: int) -> float:  # k-th smallest of the remaining n
        return values[k if k < skip else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _entered(rec, group: str) -> int | None:
    """How far ``rec``'s rank got in ``group``: the last collective it entered there (None: not a
    member, as far as its heartbeat tells). The SDK's single count stands for every group."""
    hb = rec.hb
    if hb.coll_group == group or not hb.coll_groups:
        return hb.coll_seq
    try:
        seqs = decode_groups(hb.coll_groups).get(group)
    except ProtocolError:  # checked at the intake; never trusted further than that
        return None
    if seqs is None:
        return None
    enqueued, completed = seqs
    return enqueued


def _coll_waited(rec, now: float) -> float:
    # coll_s as reported, plus the time since that report
    return rec.hb.coll_s + max(0.0, now - rec.received)


def _phase_elapsed(rec, now: float) -> float:
    return rec.hb.phase_s + max(0.0, now - rec.received)


def _span(ranks: list[int]) -> str:
    if len(ranks) <= 6:
        return ",".join(map(str, ranks))
    return f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)"
