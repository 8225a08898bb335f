"""Gang admission end to end: ``supervisor run`` with real torchrun pods on the fake cluster with
Kueue or Volcano (tests/fakes/gang.py). Under Kueue, a gang that fits the queue's quota only after
another group ends waits with every pod gated (no partial start, no relaunch, no restart spent)
and then runs as the control does; a gang Kueue preempts mid-run saves on SIGTERM, waits for
readmission and resumes from that checkpoint, without a restart counted. Under Volcano, a gang
whose nodes another group holds waits with no pod bound, each attempt has its own PodGroup
(made before its pods, deleted with its attempt) and its own PodDisruptionBudget, owned by the
release as its other objects are."""

from __future__ import annotations

import hashlib
import sys

import pytest
from kubernetes import client

from fakes.gang import FakeGangScheduler, FakeKueue, wait_for
from kube_harness import (  # noqa: F401  (control, kube_run: fixtures)
    JOB_NAME, NS, Cluster, as_the_chart_installs_it, assert_same_path, control, finished, kube_run, served_verdict)
from test_fake_gang import kueue_queues

PY = sys.executable
GANG = {"gang": {"mode": "kueue", "queue": "team"},
        "worker": {"image": "fake.invalid/worker:1", "resources": {"limits": {"nvidia.com/gpu": 1}},
                   # rendezvous ip: host-network pods pinned to their nodes, so the first pod's IP is
                   # its node's and the whole group is made at once
                   "pod_template": {"spec": {"hostNetwork": True}}}}


@pytest.fixture
def cluster(tmp_path, request):
    """3 nodes of 1 GPU and the gang admission of ``request.param`` (indirect parametrization;
    default ``kueue``): Kueue with a ClusterQueue of 2 GPUs, or Volcano's gang scheduler."""
    mode = getattr(request, "param", "kueue")
    c = Cluster(tmp_path, nodes=3, allocatable={"nvidia.com/gpu": "1"})
    c.crd = client.CustomObjectsApi(client.ApiClient(c.api.configuration()))
    if mode == "kueue":
        admission = FakeKueue(c.api, NS).start()
        kueue_queues(c.crd, gpus=2)
    else:
        admission = FakeGangScheduler(c.api, c.kubelet, NS, mode=mode).start()
    c.admission = admission
    yield c
    admission.stop()
    c.stop()


def other_group(c: Cluster, group: str, priority: str | None = None, mode: str = "kueue",
                nodes: list[str] | None = None) -> list[str]:
    """Another job's group of 2 pods of 1 GPU each, admitted as ``mode`` admits a group (a Kueue
    pod group, or a Volcano PodGroup and its pods), on ``nodes`` (one pod on each) if given; waits
    until it runs."""
    names = [f"{group}-{i}" for i in range(2)]
    if mode == "volcano":
        c.crd.create_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", NS, "podgroups", {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": group},
            "spec": {"minMember": 2, "queue": "default"}})
    for i, name in enumerate(names):
        spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "trainer:1",
                                "command": [PY, "-c", "import time\nwhile True: time.sleep(1)"],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        if priority:
            spec["priorityClassName"] = priority
        if nodes:
            spec["nodeSelector"] = {"kubernetes.io/hostname": nodes[i]}
        if mode == "volcano":
            spec["schedulerName"] = "volcano"
            meta = {"name": name, "annotations": {"scheduling.k8s.io/group-name": group}}
        else:
            # not retriable, as the controller marks its own groups: deleting its pods ends it and frees its
            # quota (a retriable group keeps it for replacement pods, as Kueue does)
            meta = {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "team", "kueue.x-k8s.io/pod-group-name": group},
                    "annotations": {"kueue.x-k8s.io/pod-group-total-count": "2",
                                    "kueue.x-k8s.io/retriable-in-group": "false"}}
        c.kubelet.v1.create_namespaced_pod(NS, {"metadata": meta, "spec": spec})
    wait_for(lambda: all((c.api.get("pods", NS, n) or {}).get("status", {}).get("phase") == "Running" for n in names),
             timeout=60, what=f"{group} running")
    return names


def job_pods(c: Cluster, attempt: int) -> list[dict]:
    return c.pods(**{"elastic-supervisor/job": JOB_NAME, "elastic-supervisor/attempt": str(attempt)})


