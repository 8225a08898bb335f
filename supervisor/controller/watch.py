"""The controller's look at the checkpoint root, made off the event loop.

Every ``POLL_S`` a worker thread lists the root and fast-verifies what is new
(:class:`~supervisor.checkpoint.cache.VerifiedCache`: published checkpoints never change); a
decision that needs the newest checkpoint (a launch, a relaunch, the end) waits for a full look
(:meth:`CheckpointWatch.look`). The loop only takes in what a look found: the controller applies
each :class:`~supervisor.checkpoint.cache.Scan` to its state.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path
from typing import Callable, Iterable

from supervisor.checkpoint.cache import Scan, VerifiedCache

log = logging.getLogger("supervisor.controller")
POLL_S = 2.0


class CheckpointWatch:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.usable: list[str] = []
        """The checkpoints that verified at the last full look, newest first (suspects included:
        the decisions skip them, and need to know one exists)."""
        self.writers: dict[str, str] = {}
        """The release that wrote each of them (their manifests'; "" when none is named)."""
        self.times: collections.deque[float] = collections.deque(maxlen=8)
        """When the last checkpoints were published (metrics: the interval)."""
        self.rebase = False
        """A root was adopted: this attempt's progress counts from what the next look finds there."""
        self._cache = VerifiedCache()
        self._scan: asyncio.Future | None = None  # a periodic look under way (a worker thread)
        self._last_poll = 0.0

    def soon(self) -> None:
        """Look again at the next poll, not ``POLL_S`` after the last."""
        self._last_poll = -POLL_S

    def poll(self, root: Path, suspects: Iterable[str]) -> Scan | None:
        """The periodic look: what the last one found once it is done (to take in), and a new one
        started when it is time."""
        found = self._collect(root)
        now = self.clock()
        if self._scan is None and now - self._last_poll >= POLL_S:
            self._last_poll = now
            self._scan = asyncio.ensure_future(asyncio.to_thread(self._cache.scan, root, exclude=list(suspects)))
        return found

    async def look(self, root: Path, suspects: Iterable[str]) -> list[Scan]:
        """Look now, with every usable checkpoint verified, and wait for it (in a worker thread):
        the scans to take in, in order (a periodic one that was under way first)."""
        out = []
        if self._scan is not None:
            await asyncio.wait([self._scan])
            found = self._collect(root)
            if found is not None:
                out.append(found)
        self._last_poll = self.clock()
        try:
            out.append(self._took(root, await asyncio.to_thread(self._cache.scan, root, exclude=list(suspects),
                                                                usable=True)))
        except Exception as exc:  # noqa: BLE001 - a bad checkpoint root must not stop the controller
            log.warning("event=checkpoint_scan_failed root=%s error=%s", root, exc)
            self.usable, self.writers = [], {}
        return out

    def _took(self, root: Path, scan: Scan) -> Scan:
        if scan.usable is not None and scan.root == root:
            self.usable = list(scan.usable)
            self.writers = dict(scan.writers)
        return scan

    def _collect(self, root: Path) -> Scan | None:
        task = self._scan
        if task is None or not task.done():
            return None
        self._scan = None
        try:
            return self._took(root, task.result())
        except Exception as exc:  # noqa: BLE001 - a bad checkpoint root must not stop the controller
            log.warning("event=checkpoint_scan_failed root=%s error=%s", root, exc)
            return None
