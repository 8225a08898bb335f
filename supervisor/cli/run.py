"""``supervisor run --config JOB.yaml``, and the one runner every command that runs a job uses."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from supervisor.cli.common import EXIT_FAILED, EXIT_USAGE


def _run_controller(cfg, fresh: bool = False) -> int:
    """Build the job's platform (its kind's builder, :mod:`supervisor.platforms.registry`), let it
    fill in what only it knows, and run the controller under it: one runner for every platform."""
    import asyncio

    from supervisor.controller.daemon import Controller
    from supervisor.controller.state import StateError
    from supervisor.platforms import registry
    from supervisor.platforms.base import PlatformError

    logging.getLogger("supervisor").setLevel(logging.INFO)
    log_dir = Path(cfg.log_dir).resolve()
    try:
        platform = registry.build(cfg, log_dir)
        cfg = platform.prepare(cfg)
    except PlatformError as exc:
        print(f"error: {cfg.platform.kind}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(platform.banner(cfg), file=sys.stderr)

    async def main() -> int:
        return await platform.supervise(Controller(cfg, platform, fresh=fresh))

    try:
        return asyncio.run(main())
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PlatformError as exc:
        print(f"error: {cfg.platform.kind}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - say what state things are in, then let it show
        logging.getLogger("supervisor").exception(
            "event=controller_crashed: the gang (if any) is still running; run the same command again to adopt it "
            "(state: %s)", log_dir / "supervisor-state.json")
        return 1


def _check_workers(cfg) -> int:
    """``supervisor run --check``: build the job's platform and ask the cluster whether it accepts
    the workers the first launch would make, making nothing (Kubernetes: a server-side dry run of
    one worker pod: schema, admission, PodSecurity, quota). What ``helm test`` runs."""
    import asyncio

    from supervisor.controller.daemon import Controller
    from supervisor.platforms import registry
    from supervisor.platforms.base import PlatformError

    log_dir = Path(cfg.log_dir).resolve()
    try:
        platform = registry.build(cfg, log_dir)
    except PlatformError as exc:
        print(f"error: {cfg.platform.kind}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        cfg = platform.prepare(cfg)
        slots = platform.slots()
        if not slots:
            print(f"error: {cfg.platform.kind}: no node slot to place a worker on (no Ready, schedulable node "
                  "matches the workers' node selector)", file=sys.stderr)
            return EXIT_FAILED
        spec = Controller(cfg, platform).executor.launch_spec(slots[:cfg.nodes.max])
        warnings = asyncio.run(platform.check_workers(spec))
    except PlatformError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        close = getattr(platform, "close", None)
        if close is not None:
            close()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"ok: the {cfg.platform.kind} platform accepts the workers of job {cfg.job} "
          f"({len(spec.nodes)} node(s) x {cfg.nproc_per_node}); nothing was made")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from supervisor.config import ConfigError, load

    try:
        cfg = load(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        return _check_workers(cfg)
    if args.allow_fresh_start:
        import dataclasses

        cfg = dataclasses.replace(cfg, restart=dataclasses.replace(cfg.restart, allow_fresh_start=True))
    return _run_controller(cfg, fresh=args.fresh)


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fresh", action="store_true",
                   help="start a new run even if LOG_DIR holds the state of an unfinished one (or an unreadable "
                   "state): what is left of its gang is stopped first and the old state is kept beside the new one. "
                   "Without it, an unfinished run is continued (its live gang adopted)")
    p.add_argument("--allow-fresh-start", action="store_true",
                   help="let the job train from scratch when it has had checkpoints but none is usable any more "
                   "(default: stop in stopped_no_checkpoint, exit 6, so that no progress is thrown away)")



def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run the supervisor daemon for a job described by a YAML config",
                       description="Run the controller: launch the gang, watch heartbeats, recover from faults. "
                       "Exit code: 0 completed, 3 stopped by the progress guard, 4 max restarts, 5 no capacity, "
                       "6 no usable checkpoint left, 1 failed/stopped, 2 bad config or the job's state refused "
                       "(another controller runs it, or its state file is unreadable: see --fresh).")
    p.add_argument("--config", required=True, metavar="JOB.yaml", help="the job config (see examples/job.yaml)")
    p.add_argument("--check", action="store_true",
                   help="do not run the job: ask the platform whether it accepts the workers the first launch would "
                   "make, making nothing (Kubernetes: a server-side dry run of one worker pod, so the schema, "
                   "admission, PodSecurity and quota all answer), print the verdict and exit 0 (accepted) or 1 "
                   "(refused, with the cluster's words). What the chart's `helm test` runs")
    _add_run_args(p)
    p.set_defaults(func=cmd_run)
