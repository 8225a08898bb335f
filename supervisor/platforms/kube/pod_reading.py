"""What one pod's status says, named as the supervisor acts on it: plain data in, a reading out.

The Kubernetes platform turns each watched pod into :class:`PodFacts` (the fields of
``status`` a cluster really sets: ``phase``, ``reason``/``message``, the conditions, each
container's ``state.waiting``/``state.terminated``, ``spec.schedulingGates``) and asks
:func:`read_pod` what it is. The table in ``docs/kubernetes.md`` ("What the cluster says")
lists every reading, what the controller does with it, how long it waits and the exit code.

No I/O, no clock, no client library: table-tested in ``tests/test_pod_reading.py``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Reading(str, enum.Enum):
    STARTING = "starting"
    """Scheduled and on its way (pulling, creating): not yet running, nothing wrong."""
    RUNNING = "running"
    WAITING_FOR_CAPACITY = "waiting_for_capacity"
    """The scheduler cannot place it (``PodScheduled=False``: Unschedulable) or a gate holds it
    (``SchedulingGated``): not a fault, the cluster is full."""
    CANNOT_START = "cannot_start"
    """The kubelet cannot start its container (image pull, missing Secret, bad container
    config): the same pod will never start; a relaunch of the same spec neither."""
    OUT_OF_MEMORY = "out_of_memory"
    """A container was killed for its memory limit (``terminated.reason: OOMKilled``)."""
    REJECTED_BY_NODE = "rejected_by_node"
    """The kubelet refused it at admission (``status.reason`` ``OutOf<resource>``,
    ``UnexpectedAdmissionError``): the node is not what the scheduler thought."""
    EVICTED = "evicted"
    """Evicted for node pressure (``status.reason: Evicted``, or the kubelet's
    ``DisruptionTarget``/``TerminationByKubelet`` while it runs): lost, not a bad node."""
    DISRUPTED = "disrupted"
    """``DisruptionTarget``: a preemption, an API eviction, the taint manager."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Its container exited with a failure code (the agent's own account says why)."""


CANNOT_START_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "PreCreateHookError",
    "PreStartHookError",
})
"""``containerStatuses[].state.waiting.reason`` values after which the container does not start
by waiting (``ContainerCreating`` and ``PodInitializing`` are on their way; ``RegistryUnavailable``
is the registry's trouble, not the job's: it waits, bounded by the startup timeout)."""
TRANSIENT_PULL = re.compile(r"toomanyrequests|too many requests|\b429\b|rate limit|i/o timeout|TLS handshake timeout|"
                            r"connection reset|connection refused|\b50[234]\b|service unavailable|"
                            r"context deadline exceeded", re.IGNORECASE)
"""A pull error that says the registry is busy or unreachable for now (rate limits, timeouts,
5xx), not that the image does not exist or cannot be had: it waits like RegistryUnavailable."""
ADMISSION_REASONS = frozenset({"UnexpectedAdmissionError", "NodeAffinity", "NodeSelectorMismatching",
                               "InvalidNodeInfo", "Taint", "NodeShutdown"})
"""``status.reason`` of a pod the kubelet refused to run (besides ``OutOf<resource>``).
NodeShutdown: admitted while the node was shutting down."""
SCHEDULING_GATED = "SchedulingGated"
UNSCHEDULABLE = "Unschedulable"
OOM_KILLED = "OOMKilled"
EVICTED = "Evicted"
TERMINATION_BY_KUBELET = "TerminationByKubelet"


@dataclass(frozen=True)
class ContainerFacts:
    name: str = ""
    waiting_reason: str = ""
    waiting_message: str = ""
    terminated_reason: str = ""
    terminated_message: str = ""
    exit_code: int | None = None
    """``state.terminated.exitCode`` (None while not terminated)."""
    memory_limit: str = ""
    """``resources.limits.memory`` of the container's spec, for the message."""


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class PodFacts:
    phase: str = ""
    reason: str = ""
    message: str = ""
    conditions: tuple[Condition, ...] = ()
    scheduling_gates: tuple[str, ...] = ()
    containers: tuple[ContainerFacts, ...] = ()
    node_name: str = ""


@dataclass(frozen=True)
class PodReading:
    kind: Reading
    reason: str = ""
    """The cluster's own word for it (``Unschedulable``, ``ErrImagePull``, ``OOMKilled``...)."""
    message: str = ""
    """The cluster's own message (the scheduler's, the kubelet's), or the supervisor's summary."""
    exit_code: int | None = None
    container: str = ""
    memory_limit: str = ""


def _condition(facts: PodFacts, kind: str) -> Condition | None:
    return next((c for c in facts.conditions if c.type == kind), None)


def is_admission_reject(reason: str) -> bool:
    return reason.startswith("OutOf") or reason in ADMISSION_REASONS


def read_pod(facts: PodFacts) -> PodReading:
    """The reading of one pod's status (see :class:`Reading`), most specific first: what the
    kubelet refused or killed it for, then a disruption, then how it ended, then why it waits."""
    if facts.phase == "Failed" and is_admission_reject(facts.reason):
        return PodReading(Reading.REJECTED_BY_NODE, facts.reason, facts.message or facts.reason)
    if facts.reason == EVICTED:
        return PodReading(Reading.EVICTED, EVICTED, facts.message or "evicted by the kubelet")
    for c in facts.containers:
        if c.terminated_reason == OOM_KILLED:
            limit = f", memory limit {c.memory_limit}" if c.memory_limit else ""
            return PodReading(Reading.OUT_OF_MEMORY, OOM_KILLED,
                              f"container {c.name} OOMKilled (exit code {c.exit_code}{limit})",
                              exit_code=c.exit_code, container=c.name, memory_limit=c.memory_limit)
    disruption = _condition(facts, "DisruptionTarget")
    if disruption is not None and disruption.status == "True":
        kind = Reading.EVICTED if disruption.reason == TERMINATION_BY_KUBELET else Reading.DISRUPTED
        return PodReading(kind, disruption.reason or "DisruptionTarget", disruption.message)
    if facts.phase in ("Succeeded", "Failed"):
        code = next((c.exit_code for c in facts.containers if c.exit_code is not None), None)
        reason = next((c.terminated_reason for c in facts.containers if c.terminated_reason), facts.reason)
        return PodReading(Reading.SUCCEEDED if facts.phase == "Succeeded" else Reading.FAILED, reason,
                          facts.message, exit_code=code)
    for c in facts.containers:
        transient = c.waiting_reason in ("ErrImagePull", "ImagePullBackOff") and TRANSIENT_PULL.search(c.waiting_message)
        if c.waiting_reason in CANNOT_START_REASONS and not transient:
            return PodReading(Reading.CANNOT_START, c.waiting_reason,
                              c.waiting_message or c.waiting_reason, container=c.name)
    if facts.phase == "Running":
        return PodReading(Reading.RUNNING)
    scheduled = _condition(facts, "PodScheduled")
    if facts.scheduling_gates or (scheduled is not None and scheduled.reason == SCHEDULING_GATED):
        gates = ", ".join(facts.scheduling_gates)
        return PodReading(Reading.WAITING_FOR_CAPACITY, SCHEDULING_GATED,
                          (scheduled.message if scheduled is not None and scheduled.message else
                           f"held by scheduling gates: {gates}" if gates else "held by scheduling gates"))
    if scheduled is not None and scheduled.status == "False" and not facts.node_name:
        return PodReading(Reading.WAITING_FOR_CAPACITY, scheduled.reason or UNSCHEDULABLE,
                          scheduled.message or "the scheduler cannot place it")
    return PodReading(Reading.STARTING)
