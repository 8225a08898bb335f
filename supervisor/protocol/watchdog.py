"""``SUPERVISOR_WATCHDOG``: the phase timeouts a rank's own watchdog uses, set by the controller
(just below its own, so that a stuck rank's stacks are on disk before the controller acts).

The value is ``phase=seconds`` items joined by commas, one per phase of :data:`TIMED_PHASES` in
that order (``init=480.000,restore=480.000,...``); a rank takes any subset, with spaces around
items, and keeps its defaults for the phases not named.
"""

from __future__ import annotations

import math
from typing import Mapping

from supervisor.protocol.errors import REJECT_SCHEMA, ProtocolError
from supervisor.protocol.vocabulary import TIMED_PHASES

MAX_CHARS = 1024


def encode_watchdog(timeouts: Mapping[str, float]) -> str:
    """The value for ``timeouts`` (seconds by phase), in :data:`TIMED_PHASES` order."""
    return ",".join(f"{phase}={timeouts[phase]:.3f}" for phase in TIMED_PHASES if phase in timeouts)


def decode_watchdog(value: str) -> dict[str, float]:
    """The timeouts a value names; :class:`ProtocolError` (``schema``) for an item that is not
    ``PHASE=SECONDS`` of a timed phase, a number that is not finite and above 0, or a value over
    :data:`MAX_CHARS`."""
    if len(value) > MAX_CHARS:
        raise ProtocolError(REJECT_SCHEMA, f"over {MAX_CHARS} characters")
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in value.strip().split(","))):
        name, sep, seconds = item.partition("=")
        if not sep or name not in TIMED_PHASES:
            raise ProtocolError(REJECT_SCHEMA, f"{item!r} is not PHASE=SECONDS (phases: {', '.join(TIMED_PHASES)})")
        try:
            out[name] = float(seconds)
        except ValueError:
            raise ProtocolError(REJECT_SCHEMA, f"{seconds!r} is not a number") from None
        if not math.isfinite(out[name]):
            raise ProtocolError(REJECT_SCHEMA, f"{name} must be a finite number of seconds")
        if out[name] <= 0:
            raise ProtocolError(REJECT_SCHEMA, f"{name} must be > 0")
    return out
