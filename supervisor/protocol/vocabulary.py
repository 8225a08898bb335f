"""The worker <-> controller contract beyond the frame, defined here once: the phases a rank
reports, which of them are timed, the exit codes a rank ends with, the phases of a restart, and
the environment variables a rank is started with."""

from __future__ import annotations

# A rank's phase (Heartbeat.phase; a heartbeat with any other name is rejected). These strings
# are on the wire, in SUPERVISOR_WATCHDOG, in events and in metric labels: never rename one.
PHASE_INIT = "init"
PHASE_RESTORE = "restore"
PHASE_DATA = "data"
PHASE_COMPUTE = "compute"
PHASE_COLLECTIVE = "collective"
PHASE_CHECKPOINT = "checkpoint"
PHASE_IDLE = "idle"
PHASE_DONE = "done"
PHASE_FAILED = "failed"
PHASE_TRAINING = "training"
"""A rank watched by the supervisor's own instrumentation (no SDK in the script): it has taken an
optimizer step and says nothing finer; its ``phase_s`` is the time since its last progress (a
step, a collective enqueued or completed). Timed by the controller with the compute timeout."""
PHASES = (PHASE_INIT, PHASE_RESTORE, PHASE_DATA, PHASE_COMPUTE, PHASE_COLLECTIVE, PHASE_CHECKPOINT, PHASE_IDLE,
          PHASE_DONE, PHASE_FAILED, PHASE_TRAINING)
# Who filled a heartbeat (Heartbeat.source): the worker SDK the script imports, or the
# instrumentation the supervisor installs in a rank whose script does not (torch's own records).
SOURCE_SDK, SOURCE_TORCH = "sdk", "torch"
SOURCES = ("", SOURCE_SDK, SOURCE_TORCH)
# The phases with a timeout, in this order: the rank's watchdog (SUPERVISOR_WATCHDOG, worker
# defaults) and the controller's detector (health.Timeouts) time exactly these. A rank that is
# idle between phases, done or failing is never stuck in a phase.
TIMED_PHASES = (PHASE_INIT, PHASE_RESTORE, PHASE_DATA, PHASE_COMPUTE, PHASE_COLLECTIVE, PHASE_CHECKPOINT)
# What a rank's restore came to: a checkpoint loaded, no checkpoint to load (a fresh start),
# or a failure (nothing that verifies when one was required, or a load error).
RESTORE_RESTORED, RESTORE_FRESH, RESTORE_FAILED = "restored", "fresh", "failed"
RESTORE_STATES = ("", RESTORE_RESTORED, RESTORE_FRESH, RESTORE_FAILED)
# How a rank that closed its SDK cleanly ended: its training finished, or it stopped early.
OUTCOME_FINISHED, OUTCOME_STOPPED = "finished", "stopped"
OUTCOMES = ("", OUTCOME_FINISHED, OUTCOME_STOPPED)
# Rank exit codes the SDK and the example use (one definition for worker and controller).
EXIT_CRASH = 17          # the drills' "crash" fault
EXIT_NONFINITE = 18      # every rank stops before the optimizer step on a non-finite loss
EXIT_PREEMPTED = 143     # 128 + SIGTERM: an emergency checkpoint was written; the scheduler may requeue
RANK_EXITS = {EXIT_CRASH: "crash", EXIT_NONFINITE: "nonfinite", EXIT_PREEMPTED: "preempted"}
"""Every rank exit code with a meaning, and the fault kind the controller names a rank that
ends with it (any other non-zero code is a plain ``rank_exit``)."""
EXIT_PREFLIGHT = 78
"""A node agent's own exit (not a rank's) when its check of the job's command where the ranks run
(:mod:`supervisor.preflight`) failed before it started any rank; its last output line says why.
sysexits' EX_CONFIG: a configuration no restart fixes."""
# A restart's phases, in order (controller clock): fault -> detected -> torn down -> scheduled
# -> rendezvous -> restored -> first step. The keys of the ``restart_complete`` event's phases
# and the ``phase`` label of supervisor_restart_phase_seconds; the benchmarks report the same.
RESTART_PHASES = ("detect", "teardown", "schedule", "rendezvous", "restore", "first_step")


