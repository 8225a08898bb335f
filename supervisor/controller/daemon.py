"""The controller process: observe -> decide (pure) -> act through a Platform.

Tasks (each named; one that dies unexpectedly stops the daemon loudly):

* ``intake``: the UDP heartbeat endpoint (:class:`Intake`), authenticated (the heartbeat key
  derived from the job token) and fenced by launch id and attempt; bad datagrams are counted by
  reason and change nothing.
* ``http``: ``/metrics``, ``/healthz``, ``/readyz``, ``/status`` and ``/v1/restore-point``.
* ``reconcile``: every ``TICK_S``: ask the platform for node states, run the detectors,
  and on a fault walk the escalation ladder (evidence first), then relaunch or stop.

A small state file (``LOG_DIR/supervisor-state.json``, written durably on every change; see
:mod:`supervisor.controller.state`) lets a restarted controller adopt the running gang
instead of killing it; the agents run in their own sessions, so a ``kill -9`` of the
controller leaves training untouched. One controller per job: ``LOG_DIR/supervisor.lock``.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import heapq
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Awaitable, Callable

from supervisor.checkpoint.cache import Scan, VerifiedCache
from supervisor.checkpoint.discovery import parse_name
from supervisor.controller import preflight
from supervisor.controller import state as state_file
from supervisor.controller import token as job_token
from supervisor.files import prune_oldest, rotate, set_aside, write_atomic
from supervisor.config import JobConfig
from supervisor.controller.decide import (
    ACTION_ABORT,
    ACTION_KILL_NODE,
    ACTION_TEAR_DOWN,
    EXIT_CODES,
    CapacityWait,
    RUNG_KILL_NODE,
    RUNG_TEARDOWN,
    TERMINAL,
    Fault,
    History,
    JobPhase,
    Relaunch,
    RestartTimer,
    Rung,
    Shrink,
    Stop,
    capacity,
    classify,
    grow,
    completed,
    evidence_awaited,
    gang_size,
    in_place_ok,
    ladder,
    note_refusals,
    pick_checkpoint,
    plan_next,
    rank_ended,
    restarted_in_place,
    restore_report,
    root_verdict,
    rung_worked,
)
from supervisor.health import Registry, Timeouts, calibrate, detect, straggler_scores
from supervisor.metrics import MetricsState, Snapshot, take_snapshot
from supervisor.platforms.node.agent_output import read_tail
from supervisor.platforms.base import WAIT_CANNOT_START, LaunchSpec, NodeState, NodeStatus, Platform, PlatformError
from supervisor.procfs import pids_with_env
from supervisor.protocol import (
    MAX_DATAGRAM,
    Env,
    OUTCOME_STOPPED,
    PHASE_DONE,
    PHASE_FAILED,
    REJECT_OTHER_LAUNCH,
    REJECT_STALE_ATTEMPT,
    REJECT_UNAUTHENTICATED,
    ControlSequencer,
    Keys,
    ProtocolError,
    control_message,
    decode_heartbeat,
    derive_keys,
    encode,
    new_launch_id,
)

log = logging.getLogger("supervisor.controller")
TICK_S = 0.2
CHECKPOINT_POLL_S = 2.0
LAUNCH_TRIES = 3
CALIBRATE_S = 2.0
# How long, at least, a fault seen only through ranks that lost a peer waits for the culprit
# to show up (and at most the heartbeat timeout + 1 s, so that a silent culprit is seen).
SECONDARY_GRACE_S = 2.0
STANDBY_AFTER_S = 10.0
"""Once a launch's gang has been running this long, the platform's warm agents are refilled
(``Platform.warm_up``): the next relaunch then finds agents that have already imported torch
instead of ones still importing it. Not at once: a job's start-up (its ranks building models,
restoring) does not share its cores with them, and a job that ends within seconds never pays."""
LEASE_RENEW_S = 10.0  # the job's owner lease (controller.state.JobLock) is renewed this often
RECEIVE_BUFFER_BYTES = 16 << 20  # ~1 s of 16,384 heartbeats: the kernel's default holds ~10 ms
STATE_FILE = state_file.STATE_FILE
EVENTS_FILE = "events.jsonl"
EVENTS_MAX_BYTES = 64 << 20
"""events.jsonl is archived (``events.jsonl.1``; the older ones move up) once it reaches this size."""
EVENTS_KEPT = 8
"""Archived generations of events.jsonl kept beside it (the oldest beyond them is removed): at most
(1 + EVENTS_KEPT) x EVENTS_MAX_BYTES in all, tens of thousands of faults' worth."""
EVIDENCE_MAX_BYTES = 512 << 20
"""The evidence folder's size at most: past it the oldest evidence files go (an event names them).
A fault's file at 16,384 ranks is ~10 MB (every rank's last heartbeat)."""
STATUS_ALL_RANKS = 256
"""``/status`` lists every rank of a job of at most this many ranks (as ``/metrics`` does)."""
STATUS_WORST_RANKS = 16
"""Above :data:`STATUS_ALL_RANKS`: ``/status`` lists this many stalest and this many slowest ranks
(``?offset=K&limit=N`` pages through the others)."""
STATUS_PAGE_MAX = 1024
"""Ranks in one page of ``/status?offset=K`` at most."""


DRAIN_MAX = 256
"""Heartbeats read per wake-up at most: bounded so that a flood cannot starve the ticks and the
HTTP API sharing the loop (a full drain is followed at once by the next one)."""
COALESCE_S = 0.005
"""After a wake-up that read heartbeats, the intake stops watching its socket this long and lets
them queue in the kernel (interrupt coalescing): a reader woken for every datagram pays an
``epoll_wait``, a loop iteration and a failed read per heartbeat, which at 16,384 ranks a second
was most of the controller's CPU. Heartbeats wait at most this long; timeouts are seconds."""
_READ_SIZE = MAX_DATAGRAM + 1
"""What one read asks for: asyncio's datagram transport reads with a 256 KiB buffer (its
``max_size``); a frame longer than :data:`MAX_DATAGRAM` arrives cut to this size and is still
refused as oversized."""


class Intake(asyncio.DatagramProtocol):
    """Heartbeats in: authenticate, validate, fence by attempt, record. Never raises.

    The transport is kept for sending (control messages); reading is done by the intake itself,
    on its own handle of the socket: up to :data:`DRAIN_MAX` datagrams per wake-up, then a pause
    of :data:`COALESCE_S`. Where the transport cannot pause its own reading, it reads (one
    datagram per callback, into ``datagram_received``) and the intake drains what else is queued.
    """

    def __init__(self, controller: "Controller") -> None:
        self.c = controller
        self.transport: asyncio.DatagramTransport | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set while the intake reads for itself
        self._resume: asyncio.Handle | None = None  # watching again after a pause (COALESCE_S)

    def connection_made(self, transport) -> None:
        self.transport = transport
        try:  # our own handle on the same socket
            self._sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
            self._sock.setblocking(False)
        except (OSError, AttributeError):
            self._sock = None  # one datagram per callback, as asyncio does
            return
        pause = getattr(transport, "pause_reading", None)
        if pause is None:
            return
        try:
            loop = asyncio.get_running_loop()
            pause()
            self._loop = loop
            self._watch()
        except (RuntimeError, NotImplementedError):  # a loop without add_reader: the transport reads
            self._loop = None
            resume = getattr(transport, "resume_reading", None)
            if resume is not None:
                resume()

    def connection_lost(self, exc) -> None:
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())  # a no-op while paused
            self._loop = None
            self._sock.close()
            self._sock = None

    def _watch(self) -> None:
        self._resume = None
        if self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._readable)

    def _readable(self) -> None:
        n = self._drain()
        loop = self._loop
        if loop is None or self._sock is None or n == 0:
            return
        loop.remove_reader(self._sock.fileno())
        # more queued than one drain takes: go on after whatever else is ready; else coalesce
        self._resume = loop.call_soon(self._watch) if n >= DRAIN_MAX else loop.call_later(COALESCE_S, self._watch)

    def datagram_received(self, data: bytes, addr) -> None:
        self._take(data, addr)
        self._drain()

    def _drain(self) -> int:
        """Read and take what is queued, up to :data:`DRAIN_MAX` datagrams; how many were read."""
        sock = self._sock
        if sock is None:
            return 0
        recvfrom, take = sock.recvfrom, self._take
        for n in range(DRAIN_MAX):
            try:
                data, addr = recvfrom(_READ_SIZE)
            except OSError:  # BlockingIOError: nothing more queued
                return n
            take(data, addr)
        return DRAIN_MAX

    def _take(self, data: bytes, addr) -> None:
        c = self.c
        keys = c.keys
        try:
            if keys is None:
                raise ProtocolError(REJECT_UNAUTHENTICATED, "no job token yet")
            hb = decode_heartbeat(data, keys.heartbeat)
        except ProtocolError as exc:
            c.rejected[exc.reason] = c.rejected.get(exc.reason, 0) + 1
            return
        if hb.launch != c.launch_id:
            # not this launch's: an earlier launch of this run (its ranks on their way out), or a
            # launch this controller never made (another run's frame with the same token: replayed)
            reason = REJECT_STALE_ATTEMPT if hb.launch in c.launch_ids else REJECT_OTHER_LAUNCH
            c.rejected[reason] = c.rejected.get(reason, 0) + 1
            return
        if hb.attempt != c.attempt or hb.job != c.cfg.job:
            if hb.job == c.cfg.job and c.attempt < hb.attempt <= c.launch_attempt + c.in_place_allowed:
                # ranks restarted in place by their agents, ahead of the controller: the
                # controller catches up (restarted_in_place), then takes their heartbeats
                c.ahead_attempt = max(c.ahead_attempt or 0, hb.attempt)
                return
            c.rejected[REJECT_STALE_ATTEMPT] = c.rejected.get(REJECT_STALE_ATTEMPT, 0) + 1
            return
        if hb.world_size != c.registry.world_size and c.registry.world_size:
            c.rejected["schema"] = c.rejected.get("schema", 0) + 1
            return
        c.received += 1
        if c.registry.observe(hb, c.clock()):
            c.addr_by_rank[hb.rank] = addr  # only an accepted heartbeat may move a rank's reply address

    def send(self, payload: dict, addr) -> None:
        """A control message to a rank of the current launch (stamped with its id), under the
        control key."""
        c = self.c
        if self.transport is not None and addr is not None and c.keys is not None:
            self.transport.sendto(encode(payload | {"launch": c.launch_id}, c.keys.control), addr)


class JobAlreadyFinished(Exception):
    def __init__(self, saved: dict) -> None:
        super().__init__(saved.get("phase"))
        self.saved = saved


