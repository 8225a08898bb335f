"""``supervisor launch``: torchrun-like arguments, the job run on this machine."""

from __future__ import annotations

import argparse
import sys

from supervisor.cli.common import EXIT_USAGE
from supervisor.cli.run import _add_run_args, _run_controller


def _launch_config(args: argparse.Namespace):
    """A JobConfig from torchrun-like arguments; raises ConfigError with a message."""
    from supervisor.config import ConfigError, from_dict

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("give the training command after --")
    nnodes = "1" if args.standalone else args.nnodes
    lo, _, hi = nnodes.partition(":")
    try:
        nmin, nmax = int(lo), int(hi or lo)
    except ValueError:
        raise ConfigError(f"--nnodes {nnodes!r} is not N or MIN:MAX") from None
    if nmin > nmax:
        raise ConfigError(f"--nnodes {nnodes}: MIN ({nmin}) is above MAX ({nmax})")
    nproc = args.nproc_per_node
    if nproc == "auto":  # torchrun's meaning: one rank per GPU, else per CPU
        import os

        try:
            import torch

            nproc = torch.cuda.device_count() if torch.cuda.is_available() else (os.cpu_count() or 1)
        except ImportError:
            nproc = os.cpu_count() or 1
    try:
        nproc = int(nproc)
    except ValueError:
        raise ConfigError(f"--nproc-per-node {args.nproc_per_node!r} is not a number or 'auto'") from None
    raw = {
        "job": args.job, "command": command, "nproc_per_node": nproc,
        "nodes": {"min": nmin, "max": nmax},
        "platform": {"kind": "local", "nodes": args.slots or nmax, "warm_agents": not args.no_warm_agents,
                     "fork_ranks": not args.no_fork_ranks, "rendezvous_backend": args.rendezvous_backend},
        "checkpoint_dir": args.checkpoint_dir, "log_dir": args.log_dir,
        "heartbeat": {"interval_s": args.heartbeat_interval, "timeout_s": args.heartbeat_timeout,
                      "aggregate": not args.no_aggregate},
        "restart": {"budget_s": args.restart_budget, "max_restarts": args.max_restarts,
                    "allow_fresh_start": args.allow_fresh_start, "in_place_restarts": args.in_place_restarts},
        "health": {"phase_floor_s": args.hang_timeout_floor},
        "instrument": {"enabled": not args.no_instrument},
        "release": {"rollback": not args.no_rollback, "probation_steps": args.probation_steps,
                    "code_dir": args.code_dir},
        "http": {"port": args.port},
        "metrics_linger_s": args.metrics_linger,
    }
    try:
        return from_dict(raw)
    except ConfigError as exc:
        # say it in the words the user typed: the flag, not the config field behind it
        msg = str(exc)
        for path, flag, value in _FLAGS:
            if msg.startswith(path + ":") or msg.startswith(path + " "):
                raise ConfigError(f"{flag} {getattr(args, value)}{msg[len(path):]}") from None
        raise


# config field -> the launch flag that sets it (and the argparse attribute holding its value)
_FLAGS = (
    ("platform.nodes", "--slots", "slots"), ("nodes.min", "--nnodes", "nnodes"), ("nodes.max", "--nnodes", "nnodes"),
    ("nproc_per_node", "--nproc-per-node", "nproc_per_node"), ("job", "--job", "job"),
    ("checkpoint_dir", "--checkpoint-dir", "checkpoint_dir"), ("log_dir", "--log-dir", "log_dir"),
    ("heartbeat.interval_s", "--heartbeat-interval", "heartbeat_interval"),
    ("heartbeat.timeout_s", "--heartbeat-timeout", "heartbeat_timeout"),
    ("restart.budget_s", "--restart-budget", "restart_budget"), ("restart.max_restarts", "--max-restarts", "max_restarts"),
    ("health.phase_floor_s", "--hang-timeout-floor", "hang_timeout_floor"), ("http.port", "--port", "port"),
    ("metrics_linger_s", "--metrics-linger", "metrics_linger"), ("port", "--port", "port"),
    ("release.probation_steps", "--probation-steps", "probation_steps"),
    ("platform.rendezvous_backend", "--rendezvous-backend", "rendezvous_backend"),
    ("restart.in_place_restarts", "--in-place-restarts", "in_place_restarts"),
)


def cmd_launch(args: argparse.Namespace) -> int:
    from supervisor.config import ConfigError

    try:
        cfg = _launch_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _run_controller(cfg, fresh=args.fresh)

