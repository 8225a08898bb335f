"""The Platform contract: one interface for local process groups, Slurm steps and pods.

A *node* is one torchrun agent and its local ranks. The controller asks a platform to
launch a gang of N named nodes for attempt k, to report each node's state, to kill one node,
to tear the whole gang down, and for the node slots it could use (healthy capacity minus
exclusions). Platforms raise :class:`PlatformError` (retry later) for scheduler trouble;
they never raise a subprocess or client library exception into the controller.
"""

from __future__ import annotations

import abc
import asyncio
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

# the plain types a platform reports in (the pure decisions read them from supervisor.model)
from supervisor.model import WAIT_CANNOT_START, WAIT_CAPACITY, NodeState, NodeStatus, RankFailure  # noqa: F401
from supervisor.procfs import pids_with_env
from supervisor.protocol import Env


class PlatformError(RuntimeError):
    """The platform could not do what was asked (a scheduler command failed or timed out)."""


class LaunchRefused(PlatformError):
    """The cluster refuses the launch for good, as it is configured (a quota that can never hold the
    gang): no retry can change it, so the job stops, as when the workers' dry run is refused."""


@dataclass(frozen=True)
class LaunchSpec:
    attempt: int
    nodes: Sequence[str]
    nnodes_min: int
    nnodes_max: int
    nproc_per_node: int
    command: Sequence[str]
    env: Mapping[str, str]
    rdzv_endpoint: str
    """``host:port`` of the c10d store, from :meth:`Platform.rendezvous_endpoint`."""
    rdzv_id: str
    max_restarts: int = 0
    """How often each node's agent may restart its ranks in place (torchrun's ``--max-restarts``);
    0: a failed rank ends its agent, and recovery is the controller's alone."""
    fork_ranks: bool = True
    """Python ranks start forked from their agent, torch already imported
    (:mod:`supervisor.platforms.node.forking_agent`); False: a new interpreter each, as under torchrun."""
    check_command: bool = False
    """Each node's agent checks the command where its ranks run before it starts them
    (:mod:`supervisor.preflight`), the controller could not (:attr:`Platform.checks_command_here`)."""
    image: str = ""
    """The worker image this launch runs, where the platform runs images ("": the configured one;
    a rollback to an earlier release names that release's)."""
    rendezvous: str = "c10d"
    """How the agents form the gang: ``c10d`` (torch's dynamic rendezvous: each agent joins by
    compare-and-set on one store) or ``static`` (each agent is told its node rank and connects
    once; :func:`supervisor.controller.decide.rendezvous_backend` chooses)."""


class Supervised(Protocol):
    """What a platform's :meth:`Platform.supervise` may use of the controller it runs (the
    platforms layer does not import the controller)."""

    requeue_planned: bool
    handed_off: bool

    async def run(self) -> int: ...

    def event(self, name: str, /, **fields: Any) -> None: ...

    def request_stop(self, sig: Any) -> None: ...

    async def serve_ended(self, until: asyncio.Event) -> None: ...


