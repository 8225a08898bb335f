"""Goodput: how much of a job's wall time trained, what the rest went to, and the checkpoint
interval that loses the least, from what the controller already wrote (``events.jsonl``).

Pure: events in (plain dicts, as the controller wrote them), a breakdown and advice out. The
only I/O is the PNG :func:`render_png` writes where the caller says.

**Accounting** (:func:`account`), per run and over every run of the log directory. A run's
wall time is the time a controller ran it (from ``run_started``, or a requeued run's
``requeue_resumed``, to ``job_finished``; the time a requeued job waits in the scheduler's
queue is not the job's). Badput by cause:

* ``startup``: a run's start to its first launch, and a launch not caused by a fault to the
  moment every rank took a step (the ``training`` event's ``since_launch_s``);
* ``waiting_for_capacity``: the cluster could not place the gang (``capacity_found``'s
  ``waited_s``, or the wait still open at the end);
* ``restart``: each restart's phases but its restore (``restart_complete``: detect, teardown,
  schedule, rendezvous, first step); a fault no restart recovered from (the run stopped, or a
  restart is under way) counts from the fault to the run's end (or now);
* ``restore``: the restart's restore phase;
* ``save_stall``: the time each save blocked the ranks (``save_blocked``'s ``blocked_s``, the
  slowest rank's, said once every rank's heartbeat names the save);
* ``wasted_progress``: steps recomputed after a restore (the newest step a rank had finished at
  the fault, ``completed_step``, minus the step the next launch restored, times the step time
  at the fault).

Productive time is what remains; ETTR = productive / wall.

**Advice** (:func:`advise`). The failure rate is fitted from the job's own faults (every
``fault_detected``: crashes, hangs, lost nodes, preemptions; planned stops are not faults) as
the mean time between them, M = exposure / faults, once there are :data:`MIN_FAULTS`; with
fewer, a prior (default :data:`PRIOR_MTBF_S`: Llama 3 405B's pre-training, 419 unexpected
interruptions in 54 days, one every 3.09 h; the caller may give its own) said as such. The save
cost C is the mean blocking time of a save, the restart cost R the mean restart (or a prior).
The interval that minimises the expected loss is Young's first-order tau = sqrt(2 C M) and
Daly's higher-order tau = sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C (C < 2M; M
otherwise), never below the background persist time of an asynchronous save (a save cannot
start before the previous one is on storage). Predicted ETTR is Daly's expected-time model for
exponential failures, T_wall / T_work = M e^(R/M) (e^((tau + C)/M) - 1) / tau.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

CAUSES = ("startup", "waiting_for_capacity", "restart", "restore", "save_stall", "wasted_progress")
RESTART_PHASES = ("detect", "teardown", "schedule", "rendezvous", "first_step")
"""A restart's phases counted as ``restart`` (its ``restore`` phase is a cause of its own)."""
MIN_FAULTS = 3
PRIOR_MTBF_S = 3.09 * 3600
PRIOR_SOURCE = ("prior: Llama 3 405B pre-training on 16,384 H100s, 419 unexpected interruptions in 54 days "
                "(one every 3.09 h)")
PRIOR_RESTART_S = 60.0
_STEP = re.compile(r"^step-(\d{1,19})$")


class GoodputError(ValueError):
    """Events that cannot be accounted (no run in them)."""


def _unix(event: Mapping[str, Any]) -> float | None:
    t = event.get("time")
    if not isinstance(t, str):
        return None
    try:
        return datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else None


def _step_of(name: Any) -> int | None:
    m = _STEP.match(name) if isinstance(name, str) else None
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Span:
    """A stretch of a run's timeline (unix times): training, or a cause of badput."""

    start: float
    end: float
    kind: str


