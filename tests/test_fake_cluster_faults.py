"""The fake cluster (tests/fakes) where a real one refuses, holds back or kills a pod, through
the real ``kubernetes`` client: scheduling by resources and its messages, scheduling gates, the
image registry and its back-off, memory limits in a real cgroup (the kernel's OOM killer),
kubelet admission rejects and node-pressure eviction. Each field value is the one a 1.30
cluster writes (kube-scheduler's FitError, the kubelet's admission and eviction messages,
containerd's pull errors).
"""

from __future__ import annotations

import signal
import sys
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fakes.kube_apiserver import FakeKubeAPIServer
from fakes.kubelet import DEFAULT_IMAGES, FakeKubelet, normalize_image, proc_state
from test_fake_kubelet import api, kubelet_factory, v1, wait_until  # noqa: F401  (fixtures: one definition)

NS = "default"
PY = sys.executable
SLEEP = "import time\ntime.sleep(120)\n"
GPU = "nvidia.com/gpu"


def pod(name: str, code: str = SLEEP, *, image: str = "trainer:1", resources: dict | None = None,
        node: str | None = None, **spec) -> dict:
    container: dict = {"name": "agent", "image": image, "command": [PY, "-c", code]}
    if resources is not None:
        container["resources"] = resources
    body = {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [container], **spec}}
    if node is not None:
        body["spec"]["nodeName"] = node
    return body


def gpus(n: int) -> dict:
    return {"limits": {GPU: str(n)}}




def condition(p: client.V1Pod, type_: str):
    return next((c for c in p.status.conditions or [] if c.type == type_), None)


def scheduled_condition(v1, name: str, reason: str = "Unschedulable"):
    """The PodScheduled condition once the scheduler has given ``reason``."""
    def seen():
        c = condition(v1.read_namespaced_pod(name, NS), "PodScheduled")
        return c if c is not None and c.status == "False" and c.reason == reason else None
    return wait_until(seen, what=f"PodScheduled={reason} on {name}")


def waiting(v1, name: str, reason: str, timeout: float = 10.0):
    """The container's ``state.waiting`` once its reason is ``reason`` (and the pod, as read)."""
    def seen():
        p = v1.read_namespaced_pod(name, NS)
        statuses = p.status.container_statuses or []
        state = statuses[0].state.waiting if statuses else None
        return (p, state) if state is not None and state.reason == reason else None
    return wait_until(seen, timeout=timeout, what=f"{name} waiting with {reason}")


# --- scheduling by resources ------------------------------------------------------------------

def test_nodes_report_capacity_and_allocatable(kubelet_factory, v1):
    kubelet_factory(nodes=2, allocatable={GPU: "8", "cpu": "16"}, node_allocatable={"fake-node-1": {GPU: "4"}})
    nodes = {n.metadata.name: n for n in v1.list_node().items}
    assert nodes["fake-node-0"].status.allocatable[GPU] == "8" == nodes["fake-node-0"].status.capacity[GPU]
    assert nodes["fake-node-1"].status.allocatable[GPU] == "4"
    assert nodes["fake-node-1"].status.allocatable["cpu"] == "16"
    assert nodes["fake-node-0"].status.allocatable["pods"] == "1"
    assert {"memory", "ephemeral-storage"} <= set(nodes["fake-node-0"].status.allocatable)


def test_a_pod_asking_more_gpus_than_a_node_has_is_unschedulable_with_the_schedulers_message(kubelet_factory, v1):
    kubelet_factory(nodes=3, pods_per_node=4, allocatable={GPU: "1"})
    v1.create_namespaced_pod(NS, pod("p0", resources=gpus(2)))
    cond = scheduled_condition(v1, "p0")
    assert cond.message == ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
                            "available: 3 No preemption victims found for incoming pod.")
    p = v1.read_namespaced_pod("p0", NS)
    assert p.status.phase == "Pending" and p.spec.node_name is None


def test_gpus_held_by_running_pods_are_freed_when_a_pod_goes(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=2, pods_per_node=4, allocatable={GPU: "1"})
    for i in range(2):
        v1.create_namespaced_pod(NS, pod(f"p{i}", resources=gpus(1)))
    nodes = {kubelet.wait_phase(f"p{i}", "Running").spec.node_name for i in range(2)}
    assert nodes == {"fake-node-0", "fake-node-1"}
    v1.create_namespaced_pod(NS, pod("late", resources=gpus(1)))
    assert scheduled_condition(v1, "late").message.startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    freed = v1.read_namespaced_pod("p0", NS).spec.node_name
    v1.delete_namespaced_pod("p0", NS, grace_period_seconds=0)
    running = kubelet.wait_phase("late", "Running")
    assert running.spec.node_name == freed
    assert condition(running, "PodScheduled").status == "True"


