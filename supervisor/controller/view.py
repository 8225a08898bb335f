"""The job as its views show it (:class:`JobView`), and ``/status``'s rendering of it (in a
worker thread: the view is taken on the event loop, references and list copies)."""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
from typing import Any

from supervisor.protocol import PHASE_DONE, SOURCE_SDK

STATUS_ALL_RANKS = 256
"""``/status`` lists every rank of a job of at most this many ranks (as ``/metrics`` does)."""
STATUS_WORST_RANKS = 16
"""Above :data:`STATUS_ALL_RANKS`: ``/status`` lists this many stalest and this many slowest ranks
(``?offset=K&limit=N`` pages through the others)."""
STATUS_PAGE_MAX = 1024
"""Ranks in one page of ``/status?offset=K`` at most."""


@dataclasses.dataclass(frozen=True)
class JobView:
    """The job as every view shows it: ``/status`` (:func:`render_status`), ``/metrics``
    (:func:`supervisor.metrics.take_snapshot`) and ``supervisor status`` (which reads ``/status``
    or the state file). Taken on the event loop in one place (``Controller.view``: plain values,
    and references to objects the controller replaces rather than mutates, such as each rank's
    record), rendered anywhere; tests build one directly."""

    job: str
    now: float
    """The controller's clock (ages are measured against it)."""
    unix: float
    phase: str
    attempt: int
    run: int = 1
    run_started_unix: float = 0.0
    world_size: int = 0
    timeout_s: float = 5.0
    straggler_threshold: float = 1.5
    per_rank_limit: int = 256
    ranks: list[Any] = dataclasses.field(default_factory=list)
    """The registry's RankRecords (a list copy: no per-rank object is made on the event loop)."""
    stragglers: dict[int, float] = dataclasses.field(default_factory=dict)
    hang_kind: str | None = None
    hang_culprits: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    last_fault_kind: str | None = None
    last_fault_attempt: int = -1
    last_fault_unix: float = 0.0
    last_fault_culprits: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    restart_in_progress: bool = False
    restarts: dict[str, int] = dataclasses.field(default_factory=dict)
    timers: list[Any] = dataclasses.field(default_factory=list)
    """Every restart's RestartTimer of this run (the current one last)."""
    budget_s: float = 900.0
    budget_remaining_s: float = 900.0
    budget_exceeded: bool = False
    checkpoint: dict[str, Any] | None = None
    checkpoint_times: tuple[float, ...] = ()
    """When each checkpoint the controller saw published was created (the interval's evidence)."""
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    received: int = 0
    node_frames: int = 0
    """Frames from node agents' relays taken in (each carries several ranks' heartbeats)."""
    step_rate: float = 0.0
    stop_requested: bool = False
    waiting_for_capacity: dict[str, Any] | None = None
    """``since_s`` and ``detail`` while the cluster cannot place the gang."""
    waiting_for_capacity_s: float = 0.0
    nodes: dict[str, Any] = dataclasses.field(default_factory=dict)
    excluded_nodes: tuple[str, ...] = ()
    suspect_checkpoints: tuple[str, ...] = ()
    suspect_why: dict[str, str] = dataclasses.field(default_factory=dict)
    checkpoint_root: str = ""
    restored: str | None = None
    restore_refused: dict[str, str] = dataclasses.field(default_factory=dict)
    log_dir: str = ""
    restore_from: str | None = None
    findings: list[Any] = dataclasses.field(default_factory=list)
    timeouts: dict[str, Any] = dataclasses.field(default_factory=dict)
    stop_reason: str = ""
    exit_code: int | None = None
    release: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The running release (:func:`supervisor.controller.releases.summary`)."""
    goodput: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The job's goodput over its runs so far and the advised checkpoint interval
    (:func:`supervisor.reports.goodput.summary`; empty before the first event)."""


