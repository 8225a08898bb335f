"""The advised checkpoint interval against the best one found by search, on simulated failures.

    python benchmarks/goodput_interval.py [--days 30] [--seeds 64] [--seed 0]
        [--out docs/benchmarks/goodput_interval.md]

For each scenario (a save cost C, a restart cost R, a mean time between failures M, and for
an asynchronous save its background persist time P), a month of training is replayed
against random failures (exponential, mean M, in wall time: during training, saves and
restarts alike): the work since the last completed save is lost at each failure, each
restart costs R (and is itself interrupted by a failure in it). The supervisor's advice is
computed the way ``supervisor report`` does (:func:`supervisor.reports.goodput.advise`), from
what a first simulated month at a naive interval "measured": its faults over its wall time
(the fitted M), its mean save cost and restart cost. Then a grid of intervals is searched for
the one that loses least on the same random failures (common random numbers: each interval
sees the same seeds), and the table compares:

* ``loss advised / loss best``: the baseline is the best interval of the search, measured in
  the same run; a ratio near 1.00 means the advice is as good as searching;
* the simulated ETTR at the advised interval against the ETTR the model predicts for it.

Pure simulation (numpy, seeded): no clock, no I/O but the report. Each failed attempt's
lost time is drawn from the exponential conditioned on failing before the attempt's end, so
one draw per failure, not per second: a month at a one-minute interval is fast.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import git_state  # noqa: E402

from supervisor.reports import goodput  # noqa: E402

LLAMA_M = goodput.PRIOR_MTBF_S
NAIVE_S = 1800.0
"""The interval a user picks by guess (and the one the fitted advice starts from)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    c: float
    """Save cost: the seconds a save blocks training."""
    r: float
    """Restart cost (seconds)."""
    m: float
    """Mean time between failures (seconds)."""
    persist: float = 0.0
    """An asynchronous save's background persist time: the next save cannot start before it."""


SCENARIOS = (
    Scenario("Llama 3 rate, 5 s blocking save", 5.0, 60.0, LLAMA_M),
    Scenario("Llama 3 rate, 0.2 s async save, 30 s persist", 0.2, 60.0, LLAMA_M, 30.0),
    Scenario("Llama 3 rate, 2 min blocking save", 120.0, 60.0, LLAMA_M),
    Scenario("1 h MTBF, 30 s save, 5 min restart", 30.0, 300.0, 3600.0),
    Scenario("12 h MTBF, 60 s save, 2 min restart", 60.0, 120.0, 12 * 3600.0),
)


def _truncated_exp(rng: np.random.Generator, m: float, upper: np.ndarray) -> np.ndarray:
    """Times to failure given a failure before ``upper`` (the exponential's inverse CDF)."""
    u = rng.random(upper.shape)
    return -m * np.log1p(-u * -np.expm1(-upper / m))


def _restarts(rng: np.random.Generator, n: int, r: float, m: float) -> tuple[float, int]:
    """The wall time of ``n`` restarts (each interrupted by failures in it and begun again)."""
    if n == 0:
        return 0.0, 0
    p_ok = math.exp(-r / m)
    fails = rng.geometric(p_ok, size=n) - 1  # failed tries before the one that finishes
    k = int(fails.sum())
    lost = float(_truncated_exp(rng, m, np.full(k, r)).sum()) if k else 0.0
    return n * r + lost, k


def simulate(tau: float, s: Scenario, work: float, seed: int) -> dict[str, float]:
    """A job of ``work`` seconds of training, saving every ``tau`` seconds of it."""
    rng = np.random.default_rng(seed)
    tau = max(tau, s.persist, 1e-3)
    n = math.ceil(work / tau)
    seg = np.full(n, tau)
    seg[-1] = work - tau * (n - 1)
    need = seg + s.c  # a segment is kept once its save completes
    # failures in a segment before one try of it gets through (geometric), and what each cost
    fails = rng.geometric(np.exp(-need / s.m)) - 1
    k = int(fails.sum())
    lost = float(_truncated_exp(rng, s.m, np.repeat(need, fails)).sum()) if k else 0.0
    restart_wall, restart_fails = _restarts(rng, k, s.r, s.m)
    wall = float(need.sum()) + lost + restart_wall
    return {"wall": wall, "faults": k + restart_fails, "saves": n, "restarts": k}


