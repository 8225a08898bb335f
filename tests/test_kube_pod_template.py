"""``platform.kubernetes.worker.pod_template`` (issue 29): the pod the controller builds with a
template merged over it, through the controller's own pod-building code
(``KubernetesPlatform.worker_pod``, no cluster asked); what the controller owns refused by the
config naming the field; the ``restricted`` Pod Security defaults; every pod built valid for
Kubernetes 1.30 and the newest (kubernetes-validate, strict)."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from kubernetes import client

from supervisor.config import ConfigError, from_dict
from supervisor.platforms.base import LaunchSpec
from supervisor.platforms.kube.client import KubeApi
from supervisor.platforms.kube.platform import KubernetesPlatform, settings_from_config

KUBE_VERSIONS = ("1.30", kubernetes_validate.latest_version())
ENV_SECRET = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}


def job(worker: dict | None = None, **k8s) -> dict:
    return {"job": "llama", "command": ["python", "train.py"], "nodes": {"min": 2, "max": 2}, "nproc_per_node": 8,
            "env": {"NCCL_DEBUG": "WARN"},
            "platform": {"kind": "kubernetes", "kubernetes": {
                "namespace": "training", "service": "llama-elastic-supervisor", "instance": "llama",
                "token_secret": {"name": "llama-token", "key": "token"}, "token_file": "/run/token",
                "volumes": {"checkpoints": {"claim_name": "ckpt", "mount_path": "/checkpoints"},
                            "logs": {"claim_name": "logs", "mount_path": "/logs"}},
                "worker": {"image": "registry.example/train:v3", "shm_size": "8Gi", **(worker or {})}, **k8s}}}


def spec(attempt: int = 0) -> LaunchSpec:
    return LaunchSpec(attempt=attempt, nodes=["node-a", "node-b"], nnodes_min=2, nnodes_max=2, nproc_per_node=8,
                      command=["python", "train.py"], env={"SUPERVISOR_JOB": "llama", "NCCL_DEBUG": "WARN"},
                      rdzv_endpoint="ignored:29400", rdzv_id="llama-0")


def platform(raw: dict, excluded=()) -> KubernetesPlatform:
    cfg = from_dict(raw)
    p = KubernetesPlatform(KubeApi(client.ApiClient(), timeout_s=1, retry_s=1),
                           settings_from_config(cfg, cfg.platform.kubernetes.namespace))
    if excluded:
        p.exclude(list(excluded))
    return p


def pod(template: dict | None = None, slot: str = "node-b", excluded=(), worker: dict | None = None, **k8s) -> dict:
    w = dict(worker or {}) | ({"pod_template": template} if template is not None else {})
    return platform(job(w, **k8s), excluded).worker_pod(spec(), slot)


def agent(p: dict) -> dict:
    return next(c for c in p["spec"]["containers"] if c["name"] == "agent")


def env(container: dict) -> dict:
    return {e["name"]: e for e in container["env"]}


def validate(p: dict) -> None:
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(p, version, strict=True)
    client.V1Pod.from_dict(p)  # what the controller's client sends: its own types (quantities are strings)


def pss_violations(p: dict, level: str = "restricted") -> list[str]:
    """The Pod Security Standards checks (k8s.io/pod-security-admission's, as the fake API server
    runs them) that ``p`` fails at ``level``."""
    from fakes.kube_apiserver import pod_security_results

    return [reason for reason, _ in pod_security_results(level, "latest", p)]


# ------------------------------------------------------------------ the pod without a template

def test_the_generated_pod_is_restricted_labelled_and_valid():
    p = pod()
    validate(p)
    assert pss_violations(p) == []
    assert p["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert agent(p)["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    labels = p["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "llama"
    # never the controller's name: its Service, Deployment and NetworkPolicy select by name + instance
    assert labels["app.kubernetes.io/name"] == "elastic-supervisor-worker"
    assert labels["app.kubernetes.io/component"] == "worker"
    assert p["spec"]["terminationGracePeriodSeconds"] == 30


def test_termination_grace_is_the_setting():
    assert pod(termination_grace_s=120)["spec"]["terminationGracePeriodSeconds"] == 120


# ------------------------------------------------------------------ merge semantics, table-tested

GPU_TEMPLATE = {
    "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}, "annotations": {"team": "llm"}},
    "spec": {
        "schedulerName": "volcano", "runtimeClassName": "nvidia", "priorityClassName": "training",
        "hostIPC": True,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "DoNotSchedule",
                                       "labelSelector": {"matchLabels": {"elastic-supervisor/job": "llama"}}}],
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": {"elastic-supervisor/job": "llama"}}}]}},
        "volumes": [{"name": "infiniband", "hostPath": {"path": "/dev/infiniband", "type": "Directory"}},
                    {"name": "hugepages", "emptyDir": {"medium": "HugePages-2Mi"}},
                    {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}],
        "initContainers": [
            {"name": "fetch-tokenizer", "image": "busybox:1.36", "command": ["sh", "-c", "true"]},
            {"name": "log-shipper", "image": "fluent-bit:3", "restartPolicy": "Always"}],
        "containers": [
            {"name": "agent", "resources": {"limits": {"nvidia.com/gpu": 8, "hugepages-2Mi": "1Gi", "memory": "900Gi"},
                                            "requests": {"memory": "900Gi"}},
             "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
             "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, ENV_SECRET,
                     {"name": "NCCL_IB_HCA", "valueFrom": {"configMapKeyRef": {"name": "nccl", "key": "hca"}}}],
             "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
             "volumeMounts": [{"name": "infiniband", "mountPath": "/dev/infiniband"},
                              {"name": "hugepages", "mountPath": "/hugepages"},
                              {"name": "datasets", "mountPath": "/data", "readOnly": True}]},
            {"name": "dcgm-exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5",
             "ports": [{"containerPort": 9400, "name": "metrics"}]}],
    },
}


def test_a_gpu_template_reaches_the_pod_as_written_with_the_controllers_fields_kept():
    p = pod(GPU_TEMPLATE, worker={"tolerations": [{"key": "pool", "operator": "Equal", "value": "a100"}],
                                  "labels": {"team": "llm"}})
    validate(p)
    meta, s = p["metadata"], p["spec"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue" and meta["labels"]["team"] == "llm"
    assert meta["labels"]["elastic-supervisor/job"] == "llama" and meta["annotations"]["team"] == "llm"
    assert meta["annotations"]["elastic-supervisor/slot"] == "node-b"
    for key in ("schedulerName", "runtimeClassName", "priorityClassName", "hostIPC", "topologySpreadConstraints"):
        assert s[key] == GPU_TEMPLATE["spec"][key], key
    assert s["affinity"]["podAntiAffinity"] == GPU_TEMPLATE["spec"]["affinity"]["podAntiAffinity"]
    # tolerations: the template's are added to workers.tolerations
    assert s["tolerations"] == [{"key": "pool", "operator": "Equal", "value": "a100"},
                                GPU_TEMPLATE["spec"]["tolerations"][0]]
    # volumes by name: the controller's first, the template's added
    assert [v["name"] for v in s["volumes"]] == ["checkpoints", "logs", "dshm", "infiniband", "hugepages", "datasets"]
    # containers by name: the agent stays first (kubectl's default, the fake kubelet's one), the sidecar added
    assert [c["name"] for c in s["containers"]] == ["agent", "dcgm-exporter"]
    assert [c["name"] for c in s["initContainers"]] == ["fetch-tokenizer", "log-shipper"]
    assert s["initContainers"][1]["restartPolicy"] == "Always"  # a native sidecar
    a = agent(p)
    assert a["command"][:3] == ["python", "-m", "supervisor.platforms.node.forking_agent"]
    assert a["image"] == "registry.example/train:v3"
    # quantities as the API's types have them (the client refuses a number)
    assert a["resources"]["limits"] == {"nvidia.com/gpu": "8", "hugepages-2Mi": "1Gi", "memory": "900Gi"}
    e = env(a)
    assert e["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "INFO"}  # config.env's, replaced by name
    assert e["WANDB_API_KEY"] == ENV_SECRET and e["NCCL_IB_HCA"]["valueFrom"]["configMapKeyRef"]["name"] == "nccl"
    assert e["SUPERVISOR_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "llama-token", "key": "token"}
    names = [v["name"] for v in a["env"]]
    assert names.index("SUPERVISOR_NODE") < names.index("WANDB_API_KEY")  # theirs after ours: $(VAR) sees ours
    assert a["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert [m["mountPath"] for m in a["volumeMounts"]] == ["/checkpoints", "/logs", "/dev/shm", "/dev/infiniband",
                                                           "/hugepages", "/data"]
    # asks for more than restricted (hostIPC, IPC_LOCK, a hostPath): says so, the rest stays restricted
    assert a["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]},
                                    "allowPrivilegeEscalation": False}
    assert pss_violations(p, "baseline") == ["non-default capabilities", "host namespaces", "hostPath volumes"]
    assert pss_violations(p, "privileged") == []
    assert all(c["securityContext"]["allowPrivilegeEscalation"] is False for c in s["initContainers"] + s["containers"])


@pytest.mark.parametrize("template,check", [
    # scalars replaced, maps merged
    ({"spec": {"automountServiceAccountToken": True}}, lambda p: p["spec"]["automountServiceAccountToken"] is True),
    ({"spec": {"nodeSelector": {"gpu": "h100"}}},
     lambda p: p["spec"]["nodeSelector"] == {"pool": "gpu", "gpu": "h100"}),
    # null removes a key
    ({"spec": {"automountServiceAccountToken": None}}, lambda p: "automountServiceAccountToken" not in p["spec"]),
    # a container's map merged (resources), other lists replaced (a sidecar's args)
    ({"spec": {"containers": [{"name": "agent", "resources": {"requests": {"cpu": "90"}}}]}},
     lambda p: agent(p)["resources"] == {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "90"}}),
    ({"spec": {"imagePullSecrets": [{"name": "regcred"}, {"name": "other"}]}},
     lambda p: p["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]),
    # a volumeMount merged by mountPath: readOnly added to the controller's checkpoints mount is refused
    # (owned); a new one is added
    ({"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}],
               "containers": [{"name": "agent", "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}},
     lambda p: agent(p)["volumeMounts"][-1] == {"name": "scratch", "mountPath": "/scratch"}),
    # hostNetwork: cluster DNS kept for the rendezvous names, unless the template says otherwise
    ({"spec": {"hostNetwork": True}},
     lambda p: p["spec"]["hostNetwork"] is True and p["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"),
    ({"spec": {"hostNetwork": True, "dnsPolicy": "Default"}}, lambda p: p["spec"]["dnsPolicy"] == "Default"),
    # security: what the template sets is kept, the rest stays restricted
    ({"spec": {"securityContext": {"runAsNonRoot": False, "fsGroup": 1000}}},
     lambda p: p["spec"]["securityContext"] == {"runAsNonRoot": False, "fsGroup": 1000,
                                                "seccompProfile": {"type": "RuntimeDefault"}}),
    ({"spec": {"containers": [{"name": "agent", "securityContext": {"privileged": True}}]}},
     lambda p: agent(p)["securityContext"] == {"privileged": True, "capabilities": {"drop": ["ALL"]}}),
    ({"spec": {"containers": [{"name": "agent", "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}]}},
     lambda p: agent(p)["securityContext"]["capabilities"] == {"drop": ["NET_RAW"]}),
], ids=["scalar", "map", "null", "container-map", "pull-secrets", "mount", "host-network", "host-network-dns",
        "pod-security", "privileged", "drop"])
def test_merge(template, check):
    p = pod(template, worker={"node_selector": {"pool": "gpu"}, "resources": {"limits": {"nvidia.com/gpu": 8}},
                              "image_pull_secrets": [{"name": "regcred"}]})
    assert check(p), p
    validate(p)


def test_a_templates_node_affinity_narrows_the_slots_pinning_and_never_undoes_it():
    template = {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]},
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H200"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}}
    pinned = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}
    p = pod(template, node_reads=True)
    node = p["spec"]["affinity"]["nodeAffinity"]
    terms = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][-1] for t in terms] == [pinned, pinned]  # ANDed into every term
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["H100"], ["H200"]]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == template["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    validate(p)
    excluded = pod(template, excluded=["bad-node"])["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(t["matchExpressions"][-1] == {"key": "kubernetes.io/hostname", "operator": "NotIn",
                                             "values": ["bad-node"]} for t in excluded)
    # without a pinning of its own, the template's affinity as written
    assert pod(template)["spec"]["affinity"] == template["spec"]["affinity"]


def test_the_template_is_not_changed_and_each_pod_is_its_own():
    template = copy.deepcopy(GPU_TEMPLATE)
    p = platform(job({"pod_template": template}))
    a, b = p.worker_pod(spec(), "node-a"), p.worker_pod(spec(), "node-b")
    assert template == GPU_TEMPLATE
    a["spec"]["volumes"].append({"name": "x"})
    assert len(b["spec"]["volumes"]) == 6
    assert a["spec"]["hostname"] != b["spec"]["hostname"]


# ------------------------------------------------------------------ owned fields refused

OWNED = [
    ({"spec": {"restartPolicy": "Always"}}, "pod_template.spec.restartPolicy: owned by the controller"),
    ({"spec": {"nodeName": "n1"}}, "pod_template.spec.nodeName: owned by the controller"),
    ({"spec": {"hostname": "h"}}, "pod_template.spec.hostname: owned by the controller"),
    ({"spec": {"subdomain": "s"}}, "pod_template.spec.subdomain: owned by the controller"),
    ({"spec": {"terminationGracePeriodSeconds": 60}},
     "pod_template.spec.terminationGracePeriodSeconds: set platform.kubernetes.termination_grace_s"),
    ({"metadata": {"name": "mine"}}, "pod_template.metadata.name: owned by the controller"),
    ({"metadata": {"finalizers": ["x"]}}, "pod_template.metadata.finalizers: only labels and annotations"),
    ({"metadata": {"labels": {"elastic-supervisor/job": "x"}}},
     "pod_template.metadata.labels.elastic-supervisor/job: owned by the controller"),
    ({"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}},
     "pod_template.metadata.labels.app.kubernetes.io/instance: owned by the controller"),
    ({"metadata": {"annotations": {"elastic-supervisor/rdzv": "x"}}},
     "pod_template.metadata.annotations.elastic-supervisor/rdzv: owned by the controller"),
    ({"metadata": {"labels": {"rank": 1}}}, "pod_template.metadata.labels.rank: must be a string"),
    ({"spec": {"containers": [{"name": "agent", "command": ["bash"]}]}},
     "pod_template.spec.containers[0].command: owned by the controller"),
    ({"spec": {"containers": [{"name": "agent", "args": ["--x"]}]}},
     "pod_template.spec.containers[0].args: owned by the controller"),
    ({"spec": {"containers": [{"name": "agent", "image": "other:1"}]}},
     "pod_template.spec.containers[0].image: set platform.kubernetes.worker.image"),
    ({"spec": {"containers": [{"name": "agent", "env": [{"name": "SUPERVISOR_TOKEN", "value": "x"}]}]}},
     "pod_template.spec.containers[0].env[0].name: SUPERVISOR_TOKEN is owned by the controller"),
    ({"spec": {"containers": [{"name": "agent", "env": [{"name": "POD_IP", "value": "1.2.3.4"}]}]}},
     "pod_template.spec.containers[0].env[0].name: POD_IP is owned by the controller"),
    ({"spec": {"containers": [{"name": "agent", "volumeMounts": [{"name": "x", "mountPath": "/checkpoints"}]}]}},
     "pod_template.spec.containers[0].volumeMounts[0].mountPath: /checkpoints is owned by the controller"),
    ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
     "pod_template.spec.volumes[0].name: 'dshm' is owned by the controller"),
    ({"spec": {"initContainers": [{"name": "agent", "image": "x"}]}},
     "pod_template.spec.initContainers[0].name: 'agent' is the worker container's name"),
    ({"spec": {"containers": [{"image": "sidecar:1"}]}},
     "pod_template.spec.containers[0].name: required (the items are merged by name)"),
    ({"spec": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}},
     "pod_template.spec.volumes: name 'a' appears twice"),
    ({"spec": {"ephemeralContainers": []}}, "pod_template.spec.ephemeralContainers: cannot be set"),
    ({"spec": {"initContainers": [{"name": "warm", "env": [{"name": "N", "value": 8}]}]}},
     "pod_template.spec.initContainers[0].env[0].value: must be a string"),
    ({"spec": {"containers": [{"name": "exporter", "image": "x", "restartPolicy": "Always"}]}},
     "pod_template.spec.containers[0].restartPolicy: only Always, on an init container"),
    ({"spec": {"affinity": {"nodeAffinity": None}}},
     "pod_template.spec.affinity.nodeAffinity: null would remove the controller's"),
    ({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}}}},
     "pod_template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: must hold"),
    ({"spec": {"containers": None}}, "pod_template.spec.containers: null would remove the controller's"),
    ({"spec": {"containers": [{"name": "agent", "env": None}]}},
     "pod_template.spec.containers[0].env: null would remove the controller's"),
    ({"metadata": {"labels": None}}, "pod_template.metadata.labels: must be a mapping"),
    ({"kind": "Pod"}, "pod_template.kind: unknown key"),
    ({"spec": []}, "pod_template.spec: must be a mapping"),
]


@pytest.mark.parametrize("template,message", OWNED, ids=[m.split(": ")[0].removeprefix("pod_template.")
                                                         for _, m in OWNED])
def test_owned_fields_are_refused_naming_the_field(template, message):
    with pytest.raises(ConfigError) as exc:
        from_dict(job({"pod_template": template}))
    assert str(exc.value).startswith(f"platform.kubernetes.worker.{message}"), str(exc.value)


@pytest.mark.parametrize("worker,message", [
    ({"labels": {"elastic-supervisor/attempt": "9"}}, "platform.kubernetes.worker.labels.elastic-supervisor/attempt"),
    ({"labels": {"app.kubernetes.io/managed-by": "me"}}, "platform.kubernetes.worker.labels.app.kubernetes.io/managed-by"),
    ({"annotations": {"elastic-supervisor/slot": "x"}}, "platform.kubernetes.worker.annotations.elastic-supervisor/slot"),
])
def test_owned_labels_are_refused_in_worker_labels_too(worker, message):
    with pytest.raises(ConfigError, match=f"^{message}: owned by the controller"):
        from_dict(job(worker))


def test_a_mount_path_is_owned_only_where_the_controller_mounts_something():
    free = {"spec": {"volumes": [{"name": "own-shm", "emptyDir": {"medium": "Memory"}}],
                     "containers": [{"name": "agent", "volumeMounts": [{"name": "own-shm", "mountPath": "/dev/shm"}]}]}}
    with pytest.raises(ConfigError, match="/dev/shm is owned by the controller"):
        from_dict(job({"pod_template": free}))
    p = pod(free, worker={"shm_size": ""})
    assert {"name": "own-shm", "mountPath": "/dev/shm"} in agent(p)["volumeMounts"]
    validate(p)


# ------------------------------------------------------------------ against the fake API server

@pytest.fixture
def api():
    from fakes.kube_apiserver import FakeKubeAPIServer

    server = FakeKubeAPIServer().start()
    yield server
    server.stop()


def started(api, tmp_path, raw: dict) -> KubernetesPlatform:
    cfg = from_dict(raw)
    settings = settings_from_config(cfg, "training")
    p = KubernetesPlatform(KubeApi(client.ApiClient(api.configuration()), timeout_s=2, retry_s=2),
                           settings).start(wait_s=10)
    (tmp_path / "token").write_text("ab" * 24)
    p.token_env(tmp_path / "token")
    return p


def test_a_capacity_probe_lands_where_a_templated_worker_lands_and_runs_none_of_its_extras(api, tmp_path):
    import asyncio

    raw = job({"pod_template": GPU_TEMPLATE}, node_reads=False, slots=2)
    raw["platform"]["kubernetes"]["token_secret"] = {"name": ""}
    client.SchedulingV1Api(client.ApiClient(api.configuration())).create_priority_class(
        {"metadata": {"name": "training"}, "value": 1000})
    p = started(api, tmp_path, raw)
    try:
        asyncio.run(p.probe_capacity(["slot-1"]))
        (probe,) = api.objects("pods", "training")
        spec = probe["spec"]
        assert probe["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"  # queues admit it alike
        assert probe["metadata"]["labels"]["elastic-supervisor/role"] == "capacity-probe"
        for key in ("schedulerName", "runtimeClassName", "priorityClassName", "topologySpreadConstraints"):
            assert spec[key] == GPU_TEMPLATE["spec"][key], key
        assert spec["tolerations"][0] == GPU_TEMPLATE["spec"]["tolerations"][0]  # then the API's defaults
        assert spec["affinity"]["podAntiAffinity"] == GPU_TEMPLATE["spec"]["affinity"]["podAntiAffinity"]
        (c,) = spec["containers"]
        assert c["name"] == "probe" and c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert c["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"], "drop": ["ALL"]}
        # it holds the slot's resources, nothing else: no init containers, volumes, env or host IPC
        assert not {"initContainers", "volumes", "hostIPC"} & set(spec) and "env" not in c
        assert spec["securityContext"]["runAsNonRoot"] is True
    finally:
        p.close()


def test_an_agent_that_ended_beside_a_running_sidecar_ends_its_pod_for_the_controller(api, tmp_path):
    import asyncio

    template = {"spec": {"containers": [{"name": "dcgm-exporter", "image": "dcgm:3"}]}}
    raw = job({"pod_template": template}, node_reads=False, slots=2)
    raw["platform"]["kubernetes"]["token_secret"] = {"name": ""}
    p = started(api, tmp_path, raw)
    try:
        s = spec()
        s = LaunchSpec(**{**s.__dict__, "nodes": ["slot-0", "slot-1"]})
        asyncio.run(p.launch(s))
        v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
        running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        for name, agent_state in (("slot-0", {"terminated": {"exitCode": 3, "reason": "Error"}}), ("slot-1", running)):
            pod = p.describe()["pods"][name]
            v1.patch_namespaced_pod_status(pod, "training", {"status": {"phase": "Running", "containerStatuses": [
                {"name": "dcgm-exporter", "ready": True, "restartCount": 0, "image": "dcgm:3", "imageID": "",
                 "state": running},
                {"name": "agent", "ready": False, "restartCount": 0, "image": "x", "imageID": "", "state": agent_state}]}})
        import time
        deadline = time.monotonic() + 10
        while True:
            out = asyncio.run(p.observe())
            if out["slot-0"].state.name == "EXITED" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert out["slot-0"].state.name == "EXITED" and out["slot-0"].exit_code == 3
        assert out["slot-1"].state.name == "RUNNING"
    finally:
        p.close()


def test_the_pods_are_admitted_where_restricted_is_enforced_and_a_template_asking_for_more_needs_its_namespace(
        api, tmp_path):
    """PodSecurity admission (the fake API server runs k8s.io/pod-security-admission's checks): the
    generated pods pass ``restricted``; a template with hostNetwork is refused there, naming why,
    and admitted once the namespace is labelled privileged, as docs/kubernetes.md says."""
    import asyncio

    from supervisor.platforms.base import PlatformError

    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    v1.create_namespace({"metadata": {"name": "training", "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    s = LaunchSpec(**{**spec().__dict__, "nodes": ["slot-0", "slot-1"]})

    def launched(template: dict | None, attempt: int) -> list[dict]:
        raw = job({"pod_template": template} if template else {}, node_reads=False, slots=2)
        raw["platform"]["kubernetes"]["token_secret"] = {"name": ""}
        p = started(api, tmp_path, raw)
        try:
            asyncio.run(p.launch(LaunchSpec(**{**s.__dict__, "attempt": attempt})))
            asyncio.run(p.probe_capacity(["slot-1"]))
        finally:
            p.close()
        return [o for o in api.objects("pods", "training") if o["metadata"]["labels"].get(
            "elastic-supervisor/attempt") == str(attempt)]

    assert len(launched(None, 0)) == 2
    assert [o["metadata"]["name"] for o in api.objects("pods", "training")
            if o["metadata"]["labels"].get("elastic-supervisor/role") == "capacity-probe"] == ["llama-probe-slot-1"]
    host_network = {"spec": {"hostNetwork": True}}
    with pytest.raises(PlatformError, match=r'violates PodSecurity "restricted:latest": host namespaces'):
        launched(host_network, 1)
    v1.patch_namespace("training", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    pods = launched(host_network, 2)
    assert len(pods) == 2 and all(o["spec"]["hostNetwork"] for o in pods)


def dry_run(api, tmp_path, raw: dict, s: LaunchSpec) -> list[str]:
    """``check_workers(s)`` of a platform started for the job ``raw``: the dry run's warnings (its
    refusal raises)."""
    import asyncio

    p = started(api, tmp_path, raw)
    try:
        return asyncio.run(p.check_workers(s))
    finally:
        p.close()

def test_the_dry_run_tells_a_refusal_from_a_cluster_that_cannot_dry_run(api, tmp_path):
    """``check_workers``: PodSecurity's refusal stops the job with the API server's words; a
    webhook with side effects (the API server will not dry-run it) and RBAC get their own answers
    (quotas: the next test); the pod is never made."""
    from supervisor.platforms.base import PlatformError

    raw = job({"pod_template": {"spec": {"hostNetwork": True}}}, node_reads=False, slots=2)
    raw["platform"]["kubernetes"]["token_secret"] = {"name": ""}
    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    v1.create_namespace({"metadata": {"name": "training", "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    s = LaunchSpec(**{**spec().__dict__, "nodes": ["slot-0", "slot-1"]})

    def check() -> list[str]:
        return dry_run(api, tmp_path, raw, s)

    with pytest.raises(PlatformError, match=r'refuses the worker pod \(a dry run: nothing was made\): HTTP 403 '
                                            r'Forbidden: .*violates PodSecurity "restricted:latest": host namespaces'):
        check()

    def audit(namespace, pod):  # a policy webhook registered with sideEffects: Unknown
        raise AssertionError("never called on a dry run")

    audit.side_effects, audit.webhook_name = "Unknown", "audit.example.com"
    api.pod_webhooks.append(audit)
    (warning,) = check()
    assert 'could not be checked with a dry run (HTTP 400 Bad Request: admission webhook "audit.example.com" does ' \
           'not support dry run)' in warning
    api.pod_webhooks.remove(audit)
    v1.patch_namespace("training", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    assert check() == []
    api.inject_fault(403, verb="create", resource="pods", message='pods is forbidden: User "system:serviceaccount:'
                     'training:llama" cannot create resource "pods" in API group "" in the namespace "training"')
    with pytest.raises(PlatformError, match="the controller may not create worker pods in namespace training: .*"
                                            "grant it pods create"):
        check()
    assert [o for o in api.objects("pods", "training")] == []


def test_a_quota_that_can_never_hold_the_gang_stops_it_and_one_others_hold_now_is_a_warning(api, tmp_path):
    """``check_workers`` reads the quota admission's refusal of the dry run: a quota whose limit
    leaves room for fewer worker pods than the job's least node count, whatever else ends, is a
    refusal (no launch could ever run); one that others hold now is a warning. The pod is never
    made."""
    import asyncio

    from supervisor.platforms.base import PlatformError

    raw = job({"resources": {"limits": {"nvidia.com/gpu": 8}}}, node_reads=False, slots=2)  # nodes: min 2
    raw["platform"]["kubernetes"]["token_secret"] = {"name": ""}
    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    v1.create_namespace({"metadata": {"name": "training"}})
    s = LaunchSpec(**{**spec().__dict__, "nodes": ["slot-0", "slot-1"]})

    def check() -> list[str]:
        return dry_run(api, tmp_path, raw, s)

    def quota(gpus: str) -> None:
        body = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": gpus}}}
        if [q for q in v1.list_namespaced_resource_quota("training").items if q.metadata.name == "gpus"]:
            v1.replace_namespaced_resource_quota("gpus", "training", body)
        else:
            v1.create_namespaced_resource_quota("training", body)

    def holder(gpus: int) -> None:  # another team's pod, holding part of the quota
        v1.create_namespaced_pod("training", {"metadata": {"name": "other"}, "spec": {"containers": [{
            "name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})

    quota("4")  # less than one worker pod's 8 GPUs
    with pytest.raises(PlatformError, match=r"the namespace's quota gpus can never hold the gang: a worker pod "
                                            r"requests requests.nvidia.com/gpu=8 and the quota allows "
                                            r"requests.nvidia.com/gpu=4 in all, room for 0 worker pods where the "
                                            r"job needs at least 2 \(a dry run: nothing was made\); raise the quota "
                                            r"or lower the workers' requests"):
        check()
    quota("16")  # room for the gang once another team's pod, holding 12 now, ends: a warning
    holder(12)
    (warning,) = check()
    assert warning.startswith("the namespace's quota does not hold a worker pod now (HTTP 403 Forbidden: ") \
        and "exceeded quota: gpus" in warning and warning.endswith("the launch fails while it does not (a first "
                                                                   "launch ends the controller, exit 1; a relaunch is "
                                                                   "retried, then fails)"), warning
    quota("12")  # room for one worker pod, never two: refused, even while the other pod holds it
    with pytest.raises(PlatformError, match=r"room for 1 worker pod where the job needs at least 2"):
        check()
    elastic = job({"resources": {"limits": {"nvidia.com/gpu": 8}}}, node_reads=False, slots=2) | {"nodes": {
        "min": 1, "max": 2}}
    elastic["platform"]["kubernetes"]["token_secret"] = {"name": ""}
    # an elastic job (nodes.min 1) launched at 2: one pod's room is enough to run
    (warning,) = dry_run(api, tmp_path, elastic, s)
    assert "the launch fails while it does not" in warning, warning
    quota("16")
    v1.delete_namespaced_pod("other", "training")
    assert check() == []
    assert [o["metadata"]["name"] for o in api.objects("pods", "training")] == []
    # a quota with room for one pod and nothing else in it passes the dry run (one pod fits); the
    # launch's second pod is refused, and the error says why the gang can never run, not a bare 403
    quota("12")
    p = started(api, tmp_path, raw)
    try:
        with pytest.raises(PlatformError, match=r"the namespace's quota gpus can never hold the gang: .* room for 1 "
                                                r"worker pod where the job needs at least 2: pod \S+ refused \(HTTP "
                                                r"403 Forbidden: .*exceeded quota: gpus"):
            asyncio.run(p.launch(s))
    finally:
        p.close()
