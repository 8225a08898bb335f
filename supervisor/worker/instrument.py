"""What the supervisor installs in a rank whose script does not import the worker SDK.

A training script that uses only torch (a DDP or FSDP2 loop, a framework the user does not own)
is watched through what torch already keeps in every rank:

* **the step**: a global optimizer step hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
  counts the steps this process took (the most any one optimizer took) and times them;
* **collectives**: the flight recorder (``TORCH_FR_BUFFER_SIZE``, turned on here) numbers every
  collective of every process group; its ``pg_status`` says, per group, the last one enqueued and
  the last one completed. Read on the heartbeat thread (a few microseconds; the entries, for the
  collective's name, sizes and start, only once one has been pending for a whole interval), it
  fills the same heartbeat fields as the SDK's own count (``coll_seq``, ``coll_inside``,
  ``coll_s``, ``coll_op``) plus ``coll_group`` and ``coll_groups``, so the controller names the
  rank the others wait for exactly as it does for an SDK job;
* **stacks and the trace on request**: a ``dump`` from the controller writes every thread's stack
  (``faulthandler``) and the flight recorder's whole trace (``fr-rank-R.json``) to the rank's log
  directory before anything is killed; an ``abort`` does the same, then SIGKILLs the rank;
* **its last word**: an uncaught exception is reported (phase ``failed``, the error, whether a peer
  caused it) before the interpreter prints it, and a clean exit says ``done``;
* **phases**: ``init`` until the first optimizer step, then ``training``, whose clock restarts at
  every step and every collective enqueued or completed (the controller's hang timeout is "no
  step and no collective progress"); ``checkpoint`` while ``torch.save`` or DCP's ``save`` runs
  (a long save of the script's own is not a hang).

It is installed by the node agent (:mod:`supervisor.platforms.node.forking_agent`): in a forked
rank before the script runs, and in a new interpreter by the ``sitecustomize`` the agent puts on
the rank's ``PYTHONPATH`` (:mod:`supervisor.worker.boot`). Only in a process whose parent is the
agent (:data:`Env.AGENT_PID`): never in a data loader worker or a tool a rank starts. Not when
the job says ``instrument.enabled: false`` (:data:`Env.INSTRUMENT` ``off``), nor without a
controller to talk to.

When the script starts the SDK (``Worker.start``), the SDK takes over (:func:`hand_over`): this
heartbeat thread stops, the hooks go quiet, and the SDK's heartbeats number on from the last
sequence number sent here (no double heartbeats, none refused as replayed).

Nothing here blocks the rank on the supervisor: heartbeats are datagrams sent from a daemon
thread, and a controller that is gone changes nothing in the rank.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from supervisor.files import write_atomic
from supervisor.protocol import (
    OUTCOME_FINISHED,
    PHASE_CHECKPOINT,
    PHASE_DONE,
    PHASE_FAILED,
    PHASE_TRAINING,
    SOURCE_TORCH,
    Env,
    encode_groups,
)
from supervisor.worker.failures import is_peer_failure
from supervisor.worker.heartbeat import HeartbeatSender
from supervisor.worker.session import Session, SessionError
from supervisor.worker.telemetry import RankState
from supervisor.worker.watchdog import dump_stacks

log = logging.getLogger("supervisor.worker")

FR_BUFFER_DEFAULT = 2000
"""Flight-recorder entries kept per rank unless the job says otherwise (``instrument.fr_buffer``):
a few hundred kB, the last steps' collectives of a large model."""
SAMPLES_PER_BEAT = 10
"""How often, per heartbeat interval, the heartbeat thread samples whether a collective is pending
(the share of a step spent waiting: a straggler's peers wait, the straggler does not)."""
DEFAULT_GROUP = "0"
"""The flight recorder's id of the default process group (the first one created)."""


