"""Scaling efficiency of the example job at 1, 2 and 4 workers, measured, and the model fitted to it.

    python benchmarks/efficiency.py [--workers 1 2 4] [--per-rank-batch 1024 | --global-batch N]
                                    [--steps 60] [--warmup 5] [--rounds 1] [--settle 0] [--retry-busy 0]
                                    [--fit compute_ms,bandwidth_gb_s] [--out docs/efficiency.md]

For every worker count ``W`` this launches ``examples/train.py`` under a real ``torchrun
--standalone --nproc-per-node W`` (gloo on CPU, NCCL if CUDA is visible; no checkpoints),
each launch in a fresh temporary directory that is also its ``TMPDIR``, with
``OMP_NUM_THREADS=1`` so that ``W`` processes ask for ``W`` cores.

By default every rank gets the same ``--per-rank-batch`` samples per step, so the global batch
is ``W`` times that (weak scaling, the regime of the seed's model: about 100 ms of compute per
step at the defaults, ``--dim 256 --layers 4``, on one core). ``--global-batch N`` instead
fixes the global batch, so each rank gets ``N / W`` (strong scaling; with a small model that
is a millisecond step, where data parallelism cannot pay on CPU). The per-rank timing logs
are turned into the report by :mod:`supervisor.reports.efficiency`: warm-up steps dropped,
throughput from rank 0's wall clock, efficiency = ``throughput_W / (W * throughput_1)``
against the ``W = 1`` run of the same invocation (in weak scaling, ``t(1) / t(W)``), and
each rank's median data / compute / collective split.

In weak scaling the model's ``--fit`` parameters (default ``compute_ms,bandwidth_gb_s``) are
fitted to the mean step times of the worker counts that have a core per rank, the straggler
term held at the measured wait for the slowest rank, and the model is printed beside the
measurement at every ``W``, step time and its split; a ``W`` above the usable core count is
marked oversubscribed (its ranks time-share cores), and the model is shown there both as if
every rank had its own core and time-shared.

With ``--rounds N`` every worker count runs ``N`` times, round-robin, the order rotated every
round (a slow phase of a shared machine then hits every worker count alike); the run with the
median throughput represents its worker count and every round's throughput is listed. On a
shared machine ``--settle S`` waits (up to ``S`` seconds) before each launch until other
processes use under a quarter of a core, and ``--retry-busy K`` runs a launch again (up to
``K`` times) when they used more than that while it ran; the report gives, for every launch,
how many cores other processes used while it ran, measured from ``/proc/stat``.

Writes the markdown report to ``--out`` and the plot beside it (same name, ``.png``), and
prints the tables.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from supervisor.reports.efficiency import (  # noqa: E402  (after the sys.path line: runs from a checkout)
    FIT_PARAMETERS,
    EfficiencyRow,
    RunStats,
    ScalingFit,
    efficiency_table,
    fit_scaling_model,
    fit_table_markdown,
    model_table_markdown,
    read_timing_logs,
    render_markdown,
    render_png,
    scaling_model,
    straggler_from_skew,
    summarize_run,
    time_shared_ms,
)

TRAIN = REPO / "examples" / "train.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="worker counts (default: 1 2 4)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default: 60)")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--per-rank-batch", type=int, default=1024,
                       help="samples per step per rank; the global batch is W times it (weak scaling; default: 1024)")
    batch.add_argument("--global-batch", type=int,
                       help="samples per step, all ranks together (strong scaling; default: off)")
    p.add_argument("--dim", type=int, default=256, help="the example's --dim (default: 256)")
    p.add_argument("--layers", type=int, default=4, help="the example's --layers (default: 4)")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing (default: 5)")
    p.add_argument("--rounds", type=int, default=1, help="runs per worker count (default: 1)")
    p.add_argument("--fit", default="compute_ms,bandwidth_gb_s",
                   help="model parameters fitted to the measured step times, comma-separated, from "
                        f"{','.join(FIT_PARAMETERS)}; straggler_ms, unless named, is held at the measured wait "
                        "for the slowest rank (weak scaling only; default: compute_ms,bandwidth_gb_s)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "efficiency.md", help="markdown report")
    p.add_argument("--keep-logs", type=Path, help="keep every run's timing logs under this directory")
    p.add_argument("--timeout", type=float, default=600, help="seconds per launch before it is killed")
    p.add_argument("--settle", type=float, default=0.0,
                   help="before each launch wait up to this many seconds for the CPUs to go idle (default: 0)")
    p.add_argument("--retry-busy", type=int, default=0,
                   help="run a launch again (up to this many times) when other processes used more than a "
                        "quarter of a core while it ran (default: 0)")
    args = p.parse_args(argv)
    if any(w < 1 for w in args.workers) or len(set(args.workers)) != len(args.workers):
        p.error("--workers must be distinct integers >= 1")
    args.workers = sorted(args.workers)
    if args.warmup < 0 or args.steps < max(args.warmup, 1) + 1:
        p.error("need --warmup >= 0 and --steps > max(--warmup, 1)")
    if args.dim < 1 or args.layers < 1:
        p.error("--dim and --layers must be >= 1")
    if args.rounds < 1 or args.retry_busy < 0:
        p.error("need --rounds >= 1 and --retry-busy >= 0")
    args.weak = args.global_batch is None
    if args.weak and args.per_rank_batch < 1:
        p.error("--per-rank-batch must be >= 1")
    if not args.weak and any(args.global_batch % w for w in args.workers):
        p.error("--global-batch must be divisible by every worker count")
    args.fit = tuple(f.strip() for f in args.fit.split(",") if f.strip())
    if not args.fit or any(f not in FIT_PARAMETERS for f in args.fit):
        p.error(f"--fit takes parameters from {', '.join(FIT_PARAMETERS)}")
    return args


def global_batch(args: argparse.Namespace, workers: int) -> int:
    return args.per_rank_batch * workers if args.weak else args.global_batch


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def system_cpu_busy_s() -> float | None:
    """CPU seconds all processes have spent busy since boot (Linux ``/proc/stat``), else None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


