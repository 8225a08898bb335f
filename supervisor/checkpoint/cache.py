"""Fast verification of a root's checkpoints, remembered: what the controller polls.

A published checkpoint is immutable (its directory appears by one rename, whole, and is never
written again), so its fast verification (:func:`~supervisor.checkpoint.discovery.verify`,
``fast``) need not be redone on every poll. :class:`VerifiedCache` keeps each verdict by the
checkpoint's directory name, with the identity of what it read: the directory's inode and its
``manifest.json``'s inode, size, mtime and ctime. A poll lists the root (one ``scandir``) and
``lstat``\\ s the manifests of the candidates it looks at; only a name that is new, or whose
directory or manifest changed (a directory removed and published again, a manifest rewritten or
appearing), is verified again. Verdicts of names no longer listed are dropped, so the cache
never holds more than the root does. A verification that failed for an I/O error (``EIO``,
``ESTALE`` on NFS) is not remembered: it is tried again at the next poll.

What the cache cannot see: a data file of a published checkpoint changed behind an unchanged
manifest (only a corruption does that). The ranks' restore verifies every checksum before it
loads anything, and a checkpoint they refuse is marked suspect: a stale verdict here costs at
most the choice of a checkpoint the ranks then pass over.

Thread-safe (one lock): the controller runs it in a worker thread, never on its event loop.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from supervisor.checkpoint.discovery import Candidate, Discovery, Skipped, Verified, candidates, verify
from supervisor.checkpoint.errors import CheckpointError
from supervisor.checkpoint.manifest import MANIFEST_NAME, Manifest

_Key = tuple


@dataclass(frozen=True)
class Scan:
    """One look at a root: the newest checkpoint that verifies (not excluded), why each newer one
    was passed over, and every name that verifies (``usable``, newest first; excluded ones
    included), when asked for."""

    root: Path
    discovery: Discovery
    usable: list[str] | None
    verified: int
    """Fast verifications this scan ran (the rest were remembered)."""
    writers: dict[str, str] = field(default_factory=dict)
    """The release (its manifest's) that wrote each checkpoint looked at that verifies."""


class VerifiedCache:
    """Fast-verification verdicts by checkpoint directory name, for one root at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: Path | None = None
        self._verdicts: dict[str, tuple[_Key, Manifest | None, str]] = {}
        self.verifications = 0
        """Fast verifications run since the cache was made (what it saved is the rest)."""

    def __len__(self) -> int:
        return len(self._verdicts)

    def scan(self, root: str | os.PathLike, *, exclude: Iterable[str] = (), usable: bool = False) -> Scan:
        """:func:`~supervisor.checkpoint.discovery.latest_complete` (``fast``) of ``root``, with
        what is remembered; with ``usable`` every published name is looked at, and the ones that
        verify are listed. Raises what listing the root raises (:class:`CheckpointError` for a
        root that is not a directory, ``OSError``)."""
        root = Path(root)
        excluded = set(exclude)
        with self._lock:
            if root != self._root:
                self._root, self._verdicts = root, {}
            before = self.verifications
            found = candidates(root)
            listed = {c.name for c in found}
            for name in [n for n in self._verdicts if n not in listed]:
                del self._verdicts[name]
            pick: Verified | None = None
            skipped: list[Skipped] = []
            names: list[str] = []
            writers: dict[str, str] = {}
            for cand in found:
                if pick is not None and not usable:
                    break
                passed_over = cand.name in excluded
                if passed_over and not usable:
                    skipped.append(Skipped(cand.name, "excluded by the caller (marked suspect)"))
                    continue
                manifest, reason = self._verdict(cand)
                if manifest is not None:
                    names.append(cand.name)
                    writers[cand.name] = manifest.release
                if pick is not None:
                    continue
                if passed_over:
                    skipped.append(Skipped(cand.name, "excluded by the caller (marked suspect)"))
                elif manifest is None:
                    skipped.append(Skipped(cand.name, reason))
                else:
                    pick = Verified(cand.path, manifest, "fast")
            return Scan(root, Discovery(pick, skipped), names if usable else None, self.verifications - before,
                        writers)

    def _verdict(self, cand: Candidate) -> tuple[Manifest | None, str]:
        key = _identity(cand.path)
        held = self._verdicts.get(cand.name)
        if key is not None and held is not None and held[0] == key:
            return held[1], held[2]
        self.verifications += 1
        try:
            manifest, reason = verify(cand.path, "fast"), ""
        except CheckpointError as exc:
            manifest, reason = None, exc.reason
        except OSError as exc:  # maybe passing (EIO, ESTALE): not remembered, tried again next time
            self._verdicts.pop(cand.name, None)
            return None, f"unreadable: {exc}"
        if key is not None and key == _identity(cand.path):  # unchanged while it was verified
            self._verdicts[cand.name] = (key, manifest, reason)
        else:
            self._verdicts.pop(cand.name, None)
        return manifest, reason


def _identity(path: Path) -> _Key | None:
    """What a verdict on ``path`` was read from: the directory (device, inode, type) and its
    manifest (inode, size, mtime, ctime; None when absent). None when it cannot be told."""
    try:
        d = os.lstat(path)
    except OSError:
        return None
    try:
        m = os.lstat(path / MANIFEST_NAME)
        manifest: tuple | None = (m.st_ino, m.st_size, m.st_mtime_ns, m.st_ctime_ns, stat.S_IFMT(m.st_mode))
    except FileNotFoundError:
        manifest = None
    except OSError:
        return None
    return (d.st_dev, d.st_ino, stat.S_IFMT(d.st_mode), manifest)
