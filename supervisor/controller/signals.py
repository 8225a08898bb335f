"""What wakes the controller's loop, and how the job is asked to end (a signal)."""

from __future__ import annotations

import asyncio


class Signals:
    def __init__(self) -> None:
        self.stop = asyncio.Event()
        """A stop was asked for: the job ends (or is handed off) at the loop's next look."""
        self.wake = asyncio.Event()
        """Set by what the loop waits for (a signal, a launch's end; while a recovery waits on the
        ranks, a heartbeat)."""
        self.handoff = False
        """SIGTERM on a platform that keeps the gang through a controller restart: leave it running."""
        self.requested = False
        """The job ends on purpose (a signal): metrics say so, alerts stay quiet."""
        self.linger_cut = False
        """A second signal: the wait for a last scrape after the end is cut short."""
        self.wants_heartbeats = False
        """A recovery waits on the ranks (their stack dumps, an adopted gang's first heartbeats):
        the intake wakes the loop at each accepted heartbeat."""

    @property
    def stopping(self) -> bool:
        return self.stop.is_set()

    def ask_stop(self, *, handoff: bool) -> None:
        self.handoff = handoff
        self.requested = not handoff
        self.stop.set()
        self.wake.set()

    async def stopped_within(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a stop; whether one came."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def sleep(self, seconds: float) -> None:
        """Until the loop's next look: ``seconds``, or what wakes it first."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        try:
            await asyncio.wait_for(self.wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        if not self.stop.is_set():
            self.wake.clear()
