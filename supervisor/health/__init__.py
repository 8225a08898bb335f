"""Pure health decisions over observed heartbeats: no I/O, no clock of its own.

``Registry`` holds the latest heartbeat of every rank of the current attempt with the
controller's (monotonic) receive time; ``detect`` turns it into findings (dead, hung,
collective hang with the culprit named, stalls, non-finite loss) and ``straggler_scores``
into per-rank scores. Every function takes ``now``: tests drive a fake clock.
"""

from supervisor.health.detect import (
    Finding,
    Kind,
    Timeouts,
    calibrate,
    detect,
    straggler_scores,
)
from supervisor.health.registry import RankRecord, Registry

__all__ = ["Finding", "Kind", "RankRecord", "Registry", "Timeouts", "calibrate", "detect", "straggler_scores"]
