"""What ``/status`` shows of the job: a snapshot taken on the event loop (references and list
copies), rendered anywhere (``/status`` renders it in a worker thread)."""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
from typing import Any

from supervisor.metrics import Snapshot
from supervisor.protocol import PHASE_DONE

STATUS_ALL_RANKS = 256
"""``/status`` lists every rank of a job of at most this many ranks (as ``/metrics`` does)."""
STATUS_WORST_RANKS = 16
"""Above :data:`STATUS_ALL_RANKS`: ``/status`` lists this many stalest and this many slowest ranks
(``?offset=K&limit=N`` pages through the others)."""
STATUS_PAGE_MAX = 1024
"""Ranks in one page of ``/status?offset=K`` at most."""


@dataclasses.dataclass
class StatusSnapshot:
    """One ``/status`` snapshot: the metrics' snapshot of the ranks and the job, and the
    status-only fields (plain values and references to objects the controller replaces)."""

    metrics: Snapshot
    extra: dict[str, Any]


def render_status(snap: StatusSnapshot, *, offset: int | None = None, limit: int | None = None) -> dict[str, Any]:
    """The ``/status`` document of ``snap``; safe off the event loop (it reads the ranks' records
    once). Per-rank detail is capped: every rank of a job of at most :data:`STATUS_ALL_RANKS`
    ranks; above it the :data:`STATUS_WORST_RANKS` stalest (oldest heartbeat) and the
    :data:`STATUS_WORST_RANKS` slowest (highest straggler score); with ``offset`` (and
    ``limit``, at most :data:`STATUS_PAGE_MAX`) one page of ranks in rank order. ``ranks_summary``
    says which were listed and sums up the others (phases, steps, stale ranks, stragglers)."""
    m, x = snap.metrics, snap.extra
    now, timeout = m.now, m.timeout_s
    recs = m.ranks
    scores = m.stragglers
    rows: dict[int, Any] = {rec.hb.rank: rec for rec in recs}
    ages = {r: now - rec.received for r, rec in rows.items()}
    phases = collections.Counter(rec.hb.phase for rec in recs)
    steps = [rec.hb.step for rec in recs]
    active = [r for r, rec in rows.items() if rec.hb.phase != PHASE_DONE]
    stale = [r for r in active if ages[r] > timeout]
    over = [r for r, score in scores.items() if score > m.straggler_threshold and r in rows]
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
    budget = m.budget_s
    return {
        "job": m.job, "phase": m.phase, "attempt": m.attempt, "as_of_unix": round(m.unix, 3),
        "world_size": m.world_size, "alive_ranks": len(active) - len(stale),
        "nodes": [{"name": n, "state": st.state.value, "pid": st.pid, "exit_code": st.exit_code, "stopped": st.stopped,
                   "waiting": st.waiting, "reason": st.reason, "detail": st.detail}
                  for n, st in sorted(x["nodes"].items())],
        "waiting_for_capacity": x.get("waiting_for_capacity"),
        "excluded_nodes": x["excluded_nodes"], "suspect_checkpoints": x["suspect_checkpoints"],
        "suspect_why": x["suspect_why"], "checkpoint_root": x["checkpoint_root"],
        "restored": x["restored"], "restore_refused": x["restore_refused"],
        "run": x["run"], "log_dir": x["log_dir"],
        "ranks": ranks, "ranks_summary": summary, "step_rate": round(m.step_rate, 3),
        "last_checkpoint": None if not m.checkpoint else m.checkpoint | {
            "age_s": round(m.unix - m.checkpoint["created_unix"], 1)},
        "restore_from": x["restore_from"],
        "restarts": [t.to_dict(now, budget) for t in x["timers"]],
        "findings": [f.to_dict() for f in x["findings"]],
        "timeouts": x["timeouts"], "budget_s": budget, "budget_remaining_s": m.budget_remaining_s,
        "budget_exceeded": m.budget_exceeded, "rejected_heartbeats": m.rejected,
        "heartbeats_received": m.received, "stop_reason": x["stop_reason"],
        "exit_code": x["exit_code"],
    }


def status_json(snap: StatusSnapshot, *, offset: int | None = None, limit: int | None = None) -> bytes:
    """:func:`render_status` encoded (what ``/status`` serves; off the event loop)."""
    return json.dumps(render_status(snap, offset=offset, limit=limit)).encode()