def torch_env(env: Mapping[str, str], log_dir: str | None) -> dict[str, str]:
    """The torch variables a rank needs that ``env`` does not set already (the job's own win):
    the flight recorder on, with a bounded ring, and on NCCL a stuck collective that dumps the
    recorder's trace into the rank's log directory and ends the process instead of waiting."""
    raw = env.get(Env.FR_BUFFER, "")
    size = int(raw) if raw.isdigit() else FR_BUFFER_DEFAULT
    wanted: dict[str, str] = {}
    if size > 0:
        # torch 2.13's names (the older TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE
        # still work there, with a deprecation warning in every rank: a job on an older torch sets them)
        wanted |= {"TORCH_FR_BUFFER_SIZE": str(size), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
        if log_dir:
            wanted["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(log_dir, "nccl-trace-rank-")  # torch appends the rank
    # a watchdog timeout or a communicator error ends the process (torch's default, said here so a
    # job's 0 is not the only value seen), and a stuck watchdog is itself noticed
    wanted |= {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_ENABLE_MONITORING": "1"}
    return {k: v for k, v in wanted.items() if k not in env}


def wanted_here(env: Mapping[str, str], *, ppid: int) -> bool:
    """Whether this process is a rank the supervisor should instrument: a rank of a supervised
    launch (an address to report to), started by the node agent itself, and not turned off."""
    if env.get(Env.INSTRUMENT, "").lower() in ("off", "0", "false", "no"):
        return False
    if not env.get(Env.HEARTBEAT_ADDR) or "RANK" not in env:
        return False
    agent = env.get(Env.AGENT_PID, "")
    return agent.isdigit() and int(agent) == ppid


class Instrumentation:
    """One rank's heartbeats from torch's own records (the module docstring)."""

    def __init__(self, session: Session, clock=time.monotonic) -> None:
        self.session = session
        self.clock = clock
        self.pid = os.getpid()
        self.state = RankState(clock=clock, source=SOURCE_TORCH)
        self.active = True
        log_dir = session.log_dir
        self.stack_path = log_dir / f"stacks-rank-{session.rank}.txt" if log_dir else None
        self.trace_path = log_dir / f"fr-rank-{session.rank}.json" if log_dir else None
        interval = session.heartbeat_interval
        self.heartbeat = HeartbeatSender(session, self.state, on_abort=self.abort, on_dump=self.dump,
                                         before_beat=self.refresh, sample=self.sample,
                                         sample_every_s=interval / SAMPLES_PER_BEAT)
        self._aborting = threading.Event()
        self._steps: dict[int, int] = {}  # id(optimizer) -> steps it took
        self._step = 0
        self._last_step_at: float | None = None
        self._samples = self._pending_samples = 0
        self._groups: dict[str, tuple[int, int]] = {}
        self._pending: tuple[str, int] | None = None  # (group, first uncompleted seq) seen pending
        self._pending_seen: float | None = None
        self._pending_polls = 0
        self._pending_op = ""
        self._hook_handles: list[Any] = []
        self._patched: list[tuple[Any, str, Any]] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Instrumentation":
        if self.session.log_dir:
            self.session.log_dir.mkdir(parents=True, exist_ok=True)
        self._hook_torch()
        self._install_excepthook()
        atexit.register(self._at_exit)
        self.heartbeat.start()
        log.info("event=rank_instrumented rank=%d source=torch (no worker SDK yet: heartbeats from torch's "
                 "optimizer hook and flight recorder)", self.session.rank)
        return self

    def hand_over(self) -> int:
        """The SDK takes over: stop here; the last heartbeat number sent (the SDK's next is above)."""
        if self.active:
            self.active = False
            for handle in self._hook_handles:
                handle.remove()
            self._hook_handles = []
            for owner, name, original in self._patched:
                setattr(owner, name, original)
            self._patched = []
            self.heartbeat.stop()
        return self.heartbeat.seq

    def _mine(self) -> bool:
        """Still the instrumented rank, not a fork of it (a data loader worker inherits the hooks)."""
        return self.active and os.getpid() == self.pid

    # ------------------------------------------------------------------ torch's hooks
    def _hook_torch(self) -> None:
        import importlib

        import torch  # a forked rank has it already; a new interpreter would import it next anyway

        optimizer = importlib.import_module("torch.optim.optimizer")
        self._hook_handles.append(optimizer.register_optimizer_step_post_hook(self._on_step))
        self._wrap(torch, "save")
        try:
            dcp = importlib.import_module("torch.distributed.checkpoint")
        except ImportError:
            return
        for name in ("save", "async_save", "save_state_dict"):
            if callable(getattr(dcp, name, None)):
                self._wrap(dcp, name)

    def _wrap(self, owner: Any, name: str) -> None:
        """Run ``owner.name`` in the checkpoint phase (a long save of the script's own is not a hang)."""
        original = getattr(owner, name)
        state, mine = self.state, self._mine

        def saving(*args: Any, **kwargs: Any) -> Any:
            if not mine() or state.phase == PHASE_CHECKPOINT:
                return original(*args, **kwargs)
            with state.phase_scope(PHASE_CHECKPOINT):
                return original(*args, **kwargs)

        saving.__wrapped__ = original  # type: ignore[attr-defined]
        saving.__name__ = getattr(original, "__name__", name)
        saving.__doc__ = getattr(original, "__doc__", None)
        setattr(owner, name, saving)
        self._patched.append((owner, name, original))

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._mine():
            return
        key = id(optimizer)
        n = self._steps.get(key, 0) + 1
        self._steps[key] = n
        if n <= self._step:
            return  # another optimizer of the same step (a GAN's two, say)
        self._step = n
        now = self.clock()
        timings = (0.0, 0.0, 0.0, 0.0)
        if self._last_step_at is not None:
            step_s = now - self._last_step_at
            waited = self._pending_samples / self._samples if self._samples else 0.0
            timings = (0.0, step_s * (1.0 - waited), step_s * waited, step_s)
        self._last_step_at = now
        self._samples = self._pending_samples = 0
        self.state.set_step(n, timings, PHASE_TRAINING)
        if n == 1:
            self.state.first_step_s = 0.0
            self.heartbeat.beat_now()  # the first step is news: the controller's restart timer ends on it

    # ------------------------------------------------------------------ the flight recorder
    def _pg_status(self) -> dict[str, tuple[int, int]] | None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return trace_groups(json.loads(sys.modules["torch"]._C._distributed_c10d._dump_fr_trace_json(False, True)))

    def sample(self) -> None:
        """Between heartbeats: is a collective pending (this step's share of waiting)?"""
        groups = self._pg_status()
        if groups is None:
            return
        self._samples += 1
        if any(e > d for e, d in groups.values()):
            self._pending_samples += 1
        if groups != self._groups:
            self._groups = groups
            self.state.progress(PHASE_TRAINING)

    def refresh(self) -> None:
        """Before each heartbeat: the collectives, per group, into the rank's state."""
        if not self._mine():
            return
        groups = self._pg_status()
        if groups is None:
            return
        if groups != self._groups:
            self._groups = groups
            self.state.progress(PHASE_TRAINING)
        # a group with collectives enqueued and not all completed: the rank waits in the newest it
        # entered (gloo's recorder can mark an earlier one completed late: the first not marked
        # completed may be one the rank already went past, and its peers entered)
        pending = {g: e for g, (e, d) in groups.items() if e > d}
        if pending:
            # the group waited in longest (the one seen pending before, while it still is)
            if self._pending is not None and pending.get(self._pending[0]) == self._pending[1]:
                group = self._pending[0]
                self._pending_polls += 1
            else:
                group = min(pending, key=lambda g: (g != DEFAULT_GROUP, len(g), g))
                self._pending, self._pending_seen, self._pending_polls = (group, pending[group]), self.clock(), 0
                self._pending_op = ""
            seq = pending[group]
            if self._pending_polls == 1:  # pending for a whole interval: worth one look at the entries
                found = self._entry(group, seq)
                if found is not None:
                    self._pending_op, created_ns = found
                    if created_ns:
                        self._pending_seen = min(self._pending_seen or self.clock(),
                                                 self.clock() - max(0.0, (time.time_ns() - created_ns) / 1e9))
            self.state.set_collectives(group=group, seq=seq, op=self._pending_op or "collective",
                                       inside_since=self._pending_seen, groups=encode_groups(groups))
        else:
            self._pending = None
            group = DEFAULT_GROUP if DEFAULT_GROUP in groups else min(groups, default="")
            seq = groups[group][0] if group else 0
            self.state.set_collectives(group=group, seq=max(0, seq), op=self.state.coll_op, inside_since=None,
                                       groups=encode_groups(groups))

    def _entry(self, group: str, seq: int) -> tuple[str, int] | None:
        raw = json.loads(sys.modules["torch"]._C._distributed_c10d._dump_fr_trace_json(True, True))
        return trace_entry(raw, group, seq)

    def write_trace(self) -> str:
        """The flight recorder's whole trace into the rank's log directory; where it went, or ""."""
        return write_trace(self.trace_path)

    # ------------------------------------------------------------------ control and last words
    def dump(self, reason: str) -> None:
        where = dump_stacks(self.stack_path, f"stack dump requested by the supervisor: {reason}")
        self.state.stack_file = where
        self.state.trace_file = self.write_trace()
        log.warning("event=stacks_dumped rank=%d reason=%s stacks=%s trace=%s", self.session.rank, reason, where,
                    self.state.trace_file or "-")

    def abort(self, reason: str) -> None:
        if self._aborting.is_set():
            return
        self._aborting.set()
        where = dump_stacks(self.stack_path, f"abort ordered by the supervisor: {reason}")
        self.write_trace()
        log.error("event=abort_ordered rank=%d reason=%s stacks=%s", self.session.rank, reason, where)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)

    def _install_excepthook(self) -> None:
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            try:
                if self._mine() and not isinstance(exc, KeyboardInterrupt):
                    peer = is_peer_failure(exc)
                    self.state.set_failed(f"{type(exc).__name__}: {exc}", peer)
                    self.heartbeat.beat_now()
            except Exception:  # noqa: BLE001 - reporting must not mask the original exception
                pass
            finally:
                previous(kind, exc, tb)

        sys.excepthook = hook

    def _at_exit(self) -> None:
        """The interpreter ends (not on an uncaught exception: that said ``failed`` already)."""
        if not self._mine():
            return
        if self.state.phase != PHASE_FAILED:
            self.state.outcome = OUTCOME_FINISHED
            self.state.set_phase(PHASE_DONE)
        self.heartbeat.beat_now()
        self.heartbeat.stop()


def trace_groups(trace: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``{group: (last enqueued, last completed)}`` from a flight-recorder trace (the JSON of
    ``_dump_fr_trace_json``; gloo's and NCCL's alike: ``pg_status`` maps each group id to its
    ``last_enqueued_collective``/``last_started_collective``/``last_completed_collective``, as
    strings, -1 for none). Only enqueued and completed are used: gloo never sets started."""
    out = {}
    status = trace.get("pg_status")
    for group, st in (status.items() if isinstance(status, Mapping) else ()):
        if not isinstance(st, Mapping):
            continue
        try:
            enq = int(st.get("last_enqueued_collective", -1))
            done = int(st.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            continue
        out[str(group)] = (max(enq, -1), max(-1, min(done, enq)))
    return out


def trace_entry(trace: Mapping[str, Any], group: str, seq: int) -> tuple[str, int] | None:
    """Collective ``seq`` of ``group`` in a trace's entries: its name and input sizes
    (``gloo:all_reduce [[1024]]``, ``nccl:all_reduce [[4096]]``) and when it was enqueued
    (``time_created_ns``, the wall clock), or None when the ring no longer holds it."""
    entries = trace.get("entries")
    for entry in reversed(entries if isinstance(entries, list) else []):
        if not isinstance(entry, Mapping):
            continue
        pg = entry.get("pg_id", (entry.get("process_group") or [None])[0])
        if str(pg) == group and str(entry.get("collective_seq_id")) == str(seq):
            sizes = json.dumps(entry.get("input_sizes", []), separators=(",", ":"))
            created = entry.get("time_created_ns") or 0
            return f"{entry.get('profiling_name', 'collective')} {sizes}"[:64], int(created) if str(created).isdigit() else 0
    return None


def write_trace(path: Path | None) -> str:
    """The flight recorder's trace (JSON, every entry) written whole to ``path``; "" when there is
    no path, no process group or no recorder, or it cannot be written."""
    torch = sys.modules.get("torch")
    dist = sys.modules.get("torch.distributed")
    if path is None or torch is None or dist is None or not dist.is_initialized():
        return ""
    try:
        trace = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
        write_atomic(path, trace if isinstance(trace, bytes) else trace.encode(), mode=0o644, durable=False)
    except (OSError, RuntimeError, AttributeError) as exc:
        log.warning("event=trace_not_written path=%s error=%s", path, exc)
        return ""
    return str(path)


_ACTIVE: Instrumentation | None = None
_LOCK = threading.Lock()


def install(env: Mapping[str, str] | None = None) -> Instrumentation | None:
    """Instrument this process if it is a rank that wants it (:func:`wanted_here`); idempotent.
    Sets the torch variables first (:func:`torch_env`), so a process group created after this
    records its collectives. Never raises: a rank that cannot be instrumented runs as it would have."""
    global _ACTIVE
    env = os.environ if env is None else env
    with _LOCK:
        if _ACTIVE is not None and _ACTIVE.pid == os.getpid():
            return _ACTIVE
        if not wanted_here(env, ppid=os.getppid()):
            return None
        if env is os.environ:
            os.environ.update(torch_env(env, env.get(Env.LOG_DIR) or None))
        try:
            session = Session.from_env(env)
            _ACTIVE = Instrumentation(session).start()
        except (SessionError, ImportError, OSError) as exc:
            print(f"supervisor: this rank is not instrumented: {exc}", file=sys.stderr, flush=True)
            return None
        return _ACTIVE


def hand_over() -> int:
    """The SDK starts in this process: the instrumentation stops; the last heartbeat number it
    sent (0 when it never ran here)."""
    with _LOCK:
        inst = _ACTIVE
    if inst is None or inst.pid != os.getpid():
        return 0
    return inst.hand_over()
