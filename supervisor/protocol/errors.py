"""The one error type every parser of the wire raises, and the reasons it names (the controller
counts rejected frames by reason; never rename one)."""

from __future__ import annotations

REJECT_MALFORMED = "malformed"
REJECT_OVERSIZED = "oversized"
REJECT_UNAUTHENTICATED = "unauthenticated"
REJECT_SCHEMA = "schema"
REJECT_STALE_ATTEMPT = "stale_attempt"
REJECT_OTHER_LAUNCH = "other_launch"
"""A frame of a launch the receiver does not belong to and never made: another run's (the same
token reused), or a rank's own frame sent back to it. Never normal traffic (a relaunch's old
ranks are a ``stale_attempt``)."""
REJECT_REASONS = (REJECT_MALFORMED, REJECT_OVERSIZED, REJECT_UNAUTHENTICATED, REJECT_SCHEMA, REJECT_STALE_ATTEMPT,
                  REJECT_OTHER_LAUNCH)


class ProtocolError(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


REJECT_REPLAYED = "replayed"
"""A rank's reason for a control message numbered at or below the last one it accepted (and the
controller's for a restore-point request whose nonce it has already taken)."""
REJECT_STALE = "stale"
"""An HTTP request stamped outside the restore point's freshness window of the controller's clock."""
