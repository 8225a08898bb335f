"""The fake cluster's gang admission (tests/fakes/gang.py) through the real client: Kueue gates a
pod group until its whole quota fits, admits it whole, preempts a lower-priority group (its pods get
Kueue's TerminationTarget condition and a graceful delete); a gang scheduler binds a PodGroup's
pods only all together, and preempts a lower-priority group."""

from __future__ import annotations

import sys

import pytest
from kubernetes import client

from fakes.gang import FakeGangScheduler, FakeKueue, wait_for
from fakes.kube_apiserver import FakeKubeAPIServer
from fakes.kubelet import FakeKubelet

NS = "ml"
PY = sys.executable
SLEEP = "import time\nwhile True: time.sleep(1)"


@pytest.fixture
def cluster(tmp_path):
    api = FakeKubeAPIServer(priority_classes={"low": 10, "high": 1000}).start()
    api.pod_webhooks.clear()
    kubelet = FakeKubelet(api, NS, nodes=2, log_dir=tmp_path / "logs", allocatable={"nvidia.com/gpu": "2"}).start()
    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    crd = client.CustomObjectsApi(client.ApiClient(api.configuration()))
    v1.create_namespace({"metadata": {"name": NS}})
    yield api, kubelet, v1, crd
    kubelet.stop()
    api.stop()


def worker(name: str, labels: dict, annotations: dict | None = None, gpus: int = 1, priority: str = "low",
           scheduler: str | None = None) -> dict:
    spec = {"restartPolicy": "Never", "priorityClassName": priority, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "agent", "image": "trainer:1", "command": [PY, "-c", SLEEP],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}, "spec": spec}


def kueue_queues(crd, gpus: int) -> None:
    crd.create_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "default"}})
    crd.create_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "gpus"},
        "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                     {"name": "default", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}})
    crd.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NS, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "team"},
        "spec": {"clusterQueue": "gpus"}})


def group_labels(group: str) -> tuple[dict, dict]:
    return ({"kueue.x-k8s.io/queue-name": "team", "kueue.x-k8s.io/pod-group-name": group},
            {"kueue.x-k8s.io/pod-group-total-count": "2"})


def phase(api, name: str) -> str:
    pod = api.get("pods", NS, name)
    return "" if pod is None else pod["status"].get("phase", "")


