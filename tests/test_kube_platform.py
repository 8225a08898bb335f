"""The Kubernetes platform end to end: the supervisor as a real subprocess drives the real
``kubernetes`` client against the in-repo fake API server; the fake kubelet runs each pod as
real local processes (one real torchrun agent per pod, gloo ranks, pod IPs 127.0.0.N). Faults
are real: a pod deleted, a rank SIGSTOPped, a node's processes stopped and its Ready condition
False, an eviction and a preemption (DisruptionTarget, then a graceful delete), the controller
SIGKILLed. Each run's loss path is compared with an uninterrupted control under plain torchrun.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import TRAIN, job_env, kill_tree, losses_by_step, read_log, run_job
from fakes.kube_apiserver import RESOURCES, FakeKubeAPIServer
from fakes.kubelet import FakeKubelet
from helm_rbac import allows, rendered_rbac
from supervisor.platforms.kube.client import USER_AGENT

pytestmark = pytest.mark.slow
PY = sys.executable
NS = "ml"
JOB_NAME = "kjob"
STEPS = 30
JOB = ["--steps", str(STEPS), "--checkpoint-every", "5", "--step-sleep", "0.1"]


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """The uninterrupted control: the same job under plain torchrun, 2 ranks."""
    tmp = tmp_path_factory.mktemp("kube-control")
    run_job(tmp, 2, [*JOB, "--log-dir", str(tmp / "log")])
    return {r["step"]: r for r in read_log(tmp / "log", 0)}


class Cluster:
    def __init__(self, tmp: Path, nodes: int) -> None:
        self.api = FakeKubeAPIServer().start()
        self.kubelet = FakeKubelet(self.api, NS, nodes=nodes, log_dir=tmp / "pod-logs").start()
        self.api.log_source = lambda ns, name: self.kubelet.logs(name) if self.kubelet.log_path(name).exists() else None
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.api.url}}],
            "users": [{"name": "me", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me", "namespace": NS}}]}))

    def pods(self, **labels) -> list[dict]:
        return [p for p in self.api.objects("pods", NS)
                if all(p["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())]

    def pod_of_rank(self, log_dir: Path, rank: int, attempt: int) -> dict:
        """The pod running ``rank`` in ``attempt`` (from the rank's own log: its node slot)."""
        for rec in read_log(log_dir / "ranks", rank):
            if rec.get("attempt") == attempt and rec.get("node"):
                slot = rec["node"]
                break
        else:
            raise AssertionError(f"rank {rank} logged no step in attempt {attempt}")
        (pod,) = [p for p in self.pods() if p["metadata"]["annotations"]["elastic-supervisor/slot"] == slot
                  and p["metadata"]["labels"]["elastic-supervisor/attempt"] == str(attempt)]
        return pod

    def stop(self) -> None:
        self.kubelet.stop()
        self.api.stop()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, nodes=3)
    yield c
    c.stop()


