"""The ``supervisor`` command: one module per subcommand, each adding its own parser, and the
platforms' own commands (``sbatch``) from :mod:`supervisor.platforms.registry`.

Each subcommand parses its arguments here, at the edge, and calls the library; exit codes:
0 success, 1 a checkpoint problem (the reason is printed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from supervisor import __version__
from supervisor.cli import checkpoints, drill, launch, releases, report, run, status
from supervisor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from supervisor.cli.status import render_final, render_status

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main", "render_final", "render_status"]

# in the order `supervisor --help` lists them (the platforms' commands come before checkpoints)
COMMANDS = (run, launch, drill, status, releases, report)


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
    for extra in _platform_commands():
        # a platform's command parses its own arguments (main() hands them over): listed here only
        sub.add_parser(extra.name, add_help=False, help=extra.help, description=extra.description)
    checkpoints.add_parser(sub)
    for sp in sub.choices.values():
        sp.formatter_class = argparse.ArgumentDefaultsHelpFormatter  # --help shows every default
    return parser


def _platform_commands():
    from supervisor.platforms import registry

    return registry.commands()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    verbose = [a for a in raw[:1] if a in ("-v", "--verbose")]
    named = raw[len(verbose):len(verbose) + 1]
    if named and named[0] in {c.name for c in _platform_commands()}:
        # a platform's command (sbatch): its own options pass through untouched to its own parser
        from supervisor.platforms import registry

        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
        return registry.command(named[0])(raw[len(verbose) + 1:])
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
