"""The latest heartbeat of every rank of the current attempt."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from supervisor.protocol import Heartbeat

STEP_HISTORY = 20


@dataclass
class RankRecord:
    hb: Heartbeat
    received: float
    first_received: float
    step_changed: float
    step_times: deque = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    work_times: deque = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))


class Registry:
    """Heartbeats of one attempt, by rank. Older attempts are fenced off by the caller."""

    def __init__(self, attempt: int = 0, world_size: int = 0) -> None:
        self.attempt = attempt
        self.world_size = world_size
        self.ranks: dict[int, RankRecord] = {}

    def reset(self, attempt: int, world_size: int) -> None:
        self.attempt = attempt
        self.world_size = world_size
        self.ranks = {}

    def observe(self, hb: Heartbeat, now: float) -> bool:
        """Record ``hb``; False when it is older than what is held (reordered or replayed)."""
        rec = self.ranks.get(hb.rank)
        if rec is None:
            self.ranks[hb.rank] = RankRecord(hb=hb, received=now, first_received=now, step_changed=now)
            return True
        if hb.seq <= rec.hb.seq and hb.pid == rec.hb.pid:
            return False  # reordered or replayed datagram: keep the newer state
        if hb.step != rec.hb.step:
            rec.step_changed = now
            if hb.last_step_s > 0:
                rec.step_times.append(hb.last_step_s)
                rec.work_times.append(hb.last_data_s + hb.last_compute_s)
        rec.hb = hb
        rec.received = now
        return True

    def max_step(self) -> int:
        return max((r.hb.step for r in self.ranks.values()), default=0)

    def min_step(self) -> int:
        return min((r.hb.step for r in self.ranks.values()), default=0)
