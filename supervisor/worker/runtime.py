"""The worker SDK's face: one object a training script creates per rank.

::

    w = Worker.from_env(log_dir=args.log_dir)     # session, faults, heartbeats, watchdog
    w.start()
    w.instrument(model)                           # count DDP / FSDP2 collectives
    restored = w.restore(ckpt)                    # the supervisor's pick, or the newest verified
    step = restored.step if restored else 0
    while step < total:
        with w.step(step + 1) as s:
            with w.phase("data"):
                batch = ...
            with w.phase("compute"), w.skip_collective_if_drilled(model):
                w.fault_point()                   # drills: crash, kill, stop, hang, slow
                loss = ...; loss.backward()
            verdict = w.agree(loss)               # one all-reduce: mean loss, non-finite, stop, save due
            ...optimizer step...
            s.loss = verdict.loss
        step += 1
        if not w.after_step(ckpt, step, verdict): # periodic save; emergency save on SIGTERM
            break
    w.close()

Every rank takes the same decisions at the same step because they are all-reduced: a
non-finite loss anywhere stops every rank *before* the optimizer step; a SIGTERM on any rank
(Slurm ``--signal``, a pod's termination grace period) makes every rank save at the same
step boundary; a time-based save is due on all ranks or none.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.distributed as dist

from supervisor.checkpoint import CheckpointLoadError, Skipped
from supervisor.checkpoint.discovery import parse_name
from supervisor.protocol import (
    Env,
    EXIT_CRASH,
    OUTCOME_FINISHED,
    OUTCOME_STOPPED,
    PHASE_CHECKPOINT,
    PHASE_COMPUTE,
    PHASE_DATA,
    PHASE_DONE,
    PHASE_RESTORE,
    HEADER_MAC,
    RESTORE_FAILED,
    RESTORE_FRESH,
    RESTORE_POINT_PATH,
    RESTORE_RESTORED,
    ANSWER_MAX_BYTES,
    Keys,
    ProtocolError,
    check_restore_answer,
    parse_restore_point,
    refused_field,
    restore_request,
)
from supervisor.procfs import descendants
from supervisor.protocol import ranklog
from supervisor.worker import collectives, instrument
from supervisor.worker.failures import is_peer_failure
from supervisor.worker.faults import Fault, parse_faults
from supervisor.worker.heartbeat import HeartbeatSender
from supervisor.worker.session import Session
from supervisor.worker.telemetry import RankState
from supervisor.worker.watchdog import Watchdog, dump_stacks

if TYPE_CHECKING:  # the manager imports torch.distributed.checkpoint (~1 s): loaded by the script that uses it
    from supervisor.checkpoint import CheckpointManager, RestoreResult

log = logging.getLogger("supervisor.worker")


class NonFiniteLoss(RuntimeError):
    """The loss was NaN or infinite on at least one rank; no optimizer step was taken."""


@dataclass(frozen=True)
class Verdict:
    loss: float
    nonfinite: bool
    stop: bool
    save_due: bool


@dataclass
class StepRecord:
    step: int
    loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def log(self, **kw: Any) -> None:
        self.extra.update(kw)


class Worker:
    def __init__(self, session: Session, faults: list[Fault] | None = None) -> None:
        self.session = session
        self.state = RankState()
        self.faults = [f for f in (faults or []) if f.applies(rank=session.rank, attempt=session.attempt)]
        self.stop_requested = False
        self.checkpoint_every_steps = 0
        self.checkpoint_every_s = 0.0
        self.async_save = False
        self._last_save_time = time.monotonic()
        self._phase_totals: dict[str, float] = {}
        self._timing = None
        self._aborting = threading.Event()
        self._restored_at: float | None = None
        self.nonfinite_step: int | None = None  # the step whose agreed loss was not finite (training stopped)
        self._skipped: dict[int, int] = {}
        log_dir = session.log_dir
        stack_path = log_dir / f"stacks-rank-{session.rank}.txt" if log_dir else None
        self.stack_path = stack_path
        self.heartbeat = HeartbeatSender(session, self.state, on_abort=self.abort, on_dump=self.dump_stacks)
        self.watchdog = Watchdog(self.state, session.timeouts, stack_path, on_fire=lambda _e: self.heartbeat.beat_now())

    @classmethod
    def from_env(cls, *, log_dir: str | os.PathLike | None = None) -> "Worker":
        """Parse the session and ``SUPERVISOR_FAULT``; bad values raise at start-up."""
        return cls(Session.from_env(log_dir=log_dir), parse_faults(os.environ.get(Env.FAULT)))

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> "Worker":
        if self.session.log_dir:
            self.session.log_dir.mkdir(parents=True, exist_ok=True)
            self._timing = open(self.session.log_dir / ranklog.log_name(self.session.rank), "a", buffering=1)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        # the supervisor's instrumentation (a rank of a script that started without the SDK) stops
        # here: the SDK's richer heartbeats replace its own, numbered on from its last
        self.heartbeat.seq = max(self.heartbeat.seq, instrument.hand_over())
        self.heartbeat.start()
        self.watchdog.start()
        self._install_excepthook()
        log.info(
            "event=worker_started rank=%d world_size=%d attempt=%d supervised=%s faults=%s",
            self.session.rank, self.session.world_size, self.session.attempt, self.session.supervised,
            [f.kind for f in self.faults],
        )
        return self

    def close(self, *, finished: bool | None = None, reason: str = "") -> None:
        """The rank's last word: it is done, and whether its training *finished*.

        ``finished`` defaults to what the SDK saw: a non-finite loss or a stop request (an
        emergency checkpoint) means it stopped early. The supervisor reports a job completed
        only when every rank finished and every agent exited 0: an early stop is never exit 0.
        """
        if finished is None:
            finished = self.nonfinite_step is None and not self.stop_requested
            if not reason:
                reason = (f"non-finite loss at step {self.nonfinite_step}" if self.nonfinite_step is not None
                          else "stop requested (SIGTERM): emergency checkpoint" if self.stop_requested else "")
        st = self.state
        st.outcome = OUTCOME_FINISHED if finished else OUTCOME_STOPPED
        if reason and not finished:
            st.error = reason[:512]
        st.set_phase(PHASE_DONE)
        self.heartbeat.beat_now()
        self.watchdog.stop()
        self.heartbeat.stop()
        if self._timing:
            self._timing.close()
            self._timing = None

    def _install_excepthook(self) -> None:
        """An uncaught exception ends the rank with a last heartbeat that names it.

        When one rank is killed, its peers fail a moment later with "connection reset by
        peer"; their agents may exit first. The supervisor needs to tell the culprit (silent,
        or failed on its own) from the ranks that merely lost their peer.
        """
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            try:
                self.report_failure(exc)
            finally:
                previous(kind, exc, tb)

        sys.excepthook = hook

    def report_failure(self, exc: BaseException) -> None:
        """Tell the supervisor this rank is ending on ``exc`` (idempotent, never raises)."""
        try:
            peer = is_peer_failure(exc)
            self.state.set_failed(f"{type(exc).__name__}: {exc}", peer)
            log.error("event=rank_failed rank=%d peer_failure=%s error=%s", self.session.rank, peer,
                      f"{type(exc).__name__}: {exc}"[:300])
            self.heartbeat.beat_now()
        except Exception:  # noqa: BLE001 - reporting must not mask the original exception
            pass

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if not self.stop_requested:
            log.warning("event=sigterm_received rank=%d action=checkpoint_at_next_step_boundary", self.session.rank)
        self.stop_requested = True

    def dump_stacks(self, reason: str) -> None:
        """The supervisor asks for evidence before it acts: every thread's stack, no harm done."""
        where = dump_stacks(self.stack_path, f"stack dump requested by the supervisor: {reason}")
        self.state.stack_file = where
        log.warning("event=stacks_dumped rank=%d reason=%s stacks=%s", self.session.rank, reason, where)

    def abort(self, reason: str) -> None:
        """The supervisor's abort order: keep the evidence, then SIGKILL this process."""
        if self._aborting.is_set():
            return
        self._aborting.set()
        where = dump_stacks(self.stack_path, f"abort ordered by the supervisor: {reason}")
        log.error("event=abort_ordered rank=%d reason=%s stacks=%s", self.session.rank, reason, where)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)

    # ---------------------------------------------------------------- instrumentation
    def instrument(self, model: torch.nn.Module) -> torch.nn.Module:
        """Count the model's collectives (DDP gradient buckets or FSDP2 all-gather/reduce-scatter)."""
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model.register_comm_hook(None, collectives.ddp_comm_hook(self.state))
        else:
            collectives.instrument_fsdp(model, self.state)
        return model

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        with self.state.phase_scope(name):
            try:
                yield
            finally:
                self._phase_totals[name] = self._phase_totals.get(name, 0.0) + time.perf_counter() - t0

    def all_reduce(self, tensor: torch.Tensor, op: Any = None, group: Any = None) -> None:
        op = dist.ReduceOp.SUM if op is None else op
        collectives.traced(self.state, "allreduce", dist.all_reduce, tensor, op=op, group=group)

    def barrier(self, group: Any = None) -> None:
        collectives.traced(self.state, "barrier", dist.barrier, group=group)

    # ---------------------------------------------------------------- steps
    @contextmanager
    def step(self, step: int) -> Iterator[StepRecord]:
        """Time one step (``step`` = the number it will have when done) and log it."""
        self.state.step = step
        self._phase_totals = {}
        self.state.take_collective_busy()
        record = StepRecord(step)
        t0 = time.perf_counter()
        yield record
        total = time.perf_counter() - t0
        busy = self.state.take_collective_busy()
        coll = sum(busy.values())
        data = self._phase_totals.get(PHASE_DATA, 0.0)
        # exposed compute: time in the compute phase not spent waiting on a collective
        compute = max(0.0, self._phase_totals.get(PHASE_COMPUTE, 0.0) - busy.get(PHASE_COMPUTE, 0.0))
        self.state.step_ended((data, compute, coll, total))
        st = self.state
        st.steps_done += 1
        if st.steps_done == 1:
            # the explicit "a step completed after the restore": a rank that dies at the next
            # step must not leave the supervisor believing its checkpoint is bad
            st.first_step_s = time.perf_counter() - (self._restored_at or t0)
            self.heartbeat.beat_now()
        if self._timing:
            s = self.session
            self._timing.write(ranklog.step_record(
                step=step, loss=record.loss, world_size=s.world_size, attempt=s.attempt, rank=s.rank, node=s.node,
                pid=os.getpid(), data_s=data, compute_s=compute, collective_s=coll, step_s=total, time=time.time(),
                extra=record.extra))

    def skip_batch(self, step: int) -> bool:
        """Whether to skip the batch of ``step`` (consume it, take no optimizer step): the
        supervisor asks for it when that step's loss was non-finite twice and the job allows
        skipping (``nonfinite.skip_batches``). True as many times as the step is listed."""
        if self._skipped.get(step, 0) < self.session.skip_steps.get(step, 0):
            self._skipped[step] = self._skipped.get(step, 0) + 1
            log.warning("event=batch_skipped step=%d reason=non-finite loss at this step in earlier attempts", step)
            return True
        return False

    def fault_point(self) -> None:
        """Where drills fire: call inside the compute phase of every step."""
        for f in self.faults:
            if not f.fires_at(self.state.step):
                continue
            if f.kind == "slow":
                time.sleep(f.ms / 1000)
            elif f.kind in ("node-kill", "node-stop"):
                log.warning("event=fault_injected kind=%s rank=%d step=%d", f.kind, self.session.rank, self.state.step)
                logging.shutdown()
                _signal_node(signal.SIGKILL if f.kind == "node-kill" else signal.SIGSTOP)
            elif f.kind == "oom":
                log.warning("event=fault_injected kind=oom rank=%d step=%d", self.session.rank, self.state.step)
                hog = []
                while True:  # every page touched: the memory is really used, until the OOM killer comes
                    hog.append(bytearray(b"\x01") * (256 << 20))
            elif f.kind in ("crash", "kill", "stop", "hang"):
                log.warning("event=fault_injected kind=%s rank=%d step=%d", f.kind, self.session.rank, self.state.step)
                if f.kind == "crash":
                    logging.shutdown()
                    sys.exit(EXIT_CRASH)
                if f.kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if f.kind == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                if f.kind == "hang":
                    while True:  # stuck in compute; the heartbeat thread keeps reporting it
                        time.sleep(3600)

    def _fires(self, kind: str) -> bool:
        return any(f.kind == kind and f.fires_at(self.state.step) for f in self.faults)

    def skip_collective_if_drilled(self, model: torch.nn.Module):
        """``skip-collective`` drill: DDP's ``no_sync`` for this step on this rank."""
        if self._fires("skip-collective") and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return nullcontext()

    def agree(self, loss: torch.Tensor) -> Verdict:
        """One small all-reduce: the mean loss and every rank-local condition, agreed.

        Call after backward and *before* the optimizer step. Raises :class:`NonFiniteLoss`
        (on every rank) when any rank's loss is not finite, so no rank corrupts its state.
        """
        local = loss.detach().float().reshape(()).cpu()
        if self._fires("nan"):
            log.warning("event=fault_injected kind=nan rank=%d step=%d", self.session.rank, self.state.step)
            local = local * float("nan")
        if self._fires("skip-collective"):
            # The drilled rank skipped the gradient all-reduce; like a rank that ran out of
            # batches it now idles in its data phase while its peers wait inside the collective.
            log.warning("event=fault_injected kind=skip-collective rank=%d step=%d", self.session.rank, self.state.step)
            self.state.set_phase(PHASE_DATA)
            while True:
                time.sleep(3600)
        finite = bool(torch.isfinite(local))
        due = bool(
            self.checkpoint_every_s and time.monotonic() - self._last_save_time >= self.checkpoint_every_s
        )
        vec = torch.tensor(
            [local.item() if finite else 0.0, 0.0 if finite else 1.0, float(self.stop_requested), float(due)],
            dtype=torch.float64,
        )
        world = self.session.world_size
        if dist.is_available() and dist.is_initialized():
            self.all_reduce(vec)
        verdict = Verdict(loss=float(vec[0] / world), nonfinite=vec[1] > 0, stop=vec[2] > 0, save_due=vec[3] > 0)
        if verdict.nonfinite:
            # every rank stops; the heartbeat names the rank(s) whose own loss was not finite
            self.nonfinite_step = self.state.step
            self.state.loss_ok = finite
            self.heartbeat.beat_now()
            log.error(
                "event=nonfinite_loss step=%d ranks_affected=%d local_finite=%s action=stop_before_optimizer_step",
                self.state.step, int(vec[1]), finite,
            )
            raise NonFiniteLoss(f"non-finite loss at step {self.state.step} on {int(vec[1])} rank(s)")
        return verdict

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_schedule(self, *, every_steps: int = 0, every_seconds: float = 0.0, async_save: bool = False) -> None:
        if every_steps < 0 or every_seconds < 0:
            raise ValueError("checkpoint intervals must be >= 0")
        self.checkpoint_every_steps = every_steps
        self.checkpoint_every_s = every_seconds
        self.async_save = async_save

    def after_step(self, ckpt: CheckpointManager | None, step: int, verdict: Verdict) -> bool:
        """Save when due; on a stop request save synchronously and return False."""
        if ckpt is None:
            return not verdict.stop
        if verdict.stop:
            told = self._note_root(ckpt)
            t0 = time.perf_counter()
            with self.phase(PHASE_CHECKPOINT):
                self.state.ckpt_state = "writing"
                result = ckpt.save(step)
                self.state.ckpt_state, self.state.ckpt_step = "idle", step
            self.state.ckpt_s = time.perf_counter() - t0
            log.warning("event=emergency_checkpoint step=%d path=%s", step, result.path)
            if told:
                self.heartbeat.beat_now()
            return False
        due = verdict.save_due or (self.checkpoint_every_steps and step % self.checkpoint_every_steps == 0)
        if due:
            self._save(ckpt, step)
        return True

    def _note_root(self, ckpt: CheckpointManager) -> bool:
        """Record the root this rank saves to (the heartbeat carries it); True when it is new.

        A script may save without ever calling :meth:`restore`: the supervisor must still learn
        where the checkpoints go, or it judges progress in a directory nobody writes."""
        root = str(Path(ckpt.root).resolve())
        if self.state.ckpt_root == root:
            return False
        self.state.ckpt_root = root
        return True

    def _save(self, ckpt: CheckpointManager, step: int) -> None:
        told = self._note_root(ckpt)
        t0 = time.perf_counter()
        with self.phase(PHASE_CHECKPOINT):
            self.state.ckpt_state = "staging" if self.async_save else "writing"
            for f in self.faults:
                if f.kind == "slow-save" and f.fires_at(step):  # a drill: the save blocks the loop longer
                    time.sleep(f.ms / 1000)
            result = ckpt.save(step, blocking=not self.async_save)
        self.state.ckpt_s = time.perf_counter() - t0
        self._last_save_time = time.monotonic()
        if self.async_save:
            self.state.ckpt_state = "writing"

            def done(fut: Any) -> None:
                ok = fut.exception() is None
                self.state.ckpt_state = "idle" if ok else "failed"
                if ok:
                    self.state.ckpt_persist_s = time.perf_counter() - t0
                    self.state.ckpt_step = step

            result.add_done_callback(done)
        else:
            self.state.ckpt_state, self.state.ckpt_step, self.state.ckpt_persist_s = "idle", step, 0.0
        if told:  # the supervisor learns the root now, not at the next sampled heartbeat
            self.heartbeat.beat_now()

    def restore(self, ckpt: CheckpointManager) -> RestoreResult | None:
        """Resume from the supervisor's pick (or the newest verified checkpoint without one).

        What happened is told to the supervisor at once (not at the next sampled heartbeat):
        the root, the checkpoint restored (or a fresh start), and every checkpoint refused
        with its reason. When the supervisor says the job has had a checkpoint, a restore that
        finds none that verifies raises :class:`~supervisor.checkpoint.CheckpointLoadError`
        instead of training from scratch.
        """
        st = self.state
        self._note_root(ckpt)
        t0 = time.perf_counter()
        exclude: list[str] = []
        try:
            with self.phase(PHASE_RESTORE):
                hint = self.restore_point() if self.session.rank == 0 else None
                exclude = hint.get("exclude", []) if hint else []
                name = hint.get("checkpoint") if hint else None
                if name:
                    log.info("event=restore_point_from_supervisor checkpoint=%s exclude=%s", name, exclude)
                result = ckpt.restore(exclude=exclude, prefer=name, required=bool(hint and hint.get("required")))
        except CheckpointLoadError as exc:
            st.restore_state, st.restore_s = RESTORE_FAILED, time.perf_counter() - t0
            st.restore_refused = _refused(exc.skipped, exclude)
            self.heartbeat.beat_now()
            raise
        st.restore_s = time.perf_counter() - t0
        self._restored_at = time.perf_counter()
        if result is not None:
            st.ckpt_step = result.step
            st.restored = result.path.name
            st.restore_refused = _refused(result.skipped, exclude)
        st.restore_state = RESTORE_RESTORED if result is not None else RESTORE_FRESH
        self.heartbeat.beat_now()
        return result

    def restore_point(self) -> dict[str, Any] | None:
        """Ask the controller which checkpoint to resume from; None without one or on failure.

        The request is signed with the HTTP key (never the token) over this rank's launch,
        attempt and rank, a time and a nonce; only an answer MAC'd by the controller for that
        nonce is taken (:mod:`supervisor.protocol`)."""
        if not self.session.api:
            return None
        s = self.session
        url = f"{s.api.rstrip('/')}{RESTORE_POINT_PATH}"
        try:
            body = _get_answer(url, s.keys, s.launch, s.attempt, s.rank)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            log.warning("event=restore_point_unavailable url=%s error=%s action=scan_checkpoint_dir", url, exc)
            return None
        try:
            point = parse_restore_point(body, is_name=parse_name)
        except ProtocolError as exc:
            log.warning("event=restore_point_rejected reason=%s", exc)
            return None
        return {"checkpoint": point.checkpoint, "exclude": list(point.exclude), "required": point.required}


