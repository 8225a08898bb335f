"""The rank's own watchdog: notices a phase or collective running past its timeout.

When it fires it dumps every thread's Python stack (``faulthandler``, which works even while
the main thread is stuck in C code) into ``LOG_DIR/stacks-rank-R.txt``, records the event in
the rank state (the next heartbeat carries it, with the dump's path) and logs it. It never
kills on its own: killing is the supervisor's decision (the abort order), so evidence is
always captured first. One dump per stuck episode; a new episode starts when the phase or
the collective changes.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from supervisor.protocol import PHASE_COLLECTIVE
from supervisor.worker.telemetry import RankState

log = logging.getLogger("supervisor.worker")


def dump_stacks(path: Path | None, reason: str) -> str:
    """Append every thread's stack to ``path`` (stderr if None); returns where it went."""
    header = f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} pid={os.getpid()} {reason}\n"
    if path is None:
        os.write(2, header.encode())
        faulthandler.dump_traceback(all_threads=True)
        return "<stderr>"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(header)
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
    return str(path)


class Watchdog:
    def __init__(
        self,
        state: RankState,
        timeouts: dict[str, float],
        stack_path: Path | None,
        on_fire: Callable[[str], None] | None = None,
        poll_s: float = 0.25,
    ) -> None:
        self.state = state
        self.timeouts = timeouts
        self.stack_path = stack_path
        self.on_fire = on_fire
        self.poll_s = poll_s
        self.fired: list[str] = []
        self._episode: tuple | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> str | None:
        """One pass; returns the event text when it fires (exposed for tests)."""
        s = self.state.snapshot()
        limit = self.timeouts.get(s.phase)
        if limit is None or s.phase_s <= limit:
            if self._episode is not None and self._episode[:2] != (s.phase, s.coll_seq):
                self._episode = None
            return None
        episode = (s.phase, s.coll_seq, s.step)
        if self._episode == episode:
            return None
        self._episode = episode
        what = f"{s.coll_op} #{s.coll_seq}" if s.phase == PHASE_COLLECTIVE else s.phase
        event = f"{what} running {s.phase_s:.1f}s > {limit:.0f}s at step {s.step}"
        where = dump_stacks(self.stack_path, f"watchdog: {event}")
        self.state.watchdog = event
        self.state.stack_file = where
        self.fired.append(event)
        log.error("event=watchdog_fired %s stacks=%s", event, where)
        if self.on_fire is not None:
            self.on_fire(event)
        return event

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - the watchdog must outlive its own bugs
                log.warning("event=watchdog_error error=%s", exc)
