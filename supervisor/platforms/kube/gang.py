"""Gang admission (``platform.kubernetes.gang``; the chart's ``workers.gang``): what each mode
puts on an attempt's worker pods and which pod-group object it makes. Pure: names, labels and
bodies in, no client, no I/O (table-tested in ``tests/test_kube_gang.py``).

* ``none``: pods go to the default scheduler one by one.
* ``kueue``: each attempt's pods are one Kueue pod group (Kueue's plain-pod integration): label
  ``kueue.x-k8s.io/pod-group-name`` (per attempt), annotation
  ``kueue.x-k8s.io/pod-group-total-count`` (the gang's pod count) and label
  ``kueue.x-k8s.io/queue-name`` (the LocalQueue). Kueue's webhook gates each pod
  (``kueue.x-k8s.io/admission``) and Kueue lifts the gate once the whole group is admitted.
  A group Kueue evicts (preemption) gets the pod condition ``TerminationTarget`` (reason
  ``WorkloadEvicted...``) and its pods are deleted gracefully.
* ``volcano``: a ``scheduling.volcano.sh/v1beta1`` PodGroup per attempt (``minMember`` = the
  gang, ``queue``, ``priorityClassName``), created before its pods; the pods name it in the
  annotation ``scheduling.k8s.io/group-name`` and go to ``schedulerName: volcano``.
* ``coscheduling`` (kubernetes-sigs/scheduler-plugins): a ``scheduling.x-k8s.io/v1alpha1``
  PodGroup per attempt (``minMember``), pods labelled ``scheduling.x-k8s.io/pod-group`` and
  sent to the scheduler that runs the plugin (``scheduler-plugins-scheduler`` by default).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from supervisor.config import ConfigError

NONE, KUEUE, VOLCANO, COSCHEDULING = "none", "kueue", "volcano", "coscheduling"
MODES = (NONE, KUEUE, VOLCANO, COSCHEDULING)

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_STOP_CONDITION = "TerminationTarget"
"""The pod condition Kueue's pod controller sets on each pod of a workload it stops, before it
deletes the pod; its reason is ``WorkloadEvicted`` or ``WorkloadEvictedDueTo<why>`` (``Preempted``,
``PodsReadyTimeout``...)."""
KUEUE_PREEMPTED = "WorkloadEvictedDueToPreempted"
"""The one Kueue eviction that is the queue taking the gang back to admit it again: another
workload's priority. The others are not: ``...PodsReadyTimeout`` (the pods never became Ready:
the job's own fault), ``...Deactivated`` and ``...ClusterQueueStopped``/``...LocalQueueStopped``
(an administrator's stop, which a relaunch must not undo), ``...AdmissionCheck``; their pods are
lost as any deleted pod is."""
KUEUE_RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
"""``"false"`` on every pod of a group: the controller never replaces a pod inside a group (each
attempt is a new group), so once the group's pods have all ended Kueue finishes its Workload,
releases its quota and lifts its finalizers. Without it Kueue waits for replacement pods: the old
attempt's pods stay Terminating and its Workload keeps the quota the next attempt needs."""

VOLCANO_API = ("scheduling.volcano.sh", "v1beta1", "podgroups")
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_API = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class GangConfig:
    """``platform.kubernetes.gang``: how an attempt's pods are admitted together."""

    mode: str = NONE
    """``none``, ``kueue``, ``volcano`` or ``coscheduling``."""
    queue: str = ""
    """kueue: the LocalQueue in the job's namespace (required); volcano: the Queue (empty:
    Volcano's ``default``); not used otherwise."""
    priority_class: str = ""
    """volcano: the PodGroup's ``priorityClassName`` (empty: the workers' priority class)."""
    scheduler_name: str = ""
    """volcano and coscheduling: the scheduler the pods go to (empty: ``volcano``,
    ``scheduler-plugins-scheduler``)."""

    def __post_init__(self) -> None:
        where = "platform.kubernetes.gang"
        if self.mode not in MODES:
            raise ConfigError(f"{where}.mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode == KUEUE and not self.queue:
            raise ConfigError(f"{where}.queue: required with mode kueue (the LocalQueue the pods are queued in)")
        if self.queue:
            if self.mode not in (KUEUE, VOLCANO):
                raise ConfigError(f"{where}.queue: only with mode kueue or volcano (mode is {self.mode})")
            if len(self.queue) > 63 or not _NAME.fullmatch(self.queue):
                raise ConfigError(f"{where}.queue: {self.queue!r} is not a queue name (a DNS label: lowercase "
                                  "alphanumerics and '-', at most 63 characters)")
        if self.priority_class:
            if self.mode != VOLCANO:
                raise ConfigError(f"{where}.priority_class: only with mode volcano (mode is {self.mode})")
            if len(self.priority_class) > 253 or not _NAME.fullmatch(self.priority_class.replace(".", "-")):
                raise ConfigError(f"{where}.priority_class: {self.priority_class!r} is not a PriorityClass name")
        if self.scheduler_name:
            if self.mode not in (VOLCANO, COSCHEDULING):
                raise ConfigError(f"{where}.scheduler_name: only with mode volcano or coscheduling "
                                  f"(mode is {self.mode})")
            if len(self.scheduler_name) > 253 or not _NAME.fullmatch(self.scheduler_name.replace(".", "-")):
                raise ConfigError(f"{where}.scheduler_name: {self.scheduler_name!r} is not a scheduler name")

    @property
    def enabled(self) -> bool:
        return self.mode != NONE

    @property
    def scheduler(self) -> str:
        """The pods' ``schedulerName`` ("" : the cluster's default)."""
        if self.mode == VOLCANO:
            return self.scheduler_name or VOLCANO_SCHEDULER
        if self.mode == COSCHEDULING:
            return self.scheduler_name or COSCHEDULING_SCHEDULER
        return ""

    @property
    def api(self) -> tuple[str, str, str] | None:
        """(group, version, plural) of the PodGroup this mode makes per attempt; None: none."""
        return VOLCANO_API if self.mode == VOLCANO else COSCHEDULING_API if self.mode == COSCHEDULING else None


def owned_by_gang(cfg: GangConfig, labels: dict, annotations: dict, scheduler_name: Any) -> list[tuple[str, str]]:
    """What a pod template or the worker values set that the chosen mode sets itself:
    ``(where, why)``, for a refusal naming the field."""
    out = []
    keys = {KUEUE: ([KUEUE_QUEUE_LABEL, KUEUE_GROUP_LABEL], [KUEUE_COUNT_ANNOTATION, KUEUE_RETRIABLE_ANNOTATION]),
            VOLCANO: ([], [VOLCANO_GROUP_ANNOTATION]),
            COSCHEDULING: ([COSCHEDULING_GROUP_LABEL], [])}.get(cfg.mode, ([], []))
    for key in keys[0]:
        if key in labels:
            out.append((f"labels.{key}", f"set by gang mode {cfg.mode}"))
    for key in keys[1]:
        if key in annotations:
            out.append((f"annotations.{key}", f"set by gang mode {cfg.mode}"))
    if cfg.scheduler and scheduler_name not in (None, cfg.scheduler):
        out.append(("spec.schedulerName", f"{scheduler_name!r}: gang mode {cfg.mode} sends the pods to "
                                          f"{cfg.scheduler!r} (set gang.scheduler_name)"))
    return out


def group_name(base: str, attempt: int) -> str:
    """The attempt's pod group: unique per release (``base`` carries the release's hash) and attempt."""
    return f"{base}-a{attempt}"


def pod_fields(cfg: GangConfig, group: str, size: int) -> tuple[dict[str, str], dict[str, str], str]:
    """(labels, annotations, schedulerName) that put a worker pod into the attempt's ``group`` of
    ``size`` pods; empty for mode none."""
    if cfg.mode == KUEUE:
        return ({KUEUE_QUEUE_LABEL: cfg.queue, KUEUE_GROUP_LABEL: group},
                {KUEUE_COUNT_ANNOTATION: str(size), KUEUE_RETRIABLE_ANNOTATION: "false"}, "")
    if cfg.mode == VOLCANO:
        return {}, {VOLCANO_GROUP_ANNOTATION: group}, cfg.scheduler
    if cfg.mode == COSCHEDULING:
        return {COSCHEDULING_GROUP_LABEL: group}, {}, cfg.scheduler
    return {}, {}, ""


def pod_group(cfg: GangConfig, name: str, namespace: str, size: int, *, labels: dict[str, str],
              owner: list[dict] | None = None, priority_class: str = "") -> dict | None:
    """The PodGroup object of an attempt (volcano, coscheduling), or None (no object: none, kueue,
    whose Workload Kueue makes itself from the pods). ``priority_class``: the workers' own, the
    default of a Volcano group's."""
    api = cfg.api
    if api is None:
        return None
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner:
        meta["ownerReferences"] = [dict(o) for o in owner]
    spec: dict[str, Any] = {"minMember": size}
    if cfg.mode == VOLCANO:
        spec["queue"] = cfg.queue or "default"
        if cfg.priority_class or priority_class:
            spec["priorityClassName"] = cfg.priority_class or priority_class
    return {"apiVersion": f"{api[0]}/{api[1]}", "kind": "PodGroup", "metadata": meta, "spec": spec}


def requeued(cfg: GangConfig, condition_type: str, reason: str) -> bool:
    """Whether a pod condition (``True``) says the gang's admission took the whole group back, to
    admit it again later: Kueue preempted its workload (``TerminationTarget``/
    ``WorkloadEvictedDueToPreempted``; :data:`KUEUE_PREEMPTED`), or, for a group under a gang
    scheduler, the scheduler preempted it. Not a fault of the job."""
    if cfg.mode == KUEUE:
        return condition_type == KUEUE_STOP_CONDITION and reason == KUEUE_PREEMPTED
    if cfg.mode in (VOLCANO, COSCHEDULING):
        return condition_type == "DisruptionTarget" and reason == PREEMPTION_BY_SCHEDULER
    return False
