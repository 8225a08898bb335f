"""The fake kubelet and scheduler (tests/fakes/kubelet.py), through the real ``kubernetes`` client.

End-to-end tests of the Kubernetes platform run real torchrun agents as "pods" on this fake;
these tests hold it to the pod contract: env (Secrets included), IPs, phases and exit codes,
scheduling, graceful and forced deletion, and the node and pod faults.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from fakes.kube_apiserver import FakeKubeAPIServer
from fakes.kubelet import FakeKubelet, proc_state

NS = "default"
PY = sys.executable
LABELS = {"app.kubernetes.io/managed-by": "elastic-supervisor", "elastic-supervisor/job": "j1",
          "elastic-supervisor/attempt": "1"}


@pytest.fixture
def api():
    with FakeKubeAPIServer(bookmark_interval_s=30.0) as server:
        yield server


@pytest.fixture
def v1(api):
    return client.CoreV1Api(client.ApiClient(api.configuration()))


@pytest.fixture
def kubelet_factory(api, tmp_path):
    started: list[FakeKubelet] = []

    def make(**kw) -> FakeKubelet:
        kubelet = FakeKubelet(api, NS, log_dir=tmp_path / "pod-logs", **kw).start()
        started.append(kubelet)
        return kubelet
    yield make
    for kubelet in started:
        kubelet.stop()


@pytest.fixture
def kubelet(kubelet_factory):
    return kubelet_factory(nodes=2)


def pod(name: str, code: str, *, env: list | None = None, grace: int | None = None,
        affinity: dict | None = None, slot: int = 0) -> dict:
    spec: dict = {"restartPolicy": "Never",
                  "containers": [{"name": "agent", "image": "trainer:1", "command": [PY, "-c", code],
                                  "env": env or []}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if affinity is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [affinity]}]}}}
    return {"metadata": {"name": name, "labels": {**LABELS, "elastic-supervisor/slot": str(slot)}}, "spec": spec}


def wait_until(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def terminated(p: client.V1Pod) -> client.V1ContainerStateTerminated:
    (status,) = p.status.container_statuses
    assert status.name == "agent" and status.state.terminated is not None, status
    return status.state.terminated


def condition(p: client.V1Pod, type_: str):
    return next((c for c in p.status.conditions or [] if c.type == type_), None)


def waits_for(path: Path) -> str:
    """Python code: wait until ``path`` exists."""
    return f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.01)\n"


SLEEP = "import time\ntime.sleep(120)\n"


class PodWatch:
    """Every event of one pod, read on a thread while the test acts."""

    def __init__(self, api, v1, name: str) -> None:
        self.events: list[tuple[str, dict]] = []
        self.cond = threading.Condition()
        self.w = watch.Watch()
        rv = v1.list_namespaced_pod(NS).metadata.resource_version
        before = api.watch_count("pods")
        threading.Thread(target=self._read, args=(v1, name, rv), daemon=True).start()
        wait_until(lambda: api.watch_count("pods") > before, what="the watch to reach the server")

    def _read(self, v1, name: str, rv: str) -> None:
        for ev in self.w.stream(v1.list_namespaced_pod, NS, field_selector=f"metadata.name={name}",
                                resource_version=rv, timeout_seconds=60):
            with self.cond:
                self.events.append((ev["type"], ev["raw_object"]))
                self.cond.notify_all()

    def wait_for(self, type_: str, timeout: float = 10.0) -> list[tuple[str, dict]]:
        with self.cond:
            assert self.cond.wait_for(lambda: any(t == type_ for t, _ in self.events), timeout), \
                [(t, o.get("status")) for t, o in self.events]
            return list(self.events)


# --- running a pod ------------------------------------------------------------------------------

def test_a_pod_runs_its_command_with_the_merged_env_and_succeeds(kubelet, v1, tmp_path, monkeypatch):
    monkeypatch.setenv("FK_FROM_TEST", "outer")
    monkeypatch.setenv("FK_SHADOWED", "outer")
    v1.create_namespaced_secret(NS, {"metadata": {"name": "job-token"}, "stringData": {"token": "s3cret"}})
    out, go = tmp_path / "env.json", tmp_path / "go"
    code = (f"import json, os\njson.dump(dict(os.environ), open({str(out)!r}, 'w'))\nprint('hello from the pod')\n"
            + waits_for(go))
    v1.create_namespaced_pod(NS, pod("p0", code, env=[
        {"name": "FK_SHADOWED", "value": "inner"},
        {"name": "FK_TOKEN", "valueFrom": {"secretKeyRef": {"name": "job-token", "key": "token"}}}]))
    running = kubelet.wait_phase("p0", "Running")
    node = running.spec.node_name
    assert node in kubelet.nodes
    assert running.status.pod_ip == running.status.host_ip == kubelet.node_ip(node)
    assert kubelet.node_ip(node) in ("127.0.0.2", "127.0.0.3")
    assert running.status.start_time is not None
    assert condition(running, "Ready").status == "True"
    assert running.status.container_statuses[0].state.running.started_at is not None
    assert kubelet.pods_running()["p0"] == kubelet.pid("p0")

    env = wait_until(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()), what="env file")
    assert env["FK_FROM_TEST"] == "outer" and env["FK_SHADOWED"] == "inner" and env["FK_TOKEN"] == "s3cret"
    assert env["POD_NAME"] == "p0" and env["POD_NAMESPACE"] == NS and env["NODE_NAME"] == node
    assert env["POD_IP"] == kubelet.node_ip(node)
    assert env["PATH"] == os.environ["PATH"]
    assert env["TMPDIR"] != os.environ.get("TMPDIR") and Path(env["TMPDIR"]).is_dir()

    go.touch()
    done = kubelet.wait_phase("p0", "Succeeded")
    state = terminated(done)
    assert (state.exit_code, state.reason) == (0, "Completed") and state.finished_at is not None
    assert condition(done, "Ready").status == "False"
    assert "hello from the pod" in kubelet.log_path("p0").read_text()
    assert kubelet.log_path("p0").name == f"{NS}_p0.log"


def test_a_failing_pod_is_failed_with_its_exit_code(kubelet, v1):
    v1.create_namespaced_pod(NS, pod("p0", "import sys; print('bad'); sys.exit(3)"))
    state = terminated(kubelet.wait_phase("p0", "Failed"))
    assert (state.exit_code, state.reason) == (3, "Error")


def test_a_pod_killed_by_sigkill_reports_137(kubelet, v1):
    v1.create_namespaced_pod(NS, pod("p0", SLEEP))
    kubelet.wait_phase("p0", "Running")
    kubelet.kill_pod_process("p0", signal.SIGKILL)
    state = terminated(kubelet.wait_phase("p0", "Failed"))
    assert (state.exit_code, state.reason) == (137, "Error")


def test_a_missing_secret_leaves_the_pod_pending_until_it_exists(kubelet, v1):
    v1.create_namespaced_pod(NS, pod("p0", "pass", env=[
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}]))

    def waiting(message: str):
        p = v1.read_namespaced_pod("p0", NS)
        statuses = p.status.container_statuses or []
        state = statuses[0].state.waiting if statuses else None
        return state and state.message == message and (p.status.phase, state.reason)
    assert wait_until(lambda: waiting('secret "later" not found'), what="the missing secret") == \
        ("Pending", "CreateContainerConfigError")
    v1.create_namespaced_secret(NS, {"metadata": {"name": "later"}, "stringData": {"other": "x"}})
    assert wait_until(lambda: waiting(f"couldn't find key token in Secret {NS}/later"), what="the missing key") == \
        ("Pending", "CreateContainerConfigError")
    v1.patch_namespaced_secret("later", NS, {"stringData": {"token": "t"}})
    assert terminated(kubelet.wait_phase("p0", "Succeeded")).exit_code == 0


# --- scheduling ---------------------------------------------------------------------------------

def test_node_affinity_not_in_a_hostname_avoids_that_node(kubelet, v1):
    v1.create_namespaced_pod(NS, pod("p0", SLEEP, affinity={
        "key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["fake-node-0"]}))
    running = kubelet.wait_phase("p0", "Running")
    assert running.spec.node_name == "fake-node-1"
    assert running.status.pod_ip == "127.0.0.3"
    v1.create_namespaced_pod(NS, pod("p1", SLEEP, affinity={
        "key": "kubernetes.io/hostname", "operator": "In", "values": ["fake-node-1"]}))
    scheduled = wait_until(lambda: condition(v1.read_namespaced_pod("p1", NS), "PodScheduled"),
                           what="a scheduling decision")
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")    # fake-node-1 is full
    assert "didn't match Pod's node affinity" in scheduled.message


def test_pods_per_node_is_respected_and_a_freed_slot_is_used(kubelet_factory, v1, tmp_path):
    kubelet = kubelet_factory(nodes=1, pods_per_node=2)
    go = tmp_path / "go"
    for i in range(2):
        v1.create_namespaced_pod(NS, pod(f"p{i}", waits_for(go), slot=i))
    for i in range(2):
        assert kubelet.wait_phase(f"p{i}", "Running").spec.node_name == "fake-node-0"
    v1.create_namespaced_pod(NS, pod("p2", SLEEP, slot=2))
    wait_until(lambda: (c := condition(v1.read_namespaced_pod("p2", NS), "PodScheduled"))
               and c.reason == "Unschedulable" and "Too many pods" in c.message, what="Unschedulable")
    assert v1.read_namespaced_pod("p2", NS).spec.node_name is None
    go.touch()                 # p0 and p1 succeed: terminated pods hold no slot
    assert kubelet.wait_phase("p2", "Running").spec.node_name == "fake-node-0"


def test_an_unschedulable_pod_is_scheduled_when_a_node_becomes_ready(kubelet_factory, v1):
    kubelet = kubelet_factory(nodes=1)
    kubelet.node_not_ready("fake-node-0")
    v1.create_namespaced_pod(NS, pod("p0", SLEEP))
    wait_until(lambda: (c := condition(v1.read_namespaced_pod("p0", NS), "PodScheduled"))
               and (c.status, c.reason) == ("False", "Unschedulable"), what="Unschedulable")
    assert v1.read_namespaced_pod("p0", NS).status.phase == "Pending"
    kubelet.node_ready("fake-node-0")
    running = kubelet.wait_phase("p0", "Running")
    assert running.spec.node_name == "fake-node-0"
    assert condition(running, "PodScheduled").status == "True"


def test_nodes_are_registered_ready_with_their_ips(kubelet, v1):
    nodes = {n.metadata.name: n for n in v1.list_node().items}
    assert sorted(nodes) == ["fake-node-0", "fake-node-1"]
    for i, name in enumerate(sorted(nodes)):
        node = nodes[name]
        assert node.metadata.labels["kubernetes.io/hostname"] == name
        assert [(a.type, a.address) for a in node.status.addresses if a.type == "InternalIP"] == \
            [("InternalIP", f"127.0.0.{i + 2}")] == [("InternalIP", kubelet.node_ip(name))]
        assert condition(node, "Ready").status == "True"


# --- deletion -----------------------------------------------------------------------------------

TRAP_TERM = """import signal, sys, time
def on_term(*_):
    open({marker!r}, 'w').write(str(time.time()))
    {after}
