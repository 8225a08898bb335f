"""Prometheus metrics, read from the controller's state at scrape time.

No global registry and no counters updated in hot paths: each scrape takes a *snapshot* of
the controller's state (cheap references, on the event loop) and turns it into metric
families (anywhere: ``/metrics`` does it in a worker thread, see
:class:`Exporter`). Names follow Prometheus conventions (``_seconds``, ``_total``, base
units) and pass ``promtool check metrics``.

Cardinality is bounded whatever the job's size (a target should stay well under 10,000
series):

* job-level aggregates for every job: ranks per phase, stale ranks, oldest and p99
  heartbeat age, min/max step, step rate, the worst straggler score and the number of
  stragglers;
* per-rank series (``supervisor_rank_heartbeat_age_seconds``, ``supervisor_rank_step``,
  ``supervisor_straggler_score``, ``supervisor_rank_phase``, ``supervisor_rank_info``: 13
  series a rank at most) for every rank while the world size is at most
  ``metrics_per_rank_limit`` (config, default 256); above it only for the ranks worth
  looking at: the :data:`WORST_RANKS` oldest heartbeats past the heartbeat timeout and the
  :data:`WORST_RANKS` highest straggler scores past ``health.straggler_threshold`` (none in
  a healthy job);
* per-rank series carry ``job`` and ``rank`` only; the node a rank runs on is in
  ``supervisor_rank_info{job,rank,node}`` (join with ``* on (job, instance, rank)
  group_left (node) supervisor_rank_info``), so a relaunch on other nodes keeps every
  per-rank series;
* a fault's culprits are capped at :data:`WORST_RANKS` series, with the full count in
  ``supervisor_last_fault_ranks``.

Labelled counters export every known label value at 0 from the start, so that
``increase()``/``rate()`` see the first event (a series born at 1 hides its first increment).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import heapq
import math
import operator
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from supervisor.controller import decide
from supervisor.controller.decide import JobPhase
from supervisor.controller.releases import ROLLBACK_REASONS
from supervisor.reports.goodput import CAUSES as GOODPUT_CAUSES
from supervisor.health import Kind
from supervisor.protocol import PHASE_DONE, PHASES, REJECT_REASONS, RESTART_PHASES

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller
    from supervisor.controller.view import JobView

RESTART_PHASE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800)
WORST_RANKS = 10
"""Per-rank series above the per-rank limit: this many stale ranks and this many stragglers."""
DEFAULT_PER_RANK_LIMIT = 256
CHECKPOINT_INTERVALS_KEPT = 3
GZIP_LEVEL = 6

# Every fault kind the controller can restart for (the detectors' and decide.classify()'s from
# node exits); a kind not listed here is still exported once it is first counted.
_NODE_FAULT_KINDS = ("crash", "node_lost", "nonfinite", "preempted", "rank_exit")


def restart_reasons() -> tuple[str, ...]:
    """The ``reason`` label values of ``supervisor_restarts_total`` exported at 0 from the start."""
    kinds = {k.value for k in Kind} | set(_NODE_FAULT_KINDS) | set(getattr(decide, "FAULT_KINDS", ()))
    return tuple(sorted(kinds))


# ------------------------------------------------------------------------------ state
class MetricsState:
    """What the metrics remember between scrapes (one per controller process)."""

    def __init__(self) -> None:
        self.started_unix = time.time()
        self._ckpt_created: deque[float] = deque(maxlen=CHECKPOINT_INTERVALS_KEPT + 1)

    def observe_checkpoint(self, created_unix: float | None) -> None:
        if created_unix is None:
            return
        if not self._ckpt_created or created_unix > self._ckpt_created[-1]:
            self._ckpt_created.append(created_unix)

    def checkpoint_interval(self) -> float | None:
        """The longest of the last intervals between newly published checkpoints seen, or None
        before two were seen."""
        t = list(self._ckpt_created)
        gaps = [b - a for a, b in zip(t, t[1:])]
        return max(gaps) if gaps else None


# ------------------------------------------------------------------------------ snapshot
@dataclass
class Snapshot:
    """Everything one rendering needs, taken on the event loop: plain values and references
    to objects the controller replaces rather than mutates (heartbeats, fault records)."""

    job: str
    now: float
    unix: float
    phase: str
    attempt: int
    world_size: int
    timeout_s: float
    straggler_threshold: float
    per_rank_limit: int
    ranks: list[Any]
    """The registry's RankRecords (a list copy: no per-rank object is made on the event loop, and
    the garbage collector sees one new container per scrape, not one per rank); read as they are
    when rendered (a rank's record may have moved on by a heartbeat)."""
    stragglers: dict[int, float]
    hang_kind: str | None = None
    hang_culprits: list[tuple[int, str]] = field(default_factory=list)
    last_fault_kind: str | None = None
    last_fault_attempt: int = -1
    last_fault_unix: float = 0.0
    last_fault_culprits: list[tuple[int, str]] = field(default_factory=list)
    restart_in_progress: bool = False
    restarts: dict[str, int] = field(default_factory=dict)
    restart_durations: list[dict[str, float]] = field(default_factory=list)
    budget_s: float = 0.0
    budget_remaining_s: float = 0.0
    budget_exceeded: bool = False
    checkpoint: dict[str, Any] | None = None
    checkpoint_interval_s: float | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    received: int = 0
    node_frames: int = 0
    excluded_nodes: int = 0
    suspect_checkpoints: int = 0
    step_rate: float = 0.0
    stop_requested: bool = False
    run_started_unix: float = 0.0
    waiting_for_capacity_s: float = 0.0
    """How long the cluster has not been able to place the gang (0: placed)."""
    release: dict[str, Any] = field(default_factory=dict)
    """The running release (:func:`supervisor.controller.releases.summary`)."""
    goodput: dict[str, Any] = field(default_factory=dict)
    """The job's goodput so far (:func:`supervisor.reports.goodput.summary`)."""


def take_snapshot(v: JobView, state: MetricsState) -> Snapshot:
    """What one rendering needs, from the job's view (:class:`~supervisor.controller.view.JobView`)
    and what the metrics remember between scrapes (every checkpoint the controller saw published
    counts toward the interval, not only the one current at this scrape: two saves between
    scrapes would otherwise hide one). O(1) in the number of ranks."""
    for created in v.checkpoint_times:
        state.observe_checkpoint(created)
    ck = v.checkpoint
    state.observe_checkpoint(ck["created_unix"] if ck else None)
    return Snapshot(
        job=v.job, now=v.now, unix=v.unix, phase=v.phase, attempt=v.attempt, world_size=v.world_size,
        timeout_s=v.timeout_s, straggler_threshold=v.straggler_threshold, per_rank_limit=v.per_rank_limit,
        ranks=v.ranks, stragglers=v.stragglers, hang_kind=v.hang_kind, hang_culprits=v.hang_culprits,
        last_fault_kind=v.last_fault_kind, last_fault_attempt=v.last_fault_attempt,
        last_fault_unix=v.last_fault_unix, last_fault_culprits=v.last_fault_culprits,
        restart_in_progress=v.restart_in_progress, restarts=v.restarts,
        restart_durations=[tm.durations() for tm in v.timers], budget_s=v.budget_s,
        budget_remaining_s=v.budget_remaining_s, budget_exceeded=v.budget_exceeded,
        checkpoint=dict(ck) if ck else None, checkpoint_interval_s=state.checkpoint_interval(),
        rejected=v.rejected, received=v.received, node_frames=v.node_frames, excluded_nodes=len(v.excluded_nodes),
        suspect_checkpoints=len(v.suspect_checkpoints),
        step_rate=max(0.0, float(v.step_rate)), stop_requested=v.stop_requested,
        run_started_unix=float(v.run_started_unix or state.started_unix),
        waiting_for_capacity_s=v.waiting_for_capacity_s, release=dict(v.release),
        goodput=dict(v.goodput),
    )


# ------------------------------------------------------------------------------ families
_RANK_OF = operator.attrgetter("hb.rank")


def _silence(rec: Any) -> tuple[float, int]:
    return rec.received, -rec.hb.rank


def families(s: Snapshot) -> Iterator[Metric]:
    """The metric families of one snapshot. Reads the ranks once; safe off the event loop."""
    job = s.job
    phase = GaugeMetricFamily("supervisor_job_phase", "1 for the job's current phase, 0 for the others",
                              labels=["job", "phase"])
    for p in JobPhase:
        phase.add_metric([job, p.value], 1.0 if s.phase == p.value else 0.0)
    yield phase
    yield _gauge("supervisor_attempt", "Current attempt number (every relaunch increments it)", job, s.attempt)
    yield _gauge("supervisor_world_size", "Ranks in the current attempt", job, s.world_size)
    yield _gauge("supervisor_run_start_time_seconds",
                 "Unix time this run of the job started (a newer run of the same job supersedes an older one)",
                 job, s.run_started_unix)
    yield _gauge("supervisor_waiting_for_capacity_seconds",
                 "How long the cluster has not been able to place the gang (Unschedulable, gated); 0 once placed",
                 job, s.waiting_for_capacity_s)
    yield _gauge("supervisor_stop_requested",
                 "1 once the supervisor was asked to stop (SIGTERM/SIGINT or the scheduler's warning signal)",
                 job, 1.0 if s.stop_requested else 0.0)

    # the aggregates, and the ranks a large job shows one by one (its stale and straggling ones):
    # one pass over the ranks, each record and heartbeat read once (at 131,072 ranks they are
    # scattered in memory: a pass per field read each cold again, ~40 % slower)
    recs = s.ranks
    now = s.now
    timeout = s.timeout_s
    cutoff = float(now - timeout)  # (a float: int.__gt__ of a float is NotImplemented, which is true)
    scores = s.stragglers
    threshold = s.straggler_threshold
    top = max(scores.values(), default=0.0)
    over = [(score, r) for r, score in scores.items() if score > threshold] if top > threshold else []
    every_rank = len(recs) <= s.per_rank_limit and s.world_size <= s.per_rank_limit
    straggling = set() if every_rank else {r for _, r in heapq.nlargest(WORST_RANKS, over)}
    picked: list[Any] = []  # the records of those stragglers
    stale: list[Any] = []  # the records of the ranks (not done) older than the timeout
    per_phase = dict.fromkeys(PHASES, 0)
    heard: list[float] = []  # when each rank not done was last heard
    hear = heard.append
    steps_min, steps_max, blocked = math.inf, -math.inf, 0.0
    for rec in recs:
        hb = rec.hb
        p = hb.phase
        per_phase[p] = per_phase.get(p, 0) + 1
        if p != PHASE_DONE:
            t = rec.received
            hear(t)
            if t < cutoff:
                stale.append(rec)
        step = hb.step
        if step < steps_min:
            steps_min = step
        if step > steps_max:
            steps_max = step
        if hb.ckpt_s > blocked:
            blocked = hb.ckpt_s
        if straggling and hb.rank in straggling:
            picked.append(rec)
    if not recs:
        steps_min = steps_max = 0
    n_stale = len(stale)  # older than the timeout: now - t > timeout
    live = len(heard) - n_stale
    yield _gauge("supervisor_alive_ranks", "Ranks heard from within the heartbeat timeout (done ranks excluded)",
                 job, live)
    in_phase = GaugeMetricFamily("supervisor_ranks_in_phase", "Ranks whose last heartbeat is in each phase",
                                 labels=["job", "phase"])
    for p, n in per_phase.items():
        in_phase.add_metric([job, p], float(n))
    yield in_phase
    yield _gauge("supervisor_stale_ranks", "Ranks (not done) whose last heartbeat is older than heartbeat.timeout_s",
                 job, n_stale)
    # the oldest heartbeat and the 99th percentile of the ages: the ceil(1 % of n) oldest, not a sort
    oldest = heapq.nsmallest(len(heard) - max(0, math.ceil(0.99 * len(heard)) - 1), heard) if heard else []
    yield _gauge("supervisor_rank_heartbeat_age_max_seconds", "Oldest last heartbeat of a rank that is not done",
                 job, max(0.0, now - oldest[0]) if oldest else 0.0)
    yield _gauge("supervisor_rank_heartbeat_age_p99_seconds",
                 "99th percentile of the ranks' last heartbeat ages (ranks not done)", job,
                 max(0.0, now - oldest[-1]) if oldest else 0.0)
    yield _gauge("supervisor_rank_step_min", "Lowest last reported step over the ranks", job, steps_min)
    yield _gauge("supervisor_rank_step_max", "Highest last reported step over the ranks", job, steps_max)
    yield _gauge("supervisor_step_rate",
                 "Training steps per second: the slowest rank's step over the controller's last minute "
                 "(0 while the job takes no step)", job, s.step_rate)
    yield _gauge("supervisor_straggler_score_max", "Highest straggler score of a rank (1 is typical)", job, top)
    yield _gauge("supervisor_stragglers", "Ranks whose straggler score is above health.straggler_threshold", job,
                 len(over))

    # per-rank series: every rank of a small job; above the limit, the worst ones only
    if every_rank:
        shown = sorted(recs, key=_RANK_OF)
    else:
        worst = heapq.nsmallest(WORST_RANKS, stale, key=_silence)  # the longest silent, the higher rank first
        shown = sorted({id(rec): rec for rec in worst + picked}.values(), key=_RANK_OF)
    age_f = GaugeMetricFamily("supervisor_rank_heartbeat_age_seconds",
                              "Seconds since each rank's last heartbeat (every rank up to metrics_per_rank_limit, "
                              "else the stale and straggling ones)", labels=["job", "rank"])
    step_f = GaugeMetricFamily("supervisor_rank_step", "Each rank's last reported step", labels=["job", "rank"])
    score_f = GaugeMetricFamily("supervisor_straggler_score",
                                "Rank's exposed work time over its peers' median (1 is typical)", labels=["job", "rank"])
    phase_f = GaugeMetricFamily("supervisor_rank_phase", "1 for each rank's phase in its last heartbeat, 0 for the others",
                                labels=["job", "rank", "phase"])
    info_f = GaugeMetricFamily("supervisor_rank_info", "1 for each rank shown per rank, labelled with its node",
                               labels=["job", "rank", "node"])
    for rec in shown:
        hb = rec.hb
        r = hb.rank
        lr = [job, str(r)]
        age_f.add_metric(lr, max(0.0, now - rec.received))
        step_f.add_metric(lr, hb.step)
        if r in scores:
            score_f.add_metric(lr, scores[r])
        for p in PHASES:
            phase_f.add_metric(lr + [p], 1.0 if hb.phase == p else 0.0)
        info_f.add_metric(lr + [hb.node], 1.0)
    yield age_f
    yield step_f
    yield score_f
    yield phase_f
    yield info_f

    hang = GaugeMetricFamily("supervisor_hang_detected",
                             "1 while a detected fault is being handled, labelled with its kind and culprit",
                             labels=["job", "kind", "rank", "node"])
    for r, node in s.hang_culprits:
        hang.add_metric([job, s.hang_kind or "", str(r), node], 1.0)
    yield hang
    last = GaugeMetricFamily("supervisor_last_fault_info",
                             f"1 for each culprit of the most recent fault (the first {WORST_RANKS}), kept after it "
                             "was handled", labels=["job", "kind", "rank", "node", "attempt"])
    when = GaugeMetricFamily("supervisor_last_fault_timestamp_seconds", "Unix time the most recent fault was detected",
                             labels=["job"])
    count = GaugeMetricFamily("supervisor_last_fault_ranks", "Culprit ranks of the most recent fault", labels=["job"])
    if s.last_fault_kind is not None:
        for r, node in s.last_fault_culprits[:WORST_RANKS]:
            last.add_metric([job, s.last_fault_kind, str(r), node, str(s.last_fault_attempt)], 1.0)
        when.add_metric([job], s.last_fault_unix)
        count.add_metric([job], float(len(s.last_fault_culprits)))
    yield last
    yield when
    yield count
    yield _gauge("supervisor_restart_in_progress", "1 from a fault's detection to the relaunched gang's first step", job,
                 1.0 if s.restart_in_progress else 0.0)
    restarts = CounterMetricFamily("supervisor_restarts", "Restarts by the fault that caused them",
                                   labels=["job", "reason"])
    for reason in sorted(set(restart_reasons()) | set(s.restarts)):
        restarts.add_metric([job, reason], s.restarts.get(reason, 0))
    yield restarts
    yield _restart_histogram(job, s.restart_durations)
    yield _gauge("supervisor_restart_budget_seconds", "The restart budget", job, s.budget_s)
    yield _gauge("supervisor_restart_budget_remaining_seconds",
                 "Budget left for the restart in progress (the full budget when none is)", job, s.budget_remaining_s)
    yield _gauge("supervisor_restart_budget_exceeded", "1 if the last restart took longer than its budget", job,
                 1.0 if s.budget_exceeded else 0.0)
    ck = s.checkpoint
    yield _gauge("supervisor_last_checkpoint_step", "Global step of the newest complete checkpoint (-1: none)", job,
                 ck["step"] if ck else -1)
    ts = GaugeMetricFamily("supervisor_last_checkpoint_timestamp_seconds",
                           "Unix time the newest complete checkpoint was published", labels=["job"])
    agegauge = GaugeMetricFamily("supervisor_last_checkpoint_age_seconds",
                                 "Seconds since the newest complete checkpoint was published", labels=["job"])
    if ck:
        ts.add_metric([job], ck["created_unix"])
        agegauge.add_metric([job], max(0.0, s.unix - ck["created_unix"]))
    yield ts
    yield agegauge
    interval = GaugeMetricFamily("supervisor_checkpoint_interval_seconds",
                                 f"The longest of the last {CHECKPOINT_INTERVALS_KEPT} intervals between newly "
                                 "published checkpoints this supervisor saw (absent before two)", labels=["job"])
    if s.checkpoint_interval_s is not None:
        interval.add_metric([job], s.checkpoint_interval_s)
    yield interval
    save = GaugeMetricFamily("supervisor_checkpoint_save_seconds",
                             "How long the last checkpoint save blocked the training loop (max over ranks)", labels=["job"])
    if blocked > 0:
        save.add_metric([job], blocked)
    yield save
    rejected = CounterMetricFamily("supervisor_heartbeats_rejected", "Heartbeats refused, by reason",
                                   labels=["job", "reason"])
    for reason in sorted(set(REJECT_REASONS) | set(s.rejected)):
        rejected.add_metric([job, reason], s.rejected.get(reason, 0))
    yield rejected
    received = CounterMetricFamily("supervisor_heartbeats_received", "Heartbeats accepted", labels=["job"])
    received.add_metric([job], s.received)
    yield received
    frames = CounterMetricFamily("supervisor_heartbeat_node_frames",
                                 "Frames from node agents' relays accepted (each carries the heartbeats of several ranks)",
                                 labels=["job"])
    frames.add_metric([job], s.node_frames)
    yield frames
    yield _gauge("supervisor_excluded_nodes", "Nodes excluded from future attempts", job, s.excluded_nodes)
    yield _gauge("supervisor_suspect_checkpoints",
                 "Checkpoints this run will never restore (the ranks' verification refused them, or two attempts "
                 "that restored one died before a step); kept on disk as evidence", job, s.suspect_checkpoints)
    rel = s.release
    info = GaugeMetricFamily("supervisor_release_info",
                             "1, labelled with the version the ranks run, its state (probation, known_good, rejected) "
                             "and the job's newest known-good version", labels=["job", "version", "state", "known_good"])
    if rel.get("version"):
        info.add_metric([job, rel["version"], rel.get("state") or "", rel.get("known_good") or ""], 1.0)
    yield info
    rollbacks = CounterMetricFamily("supervisor_release_rollbacks",
                                    "Releases rejected and rolled back to an earlier version, by why",
                                    labels=["job", "reason"])
    reasons = rel.get("rollback_reasons", {})
    for reason in sorted(set(ROLLBACK_REASONS) | set(reasons)):
        rollbacks.add_metric([job, reason], reasons.get(reason, 0))
    yield rollbacks
    last = GaugeMetricFamily("supervisor_release_last_rollback_timestamp_seconds",
                             "Unix time of the job's newest rollback, labelled with the version rejected (from), the "
                             "one that runs instead (to) and why", labels=["job", "from", "to", "reason"])
    lr = rel.get("last_rollback")
    if lr:
        last.add_metric([job, lr["from"], lr["to"], lr["reason"]], lr["unix"])
    yield last
    yield from _goodput(job, s.goodput)


def _goodput(job: str, g: dict[str, Any]) -> Iterator[Metric]:
    """Goodput over the job's runs so far: gauges (productive time can fall back, when a
    restore recomputes steps), so the alert takes ``delta`` over a window."""
    if not g:
        return
    yield _gauge("supervisor_goodput_wall_seconds", "Wall time the job's controllers have run it, over every run of "
                 "its log directory", job, g["wall_s"])
    yield _gauge("supervisor_goodput_productive_seconds", "The part of that wall time that trained (wall time less "
                 "every cause of badput)", job, g["productive_s"])
    yield _gauge("supervisor_goodput_ettr", "Effective training time ratio so far: productive / wall time", job,
                 g["ettr"])
    bad = GaugeMetricFamily("supervisor_goodput_badput_seconds", "Wall time that did not train, by cause: startup, "
                            "waiting_for_capacity, restart, restore, save_stall, wasted_progress (steps recomputed "
                            "after a restore)", labels=["job", "cause"])
    for cause in GOODPUT_CAUSES:
        bad.add_metric([job, cause], g["badput_s"].get(cause, 0.0))
    yield bad
    advised = GaugeMetricFamily("supervisor_checkpoint_interval_advised_seconds",
                                "The checkpoint interval that loses least for this job's failure rate, save and "
                                "restart costs (Daly; absent until a save's cost was measured)", labels=["job"])
    if g.get("advised_interval_s") is not None:
        advised.add_metric([job], g["advised_interval_s"])
    yield advised
    predicted = GaugeMetricFamily("supervisor_goodput_ettr_predicted",
                                  "The ETTR the model predicts at the current checkpoint interval (at=current) and "
                                  "at the advised one (at=advised)", labels=["job", "at"])
    for at, key in (("current", "ettr_predicted_now"), ("advised", "ettr_predicted_advised")):
        if g.get(key) is not None:
            predicted.add_metric([job, at], g[key])
    yield predicted


def _gauge(name: str, doc: str, job: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["job"])
    g.add_metric([job], float(value))
    return g


def _restart_histogram(job: str, durations: list[dict[str, float]]) -> HistogramMetricFamily:
    h = HistogramMetricFamily("supervisor_restart_phase_seconds", "Duration of each phase of completed restarts",
                              labels=["job", "phase"])
    for phase in RESTART_PHASES:
        values = [d[phase] for d in durations if phase in d]
        buckets = []
        for bound in RESTART_PHASE_BUCKETS:
            buckets.append((_fmt(bound), sum(1 for v in values if v <= bound)))
        buckets.append(("+Inf", len(values)))
        h.add_metric([job, phase], buckets, sum(values))
    return h


def _fmt(x: float) -> str:
    return str(float(x))


# ------------------------------------------------------------------------------ collectors
class ControllerCollector:
    """A prometheus_client collector over a live controller (snapshot and families in the
    calling thread: for tests and in-process use; ``/metrics`` uses :class:`Exporter`)."""

    def __init__(self, controller: "Controller", state: MetricsState | None = None) -> None:
        self.c = controller
        self.state = state or MetricsState()

    def collect(self) -> Iterator[Metric]:
        yield from families(take_snapshot(self.c.view(), self.state))


class _SnapshotCollector:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from families(self.snapshot)


def make_registry(controller: "Controller") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(controller))
    return registry


