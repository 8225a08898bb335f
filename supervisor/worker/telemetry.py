"""What a rank is doing right now: step, phase, collectives in flight, last step's timings.

Written by the training thread (and by collective completion callbacks, under a lock), read
by the heartbeat and watchdog threads. Reads take a consistent snapshot under the same lock;
writes are a few attribute stores, so the training loop pays microseconds per phase change.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from supervisor.protocol import (MEDIAN_MIN_STEPS, MEDIAN_STEPS, PHASE_CHECKPOINT, PHASE_COLLECTIVE, PHASE_COMPUTE,
                                 PHASE_FAILED, PHASE_IDLE, PHASE_INIT, PHASE_RESTORE, SOURCE_SDK)


@dataclass(frozen=True)
class Snapshot:
    step: int
    phase: str
    phase_s: float
    coll_seq: int
    coll_op: str
    coll_inside: bool
    coll_s: float
    last_data_s: float
    last_compute_s: float
    last_collective_s: float
    last_step_s: float
    ckpt_step: int
    ckpt_state: str
    ckpt_s: float
    ckpt_persist_s: float
    loss_ok: bool
    watchdog: str
    stack_file: str
    error: str
    error_peer: bool
    ckpt_root: str
    restore_state: str
    restored: str
    restore_refused: tuple[tuple[str, str], ...]
    restore_s: float
    steps_done: int
    first_step_s: float
    outcome: str
    dump_seq: int
    source: str
    coll_group: str
    coll_groups: str
    trace_file: str
    loop_step_s: float
    step_median_s: float
    work_median_s: float


LOOPS_KEPT = 16
"""How many of its last loop iterations a rank's ``loop_step_s`` is the median of."""

_COLLECTIVE_PHASES = (PHASE_COMPUTE, PHASE_COLLECTIVE, PHASE_IDLE)
"""A rank in one of these with a collective in flight reports the collective phase (from its start)."""