def test_reasons_combine_as_the_scheduler_writes_them(kubelet_factory, v1):
    kubelet_factory(nodes=3, pods_per_node=4, allocatable={GPU: "1"},
                    node_labels={"fake-node-1": {"pool": "gpu"}, "fake-node-2": {"pool": "gpu"}})
    v1.create_namespaced_pod(NS, pod("p0", resources=gpus(2), nodeSelector={"pool": "gpu"}))
    assert scheduled_condition(v1, "p0").message == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient "
        "nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
        "2 No preemption victims found for incoming pod.")


def test_cpu_and_memory_limits_without_requests_count_as_requests(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1, pods_per_node=4, allocatable={"cpu": "2", "memory": "1Gi"})
    v1.create_namespaced_pod(NS, pod("p0", resources={"limits": {"cpu": "1500m", "memory": "512Mi"}}))
    kubelet.wait_phase("p0", "Running")
    v1.create_namespaced_pod(NS, pod("p1", resources={"requests": {"cpu": "600m", "memory": "600Mi"}}))
    assert scheduled_condition(v1, "p1").message == (
        "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory. preemption: 0/1 nodes are "
        "available: 1 No preemption victims found for incoming pod.")
    v1.create_namespaced_pod(NS, pod("p2", resources={"requests": {"cpu": "500m", "memory": "512Mi"}}))
    assert kubelet.wait_phase("p2", "Running").spec.node_name == "fake-node-0"      # exactly what is left


def test_pods_of_other_namespaces_hold_their_resources(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=2, pods_per_node=4, allocatable={GPU: "1"})
    v1.create_namespaced_pod("other", pod("elsewhere", resources=gpus(1), node="fake-node-0"))
    v1.create_namespaced_pod(NS, pod("p0", resources=gpus(1)))
    assert kubelet.wait_phase("p0", "Running").spec.node_name == "fake-node-1"


def test_a_not_ready_node_is_tainted_and_named_so(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1)
    kubelet.node_not_ready("fake-node-0")
    taints = v1.read_node("fake-node-0").spec.taints
    assert [(t.key, t.effect) for t in taints] == [("node.kubernetes.io/not-ready", "NoSchedule")]
    v1.create_namespaced_pod(NS, pod("p0"))
    assert scheduled_condition(v1, "p0").message == (
        "0/1 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }. preemption: "
        "0/1 nodes are available: 1 Preemption is not helpful for scheduling.")
    kubelet.node_ready("fake-node-0")
    assert not v1.read_node("fake-node-0").spec.taints
    kubelet.wait_phase("p0", "Running")


# --- scheduling gates -------------------------------------------------------------------------

def test_a_gated_pod_waits_until_its_gates_are_removed(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1)
    v1.create_namespaced_pod(NS, pod("p0", schedulingGates=[{"name": "example.com/quota"}, {"name": "later"}]))
    cond = scheduled_condition(v1, "p0", "SchedulingGated")
    assert cond.message == "Scheduling is blocked due to non-empty scheduling gates"
    with pytest.raises(ApiException) as info:     # gates can only be removed
        v1.patch_namespaced_pod("p0", NS, {"spec": {"schedulingGates": [
            {"name": "example.com/quota"}, {"name": "later"}, {"name": "more"}]}})
    assert info.value.status == 422
    assert "spec.schedulingGates[2].name: Forbidden: only deletion is allowed, but found new scheduling gate " \
           "'more'" in info.value.body
    v1.patch_namespaced_pod("p0", NS, {"spec": {"schedulingGates": [{"name": "later"}]}})
    assert v1.read_namespaced_pod("p0", NS).spec.node_name is None
    v1.patch_namespaced_pod("p0", NS, {"spec": {"schedulingGates": None}})
    running = kubelet.wait_phase("p0", "Running")
    assert condition(running, "PodScheduled").status == "True"


# --- images -----------------------------------------------------------------------------------

def test_a_pulled_image_is_reported_with_its_id(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1)
    v1.create_namespaced_pod(NS, pod("p0", image="trainer:1"))
    (status,) = kubelet.wait_phase("p0", "Running").status.container_statuses
    assert status.image == "docker.io/library/trainer:1"
    assert status.image_id.startswith("docker.io/library/trainer@sha256:") and len(status.image_id.split(":")[-1]) == 64
    assert "fake.invalid/worker:1" in DEFAULT_IMAGES


