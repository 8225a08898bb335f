"""DCP storage adapters: a writer that checksums while it writes, a reader that stays inside.

The writer is DCP's own ``FileSystemWriter`` (so a plain ``dcp.load`` reads the result) with
three changes, each for a measured trap in torch 2.13:

* every file goes through :class:`~supervisor.checkpoint.fsutil.HashingFile`, so the digest
  the manifest needs costs no second read, and a file is created exclusively (a stale file
  is never overwritten);
* torch.save's zip CRC32 (computed at ~2 GiB/s and never checked on load) is switched off in
  the writer threads, where the setting lives (it is per thread);
* an I/O error in one of DCP's extra writer threads, which DCP would drop with the thread
  and then publish metadata without that file, is raised instead.

DCP's ``.metadata`` is a pickle. It is read only by :func:`read_dcp_metadata`, an unpickler
that resolves nothing but the classes a DCP metadata file is made of (listed by saving real
DDP, FSDP2 and plain checkpoints with torch 2.13 and recording every global their pickles
name), so a crafted file cannot run code; and every storage file it names must be one the
manifest lists, so it cannot send a load outside the checkpoint.

The reader refuses DCP metadata that names a file outside the manifest's list, and reads a
tensor straight from the file into its destination when it safely can (the whole saved
chunk, same dtype, contiguous on both sides, no stream transform): it learns the tensor's
layout from the pickle alone (``torch.load(map_location="meta")`` reads no data) and the
byte offset of its storage from the zip directory, then ``readinto`` the destination. DCP's
own path (``torch.load`` into a fresh tensor, then a copy) allocates and touches every byte
twice; it remains the fallback for everything else (resharded slices, transforms, odd
layouts), so the result is the same either way.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.planner import LoadItemType
from torch.distributed.checkpoint.utils import _create_file_view
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.futures import Future

from supervisor.checkpoint.checksum import hash_file, new_hasher
from supervisor.checkpoint.errors import UnsafeContentError, UnsafePathError, VerificationError
from supervisor.checkpoint.fsutil import HashingFile

AfterFile = Callable[[str], None]

METADATA_NAME = ".metadata"


def _allowed_globals() -> dict[tuple[str, str], object]:
    """Every global a torch 2.13 DCP ``.metadata`` pickle names, and nothing else.

    Found by saving real checkpoints (DDP, FSDP2 ``fully_shard``, plain bf16/fp32 modules with
    AdamW state and non-tensor entries) and recording each ``find_class`` call. All of them are
    plain data: dataclasses whose ``__init__``/``__setstate__`` only store fields, an enum, a
    path, ``torch.Size`` and dtype/layout constants. No callable here reaches the OS.
    """
    md = dcp_metadata
    allowed: dict[tuple[str, str], object] = {
        ("torch.distributed.checkpoint.metadata", cls.__name__): cls
        for cls in (md.Metadata, md.MetadataIndex, md.StorageMeta, md.TensorProperties, md.TensorStorageMetadata,
                    md.ChunkStorageMetadata, md.BytesStorageMetadata, md._MEM_FORMAT_ENCODING)
    }
    allowed[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = _StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout  # layout by name, from a cache
    allowed[("pathlib", "PosixPath")] = __import__("pathlib").PosixPath  # StorageMeta.checkpoint_id
    allowed[("pathlib", "PurePosixPath")] = __import__("pathlib").PurePosixPath
    allowed[("collections", "OrderedDict")] = __import__("collections").OrderedDict
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype):  # pickled as the constant torch.<name>
            allowed[("torch", name)] = value
    return allowed


_ALLOWED_GLOBALS = _allowed_globals()


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :func:`_allowed_globals`: a ``__reduce__`` payload
    (``os.system``, ``builtins.eval``, ``subprocess.Popen``...) fails at its first global."""

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"references {module}.{name}, which a DCP metadata file never "
                                         "needs") from None

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("uses a persistent id, which a DCP metadata file never does")


