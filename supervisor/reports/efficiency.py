"""Scaling efficiency: a parametric all-reduce model, and the report of measured runs.

Two halves, both pure (no subprocess, no global state; the only I/O is reading timing logs
the caller names and writing the PNG the caller asks for):

**The model** (:func:`scaling_model`). Data-parallel training at a fixed per-worker batch
(weak scaling): every worker does the same local work, then the gradients are all-reduced
with a ring, and the step waits for the slowest worker. One step on ``W`` workers takes::

    t(W) = compute_ms + overhead_ms                                   local work
         + 2 (W-1)/W * grad_mb * 1e6 B / (bandwidth_gb_s * 1e9 B/s)   ring all-reduce, bandwidth
         + 2 (W-1) * hop_latency_us / 1000                            ring all-reduce, latency
         + straggler_ms * log2(W)                                     wait for the slowest worker

    speedup(W)    = W * t(1) / t(W)     (W workers process W times the samples per step)
    efficiency(W) = t(1) / t(W)         (= speedup / W)

A ring all-reduce runs ``2 (W-1)`` steps (reduce-scatter, then all-gather), each moving
``1/W`` of the buffer to the next neighbour and paying one hop latency. ``grad_mb`` is the
part of the gradient whose reduction is *exposed* after the backward pass (DDP overlaps the
other buckets with backward), so it is small next to the model size. The straggler term is
the expected maximum of ``W`` per-worker jitters, which grows with ``log W`` for light-tailed
noise. Both all-reduce terms are zero at ``W = 1``.

The defaults reproduce the seed's table exactly at its displayed precision (step time to
0.1 ms, speedup to 0.1x); no modelled step time is more than 0.025 ms off the seed's:

=======  ==============  =======
workers  step time (ms)  speedup
=======  ==============  =======
1        120.3           1.0x
2        125.7           1.9x
4        131.4           3.7x
8        137.8           7.0x
16       145.6           13.2x
=======  ==============  =======

The defaults were chosen as round numbers (1 MB exposed at 25 GB/s, 175 us per ring hop, a
5 ms straggler penalty per doubling, 0.3 ms fixed overhead) that fit; a least-squares fit of
the three scaling terms to the seed's four multi-worker rows gives 0.093 ms of bandwidth
term, 178 us per hop and 4.95 ms per doubling, with residuals under 0.004 ms, so the form
itself fits the seed and rounding the parameters costs at most 0.025 ms. 175 us per hop is
TCP/Ethernet-class latency (NCCL on NVLink or InfiniBand is a few us); feed your own numbers.

**The fit** (:func:`fit_scaling_model`). ``t(W)`` is linear in ``compute_ms``, in the
full-buffer transfer time ``grad_mb / bandwidth_gb_s``, in ``hop_latency_us`` and in
``straggler_ms``, so fitting them to measured step times is a linear least-squares problem
with the constraint that none is negative (solved exactly: the best non-negative solution is
the unconstrained solution on one subset of the free parameters, and there are at most 16).
The parameters left out of ``free`` are held at the values given (the defaults otherwise).
Each free parameter needs a worker count that tells it apart: at ``W = 1`` every scaling
term is zero, and at ``W = 2`` alone the three are all one constant (``grad_mb /
bandwidth``, ``2 hop``, ``straggler``), so with measurements at 1 and 2 workers only one
scaling term can be fitted; :func:`fit_scaling_model` refuses a free set the worker counts
cannot separate instead of returning an arbitrary split.

**The report** (:func:`summarize_run`, :func:`efficiency_table`, :func:`render_markdown`,
:func:`render_png`) of real runs of ``examples/train.py``, whose every rank writes one JSON
line per step to ``rank-R.jsonl`` (``step``, ``world_size``, ``attempt``, ``data_s``,
``compute_s``, ``collective_s``, ``time`` = wall clock after the step, ...):

* the first ``warmup`` steps are skipped (process-group set-up, allocator and autograd
  warm-up); the last skipped step's ``time`` starts the clock (with ``warmup = 0``, the first
  step's, which is then not timed either);
* throughput = ``global_batch * timed_steps / wall``, ``wall`` measured on rank 0 from the
  end of the last warm-up step to the end of the last step (rank 0 cannot finish a step
  before the slowest rank has joined its collectives, so this is the job's throughput). The
  median step time (median difference of consecutive ``time`` fields) is reported beside it;
* efficiency of ``W`` workers = ``throughput_W / (W * throughput_1)``; with no ``W = 1`` run
  the smallest ``W`` is the baseline: ``throughput_W * B / (W * throughput_B)``;
* the data / compute / collective split is the median of each field over the timed steps,
  per rank, beside that rank's median step time (differences of its own ``time`` field).
  The fields are the job's own timers and are reported as logged, not reinterpreted: a
  collective the job launches during ``backward()`` (DDP's gradient buckets) can be counted
  in ``collective_s`` while ``compute_s`` is still running, so the three need not add up to
  the step time, and ``collective_s`` includes any wait for the slowest rank.

Runs are compared at one global batch (strong scaling: ``W`` ranks share it) or at one
per-rank batch (weak scaling: the global batch grows with ``W``, the model's regime); the
efficiency formula is the same and, in weak scaling, equals ``t(1) / t(W)`` of the mean step
times, as in the model.

Two more numbers per run split the mean step the way the model does: ``local_ms``, the
mean over the timed steps of the ranks' mean ``data_s + compute_s`` (the model's local
term), and ``skew_ms``, the mean over the timed steps of how far the slowest rank's
``data_s + compute_s`` lies above that mean: the time the other ranks wait for it, the
measured counterpart of the straggler term (``straggler_ms * log2 W``). What is left of the
mean step is communication and bookkeeping, the counterpart of the ring all-reduce.

A log with more than one ``attempt`` (a restarted job re-logs steps) is rejected: a restart
makes wall-clock throughput meaningless. With several runs (rounds) per worker count the
run with the median throughput represents it, so its split and its throughput agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from supervisor.protocol import ranklog

__all__ = [
    "SEED_TABLE",
    "ScalingPoint",
    "RankSplit",
    "RunStats",
    "EfficiencyRow",
    "ScalingFit",
    "FIT_PARAMETERS",
    "ring_allreduce_ms",
    "scaling_model",
    "fit_scaling_model",
    "model_table_markdown",
    "parse_timing_lines",
    "read_timing_logs",
    "summarize_run",
    "efficiency_table",
    "render_markdown",
    "time_shared_ms",
    "straggler_from_skew",
    "fit_table_markdown",
    "render_png",
]

#: The seed's table: workers -> (step time in ms, speedup), as displayed there.
SEED_TABLE: Mapping[int, tuple[float, float]] = {
    1: (120.3, 1.0), 2: (125.7, 1.9), 4: (131.4, 3.7), 8: (137.8, 7.0), 16: (145.6, 13.2),
}

_SPLIT_FIELDS = ("data_s", "compute_s", "collective_s")


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScalingPoint:
    """One row of :func:`scaling_model` (times in ms)."""

    workers: int
    step_ms: float
    local_ms: float  # compute_ms + overhead_ms
    allreduce_ms: float  # ring all-reduce: bandwidth + latency terms
    straggler_ms: float
    speedup: float  # W * t(1) / t(W)
    efficiency: float  # t(1) / t(W)


def _check_number(name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def _check_workers(workers: object) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"worker counts must be integers >= 1, got {workers!r}")
    return workers


def ring_allreduce_ms(workers: int, *, grad_mb: float, bandwidth_gb_s: float, hop_latency_us: float) -> float:
    """Time of one ring all-reduce of ``grad_mb`` MB (1e6 bytes) over ``workers`` ranks, in ms.

    ``2 (W-1)/W * bytes / bandwidth + 2 (W-1) * hop latency``; zero for one worker.
    """
    w = _check_workers(workers)
    mb = _check_number("grad_mb", grad_mb)
    bw = math.inf if bandwidth_gb_s == math.inf else _check_number("bandwidth_gb_s", bandwidth_gb_s, positive=True)
    lat = _check_number("hop_latency_us", hop_latency_us)
    bandwidth_ms = 2 * (w - 1) / w * (mb * 1e6) / (bw * 1e9) * 1e3  # 0 at infinite bandwidth
    latency_ms = 2 * (w - 1) * lat / 1e3
    return bandwidth_ms + latency_ms


def scaling_model(
    workers: Iterable[int] = (1, 2, 4, 8, 16),
    *,
    compute_ms: float = 120.0,
    overhead_ms: float = 0.3,
    grad_mb: float = 1.0,
    bandwidth_gb_s: float = 25.0,
    hop_latency_us: float = 175.0,
    straggler_ms: float = 5.0,
) -> list[ScalingPoint]:
    """Modelled step time, speedup and efficiency at each worker count (see the module doc).

    ``compute_ms``: local forward + backward + optimizer time of one worker (> 0).
    ``overhead_ms``: fixed per-step cost (data loading, launch, bookkeeping; >= 0).
    ``grad_mb``: MB (1e6 bytes) of gradient whose all-reduce is not hidden behind backward.
    ``bandwidth_gb_s``: per-link bandwidth in GB/s (1e9 bytes/s; > 0; ``math.inf``: no
    bandwidth term).
    ``hop_latency_us``: cost of one ring step, in us (latency + launch + synchronisation).
    ``straggler_ms``: extra wait for the slowest worker per doubling of the worker count.

    Rows come in the order given; speedup and efficiency are relative to the modelled
    ``t(1)`` whether or not 1 is among ``workers``. Raises ``ValueError`` on a bad input.
    """
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Iterable):
        raise ValueError(f"workers must be an iterable of integers >= 1, got {workers!r}")
    ws = [_check_workers(w) for w in workers]
    if not ws:
        raise ValueError("workers must name at least one worker count")
    if len(set(ws)) != len(ws):
        raise ValueError(f"duplicate worker counts in {ws}")
    local = _check_number("compute_ms", compute_ms, positive=True) + _check_number("overhead_ms", overhead_ms)
    strag = _check_number("straggler_ms", straggler_ms)
    t1 = local  # both all-reduce terms and log2(1) vanish at one worker
    points = []
    for w in ws:
        ar = ring_allreduce_ms(w, grad_mb=grad_mb, bandwidth_gb_s=bandwidth_gb_s, hop_latency_us=hop_latency_us)
        st = strag * math.log2(w)
        t = local + ar + st
        points.append(ScalingPoint(workers=w, step_ms=t, local_ms=local, allreduce_ms=ar, straggler_ms=st,
                                   speedup=w * t1 / t, efficiency=t1 / t))
    return points


#: What :func:`fit_scaling_model` can fit, in the order of the model's terms.
FIT_PARAMETERS = ("compute_ms", "bandwidth_gb_s", "hop_latency_us", "straggler_ms")

_MODEL_DEFAULTS = {"compute_ms": 120.0, "overhead_ms": 0.3, "grad_mb": 1.0, "bandwidth_gb_s": 25.0,
                   "hop_latency_us": 175.0, "straggler_ms": 5.0}


@dataclass(frozen=True)
class ScalingFit:
    """The result of :func:`fit_scaling_model`: every model parameter, and how well they fit."""

    params: Mapping[str, float]  # every keyword of scaling_model, fitted or held
    free: tuple[str, ...]  # which of them were fitted
    workers: tuple[int, ...]  # the measured worker counts, ascending
    measured_ms: tuple[float, ...]  # the step times fitted, in that order
    residual_ms: tuple[float, ...]  # measured - modelled, in that order

    @property
    def rms_ms(self) -> float:
        return math.sqrt(sum(r * r for r in self.residual_ms) / len(self.residual_ms))

    def model(self, workers: Iterable[int] | None = None) -> list[ScalingPoint]:
        """:func:`scaling_model` with the fitted parameters (at the measured worker counts by default)."""
        return scaling_model(self.workers if workers is None else workers, **self.params)


def _scaling_columns(w: int) -> dict[str, float]:
    """Each fittable parameter's coefficient in t(W), per unit of its linear form (ms)."""
    return {"compute_ms": 1.0, "bandwidth_gb_s": 2 * (w - 1) / w, "hop_latency_us": 2 * (w - 1),
            "straggler_ms": math.log2(w)}