def test_an_image_is_pulled_by_the_digest_a_pod_reported_and_an_unknown_digest_is_not_found(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=3)
    v1.create_namespaced_pod(NS, pod("p0", image="trainer:1"))
    (first,) = kubelet.wait_phase("p0", "Running").status.container_statuses
    v1.create_namespaced_pod(NS, pod("p1", image=first.image_id))  # what a rollback to "exactly that image" names
    (again,) = kubelet.wait_phase("p1", "Running").status.container_statuses
    assert again.image_id == first.image_id
    unknown = first.image_id.split("@")[0] + "@sha256:" + "0" * 64
    v1.create_namespaced_pod(NS, pod("p2", image=unknown))
    _, state = waiting(v1, "p2", "ErrImagePull")
    assert state.message.endswith(f"{unknown}: not found")


def test_an_unknown_image_alternates_err_image_pull_and_back_off_then_runs_once_pushed(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1, image_pull_backoff_s=0.4, image_pull_backoff_max_s=2.0)
    v1.create_namespaced_pod(NS, pod("p0", image="nope:1"))
    p, state = waiting(v1, "p0", "ErrImagePull")
    assert state.message == ('rpc error: code = NotFound desc = failed to pull and unpack image '
                             '"docker.io/library/nope:1": failed to resolve reference "docker.io/library/nope:1": '
                             'docker.io/library/nope:1: not found')
    assert p.status.phase == "Pending"
    for type_ in ("Ready", "ContainersReady"):
        c = condition(p, type_)
        assert (c.status, c.reason, c.message) == ("False", "ContainersNotReady", "containers with unready status: [agent]")
    p, state = waiting(v1, "p0", "ImagePullBackOff")
    assert state.message == 'Back-off pulling image "nope:1"' and p.status.phase == "Pending"
    waiting(v1, "p0", "ErrImagePull")           # the back-off ends: another pull, which fails again
    waiting(v1, "p0", "ImagePullBackOff")
    kubelet.add_image("nope:1")
    (status,) = kubelet.wait_phase("p0", "Running").status.container_statuses
    assert status.image == "docker.io/library/nope:1"


def test_an_unresolvable_registry_says_no_such_host(kubelet_factory, v1):
    kubelet_factory(nodes=1)
    v1.create_namespaced_pod(NS, pod("p0", image="registry.example.invalid/team/train:v3"))
    _, state = waiting(v1, "p0", "ErrImagePull")
    assert state.message.startswith('rpc error: code = Unknown desc = failed to pull and unpack image '
                                    '"registry.example.invalid/team/train:v3"')
    assert state.message.endswith('Head "https://registry.example.invalid/v2/team/train/manifests/v3": dial tcp: '
                                  'lookup registry.example.invalid: no such host')


@pytest.mark.parametrize("image, error", [
    ("bad image:1", "invalid reference format"),
    ("Bad Image", "invalid reference format: repository name (library/Bad Image) must be lowercase"),
    ("trainer:1@sha256:zz", "invalid reference format"),
])
def test_an_invalid_image_reference_is_invalid_image_name(kubelet_factory, v1, image, error):
    kubelet_factory(nodes=1)
    v1.create_namespaced_pod(NS, pod("p0", image=image))
    p, state = waiting(v1, "p0", "InvalidImageName")
    assert state.message == f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": {error}'
    assert p.status.phase == "Pending"


def test_pull_policy_never_runs_only_what_is_there(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=2)
    body = pod("p0", image="nope:1")
    body["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    v1.create_namespaced_pod(NS, body)
    _, state = waiting(v1, "p0", "ErrImageNeverPull")
    assert state.message == 'Container image "nope:1" is not present with pull policy of Never'
    present = pod("p1", image="trainer:1")
    present["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    v1.create_namespaced_pod(NS, present)
    kubelet.wait_phase("p1", "Running")


def test_normalize_image():
    assert normalize_image("trainer") == ("docker.io/library/trainer:latest", "docker.io/library/trainer")
    assert normalize_image("fake.invalid/worker:1") == ("fake.invalid/worker:1", "fake.invalid/worker")
    assert normalize_image("localhost:5000/a/b:c")[1] == "localhost:5000/a/b"


def test_a_missing_secret_is_create_container_config_error_after_the_pull(kubelet_factory, v1):
    kubelet_factory(nodes=1)
    body = pod("p0")
    body["spec"]["containers"][0]["env"] = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "x", "key": "token"}}}]
    v1.create_namespaced_pod(NS, body)
    _, state = waiting(v1, "p0", "CreateContainerConfigError")
    assert state.message == 'secret "x" not found'


