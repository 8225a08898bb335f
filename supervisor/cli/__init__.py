"""The ``supervisor`` command: one module per subcommand, each adding its own parser.

Each subcommand parses its arguments here, at the edge, and calls the library; exit codes:
0 success, 1 a checkpoint problem (the reason is printed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from supervisor import __version__
from supervisor.cli import checkpoints, drill, launch, run, sbatch, status
from supervisor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from supervisor.cli.status import render_final, render_status

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main", "render_final", "render_status"]

# in the order `supervisor --help` lists them
COMMANDS = (run, launch, drill, status, sbatch, checkpoints)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="supervisor",
        description="elastic-supervisor: keeps distributed PyTorch training jobs alive.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    for sp in sub.choices.values():
        sp.formatter_class = argparse.ArgumentDefaultsHelpFormatter  # --help shows every default
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    verbose = [a for a in raw[:1] if a in ("-v", "--verbose")]
    if raw[len(verbose):len(verbose) + 1] == ["sbatch"]:
        # sbatch's own options pass through untouched: its parser lives with the wrapper
        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
        return sbatch.cmd_sbatch(raw[len(verbose) + 1:])
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    return func(args)
