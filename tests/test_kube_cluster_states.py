"""What a real cluster does to a job, end to end: real torchrun pods on the fake cluster
(tests/fakes: a scheduler that counts GPUs against each node's allocatable, a registry that
knows some images, real cgroup memory limits, kubelet admission), the controller as it ships
(no torch in its environment), each run against the uninterrupted control where the job goes on.

- two releases with the same ``config.job`` in one namespace both complete, untouched by each other;
- 60+-character node names (GKE's unique part at the end) give one distinct pod per slot;
- a gang that asks for more GPUs than are free waits (no teardown, no attempt spent) and runs
  once another pod frees them; an elastic one starts smaller after the grace and grows back;
- an unknown image stops in seconds with the kubelet's message, after one attempt;
- a rank OOMKilled once resumes without excluding its node; twice at the same step stops named;
- a kubelet's admission reject excludes its node and the slot goes to the spare;
- a drain's eviction waits for the gang (a PodDisruptionBudget per attempt).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from controller_venv import controller_python
from kube_harness import (  # noqa: F401  (fixtures)
    JOB,
    JOB_NAME,
    NS,
    Cluster,
    KubeRun,
    assert_same_path,
    cluster,
    control,
    finished,
    k8s_event,
    kube_run,
)

pytestmark = pytest.mark.slow
PY = sys.executable
GPU = {"limits": {"nvidia.com/gpu": 1}}
MEMORY_LIMITED = {"worker": {"image": "fake.invalid/worker:1", "resources": {"limits": {"memory": "2Gi"}}}}
# filling 2 GiB until the OOM killer comes takes a second or more on a loaded host: longer than
# the harness's 3 s phase floor could allow a step (the rank would be named hung first), and a
# process reclaiming at its cgroup's limit can miss the harness's 3 s heartbeat timeout (it was
# named dead first, in a loaded run)
FILLING_TAKES_TIME = {"health": {"phase_floor_s": 20}, "heartbeat": {"interval_s": 0.5, "timeout_s": 15}}
GKE_PREFIX = "gke-prod-us-central1-a3-highgpu-8g-spot-pool-7f9c2b1d-x4kq-n"  # + a digit: 62 characters


@pytest.fixture
def gpu_cluster(tmp_path):
    """Three nodes of one GPU each."""
    c = Cluster(tmp_path, 3, allocatable={"nvidia.com/gpu": "1"})
    yield c
    c.stop()


@pytest.fixture
def gpu_run(tmp_path, gpu_cluster, tmp_path_factory):
    """``kube_run`` on the GPU cluster."""
    runs: list[KubeRun] = []
    controller = controller_python(tmp_path_factory)

    def start(**kw) -> KubeRun:
        runs.append(KubeRun(tmp_path, gpu_cluster, **{"controller": controller, **kw}))
        return runs[-1]

    yield start
    for run in runs:
        run.kill()


def release(cluster: Cluster, tmp: Path, name: str) -> dict:
    """``platform.kubernetes`` as the chart installs release ``name``: its ConfigMap owns the
    pods, its Lease elects its controller (the controller makes the job token's Secret)."""
    cluster.kubelet.v1.create_namespaced_config_map(NS, {"metadata": {"name": f"{name}-config"},
                                                         "data": {"job.yaml": "{}"}})
    return {"owner_config_map": f"{name}-config", "lease": f"{name}-leader"}


def blocker(cluster: Cluster, node: str, gpus: int = 1) -> str:
    """Another tenant's pod holding ``gpus`` GPUs of ``node`` (not the job's: no labels of ours)."""
    name = f"other-tenant-{node[-6:]}"
    cluster.kubelet.v1.create_namespaced_pod(NS, {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
            "name": "c", "image": "fake.invalid/worker:1",
            "command": ["python", "-c", "import time\nwhile True: time.sleep(60)"],
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})
    cluster.kubelet.wait_phase(name, "Running", timeout=30)
    return name


def launches(run: KubeRun) -> list[dict]:
    return run.events("launched")


def test_two_releases_with_one_job_name_in_one_namespace_both_complete(tmp_path, control):
    c = Cluster(tmp_path, 4)
    runs = []
    try:
        for name in ("team-a", "team-b"):
            (tmp_path / name).mkdir()
            runs.append(KubeRun(tmp_path / name, c, kube={"node_reads": False, **release(c, tmp_path, name)},
                                name=name))
        for run in runs:
            assert finished(run)["phase"] == "completed"
            assert not run.events("fault_detected"), run.events()
            assert len(launches(run)) == 1
            assert_same_path(run, control)
        owners = {p["metadata"]["labels"]["elastic-supervisor/owner"] for p in c.pods(**{
            "elastic-supervisor/job": JOB_NAME})}
        assert len(owners) == 2
        budgets = c.api.objects("poddisruptionbudgets", NS)  # one per release's attempt, each selecting its own
        assert {b["spec"]["selector"]["matchLabels"]["elastic-supervisor/owner"] for b in budgets} == owners
        assert len({b["metadata"]["name"] for b in budgets}) == 2
        for run in runs:  # neither fenced, adopted or counted the other's pods
            assert "stale_pod_deleted" not in run.output() and "deleted by someone else" not in run.output()
    finally:
        for run in runs:
            run.kill()
        c.stop()


def test_long_node_names_give_one_distinct_pod_per_slot(tmp_path, control):
    c = Cluster(tmp_path, 3, node_prefix=GKE_PREFIX)
    try:
        assert all(len(n) >= 60 for n in c.kubelet.nodes)
        run = KubeRun(tmp_path, c)
        try:
            assert finished(run)["phase"] == "completed"
            pods = c.pods(**{"elastic-supervisor/attempt": "0"})
            assert len({p["metadata"]["name"] for p in pods}) == 2
            assert {p["spec"]["nodeName"] for p in pods} == set(launches(run)[0]["nodes"])
            assert all(len(p["metadata"]["name"]) <= 63 for p in pods)
            assert_same_path(run, control)
        finally:
            run.kill()
    finally:
        c.stop()


def live_status(run: KubeRun) -> dict:
    """The running controller's /status (its address from the state file it keeps)."""
    state = json.loads((run.log_dir / "supervisor-state.json").read_text())
    with urllib.request.urlopen(f"http://{state['http_host']}:{state['http_port']}/status", timeout=5) as resp:
        return json.loads(resp.read())


def until(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_a_gang_waits_for_gpus_without_spending_an_attempt_and_runs_once_they_are_free(gpu_cluster, gpu_run,
                                                                                      control, tmp_path):
    held = blocker(gpu_cluster, "fake-node-1")
    run = gpu_run(kube={"worker": {"image": "fake.invalid/worker:1", "resources": GPU},
                         **release(gpu_cluster, tmp_path, "demo")},
                   # a startup timeout the wait outlasts, long enough for a pod placed on a loaded host
                   # to import torch and send its first heartbeat (5 s was not, in a CI run)
                   overrides={"health": {"startup_timeout_s": 12}})
    wait = run.wait_event("waiting_for_capacity")
    assert "Insufficient nvidia.com/gpu" in wait["detail"], wait
    said = k8s_event(gpu_cluster, "WaitingForCapacity", "demo-config")
    assert "Insufficient nvidia.com/gpu" in said["message"]
    # past the startup timeout, still waiting (not a startup stall), as /status and the CLI say
    st = until(lambda: (s := live_status(run))["waiting_for_capacity"]["since_s"] > 13 and s)
    assert st["phase"] == "waiting_for_capacity" and "Insufficient nvidia.com/gpu" in st["waiting_for_capacity"]["detail"]
    assert any(n["waiting"] == "capacity" and n["reason"] == "Unschedulable" for n in st["nodes"]), st["nodes"]
    cli = subprocess.run([PY, "-m", "supervisor", "status", "--log-dir", str(run.log_dir)], capture_output=True,
                         text=True, timeout=60, env=run.env)
    assert "waiting for capacity" in cli.stdout and "waiting (capacity: Unschedulable)" in cli.stdout, cli.stdout
    gpu_cluster.kubelet.v1.delete_namespaced_pod(held, NS, grace_period_seconds=0)
    found = run.wait_event("capacity_found")
    assert found["waited_s"] > 13, found
    assert finished(run)["phase"] == "completed"
    assert len(launches(run)) == 1 and not run.events("fault_detected") and not run.events("action")
    assert_same_path(run, control)


def test_a_controller_replaced_while_its_gang_waits_for_gpus_goes_on_with_the_same_wait(gpu_cluster, gpu_run,
                                                                                       control):
    """The wait for capacity is the job's, not one controller's: a replacement (the Deployment's,
    after a kill -9) adopts the waiting gang and goes on with the wait its predecessor began (the
    state keeps when it began), so restart.capacity_wait_s bounds the whole wait however often
    the controller is replaced, and the wait is announced once."""
    held = blocker(gpu_cluster, "fake-node-1")
    run = gpu_run(kube={"worker": {"image": "fake.invalid/worker:1", "resources": GPU}},
                  overrides={"health": {"startup_timeout_s": 12}})
    run.wait_event("waiting_for_capacity")
    until(lambda: live_status(run)["waiting_for_capacity"]["since_s"] > 6)
    os.killpg(run.proc.pid, signal.SIGKILL)  # the controller only: its pods wait on
    run.proc.wait()
    run.start()
    run.wait_event("adopted", attempt=0, timeout=90)
    # (the state file names the new controller's port once it serves; the dead one's refuses)
    st = until(lambda: (s := live_status(run))["phase"] == "waiting_for_capacity" and s)
    assert st["waiting_for_capacity"]["since_s"] > 6, st["waiting_for_capacity"]
    assert "Insufficient nvidia.com/gpu" in st["waiting_for_capacity"]["detail"]
    gpu_cluster.kubelet.v1.delete_namespaced_pod(held, NS, grace_period_seconds=0)
    found = run.wait_event("capacity_found")
    assert found["waited_s"] > 6, found
    assert finished(run)["phase"] == "completed"
    assert len(run.events("waiting_for_capacity")) == 1  # announced by the first controller only
    assert len(launches(run)) == 1 and not run.events("fault_detected") and not run.events("action")
    assert_same_path(run, control)

def test_a_gang_that_can_never_be_placed_stops_naming_the_scheduler(gpu_cluster, gpu_run):
    run = gpu_run(kube={"worker": {"image": "fake.invalid/worker:1", "resources": {"limits": {"nvidia.com/gpu": 2}}}},
                   overrides={"restart": {"capacity_wait_s": 3}})
    done = finished(run, code=5)
    assert done["phase"] == "stopped_no_capacity"
    assert "Insufficient nvidia.com/gpu" in done["reason"] and "capacity_wait_s" in done["reason"], done
    assert len(launches(run)) == 1 and not run.events("fault_detected")
    assert not gpu_cluster.pods(**{"elastic-supervisor/job": JOB_NAME}) or all(
        p["metadata"].get("deletionTimestamp") for p in gpu_cluster.pods(**{"elastic-supervisor/job": JOB_NAME}))


def test_a_quota_with_room_for_one_worker_pod_stops_a_gang_of_two_at_launch_naming_it(gpu_cluster, gpu_run):
    """The namespace's ResourceQuota holds one worker pod's GPU and nothing else holds it: the
    dry run of one pod passes, the launch's second pod is refused (403, exceeded quota). No retry
    makes the quota larger: the job stops at once (stopped_startup_failure, exit 8) naming the
    quota and the room, and the pod it made is deleted."""
    gpu_cluster.kubelet.v1.create_namespaced_resource_quota(NS, {"metadata": {"name": "gpus"}, "spec": {
        "hard": {"requests.nvidia.com/gpu": "1"}}})
    run = gpu_run(kube={"worker": {"image": "fake.invalid/worker:1", "resources": GPU}})
    done = finished(run, code=8)
    assert done["phase"] == "stopped_startup_failure", done
    assert ("the namespace's quota gpus can never hold the gang: a worker pod requests requests.nvidia.com/gpu=1 "
            "and the quota allows requests.nvidia.com/gpu=1 in all, room for 1 worker pod where the job needs at "
            "least 2") in done["reason"], done
    refused = run.events("workers_refused")
    assert len(refused) == 1 and "exceeded quota: gpus" in refused[0]["error"], refused
    assert not run.events("launch_failed")  # not retried
    assert all(p["metadata"].get("deletionTimestamp") for p in gpu_cluster.pods(**{"elastic-supervisor/job": JOB_NAME}))

def test_an_elastic_gang_starts_smaller_after_the_grace_and_grows_back(tmp_path):
    c = Cluster(tmp_path, 2, allocatable={"nvidia.com/gpu": "1"})
    run = None
    try:
        held = blocker(c, "fake-node-1")
        run = KubeRun(tmp_path, c, job=["--steps", "80", "--checkpoint-every", "5", "--step-sleep", "0.1"],
                      kube={"worker": {"image": "fake.invalid/worker:1", "resources": GPU}},
                      overrides={"nodes": {"min": 1, "max": 2}, "restart": {"shrink_after_s": 2}})
        shrink = run.wait_event("capacity_shrink")
        assert shrink["nodes"] == ["fake-node-0"], shrink
        smaller = run.wait_event("launched", attempt=1)
        assert smaller["world_size"] == 1
        run.wait_event("running", attempt=1)
        c.kubelet.v1.delete_namespaced_pod(held, NS, grace_period_seconds=0)
        back = run.wait_event("capacity_returned")
        assert back["slots"] == ["fake-node-1"], back
        larger = run.wait_event("launched", attempt=2)
        assert larger["world_size"] == 2 and larger["restore_from"], larger
        assert finished(run)["phase"] == "completed"
        assert not run.events("fault_detected"), run.events("fault_detected")
        steps = sorted(run.losses())
        assert steps == list(range(1, 81))
    finally:
        if run is not None:
            run.kill()
        c.stop()


def test_an_unknown_image_stops_in_seconds_with_the_kubelets_message_and_no_relaunch(cluster, kube_run):
    run = kube_run(kube={"worker": {"image": "fake.invalid/no-such-image:1"}})
    done = finished(run, code=8)
    assert done["phase"] == "stopped_startup_failure"
    assert "ErrImagePull" in done["reason"] or "ImagePullBackOff" in done["reason"], done
    assert "no-such-image" in done["reason"]
    assert len(launches(run)) == 1
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "cannot_start"


@pytest.fixture
def memory_cluster(tmp_path):
    """Three nodes whose kubelet enforces a container's memory limit with a real cgroup."""
    c = Cluster(tmp_path, 3)
    if not c.kubelet.enforces_memory:
        c.stop()
        pytest.skip(f"no memory cgroup here: {c.kubelet.memory_unavailable_reason}")
    yield c
    c.stop()


def test_an_oom_once_resumes_without_excluding_its_node(tmp_path, memory_cluster, control):
    run = KubeRun(tmp_path, memory_cluster, fault="kind=oom,rank=1,step=12,attempt=0", kube=MEMORY_LIMITED,
                  overrides=FILLING_TAKES_TIME)
    try:
        fault = run.wait_event("fault_detected")
        assert fault["kind"] == "oom" and fault["node_failure"] is False, fault
        assert "rank 1 out of memory at step 12" in fault["detail"] and "memory limit 2Gi" in fault["detail"]
        assert finished(run)["phase"] == "completed"
        assert not run.events("nodes_excluded")
        assert_same_path(run, control)
    finally:
        run.kill()


def test_an_oom_at_the_same_step_twice_stops_named(tmp_path, memory_cluster):
    run = KubeRun(tmp_path, memory_cluster, fault="kind=oom,rank=1,step=12", kube=MEMORY_LIMITED,
                  overrides=FILLING_TAKES_TIME)
    try:
        done = finished(run, code=11)
        assert done["phase"] == "stopped_out_of_memory"
        assert "same rank ran out of memory at the same step" in done["reason"], done
        faults = [(e["attempt"], e["kind"], e["detail"]) for e in run.events("fault_detected")]
        assert len(faults) == 2 and not run.events("nodes_excluded"), faults
    finally:
        run.kill()


def test_a_kubelets_admission_reject_excludes_its_node_and_the_spare_takes_the_slot(gpu_cluster, gpu_run,
                                                                                 control):
    gpu_cluster.kubelet.set_device_health("fake-node-1", "nvidia.com/gpu", healthy=0)
    run = gpu_run(kube={"worker": {"image": "fake.invalid/worker:1", "resources": GPU}})
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "node_rejected" and "UnexpectedAdmissionError" in fault["detail"], fault
    excluded = run.wait_event("nodes_excluded")
    assert excluded["nodes"] == ["fake-node-1"]
    relaunch = run.wait_event("launched", attempt=1)
    assert "fake-node-1" not in relaunch["nodes"] and "fake-node-2" in relaunch["nodes"], relaunch
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_a_pod_evicted_for_node_pressure_checkpoints_on_its_way_out_and_its_node_is_kept(cluster, kube_run,
                                                                                      control):
    run = kube_run()
    run.wait_checkpoint(10)
    pod = cluster.pod_of_rank(run.log_dir, 1, attempt=0)
    # the kubelet's graceful eviction: DisruptionTarget/TerminationByKubelet, SIGTERM, then Evicted
    cluster.kubelet.evict_for_pressure(pod["metadata"]["name"], grace_s=10)
    fault = run.wait_event("fault_detected")
    # the evicted pod (lost) or its peer, whose ranks agreed to stop on the same SIGTERM (preempted)
    assert fault["node_failure"] is False, fault
    assert ("low on resource: memory" in fault["detail"] and fault["kind"] == "node_lost") or \
        fault["kind"] == "preempted", fault
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["excluded"] == [] and pod["spec"]["nodeName"] in relaunch["nodes"], relaunch
    # the ranks had the eviction's grace: they agreed to stop and wrote the emergency checkpoint
    assert int(relaunch["restore_from"].split("-")[1]) % 5 != 0, relaunch
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_a_drain_s_eviction_waits_for_the_gang_and_the_budget_follows_the_attempt(cluster, kube_run, control):
    """A PodDisruptionBudget per attempt (minAvailable = the gang): a drain's eviction of a
    training pod is refused (429) and the job trains on untouched; a restart deletes the old
    attempt's budget and makes the new one's; the job completes bit-identical."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    policy = client.PolicyV1Api(cluster.kubelet.v1.api_client)
    run = kube_run()
    run.wait_event("launched", attempt=0)

    def budget(attempt: int):
        try:
            return policy.read_namespaced_pod_disruption_budget(f"{JOB_NAME}-a{attempt}", NS)
        except ApiException as exc:
            assert exc.status == 404
            return None

    deadline = time.monotonic() + 60
    while (b := budget(0)) is None or not b.status or b.status.current_healthy != 2:
        assert time.monotonic() < deadline, b
        time.sleep(0.1)
    assert b.spec.min_available == 2
    assert b.spec.selector.match_labels == {"app.kubernetes.io/managed-by": "elastic-supervisor",
                                            "elastic-supervisor/job": JOB_NAME, "elastic-supervisor/attempt": "0"}
    run.wait_checkpoint(5)
    name = cluster.pod_of_rank(run.log_dir, 1, attempt=0)["metadata"]["name"]
    with pytest.raises(ApiException) as refused:  # kubectl drain's eviction
        cluster.kubelet.v1.create_namespaced_pod_eviction(name, NS, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=NS)))
    assert refused.value.status == 429 and "disruption budget" in refused.value.body
    run.wait_checkpoint(10)
    assert not run.events("fault_detected")  # the gang was never touched
    cluster.kubelet.v1.delete_namespaced_pod(name, NS)  # not an eviction: a budget never blocks a delete
    run.wait_event("launched", attempt=1)
    deadline = time.monotonic() + 60
    while budget(0) is not None or budget(1) is None:
        assert time.monotonic() < deadline, (budget(0), budget(1))
        time.sleep(0.1)
    assert budget(1).spec.min_available == 2
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)