def fit_scaling_model(
    step_ms: Mapping[int, float],
    *,
    free: Sequence[str] = ("compute_ms", "hop_latency_us", "straggler_ms"),
    **fixed: float,
) -> ScalingFit:
    """Fit the ``free`` parameters of :func:`scaling_model` to measured step times.

    ``step_ms`` maps worker counts to measured step times in ms (weak scaling: the same
    per-worker batch at every count). ``free`` names parameters from
    :data:`FIT_PARAMETERS`; every other :func:`scaling_model` keyword is held at the value
    passed in ``fixed`` (its default otherwise). ``overhead_ms`` and ``grad_mb`` are never
    fitted: the step times cannot tell ``overhead_ms`` from ``compute_ms``, nor ``grad_mb``
    from ``bandwidth_gb_s`` (only their ratio enters), so fitting ``bandwidth_gb_s`` reads it
    against the ``grad_mb`` given.

    Least squares with no parameter negative (see the module doc); a bandwidth term that
    fits to zero comes back as ``bandwidth_gb_s = math.inf``. Raises ``ValueError`` for bad
    input, for fewer worker counts than free parameters, for a free set the worker counts
    cannot tell apart (e.g. two scaling terms from ``W = 1, 2`` only), and for a fitted
    ``compute_ms`` that is not positive.
    """
    if not isinstance(step_ms, Mapping) or not step_ms:
        raise ValueError(f"step_ms must map worker counts to step times in ms, got {step_ms!r}")
    ws = sorted(_check_workers(w) for w in step_ms)
    t = [_check_number(f"step_ms[{w}]", step_ms[w], positive=True) for w in ws]
    if isinstance(free, str):
        free = (free,)
    free = tuple(free)
    unknown = [f for f in free if f not in FIT_PARAMETERS]
    if unknown or not free or len(set(free)) != len(free):
        raise ValueError(f"free must name distinct parameters from {FIT_PARAMETERS}, got {free!r}")
    bad = [k for k in fixed if k not in _MODEL_DEFAULTS or k in free]
    if bad:
        raise ValueError(f"cannot hold {bad}: fixed takes the scaling_model keywords not in free")
    params = dict(_MODEL_DEFAULTS) | {k: float(v) for k, v in fixed.items()}
    if "bandwidth_gb_s" in free and params["grad_mb"] <= 0:
        raise ValueError("fitting bandwidth_gb_s needs grad_mb > 0 (only grad_mb / bandwidth_gb_s enters t(W))")
    if len(ws) < len(free):
        raise ValueError(f"{len(ws)} worker count(s) {ws} cannot fit {len(free)} parameters {list(free)}")
    # The held parameters' part of t(W), then the free columns in linear form.
    scaling_model(ws, **params)  # validates the held values
    held = {k: params[k] for k in FIT_PARAMETERS if k not in free}
    linear_held = {"compute_ms": held.get("compute_ms", 0.0),
                   "bandwidth_gb_s": (params["grad_mb"] / held["bandwidth_gb_s"]) if "bandwidth_gb_s" in held else 0.0,
                   "hop_latency_us": held.get("hop_latency_us", 0.0) / 1e3,
                   "straggler_ms": held.get("straggler_ms", 0.0)}
    cols = [_scaling_columns(w) for w in ws]
    target = np.array([tw - params["overhead_ms"] - sum(c[k] * linear_held[k] for k in held)
                       for tw, c in zip(t, cols)])
    a = np.array([[c[k] for k in free] for c in cols])
    if np.linalg.matrix_rank(a) < len(free):
        raise ValueError(f"worker counts {ws} cannot tell {list(free)} apart: their terms are proportional "
                         "there; hold all but one scaling term, or measure more worker counts")
    # Exact non-negative least squares: the best of the unconstrained fits on every subset
    # whose coefficients come out non-negative (compute_ms may take any sign here; checked below).
    best: tuple[float, np.ndarray] | None = None
    n = len(free)
    for mask in range(1 << n):  # mask 0: every free scaling term at zero
        idx = [i for i in range(n) if mask >> i & 1]
        if "compute_ms" in free and free.index("compute_ms") not in idx:
            continue
        x = np.zeros(n)
        if idx:
            x[idx] = np.linalg.lstsq(a[:, idx], target, rcond=None)[0]
        if any(x[i] < 0 for i in idx if free[i] != "compute_ms"):
            continue
        sse = float(np.sum((a @ x - target) ** 2))
        if best is None or sse < best[0] * (1 - 1e-12) - 1e-18:
            best = (sse, x)
    assert best is not None  # the subset of compute_ms alone (or of nothing) is always feasible
    x = best[1]
    for name, v in zip(free, x.tolist()):
        if name == "compute_ms":
            if v <= 0:
                raise ValueError(f"compute_ms fits to {v:.3g} ms: the held parameters explain more than "
                                 "the measured step times")
            params[name] = v
        elif name == "bandwidth_gb_s":
            params[name] = params["grad_mb"] / v if v > 0 else math.inf
        elif name == "hop_latency_us":
            params[name] = v * 1e3
        else:
            params[name] = v
    modelled = [p.step_ms for p in scaling_model(ws, **params)]
    return ScalingFit(params=params, free=free, workers=tuple(ws), measured_ms=tuple(t),
                      residual_ms=tuple(m - p for m, p in zip(t, modelled)))