# --- memory limits: a real cgroup ---------------------------------------------------------------

ALLOCATE = """import time
chunks = []
for _ in range(64):
    chunks.append(bytearray(16 << 20))   # touched: 16 MiB a step, past the limit soon
    time.sleep(0.005)
time.sleep(60)
"""

CHILD_ALLOCATES = f"""import subprocess, time
subprocess.Popen([{PY!r}, '-c', {ALLOCATE!r}])
time.sleep(60)
"""


def memory_kubelet(kubelet_factory) -> FakeKubelet:
    kubelet = kubelet_factory(nodes=1)
    if not kubelet.enforces_memory:
        pytest.skip(f"no memory cgroup on this host: {kubelet.memory_unavailable_reason}")
    return kubelet


@pytest.mark.parametrize("code", [ALLOCATE, CHILD_ALLOCATES], ids=["main-process", "a-child"])
def test_a_container_past_its_memory_limit_is_oom_killed_whole(kubelet_factory, v1, code):
    kubelet = memory_kubelet(kubelet_factory)
    v1.create_namespaced_pod(NS, pod("p0", code, resources={"limits": {"memory": "128Mi"}}))
    kubelet.wait_phase("p0", "Running")
    c = kubelet._current("p0")
    assert c.cgroup is not None and c.cgroup.is_dir()
    failed = kubelet.wait_phase("p0", "Failed", timeout=30)
    (status,) = failed.status.container_statuses
    assert (status.state.terminated.reason, status.state.terminated.exit_code) == ("OOMKilled", 137)
    assert condition(failed, "Ready").reason == "PodFailed"
    wait_until(lambda: not c.cgroup.exists(), what="the cgroup removed")
    assert kubelet.container_pids("p0") == set()


def test_a_container_within_its_limit_runs_and_no_limit_means_no_cgroup(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1, pods_per_node=2)
    v1.create_namespaced_pod(NS, pod("free", "print('ok')"))
    assert kubelet.wait_phase("free", "Succeeded")
    assert kubelet._current("free").cgroup is None and not kubelet._cgroups._probed
    if not kubelet.enforces_memory:
        pytest.skip(f"no memory cgroup on this host: {kubelet.memory_unavailable_reason}")
    v1.create_namespaced_pod(NS, pod("small", "x = bytearray(8 << 20)\nprint('ok')",
                                     resources={"limits": {"memory": "256Mi"}}))
    done = kubelet.wait_phase("small", "Succeeded", timeout=20)
    assert done.status.container_statuses[0].state.terminated.reason == "Completed"


# --- kubelet admission ----------------------------------------------------------------------------

def test_unhealthy_devices_the_scheduler_did_not_see_are_an_unexpected_admission_error(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1, pods_per_node=4, allocatable={GPU: "2"})
    v1.create_namespaced_pod(NS, pod("p0", resources=gpus(1)))
    kubelet.wait_phase("p0", "Running")
    kubelet.set_device_health("fake-node-0", GPU, healthy=1)       # allocatable still says 2
    assert v1.read_node("fake-node-0").status.allocatable[GPU] == "2"
    v1.create_namespaced_pod(NS, pod("p1", resources=gpus(1)))
    failed = kubelet.wait_phase("p1", "Failed")
    assert failed.spec.node_name == "fake-node-0"
    assert failed.status.reason == "UnexpectedAdmissionError"
    assert failed.status.message == ("Pod was rejected: Allocate failed due to requested number of devices "
                                     "unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected")
    assert not failed.status.container_statuses            # never started
    kubelet.set_device_health("fake-node-0", GPU, healthy=0)
    v1.create_namespaced_pod(NS, pod("p2", resources=gpus(1)))
    assert kubelet.wait_phase("p2", "Failed").status.message == (
        "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
        "nvidia.com/gpu, which is unexpected")
    kubelet.publish_node_status("fake-node-0")                  # the next node status update
    node = v1.read_node("fake-node-0").status
    assert (node.allocatable[GPU], node.capacity[GPU]) == ("0", "2")
    v1.create_namespaced_pod(NS, pod("p3", resources=gpus(1)))
    assert "1 Insufficient nvidia.com/gpu" in scheduled_condition(v1, "p3").message