def read_dcp_metadata(ckpt_dir: str | os.PathLike, allowed: set[str] | frozenset[str],
                      name: str = METADATA_NAME) -> "dcp_metadata.Metadata":
    """Read a checkpoint's DCP metadata without trusting it.

    The pickle is loaded by an unpickler that allows only the DCP metadata classes (a crafted
    file cannot run code: it is refused at its first other global), the file is opened without
    following a symlink, and every storage file it names must be in ``allowed`` (the
    manifest's list), so a load cannot read outside the checkpoint. Raises
    :class:`UnsafeContentError` or :class:`UnsafePathError` with the reason.
    """
    ckpt_dir = Path(ckpt_dir)
    if name not in allowed:
        raise UnsafePathError(f"DCP metadata {name!r} is not listed in the manifest", path=str(ckpt_dir))
    try:
        fd = os.open(ckpt_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise VerificationError(f"cannot open DCP {name} (missing or a symlink): {exc.strerror}",
                                path=str(ckpt_dir)) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise VerificationError(f"DCP {name} is not a regular file", path=str(ckpt_dir))
        try:
            metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as exc:
            raise UnsafeContentError(f"DCP {name} {exc}: refused without running it", path=str(ckpt_dir)) from None
        except Exception as exc:  # noqa: BLE001 - any other failure of a hostile or garbled pickle
            raise UnsafeContentError(f"DCP {name} is not a readable DCP metadata pickle "
                                     f"({type(exc).__name__}: {str(exc)[:200]})", path=str(ckpt_dir)) from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise UnsafeContentError(f"DCP {name} holds a {type(metadata).__name__}, not DCP Metadata",
                                 path=str(ckpt_dir))
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise UnsafeContentError(f"DCP {name} has no storage_data mapping", path=str(ckpt_dir))
    for info in storage.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(info, _StorageInfo) or not isinstance(rel, str):
            raise UnsafeContentError(f"DCP {name} has a storage entry that is not a file reference",
                                     path=str(ckpt_dir))
        if rel not in allowed:
            raise UnsafePathError(f"DCP metadata refers to {rel!r}, which the manifest does not list",
                                  path=str(ckpt_dir))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (info.offset, info.length)):
            raise UnsafeContentError(f"DCP {name} has a storage entry with a bad offset or length",
                                     path=str(ckpt_dir))
    return metadata


class _HashingFileSystem(FileSystem):
    def __init__(self, root: Path, algorithm: str, after_file: AfterFile | None) -> None:
        self.root = root
        self.algorithm = algorithm
        self.after_file = after_file
        self.records: dict[str, tuple[int, str]] = {}
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()

    def _rel(self, path: Path) -> str:
        return Path(path).relative_to(self.root).as_posix()

    def _record(self, f: HashingFile) -> None:
        with self._lock:
            self.records[self._rel(f.path)] = (f.size, f.digest)  # type: ignore[assignment]
        if self.after_file is not None:
            self.after_file(self._rel(f.path))

    @contextmanager
    def create_stream(self, path, mode):
        if "w" not in mode:
            with open(path, mode) as f:
                yield f
            return
        previous_crc = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            f = HashingFile(path, self.algorithm, on_close=self._record)
            try:
                yield f
                f.close()
            except OSError as exc:
                # Recorded and raised by HashingWriter.write_data once every writer thread has
                # stopped. Not re-raised here: in one of DCP's extra threads it would only kill
                # the thread and print a second traceback for the same disk error.
                f.abort()
                with self._lock:
                    self.errors.append(exc)
        except OSError as exc:  # the file could not even be created
            with self._lock:
                self.errors.append(exc)
        finally:
            torch.serialization.set_crc32_options(previous_crc)

    def rename(self, path, new_path) -> None:
        os.rename(path, new_path)
        with self._lock:
            rec = self.records.pop(self._rel(path), None)
            if rec is not None:
                self.records[self._rel(new_path)] = rec

    def rm_file(self, path) -> None:
        os.unlink(path)
        with self._lock:
            self.records.pop(self._rel(path), None)