class RankState:
    def __init__(self, clock=time.monotonic, source: str = SOURCE_SDK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.step = 0
        self.phase = PHASE_INIT
        self.phase_since = clock()
        self.coll_seq = 0
        self.coll_op = ""
        self._coll_in_flight = 0
        self._coll_since = 0.0
        self._coll_busy: dict[str, float] = {}  # per phase: time with >= 1 collective in flight
        self._coll_busy_phase = ""
        self.last = (0.0, 0.0, 0.0, 0.0)  # data, compute, collective, step seconds
        self.ckpt_step = -1
        self.ckpt_state = "idle"
        self.ckpt_s = 0.0  # how long the last save blocked the training loop
        self.ckpt_persist_s = 0.0  # an async save's start to its files on storage
        self.loss_ok = True
        self.watchdog = ""
        self.stack_file = ""
        self.error = ""
        self.error_peer = False
        # the restore, as this rank reports it (supervisor.protocol.Heartbeat documents each)
        self.ckpt_root = ""
        self.restore_state = ""
        self.restored = ""
        self.restore_refused: tuple[tuple[str, str], ...] = ()
        self.restore_s = 0.0
        self.steps_done = 0
        self.first_step_s = 0.0
        self.outcome = ""
        self.dump_seq = 0  # the last stack-dump request carried out (supervisor.protocol.Heartbeat)
        self.source = source
        self.coll_group = ""
        self.coll_groups = ""
        self.trace_file = ""
        # the loop's wall time per step, its saves left out (supervisor.protocol.Heartbeat.loop_step_s)
        self.loop_step_s = 0.0
        self._loop_at: float | None = None  # when the last step ended
        self._saving_s = 0.0  # time in the checkpoint phase since then
        self._loops: deque[float] = deque(maxlen=LOOPS_KEPT)
        # the medians of the last steps' times and exposed work (Heartbeat.step_median_s, work_median_s)
        self.step_median_s = self.work_median_s = 0.0
        self._steps_s: deque[float] = deque(maxlen=MEDIAN_STEPS)
        self._work_s: deque[float] = deque(maxlen=MEDIAN_STEPS)

    # ---------------------------------------------------------------- phases
    def set_phase(self, name: str) -> None:
        with self._lock:
            now = self._clock()
            if self.phase == PHASE_CHECKPOINT and name != PHASE_CHECKPOINT:
                # the part of the save since the last step's end (a step that ended inside it counted the rest)
                self._saving_s += now - max(self.phase_since, self._loop_at if self._loop_at is not None else -math.inf)
            self.phase = name
            self.phase_since = now

    @contextmanager
    def phase_scope(self, name: str) -> Iterator[None]:
        previous = self.phase
        self.set_phase(name)
        try:
            yield
        finally:
            # back to an enclosing phase, but never back to init/restore: those are over
            self.set_phase(PHASE_IDLE if previous in (name, PHASE_INIT, PHASE_RESTORE) else previous)

    def set_failed(self, error: str, peer: bool) -> None:
        """The rank is ending on an exception: say which, and whether a peer caused it."""
        with self._lock:
            self.error = error[:512]
            self.error_peer = peer
            self.phase = PHASE_FAILED
            self.phase_since = self._clock()

    # ---------------------------------------------------------------- collectives
    def coll_enter(self, op: str) -> int:
        """Mark entry into a collective; returns its sequence number for :meth:`coll_exit`."""
        with self._lock:
            self.coll_seq += 1
            if self._coll_in_flight == 0:
                self._coll_since = self._clock()
                self._coll_busy_phase = self.phase
            self._coll_in_flight += 1
            self.coll_op = op
            return self.coll_seq

    def coll_exit(self, seq: int) -> None:
        with self._lock:
            if self._coll_in_flight == 0:
                return
            self._coll_in_flight -= 1
            if self._coll_in_flight == 0:
                phase = self._coll_busy_phase
                self._coll_busy[phase] = self._coll_busy.get(phase, 0.0) + self._clock() - self._coll_since

    def set_collectives(self, *, group: str, seq: int, op: str, inside_since: float | None, groups: str) -> None:
        """What the flight recorder says (the instrumentation's poll, not the SDK's own count):
        ``seq`` entered in ``group``, in it since ``inside_since`` (this clock) or not inside one."""
        with self._lock:
            self.coll_group, self.coll_seq, self.coll_op, self.coll_groups = group, seq, op, groups
            self._coll_in_flight = 0 if inside_since is None else 1
            if inside_since is not None:
                self._coll_since = inside_since

    def set_step(self, step: int, timings: tuple[float, float, float, float], progress_phase: str) -> None:
        """An optimizer step was taken (the instrumentation's hook): the count, the last step's
        data/compute/collective/step seconds, and progress in ``progress_phase`` from now on."""
        with self._lock:
            self.step = step
            self.steps_done = step
            self.last = timings
            self._loop_done()
            if self.phase not in (PHASE_FAILED, PHASE_CHECKPOINT):
                self.phase = progress_phase
                self.phase_since = self._clock()

    def step_ended(self, timings: tuple[float, float, float, float]) -> None:
        """A step of the SDK's ended: its data/compute/collective/step seconds."""
        with self._lock:
            self.last = timings
            self._loop_done()

    def _loop_done(self) -> None:
        """(Under the lock, at a step's end, its timings in ``last``.) The step's time and exposed
        work join their medians' history; and one more loop iteration: the wall time from the
        previous step's end, less what saves blocked in between; ``loop_step_s`` is the median of
        the last :data:`LOOPS_KEPT` (a save's stall or one slow step does not move it)."""
        data, compute, _, step = self.last
        if step > 0:
            self._steps_s.append(step)
            self._work_s.append(data + compute)
            if len(self._steps_s) >= MEDIAN_MIN_STEPS:
                self.step_median_s = statistics.median(self._steps_s)
                self.work_median_s = statistics.median(self._work_s)
        now = self._clock()
        if self._loop_at is not None:
            saving = self._saving_s + (now - max(self.phase_since, self._loop_at) if self.phase == PHASE_CHECKPOINT else 0.0)
            self._loops.append(max(0.0, now - self._loop_at - saving))
            self.loop_step_s = statistics.median(self._loops)
        self._loop_at = now
        self._saving_s = 0.0

    def progress(self, phase: str) -> None:
        """Progress seen (a collective enqueued or completed): the phase's clock starts again,
        unless the rank is saving, failing or done."""
        with self._lock:
            if self.phase == phase:
                self.phase_since = self._clock()

    def take_collective_busy(self) -> dict[str, float]:
        """Time with at least one collective in flight since the last call, by the phase in
        which it began (overlapping collectives count once: this is wall time, not a sum)."""
        with self._lock:
            busy, self._coll_busy = self._coll_busy, {}
            return busy

    # ---------------------------------------------------------------- reads
    def snapshot(self) -> Snapshot:
        with self._lock:
            now = self._clock()
            inside = self._coll_in_flight > 0
            return Snapshot(
                step=self.step,
                phase=PHASE_COLLECTIVE if inside and self.phase in _COLLECTIVE_PHASES else self.phase,
                phase_s=now - (self._coll_since if inside and self.phase in _COLLECTIVE_PHASES else self.phase_since),
                coll_seq=self.coll_seq,
                coll_op=self.coll_op,
                coll_inside=inside,
                coll_s=now - self._coll_since if inside else 0.0,
                last_data_s=self.last[0],
                last_compute_s=self.last[1],
                last_collective_s=self.last[2],
                last_step_s=self.last[3],
                ckpt_step=self.ckpt_step,
                ckpt_state=self.ckpt_state,
                ckpt_s=self.ckpt_s,
                ckpt_persist_s=self.ckpt_persist_s,
                loss_ok=self.loss_ok,
                watchdog=self.watchdog,
                stack_file=self.stack_file,
                error=self.error,
                error_peer=self.error_peer,
                ckpt_root=self.ckpt_root,
                restore_state=self.restore_state,
                restored=self.restored,
                restore_refused=self.restore_refused,
                restore_s=self.restore_s,
                steps_done=self.steps_done,
                first_step_s=self.first_step_s,
                outcome=self.outcome,
                dump_seq=self.dump_seq,
                source=self.source,
                coll_group=self.coll_group,
                coll_groups=self.coll_groups,
                trace_file=self.trace_file,
                loop_step_s=self.loop_step_s,
                step_median_s=self.step_median_s,
                work_median_s=self.work_median_s,
            )
