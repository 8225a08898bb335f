"""The completion manifest: the one file that makes a checkpoint directory trustworthy.

Its fields follow the seed's ``checkpoint-manifest.yaml`` (format_version, status,
global_step, writer_world_size, the logical model/optimizer state with shard counts,
trainer_state, checksums). It is stored as ``manifest.json``: JSON is a subset of YAML (any
YAML tool reads it) without anchors, aliases or tags, so parsing a hostile file is bounded by
its size, which is capped before a byte is parsed.

A manifest is written last, after every file it lists is durable, and it names each file
with its size and digest. Readers trust nothing that it does not list, and nothing it lists
may point outside the checkpoint directory.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from supervisor.checkpoint.checksum import ALGORITHMS
from supervisor.checkpoint.errors import ManifestError, UnsafePathError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = frozenset({1})
STATUS_COMPLETE = "complete"
# A manifest lists one entry per file: ~100 bytes each. 64 MiB is ~600k files, far beyond
# any real job (DCP writes thread_count files per rank), and small enough to parse safely.
MAX_MANIFEST_BYTES = 64 << 20
MAX_PATH_CHARS = 1024
MAX_DEPTH = 64
"""Nesting of the whole document (a real manifest nests 5 deep; ``config`` is the job's own)."""
MAX_INT = (1 << 63) - 1
"""Steps, sizes, world sizes and attempts: a 64-bit count at most (what ``st_size`` and every
consumer can hold); a larger integer is refused, never converted."""
MAX_CURSOR_INT = (1 << 128) - 1
"""The data cursor's fields (its seed may be any large integer the job chose)."""
MAX_CREATED_UNIX = 1e11
_HEX = re.compile(r"^[0-9a-f]{8,128}$")
_RELEASE = re.compile(r"[0-9A-Za-z_-]{0,64}")


@dataclass(frozen=True)
class FileEntry:
    size: int
    digest: str


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated manifest. Build one with :meth:`from_dict` or :func:`parse`."""

    global_step: int
    writer_world_size: int
    checksum_algorithm: str
    files: dict[str, FileEntry]
    created_at: str = ""
    created_unix: float = 0.0
    torch_version: str = ""
    supervisor_version: str = ""
    attempt: int = 0
    release: str = ""
    """The version of the job that wrote it (``SUPERVISOR_RELEASE``; "" when unsupervised)."""
    states: dict[str, Any] = field(default_factory=dict)
    trainer_state: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    status: str = STATUS_COMPLETE

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "status": self.status,
            "global_step": self.global_step,
            "writer_world_size": self.writer_world_size,
            "created_at": self.created_at,
            "created_unix": self.created_unix,
            "torch_version": self.torch_version,
            "supervisor_version": self.supervisor_version,
            "attempt": self.attempt,
            **({"release": self.release} if self.release else {}),
            "states": self.states,
            "trainer_state": self.trainer_state,
            "config": self.config,
            "checksums": {
                "algorithm": self.checksum_algorithm,
                "files": {
                    p: {"size": e.size, "digest": e.digest} for p, e in sorted(self.files.items())
                },
            },
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1).encode()

    @classmethod
    def from_dict(cls, raw: Any) -> "Manifest":
        if not isinstance(raw, dict):
            raise ManifestError(f"manifest must be a mapping, got {type(raw).__name__}")
        check_plain(raw)
        version = raw.get("format_version")
        if not _is_int(version):
            raise ManifestError("manifest has no integer format_version")
        if version not in SUPPORTED_FORMAT_VERSIONS:
            newest = max(SUPPORTED_FORMAT_VERSIONS)
            hint = " (written by a newer supervisor: upgrade to read it)" if version > newest else ""
            raise ManifestError(
                f"unknown manifest format_version {_short(version)}; this reader supports "
                f"{sorted(SUPPORTED_FORMAT_VERSIONS)}{hint}"
            )
        status = raw.get("status")
        if status != STATUS_COMPLETE:
            raise ManifestError(f"manifest status is {_short(status)}, not {STATUS_COMPLETE!r}")
        step = _int_field(raw, "global_step", minimum=0)
        world = _int_field(raw, "writer_world_size", minimum=1)
        checksums = raw.get("checksums")
        if not isinstance(checksums, dict):
            raise ManifestError("manifest has no checksums mapping")
        algorithm = checksums.get("algorithm")
        if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
            raise ManifestError(
                f"unknown checksum algorithm {_short(algorithm)} (checksums.algorithm); known: "
                f"{', '.join(sorted(ALGORITHMS))}"
            )
        raw_files = checksums.get("files")
        if not isinstance(raw_files, dict) or not raw_files:
            raise ManifestError("manifest lists no files")
        files: dict[str, FileEntry] = {}
        for path, entry in raw_files.items():
            check_relative_path(path)
            if not isinstance(entry, dict):
                raise ManifestError(f"file entry for {_short(path)} is not a mapping")
            size = entry.get("size")
            digest = entry.get("digest")
            if not _is_int(size) or not 0 <= size <= MAX_INT:
                raise ManifestError(f"file entry for {_short(path)} has no valid size")
            if not isinstance(digest, str) or not _HEX.match(digest):
                raise ManifestError(f"file entry for {_short(path)} has no valid hex digest")
            files[path] = FileEntry(size=size, digest=digest)
        trainer_state = _mapping(raw, "trainer_state")
        for ref in _referenced_files(trainer_state):
            check_relative_path(ref)
            if ref not in files:
                raise ManifestError(f"trainer_state refers to {_short(ref)}, which is not checksummed")
        if "data_cursor" in trainer_state:
            _check_cursor(trainer_state["data_cursor"])
        created_unix = raw.get("created_unix", 0.0)
        # an integer is compared before any float(): a 400-digit one does not fit a float
        if (not isinstance(created_unix, (int, float)) or isinstance(created_unix, bool)
                or not 0 <= created_unix < MAX_CREATED_UNIX or not math.isfinite(created_unix)):
            raise ManifestError(f"created_unix must be a finite number in [0, {MAX_CREATED_UNIX:g}), got "
                                f"{_short(created_unix)}")
        attempt = raw.get("attempt", 0)
        release = raw.get("release", "")
        if not isinstance(release, str) or not _RELEASE.fullmatch(release):
            raise ManifestError(f"release must be a version id (up to 64 letters, digits, '-', '_'), got "
                                f"{_short(release)}")
        return cls(
            format_version=version,
            status=status,
            global_step=step,
            writer_world_size=world,
            checksum_algorithm=algorithm,
            files=files,
            created_at=str(raw.get("created_at", "")),
            created_unix=float(created_unix),
            torch_version=str(raw.get("torch_version", "")),
            supervisor_version=str(raw.get("supervisor_version", "")),
            attempt=attempt if _is_int(attempt) and 0 <= attempt <= MAX_INT else 0,
            release=release,
            states=_mapping(raw, "states"),
            trainer_state=trainer_state,
            config=_mapping(raw, "config"),
        )


def parse(data: bytes) -> Manifest:
    """Parse manifest bytes with a size cap; every problem is a :class:`ManifestError`."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest is larger than the {MAX_MANIFEST_BYTES} byte limit")
    if not data.strip():
        raise ManifestError("manifest is empty (truncated write?)")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"manifest is not valid JSON (truncated or garbled): {exc}") from None
    except RecursionError:
        raise ManifestError("manifest nests too deeply") from None
    return Manifest.from_dict(raw)


