"""Small durable-file helpers shared by the checkpoint library, the controller and platforms."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Iterable, Iterator

TMP_RANDOM_BYTES = 8
"""Random bytes in a temporary file's name (hex): two writers, even with the same pid (two
containers' PID 1 on one shared volume), never share one."""


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


def write_atomic(path: str | os.PathLike, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that a reader (or a crash) at any instant finds the old file
    or the new one, whole, never a torn or empty one, whatever other writers do meanwhile.

    The bytes go to a temporary file beside ``path`` under a name no other writer can hold
    (``.NAME.<random>.tmp``, created with ``O_EXCL|O_NOFOLLOW``: never an existing file, never
    through a planted symlink), fsynced, renamed over ``path`` (a symlink at ``path`` itself is
    replaced, its target untouched), and the directory fsynced. Concurrent writers each rename
    a whole file of their own: the last rename wins. ``durable=False`` skips the two fsyncs: for
    a file rewritten every second whose loss in a crash costs nothing (whole or old, still)."""
    path = Path(path)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(TMP_RANDOM_BYTES)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            break
        except FileExistsError:  # 2**-64: another name
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def rotated(path: str | os.PathLike, n: int) -> Path:
    """The ``n``-th archived generation of a rotated file: ``NAME.n`` (1 is the newest)."""
    path = Path(path)
    return path.with_name(f"{path.name}.{n}")


def rotate(path: str | os.PathLike, keep: int) -> None:
    """Archive ``path`` as ``NAME.1`` (``NAME.1`` becoming ``NAME.2``, and so on), keeping at
    most ``keep`` archived generations (the oldest beyond them is removed). The next write
    starts a new ``path``."""
    path = Path(path)
    try:
        os.unlink(rotated(path, keep))
    except FileNotFoundError:
        pass
    for n in range(keep - 1, 0, -1):
        try:
            os.rename(rotated(path, n), rotated(path, n + 1))
        except FileNotFoundError:
            pass
    if keep > 0:
        os.rename(path, rotated(path, 1))
    else:
        os.unlink(path)


def generations(path: str | os.PathLike) -> list[Path]:
    """A rotated file's generations that exist, oldest first, ``path`` itself last."""
    path = Path(path)
    older = []
    n = 1
    while os.path.lexists(rotated(path, n)):
        older.append(rotated(path, n))
        n += 1
    return [*reversed(older), *([path] if os.path.lexists(path) else [])]


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """Every line of a rotated file (see :func:`rotate`), oldest first: its archived generations,
    then the file itself. A generation rotated away while it is read is skipped."""
    for gen in generations(path):
        try:
            with open(gen, errors="replace") as f:
                yield from (line.rstrip("\n") for line in f)
        except FileNotFoundError:
            continue


def read_json_lines(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a rotated JSON-lines file (``events.jsonl``: its archived generations
    first, see :func:`read_lines`); a line that is not a JSON object (torn, garbled, nested too
    deeply) is passed over."""
    out = []
    try:
        for line in read_lines(path):
            try:
                e = json.loads(line) if line.strip() else None
            except (ValueError, RecursionError):
                continue
            if isinstance(e, dict):
                out.append(e)
    except OSError:
        return out
    return out


def prune_oldest(folder: str | os.PathLike, max_bytes: int, *, suffix: str = "", keep: Iterable[str] = ()) -> list[Path]:
    """Remove the oldest regular files of ``folder`` (by mtime, then name; only names ending in
    ``suffix``, never a name in ``keep``, never a temporary ``.NAME.*.tmp``) until what is left
    weighs at most ``max_bytes``; returns what was removed, oldest first."""
    kept = set(keep)
    files = []
    with os.scandir(folder) as it:
        for e in it:
            if not e.name.endswith(suffix) or e.name.startswith(".") or not e.is_file(follow_symlinks=False):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            files.append((st.st_mtime_ns, e.name, st.st_size))
    total = sum(size for _, _, size in files)
    removed = []
    for _, name, size in sorted(files):
        if total <= max_bytes:
            break
        if name in kept:
            continue
        try:
            os.unlink(Path(folder) / name)
        except FileNotFoundError:
            pass
        total -= size
        removed.append(Path(folder) / name)
    return removed
