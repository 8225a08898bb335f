"""``supervisor checkpoints list|verify|prune``: inspect, verify and prune a checkpoint root."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, _human_age, _human_bytes, _saved_state, _table


def _root_errors(func):
    """A checkpoints command on a root that cannot be listed says so (exit 1), never a traceback."""
    import functools

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        from supervisor.checkpoint import CheckpointError

        try:
            return func(args)
        except CheckpointError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED

    return run


@_root_errors
def cmd_checkpoints_list(args: argparse.Namespace) -> int:
    from supervisor.checkpoint import candidates, in_flight, verify
    from supervisor.checkpoint.discovery import refusal

    root = Path(args.dir)
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=sys.stderr)
        return EXIT_FAILED
    rows, records = [], []
    now = time.time()
    level = "full" if args.full else "fast"
    for cand in candidates(root):
        try:
            m = verify(cand.path, level)
            rec = {
                "name": cand.name, "step": m.global_step, "status": "complete",
                "writer_world_size": m.writer_world_size, "bytes": m.total_bytes,
                "age_s": round(now - m.created_unix, 1), "verification": f"ok ({level})",
            }
        except Exception as exc:  # noqa: BLE001 - a damaged checkpoint is a FAILED row, never a traceback
            rec = {
                "name": cand.name, "step": cand.step, "status": "invalid", "writer_world_size": None,
                "bytes": None, "age_s": None,
                "verification": f"FAILED: {refusal(exc)}",
            }
        records.append(rec)
    for tmp in in_flight(root):
        try:
            age = round(now - tmp.lstat().st_mtime, 1)
        except OSError:  # finished or removed meanwhile
            continue
        records.append({
            "name": tmp.name, "step": None, "status": "in-flight/partial", "writer_world_size": None,
            "bytes": None, "age_s": age, "verification": "not published",
        })
    if args.json:
        print(json.dumps(records, indent=1))
        return EXIT_OK
    if not records:
        print(f"no checkpoints under {root}")
        return EXIT_OK
    for r in records:
        rows.append([
            r["name"], "-" if r["step"] is None else str(r["step"]), r["status"],
            "-" if r["writer_world_size"] is None else str(r["writer_world_size"]),
            "-" if r["bytes"] is None else _human_bytes(r["bytes"]),
            "-" if r["age_s"] is None else _human_age(r["age_s"]), r["verification"],
        ])
    print(_table(rows, ["NAME", "STEP", "STATUS", "WORLD", "SIZE", "AGE", "VERIFICATION"]))
    return EXIT_OK


@_root_errors
def cmd_checkpoints_verify(args: argparse.Namespace) -> int:
    from supervisor.checkpoint import candidates, latest_complete, verify
    from supervisor.checkpoint.discovery import refusal

    root = Path(args.dir)
    level = "full" if args.full else "fast"
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=sys.stderr)
        return EXIT_FAILED
    if args.step is None and candidates(root) == [] and (root / "manifest.json").exists():
        targets = [root]  # DIR is itself one checkpoint
    elif args.step is None:
        # exit 0 only when the newest checkpoint verifies: a FAILED line never comes with 0
        found = latest_complete(root, level)
        for s in found.skipped:
            print(f"FAILED {s.name}: {s.reason}")
        if found.checkpoint is None:
            print(f"error: no checkpoint under {root} verifies ({level})", file=sys.stderr)
            return EXIT_FAILED
        c = found.checkpoint
        print(f"OK {c.name}: step {c.step}, {len(c.manifest.files)} files, "
              f"{_human_bytes(c.manifest.total_bytes)} verified ({level})")
        if found.skipped:
            print(f"error: the newest checkpoint ({found.skipped[0].name}) fails verification; a restore would fall "
                  f"back to {c.name} (step {c.step})", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    else:
        targets = [c.path for c in candidates(root) if c.step == args.step]
        if not targets:
            print(f"error: no checkpoint for step {args.step} under {root}", file=sys.stderr)
            return EXIT_FAILED
    status = EXIT_OK
    for path in targets:
        try:
            m = verify(path, level)
            print(f"OK {path.name}: step {m.global_step}, {len(m.files)} files, "
                  f"{_human_bytes(m.total_bytes)} verified ({level})")
        except Exception as exc:  # noqa: BLE001 - a damaged checkpoint is a FAILED line, never a traceback
            print(f"FAILED {path.name}: {refusal(exc)}")
            status = EXIT_FAILED
    return status


@_root_errors
def cmd_checkpoints_prune(args: argparse.Namespace) -> int:
    from supervisor.checkpoint import prune

    root = Path(args.dir)
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=sys.stderr)
        return EXIT_FAILED
    protect: set[str] = set()
    suspects: set[str] = set()
    if args.log_dir:
        # the supervisor's own record: the checkpoint its attempt restores from, and the
        # suspects it keeps as evidence, are never deleted under it; a suspect never counts
        # toward --keep either (as in the job's own pruning)
        saved = _saved_state(args.log_dir)
        if saved is None:
            return EXIT_FAILED
        suspects = set((saved.get("history") or {}).get("suspects", []))
        protect = {n for n in (saved.get("restore_from"), saved.get("restored")) if n} | suspects
        if protect:
            print(f"protected by the supervisor's state: {', '.join(sorted(protect))}")
    else:
        print("note: without --log-dir, the checkpoint a supervised job restores from and its suspect ones are not "
              "protected", file=sys.stderr)
    try:
        result = prune(root, args.keep, dry_run=args.dry_run, remove_partial=args.remove_partial,
                       partial_grace_s=args.partial_grace, protect=protect, known_bad=suspects)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verb = "would remove" if args.dry_run else "removed"
    for name in result.removed + result.removed_partial:
        print(f"{verb} {name}")
    for s in result.failed:
        print(f"kept as evidence {s.name}: {s.reason}")
    for s in result.skipped:
        print(f"skipped {s.name}: {s.reason}")
    print(f"kept {len(result.kept)}, {verb} {len(result.removed)} complete and "
          f"{len(result.removed_partial)} partial")
    return EXIT_OK



def add_parser(sub) -> None:
    ck = sub.add_parser(
        "checkpoints", help="inspect, verify and prune checkpoints",
        description="Inspect, verify and prune the checkpoints under a checkpoint root. "
        "'fast' verification checks the manifest, paths and sizes; '--full' also recomputes "
        "every checksum.",
    )
    ck.set_defaults(func=lambda _args: (ck.print_help(), EXIT_USAGE)[1])
    ck_sub = ck.add_subparsers(dest="ck_command", metavar="ACTION")
    p = ck_sub.add_parser("list", help="one line per checkpoint: step, status, world size, size, age, verification")
    p.add_argument("dir", metavar="DIR", help="checkpoint root")
    p.add_argument("--full", action="store_true", help="verify checksums too (reads every byte)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_checkpoints_list)

    p = ck_sub.add_parser(
        "verify", help="verify the newest checkpoint (or --step N); exit 1 with the reason if it fails",
        description="Without --step: verify the newest checkpoint; if it fails, say why and which older one "
        "a restore would fall back to. Exit 0 only when the newest verifies, 1 when it fails (even if an "
        "older one verifies) or none does. With --step N: verify that step's checkpoints (exit 1 if any "
        "fails). DIR may also be one checkpoint directory.",
    )
    p.add_argument("dir", metavar="DIR", help="checkpoint root, or one checkpoint directory")
    p.add_argument("--step", type=int, help="verify the checkpoint(s) of this global step")
    p.add_argument("--full", action="store_true", help="recompute every checksum (reads every byte)")
    p.add_argument("--strict", action="store_true", help=argparse.SUPPRESS)  # the default now: kept for old scripts
    p.set_defaults(func=cmd_checkpoints_verify)

    p = ck_sub.add_parser(
        "prune", help="keep the newest K complete checkpoints, delete older ones",
        description="Delete complete checkpoints beyond the newest K (K >= 2). Never deletes the "
        "newest one that passes full verification (checksums), one that fails verification (kept as "
        "evidence), a save in flight, or (with --log-dir) what the supervisor's state names.",
    )
    p.add_argument("dir", metavar="DIR", help="checkpoint root")
    p.add_argument("--keep", type=int, required=True, metavar="K", help="complete checkpoints to keep (>= 2)")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    p.add_argument("--remove-partial", action="store_true",
                   help="also remove partial saves whose writer is dead (same host) or older than --partial-grace")
    p.add_argument("--partial-grace", type=float, default=3600.0, metavar="SECONDS",
                   help="age after which a partial save counts as abandoned (default 3600)")
    p.add_argument("--log-dir", metavar="LOG_DIR",
                   help="the job's supervisor log dir: never delete the checkpoint its state restores from, nor "
                   "the suspects it keeps as evidence")
    p.set_defaults(func=cmd_checkpoints_prune)
    for sp in ck_sub.choices.values():
        sp.formatter_class = argparse.ArgumentDefaultsHelpFormatter  # --help shows every default