BUSY_CORES = 0.25  # other processes using more than this many cores make a launch "busy"


def wait_for_quiet(max_wait_s: float, *, max_cores: float = BUSY_CORES, window_s: float = 2.0) -> None:
    """Wait (at most ``max_wait_s``) until other processes use under ``max_cores`` CPU cores."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        b0 = system_cpu_busy_s()
        if b0 is None:
            return
        time.sleep(window_s)
        b1 = system_cpu_busy_s()
        if b1 is not None and (b1 - b0) / window_s < max_cores:
            return


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def launch(workers: int, args: argparse.Namespace, work: Path) -> tuple[Path, float, float | None]:
    """One torchrun launch of the example.

    Returns its log directory, its wall seconds, and how many cores other processes used on
    average meanwhile (system busy time minus this launch's; None off Linux).
    """
    tmpdir, log_dir = work / "tmp", work / "logs"
    tmpdir.mkdir(parents=True)
    env = dict(os.environ)
    env.pop("SUPERVISOR_FAULT", None)
    env.update(TMPDIR=str(tmpdir), OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    gb = global_batch(args, workers)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}",
           str(TRAIN), "--steps", str(args.steps), "--global-batch", str(gb), "--dataset-size", str(max(4096, gb)),
           "--dim", str(args.dim), "--layers", str(args.layers), "--checkpoint-every", "0", "--log-dir", str(log_dir)]
    busy0, own0 = system_cpu_busy_s(), children_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=args.timeout,
                          start_new_session=True)
    elapsed = time.perf_counter() - t0
    busy1, own1 = system_cpu_busy_s(), children_cpu_s()
    foreign = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / elapsed
    if proc.returncode != 0:
        raise SystemExit(f"torchrun at W={workers} failed (rc={proc.returncode}):\n{shlex.join(cmd)}\n"
                         f"{proc.stderr[-4000:]}")
    return log_dir, elapsed, foreign


def machine() -> str:
    import torch

    cores = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only (gloo)"
    return (f"{platform.machine()}, {usable} usable CPU cores ({cores} online), "
            f"{dev}; Python {platform.python_version()}, torch {torch.__version__}")


def n_params(dim: int, layers: int) -> int:
    """Parameters of examples/train.py's DeepMLP: per block LayerNorm + two Linear, then a head."""
    return layers * (2 * dim + (dim * 2 * dim + 2 * dim) + (2 * dim * dim + dim)) + dim + 1


def transport() -> str:
    import torch

    return "NCCL" if torch.cuda.is_available() else "gloo over loopback TCP"


def reading_strong(args: argparse.Namespace, rows: list[EfficiencyRow]) -> str:
    """Strong scaling: the measured numbers that explain the efficiency, in a paragraph."""
    base = rows[0]
    t1 = base.run.median_step_ms
    grad_mb = n_params(args.dim, args.layers) * 4 / 1e6
    parts = []
    for row in rows[1:]:
        coll = row.run.mean_split_ms()[2]
        parts.append(f"{coll:.1f} ms at W = {row.workers} ({coll / t1:.1f}x the whole W = {base.workers} step; "
                     f"efficiency {row.efficiency:.0%})")
    per_w = "; ".join(parts) if parts else "(no multi-worker run)"
    return (f"**Reading.** Strong scaling: a step takes {t1:.2f} ms median at W = {base.workers} for the whole "
            f"global batch of {args.global_batch}, with a {grad_mb:.2f} MB fp32 gradient. Splitting the batch saves "
            f"at most a share of that per step, while every step with W > 1 pays for its collectives (DDP's "
            f"gradient all-reduce and the job's own per-step all-reduce) through {transport()}. The mean per-rank "
            f"median *collective* time is {per_w}. Without `--global-batch` the benchmark measures weak "
            f"scaling, the model's regime, and fits the model to it.\n")


def fit_model(args: argparse.Namespace, rows: list[EfficiencyRow], cores: int) -> tuple[ScalingFit | None, str]:
    """The model fitted to the worker counts that have a core per rank; (None, why) if it cannot be.

    The terms not in ``--fit`` are held at zero, so the fitted ones carry the whole measured
    cost, except the straggler term: unless fitted, it is held at the measured wait for the
    slowest rank (:func:`straggler_from_skew`).
    """
    if not args.weak:
        return None, "the model is of weak scaling; this run is strong scaling (`--global-batch`)"
    used = [r for r in rows if r.workers <= cores]
    held = {"overhead_ms": 0.0, "grad_mb": n_params(args.dim, args.layers) * 4 / 1e6,
            "bandwidth_gb_s": math.inf, "hop_latency_us": 0.0, "straggler_ms": 0.0}
    skews = {r.workers: r.run.skew_ms for r in used if r.workers > 1}
    if "straggler_ms" not in args.fit and skews:
        held["straggler_ms"] = straggler_from_skew(skews)
    try:
        fit = fit_scaling_model({r.workers: r.run.mean_step_ms for r in used}, free=args.fit,
                                **{k: v for k, v in held.items() if k not in args.fit})
    except ValueError as exc:
        return None, (f"no fit of {', '.join(args.fit)} to W = {', '.join(str(r.workers) for r in used)} "
                      f"(the worker counts with a core per rank): {exc}")
    return fit, ""


def fmt_param(name: str, value: float) -> str:
    unit = {"compute_ms": "ms", "overhead_ms": "ms", "grad_mb": "MB", "bandwidth_gb_s": "GB/s",
            "hop_latency_us": "us", "straggler_ms": "ms"}[name]
    if value == math.inf:
        return f"`{name}` = inf (no bandwidth term)"
    digits = {"ms": ".2f", "us": ".0f", "MB": ".3f", "GB/s": ".3g"}[unit]
    return f"`{name}` = {value:{digits}} {unit}"


def fit_text(args: argparse.Namespace, fit: ScalingFit) -> str:
    """What was fitted to what, what was held and why, and what the fit cannot say."""
    free = ", ".join(fmt_param(k, fit.params[k]) for k in fit.free)
    held = [fmt_param(k, v) + (" (measured: the mean wait for the slowest rank, `skew_ms`, over log2 W)"
                               if k == "straggler_ms" and v > 0 else "")
            for k, v in fit.params.items() if k not in fit.free]
    resid = ", ".join(f"{r:+.2f} ms at W = {w}" for w, r in zip(fit.workers, fit.residual_ms))
    text = (f"**The fit.** {', '.join(fit.free)} fitted by least squares to the measured mean step time at "
            f"W = {', '.join(map(str, fit.workers))}, the worker counts with a core per rank here: {free}. "
            f"Held: {'; '.join(held)}. `grad_mb` is this model's whole fp32 gradient, so a fitted "
            f"`bandwidth_gb_s` is the rate at which this transport reduces it while the ranks compute; "
            f"`overhead_ms` is folded into `compute_ms`, and the communication terms not fitted are held at "
            f"zero, so the fitted ones carry the whole measured cost. Residuals: {resid}"
            + (" (as many parameters as worker counts: the model passes through them by construction, "
               "and the rows not fitted are its test)." if len(fit.free) == len(fit.workers) else "."))
    multi = [w for w in fit.workers if w > 1]
    comm = [k for k in fit.free if k in ("bandwidth_gb_s", "hop_latency_us")]
    if len(multi) == 1 and len(comm) == 1 and len(fit.free) == 2:
        # one multi-worker count fixes the communication cost there, not how it grows
        other = "hop_latency_us" if comm[0] == "bandwidth_gb_s" else "bandwidth_gb_s"
        points = dict(zip(fit.workers, fit.measured_ms))
        held_alt = {k: v for k, v in fit.params.items() if k not in ("compute_ms", other)}
        held_alt[comm[0]] = math.inf if comm[0] == "bandwidth_gb_s" else 0.0
        alt = fit_scaling_model(points, free=("compute_ms", other), **held_alt)
        ws = [w for w in args.workers if w > multi[0]] or [2 * multi[0]]
        growth = {"bandwidth_gb_s": "the bandwidth term (2 (W-1)/W of a fixed gradient)",
                  "hop_latency_us": "the hop-latency term (2 (W-1) hops)"}
        text += (f" One multi-worker count fixes the communication cost at W = {multi[0]}, not how it grows: "
                 f"it is put in {growth[comm[0]]}; put in {growth[other]} instead, the model would give "
                 + ", ".join(f"{a.step_ms:.1f} ms instead of {b.step_ms:.1f} ms at W = {a.workers}"
                             for a, b in zip(alt.model(ws), fit.model(ws)))
                 + ". More cores tell them apart (`--fit` then takes more terms).")
    return text + "\n"


def reading_weak(args: argparse.Namespace, rows: list[EfficiencyRow], fit: ScalingFit | None, cores: int) -> str:
    """Weak scaling: the measured numbers that explain the efficiency, in a paragraph."""
    base = rows[0]
    t1 = base.run.mean_step_ms
    grad_mb = n_params(args.dim, args.layers) * 4 / 1e6
    parts = []
    for row in rows[1:]:
        r = row.run
        rest = r.mean_step_ms - r.local_ms - r.skew_ms
        where = (f"{row.workers} ranks on {cores} cores (oversubscribed)" if row.workers > cores
                 else f"W = {row.workers} (a core per rank)")
        parts.append(f"at {where} a step takes {r.mean_step_ms:.1f} ms: local work {r.local_ms:.1f} ms, the wait "
                     f"for the slowest rank {r.skew_ms:.1f} ms, the rest (communication) {rest:.1f} ms; speedup "
                     f"{row.speedup:.2f}x, efficiency {row.efficiency:.0%}")
    over = [r for r in rows if r.workers > cores]
    shared = ""
    if fit is not None and over:
        m = {p.workers: p for p in fit.model([r.workers for r in over])}
        shared = (" For the oversubscribed rows the time-shared model (local term x W / cores, plus the "
                  "communication and straggler terms) gives " + ", ".join(
                      f"{time_shared_ms(m[r.workers], cores):.1f} ms at W = {r.workers} (measured "
                      f"{r.run.mean_step_ms:.1f} ms)" for r in over) +
                  "; the one-core-per-rank model column is what that many cores would do, which this machine "
                  "cannot measure.")
    return (f"**Reading.** Weak scaling at {args.per_rank_batch} samples per rank, a {grad_mb:.2f} MB fp32 "
            f"gradient reduced through {transport()}. At W = {base.workers} a step takes {t1:.1f} ms (local work "
            f"{base.run.local_ms:.1f} ms); " + "; ".join(parts) + "." + shared + "\n")


def report_text(args: argparse.Namespace, table: str, fit_section: str, seed_model: str,
                launches: dict[int, list[float]], others: dict[int, list[float | None]], png_name: str,
                argv: list[str], reading_text: str, discarded: dict[int, list[float]]) -> str:
    usable = usable_cores()
    over = [w for w in args.workers if w > usable]
    cmd = shlex.join(["python", "benchmarks/efficiency.py", *argv])
    oversub = (f"**This machine has {usable} usable CPU cores, so W = {', '.join(map(str, over))} is "
               f"oversubscribed**: the ranks time-share cores, and the efficiency there measures that "
               f"contention as much as the method. Read those rows as what this machine does, not as "
               f"what {max(over)} real devices would do; the fit leaves them out.\n\n") if over else ""
    launch_s = ", ".join(f"W={w}: " + "/".join(f"{s:.1f}" for s in v) + " s" for w, v in sorted(launches.items()))
    seen = [x for v in others.values() for x in v if x is not None]
    if seen:
        other_s = ", ".join(f"W={w}: " + "/".join("?" if x is None else f"{x:.2f}" for x in v)
                            for w, v in sorted(others.items()))
        load_note = (" CPU cores used on average by processes outside the benchmark during each launch "
                     f"(system busy time from `/proc/stat` minus the launch's own): {other_s}.")
        if max(seen) > BUSY_CORES:
            load_note += (" **Other work was competing for the cores during some launches**, and the "
                          "numbers carry that.")
    else:
        load_note = ""
    if discarded:
        load_note += (" Launches run again because other processes used more than "
                      f"{BUSY_CORES} cores meanwhile (`--retry-busy`), with those loads: " +
                      ", ".join(f"W={w}: " + "/".join(f"{x:.2f}" for x in v) for w, v in sorted(discarded.items())) +
                      ".")
    if args.weak:
        batch = (f"{args.per_rank_batch} samples per rank per step, so a global batch of "
                 f"{args.per_rank_batch} x W (weak scaling, the model's regime)")
        eff = ("efficiency** = throughput_W / (W x throughput_1), against the W = 1 run of this same "
               "invocation; in weak scaling that is t(1) / t(W) of the mean step times, the model's "
               "definition (speedup = throughput_W / throughput_1 = W t(1) / t(W))")
    else:
        batch = (f"global batch {args.global_batch} (strong scaling: each rank gets {args.global_batch}/W "
                 "samples per step)")
        eff = ("efficiency** = throughput_W / (W x throughput_1), against the W = 1 run of this same "
               "invocation (speedup = throughput_W / throughput_1)")
    return f"""# Scaling efficiency

Produced by `{cmd}` on {_dt.date.today().isoformat()} (rerun it to refresh this file and
`{png_name}`; it takes a few minutes).

Machine: {machine()}.

{oversub}## Method

`examples/train.py` (DDP, residual MLP, `--dim {args.dim} --layers {args.layers}`: {n_params(args.dim, args.layers):,}
parameters) runs under a real `torchrun --standalone --nproc-per-node W` at
W = {", ".join(map(str, args.workers))}, {args.steps} steps, {batch}, no checkpoints,
`OMP_NUM_THREADS=1` (one core per rank), each launch in a fresh `TMPDIR`, {args.rounds} round(s)
per worker count{" (round-robin, order rotated every round; the median-throughput run represents its W)" if args.rounds > 1 else ""}.
Every rank logs one JSON line per step; `supervisor.reports.efficiency` drops the first {args.warmup} steps and
computes:

- **samples/s** = global batch x timed steps / wall time, the wall time from rank 0's `time`
  field at the end of the last warm-up step to the end of the last step (mean step = wall
  time / timed steps);
- **median step** = median difference of rank 0's consecutive `time` fields;
- **{eff};
- **data / compute / collective** = median over the timed steps of each rank's `data_s`,
  `compute_s`, `collective_s`, as the example logs them (first table: the mean over ranks;
  second table: each rank, beside its median step time from its own `time` field). They are
  the job's own timers, reported as logged: a collective launched during `backward()` (DDP's
  gradient buckets) can count as *collective* while *compute* is still running, so the three
  need not add up to the step, and *collective* includes waiting for the slowest rank;
- **local / wait for the slowest rank / rest**, the mean step split as the model splits it:
  per timed step, the ranks' mean `data_s + compute_s`; how far the slowest rank's lies
  above that mean; and what is left of the mean step (communication, bookkeeping). `compute_s`
  counts only compute with no collective in flight, so where DDP's gradient buckets overlap
  the backward pass, *local* reads low and *rest* high by that overlap.

Whole launches (process start-up and rendezvous included, not part of the throughput) took
{launch_s}.{load_note}

## Measured

{table}
![throughput against the fitted model, and the per-rank split]({png_name})

## Measured beside the model fitted to it

{fit_section}
{reading_text}
## The model: ring all-reduce with a straggler penalty

`supervisor.reports.efficiency.scaling_model(workers, *, compute_ms=120.0, overhead_ms=0.3,
grad_mb=1.0, bandwidth_gb_s=25.0, hop_latency_us=175.0, straggler_ms=5.0)`, at fixed
per-worker batch (weak scaling), one step on W workers:

    t(W) = compute_ms + overhead_ms
         + 2 (W-1)/W * grad_mb [MB] / bandwidth_gb_s [GB/s]    ring all-reduce, bandwidth
         + 2 (W-1) * hop_latency_us                             ring all-reduce, latency
         + straggler_ms * log2(W)                               wait for the slowest worker
    speedup(W) = W * t(1) / t(W),   efficiency(W) = t(1) / t(W)

`grad_mb` is the gradient whose reduction is not hidden behind the backward pass.
`supervisor.reports.efficiency.fit_scaling_model(step_ms_by_workers, free=..., **held)` fits the
chosen parameters to measured step times (least squares, none negative) and refuses a set the
worker counts cannot tell apart. With its defaults the model reproduces the seed's table
(120 ms of compute per worker on separate devices; 120.3 / 125.7 / 131.4 / 137.8 / 145.6 ms,
1.0x / 1.9x / 3.7x / 7.0x / 13.2x at 1 / 2 / 4 / 8 / 16 workers) at its displayed precision;
every step time is at most 0.025 ms off it:

{seed_model}"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.out = args.out.resolve()
    png = args.out.with_suffix(".png")
    runs: list[RunStats] = []
    launches: dict[int, list[float]] = {}
    others: dict[int, list[float | None]] = {}  # cores used by other processes during each launch
    discarded: dict[int, list[float]] = {}  # the same, for launches run again (--retry-busy)
    with tempfile.TemporaryDirectory(prefix="efficiency-") as tmp:
        root = args.keep_logs.resolve() if args.keep_logs else Path(tmp)
        for rnd in range(args.rounds):
            k = rnd % len(args.workers)
            order = args.workers[k:] + args.workers[:k]
            for w in order:
                for attempt in range(args.retry_busy + 1):
                    work = root / (f"round{rnd}-w{w}" + (f"-retry{attempt}" if attempt else ""))
                    if work.exists():
                        raise SystemExit(f"{work} exists: pick an empty --keep-logs directory")
                    print(f"round {rnd + 1}/{args.rounds}: W={w} ...", file=sys.stderr, flush=True)
                    wait_for_quiet(args.settle)
                    log_dir, elapsed, foreign = launch(w, args, work)
                    if foreign is None or foreign <= BUSY_CORES or attempt == args.retry_busy:
                        break
                    discarded.setdefault(w, []).append(foreign)
                    print(f"  other processes used {foreign:.2f} cores meanwhile: running it again",
                          file=sys.stderr, flush=True)
                launches.setdefault(w, []).append(elapsed)
                others.setdefault(w, []).append(foreign)
                stats = summarize_run(read_timing_logs(log_dir), global_batch=global_batch(args, w),
                                      warmup=args.warmup)
                if stats.workers != w:
                    raise SystemExit(f"launched W={w} but the logs say world_size={stats.workers}")
                runs.append(stats)
    rows = efficiency_table(runs)
    cores = usable_cores()
    table = render_markdown(rows, cores=cores)
    fit, why_not = fit_model(args, rows, cores)
    if fit is not None:
        side = fit_table_markdown(rows, fit, cores=cores)
        fit_section = side + "\n" + fit_text(args, fit)
        pts = fit.model(args.workers)
        model_thr = {p.workers: global_batch(args, p.workers) / (p.step_ms / 1e3) for p in pts}
        shared_thr = {p.workers: global_batch(args, p.workers) * 1e3 / time_shared_ms(p, cores)
                      for p in pts if p.workers > cores}
    else:
        side, fit_section, model_thr, shared_thr = "", f"No fit: {why_not}.\n", None, None
    reading_text = reading_weak(args, rows, fit, cores) if args.weak else reading_strong(args, rows)
    seed_model = model_table_markdown(scaling_model())
    print(table)
    print(side or fit_section)
    print(seed_model)
    scaling = (f"{args.per_rank_batch} samples/rank (weak scaling)" if args.weak
               else f"global batch {args.global_batch} (strong scaling)")
    render_png(rows, png, title=f"examples/train.py --dim {args.dim} --layers {args.layers}, {scaling}, "
                                f"{args.steps} steps ({args.warmup} warm-up), {cores} CPU cores",
               model_throughput=model_thr, model_time_shared=shared_thr, oversubscribed_from=cores + 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report_text(args, table, fit_section, seed_model, launches, others, png.name, argv,
                                    reading_text, discarded))
    print(f"wrote {args.out} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