def model_table_markdown(points: Sequence[ScalingPoint]) -> str:
    """A markdown table of :func:`scaling_model` rows (ms to 0.1, speedup to 0.1x)."""
    lines = [
        "| workers | step time (ms) | local (ms) | ring all-reduce (ms) | straggler (ms) | speedup | efficiency |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(f"| {p.workers} | {p.step_ms:.1f} | {p.local_ms:.1f} | {p.allreduce_ms:.2f} | "
                     f"{p.straggler_ms:.1f} | {p.speedup:.1f}x | {p.efficiency:.1%} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# Measured runs
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankSplit:
    """Medians over the timed steps of one rank, in ms."""

    rank: int
    data_ms: float
    compute_ms: float
    collective_ms: float
    step_ms: float  # median difference of this rank's consecutive 'time' fields


@dataclass(frozen=True)
class RunStats:
    """One run (one worker count, one launch) after the warm-up steps are dropped."""

    workers: int
    global_batch: int
    warmup: int
    timed_steps: int
    wall_s: float  # rank 0, end of the last warm-up step to end of the last step
    throughput: float  # samples/s = global_batch * timed_steps / wall_s
    median_step_ms: float  # median of rank 0's consecutive 'time' differences
    ranks: tuple[RankSplit, ...]
    local_ms: float = 0.0  # mean over timed steps of the ranks' mean data + compute
    skew_ms: float = 0.0  # mean over timed steps of the slowest rank's data + compute minus that mean

    @property
    def mean_step_ms(self) -> float:
        """Wall time per timed step (the step time the throughput implies), in ms."""
        return self.wall_s / self.timed_steps * 1e3

    @property
    def median_throughput(self) -> float:
        """Samples/s implied by the median step time."""
        return self.global_batch / (self.median_step_ms / 1e3)

    def mean_split_ms(self) -> tuple[float, float, float]:
        """(data, compute, collective) ms: the mean over ranks of the per-rank medians."""
        n = len(self.ranks)
        return (sum(r.data_ms for r in self.ranks) / n, sum(r.compute_ms for r in self.ranks) / n,
                sum(r.collective_ms for r in self.ranks) / n)


@dataclass(frozen=True)
class EfficiencyRow:
    """One worker count in the report: its representative run and its ratios to the baseline."""

    run: RunStats
    baseline_workers: int
    speedup: float  # throughput_W / throughput_B
    efficiency: float  # throughput_W * B / (W * throughput_B)
    round_throughputs: tuple[float, ...]  # every round's throughput, sorted

    @property
    def workers(self) -> int:
        return self.run.workers


def parse_timing_lines(lines: Iterable[str], *, source: str = "<log>") -> list[dict]:
    """JSON records of a ``rank-R.jsonl`` log; blank lines are skipped, bad JSON is a ValueError."""
    return ranklog.parse_records(lines, source=source, strict=True)


def read_timing_logs(log_dir: str | Path) -> dict[int, list[dict]]:
    """Every ``rank-R.jsonl`` under ``log_dir``, as ``{rank: records}``."""
    logs = ranklog.read_logs(log_dir, strict=True)
    if not logs:
        raise ValueError(f"no rank-R.jsonl timing logs in {log_dir}")
    return logs


def _field(rec: Mapping, key: str, where: str) -> float:
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where}: field {key!r} missing or not a finite number: {v!r}")
    return float(v)


