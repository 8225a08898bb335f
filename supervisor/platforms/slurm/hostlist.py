"""Slurm's hostlist syntax (``n[1-3,5],gpu07``): pure parsing, no Slurm command runs here.

The contract: a string in, the node names out, or :class:`HostlistError` (a
:class:`~supervisor.platforms.base.PlatformError`, and a ``ValueError``) naming the part that is
wrong. Bounded before anything is built: at most :data:`MAX_HOSTLIST_CHARS` characters in,
:data:`MAX_HOSTS` names out (a range is counted, never expanded, to find that out), range bounds
of at most :data:`MAX_RANGE_DIGITS` ASCII digits; linear time in the input plus the output.
"""

from __future__ import annotations

import re

from supervisor.platforms.base import PlatformError

MAX_HOSTS = 100_000
"""More names than any Slurm allocation holds (Slurm's own node limit is 65,533 per job)."""
MAX_HOSTLIST_CHARS = 1 << 20
MAX_RANGE_DIGITS = 9
_BRACKET = re.compile(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)")
_NUMBER = re.compile(r"[0-9]{1,%d}" % MAX_RANGE_DIGITS)


class HostlistError(PlatformError, ValueError):
    """A hostlist that is malformed or expands past the bounds; the message names the part."""


def expand_hostlist(expr: str, *, limit: int = MAX_HOSTS) -> list[str]:
    """``n[1-3,5],gpu07`` -> ``[n1, n2, n3, n5, gpu07]`` (Slurm's hostlist syntax, ranges in one
    bracket per name, zero padding kept). :class:`HostlistError` for a malformed list or one of
    more than ``limit`` names."""
    if not isinstance(expr, str):
        raise HostlistError(f"hostlist must be a string, got {type(expr).__name__}")
    if len(expr) > MAX_HOSTLIST_CHARS:
        raise HostlistError(f"hostlist of {len(expr)} characters is over the {MAX_HOSTLIST_CHARS} limit")
    parts = []
    count = 0
    for part in _split_top(expr.strip()):
        if not part:
            continue
        m = _BRACKET.fullmatch(part)
        if m is None:
            if "[" in part or "]" in part:
                raise HostlistError(f"unsupported hostlist {_short(part)} (one bracket per name)")
            ranges = None
        else:
            ranges = _parse_ranges(m.group(2))
        count += 1 if ranges is None else sum(hi - lo + 1 for lo, hi, _ in ranges)
        if count > limit:
            raise HostlistError(f"hostlist names more than {limit} nodes (at {_short(part)}): refused, not "
                                "expanded")
        parts.append((part, m, ranges))
    out: list[str] = []
    for part, m, ranges in parts:
        if ranges is None:
            out.append(part)
            continue
        prefix, _, suffix = m.groups()
        for lo, hi, width in ranges:
            out.extend(f"{prefix}{str(i).zfill(width)}{suffix}" for i in range(lo, hi + 1))
    return out


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _parse_ranges(ranges: str) -> list[tuple[int, int, int]]:
    """``1-3,05`` -> ``[(1, 3, 1), (5, 5, 2)]``: (low, high, zero-padded width)."""
    out = []
    for item in ranges.split(","):
        lo, sep, hi = item.partition("-")
        if not _NUMBER.fullmatch(lo) or (sep and not _NUMBER.fullmatch(hi)):
            raise HostlistError(f"bad hostlist range {_short(item)} (numbers of 1-{MAX_RANGE_DIGITS} digits)")
        low = int(lo)
        high = int(hi) if sep else low
        if high < low:
            raise HostlistError(f"bad hostlist range {_short(item)} (its end is below its start)")
        out.append((low, high, len(lo)))
    return out


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")
