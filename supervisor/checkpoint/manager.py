"""Save and restore the complete continuation state of a (distributed) training job.

Usage, identical on every rank (construct the manager at the same point on all ranks: it
creates a process group of its own for checkpoint traffic)::

    cursor = DataCursor(seed=args.seed)
    ckpt = CheckpointManager(root, model=model, optimizer=opt, scheduler=sched,
                             cursor=cursor, seed=args.seed, config=vars(args))
    restored = ckpt.restore()            # None on a fresh start
    step = restored.step if restored else 0
    while step < total:
        ...train one step, cursor.advance(global_batch)...
        step += 1
        if step % every == 0:
            ckpt.save(step, blocking=False)  # async: blocked only while state is copied
    ckpt.close()                          # flush the save in flight

The commit protocol (two phases, marker last):

1. rank 0 creates a fresh ``.tmp-step-N-<random>`` directory (never reused) and broadcasts
   its name;
2. every rank writes its DCP shards (hashed while written, fsynced), its RNG file, and rank
   0 the trainer files; the records (path, size, digest) are gathered on rank 0;
3. rank 0 checks every expected file is there with its size (and that DCP's metadata names
   no file outside the records), writes ``manifest.json``, fsyncs it and the directories,
   publishes the directory with one ``rename`` and fsyncs the root;
4. the outcome is broadcast, so every rank returns the same result or raises the same
   :class:`CheckpointSaveError`. A failure removes the partial directory; nothing partial is
   ever published, so the previous checkpoint stays the latest.

A save runs its collectives on the manager's own gloo group, so the background thread of an
async save never interleaves with the training loop's collectives.
"""

from __future__ import annotations

import atexit
import copy
import functools
import io
import json
import logging
import os
import re
import threading
import time
import uuid
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

import supervisor
from supervisor.checkpoint.checksum import ALGORITHMS, DEFAULT_ALGORITHM
from supervisor.checkpoint.discovery import (
    LEVELS,
    OWNER_NAME,
    Level,
    Skipped,
    checkpoint_name,
    latest_complete,
    prune,
    verify,
    write_owner,
)
from supervisor.checkpoint.errors import (
    CheckpointError,
    CheckpointLoadError,
    CheckpointSaveError,
)
from supervisor.checkpoint.fsutil import HashingFile, dump_json, fsync_dir, remove_tree, write_durable
from supervisor.checkpoint.dcp_io import HashingWriter, ManifestReader, read_dcp_metadata
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from supervisor.protocol.vocabulary import Env
from supervisor.checkpoint.state import (
    MAX_RNG_BYTES,
    RNG_DERIVED,
    RNG_EXACT,
    RNG_GUARANTEE,
    DataCursor,
    PreparedRng,
    apply_rng,
    capture_rng,
    derived_seed,
    prepare_rng,
    seed_all,
)

log = logging.getLogger("supervisor.checkpoint")
# In a single process we pass no_dist=True on purpose; DCP warns about it on every call anyway.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

_EXTRA_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class SaveResult:
    step: int
    path: Path
    bytes: int
    seconds_blocked: float
    seconds_total: float


@dataclass(frozen=True)
class RestoreResult:
    step: int
    path: Path
    manifest: Manifest
    rng: str  # RNG_EXACT or RNG_DERIVED
    skipped: list[Skipped] = field(default_factory=list)


@dataclass
class _Snapshot:
    """Everything one save writes, captured by value at the moment ``save`` was called."""

    step: int
    app_state: dict[str, Any]
    rng: bytes
    trainer_files: dict[str, bytes]  # rank 0 only: relpath -> torch.save bytes
    trainer_state: dict[str, Any]
    blocked_s: float = 0.0