def _signal_node(sig: int) -> None:
    """The node drills: ``sig`` to every process of this rank's node: its torchrun agent (the
    parent), every rank under it, and this process last."""
    agent = os.getppid()
    me = os.getpid()
    for pid in [p for p in descendants(agent) if p != me] + [agent, me]:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _refused(skipped: list[Skipped], exclude: list[str]) -> tuple[tuple[str, str], ...]:
    """The checkpoints the restore refused, for the heartbeat (bounded; the rank log has the full
    reasons): every one it skipped but those the controller's restore point excluded."""
    passed_over = set(exclude)
    return refused_field((s.name, s.reason) for s in skipped if s.name not in passed_over)


_get_answer_retrying = None


def _get_answer(url: str, keys: Keys, launch: str, attempt: int, rank: int) -> bytes:
    """:func:`_get_answer_once`, tried 3 times with exponential back-off (tenacity is imported on
    first use: only rank 0 of a supervised job asks, once per attempt); each try is signed anew."""
    global _get_answer_retrying
    if _get_answer_retrying is None:
        from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

        _get_answer_retrying = retry(retry=retry_if_exception_type((OSError, urllib.error.URLError)),
                                     stop=stop_after_attempt(3), wait=wait_exponential(multiplier=0.2, max=2),
                                     reraise=True)(_get_answer_once)
    return _get_answer_retrying(url, keys, launch, attempt, rank)


def _get_answer_once(url: str, keys: Keys, launch: str, attempt: int, rank: int) -> bytes:
    """The body of the controller's answer, once its MAC for this request's nonce verified."""
    signed = restore_request(keys, launch=launch, attempt=attempt, rank=rank)
    req = urllib.request.Request(f"{url}?{signed.query}", headers=signed.headers)
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read(ANSWER_MAX_BYTES)
        check_restore_answer(keys.http, signed.nonce, resp.status, body, resp.headers.get(HEADER_MAC))
    return body

