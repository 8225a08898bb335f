"""``supervisor sbatch``: the Slurm platform's own command (the registry offers it under
``supervisor``). It parses its own arguments, so that sbatch's options pass through untouched:
check what can be checked before submitting, then submit the self-contained batch script."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from supervisor.platforms.base import PlatformError
from supervisor.platforms.slurm.client import partition_sizes
from supervisor.platforms.slurm.sbatch import (node_count_problem, parse_time_limit, render_batch_script,
                                               sbatch_partitions, submit, warning_problems)

# the supervisor command's exit codes
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str]) -> int:
    """supervisor sbatch [ours] [sbatch options] -- COMMAND...: check what can be checked before
    submitting (time limit, warning, node count against the partition), then submit the
    self-contained batch script (the job config inline: the command is argv in JSON, no shell
    ever sees it) or, with --dry-run, print it."""
    import os
    import shlex

    from supervisor.config import ConfigError, from_dict, load_raw

    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        head, command = argv[:cut], argv[cut + 1:]
    else:
        head, command = argv, []
    p = argparse.ArgumentParser(
        prog="supervisor sbatch", description="Submit COMMAND to Slurm under the supervisor: one sbatch "
        "--no-kill allocation of --min-nodes to --nodes nodes, the supervisor on the batch host, one torchrun agent "
        "per node as an srun step. Options this command does not know go to sbatch as given. Prints the job id.",
        epilog="example: supervisor sbatch --nodes 4 --min-nodes 2 --time 2:00:00 --partition gpu -- "
        "python train.py --steps 1000")
    p.add_argument("--nodes", "-N", type=int, help="most nodes the job runs on (nodes.max; default: from --config)")
    p.add_argument("--min-nodes", type=int, default=0, help="fewest nodes worth running (nodes.min; default: "
                   "--nodes, or --config's without --nodes). Slurm gets --nodes=MIN-MAX and starts the job on what "
                   "it has")
    p.add_argument("--time", "-t", help="sbatch time limit, e.g. 2:00:00 (every field after the first in range)")
    p.add_argument("--nproc-per-node", type=int, default=None)
    p.add_argument("--job", "--job-name", "-J", dest="job", default=None, help="job name (Slurm's and the supervisor's)")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--config", metavar="JOB.yaml", help="a base job config; the options above override it")
    p.add_argument("--host", default="auto", help="the address the nodes reach the supervisor at (default: the "
                   "batch host's NodeAddr)")
    p.add_argument("--warning-seconds", type=int, default=120,
                   help="ask Slurm for the warning signal this long before the time limit (sbatch --signal); must "
                   "cover restart.kill_grace_s + platform.slurm.kill_confirm_s (+ command_timeout_s with --requeue)")
    p.add_argument("--checkpoint-seconds", type=float, default=None, metavar="S",
                   help="how long the ranks take to write their checkpoint: refused if longer than restart.kill_grace_s")
    p.add_argument("--requeue", action="store_true", help="sbatch --requeue, and requeue the job after the warning "
                   "signal's emergency checkpoint: it resumes from the newest verified checkpoint")
    p.add_argument("--heartbeat-timeout", type=float, default=None)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment for the ranks")
    p.add_argument("--python", default=sys.executable, help="the python that runs the supervisor on the batch host")
    p.add_argument("--dry-run", action="store_true", help="print the self-contained batch script (save it and "
                   "submit it with sbatch as is); submit nothing")
    args, sbatch_opts = p.parse_known_args(head)
    stray = [a for a in sbatch_opts if not a.startswith("-")]
    if stray and not all(i > 0 and sbatch_opts[i - 1].startswith("-") and "=" not in sbatch_opts[i - 1]
                         for i, a in enumerate(sbatch_opts) if not a.startswith("-")):
        print(f"error: unexpected arguments {stray}: put the training command after --", file=sys.stderr)
        return EXIT_USAGE
    if not command:
        print("error: give the training command after --", file=sys.stderr)
        return EXIT_USAGE
    try:
        # the same bounded reader as `supervisor run --config` (size, alias expansion)
        base = load_raw(args.config) if args.config else {}
        base.pop("command", None)

        def section(value, name: str) -> dict:
            if value is None:
                return {}
            if not isinstance(value, dict):
                raise ConfigError(f"{args.config}: {name}: must be a mapping")
            return dict(value)

        env = section(base.get("env"), "env")
        for item in args.env:
            k, sep, v = item.partition("=")
            if not sep:
                raise ConfigError(f"--env {item!r}: need KEY=VALUE")
            env[k] = v
        plat = section(base.get("platform"), "platform")
        slurm = section(plat.get("slurm"), "platform.slurm")
        slurm["requeue_on_warning"] = args.requeue or slurm.get("requeue_on_warning", False)
        nodes = section(base.get("nodes"), "nodes")
        if args.nodes is not None:  # (the base config's other nodes.* settings stay)
            nodes |= {"min": args.min_nodes or args.nodes, "max": args.nodes}
        elif args.min_nodes:
            nodes["min"] = args.min_nodes
        if "max" not in nodes:
            raise ConfigError("give --nodes (or nodes.max in --config)")

        def given(value, key: str, default):
            return value if value is not None else base.get(key, default)

        def path(value, key: str, default) -> str:
            where = given(value, key, default)
            if not isinstance(where, str) or not where:
                raise ConfigError(f"{args.config}: {key}: must be a path (a non-empty string), not {where!r:.60}")
            return str(Path(where).resolve())

        raw = base | {
            "job": given(args.job, "job", "job"), "command": command,
            "nproc_per_node": given(args.nproc_per_node, "nproc_per_node", 1), "nodes": nodes,
            "platform": plat | {"kind": "slurm", "host": args.host, "nodes": 0, "slurm": slurm},
            "checkpoint_dir": path(args.checkpoint_dir, "checkpoint_dir", "checkpoints"),
            "log_dir": path(args.log_dir, "log_dir", "supervisor-logs"),
            "intake": section(base.get("intake"), "intake") | {"host": args.host},
            "http": section(base.get("http"), "http") | {"host": args.host}, "env": env,
        }
        if args.heartbeat_timeout is not None:
            raw["heartbeat"] = section(base.get("heartbeat"), "heartbeat") | {"timeout_s": args.heartbeat_timeout}
        cfg = from_dict(raw)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # what can be checked before submitting: a bad value here would reach Slurm and fail (or pend) later
    problems = []
    time_limit_s = None
    if args.time is not None:
        try:
            time_limit_s = parse_time_limit(args.time)
        except ValueError as exc:
            problems.append(str(exc))
    problems += warning_problems(cfg, warning_s=args.warning_seconds, time_limit_s=time_limit_s,
                                 requeue=args.requeue, checkpoint_s=args.checkpoint_seconds)
    sc = cfg.platform.slurm
    try:
        sizes, default = partition_sizes(env=os.environ, timeout=sc.command_timeout_s,
                                         sinfo=str(Path(sc.bin_dir) / "sinfo") if sc.bin_dir else "sinfo")
    except PlatformError as exc:
        print(f"supervisor sbatch: node count not checked against the partition (sinfo: {exc})", file=sys.stderr)
    else:
        problem = node_count_problem(cfg.nodes.max, sbatch_partitions(sbatch_opts, os.environ), sizes, default)
        if problem:
            problems.append(problem)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        print("supervisor sbatch: nothing submitted", file=sys.stderr)
        return EXIT_USAGE
    try:  # an option with a line break is refused: it would end the script's comment line
        rendered = render_batch_script(cfg, time_limit=args.time, warning_s=args.warning_seconds,
                                       requeue=args.requeue, sbatch_opts=sbatch_opts, python=args.python,
                                       workdir=str(Path.cwd()))
    except PlatformError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(rendered.script, end="")
        print(f"supervisor sbatch: dry run, nothing submitted. The script above is self-contained: save it (e.g. as "
              f"{cfg.job}.sbatch) and submit it with: mkdir -p {shlex.quote(str(rendered.output_dir))} && "
              f"{rendered.sbatch_command_text} {cfg.job}.sbatch", file=sys.stderr)
        return EXIT_OK
    try:
        job_id = submit(rendered, timeout=max(60.0, sc.command_timeout_s))
    except PlatformError as exc:
        print(f"error: sbatch: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(job_id)
    print(f"supervisor sbatch: job {job_id} submitted ({rendered.record_dir}/{cfg.job}-{job_id}.sbatch); events in "
          f"{cfg.log_dir}/events.jsonl", file=sys.stderr)
    return EXIT_OK