@dataclass
class Breakdown:
    run: int
    """The run (0: every run of the log directory together)."""
    wall_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    restart_phases_s: dict[str, float] = field(default_factory=dict)
    wasted_steps: int = 0
    faults: int = 0
    restarts: int = 0
    saves: int = 0
    save_blocked_s: list[float] = field(default_factory=list)
    save_persist_s: list[float] = field(default_factory=list)
    """Asynchronous saves' whole times (start to storage): the interval's lower bound."""
    restart_totals_s: list[float] = field(default_factory=list)
    checkpoint_times: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    ended: str = ""
    """The run's final phase ("" while it runs)."""
    restarted: set = field(default_factory=set)
    """Attempts a fault's restart launched (their start-up is the restart's, not ``startup``)."""
    launched: bool = False
    """The run has launched a gang (or adopted one)."""
    start_unix: float | None = None
    end_unix: float | None = None
    """When the run's controller started and stopped running it (the plot's bar)."""

    @property
    def productive_s(self) -> float:
        return max(0.0, self.wall_s - sum(self.badput_s.values()))

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def checkpoint_interval_s(self) -> float | None:
        """The median interval between the checkpoints the controller saw complete."""
        t = sorted(self.checkpoint_times)
        gaps = sorted(b - a for a, b in zip(t, t[1:]) if b > a)
        return gaps[len(gaps) // 2] if gaps else None

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "wall_s": round(self.wall_s, 3), "productive_s": round(self.productive_s, 3),
                "ettr": round(self.ettr, 4), "badput_s": {k: round(v, 3) for k, v in self.badput_s.items()},
                "restart_phases_s": {k: round(v, 3) for k, v in self.restart_phases_s.items()},
                "wasted_steps": self.wasted_steps, "faults": self.faults, "restarts": self.restarts,
                "saves": self.saves, "checkpoint_interval_s": self.checkpoint_interval_s, "ended": self.ended}


KEPT = 4096
"""Per run, the newest measurements of each kind kept (save costs, restart totals, step times,
checkpoint times): the means and medians the advice takes are over them."""
SPANS_KEPT = 20_000
"""Per run, the newest timeline spans kept (the plot's)."""


def _keep(values: list, limit: int) -> None:
    if len(values) > limit:
        del values[: len(values) - limit]


def _add(total: Breakdown, run: Breakdown, *, spans: bool) -> None:
    total.wall_s += run.wall_s
    for k, v in run.badput_s.items():
        total.badput_s[k] += v
    for k, v in run.restart_phases_s.items():
        total.restart_phases_s[k] = total.restart_phases_s.get(k, 0.0) + v
    total.wasted_steps += run.wasted_steps
    total.faults += run.faults
    total.restarts += run.restarts
    total.saves += run.saves
    total.save_blocked_s += run.save_blocked_s
    total.save_persist_s += run.save_persist_s
    total.restart_totals_s += run.restart_totals_s
    total.step_times_s += run.step_times_s
    total.checkpoint_times += run.checkpoint_times
    if spans:
        total.spans += run.spans


