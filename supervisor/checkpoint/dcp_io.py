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

The reader refuses DCP metadata that names a file outside the manifest's list.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from supervisor.checkpoint.errors import UnsafePathError
from supervisor.checkpoint.fsutil import HashingFile

AfterFile = Callable[[str], None]


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
    """DCP reader that refuses any storage file the manifest does not list."""

    def __init__(self, path: Path, allowed: set[str]) -> None:
        super().__init__(path)
        self.allowed = allowed

    def read_metadata(self, *args, **kwargs):
        metadata = super().read_metadata(*args, **kwargs)
        for info in (metadata.storage_data or {}).values():
            rel = getattr(info, "relative_path", None)
            if rel not in self.allowed:
                raise UnsafePathError(
                    f"DCP metadata refers to {rel!r}, which the manifest does not list", path=str(self.path)
                )
        return metadata
