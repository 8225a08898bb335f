"""``supervisor report``: the job's goodput (its effective training time ratio and where the
rest of its wall time went) and the checkpoint interval its own failures advise, read from its
log directory (:mod:`supervisor.reports.goodput`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from supervisor.files import read_json_lines as read_events
from supervisor.reports import goodput


def cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.log_dir) / "events.jsonl"
    if not path.exists():
        print(f"error: no events in {args.log_dir} ({path} is missing): give the job's --log-dir", file=sys.stderr)
        return EXIT_USAGE
    for name, value in (("--mtbf-hours", args.mtbf_hours), ("--restart-s", args.restart_s),
                        ("--persist-s", 0.0 if args.persist_s is None else args.persist_s)):
        if not (value >= 0 and value < 1e9) or (name == "--mtbf-hours" and value == 0):
            print(f"error: {name} {value}: must be a finite number > 0 (>= 0 for --persist-s and --restart-s)",
                  file=sys.stderr)
            return EXIT_USAGE
    acc = goodput.Accountant()
    for ev in read_events(path):
        acc.feed(ev)
    try:
        runs, total = acc.breakdowns(acc.newest_unix() if args.to_last_event else time.time())
    except goodput.GoodputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    given = args.mtbf_hours != goodput.PRIOR_MTBF_S / 3600
    advice = goodput.advise(total, prior_mtbf_s=args.mtbf_hours * 3600,
                            prior_source="prior: --mtbf-hours" if given else goodput.PRIOR_SOURCE,
                            prior_restart_s=args.restart_s, persist_s=args.persist_s)
    if args.json:
        print(json.dumps({"runs": [b.to_dict() for b in runs], "total": total.to_dict(), "advice": advice.to_dict()},
                         indent=1))
    else:
        print(goodput.render_table(runs, total, advice, until=(
            "not finished: counted to its last event (--to-last-event)" if args.to_last_event else
            "still running (or its controller died without a word): counted to now; --to-last-event counts it to "
            "its last event")))
    if args.png:
        goodput.render_png(runs, args.png, title=f"{Path(args.log_dir).resolve().name}: ETTR {100 * total.ettr:.1f}% "
                           f"over {len(runs)} run(s), {total.faults} fault(s)")
        if not args.json:
            print(f"\ntimeline written to {args.png}")
    return EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="goodput: the share of wall time that trained, badput by cause, and the "
                       "checkpoint interval the job's own failures advise",
                       description="Add up where the job's wall time went (productive training; start-up, waiting "
                       "for capacity, restarts, restores, save stalls, steps recomputed after a restore), per run and "
                       "over every run of the log directory, from its events.jsonl; then fit the job's failure rate "
                       "and advise the checkpoint interval that loses least (Young's and Daly's formulas), with the "
                       "ETTR predicted at the current interval and at the advised one.")
    p.add_argument("--log-dir", default="supervisor-logs", help="the job's log dir")
    p.add_argument("--png", metavar="PATH", help="also write a timeline of the runs as a PNG%(default).0s")
    p.add_argument("--json", action="store_true", help="print the breakdown and the advice as JSON")
    p.add_argument("--to-last-event", action="store_true",
                   help="count a run that has not finished to its last event, not to now (its controller died)")
    p.add_argument("--mtbf-hours", type=float, default=goodput.PRIOR_MTBF_S / 3600, metavar="H",
                   help="the mean time between failures to assume while the job has had fewer than "
                   f"{goodput.MIN_FAULTS} faults of its own (the default is Llama 3's pre-training fleet's)")
    p.add_argument("--restart-s", type=float, default=goodput.PRIOR_RESTART_S, metavar="S",
                   help="the restart cost to assume before a restart was measured")
    p.add_argument("--persist-s", type=float, default=None, metavar="S",
                   help="an asynchronous save's background persist time: the advised interval is never shorter "
                   "(default: what the job's asynchronous saves took, as its ranks reported it%(default).0s)")
    p.set_defaults(func=cmd_report)