def check_plain(raw: Any) -> None:
    """Bounds every manifest holds, checked without recursion before any field is read: at most
    :data:`MAX_DEPTH` levels of nesting, only finite numbers, and only strings that are valid
    Unicode (a lone surrogate, which JSON's ``\\ud800`` escape makes, cannot be printed, logged
    or used as a path). The error names the field."""
    # (value, depth, where): ``where`` is (parent's where, key), rendered only for an error
    stack: list[tuple[Any, int, Any]] = [(raw, 1, None)]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, dict):
            if depth > MAX_DEPTH:
                raise ManifestError(f"{_field(where)}: nests deeper than {MAX_DEPTH} levels")
            for k, v in value.items():
                _check_text(k, where)
                stack.append((v, depth + 1, (where, k)))
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                raise ManifestError(f"{_field(where)}: nests deeper than {MAX_DEPTH} levels")
            stack.extend((v, depth + 1, (where, i)) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ManifestError(f"{_field(where)}: {value} is not a finite number")


def _field(where: Any) -> str:
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}"[:100])
    return "manifest field " + ("".join(reversed(parts)).lstrip(".") or "(top level)")


def _check_text(s: str, where: Any) -> None:
    if not s.isascii():
        try:
            s.encode()
        except UnicodeEncodeError as exc:
            raise ManifestError(f"{_field(where)}: a string that is not valid Unicode ({exc.reason} at "
                                f"character {exc.start})") from None


