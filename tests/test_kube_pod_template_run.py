"""``platform.kubernetes.worker.pod_template`` end to end (issue 29): ``supervisor run`` as a real
subprocess (the controller as its image ships it) against the fake API server, which validates
every pod as kube-apiserver 1.30 does, and the fake kubelet running real torchrun pods. A GPU
team's kind of template (a volume and its mount, env from a Secret, hostNetwork, a label) reaches
the pods as written, the ranks get the Secret's value, and the job completes on the loss path of
an uninterrupted torchrun run."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from kube_harness import (  # noqa: F401  (cluster, control, kube_run: fixtures)
    JOB_NAME,
    NS,
    as_the_chart_installs_it,
    assert_allowed_by_the_charts_rbac,
    assert_same_path,
    cluster,
    control,
    finished,
    k8s_event,
    kube_run,
)

pytestmark = pytest.mark.slow

SECRET_VALUE = "s3cr3t-from-a-secret"


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def test_a_template_with_a_volume_env_from_a_secret_and_host_network_reaches_the_pods_and_the_job_completes(
        cluster, kube_run, control, tmp_path):
    cluster.kubelet.v1.create_namespaced_secret(NS, {"metadata": {"name": "wandb"}, "data": {
        "api-key": base64.b64encode(SECRET_VALUE.encode()).decode()}})
    template = {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}},
        "spec": {
            "hostNetwork": True,
            "volumes": [{"name": "datasets", "hostPath": {"path": str(tmp_path), "type": "Directory"}}],
            "containers": [{"name": "agent",
                            "env": [{"name": "WANDB_API_KEY",
                                     "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
                                    {"name": "DATA_ROOT", "value": "/data"}],
                            "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True}]}],
        },
    }
    run = kube_run(kube={"worker": {"image": "fake.invalid/worker:1", "pod_template": template}})
    run.wait_checkpoint(5)
    pods = cluster.pods(**{"elastic-supervisor/job": JOB_NAME})
    assert len(pods) == 2
    for pod in pods:
        pid = cluster.kubelet.pid(pod["metadata"]["name"])
        assert pid is not None, "the pod's agent runs"
        seen = environ(pid)
        assert seen["WANDB_API_KEY"] == SECRET_VALUE and seen["DATA_ROOT"] == "/data"
        assert seen["SUPERVISOR_JOB"] == JOB_NAME  # the controller's own variables beside the template's
    done = finished(run)
    assert done["phase"] == "completed"
    assert_same_path(run, control)
    for pod in cluster.pods(**{"elastic-supervisor/job": JOB_NAME}):
        spec, labels = pod["spec"], pod["metadata"]["labels"]
        assert pod["status"]["phase"] == "Succeeded" and spec["restartPolicy"] == "Never"
        assert labels["kueue.x-k8s.io/queue-name"] == "gpu-queue" and labels["elastic-supervisor/job"] == JOB_NAME
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert {"name": "datasets", "hostPath": {"path": str(tmp_path), "type": "Directory"}} in spec["volumes"]
        (agent,) = spec["containers"]
        assert {"name": "datasets", "mountPath": "/data", "readOnly": True} in agent["volumeMounts"]
        env = {e["name"]: e for e in agent["env"]}
        assert env["WANDB_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
        assert SECRET_VALUE not in str(pod)  # a reference in the spec, never the value
        # what the template did not ask for stays restricted
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert agent["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        # the slot's pinning kept
        node = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert node["nodeSelectorTerms"][0]["matchExpressions"][-1]["values"] == [spec["nodeName"]]


def test_a_privileged_template_in_a_restricted_namespace_stops_the_job_before_any_pod_exists(cluster, kube_run,
                                                                                             tmp_path):
    """The controller's start-up dry-runs one worker pod (``dryRun=All``): PodSecurity refuses a
    privileged template there, and the job stops at once with the API server's words (exit 8), as
    an Event on the release's ConfigMap, having made no pod."""
    cluster.kubelet.v1.create_namespace({"metadata": {"name": NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    template = {"spec": {"hostNetwork": True, "containers": [{"name": "agent", "securityContext": {
        "privileged": True, "allowPrivilegeEscalation": True, "capabilities": {"add": ["IPC_LOCK"]}}}]}}
    kube = as_the_chart_installs_it(cluster, tmp_path)
    run = kube_run(kube=kube | {"worker": {"image": "fake.invalid/worker:1", "pod_template": template}})
    refused = run.wait_event("workers_refused")
    assert 'violates PodSecurity "restricted:latest": host namespaces' in refused["error"], refused
    assert "privileged" in refused["error"] and "nothing was made" in refused["error"]
    done = finished(run, 8)
    assert done["phase"] == "stopped_startup_failure" and "violates PodSecurity" in done["reason"]
    assert not run.events("launched") and cluster.pods() == []
    assert cluster.api.request_count(verb="create", resource="pods") == 1  # the dry run, and no pod since
    said = k8s_event(cluster, "WorkerPodRefused", "demo-elastic-supervisor-config")
    assert said["type"] == "Warning" and 'violates PodSecurity "restricted:latest"' in said["message"]
    assert_allowed_by_the_charts_rbac(cluster.api)
    # what `helm test` runs: the same dry run, from the same config, its verdict as an exit code
    check = [str(run.controller), "-m", "supervisor", "run", "--config", str(run.config), "--check"]
    refused = subprocess.run(check, env=run.env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 1 and 'violates PodSecurity "restricted:latest"' in refused.stderr, refused
    cluster.kubelet.v1.patch_namespace(NS, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    accepted = subprocess.run(check, env=run.env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert accepted.returncode == 0 and accepted.stdout.startswith("ok: "), accepted
    assert cluster.pods() == []  # a dry run makes nothing
