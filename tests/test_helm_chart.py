"""The Helm chart (helm/elastic-supervisor) rendered by Helm's own engine, checked object by object.

No cluster can run here: ``helm_python`` (helm-python-sdk, Helm v4's Go engine) lints the chart
strictly and renders it with several value sets; every rendered object then passes
``kubernetes_validate`` in strict mode (misspelled fields are errors) for Kubernetes 1.30 and the
newest version it knows, and the Prometheus Operator objects (CRDs, which kubernetes_validate
skips) pass the ``cloudcoil-models-prometheus-operator`` models with no field dropped. On top:
the RBAC verbs exactly, the non-root security context, the schema refusing bad values with the
field named, the job config against supervisor/config.py, the PrometheusRule against
deploy/prometheus/rules/, and ``lookup`` keeping the token on upgrade (a cluster-aware render
against a small fake API server).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import json
import logging
import re
import socket
import tarfile
import threading
import typing
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml
from kubernetes import client as kubernetes_client
from cloudcoil.models.prometheus_operator import v1 as prom_v1

from supervisor import config as job_config
from supervisor.platforms.base import LaunchSpec
from supervisor.platforms.kube.client import KubeApi
from supervisor.platforms.kube.platform import KubernetesPlatform, settings_from_config

from fakes.kube_apiserver import pod_security_results
from helm_rbac import allows, rendered_rbac

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "elastic-supervisor"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "supervisor-alerts.yml"
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
RELEASE, NAMESPACE = "demo", "train"
FULLNAME = f"{RELEASE}-elastic-supervisor"
KUBE_VERSIONS = ("1.30", kubernetes_validate.latest_version())
CHART_OWNED_CONFIG = {"platform", "checkpoint_dir", "log_dir", "http", "intake"}
"""JobConfig fields the chart sets itself (cluster-dependent); the schema refuses them in values."""

GPU_FLEET = yaml.safe_load("""
config:
  job: llama-70b
  command: [python, /app/train.py]
  nodes: {min: 32, max: 32}
  nproc_per_node: 8
workers:
  image: {repository: registry.example/llama-train, tag: v7}
  resources:
    limits: {nvidia.com/gpu: 8, rdma/ib: 1, hugepages-2Mi: 2Gi, memory: 1600Gi}
    requests: {cpu: "180", memory: 1600Gi}
  nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  priorityClassName: training-high
  terminationGracePeriodSeconds: 180
  podTemplate:
    metadata:
      labels: {kueue.x-k8s.io/queue-name: gpu-h100, team: llm}
      annotations: {cluster-autoscaler.kubernetes.io/safe-to-evict: "false"}
    spec:
      schedulerName: default-scheduler
      runtimeClassName: nvidia
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      hostIPC: true
      tolerations:
        - {key: rdma, operator: Exists, effect: NoSchedule}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions: [{key: node.kubernetes.io/instance-type, operator: In, values: [p5.48xlarge]}]
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - topologyKey: kubernetes.io/hostname
              labelSelector: {matchLabels: {elastic-supervisor/job: llama-70b}}
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: topology.kubernetes.io/zone
          whenUnsatisfiable: DoNotSchedule
          labelSelector: {matchLabels: {elastic-supervisor/job: llama-70b}}
      securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000}
      volumes:
        - {name: infiniband, hostPath: {path: /dev/infiniband, type: Directory}}
        - {name: hugepages, emptyDir: {medium: HugePages-2Mi}}
        - {name: datasets, persistentVolumeClaim: {claimName: datasets, readOnly: true}}
      initContainers:
        - name: warm-cache
          image: registry.example/tools:1
          command: [sh, -c, "cp -r /data/tokenizer /cache/"]
          volumeMounts: [{name: datasets, mountPath: /data, readOnly: true}]
        - name: log-shipper
          image: fluent/fluent-bit:3.0
          restartPolicy: Always
          resources: {requests: {cpu: 100m, memory: 128Mi}}
      containers:
        - name: agent
          securityContext: {capabilities: {add: [IPC_LOCK]}}
          env:
            - {name: NCCL_IB_HCA, value: mlx5}
            - name: WANDB_API_KEY
              valueFrom: {secretKeyRef: {name: wandb, key: api-key}}
            - name: NCCL_SOCKET_IFNAME
              valueFrom: {configMapKeyRef: {name: nccl, key: ifname}}
          envFrom:
            - secretRef: {name: s3-credentials}
          volumeMounts:
            - {name: infiniband, mountPath: /dev/infiniband}
            - {name: hugepages, mountPath: /hugepages}
            - {name: datasets, mountPath: /data, readOnly: true}
persistence:
  checkpoints: {existingClaim: ckpt-rwx, subPath: llama-70b}
  logs: {existingClaim: logs-rwx, subPath: llama-70b}
rbac: {nodeReads: true}
""")
"""What a GPU team running a 256-GPU job writes (docs/kubernetes.md shows the same)."""

# the engine's own records into Python logging, warnings up: not "found symbolic link" (INFO,
# files/supervisor-alerts.yml) on stderr at every load
helm_python.enable_logging(logging.WARNING)

VALUE_SETS: dict[str, dict] = {
    "defaults": {},
    "monitoring": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                               "prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}},
    "node_reads": {"rbac": {"nodeReads": True}},
    "existing_secret": {"token": {"existingSecret": "team-token", "secretKey": "hmac"}},
    "custom_resources": {
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": 4, "memory": "8Gi"}},
        "config": {"job": "llama-7b", "command": ["python", "/app/train.py", "--steps", 1000],
                   "nodes": {"min": 2, "max": 4, "world_sizes": [16, 32], "world_size_multiple_of": 8},
                   "nproc_per_node": 8,
                   "restart": {"budget_s": 600, "max_restarts": 5, "allow_fresh_start": True},
                   "heartbeat": {"interval_s": 0.5, "timeout_s": 3}, "health": {"phase_floor_s": 60},
                   "nonfinite": {"skip_batches": 2}, "env": {"NCCL_DEBUG": "WARN", "SUPERVISOR_FAULT": ""}},
        "workers": {"image": {"repository": "registry.example/train", "tag": "v3"},
                    "resources": {"limits": {"nvidia.com/gpu": 8}}, "nodeSelector": {"pool": "gpu"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "rendezvous": "ip"},
        "persistence": {"checkpoints": {"existingClaim": "ckpt-rwx", "subPath": "llama"},
                        "logs": {"existingClaim": "logs-rwx"}},
        "extraArgs": ["--allow-fresh-start"], "extraEnv": [{"name": "LOG_LEVEL", "value": "debug"}],
        "nodeSelector": {"pool": "cpu"}, "priorityClassName": "system-cluster-critical",
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ctl", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    },
    "gpu_fleet": GPU_FLEET,
    "kueue_gang": {**GPU_FLEET, "workers": {**GPU_FLEET["workers"], "gang": {"mode": "kueue", "queue": "gpu-h100"},
                                            "podTemplate": {**GPU_FLEET["workers"]["podTemplate"], "metadata": {
                                                "labels": {"team": "llm"}}}}},
    "volcano_gang": {"config": {"nodes": {"min": 4, "max": 4}, "nproc_per_node": 8},
                     "workers": {"image": {"repository": "registry.example/train", "tag": "v3"},
                                 "resources": {"limits": {"nvidia.com/gpu": 8}}, "priorityClassName": "training",
                                 "gang": {"mode": "volcano", "queue": "research"}}},
}


@pytest.fixture(scope="module")
def chart():
    with helm_python.Chart.load(CHART) as c:
        yield c


def render(chart, values: dict, name: str = RELEASE) -> dict[str, str]:
    return chart.render(values, name=name, namespace=NAMESPACE, is_install=True)


def objects(rendered: dict[str, str]) -> list[dict]:
    """Every Kubernetes object the templates rendered (NOTES.txt and blank templates left out)."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def by_kind(objs: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for o in objs:
        kinds.setdefault(o["kind"], []).append(o)
    return kinds


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs).get(kind, [])
    assert len(found) == 1, f"{len(found)} {kind} objects rendered"
    return found[0]