class KubeRun:
    """``supervisor run`` with ``platform.kind: kubernetes`` as a real subprocess."""

    def __init__(self, tmp: Path, cluster: Cluster, *, fault: str | None = None, job: list[str] = JOB,
                 nodes: int = 2, overrides: dict | None = None, name: str = "controller",
                 kube: dict | None = None) -> None:
        self.tmp, self.cluster, self.name = tmp, cluster, name
        self.log_dir, self.ckpt = tmp / "logs", tmp / "ckpt"
        kube = {"namespace": NS, "worker": {"image": "fake.invalid/worker:1"}, "python": PY,
                "kubeconfig": str(cluster.kubeconfig), "rdzv_port": 0, "rendezvous": "ip", "node_reads": True,
                "controller_address": "127.0.0.1",
                "termination_grace_s": 10, "delete_confirm_s": 5, "lease_duration_s": 4, "renew_deadline_s": 3,
                "api_retry_s": 20, **(kube or {})}
        cfg = {"job": JOB_NAME, "command": [PY, str(TRAIN), *job], "nproc_per_node": 1,
               "nodes": {"min": nodes, "max": nodes}, "platform": {"kind": "kubernetes", "kubernetes": kube},
               "checkpoint_dir": str(self.ckpt), "log_dir": str(self.log_dir),
               "heartbeat": {"interval_s": 0.5, "timeout_s": 3}, "health": {"phase_floor_s": 3},
               "restart": {"kill_grace_s": 10}, "metrics_linger_s": 0,
               "env": {"OMP_NUM_THREADS": "1", **({"SUPERVISOR_FAULT": fault} if fault else {})}}
        for key, value in (overrides or {}).items():
            cfg[key] = value | cfg.get(key, {}) if isinstance(value, dict) and key != "platform" else value
        self.config = tmp / f"{name}.json"
        self.config.write_text(json.dumps(cfg))
        self.env = job_env(tmp)
        self.start()

    def start(self) -> None:
        self.out = open(self.tmp / f"{self.name}-output.txt", "a")
        self.proc = subprocess.Popen([PY, "-m", "supervisor", "run", "--config", str(self.config)], env=self.env,
                                     stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.tmp)

    def output(self) -> str:
        self.out.flush()
        return (self.tmp / f"{self.name}-output.txt").read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict]:
        try:
            lines = (self.log_dir / "events.jsonl").read_text().splitlines()
        except OSError:
            return []
        return [e for e in map(json.loads, filter(str.strip, lines)) if name is None or e["event"] == name]

    def wait_event(self, name: str, /, timeout: float = 120, **match) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events(name):
                if all(e.get(k) == v for k, v in match.items()):
                    return e
            if self.proc.poll() is not None and not any(all(e.get(k) == v for k, v in match.items())
                                                        for e in self.events(name)):
                break
            time.sleep(0.1)
        raise AssertionError(f"no event {name} {match}; events: {self.events()}\n{self.output()[-5000:]}")

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervisor still running after {timeout}s\n{self.output()[-5000:]}\n"
                                 f"{self.events()}") from None

    def wait_checkpoint(self, step: int, timeout: float = 120) -> None:
        from supervisor.checkpoint import latest_complete

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = latest_complete(self.ckpt).checkpoint if self.ckpt.exists() else None
            if found is not None and found.step >= step:
                return
            assert self.proc.poll() is None, self.output()[-4000:]
            time.sleep(0.05)
        raise AssertionError(f"no checkpoint of step {step}: {self.events()}")

    def losses(self) -> dict[int, dict]:
        return losses_by_step(read_log(self.log_dir / "ranks", 0))

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait(timeout=30)
        self.out.close()


@pytest.fixture
def kube_run(tmp_path, cluster):
    runs: list[KubeRun] = []

    def start(**kw) -> KubeRun:
        run = KubeRun(tmp_path, cluster, **kw)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill()


def assert_same_path(run: KubeRun, control: dict, exact: bool = True) -> None:
    got = run.losses()
    assert sorted(got) == list(range(1, STEPS + 1)), sorted(got)
    for step, rec in control.items():
        if exact:
            assert got[step]["loss_hex"] == rec["loss_hex"], step
        else:
            assert math.isclose(got[step]["loss"], rec["loss"], rel_tol=1e-4), step


def finished(run: KubeRun, code: int = 0) -> dict:
    """The job's end: its verdict, then the controller, which stays up after it (so that its
    Deployment does not restart it), leaves on SIGTERM."""
    done = run.wait_event("job_finished", timeout=240)
    assert done["exit_code"] == code, f"{done}\n{run.output()[-5000:]}\n{run.events()}"
    assert served_verdict(run)["phase"] == done["phase"]
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == code
    return done


def served_verdict(run: KubeRun) -> dict:
    """An idle controller (the job ended) still answers its liveness probe, /readyz and /status:
    a Deployment's probe must not restart it, its scrapers see the verdict."""
    deadline = time.monotonic() + 30
    while not (m := re.search(r"event=serving_verdict phase=\S+ http=([^\s:]+):(\d+)", run.output())):
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.1)
    base = f"http://{m.group(1)}:{m.group(2)}"
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(f"{base}/status", timeout=5) as resp:
        return json.loads(resp.read())