class HashingWriter(FileSystemWriter):
    """DCP writer into a fresh directory; ``records`` maps relative path -> (size, digest)."""

    def __init__(self, path: Path, algorithm: str, thread_count: int, after_file: AfterFile | None = None) -> None:
        super().__init__(
            path,
            single_file_per_rank=True,
            sync_files=True,
            thread_count=thread_count,
            overwrite=False,
        )
        self.fs = _HashingFileSystem(Path(path), algorithm, after_file)
        self.metadata = None

    @property
    def records(self) -> dict[str, tuple[int, str]]:
        return dict(self.fs.records)

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        if self.fs.errors:
            raise self.fs.errors[0]
        return fut

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        self.metadata = metadata


class ManifestReader(FileSystemReader):
    """DCP reader that refuses any storage file the manifest does not list (and reads fast).

    With ``digests`` (relative path -> expected digest, in ``algorithm``), every storage file
    this reader reads from is verified in the same pass: the file is read from start to end
    once, each tensor that can be read straight into place is, the bytes between them go
    through a small scratch buffer, and all of it feeds the checksum. A file the plan reads
    only a small part of (a resharded load) is checksummed whole first instead. A mismatch
    raises :class:`VerificationError` before the file's tensors are committed and sets
    ``corrupt``; tensors already read from it hold bad bytes, so the caller must load
    another checkpoint over them (or rebuild the model).
    """

    def __init__(self, path: Path, allowed: set[str], *, digests: dict[str, str] | None = None,
                 algorithm: str = "") -> None:
        super().__init__(path)
        self.allowed = allowed
        self.digests = digests
        self.algorithm = algorithm
        self.corrupt: str | None = None
        self.unsafe: str | None = None
        """Why a non-tensor entry was refused (it would have run code when unpickled)."""
        self.direct_reads = 0
        self.fallback_reads = 0
        self.verified_inline: list[str] = []
        self.verified_whole: list[str] = []

    def read_metadata(self, *args, **kwargs):
        """DCP's ``read_metadata`` without ``pickle.load``: see :func:`read_dcp_metadata`."""
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
        metadata = read_dcp_metadata(self.path, self.allowed, name)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan, planner):
        per_file: dict[str, list] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for relative_path, reqs in per_file.items():
            # listed (read_metadata checked it) and verified free of symlinks; O_NOFOLLOW narrows the
            # window for a file swapped for a link after that check
            fd = os.open(Path(self.path) / relative_path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as stream:
                reqs = sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset)
                placed: dict[int, tuple[int, int, torch.Tensor]] = {}  # request -> (offset, bytes, target)
                targets: dict[int, torch.Tensor] = {}
                for i, req in enumerate(reqs):
                    if req.type == LoadItemType.BYTE_IO:
                        continue
                    targets[i] = planner.resolve_tensor(req).detach()
                    where = self._locate(stream, self.storage_data[req.storage_index], req, targets[i])
                    if where is not None:
                        placed[i] = (*where, targets[i])
                if self.digests is not None:
                    self._verify_while_reading(stream, relative_path, placed)
                else:
                    for offset, nbytes, target in placed.values():
                        _read_into(stream, offset, nbytes, target, relative_path)
                self.direct_reads += len(placed)
                for i, req in enumerate(reqs):
                    info = self.storage_data[req.storage_index]
                    if req.type == LoadItemType.BYTE_IO:
                        view = _create_file_view(stream, info.offset, info.length)
                        data = self.transforms.transform_load_stream(req, info.transform_descriptors or (), view)
                        raw = data.read(-1)
                        # DCP's planner unpickles non-tensor entries (optimizer param_groups, ...)
                        # with weights_only=False: only bytes that torch's weights-only loader
                        # accepts (tensors, containers, primitives: no code) may reach it
                        try:
                            torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
                        except Exception as exc:  # noqa: BLE001 - any refusal is a refusal
                            fqn = req.dest_index.fqn
                            self.unsafe = (f"{relative_path}: entry {fqn} would run code when unpickled "
                                           f"({type(exc).__name__}); refused without running it")[:300]
                            raise UnsafeContentError(self.unsafe, path=str(self.path)) from None
                        planner.load_bytes(req, io.BytesIO(raw))
                        continue
                    target = targets[i]
                    if i not in placed:
                        self.fallback_reads += 1
                        view = _create_file_view(stream, info.offset, info.length)
                        data = self.transforms.transform_load_stream(req, info.transform_descriptors or (), view)
                        if not data.seekable():
                            data = io.BytesIO(data.read(-1))
                        tensor = torch.load(data, map_location="cpu", weights_only=True)
                        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                        if target.size() != tensor.size():
                            raise ValueError(f"{req.storage_index}: size {tuple(tensor.size())} does not fit "
                                             f"{tuple(target.size())}")
                        target.copy_(tensor)
                    planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _verify_while_reading(self, stream, relative_path: str, placed: dict) -> None:
        expected = self.digests.get(relative_path) if self.digests is not None else None
        if expected is None:
            raise VerificationError(f"{relative_path} has no checksum in the manifest", path=str(self.path))
        size = os.fstat(stream.fileno()).st_size
        segments = sorted(placed.values(), key=lambda p: p[0])
        disjoint = all(a[0] + a[1] <= b[0] for a, b in zip(segments, segments[1:]))
        if disjoint and sum(n for _, n, _ in segments) * 2 >= size:
            # one pass: tensors straight into place, the bytes between them through a scratch buffer
            hasher = new_hasher(self.algorithm)
            scratch = memoryview(bytearray(min(size, 8 << 20) or 1))
            pos = 0
            stream.seek(0)
            for offset, nbytes, target in [*segments, (size, 0, None)]:
                while pos < offset:
                    n = stream.readinto(scratch[: min(len(scratch), offset - pos)])
                    if not n:
                        raise VerificationError(f"{relative_path} ended early (truncated?)", path=str(self.path))
                    hasher.update(scratch[:n])
                    pos += n
                if target is not None:
                    dest = _read_into(stream, offset, nbytes, target, relative_path)
                    hasher.update(dest)
                    pos = offset + nbytes
            digest = hasher.hexdigest()
            self.verified_inline.append(relative_path)
        else:
            # a small part of a big file (resharding): checksum it whole, then read the part
            _, digest = hash_file(Path(self.path) / relative_path, self.algorithm)
            for offset, nbytes, target in segments:
                _read_into(stream, offset, nbytes, target, relative_path)
            self.verified_whole.append(relative_path)
        if digest != expected:
            self.corrupt = relative_path
            raise VerificationError(f"{relative_path} fails its {self.algorithm} checksum (corrupt)",
                                    path=str(self.path))

    @staticmethod
    def _locate(stream, info, req, target: torch.Tensor) -> tuple[int, int] | None:
        """(file offset, byte count) of the tensor's raw bytes when it can be read straight into
        ``target`` (the whole saved chunk, same dtype and shape, contiguous, no transform)."""
        if info.transform_descriptors or target.device.type != "cpu" or not target.is_contiguous():
            return None
        if target.dim() == 0 or target.numel() == 0 or any(o != 0 for o in req.storage_offsets):
            return None
        try:
            view = _create_file_view(stream, info.offset, info.length)
            meta = torch.load(view, map_location="meta", weights_only=True)  # the pickle only: no data
            view.seek(0)
            records = [r for r in torch._C.PyTorchFileReader(view).get_all_records() if r.startswith("data/")]
            if len(records) != 1 or not isinstance(meta, torch.Tensor):
                return None
            view.seek(0)
            zipped = torch._C.PyTorchFileReader(view)
            size, offset = zipped.get_record_size(records[0]), zipped.get_record_offset(records[0])
        except (RuntimeError, ValueError, OSError, EOFError):
            return None
        nbytes = target.numel() * target.element_size()
        if (meta.dtype != target.dtype or tuple(meta.shape) != tuple(target.shape) or tuple(req.lengths) != tuple(meta.shape)
                or not meta.is_contiguous() or meta.storage_offset() != 0 or size != nbytes
                or offset + size > info.length):
            return None
        return info.offset + offset, nbytes


def _read_into(stream, offset: int, nbytes: int, target: torch.Tensor, name: str) -> memoryview:
    dest = memoryview(target.view(torch.uint8).numpy()).cast("B")
    stream.seek(offset)
    filled = 0
    while filled < nbytes:
        n = stream.readinto(dest[filled:])
        if not n:
            raise OSError(f"{name}: file ended {nbytes - filled} bytes early")
        filled += n
    return dest
