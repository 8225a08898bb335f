"""Small durable-file helpers shared by the checkpoint library, the controller and platforms."""

from __future__ import annotations

import os
import time
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside(path: Path, label: str, *, when: float | None = None) -> Path:
    """Rename ``path`` to a free ``NAME.LABEL-TIME[-n]SUFFIX`` beside it (kept, never
    overwritten: the post-mortem of an earlier run); returns the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if when is None else when))
    n = 0
    while True:
        dest = path.with_name(f"{path.stem}.{label}-{stamp}{f'-{n}' if n else ''}{path.suffix}")
        if not os.path.lexists(dest):
            break
        n += 1
    os.rename(path, dest)
    fsync_dir(path.parent)
    return dest