class Accountant:
    """The accounting of :func:`account`, one event at a time: the controller feeds it each
    event as it writes it (and, at its start, those its log directory already holds), and asks
    for the breakdown at a scrape. Memory is bounded (:data:`KEPT`, :data:`SPANS_KEPT` per run)."""

    def __init__(self) -> None:
        self.runs: dict[int, Breakdown] = {}
        self.open_at: dict[int, float] = {}  # run -> since when a controller runs it (its wall clock counts)
        self.capacity_since: dict[int, float] = {}
        self.pending_fault: dict[int, dict] = {}  # run -> the last fault, until the next launch restores
        self.last_at: dict[int, float] = {}  # run -> its newest event's time
        self.down_since: dict[int, float] = {}  # run -> when a fault no restart has completed since hit it
        self.waited_down: dict[int, float] = {}  # run -> capacity waits inside that restart (counted as such)
        self.recomputed: dict[int, float] = {}  # run -> the seconds of steps the restart under way goes back over

    def _down_to(self, b: Breakdown, t: float) -> None:
        """A run ends with a fault no restart recovered from: the time since it is the restart's."""
        since = self.down_since.pop(b.run, None)
        waited = self.waited_down.pop(b.run, 0.0)
        if since is not None and t > since:
            b.badput_s["restart"] += max(0.0, t - since - waited)
            b.spans.append(Span(since, t, "restart"))

    def _close_others(self, run_no: int) -> None:
        """Another run opened: one still open before it lost its controller (killed, its node
        gone) without a word; its wall time ends at its last event."""
        for other in [r for r in self.open_at if r != run_no]:
            b = self.runs[other]
            end = self.last_at.get(other, self.open_at[other])
            b.wall_s += max(0.0, end - self.open_at.pop(other))
            b.end_unix = end
            self.capacity_since.pop(other, None)
            self._down_to(b, end)
            b.ended = b.ended or "lost"

    def feed(self, ev: Mapping[str, Any]) -> None:
        name, t, run_no = ev.get("event"), _unix(ev), ev.get("run", 1)
        if t is None or not isinstance(run_no, int) or isinstance(run_no, bool):
            return
        b = self.runs.get(run_no)
        if b is None:
            b = self.runs[run_no] = Breakdown(run_no)
        if run_no not in self.open_at and name != "job_finished" and not b.ended:
            self.open_at[run_no] = t  # the run's first event (run_started, requeue_resumed, or an older log's)
            self._close_others(run_no)
            if b.start_unix is None:
                b.start_unix = t
        self.last_at[run_no] = t
        if name == "job_finished":
            if run_no in self.open_at:
                b.wall_s += max(0.0, t - self.open_at.pop(run_no))
            b.end_unix = t
            self._down_to(b, t)
            b.ended = str(ev.get("phase", ""))
            if run_no in self.capacity_since:
                since = self.capacity_since.pop(run_no)
                b.badput_s["waiting_for_capacity"] += max(0.0, t - since)
                b.spans.append(Span(since, t, "waiting_for_capacity"))
        elif name == "requeue_resumed":
            b.ended = ""
            if run_no not in self.open_at:
                self.open_at[run_no] = t
                self._close_others(run_no)
        elif name == "training":
            s = _num(ev.get("since_launch_s"))
            if s is not None and run_no not in self.pending_fault and ev.get("attempt") not in b.restarted:
                b.badput_s["startup"] += s
                b.spans.append(Span(t - s, t, "startup"))
        elif name == "waiting_for_capacity":
            self.capacity_since.setdefault(run_no, t)
        elif name == "capacity_found":
            waited = _num(ev.get("waited_s"))
            since = self.capacity_since.pop(run_no, None)
            if waited is None and since is not None:
                waited = max(0.0, t - since)
            if waited is not None:
                b.badput_s["waiting_for_capacity"] += waited
                b.spans.append(Span(t - waited, t, "waiting_for_capacity"))
                if run_no in self.down_since:  # inside a restart: its schedule phase holds it too
                    self.waited_down[run_no] = self.waited_down.get(run_no, 0.0) + waited
        elif name == "checkpoint_complete":
            b.saves += 1
            b.checkpoint_times.append(t)
        elif name == "save_blocked":
            blocked = _num(ev.get("blocked_s"))
            if blocked is not None:
                b.save_blocked_s.append(blocked)
                b.badput_s["save_stall"] += blocked
                b.spans.append(Span(t - blocked, t, "save_stall"))
            persist = _num(ev.get("persist_s"))
            if persist is not None and persist > 0:
                b.save_persist_s.append(persist)
        elif name == "fault_detected":
            b.faults += 1
            self.down_since.setdefault(run_no, t - (_num(ev.get("detection_s")) or 0.0))
            self.pending_fault[run_no] = dict(ev)
            st = _num(ev.get("step_time_s"))
            if st is not None:
                b.step_times_s.append(st)
        elif name == "launched" and run_no not in self.pending_fault and not b.launched:
            # the run's first launch: what came before it in the run (its controller starting,
            # preflight) is start-up too
            b.launched = True
            since = self.open_at.get(run_no)
            if since is not None and t > since:
                b.badput_s["startup"] += t - since
                b.spans.append(Span(since, t, "startup"))
        elif name == "launched" and run_no in self.pending_fault:
            fault = self.pending_fault.pop(run_no)
            reached, st = fault.get("completed_step"), _num(fault.get("step_time_s"))
            restored = _step_of(ev.get("restore_from")) or 0
            if isinstance(reached, int) and not isinstance(reached, bool) and st is not None:
                steps = max(0, reached - restored)
                b.wasted_steps += steps
                b.badput_s["wasted_progress"] += steps * st
                self.recomputed[run_no] = steps * st
            b.restarted.add(ev.get("attempt"))
        elif name == "restart_complete":
            b.restarts += 1
            self.down_since.pop(run_no, None)
            waited = self.waited_down.pop(run_no, 0.0)  # a capacity wait in it is that cause's, not the restart's
            phases = ev.get("phases") if isinstance(ev.get("phases"), dict) else {}
            total = _num(ev.get("total_s"))
            restart = 0.0
            for phase, v in phases.items():
                v = _num(v)
                if v is None or not isinstance(phase, str):
                    continue
                b.restart_phases_s[phase] = b.restart_phases_s.get(phase, 0.0) + v
                if phase == "restore":
                    b.badput_s["restore"] += v
                else:
                    restart += v
            b.badput_s["restart"] += max(0.0, restart - waited)
            if total is not None:
                b.restart_totals_s.append(total)
                first, restore = _num(phases.get("first_step")) or 0.0, _num(phases.get("restore")) or 0.0
                b.spans.append(Span(t - total, t, "restart"))
                if restore:
                    b.spans.append(Span(t - first - restore, t - first, "restore"))
                if self.recomputed.get(run_no):  # what the restore went back over is trained again now
                    b.spans.append(Span(t, t + self.recomputed.pop(run_no), "wasted_progress"))
        for values in (b.save_blocked_s, b.save_persist_s, b.restart_totals_s, b.step_times_s, b.checkpoint_times):
            _keep(values, KEPT)
        _keep(b.spans, SPANS_KEPT)

    def newest_unix(self) -> float:
        """The newest event's time: where a run nobody runs any more (its controller gone
        without a word, and none after it) is accounted to."""
        return max(self.last_at.values(), default=0.0)

    def breakdowns(self, now_unix: float, *, spans: bool = True) -> tuple[list[Breakdown], Breakdown]:
        """Each run's breakdown and all of them together, a run still going accounted to
        ``now_unix`` (copies: feeding on changes none of them). :class:`GoodputError` when no
        run was fed. Without ``spans`` the timeline is left out (what a scrape needs)."""
        if not self.runs:
            raise GoodputError("no run of a job in these events (is this the job's log directory?)")
        out = []
        for run_no in sorted(self.runs):
            src = self.runs[run_no]
            b = Breakdown(run_no, ended=src.ended, restarted=set(src.restarted), start_unix=src.start_unix,
                          end_unix=src.end_unix)
            _add(b, src, spans=spans)
            since = self.open_at.get(run_no)
            if since is not None:  # still running (or its controller died): up to now
                b.wall_s += max(0.0, now_unix - since)
                b.end_unix = now_unix
                waiting = self.capacity_since.get(run_no)
                if waiting is not None:
                    b.badput_s["waiting_for_capacity"] += max(0.0, now_unix - waiting)
                down = self.down_since.get(run_no)
                if down is not None:  # a restart under way
                    b.badput_s["restart"] += max(0.0, now_unix - down - self.waited_down.get(run_no, 0.0)
                                                 - (max(0.0, now_unix - waiting) if waiting is not None else 0.0))
            out.append(b)
        total = Breakdown(0)
        for b in out:
            _add(total, b, spans=spans)
        return out, total