def test_a_gang_waits_gated_for_its_quota_then_runs_as_the_control(cluster, kube_run, control):
    blocker = other_group(cluster, "other")
    run = kube_run(kube=GANG, overrides={"restart": {"kill_grace_s": 10, "capacity_wait_s": 300}})
    waiting = run.wait_event("waiting_for_capacity", timeout=120)
    assert waiting["attempt"] == 0 and "SchedulingGated" in waiting["detail"]
    pods = job_pods(cluster, 0)
    assert len(pods) == 2
    for pod in pods:   # every pod gated, none bound: no partial start
        assert pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
        assert not pod["spec"].get("nodeName")
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    group = pods[0]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
    wl = wait_for(lambda: next((w for w in cluster.api.objects("workloads", NS) if w["metadata"]["name"] == group
                                and w.get("status")), None), what="the job's workload")
    assert next(c for c in wl["status"]["conditions"] if c["type"] == "QuotaReserved")["reason"] == "Pending"
    for name in blocker:   # the other group ends: its quota goes to the gang
        cluster.kubelet.v1.delete_namespaced_pod(name, NS)
    run.wait_event("capacity_found", timeout=120)
    finished(run)
    assert [e["attempt"] for e in run.events("launched")] == [0]
    assert run.events("fault_detected") == [] and run.events("gang_requeued") == []
    assert_same_path(run, control)


def test_a_gang_preempted_by_kueue_saves_waits_and_resumes_without_a_restart(cluster, kube_run, control):
    client.SchedulingV1Api(cluster.kubelet.v1.api_client).create_priority_class(
        {"metadata": {"name": "high"}, "value": 1000})
    run = kube_run(kube=GANG, job=["--steps", "30", "--checkpoint-every", "5", "--step-sleep", "0.3"],
                   overrides={"restart": {"kill_grace_s": 10, "capacity_wait_s": 300}})
    run.wait_checkpoint(5, timeout=180)
    other_group(cluster, "urgent", "high")   # admitted once Kueue has preempted the gang and its pods ended
    taken = run.wait_event("gang_requeued", timeout=120)
    assert taken["attempt"] == 0 and taken["reason"] == "WorkloadEvictedDueToPreempted" and taken["restarts"] == 0
    saved = run.wait_event("emergency_checkpoint", timeout=60)
    run.wait_event("waiting_for_capacity", timeout=120, attempt=1)
    assert all(p["spec"]["schedulingGates"] for p in job_pods(cluster, 1))
    for name in ("urgent-0", "urgent-1"):
        cluster.kubelet.v1.delete_namespaced_pod(name, NS)
    launched = [e for e in run.events("launched") if e["attempt"] == 1]
    assert launched and launched[0]["restore_from"] == saved["name"]
    finished(run)
    assert run.events("fault_detected") == []
    assert_same_path(run, control)


def test_a_kueue_gang_restarted_after_a_fault_is_admitted_again_in_the_quota_it_held(cluster, kube_run, control):
    """A ClusterQueue of 2 GPUs and a gang of 2: after a rank's crash the next attempt's group needs
    the very quota the torn-down one held. The controller marks its groups not retriable, so Kueue
    finishes the old group once its pods end (a retriable one keeps the quota for replacement pods,
    and the next attempt would wait gated until the job stopped for capacity)."""
    run = kube_run(kube=GANG, fault="kind=crash,rank=1,step=8,attempt=0",
                   overrides={"restart": {"kill_grace_s": 10, "capacity_wait_s": 120},
                              "heartbeat": {"interval_s": 0.5, "timeout_s": 10}})
    fault = run.wait_event("fault_detected", timeout=180)
    assert fault["kind"] == "crash"
    run.wait_event("launched", attempt=1, timeout=120)
    assert finished(run)["phase"] == "completed"
    assert not run.events("gang_requeued")  # a fault of the job, counted as one
    groups = {w["metadata"]["name"] for w in cluster.api.objects("workloads", NS)}
    assert not [g for g in groups if g.endswith("-a0")], groups  # the first attempt's group finished and went
    assert_same_path(run, control)


VOLCANO_GROUPS = "podgroups.scheduling.volcano.sh"