def k8s_event(cluster: Cluster, reason: str, about: str, timeout: float = 30) -> dict:
    """The Kubernetes Event the controller posted with ``reason`` about the object named ``about``
    (posted in the background: wait for it)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in cluster.api.objects("events", NS)
                 if e.get("reason") == reason and e["involvedObject"]["name"] == about]
        if found:
            return found[0]
        assert time.monotonic() < deadline, [(e.get("reason"), e["involvedObject"]) for e in
                                             cluster.api.objects("events", NS)]
        time.sleep(0.1)


def as_the_chart_installs_it(cluster: Cluster, tmp: Path) -> dict:
    """``platform.kubernetes`` as the Helm chart sets it: the release's ConfigMap owns the pods,
    the release's token Secret (mounted in the controller) reaches the ranks by secretKeyRef."""
    token = os.urandom(32).hex()
    cluster.kubelet.v1.create_namespaced_secret(NS, {"metadata": {"name": "demo-elastic-supervisor-token"},
                                                     "data": {"token": base64.b64encode(token.encode()).decode()}})
    cluster.kubelet.v1.create_namespaced_config_map(NS, {"metadata": {"name": "demo-elastic-supervisor-config"},
                                                         "data": {"job.yaml": "{}"}})
    mounted = tmp / "token-secret"
    mounted.mkdir()
    (mounted / "token").write_text(token)
    return {"owner_config_map": "demo-elastic-supervisor-config", "lease": "demo-elastic-supervisor-leader",
            "token_secret": {"name": "demo-elastic-supervisor-token", "key": "token"},
            "token_file": str(mounted / "token")}


def assert_allowed_by_the_charts_rbac(api: FakeKubeAPIServer) -> None:
    """Every request the controller sent (its own User-Agent) is one the chart's Role (namespaced)
    or node ClusterRole (cluster-scoped) allows: the RBAC is what the platform really calls."""
    rules = rendered_rbac({"rbac": {"nodeReads": True}}, namespace=NS)
    made = api.request_counts(user_agent=USER_AGENT)
    assert made, "no request carried the controller's User-Agent"
    refused = []
    for verb, resource in sorted(made):
        rt = RESOURCES[resource.split("/")[0]]
        if not allows(rules["Role" if rt.namespaced else "ClusterRole"], verb, rt.group, resource):
            refused.append((verb, rt.group, resource))
    assert not refused, f"the chart's RBAC refuses requests the controller made: {refused}\nrules: {rules}"


