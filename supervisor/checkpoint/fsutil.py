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
from supervisor.files import fsync_dir  # noqa: F401 - re-exported: the library's writers use it from here


class HashingFile:
    """A write-only binary file that hashes and counts what passes through it.

    ``torch.save`` and DCP's writer need only ``write``/``tell``/``flush``/``fileno``; hashing
    while writing saves a second read of every byte at commit time.

    Durability: the size and digest are recorded (``on_close``) only after every byte is
    fsynced. DCP calls ``os.fsync(f.fileno())`` without flushing first (torch 2.13, for the
    shards and for ``.metadata``), so ``fileno()`` flushes the buffer before handing out the
    descriptor, and ``close()`` fsyncs whatever was written since the last :meth:`sync`.
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
        self._unsynced = False  # bytes written since the last fsync we made ourselves

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = self._f.write(view)
        if n != len(view):  # a raw short write; buffered files never do this
            raise OSError(f"short write to {self.path}: {n} of {len(view)} bytes")
        self._hasher.update(view)
        self.size += n
        self._unsynced = True
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
        # Whoever asks for the descriptor may fsync it next (DCP does): the bytes still in
        # the buffer must reach the kernel first, or that fsync misses them.
        self._f.flush()
        return self._f.fileno()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._unsynced = False

    def close(self) -> None:
        """Flush, fsync (if anything was written since the last :meth:`sync`), then record."""
        if self._f.closed:
            return
        self._f.flush()
        if self._unsynced:
            # DCP's own fsync may already have covered it; ours is cheap then, and it makes the
            # promise hold whoever wrote through this file: recorded means durable.
            os.fsync(self._f.fileno())
            self._unsynced = False
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