def test_a_pod_bound_past_allocatable_is_rejected_out_of_the_resource(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1, pods_per_node=2, allocatable={"cpu": "2", GPU: "8"})
    v1.create_namespaced_pod(NS, pod("cpu", resources={"requests": {"cpu": "3"}}, node="fake-node-0"))
    failed = kubelet.wait_phase("cpu", "Failed")
    assert (failed.status.reason, failed.status.message) == (
        "OutOfcpu", "Pod was rejected: Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000")
    assert not failed.status.container_statuses
    # a resource no device plugin serves: the predicate handler's OutOf<resource>
    kubelet.set_device_health("fake-node-0", GPU, None)
    v1.create_namespaced_pod(NS, pod("gpu", resources=gpus(9), node="fake-node-0"))
    failed = kubelet.wait_phase("gpu", "Failed")
    assert (failed.status.reason, failed.status.message) == (
        "OutOfnvidia.com/gpu",
        "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 9, used: 0, capacity: 8")
    v1.create_namespaced_pod(NS, pod("a", node="fake-node-0"))
    v1.create_namespaced_pod(NS, pod("b", node="fake-node-0"))
    kubelet.wait_phase("a", "Running")
    kubelet.wait_phase("b", "Running")
    v1.create_namespaced_pod(NS, pod("c", node="fake-node-0"))
    failed = kubelet.wait_phase("c", "Failed")
    assert (failed.status.reason, failed.status.message) == (
        "OutOfpods", "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2")


def test_a_pod_bound_past_its_gpus_is_refused_by_the_device_manager_first(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1, pods_per_node=4, allocatable={GPU: "8"})
    v1.create_namespaced_pod(NS, pod("p0", resources=gpus(8)))
    kubelet.wait_phase("p0", "Running")
    v1.create_namespaced_pod(NS, pod("p1", resources=gpus(1), node="fake-node-0"))
    failed = kubelet.wait_phase("p1", "Failed")
    assert failed.status.reason == "UnexpectedAdmissionError"
    assert "Requested: 1, Available: 0" in failed.status.message


# --- node-pressure eviction ---------------------------------------------------------------------

TRAPS_TERM = """import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
open({ready!r}, 'w').close()
while True:
    time.sleep(0.05)
"""


def test_a_soft_eviction_sigterms_and_leaves_a_failed_evicted_pod(api, kubelet_factory, v1, tmp_path):
    kubelet = kubelet_factory(nodes=1)
    ready = tmp_path / "ready"
    v1.create_namespaced_pod(NS, pod("p0", TRAPS_TERM.format(ready=str(ready))))
    kubelet.wait_phase("p0", "Running")
    wait_until(ready.exists, what="the handler installed")
    message = kubelet.evict_for_pressure("p0", "memory", grace_s=10)
    assert message.startswith("The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi. "
                              "Container agent was using ")
    assert message.endswith("Ki, request is 0, has larger consumption of memory. ")
    failed = kubelet.wait_phase("p0", "Failed", timeout=8)      # SIGTERM: it exits long before the grace
    assert (failed.status.reason, failed.status.message) == ("Evicted", message)
    target = condition(failed, "DisruptionTarget")
    assert (target.status, target.reason, target.message) == ("True", "TerminationByKubelet", message)
    terminated = failed.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert failed.metadata.deletion_timestamp is None          # the pod object stays


def test_a_hard_eviction_kills_at_once(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1)
    v1.create_namespaced_pod(NS, pod("p0", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                           "time.sleep(120)\n"))
    kubelet.wait_phase("p0", "Running")
    pid = kubelet.pid("p0")
    message = kubelet.evict_for_pressure("p0", "ephemeral-storage", grace_s=0, threshold="10Gi", available="9Gi")
    assert message == "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. "
    failed = kubelet.wait_phase("p0", "Failed", timeout=5)
    assert failed.status.reason == "Evicted"
    assert failed.status.container_statuses[0].state.terminated.exit_code == 137
    assert proc_state(pid) in (None, "Z")
    assert v1.read_namespaced_pod("p0", NS).status.phase == "Failed"


def test_an_eviction_with_a_grace_ends_in_sigkill(kubelet_factory, v1, tmp_path):
    kubelet = kubelet_factory(nodes=1)
    ready = tmp_path / "ready"
    v1.create_namespaced_pod(NS, pod("p0", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                           f"open({str(ready)!r}, 'w').close()\ntime.sleep(120)\n"))
    kubelet.wait_phase("p0", "Running")
    wait_until(ready.exists, what="SIGTERM ignored")
    started = time.monotonic()
    kubelet.evict_for_pressure("p0", grace_s=1)
    failed = kubelet.wait_phase("p0", "Failed", timeout=8)
    assert time.monotonic() - started >= 0.9
    assert failed.status.container_statuses[0].state.terminated.exit_code == 128 + signal.SIGKILL
