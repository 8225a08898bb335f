"""Gang admission end to end: ``supervisor run`` with real torchrun pods on the fake cluster with
Kueue (tests/fakes/gang.py). A gang that fits the queue's quota only after another group ends
waits with every pod gated (no partial start, no relaunch, no restart spent) and then runs as the
control does; a gang Kueue preempts mid-run saves on SIGTERM, waits for readmission and resumes
from that checkpoint, without a restart counted."""

from __future__ import annotations

import sys

import pytest
from kubernetes import client

from fakes.gang import FakeKueue, wait_for
from kube_harness import NS, JOB_NAME, Cluster, assert_same_path, control, finished, kube_run  # noqa: F401
from test_fake_gang import kueue_queues

PY = sys.executable
GANG = {"gang": {"mode": "kueue", "queue": "team"},
        "worker": {"image": "fake.invalid/worker:1", "resources": {"limits": {"nvidia.com/gpu": 1}},
                   # rendezvous ip: host-network pods pinned to their nodes, so the first pod's IP is
                   # its node's and the whole group is made at once
                   "pod_template": {"spec": {"hostNetwork": True}}}}


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, nodes=3, allocatable={"nvidia.com/gpu": "1"})
    kueue = FakeKueue(c.api, NS).start()
    c.crd = client.CustomObjectsApi(client.ApiClient(c.api.configuration()))
    kueue_queues(c.crd, gpus=2)
    yield c
    kueue.stop()
    c.stop()


def other_group(c: Cluster, group: str, priority: str | None = None) -> list[str]:
    names = [f"{group}-{i}" for i in range(2)]
    for name in names:
        spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "trainer:1",
                                "command": [PY, "-c", "import time\nwhile True: time.sleep(1)"],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        if priority:
            spec["priorityClassName"] = priority
        c.kubelet.v1.create_namespaced_pod(NS, {"metadata": {"name": name, "labels": {
            "kueue.x-k8s.io/queue-name": "team", "kueue.x-k8s.io/pod-group-name": group},
            "annotations": {"kueue.x-k8s.io/pod-group-total-count": "2"}}, "spec": spec})
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