def account(events: Iterable[Mapping[str, Any]], *, now_unix: float) -> tuple[list[Breakdown], Breakdown]:
    """The breakdown of each run of ``events`` (in the order written) and of them all together.
    A run still going is accounted to ``now_unix``. :class:`GoodputError` when no run is in them."""
    acc = Accountant()
    for ev in events:
        acc.feed(ev)
    return acc.breakdowns(now_unix)


# ---------------------------------------------------------------------------- advice
def young(c: float, m: float) -> float:
    """Young (1974): the first-order optimal interval, sqrt(2 C M)."""
    return math.sqrt(2.0 * c * m)


def daly(c: float, m: float) -> float:
    """Daly (2006): the higher-order optimal interval (compute time between checkpoints)."""
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def predicted_ettr(tau: float, *, c: float, r: float, m: float) -> float:
    """Daly's expected-time model for exponential failures (mean ``m``): the share of wall time
    that trains with a checkpoint every ``tau`` of training costing ``c`` and a restart ``r``."""
    if tau <= 0 or m <= 0:
        return 0.0
    try:
        wall_per_work = m * math.exp(r / m) * math.expm1((tau + c) / m) / tau
    except OverflowError:
        return 0.0
    return 1.0 / wall_per_work if wall_per_work > 0 else 0.0


@dataclass(frozen=True)
class Advice:
    mtbf_s: float
    mtbf_source: str
    save_cost_s: float | None
    """C: the mean blocking time of a save (None: no save was measured)."""
    restart_cost_s: float
    restart_source: str
    persist_s: float
    step_time_s: float | None
    current_interval_s: float | None
    """The training time between two saves now: the median interval between checkpoints less a
    save's blocking time (the same measure as the advised interval)."""
    young_s: float | None = None
    daly_s: float | None = None
    advised_s: float | None = None
    ettr_now: float | None = None
    ettr_advised: float | None = None
    per_second_of_c: float | None = None
    """ETTR lost (a fraction) for each second more of save cost, at the advised interval, re-advised."""
    per_minute_of_r: float | None = None

    def steps(self, seconds: float | None) -> int | None:
        if seconds is None or not self.step_time_s:
            return None
        return max(1, round(seconds / self.step_time_s))

    def to_dict(self) -> dict[str, Any]:
        out = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}
        out["advised_steps"], out["current_steps"] = self.steps(self.advised_s), self.steps(self.current_interval_s)
        return out


