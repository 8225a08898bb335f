"""The controller process: observe -> decide (pure) -> act through a Platform.

Tasks (each named; one that dies unexpectedly stops the daemon loudly):

* ``intake``: the UDP heartbeat endpoint (:mod:`~supervisor.controller.intake`), authenticated
  (the heartbeat key derived from the job token) and fenced by launch id and attempt; bad
  datagrams are counted by reason and change nothing.
* ``http``: ``/metrics``, ``/healthz``, ``/readyz``, ``/status`` and ``/v1/restore-point``.
* ``reconcile``: every ``TICK_S`` (sooner while a recovery waits): ask the platform for node
  states, ask the pure layer what follows (:mod:`~supervisor.controller.reconcile`: completed,
  a fault, a capacity wait; :mod:`~supervisor.controller.recovery`: the recovery's next step),
  save, and have :mod:`~supervisor.controller.executor` carry it out; a launch is the
  executor's task, whose outcome the loop takes as its next look.

How a controller takes up its job (the saved state, token, ports, the first launch or an
adoption) is :mod:`~supervisor.controller.startup`'s.

A small state file (``LOG_DIR/supervisor-state.json``, written durably on every change; see
:mod:`supervisor.controller.state`) lets a restarted controller adopt the running gang
instead of killing it; the agents run in their own sessions, so a ``kill -9`` of the
controller leaves training untouched. One controller per job: ``LOG_DIR/supervisor.lock``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from supervisor.checkpoint.cache import Scan
from supervisor.checkpoint.discovery import parse_name
from supervisor.config import JobConfig
from supervisor.controller import decide, reconcile
from supervisor.controller import recovery as recovery_step
from supervisor.controller import release_store
from supervisor.controller import releases
from supervisor.controller import state as state_file
from supervisor.controller.executor import Executor
from supervisor.controller.intake import Intake, Wire, grow_receive_buffer
from supervisor.controller.job_state import Heard, InState, JobState, as_path, as_tuple
from supervisor.controller.recovery import Stage
from supervisor.controller.restarts import Restarts
from supervisor.controller.signals import Signals
from supervisor.controller.startup import JobAlreadyFinished, Startup, launched_as
from supervisor.controller.view import JobView, render_status, reported_by
from supervisor.controller.watch import CheckpointWatch
from supervisor.files import read_json_lines, rotate
from supervisor.metrics import WORST_RANKS
from supervisor.controller.decide import made_progress as decide_progress
from supervisor.controller.decide import (
    EXIT_CODES,
    TERMINAL,
    Fault,
    History,
    JobPhase,
    Relaunch,
    RestartTimer,
    Shrink,
    Stop,
    grow,
    note_refusals,
    pick_checkpoint,
    plan_next,
    requeued,
    restore_report,
    root_verdict,
)
from supervisor.health import Registry, Timeouts
from supervisor.platforms.base import NodeStatus, Platform, PlatformError
from supervisor.protocol import PHASE_DONE, SOURCE_TORCH
from supervisor.protocol.restore import EXCLUDE_MAX
from supervisor.reports import goodput

log = logging.getLogger("supervisor.controller")
TICK_S = 0.2
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
STATE_FILE = state_file.STATE_FILE
EVENTS_FILE = "events.jsonl"
EVENTS_MAX_BYTES = 64 << 20
"""events.jsonl is archived (``events.jsonl.1``; the older ones move up) once it reaches this size."""
EVENTS_KEPT = 8
"""Archived generations of events.jsonl kept beside it (the oldest beyond them is removed): at most
(1 + EVENTS_KEPT) x EVENTS_MAX_BYTES in all, tens of thousands of faults' worth."""


