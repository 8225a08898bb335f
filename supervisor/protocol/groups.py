"""The ``coll_groups`` heartbeat field: every process group's flight-recorder sequence numbers.

A rank watched through torch's flight recorder (no SDK in the script) reports, per process group,
the sequence number of the last collective it *enqueued* (entered) and of the last one that
*completed*, as ``GROUP=ENQUEUED/COMPLETED`` items joined by single spaces::

    0=1042/1041 1=88/88

Group ids are the flight recorder's (``pg_status`` keys: the order in which the script created
its groups, the same on every member); a number is -1 when the group has run nothing yet. The
controller compares ranks in the one group where some of them wait: a member whose ENQUEUED is
below the collective the others wait in never entered it.
"""

from __future__ import annotations

from supervisor.protocol.errors import REJECT_SCHEMA, ProtocolError

GROUPS_MAX = 16
"""At most this many groups in one heartbeat (the rest are left out, lowest ids first kept)."""
GROUP_ID_CHARS = 16
_SEQ_MAX = 1 << 62


def encode_groups(groups: dict[str, tuple[int, int]]) -> str:
    """The field's value for ``{group: (enqueued, completed)}`` (bounded: :data:`GROUPS_MAX`)."""
    items = sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))[:GROUPS_MAX]
    return " ".join(f"{g[:GROUP_ID_CHARS]}={e}/{c}" for g, (e, c) in items)


def decode_groups(value: str) -> dict[str, tuple[int, int]]:
    """``{group: (enqueued, completed)}`` from the field; :class:`ProtocolError` on anything else."""
    out: dict[str, tuple[int, int]] = {}
    if not value:
        return out
    items = value.split(" ")
    if len(items) > GROUPS_MAX:
        raise ProtocolError(REJECT_SCHEMA, f"coll_groups: more than {GROUPS_MAX} groups")
    for item in items:
        group, sep, seqs = item.partition("=")
        enq, sep2, done = seqs.partition("/")
        if (not sep or not sep2 or not group or len(group) > GROUP_ID_CHARS or group in out
                or not all(c.isalnum() or c in "-_." for c in group)):
            raise ProtocolError(REJECT_SCHEMA, f"coll_groups: {item[:40]!r} is not GROUP=ENQUEUED/COMPLETED")
        try:
            e, c = int(enq), int(done)
        except ValueError:
            raise ProtocolError(REJECT_SCHEMA, f"coll_groups: {item[:40]!r} has a number that is not one") from None
        if not -1 <= c <= e <= _SEQ_MAX:
            raise ProtocolError(REJECT_SCHEMA, f"coll_groups: {item[:40]!r} needs -1 <= COMPLETED <= ENQUEUED")
        out[group] = (e, c)
    return out
