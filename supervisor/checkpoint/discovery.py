"""Finding, verifying and retiring checkpoints under a root directory.

Layout of a root::

    root/
      step-0000000120/          published checkpoints (one atomic rename each)
        manifest.json           written last; lists every file with size and digest
        .metadata __0_0.distcp  DCP model + optimizer state (plain ``dcp.load`` reads it)
        rng/rank-00000.json     per-rank RNG
        trainer/*.pt            scheduler, grad scaler, user-registered objects
      step-0000000120-1/        the same step saved again (names are never reused)
      .tmp-step-0000000130-ab12/  a save in flight (or a dead writer's leftovers)
      .deleting-step-...        a removal in progress

Verification levels: ``fast`` checks the manifest, the path of every entry (no escape, no
symlink) and every size; ``full`` also recomputes every checksum.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal

from supervisor.checkpoint.checksum import hash_file
from supervisor.checkpoint.errors import (
    CheckpointError,
    ManifestError,
    NoCheckpointError,
    UnsafePathError,
    VerificationError,
)
from supervisor.checkpoint.fsutil import remove_tree
from supervisor.checkpoint.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, parse
from supervisor.procfs import pid_alive

Level = Literal["fast", "full"]
LEVELS: tuple[Level, ...] = ("fast", "full")
TMP_PREFIX = ".tmp-"
OWNER_NAME = "OWNER.json"
# ASCII digits only (``\\d`` takes any script's), and no more than a 64-bit step needs
_NAME = re.compile(r"^step-([0-9]{10,20})(?:-([0-9]{1,9}))?$")
_TMP_NAME = re.compile(r"^\.tmp-step-([0-9]{10,20})-[0-9a-f]+$")


def checkpoint_name(step: int, generation: int = 0) -> str:
    return f"step-{step:010d}" if generation == 0 else f"step-{step:010d}-{generation}"


def parse_name(name: str) -> tuple[int, int] | None:
    """``step-0000000120-2`` -> ``(120, 2)``; ``None`` for anything else."""
    m = _NAME.match(name)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


@dataclass(frozen=True)
class Candidate:
    """A published directory under a root, before verification."""

    path: Path
    step: int
    generation: int

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


@dataclass(frozen=True)
class Verified:
    path: Path
    manifest: Manifest
    level: Level

    @property
    def step(self) -> int:
        return self.manifest.global_step

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Discovery:
    """The answer of :func:`latest_complete`: the pick and why each newer one was passed over."""

    checkpoint: Verified | None
    skipped: list[Skipped] = field(default_factory=list)

    def explain(self) -> str:
        lines = [f"skipped {s.name}: {s.reason}" for s in self.skipped]
        lines.append(
            f"picked {self.checkpoint.name} (step {self.checkpoint.step}, {self.checkpoint.level} verification)"
            if self.checkpoint
            else "no checkpoint verifies"
        )
        return "\n".join(lines)


def candidates(root: str | os.PathLike) -> list[Candidate]:
    """Published checkpoint directories, newest first (by step, then generation)."""
    root = Path(root)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise CheckpointError("checkpoint root is not a directory", path=str(root)) from None
    except OSError as exc:
        raise CheckpointError(f"checkpoint root cannot be listed: {exc.strerror or exc}", path=str(root)) from None
    found = []
    for entry in entries:
        parsed = parse_name(entry.name)
        if parsed is not None:
            found.append(Candidate(Path(entry.path), *parsed))
    found.sort(key=lambda c: (c.step, c.generation), reverse=True)
    return found


def in_flight(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    try:
        return sorted(Path(e.path) for e in os.scandir(root) if _TMP_NAME.match(e.name))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"checkpoint root cannot be listed: {exc.strerror or exc}", path=str(root)) from None


def read_manifest(ckpt_dir: str | os.PathLike) -> Manifest:
    """Read and validate ``manifest.json``; a missing or bad one is a :class:`ManifestError`."""
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / MANIFEST_NAME
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ManifestError("no manifest (incomplete save?)", path=str(ckpt_dir)) from None
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError("manifest is not a regular file", path=str(ckpt_dir))
    if st.st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"manifest is {st.st_size} bytes, over the {MAX_MANIFEST_BYTES} byte limit",
            path=str(ckpt_dir),
        )
    with open(path, "rb") as f:
        # read(n) allocates n bytes at once: ask for what the file holds (bounded), not the cap
        data = f.read(min(st.st_size, MAX_MANIFEST_BYTES) + 1)
    try:
        return parse(data)
    except ManifestError as exc:
        raise type(exc)(exc.reason, path=str(ckpt_dir)) from None


def resolve_entry(ckpt_dir: Path, relpath: str) -> Path:
    """The real path of a manifest entry, refusing symlinks anywhere below ``ckpt_dir``."""
    current = ckpt_dir
    for part in relpath.split("/"):
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise VerificationError(f"{relpath} is missing", path=str(ckpt_dir)) from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(f"{relpath} goes through a symlink", path=str(ckpt_dir))
    if not stat.S_ISREG(st.st_mode):
        raise VerificationError(f"{relpath} is not a regular file", path=str(ckpt_dir))
    return current


def verify(
    ckpt_dir: str | os.PathLike,
    level: Level = "fast",
    *,
    only: Iterable[str] | None = None,
    manifest: Manifest | None = None,
) -> Manifest:
    """Verify one checkpoint directory; raise a :class:`CheckpointError` with the reason.

    ``only`` restricts the checksum pass to some files (ranks share the full pass of a
    distributed restore); the fast checks always cover every file.
    """
    if level not in LEVELS:
        raise ValueError(f"verification level must be one of {LEVELS}, got {level!r}")
    ckpt_dir = Path(ckpt_dir)
    if ckpt_dir.is_symlink():
        raise UnsafePathError("checkpoint directory is a symlink", path=str(ckpt_dir))
    m = manifest if manifest is not None else read_manifest(ckpt_dir)
    parsed = parse_name(ckpt_dir.name)
    if parsed is not None and parsed[0] != m.global_step:
        raise VerificationError(
            f"directory name says step {parsed[0]} but the manifest says {m.global_step}",
            path=str(ckpt_dir),
        )
    if ".metadata" not in m.files:
        raise VerificationError("manifest lists no DCP .metadata", path=str(ckpt_dir))
    real: dict[str, Path] = {}
    for rel, entry in m.files.items():
        p = resolve_entry(ckpt_dir, rel)
        size = p.stat().st_size
        if size != entry.size:
            raise VerificationError(
                f"{rel} is {size} bytes, the manifest says {entry.size} (truncated?)",
                path=str(ckpt_dir),
            )
        real[rel] = p
    if level == "full":
        names = m.files.keys() if only is None else only
        for rel in names:
            entry = m.files[rel]
            size, digest = hash_file(real[rel], m.checksum_algorithm)
            if size != entry.size:
                raise VerificationError(f"{rel} changed size while verified", path=str(ckpt_dir))
            if digest != entry.digest:
                raise VerificationError(
                    f"{rel} fails its {m.checksum_algorithm} checksum (corrupt)", path=str(ckpt_dir)
                )
    return m


def latest_complete(
    root: str | os.PathLike,
    level: Level = "fast",
    *,
    exclude: Iterable[str] = (),
    max_step: int | None = None,
) -> Discovery:
    """The newest checkpoint under ``root`` that verifies at ``level``, with skip reasons.

    Every published directory is tried newest first until one verifies, so a good checkpoint
    is never missed because newer ones are bad, and an unverified one is never returned.
    ``exclude`` names directories to pass over (e.g. ones marked suspect by the supervisor).
    """
    skipped: list[Skipped] = []
    excluded = set(exclude)
    for cand in candidates(root):
        if cand.name in excluded:
            skipped.append(Skipped(cand.name, "excluded by the caller (marked suspect)"))
            continue
        if max_step is not None and cand.step > max_step:
            skipped.append(Skipped(cand.name, f"newer than the requested step {max_step}"))
            continue
        try:
            manifest = verify(cand.path, level)
        except Exception as exc:  # noqa: BLE001 - a damaged checkpoint is passed over, never raised
            skipped.append(Skipped(cand.name, refusal(exc)))
            continue
        return Discovery(Verified(cand.path, manifest, level), skipped)
    return Discovery(None, skipped)


def refusal(exc: BaseException) -> str:
    """Why a checkpoint was refused, in one line: a :class:`CheckpointError`'s reason, an I/O
    error as unreadable, anything else (a defect of this reader, never the caller's problem:
    discovery moves on) with its type."""
    if isinstance(exc, CheckpointError):
        return exc.reason
    if isinstance(exc, OSError):
        return f"unreadable: {exc}"
    return f"unexpected {type(exc).__name__} while verifying: {str(exc)[:200]}"


def require_latest(root: str | os.PathLike, level: Level = "fast", **kw) -> Verified:
    found = latest_complete(root, level, **kw)
    if found.checkpoint is None:
        raise NoCheckpointError(
            "no checkpoint verifies" + (f" ({len(found.skipped)} skipped)" if found.skipped else ""),
            path=str(root),
            skipped=found.skipped,
        )
    return found.checkpoint


@dataclass
class PruneResult:
    """What :func:`prune` did. ``kept`` includes ``failed`` (kept as evidence) and protected ones."""

    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    removed_partial: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)  # passed full verification in this call
    failed: list[Skipped] = field(default_factory=list)  # failed verification or known bad: kept as evidence
    skipped: list[Skipped] = field(default_factory=list)  # left alone (e.g. a symlinked in-flight dir), with why


def prune(
    root: str | os.PathLike,
    keep: int,
    *,
    dry_run: bool = False,
    remove_partial: bool = False,
    partial_grace_s: float = 3600.0,
    protect: Iterable[str] = (),
    now: float | None = None,
    verified: Iterable[str] = (),
    known_bad: Iterable[str] = (),
    release: str = "",
) -> PruneResult:
    """Keep the newest ``keep`` (>= 2) checkpoints that pass full verification; delete older ones.

    Newest first, each checkpoint that could count toward ``keep`` is verified at the ``full``
    level (every checksum), except names in ``verified``, which the caller vouches for (this
    process wrote them, or checked their checksums): those get the ``fast`` checks only. One
    that fails is kept as evidence and does not count, and so are names in ``known_bad`` (e.g.
    checkpoints a restore in this process found corrupt), without being read. So the newest
    checkpoint that passes full verification is always kept, whatever is newer than it.
    Checkpoints beyond the ``keep`` counted ones are removed if they pass the fast checks
    (one that does not is evidence and stays). Never removed: anything in ``protect`` (the
    supervisor's restore point, suspects), saves in flight. With ``remove_partial``, partial
    saves are removed only when their writer is provably gone (same host, dead pid) or they
    are older than ``partial_grace_s``; one that is not a real directory (a symlink) is left
    alone, never followed, and reported in ``skipped``.

    With ``release`` (the version of the job pruning), the newest checkpoint written by another
    release (its manifest's) is kept too: a new version's first saves never remove the last one
    its predecessor can read, which a rollback to that predecessor resumes from.
    """
    if keep < 2:
        raise ValueError("keep must be at least 2: the newest checkpoint may still be unproven")
    result = PruneResult()
    protected = set(protect)
    vouched = set(verified)
    bad = set(known_bad)
    counted = 0
    other_kept = not release  # the newest checkpoint of another release is kept (see above)
    for cand in candidates(root):
        name = cand.name
        if name in bad:
            result.kept.append(name)
            result.failed.append(Skipped(name, "known bad to the caller (kept as evidence)"))
            continue
        if counted < keep:
            level: Level = "fast" if name in vouched else "full"
            try:
                manifest = verify(cand.path, level)
            except Exception as exc:  # noqa: BLE001 - kept as evidence, never raised
                result.kept.append(name)
                result.failed.append(Skipped(name, refusal(exc)))
                continue
            other_kept = other_kept or manifest.release != release
            counted += 1
            result.kept.append(name)
            if level == "full":
                result.verified.append(name)
            continue
        if name in protected:
            result.kept.append(name)
            continue
        try:
            manifest = verify(cand.path, "fast")
        except Exception as exc:  # noqa: BLE001 - kept as evidence, never raised
            result.kept.append(name)
            result.failed.append(Skipped(name, refusal(exc)))
            continue
        if not other_kept and manifest.release != release:
            other_kept = True
            result.kept.append(name)
            continue
        if not dry_run:
            try:
                remove_tree(cand.path)
            except OSError as exc:
                result.skipped.append(Skipped(name, f"could not be removed: {exc}"))
                continue
        result.removed.append(name)
    if remove_partial:
        now = time.time() if now is None else now
        for tmp in in_flight(root):
            try:
                st = os.lstat(tmp)
            except FileNotFoundError:
                continue  # finished or removed meanwhile
            if stat.S_ISLNK(st.st_mode):
                result.skipped.append(Skipped(tmp.name, "in-flight entry is a symlink: left alone, not followed"))
                continue
            if not stat.S_ISDIR(st.st_mode):
                result.skipped.append(Skipped(tmp.name, "in-flight entry is not a directory: left alone"))
                continue
            if _partial_is_stale(tmp, now, partial_grace_s):
                if not dry_run:
                    try:
                        remove_tree(tmp, trash_prefix=".deleting")
                    except OSError as exc:
                        result.skipped.append(Skipped(tmp.name, f"could not be removed: {exc}"))
                        continue
                result.removed_partial.append(tmp.name)
    return result


def write_owner(tmp_dir: Path, attempt: int) -> None:
    (tmp_dir / OWNER_NAME).write_text(
        json.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(), "attempt": attempt, "created_unix": time.time()}
        )
    )


_MAX_OWNER_BYTES = 64 << 10


def _read_owner(tmp: Path) -> dict:
    """OWNER.json of a save in flight: a small regular file, never followed through a symlink
    (a link to a FIFO or a device would hang or flood the reader)."""
    fd = os.open(tmp / OWNER_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("OWNER.json is not a regular file")
        return json.loads(f.read(_MAX_OWNER_BYTES))  # a bounded read, whatever the file claims


def _partial_is_stale(tmp: Path, now: float, grace_s: float) -> bool:
    try:
        owner = _read_owner(tmp)
        host, pid, created = owner["host"], int(owner["pid"]), float(owner["created_unix"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
        # unreadable, or not what a writer leaves (a 400-digit time, 64 KiB of '['): judged by its age
        try:
            return now - os.lstat(tmp).st_mtime > grace_s
        except OSError:
            return False
    if host == socket.gethostname() and not pid_alive(pid):
        return True
    return now - created > grace_s