def advise(b: Breakdown, *, prior_mtbf_s: float = PRIOR_MTBF_S, prior_source: str = PRIOR_SOURCE,
           prior_restart_s: float = PRIOR_RESTART_S, persist_s: float | None = None) -> Advice:
    """The checkpoint interval that loses least for the job ``b`` describes (see the module).
    ``persist_s``: the background persist time to bound it by (None: the mean the job's
    asynchronous saves took, 0 when it made none)."""
    if persist_s is None:
        persist_s = sum(b.save_persist_s) / len(b.save_persist_s) if b.save_persist_s else 0.0
    exposure = b.wall_s
    if b.faults >= MIN_FAULTS and exposure > 0:
        m, src = exposure / b.faults, f"fitted: {b.faults} faults in {exposure / 3600:.2f} h of the job's wall time"
    else:
        m, src = prior_mtbf_s, (f"{prior_source} (the job had {b.faults} fault(s), fewer than {MIN_FAULTS} to fit "
                                "its own rate)")
    c = sum(b.save_blocked_s) / len(b.save_blocked_s) if b.save_blocked_s else None
    if b.restart_totals_s:
        r, rsrc = sum(b.restart_totals_s) / len(b.restart_totals_s), f"measured: {len(b.restart_totals_s)} restart(s)"
    else:
        r, rsrc = prior_restart_s, "prior (no restart measured yet)"
    st = sorted(b.step_times_s)
    step = st[len(st) // 2] if st else None
    now = b.checkpoint_interval_s
    if now is not None and c is not None:
        now = max(now - c, 1e-3)  # the training between two saves (what tau is), not the wall between them
    adv = Advice(m, src, c, r, rsrc, persist_s, step, now)
    if c is None:
        return adv
    y, d = young(c, m), daly(c, m)
    best = max(d, persist_s)

    def ettr_best(c_: float, r_: float) -> float:
        return predicted_ettr(max(daly(c_, m), persist_s), c=c_, r=r_, m=m)

    base = ettr_best(c, r)
    return Advice(m, src, c, r, rsrc, persist_s, step, now, y, d, best,
                  predicted_ettr(now, c=c, r=r, m=m) if now else None, predicted_ettr(best, c=c, r=r, m=m),
                  base - ettr_best(c + 1.0, r), base - ettr_best(c, r + 60.0))


def summary(total: Breakdown, advice: Advice) -> dict[str, Any]:
    """The job's goodput so far as ``/status``, ``/metrics`` and ``supervisor status`` show it
    (plain values; times in seconds)."""
    a = advice

    def r(v: float | None, nd: int = 3) -> float | None:
        return None if v is None else round(v, nd)

    return {"wall_s": r(total.wall_s), "productive_s": r(total.productive_s), "ettr": r(total.ettr, 4),
            "badput_s": {k: r(v) for k, v in total.badput_s.items()}, "wasted_steps": total.wasted_steps,
            "faults": total.faults, "mtbf_s": r(a.mtbf_s, 1), "mtbf_source": a.mtbf_source,
            "save_cost_s": r(a.save_cost_s), "restart_cost_s": r(a.restart_cost_s), "persist_s": r(a.persist_s),
            "current_interval_s": r(a.current_interval_s), "current_steps": a.steps(a.current_interval_s),
            "advised_interval_s": r(a.advised_s), "advised_steps": a.steps(a.advised_s),
            "young_s": r(a.young_s), "daly_s": r(a.daly_s),
            "ettr_predicted_now": r(a.ettr_now, 4), "ettr_predicted_advised": r(a.ettr_advised, 4)}


# ---------------------------------------------------------------------------- how it is shown
def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def render_table(runs: Sequence[Breakdown], total: Breakdown, advice: Advice, *,
                 until: str = "still running (or its controller died without a word): counted to now") -> str:
    head = ["", "wall", "productive", "ETTR", *CAUSES]
    rows = [[(f"run {b.run}" + ("" if b.ended else "*")) if b.run else "all runs", _dur(b.wall_s),
             _dur(b.productive_s), f"{100 * b.ettr:.1f}%", *(_dur(b.badput_s[k]) for k in CAUSES)]
            for b in [*runs, total]]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    t = total
    if any(not b.ended for b in runs):
        lines.append(f"* {until}")
    lines += ["", f"faults {t.faults}, restarts {t.restarts}, saves {t.saves}, steps recomputed after restores "
                  f"{t.wasted_steps}", ""]
    a = advice
    lines.append(f"mean time between faults: {_dur(a.mtbf_s)}: {a.mtbf_source}")
    lines.append(f"restart cost R: {_dur(a.restart_cost_s)}: {a.restart_source}")
    if a.save_cost_s is None:
        lines.append("save cost C: not measured (no save's blocking time was reported): no interval advised")
        return "\n".join(lines)
    lines.append(f"save cost C (blocking part): {_dur(a.save_cost_s)}" +
                 (f"; background persist time {_dur(a.persist_s)} (a lower bound on the interval)" if a.persist_s else ""))

    def at(s: float | None) -> str:
        n = a.steps(s)
        return _dur(s) + (f" ({n} steps)" if n else "")

    lines.append(f"checkpoint interval now (training between saves): {at(a.current_interval_s)}"
                 + (f", predicted ETTR {100 * a.ettr_now:.2f}%" if a.ettr_now is not None else ""))
    lines.append(f"advised interval: {at(a.advised_s)} (Daly; Young's first-order {_dur(a.young_s)}), predicted ETTR "
                 f"{100 * a.ettr_advised:.2f}%")
    lines.append(f"one more second of C costs {100 * a.per_second_of_c:.3f} points of ETTR; one more minute of R "
                 f"costs {100 * a.per_minute_of_r:.3f} points")
    return "\n".join(lines)


COLORS = {"training": "#4caf50", "startup": "#9e9e9e", "waiting_for_capacity": "#ffb300", "restart": "#e53935",
          "restore": "#8e24aa", "save_stall": "#1e88e5", "wasted_progress": "#a5d6a7"}
LABELS = {"training": "training", "startup": "start-up", "waiting_for_capacity": "waiting for capacity",
          "restart": "restart", "restore": "restore", "save_stall": "save stall",
          "wasted_progress": "steps trained again"}
_DRAWN = ("startup", "waiting_for_capacity", "restart", "restore", "wasted_progress", "save_stall")  # bottom to top


def render_png(runs: Sequence[Breakdown], path: str | Path, *, title: str = "") -> None:
    """A timeline of each run: training, start-up, capacity waits, restarts (their restore
    phase), the steps trained again after a restore, and saves' stalls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = [s for b in runs for s in b.spans]
    t0 = min([s.start for s in spans] + [b.start_unix for b in runs if b.start_unix is not None], default=0.0)
    t1 = max([s.end for s in spans] + [b.end_unix for b in runs if b.end_unix is not None], default=t0 + 1.0)
    length = t1 - t0
    unit, scale = ("hours", 3600.0) if length > 3 * 3600 else ("minutes", 60.0) if length > 300 else ("seconds", 1.0)
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.55 * len(runs)))
    for i, b in enumerate(runs):
        mine = sorted(b.spans, key=lambda s: s.start)
        if mine or b.start_unix is not None:
            lo = b.start_unix if b.start_unix is not None else mine[0].start
            hi = b.end_unix if b.end_unix is not None else max(s.end for s in mine)
            ax.broken_barh([((lo - t0) / scale, (hi - lo) / scale)], (i - 0.3, 0.6), color=COLORS["training"])
        for kind in _DRAWN:
            bars = [((s.start - t0) / scale, max((s.end - s.start) / scale, length / scale / 800))
                    for s in mine if s.kind == kind]
            if bars:
                ax.broken_barh(bars, (i - 0.3, 0.6), color=COLORS[kind])
    ax.set_yticks(range(len(runs)), [f"run {b.run}: ETTR {100 * b.ettr:.0f}%" for b in runs])
    ax.set_ylim(-0.6, len(runs) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel(f"{unit} since the first run started")
    ax.set_title(title or "where the wall time went")
    kinds = ("training", *_DRAWN)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    fig.legend(handles, [LABELS[k] for k in kinds], loc="lower center", ncol=len(kinds), frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.12 if len(runs) < 3 else 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