class Env:
    """The environment variables through which the controller (via its platform) tells every rank
    where it belongs and whom to talk to; :class:`supervisor.worker.session.Session` reads them."""

    JOB = "SUPERVISOR_JOB"
    ATTEMPT = "SUPERVISOR_ATTEMPT"
    LAUNCH = "SUPERVISOR_LAUNCH"
    """The launch's random id (:func:`new_launch_id`): in every frame, checked on both sides. New
    for every launch; a rank restarted in place by its agent keeps its launch's."""
    NODE = "SUPERVISOR_NODE"
    HEARTBEAT_ADDR = "SUPERVISOR_HEARTBEAT_ADDR"
    HEARTBEAT_UPSTREAM = "SUPERVISOR_HEARTBEAT_UPSTREAM"
    """Set by a node agent that relays its ranks' heartbeats (:mod:`supervisor.platforms.node.relay`):
    the controller's address, while ``SUPERVISOR_HEARTBEAT_ADDR`` names the relay on the node."""
    AGGREGATE = "SUPERVISOR_AGGREGATE"
    """``off``: every rank sends its own heartbeats to the controller (``heartbeat.aggregate:
    false``); a number: each node's agent relays them, a frame per node this often (seconds:
    :func:`supervisor.controller.decide.relay_flush_s`); unset: a frame per heartbeat interval."""
    API = "SUPERVISOR_API"
    TOKEN = "SUPERVISOR_TOKEN"
    TOKEN_FILE = "SUPERVISOR_TOKEN_FILE"
    LOG_DIR = "SUPERVISOR_LOG_DIR"
    CHECKPOINT_DIR = "SUPERVISOR_CHECKPOINT_DIR"
    HEARTBEAT_INTERVAL = "SUPERVISOR_HEARTBEAT_INTERVAL"
    WATCHDOG = "SUPERVISOR_WATCHDOG"
    SKIP_STEPS = "SUPERVISOR_SKIP_STEPS"
    FAULT = "SUPERVISOR_FAULT"
    IN_PLACE = "SUPERVISOR_IN_PLACE"
    """Set (to the launch's in-place restart allowance) when the node agents restart ranks in
    place: a rank then counts its own restarts under its agent (its attempt is the launch's
    plus that count, the same on every rank, since an agent restarts its whole gang)."""
    INSTRUMENT = "SUPERVISOR_INSTRUMENT"
    """``off``: no instrumentation in the ranks (``instrument.enabled: false``); anything else, or
    unset: a rank whose script does not start the worker SDK is watched through torch's own
    records (:mod:`supervisor.worker.instrument`)."""
    FR_BUFFER = "SUPERVISOR_FR_BUFFER"
    """The flight recorder's ring size, in entries (``TORCH_FR_BUFFER_SIZE`` unless the job sets
    that itself); ``0`` leaves the recorder off."""
    RELEASE = "SUPERVISOR_RELEASE"
    """The id of the version the ranks run (:mod:`supervisor.controller.releases`): the worker
    SDK writes it into every checkpoint's manifest (``release``), so that a checkpoint a rejected
    release wrote is never restored."""
    AGENT_PID = "SUPERVISOR_AGENT_PID"
    """Set by the node agent to its own pid: the instrumentation starts in a process whose parent
    is the agent (a rank), never in a process a rank starts (a data loader worker, a tool)."""
    RANK_EXITS = "SUPERVISOR_RANK_EXITS"
    """A directory (set by a platform that can read it) where a node's agent records each rank
    process that ends, the moment it ends: a file named after its pid holding
    ``{"pid", "exit_code", "at"}`` (an exit code below 0 is the signal that killed it). The
    agent's own exit tells the same ~1 s later, after its shutdown."""