def rendered_job_config(objs: list[dict]) -> dict:
    return yaml.safe_load(one(objs, "ConfigMap")["data"]["job.yaml"])


# ------------------------------------------------------------------ lint and validation

@pytest.mark.parametrize("value_set", VALUE_SETS)
@pytest.mark.parametrize("kube_version", ["v1.30.0", f"v{kubernetes_validate.latest_version()}"])
def test_lint_strict(value_set, kube_version):
    report = helm_python.lint(CHART, VALUE_SETS[value_set], strict=True, namespace=NAMESPACE,
                              kube_version=kube_version)
    assert report["errors"] == []
    # strict: warnings are errors; "icon is recommended" (info) is all that may remain
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _validate_crd(obj: dict) -> None:
    """The Prometheus Operator models, strict by round trip: the models ignore unknown fields,
    so a field the model drops is a misspelling (or a field the operator does not have)."""
    model = {"PrometheusRule": prom_v1.PrometheusRule, "ServiceMonitor": prom_v1.ServiceMonitor}[obj["kind"]]
    parsed = model.model_validate(obj)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == obj


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_object_validates_strict(chart, value_set):
    objs = objects(render(chart, VALUE_SETS[value_set]))
    assert objs
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            _validate_crd(obj)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on Kubernetes {version}: {exc}")


