"""The Kubernetes end-to-end harness, shared by every test file that runs ``supervisor run`` with
``platform.kind: kubernetes`` against the in-repo fake API server and kubelet (tests/fakes):
``Cluster`` (the fake cluster), ``KubeRun`` (the controller as a real subprocess), the fixtures
``control``, ``cluster`` and ``kube_run``, and the assertions on a run.

A test module uses the fixtures by importing them (pytest finds fixtures among a module's names):

    from kube_harness import cluster, control, kube_run  # noqa: F401  (fixtures)
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
from typing import Any

import pytest
import yaml

from conftest import TRAIN, job_env, kill_tree, losses_by_step, read_log, run_job
from controller_venv import controller_env, controller_python
from fakes.kube_apiserver import RESOURCES, FakeKubeAPIServer
from fakes.kubelet import FakeKubelet
from helm_rbac import allows, rendered_rbac
from supervisor.platforms.kube.client import USER_AGENT

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
    def __init__(self, tmp: Path, nodes: int, **kubelet: Any) -> None:
        """``kubelet``: the fake kubelet's own arguments (allocatable, images, node_prefix...)."""
        self.api = FakeKubeAPIServer().start()
        self.kubelet = FakeKubelet(self.api, NS, nodes=nodes, log_dir=tmp / "pod-logs", **kubelet).start()
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
    """``supervisor run`` with ``platform.kind: kubernetes`` as a real subprocess: the controller as
    its image ships it (``controller``, default :func:`controller_venv.controller_python`: no torch,
    the package installed with ``--no-deps``), its pods with this test environment's python."""

    def __init__(self, tmp: Path, cluster: Cluster, *, fault: str | None = None, job: list[str] = JOB,
                 nodes: int = 2, overrides: dict | None = None, name: str = "controller",
                 kube: dict | None = None, controller: Path | None = None, script: Path = TRAIN) -> None:
        self.tmp, self.cluster, self.name = tmp, cluster, name
        self.controller = Path(controller or controller_python())
        self.log_dir, self.ckpt = tmp / "logs", tmp / "ckpt"
        kube = {"namespace": NS, "worker": {"image": "fake.invalid/worker:1"}, "python": PY,
                "kubeconfig": str(cluster.kubeconfig), "rdzv_port": 0, "rendezvous": "ip", "node_reads": True,
                "controller_address": "127.0.0.1",
                "termination_grace_s": 10, "delete_confirm_s": 5, "lease_duration_s": 4, "renew_deadline_s": 3,
                "api_retry_s": 20, **(kube or {})}
        cfg = {"job": JOB_NAME, "command": [PY, str(script), *job], "nproc_per_node": 1,
               "nodes": {"min": nodes, "max": nodes}, "platform": {"kind": "kubernetes", "kubernetes": kube},
               "checkpoint_dir": str(self.ckpt), "log_dir": str(self.log_dir),
               "heartbeat": {"interval_s": 0.5, "timeout_s": 3}, "health": {"phase_floor_s": 3},
               "restart": {"kill_grace_s": 10}, "metrics_linger_s": 0,
               "env": {"OMP_NUM_THREADS": "1", **({"SUPERVISOR_FAULT": fault} if fault else {})}}
        for key, value in (overrides or {}).items():  # a mapping is merged over the section (platform: its own keys)
            cfg[key] = cfg.get(key, {}) | value if isinstance(value, dict) else value
        self.config = tmp / f"{name}.json"
        self.config.write_text(json.dumps(cfg))
        self.env = controller_env(job_env(tmp))  # its own copy of the package, not this checkout's
        self.start()

    def start(self) -> None:
        self.out = open(self.tmp / f"{self.name}-output.txt", "a")
        self.proc = subprocess.Popen([str(self.controller), "-m", "supervisor", "run", "--config", str(self.config)],
                                     env=self.env,
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
def kube_run(tmp_path, cluster, tmp_path_factory):
    runs: list[KubeRun] = []
    controller = controller_python(tmp_path_factory)  # built once per session, under pytest's tmp

    def start(**kw) -> KubeRun:
        run = KubeRun(tmp_path, cluster, **{"controller": controller, **kw})
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


