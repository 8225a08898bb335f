"""The checkpoints a rank's restore refused, with why: the heartbeat's ``restore_refused``.

On the wire a JSON list of ``[name, why]`` pairs, newest first, at most :data:`REFUSED_MAX`
of them, a name at most :data:`NAME_CHARS` and a reason at most :data:`WHY_CHARS` characters.
A checkpoint the rank passed over because the controller's restore point excluded it is not
a refusal and is not listed (the controller made it suspect itself).

An older SDK sent ``restore_skipped`` instead: one string ``name: why; name: why`` (at most
:data:`LEGACY_CHARS`), listing the excluded ones too, as ``excluded by the caller (...)``.
:func:`decode_refused` reads both.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from supervisor.protocol.errors import REJECT_SCHEMA, ProtocolError

REFUSED_MAX = 16
NAME_CHARS = 64
WHY_CHARS = 160
BUDGET_CHARS = 384
"""What :func:`refused_field` keeps of names and reasons together (the older string's size)."""
LEGACY_CHARS = 384
Refused = tuple[tuple[str, str], ...]

_LEGACY_ENTRY = re.compile(r"(?:^|; )(step-\d+(?:-\d+)?): ")
_LEGACY_EXCLUDED = "excluded by the caller"


def refused_field(pairs: Iterable[tuple[str, str]]) -> Refused:
    """What a rank sends of its refusals ``(name, why)``: the first :data:`REFUSED_MAX`, each
    reason cut to :data:`WHY_CHARS`, until :data:`BUDGET_CHARS` are spent (the last one cut)."""
    out: list[tuple[str, str]] = []
    left = BUDGET_CHARS
    for name, why in pairs:
        if len(out) == REFUSED_MAX or left <= len(name):
            break
        why = why[:min(WHY_CHARS, left - len(name))]
        out.append((name[:NAME_CHARS], why))
        left -= len(name) + len(why)
    return tuple(out)


def decode_refused(value: Any) -> Refused:
    """The refusals of a heartbeat's field: the list of pairs, or an older SDK's string (whose
    ``excluded by the caller`` entries are not refusals; its first :data:`REFUSED_MAX`);
    :class:`ProtocolError` (``schema``) for anything else, or past the bounds."""
    if isinstance(value, str):
        if len(value) > LEGACY_CHARS:
            raise ProtocolError(REJECT_SCHEMA, f"bad restore_skipped: over {LEGACY_CHARS} characters")
        return _legacy(value)[:REFUSED_MAX]
    if not isinstance(value, (list, tuple)) or len(value) > REFUSED_MAX:
        raise ProtocolError(REJECT_SCHEMA, f"bad restore_refused: {value!r}"[:120])
    for pair in value:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], str) and len(pair[0]) <= NAME_CHARS and len(pair[1]) <= WHY_CHARS):
            raise ProtocolError(REJECT_SCHEMA, f"bad restore_refused entry: {pair!r}"[:120])
    return tuple((name, why) for name, why in value)


def _legacy(text: str) -> Refused:
    marks = list(_LEGACY_ENTRY.finditer(text))
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        why = text[m.end():end].strip()
        if not why.startswith(_LEGACY_EXCLUDED):
            out.append((m.group(1), why))
    return tuple(out)
