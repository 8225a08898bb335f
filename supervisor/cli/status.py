"""``supervisor status``: a running job from its controller's /status, a finished one from its state file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, _human_age, _saved_state, _table
from supervisor.files import read_json_lines as _read_events
from supervisor.reports import goodput


def _status_url(args: argparse.Namespace, saved: dict | None) -> str | None:
    if args.url:
        return args.url.rstrip("/")
    if saved is None or not saved.get("http_port"):
        return None
    host = saved.get("http_host") or ""
    if host in ("0.0.0.0", "::", "[::]", ""):
        # a wildcard listens everywhere: reach it at the host the controller runs on, as its
        # platform recorded it (Slurm: the batch host's address, right from a login node); else here
        from supervisor.platforms import registry

        host = registry.reached_at(saved.get("platform")) or "127.0.0.1"
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
    try:
        from supervisor.controller import release_store, releases

        ledger = release_store.load(Path(log_dir))
    except release_store.ReleaseError as exc:
        lines.append(f"release: {exc}")
    else:
        if ledger.current:
            # (the job's probation length is its config's, which the state file does not hold)
            lines.append(release_line(releases.summary(ledger, releases.Policy()) | {"probation_steps": None}))
    events = _read_events(Path(log_dir) / "events.jsonl")
    acc = goodput.Accountant()
    for e in events:
        acc.feed(e)
    try:  # (no controller answers: a run still open ended at its last event)
        _, total = acc.breakdowns(acc.newest_unix(), spans=False)
    except goodput.GoodputError:
        pass
    else:
        lines.append(goodput_line(goodput.summary(total, goodput.advise(total))))
    faults = [e for e in events if e.get("event") == "fault_detected" and e.get("run", 1) == saved.get("run", 1)]
    if faults:
        f = faults[-1]
        lines.append(f"last fault (attempt {f.get('attempt')}): {f.get('kind')} ranks {f.get('ranks')}: {f.get('detail')}")
    return "\n".join(lines).encode(errors="replace").decode()  # a lone surrogate from a file cannot be printed


def release_line(rel: dict) -> str:
    """The running release in one line: its version and state, what it trained, the known-good one."""
    state = rel.get("state") or "?"
    if state == "probation":
        of = f"/{rel['probation_steps']}" if rel.get("probation_steps") else ""
        state = f"on probation ({rel.get('steps', 0)}{of} steps trained)"
    good = rel.get("known_good")
    line = f"release: {rel['version']} {state}" + (f"; known-good: {good}" if good and good != rel["version"] else "")
    if rel.get("rollbacks"):
        line += f"; rollbacks: {rel['rollbacks']} ({', '.join(f'{k} {v}' for k, v in rel['rollback_reasons'].items() if v)})"
    if rel.get("rejected"):
        line += f"; rejected: {', '.join(rel['rejected'])} (`supervisor releases` says why)"
    return line


def goodput_line(g: dict) -> str:
    """The job's goodput so far in one line: ETTR, the biggest causes of badput, and the
    checkpoint interval now against the advised one (``supervisor report`` has the rest)."""
    bad = sorted(((v, k) for k, v in (g.get("badput_s") or {}).items() if v and v >= 0.5), reverse=True)[:3]
    line = f"goodput: ETTR {100 * g['ettr']:.1f}% of {_human_age(g['wall_s'])}"
    if bad:
        line += " (badput: " + ", ".join(f"{k.replace('_', ' ')} {_human_age(v)}" for v, k in bad) + ")"

    def at(seconds: float | None, steps: int | None) -> str:
        return _human_age(seconds) + (f" = {steps} steps" if steps else "")

    if g.get("advised_interval_s") is not None:
        now = g.get("current_interval_s")
        line += (f"; checkpoint every {at(now, g.get('current_steps'))}" if now is not None else "; checkpoint") + \
            f", advised {at(g['advised_interval_s'], g.get('advised_steps'))}"
        if g.get("ettr_predicted_advised") is not None:
            line += f" (predicted ETTR {100 * g['ettr_predicted_advised']:.1f}%"
            if g.get("ettr_predicted_now") is not None:
                line += f" against {100 * g['ettr_predicted_now']:.1f}% now"
            line += ")"
    return line + "; `supervisor report` has the breakdown"


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
    if (st.get("release") or {}).get("version"):
        lines.append(release_line(st["release"]))
    if st.get("goodput"):
        lines.append(goodput_line(st["goodput"]))
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


def add_parser(sub) -> None:
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