def check_relative_path(path: Any) -> str:
    """Refuse any manifest path that is not a plain relative path inside the directory.

    Symlinks are checked against the real file system at verification time; this is the
    syntactic half: no absolute paths, no ``..``, no ``.``/empty components, no NUL or
    backslash (which some tools treat as a separator).
    """
    if not isinstance(path, str) or not path:
        raise UnsafePathError(f"manifest path {_short(path)} is not a non-empty string")
    if len(path) > MAX_PATH_CHARS:
        raise UnsafePathError(f"manifest path is longer than {MAX_PATH_CHARS} characters")
    if "\x00" in path or "\\" in path:
        raise UnsafePathError(f"manifest path {_short(path)} contains NUL or a backslash")
    if path.startswith("/"):
        raise UnsafePathError(f"manifest path {_short(path)} is absolute")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"manifest path {_short(path)} escapes or is not normalised")
    if PurePosixPath(path).is_absolute():
        raise UnsafePathError(f"manifest path {_short(path)} is absolute")
    return path


def _referenced_files(trainer_state: dict[str, Any]) -> list[str]:
    refs: list[str] = []
    for key in ("scheduler", "grad_scaler"):
        if trainer_state.get(key) is not None:
            refs.append(trainer_state[key])
    extras = trainer_state.get("extras") or {}
    if not isinstance(extras, dict):
        raise ManifestError("trainer_state.extras is not a mapping")
    refs.extend(extras.values())
    rng = trainer_state.get("rng") or {}
    if not isinstance(rng, dict):
        raise ManifestError("trainer_state.rng is not a mapping")
    files = rng.get("files") or []
    if not isinstance(files, list):
        raise ManifestError("trainer_state.rng.files is not a list")
    refs.extend(files)
    return refs


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v: Any) -> str:
    """``repr`` for an error message, bounded (a value may be a 4,000-digit integer or a long list)."""
    if _is_int(v) and not -(10**30) < v < 10**30:
        return f"an integer of {len(str(abs(v)))} digits"
    text = repr(v) if not isinstance(v, (dict, list)) else f"a {type(v).__name__} of {len(v)} items"
    return text if len(text) <= 80 else text[:77] + "..."


def _int_field(raw: dict, key: str, minimum: int) -> int:
    v = raw.get(key)
    if not _is_int(v) or not minimum <= v <= MAX_INT:
        raise ManifestError(f"manifest field {key} must be an integer >= {minimum} (below 2**63), got {_short(v)}")
    return v


def _check_cursor(cursor: Any) -> None:
    """``trainer_state.data_cursor`` is applied by a restore: refused here, before anything loads."""
    if not isinstance(cursor, dict):
        raise ManifestError(f"trainer_state.data_cursor must be a mapping, got {type(cursor).__name__}")
    for key in ("seed", "epoch", "position", "total"):
        v = cursor.get(key)
        if not _is_int(v) or not 0 <= v <= MAX_CURSOR_INT:
            raise ManifestError(f"trainer_state.data_cursor.{key} must be an integer in [0, 2**128), got {_short(v)}")


def _mapping(raw: dict, key: str) -> dict[str, Any]:
    v = raw.get(key, {})
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ManifestError(f"manifest field {key} must be a mapping")
    return v