def mean_loss(tau: float, s: Scenario, work: float, seeds: list[int]) -> tuple[float, float]:
    walls = [simulate(tau, s, work, seed)["wall"] for seed in seeds]
    wall = float(np.mean(walls))
    return wall - work, work / wall


def advice_for(s: Scenario, work: float, seed: int) -> goodput.Advice:
    """What ``supervisor report`` would advise after a month at a naive 30-minute interval:
    its faults and wall time, save and restart costs as the controller would have seen them."""
    naive = simulate(NAIVE_S, s, work, seed)
    b = goodput.Breakdown(0, wall_s=naive["wall"], faults=int(naive["faults"]))
    b.save_blocked_s = [s.c]
    b.restart_totals_s = [s.r]
    return goodput.advise(b, persist_s=s.persist)


def run(days: float, n_seeds: int, seed0: int) -> tuple[list[list[str]], list[float]]:
    work = days * 86400.0
    seeds = [seed0 + 1000 + i for i in range(n_seeds)]
    rows, ratios = [], []
    for s in SCENARIOS:
        adv = advice_for(s, work, seed0)
        lo = max(s.persist, s.c / 4, 5.0)
        grid = np.geomspace(lo, 8 * math.sqrt(2 * s.c * s.m) + 600, 48)
        losses = [(mean_loss(float(t), s, work, seeds)[0], float(t)) for t in grid]
        best_loss, best_tau = min(losses)
        adv_loss, adv_ettr = mean_loss(adv.advised_s, s, work, seeds)
        predicted = goodput.predicted_ettr(adv.advised_s, c=s.c, r=s.r, m=adv.mtbf_s)
        naive_loss, _ = mean_loss(NAIVE_S, s, work, seeds)
        ratio = adv_loss / best_loss
        ratios.append(ratio)
        rows.append([s.name, f"{adv.mtbf_s / 3600:.2f} h", f"{adv.young_s / 60:.1f} min",
                     f"{adv.advised_s / 60:.1f} min", f"{best_tau / 60:.1f} min", f"{adv_loss / 3600:.1f} h",
                     f"{best_loss / 3600:.1f} h", f"{ratio:.3f}", f"{naive_loss / best_loss:.2f}",
                     f"{100 * adv_ettr:.2f}%", f"{100 * predicted:.2f}%"])
    return rows, ratios


HEAD = ["scenario", "fitted M", "Young", "advised (Daly)", "best by search", "loss advised", "loss best",
        "advised / best", "every 30 min / best", "ETTR simulated", "ETTR predicted"]


def table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--days", type=float, default=30.0, help="days of training each replay does (default 30)")
    ap.add_argument("--seeds", type=int, default=64, help="replays per interval (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the report to this markdown file")
    args = ap.parse_args(argv)
    if not (args.days > 0 and args.seeds > 0):
        ap.error("--days and --seeds must be > 0")
    rows, ratios = run(args.days, args.seeds, args.seed)
    report = "\n".join([
        "# The advised checkpoint interval against the best found by search",
        "",
        f"`python benchmarks/goodput_interval.py --days {args.days:g} --seeds {args.seeds} --seed {args.seed}` "
        f"(commit {git_state('supervisor/reports')}). Each interval replays {args.days:g} days of training on "
        f"{args.seeds} seeds of exponential failures (common random numbers); the advice is fitted from a first "
        "simulated month at a 30-minute interval, as `supervisor report` fits it from a job's events.",
        "",
        table(rows),
        "",
        f"Worst ratio: {max(ratios):.3f} (loss at the advised interval over the loss at the best of a 48-point "
        "search; the search's best is itself noisy, so a ratio a little under 1 can happen).",
    ])
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
