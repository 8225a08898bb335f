"""Durable file-system primitives: every byte that a manifest vouches for is fsynced first.

DCP fsyncs its shards but never the directories that hold them; after a power loss a renamed
directory can come back without its entries. Everything here fsyncs the directory too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from supervisor.checkpoint.checksum import new_hasher


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingFile:
    """A write-only binary file that hashes and counts what passes through it.

    ``torch.save`` and DCP's writer need only ``write``/``tell``/``flush``/``fileno``; hashing
    while writing saves a second read of every byte at commit time.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        algorithm: str,
        on_close: Callable[["HashingFile"], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._f = open(path, "xb")  # never overwrite: a fresh file or an error
        self._hasher = new_hasher(algorithm)
        self.size = 0
        self.digest: str | None = None
        self._on_close = on_close

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = self._f.write(view)
        if n != len(view):  # a raw short write; buffered files never do this
            raise OSError(f"short write to {self.path}: {n} of {len(view)} bytes")
        self._hasher.update(view)
        self.size += n
        return n

    def tell(self) -> int:
        return self.size

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._f.flush()

    def fileno(self) -> int:
        return self._f.fileno()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f.closed:
            return
        self._f.flush()
        self._f.close()
        self.digest = self._hasher.hexdigest()
        if self._on_close is not None:
            self._on_close(self)

    def abort(self) -> None:
        """Close without recording: the file is incomplete and will not be listed."""
        try:
            self._f.close()
        except OSError:
            pass  # flushing the rest failed too (full disk); the caller reports the first error

    def __enter__(self) -> "HashingFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_durable(path: str | os.PathLike, data: bytes, algorithm: str) -> tuple[int, str]:
    """Write ``data`` to a new file, fsync it, and return ``(size, digest)``."""
    with HashingFile(path, algorithm) as f:
        f.write(data)
        f.sync()
    return f.size, f.digest  # type: ignore[return-value]


def dump_json(obj: Any) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def remove_tree(path: Path, trash_prefix: str = ".deleting-") -> None:
    """Delete a checkpoint directory so that a crash half-way never leaves it looking complete.

    The directory is first renamed to a dot-name (atomic; discovery ignores dot-names), then
    removed. A crash between the two leaves only an ignored ``.deleting-*`` folder behind.
    """
    trash = path.with_name(trash_prefix + path.name)
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash)
