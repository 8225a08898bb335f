"""The plain types the pure decisions take: what a platform reports of a node, and why a rank
ended.

Platforms build these values and the controller's decisions (``controller.decide``) read them;
neither owns them, so the pure layer imports this module, never ``supervisor.platforms``
(``.importlinter`` says so). Values only: no I/O, no clock, no platform.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NodeState(str, enum.Enum):
    RUNNING = "running"
    EXITED = "exited"      # the agent ended; see exit_code
    LOST = "lost"          # gone without an exit code we could read (killed, adopted and vanished)


WAIT_CAPACITY = "capacity"
"""``NodeStatus.waiting``: the cluster cannot place the node now (no free GPUs, quota, a
scheduling gate). Not a fault and not a failed attempt: the job waits, bounded."""
WAIT_CANNOT_START = "cannot_start"
"""``NodeStatus.waiting``: the node will never start as specified (its image cannot be pulled,
a Secret it needs is missing): a startup failure, at once."""


RENDEZVOUS_BACKENDS = ("auto", "c10d", "static")
"""``platform.rendezvous_backend``: how a launch's agents form the gang (``auto``: the
controller chooses by the gang's size, :func:`supervisor.controller.decide.rendezvous_backend`)."""


@dataclass(frozen=True)
class RankFailure:
    rank: int
    exit_code: int
    """The worker's exit code; negative: killed by that signal."""
    error: str = ""
    """The rank's own last error line, when its output has one."""
    root_cause: bool = False
    """torchrun's "first observed failure" (the others were mostly stopped by the agent)."""


@dataclass(frozen=True)
class NodeStatus:
    name: str
    attempt: int
    state: NodeState
    exit_code: int | None = None
    """0 success; > 0 the agent's failure code; < 0 killed by that signal."""
    killed_by_us: bool = False
    pid: int | None = None
    stopped: bool = False
    """The agent process is stopped (SIGSTOP / frozen), as far as the platform can tell."""
    failures: tuple[RankFailure, ...] = ()
    """A failed agent's ranks as its own output tells them (root cause first): exit code or
    signal, and each rank's last error line. Empty when unknown."""
    output_error: str = ""
    """The last error line of a failed node's output when it names no rank (e.g. the command
    could not start)."""
    host: str = ""
    """The machine the node ran on (Slurm node, Kubernetes node): the failure domain a node-level
    fault counts against and exclusion excludes. Empty: the slot is its own machine."""
    detail: str = ""
    """What the platform saw, for the event (e.g. "evicted: DisruptionTarget EvictionByEvictionAPI")."""
    exited_pids: tuple[int, ...] = ()
    """Rank processes of this node that ended while its agent runs on (an agent allowed to
    restart in place restarts them), where the platform can see them; oldest first."""
    exit_codes: tuple[tuple[int, int, float], ...] = ()
    """``(pid, exit status, when)`` of those ended rank processes whose agent recorded how they
    ended (:data:`~supervisor.protocol.Env.RANK_EXITS`; the local platform), oldest first; a
    status below 0 is the signal that killed it; ``when`` is the agent's wall clock. An agent
    that may not restart in place exits because of such an end, ~1 s later."""
    waiting: str = ""
    """Why a node that has not ended (state RUNNING) is not running yet, where the platform can
    tell: :data:`WAIT_CAPACITY` or :data:`WAIT_CANNOT_START`; "" when it runs or is on its way."""
    reason: str = ""
    """The platform's own word for what it saw (Kubernetes: ``Unschedulable``, ``ErrImagePull``,
    ``OOMKilled``, ``OutOfnvidia.com/gpu``, ``Evicted``); ``detail`` holds its message."""
    out_of_memory: bool = False
    """The node's container was killed for its memory limit: a rank's fault (a memory bug or a
    batch too large), never the machine's."""
    bad_host: bool = False
    """The machine itself refused the node (a kubelet's admission reject: its devices are not
    what the scheduler saw): exclude it now, whatever ``restart.exclude_node_after`` says."""
    requeued: bool = False
    """The cluster's gang admission took the whole gang back to admit it again later (Kueue evicted
    its workload for a preemption; a gang scheduler preempted its group): not a fault of the job or
    of a machine, and no restart is spent on it; the ranks got their SIGTERM grace to save."""
    image_id: str = ""
    """The image the node runs, by digest, as its runtime reports it once pulled (Kubernetes:
    the container status's ``imageID``); "" where unknown. A rollback runs exactly that image."""
