"""``supervisor releases`` and ``supervisor release allow``: the job's versions as its ledger
keeps them (``LOG_DIR/releases/ledger.json``), and the operator's word that a rejected one may run
again. Both read files only: they work whether or not the job's controller is running."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from supervisor.cli.common import EXIT_OK, EXIT_USAGE, _table
from supervisor.controller import release_store, releases


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(unix)) if unix else "-"


def _load(log_dir: str) -> releases.Ledger | None:
    try:
        return release_store.load(Path(log_dir))
    except release_store.ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def render(ledger: releases.Ledger) -> str:
    """The versions, oldest first: state (the running one starred), when released, steps trained,
    checkpoints written, what it runs; then why each rejected one was, and the rollbacks."""
    rows = []
    for vid, rec in ledger.releases.items():
        ckpts = f"{len(rec.checkpoints)} (newest {rec.checkpoints[-1]})" if rec.checkpoints else "0"
        rows.append([("* " if vid == ledger.current else "  ") + vid, rec.state, _when(rec.released_unix),
                     str(rec.steps), ckpts, rec.version.summary()])
    lines = [_table(rows, ["  VERSION", "STATE", "RELEASED", "STEPS", "CHECKPOINTS", "RUNS"]),
             "(* the version the job runs now)"]
    for vid, rec in ledger.releases.items():
        if rec.state == releases.REJECTED:
            lines.append(f"rejected {vid} at {_when(rec.state_unix)}: {rec.why}")
        elif rec.allowed:
            lines.append(f"allowed again {vid}: {rec.why}")
    good = ledger.known_good
    lines.append(f"known-good: {good.version.id}" if good else "known-good: none yet")
    if ledger.rollbacks:
        last = ledger.last_rollback or {}
        lines.append(f"rollbacks: {ledger.rollbacks} ({', '.join(f'{k} {v}' for k, v in ledger.rollback_reasons.items())})"
                     + (f"; the newest at {_when(last['unix'])}: {last['from']} -> {last['to']} ({last['reason']})"
                        if last else ""))
    return "\n".join(lines)


def cmd_releases(args: argparse.Namespace) -> int:
    ledger = _load(args.log_dir)
    if ledger is None:
        return EXIT_USAGE
    if args.json:
        print(json.dumps(ledger.to_saved(), indent=1))
    elif not ledger.releases:
        # not an error: a job started before releases were recorded, or never run here
        print(f"no release recorded in {args.log_dir} (its ledger is {release_store.releases_dir(Path(args.log_dir))}"
              f"/{release_store.LEDGER_FILE}: the job's controller writes it at its start)")
    else:
        print(render(ledger))
    return EXIT_OK


def resolve(ledger: releases.Ledger, given: str) -> str:
    """The version ``given`` names (an id or a unique prefix of one); ValueError saying why not."""
    if given in ledger.releases:
        return given
    matches = [vid for vid in ledger.releases if vid.startswith(given)] if given else []
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(f"{vid} ({rec.state})" for vid, rec in ledger.releases.items()) or "none"
    if matches:
        raise ValueError(f"{given!r} names several versions ({', '.join(matches)}): give more of the id")
    raise ValueError(f"no version {given!r} in this job's ledger; its versions: {known}")


def cmd_allow(args: argparse.Namespace) -> int:
    ledger = _load(args.log_dir)
    if ledger is None:
        return EXIT_USAGE
    try:
        vid = resolve(ledger, args.version)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    rec = ledger.releases[vid]
    if rec.state != releases.REJECTED:
        print(f"error: version {vid} is {rec.state}, not rejected: there is nothing to allow", file=sys.stderr)
        return EXIT_USAGE
    try:
        mark = release_store.ask_allow(Path(args.log_dir), vid)
    except OSError as exc:
        print(f"error: cannot write the allow mark in {args.log_dir}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"version {vid} is allowed again ({mark}); it was rejected for: {rec.why}\n"
          "This takes effect at the job's next start: run its command again (on Kubernetes, restart the "
          "controller's pod). The version is then on probation again, and rolled back again if it still cannot train.")
    return EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("releases", help="list the job's versions: state, steps trained, checkpoints, why rejected",
                       description="List every version of the job its controller recorded (a version is what the "
                       "ranks run: command, env, code; on Kubernetes the image), oldest first, with its state "
                       "(probation, known_good, rejected), the steps it trained, the checkpoints it wrote, and why a "
                       "rejected one was rejected.")
    p.add_argument("--log-dir", default="supervisor-logs", help="the job's log dir")
    p.add_argument("--json", action="store_true", help="print the ledger as saved")
    p.set_defaults(func=cmd_releases)
    r = sub.add_parser("release", help="act on one version of the job (allow a rejected one to run again)",
                       description="Act on one version of the job.")
    rsub = r.add_subparsers(dest="release_command", metavar="ACTION", required=True)
    a = rsub.add_parser("allow", help="let a rejected version run again at the job's next start",
                        description="Let a rejected version run again: at the job's next start it is on probation "
                        "once more (rolled back again if it still cannot train). VERSION is its id, or a unique "
                        "prefix of it (`supervisor releases` lists them).")
    a.add_argument("version", metavar="VERSION")
    a.add_argument("--log-dir", default="supervisor-logs", help="the job's log dir")
    a.set_defaults(func=cmd_allow)