class Controller:
    """One job's controller: its state (a :class:`JobState` value, replaced whole on every change,
    saved before every action), its platform, and the executor of its recoveries' actions."""

    # the job's state: each of these reads and writes a field of ``self.state``
    phase = InState()
    run_no = InState("run")
    run_started = InState()
    attempt = InState()
    launch_attempt = InState()
    in_place_allowed = InState()
    in_place_used = InState()
    launch_id = InState()
    nodes = InState(to_state=as_tuple, from_state=list)
    restore_from = InState()
    restored = InState()
    restored_step = InState()
    ckpt_step_at_attempt_start = InState()
    ckpt_root = InState(to_state=str, from_state=as_path)
    latest_ckpt = InState("last_checkpoint")
    stop_reason = InState()
    require_checkpoint = InState()
    skip_steps = InState(to_state=as_tuple)
    history = InState()
    recovery = InState()
    # what the looks remember (reconcile.Memory), read and written the same way
    in_place_deadline = InState(holder="memory")
    in_place_failed = InState(holder="memory")
    capacity_since = InState(holder="memory")
    capacity_message = InState(holder="memory")
    launched_at = InState(holder="memory")

    def __init__(self, cfg: JobConfig, platform: Platform, *, clock=time.monotonic, fresh: bool = False) -> None:
        self.cfg, self.platform, self.clock, self.fresh = cfg, platform, clock, fresh
        self.log_dir = Path(cfg.log_dir).resolve()
        self.state_path = self.log_dir / STATE_FILE
        self._lock = state_file.JobLock(self.log_dir, owner=platform.lock_owner())
        # the job's state, and what the looks at the gang remember between them (both values)
        self.state = JobState(cfg.job, run_started=time.time(), ckpt_root=str(Path(cfg.checkpoint_dir).resolve()))
        self.memory = reconcile.Memory(launched_at=clock())
        # what this controller has seen
        self.registry = Registry()  # the ranks' last heartbeats
        self.node_status: dict[str, NodeStatus] = {}  # the platform's last look at the nodes
        self.heard = Heard()  # what the running attempt's ranks said (their restore report, steps)
        self.restarts = Restarts()  # each restart's timer, the last fault (the views show them)
        h = cfg.health
        self.detection = reconcile.Detection(Timeouts(heartbeat_s=cfg.heartbeat.timeout_s, startup_s=h.startup_timeout_s,
                                                      checkpoint_s=h.checkpoint_timeout_s))
        self.calibration = reconcile.Calibration(
            heartbeat_s=cfg.heartbeat.timeout_s, startup_s=h.startup_timeout_s, checkpoint_s=h.checkpoint_timeout_s,
            factor=h.phase_factor, floor_s=h.phase_floor_s, ceiling_s=h.phase_ceiling_s, every_s=CALIBRATE_S)
        self.watch = CheckpointWatch(clock)  # the looks at the checkpoint root, off the loop
        # the job's versions (releases.Ledger, LOG_DIR/releases/ledger.json: it outlives runs)
        self.releases = releases.Ledger()
        self.version: releases.Version | None = None  # what this controller's config runs
        self.release_switch = False  # an adopted gang runs another version than the one to run: relaunch
        # goodput over the log directory's runs: fed every event as it is written (and, at the
        # first, what events.jsonl already holds of earlier runs)
        self.goodput: goodput.Accountant | None = None
        rc = cfg.release
        self.release_policy = releases.Policy(
            rollback=rc.rollback, probation_steps=rc.probation_steps,
            baseline=release_store.baseline(rc.baseline.command, rc.baseline.image, cfg.env, cfg.command))
        # where it is reached
        self.wire = Wire()  # the job token and its keys, this run's launch ids, what the intake counted
        self.intake: Intake | None = None
        self.intake_port, self.http_port = cfg.intake.port, cfg.http.port
        self.ready = False  # /readyz: serving (the Service lists only ready pods)
        self.scrapes = 0  # /metrics reads: after the end, linger for one more if a scraper has been seen
        # how it acts
        self.signals = Signals()  # what wakes the loop; a stop or a hand-off asked for
        self.requeue_planned = False  # the stop is a planned requeue (Slurm's time-limit warning)
        self.executor = Executor(self)
        self.startup = Startup(self)

    @property
    def handed_off(self) -> bool:
        """This controller left on SIGTERM with the gang running, for the next one to adopt."""
        return self.signals.handoff

    def wake(self) -> None:
        """Have the loop look again now (not at its next tick)."""
        self.signals.wake.set()

    def new_launch(self) -> None:
        """A new launch of the gang: a new random id, in its ranks' environment and frames."""
        self.launch_id = self.wire.new_launch()

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
            saved = self.startup.open_history()
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
        if self.startup.old_gang is not None:
            old = self.startup.old_gang
            if await self.platform.adopt(old.get("platform", {}), launched_as(old)):
                self.event("old_gang_stopped", attempt=old["attempt"], detail="--fresh: what was left of the previous "
                           "run's gang, through the platform")
                await self.platform.teardown(self.cfg.restart.kill_grace_s)
        ran_before = self.startup.take_release()  # what version runs (raises StateError when it cannot be told)
        adopt_gang = False
        if saved and JobPhase(saved["phase"]) not in TERMINAL:
            adopt_gang = await self.platform.adopt(saved.get("platform", {}), launched_as(saved))
        # an adopted gang that runs another version than the one to run now (a release while the
        # controller was away, a helm upgrade of the workers): it saves and is relaunched
        self.release_switch = adopt_gang and ran_before not in ("", self.releases.current)
        if not adopt_gang:
            self.platform.warm_up()  # the first launch follows: its agents import torch meanwhile
        self.startup.init_token(saved)
        loop = asyncio.get_running_loop()
        transport, self.intake = await self.startup.bind_intake(loop, saved, adopt_gang)
        self.intake_port = transport.get_extra_info("sockname")[1]
        grow_receive_buffer(transport.get_extra_info("socket"))
        from supervisor.controller.http import start_http

        runner = await self.startup.bind_http(start_http, saved)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop, sig)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            # from here to the end the controller answers: what watches it starts before any launch
            api = f"http://{self.platform.controller_address(self.cfg.http.host)}:{self.http_port}"
            await self.platform.serving(api)
            # a recovery the previous controller was in the middle of is finished, at its stage
            resume = saved is not None and saved.get("recovery") is not None and \
                JobPhase(saved["phase"]) not in TERMINAL
            if adopt_gang:
                self.startup.adopt(saved, save=not resume)  # (a resumed recovery saves itself)
            elif resume:
                await self.startup.run_preflight()
                self.startup.take_over(saved)
                self.event("adopt_failed", detail="no live node of the saved gang; finishing the recovery it was in")
            else:
                await self.startup.run_preflight()
                await self.startup.first_launch(saved)
            if resume:
                self.startup.resume_recovery(saved, gang_found=adopt_gang)
            self.ready = True
            await self._reconcile_loop()
            await self._linger()
        finally:
            transport.close()
            await runner.cleanup()
        if self.signals.handoff:
            return 0
        code = EXIT_CODES.get(self.phase, 1)
        self.event("job_finished", phase=self.phase.value, exit_code=code, reason=self.stop_reason,
                   heartbeats={"received": self.wire.received, "node_frames": self.wire.node_frames,
                               "rejected": sum(self.wire.rejected.values())})
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
        while self.scrapes == seen and self.clock() < deadline and not self.signals.linger_cut:
            await asyncio.sleep(0.05)

    async def serve_ended(self, until: asyncio.Event) -> None:
        """After the job has ended (or was found ended): keep answering ``/healthz``, ``/readyz``,
        ``/status`` and ``/metrics`` (the verdict) until ``until`` is set. A controller that
        stays up after the end (a Deployment's) must still pass its liveness probe, and its
        scrapers must see the final phase, not a target gone down."""
        from supervisor.controller.http import start_http

        self.ready = True  # ready to be scraped and asked: the Service lists only ready pods
        runner = await self.startup.bind_http(start_http, {"http_port": self.http_port} if self.http_port else None)
        log.info("event=serving_verdict phase=%s http=%s:%s", self.phase.value, self.cfg.http.host, self.http_port)
        try:
            await until.wait()
        finally:
            await runner.cleanup()

    def request_stop(self, sig: int) -> None:
        """Tear the gang down (SIGTERM, restart.kill_grace_s: ranks write an emergency checkpoint) and exit."""
        if self.signals.stopping or self.phase in TERMINAL:
            # a second signal, or one after the job ended: the verdict stands; only the wait
            # for a last scrape is cut short
            self.signals.linger_cut = True
            return
        if sig == signal.SIGTERM and self.platform.hands_off_on_sigterm:
            # the controller's own pod is being replaced (an upgrade, a drained node): the gang
            # trains on and the next controller adopts it
            log.warning("event=signal_received signal=SIGTERM action=hand_off (the gang keeps running; the next "
                        "controller adopts it)")
            self.signals.ask_stop(handoff=True)
            return
        log.warning("event=signal_received signal=%s action=tear_down_and_exit", signal.Signals(sig).name)
        self.stop_reason = f"stopped by {signal.Signals(sig).name}"
        self.signals.ask_stop(handoff=False)

    # ------------------------------------------------------------------ the loop
    async def _reconcile_loop(self) -> None:
        while self.phase not in TERMINAL:
            signals = self.signals
            if signals.stopping:
                await self.executor.settle_launch(abandon=signals.handoff)
            if signals.stopping and signals.handoff:
                self.save_state()
                self.event("controller_handoff", attempt=self.attempt, phase=self.phase.value,
                           detail="SIGTERM: this controller stops; the gang keeps running and the next one adopts it")
                return
            if signals.stopping:
                rec = self.recovery
                if rec is not None and ((rec.stage == Stage.EVIDENCE and rec.acted)
                                        or (rec.stage == Stage.RECORD and not rec.acted)):
                    # stacks asked for, evidence not yet written: kept before the kill
                    await self.executor.run(recovery_step.WriteEvidence(), rec)
                # stopped on purpose: the ranks get kill_grace_s to write their emergency checkpoint
                self.check_lease()
                await self.executor.tear_down_saving(
                    self.cfg.restart.kill_grace_s, "written by the ranks on the way out; the next run resumes from it")
                self.finish(JobPhase.REQUEUED if self.requeue_planned else JobPhase.CANCELLED,
                             self.stop_reason or "stopped")
                return
            self._renew_lease()
            if not self.executor.launch_settled():  # a launch under way: its outcome is the next look's
                await signals.sleep(TICK_S)
                continue
            try:
                await self._tick()
            except PlatformError as exc:
                log.error("event=platform_error error=%s (state kept; retrying)", exc)
                self.event("platform_error", error=str(exc))
            await signals.sleep(recovery_step.poll_s(self.recovery, TICK_S))

    def _renew_lease(self) -> None:
        """Keep the job's lease (a shared filesystem: another host's controller may take a stale
        one over). Lost to another controller: stop acting at once, touching neither the gang
        nor the state (they are the new owner's). The lease's own thread may find it lost between
        renewals: checked on every call."""
        self.check_lease()
        try:
            self._lock.renew_every(self.clock(), LEASE_RENEW_S)
        except state_file.StateError:
            self.check_lease()

    def check_lease(self) -> None:
        if not self._lock.lost:
            return
        if self._lock.loss_news():
            log.error("event=job_lease_lost %s: this controller stops acting on the job", self._lock.lost)
            self.event("job_lease_lost", detail=self._lock.lost)
        raise state_file.StateError(f"another controller took this job over ({self._lock.lost}); this one "
                                    "stopped without touching the gang or the state")

    async def _tick(self) -> None:
        if self.recovery is not None:
            await self._advance_recovery()
            return
        now = self.clock()
        self.node_status = await self.platform.observe()
        scan = self.watch.poll(self.ckpt_root, self.history.suspects)
        if scan is not None:
            self._take_scan(scan)
        reg = self.registry
        policy = self._look_policy()
        self.memory, done = reconcile.ended(self.memory, self._look(now), policy)
        if done is not None:
            # the last save may have landed after the last look (which runs off the loop, every few
            # seconds): the final state names it
            await self.look_at_checkpoints()
            missing = list(done.missing)
            if missing:
                log.warning("event=last_words_missing ranks=%s every agent exited 0; taking their word", missing)
                self.event("last_words_missing", ranks=missing,
                           detail="every agent exited 0 but these ranks' last heartbeat never arrived")
            if not done.heard:
                log.warning("event=no_heartbeats the command ended without a heartbeat from any rank: neither the "
                            "worker SDK nor the supervisor's instrumentation ran in it (not Python, another "
                            "interpreter without the supervisor package, or instrument.enabled: false), so nothing "
                            "about its training was watched or verified")
                self.event("no_heartbeats", attempt=self.attempt,
                           detail="every agent exited 0 but no rank ever sent a heartbeat (no worker SDK and no "
                                  "instrumentation)")
                self.finish(JobPhase.COMPLETED, "every agent exited 0 (no rank ever sent a heartbeat)")
            else:
                self.finish(JobPhase.COMPLETED, "every rank finished and every agent exited 0")
            return
        self._track_progress(now)
        standby = self.memory.standby_at
        if standby is not None and now >= standby and self.phase == JobPhase.RUNNING:
            self.memory = dataclasses.replace(self.memory, standby_at=None)
            standing = self.platform.warm_up()  # the next relaunch finds its agents ready
            if standing:
                log.info("event=agents_standing_by pids=%s (they import torch now; a relaunch takes them)", standing)
                self.event("agents_standing_by", attempt=self.attempt, pids=standing)
        if self.memory.pending_stop is not None:
            phase, reason = self.memory.pending_stop
            self.event("action", attempt=self.attempt, action="tear_down", reason=reason[:200])
            await self.platform.teardown(self.cfg.restart.teardown_grace_s)
            self.finish(phase, reason)
            return
        if self.phase in TERMINAL:
            return
        if await self._requeue() or await self._capacity(now) or await self._grow() or await self._switch_release():
            return
        if reconcile.calibration_due(self.detection, now, reg, self.calibration):
            # off the loop: at 131,072 ranks the scores take ~0.5 s, and the heartbeats must go on
            # being read meanwhile
            self.detection = await asyncio.to_thread(reconcile.calibrated, self.detection, now, reg.snapshot(),
                                                     self.calibration)
        self.memory, fault, findings = reconcile.fault(self.memory, self._look(now, logged=True), policy)
        if findings is not None:
            self.detection = dataclasses.replace(self.detection, findings=tuple(findings))
        if fault is not None:
            await self._recover(fault)

    def _look(self, now: float, *, logged: bool = False) -> reconcile.Look:
        """This tick's look at the gang (``logged``: with the last step each ended rank's own log
        recorded, read from disk)."""
        return reconcile.Look(
            now=now, nodes=self.node_status, registry=self.registry, attempt=self.attempt,
            gang=tuple(self.nodes), in_place_allowed=self.in_place_allowed, ahead_attempt=self.heard.ahead_attempt,
            logged_steps=self._logged_steps() if logged else {}, timeouts=self.detection.timeouts,
            launched_at=self.launched_at)

    def _look_policy(self) -> reconcile.Policy:
        return reconcile.Policy(heartbeat_timeout_s=self.cfg.heartbeat.timeout_s,
                                in_place_timeout_s=self.cfg.restart.in_place_timeout_s,
                                secondary_grace_s=SECONDARY_GRACE_S)

    def _logged_steps(self) -> dict[int, int]:
        """The ranks that ended (:func:`~.reconcile.ended_ranks`): the last step their own log
        recorded in this attempt."""
        out = {}
        for rank in reconcile.ended_ranks(self.node_status, self.registry):
            logged = _last_logged_step(self.log_dir / "ranks" / f"rank-{rank}.jsonl", self.attempt)
            if logged is not None:
                out[rank] = logged
        return out

    async def _capacity(self, now: float) -> bool:
        """Whether the gang waits for capacity this tick (:func:`~.reconcile.placement`): not a
        fault, and the startup timeout runs from the moment it is placed. Past
        restart.shrink_after_s an elastic gang is relaunched at the size that was placed; past
        restart.capacity_wait_s the job stops."""
        r, n = self.cfg.restart, self.cfg.nodes
        self.memory, said = reconcile.placement(self.memory, self.node_status, now, reconcile.CapacityPolicy(
            wait_limit_s=r.capacity_wait_s or r.budget_s, shrink_after_s=r.shrink_after_s, nodes_min=n.min,
            nodes_max=n.max, nproc_per_node=self.cfg.nproc_per_node, world_sizes=n.world_sizes,
            world_size_multiple_of=n.world_size_multiple_of))
        for verdict in said:
            if isinstance(verdict, reconcile.Placed):
                self.launched_at = now  # the startup timeout starts now
                if self.phase == JobPhase.WAITING_FOR_CAPACITY:
                    self.phase = JobPhase.STARTING
                if verdict.found:  # (else a placed pod ended: the fault that follows says so)
                    log.info("event=capacity_found attempt=%d waited_s=%.1f", self.attempt, verdict.waited_s)
                    self.event("capacity_found", attempt=self.attempt, waited_s=round(verdict.waited_s, 3))
                self.save_state()
                return False
            self.launched_at = now
            if isinstance(verdict, reconcile.Waiting) and (verdict.first or self.phase == JobPhase.STARTING):
                self.phase = JobPhase.WAITING_FOR_CAPACITY
                self.save_state()
                if verdict.first:
                    log.warning("event=waiting_for_capacity attempt=%d nodes=%s limit_s=%g detail=%s", self.attempt,
                                list(verdict.nodes), r.capacity_wait_s or r.budget_s, verdict.message)
                    self.event("waiting_for_capacity", attempt=self.attempt, nodes=list(verdict.nodes),
                               detail=verdict.message, limit_s=r.capacity_wait_s or r.budget_s)
                else:  # an adopted gang still waiting: the wait the previous controller began goes on
                    log.warning("event=still_waiting_for_capacity attempt=%d nodes=%s waited_s=%.1f limit_s=%g "
                                "detail=%s", self.attempt, list(verdict.nodes), now - self.capacity_since,
                                r.capacity_wait_s or r.budget_s, verdict.message)
            elif isinstance(verdict, Stop):
                self.event("action", attempt=self.attempt, action="tear_down", reason="no_capacity")
                await self.platform.teardown(r.teardown_grace_s)
                self.finish(verdict.phase, verdict.reason)
            elif isinstance(verdict, Shrink):
                await self._shrink(verdict)
        return bool(said)

    async def _requeue(self) -> bool:
        """The cluster's gang admission took the gang back (:func:`~.decide.requeued`: Kueue evicted
        its workload, a gang scheduler preempted its group): not a fault, so no restart is counted
        and no restart timer runs. The ranks had their SIGTERM grace to write an emergency
        checkpoint; the gang is relaunched from the newest one, and its new pods wait for
        readmission as any gang waits for capacity (restart.capacity_wait_s)."""
        node = requeued(self.node_status)
        if node is None:
            return False
        log.warning("event=gang_requeued attempt=%d node=%s detail=%s", self.attempt, node.name, node.detail)
        self.event("gang_requeued", attempt=self.attempt, nodes=list(self.nodes), reason=node.reason,
                   detail=node.detail, restarts=self.history.restarts)
        self.event("action", attempt=self.attempt, action="tear_down", reason="requeued")
        await self.executor.relaunch(list(self.nodes), grace_s=self.cfg.restart.kill_grace_s,
                                     saved="written by the ranks on the way out (the gang's queue took it back); "
                                           "the readmitted gang resumes from it")
        return True

    async def _shrink(self, verdict: Shrink) -> None:
        """An elastic gang that waited restart.shrink_after_s is relaunched at the size placed; the
        slots left out are watched, to grow back when the cluster has room."""
        log.warning("event=capacity_shrink attempt=%d nodes=%s reason=%s", self.attempt, list(verdict.nodes),
                    verdict.reason)
        self.event("capacity_shrink", attempt=self.attempt, nodes=list(verdict.nodes), detail=verdict.reason)
        self.event("action", attempt=self.attempt, action="tear_down", reason="capacity_shrink")
        left_out = [s for s in self.nodes if s not in verdict.nodes]
        await self.executor.relaunch(list(verdict.nodes), grace_s=self.cfg.restart.teardown_grace_s,
                                     timer=self.restarts.open,
                                     then=lambda: self.platform.probe_capacity(left_out))  # to grow back later

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
        await self.executor.relaunch(list(nodes), grace_s=self.cfg.restart.kill_grace_s,
                                     saved="written by the ranks on the way out; the larger gang resumes from it")
        return True

    async def _switch_release(self) -> bool:
        """An adopted gang runs another version than the one to run now (released while no
        controller watched it, or a ``helm upgrade`` of the workers): the ranks save on SIGTERM
        (restart.kill_grace_s, as for a planned stop) and the version to run resumes from there."""
        if not self.release_switch:
            return False
        self.release_switch = False
        log.warning("event=release_relaunch attempt=%d version=%s (the adopted gang runs another version)",
                    self.attempt, self.releases.current)
        self.event("release_relaunch", attempt=self.attempt, version=self.releases.current,
                   detail="the adopted gang runs another version of the job: it saves and is relaunched as this one")
        self.event("action", attempt=self.attempt, action="tear_down", reason="release")
        await self.executor.relaunch(list(self.nodes), grace_s=self.cfg.restart.kill_grace_s,
                                     saved="written by the ranks on the way out; the new release resumes from it")
        return True

    def _track_progress(self, now: float) -> None:
        reg = self.registry
        for said in reconcile.started(reg, starting=self.phase == JobPhase.STARTING,
                                      reported=self.heard.report is not None, root_judged=self.heard.root_judged):
            if isinstance(said, reconcile.Running):
                self.in_place_deadline = None  # a restart in place came back
                self.phase = JobPhase.RUNNING
                self.memory = dataclasses.replace(self.memory, standby_at=now + STANDBY_AFTER_S)
                self.save_state()  # before the event: whoever reads "running" finds it in the state file too
                self.event("running", attempt=self.attempt, world_size=said.world_size,
                           **reported_by(reg, range(said.world_size), counts=True))
            elif isinstance(said, reconcile.Reported):
                self._on_restore_reported(said.report)
                if self.phase in TERMINAL:
                    return
            else:
                self.heard.root_judged = True
                self._judge_root(said.report)
        all_heard = 0 < reg.world_size == len(reg.ranks)
        hbs = [rec.hb for rec in reg.ranks.values()] if self.restarts.open is not None else []
        for told in self.restarts.progress(now, attempt=self.attempt, all_heard=all_heard,
                                           steps_done=[hb.steps_done for hb in hbs],
                                           first_step_s=[hb.first_step_s for hb in hbs],
                                           restore_s=[hb.restore_s for hb in hbs], budget_s=self.cfg.restart.budget_s):
            self.event(told.event, **told.fields)
            if told.event == "restart_complete":
                log.info("event=restart_complete attempt=%d total_s=%.2f %s", self.attempt, told.fields["total_s"],
                         " ".join(f"{k}_s={v:.2f}" for k, v in told.fields["phases"].items()))
                self.save_state()
            else:
                log.error("event=%s attempt=%d budget_s=%.0f", told.event, self.attempt, self.cfg.restart.budget_s)
        if all_heard and not self.heard.stepped and all(rec.hb.steps_done > 0 for rec in reg.ranks.values()):
            # every rank of this attempt has taken a step: training (what the goodput report's
            # start-up is measured to, for an attempt no restart timer covers)
            self.heard.stepped = True
            self.event("training", attempt=self.attempt, step=reg.min_step(),
                       since_launch_s=round(now - self.launched_at, 3))
        if all_heard and now >= self.heard.progress_at:  # reads every rank: less often in a large gang
            self.heard.progress_at = now + decide.progress_every_s(reg.world_size)
            step, saved = reg.floor()
            self.heard.mark_step(now, step)
            self.track_release(time.time(), step)
            self.tell_save(reg, saved)

    def completed_step(self) -> dict[str, int]:
        """``completed_step``: the newest step an SDK rank has finished (its ``step`` is the one
        it is taking), what a restore to an older one recomputes; none for a script without the
        SDK (its count is its optimizer steps since its launch, not the step it resumed at)."""
        hbs = [rec.hb for rec in self.registry.ranks.values()]
        if not hbs or any(hb.source == SOURCE_TORCH for hb in hbs):
            return {}
        return {"completed_step": max(hb.step for hb in hbs) - 1}

    def tell_save(self, reg: Registry, saved: int) -> None:
        """Every rank has said it saved a newer step (``saved``: the oldest of their newest saves):
        how long that save blocked the gang (the slowest rank's) and, for an asynchronous one, how
        long it took to reach storage: the goodput's save stalls and the interval's lower bound."""
        if saved <= self.heard.saved_step or saved <= self.restored_step:  # (a restored step is no save)
            return
        self.heard.saved_step = saved
        hbs = [rec.hb for rec in reg.ranks.values()]
        persist = max(hb.ckpt_persist_s for hb in hbs)
        self.event("save_blocked", attempt=self.attempt, step=saved, blocked_s=round(max(hb.ckpt_s for hb in hbs), 3),
                   **({"persist_s": round(persist, 3)} if persist > 0 else {}))

    def _on_restore_reported(self, report) -> None:
        """Every rank said how its restore went: record what was really restored, make the
        checkpoints they refused suspect, and check that they write where we watch."""
        self.heard.report = report
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
        self.history, newly = note_refusals(self.history, report)
        for name, why in newly:
            self.event("checkpoint_suspect", name=name, detail=why)
        parsed = parse_name(report.restored) if report.restored else None
        self.restored_step = parsed[0] if parsed else 0
        self.save_state()

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
            self.watch.rebase = True
            self.watch.soon()
        elif verdict == "conflict":
            self.event("checkpoint_root_conflict", roots=list(report.roots), detail=detail)
            # the gang is torn down before the verdict (_tick): nothing may keep training unwatched
            self.memory = dataclasses.replace(self.memory, pending_stop=(
                JobPhase.FAILED, f"{detail}: every rank must save to one shared root (give the same --checkpoint-dir "
                "to every rank, or none: ranks read SUPERVISOR_CHECKPOINT_DIR)"))
            return False
        return True

    async def look_at_checkpoints(self) -> None:
        """Look now (in a worker thread), and wait for it: the newest checkpoint and every usable
        one, for a decision that follows (a launch, a relaunch, the end)."""
        for scan in await self.watch.look(self.ckpt_root, self.history.suspects):
            self._take_scan(scan)

    def _take_scan(self, scan: Scan) -> None:
        """Take in one look at the checkpoint root (made off the loop, maybe a moment ago)."""
        if scan.root != self.ckpt_root:
            return  # the root was adopted meanwhile: the next look is at the new one
        found = scan.discovery.checkpoint
        if found is not None and found.name in self.history.suspects:
            self.watch.soon()  # made suspect meanwhile: look again at once
            return
        if found is None:
            self.latest_ckpt = None
        else:
            if not self.history.had_checkpoint:
                self.history = dataclasses.replace(self.history, had_checkpoint=True)
            if self.latest_ckpt is None or self.latest_ckpt["name"] != found.name:
                # how long this save blocked the ranks, where their heartbeats already say (goodput)
                self.event("checkpoint_complete", name=found.name, step=found.step,
                           **({"release": found.manifest.release} if found.manifest.release else {}))
                if found.manifest.release:
                    self.releases = releases.wrote(self.releases, found.manifest.release, found.name)
                self.watch.times.append(found.manifest.created_unix)
            self.latest_ckpt = {"name": found.name, "step": found.step, "created_unix": found.manifest.created_unix,
                                "writer_world_size": found.manifest.writer_world_size}
        if self.watch.rebase:  # a root adopted: progress in this attempt counts from what it holds
            self.watch.rebase = False
            self.ckpt_step_at_attempt_start = self.latest_ckpt["step"] if self.latest_ckpt else -1

    # ------------------------------------------------------------------ recovery
    async def _recover(self, fault: Fault) -> None:
        """A fault is detected: its recovery begins (:mod:`~supervisor.controller.recovery`), and
        its first step is taken at once."""
        self.check_lease()
        now = self.clock()
        self.phase = JobPhase.RECOVERING
        self.restarts.begin(fault, self.attempt, RestartTimer(self.attempt, fault.kind, fault.fault_at, now),
                            unix=time.time(), culprits=[
                                (r, self.registry.ranks[r].hb.node if r in self.registry.ranks else ",".join(fault.nodes))
                                for r in fault.ranks or (-1,)])
        self.platform.warm_up()  # a launch may follow: what can start ahead starts now
        log.error("event=fault_detected attempt=%d kind=%s ranks=%s nodes=%s detail=%s", self.attempt, fault.kind,
                  list(fault.ranks), list(fault.nodes), fault.detail)
        # the step the gang had reached and its step time (the loop's, a save's stall not in
        # it): what a restore to an older step recomputes
        took = self.registry.loop_step_time() or self.heard.step_time()
        self.event("fault_detected", attempt=self.attempt, **fault.to_dict(),
                   detection_s=round(now - fault.fault_at, 3), **reported_by(self.registry, fault.ranks),
                   step=self.registry.max_step(), **self.completed_step(),
                   **({"step_time_s": round(took, 4)} if took > 0 else {}))
        rejected = self.judge_release(fault)
        # a rejected release is relaunched as another version: never restarted in place
        self.recovery = recovery_step.begin(fault, in_place=bool(self.in_place_allowed) and not rejected)
        self.executor.in_place = None
        await self._advance_recovery()

    async def _advance_recovery(self) -> None:
        """Steps of the recovery (:func:`~supervisor.controller.recovery.step`), each saved before
        its actions are carried out (:class:`~supervisor.controller.executor.Executor`), until one
        has to wait (for the ranks' stacks, a rung's grace) or the recovery is over."""
        self.signals.wants_heartbeats = False
        while self.recovery is not None and self.phase not in TERMINAL and not self.signals.stopping:
            rec = self.recovery
            waits_on_nodes = rec.stage == Stage.RUNG and rec.acted
            obs = recovery_step.Observation(
                now=self.clock(), nodes=await self.platform.observe() if waits_on_nodes else self.node_status,
                rank_pids={r: r_.hb.pid for r, r_ in self.registry.ranks.items() if r_.hb.pid},
                answered=self.executor.answered(), in_place=self.executor.in_place,
                heard=0 < self.registry.world_size and self.registry.all_heard())
            new, actions = recovery_step.step(rec, obs, recovery_step.Policy(
                abort_grace_s=self.cfg.restart.abort_grace_s,
                evidence_wait_s=min(1.0, self.cfg.heartbeat.interval_s * 1.2)))  # older workers never answer
            if new == rec and not actions:
                # waiting: on the ranks (their stacks, an adopted gang's first heartbeats), or the clock
                self.signals.wants_heartbeats = bool(rec.hold_until) or (rec.stage == Stage.EVIDENCE and rec.acted)
                return
            self.recovery = new
            if actions or new is None:
                # what is about to be done, before it is done (no fsync: it is a controller's
                # death that this outlives; the launch's own save is durable)
                self.save_state(durable=False)
            for i, action in enumerate(actions):
                try:
                    await self.executor.run(action, rec if new is None else new, resumed=rec.resumed and i == 0)
                except PlatformError:
                    # not carried out: the stage's action is tried again at the next tick
                    if self.recovery is not None and self.recovery.acted and self.recovery.stage == new.stage:
                        self.recovery = dataclasses.replace(self.recovery, acted=False)
                        self.save_state(durable=False)
                    raise

    def tell_suspects(self, before: set[str]) -> None:
        for name in self.history.suspects:
            if name not in before:
                self.event("checkpoint_suspect", name=name, detail=self.history.suspect_why.get(name, ""))

    def restorable(self) -> list[str]:
        """The usable checkpoints of the last look at the root, newest first, less those a
        rejected release wrote (:func:`~.releases.restorable`)."""
        return releases.restorable(self.watch.usable, self.watch.writers, self.releases)

    def choose_checkpoint(self) -> str | None | Stop:
        """The checkpoint a launch resumes from (:func:`pick_checkpoint`), of the last look at the root."""
        usable = self.restorable()
        if usable and not self.history.had_checkpoint:
            self.history = dataclasses.replace(self.history, had_checkpoint=True)
        return pick_checkpoint(usable, self.history, self.cfg.restart.allow_fresh_start)

    def plan(self, fault: Fault, history: History, *, rolled_back: bool = False) -> tuple[Relaunch | Stop, History]:
        """What comes after ``fault``, and the history after it (:func:`plan_next`), on the
        checkpoints of the last :meth:`look_at_checkpoints` (its callers look first);
        ``rolled_back``: the fault rejected the release that caused it, which goes back to an
        earlier version (the fault does not count against the job)."""
        made_progress = decide_progress(
            latest_step=self.latest_ckpt["step"] if self.latest_ckpt else None,
            step_at_start=self.ckpt_step_at_attempt_start, had_checkpoint=bool(history.had_checkpoint or self.latest_ckpt),
            steps_without_sdk=max((rec.hb.steps_done for rec in self.registry.ranks.values()
                                   if rec.hb.source == SOURCE_TORCH), default=0))
        straggler_nodes = []
        if self.cfg.health.exclude_stragglers:
            straggler_nodes = sorted({self.registry.ranks[r].hb.node for r, s in self.detection.stragglers.items()
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
            checkpoints=self.restorable(), allow_fresh_start=self.cfg.restart.allow_fresh_start,
            nonfinite_window=self.cfg.nonfinite.window_steps, skip_batches=self.cfg.nonfinite.skip_batches,
            nproc_per_node=self.cfg.nproc_per_node, world_sizes=self.cfg.nodes.world_sizes,
            world_size_multiple_of=self.cfg.nodes.world_size_multiple_of,
            straggler_nodes=straggler_nodes, release_rejected=rolled_back,
        )

    # ------------------------------------------------------------------ releases
    def running_version(self) -> releases.Version | None:
        rec = self.releases.get(self.releases.current)
        return rec.version if rec is not None else self.version

    def release_launch(self) -> tuple[tuple[str, ...], dict[str, str], str]:
        """The command, the job's environment and the image a launch runs: the config's, or an
        earlier version's (a rollback: its code from its snapshot, its image)."""
        v = self.running_version()
        if v is None or self.version is None or v.id == self.version.id:
            return tuple(self.cfg.command), dict(self.cfg.env), ""
        rec = self.releases.get(v.id)
        return release_store.launch_command(self.log_dir, v), dict(v.env), releases.image_of(rec) if rec else v.image

    def save_releases(self) -> None:
        if not self.cfg.release.rollback:
            return  # versions are not tracked: nothing of theirs is written
        try:
            release_store.save(self.log_dir, self.releases)
        except OSError as exc:
            log.error("event=release_ledger_unwritable error=%s (kept in memory; written again at the next change)", exc)

    def judge_release(self, fault: Fault) -> bool:
        """Whether ``fault`` rejects the running release (:func:`~.releases.judge`): kept as the
        ledger's pending rejection, which the plan after the teardown carries out."""
        pending = self.releases.pending
        if pending is not None and pending.version == self.releases.current:
            return True  # (judged before a controller restart: the teardown it waited on goes on)
        if pending is not None:  # stale (another version runs now): judged afresh
            self.releases = dataclasses.replace(self.releases, pending=None)
        before = self.releases
        stepped = restore_report(rec.hb for rec in self.registry.ranks.values()).stepped
        self.releases, verdict = releases.judge(
            before, kind=fault.kind, detail=fault.detail, step=fault.step, stepped=stepped,
            node_failure=fault.node_failure, policy=self.release_policy)
        if self.releases != before:
            self.save_releases()
        if verdict is not None and not verdict.to:
            self.event("release_not_rolled_back", version=verdict.version, reason=verdict.reason, why=verdict.why,
                       detail="no version of this job is known-good yet and release.baseline names none: the job's "
                              "own verdict stands")
            return False
        if verdict is not None:
            log.error("event=release_rejected version=%s reason=%s goes_back_to=%s why=%s", verdict.version,
                      verdict.reason, verdict.to, verdict.why)
        return verdict is not None

    def roll_back(self) -> releases.Told | None:
        """Before the plan after a fault that rejected the running release: the version is
        rejected and the earlier one (:func:`~.releases.rollback_target`) is to run; returns the
        event to tell once the plan has chosen the checkpoint. With none to go back to, the
        job's own verdict stands (said now) and None is returned."""
        verdict = self.releases.pending
        if verdict is None:
            return None
        target = releases.rollback_target(self.releases, verdict.version, self.release_policy)
        if target is None:  # (judged with one: the ledger changed since, e.g. a baseline taken out)
            self.releases = releases.settle(self.releases)
            self.save_releases()
            return None
        self.releases, told = releases.roll_back(self.releases, verdict, target, now_unix=time.time())
        self.save_releases()
        return told

    def tell_rollback(self, told: releases.Told, decision: Relaunch | Stop) -> None:
        checkpoint = decision.restore_from if isinstance(decision, Relaunch) else None
        f = told.fields
        log.error("event=release_rolled_back from=%s to=%s reason=%s checkpoint=%s why=%s", f["from"], f["to"],
                  f["reason"], checkpoint, f["why"])
        self.event(told.event, **f, checkpoint=checkpoint, attempt=self.attempt,
                   **({} if isinstance(decision, Relaunch) else {"stops": decision.reason}))

    def track_release(self, now_unix: float, slowest_step: int) -> None:
        """The running version's steps past its restore (``slowest_step``: the slowest rank's): its
        probation's end."""
        reg = self.registry
        if not (0 < reg.world_size == len(reg.ranks)) or self.releases.pending is not None:
            return
        pinned = releases.pinned(self.releases, (st.image_id for st in self.node_status.values()))
        if pinned is not self.releases:
            self.releases = pinned
            self.save_releases()
        steps = slowest_step - self.restored_step
        finite = reg.all_finite()
        self.releases, told = releases.trained(self.releases, steps, finite=finite, now_unix=now_unix,
                                               policy=self.release_policy)
        if told is not None:
            self.save_releases()
            log.info("event=%s version=%s steps=%s", told.event, told.fields["version"], told.fields["steps"])
            self.event(told.event, **told.fields)

    def finish(self, phase: JobPhase, reason: str) -> None:
        self.phase = phase
        self.stop_reason = reason
        self.recovery = None  # a recovery under way ends with the job
        level = logging.INFO if phase == JobPhase.COMPLETED else logging.ERROR
        log.log(level, "event=terminal phase=%s exit_code=%d reason=%s", phase.value, EXIT_CODES[phase], reason)
        self.save_releases()  # the steps each version trained
        self.save_state()

    # ------------------------------------------------------------------ views
    def view(self) -> JobView:
        """The job as ``/status``, ``/metrics`` and ``supervisor status`` show it: its state and
        what this controller has seen, taken here, on the event loop, in O(1) but for one list
        copy of the ranks' records; rendered anywhere."""
        now = self.clock()
        rs = self.restarts
        hang = rs.active
        ranks = self.registry.ranks
        ck = self.latest_ckpt
        since = self.capacity_since
        return JobView(
            job=self.cfg.job, now=now, unix=time.time(), phase=self.phase.value, attempt=self.attempt,
            run=self.run_no, run_started_unix=self.run_started, world_size=self.registry.world_size,
            timeout_s=self.cfg.heartbeat.timeout_s, straggler_threshold=self.cfg.health.straggler_threshold,
            per_rank_limit=self.cfg.metrics_per_rank_limit, ranks=list(ranks.values()),
            stragglers=self.detection.stragglers,  # (never changed in place: a calibration replaces it)
            hang_kind=hang.kind if hang is not None else None,
            hang_culprits=[] if hang is None else [(r, ranks[r].hb.node if r in ranks else ",".join(hang.nodes))
                                                   for r in (hang.ranks or (-1,))[:WORST_RANKS]],
            last_fault_kind=rs.last.kind if rs.last is not None else None,
            last_fault_attempt=rs.last_attempt, last_fault_unix=rs.last_unix,
            last_fault_culprits=list(rs.last_culprits) if rs.last is not None else [],
            restart_in_progress=rs.open is not None and self.phase not in TERMINAL,
            restarts=dict(rs.by_reason), timers=list(rs.timers), budget_s=self.cfg.restart.budget_s,
            budget_remaining_s=self.budget_remaining(now), budget_exceeded=bool(rs.budget_exceeded),
            checkpoint=dict(ck) if ck else None, checkpoint_times=tuple(self.watch.times),
            rejected=dict(self.wire.rejected), received=self.wire.received, node_frames=self.wire.node_frames,
            step_rate=max(0.0, float(self.heard.step_rate())),
            stop_requested=self.signals.requested,
            waiting_for_capacity=None if since is None else {"since_s": round(now - since, 1),
                                                              "detail": self.capacity_message},
            waiting_for_capacity_s=0.0 if since is None else now - since,
            nodes=dict(self.node_status), excluded_nodes=tuple(self.history.excluded),
            suspect_checkpoints=tuple(self.history.suspects), suspect_why=dict(self.history.suspect_why),
            checkpoint_root=str(self.ckpt_root), restored=self.restored,
            restore_refused=dict(self.heard.report.refused) if self.heard.report else {}, log_dir=str(self.log_dir),
            restore_from=self.restore_from, findings=list(self.detection.findings), timeouts=asdict(self.detection.timeouts),
            stop_reason=self.stop_reason, exit_code=EXIT_CODES.get(self.phase),
            release=releases.summary(self.releases, self.release_policy),
            goodput=self.goodput_summary(),
        )

    def accountant(self) -> goodput.Accountant:
        if self.goodput is None:
            self.goodput = goodput.Accountant()
            for rec in read_json_lines(self.log_dir / EVENTS_FILE):  # the earlier runs of this log directory
                self.goodput.feed(rec)
        return self.goodput

    def goodput_summary(self) -> dict[str, Any]:
        """The job's goodput so far and the interval its faults advise (:mod:`~supervisor.reports.goodput`)."""
        try:
            _, total = self.accountant().breakdowns(time.time(), spans=False)
        except goodput.GoodputError:
            return {}
        return goodput.summary(total, goodput.advise(total))

    def status(self, *, offset: int | None = None, limit: int | None = None) -> dict[str, Any]:
        """The state as ``supervisor status`` shows it (:func:`render_status` of a view taken now)."""
        return render_status(self.view(), offset=offset, limit=limit)

    def alive_ranks(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        return sum(1 for rec in self.registry.ranks.values()
                   if now - rec.received <= self.cfg.heartbeat.timeout_s and rec.hb.phase != PHASE_DONE)

    def budget_remaining(self, now: float) -> float:
        return self.restarts.budget_remaining(self.cfg.restart.budget_s, now)

    def restore_point(self) -> dict[str, Any]:
        # the ranks pass over the suspects and what a rejected release wrote (their own scan of
        # the root, where the named checkpoint cannot be restored, must not fall back on one)
        unfit = set(self.watch.usable) - set(self.restorable())
        exclude = list(self.history.suspects) + sorted(unfit - set(self.history.suspects))
        return {"attempt": self.attempt, "checkpoint": self.restore_from, "exclude": exclude[:EXCLUDE_MAX],
                "required": self.require_checkpoint}

    # ------------------------------------------------------------------ persistence
    def event(self, name: str, /, **fields: Any) -> None:
        now = time.time()
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z",
               "event": name, "job": self.cfg.job, "run": self.run_no} | fields
        acc = self.accountant()  # (before this event is written: it reads the earlier ones)
        path = self.log_dir / EVENTS_FILE
        with open(path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
            full = f.tell() >= EVENTS_MAX_BYTES
        if full:  # archived beside it (events.jsonl.1, .2, ...): readers take them all (files.read_lines)
            try:
                rotate(path, EVENTS_KEPT)
            except OSError as exc:
                log.warning("event=events_rotate_failed path=%s error=%s", path, exc)
        acc.feed(rec)
        self.platform.tell(name, rec)

    def save_state(self, *, durable: bool = True) -> None:
        self.check_lease()  # the state is the new owner's once the lease is lost
        # the job's state, and beside it what only this controller knows (where it listens, what
        # its platform runs) and the restart under way's timer
        timer = self.restarts.open
        since = self.capacity_since  # a replacement goes on with the wait, not from nothing
        state_file.save(self.state_path, self.state.to_saved(self.to_unix) | {
            "intake_port": self.intake_port, "http_port": self.http_port, "http_host": self.cfg.http.host,
            "platform": self.platform.describe(), "pid": os.getpid(), "updated": time.time(),
        } | ({"restart_timer": timer.to_saved(self.to_unix)} if timer is not None else {})
          | ({"capacity_since": self.to_unix(since),
              "capacity_message": state_file.plain_text(self.capacity_message, state_file.MAX_CAPACITY_MESSAGE)}
             if since is not None else {})
          | ({"exit_code": EXIT_CODES[self.phase]} if self.phase in TERMINAL else {}), durable=durable)

    def to_unix(self, t: float) -> float:
        """A time of this controller's clock as wall-clock time (what a replacement can read)."""
        return time.time() - (self.clock() - t)

    def from_unix(self, unix: float) -> float:
        return self.clock() - (time.time() - unix)


def _last_logged_step(path: Path, attempt: int) -> int | None:
    """The last step a rank's own log (rank-R.jsonl, written by the SDK) records for ``attempt``."""
    from supervisor.protocol import ranklog

    for rec in reversed(ranklog.read_log(path, tail_bytes=8192)):
        if rec.get("attempt") == attempt and isinstance(rec.get("step"), int):
            return rec["step"]
    return None