# ------------------------------------------------------------------------------------ the tests
def test_a_job_runs_as_pods_and_completes_bit_identical(cluster, kube_run, control, tmp_path):
    run = kube_run(kube=as_the_chart_installs_it(cluster, tmp_path))
    launched = run.wait_event("launched", attempt=0)
    assert launched["nodes"] == ["fake-node-0", "fake-node-1"] and launched["world_size"] == 2
    done = finished(run)
    assert done["phase"] == "completed"
    assert_same_path(run, control)
    pods = cluster.pods(**{"elastic-supervisor/job": JOB_NAME})
    assert sorted(p["metadata"]["name"] for p in pods) == ["kjob-a0-fake-node-0", "kjob-a0-fake-node-1"]
    for p in pods:
        spec = p["spec"]
        assert spec["restartPolicy"] == "Never" and p["status"]["phase"] == "Succeeded"
        assert p["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "elastic-supervisor"
        (container,) = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        # the token reaches the ranks from the release's Secret, never as a value in the pod spec
        assert env["SUPERVISOR_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "demo-elastic-supervisor-token",
                                                                        "key": "token"}
        assert "SUPERVISOR_TOKEN_FILE" not in env
        assert [o["name"] for o in p["metadata"]["ownerReferences"]] == ["demo-elastic-supervisor-config"]
        node = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert node["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [spec["nodeName"]]
    service = cluster.api.get("services", NS, "kjob-rdzv")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert cluster.api.request_count(verb="watch", resource="pods") >= 1  # observed by watch
    made = cluster.api.request_counts(user_agent=USER_AGENT)
    assert made[("watch", "nodes")] >= 1 and made[("get", "configmaps")] == 1
    assert not [r for _, r in made if r == "secrets"]  # the release's Secret: none written
    assert_allowed_by_the_charts_rbac(cluster.api)
    # `kubectl get events`: the job's own events are on the release's ConfigMap
    owner = "demo-elastic-supervisor-config"
    assert k8s_event(cluster, "GangLaunched", owner)["type"] == "Normal"
    ended = k8s_event(cluster, "JobFinished", owner)
    assert ended["type"] == "Normal" and ended["message"].startswith("completed (exit code 0)")
    assert ended["involvedObject"]["kind"] == "ConfigMap" and ended["involvedObject"]["uid"]


def test_a_pod_deleted_mid_run_is_lost_not_a_bad_node_and_the_gang_resumes(cluster, kube_run, control):
    run = kube_run()
    run.wait_checkpoint(10)
    pod = cluster.pod_of_rank(run.log_dir, 1, attempt=0)
    cluster.kubelet.v1.delete_namespaced_pod(pod["metadata"]["name"], NS)  # kubectl delete pod: graceful
    fault = run.wait_event("fault_detected")
    # the delete's SIGTERM reaches the ranks, which agree to stop (exit 143: preempted) and write
    # an emergency checkpoint; or the pod is seen gone first: lost, deleted by someone else
    assert fault["kind"] == "preempted" or "deleted by someone else" in fault["detail"], fault
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["excluded"] == [] and len(relaunch["nodes"]) == 2  # a deleted pod says nothing of its node
    assert int(relaunch["restore_from"].split("-")[1]) >= 10
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)
    # attempt fencing: nothing of attempt 0 is left
    assert not [p for p in cluster.pods(**{"elastic-supervisor/attempt": "0"})
                if p["status"].get("phase") not in ("Succeeded", "Failed")]


def test_a_sigstopped_rank_is_found_silent_its_pod_killed_and_the_gang_resumes(cluster, kube_run, control):
    run = kube_run(fault="kind=stop,rank=1,step=13,attempt=0")
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "dead" and fault["ranks"] == [1], fault
    kill = run.wait_event("action", action="kill_node")
    assert kill["node"] == fault["nodes"][0]
    # `kubectl describe pod` of the stopped rank's pod says what happened to it and why
    pod = f"{JOB_NAME}-a0-{kill['node']}"
    said = k8s_event(cluster, "RankFault", pod)
    assert said["type"] == "Warning" and "dead on rank(s) 1" in said["message"], said
    assert said["involvedObject"]["kind"] == "Pod" and said["involvedObject"]["uid"]
    assert k8s_event(cluster, "KilledBySupervisor", pod)["type"] == "Warning"
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["restore_from"] == "step-0000000010"
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_a_node_gone_not_ready_is_excluded_and_its_slot_goes_to_the_spare(cluster, kube_run, control):
    run = kube_run()
    run.wait_checkpoint(10)
    pod = cluster.pod_of_rank(run.log_dir, 1, attempt=0)
    node = pod["spec"]["nodeName"]
    cluster.kubelet.node_not_ready(node)  # its processes stopped, Ready=False
    try:
        fault = run.wait_event("fault_detected")
        assert fault["kind"] == "dead" and fault["node_failure"] is True, fault
        relaunch = run.wait_event("launched", attempt=1)
        assert node not in relaunch["nodes"] and "fake-node-2" in relaunch["nodes"], relaunch
        assert relaunch["world_size"] == 2
        assert finished(run)["phase"] == "completed"
    finally:
        cluster.kubelet.node_ready(node)
    assert_same_path(run, control)


@pytest.mark.parametrize("how, reason", [("evict", "EvictionByEvictionAPI"), ("preempt", "PreemptionByScheduler")])
def test_an_evicted_or_preempted_pod_checkpoints_on_its_way_out_and_the_gang_resumes_there(
        cluster, kube_run, control, how, reason):
    run = kube_run()
    run.wait_checkpoint(10)
    pod = cluster.pod_of_rank(run.log_dir, 1, attempt=0)
    getattr(cluster.kubelet, how)(pod["metadata"]["name"])  # DisruptionTarget, then a graceful delete
    fault = run.wait_event("fault_detected")
    assert reason in fault["detail"] or fault["kind"] == "preempted", fault
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["excluded"] == [], relaunch  # not a hardware fault
    # SIGTERM reached the ranks: every rank agreed to stop and the emergency checkpoint was written
    restored = int(relaunch["restore_from"].split("-")[1])
    assert restored % 5 != 0, relaunch
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_a_killed_controller_is_replaced_by_one_that_adopts_the_running_gang(cluster, kube_run, control):
    # the gang must outlast the Lease takeover (a few seconds): with ranks forked from their
    # agent, 30 steps of 0.1 s were over before the next controller could adopt them
    run = kube_run(job=[*JOB[:-1], "0.5"])
    run.wait_event("running", attempt=0)
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods()}
    os.killpg(run.proc.pid, signal.SIGKILL)  # the controller only: the pods train on
    run.proc.wait()
    run.start()  # what the Deployment does
    adopted = run.wait_event("adopted", timeout=90)
    assert adopted["attempt"] == 0
    assert finished(run)["phase"] == "completed"
    assert not run.events("launched")[1:], "the adopted gang was relaunched"
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods()} == pods  # the same pods
    assert_same_path(run, control)