def exposition(snapshot: Snapshot) -> bytes:
    """The text exposition of one snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot))
    return generate_latest(registry)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header admits gzip (``q=0`` refuses it)."""
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        return q > 0
    return False


@dataclass
class Rendered:
    body: bytes
    gzipped: bool
    plain_bytes: int
    render_s: float
    """Wall time from the snapshot to the bytes (the worker thread's part)."""
    render_cpu_s: float
    """CPU time the worker thread spent on it."""
    rendered_at: float = 0.0
    """The controller's clock when its snapshot was taken."""
    reused: bool = False
    """Served again to a later scrape (:func:`~supervisor.controller.decide.metrics_every_s`)."""


class Exporter:
    """``/metrics`` for a controller: the snapshot on the event loop, the rest (aggregates,
    text, gzip) in one worker thread, so that a scrape of a 16,384-rank job never holds the
    loop that takes the heartbeats. Scrapes are rendered one at a time."""

    def __init__(self, controller: "Controller") -> None:
        self.c = controller
        self.state = MetricsState()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-render")
        self.last: Rendered | None = None
        self._key: tuple[str, int, bool] | None = None

    async def render(self, gzip_ok: bool) -> Rendered:
        """The exposition: rendered anew, or the last one again while it is younger than
        :func:`~supervisor.controller.decide.metrics_every_s` (a large gang; what the last
        rendering cost counts) and the job's phase and attempt are still what it shows."""
        c, last = self.c, self.last
        key = (c.phase.value, c.attempt, gzip_ok)
        if (last is not None and self._key == key
                and c.clock() - last.rendered_at < decide.metrics_every_s(c.registry.world_size, last.render_cpu_s)):
            return dataclasses.replace(last, reused=True)
        snap = take_snapshot(c.view(), self.state)
        out = await asyncio.get_running_loop().run_in_executor(self._pool, self.render_snapshot, snap, gzip_ok)
        self.last, self._key = out, key
        return out

    @staticmethod
    def render_snapshot(snap: Snapshot, gzip_ok: bool) -> Rendered:
        t0, c0 = time.perf_counter(), time.thread_time()
        body = exposition(snap)
        plain = len(body)
        if gzip_ok:
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        return Rendered(body, gzip_ok, plain, time.perf_counter() - t0, time.thread_time() - c0, snap.now)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