@pytest.mark.parametrize("cluster", ["volcano"], indirect=True)
def test_under_volcano_a_gang_waits_unbound_runs_as_the_control_and_each_attempt_has_its_own_pod_group(
        cluster, kube_run, control, tmp_path):
    # another job's group holds fake-node-1 and fake-node-2: of the gang's two nodes (fake-node-0,
    # fake-node-1) one is free, which a pod-by-pod scheduler would bind at once (a partial start)
    blocker = other_group(cluster, "other", mode="volcano", nodes=["fake-node-1", "fake-node-2"])
    kube = GANG | {"gang": {"mode": "volcano", "queue": "research"}} | as_the_chart_installs_it(cluster, tmp_path)
    run = kube_run(kube=kube, job=["--steps", "30", "--checkpoint-every", "5", "--step-sleep", "0.3"],
                   overrides={"restart": {"kill_grace_s": 10, "capacity_wait_s": 300}})
    assert run.wait_event("launched", attempt=0)["nodes"] == ["fake-node-0", "fake-node-1"]
    waiting = run.wait_event("waiting_for_capacity", timeout=120)
    assert waiting["attempt"] == 0 and "tasks in gang unschedulable" in waiting["detail"], waiting
    pods = job_pods(cluster, 0)
    assert len(pods) == 2
    (group,) = {p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in pods}
    for pod in pods:   # no pod bound, not even the one whose node is free: no partial start
        assert pod["spec"]["schedulerName"] == "volcano" and not pod["spec"].get("nodeName")
    # the gang scheduler's verdict on the whole group (written after it has tried the group)
    pg = wait_for(lambda: (g := cluster.api.get(VOLCANO_GROUPS, NS, group)) and g.get("status") and g,
                  what="the gang's PodGroup status")
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert pg["spec"]["minMember"] == 2 and pg["spec"]["queue"] == "research"
    assert pg["status"]["phase"] == "Pending" and pg["status"]["conditions"][0]["type"] == "Unschedulable"
    assert not any(p["spec"].get("nodeName") for p in job_pods(cluster, 0))
    # the attempt's PodGroup and PodDisruptionBudget are the release's, as its pods and Service are
    uid = cluster.api.get("configmaps", NS, "demo-elastic-supervisor-config")["metadata"]["uid"]
    base = f"{JOB_NAME}-{hashlib.sha256(uid.encode()).hexdigest()[:5]}"
    assert group == f"{base}-a0"
    service = cluster.api.get("services", NS, f"{base}-rdzv")
    budget = cluster.api.get("poddisruptionbudgets", NS, f"{base}-a0")
    assert budget["spec"]["minAvailable"] == 2
    for obj in (pg, budget, *pods):
        assert obj["metadata"]["ownerReferences"] == service["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in obj["metadata"]["ownerReferences"]] == [
            ("ConfigMap", "demo-elastic-supervisor-config", uid)]
        assert obj["metadata"]["labels"].items() >= service["metadata"]["labels"].items()
        assert obj is budget or obj["metadata"]["labels"]["elastic-supervisor/attempt"] == "0"
    assert service["metadata"]["labels"]["elastic-supervisor/owner"] == uid
    assert all(p["metadata"]["labels"].items() >= budget["spec"]["selector"]["matchLabels"].items() for p in pods)

    for name in blocker:   # the other group ends: its nodes go to the gang, which is bound whole
        cluster.kubelet.v1.delete_namespaced_pod(name, NS)
    run.wait_event("capacity_found", timeout=120)
    # the wait was no fault: no relaunch, no restart, nothing requeued
    assert [e["attempt"] for e in run.events("launched")] == [0]
    assert run.events("fault_detected") == [] and run.events("gang_requeued") == []
    assert cluster.admission.bound.count(group) == 1
    assert sorted(p["spec"]["nodeName"] for p in job_pods(cluster, 0)) == ["fake-node-0", "fake-node-1"]

    # a restart: one pod deleted mid-run; the old attempt's PodGroup and budget go with it
    run.wait_checkpoint(10, timeout=120)
    cluster.kubelet.v1.delete_namespaced_pod(cluster.pod_of_rank(run.log_dir, 1, attempt=0)["metadata"]["name"], NS)
    run.wait_event("fault_detected")
    relaunch = run.wait_event("launched", attempt=1)
    assert int(relaunch["restore_from"].split("-")[1]) >= 10
    assert cluster.api.get(VOLCANO_GROUPS, NS, f"{base}-a0") is None
    assert cluster.api.get("poddisruptionbudgets", NS, f"{base}-a0") is None
    pg1 = cluster.api.get(VOLCANO_GROUPS, NS, f"{base}-a1")
    assert pg1["spec"]["minMember"] == 2 and pg1["metadata"]["labels"]["elastic-supervisor/attempt"] == "1"
    assert cluster.api.get("poddisruptionbudgets", NS, f"{base}-a1")["spec"]["minAvailable"] == 2
    assert {p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in job_pods(cluster, 1)} == \
        {f"{base}-a1"}
    run.wait_event("job_finished", timeout=240)
    # one restart, the deleted pod's: the wait for the other group's nodes spent none of the budget
    assert [t["reason"] for t in served_verdict(run)["restarts"]] == ["preempted"]
    finished(run)
    assert [e["attempt"] for e in run.events("launched")] == [0, 1]
    assert len(run.events("fault_detected")) == 1 and run.events("gang_requeued") == []
    assert_same_path(run, control)
