"""Slurm's hostlist syntax (``n[1-3,5],gpu07``): pure parsing, no Slurm command runs here."""

from __future__ import annotations

import re


def expand_hostlist(expr: str) -> list[str]:
    """``n[1-3,5],gpu07`` -> ``[n1, n2, n3, n5, gpu07]`` (Slurm's hostlist syntax, nested ranges
    in one bracket per name, zero padding kept)."""
    out: list[str] = []
    for part in _split_top(expr.strip()):
        if not part:
            continue
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
        if m is None:
            if "[" in part or "]" in part:
                raise ValueError(f"unsupported hostlist {part!r}")
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        tails = _expand_ranges(ranges)
        for tail in tails:
            for name in expand_hostlist(suffix) if "[" in suffix else [suffix]:
                out.append(f"{prefix}{tail}{name}")
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


def _expand_ranges(ranges: str) -> list[str]:
    out = []
    for item in ranges.split(","):
        lo, sep, hi = item.partition("-")
        if not sep:
            out.append(lo)
            continue
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
            raise ValueError(f"bad hostlist range {item!r}")
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out