def test_two_controllers_at_once_only_the_lease_holder_acts(cluster, kube_run, control, tmp_path):
    first = kube_run()
    first.wait_event("launched", attempt=0)
    second = kube_run(name="standby")
    # the standby campaigns for the Lease and waits: it launches nothing, kills nothing
    deadline = time.monotonic() + 60
    while "event=leader_election" not in second.output():
        assert time.monotonic() < deadline and second.proc.poll() is None, second.output()
        time.sleep(0.1)
    assert finished(first)["phase"] == "completed"
    assert_same_path(first, control)
    # the first released the Lease at the end; the standby leads now, finds the run finished and
    # does nothing (a Deployment's restarted controller must not train the job again)
    second.wait_event("job_already_finished", phase="completed")
    assert served_verdict(second)["phase"] == "completed"
    assert [e["attempt"] for e in first.events("launched")] == [0]  # one gang, launched once, by one controller
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0


def test_a_controller_killed_in_the_middle_of_a_restart_is_replaced_by_one_that_finishes_it(
        cluster, kube_run, control):
    run = kube_run(fault="kind=crash,rank=1,step=13,attempt=0")
    run.wait_event("action", action="tear_down")
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    run.start()
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["restore_from"] == "step-0000000010"
    assert finished(run)["phase"] == "completed"
    assert not [p for p in cluster.pods(**{"elastic-supervisor/attempt": "0"})
                if p["status"].get("phase") not in ("Succeeded", "Failed")]
    assert_same_path(run, control)


def test_sigterm_to_the_controller_hands_the_running_gang_to_the_next_one(cluster, kube_run, control):
    run = kube_run()
    run.wait_event("running", attempt=0)
    run.proc.send_signal(signal.SIGTERM)  # its pod is replaced (helm upgrade, a drained node)
    assert run.wait(timeout=60) == 0
    assert run.events("controller_handoff") and not run.events("job_finished")
    assert all(p["status"]["phase"] == "Running" for p in cluster.pods())  # the gang trained on
    run.start()
    run.wait_event("adopted", attempt=0)
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_an_api_server_down_for_a_while_stops_no_training(cluster, kube_run, control):
    run = kube_run(job=[*JOB[:-1], "0.5"])  # long enough to outlast the outage and a controller restart
    run.wait_event("running", attempt=0)
    outage = cluster.api.inject_fault(503, user_agent="elastic-supervisor-controller")
    cluster.api.close_watches()
    ckpt_before = sorted(p.name for p in run.ckpt.glob("step-*"))
    # the controller cannot renew its Lease: it stops acting (it may not prove it leads) and
    # leaves, killing nothing; the pods train on meanwhile
    run.wait_event("leadership_lost", timeout=60)
    assert run.wait(timeout=60) == 1
    deadline = time.monotonic() + 60
    while sorted(p.name for p in run.ckpt.glob("step-*")) == ckpt_before:
        assert time.monotonic() < deadline, "no checkpoint written while the API server was down"
        time.sleep(0.1)
    cluster.api.remove_fault(outage)
    run.start()  # what the Deployment does
    run.wait_event("adopted", attempt=0)
    assert finished(run)["phase"] == "completed"
    assert [e["attempt"] for e in run.events("launched")] == [0]  # never relaunched
    assert_same_path(run, control)