def render_status(v: JobView, *, offset: int | None = None, limit: int | None = None) -> dict[str, Any]:
    """The ``/status`` document of ``v``; safe off the event loop (it reads the ranks' records
    once). Per-rank detail is capped: every rank of a job of at most :data:`STATUS_ALL_RANKS`
    ranks; above it the :data:`STATUS_WORST_RANKS` stalest (oldest heartbeat) and the
    :data:`STATUS_WORST_RANKS` slowest (highest straggler score); with ``offset`` (and
    ``limit``, at most :data:`STATUS_PAGE_MAX`) one page of ranks in rank order. ``ranks_summary``
    says which were listed and sums up the others (phases, steps, stale ranks, stragglers)."""
    now, timeout = v.now, v.timeout_s
    recs = v.ranks
    scores = v.stragglers
    rows: dict[int, Any] = {rec.hb.rank: rec for rec in recs}
    ages = {r: now - rec.received for r, rec in rows.items()}
    phases = collections.Counter(rec.hb.phase for rec in recs)
    steps = [rec.hb.step for rec in recs]
    active = [r for r, rec in rows.items() if rec.hb.phase != PHASE_DONE]
    stale = [r for r in active if ages[r] > timeout]
    over = [r for r, score in scores.items() if score > v.straggler_threshold and r in rows]
    if offset is not None or limit is not None:
        start = max(0, offset or 0)
        count = min(STATUS_PAGE_MAX, STATUS_PAGE_MAX if limit is None else max(0, limit))
        shown = sorted(rows)[start:start + count]
        selection = "page"
    elif len(rows) <= STATUS_ALL_RANKS:
        start, count, shown, selection = 0, len(rows), sorted(rows), "all"
    else:
        stalest = heapq.nlargest(STATUS_WORST_RANKS, active, key=ages.__getitem__)
        slowest = heapq.nlargest(STATUS_WORST_RANKS, scores, key=scores.__getitem__)
        start, count, selection = 0, 0, "stalest_and_slowest"
        shown = sorted(set(stalest) | {r for r in slowest if r in rows})
    ranks = []
    for r in shown:
        rec = rows[r]
        hb = rec.hb
        age = max(0.0, now - rec.received)
        ranks.append({
            "rank": r, "node": hb.node, "step": hb.step, "phase": hb.phase,
            "phase_s": round(hb.phase_s + age, 2), "heartbeat_age_s": round(age, 2), "coll_seq": hb.coll_seq,
            "coll_inside": hb.coll_inside, "straggler_score": round(scores.get(r, 1.0), 3),
            "watchdog": hb.watchdog, "loss_ok": hb.loss_ok,
        })
    summary = {
        "heard": len(rows), "listed": len(ranks), "omitted": len(rows) - len(ranks), "selection": selection,
        "by_phase": dict(phases), "step_min": min(steps, default=0), "step_max": max(steps, default=0),
        "heartbeat_age_max_s": round(max((max(0.0, ages[r]) for r in active), default=0.0), 2),
        "stale": len(stale), "stragglers": len(over), "page_max": STATUS_PAGE_MAX,
    }
    if selection == "page":
        summary |= {"offset": start, "limit": count,
                    "next_offset": start + count if start + count < len(rows) else None}
    elif selection == "stalest_and_slowest":
        summary["worst"] = STATUS_WORST_RANKS
    budget = v.budget_s
    return {
        "job": v.job, "phase": v.phase, "attempt": v.attempt, "as_of_unix": round(v.unix, 3),
        "world_size": v.world_size, "alive_ranks": len(active) - len(stale),
        "nodes": [{"name": n, "state": st.state.value, "pid": st.pid, "exit_code": st.exit_code, "stopped": st.stopped,
                   "waiting": st.waiting, "reason": st.reason, "detail": st.detail}
                  for n, st in sorted(v.nodes.items())],
        "waiting_for_capacity": v.waiting_for_capacity,
        "excluded_nodes": list(v.excluded_nodes), "suspect_checkpoints": list(v.suspect_checkpoints),
        "suspect_why": dict(v.suspect_why), "checkpoint_root": v.checkpoint_root,
        "restored": v.restored, "restore_refused": dict(v.restore_refused),
        "run": v.run, "log_dir": v.log_dir,
        "ranks": ranks, "ranks_summary": summary, "step_rate": round(v.step_rate, 3),
        "last_checkpoint": None if not v.checkpoint else v.checkpoint | {
            "age_s": round(v.unix - v.checkpoint["created_unix"], 1)},
        "restore_from": v.restore_from,
        "restarts": [t.to_dict(now, budget) for t in v.timers],
        "findings": [f.to_dict() for f in v.findings],
        "timeouts": v.timeouts, "budget_s": budget, "budget_remaining_s": v.budget_remaining_s,
        "budget_exceeded": v.budget_exceeded, "rejected_heartbeats": v.rejected,
        "heartbeats_received": v.received, "heartbeat_node_frames": v.node_frames, "stop_reason": v.stop_reason,
        "exit_code": v.exit_code, "release": dict(v.release),
        "goodput": dict(v.goodput),
    }


def status_json(v: JobView, *, offset: int | None = None, limit: int | None = None) -> bytes:
    """:func:`render_status` encoded (what ``/status`` serves; off the event loop)."""
    return json.dumps(render_status(v, offset=offset, limit=limit)).encode()


def reported_by(registry: Any, ranks: Any, *, counts: bool = False) -> dict[str, Any]:
    """Which source filled the last heartbeats of ``ranks`` (the worker SDK, or the supervisor's
    instrumentation from torch's own records: :data:`~supervisor.protocol.SOURCE_TORCH`), for an
    event: ``{"reported_by": {"torch": [1], "sdk": [0]}}``, or counts per source with ``counts``
    (a gang's start, at any size); ``{}`` when none of them was heard."""
    by: dict[str, list[int]] = {}
    for r in ranks:
        rec = registry.ranks.get(r)
        if rec is not None:
            by.setdefault(rec.hb.source or SOURCE_SDK, []).append(r)
    if not by:
        return {}
    return {"reported_by": {k: len(v) for k, v in by.items()} if counts else by}