class Controller:
    def __init__(self, cfg: JobConfig, platform: Platform, *, clock=time.monotonic, fresh: bool = False) -> None:
        self.cfg = cfg
        self.fresh = fresh
        self.run_no = 1
        self.run_started = time.time()
        self.require_checkpoint = False
        self.skip_steps: list[int] = []
        self.scrapes = 0  # /metrics reads: after the end, linger for one more if a scraper has been seen
        self.stop_requested = False  # the job ends on purpose (a signal): metrics say so, alerts stay quiet
        self.requeue_planned = False  # the stop is a planned requeue (Slurm's time-limit warning)
        self._linger_cut = False
        self._lease_renewed = -LEASE_RENEW_S
        self._agents_ended_at: float | None = None  # when no agent of the gang was running any more
        self._pending_stop: tuple[JobPhase, str] | None = None
        self._lease_lost_told = False
        self._standby_at: float | None = None  # when to refill the warm agents (STANDBY_AFTER_S)
        self.checkpoint_times: collections.deque[float] = collections.deque(maxlen=8)  # metrics: the interval
        self._old_gang: dict | None = None  # --fresh over a live run: its gang, to stop through the platform  # a verdict to give once the gang is torn down
        self.report = None  # the ranks' restore report of this attempt, once they all sent one
        self.restored: str | None = None
        self._lock = state_file.JobLock(Path(cfg.log_dir).resolve(), owner=platform.lock_owner())
        self.control_seq = ControlSequencer()  # numbers abort/dump orders: a captured one cannot be replayed
        self.platform = platform
        self.clock = clock
        self.log_dir = Path(cfg.log_dir).resolve()
        self.ckpt_root = Path(cfg.checkpoint_dir).resolve()
        self.state_path = self.log_dir / STATE_FILE
        self.registry = Registry()
        self.phase = JobPhase.STARTING
        self.attempt = 0
        self.launch_attempt = 0
        """The attempt the running agents were launched with (restarts in place raise ``attempt``)."""
        self.in_place_allowed = 0  # restarts in place the running agents allow (their --max-restarts)
        self.in_place_used = 0
        self.in_place_deadline: float | None = None  # the restarted ranks report in by then, or the gang goes
        self.in_place_failed = False
        self.ahead_attempt: int | None = None  # ranks of a later attempt heard (restarted in place)
        self.history = History()
        self.nodes: list[str] = []
        self.node_status: dict[str, NodeStatus] = {}
        self.restore_from: str | None = None
        self.restored_step = 0
        self.launched_at = clock()
        self.timers: list[RestartTimer] = []
        self.current_timer: RestartTimer | None = None
        self.rejected: dict[str, int] = {}
        self.received = 0
        self.restarts_by_reason: dict[str, int] = {}
        self.addr_by_rank: dict[int, Any] = {}
        self.findings: list = []
        self.active_hang: Fault | None = None
        # the most recent fault, kept after it was handled (metrics: supervisor_last_fault_*)
        self.last_fault: Fault | None = None
        self.last_fault_culprits: list[tuple[int, str]] = []
        self.last_fault_attempt = -1
        self.last_fault_unix = 0.0
        self.stragglers: dict[int, float] = {}
        self.timeouts = Timeouts(heartbeat_s=cfg.heartbeat.timeout_s, startup_s=cfg.health.startup_timeout_s,
                                 checkpoint_s=cfg.health.checkpoint_timeout_s)
        self.latest_ckpt: dict[str, Any] | None = None
        self.ckpt_step_at_attempt_start = -1
        self.stop_reason = ""
        self.budget_exceeded = False
        self.keys: Keys | None = None
        self.token = b""  # the job token (held, never sent); sets ``keys``, derived from it
        self.launch_id = ""
        """The random id of the running gang's launch (Env.LAUNCH): only its frames are taken."""
        self.launch_ids: collections.deque[str] = collections.deque(maxlen=64)
        """This run's launch ids, the current one last: a frame of an earlier one is a stale attempt."""
        self.intake_port = cfg.intake.port
        self.http_port = cfg.http.port
        self.intake: Intake | None = None
        self._stop = asyncio.Event()
        self._last_ckpt_poll = 0.0
        self._ckpt_cache = VerifiedCache()  # fast verifications by checkpoint name (published ones never change)
        self._ckpt_scan: asyncio.Future | None = None  # a look at the checkpoint root under way (a worker thread)
        self._usable: list[str] = []  # the checkpoints that verified at the last full look, newest first
        self._ckpt_rebase = False  # a root adopted: count this attempt's progress from its newest checkpoint
        self._step_marks: list[tuple[float, int]] = []
        self._last_calibration = -CALIBRATE_S
        self._secondary_since: float | None = None
        self.capacity_since: float | None = None
        """Since when the cluster could not place the gang (None: placed, or not on such a platform)."""
        self.capacity_message = ""
        self.ready = False
        self._handoff = False
        self._root_judged = False  # this attempt's checkpoint root was checked before any restore report
        """SIGTERM on a platform that keeps the gang through a controller restart: leave it running."""

    @property
    def handed_off(self) -> bool:
        """This controller left on SIGTERM with the gang running, for the next one to adopt."""
        return self._handoff

    @property
    def token(self) -> bytes:
        """The job token. It never leaves this host: frames and HTTP requests are MAC'd with the
        keys derived from it (``keys``; None without a token: nothing is then authenticated)."""
        return self._token

    @token.setter
    def token(self, token: bytes) -> None:
        self._token = token
        self.keys = derive_keys(token) if token else None

    def _new_launch(self) -> None:
        """A new launch of the gang: a new random id, in its ranks' environment and frames."""
        self.launch_id = new_launch_id()
        self.launch_ids.append(self.launch_id)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        """Run the job to its end; returns the exit code. Raises :class:`StateError` (nothing
        started) when another controller holds the job or its saved state cannot be used."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lock.elected = self.platform.elected()
        self._lock.acquire()
        try:
            return await self._run_locked()
        finally:
            self._lock.release()

    async def _run_locked(self) -> int:
        if self._lock.took_over:
            self.event("job_lease_taken_over", previous=self._lock.took_over)
            log.warning("event=job_lease_taken_over previous=%s", self._lock.took_over)
        try:
            saved = self._open_history()
        except JobAlreadyFinished as done:
            prev = done.saved
            self.phase, self.stop_reason = JobPhase(prev["phase"]), prev.get("stop_reason", "")
            self.event("job_already_finished", run=prev.get("run", 1), phase=prev["phase"],
                       exit_code=prev.get("exit_code"), reason=self.stop_reason,
                       detail="nothing to do: this run ended; `supervisor run --fresh` (or a new release) starts "
                              "a new one")
            log.info("event=job_already_finished phase=%s reason=%s", prev["phase"], self.stop_reason)
            return EXIT_CODES.get(self.phase, 1)
        for name, fields in self.platform.notices():
            self.event(name, **fields)
            log.warning("event=%s %s", name, " ".join(f"{k}={v}" for k, v in fields.items()))
        if self._old_gang is not None:
            old = self._old_gang
            if await self.platform.adopt(old.get("platform", {}), _launched_as(old)):
                self.event("old_gang_stopped", attempt=old["attempt"], detail="--fresh: what was left of the previous "
                           "run's gang, through the platform")
                await self.platform.teardown(self.cfg.restart.kill_grace_s)
        adopt_gang = False
        if saved and JobPhase(saved["phase"]) not in TERMINAL:
            adopt_gang = await self.platform.adopt(saved.get("platform", {}), _launched_as(saved))
        if not adopt_gang:
            self.platform.warm_up()  # the first launch follows: its agents import torch meanwhile
        self._init_token(saved)
        loop = asyncio.get_running_loop()
        transport, self.intake = await self._bind_intake(loop, saved, adopt_gang)
        self.intake_port = transport.get_extra_info("sockname")[1]
        _grow_receive_buffer(transport.get_extra_info("socket"))
        from supervisor.controller.http import start_http

        runner = await self._bind_http(start_http, saved)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop, sig)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            # from here to the end the controller answers: what watches it starts before any launch
            api = f"http://{self.platform.controller_address(self.cfg.http.host)}:{self.http_port}"
            await self.platform.serving(api)
            if adopt_gang:
                self._adopt(saved)
            else:
                await self._preflight()
                await self._first_launch(saved)
            self.ready = True
            await self._reconcile_loop()
            await self._linger()
        finally:
            transport.close()
            await runner.cleanup()
        if self._handoff:
            return 0
        code = EXIT_CODES.get(self.phase, 1)
        self.event("job_finished", phase=self.phase.value, exit_code=code, reason=self.stop_reason)
        return code

    async def _linger(self) -> None:
        """After the end, keep serving /metrics until the scraper that has been watching has
        seen the final phase once (the alerts need it: a job that ended, or was stopped on
        purpose, must never page as "down"), at most ``metrics_linger_s``; never for nobody:
        a torchrun-like command returns when its job ends. A second signal cuts it short."""
        if self.phase not in TERMINAL or self.cfg.metrics_linger_s <= 0 or not self.scrapes:
            return
        self.event("metrics_linger", seconds=self.cfg.metrics_linger_s,
                   detail="serving /metrics until the scraper has seen the final phase")
        seen, deadline = self.scrapes, self.clock() + self.cfg.metrics_linger_s
        while self.scrapes == seen and self.clock() < deadline and not self._linger_cut:
            await asyncio.sleep(0.05)

    async def serve_ended(self, until: asyncio.Event) -> None:
        """After the job has ended (or was found ended): keep answering ``/healthz``, ``/readyz``,
        ``/status`` and ``/metrics`` (the verdict) until ``until`` is set. A controller that
        stays up after the end (a Deployment's) must still pass its liveness probe, and its
        scrapers must see the final phase, not a target gone down."""
        from supervisor.controller.http import start_http

        self.ready = True  # ready to be scraped and asked: the Service lists only ready pods
        runner = await self._bind_http(start_http, {"http_port": self.http_port} if self.http_port else None)
        log.info("event=serving_verdict phase=%s http=%s:%s", self.phase.value, self.cfg.http.host, self.http_port)
        try:
            await until.wait()
        finally:
            await runner.cleanup()

    def request_stop(self, sig: int) -> None:
        """Tear the gang down (SIGTERM, restart.kill_grace_s: ranks write an emergency checkpoint) and exit."""
        if self._stop.is_set() or self.phase in TERMINAL:
            # a second signal, or one after the job ended: the verdict stands; only the wait
            # for a last scrape is cut short
            self._linger_cut = True
            return
        if sig == signal.SIGTERM and self.platform.hands_off_on_sigterm:
            # the controller's own pod is being replaced (an upgrade, a drained node): the gang
            # trains on and the next controller adopts it
            log.warning("event=signal_received signal=SIGTERM action=hand_off (the gang keeps running; the next "
                        "controller adopts it)")
            self._handoff = True
            self._stop.set()
            return
        log.warning("event=signal_received signal=%s action=tear_down_and_exit", signal.Signals(sig).name)
        self.stop_reason = f"stopped by {signal.Signals(sig).name}"
        self.stop_requested = True
        self._stop.set()

    def _open_history(self) -> dict | None:
        """The saved state this controller continues, or None for a new run.

        A live or interrupted run (not in a terminal phase) is continued: its gang adopted, or
        its history carried on. A finished run's state is archived and a new run starts with a
        new history; an event says what it inherits (nothing but the checkpoints on disk).
        With ``fresh``, any saved state (even an unreadable one) is archived after what is
        left of its gang has been stopped.
        """
        try:
            saved = state_file.load(self.state_path)
        except state_file.StateError:
            if not self.fresh:
                raise
            saved = None
            self._stop_strays()
            where = state_file.archive(self.state_path, "unreadable")
            self.event("run_started", run=1, fresh=True, previous_state=str(where),
                       inherited="nothing: the previous state was unreadable; checkpoints on disk are discovered "
                                 "again and verified by the ranks")
            return None
        if saved is not None and saved["job"] != self.cfg.job:
            if not self.fresh and JobPhase(saved["phase"]) not in TERMINAL:
                # its gang may be running: never leave it neither adopted nor stopped
                raise state_file.StateError(
                    f"{self.log_dir} holds the state of another job ({saved['job']!r}, phase {saved['phase']}), whose "
                    f"gang may still be running: give this job ({self.cfg.job!r}) its own --log-dir, or use --fresh "
                    "to stop what is left of that job and start this one here")
            if self.fresh and JobPhase(saved["phase"]) not in TERMINAL:
                self._stop_strays()
            where = state_file.archive(self.state_path, f"job-{saved['job'][:40]}")
            log.warning("event=state_file_of_another_job job=%s archived=%s", saved["job"], where)
            saved = None
        if saved is None:
            if not self.fresh:
                self.event("run_started", run=1, inherited="nothing (no previous run in this log directory)")
            return None
        phase = JobPhase(saved["phase"])
        if phase in TERMINAL and phase != JobPhase.REQUEUED and not self.fresh and not self.platform.reruns_finished:
            # restarted after the end (a Deployment restarts what exits): the verdict stands
            raise JobAlreadyFinished(saved)
        # a planned requeue is the same run going on in a new allocation: its history continues
        if self.fresh or (phase in TERMINAL and phase != JobPhase.REQUEUED):
            if self.fresh and phase not in TERMINAL:
                self._stop_strays()
                self._old_gang = saved  # stopped through the platform too (Slurm steps on other nodes)
            where = state_file.archive(self.state_path, f"run{saved.get('run', 1)}")
            ranks_dir = self.log_dir / "ranks"
            if ranks_dir.exists():  # the ranks' own logs (steps, stacks) are that run's evidence too
                set_aside(ranks_dir, f"run{saved.get('run', 1)}")
            self.run_no = int(saved.get("run", 1)) + 1
            self.event("run_started", run=self.run_no, fresh=self.fresh,
                       previous_run={"phase": saved["phase"], "attempt": saved["attempt"],
                                     "exit_code": saved.get("exit_code"), "reason": saved.get("stop_reason", ""),
                                     "state": str(where)},
                       inherited="nothing: attempts, restarts, suspect checkpoints, excluded nodes and the "
                                 "no-progress count start fresh; checkpoints on disk are discovered again and "
                                 "fully verified by the ranks")
            log.info("event=run_started run=%d previous_phase=%s previous_state=%s", self.run_no, saved["phase"], where)
            return None
        self.run_no = int(saved.get("run", 1))
        self.run_started = float(saved.get("run_started", time.time()))
        if phase == JobPhase.REQUEUED:
            self.event("requeue_resumed", run=self.run_no, attempt=saved["attempt"],
                       detail="the requeued job continues its run's history from the newest verified checkpoint")
        if saved.get("ckpt_root"):
            self.ckpt_root = Path(saved["ckpt_root"])
        return saved

    def _stop_strays(self) -> None:
        """``--fresh``: no process of an earlier gang of this job may outlive its record."""
        marker = str(self.log_dir / "ranks")
        pids = pids_with_env(Env.LOG_DIR, marker)
        for pid in pids:
            for target in (lambda: os.killpg(os.getpgid(pid), signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    target()
                except OSError:
                    pass
        if pids:
            log.warning("event=strays_killed pids=%s (processes of an earlier gang of this job)", pids)
            self.event("strays_killed", pids=pids)

    async def _bind_intake(self, loop, saved: dict | None, adopt_gang: bool):
        """The heartbeat port: an adopted gang's ranks send to the saved one, so it must be had;
        otherwise the configured one (0: any free port)."""
        port = int(saved.get("intake_port", 0)) if (saved and adopt_gang) else self.intake_port
        try:
            return await loop.create_datagram_endpoint(lambda: Intake(self), local_addr=(self.cfg.intake.host, port))
        except OSError as exc:
            if adopt_gang:  # the gang was only looked at: it runs on, untouched
                raise state_file.StateError(
                    f"the running gang sends its heartbeats to {self.cfg.intake.host}:{port}, which this controller "
                    f"cannot bind ({exc}); another process holds it (`ss -ulpn 'sport = :{port}'` names it). Stop "
                    "that process and run the same command again to adopt the gang, or use --fresh to stop the "
                    "gang and start a new run.") from None
            raise state_file.StateError(f"cannot bind the heartbeat port {self.cfg.intake.host}:{port}: {exc}") from None

    async def _bind_http(self, start_http, saved: dict | None):
        """The HTTP port: the one given wins; else the saved one (scrapers know it) when free; else any."""
        given = self.cfg.http.port
        candidates = [given] if given else ([int(saved["http_port"])] if saved and saved.get("http_port") else []) + [0]
        for i, port in enumerate(candidates):
            try:
                return await start_http(self, self.cfg.http.host, port)
            except OSError as exc:
                if given or i == len(candidates) - 1:
                    raise state_file.StateError(f"cannot serve HTTP on {self.cfg.http.host}:{port}: {exc}") from None
                log.warning("event=http_port_taken port=%d error=%s action=use_a_free_port", port, exc)
                self.event("http_port_changed", old=port, reason=str(exc))
        raise AssertionError("unreachable")

    async def _preflight(self) -> None:
        """The commonest mistakes as one clear line before anything is launched (off the loop:
        the interpreter probe may take seconds). The command is checked here only where this host
        shares the workers' environment (``Platform.checks_command_here``); elsewhere each node's
        agent checks it before it starts ranks (``LaunchSpec.check_command``)."""
        try:
            warnings = await asyncio.to_thread(preflight.check, self.cfg.command,
                                               dict(os.environ) | dict(self.cfg.env), self.ckpt_root,
                                               command_here=self.platform.checks_command_here)
        except preflight.PreflightError as exc:
            self.event("preflight_failed", error=str(exc))
            raise state_file.StateError(str(exc)) from None
        for w in warnings:
            log.warning("event=preflight_warning %s", w)
            self.event("preflight_warning", warning=w)

    def _init_token(self, saved: dict | None) -> None:
        """A continued run keeps its token (its live ranks hold it); a new run gets a new one."""
        try:
            provided = self.platform.job_token()
        except PlatformError as exc:
            raise state_file.StateError(str(exc)) from None
        if provided is not None:
            self.token = provided
            return
        try:
            self.token = job_token.load_or_create(self.log_dir / "token", reuse=bool(saved))
        except job_token.TokenError as exc:
            raise state_file.StateError(str(exc)) from None

    async def _first_launch(self, saved: dict | None) -> None:
        if saved:
            # a previous controller's gang is gone: continue its history with a new attempt
            self.attempt = int(saved.get("attempt", 0)) + 1
            self.history = saved["history"]
            self.skip_steps = list(self.history.skip_steps)
            self.event("adopt_failed", detail="no live node of the saved gang; relaunching with the run's history")
        self.platform.exclude(list(self.history.excluded))
        slots = [s for s in self.platform.slots() if s not in self.history.excluded]
        n = self.cfg.nodes
        size = gang_size(len(slots), n.min, n.max, self.cfg.nproc_per_node, n.world_sizes, n.world_size_multiple_of)
        if size is None:
            self._finish(JobPhase.STOPPED_NO_CAPACITY,
                         f"{len(slots)} node slots and no node count in [{n.min}, {n.max}] with a world size the job "
                         f"accepts (world_sizes={list(n.world_sizes)}, multiple of {n.world_size_multiple_of})")
            return
        await self._scan_checkpoints()
        pick = pick_checkpoint(self._usable_checkpoints(), self.history, self.cfg.restart.allow_fresh_start)
        if isinstance(pick, Stop):
            self._finish(pick.phase, pick.reason)
            return
        self.require_checkpoint = self.history.had_checkpoint and not self.cfg.restart.allow_fresh_start
        if saved:
            # a restart a previous controller began (what it left may still hold the slots for a
            # moment): retried like any relaunch
            await self._launch_retrying(slots[:size], pick, None)
        else:
            await self._launch_unless_handed_off(slots[:size], pick, None)

    def _adopt(self, saved: dict) -> None:
        attempt = int(saved["attempt"])
        self.attempt = attempt
        self.launch_attempt = _launched_as(saved)
        self.in_place_allowed = int(saved.get("in_place_allowed", 0))
        self.in_place_used = int(saved.get("in_place_used", 0))
        # the running ranks' launch (their environment's): only its frames are theirs. A gang saved
        # without one (an older controller's) speaks another wire: it is heard as silent and relaunched
        self.launch_id = saved.get("launch_id", "")
        self.launch_ids.append(self.launch_id)
        self.history = saved["history"]
        self.skip_steps = list(self.history.skip_steps)
        self.nodes = list(saved.get("nodes", []))
        self.restore_from = saved.get("restore_from")
        self.restored_step = int(saved.get("restored_step", 0))
        self.ckpt_step_at_attempt_start = int(saved.get("ckpt_step_at_attempt_start", -1))
        self.require_checkpoint = self.history.had_checkpoint and not self.cfg.restart.allow_fresh_start
        self.registry.reset(attempt, len(self.nodes) * self.cfg.nproc_per_node)
        self.launched_at = self.clock()
        self.phase = JobPhase.STARTING
        self.event("adopted", attempt=attempt, nodes=self.nodes)
        log.info("event=adopted attempt=%d nodes=%s (the running gang was not touched)", attempt, self.nodes)
        self._save_state()

    # ------------------------------------------------------------------ the loop
    async def _reconcile_loop(self) -> None:
        while self.phase not in TERMINAL:
            if self._stop.is_set() and self._handoff:
                self._save_state()
                self.event("controller_handoff", attempt=self.attempt, phase=self.phase.value,
                           detail="SIGTERM: this controller stops; the gang keeps running and the next one adopts it")
                return
            if self._stop.is_set():
                # stopped on purpose: the ranks get kill_grace_s to write their emergency checkpoint
                before = self.latest_ckpt["step"] if self.latest_ckpt else -1
                self._check_lease()
                await self.platform.teardown(self.cfg.restart.kill_grace_s)
                await self._scan_checkpoints()
                if self.latest_ckpt and self.latest_ckpt["step"] > before:
                    self.event("emergency_checkpoint", name=self.latest_ckpt["name"], step=self.latest_ckpt["step"],
                               detail="written by the ranks on the way out; the next run resumes from it")
                self._finish(JobPhase.REQUEUED if self.requeue_planned else JobPhase.CANCELLED,
                             self.stop_reason or "stopped")
                return
            self._renew_lease()
            try:
                await self._tick()
            except PlatformError as exc:
                log.error("event=platform_error error=%s (state kept; retrying)", exc)
                self.event("platform_error", error=str(exc))
            await asyncio.sleep(TICK_S)

    def _renew_lease(self) -> None:
        """Keep the job's lease (a shared filesystem: another host's controller may take a stale
        one over). Lost to another controller: stop acting at once, touching neither the gang
        nor the state (they are the new owner's). A filesystem hiccup is retried. The lease's
        own thread may find it lost between renewals: checked on every call."""
        self._check_lease()
        now = self.clock()
        if now - self._lease_renewed < LEASE_RENEW_S:
            return
        self._lease_renewed = now
        try:
            self._lock.renew()
        except state_file.StateError as exc:
            if not self._lock.lost:
                log.warning("event=job_lease_renew_failed error=%s (retrying)", exc)
                return
            self._check_lease()

    def _check_lease(self) -> None:
        if not self._lock.lost:
            return
        if not self._lease_lost_told:
            self._lease_lost_told = True
            log.error("event=job_lease_lost %s: this controller stops acting on the job", self._lock.lost)
            self.event("job_lease_lost", detail=self._lock.lost)
        raise state_file.StateError(f"another controller took this job over ({self._lock.lost}); this one "
                                    "stopped without touching the gang or the state")

    async def _tick(self) -> None:
        now = self.clock()
        self.node_status = await self.platform.observe()
        self._poll_checkpoints()
        reg = self.registry
        world = reg.world_size
        if self.node_status and all(n.state != NodeState.RUNNING for n in self.node_status.values()):
            self._agents_ended_at = self._agents_ended_at or now
        else:
            self._agents_ended_at = None
        outcomes = {r: rec.hb.outcome for r, rec in reg.ranks.items()}
        if completed(self.node_status, outcomes, world, waited_s=now - (self._agents_ended_at or now),
                     # less than the heartbeat timeout: a rank silent that long would read as dead
                     grace_s=self.cfg.heartbeat.timeout_s / 2):
            # the last save may have landed after the last look (which runs off the loop, every few
            # seconds): the final state names it
            await self._scan_checkpoints()
            missing = sorted(set(range(world)) - {r for r, o in outcomes.items() if o}) if outcomes else []
            if missing:
                log.warning("event=last_words_missing ranks=%s every agent exited 0; taking their word", missing)
                self.event("last_words_missing", ranks=missing,
                           detail="every agent exited 0 but these ranks' last heartbeat never arrived")
            if not reg.ranks:
                log.warning("event=no_heartbeats the command ended without a heartbeat from any rank: it never "
                            "started the worker SDK, so nothing about its training was watched or verified")
                self.event("no_heartbeats", attempt=self.attempt,
                           detail="every agent exited 0 but no rank ever sent a heartbeat (no worker SDK?)")
                self._finish(JobPhase.COMPLETED, "every agent exited 0 (no rank ever sent a heartbeat)")
            else:
                self._finish(JobPhase.COMPLETED, "every rank finished and every agent exited 0")
            return
        self._track_progress(now)
        if self._standby_at is not None and now >= self._standby_at and self.phase == JobPhase.RUNNING:
            self._standby_at = None
            standing = self.platform.warm_up()  # the next relaunch finds its agents ready
            if standing:
                log.info("event=agents_standing_by pids=%s (they import torch now; a relaunch takes them)", standing)
                self.event("agents_standing_by", attempt=self.attempt, pids=standing)
        if self._pending_stop is not None:
            phase, reason = self._pending_stop
            self.event("action", attempt=self.attempt, action="tear_down", reason=reason[:200])
            await self.platform.teardown(self.cfg.restart.teardown_grace_s)
            self._finish(phase, reason)
            return
        if self.phase in TERMINAL:
            return
        if await self._capacity(now) or await self._grow():
            return
        if now - self._last_calibration >= CALIBRATE_S:
            # step-time statistics move slowly: every few seconds is enough, and at 16k ranks
            # recomputing them on every tick would cost more than the detectors themselves
            self._last_calibration = now
            step_times = [t for rec in reg.ranks.values() for t in rec.step_times]
            h = self.cfg.health
            self.timeouts = calibrate(step_times, heartbeat_s=self.cfg.heartbeat.timeout_s,
                                      startup_s=h.startup_timeout_s, checkpoint_s=h.checkpoint_timeout_s,
                                      factor=h.phase_factor, floor_s=h.phase_floor_s, ceiling_s=h.phase_ceiling_s)
            self.stragglers = straggler_scores(reg)
        if self.in_place_allowed and (fault := self._in_place_signal(now)) is not None:
            await self._recover(fault)
            return
        if not self.in_place_allowed and (fault := self._rank_end_signal(now)) is not None:
            await self._recover(fault)
            return
        self.findings = detect(reg, now, self.timeouts, launched_at=self.launched_at)
        if not self.findings and all(n.state == NodeState.RUNNING and n.waiting != WAIT_CANNOT_START
                                     for n in self.node_status.values()):
            return
        fault = classify(
            self.node_status, self.findings, now=now,
            last_heard={r: rec.received for r, rec in reg.ranks.items()},
            phase_started={r: rec.received - rec.hb.phase_s for r, rec in reg.ranks.items()},
            **self._ranks_said(),
            stopped_ranks={r: rec.hb.error for r, rec in reg.ranks.items() if rec.hb.outcome == OUTCOME_STOPPED},
        )
        if fault is not None and fault.secondary:
            # only ranks that lost a peer have failed so far: give the culprit's node a moment
            # to exit too, so that it (not its victim) is named and counted against its node
            if self._secondary_since is None:
                self._secondary_since = now
            # (a whole node that died or froze shows only as silence: up to the heartbeat timeout)
            if now - self._secondary_since < max(SECONDARY_GRACE_S, self.cfg.heartbeat.timeout_s + 1.0):
                return
        self._secondary_since = None
        if fault is not None:
            await self._recover(fault)

    async def _capacity(self, now: float) -> bool:
        """Whether the gang waits for capacity this tick (:func:`~.decide.capacity`): not a fault,
        and the startup timeout runs from the moment it is placed. Past restart.shrink_after_s an
        elastic gang is relaunched at the size that was placed; past restart.capacity_wait_s the
        job stops. A node that cannot start at all is classify's (a startup failure)."""
        r, n = self.cfg.restart, self.cfg.nodes
        since = self.capacity_since
        verdict = capacity(self.node_status, waited_s=now - (now if since is None else since),
                           wait_limit_s=r.capacity_wait_s or r.budget_s, shrink_after_s=r.shrink_after_s,
                           nodes_min=n.min, nodes_max=n.max, nproc_per_node=self.cfg.nproc_per_node,
                           world_sizes=n.world_sizes, world_size_multiple_of=n.world_size_multiple_of)
        if any(st.waiting == WAIT_CANNOT_START for st in self.node_status.values()):
            return False  # a startup failure (classify names it): not capacity
        # a placed pod that ended meanwhile (crashed, rejected by its node) is a fault now, whatever waits
        broken = any(st.state != NodeState.RUNNING and not (st.state == NodeState.EXITED and st.exit_code == 0)
                     for st in self.node_status.values())
        if verdict is None or broken:
            if since is not None:
                self.capacity_since, self.capacity_message = None, ""
                self.launched_at = now  # the startup timeout starts now
                if self.phase == JobPhase.WAITING_FOR_CAPACITY:
                    self.phase = JobPhase.STARTING
                if verdict is None:  # (else a placed pod ended: the fault that follows says so)
                    log.info("event=capacity_found attempt=%d waited_s=%.1f", self.attempt, now - since)
                    self.event("capacity_found", attempt=self.attempt, waited_s=round(now - since, 3))
                self._save_state()
            return False
        self.launched_at = now
        if since is None:
            self.capacity_since = now
            self.phase = JobPhase.WAITING_FOR_CAPACITY
            waiting = verdict.waiting if isinstance(verdict, CapacityWait) else ()
            self.capacity_message = verdict.message if isinstance(verdict, CapacityWait) else verdict.reason
            self._save_state()
            log.warning("event=waiting_for_capacity attempt=%d nodes=%s limit_s=%g detail=%s", self.attempt,
                        list(waiting), r.capacity_wait_s or r.budget_s, self.capacity_message)
            self.event("waiting_for_capacity", attempt=self.attempt, nodes=list(waiting), detail=self.capacity_message,
                       limit_s=r.capacity_wait_s or r.budget_s)
        if isinstance(verdict, Stop):
            self.event("action", attempt=self.attempt, action="tear_down", reason="no_capacity")
            await self.platform.teardown(r.teardown_grace_s)
            self._finish(verdict.phase, verdict.reason)
            return True
        if isinstance(verdict, Shrink):
            log.warning("event=capacity_shrink attempt=%d nodes=%s reason=%s", self.attempt, list(verdict.nodes),
                        verdict.reason)
            self.event("capacity_shrink", attempt=self.attempt, nodes=list(verdict.nodes), detail=verdict.reason)
            self.event("action", attempt=self.attempt, action="tear_down", reason="capacity_shrink")
            await self.platform.teardown(r.teardown_grace_s)
            self.capacity_since, self.capacity_message = None, ""
            await self._scan_checkpoints()
            pick = pick_checkpoint(self._usable_checkpoints(), self.history, r.allow_fresh_start)
            if isinstance(pick, Stop):
                self._finish(pick.phase, pick.reason)
                return True
            self.attempt = max(self.attempt + 1, self.launch_attempt + self.in_place_allowed + 1)
            timer = self.current_timer if self.current_timer is not None and not self.current_timer.done else None
            left_out = [s for s in self.nodes if s not in verdict.nodes]
            await self._launch_retrying(list(verdict.nodes), pick, timer)
            if self.phase not in TERMINAL:
                await self.platform.probe_capacity(left_out)  # to grow back when the cluster has room
            return True
        self.capacity_message = verdict.message
        return True

    async def _grow(self) -> bool:
        """A gang shrunk for capacity grows back when the cluster can place what it left out
        (:meth:`Platform.capacity_returned`): the ranks save on SIGTERM (restart.kill_grace_s, as for a
        planned stop), and the larger gang resumes from that checkpoint. Not a fault."""
        returned = self.platform.capacity_returned() if self.phase == JobPhase.RUNNING else []
        if not returned:
            return False
        n = self.cfg.nodes
        nodes = grow(self.nodes, returned, excluded=self.history.excluded, nodes_min=n.min, nodes_max=n.max,
                     nproc_per_node=self.cfg.nproc_per_node, world_sizes=n.world_sizes,
                     world_size_multiple_of=n.world_size_multiple_of)
        if nodes is None:  # not a size the job takes (yet): keep watching for those slots
            await self.platform.probe_capacity(returned)
            return False
        log.info("event=capacity_returned attempt=%d slots=%s action=grow nodes=%s", self.attempt, returned, nodes)
        self.event("capacity_returned", attempt=self.attempt, slots=returned, nodes=list(nodes),
                   detail="the cluster can place what the gang left out: it saves and relaunches larger")
        self.event("action", attempt=self.attempt, action="tear_down", reason="grow")
        before = self.latest_ckpt["step"] if self.latest_ckpt else -1
        await self.platform.teardown(self.cfg.restart.kill_grace_s)
        await self._scan_checkpoints()  # off the loop (a worker thread), as every decision's look
        if self.latest_ckpt and self.latest_ckpt["step"] > before:
            self.event("emergency_checkpoint", name=self.latest_ckpt["name"], step=self.latest_ckpt["step"],
                       detail="written by the ranks on the way out; the larger gang resumes from it")
        pick = pick_checkpoint(self._usable_checkpoints(), self.history, self.cfg.restart.allow_fresh_start)
        if isinstance(pick, Stop):
            self._finish(pick.phase, pick.reason)
            return True
        self.attempt = max(self.attempt + 1, self.launch_attempt + self.in_place_allowed + 1)
        await self._launch_retrying(list(nodes), pick, None)
        return True

    def _in_place_signal(self, now: float) -> Fault | None:
        """The agents have begun restarting this attempt's ranks in place, or the last restart in
        place did not come back in time (then the gang is torn down)."""
        reg = self.registry
        ahead = self.ahead_attempt if (self.ahead_attempt or 0) > self.attempt else None
        if self.in_place_deadline is not None and ahead is None:
            if now <= self.in_place_deadline:
                return None  # the restarted ranks are on their way: exits seen now are the old ones'
            self.in_place_deadline = None
            self.in_place_failed = True
            missing = sorted(set(range(reg.world_size)) - set(reg.ranks))
            return Fault("startup_stall", tuple(missing), tuple(self.nodes),
                         f"the restart in place did not report in within {self.cfg.restart.in_place_timeout_s:g} s "
                         f"(ranks {missing} silent): tearing the gang down", RUNG_TEARDOWN, False, now)
        return restarted_in_place(self.node_status, now=now, ahead_attempt=ahead,
                                  rank_pids={r: rec.hb.pid for r, rec in reg.ranks.items()}, **self._ranks_said())

    def _rank_end_signal(self, now: float) -> Fault | None:
        """A rank of the gang ended in failure and its agent (which may not restart it) told
        how: the fault its agent's exit will name, ~1 s before that exit."""
        if not any(code for st in self.node_status.values() for _, code, _ in st.exit_codes):
            return None  # nothing ended, or only ranks that finished: nothing to read per tick
        return rank_ended(self.node_status, now=now,
                          rank_pids={r: rec.hb.pid for r, rec in self.registry.ranks.items()}, **self._ranks_said())

    def _ranks_said(self) -> dict[str, Any]:
        """What the ranks' last heartbeats say, as the pure decisions (classify, restarted_in_place,
        rank_ended) take it: where each rank runs, which are done, which failed (and whether a peer
        broke them, and their error), whose loss was not finite, and each rank's step."""
        ranks = self.registry.ranks
        return {
            "rank_nodes": {r: rec.hb.node for r, rec in ranks.items()},
            "done_ranks": {r for r, rec in ranks.items() if rec.hb.phase == PHASE_DONE},
            "failed_ranks": {r: rec.hb.error_peer for r, rec in ranks.items() if rec.hb.phase == PHASE_FAILED},
            "failed_errors": {r: rec.hb.error for r, rec in ranks.items() if rec.hb.phase == PHASE_FAILED},
            "nonfinite_ranks": [r for r, rec in ranks.items() if not rec.hb.loss_ok],
            "rank_steps": self._rank_steps(),
        }

    def _rank_steps(self) -> dict[int, int]:
        """Each rank's step: its last heartbeat's, or, for a rank that ended (its node's agent
        failed, or recorded the end), the one after the last step its own log recorded in this
        attempt (heartbeats are sampled; a rank killed mid-step leaves its log one step behind)."""
        reg = self.registry
        steps = {r: rec.hb.step for r, rec in reg.ranks.items()}
        by_pid = {rec.hb.pid: r for r, rec in reg.ranks.items() if rec.hb.pid}
        oom = {n for n, st in self.node_status.items() if st.out_of_memory}  # every rank of it was killed
        ended = {f.rank for st in self.node_status.values() for f in st.failures} | \
            {by_pid[pid] for st in self.node_status.values() for pid, _, _ in st.exit_codes if pid in by_pid} | \
            {r for r, rec in reg.ranks.items() if rec.hb.node in oom}
        for rank in ended:
            logged = _last_logged_step(self.log_dir / "ranks" / f"rank-{rank}.jsonl", self.attempt)
            if logged is not None:
                steps[rank] = max(steps.get(rank, 0), logged + 1)
        return steps

    def _track_progress(self, now: float) -> None:
        reg = self.registry
        world = reg.world_size
        all_heard = world > 0 and len(reg.ranks) == world
        if all_heard and self.phase == JobPhase.STARTING:
            self.in_place_deadline = None  # a restart in place came back
            self.phase = JobPhase.RUNNING
            self._standby_at = now + STANDBY_AFTER_S
            self._save_state()  # before the event: whoever reads "running" finds it in the state file too
            self.event("running", attempt=self.attempt, world_size=world)
        if self.report is None and all_heard and all(rec.hb.restore_state for rec in reg.ranks.values()):
            self._on_restore_reported(restore_report(rec.hb for rec in reg.ranks.values()))
            if self.phase in TERMINAL:
                return
        elif (self.report is None and all_heard and not self._root_judged
              and all(rec.hb.ckpt_root for rec in reg.ranks.values())):
            # ranks that save without restoring (no restore report comes) still say where they save
            self._root_judged = True
            self._judge_root(restore_report(rec.hb for rec in reg.ranks.values()))
        t = self.current_timer
        if t is not None and not t.done:
            if t.rendezvous_at is None and all_heard:
                t.rendezvous_at = now
            # the ranks say when their first step after the restore completed (sent at once), and
            # how long it took since the restore ended: both from their own clocks
            if t.rendezvous_at is not None and all_heard and all(rec.hb.steps_done > 0 for rec in reg.ranks.values()):
                t.first_step_at = now
                first = max(rec.hb.first_step_s for rec in reg.ranks.values())
                restore = max(rec.hb.restore_s for rec in reg.ranks.values())
                # ranks faster than a tick from their start to their first step (forked, torch
                # imported) are first heard in this very tick: their own clocks then say when
                # the restore began, which the gang's rendezvous preceded
                launched = max(m for m in (t.detected_at, t.torn_down_at, t.scheduled_at) if m is not None)
                t.rendezvous_at = max(launched, min(t.rendezvous_at, now - first - restore))
                t.restored_at = max(t.rendezvous_at, now - first)
                d = t.durations()
                total = t.total(now)
                within = total <= self.cfg.restart.budget_s
                self.budget_exceeded = not within
                self.event("restart_complete", attempt=self.attempt, reason=t.reason, phases=d, total_s=round(total, 3),
                           within_budget=within)
                log.info("event=restart_complete attempt=%d total_s=%.2f %s", self.attempt, total,
                         " ".join(f"{k}_s={v:.2f}" for k, v in d.items()))
                self._save_state()
            elif now - t.fault_at > self.cfg.restart.budget_s and not self.budget_exceeded:
                self.budget_exceeded = True
                self.event("budget_exceeded", attempt=self.attempt, budget_s=self.cfg.restart.budget_s)
                log.error("event=budget_exceeded attempt=%d budget_s=%.0f", self.attempt, self.cfg.restart.budget_s)
        if all_heard:
            self._step_marks.append((now, reg.min_step()))
            self._step_marks = [m for m in self._step_marks if now - m[0] <= 60]

    def _on_restore_reported(self, report) -> None:
        """Every rank said how its restore went: record what was really restored, make the
        checkpoints they refused suspect, and check that they write where we watch."""
        self.report = report
        if not self._judge_root(report):
            return
        self.restored = report.restored
        refused = {n: why for n, why in report.refused}
        fields = dict(attempt=self.attempt, state=report.state, name=report.restored, announced=self.restore_from,
                      refused=refused)
        if report.state == "restored":
            self.event("checkpoint_restored", **fields)
        elif report.state == "fresh":
            self.event("fresh_start", **fields)
        else:
            self.event("restore_failed", **fields)
        if report.restored != self.restore_from and self.restore_from:
            log.warning("event=restored_other_than_announced attempt=%d announced=%s restored=%s refused=%s",
                        self.attempt, self.restore_from, report.restored, refused)
        for name, why in note_refusals(self.history, report):
            self.event("checkpoint_suspect", name=name, detail=why)
        parsed = parse_name(report.restored) if report.restored else None
        self.restored_step = parsed[0] if parsed else 0
        self._save_state()

    def _judge_root(self, report) -> bool:
        """Whether the ranks save where the supervisor watches: adopt their one root, or stop the
        job (torn down first) when they save to several; False when it stops."""
        verdict, detail = root_verdict(str(self.ckpt_root), report)
        if verdict == "adopt":
            log.warning("event=checkpoint_root_adopted watched=%s ranks_write=%s (the ranks' own root wins: progress "
                        "is judged where checkpoints are written)", self.ckpt_root, detail)
            self.event("checkpoint_root_adopted", watched=str(self.ckpt_root), root=detail,
                       detail="the ranks save checkpoints here, not where the supervisor was told to look")
            self.ckpt_root = Path(detail)
            # looked at off the loop at the next tick; progress counts from what it holds then
            self._ckpt_rebase, self._last_ckpt_poll = True, -CHECKPOINT_POLL_S
        elif verdict == "conflict":
            self.event("checkpoint_root_conflict", roots=list(report.roots), detail=detail)
            # the gang is torn down before the verdict (_tick): nothing may keep training unwatched
            self._pending_stop = (JobPhase.FAILED, f"{detail}: every rank must save to one shared root (give the "
                                  "same --checkpoint-dir to every rank, or none: ranks read SUPERVISOR_CHECKPOINT_DIR)")
            return False
        return True

    def _poll_checkpoints(self, force: bool = False) -> None:
        """Every ``CHECKPOINT_POLL_S``: look for the newest published checkpoint in a worker
        thread (:class:`VerifiedCache`: only what is new or changed is verified), and take in the
        last look once it is done; the loop never lists or verifies anything. ``force`` looks
        now, on the calling thread (:meth:`_scan_checkpoints` is the way from a coroutine)."""
        task = self._ckpt_scan
        if task is not None and task.done():
            self._ckpt_scan = None
            try:
                self._take_scan(task.result())
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint root must not stop the controller
                log.warning("event=checkpoint_scan_failed root=%s error=%s", self.ckpt_root, exc)
        if force:
            try:
                self._take_scan(self._ckpt_cache.scan(self.ckpt_root, exclude=list(self.history.suspects),
                                                      usable=True))
            except Exception as exc:  # noqa: BLE001
                log.warning("event=checkpoint_scan_failed root=%s error=%s", self.ckpt_root, exc)
            return
        now = self.clock()
        if self._ckpt_scan is not None or now - self._last_ckpt_poll < CHECKPOINT_POLL_S:
            return
        self._last_ckpt_poll = now
        self._ckpt_scan = asyncio.ensure_future(asyncio.to_thread(
            self._ckpt_cache.scan, self.ckpt_root, exclude=list(self.history.suspects)))

    async def _scan_checkpoints(self) -> None:
        """Look now (in a worker thread), and wait for it: the newest checkpoint and every usable
        one, for a decision that follows (a launch, a relaunch, the end)."""
        if self._ckpt_scan is not None:
            await asyncio.wait([self._ckpt_scan])
            self._poll_checkpoints()  # takes it in; starts nothing (just polled)
        self._last_ckpt_poll = self.clock()
        try:
            scan = await asyncio.to_thread(self._ckpt_cache.scan, self.ckpt_root,
                                           exclude=list(self.history.suspects), usable=True)
        except Exception as exc:  # noqa: BLE001 - a bad checkpoint root must not stop the controller
            log.warning("event=checkpoint_scan_failed root=%s error=%s", self.ckpt_root, exc)
            self._usable = []
            return
        self._take_scan(scan)

    def _take_scan(self, scan: Scan) -> None:
        """Take in one look at the checkpoint root (made off the loop, maybe a moment ago)."""
        if scan.root != self.ckpt_root:
            return  # the root was adopted meanwhile: the next look is at the new one
        if scan.usable is not None:
            self._usable = scan.usable  # suspects included: the decision skips them itself
        found = scan.discovery.checkpoint
        if found is not None and found.name in self.history.suspects:
            self._last_ckpt_poll = -CHECKPOINT_POLL_S  # made suspect meanwhile: look again at once
            return
        if found is None:
            self.latest_ckpt = None
        else:
            self.history.had_checkpoint = True
            if self.latest_ckpt is None or self.latest_ckpt["name"] != found.name:
                self.event("checkpoint_complete", name=found.name, step=found.step)
                self.checkpoint_times.append(found.manifest.created_unix)
            self.latest_ckpt = {"name": found.name, "step": found.step, "created_unix": found.manifest.created_unix,
                                "writer_world_size": found.manifest.writer_world_size}
        if self._ckpt_rebase:  # a root adopted: progress in this attempt counts from what it holds
            self._ckpt_rebase = False
            self.ckpt_step_at_attempt_start = self.latest_ckpt["step"] if self.latest_ckpt else -1

    def _usable_checkpoints(self) -> list[str]:
        """Every checkpoint that passes fast verification, newest first (suspects included:
        the decision skips them, and needs to know one exists), as of the last
        :meth:`_scan_checkpoints`."""
        return list(self._usable)

    # ------------------------------------------------------------------ recovery
    async def _recover(self, fault: Fault) -> None:
        self._check_lease()
        now = self.clock()
        self.phase = JobPhase.RECOVERING
        self.active_hang = fault
        self.last_fault, self.last_fault_attempt, self.last_fault_unix = fault, self.attempt, time.time()
        self.last_fault_culprits = [
            (r, self.registry.ranks[r].hb.node if r in self.registry.ranks else ",".join(fault.nodes))
            for r in fault.ranks or (-1,)
        ]
        timer = RestartTimer(self.attempt, fault.kind, fault.fault_at, now)
        self.current_timer = timer
        self.timers.append(timer)
        self.restarts_by_reason[fault.kind] = self.restarts_by_reason.get(fault.kind, 0) + 1
        self.platform.warm_up()  # a launch may follow: what can start ahead starts now
        log.error("event=fault_detected attempt=%d kind=%s ranks=%s nodes=%s detail=%s", self.attempt, fault.kind,
                  list(fault.ranks), list(fault.nodes), fault.detail)
        self.event("fault_detected", attempt=self.attempt, **fault.to_dict(),
                   detection_s=round(now - fault.fault_at, 3))
        await self._save_evidence(fault)
        if self.in_place_allowed and await self._restart_in_place(fault, timer):
            return
        worked = False  # a rung whose nodes exited in time: straight on to the teardown
        for rung in ladder(fault, abort_grace_s=self.cfg.restart.abort_grace_s):
            if worked and rung.action != ACTION_TEAR_DOWN:
                continue
            if rung.action == ACTION_ABORT:
                for rank in rung.ranks:
                    self.intake.send(control_message("abort", attempt=self.attempt, rank=rank,
                                                     seq=self.control_seq.next(),
                                                     reason=f"{fault.kind}: {fault.detail}"[:400]),
                                     self.addr_by_rank.get(rank))
                self.event("action", attempt=self.attempt, action=rung.action, ranks=list(rung.ranks),
                           reason=fault.kind)
            elif rung.action == ACTION_KILL_NODE:
                for node in rung.nodes:
                    self.event("action", attempt=self.attempt, action=rung.action, node=node, reason=fault.kind)
                    await self.platform.kill_node(node)
            else:
                self.event("action", attempt=self.attempt, action=rung.action, reason=fault.kind)
                self._check_lease()
                await self.platform.teardown(self.cfg.restart.teardown_grace_s)
            worked = rung.wait_s > 0 and await self._rung_works(rung)
        timer.torn_down_at = self.clock()
        if not fault.node_failure:
            # a platform may learn only while tearing down that a node cannot answer (Slurm: a
            # cancel it could not confirm): count that node, and only it, as failed
            stopped = tuple(sorted(n for n, st in (await self.platform.observe()).items() if st.stopped))
            if stopped:
                fault = dataclasses.replace(fault, nodes=stopped, node_failure=True)
                self.event("nodes_unresponsive", attempt=self.attempt, nodes=list(stopped), reason=fault.kind)
        await self._scan_checkpoints()
        suspects_before = set(self.history.suspects)
        decision = self._plan(fault, self.history)
        self._tell_suspects(suspects_before)
        self.active_hang = None
        if isinstance(decision, Stop):
            self._finish(decision.phase, decision.reason)
            return
        assert isinstance(decision, Relaunch)
        if decision.newly_excluded:
            self.event("nodes_excluded", nodes=list(decision.newly_excluded), reason=fault.kind)
        self.platform.exclude(list(self.history.excluded))
        self.require_checkpoint = decision.require_checkpoint
        if decision.skip_steps and decision.skip_steps != tuple(self.skip_steps):
            self.event("batches_skipped", steps=list(decision.skip_steps),
                       detail="a non-finite loss recurred at these steps: the ranks skip their batches")
        self.skip_steps = list(decision.skip_steps)
        # every message and process of the next gang carries the new number, above any the old
        # agents could still give a rank they restart in place
        self.attempt = max(self.attempt + 1, self.launch_attempt + self.in_place_allowed + 1)
        await self._launch_retrying(list(decision.nodes), decision.restore_from, timer)

    async def _launch_retrying(self, nodes: list[str], restore_from: str | None, timer: RestartTimer | None) -> None:
        """A relaunch: a failed launch is torn down and tried again (LAUNCH_TRIES, with a back-off
        a stop cuts short), then the job fails."""
        for attempt_no in range(1, LAUNCH_TRIES + 1):
            try:
                await self._launch_unless_handed_off(nodes, restore_from, timer)
                return
            except PlatformError as exc:
                log.error("event=launch_failed try=%d/%d error=%s", attempt_no, LAUNCH_TRIES, exc)
                self.event("launch_failed", attempt=self.attempt, error=str(exc), try_=attempt_no)
                await self.platform.teardown(self.cfg.restart.teardown_grace_s)
                if self._stop.is_set():
                    return  # stopped or handed off: the loop ends the job, or leaves it to the next controller
                try:
                    await asyncio.wait_for(self._stop.wait(), min(30.0, 2.0 ** attempt_no))
                    return
                except asyncio.TimeoutError:
                    pass
        self._finish(JobPhase.FAILED, f"the platform could not launch attempt {self.attempt} ({LAUNCH_TRIES} tries)")

    async def _restart_in_place(self, fault: Fault, timer: RestartTimer) -> bool:
        """Rung 0: let the node agents restart the ranks in place, when :func:`in_place_ok` says
        the same gang may go on. The checkpoint is chosen exactly as for a full restart (on a
        copy of the history, kept only if this path is taken); the ranks still running are
        aborted, and their agents restart them with the rest; the new ranks carry the next
        attempt number and ask for the restore point. Returns False (nothing done) otherwise."""
        self.node_status = await self.platform.observe()
        await self._scan_checkpoints()
        preview = copy.deepcopy(self.history)
        decision = self._plan(fault, preview)
        why_not = in_place_ok(fault=fault, decision=decision, nodes=self.node_status, previous_nodes=self.nodes,
                              allowed=self.in_place_allowed, used=self.in_place_used, skip_steps=self.skip_steps,
                              last_failed=self.in_place_failed, kills_ranks=self.platform.kills_ranks)
        if not why_not and fault.rung == RUNG_KILL_NODE:
            # a silent rank cannot obey an abort: its process is killed, and its agent restarts it
            by_node: dict[str, list[int]] = {}
            for r in fault.ranks:
                rec = self.registry.ranks.get(r)
                if rec is not None and rec.hb.pid:
                    by_node.setdefault(rec.hb.node, []).append(rec.hb.pid)
            for node, pids in sorted(by_node.items()):
                self.event("action", attempt=self.attempt, action="kill_ranks", node=node, pids=pids,
                           ranks=[r for r in fault.ranks if r in self.registry.ranks
                                  and self.registry.ranks[r].hb.node == node], reason=fault.kind)
                if not await self.platform.kill_ranks(node, pids):
                    why_not = f"the platform could not kill the silent ranks' processes on {node}"
                    break
            else:
                if not by_node:
                    why_not = "the silent ranks' processes are not known"
        if why_not:
            log.info("event=in_place_declined attempt=%d kind=%s reason=%s", self.attempt, fault.kind, why_not)
            self.event("in_place_declined", attempt=self.attempt, kind=fault.kind, reason=why_not)
            return False
        assert isinstance(decision, Relaunch)
        suspects_before = set(self.history.suspects)
        self.history = preview
        self._tell_suspects(suspects_before)
        self.active_hang = None
        self.require_checkpoint = decision.require_checkpoint
        for rank, addr in self.addr_by_rank.items():  # whoever still runs goes, to be restarted with the rest
            self.intake.send(control_message("abort", attempt=self.attempt, rank=rank, seq=self.control_seq.next(),
                                             reason=f"restart in place: {fault.kind}"), addr)
        self.in_place_used += 1
        self.event("action", attempt=self.attempt, action="restart_in_place", reason=fault.kind,
                   restore_from=decision.restore_from, left=self.in_place_allowed - self.in_place_used)
        timer.torn_down_at = self.clock()
        self.attempt = max(self.attempt + 1, self.ahead_attempt or 0)
        await self._arm(list(decision.nodes), decision.restore_from, timer, None)
        self.in_place_deadline = self.clock() + self.cfg.restart.in_place_timeout_s
        return True

    def _tell_suspects(self, before: set[str]) -> None:
        for name in self.history.suspects:
            if name not in before:
                self.event("checkpoint_suspect", name=name, detail=self.history.suspect_why.get(name, ""))

    def _plan(self, fault: Fault, history: History) -> Relaunch | Stop:
        """What comes after ``fault`` (:func:`plan_next`, which updates ``history``), on the
        checkpoints of the last :meth:`_scan_checkpoints` (its callers look first)."""
        made_progress = bool(self.latest_ckpt and self.latest_ckpt["step"] > self.ckpt_step_at_attempt_start)
        straggler_nodes = []
        if self.cfg.health.exclude_stragglers:
            straggler_nodes = sorted({self.registry.ranks[r].hb.node for r, s in self.stragglers.items()
                                      if s > self.cfg.health.straggler_threshold and r in self.registry.ranks})
        # what the ranks said about their restore, up to their last word (a rank that died
        # before all had reported still counts: its heartbeat is in the registry)
        report = restore_report(rec.hb for rec in self.registry.ranks.values())
        return plan_next(
            history=history, fault=fault, made_progress=made_progress, report=report,
            slots=self.platform.slots(), previous_nodes=self.nodes,
            hosts={n: st.host for n, st in self.node_status.items() if st.host},
            nodes_min=self.cfg.nodes.min, nodes_max=self.cfg.nodes.max, max_restarts=self.cfg.restart.max_restarts,
            guard_attempts=self.cfg.restart.progress_guard_attempts, exclude_after=self.cfg.restart.exclude_node_after,
            checkpoints=self._usable_checkpoints(), allow_fresh_start=self.cfg.restart.allow_fresh_start,
            nonfinite_window=self.cfg.nonfinite.window_steps, skip_batches=self.cfg.nonfinite.skip_batches,
            nproc_per_node=self.cfg.nproc_per_node, world_sizes=self.cfg.nodes.world_sizes,
            world_size_multiple_of=self.cfg.nodes.world_size_multiple_of,
            straggler_nodes=straggler_nodes,
        )

    async def _launch_unless_handed_off(self, nodes: list[str], restore_from: str | None,
                                        timer: RestartTimer | None) -> None:
        """Launch; a SIGTERM hand-off meanwhile abandons the launch at once (its pods may wait
        minutes for a node): the state says the restart is unfinished, and the next controller
        finishes it. A plain stop lets the launch end first, so that its teardown finds every
        process the launch made."""
        launch = asyncio.ensure_future(self._launch(nodes, restore_from, timer))
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({launch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if launch.done() or not self._handoff:
            await launch
            return
        launch.cancel()
        try:
            await launch
        except (asyncio.CancelledError, PlatformError):
            pass
        log.warning("event=launch_abandoned attempt=%d (SIGTERM hand-off: the next controller finishes the restart)",
                    self.attempt)
        self.event("launch_abandoned", attempt=self.attempt,
                   detail="SIGTERM hand-off during the launch: the next controller finishes this restart")

    async def _rung_works(self, rung: Rung) -> bool:
        """Whether the rung's action takes within its ``wait_s`` (:func:`rung_worked`)."""
        pids = {r: rec.hb.pid for r, rec in self.registry.ranks.items() if rec.hb.pid}
        deadline = self.clock() + rung.wait_s
        while self.clock() < deadline:
            if rung_worked(rung, await self.platform.observe(), pids):
                return True
            await asyncio.sleep(0.05)
        return False

    async def _save_evidence(self, fault: Fault) -> None:
        """Before anything is killed: every live rank dumps its stacks; keep their last heartbeats."""
        asked: dict[int, int] = {}
        for rank, addr in self.addr_by_rank.items():
            asked[rank] = self.control_seq.next()
            self.intake.send(control_message("dump", attempt=self.attempt, rank=rank, seq=asked[rank],
                                             reason=fault.kind), addr)
        interval = self.cfg.heartbeat.interval_s
        reg = self.registry
        awaited = evidence_awaited(fault, {r: (rec.hb.phase, rec.received) for r, rec in reg.ranks.items()
                                           if r in asked}, now=self.clock(), fresh_s=2 * interval)

        def answered(rank: int) -> bool:  # its stacks are on disk: a heartbeat naming the request
            rec = reg.ranks.get(rank)
            return rec is not None and rec.hb.dump_seq >= asked[rank]

        # until every rank that can answer has (it answers at once), at most as long as a
        # heartbeat interval and a little (older workers never answer)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(1.0, interval * 1.2)
        while loop.time() < deadline and not all(answered(r) for r in awaited):
            await asyncio.sleep(0.01)
        ev_dir = self.log_dir / "evidence"
        path = ev_dir / f"attempt-{self.attempt}-{int(time.time())}-{fault.kind}.json"
        head = {"fault": fault.to_dict(), "attempt": self.attempt, "time": time.time(),
                "findings": list(self.findings), "nodes": dict(self.node_status)}
        # built, encoded and written in a worker thread (16,384 ranks' heartbeats are megabytes);
        # the records as they are now (a heartbeat arriving meanwhile replaces one, whole)
        pruned = await asyncio.to_thread(_write_evidence, path, head, list(self.registry.ranks.items()), asked,
                                         awaited, answered, self.clock(), self.log_dir / "ranks")
        self.event("evidence_saved", attempt=self.attempt, path=str(path))
        if pruned:
            self.event("evidence_rotated", removed=[p.name for p in pruned[:20]], count=len(pruned),
                       cap_bytes=EVIDENCE_MAX_BYTES, detail="the oldest evidence files of this log directory, past "
                       "its cap")

    async def _launch(self, nodes: list[str], restore_from: str | None, timer: RestartTimer | None = None) -> None:
        await self._arm(nodes, restore_from, timer, self.platform.launch)

    async def _arm(self, nodes: list[str], restore_from: str | None, timer: RestartTimer | None,
                   launch: Callable[[LaunchSpec], Awaitable[None]] | None) -> None:
        """Make ``self.attempt`` the running attempt on ``nodes``, resuming from ``restore_from``:
        launched through ``launch`` (the platform's), or restarted in place by the running
        agents (None: nothing to launch; the ranks already carry this attempt number)."""
        self._check_lease()
        self.nodes = nodes
        self.restore_from = restore_from
        parsed = parse_name(restore_from) if restore_from else None  # verify() ties a name to its step
        self.restored_step = parsed[0] if parsed else 0
        self.ckpt_step_at_attempt_start = self.latest_ckpt["step"] if self.latest_ckpt else -1
        world = len(nodes) * self.cfg.nproc_per_node
        self.registry.reset(self.attempt, world)
        self.addr_by_rank = {}
        self._step_marks = []  # the step rate of this attempt only (a resume goes back in steps)
        self.report, self.restored = None, None
        self._root_judged = False
        self.ahead_attempt = None
        self.capacity_since, self.capacity_message = None, ""
        if launch is not None:
            self._new_launch()  # from here the old gang's frames are a stale attempt's
            await launch(self._launch_spec(nodes))
            self.launch_attempt = self.attempt
            self.in_place_allowed = self.cfg.restart.in_place_restarts
            self.in_place_used, self.in_place_failed, self.in_place_deadline = 0, False, None
        now = self.clock()
        self.launched_at = now
        if timer is not None:
            timer.scheduled_at = now
        self.phase = JobPhase.STARTING
        self.event("launched", attempt=self.attempt, nodes=nodes, world_size=world, restore_from=restore_from,
                   require_checkpoint=self.require_checkpoint, excluded=self.history.excluded, launch=self.launch_id,
                   **({} if launch is not None else {"in_place": True}))
        log.info("event=launched attempt=%d nodes=%s world_size=%d restore_from=%s%s", self.attempt, nodes, world,
                 restore_from, "" if launch is not None else " in_place=true (the running agents restart the ranks)")
        self._save_state()

    def _launch_spec(self, nodes: list[str]) -> LaunchSpec:
        rank_log_dir = self.log_dir / "ranks"
        in_place = self.cfg.restart.in_place_restarts
        env = dict(self.cfg.env) | {
            Env.JOB: self.cfg.job,
            Env.ATTEMPT: str(self.attempt),
            Env.LAUNCH: self.launch_id,
            Env.HEARTBEAT_ADDR: f"{self.platform.controller_address(self.cfg.intake.host)}:{self.intake_port}",
            Env.API: f"http://{self.platform.controller_address(self.cfg.http.host)}:{self.http_port}",
            **self.platform.token_env(self.log_dir / "token"),
            Env.LOG_DIR: str(rank_log_dir),
            Env.CHECKPOINT_DIR: str(self.ckpt_root),
            Env.HEARTBEAT_INTERVAL: str(self.cfg.heartbeat.interval_s),
            Env.WATCHDOG: self.timeouts.watchdog_env(),
        } | ({Env.SKIP_STEPS: ",".join(map(str, self.skip_steps))} if self.skip_steps else {}) \
          | ({Env.IN_PLACE: str(in_place)} if in_place else {})
        return LaunchSpec(
            attempt=self.attempt, nodes=nodes,
            # the controller chose the world: every agent it launched must join (--nnodes N:N). With a
            # range, agents that joined first start training smaller after torch's last call (1 s) and
            # a late one (still importing) then restarts them all as a membership change, on a
            # SIGTERM the ranks answer with an emergency checkpoint (seen: 30 s lost, then SIGKILL);
            # restarting in place, a lost agent would leave the others training smaller on their own
            nnodes_min=len(nodes), nnodes_max=len(nodes),
            nproc_per_node=self.cfg.nproc_per_node, command=self.cfg.command, env=env,
            rdzv_endpoint=self.platform.rendezvous_endpoint(self.attempt, self.cfg.platform.host),
            rdzv_id=f"{self.cfg.job}-{self.attempt}", max_restarts=in_place,
            fork_ranks=self.cfg.platform.fork_ranks,
            check_command=not self.platform.checks_command_here,  # then each agent checks it where it runs
        )

    def _finish(self, phase: JobPhase, reason: str) -> None:
        self.phase = phase
        self.stop_reason = reason
        level = logging.INFO if phase == JobPhase.COMPLETED else logging.ERROR
        log.log(level, "event=terminal phase=%s exit_code=%d reason=%s", phase.value, EXIT_CODES[phase], reason)
        self._save_state()

    # ------------------------------------------------------------------ views
    def step_rate(self) -> float:
        if len(self._step_marks) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._step_marks[0], self._step_marks[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def status_snapshot(self) -> "StatusSnapshot":
        """What one ``/status`` rendering needs, taken on the event loop the way ``/metrics``
        takes its own (:func:`supervisor.metrics.take_snapshot`: references and list copies,
        no per-rank object made here); :func:`render_status` turns it into the document
        anywhere (``/status`` does it in a worker thread)."""
        snap = take_snapshot(self, MetricsState())
        return StatusSnapshot(snap, {
            "nodes": dict(self.node_status), "excluded_nodes": list(self.history.excluded),
            "suspect_checkpoints": list(self.history.suspects), "suspect_why": dict(self.history.suspect_why),
            "checkpoint_root": str(self.ckpt_root), "restored": self.restored,
            "restore_refused": dict(self.report.refused) if self.report else {},
            "run": self.run_no, "log_dir": str(self.log_dir), "restore_from": self.restore_from,
            "timers": list(self.timers), "findings": list(self.findings), "timeouts": asdict(self.timeouts),
            "stop_reason": self.stop_reason, "exit_code": EXIT_CODES.get(self.phase),
            "waiting_for_capacity": None if self.capacity_since is None else {
                "since_s": round(self.clock() - self.capacity_since, 1), "detail": self.capacity_message},
        })

    def status(self, *, offset: int | None = None, limit: int | None = None) -> dict[str, Any]:
        """The state as ``supervisor status`` shows it (:func:`render_status` of a snapshot taken now)."""
        return render_status(self.status_snapshot(), offset=offset, limit=limit)

    def alive_ranks(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        return sum(1 for rec in self.registry.ranks.values()
                   if now - rec.received <= self.cfg.heartbeat.timeout_s and rec.hb.phase != PHASE_DONE)

    def budget_remaining(self, now: float) -> float:
        t = self.current_timer
        if t is None or t.done:
            return self.cfg.restart.budget_s
        return t.budget_remaining(self.cfg.restart.budget_s, now)

    def restore_point(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "checkpoint": self.restore_from, "exclude": list(self.history.suspects),
                "required": self.require_checkpoint}

    # ------------------------------------------------------------------ persistence
    def event(self, name: str, /, **fields: Any) -> None:
        now = time.time()
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z",
               "event": name, "job": self.cfg.job, "run": self.run_no} | fields
        path = self.log_dir / EVENTS_FILE
        with open(path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
            full = f.tell() >= EVENTS_MAX_BYTES
        if full:  # archived beside it (events.jsonl.1, .2, ...): readers take them all (files.read_lines)
            try:
                rotate(path, EVENTS_KEPT)
            except OSError as exc:
                log.warning("event=events_rotate_failed path=%s error=%s", path, exc)
        self.platform.tell(name, rec)

    def _save_state(self) -> None:
        self._check_lease()  # the state is the new owner's once the lease is lost
        state_file.save(self.state_path, {
            "job": self.cfg.job, "phase": self.phase.value, "attempt": self.attempt, "nodes": self.nodes,
            "restore_from": self.restore_from, "restored": self.restored, "restored_step": self.restored_step,
            "ckpt_step_at_attempt_start": self.ckpt_step_at_attempt_start, "history": self.history,
            "intake_port": self.intake_port, "http_port": self.http_port, "http_host": self.cfg.http.host,
            "platform": self.platform.describe(), "pid": os.getpid(), "updated": time.time(),
            "stop_reason": self.stop_reason, "ckpt_root": str(self.ckpt_root), "last_checkpoint": self.latest_ckpt,
            "run": self.run_no, "run_started": self.run_started,
            "launch_attempt": self.launch_attempt, "in_place_allowed": self.in_place_allowed,
            "in_place_used": self.in_place_used, "launch_id": self.launch_id,
        } | ({"exit_code": EXIT_CODES[self.phase]} if self.phase in TERMINAL else {}))


@dataclasses.dataclass
class StatusSnapshot:
    """One ``/status`` snapshot: the metrics' snapshot of the ranks and the job, and the
    status-only fields (plain values and references to objects the controller replaces)."""

    metrics: Snapshot
    extra: dict[str, Any]


def render_status(snap: StatusSnapshot, *, offset: int | None = None, limit: int | None = None) -> dict[str, Any]:
    """The ``/status`` document of ``snap``; safe off the event loop (it reads the ranks' records
    once). Per-rank detail is capped: every rank of a job of at most :data:`STATUS_ALL_RANKS`
    ranks; above it the :data:`STATUS_WORST_RANKS` stalest (oldest heartbeat) and the
    :data:`STATUS_WORST_RANKS` slowest (highest straggler score); with ``offset`` (and
    ``limit``, at most :data:`STATUS_PAGE_MAX`) one page of ranks in rank order. ``ranks_summary``
    says which were listed and sums up the others (phases, steps, stale ranks, stragglers)."""
    m, x = snap.metrics, snap.extra
    now, timeout = m.now, m.timeout_s
    recs = m.ranks
    scores = m.stragglers
    rows: dict[int, Any] = {rec.hb.rank: rec for rec in recs}
    ages = {r: now - rec.received for r, rec in rows.items()}
    phases = collections.Counter(rec.hb.phase for rec in recs)
    steps = [rec.hb.step for rec in recs]
    active = [r for r, rec in rows.items() if rec.hb.phase != PHASE_DONE]
    stale = [r for r in active if ages[r] > timeout]
    over = [r for r, score in scores.items() if score > m.straggler_threshold and r in rows]
    if offset is not None or limit is not None:
        start = max(0, offset or 0)
        count = min(STATUS_PAGE_MAX, STATUS_PAGE_MAX if limit is None else max(0, limit))
        shown = sorted(rows)[start:start + count]
        selection = "page"
    elif len(rows) <= STATUS_ALL_RANKS:
        start, count, shown, selection = 0, len(rows), sorted(rows), "all"
    else:
        stalest = heapq.nlargest(STATUS_WORST_RANKS, active, key=ages.__getitem__)
        slowest = heapq.nlargest(STATUS_WORST_RANKS, scores, key=scores.__getitem__)
        start, count, selection = 0, 0, "stalest_and_slowest"
        shown = sorted(set(stalest) | {r for r in slowest if r in rows})
    ranks = []
    for r in shown:
        rec = rows[r]
        hb = rec.hb
        age = max(0.0, now - rec.received)
        ranks.append({
            "rank": r, "node": hb.node, "step": hb.step, "phase": hb.phase,
            "phase_s": round(hb.phase_s + age, 2), "heartbeat_age_s": round(age, 2), "coll_seq": hb.coll_seq,
            "coll_inside": hb.coll_inside, "straggler_score": round(scores.get(r, 1.0), 3),
            "watchdog": hb.watchdog, "loss_ok": hb.loss_ok,
        })
    summary = {
        "heard": len(rows), "listed": len(ranks), "omitted": len(rows) - len(ranks), "selection": selection,
        "by_phase": dict(phases), "step_min": min(steps, default=0), "step_max": max(steps, default=0),
        "heartbeat_age_max_s": round(max((max(0.0, ages[r]) for r in active), default=0.0), 2),
        "stale": len(stale), "stragglers": len(over), "page_max": STATUS_PAGE_MAX,
    }
    if selection == "page":
        summary |= {"offset": start, "limit": count,
                    "next_offset": start + count if start + count < len(rows) else None}
    elif selection == "stalest_and_slowest":
        summary["worst"] = STATUS_WORST_RANKS
    budget = m.budget_s
    return {
        "job": m.job, "phase": m.phase, "attempt": m.attempt, "as_of_unix": round(m.unix, 3),
        "world_size": m.world_size, "alive_ranks": len(active) - len(stale),
        "nodes": [{"name": n, "state": st.state.value, "pid": st.pid, "exit_code": st.exit_code, "stopped": st.stopped,
                   "waiting": st.waiting, "reason": st.reason, "detail": st.detail}
                  for n, st in sorted(x["nodes"].items())],
        "waiting_for_capacity": x.get("waiting_for_capacity"),
        "excluded_nodes": x["excluded_nodes"], "suspect_checkpoints": x["suspect_checkpoints"],
        "suspect_why": x["suspect_why"], "checkpoint_root": x["checkpoint_root"],
        "restored": x["restored"], "restore_refused": x["restore_refused"],
        "run": x["run"], "log_dir": x["log_dir"],
        "ranks": ranks, "ranks_summary": summary, "step_rate": round(m.step_rate, 3),
        "last_checkpoint": None if not m.checkpoint else m.checkpoint | {
            "age_s": round(m.unix - m.checkpoint["created_unix"], 1)},
        "restore_from": x["restore_from"],
        "restarts": [t.to_dict(now, budget) for t in x["timers"]],
        "findings": [f.to_dict() for f in x["findings"]],
        "timeouts": x["timeouts"], "budget_s": budget, "budget_remaining_s": m.budget_remaining_s,
        "budget_exceeded": m.budget_exceeded, "rejected_heartbeats": m.rejected,
        "heartbeats_received": m.received, "stop_reason": x["stop_reason"],
        "exit_code": x["exit_code"],
    }


def status_json(snap: StatusSnapshot, *, offset: int | None = None, limit: int | None = None) -> bytes:
    """:func:`render_status` encoded (what ``/status`` serves; off the event loop)."""
    return json.dumps(render_status(snap, offset=offset, limit=limit)).encode()


def _write_evidence(path: Path, head: dict, records: list, asked: dict[int, int], awaited, answered,
                    now: float, rank_log_dir: Path) -> list[Path]:
    """The evidence file of a fault (off the event loop), then the oldest evidence files past
    :data:`EVIDENCE_MAX_BYTES` removed (never this one); returns those."""
    ranks = {r: {"heartbeat": rec.hb.to_payload(), "age_s": round(now - rec.received, 3)} for r, rec in sorted(records)}
    doc = {
        "fault": head["fault"], "attempt": head["attempt"], "time": head["time"],
        "findings": [f.to_dict() for f in head["findings"]],
        "nodes": {n: asdict(st) for n, st in head["nodes"].items()},
        "ranks": ranks, "stack_files": sorted({v["heartbeat"]["stack_file"] for v in ranks.values()} - {""}),
        # asked to dump their stacks; of those, the ones that could answer; the ones that did
        "asked": sorted(asked), "awaited": sorted(awaited),
        "answered": sorted(filter(answered, asked)),
        "rank_log_dir": str(rank_log_dir),
    }
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, default=str).encode(), mode=0o644)
    return prune_oldest(path.parent, EVIDENCE_MAX_BYTES, suffix=".json", keep=[path.name])


def _launched_as(saved: dict) -> int:
    """The attempt a saved gang's agents were launched with (later ones were restarts in place)."""
    return int(saved.get("launch_attempt", saved["attempt"]))


def _last_logged_step(path: Path, attempt: int) -> int | None:
    """The last step a rank's own log (rank-R.jsonl, written by the SDK) records for ``attempt``."""
    from supervisor.protocol import ranklog

    for rec in reversed(ranklog.read_log(path, tail_bytes=8192)):
        if rec.get("attempt") == attempt and isinstance(rec.get("step"), int):
            return rec["step"]
    return None


_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33 if sys.platform.startswith("linux") else None)
"""Linux's SO_RCVBUFFORCE (33; Python's socket module does not name it, so without the number
the buffer stayed capped at net.core.rmem_max even as root)."""


def _grow_receive_buffer(sock) -> None:
    """Room for bursts of heartbeats while a tick runs; beyond net.core.rmem_max only as root."""
    if sock is None:
        return
    for opt in (_SO_RCVBUFFORCE, socket.SO_RCVBUF):
        if opt is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, RECEIVE_BUFFER_BYTES)
            return
        except OSError:
            continue



