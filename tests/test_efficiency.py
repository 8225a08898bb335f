"""Scaling efficiency: the all-reduce model, the report math on hand-made logs, the plot, and
one real end-to-end run of ``benchmarks/efficiency.py`` (torchrun at W = 1 and W = 2)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.reports.efficiency import (
    FIT_PARAMETERS,
    SEED_TABLE,
    efficiency_table,
    fit_scaling_model,
    fit_table_markdown,
    model_table_markdown,
    parse_timing_lines,
    read_timing_logs,
    render_markdown,
    render_png,
    ring_allreduce_ms,
    scaling_model,
    straggler_from_skew,
    summarize_run,
    time_shared_ms,
)

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------- model

def test_model_defaults_reproduce_the_seed_table():
    points = scaling_model()
    assert [p.workers for p in points] == [1, 2, 4, 8, 16]
    for p in points:
        seed_ms, seed_speedup = SEED_TABLE[p.workers]
        assert f"{p.step_ms:.1f}" == f"{seed_ms:.1f}"
        assert abs(p.step_ms - seed_ms) < 0.03
        assert f"{p.speedup:.1f}" == f"{seed_speedup:.1f}"
        assert p.efficiency == pytest.approx(p.speedup / p.workers)
        assert p.step_ms == pytest.approx(p.local_ms + p.allreduce_ms + p.straggler_ms)
    table = model_table_markdown(points)
    for w, (ms, speedup) in SEED_TABLE.items():
        assert f"| {w} | {ms:.1f} |" in table
        assert f"| {speedup:.1f}x |" in table


def test_model_terms_with_hand_checked_numbers():
    # 100 MB at 10 GB/s over a ring of 4: 2 * 3/4 * 10 ms = 15 ms; 6 hops of 50 us = 0.3 ms.
    assert ring_allreduce_ms(4, grad_mb=100, bandwidth_gb_s=10, hop_latency_us=50) == pytest.approx(15.3)
    assert ring_allreduce_ms(1, grad_mb=100, bandwidth_gb_s=10, hop_latency_us=50) == 0.0
    (p1, p4) = scaling_model([1, 4], compute_ms=100, overhead_ms=0, grad_mb=100, bandwidth_gb_s=10,
                             hop_latency_us=50, straggler_ms=2)
    assert p1.step_ms == 100 and p1.speedup == 1.0 and p1.efficiency == 1.0
    assert p4.allreduce_ms == pytest.approx(15.3)
    assert p4.straggler_ms == pytest.approx(4.0)  # 2 ms * log2(4)
    assert p4.step_ms == pytest.approx(119.3)
    assert p4.speedup == pytest.approx(4 * 100 / 119.3)
    # Speedup is relative to the modelled t(1) even when 1 is not requested; order is kept.
    (p8, p2) = scaling_model([8, 2])
    assert p2.speedup == pytest.approx(2 * 120.3 / p2.step_ms)
    assert p8.workers == 8


def test_model_with_no_communication_scales_perfectly():
    points = scaling_model([1, 2, 64], grad_mb=0, hop_latency_us=0, straggler_ms=0)
    assert [p.speedup for p in points] == [1.0, 2.0, 64.0]


@pytest.mark.parametrize("workers, kwargs, match", [
    ([0], {}, "integers >= 1"),
    ([1, 2.5], {}, "integers >= 1"),
    ([1, True], {}, "integers >= 1"),
    ([], {}, "at least one"),
    ([1, 2, 2], {}, "duplicate"),
    ("124", {}, "iterable"),
    (4, {}, "iterable"),
    ([1, 2], {"compute_ms": 0}, "compute_ms must be > 0"),
    ([1, 2], {"compute_ms": float("nan")}, "compute_ms must be finite"),
    ([1, 2], {"overhead_ms": -0.1}, "overhead_ms must be >= 0"),
    ([1, 2], {"grad_mb": -1}, "grad_mb"),
    ([1, 2], {"bandwidth_gb_s": 0}, "bandwidth_gb_s must be > 0"),
    ([1, 2], {"hop_latency_us": float("inf")}, "hop_latency_us must be finite"),
    ([1, 2], {"straggler_ms": -5}, "straggler_ms"),
    ([1, 2], {"straggler_ms": "5"}, "straggler_ms must be a number"),
])
def test_model_rejects_bad_inputs(workers, kwargs, match):
    with pytest.raises(ValueError, match=match):
        scaling_model(workers, **kwargs)


# ---------------------------------------------------------------------------------- fit

SEED_PARAMS = {"compute_ms": 120.0, "overhead_ms": 0.3, "grad_mb": 1.0, "bandwidth_gb_s": 25.0,
               "hop_latency_us": 175.0, "straggler_ms": 5.0}
NO_COMM = {"grad_mb": 4.2, "bandwidth_gb_s": math.inf, "hop_latency_us": 0.0, "straggler_ms": 0.0}


@pytest.mark.parametrize("workers, truth, free", [
    # every term at once, from the seed's own worker counts
    ((1, 2, 4, 8, 16), SEED_PARAMS, FIT_PARAMETERS),
    # three terms from three worker counts, the fourth held at its true value
    ((1, 2, 4), SEED_PARAMS, ("compute_ms", "hop_latency_us", "straggler_ms")),
    ((1, 2, 4), SEED_PARAMS | {"bandwidth_gb_s": 2.0}, ("compute_ms", "bandwidth_gb_s", "straggler_ms")),
    # two points (what a 2-core machine measures): compute plus one scaling term
    ((1, 2), {"overhead_ms": 0.0, **NO_COMM, "compute_ms": 98.0, "straggler_ms": 7.5}, ("compute_ms", "straggler_ms")),
    ((1, 2), {"overhead_ms": 0.0, **NO_COMM, "compute_ms": 98.0, "bandwidth_gb_s": 0.6},
     ("compute_ms", "bandwidth_gb_s")),
    ((1, 2), {"overhead_ms": 0.0, **NO_COMM, "compute_ms": 98.0, "hop_latency_us": 900.0},
     ("compute_ms", "hop_latency_us")),
    # a term whose true value is zero is recovered at zero (the non-negativity bound is active)
    ((1, 2, 4, 8), SEED_PARAMS | {"straggler_ms": 0.0}, FIT_PARAMETERS),
    ((1, 2, 4, 8), SEED_PARAMS | {"hop_latency_us": 0.0}, FIT_PARAMETERS),
    # compute held, the scaling terms fitted; unordered, non-power-of-two worker counts
    ((6, 3, 1, 12), SEED_PARAMS | {"compute_ms": 40.0}, ("bandwidth_gb_s", "hop_latency_us", "straggler_ms")),
])
def test_fit_recovers_known_parameters(workers, truth, free):
    measured = {p.workers: p.step_ms for p in scaling_model(workers, **truth)}
    fit = fit_scaling_model(measured, free=free, **{k: v for k, v in truth.items() if k not in free})
    assert fit.free == tuple(free) and fit.workers == tuple(sorted(workers))
    for name, value in truth.items():
        assert fit.params[name] == pytest.approx(value, rel=1e-6, abs=1e-6), name
    assert fit.rms_ms == pytest.approx(0.0, abs=1e-6)
    assert [p.step_ms for p in fit.model()] == pytest.approx([measured[w] for w in sorted(workers)])


def test_fit_of_the_seed_table_itself():
    # The seed's table is rounded to 0.1 ms: the fit lands within that rounding of it.
    fit = fit_scaling_model({w: ms for w, (ms, _) in SEED_TABLE.items()}, free=FIT_PARAMETERS)
    assert max(abs(r) for r in fit.residual_ms) < 0.005
    assert fit.params["compute_ms"] == pytest.approx(120.0, abs=0.01)
    assert fit.params["hop_latency_us"] == pytest.approx(175.0, rel=0.02)
    assert fit.params["straggler_ms"] == pytest.approx(5.0, rel=0.02)


def test_fit_keeps_terms_non_negative():
    # Step times that fall with W: no scaling term may go negative to follow them.
    fit = fit_scaling_model({1: 100.0, 2: 99.0, 4: 98.0}, free=("compute_ms", "hop_latency_us", "straggler_ms"),
                            overhead_ms=0.0, grad_mb=0.0)
    assert fit.params["hop_latency_us"] == 0.0 and fit.params["straggler_ms"] == 0.0
    assert fit.params["compute_ms"] == pytest.approx(99.0)  # the mean: the best constant
    fit = fit_scaling_model({1: 100.0, 2: 99.0}, free=("compute_ms", "bandwidth_gb_s"), overhead_ms=0.0,
                            grad_mb=4.2, hop_latency_us=0.0, straggler_ms=0.0)
    assert fit.params["bandwidth_gb_s"] == math.inf  # a bandwidth term of zero
    assert scaling_model([4], **fit.params)[0].allreduce_ms == 0.0


def test_straggler_from_skew_and_time_sharing():
    assert straggler_from_skew({2: 12.0}) == 12.0
    assert straggler_from_skew({1: 5.0, 2: 10.0, 4: 20.0}) == pytest.approx(10.0)  # W=1 says nothing
    assert straggler_from_skew({2: 9.0, 4: 21.0}) == pytest.approx((9 + 42) / 5)
    for bad in ({1: 3.0}, {}):
        with pytest.raises(ValueError, match="above 1"):
            straggler_from_skew(bad)
    (p2, p8) = scaling_model([2, 8], compute_ms=100, overhead_ms=0, grad_mb=0, hop_latency_us=0, straggler_ms=4)
    assert time_shared_ms(p2, 2) == p2.step_ms == 104.0  # a core per rank: nothing shared
    assert time_shared_ms(p8, 2) == pytest.approx(400 + 12)  # 8 ranks take turns on 2 cores
    with pytest.raises(ValueError, match="cores"):
        time_shared_ms(p8, 0)


@pytest.mark.parametrize("step_ms, free, held, match", [
    ({1: 100, 2: 110}, ("compute_ms", "hop_latency_us", "straggler_ms"), {}, "cannot fit 3 parameters"),
    ({1: 100, 2: 110}, ("bandwidth_gb_s", "straggler_ms"), {}, "cannot tell"),
    ({2: 100, 4: 110, 8: 120, 16: 130}, FIT_PARAMETERS, {}, None),  # fine: four counts, four terms
    ({1: 100, 2: 110}, ("compute_ms", "gpu_ms"), {}, "free must name"),
    ({1: 100, 2: 110}, ("compute_ms", "compute_ms"), {}, "free must name"),
    ({1: 100, 2: 110}, (), {}, "free must name"),
    ({1: 100, 2: 110}, ("compute_ms",), {"compute_ms": 5}, "cannot hold"),
    ({1: 100, 2: 110}, ("compute_ms",), {"warp": 5}, "cannot hold"),
    ({1: 100, 2: 110}, ("compute_ms", "bandwidth_gb_s"), {"grad_mb": 0}, "needs grad_mb > 0"),
    ({1: 100, 2: 0}, ("compute_ms",), {}, r"step_ms\[2\] must be > 0"),
    ({1: 100, 2: float("nan")}, ("compute_ms",), {}, "must be finite"),
    ({0: 100}, ("compute_ms",), {}, "integers >= 1"),
    ({}, ("compute_ms",), {}, "must map"),
    ({1: 10, 2: 11}, ("compute_ms",), {"overhead_ms": 50}, "compute_ms fits to"),
    ({1: 10, 2: 11}, ("compute_ms",), {"hop_latency_us": -1}, "hop_latency_us must be >= 0"),
])
def test_fit_rejects_what_it_cannot_determine(step_ms, free, held, match):
    if match is None:
        fit_scaling_model(step_ms, free=free, **held)
        return
    with pytest.raises(ValueError, match=match):
        fit_scaling_model(step_ms, free=free, **held)


# ------------------------------------------------------------------- report on synthetic logs

def write_log(log_dir: Path, rank: int, world: int, times: list[float], *, data=None, compute=None,
              collective=None, attempt: int = 0, first_step: int = 1) -> None:
    """rank-R.jsonl as examples/train.py writes it (only the fields the report reads, plus loss)."""
    n = len(times)
    data = data or [0.001] * n
    compute = compute or [0.01] * n
    collective = collective or [0.002] * n
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"rank-{rank}.jsonl").open("a") as f:
        for i in range(n):
            f.write(json.dumps({"step": first_step + i, "loss": 1.0, "world_size": world, "attempt": attempt,
                                "rank": rank, "data_s": data[i], "compute_s": compute[i],
                                "collective_s": collective[i], "time": times[i]}) + "\n")


# Two warm-up steps (slow, with absurd split values) then four timed steps; binary-exact times.
W1_TIMES = [10.0, 11.0, 11.25, 11.5, 11.75, 12.0]  # timed: 4 steps in 1.0 s, each 0.25 s
W2_TIMES = [20.0, 23.0, 23.125, 23.25, 23.375, 23.625]  # timed: 4 steps in 0.625 s, median 0.125 s
WARM = [9.0, 9.0]


@pytest.fixture
def synthetic(tmp_path: Path) -> dict[int, Path]:
    w1, w2 = tmp_path / "w1", tmp_path / "w2"
    write_log(w1, 0, 1, W1_TIMES, compute=WARM + [0.1, 0.2, 0.3, 0.4])
    write_log(w2, 0, 2, W2_TIMES, compute=WARM + [0.1, 0.2, 0.3, 0.4], data=WARM + [0.001] * 4)
    write_log(w2, 1, 2, [t + 0.01 for t in W2_TIMES], compute=WARM + [0.01, 0.02, 0.03, 0.5],
              collective=WARM + [0.004, 0.004, 0.008, 0.008])
    return {1: w1, 2: w2}


def test_throughput_efficiency_and_split(synthetic):
    s1 = summarize_run(read_timing_logs(synthetic[1]), global_batch=8, warmup=2)
    s2 = summarize_run(read_timing_logs(synthetic[2]), global_batch=8, warmup=2)
    assert (s1.workers, s1.timed_steps, s1.wall_s) == (1, 4, 1.0)
    assert s1.throughput == 32.0  # 8 samples x 4 steps / 1.0 s
    assert s1.median_step_ms == 250.0 and s1.median_throughput == 32.0
    assert (s2.workers, s2.timed_steps, s2.wall_s) == (2, 4, 0.625)
    assert s2.throughput == pytest.approx(51.2)  # 8 x 4 / 0.625
    assert s2.median_step_ms == 125.0

    # Per-rank medians of the timed steps only (the 9 s warm-up values are gone), in ms.
    r0, r1 = s2.ranks
    assert (r0.rank, r0.data_ms, r0.compute_ms, r0.collective_ms) == (0, 1.0, pytest.approx(250.0), 2.0)
    assert (r1.rank, r1.data_ms, r1.compute_ms, r1.collective_ms) == (1, 1.0, pytest.approx(25.0), 6.0)
    assert r0.step_ms == 125.0 and r1.step_ms == pytest.approx(125.0)  # rank 1's clock is offset, not slower
    assert s2.mean_split_ms() == pytest.approx((1.0, 137.5, 4.0))
    # local = data + compute per step, ms: rank 0 101/201/301/401, rank 1 11/21/31/501.
    assert s1.local_ms == pytest.approx(251.0) and s1.skew_ms == 0.0
    assert s2.local_ms == pytest.approx((56 + 111 + 166 + 451) / 4)  # the ranks' mean, per step
    assert s2.skew_ms == pytest.approx((45 + 90 + 135 + 50) / 4)  # slowest minus that mean
    assert s2.mean_step_ms == pytest.approx(156.25)  # 0.625 s / 4 steps

    rows = efficiency_table([s2, s1])
    assert [r.workers for r in rows] == [1, 2]
    assert rows[0].speedup == 1.0 and rows[0].efficiency == 1.0
    assert rows[1].baseline_workers == 1
    assert rows[1].speedup == pytest.approx(1.6)  # 51.2 / 32
    assert rows[1].efficiency == pytest.approx(0.8)  # 51.2 / (2 x 32)

    md = render_markdown(rows)
    assert "| 1 | 4 | 1.000 | 32 | 32 | 250.00 | 1.00x | 100.0% | 1.00 | 250.00 | 2.00 |" in md
    assert "| 2 | 4 | 0.625 | 51 | 51 | 125.00 | 1.60x | 80.0% | 1.00 | 137.50 | 4.00 |" in md
    assert "| 2 | 1 | 1.00 | 25.00 | 6.00 | 125.00 |" in md
    assert "| 2 (oversubscribed) | 4 | 0.625 |" in render_markdown(rows, cores=1)
    assert "| 2 | 4 | 0.625 |" in render_markdown(rows, cores=2)


def test_warmup_steps_are_skipped(synthetic):
    logs = read_timing_logs(synthetic[1])
    # warmup=0: step 1's end starts the clock; steps 2..6 are timed, the slow step 2 included.
    s0 = summarize_run(logs, global_batch=8, warmup=0)
    assert (s0.timed_steps, s0.wall_s, s0.throughput) == (5, 2.0, 20.0)
    assert s0.median_step_ms == 250.0
    assert s0.ranks[0].compute_ms == pytest.approx(300.0)  # median of 9, .1, .2, .3, .4
    # warmup=1: the clock still starts at step 1's end, but step 1 is what is dropped.
    assert summarize_run(logs, global_batch=8, warmup=1).timed_steps == 5
    s2 = summarize_run(logs, global_batch=8, warmup=2)
    assert (s2.timed_steps, s2.throughput) == (4, 32.0)
    s4 = summarize_run(logs, global_batch=8, warmup=4)  # timed: steps 5, 6 from 11.5 s
    assert (s4.timed_steps, s4.wall_s, s4.throughput) == (2, 0.5, 32.0)
    assert s4.ranks[0].compute_ms == pytest.approx(350.0)
    s5 = summarize_run(logs, global_batch=8, warmup=5)  # one timed step: step 6, 0.25 s
    assert (s5.timed_steps, s5.wall_s, s5.throughput) == (1, 0.25, 32.0)
    with pytest.raises(ValueError, match="need at least 7"):
        summarize_run(logs, global_batch=8, warmup=6)


def test_baseline_is_the_smallest_worker_count_without_w1(tmp_path):
    write_log(tmp_path / "a", 0, 2, [0.0, 1.0, 2.0])
    write_log(tmp_path / "a", 1, 2, [0.0, 1.0, 2.0])
    for r in range(4):
        write_log(tmp_path / "b", r, 4, [0.0, 1.0, 1.75])
    runs = [summarize_run(read_timing_logs(tmp_path / d), global_batch=4, warmup=2) for d in "ab"]
    rows = efficiency_table(runs)
    assert rows[1].baseline_workers == 2
    assert rows[1].efficiency == pytest.approx((4 / 0.75) * 2 / (4 * 4.0))
    assert "efficiency vs W=2" in render_markdown(rows)


def test_rounds_pick_the_median_run(tmp_path):
    runs = []
    for i, wall in enumerate([0.5, 0.25, 1.0]):
        write_log(tmp_path / str(i), 0, 1, [0.0, 1.0, 1.0 + wall])
        runs.append(summarize_run(read_timing_logs(tmp_path / str(i)), global_batch=2, warmup=2))
    (row,) = efficiency_table(runs)
    assert row.run.throughput == 4.0  # 2 / 0.5: the middle of 2, 4 and 8
    assert row.round_throughputs == (2.0, 4.0, 8.0)


def test_bad_logs_are_rejected(tmp_path):
    def summarize(d):
        return summarize_run(read_timing_logs(tmp_path / d), global_batch=8, warmup=0)

    write_log(tmp_path / "missing-rank", 0, 2, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="ranks \\[0\\]"):
        summarize("missing-rank")
    write_log(tmp_path / "restarted", 0, 1, [0.0, 1.0, 2.0])
    write_log(tmp_path / "restarted", 0, 1, [3.0, 4.0], attempt=1, first_step=2)
    with pytest.raises(ValueError, match="several attempts"):
        summarize("restarted")
    write_log(tmp_path / "gap", 0, 1, [0.0, 1.0])
    write_log(tmp_path / "gap", 0, 1, [2.0], first_step=4)
    with pytest.raises(ValueError, match="not consecutive"):
        summarize("gap")
    write_log(tmp_path / "clock", 0, 1, [5.0, 5.0, 5.0])
    with pytest.raises(ValueError, match="does not advance"):
        summarize("clock")
    write_log(tmp_path / "uneven", 0, 2, [0.0, 1.0, 2.0])
    write_log(tmp_path / "uneven", 1, 2, [0.0, 1.0])
    with pytest.raises(ValueError, match="different steps"):
        summarize("uneven")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no rank-R.jsonl"):
        read_timing_logs(tmp_path / "empty")
    with pytest.raises(ValueError, match="x.jsonl:2: not JSON"):
        parse_timing_lines(['{"step": 1}', "{oops", ""], source="x.jsonl")
    logs = {0: [{"step": 1, "world_size": 1, "time": 0.0}, {"step": 2, "world_size": 1, "time": 1.0}]}
    with pytest.raises(ValueError, match="'data_s' missing"):
        summarize_run(logs, global_batch=8, warmup=0)
    for kwargs, match in [({"global_batch": 0}, "global_batch"), ({"global_batch": 8, "warmup": -1}, "warmup")]:
        with pytest.raises(ValueError, match=match):
            summarize_run(logs, **kwargs)


def test_weak_scaling_runs_and_the_fitted_model_beside_them(tmp_path):
    # 8 samples per rank; W=1: 125 ms steps, W=2: 137.5 ms, W=4: 250 ms (4 ranks on 2 cores).
    for w, dt in ((1, 0.125), (2, 0.1375), (4, 0.25)):
        for r in range(w):
            write_log(tmp_path / f"w{w}", r, w, [10.0 + i * dt for i in range(5)])
    runs = [summarize_run(read_timing_logs(tmp_path / f"w{w}"), global_batch=8 * w, warmup=1) for w in (1, 2, 4)]
    rows = efficiency_table(runs)
    assert [r.run.mean_step_ms for r in rows] == pytest.approx([125.0, 137.5, 250.0])
    assert rows[1].efficiency == pytest.approx(125.0 / 137.5)  # weak scaling: t(1) / t(W)
    assert rows[2].speedup == pytest.approx(4 * 125.0 / 250.0)
    fit = fit_scaling_model({1: 125.0, 2: 137.5}, free=("compute_ms", "straggler_ms"), overhead_ms=0.0,
                            grad_mb=4.2, bandwidth_gb_s=math.inf, hop_latency_us=0.0)
    assert fit.params["straggler_ms"] == pytest.approx(12.5)
    md = fit_table_markdown(rows, fit, cores=2)
    assert "| 1 | 125.0 | 125.0 | 1.00x | 1.00x | 100.0% | 100.0% | 125.0 | yes |" in md
    assert "| 2 | 137.5 | 137.5 | 1.82x | 1.82x | 90.9% | 90.9% | 137.5 | yes |" in md
    # W=4: one core per rank, the model says 125 + 2 x 12.5; time-shared on 2 cores, 2 x 125 + 25.
    assert ("| 4 (oversubscribed: 4 ranks on 2 cores) | 250.0 | 150.0 | 2.00x | 3.33x | 50.0% | 83.3% | "
            "275.0 | no |") in md


def test_runs_of_different_batches_are_not_compared(tmp_path):
    write_log(tmp_path / "a", 0, 1, [0.0, 1.0, 2.0])
    logs = read_timing_logs(tmp_path / "a")
    with pytest.raises(ValueError, match="global batch"):
        efficiency_table([summarize_run(logs, global_batch=8, warmup=0),
                          summarize_run(logs, global_batch=16, warmup=0)])
    write_log(tmp_path / "b", 0, 2, [0.0, 1.0, 2.0])
    write_log(tmp_path / "b", 1, 2, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="per-rank batch"):  # neither strong (8, 24) nor weak (8, 12)
        efficiency_table([summarize_run(logs, global_batch=8, warmup=0),
                          summarize_run(read_timing_logs(tmp_path / "b"), global_batch=24, warmup=0)])
    with pytest.raises(ValueError, match="no runs"):
        efficiency_table([])


# ---------------------------------------------------------------------------------- plot

def test_png_is_written(synthetic, tmp_path):
    pytest.importorskip("matplotlib")
    rows = efficiency_table(summarize_run(read_timing_logs(d), global_batch=8, warmup=2) for d in synthetic.values())
    out = render_png(rows, tmp_path / "plots" / "eff.png", title="synthetic")
    assert out == tmp_path / "plots" / "eff.png"
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_png_without_matplotlib_names_the_extra(synthetic, tmp_path, monkeypatch):
    rows = efficiency_table([summarize_run(read_timing_logs(synthetic[1]), global_batch=8, warmup=2)])
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)  # None in sys.modules makes the import fail
    with pytest.raises(ImportError, match=r"elastic-supervisor\[report\]"):
        render_png(rows, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_benchmark_command_end_to_end(tmp_path):
    """The one command, for real: torchrun at W = 1 and 2 (weak scaling), 12 steps, the model
    fitted to them, report + plot written."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "report" / "eff.md"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("SUPERVISOR_FAULT", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "efficiency.py"), "--workers", "1", "2", "--steps", "12",
         "--per-rank-batch", "8", "--dim", "64", "--warmup", "3", "--out", str(out),
         "--keep-logs", str(tmp_path / "logs")],
        env=env, capture_output=True, text=True, timeout=240, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = efficiency_table(summarize_run(read_timing_logs(tmp_path / "logs" / f"round0-w{w}" / "logs"),
                                          global_batch=8 * w, warmup=3) for w in (1, 2))
    assert [r.workers for r in rows] == [1, 2]
    for r in rows:
        assert r.run.timed_steps == 9 and r.run.throughput > 0 and math.isfinite(r.efficiency)
        assert [s.rank for s in r.run.ranks] == list(range(r.workers))
        assert all(s.compute_ms > 0 for s in r.run.ranks)
    text = out.read_text()
    assert "| 1 | 9 |" in text and "| 2 | 9 |" in text
    assert "8 samples per rank per step" in text
    if (os.cpu_count() or 1) >= 2:  # a core per rank: the model is fitted to both counts, exactly
        assert "**The fit.** compute_ms, bandwidth_gb_s fitted" in text
        assert "(measured: the mean wait for the slowest rank" in text  # straggler_ms from the skew
        assert text.count(" | yes |") == 2 and "| wait for the slowest rank (ms): measured |" in text
    assert "| 16 | 145.6 |" in text  # the seed's model table is still there
    assert "| 1 | 9 |" in proc.stdout and "| 2 | 9 |" in proc.stdout
    png = out.with_suffix(".png").read_bytes()
    assert png[:8] == PNG_MAGIC