signal.signal(signal.SIGTERM, on_term)
open({ready!r}, 'w').close()
while True:
    time.sleep(0.05)
"""


def test_graceful_delete_sends_sigterm_and_the_pod_goes_when_the_process_exits(kubelet, v1, tmp_path):
    marker, ready = tmp_path / "term", tmp_path / "ready"
    v1.create_namespaced_pod(NS, pod("p0", TRAP_TERM.format(marker=str(marker), ready=str(ready),
                                                          after="sys.exit(0)")))
    kubelet.wait_phase("p0", "Running")
    wait_until(ready.exists, what="the handler installed")
    v1.delete_namespaced_pod("p0", NS, grace_period_seconds=30)
    kubelet.wait_gone("p0", timeout=10)           # long before the 30 s grace: the process exited
    assert marker.exists()


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(api, kubelet, v1, tmp_path):
    marker, ready = tmp_path / "term", tmp_path / "ready"
    v1.create_namespaced_pod(NS, pod("p0", TRAP_TERM.format(marker=str(marker), ready=str(ready),
                                                          after="pass")))
    kubelet.wait_phase("p0", "Running")
    wait_until(ready.exists, what="the handler installed")
    pid = kubelet.pid("p0")
    events = PodWatch(api, v1, "p0")
    deleted_at = time.monotonic()
    v1.delete_namespaced_pod("p0", NS, grace_period_seconds=2)
    wait_until(marker.exists, what="SIGTERM delivered")
    assert v1.read_namespaced_pod("p0", NS).metadata.deletion_timestamp is not None
    seen = events.wait_for("DELETED", timeout=10)
    assert time.monotonic() - deleted_at >= 1.9            # the grace period was honoured
    assert proc_state(pid) in (None, "Z")
    final = [o for t, o in seen if t == "MODIFIED"][-1]    # the kubelet's last status, then the delete
    assert final["status"]["phase"] == "Failed"
    assert final["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_delete_with_grace_zero_kills_at_once(kubelet, v1):
    v1.create_namespaced_pod(NS, pod("p0", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                           "time.sleep(120)\n", grace=60))
    kubelet.wait_phase("p0", "Running")
    pid = kubelet.pid("p0")
    v1.delete_namespaced_pod("p0", NS, grace_period_seconds=0)
    with pytest.raises(ApiException) as info:
        v1.read_namespaced_pod("p0", NS)
    assert info.value.status == 404
    wait_until(lambda: proc_state(pid) in (None, "Z"), timeout=3, what="the process killed")


@pytest.mark.parametrize("fault, reason", [("evict", "EvictionByEvictionAPI"), ("preempt", "PreemptionByScheduler")])
def test_disruption_target_is_visible_before_the_pod_goes(api, kubelet, v1, fault, reason):
    v1.create_namespaced_pod(NS, pod("p0", SLEEP))
    kubelet.wait_phase("p0", "Running")
    events = PodWatch(api, v1, "p0")
    getattr(kubelet, fault)("p0")
    seen = events.wait_for("DELETED")
    flagged = [i for i, (t, o) in enumerate(seen)
               if any(c["type"] == "DisruptionTarget" and c["status"] == "True" and c["reason"] == reason
                      for c in (o.get("status") or {}).get("conditions") or [])]
    deleting = [i for i, (_, o) in enumerate(seen) if o["metadata"].get("deletionTimestamp")]
    assert flagged and deleting and flagged[0] < deleting[0] and seen[-1][0] == "DELETED"
    assert seen[deleting[0]][1]["metadata"]["deletionGracePeriodSeconds"] == 30   # the pod's default


# --- node faults --------------------------------------------------------------------------------

SPAWNS_A_SESSION = f"""import subprocess, time
subprocess.Popen([{PY!r}, '-c', 'import time; time.sleep(120)'], start_new_session=True)
time.sleep(120)
"""


def test_node_not_ready_stops_every_process_and_node_ready_resumes_them(kubelet, v1):
    v1.create_namespaced_pod(NS, pod("p0", SPAWNS_A_SESSION))
    node = kubelet.wait_phase("p0", "Running").spec.node_name
    pids = wait_until(lambda: len(p := kubelet.container_pids("p0")) == 2 and p, what="the child")
    # both asleep first: a child seen between its fork and its exec holds its parent in vfork
    # (uninterruptible: a SIGSTOP there stops the child, and the parent not before it execs)
    wait_until(lambda: all(proc_state(p) == "S" for p in pids), what="the processes asleep")
    kubelet.node_not_ready(node)
    wait_until(lambda: all(proc_state(p) == "T" for p in pids), timeout=10, what="the processes stopped")
    ready = condition(v1.read_node(node), "Ready")
    assert (ready.status, ready.reason) == ("False", "KubeletNotReady")
    kubelet.node_ready(node)
    wait_until(lambda: all(proc_state(p) in ("S", "R") for p in pids), timeout=3, what="the processes resumed")
    assert condition(v1.read_node(node), "Ready").status == "True"
    assert v1.read_namespaced_pod("p0", NS).status.phase == "Running"


def test_kill_node_kills_the_processes_and_its_kubelet_falls_silent(kubelet, v1):
    v1.create_namespaced_pod(NS, pod("p0", SPAWNS_A_SESSION))
    node = kubelet.wait_phase("p0", "Running").spec.node_name
    pids = wait_until(lambda: len(p := kubelet.container_pids("p0")) == 2 and p, what="the child")
    kubelet.kill_node(node)
    wait_until(lambda: all(proc_state(p) in (None, "Z") for p in pids), timeout=3, what="the processes killed")
    wait_until(lambda: "p0" not in kubelet.pods_running(), what="the kubelet to see the exit")
    ready = condition(v1.read_node(node), "Ready")
    assert (ready.status, ready.reason) == ("Unknown", "NodeStatusUnknown")
    assert v1.read_namespaced_pod("p0", NS).status.phase == "Running"       # a dead kubelet reports nothing
    kubelet.node_ready(node)                  # the kubelet comes back and reports what it finds
    assert terminated(kubelet.wait_phase("p0", "Failed")).exit_code == 137


# --- the watch ----------------------------------------------------------------------------------

def test_a_kubelet_that_missed_changes_relists_after_410(api, kubelet_factory, v1):
    # room for both pods: what is tested is the relist, not admission against a stale cache
    kubelet = kubelet_factory(nodes=1, pods_per_node=2)
    v1.create_namespaced_pod(NS, pod("old", SLEEP))
    kubelet.wait_phase("old", "Running")
    old_pid = kubelet.pid("old")
    lists = api.request_count(verb="list", resource="pods")
    fault = api.inject_fault(503, verb="watch", resource="pods", user_agent="fake-kubelet")
    api.close_watches()
    wait_until(lambda: fault.hits > 0, what="the kubelet to try to watch again")
    v1.delete_namespaced_pod("old", NS, grace_period_seconds=0)
    v1.create_namespaced_pod(NS, pod("new", "pass", slot=1))
    api.compact()                                       # the kubelet's resourceVersion is now too old
    api.remove_fault(fault)
    assert terminated(kubelet.wait_phase("new", "Succeeded")).exit_code == 0
    wait_until(lambda: proc_state(old_pid) in (None, "Z"), what="the deleted pod's process killed")
    assert api.request_count(verb="list", resource="pods") > lists


def test_stop_kills_every_process(api, tmp_path, v1):
    kubelet = FakeKubelet(api, NS, nodes=1, log_dir=tmp_path).start()
    try:
        v1.create_namespaced_pod(NS, pod("p0", SPAWNS_A_SESSION))
        kubelet.wait_phase("p0", "Running")
        pids = wait_until(lambda: len(p := kubelet.container_pids("p0")) == 2 and p, what="the child")
    finally:
        kubelet.stop()
    assert all(proc_state(p) in (None, "Z") for p in pids)
