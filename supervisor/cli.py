"""The ``supervisor`` command.

Each subcommand parses its arguments here, at the edge, and calls the library; exit codes:
0 success, 1 a checkpoint problem (the reason is printed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

from supervisor import __version__

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _human_age(seconds: float) -> str:
    if seconds < 0:
        return "in the future"
    for unit, width in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= width:
            return f"{seconds / width:.1f}{unit}"
    return f"{seconds:.0f}s"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


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


def _run_controller(cfg, fresh: bool = False) -> int:
    """Build the job's platform (local, slurm, kubernetes), let it fill in what only it knows, and
    run the controller under it: one runner for every platform."""
    import asyncio

    from supervisor.controller.daemon import Controller
    from supervisor.controller.state import StateError
    from supervisor.platforms.base import PlatformError
    from supervisor.platforms.factory import build_platform

    logging.getLogger("supervisor").setLevel(logging.INFO)
    log_dir = Path(cfg.log_dir).resolve()
    try:
        platform = build_platform(cfg, log_dir)
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


def cmd_run(args: argparse.Namespace) -> int:
    from supervisor.config import ConfigError, load

    try:
        cfg = load(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.allow_fresh_start:
        import dataclasses

        cfg = dataclasses.replace(cfg, restart=dataclasses.replace(cfg.restart, allow_fresh_start=True))
    return _run_controller(cfg, fresh=args.fresh)


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
                     "fork_ranks": not args.no_fork_ranks},
        "checkpoint_dir": args.checkpoint_dir, "log_dir": args.log_dir,
        "heartbeat": {"interval_s": args.heartbeat_interval, "timeout_s": args.heartbeat_timeout},
        "restart": {"budget_s": args.restart_budget, "max_restarts": args.max_restarts,
                    "allow_fresh_start": args.allow_fresh_start, "in_place_restarts": args.in_place_restarts},
        "health": {"phase_floor_s": args.hang_timeout_floor},
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


def _rank0_losses(log_dir: str) -> tuple[dict[int, float], dict[int, int]]:
    """Rank 0's loss per step and the world size it was taken at (a re-run step: the last attempt's)."""
    out: dict[int, float] = {}
    world: dict[int, int] = {}
    try:
        lines = (Path(log_dir) / "ranks" / "rank-0.jsonl").read_text().splitlines()
    except OSError:
        return out, world
    for line in lines:
        rec = json.loads(line)
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
    from supervisor.worker.faults import FaultSpecError, parse_faults

    try:
        parse_faults(args.fault)
        base = load(args.config) if args.config else _launch_config(args)
    except (ConfigError, FaultSpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if base.platform.kind == "slurm" and not (base.platform.slurm.job_id or os.environ.get("SLURM_JOB_ID")):
        print("error: a drill on the slurm platform runs inside its allocation: submit it, e.g. sbatch --no-kill "
              "--nodes=3 --wrap \"supervisor drill --config JOB.yaml --fault ...\" (or set platform.slurm.job_id)",
              file=sys.stderr)
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


def _saved_state(log_dir: str) -> dict | None:
    """The job's state file, for `status` when no supervisor answers; None (with an error
    printed) when it cannot be read."""
    from supervisor.controller.state import STATE_FILE, StateError, load, to_json

    path = Path(log_dir) / STATE_FILE
    try:
        saved = load(path)
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    if saved is None:
        print(f"error: no {path}: no supervisor has run a job with --log-dir {log_dir}", file=sys.stderr)
        return None
    return to_json(saved)


def _status_url(args: argparse.Namespace, saved: dict | None) -> str | None:
    if args.url:
        return args.url.rstrip("/")
    if saved is None or not saved.get("http_port"):
        return None
    host = saved.get("http_host") or ""
    if host in ("0.0.0.0", "::", "[::]", ""):
        # a wildcard listens everywhere: reach it at the host the controller runs on, which the
        # platform recorded (Slurm: the batch host's address, right from a login node); else here
        platform = saved.get("platform")
        host = str((platform.get("batch_addr") if isinstance(platform, dict) else "") or "127.0.0.1")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address in a URL
    return f"http://{host}:{saved['http_port']}"


def render_final(saved: dict, log_dir: str) -> str:
    """A finished (or unattended) job, from its state file and events: what on-call needs."""
    ck = saved.get("last_checkpoint")
    lines = [
        f"job {saved['job']}  phase {saved['phase']}  attempt {saved['attempt']}  run {saved.get('run', 1)}"
        + (f"  exit code {saved['exit_code']}" if "exit_code" in saved else ""),
        f"last checkpoint: {ck['name']} (step {ck['step']})" if ck else "last checkpoint: none",
        f"restored by the last attempt: {saved.get('restored') or saved.get('restore_from') or 'nothing (fresh start)'}",
    ]
    hist = saved.get("history") or {}
    if hist.get("suspects"):
        why = hist.get("suspect_why", {})
        lines += [f"suspect checkpoint: {n}: {why.get(n, '')}" for n in hist["suspects"]]
    if hist.get("excluded"):
        lines.append(f"excluded nodes: {', '.join(hist['excluded'])}")
    if saved.get("stop_reason"):
        lines.append(f"reason: {saved['stop_reason']}")
    events = _read_events(Path(log_dir) / "events.jsonl")
    faults = [e for e in events if e.get("event") == "fault_detected" and e.get("run", 1) == saved.get("run", 1)]
    if faults:
        f = faults[-1]
        lines.append(f"last fault (attempt {f.get('attempt')}): {f.get('kind')} ranks {f.get('ranks')}: {f.get('detail')}")
    return "\n".join(lines).encode(errors="replace").decode()  # a lone surrogate from a file cannot be printed


def _read_events(path: Path) -> list[dict]:
    """The event records of events.jsonl, its archived generations first (events.jsonl.N ... .1:
    it rotates past a size cap); a line that is not a JSON object (torn, garbled, nested too
    deeply) is passed over."""
    from supervisor.files import read_lines

    try:
        lines = list(read_lines(path))
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            e = json.loads(line) if line.strip() else None
        except (ValueError, RecursionError):
            continue
        if isinstance(e, dict):
            events.append(e)
    return events


def _node_state(n: dict) -> str:
    """A node's state as the platform read it: ``running``, ``running (stopped)``, ``waiting
    (capacity: Unschedulable)``, ``exited (OOMKilled)``."""
    if n.get("waiting"):
        return f"waiting ({n['waiting']}{': ' + n['reason'] if n.get('reason') else ''})"
    state = n["state"] + (" (stopped)" if n.get("stopped") else "")
    return state + (f" ({n['reason']})" if n.get("reason") and n["state"] != "running" else "")


def render_status(st: dict) -> str:
    lines = [
        f"job {st['job']}  phase {st['phase']}  attempt {st['attempt']}  world {st['world_size']}  "
        f"alive {st['alive_ranks']}  step rate {st['step_rate']:.2f}/s",
    ]
    ck = st.get("last_checkpoint")
    lines.append(f"last checkpoint: {ck['name']} (step {ck['step']}, {_human_age(ck['age_s'])} ago)" if ck
                 else "last checkpoint: none")
    if st.get("restored") or st.get("restore_from"):
        refused = st.get("restore_refused") or {}
        lines.append(f"restored: {st.get('restored') or '(not yet reported)'}"
                     + (f" (announced {st['restore_from']})" if st.get("restore_from") != st.get("restored") else "")
                     + "".join(f"; refused {n}: {why}" for n, why in refused.items()))
    for name in st.get("suspect_checkpoints") or []:
        lines.append(f"suspect checkpoint: {name}: {(st.get('suspect_why') or {}).get(name, '')}")
    if st.get("excluded_nodes"):
        lines.append(f"excluded nodes: {', '.join(st['excluded_nodes'])}")
    wait = st.get("waiting_for_capacity")
    if wait:
        lines.append(f"waiting for capacity for {_human_age(wait['since_s'])} (no attempt spent): {wait['detail']}")
    lines.append("")
    lines.append(_table(
        [[n["name"], _node_state(n), str(n["pid"]), "-" if n["exit_code"] is None else str(n["exit_code"]),
          (n.get("detail") or "")[:100]] for n in st["nodes"]],
        ["NODE", "STATE", "PID", "EXIT", "DETAIL"]))
    lines.append("")
    lines.append(_table(
        [[str(r["rank"]), r["node"], str(r["step"]), r["phase"], f"{r['phase_s']:.1f}s", f"{r['heartbeat_age_s']:.1f}s",
          f"{r['coll_seq']}{'*' if r['coll_inside'] else ''}", f"{r['straggler_score']:.2f}", r["watchdog"][:40]]
         for r in st["ranks"]],
        ["RANK", "NODE", "STEP", "PHASE", "IN PHASE", "HB AGE", "COLL", "STRAGGLER", "WATCHDOG"]))
    left_out = _ranks_left_out(st.get("ranks_summary"))
    if left_out:
        lines.append(left_out)
    if st["restarts"]:
        lines.append("")
        lines.append(_table(
            [[str(t["attempt_from"]), t["reason"]] + [f"{t['phases'].get(p, 0):.2f}" if p in t["phases"] else "-"
                                                      for p in ("detect", "teardown", "schedule", "rendezvous", "restore", "first_step")]
             + [f"{t['total_s']:.2f}", "yes" if t["within_budget"] else "NO"] for t in st["restarts"]],
            ["FROM", "REASON", "DETECT", "TEARDOWN", "SCHEDULE", "RDZV", "RESTORE", "1ST STEP", "TOTAL", "IN BUDGET"]))
    if st.get("findings"):
        lines.append("")
        lines += [f"finding: {f['kind']} ranks {f['ranks']}: {f['detail']}" for f in st["findings"]]
    rej = {k: v for k, v in st.get("rejected_heartbeats", {}).items() if v}
    if rej:
        lines.append(f"rejected heartbeats: {rej}")
    if st.get("stop_reason"):
        lines.append(f"stopped: {st['stop_reason']} (exit code {st.get('exit_code')})")
    return "\n".join(lines)


def _ranks_left_out(summary: dict | None) -> str:
    """What the rank table above leaves out (``/status`` caps per-rank detail), and how to see it."""
    if not summary or not summary.get("omitted"):
        return ""
    phases = ", ".join(f"{n} {p}" for p, n in sorted(summary.get("by_phase", {}).items()))
    which = {"stalest_and_slowest": f"the {summary.get('worst')} stalest and the {summary.get('worst')} slowest",
             "page": f"ranks from #{summary.get('offset')} ({summary.get('limit')} a page)"}.get(
        summary.get("selection"), "some")
    more = (f"; next page: --ranks-from {summary['next_offset']}" if summary.get("next_offset") is not None else
            "" if summary.get("selection") == "page" else "; every rank: --ranks-from 0 (pages of at most "
            f"{summary.get('page_max')})")
    return (f"{summary['omitted']} of {summary['heard']} ranks not listed (shown: {which}). All ranks: {phases}; "
            f"steps {summary.get('step_min')}..{summary.get('step_max')}; {summary.get('stale')} stale, "
            f"{summary.get('stragglers')} stragglers, oldest heartbeat {summary.get('heartbeat_age_max_s')}s{more}")


def cmd_status(args: argparse.Namespace) -> int:
    """Ask the running supervisor; when none answers, show the job's final (or last known)
    state from its state file and events instead of an error."""
    import urllib.error
    import urllib.request

    from supervisor.controller.decide import TERMINAL, JobPhase

    while True:
        saved = None if args.url else _saved_state(args.log_dir)
        if saved is None and not args.url:
            return EXIT_FAILED
        url = _status_url(args, saved)
        st, error = None, "no HTTP port recorded"
        if url is not None:
            try:
                page = "&".join(f"{k}={v}" for k, v in (("offset", getattr(args, "ranks_from", None)),
                                                             ("limit", getattr(args, "ranks_limit", None)))
                                if v is not None)
                with urllib.request.urlopen(f"{url}/status" + (f"?{page}" if page else ""), timeout=5) as resp:
                    st = json.loads(resp.read())
                if not isinstance(st, dict):
                    st, error = None, f"{url}/status answered a JSON {type(st).__name__}, not a status"
            except (urllib.error.URLError, OSError, ValueError, RecursionError) as exc:
                error = str(exc)[:300]
        if st is None:
            if saved is None:
                print(f"error: no supervisor answering at {url}: {error}", file=sys.stderr)
                return EXIT_FAILED
            if args.json:
                print(json.dumps(saved, indent=1))
            else:
                if JobPhase(saved["phase"]) not in TERMINAL:
                    print(f"warning: the job is not finished but no supervisor answers at {url} ({error}); its "
                          "last recorded state follows. Run the same supervisor command again to adopt the gang.",
                          file=sys.stderr)
                print(render_final(saved, args.log_dir))
            return EXIT_OK
        if args.json:
            print(json.dumps(st, indent=1))
        else:
            try:
                text = render_status(st)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                # whatever listens on the port the state file names is not this job's supervisor
                print(f"error: what answers at {url}/status is not this job's supervisor ({type(exc).__name__}: "
                      f"{str(exc)[:200]})", file=sys.stderr)
                return EXIT_FAILED
            if args.watch:
                print("\033[2J\033[H", end="")
            print(text)
        if not args.watch:
            return EXIT_OK
        time.sleep(args.interval)


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
    p.add_argument("--port", type=int, default=0, help="HTTP port for /metrics and /status (0: a free one)")
    p.add_argument("--metrics-linger", type=float, default=15.0, metavar="SECONDS",
                   help="after the job ends keep serving /metrics this long for a last scrape, only if a scraper "
                   "has been seen (otherwise the command returns at once)")
    _add_run_args(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the training command")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fresh", action="store_true",
                   help="start a new run even if LOG_DIR holds the state of an unfinished one (or an unreadable "
                   "state): what is left of its gang is stopped first and the old state is kept beside the new one. "
                   "Without it, an unfinished run is continued (its live gang adopted)")
    p.add_argument("--allow-fresh-start", action="store_true",
                   help="let the job train from scratch when it has had checkpoints but none is usable any more "
                   "(default: stop in stopped_no_checkpoint, exit 6, so that no progress is thrown away)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="supervisor",
        description="elastic-supervisor: keeps distributed PyTorch training jobs alive.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run the supervisor daemon for a job described by a YAML config",
                       description="Run the controller: launch the gang, watch heartbeats, recover from faults. "
                       "Exit code: 0 completed, 3 stopped by the progress guard, 4 max restarts, 5 no capacity, "
                       "6 no usable checkpoint left, 1 failed/stopped, 2 bad config or the job's state refused "
                       "(another controller runs it, or its state file is unreadable: see --fresh).")
    p.add_argument("--config", required=True, metavar="JOB.yaml", help="the job config (see examples/job.yaml)")
    _add_run_args(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "launch", help="torchrun-like shortcut: run a job on this machine under the supervisor",
        description="Run COMMAND on the local platform under the supervisor, like torchrun but with hang "
        "detection, verified checkpoints and elastic relaunch. Example: supervisor launch --nnodes 1:2 "
        "--slots 3 --nproc-per-node 1 --checkpoint-dir ckpt -- python examples/train.py --steps 200",
    )
    _add_launch_args(p)
    p.set_defaults(func=cmd_launch)

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

    p = sub.add_parser("status", help="show a running job: nodes, ranks, phases, heartbeats, restarts")
    p.add_argument("--log-dir", default="supervisor-logs", help="the job's log dir (finds the HTTP port)")
    p.add_argument("--url", help="the supervisor's HTTP address instead, e.g. http://127.0.0.1:9400")
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    p.add_argument("--interval", type=float, default=2.0, help="refresh period for --watch")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument("--ranks-from", type=int, metavar="K", help="list the ranks from rank #K in rank order (a page; "
                   "without it a large job lists only its stalest and slowest ranks)")
    p.add_argument("--ranks-limit", type=int, metavar="N", help="ranks in that page (at most 1024)")
    p.set_defaults(func=cmd_status)

    sub.add_parser(
        "sbatch", add_help=False, help="submit a job to Slurm under the supervisor (supervisor sbatch --help)",
        description="supervisor sbatch --nodes N [--min-nodes M] [--time T] [sbatch options] -- COMMAND ...")

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
    for sp in [*sub.choices.values(), *ck_sub.choices.values()]:
        sp.formatter_class = argparse.ArgumentDefaultsHelpFormatter  # --help shows every default
    return parser


def cmd_sbatch(argv: Sequence[str]) -> int:
    """supervisor sbatch [ours] [sbatch options] -- COMMAND...: check what can be checked before
    submitting (time limit, warning, node count against the partition), then submit the
    self-contained batch script (the job config inline: the command is argv in JSON, no shell
    ever sees it) or, with --dry-run, print it."""
    import os
    import shlex

    from supervisor.config import ConfigError, from_dict, load_raw
    from supervisor.platforms.base import PlatformError
    from supervisor.platforms.slurm import (node_count_problem, parse_time_limit, partition_sizes, render_batch_script,
                                            sbatch_partitions, submit, warning_problems)

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

        raw = base | {
            "job": given(args.job, "job", "job"), "command": command,
            "nproc_per_node": given(args.nproc_per_node, "nproc_per_node", 1), "nodes": nodes,
            "platform": plat | {"kind": "slurm", "host": args.host, "nodes": 0, "slurm": slurm},
            "checkpoint_dir": str(Path(given(args.checkpoint_dir, "checkpoint_dir", "checkpoints")).resolve()),
            "log_dir": str(Path(given(args.log_dir, "log_dir", "supervisor-logs")).resolve()),
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    verbose = [a for a in raw[:1] if a in ("-v", "--verbose")]
    if raw[len(verbose):len(verbose) + 1] == ["sbatch"]:
        # sbatch's own options pass through untouched: its parser lives with the wrapper
        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
        return cmd_sbatch(raw[len(verbose) + 1:])
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