def _add_launch_args(p: argparse.ArgumentParser) -> None:
    # torchrun's spellings are accepted where they mean the same thing (--nproc_per_node,
    # --nproc-per-node auto, --standalone, --max_restarts)
    p.add_argument("--nnodes", default="1", metavar="MIN:MAX", help="node count, N or a range MIN:MAX (as torchrun)")
    p.add_argument("--standalone", action="store_true", help="one node (as torchrun's --standalone: --nnodes 1)")
    p.add_argument("--slots", type=int, default=0, help="node slots on this machine, spares included (0: MAX)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1", metavar="N|auto",
                   help="ranks per node; 'auto' as torchrun: one per GPU, else one per CPU")
    p.add_argument("--job", default="local", help="job name (labels metrics and events)")
    p.add_argument("--checkpoint-dir", default="checkpoints", help="checkpoint root (also passed to ranks)")
    p.add_argument("--log-dir", default="supervisor-logs",
                   help="events, state, the job's output (attempt-K/NODE.log, lines prefixed [rankN]:), stack dumps")
    p.add_argument("--heartbeat-interval", type=float, default=1.0, metavar="SECONDS", help="how often ranks report")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="a rank silent this long is dead")
    p.add_argument("--hang-timeout-floor", type=float, default=30.0, metavar="SECONDS",
                   help="hang timeouts are calibrated from step times but never below this")
    p.add_argument("--restart-budget", type=float, default=900.0, metavar="SECONDS",
                   help="fault to first resumed step, at most (past it the job is flagged, not stopped)")
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=20,
                   help="restarts before the job stops in stopped_max_restarts (exit 4); unlike torchrun's, each "
                   "restart is the supervisor's: detect, keep evidence, tear down, relaunch from a verified checkpoint")
    p.add_argument("--in-place-restarts", type=int, default=0, metavar="N",
                   help="let each node's torchrun agent restart a crashed or aborted rank in place, up to N times per "
                   "launch, instead of tearing the gang down (the supervisor still picks the checkpoint and tears "
                   "down when the cheap path fails); 0: every restart is a full relaunch")
    p.add_argument("--no-warm-agents", action="store_true",
                   help="start every node's torchrun agent cold (default: one per slot is started ahead, when the job "
                   "starts and when a fault is found, so a launch does not wait for its import of torch)")
    p.add_argument("--no-fork-ranks", action="store_true",
                   help="start every rank as a new Python interpreter, as plain torchrun does (default: a node's "
                   "Python ranks are forked from its agent with torch already imported, so neither a start nor a "
                   "restart in place pays `import torch` per rank)")
    p.add_argument("--no-aggregate", action="store_true",
                   help="every rank sends its own heartbeats to the supervisor (default: each node's agent relays its "
                   "ranks' heartbeats, one frame per node and interval, so the supervisor reads one datagram per node)")
    p.add_argument("--rendezvous-backend", choices=("auto", "c10d", "static"), default="auto",
                   help="how each launch's agents form the gang: c10d (torch's dynamic rendezvous: every agent joins "
                   "one store), static (the supervisor hands each agent its node rank: no join contends), auto "
                   "(static from platform.static_rendezvous_nodes, 256, nodes up; default)")
    p.add_argument("--no-instrument", action="store_true",
                   help="do not watch ranks whose script lacks the worker SDK (default: such a rank gets heartbeats, "
                   "its step count and its collectives' progress from torch's optimizer hook and flight recorder, "
                   "stacks on request and its crash reported, so a hang is found and its culprit named)")
    p.add_argument("--no-rollback", action="store_true",
                   help="a new version of the job that cannot train ends the job (default: it is rejected and the "
                   "job goes back to the last known-good version, from a checkpoint that version's code can read)")
    p.add_argument("--probation-steps", type=int, default=20, metavar="N",
                   help="steps a new version must train with no fault of its own before it is the job's known-good "
                   "version (default 20)")
    p.add_argument("--code-dir", default="", metavar="DIR",
                   help="the folder of the training code: hashed into the version and copied for a rollback "
                   "(default: the entry script's folder)")
    p.add_argument("--port", type=int, default=0, help="HTTP port for /metrics and /status (0: a free one)")
    p.add_argument("--metrics-linger", type=float, default=15.0, metavar="SECONDS",
                   help="after the job ends keep serving /metrics this long for a last scrape, only if a scraper "
                   "has been seen (otherwise the command returns at once)")
    _add_run_args(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the training command")



def add_parser(sub) -> None:
    p = sub.add_parser(
        "launch", help="torchrun-like shortcut: run a job on this machine under the supervisor",
        description="Run COMMAND on the local platform under the supervisor, like torchrun but with hang "
        "detection, verified checkpoints and elastic relaunch. Example: supervisor launch --nnodes 1:2 "
        "--slots 3 --nproc-per-node 1 --checkpoint-dir ckpt -- python examples/train.py --steps 200",
    )
    _add_launch_args(p)
    p.set_defaults(func=cmd_launch)