def test_validators_have_teeth(chart):
    """A misspelled field fails both validators (or the tests above would prove nothing)."""
    deployment = one(objects(render(chart, {})), "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)
    rule = one(objects(render(chart, VALUE_SETS["monitoring"])), "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["fr"] = "5m"
    with pytest.raises(AssertionError):
        _validate_crd(rule)


def test_objects_per_value_set(chart):
    kinds = {name: sorted(by_kind(objects(render(chart, v)))) for name, v in VALUE_SETS.items()}
    base = ["ConfigMap", "Deployment", "Pod", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount"]
    assert kinds["defaults"] == base  # the Pod: `helm test`'s check of the workers
    assert kinds["custom_resources"] == base
    assert kinds["monitoring"] == sorted(base + ["PrometheusRule", "ServiceMonitor"])
    assert kinds["node_reads"] == sorted(base + ["ClusterRole", "ClusterRoleBinding"])
    assert kinds["existing_secret"] == [k for k in base if k != "Secret"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_labels_and_names(chart, value_set):
    long_release = "a-release-name-that-is-quite-long-for-a-training-job"  # 52 characters
    for release in (RELEASE, long_release):
        for obj in objects(render(chart, VALUE_SETS[value_set], name=release)):
            meta = obj["metadata"]
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):  # path segment names: 253
                assert len(meta["name"]) <= 253 and NAMESPACE in meta["name"]
            else:  # Services and the pods' prefix: DNS labels
                assert len(meta["name"]) <= 63, meta["name"]
                assert meta["namespace"] == NAMESPACE
            labels = meta["labels"]
            assert labels["app.kubernetes.io/name"] == "elastic-supervisor"
            assert labels["app.kubernetes.io/instance"] == release
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/part-of"] == "elastic-supervisor"
            assert labels["app.kubernetes.io/version"] == helm_python.Chart.load(CHART).metadata["appVersion"]


# ------------------------------------------------------------------ RBAC

ROLE_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create", "delete"]},
]
"""Exactly the calls in supervisor/platforms/kube/ (tests/test_kube_platform.py checks the requests a
real run sends against the rendered rules): no secrets (the chart's token Secret reaches the
ranks by secretKeyRef), events created only (never read, patched or deleted), no GET of single
pods (a watch)."""
NODE_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]

@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_rbac_least_verbs(chart, value_set):
    objs = objects(render(chart, VALUE_SETS[value_set]))
    role = one(objs, "Role")
    mode = VALUE_SETS[value_set].get("workers", {}).get("gang", {}).get("mode", "none")
    extra = [GANG_RULES[mode]] if mode in GANG_RULES else []
    assert role["rules"] == ROLE_RULES + extra  # exactly: no secrets, no wildcard, events created only
    sa = one(objs, "ServiceAccount")["metadata"]["name"]
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    binding = one(objs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == subject
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa
    kinds = by_kind(objs)
    if VALUE_SETS[value_set].get("rbac", {}).get("nodeReads"):
        cluster_role = one(objs, "ClusterRole")
        assert cluster_role["rules"] == NODE_RULES
        crb = one(objs, "ClusterRoleBinding")
        assert crb["roleRef"]["name"] == cluster_role["metadata"]["name"] and crb["subjects"] == subject
        assert NAMESPACE in cluster_role["metadata"]["name"]  # one per release and namespace
        assert rendered_job_config(objs)["platform"]["kubernetes"]["node_reads"] is True
    else:
        assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
        assert rendered_job_config(objs)["platform"]["kubernetes"]["node_reads"] is False


GANG_RULES = {"volcano": {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"],
                          "verbs": ["get", "create", "delete"]},
              "coscheduling": {"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups"],
                               "verbs": ["get", "create", "delete"]}}


@pytest.mark.parametrize("mode, queue", [("none", ""), ("kueue", "team-a"), ("volcano", "research"),
                                         ("coscheduling", "")])
def test_gang_mode_reaches_the_controller_and_the_role_grants_what_it_calls(chart, mode, queue):
    objs = objects(render(chart, {"workers": {"gang": {"mode": mode, "queue": queue}}}))
    gang = rendered_job_config(objs)["platform"]["kubernetes"]["gang"]
    assert (gang["mode"], gang["queue"]) == (mode, queue)
    job_config.from_dict(rendered_job_config(objs))  # the controller accepts it
    extra = [GANG_RULES[mode]] if mode in GANG_RULES else []  # kueue: its webhook and controller act, not ours
    assert one(objs, "Role")["rules"] == ROLE_RULES + extra


def test_gang_pods_as_the_chart_would_have_them_made(chart):
    pods = sample_worker_pods(objects(render(chart, VALUE_SETS["kueue_gang"])))
    for pod in pods:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels["kueue.x-k8s.io/queue-name"] == "gpu-h100" and labels["team"] == "llm"
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "2"  # the gang these samples make
    assert len({p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in pods}) == 1
    for pod in sample_worker_pods(objects(render(chart, VALUE_SETS["volcano_gang"]))):
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"]


def test_no_disruption_budget_no_rule(chart):
    objs = objects(render(chart, {"workers": {"disruptionBudget": False}}))
    assert one(objs, "Role")["rules"] == ROLE_RULES[:-1]
    assert rendered_job_config(objs)["platform"]["kubernetes"]["disruption_budget"] is False


def test_lease_timings_reach_the_controller(chart):
    objs = objects(render(chart, {"leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20}}))
    k8s = rendered_job_config(objs)["platform"]["kubernetes"]
    assert (k8s["lease_duration_s"], k8s["renew_deadline_s"], k8s["disruption_budget"]) == (30, 20, True)


def test_rbac_off(chart):
    kinds = by_kind(objects(render(chart, {"rbac": {"create": False, "nodeReads": True},
                                           "serviceAccount": {"create": False, "name": "ops"}})))
    assert not {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ServiceAccount"} & set(kinds)
    assert kinds["Deployment"][0]["spec"]["template"]["spec"]["serviceAccountName"] == "ops"



def test_rbac_as_the_platform_tests_read_it():
    """tests/helm_rbac.py, which tests/test_kube_platform.py checks a run's requests with."""
    rules = rendered_rbac({"rbac": {"nodeReads": True}}, release=RELEASE, namespace=NAMESPACE)
    assert rules == {"Role": ROLE_RULES, "ClusterRole": NODE_RULES}
    role = rules["Role"]
    assert allows(role, "get", "", "pods/log") and not allows(role, "get", "", "pods")
    assert allows(role, "update", "coordination.k8s.io", "leases") and not allows(role, "update", "", "leases")
    assert not allows(role, "create", "", "secrets") and allows(role, "create", "", "events")
    assert not allows(role, "delete", "", "events") and not allows(role, "patch", "", "events")
    assert allows(rules["ClusterRole"], "watch", "", "nodes")
    assert allows([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}], "patch", "apps", "deployments")
    assert rendered_rbac({}) == {"Role": ROLE_RULES, "ClusterRole": []}

# ------------------------------------------------------------------ the Deployment

@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_non_root_security_context(chart, value_set):
    pod = one(objects(render(chart, VALUE_SETS[value_set])), "Deployment")["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and psc["runAsGroup"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc == {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                  "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    # a read-only root needs a writable /tmp (TMPDIR, HOME), from a bounded emptyDir
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]["sizeLimit"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TMPDIR"] == "/tmp" and env["HOME"] == "/tmp" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert mounts["/etc/supervisor"]["readOnly"] is True


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_test_dry_runs_a_worker_pod_as_the_controller(chart, value_set):
    """`helm test`: the controller's start-up check alone (supervisor run --check), as the
    controller runs: its image, service account (its Role allows the dry-run create), config and
    token, non-root."""
    objs = objects(render(chart, VALUE_SETS[value_set]))
    (pod,) = by_kind(objs)["Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    controller = one(objs, "Deployment")["spec"]["template"]["spec"]
    spec = pod["spec"]
    (check,) = spec["containers"]
    (supervisor,) = controller["containers"]
    assert check["command"] == [*supervisor["command"], "--check"] and check["image"] == supervisor["image"]
    assert spec["serviceAccountName"] == controller["serviceAccountName"] and spec["restartPolicy"] == "Never"
    assert spec["securityContext"] == controller["securityContext"]
    assert check["securityContext"] == supervisor["securityContext"]
    mounts = {m["mountPath"]: m["name"] for m in supervisor["volumeMounts"]}
    volumes = {v["name"]: v for v in controller["volumes"]}
    for m in check["volumeMounts"]:
        if m["mountPath"] != "/tmp":
            assert {k: v for k, v in {v["name"]: v for v in spec["volumes"]}[m["name"]].items() if k != "name"} == \
                {k: v for k, v in volumes[mounts[m["mountPath"]]].items() if k != "name"}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_deployment_runs_one_controller(chart, value_set):
    objs = objects(render(chart, VALUE_SETS[value_set]))
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["supervisor", "run", "--config", "/etc/supervisor/job.yaml"]
    assert container["args"] if VALUE_SETS[value_set].get("extraArgs") else "args" not in container
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    volumes = {v["name"]: v for v in pod["volumes"]}
    cm = one(objs, "ConfigMap")
    config_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/supervisor")
    assert volumes[config_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    assert "job.yaml" in cm["data"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # on a lost node the controller is replaced after 30 s, not Kubernetes' default 300 s
    assert pod["tolerations"][:2] == [
        {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        for taint in ("not-ready", "unreachable")]
    assert rendered_job_config(objs)["platform"]["kubernetes"]["owner_config_map"] == cm["metadata"]["name"]
    # the pod restarts when the job config changes (and then adopts its gang)
    assert re.fullmatch(r"[0-9a-f]{64}", dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"])


def test_custom_resources_and_placement(chart):
    values = VALUE_SETS["custom_resources"]
    objs = objects(render(chart, values))
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"] == values["resources"]
    for key in ("nodeSelector", "affinity", "priorityClassName"):
        assert pod[key] == values[key]
    assert pod["tolerations"][2:] == values["tolerations"]
    assert container["args"] == ["--allow-fresh-start"]
    assert {"name": "LOG_LEVEL", "value": "debug"} in container["env"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt-rwx"}
    assert volumes["logs"]["persistentVolumeClaim"] == {"claimName": "logs-rwx"}
    assert mounts["checkpoints"] == {"name": "checkpoints", "mountPath": "/checkpoints", "subPath": "llama"}
    assert "subPath" not in mounts["logs"]
    worker = rendered_job_config(objs)["platform"]["kubernetes"]["worker"]
    assert worker["image"] == "registry.example/train:v3"
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert worker["node_selector"] == {"pool": "gpu"} and worker["tolerations"] == values["workers"]["tolerations"]


def test_default_volumes_are_emptydirs_with_a_warning(chart):
    rendered = render(chart, {})
    pod = one(objects(rendered), "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}
    notes = next(t for p, t in rendered.items() if p.endswith("NOTES.txt"))
    assert "persistence.checkpoints.existingClaim" in notes and "WARNING" in notes


def test_service_http_and_udp_heartbeats(chart):
    objs = objects(render(chart, {"service": {"httpPort": 8080, "heartbeatPort": 5005}}))
    svc = one(objs, "Service")
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
        {"name": "heartbeat", "port": 5005, "targetPort": "heartbeat", "protocol": "UDP"},
    ]
    dep = one(objs, "Deployment")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    ports = dep["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert ports == [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                     {"name": "heartbeat", "containerPort": 5005, "protocol": "UDP"}]
    cfg = rendered_job_config(objs)
    assert cfg["http"] == {"host": "0.0.0.0", "port": 8080} and cfg["intake"] == {"host": "0.0.0.0", "port": 5005}
    assert cfg["platform"]["host"] == f"{FULLNAME}.{NAMESPACE}.svc"


def test_notes_tell_how_to_watch(chart):
    notes = next(t for p, t in render(chart, {}).items() if p.endswith("NOTES.txt"))
    assert f"kubectl -n {NAMESPACE} logs -f deploy/{FULLNAME}" in notes
    assert f"kubectl -n {NAMESPACE} port-forward svc/{FULLNAME} 9400:9400" in notes
    assert "supervisor status --url http://127.0.0.1:9400" in notes
    assert f"helm test {RELEASE} -n {NAMESPACE} --logs" in notes and "WorkerPodRefused" in notes


# ------------------------------------------------------------------ the token Secret

def test_generated_token(chart):
    objs = objects(render(chart, {}))
    secret = one(objs, "Secret")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert re.fullmatch(r"[0-9a-f]{64}", token)  # supervisor/controller/token.py wants >= 48 hex digits
    other = one(objects(render(chart, {})), "Secret")["data"]["token"]
    assert other != secret["data"]["token"]  # random per install (lookup keeps it on upgrade)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "token")["secret"]
    assert vol["secretName"] == secret["metadata"]["name"] and vol["defaultMode"] == 0o400
    k8s = rendered_job_config(objs)["platform"]["kubernetes"]
    assert k8s["token_secret"] == {"name": secret["metadata"]["name"], "key": "token"}
    assert k8s["token_file"] == "/var/run/secrets/elastic-supervisor/token"


def test_existing_token_secret(chart):
    objs = objects(render(chart, VALUE_SETS["existing_secret"]))
    assert "Secret" not in by_kind(objs)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "token")["secret"]
    assert vol["secretName"] == "team-token" and vol["items"] == [{"key": "hmac", "path": "hmac"}]
    k8s = rendered_job_config(objs)["platform"]["kubernetes"]
    assert k8s["token_secret"] == {"name": "team-token", "key": "hmac"}
    assert k8s["token_file"] == "/var/run/secrets/elastic-supervisor/hmac"


class _FakeAPIServer:
    """The little of a kube-apiserver that a cluster-aware render's ``lookup`` needs: version,
    discovery of core/v1 secrets, and GET of the secrets it holds (404 for any other)."""

    def __init__(self, secrets: dict[str, dict]) -> None:
        self.secrets = secrets
        self.requests: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.runner = None
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()

    async def _handle(self, request):
        from aiohttp import web

        self.requests.append(f"{request.method} {request.path}")
        path = request.path
        if path == "/version":
            return web.json_response({"major": "1", "minor": "30", "gitVersion": "v1.30.0"})
        if path == "/api":
            return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        if path == "/api/v1":
            return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret",
                 "verbs": ["get", "list", "create"]}]})
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets/([^/]+)", path)
        if m and request.method == "GET" and f"{m[1]}/{m[2]}" in self.secrets:
            return web.json_response(self.secrets[f"{m[1]}/{m[2]}"])
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                  "code": 404}, status=404)

    def __enter__(self):
        from aiohttp import web

        async def start():
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.mark.parametrize("existing", ["kept", "absent", "other_key"])
def test_token_kept_on_upgrade(chart, existing):
    """``lookup`` finds the installed Secret: an upgrade renders its token again, never a new one
    (the running ranks hold it). A Secret without the key, or none, gets a new token."""
    name = f"{FULLNAME}-token"
    old = "5e" * 32
    data = {"token": base64.b64encode(old.encode()).decode()}
    secrets = {} if existing == "absent" else {f"{NAMESPACE}/{name}": {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": "7"},
        "data": data if existing == "kept" else {"other": data["token"]}}}
    with _FakeAPIServer(secrets) as api, \
            helm_python.Config(kube_apiserver=f"http://127.0.0.1:{api.port}", namespace=NAMESPACE,
                               storage_driver="memory") as cluster:
        rendered = cluster.render(chart, {}, name=RELEASE, namespace=NAMESPACE, is_upgrade=True)
    assert f"GET /api/v1/namespaces/{NAMESPACE}/secrets/{name}" in api.requests
    token = one(objects(rendered), "Secret")["data"]["token"]
    if existing == "kept":
        assert token == data["token"]
    else:
        assert token != data["token"]
        assert re.fullmatch(r"[0-9a-f]{64}", base64.b64decode(token).decode())


# ------------------------------------------------------------------ the job config contract

def _dataclass_fields(tp) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(tp)
    return {f.name: hints[f.name] for f in dataclasses.fields(tp)}


def test_schema_covers_config_py():
    """values.schema.json's `config` names every JobConfig field the chart does not own, and each
    nested section names exactly its dataclass's fields: a field added to config.py fails here
    until the chart offers it (or owns it)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    cfg_schema = schema["properties"]["config"]
    fields = _dataclass_fields(job_config.JobConfig)
    assert set(cfg_schema["properties"]) | CHART_OWNED_CONFIG == set(fields)
    assert not set(cfg_schema["properties"]) & CHART_OWNED_CONFIG
    assert cfg_schema["additionalProperties"] is False
    for name, tp in fields.items():
        if dataclasses.is_dataclass(tp) and name not in CHART_OWNED_CONFIG:
            section = cfg_schema["properties"][name]
            assert set(section["properties"]) == set(_dataclass_fields(tp)), name
            assert section["additionalProperties"] is False, name


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_job_config_loads_with_config_py(chart, value_set):
    """The rendered job.yaml is a JobConfig: supervisor/config.py accepts it whole (the platform
    block is the chart's contract with the Kubernetes platform) and reads the values given."""
    values = VALUE_SETS[value_set]
    raw = rendered_job_config(objects(render(chart, values)))
    assert raw["platform"]["kind"] == "kubernetes"
    assert set(raw["platform"]["kubernetes"]) == {
        "namespace", "service", "owner_config_map", "lease", "token_secret", "token_file", "node_reads",
        "instance", "termination_grace_s", "rendezvous", "volumes", "worker", "disruption_budget", "lease_duration_s",
        "renew_deadline_s", "gang"}
    k8s = job_config.from_dict(copy.deepcopy(raw)).platform.kubernetes  # the platform reads what the chart writes
    assert k8s.token_secret.name and k8s.token_file.endswith("/" + k8s.token_secret.key)
    assert k8s.worker.image and k8s.service == FULLNAME and k8s.namespace == NAMESPACE
    local = dict(raw, platform={"kind": "local"})
    cfg = job_config.from_dict(local)
    given = values.get("config", {})
    assert cfg.job == (given.get("job") or RELEASE)  # empty (the default): the release's name
    assert cfg.command == tuple(str(a) for a in given.get("command", ["python", "train.py"]))
    assert cfg.checkpoint_dir == "/checkpoints" and cfg.log_dir == "/logs"
    if value_set == "custom_resources":
        assert (cfg.nodes.min, cfg.nodes.max, cfg.nproc_per_node) == (2, 4, 8)
        assert cfg.nodes.world_sizes == (16, 32) and cfg.nodes.world_size_multiple_of == 8
        assert cfg.restart.budget_s == 600 and cfg.restart.max_restarts == 5 and cfg.restart.allow_fresh_start
        assert cfg.heartbeat.interval_s == 0.5 and cfg.heartbeat.timeout_s == 3
        assert cfg.health.phase_floor_s == 60 and cfg.nonfinite.skip_batches == 2
        assert cfg.env == {"NCCL_DEBUG": "WARN", "SUPERVISOR_FAULT": ""}
        assert raw["platform"]["kubernetes"]["volumes"]["checkpoints"] == {
            "claim_name": "ckpt-rwx", "sub_path": "llama", "mount_path": "/checkpoints"}
        assert raw["platform"]["kubernetes"]["rendezvous"] == "ip"
    else:  # config.py's own defaults, not copies in the chart
        assert cfg.restart == job_config.RestartConfig() and cfg.health == job_config.HealthConfig()


# ------------------------------------------------------------------ the worker pods the controller builds

def sample_worker_pods(objs: list[dict]) -> list[dict]:
    """The first and second pods of attempt 0, as the controller builds them from the rendered
    job config (its own pod-building code; no cluster asked)."""
    cfg = job_config.from_dict(rendered_job_config(objs))
    settings = settings_from_config(cfg, cfg.platform.kubernetes.namespace)
    platform = KubernetesPlatform(KubeApi(kubernetes_client.ApiClient(), timeout_s=1, retry_s=1), settings)
    slots = ["gpu-node-0", "gpu-node-1"]
    spec = LaunchSpec(attempt=0, nodes=slots, nnodes_min=2, nnodes_max=2, nproc_per_node=cfg.nproc_per_node,
                      command=list(cfg.command), env=dict(cfg.env), rdzv_endpoint="x:29400", rdzv_id="r")
    endpoint = "10.0.0.1:29400" if cfg.platform.kubernetes.rendezvous == "ip" else ""  # the first pod's IP, once placed
    return [platform.worker_pod(spec, slot, endpoint) for slot in slots]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_worker_pods_built_from_the_rendered_config_validate_strict(chart, value_set):
    values = VALUE_SETS[value_set]
    for pod in sample_worker_pods(objects(render(chart, values))):
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(pod, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"worker pod {pod['metadata']['name']} on Kubernetes {version}: {exc}")
        kubernetes_client.V1Pod.from_dict(pod)  # and the controller's client takes it (its own types)
        labels = pod["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/name"] != "elastic-supervisor"  # the controller's Service selects that
        grace = values.get("workers", {}).get("terminationGracePeriodSeconds", 30)
        assert pod["spec"]["terminationGracePeriodSeconds"] == grace
        if "podTemplate" not in values.get("workers", {}):  # restricted, as the chart's own pod
            assert pod["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
            assert pod["spec"]["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False,
                                                                       "capabilities": {"drop": ["ALL"]}}
            assert not pod["spec"].get("hostNetwork")
            assert pod_security_results("restricted", "latest", pod) == []  # admitted where restricted is enforced


def test_a_gpu_teams_template_reaches_the_worker_pod_as_written(chart):
    objs = objects(render(chart, GPU_FLEET))
    service = one(objs, "Service")
    template = GPU_FLEET["workers"]["podTemplate"]
    first, second = sample_worker_pods(objs)
    for pod in (first, second):
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-h100"
        assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
        # the controller's Service never selects a worker pod
        assert not service["spec"]["selector"].items() <= meta["labels"].items()
        for key in ("schedulerName", "runtimeClassName", "hostNetwork", "dnsPolicy", "hostIPC",
                    "topologySpreadConstraints"):
            assert spec[key] == template["spec"][key], key
        assert spec["priorityClassName"] == "training-high" and spec["restartPolicy"] == "Never"
        assert spec["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": True,
                                           "seccompProfile": {"type": "RuntimeDefault"}}
        assert spec["tolerations"] == GPU_FLEET["workers"]["tolerations"] + template["spec"]["tolerations"]
        assert spec["affinity"]["podAntiAffinity"] == template["spec"]["affinity"]["podAntiAffinity"]
        # rbac.nodeReads: each pod pinned to its slot's node, ANDed with the template's instance type
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"][0]["values"] == ["p5.48xlarge"]
        assert term["matchExpressions"][1] == {"key": "kubernetes.io/hostname", "operator": "In",
                                               "values": [meta["annotations"]["elastic-supervisor/slot"]]}
        assert [v["name"] for v in spec["volumes"]] == ["checkpoints", "logs", "dshm", "infiniband", "hugepages",
                                                        "datasets"]
        assert [c["name"] for c in spec["initContainers"]] == ["warm-cache", "log-shipper"]
        (agent,) = spec["containers"]
        assert agent["name"] == "agent" and agent["image"] == "registry.example/llama-train:v7"
        assert agent["resources"]["limits"]["nvidia.com/gpu"] == "8" and agent["resources"]["limits"]["rdma/ib"] == "1"
        env = {e["name"]: e for e in agent["env"]}
        assert env["WANDB_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
        assert env["SUPERVISOR_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == f"{FULLNAME}-token"
        assert agent["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
        assert {"name": "infiniband", "mountPath": "/dev/infiniband"} in agent["volumeMounts"]
        assert agent["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]},
                                            "allowPrivilegeEscalation": False}
    assert first["spec"]["hostname"] != second["spec"]["hostname"]
    # it asks for more than restricted, and says so: its namespace must be labelled privileged
    assert [r for r, _ in pod_security_results("baseline", "latest", first)] == [
        "non-default capabilities", "host namespaces", "hostPath volumes"]
    assert pod_security_results("privileged", "latest", first) == []


# ------------------------------------------------------------------ the schema refuses bad values

BAD_VALUES = [
    ({"replicas": 2}, "additional properties 'replicas'"),
    ({"leaderElection": {"leaseDurationSeconds": 1}}, "/leaderElection/leaseDurationSeconds"),
    ({"workers": {"gang": {"mode": "yunikorn"}}}, "/workers/gang/mode"),
    ({"workers": {"gang": {"mode": "kueue", "queue": "Team_A"}}}, "/workers/gang/queue"),
    ({"leaderElection": {"renewDeadlineSeconds": 0}}, "/leaderElection/renewDeadlineSeconds"),
    ({"workers": {"disruptionBudget": "yes"}}, "/workers/disruptionBudget"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"config": {"nodes": {"min": 0, "max": 1}}}, "/config/nodes/min"),
    ({"config": {"job": "Bad_Name"}}, "/config/job"),
    ({"config": {"command": []}}, "/config/command"),
    ({"config": {"restart": {"budget_s": -1}}}, "/config/restart/budget_s"),
    ({"config": {"restart": {"budget": 5}}}, "additional properties 'budget'"),
    ({"config": {"heartbeat": {"interval_s": 0.01}}}, "/config/heartbeat/interval_s"),
    ({"config": {"checkpoint_dir": "/elsewhere"}}, "additional properties 'checkpoint_dir'"),
    ({"config": {"platform": {"kind": "local"}}}, "additional properties 'platform'"),
    ({"config": {"env": {"SUPERVISOR_TOKEN": "x"}}}, "/config/env/SUPERVISOR_TOKEN"),
    ({"config": {"env": {"1BAD": "x"}}}, "'1BAD'"),
    ({"service": {"httpPort": 70000}}, "/service/httpPort"),
    ({"service": {"heartbeatPort": "9401"}}, "/service/heartbeatPort"),
    ({"workers": {"rendezvous": "mdns"}}, "/workers/rendezvous"),
    ({"persistence": {"logs": {"existingClaim": "Bad Claim"}}}, "/persistence/logs/existingClaim"),
    ({"persistence": {"checkpoints": {"mountPath": "relative"}}}, "/persistence/checkpoints/mountPath"),
    ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    ({"rbac": {"nodeReads": "yes"}}, "/rbac/nodeReads"),
    ({"metrics": {"serviceMonitor": {"interval": "2 seconds"}}}, "/metrics/serviceMonitor/interval"),
    # issue 29: the worker pods' values, typed and bounded
    ({"workers": {"resources": {"limits": {"nvidia.com/gpu": -8}}}}, "/workers/resources/limits/nvidia.com~1gpu"),
    ({"workers": {"resources": {"limits": {"nvidia.com/gpu": 1.5}}}}, "/workers/resources/limits/nvidia.com~1gpu"),
    ({"workers": {"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}}, "/workers/resources/limits/nvidia.com~1gpu"),
    ({"workers": {"resources": {"requests": {"cpu": -2}}}}, "/workers/resources/requests/cpu"),
    ({"workers": {"tolerations": [{"key": "gpu", "operator": "Exist"}]}}, "/workers/tolerations/0/operator"),
    ({"workers": {"tolerations": [{"key": "gpu", "effect": "NoScheduled"}]}}, "/workers/tolerations/0/effect"),
    ({"workers": {"terminationGracePeriodSeconds": -1}}, "/workers/terminationGracePeriodSeconds"),
    ({"workers": {"terminationGracePeriodSeconds": 1.5}}, "/workers/terminationGracePeriodSeconds"),
    ({"workers": {"podLabels": {"elastic-supervisor/attempt": "1"}}}, "/workers/podLabels/elastic-supervisor~1attempt"),
    ({"workers": {"podTemplate": {"spec": {"tolerations": [{"operator": "Exists", "effect": "NoExecut"}]}}}},
     "/workers/podTemplate/spec/tolerations/0/effect"),
    ({"workers": {"podTemplate": {"spec": {"containers": [
        {"name": "agent", "resources": {"limits": {"nvidia.com/gpu": -8}}}]}}}},
     "/workers/podTemplate/spec/containers/0/resources/limits/nvidia.com~1gpu"),
    ({"workers": {"podTemplate": {"spec": {"tolerration": []}}}}, "additional properties 'tolerration'"),
    ({"workers": {"podTemplate": {"spec": {"containers": [{"name": "agent", "volumeMount": []}]}}}},
     "additional properties 'volumeMount'"),
    ({"workers": {"podTemplate": {"spec": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedul"}]}}}},
     "/workers/podTemplate/spec/topologySpreadConstraints/0/whenUnsatisfiable"),
    ({"workers": {"podTemplate": {"spec": {"topologySpreadConstraints": [
        {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}}}},
     "/workers/podTemplate/spec/topologySpreadConstraints/0/maxSkew"),
    ({"workers": {"podTemplate": {"spec": {"volumes": [{"name": "hp", "emptyDir": {"medium": "Hugepages-2Mi"}}]}}}},
     "/workers/podTemplate/spec/volumes/0/emptyDir/medium"),
    ({"workers": {"podTemplate": {"spec": {"volumes": [{"name": "ib", "hostpath": {"path": "/dev/infiniband"}}]}}}},
     "additional properties 'hostpath'"),
    ({"workers": {"podTemplate": {"spec": {"volumes": [{"name": "ib"}]}}}}, "/workers/podTemplate/spec/volumes/0"),
    ({"workers": {"podTemplate": {"spec": {"hostNetwork": "true"}}}}, "/workers/podTemplate/spec/hostNetwork"),
    ({"workers": {"podTemplate": {"spec": {"dnsPolicy": "ClusterFirstWithHostNetwork"}}}},
     "/workers/podTemplate/spec/dnsPolicy"),
    ({"workers": {"podTemplate": {"spec": {"securityContext": {"runAsUser": -1}}}}},
     "/workers/podTemplate/spec/securityContext/runAsUser"),
    ({"workers": {"podTemplate": {"spec": {"containers": [
        {"name": "agent", "securityContext": {"seccompProfile": {"type": "Default"}}}]}}}},
     "/workers/podTemplate/spec/containers/0/securityContext/seccompProfile/type"),
    ({"workers": {"podTemplate": {"spec": {"containers": [{"name": "agent", "env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf"}}}]}]}}}},
     "/workers/podTemplate/spec/containers/0/env/0/valueFrom/secretKeyRef"),
    ({"workers": {"podTemplate": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Within", "values": ["a"]}]}]}}}}}}},
     "operator"),
    ({"workers": {"podTemplate": {"kind": "Pod"}}}, "additional properties 'kind'"),
    ({"workers": {"podTemplate": {"spec": {"containers": [{"name": "exporter", "image": "x", "restartPolicy": "Always"}]}}}},
     "additional properties 'restartPolicy'"),  # a native sidecar is an init container
    ({"workers": {"podTemplate": {"spec": {"initContainers": [{"name": "s", "image": "x", "restartPolicy": "Never"}]}}}},
     "/workers/podTemplate/spec/initContainers/0/restartPolicy"),
]

OWNED_VALUES = [
    ({"spec": {"restartPolicy": "Always"}}, "/workers/podTemplate/spec/restartPolicy"),
    ({"spec": {"nodeName": "gpu-17"}}, "/workers/podTemplate/spec/nodeName"),
    ({"spec": {"hostname": "mine"}}, "/workers/podTemplate/spec/hostname"),
    ({"spec": {"subdomain": "mine"}}, "/workers/podTemplate/spec/subdomain"),
    ({"spec": {"terminationGracePeriodSeconds": 60}}, "/workers/podTemplate/spec/terminationGracePeriodSeconds"),
    ({"metadata": {"name": "mine"}}, "/workers/podTemplate/metadata': additional properties 'name'"),
    ({"metadata": {"labels": {"elastic-supervisor/job": "x"}}}, "/workers/podTemplate/metadata/labels/elastic-supervisor~1job"),
    ({"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}},
     "/workers/podTemplate/metadata/labels/app.kubernetes.io~1instance"),
    ({"metadata": {"annotations": {"elastic-supervisor/rdzv": "x"}}},
     "/workers/podTemplate/metadata/annotations/elastic-supervisor~1rdzv"),
    ({"spec": {"containers": [{"name": "agent", "command": ["bash"]}]}}, "/workers/podTemplate/spec/containers/0/command"),
    ({"spec": {"containers": [{"name": "agent", "args": ["-x"]}]}}, "/workers/podTemplate/spec/containers/0/args"),
    ({"spec": {"containers": [{"name": "agent", "image": "other:1"}]}}, "/workers/podTemplate/spec/containers/0/image"),
    ({"spec": {"containers": [{"name": "agent", "env": [{"name": "SUPERVISOR_TOKEN", "value": "0"}]}]}},
     "/workers/podTemplate/spec/containers/0/env/0/name"),
    ({"spec": {"containers": [{"name": "agent", "env": [{"name": "POD_IP", "value": "1.2.3.4"}]}]}},
     "/workers/podTemplate/spec/containers/0/env/0/name"),
    ({"spec": {"initContainers": [{"name": "agent", "image": "x"}]}}, "/workers/podTemplate/spec/initContainers/0/name"),
    ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "/workers/podTemplate/spec/volumes/0/name"),
    ({"spec": {"ephemeralContainers": []}}, "/workers/podTemplate/spec/ephemeralContainers"),
]


@pytest.mark.parametrize("template,field", OWNED_VALUES, ids=[f for _, f in OWNED_VALUES])
def test_what_the_controller_owns_is_refused_at_install(chart, template, field):
    """The schema refuses a template field the controller owns, naming it; the controller's config
    parsing refuses it too (tests/test_kube_pod_template.py), so it is never silently dropped."""
    with pytest.raises(helm_python.HelmValuesError) as exc:
        render(chart, {"workers": {"podTemplate": template}})
    assert field in str(exc.value)
    raw = rendered_job_config(objects(render(chart, {})))
    raw["platform"]["kubernetes"]["worker"]["pod_template"] = template
    with pytest.raises(job_config.ConfigError, match="platform.kubernetes.worker.pod_template"):
        job_config.from_dict(raw)


@pytest.mark.parametrize("values,field", BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_schema_refuses_bad_values_naming_the_field(chart, values, field):
    with pytest.raises(helm_python.HelmValuesError) as exc:
        render(chart, values)
    assert field in str(exc.value)
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(chart.merge_values(values))


@pytest.mark.parametrize("values,message", [
    ({"config": {"nodes": {"min": 3, "max": 2}}}, "config.nodes.max: 2 is below config.nodes.min 3"),
    ({"config": {"heartbeat": {"interval_s": 2, "timeout_s": 3}}}, "config.heartbeat.timeout_s"),
    ({"service": {"httpPort": 9000, "heartbeatPort": 9000}}, "service.heartbeatPort"),
    ({"persistence": {"checkpoints": {"existingClaim": "ckpt"}}, "workers": {"podTemplate": {"spec": {"containers": [
        {"name": "agent", "volumeMounts": [{"name": "x", "mountPath": "/checkpoints"}]}]}}}},
     "workers.podTemplate.spec.containers[0].volumeMounts[0].mountPath: /checkpoints is owned by the controller "
     "(persistence.checkpoints.mountPath)"),
    ({"workers": {"podTemplate": {"spec": {"containers": [
        {"name": "agent", "volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}]}]}}}},
     "/dev/shm is owned by the controller (workers.shmSize)"),
    ({"workers": {"podTemplate": {"spec": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}}}},
     'workers.podTemplate.spec.volumes[1].name: "a" appears twice'),
    ({"nameOverride": "elastic-supervisor-worker"}, "nameOverride"),
    ({"workers": {"gang": {"mode": "kueue"}}}, "workers.gang.queue: required with mode kueue"),
    ({"workers": {"gang": {"mode": "coscheduling", "queue": "q"}}}, "workers.gang.queue: only with mode kueue or volcano"),
    ({"workers": {"gang": {"mode": "kueue", "queue": "q", "schedulerName": "x"}}},
     "workers.gang.schedulerName: only with mode volcano or coscheduling"),
    ({"workers": {"gang": {"mode": "volcano", "queue": "q"}, "rendezvous": "ip"}}, "use rendezvous dns"),
    ({"leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}},
     "leaderElection.renewDeadlineSeconds: 10 must be under leaseDurationSeconds (10)"),
])
def test_cross_field_checks(chart, values, message):
    """What the schema cannot say (a field against another) fails the render, naming the field."""
    with pytest.raises(helm_python.HelmRenderError) as exc:
        render(chart, values)
    assert message in str(exc.value)


def test_defaults_are_documented():
    """Every key of values.yaml has a comment right above it, except the keys inside a
    documented (`# --`) value's default mapping (e.g. podSecurityContext's)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented, inside_default_of = [], None
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w.-]*):", line)
        if not m:
            continue
        indent = len(m[1])
        if inside_default_of is not None and indent > inside_default_of:
            continue
        inside_default_of = None
        comments = []
        for prev in reversed(lines[:i]):
            if not prev.strip().startswith("#"):
                break
            comments.insert(0, prev.strip())
        if not comments:
            undocumented.append(f"values.yaml:{i + 1}: {m[2]}")
        elif comments[0].startswith("# --") and line.rstrip().endswith(":"):
            inside_default_of = indent
    assert undocumented == []


# ------------------------------------------------------------------ monitoring

def test_prometheus_rule_holds_the_deploy_rules(chart, tmp_path):
    """The PrometheusRule's groups are deploy/prometheus/rules/supervisor-alerts.yml's, the file
    promtool tests: the chart's files/supervisor-alerts.yml links to it, and `helm package`
    stores its content, so the packaged chart holds the same bytes."""
    link = CHART / "files" / "supervisor-alerts.yml"
    assert link.is_symlink() and link.resolve() == RULES.resolve()
    rule = one(objects(render(chart, VALUE_SETS["monitoring"])), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert rule["metadata"]["labels"]["release"] == "kps"
    archive = helm_python.package(CHART, destination=tmp_path)
    with tarfile.open(archive) as tar:
        member = tar.extractfile("elastic-supervisor/files/supervisor-alerts.yml")
        assert member is not None and member.read() == RULES.read_bytes()
    with helm_python.Chart.load(archive) as packaged:
        rule = one(objects(render(packaged, VALUE_SETS["monitoring"])), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_service_monitor_matches_the_rules_scrape_job(chart):
    """The rules match up{job="elastic-supervisor"} (SupervisorDown) and join on the supervisor's
    own `job` label: the ServiceMonitor names the Prometheus job from a Service label holding
    that name, and honours the scraped labels."""
    scrape_jobs = set(re.findall(r'up\{job="([^"]+)"\}', RULES.read_text()))
    assert len(scrape_jobs) == 1
    objs = objects(render(chart, dict(VALUE_SETS["monitoring"], nameOverride="trainer")))
    sm, svc = one(objs, "ServiceMonitor"), one(objs, "Service")
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == scrape_jobs.pop()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"] if p["protocol"] == "TCP"}
    assert sm["metadata"]["labels"]["release"] == "kps"


# ------------------------------------------------------------------ the controller image

def test_containerfile_matches_the_chart(chart):
    """The image's numeric user is the chart's runAsUser (runAsNonRoot can only check a numeric
    USER), it is python:3.11-slim, and its default command is the chart's."""
    text = CONTAINERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    user = re.findall(r"^USER\s+(\d+):(\d+)\s*$", text, re.M)
    assert user, "USER must be numeric uid:gid"
    pod = one(objects(render(chart, {})), "Deployment")["spec"]["template"]["spec"]
    assert (int(user[-1][0]), int(user[-1][1])) == (pod["securityContext"]["runAsUser"],
                                                    pod["securityContext"]["runAsGroup"])
    entrypoint = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)[1])
    cmd = json.loads(re.search(r"^CMD\s+(\[.*\])\s*$", text, re.M)[1])
    assert entrypoint + cmd == pod["containers"][0]["command"]


def test_the_default_job_name_is_the_release_name_so_two_releases_are_two_jobs(chart):
    jobs = {}
    for release in ("team-a", "team-b", "a" * 45, "a" * 44 + "b"):
        cfg = rendered_job_config(objects(render(chart, {}, name=release)))
        assert len(cfg["job"]) <= 40 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", cfg["job"]), cfg["job"]
        jobs[release] = cfg["job"]
    assert jobs["team-a"] == "team-a" and jobs["team-b"] == "team-b"
    assert len(set(jobs.values())) == 4  # two long names that share their head stay two jobs
    pinned = rendered_job_config(objects(render(chart, {"config": {"job": "llama"}}, name="team-a")))
    assert pinned["job"] == "llama"


@pytest.mark.parametrize("name, mode", [("llama-kueue.yaml", "kueue"), ("llama-volcano.yaml", "volcano")])
def test_the_worked_values_files_in_the_docs_install(chart, name, mode):
    """docs/kubernetes.md's values files for Kueue and Volcano render, validate strict and give the
    controller the gang they say."""
    doc = (CHART.parent.parent / "docs" / "kubernetes.md").read_text()
    block = next(b for b in doc.split("```yaml\n")[1:] if b.startswith(f"# {name}")).split("```")[0]
    values = yaml.safe_load(block)
    objs = objects(render(chart, values))
    for obj in objs:
        kubernetes_validate.validate(obj, KUBE_VERSIONS[0], strict=True)
    cfg = job_config.from_dict(rendered_job_config(objs))
    assert cfg.platform.kubernetes.gang.mode == mode and cfg.nodes.max == 32
    for pod in sample_worker_pods(objs):
        kubernetes_validate.validate(pod, KUBE_VERSIONS[0], strict=True)