class CheckpointManager:
    """Complete, verified, resharding checkpoints for one job. See the module docstring.

    ``after_file(step, relpath)`` is called after each DCP shard file of a save is written
    (from a writer thread): the hook the fault injector uses to die between shard writes.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Stateful | None = None,
        grad_scaler: Stateful | None = None,
        cursor: DataCursor | None = None,
        seed: int = 0,
        config: dict[str, Any] | None = None,
        keep: int = 3,
        checksum: str = DEFAULT_ALGORITHM,
        verify_on_restore: Level = "full",
        io_threads: int = 2,
        attempt: int = 0,
        process_group: Any = None,
        after_file: Callable[[int, str], None] | None = None,
        release: str | None = None,
    ) -> None:
        if keep < 2:
            raise ValueError("keep must be at least 2: the newest checkpoint may still be unproven")
        if checksum not in ALGORITHMS:
            raise ValueError(f"unknown checksum {checksum!r}; known: {', '.join(sorted(ALGORITHMS))}")
        if verify_on_restore not in LEVELS:
            raise ValueError(f"verify_on_restore must be one of {LEVELS}")
        if io_threads < 1:
            raise ValueError("io_threads must be >= 1")
        self.root = Path(root)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_scaler = grad_scaler
        self.cursor = cursor if cursor is not None else DataCursor(seed=seed)
        self.seed = seed
        self.config = _jsonable(config or {})
        self.keep = keep
        self.checksum = checksum
        self.verify_on_restore = verify_on_restore
        self.io_threads = io_threads
        self.attempt = attempt
        # the version of the job writing (each manifest names it: a rejected release's checkpoints
        # are never restored); by default the supervisor's, from the environment it launched us with
        release = os.environ.get(Env.RELEASE, "") if release is None else release
        self.release = release if re.fullmatch(r"[0-9A-Za-z_-]{0,64}", release) else ""
        self.after_file = after_file
        self._extras: dict[str, Stateful] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self._pending: Future | None = None
        self._pending_lock = threading.Lock()
        self.last_error: BaseException | None = None
        self._staging: threading.Event | None = None
        # Retention's memory (rank 0): checkpoints this process committed or saw pass full
        # verification (never re-hashed by its pruning), and ones its restore() refused.
        self._vouched: set[str] = set()
        self._known_bad: set[str] = set()
        self._root_mode_checked = False
        self._step_hook = (
            optimizer.register_step_pre_hook(self._before_optimizer_step) if optimizer is not None else None
        )
        if dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            self._pg = process_group if process_group is not None else dist.new_group(backend="gloo")
        else:
            self.rank, self.world_size, self._pg = 0, 1, None
        atexit.register(self._flush_at_exit)

    # ----------------------------------------------------------------- registration
    def register(self, name: str, obj: Stateful) -> None:
        """Save and restore ``obj`` (anything with state_dict/load_state_dict) with the job.

        Its state is taken to be the same on every rank; rank 0 writes it. It is serialized by
        value when ``save`` is called, so it must be modest in size (use the model for tensors
        that are large).
        """
        if not _EXTRA_NAME.match(name):
            raise ValueError(f"extra state name {name!r} must match {_EXTRA_NAME.pattern}")
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"{name!r} has no state_dict()/load_state_dict()")
        self._extras[name] = obj

    # ----------------------------------------------------------------- save
    def save(self, step: int, *, blocking: bool = True) -> SaveResult | Future:
        """Checkpoint the state as of ``step`` (steps completed).

        ``blocking=True`` writes and commits before returning. ``blocking=False`` returns a
        ``Future`` at once; the copy of the tensors into reused host buffers, the writing,
        checksumming and the commit run in a background thread. With an optimizer, the copy
        overlaps the next forward and backward: the optimizer's next ``step()`` waits until it
        is done (a step pre-hook), so the saved state is exactly the state at ``save()``.
        Parameters changed in place by anything but ``optimizer.step()`` must call
        :meth:`wait_staged` first. Without an optimizer the copy is made before returning.
        Small state (scheduler, scaler, registered objects, RNG, cursor) is always captured
        by value before returning. At most one save is in flight: a second call first waits
        for the previous one (whose buffers it reuses).
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        self._wait_previous()
        t0 = time.perf_counter()
        background_copy = not blocking and self._step_hook is not None
        snap = self._snapshot(step, stage=not blocking and not background_copy)
        snap.blocked_s = time.perf_counter() - t0
        if blocking:
            result = self._persist(snap, t0)
            return result
        fut: Future = Future()
        staged = threading.Event()
        if background_copy:
            self._staging = staged
        else:
            staged.set()

        def run() -> None:
            try:
                if not staged.is_set():
                    try:
                        snap.app_state = self._stage(snap.app_state)
                    finally:
                        staged.set()
                fut.set_result(self._persist(snap, t0))
            except BaseException as exc:  # noqa: BLE001 - handed to the Future, surfaced by wait()
                self.last_error = exc
                log.error("event=checkpoint_save_failed step=%d error=%s", step, exc)
                fut.set_exception(exc)

        with self._pending_lock:
            self._pending = fut
        threading.Thread(target=run, name=f"checkpoint-save-{step}", daemon=False).start()
        return fut

    def wait_staged(self) -> None:
        """Block until the save in flight has copied the tensors (then they may change)."""
        ev = self._staging
        if ev is not None:
            ev.wait()

    def _before_optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.wait_staged()

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable; raise its error if it failed."""
        with self._pending_lock:
            fut, self._pending = self._pending, None
        return fut.result() if fut is not None else None

    def close(self) -> None:
        """Flush the save in flight. Call before destroying the process group."""
        self.wait()

    def _wait_previous(self) -> None:
        try:
            self.wait()
        except CheckpointError as exc:
            log.warning("event=previous_save_failed reason=%s (the one before it is still the latest)", exc.reason)

    def _flush_at_exit(self) -> None:
        try:
            self.wait()
        except BaseException as exc:  # noqa: BLE001 - at exit there is nobody left to raise to
            log.error("event=checkpoint_flush_failed error=%s", exc)

    def _app_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.model is None:
            return state
        if self.optimizer is not None:
            msd, osd = get_state_dict(self.model, self.optimizer)
            state["model"], state["optimizer"] = msd, osd
        else:
            state["model"] = get_model_state_dict(self.model)
        return state

    def _snapshot(self, step: int, *, stage: bool) -> _Snapshot:
        app = self._app_state()
        if stage:
            app = self._stage(app)
        trainer_files: dict[str, bytes] = {}
        trainer_state: dict[str, Any] = {
            "global_step": step,
            "data_cursor": self.cursor.state_dict(),
            "scheduler": None,
            "grad_scaler": None,
            "extras": {},
        }
        if self.rank == 0:
            if self.scheduler is not None:
                trainer_state["scheduler"] = "trainer/scheduler.pt"
                trainer_files["trainer/scheduler.pt"] = _to_bytes(self.scheduler.state_dict())
            if self.grad_scaler is not None:
                trainer_state["grad_scaler"] = "trainer/grad_scaler.pt"
                trainer_files["trainer/grad_scaler.pt"] = _to_bytes(self.grad_scaler.state_dict())
            for name, obj in self._extras.items():
                rel = f"trainer/extra-{name}.pt"
                trainer_state["extras"][name] = rel
                trainer_files[rel] = _to_bytes(obj.state_dict())
        if self.scheduler is not None:
            trainer_state["scheduler_step"] = getattr(self.scheduler, "last_epoch", None)
        return _Snapshot(
            step=step,
            app_state=app,
            rng=dump_json(capture_rng()),
            trainer_files=trainer_files,
            trainer_state=trainer_state,
        )

    def _stage(self, state: Any, prefix: str = "") -> Any:
        """Copy every tensor into reused host buffers; other leaves are deep-copied."""
        if isinstance(state, dict):
            return {k: self._stage(v, f"{prefix}/{k}") for k, v in state.items()}
        if isinstance(state, (list, tuple)):
            return type(state)(self._stage(v, f"{prefix}/{i}") for i, v in enumerate(state))
        if isinstance(state, torch.Tensor):
            from torch.distributed.tensor import DTensor

            if isinstance(state, DTensor):
                local = self._copy_to_buffer(prefix, state.to_local())
                return DTensor.from_local(
                    local, state.device_mesh, state.placements, run_check=False,
                    shape=state.shape, stride=state.stride(),
                )
            return self._copy_to_buffer(prefix, state)
        return copy.deepcopy(state)

    def _copy_to_buffer(self, key: str, t: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            pin = t.is_cuda
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        buf.copy_(t.detach(), non_blocking=t.is_cuda)
        if t.is_cuda:
            torch.cuda.current_stream(t.device).synchronize()
        return buf

    # ----------------------------------------------------------------- commit
    def _persist(self, snap: _Snapshot, t0: float) -> SaveResult:
        step = snap.step
        tmp_name: str | None = None
        setup_error: str | None = None
        if self.rank == 0:
            tmp_name = f".tmp-step-{step:010d}-{uuid.uuid4().hex[:12]}"
            try:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # see "Trust" in docs/checkpoints.md
                if not self._root_mode_checked:
                    self._root_mode_checked = True
                    mode = self.root.stat().st_mode
                    if mode & 0o022:
                        log.warning("event=checkpoint_root_writable_by_others root=%s mode=%o (whoever can write "
                                    "it can forge a checkpoint: chmod 700)", self.root, mode & 0o777)
                (self.root / tmp_name).mkdir()
                write_owner(self.root / tmp_name, self.attempt)
            except OSError as exc:
                setup_error = f"cannot create {tmp_name}: {exc}"
        tmp_name, setup_error = self._broadcast((tmp_name, setup_error))
        if setup_error:
            raise CheckpointSaveError(setup_error, path=str(self.root))
        tmp = self.root / tmp_name
        hook = functools.partial(self.after_file, step) if self.after_file else None
        writer = HashingWriter(tmp, self.checksum, self.io_threads, hook)
        local_error: str | None = None
        records: dict[str, tuple[int, str]] = {}
        try:
            if snap.app_state:
                dcp.save(snap.app_state, storage_writer=writer, process_group=self._pg, no_dist=self._pg is None)
                records.update(writer.records)
            (tmp / "rng").mkdir(exist_ok=True)
            rel = f"rng/rank-{self.rank:05d}.json"
            records[rel] = write_durable(tmp / rel, snap.rng, self.checksum)
            if snap.trainer_files:
                (tmp / "trainer").mkdir(exist_ok=True)
                for rel, data in snap.trainer_files.items():
                    records[rel] = write_durable(tmp / rel, data, self.checksum)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            local_error = f"rank {self.rank}: {_describe(exc)}"
        gathered = self._all_gather((records, local_error))
        outcome: tuple[str | None, str | None] = (None, None)
        if self.rank == 0:
            errors = [err for _, err in gathered if err]
            if errors:
                outcome = (None, "; ".join(errors[:4]) + (" ..." if len(errors) > 4 else ""))
            else:
                try:
                    final = self._commit(tmp, snap, [r for r, _ in gathered], writer)
                    outcome = (final.name, None)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # noqa: BLE001
                    outcome = (None, f"commit: {_describe(exc)}")
            if outcome[1] is not None:
                try:
                    remove_tree(tmp, trash_prefix=".deleting")
                except OSError as exc:
                    log.warning("event=partial_not_removed path=%s error=%s", tmp, exc)
        final_name, error = self._broadcast(outcome)
        if error is not None:
            log.error("event=checkpoint_save_failed step=%d reason=%s", step, error)
            raise CheckpointSaveError(f"save of step {step} failed: {error}", path=str(self.root))
        total = sum(size for recs, _ in gathered for size, _ in recs.values())
        result = SaveResult(step, self.root / final_name, total, snap.blocked_s, time.perf_counter() - t0)
        if self.rank == 0:
            log.info(
                "event=checkpoint_saved step=%d path=%s bytes=%d blocked_s=%.3f total_s=%.3f",
                step, result.path, total, snap.blocked_s, result.seconds_total,
            )
            try:
                # the checkpoint just committed is vouched for: its digests come from the bytes written
                self._vouched.add(final_name)
                pr = prune(self.root, self.keep, protect={final_name}, remove_partial=True,
                           verified=self._vouched, known_bad=self._known_bad, release=self.release)
                self._vouched = (self._vouched | set(pr.verified)) & set(pr.kept)
                if pr.removed or pr.removed_partial:
                    log.info("event=checkpoint_pruned removed=%s partial=%s", pr.removed, pr.removed_partial)
            except (CheckpointError, OSError) as exc:
                log.warning("event=prune_failed error=%s", exc)
        return result

    def _commit(self, tmp: Path, snap: _Snapshot, per_rank: list[dict[str, tuple[int, str]]], writer: HashingWriter) -> Path:
        files: dict[str, FileEntry] = {}
        for rank, recs in enumerate(per_rank):
            for rel, (size, digest) in recs.items():
                if rel in files:
                    raise CheckpointSaveError(f"{rel} reported by two ranks (second: rank {rank})")
                files[rel] = FileEntry(size=size, digest=digest)
        for rel, entry in files.items():
            st = os.lstat(tmp / rel)
            if st.st_size != entry.size:
                raise CheckpointSaveError(f"{rel} is {st.st_size} bytes on disk, its writer wrote {entry.size}")
        states: dict[str, Any] = {}
        if snap.app_state:
            if ".metadata" not in files or writer.metadata is None:
                raise CheckpointSaveError("DCP wrote no .metadata")
            referenced = {info.relative_path for info in writer.metadata.storage_data.values()}
            missing = referenced - files.keys()
            if missing:
                raise CheckpointSaveError(f"DCP metadata names files no rank wrote: {sorted(missing)[:5]}")
            states = _summarize(writer.metadata, self.optimizer)
        missing_rng = [r for r in range(self.world_size) if f"rng/rank-{r:05d}.json" not in files]
        if missing_rng:
            raise CheckpointSaveError(f"RNG state missing for ranks {missing_rng[:8]}")
        trainer_state = dict(snap.trainer_state)
        trainer_state["rng"] = {
            "files": [f"rng/rank-{r:05d}.json" for r in range(self.world_size)],
            "seed": self.seed,
            "guarantee": RNG_GUARANTEE,
        }
        now = time.time()
        manifest = Manifest(
            global_step=snap.step,
            writer_world_size=self.world_size,
            checksum_algorithm=self.checksum,
            files=files,
            created_at=datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="milliseconds"),
            created_unix=now,
            torch_version=torch.__version__,
            supervisor_version=supervisor.__version__,
            attempt=self.attempt,
            release=self.release,
            states=states,
            trainer_state=trainer_state,
            config=self.config,
        )
        # Validate what we are about to publish with the same code every reader runs.
        Manifest.from_dict(manifest.to_dict())
        with HashingFile(tmp / MANIFEST_NAME, self.checksum) as f:
            f.write(manifest.to_bytes())
            f.sync()
        (tmp / OWNER_NAME).unlink(missing_ok=True)  # only meaningful while in flight
        for sub in ("rng", "trainer"):
            if (tmp / sub).is_dir():
                fsync_dir(tmp / sub)
        fsync_dir(tmp)
        return _publish(tmp, self.root, snap.step)

    # ----------------------------------------------------------------- restore
    def restore(
        self,
        *,
        path: str | os.PathLike | None = None,
        prefer: str | None = None,
        exclude: Iterable[str] = (),
        required: bool = False,
    ) -> RestoreResult | None:
        """Load the newest checkpoint that verifies; ``None`` if there is none.

        Rank 0 picks a candidate (fast verification) and broadcasts it; every rank then
        checksums its share of the files (full verification, the default); a candidate that
        fails is skipped, with its reason, and the next older one is tried. Every rank loads
        the same checkpoint or every rank raises.

        ``path``: load exactly this checkpoint or raise. ``prefer``: the name of the
        checkpoint to try first (the supervisor's pick); if it does not verify, discovery
        continues from the newest other one. ``exclude``: names never to load (suspects).
        ``required``: a checkpoint must be loaded (the job has had one): when none verifies,
        raise :class:`CheckpointLoadError` instead of returning ``None`` (a fresh start).
        Only rank 0's arguments count. A :class:`CheckpointLoadError` carries ``skipped``.
        """
        self._wait_previous()
        skipped: list[Skipped] = []
        excluded = set(exclude)
        # the supervisor's suspects are kept as evidence: this process's pruning never counts them
        self._known_bad.update(excluded)
        overwritten: str | None = None
        explicit = Path(path) if path is not None and self.rank == 0 else None
        preferred = prefer if self.rank == 0 and prefer and prefer not in excluded else None
        while True:
            choice: tuple[str, dict, bool] | None | str = None
            if self.rank == 0:
                if preferred is not None:
                    choice = self._pick_preferred(preferred, skipped)
                    excluded.add(preferred)
                    preferred = None
                if choice is None:
                    choice = self._pick(explicit, excluded, skipped)
                if choice is None and required:
                    choice = ("no checkpoint verifies, and one is required (the job has had one): refusing to "
                              "train from scratch" + "".join(f"; {s.name}: {s.reason}" for s in skipped))
            choice = self._broadcast(choice)  # rank 0's view: other ranks' arguments are ignored
            if isinstance(choice, str):
                raise CheckpointLoadError(choice, path=str(path or self.root), skipped=skipped)
            if choice is None:
                self._known_bad.update(s.name for s in skipped)
                if skipped and self.rank == 0:
                    log.warning("event=no_verified_checkpoint root=%s skipped=%d", self.root, len(skipped))
                if overwritten is not None:
                    raise CheckpointLoadError(
                        f"no checkpoint verifies, and {overwritten} was found corrupt only while loading: the "
                        "model and optimizer hold some of its tensors. Rebuild them (a new process) before "
                        f"training from scratch, with restore(exclude=[{overwritten!r}]) or that checkpoint "
                        "removed (the supervisor excludes it by itself).",
                        path=str(self.root), skipped=skipped)
                return None
            is_explicit = choice[2]
            ckpt_path, manifest = Path(choice[0]), Manifest.from_dict(choice[1])
            if self.verify_on_restore == "full":
                # the small files (DCP metadata, trainer state) are checksummed up front, shared
                # among ranks; the tensor files are checksummed by the reader as it loads them
                mine = sorted(f for f in manifest.files if not _is_tensor_file(f))[self.rank :: self.world_size]
                err = None
                try:
                    verify(ckpt_path, "full", only=mine, manifest=manifest)
                except (CheckpointError, OSError) as exc:
                    err = getattr(exc, "reason", str(exc))
                errors = [e for e in self._all_gather(err) if e]
                if errors:
                    skipped.append(Skipped(ckpt_path.name, errors[0]))
                    if self.rank == 0:
                        log.warning("event=checkpoint_skipped name=%s reason=%s", ckpt_path.name, errors[0])
                    if is_explicit:
                        raise CheckpointLoadError(errors[0], path=str(ckpt_path), skipped=skipped)
                    excluded.add(ckpt_path.name)
                    continue
            if self.model is not None:
                # DCP's .metadata is a pickle: read it with the unpickler that allows only DCP's
                # metadata classes and check it names only listed files, before anything loads
                err = None
                if self.rank == 0:
                    try:
                        read_dcp_metadata(ckpt_path, frozenset(manifest.files))
                    except (CheckpointError, OSError) as exc:
                        err = getattr(exc, "reason", str(exc))
                err = self._broadcast(err)
                if err:
                    skipped.append(Skipped(ckpt_path.name, err))
                    if self.rank == 0:
                        log.warning("event=checkpoint_skipped name=%s reason=%s", ckpt_path.name, err)
                    if is_explicit:
                        raise CheckpointLoadError(err, path=str(ckpt_path), skipped=skipped)
                    excluded.add(ckpt_path.name)
                    continue
            try:
                rng_mode = self._load(ckpt_path, manifest)
            except _Refused as exc:
                # refused before the live model, optimizer and trainer objects were touched
                skipped.append(Skipped(ckpt_path.name, exc.reason))
                if self.rank == 0:
                    log.warning("event=checkpoint_skipped name=%s reason=%s", ckpt_path.name, exc.reason)
                if is_explicit:
                    raise CheckpointLoadError(exc.reason, path=str(ckpt_path), skipped=skipped) from None
                excluded.add(ckpt_path.name)
                continue
            except _CorruptWhileLoading as exc:
                # some tensors now hold bytes of a corrupt file: only a full load of another
                # checkpoint may follow (it overwrites every tensor), never a fresh start
                overwritten = ckpt_path.name
                skipped.append(Skipped(ckpt_path.name, exc.reason))
                if self.rank == 0:
                    log.warning("event=checkpoint_skipped name=%s reason=%s (found while loading)", ckpt_path.name,
                                exc.reason)
                if is_explicit:
                    raise CheckpointLoadError(f"{exc.reason}; found while loading: the model and optimizer hold "
                                              "some of its tensors, rebuild them before training",
                                              path=str(ckpt_path), skipped=skipped) from None
                excluded.add(ckpt_path.name)
                continue
            if self.rank == 0:
                log.info(
                    "event=checkpoint_restored step=%d path=%s writer_world_size=%d world_size=%d rng=%s skipped=%d",
                    manifest.global_step, ckpt_path, manifest.writer_world_size, self.world_size, rng_mode,
                    len(skipped),
                )
            self._known_bad.update(s.name for s in skipped)  # never counted by this process's pruning
            return RestoreResult(manifest.global_step, ckpt_path, manifest, rng_mode, skipped)

    def _pick_preferred(self, name: str, skipped: list[Skipped]):
        try:
            m = verify(self.root / name, "fast")
        except (CheckpointError, OSError) as exc:
            skipped.append(Skipped(name, getattr(exc, "reason", str(exc))))
            log.warning("event=preferred_checkpoint_rejected name=%s reason=%s", name, skipped[-1].reason)
            return None
        return (str(self.root / name), m.to_dict(), False)

    def _pick(self, explicit: Path | None, excluded: set[str], skipped: list[Skipped]):
        if explicit is not None:
            try:
                m = verify(explicit, "fast")
            except (CheckpointError, OSError) as exc:
                return getattr(exc, "reason", str(exc))
            return (str(explicit), m.to_dict(), True)
        found = latest_complete(self.root, "fast", exclude=excluded)
        skipped.extend(s for s in found.skipped if s.name not in {x.name for x in skipped})
        if found.checkpoint is None:
            return None
        return (str(found.checkpoint.path), found.checkpoint.manifest.to_dict(), False)

    def _load(self, ckpt_path: Path, manifest: Manifest) -> str:
        """Load one checkpoint into the live objects. Everything but the tensors is read and
        checked first (the cursor, every trainer file, the RNG state), and the trainer objects
        take their state with an undo, before a tensor is touched: a checkpoint refused then
        (:class:`_Refused`, on any rank) leaves the model, optimizer, scheduler, scaler,
        registered objects, cursor and generators as they were."""
        refusal: tuple[bool, str] | None = None
        undo: list[tuple[Stateful, Any]] = []
        try:
            cursor, objects = self._prepare_trainer_state(ckpt_path, manifest)
            undo = self._apply_with_undo(objects)
        except _Mismatch as exc:
            refusal = (True, exc.reason)
        except _Refused as exc:
            refusal = (False, exc.reason)
        refusals = [r for r in self._all_gather(refusal) if r]
        if refusals:
            _undo(undo)
            mismatch = [reason for is_mismatch, reason in refusals if is_mismatch]
            if mismatch:  # the job registers what the checkpoint does not hold: an error, not a damaged file
                raise CheckpointLoadError(mismatch[0], path=str(ckpt_path))
            raise _Refused(refusals[0][1], path=str(ckpt_path))
        rng = self._prepare_rng(ckpt_path, manifest)
        error: str | None = None
        corrupt: str | None = None
        try:
            if self.model is not None:
                app = self._app_state()
                full = self.verify_on_restore == "full"
                reader = ManifestReader(
                    ckpt_path, set(manifest.files), algorithm=manifest.checksum_algorithm,
                    digests={rel: e.digest for rel, e in manifest.files.items()} if full else None,
                )
                try:
                    dcp.load(app, storage_reader=reader, process_group=self._pg, no_dist=self._pg is None)
                finally:
                    corrupt = (f"{reader.corrupt} fails its {manifest.checksum_algorithm} checksum (corrupt)"
                               if reader.corrupt else reader.unsafe)
                if self.optimizer is not None:
                    set_state_dict(
                        self.model, self.optimizer,
                        model_state_dict=app["model"], optim_state_dict=app["optimizer"],
                    )
                else:
                    set_model_state_dict(self.model, app["model"])
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException
            error = f"model/optimizer state: {_describe(exc)}"
        outcomes = [o for o in self._all_gather((error, corrupt)) if o[0]]
        if outcomes:
            _undo(undo)
            bad = [o for o in outcomes if o[1]]
            if bad:
                raise _CorruptWhileLoading(bad[0][1], path=str(ckpt_path))
            raise CheckpointLoadError(outcomes[0][0], path=str(ckpt_path))
        if cursor is not None:
            self.cursor.load_state_dict(cursor)  # checked above: cannot fail
        return self._restore_rng(manifest, rng)

    def _prepare_trainer_state(self, ckpt_path: Path, manifest: Manifest) -> tuple[dict | None, list]:
        """The cursor and each registered trainer object's state, read and type-checked;
        :class:`_Refused` naming the field or file that is wrong. Touches nothing live."""
        ts = manifest.trainer_state
        cursor = ts.get("data_cursor") if "data_cursor" in ts else None
        if "data_cursor" in ts:
            try:
                DataCursor().load_state_dict(cursor)
            except ValueError as exc:
                raise _Refused(f"trainer_state.data_cursor: {exc}") from None
        objects: list[tuple[str, Stateful, dict]] = []
        for attr, key in (("scheduler", "scheduler"), ("grad_scaler", "grad_scaler")):
            obj = getattr(self, attr)
            if obj is None:
                continue
            if ts.get(key) is None:
                raise _Mismatch(f"the checkpoint holds no {key} state but one is registered")
            objects.append((key, obj, _read_state_file(ckpt_path, ts[key])))
        saved_extras = ts.get("extras") or {}
        for name, obj in self._extras.items():
            if name not in saved_extras:
                raise _Mismatch(f"the checkpoint holds no state for registered object {name!r}")
            objects.append((f"extra {name!r}", obj, _read_state_file(ckpt_path, saved_extras[name])))
        return cursor, objects

    @staticmethod
    def _apply_with_undo(objects: list[tuple[str, Stateful, dict]]) -> list[tuple[Stateful, Any]]:
        """``load_state_dict`` each object, keeping a copy of its state before: one that raises
        is a refusal, and every object applied so far gets its old state back."""
        undo: list[tuple[Stateful, Any]] = []
        for what, obj, sd in objects:
            old = obj.state_dict()
            try:
                old = copy.deepcopy(old)
            except Exception:  # noqa: BLE001 - an object whose state cannot be copied is restored from its own dict
                pass
            try:
                obj.load_state_dict(sd)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # noqa: BLE001 - any refusal of the object's own loader
                _undo(undo + [(obj, old)])
                raise _Refused(f"{what} state: {_describe(exc)}") from None
            undo.append((obj, old))
        return undo

    def _prepare_rng(self, ckpt_path: Path, manifest: Manifest) -> PreparedRng | None:
        """This rank's saved generators, checked (None: the derived seed will be used, and why is
        logged). Any way the file can be wrong (unreadable, too large, not JSON, nested 5,000
        deep, wrong-sized or out-of-range states) falls back; it never refuses the checkpoint."""
        rel = f"rng/rank-{self.rank:05d}.json"
        if manifest.writer_world_size != self.world_size or rel not in manifest.files:
            return None
        try:
            with open(ckpt_path / rel, "rb") as f:
                data = f.read(min(os.fstat(f.fileno()).st_size, MAX_RNG_BYTES) + 1)
            if len(data) > MAX_RNG_BYTES:
                raise ValueError(f"{rel} is over {MAX_RNG_BYTES} bytes")
            return prepare_rng(json.loads(data))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - OSError, ValueError, RecursionError...: the fallback
            log.warning("event=rng_not_restored rank=%d reason=%s (using the derived seed)", self.rank,
                        _describe(exc))
            return None

    def _restore_rng(self, manifest: Manifest, prepared: PreparedRng | None) -> str:
        if prepared is not None:
            try:
                apply_rng(prepared)
                return RNG_EXACT
            except Exception as exc:  # noqa: BLE001 - e.g. another CUDA device count: the fallback
                log.warning("event=rng_not_restored rank=%d reason=%s (using the derived seed)", self.rank,
                            _describe(exc))
        seed_all(derived_seed(self.seed, manifest.global_step, self.rank))
        return RNG_DERIVED

    # ----------------------------------------------------------------- collectives
    def _broadcast(self, obj: Any) -> Any:
        if self._pg is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._pg)
        return box[0]

    def _all_gather(self, obj: Any) -> list[Any]:
        if self._pg is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._pg)
        return out


def _publish(tmp: Path, root: Path, step: int) -> Path:
    """Rename ``tmp`` to the first free ``step-N[-g]`` name: a published name is never reused."""
    generation = 0
    while True:
        final = root / checkpoint_name(step, generation)
        if not os.path.lexists(final):
            try:
                os.rename(tmp, final)
            except OSError as exc:
                if os.path.lexists(final):  # lost a race for the name: take the next one
                    generation += 1
                    continue
                raise CheckpointSaveError(f"publish rename failed: {exc}") from exc
            fsync_dir(root)
            return final
        generation += 1


def _summarize(metadata: Any, optimizer: Any) -> dict[str, Any]:
    """Logical states (model, optimizer) with tensor counts, shard counts and bytes."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    states: dict[str, dict[str, Any]] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        top = fqn.split(".", 1)[0]
        s = states.setdefault(top, {"format": "dcp", "tensors": 0, "shards": 0, "bytes": 0})
        if isinstance(md, TensorStorageMetadata):
            s["tensors"] += 1
            s["shards"] = max(s["shards"], len(md.chunks))
            numel = 1
            for d in md.size:
                numel *= d
            s["bytes"] += numel * torch.tensor([], dtype=md.properties.dtype).element_size()
    states.get("model", {}).setdefault("logical_state", "model")
    if "optimizer" in states and optimizer is not None:
        states["optimizer"]["logical_state"] = type(optimizer).__name__.lower()
    return states


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _from_file(path: Path) -> Any:
    # weights_only: tensors, containers and primitives only; a checkpoint never runs code.
    return torch.load(path, map_location="cpu", weights_only=True)