def summarize_run(logs: Mapping[int, Sequence[Mapping]], *, global_batch: int, warmup: int = 5) -> RunStats:
    """Throughput, median step time and per-rank split of one run (see the module doc).

    ``logs`` maps each rank to its records (as :func:`read_timing_logs` returns). Every rank
    0..W-1 of ``world_size`` W must be present, with one attempt, steps strictly consecutive,
    and the same steps on every rank. The end of step ``warmup`` starts the clock and the
    steps after it are timed, so at least ``warmup + 1`` steps are needed; with
    ``warmup = 0`` the end of the first step starts the clock (it is not timed either, so
    ``warmup`` 0 and 1 time the same steps).
    """
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be an integer >= 1, got {global_batch!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if not logs:
        raise ValueError("no timing logs")
    ranks = sorted(logs)
    worlds = {int(_field(r, "world_size", f"rank {rank}")) for rank in ranks for r in logs[rank]}
    if len(worlds) != 1:
        raise ValueError(f"records disagree on world_size: {sorted(worlds)}" if worlds else "the logs are empty")
    world = worlds.pop()
    if ranks != list(range(world)):
        raise ValueError(f"world_size is {world} but the logs are of ranks {ranks}")
    attempts = {r.get("attempt", 0) for rank in ranks for r in logs[rank]}
    if len(attempts) > 1:
        raise ValueError(f"the logs hold several attempts {sorted(attempts)}: a restarted run has no "
                         "meaningful wall-clock throughput")
    steps_by_rank = {}
    for rank in ranks:
        recs = sorted(logs[rank], key=lambda r: _field(r, "step", f"rank {rank}"))
        steps = [int(_field(r, "step", f"rank {rank}")) for r in recs]
        if any(b != a + 1 for a, b in zip(steps, steps[1:])):
            raise ValueError(f"rank {rank}: steps are not consecutive (duplicates or gaps) between "
                             f"{steps[0]} and {steps[-1]}")
        steps_by_rank[rank] = recs
    if len({tuple(int(r["step"]) for r in recs) for recs in steps_by_rank.values()}) != 1:
        raise ValueError("the ranks logged different steps")
    recs0 = steps_by_rank[0]
    need = max(warmup, 1) + 1
    if len(recs0) < need:
        raise ValueError(f"{len(recs0)} steps logged with warmup={warmup}: need at least {need} "
                         "(a clock start and one timed step after the warm-up)")
    start = max(warmup - 1, 0)  # index of the record whose 'time' starts the clock
    timed0 = recs0[start + 1:]
    times = [_field(r, "time", "rank 0") for r in recs0[start:]]
    wall = times[-1] - times[0]
    if wall <= 0:
        raise ValueError(f"rank 0's 'time' does not advance over the timed steps (wall = {wall} s)")
    diffs = [b - a for a, b in zip(times, times[1:])]
    median_step_s = statistics.median(diffs)
    if median_step_s <= 0:
        raise ValueError("rank 0's median step time is not positive")
    splits = []
    for rank in ranks:
        where = f"rank {rank}"
        clock = [_field(r, "time", where) for r in steps_by_rank[rank][start:]]
        timed = steps_by_rank[rank][start + 1:]
        med = [statistics.median(_field(r, k, where) for r in timed) * 1e3 for k in _SPLIT_FIELDS]
        step_ms = statistics.median(b - a for a, b in zip(clock, clock[1:])) * 1e3
        splits.append(RankSplit(rank=rank, data_ms=med[0], compute_ms=med[1], collective_ms=med[2], step_ms=step_ms))
    # Per timed step, each rank's local work (data + exposed compute): its mean over the ranks,
    # and how far the slowest rank is above that mean (what the others wait for).
    local = [[(_field(steps_by_rank[rank][i], "data_s", f"rank {rank}") +
               _field(steps_by_rank[rank][i], "compute_s", f"rank {rank}")) * 1e3 for rank in ranks]
             for i in range(start + 1, len(recs0))]
    return RunStats(workers=world, global_batch=global_batch, warmup=warmup, timed_steps=len(timed0),
                    wall_s=wall, throughput=global_batch * len(timed0) / wall,
                    median_step_ms=median_step_s * 1e3, ranks=tuple(splits),
                    local_ms=statistics.fmean(statistics.fmean(v) for v in local),
                    skew_ms=statistics.fmean(max(v) - statistics.fmean(v) for v in local))


def efficiency_table(runs: Iterable[RunStats]) -> list[EfficiencyRow]:
    """One row per worker count, ascending, relative to the smallest worker count (normally 1).

    Several runs of one worker count are rounds: the run with the median throughput (the
    lower middle one for an even count) represents it, and every round's throughput is kept.
    All runs must share one global batch (strong scaling) or one per-rank batch, the global
    batch divided by the worker count (weak scaling).
    """
    by_w: dict[int, list[RunStats]] = {}
    for r in runs:
        by_w.setdefault(r.workers, []).append(r)
    if not by_w:
        raise ValueError("no runs to report")
    batches = {r.global_batch for rs in by_w.values() for r in rs}
    per_rank = {(r.global_batch / r.workers) for rs in by_w.values() for r in rs}
    if len(batches) != 1 and len(per_rank) != 1:
        raise ValueError("runs must share one global batch (strong scaling) or one per-rank batch (weak "
                         f"scaling); got global batch sizes {sorted(batches)} at workers {sorted(by_w)}")
    rep = {}
    for w, rs in by_w.items():
        ordered = sorted(rs, key=lambda r: r.throughput)
        rep[w] = (ordered[(len(ordered) - 1) // 2], tuple(r.throughput for r in ordered))
    base_w = min(rep)
    base = rep[base_w][0].throughput
    rows = []
    for w in sorted(rep):
        run, all_thr = rep[w]
        rows.append(EfficiencyRow(run=run, baseline_workers=base_w, speedup=run.throughput / base,
                                  efficiency=run.throughput * base_w / (w * base), round_throughputs=all_thr))
    return rows


def render_markdown(rows: Sequence[EfficiencyRow], *, cores: int | None = None) -> str:
    """Two markdown tables: efficiency per worker count, then each rank's step split.

    With ``cores``, a worker count above it is marked oversubscribed in the first table.
    """
    if not rows:
        raise ValueError("no rows to render")
    b = rows[0].baseline_workers
    eff_head = "efficiency" if b == 1 else f"efficiency vs W={b}"
    lines = [
        f"| workers | timed steps | wall (s) | samples/s | rounds (samples/s) | median step (ms) | "
        f"speedup vs W={b} | {eff_head} | data (ms) | compute (ms) | collective (ms) |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row.run
        d, c, k = r.mean_split_ms()
        rounds = ", ".join(f"{t:,.0f}" for t in row.round_throughputs)
        label = f"{r.workers} (oversubscribed)" if cores is not None and r.workers > cores else str(r.workers)
        lines.append(f"| {label} | {r.timed_steps} | {r.wall_s:.3f} | {r.throughput:,.0f} | {rounds} | "
                     f"{r.median_step_ms:.2f} | {row.speedup:.2f}x | {row.efficiency:.1%} | "
                     f"{d:.2f} | {c:.2f} | {k:.2f} |")
    lines += [
        "",
        "| workers | rank | data (ms) | compute (ms) | collective (ms) | step (ms) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for s in row.run.ranks:
            lines.append(f"| {row.workers} | {s.rank} | {s.data_ms:.2f} | {s.compute_ms:.2f} | "
                         f"{s.collective_ms:.2f} | {s.step_ms:.2f} |")
    return "\n".join(lines) + "\n"


def time_shared_ms(point: ScalingPoint, cores: int) -> float:
    """A modelled step when ``point.workers`` ranks share ``cores`` cores: the local term
    stretched by ``W / cores`` (the ranks take turns), the communication terms unchanged."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
    return point.local_ms * max(1.0, point.workers / cores) + point.allreduce_ms + point.straggler_ms


def straggler_from_skew(skew_ms: Mapping[int, float]) -> float:
    """The straggler term that best matches measured skews: ``skew_W ~ straggler_ms * log2 W``.

    ``skew_ms`` maps worker counts to :attr:`RunStats.skew_ms`; ``W = 1`` carries no
    information (log2 1 = 0) and is ignored. Least squares through the origin; at least one
    ``W > 1`` is needed. Raises ``ValueError`` otherwise.
    """
    pts = {_check_workers(w): _check_number(f"skew_ms[{w}]", v) for w, v in skew_ms.items()}
    den = sum(math.log2(w) ** 2 for w in pts)
    if den == 0:
        raise ValueError("the straggler term needs a skew measured at a worker count above 1")
    return sum(v * math.log2(w) for w, v in pts.items()) / den


def fit_table_markdown(rows: Sequence[EfficiencyRow], fit: ScalingFit, *, cores: int) -> str:
    """Measured beside modelled, one row per measured worker count (weak scaling): two tables.

    The first compares step times, speedups and efficiencies. The measured step is the mean
    (wall time / timed steps, the one the throughput implies); the measured speedup and
    efficiency are the report's, against the baseline of the same run. The modelled columns
    are ``fit.model()``: one core (device) per rank. A row with more ranks than ``cores`` is
    marked oversubscribed, and the model is also given time-shared there
    (:func:`time_shared_ms`). Rows the fit used are marked.

    The second splits each mean step as the model does: local work (:attr:`RunStats.local_ms`
    against the model's local term), the wait for the slowest rank (:attr:`RunStats.skew_ms`
    against the straggler term) and the rest of the step (against the ring all-reduce).
    """
    if not rows:
        raise ValueError("no rows to render")
    b = rows[0].baseline_workers
    model = {p.workers: p for p in fit.model(sorted({r.workers for r in rows} | {b}))}
    base_model = model[b]
    lines = [
        f"| workers | measured step (ms) | model step (ms) | measured speedup vs W={b} | model speedup | "
        "measured efficiency | model efficiency | model time-shared on "
        f"{cores} cores (ms) | fitted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    label = {r.workers: (f"{r.workers} (oversubscribed: {r.workers} ranks on {cores} cores)"
                         if r.workers > cores else str(r.workers)) for r in rows}
    for row in rows:
        w = row.workers
        m = model[w]
        speed = w * base_model.step_ms / (b * m.step_ms)
        lines.append(f"| {label[w]} | {row.run.mean_step_ms:.1f} | {m.step_ms:.1f} | {row.speedup:.2f}x | "
                     f"{speed:.2f}x | {row.efficiency:.1%} | {speed * b / w:.1%} | "
                     f"{time_shared_ms(m, cores):.1f} | {'yes' if w in fit.workers else 'no'} |")
    lines += [
        "",
        "| workers | local (ms): measured | model | wait for the slowest rank (ms): measured | model straggler | "
        "rest of the step (ms): measured | model ring all-reduce |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r, m = row.run, model[row.workers]
        rest = r.mean_step_ms - r.local_ms - r.skew_ms
        lines.append(f"| {label[row.workers]} | {r.local_ms:.1f} | {m.local_ms:.1f} | {r.skew_ms:.1f} | "
                     f"{m.straggler_ms:.1f} | {rest:.1f} | {m.allreduce_ms:.1f} |")
    return "\n".join(lines) + "\n"


def render_png(rows: Sequence[EfficiencyRow], path: str | Path, *, title: str | None = None,
               model_throughput: Mapping[int, float] | None = None,
               model_time_shared: Mapping[int, float] | None = None,
               oversubscribed_from: int | None = None) -> Path:
    """Plot throughput (measured vs ideal), efficiency, and the per-rank split into ``path``.

    ``model_throughput`` (workers -> samples/s, a core per rank) and ``model_time_shared``
    (the same where ranks share cores), if given, are drawn beside the measurement; worker
    counts from ``oversubscribed_from`` up are shaded as oversubscribed.

    Needs matplotlib (``pip install 'elastic-supervisor[report]'``); it is imported here, and
    the figure is drawn by the non-interactive Agg canvas without pyplot (so no process-wide
    backend switch), and the rest of this module works without matplotlib.
    """
    if not rows:
        raise ValueError("no rows to plot")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("render_png needs matplotlib: pip install 'elastic-supervisor[report]' "
                           f"(or matplotlib>=3.7) ({exc})") from exc
    path = Path(path)
    ws = [r.workers for r in rows]
    b = rows[0].baseline_workers
    base = rows[0].run.throughput
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)  # Agg for this figure only: no pyplot, no process-wide backend switch
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.4])
    ax1.plot(ws, [r.run.throughput for r in rows], "o-", label="measured")
    ax1.plot(ws, [base * w / b for w in ws], "--", color="gray", label=f"ideal (linear from W={b})")
    if model_throughput:
        mw = sorted(model_throughput)
        ax1.plot(mw, [model_throughput[w] for w in mw], "s:", color="tab:orange", label="model (fitted), a core per rank")
    if model_time_shared:
        mw = sorted(model_time_shared)
        ax1.plot(mw, [model_time_shared[w] for w in mw], "x", color="tab:red", markersize=9,
                 label="model, ranks time-share the cores")
    if oversubscribed_from is not None and max(ws) >= oversubscribed_from:
        lo = max(min(ws), oversubscribed_from / 2 ** 0.5)
        ax1.axvspan(lo, max(ws) * 2 ** 0.25, color="tab:red", alpha=0.08, label="oversubscribed")
    for r in rows:
        ax1.annotate(f"{r.efficiency:.0%}", (r.workers, r.run.throughput), textcoords="offset points",
                     xytext=(0, 8), ha="center", fontsize=9)
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(ws, [str(w) for w in ws])
    ax1.set_xlabel("workers")
    ax1.set_ylabel("samples/s")
    ax1.set_title("throughput (labels: efficiency)")
    ax1.legend(fontsize=8)
    # Side by side, not stacked: the job's collective timer can overlap its compute timer.
    splits = [(r.workers, s) for r in rows for s in r.run.ranks]
    x = list(range(len(splits)))
    width = 0.27
    for i, (name, attr) in enumerate((("data", "data_ms"), ("compute", "compute_ms"), ("collective", "collective_ms"))):
        ax2.bar([v + (i - 1) * width for v in x], [getattr(s, attr) for _, s in splits], width, label=name)
    ax2.scatter(x, [s.step_ms for _, s in splits], marker="_", s=600, color="black", zorder=3,
                label="step (wall clock)")
    ax2.set_xticks(x, [f"W{w}\nr{s.rank}" for w, s in splits], fontsize=8)
    ax2.set_ylabel("median ms per step")
    ax2.set_title("per-rank medians (timers may overlap)")
    ax2.set_ylim(0, max(max(s.step_ms for _, s in splits), max(s.compute_ms for _, s in splits),
                        max(s.collective_ms for _, s in splits)) * 1.3)
    ax2.legend(fontsize=8, loc="upper left", ncols=4)
    if title:
        fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
