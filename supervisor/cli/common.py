"""What every command shares: exit codes, the human formats, the job's saved state."""

from __future__ import annotations

import sys
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _human_age(seconds: float) -> str:
    if seconds < 0:
        return "in the future"
    for unit, width in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= width:
            return f"{seconds / width:.1f}{unit}"
    return f"{seconds:.0f}s"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)



def _saved_state(log_dir: str) -> dict | None:
    """The job's state file, for `status` when no supervisor answers; None (with an error
    printed) when it cannot be read."""
    from supervisor.controller.state import STATE_FILE, StateError, load, to_json

    path = Path(log_dir) / STATE_FILE
    try:
        saved = load(path)
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    if saved is None:
        print(f"error: no {path}: no supervisor has run a job with --log-dir {log_dir}", file=sys.stderr)
        return None
    return to_json(saved)

