"""How a controller takes up its job: the saved state it continues (or archives for a new run),
its token and ports, the preflight, and then the first launch, the adoption of a live gang, or the
recovery a previous controller was in the middle of."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.controller import preflight
from supervisor.controller import release_store, releases
from supervisor.controller import recovery as recovery_step
from supervisor.controller import state as state_file
from supervisor.controller import token as job_token
from supervisor.controller.decide import TERMINAL, JobPhase, RestartTimer, Stop, gang_size
from supervisor.controller.intake import Intake
from supervisor.files import set_aside
from supervisor.platforms.base import PlatformError

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller

log = logging.getLogger("supervisor.controller")


class JobAlreadyFinished(Exception):
    def __init__(self, saved: dict) -> None:
        super().__init__(saved.get("phase"))
        self.saved = saved


def launched_as(saved: dict) -> int:
    """The attempt a saved gang's agents were launched with (later ones were restarts in place)."""
    return int(saved.get("launch_attempt", saved["attempt"]))


class Startup:
    def __init__(self, controller: "Controller") -> None:
        self.c = controller
        self.old_gang: dict | None = None
        """--fresh over a live run: its gang, to stop through the platform too (Slurm steps on other nodes)."""

    def open_history(self) -> dict | None:
        """The saved state this controller continues, or None for a new run.

        A live or interrupted run (not in a terminal phase) is continued: its gang adopted, or
        its history carried on. A finished run's state is archived and a new run starts with a
        new history; an event says what it inherits (nothing but the checkpoints on disk).
        With ``fresh``, any saved state (even an unreadable one) is archived after what is
        left of its gang has been stopped.
        """
        c = self.c
        try:
            saved = state_file.load(c.state_path)
        except state_file.StateError:
            if not c.fresh:
                raise
            saved = None
            self.stop_strays()
            where = state_file.archive(c.state_path, "unreadable")
            c.event("run_started", run=1, fresh=True, previous_state=str(where),
                    inherited="nothing: the previous state was unreadable; checkpoints on disk are discovered "
                              "again and verified by the ranks")
            return None
        if saved is not None and saved["job"] != c.cfg.job:
            if not c.fresh and JobPhase(saved["phase"]) not in TERMINAL:
                # its gang may be running: never leave it neither adopted nor stopped
                raise state_file.StateError(
                    f"{c.log_dir} holds the state of another job ({saved['job']!r}, phase {saved['phase']}), whose "
                    f"gang may still be running: give this job ({c.cfg.job!r}) its own --log-dir, or use --fresh "
                    "to stop what is left of that job and start this one here")
            if c.fresh and JobPhase(saved["phase"]) not in TERMINAL:
                self.stop_strays()
            where = state_file.archive(c.state_path, f"job-{saved['job'][:40]}")
            log.warning("event=state_file_of_another_job job=%s archived=%s", saved["job"], where)
            saved = None
        if saved is None:
            if not c.fresh:
                c.event("run_started", run=1, inherited="nothing (no previous run in this log directory)")
            return None
        phase = JobPhase(saved["phase"])
        if phase in TERMINAL and phase != JobPhase.REQUEUED and not c.fresh and not c.platform.reruns_finished:
            # restarted after the end (a Deployment restarts what exits): the verdict stands
            raise JobAlreadyFinished(saved)
        # a planned requeue is the same run going on in a new allocation: its history continues
        if c.fresh or (phase in TERMINAL and phase != JobPhase.REQUEUED):
            if c.fresh and phase not in TERMINAL:
                self.stop_strays()
                self.old_gang = saved  # stopped through the platform too (Slurm steps on other nodes)
            where = state_file.archive(c.state_path, f"run{saved.get('run', 1)}")
            ranks_dir = c.log_dir / "ranks"
            if ranks_dir.exists():  # the ranks' own logs (steps, stacks) are that run's evidence too
                set_aside(ranks_dir, f"run{saved.get('run', 1)}")
            c.run_no = int(saved.get("run", 1)) + 1
            c.event("run_started", run=c.run_no, fresh=c.fresh,
                    previous_run={"phase": saved["phase"], "attempt": saved["attempt"],
                                  "exit_code": saved.get("exit_code"), "reason": saved.get("stop_reason", ""),
                                  "state": str(where)},
                    inherited="nothing: attempts, restarts, suspect checkpoints, excluded nodes and the "
                              "no-progress count start fresh; checkpoints on disk are discovered again and "
                              "fully verified by the ranks")
            log.info("event=run_started run=%d previous_phase=%s previous_state=%s", c.run_no, saved["phase"], where)
            return None
        c.run_no = int(saved.get("run", 1))
        c.run_started = float(saved.get("run_started", time.time()))
        if phase == JobPhase.REQUEUED:
            c.event("requeue_resumed", run=c.run_no, attempt=saved["attempt"],
                    detail="the requeued job continues its run's history from the newest verified checkpoint")
        if saved.get("ckpt_root"):
            c.ckpt_root = Path(saved["ckpt_root"])
        return saved

    def take_release(self) -> str:
        """The version this controller's config runs (:mod:`~supervisor.controller.releases`),
        taken into the job's ledger: a new one is a release (its code snapshotted), a rejected
        one gives way to the known-good version. Returns the version the job ran before ("":
        none recorded)."""
        c = self.c
        cfg = c.cfg
        if not cfg.release.rollback:
            # rollbacks off: no version is told, hashed or snapshotted (nothing of it can refuse a start)
            log.info("event=releases_off detail=release.rollback is false: versions are not tracked")
            return ""
        parts = c.platform.release_parts()
        try:
            ledger = release_store.load(c.log_dir)
            c.version = release_store.identify(
                command=cfg.command, env=cfg.env, trained={"nproc_per_node": cfg.nproc_per_node,
                                                           "nonfinite": dataclasses.asdict(cfg.nonfinite)},
                log_dir=c.log_dir, checkpoint_dir=Path(cfg.checkpoint_dir), code_dir=cfg.release.code_dir,
                max_code_bytes=int(cfg.release.max_code_mb * 2**20), platform_parts=parts, hash_code=parts is None)
            marks = release_store.allowed(c.log_dir)
            for vid in marks:
                before = ledger.get(vid)
                ledger = releases.allow(ledger, vid, now_unix=time.time())
                if before is not None and before.state == releases.REJECTED:
                    c.event("release_allowed", version=vid, detail="allowed again by the operator: on probation")
            previous = ledger.current
            ledger, told = releases.arrive(ledger, c.version, now_unix=time.time(), policy=c.release_policy)
            if ledger.get(c.version.id).state != releases.REJECTED and parts is None:
                release_store.snapshot(c.log_dir, c.version, Path(cfg.checkpoint_dir))
            release_store.save(c.log_dir, ledger)
            for vid in marks:  # taken in only once the ledger that holds them is written
                release_store.taken(c.log_dir, vid)
        except (release_store.ReleaseError, OSError) as exc:
            raise state_file.StateError(f"release: {exc}") from None
        c.releases = ledger
        if told is not None:
            level = logging.WARNING if told.event == "release_still_rejected" else logging.INFO
            log.log(level, "event=%s %s", told.event, " ".join(f"{k}={v}" for k, v in told.fields.items()
                                                                if k != "detail"))
            c.event(told.event, **told.fields)
        return previous

    def stop_strays(self) -> None:
        """``--fresh``: no process of an earlier gang of this job may outlive its record."""
        c = self.c
        pids = c.platform.stop_strays(c.log_dir / "ranks")
        if pids:
            log.warning("event=strays_killed pids=%s (processes of an earlier gang of this job)", pids)
            c.event("strays_killed", pids=pids)

    async def bind_intake(self, loop, saved: dict | None, adopt_gang: bool):
        """The heartbeat port: an adopted gang's ranks send to the saved one, so it must be had;
        otherwise the configured one (0: any free port)."""
        c = self.c
        port = int(saved.get("intake_port", 0)) if (saved and adopt_gang) else c.intake_port
        try:
            return await loop.create_datagram_endpoint(lambda: Intake(c), local_addr=(c.cfg.intake.host, port))
        except OSError as exc:
            if adopt_gang:  # the gang was only looked at: it runs on, untouched
                raise state_file.StateError(
                    f"the running gang sends its heartbeats to {c.cfg.intake.host}:{port}, which this controller "
                    f"cannot bind ({exc}); another process holds it (`ss -ulpn 'sport = :{port}'` names it). Stop "
                    "that process and run the same command again to adopt the gang, or use --fresh to stop the "
                    "gang and start a new run.") from None
            raise state_file.StateError(f"cannot bind the heartbeat port {c.cfg.intake.host}:{port}: {exc}") from None

    async def bind_http(self, start_http, saved: dict | None):
        """The HTTP port: the one given wins; else the saved one (scrapers know it) when free; else any."""
        c = self.c
        given = c.cfg.http.port
        candidates = [given] if given else ([int(saved["http_port"])] if saved and saved.get("http_port") else []) + [0]
        for i, port in enumerate(candidates):
            try:
                return await start_http(c, c.cfg.http.host, port)
            except OSError as exc:
                if given or i == len(candidates) - 1:
                    raise state_file.StateError(f"cannot serve HTTP on {c.cfg.http.host}:{port}: {exc}") from None
                log.warning("event=http_port_taken port=%d error=%s action=use_a_free_port", port, exc)
                c.event("http_port_changed", old=port, reason=str(exc))
        raise AssertionError("unreachable")

    async def run_preflight(self) -> None:
        """The commonest mistakes as one clear line before anything is launched (off the loop:
        the interpreter probe may take seconds). The command is checked here only where this host
        shares the workers' environment (``Platform.checks_command_here``); elsewhere each node's
        agent checks it before it starts ranks (``LaunchSpec.check_command``)."""
        c = self.c
        try:
            warnings = await asyncio.to_thread(preflight.check, c.cfg.command,
                                               dict(os.environ) | dict(c.cfg.env), c.ckpt_root,
                                               command_here=c.platform.checks_command_here)
        except preflight.PreflightError as exc:
            c.event("preflight_failed", error=str(exc))
            raise state_file.StateError(str(exc)) from None
        for w in warnings:
            log.warning("event=preflight_warning %s", w)
            c.event("preflight_warning", warning=w)

    def init_token(self, saved: dict | None) -> None:
        """A continued run keeps its token (its live ranks hold it); a new run gets a new one."""
        c = self.c
        try:
            provided = c.platform.job_token()
        except PlatformError as exc:
            raise state_file.StateError(str(exc)) from None
        if provided is not None:
            c.wire.token = provided
            return
        try:
            c.wire.token = job_token.load_or_create(c.log_dir / "token", reuse=bool(saved))
        except job_token.TokenError as exc:
            raise state_file.StateError(str(exc)) from None

    async def first_launch(self, saved: dict | None) -> None:
        c = self.c
        if saved:
            # a previous controller's gang is gone: continue its history with a new attempt
            c.attempt = int(saved.get("attempt", 0)) + 1
            c.history = saved["history"]
            c.skip_steps = c.history.skip_steps
            c.event("adopt_failed", detail="no live node of the saved gang; relaunching with the run's history")
        c.platform.exclude(list(c.history.excluded))
        slots = [s for s in c.platform.slots() if s not in c.history.excluded]
        n = c.cfg.nodes
        size = gang_size(len(slots), n.min, n.max, c.cfg.nproc_per_node, n.world_sizes, n.world_size_multiple_of)
        if size is None:
            c.finish(JobPhase.STOPPED_NO_CAPACITY,
                     f"{len(slots)} node slots and no node count in [{n.min}, {n.max}] with a world size the job "
                     f"accepts (world_sizes={list(n.world_sizes)}, multiple of {n.world_size_multiple_of})")
            return
        await c.look_at_checkpoints()
        pick = c.choose_checkpoint()
        if isinstance(pick, Stop):
            c.finish(pick.phase, pick.reason)
            return
        c.require_checkpoint = c.history.had_checkpoint and not c.cfg.restart.allow_fresh_start
        if not await self.check_workers(slots[:size]):
            return
        # the loop's task (its pods may wait minutes for a node); a restart a previous controller
        # began (what it left may still hold the slots for a moment) is retried like any relaunch
        ex = c.executor
        ex.start_launch(ex.launch_retrying(slots[:size], pick, None) if saved else ex.launch(slots[:size], pick))

    async def check_workers(self, nodes: list[str]) -> bool:
        """Ask the cluster, before anything is made, whether it accepts the workers as the first
        launch would make them (:meth:`~supervisor.platforms.base.Platform.check_workers`).
        Refused: the job stops at once with the cluster's own words (no restart fixes a pod spec
        the cluster forbids) and returns False."""
        c = self.c
        try:
            warnings = await c.platform.check_workers(c.executor.launch_spec(nodes))
        except PlatformError as exc:
            log.error("event=workers_refused error=%s", exc)
            c.event("workers_refused", error=str(exc))
            c.finish(JobPhase.STOPPED_STARTUP_FAILURE, str(exc))
            return False
        for w in warnings:
            log.warning("event=preflight_warning %s", w)
            c.event("preflight_warning", warning=w)
        return True

    def adopt(self, saved: dict, *, save: bool = True) -> None:
        c = self.c
        self.take_over(saved)
        c.launched_at = c.clock()
        c.phase = JobPhase.STARTING
        c.event("adopted", attempt=c.attempt, nodes=c.nodes)
        log.info("event=adopted attempt=%d nodes=%s (the running gang was not touched)", c.attempt, c.nodes)
        if save:
            c.save_state()

    def resume_recovery(self, saved: dict, *, gang_found: bool) -> None:
        """Go on with the recovery the saved state was in (:func:`~.recovery.resume`), with its
        restart's timer: the gang, where it was found, is adopted first."""
        c = self.c
        # an adopted gang's ranks are heard again within a heartbeat interval or two: their stacks
        # are asked for, and an abort sent, once their reply addresses are known
        rec = recovery_step.resume(c.recovery, gang_found=gang_found, now=c.clock(),
                                   hold_s=2 * c.cfg.heartbeat.interval_s + 0.5)
        t = RestartTimer.from_saved(saved["restart_timer"], c.from_unix) if saved.get("restart_timer") else None
        c.recovery = rec
        c.executor.in_place = None
        c.phase = JobPhase.RECOVERING
        fault = rec.fault
        c.restarts.begin(fault, c.attempt, t, unix=c.to_unix(t.detected_at) if t is not None else time.time(),
                         culprits=[(r, ",".join(fault.nodes)) for r in fault.ranks or (-1,)])
        if not gang_found:
            c.platform.exclude(list(c.history.excluded))
        log.warning("event=recovery_resumed attempt=%d kind=%s stage=%s rung=%d gang_found=%s", c.attempt,
                    rec.fault.kind, rec.stage.value, rec.rung, gang_found)
        c.event("recovery_resumed", attempt=c.attempt, kind=rec.fault.kind, stage=rec.stage.value, rung=rec.rung,
                gang_found=gang_found, detail="the previous controller stopped in the middle of this recovery; "
                "this one finishes it from that stage")
        c.save_state()

    def take_over(self, saved: dict) -> None:
        """The saved run's attempt, launch and history, taken over by this controller."""
        c = self.c
        c.state = c.state.continued(saved, c.from_unix)
        if saved.get("capacity_since") is not None:  # its gang was waiting for capacity: the wait goes on
            # (never from the future: another host's clock ahead of this one's would lengthen the limit)
            c.capacity_since = c.from_unix(min(saved["capacity_since"], time.time()))
            c.capacity_message = saved.get("capacity_message", "")
        c.wire.launch_ids.append(c.launch_id)  # the running ranks' launch: only its frames are theirs
        c.skip_steps = c.history.skip_steps
        attempt = c.attempt
        c.require_checkpoint = c.history.had_checkpoint and not c.cfg.restart.allow_fresh_start
        c.registry.reset(attempt, len(c.nodes) * c.cfg.nproc_per_node)
