"""Gang admission's pure parts (supervisor/platforms/kube/gang.py): what each mode puts on the
worker pods the controller builds (``KubernetesPlatform.worker_pod``, no cluster asked), the
PodGroup bodies, the config's refusals naming the field, and which pod condition says the queue
took the gang back."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes import client

from supervisor.config import ConfigError, from_dict
from supervisor.controller.decide import requeued
from supervisor.model import NodeState, NodeStatus
from supervisor.platforms.kube import gang
from supervisor.platforms.kube.gang import GangConfig
from test_kube_pod_template import job, platform, spec


def worker_pod(mode: dict, slot: str = "node-b", attempt: int = 3, **worker) -> dict:
    p = platform(job(worker, gang=mode))
    s = spec(attempt)
    return p.worker_pod(s, slot)


@pytest.mark.parametrize("mode, labels, annotations, scheduler", [
    ({}, {}, {}, None),
    ({"mode": "none"}, {}, {}, None),
    ({"mode": "kueue", "queue": "gpu-h100"},
     {"kueue.x-k8s.io/queue-name": "gpu-h100", "kueue.x-k8s.io/pod-group-name": "llama-a3"},
     {"kueue.x-k8s.io/pod-group-total-count": "2", "kueue.x-k8s.io/retriable-in-group": "false"}, None),
    ({"mode": "volcano"}, {}, {"scheduling.k8s.io/group-name": "llama-a3"}, "volcano"),
    ({"mode": "volcano", "scheduler_name": "volcano-gpu"}, {}, {"scheduling.k8s.io/group-name": "llama-a3"},
     "volcano-gpu"),
    ({"mode": "coscheduling"}, {"scheduling.x-k8s.io/pod-group": "llama-a3"}, {}, "scheduler-plugins-scheduler"),
])
def test_each_mode_puts_the_attempts_pods_into_one_group(mode, labels, annotations, scheduler):
    p = worker_pod(mode)
    got_labels = {k: v for k, v in p["metadata"]["labels"].items() if "kueue" in k or "scheduling" in k}
    got_annotations = {k: v for k, v in p["metadata"]["annotations"].items() if "kueue" in k or "scheduling" in k}
    assert (got_labels, got_annotations, p["spec"].get("schedulerName")) == (labels, annotations, scheduler)
    for version in ("1.30", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(p, version, strict=True)
    client.V1Pod.from_dict(p)


def test_the_group_is_per_attempt_and_the_same_for_every_slot():
    mode = {"mode": "kueue", "queue": "q"}
    a, b = worker_pod(mode, "node-a", 1), worker_pod(mode, "node-b", 1)
    c = worker_pod(mode, "node-a", 2)
    group = "kueue.x-k8s.io/pod-group-name"
    assert a["metadata"]["labels"][group] == b["metadata"]["labels"][group] != c["metadata"]["labels"][group]


@pytest.mark.parametrize("cfg, expected", [
    (GangConfig(), None),
    (GangConfig(mode="kueue", queue="q"), None),
    (GangConfig(mode="volcano"), {"minMember": 4, "queue": "default"}),
    (GangConfig(mode="volcano", queue="research", priority_class="training-high"),
     {"minMember": 4, "queue": "research", "priorityClassName": "training-high"}),
    (GangConfig(mode="coscheduling"), {"minMember": 4}),
])
def test_pod_group_bodies(cfg, expected):
    body = gang.pod_group(cfg, "llama-a3", "training", 4, labels={"elastic-supervisor/job": "llama"},
                          owner=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u"}])
    if expected is None:
        assert body is None
        return
    assert body["spec"] == expected
    assert body["apiVersion"] == {"volcano": "scheduling.volcano.sh/v1beta1",
                                  "coscheduling": "scheduling.x-k8s.io/v1alpha1"}[cfg.mode]
    assert body["kind"] == "PodGroup" and body["metadata"]["name"] == "llama-a3"
    assert body["metadata"]["ownerReferences"][0]["name"] == "cm"


def test_a_volcano_group_takes_the_workers_priority_class_by_default():
    body = gang.pod_group(GangConfig(mode="volcano"), "g", "ns", 2, labels={}, priority_class="training-high")
    assert body["spec"]["priorityClassName"] == "training-high"


@pytest.mark.parametrize("mode, worker, why", [
    ({"mode": "slurm"}, {}, "platform.kubernetes.gang.mode: 'slurm' is not one of none, kueue, volcano, coscheduling"),
    ({"mode": "kueue"}, {}, "platform.kubernetes.gang.queue: required with mode kueue"),
    ({"mode": "kueue", "queue": "GPU Queue"}, {}, "platform.kubernetes.gang.queue: 'GPU Queue' is not a queue name"),
    ({"mode": "none", "queue": "q"}, {}, "platform.kubernetes.gang.queue: only with mode kueue or volcano"),
    ({"mode": "kueue", "queue": "q", "scheduler_name": "x"}, {},
     "platform.kubernetes.gang.scheduler_name: only with mode volcano or coscheduling"),
    ({"mode": "coscheduling", "priority_class": "p"}, {},
     "platform.kubernetes.gang.priority_class: only with mode volcano"),
    ({"mode": "kueue", "queue": "q"}, {"labels": {"kueue.x-k8s.io/queue-name": "other"}},
     "platform.kubernetes.worker.labels.kueue.x-k8s.io/queue-name: set by gang mode kueue"),
    ({"mode": "volcano"}, {"pod_template": {"spec": {"schedulerName": "default-scheduler"}}},
     "platform.kubernetes.worker.pod_template.spec.schedulerName: 'default-scheduler': gang mode volcano sends"),
    ({"mode": "coscheduling"}, {"pod_template": {"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "g"}}}},
     "platform.kubernetes.worker.pod_template.metadata.labels.scheduling.x-k8s.io/pod-group: set by gang mode"),
    ({"mode": "kueue", "queue": "q", "extra": 1}, {}, "platform.kubernetes.gang.extra: unknown key"),
])
def test_bad_gang_settings_are_refused_naming_the_field(mode, worker, why):
    with pytest.raises(ConfigError) as info:
        from_dict(job(worker, gang=mode))
    assert str(info.value).startswith(why), str(info.value)


def test_a_template_may_name_the_gangs_own_scheduler():
    p = worker_pod({"mode": "volcano"}, pod_template={"spec": {"schedulerName": "volcano"}})
    assert p["spec"]["schedulerName"] == "volcano"


@pytest.mark.parametrize("mode, type_, reason, taken_back", [
    ("kueue", "TerminationTarget", "WorkloadEvictedDueToPreempted", True),
    ("kueue", "TerminationTarget", "WorkloadEvicted", False),
    # Kueue's other evictions: the pods never Ready (the job's fault), an administrator's stop
    ("kueue", "TerminationTarget", "WorkloadEvictedDueToPodsReadyTimeout", False),
    ("kueue", "TerminationTarget", "WorkloadEvictedDueToDeactivated", False),
    ("kueue", "TerminationTarget", "WorkloadEvictedDueToClusterQueueStopped", False),
    ("kueue", "TerminationTarget", "WorkloadDeleted", False),      # the workload deleted: not a requeue
    ("kueue", "DisruptionTarget", "PreemptionByScheduler", False),  # the default scheduler: a lost pod
    ("volcano", "DisruptionTarget", "PreemptionByScheduler", True),
    ("coscheduling", "DisruptionTarget", "PreemptionByScheduler", True),
    ("volcano", "DisruptionTarget", "EvictionByEvictionAPI", False),
    ("none", "TerminationTarget", "WorkloadEvictedDueToPreempted", False),
])
def test_which_condition_says_the_queue_took_the_gang_back(mode, type_, reason, taken_back):
    cfg = GangConfig(mode=mode, queue="q" if mode == "kueue" else "")
    assert gang.requeued(cfg, type_, reason) is taken_back


def test_requeued_is_decided_on_nodes_that_ended():
    running = NodeStatus("a", 1, NodeState.RUNNING)
    taken = NodeStatus("b", 1, NodeState.LOST, requeued=True, detail="pod x WorkloadEvictedDueToPreempted")
    assert requeued({"a": running}) is None
    assert requeued({"a": running, "b": taken}) is taken
    assert requeued({"b": NodeStatus("b", 1, NodeState.LOST)}) is None