def condition(api, name: str, type_: str) -> dict | None:
    pod = api.get("pods", NS, name) or {}
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def test_kueue_gates_a_group_until_the_whole_group_fits_then_preempts_for_a_higher_priority_one(cluster):
    api, kubelet, v1, crd = cluster
    with FakeKueue(api, NS) as kueue:
        kueue_queues(crd, gpus=2)
        # a pod group refused without its total count, as Kueue's webhook refuses it
        with pytest.raises(client.exceptions.ApiException) as info:
            v1.create_namespaced_pod(NS, worker("bad", {"kueue.x-k8s.io/queue-name": "team",
                                                        "kueue.x-k8s.io/pod-group-name": "g"}))
        assert info.value.status == 422 and "pod-group-total-count" in info.value.body
        labels, annotations = group_labels("a")
        v1.create_namespaced_pod(NS, worker("a-0", labels, annotations))
        created = api.get("pods", NS, "a-0")
        assert created["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
        assert created["metadata"]["labels"]["kueue.x-k8s.io/managed"] == "true"
        # one pod of two: no workload, the pod stays gated with the scheduler's word for it
        gated = wait_for(lambda: condition(api, "a-0", "PodScheduled"), what="a-0 gated")
        assert (gated["status"], gated["reason"]) == ("False", "SchedulingGated")
        assert api.objects("workloads", NS) == []
        v1.create_namespaced_pod(NS, worker("a-1", labels, annotations))
        wait_for(lambda: phase(api, "a-0") == "Running" and phase(api, "a-1") == "Running", what="a running")
        (wl,) = api.objects("workloads", NS)
        assert wl["metadata"]["name"] == "a" and wl["spec"]["podSets"][0]["count"] == 2
        assert {c["type"]: c["status"] for c in wl["status"]["conditions"]}["Admitted"] == "True"
        assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {"nvidia.com/gpu": "2"}
        # a second group of the same priority waits, gated, its whole quota short
        labels_b, annotations_b = group_labels("b")
        for i in range(2):
            v1.create_namespaced_pod(NS, worker(f"b-{i}", labels_b, annotations_b))
        wl_b = wait_for(lambda: next((w for w in api.objects("workloads", NS) if w["metadata"]["name"] == "b"
                                      and w.get("status")), None), what="b's workload status")
        quota = next(c for c in wl_b["status"]["conditions"] if c["type"] == "QuotaReserved")
        assert (quota["status"], quota["reason"]) == ("False", "Pending")
        assert quota["message"] == ("couldn't assign flavors to pod set main: insufficient unused quota for "
                                    "nvidia.com/gpu in flavor default, 2 more needed")
        assert all(api.get("pods", NS, f"b-{i}")["spec"]["schedulingGates"] for i in range(2))
        # a higher-priority group preempts "a": Kueue's condition on its pods, then their graceful delete
        labels_c, annotations_c = group_labels("c")
        for i in range(2):
            v1.create_namespaced_pod(NS, worker(f"c-{i}", labels_c, annotations_c, priority="high"))
        # (read from what the fake wrote: with its 1 s grace the pod may be gone before this thread looks)
        stopped = wait_for(lambda: kueue.stopped.get("a-0"), what="a-0 stopped")
        assert (stopped["status"], stopped["reason"]) == ("True", "WorkloadEvictedDueToPreempted")
        assert stopped["message"].startswith("Preempted to accommodate a workload (UID: ")
        wait_for(lambda: phase(api, "c-0") == "Running" and phase(api, "c-1") == "Running", what="c running")
        assert kueue.evicted == ["a"] and kueue.admitted[:2] == ["a", "c"]
        # "b" (same priority as "a", older than nothing it could preempt) still waits
        assert all(api.get("pods", NS, f"b-{i}")["spec"]["schedulingGates"] for i in range(2))


@pytest.mark.parametrize("retriable", [True, False])
def test_a_group_whose_pods_were_deleted_keeps_its_quota_unless_it_is_not_retriable(cluster, retriable):
    """Kueue keeps an ended group's quota for its replacement pods; a group marked
    ``retriable-in-group: "false"`` is finished once no pod is active, and the next group runs."""
    api, kubelet, v1, crd = cluster
    with FakeKueue(api, NS):
        kueue_queues(crd, gpus=2)
        labels, annotations = group_labels("a0")
        if not retriable:
            annotations["kueue.x-k8s.io/retriable-in-group"] = "false"
        for i in range(2):
            v1.create_namespaced_pod(NS, worker(f"a0-{i}", labels, annotations))
        wait_for(lambda: phase(api, "a0-0") == "Running" and phase(api, "a0-1") == "Running", what="a0 running")
        for i in range(2):  # the attempt torn down
            v1.delete_namespaced_pod(f"a0-{i}", NS, grace_period_seconds=0)
        wait_for(lambda: api.get("pods", NS, "a0-0") is None and api.get("pods", NS, "a0-1") is None, what="a0 gone")
        labels, annotations = group_labels("a1")  # the next attempt's group
        for i in range(2):
            v1.create_namespaced_pod(NS, worker(f"a1-{i}", labels, annotations))
        if retriable:
            wl = wait_for(lambda: next((w for w in api.objects("workloads", NS) if w["metadata"]["name"] == "a1"
                                        and w.get("status")), None), what="a1's workload status")
            quota = next(c for c in wl["status"]["conditions"] if c["type"] == "QuotaReserved")
            assert (quota["status"], quota["reason"]) == ("False", "Pending")  # a0 still holds the GPUs
            assert all(api.get("pods", NS, f"a1-{i}")["spec"]["schedulingGates"] for i in range(2))
            (held,) = [w for w in api.objects("workloads", NS) if w["metadata"]["name"] == "a0"]
            assert held["status"]["admission"]
        else:
            wait_for(lambda: phase(api, "a1-0") == "Running" and phase(api, "a1-1") == "Running", what="a1 running")
            assert "a0" not in {w["metadata"]["name"] for w in api.objects("workloads", NS)}


@pytest.mark.parametrize("mode", ["volcano", "coscheduling"])
def test_a_gang_scheduler_binds_a_group_only_whole(cluster, mode):
    api, kubelet, v1, crd = cluster
    sched = "volcano" if mode == "volcano" else "scheduler-plugins-scheduler"
    group_api = ("scheduling.volcano.sh", "v1beta1") if mode == "volcano" else ("scheduling.x-k8s.io", "v1alpha1")

    def member(name: str, group: str, priority: str = "low", gpus: int = 2) -> dict:
        if mode == "volcano":
            return worker(name, {}, {"scheduling.k8s.io/group-name": group}, gpus=gpus, priority=priority,
                          scheduler=sched)
        return worker(name, {"scheduling.x-k8s.io/pod-group": group}, gpus=gpus, priority=priority, scheduler=sched)

    with FakeGangScheduler(api, kubelet, NS, mode=mode) as scheduler:
        for g, size in (("big", 3), ("small", 2)):
            crd.create_namespaced_custom_object(*group_api, NS, "podgroups", {
                "apiVersion": "/".join(group_api), "kind": "PodGroup", "metadata": {"name": g},
                "spec": {"minMember": size}})
        # 3 pods of 2 GPUs on 2 nodes of 2: never placed, none of them bound (no partial start)
        for i in range(3):
            v1.create_namespaced_pod(NS, member(f"big-{i}", "big"))
        cond = wait_for(lambda: condition(api, "big-2", "PodScheduled"), what="big unschedulable")
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert "minAvailable" in cond["message"]
        pg = wait_for(lambda: (api.get(f"podgroups.{group_api[0]}", NS, "big") or {}).get("status"), what="pg status")
        assert pg["phase"] == "Pending"
        assert not any(api.get("pods", NS, f"big-{i}")["spec"].get("nodeName") for i in range(3))
        for i in range(2):
            v1.create_namespaced_pod(NS, member(f"small-{i}", "small"))
        wait_for(lambda: phase(api, "small-0") == "Running" and phase(api, "small-1") == "Running", what="small")
        assert scheduler.bound == ["small"]
        # a higher-priority group preempts "small"
        crd.create_namespaced_custom_object(*group_api, NS, "podgroups", {
            "apiVersion": "/".join(group_api), "kind": "PodGroup", "metadata": {"name": "urgent"},
            "spec": {"minMember": 2}})
        for i in range(2):
            v1.create_namespaced_pod(NS, member(f"urgent-{i}", "urgent", priority="high"))
        wait_for(lambda: phase(api, "urgent-0") == "Running" and phase(api, "urgent-1") == "Running", what="urgent")
        assert api.get("pods", NS, "small-0") is None or condition(api, "small-0", "DisruptionTarget")["reason"] == \
            "PreemptionByScheduler"
        assert scheduler.bound[-1] == "urgent"
