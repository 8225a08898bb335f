"""Checksums named by algorithm, so a manifest says how its digests were made.

xxh3 is far faster than the disk (docs/checkpoints.md) and releases the GIL: it is the default.
sha256 runs at disk speed (it doubles the persist time), for a site that must have a
cryptographic digest; the manifest records the choice and a reader follows it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable, Protocol

import xxhash

_CHUNK = 8 << 20


class Hasher(Protocol):
    def update(self, data, /) -> None: ...

    def hexdigest(self) -> str: ...


ALGORITHMS: dict[str, Callable[[], Hasher]] = {
    "xxh3_64": xxhash.xxh3_64,
    "xxh3_128": xxhash.xxh3_128,
    "sha256": hashlib.sha256,
}
DEFAULT_ALGORITHM = "xxh3_128"


def new_hasher(algorithm: str) -> Hasher:
    try:
        return ALGORITHMS[algorithm]()
    except KeyError:
        raise ValueError(
            f"unknown checksum algorithm {algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}"
        ) from None


def hash_file(path: str | os.PathLike, algorithm: str) -> tuple[int, str]:
    """Return ``(size, hexdigest)`` of a file, read in large chunks into one reused buffer."""
    hasher = new_hasher(algorithm)
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            hasher.update(view[:n])
            size += n
    return size, hasher.hexdigest()
