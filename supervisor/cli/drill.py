"""``supervisor drill``: the job run twice, a control and one with faults, and their loss paths compared."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, _table
from supervisor.cli.launch import _add_launch_args, _launch_config
from supervisor.cli.run import _run_controller
from supervisor.protocol import ranklog


def _rank0_losses(log_dir: str) -> tuple[dict[int, float], dict[int, int]]:
    """Rank 0's loss per step and the world size it was taken at (a re-run step: the last attempt's)."""
    out: dict[int, float] = {}
    world: dict[int, int] = {}
    for rec in ranklog.read_log(Path(log_dir) / ranklog.RANKS_DIR / ranklog.log_name(0)):
        if rec.get("loss") is not None:
            out[rec["step"]] = rec["loss"]
            world[rec["step"]] = rec.get("world_size", 0)
    return out, world


def cmd_drill(args: argparse.Namespace) -> int:
    """Run the job twice (control, then with faults) and compare the loss paths.

    On the slurm platform (``--config`` with ``platform.kind: slurm``) both runs go, one after
    the other, to the allocation this command runs in (``sbatch --no-kill -N3 --wrap 'supervisor
    drill ...'``): the nodes it has beyond ``nodes.max`` are the spares."""
    import dataclasses
    import os

    from supervisor.config import ConfigError, load
    from supervisor.platforms import registry
    from supervisor.worker.faults import FaultSpecError, parse_faults

    try:
        parse_faults(args.fault)
        base = load(args.config) if args.config else _launch_config(args)
    except (ConfigError, FaultSpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    problem = registry.drill_problem(base, os.environ)  # e.g. Slurm: only inside its allocation
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if any(a in ("--checkpoint-dir", "--log-dir") for a in base.command):
        print("error: leave --checkpoint-dir/--log-dir out of the command: the drill gives each run its own "
              "(the job reads SUPERVISOR_CHECKPOINT_DIR and SUPERVISOR_LOG_DIR)", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} is not empty; a drill needs fresh directories", file=sys.stderr)
        return EXIT_USAGE
    runs = {}
    for name, fault in (("control", None), ("drill", args.fault)):
        env = {k: v for k, v in base.env.items() if k != "SUPERVISOR_FAULT"}
        if fault:
            env["SUPERVISOR_FAULT"] = fault
        # each run its own job name too: it names the run's Slurm steps (sv-JOB-aK-NODE) and its
        # rendezvous ids, so nothing the control left in the allocation is taken for the drill's
        cfg = dataclasses.replace(base, log_dir=str(out / name / "logs"), checkpoint_dir=str(out / name / "ckpt"),
                                  job=f"{base.job[:64 - len(name) - 1]}-{name}",
                                  env=env, http=dataclasses.replace(base.http, port=0), metrics_linger_s=0.0,
                                  intake=dataclasses.replace(base.intake, port=0))
        print(f"== {name}" + (f" with SUPERVISOR_FAULT={fault}" if fault else " (no fault)"), flush=True)
        runs[name] = (cfg, _run_controller(cfg))
        print(f"   {name} exited with {runs[name][1]}", flush=True)
    (control, control_world), (drill, drill_world) = (_rank0_losses(runs["control"][0].log_dir),
                                                      _rank0_losses(runs["drill"][0].log_dir))
    common = sorted(set(control) & set(drill))
    identical = sum(1 for s in common if control[s] == drill[s])

    def rel(s: int) -> float:
        return abs(drill[s] - control[s]) / max(abs(control[s]), 1e-12)

    # steps taken at another world size (a node lost without a spare) cannot be bit-identical:
    # they are compared within --resize-tolerance, and the report says so
    resized = [s for s in common if drill_world.get(s) != control_world.get(s)]
    same = [s for s in common if s not in resized]
    worst = max((rel(s) for s in same), default=0.0 if common else float("inf"))
    worst_resized = max((rel(s) for s in resized), default=0.0)
    missing = sorted(set(control) - set(drill))
    print()
    print(_table([[str(len(control)), str(len(drill)), str(len(common)), str(identical), f"{worst:.3g}",
                   str(missing[:5]) if missing else "-"]],
                 ["CONTROL STEPS", "DRILL STEPS", "COMPARED", "BIT-IDENTICAL", "MAX REL DIFF", "MISSING"]))
    try:
        events = [json.loads(line) for line in
                  (Path(runs["drill"][0].log_dir) / "events.jsonl").read_text().splitlines()]
    except OSError:
        events = []
    for f in (e for e in events if e["event"] == "fault_detected"):
        print(f"fault (attempt {f['attempt']}): {f['kind']} ranks {f['ranks']} nodes {f['nodes']}: {f['detail']}")
    relaunched = [e for e in events if e["event"] == "launched" and e.get("attempt", 0) > 0]
    launches = [e for e in events if e["event"] == "launched"]
    for e in relaunched:
        before = next((b for b in reversed(launches) if b.get("attempt", 0) < e["attempt"]), None)
        size = "" if before is None else f" (was {before['world_size']})"
        print(f"relaunch (attempt {e['attempt']}): nodes {e['nodes']}, world size {e['world_size']}{size}, from "
              f"{e.get('restore_from') or 'scratch'}" + (f"; excluded {e['excluded']}" if e.get("excluded") else ""))
    restarts = [e for e in events if e["event"] == "restart_complete"]
    if restarts:
        phases = ("detect", "teardown", "schedule", "rendezvous", "restore", "first_step")
        print()
        print(_table([[str(e["attempt"]), e["reason"], *[f"{e['phases'].get(p, 0):.2f}" for p in phases],
                       f"{e['total_s']:.2f}", "yes" if e["within_budget"] else "NO"] for e in restarts],
                     ["ATTEMPT", "REASON", *[p.upper() for p in phases], "TOTAL S", "IN BUDGET"]))
    faults = [e for e in events if e["event"] == "fault_detected"]
    # a drill whose fault never fired rehearsed nothing: that is a failure, not a pass
    rehearsed = bool(faults) and bool(relaunched) and bool(restarts)
    ok = (runs["control"][1] == 0 and runs["drill"][1] == 0 and not missing and bool(common)
          and worst <= args.tolerance and worst_resized <= args.resize_tolerance and rehearsed)
    print()
    if resized:
        worlds = sorted({drill_world[s] for s in resized})
        print(f"{len(resized)} steps ran at world size {'/'.join(map(str, worlds))} (control: "
              f"{control_world.get(resized[0])}): compared within relative tolerance {args.resize_tolerance:g} "
              f"(--resize-tolerance), not bit for bit; max rel diff {worst_resized:.3g}")
    if not rehearsed:
        print("drill FAILED: nothing was rehearsed: " + (
            "the fault never fired (no fault detected; check its step, rank and attempt against the job)"
            if not faults else "no restart completed after the fault"))
    print("drill PASSED: the resumed job took the steps the uninterrupted one took" if ok else
          "drill FAILED: see above (exit codes, missing steps, or a loss path outside the tolerance)")
    return EXIT_OK if ok else EXIT_FAILED


def add_parser(sub) -> None:
    p = sub.add_parser(
        "drill", help="rehearse recovery: run the job uninterrupted, then with faults; compare loss paths",
        description="Runs the job twice under the supervisor, each in its own directories under --out: a "
        "control with no fault and a drill with SUPERVISOR_FAULT set to --fault. Prints the loss-path "
        "comparison (rank 0's loss per step) and every restart's phase timings. Exit 0 if both runs "
        "completed, the fault fired and a restart completed, and the loss paths agree within --tolerance "
        "(steps taken at another world size: --resize-tolerance). Rank faults (kill, stop, hang, crash, nan, "
        "skip-collective) and node faults (node-kill: every process of the rank's node; node-stop: the node "
        "frozen); with a spare slot (--slots above MAX) the job keeps its size, without one it continues "
        "smaller. Example: supervisor drill --nnodes 1:2 --slots 2 --fault 'kind=node-kill,rank=1,step=13,"
        "attempt=0' -- python examples/train.py --steps 30 --checkpoint-every 5. On Slurm, both runs go to the "
        "allocation the drill runs in (a --config with platform.kind slurm; the nodes beyond nodes.max are the "
        "spares): sbatch --no-kill --nodes=3 --wrap \"supervisor drill --config drill.yaml --fault ...\"",
    )
    p.add_argument("--config", metavar="JOB.yaml", help="a job config (instead of the launch options)")
    p.add_argument("--fault", required=True, help="the SUPERVISOR_FAULT spec of the drill run (see README)")
    p.add_argument("--out", default="drill-out", help="where both runs keep checkpoints and logs (must be empty)")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="largest relative loss difference accepted at the control's world size (0: bit-identical, "
                   "as expected on CPU)")
    p.add_argument("--resize-tolerance", type=float, default=1e-4,
                   help="largest relative loss difference accepted for steps the drill took at another world size "
                   "(a node lost without a spare): a different reduction order cannot be bit-identical")
    _add_launch_args(p)
    p.set_defaults(func=cmd_drill)