class LockOwner:
    """Who a controller is, for the job's lock (``controller.state.JobLock``): the default is a
    process on a host; a scheduler adds the fields that name its run of the job, and says when a
    newer run of the same job supersedes the holder recorded (Slurm: a requeue)."""

    def fields(self) -> dict[str, Any]:
        """What the owner record carries beside host, boot id and pid."""
        return {}

    def supersedes(self, held: dict[str, Any]) -> str:
        """Why this controller's run replaces the holder ``held`` records, at once ('' when it does not)."""
        return ""

    def describe(self, held: dict[str, Any]) -> str:
        """The holder ``held`` records, for a message."""
        return f"host {held.get('host')}, pid {held.get('pid')}"

    def stop_hint(self, held: dict[str, Any]) -> str:
        """How a person stops that holder."""
        return f"SIGTERM to pid {held.get('pid')} on {held.get('host')}"


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Platform(abc.ABC):
    kind: str = "abstract"
    hands_off_on_sigterm: bool = False
    """SIGTERM to the controller means its own replacement (a Kubernetes pod), not "stop the job":
    it leaves the gang running for the next controller to adopt."""
    reruns_finished: bool = True
    """A controller started on a finished run starts a new one (a command run again). False: it
    reports the verdict and does nothing (a Deployment restarting what exited)."""
    kills_ranks: bool = False
    """The platform can SIGKILL one rank process and leave its node's agent running
    (:meth:`kill_ranks`): a silent rank on a healthy node can then be restarted in place."""
    checks_command_here: bool = True
    """The controller shares the workers' environment (local, Slurm), so its preflight checks the job's
    command. False (Kubernetes: the controller's image is not the workers'): it checks only what it
    sees (the checkpoint root), and each node's agent checks the command where its ranks run
    (``LaunchSpec.check_command``), ending with ``EXIT_PREFLIGHT`` when it fails."""

    @abc.abstractmethod
    async def launch(self, spec: LaunchSpec) -> None:
        """Start one agent per node of ``spec.nodes`` for ``spec.attempt``."""

    @abc.abstractmethod
    async def observe(self) -> dict[str, NodeStatus]:
        """The current attempt's nodes and their states."""

    @abc.abstractmethod
    async def kill_node(self, name: str) -> None:
        """Kill one node of the current gang at once (all its processes)."""

    async def kill_ranks(self, name: str, pids: Sequence[int]) -> bool:
        """SIGKILL these rank processes of node ``name`` (pids their heartbeats gave), leaving its
        agent running; False when the platform cannot (:attr:`kills_ranks`) or a pid is not
        one of that node's ranks (never signal a stranger)."""
        return False

    @abc.abstractmethod
    async def teardown(self, grace_s: float) -> None:
        """End every node of the current gang: SIGTERM, ``grace_s``, then SIGKILL; wait until gone."""

    @abc.abstractmethod
    def slots(self) -> list[str]:
        """Every node slot this platform knows (healthy or not, excluded or not)."""

    # ---------------------------------------------------------------- what the platform owns
    # (defaults fit a platform whose nodes reach the controller's host directly)
    def rendezvous_endpoint(self, attempt: int, host: str) -> str:
        """``host:port`` the agents of ``attempt`` rendezvous at; ``host`` is ``platform.host``."""
        return f"{host}:{free_port(host)}"

    def controller_address(self, bind_host: str) -> str:
        """The address ranks dial to reach the controller listening on ``bind_host``."""
        return bind_host

    def job_token(self) -> bytes | None:
        """The job token when the platform provides it (a Kubernetes Secret of the release's);
        None: the controller makes and keeps its own."""
        return None

    def token_env(self, token_path: Path) -> dict[str, str]:
        """How the job token reaches the ranks: a file on a filesystem they share with the controller."""
        return {Env.TOKEN_FILE: str(token_path)}

    def exclude(self, hosts: Sequence[str]) -> None:
        """The machines the next launches must avoid (``slots()`` already leaves them out when the
        slots are the machines)."""

    def warm_up(self) -> list[int]:
        """A launch is coming (the job starts, or a fault was just found), or may come (the gang
        has run a while): start ahead whatever can be started before it is needed (the local
        platform: an agent per slot that has imported torch). Must not block; a platform without
        such a thing does nothing. Returns the pids of what now waits (for the events)."""
        return []

    async def check_workers(self, spec: LaunchSpec) -> list[str]:
        """Ask the cluster whether it would accept the workers ``spec`` makes, making nothing (a
        Kubernetes server-side dry run: schema, admission, PodSecurity, quota). Raises
        :class:`PlatformError` with the cluster's own words when it refuses them; returns warnings
        (a refusal that may pass later: a quota others use now). A platform that cannot ask
        accepts."""
        return []

    async def probe_capacity(self, slots: Sequence[str]) -> None:
        """The gang runs without these slots because the cluster could not place them: watch for
        the capacity to come back (:meth:`capacity_returned`). A platform that cannot tell does
        nothing (its gang grows back at the next relaunch, if the slots are free then)."""

    def capacity_returned(self) -> list[str]:
        """Slots given to :meth:`probe_capacity` that the cluster could place now (each said
        once; the probe is gone by then, its resources free for the gang)."""
        return []

    async def serving(self, api: str) -> None:
        """The controller holds the job and answers at ``api`` (``http://ADDR:PORT``, its
        ``/healthz``) from now until it ends, before anything is launched: a platform may start
        what watches it for the job's life (Slurm: a standing node guard per node). Must not raise."""

    def prepare(self, cfg: Any) -> Any:
        """The job config with anything only the platform knows filled in (e.g. ``auto`` addresses)."""
        return cfg

    def banner(self, cfg: Any) -> str:
        """One line for stderr at start: where the job runs and where to look."""
        return (f"supervisor: job {cfg.job}: {cfg.nodes.min}-{cfg.nodes.max} nodes x {cfg.nproc_per_node} on "
                f"{self.kind} (slots: {self.slots()}); events and state in {cfg.log_dir}")

    async def supervise(self, job: Supervised) -> int:
        """Run the controller; a platform wraps it with what it needs (signals, leader election)."""
        return await job.run()

    def elected(self) -> str:
        """How the platform's own leader election made this controller the job's one actor (e.g.
        the Kubernetes Lease it holds), or "" without one. The job's file lease of a controller
        elected before it is then taken over at once."""
        return ""

    def tell(self, name: str, fields: dict) -> None:
        """Hear one event the controller recorded (``events.jsonl``'s record): a platform may show
        it where its users look (Kubernetes Events on the pods). Must not block or raise."""

    def notices(self) -> list[tuple[str, dict]]:
        """Events the platform found when it started, for the controller's events.jsonl (e.g. the
        previous controller of this job was lost and the job requeued)."""
        return []

    def describe(self) -> dict:
        """What the state file needs to adopt the running gang after a controller restart."""
        return {}

    def release_parts(self) -> dict[str, str] | None:
        """What identifies the code the ranks run, where the platform knows it (Kubernetes: the
        worker image and the pod template); None: the controller hashes the code folder on the
        filesystem it shares with the ranks (local, Slurm) and snapshots it for a rollback."""
        return None

    def lock_owner(self) -> LockOwner:
        """This controller as the job's lock records it (who holds the job, and whether a newer run
        of it supersedes the one recorded)."""
        return LockOwner()

    async def adopt(self, saved: dict, attempt: int) -> bool:
        """Re-attach to a gang described by :meth:`describe`; False if nothing is left to adopt."""
        return False

    def stop_strays(self, rank_log_dir: Path) -> list[int]:
        """``--fresh`` over a run whose state is unreadable or another job's: SIGKILL every process
        on this host whose environment names ``rank_log_dir`` (an earlier gang's agents and ranks,
        with their process groups); returns their pids. What runs elsewhere is stopped through
        :meth:`adopt` and :meth:`teardown` from the old state where it can be read."""
        pids = pids_with_env(Env.LOG_DIR, str(rank_log_dir))
        for pid in pids:
            for target in (lambda: os.killpg(os.getpgid(pid), signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    target()
                except OSError:
                    pass
        return pids