def _read_state_file(ckpt_path: Path, rel: str) -> dict:
    """A trainer file's state dict, or :class:`_Refused` saying why not: not a weights-only
    torch file (any error of the loader), or not a mapping."""
    try:
        sd = _from_file(ckpt_path / rel)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - UnpicklingError, EOFError, RuntimeError...: one refusal
        raise _Refused(f"{rel} is not a weights-only torch file: {_describe(exc)}") from None
    if not isinstance(sd, dict):
        raise _Refused(f"{rel} holds a {type(sd).__name__}, not a state dict")
    return sd


def _undo(undo: list[tuple[Stateful, Any]]) -> None:
    for obj, old in reversed(undo):
        try:
            obj.load_state_dict(old)
        except Exception as exc:  # noqa: BLE001 - the object's own state, taken a moment ago
            log.error("event=trainer_state_not_undone object=%s error=%s", type(obj).__name__, _describe(exc))


class _CorruptWhileLoading(CheckpointLoadError):
    """A tensor file failed its checksum during the load: the model holds some of its bytes."""


class _Refused(CheckpointLoadError):
    """A checkpoint refused before anything live was touched (its trainer state is unusable):
    the next older one may be tried as if it had failed verification."""


class _Mismatch(_Refused):
    """The job registers an object (scheduler, scaler, extra) the checkpoint holds no state for:
    raised to the caller (before anything live was touched), not passed over for an older one."""


def _is_tensor_file(rel: str) -> bool:
    """DCP's tensor data files (``__R_N.distcp``), checksummed while they are read."""
    return rel.endswith(".distcp")


def _describe(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: rank -> exception
    if isinstance(failures, dict) and failures:
        rank, first = next(iter(sorted(failures.items(), key=lambda kv: kv[0])))
        inner = first[0] if isinstance(first, tuple) else first
        if isinstance(inner, BaseException):
            return f"DCP failed on rank {rank}: {_describe(inner)}"
    text = str(exc).strip().splitlines()
    head = text[0] if text else ""
    return f"{type(exc).__name__}: {head}"[:500]


def _jsonable(obj: Any) -> Any:
    try:
        return json.loads(json.dumps(obj, default=str))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config snapshot is not JSON-serializable: {exc}") from None
