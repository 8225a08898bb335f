"""The fake API server where a real cluster is strict with GPU jobs (issue 29), through the real client.

Custom resources (Volcano and scheduler-plugins PodGroups, Kueue's queues and workloads),
``dryRun=All``, namespaces with PodSecurity labels, ResourceQuota, PriorityClass objects and
PodDisruptionBudgets with the eviction subresource: each asserted with the status codes and
messages kube-apiserver answers, so a test on the fake fails where a user's job would.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from fakes.kube_apiserver import FakeKubeAPIServer

NS = "default"
VOLCANO = ("scheduling.volcano.sh", "v1beta1", "podgroups")
COSCHED = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
KUEUE = "kueue.x-k8s.io"


@pytest.fixture
def api():
    with FakeKubeAPIServer(bookmark_interval_s=30.0, priority_classes={"training": 1000}) as server:
        yield server


@pytest.fixture
def v1(api):
    return client.CoreV1Api(client.ApiClient(api.configuration()))


@pytest.fixture
def crd(api):
    return client.CustomObjectsApi(client.ApiClient(api.configuration()))


@pytest.fixture
def policy(api):
    return client.PolicyV1Api(client.ApiClient(api.configuration()))


@pytest.fixture
def scheduling(api):
    return client.SchedulingV1Api(client.ApiClient(api.configuration()))


def pod(name: str, labels: dict | None = None, node: str | None = None, **spec_extra) -> dict:
    spec: dict = {"containers": [{"name": "agent", "image": "trainer:1"}], **spec_extra}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def with_resources(body: dict, requests: dict | None = None, limits: dict | None = None) -> dict:
    body["spec"]["containers"][0]["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return body


def restricted_pod(name: str) -> dict:
    body = pod(name, securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}})
    body["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}
    return body


def expect_error(code: int, reason: str, fn, *args, **kw) -> dict:
    with pytest.raises(ApiException) as info:
        fn(*args, **kw)
    assert info.value.status == code, info.value.body
    body = json.loads(info.value.body)
    assert (body["kind"], body["status"], body["code"], body["reason"]) == ("Status", "Failure", code, reason)
    return body


def podgroup(name: str, group: tuple[str, str, str], **spec) -> dict:
    return {"apiVersion": f"{group[0]}/{group[1]}", "kind": "PodGroup", "metadata": {"name": name},
            "spec": spec or {"minMember": 2}}


# --- custom resources ----------------------------------------------------------------------------

def test_two_groups_podgroups_are_kept_apart(crd, api):
    a = crd.create_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2], podgroup("pg", VOLCANO, minMember=4))
    b = crd.create_namespaced_custom_object(*COSCHED[:2], NS, COSCHED[2], podgroup("pg", COSCHED, minMember=8))
    assert a["apiVersion"] == "scheduling.volcano.sh/v1beta1" and b["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert a["metadata"]["uid"] != b["metadata"]["uid"] and a["metadata"]["generation"] == 1
    assert crd.get_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2], "pg")["spec"]["minMember"] == 4
    assert crd.get_namespaced_custom_object(*COSCHED[:2], NS, COSCHED[2], "pg")["spec"]["minMember"] == 8
    listed = crd.list_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2])
    assert (listed["kind"], [i["spec"]["minMember"] for i in listed["items"]]) == ("PodGroupList", [4])
    body = expect_error(409, "AlreadyExists", crd.create_namespaced_custom_object, *COSCHED[:2], NS, COSCHED[2],
                        podgroup("pg", COSCHED))
    assert body["message"] == 'podgroups.scheduling.x-k8s.io "pg" already exists'
    deleted = crd.delete_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2], "pg")
    assert (deleted["kind"], deleted["status"]) == ("Status", "Success")
    body = expect_error(404, "NotFound", crd.get_namespaced_custom_object, *VOLCANO[:2], NS, VOLCANO[2], "pg")
    assert body["message"] == 'podgroups.scheduling.volcano.sh "pg" not found'
    assert crd.get_namespaced_custom_object(*COSCHED[:2], NS, COSCHED[2], "pg")["spec"]["minMember"] == 8
    assert [o["metadata"]["name"] for o in api.objects("podgroups.scheduling.x-k8s.io", NS)] == ["pg"]
    assert api.objects("podgroups.scheduling.volcano.sh") == []


def test_kueue_objects_list_watch_select_and_keep_their_status(crd):
    rv = crd.list_namespaced_custom_object(KUEUE, "v1beta1", NS, "workloads")["metadata"]["resourceVersion"]
    for name, queue in (("w0", "gpu"), ("w1", "cpu")):
        crd.create_namespaced_custom_object(KUEUE, "v1beta1", NS, "workloads", {
            "apiVersion": f"{KUEUE}/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
            "spec": {"queueName": queue, "podSets": [{"name": "main", "count": 2}]}})
    picked = crd.list_namespaced_custom_object(KUEUE, "v1beta1", NS, "workloads",
                                               label_selector="kueue.x-k8s.io/queue-name=gpu")
    assert [i["metadata"]["name"] for i in picked["items"]] == ["w0"]
    picked = crd.list_namespaced_custom_object(KUEUE, "v1beta1", NS, "workloads", field_selector="metadata.name=w1")
    assert [i["metadata"]["name"] for i in picked["items"]] == ["w1"]
    body = expect_error(400, "BadRequest", crd.list_namespaced_custom_object, KUEUE, "v1beta1", NS, "workloads",
                        field_selector="spec.queueName=gpu")
    assert body["message"] == "field label not supported: spec.queueName"
    # the status subresource: a patch of the object keeps the status, of /status changes only it
    admitted = {"admission": {"clusterQueue": "cq"}, "conditions": [{"type": "Admitted", "status": "True"}]}
    after = crd.patch_namespaced_custom_object_status(KUEUE, "v1beta1", NS, "workloads", "w0",
                                                      {"status": admitted, "spec": {"queueName": "other"}})
    assert after["status"] == admitted and after["spec"]["queueName"] == "gpu" and after["metadata"]["generation"] == 1
    after = crd.patch_namespaced_custom_object(KUEUE, "v1beta1", NS, "workloads", "w0",
                                               {"spec": {"active": False}, "status": {"admission": None}})
    assert after["status"] == admitted and after["spec"]["active"] is False and after["metadata"]["generation"] == 2
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in watch.Watch().stream(
        crd.list_namespaced_custom_object, KUEUE, "v1beta1", NS, "workloads", resource_version=rv, timeout_seconds=1)]
    assert seen == [("ADDED", "w0"), ("ADDED", "w1"), ("MODIFIED", "w0"), ("MODIFIED", "w0")]


def test_cluster_scoped_kueue_queues(crd):
    crd.create_cluster_custom_object(KUEUE, "v1beta1", "resourceflavors", {
        "apiVersion": f"{KUEUE}/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "h100"}})
    cq = crd.create_cluster_custom_object(KUEUE, "v1beta1", "clusterqueues", {
        "apiVersion": f"{KUEUE}/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "cq"},
        "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}})
    assert "namespace" not in cq["metadata"]
    lq = crd.create_namespaced_custom_object(KUEUE, "v1beta1", NS, "localqueues", {
        "apiVersion": f"{KUEUE}/v1beta1", "kind": "LocalQueue", "metadata": {"name": "gpu"},
        "spec": {"clusterQueue": "cq"}})
    assert lq["metadata"]["namespace"] == NS
    assert [i["metadata"]["name"] for i in crd.list_cluster_custom_object(KUEUE, "v1beta1", "clusterqueues")["items"]] == ["cq"]
    # a cluster-scoped resource has no namespaced path, as on a real server
    expect_error(404, "NotFound", crd.list_namespaced_custom_object, KUEUE, "v1beta1", NS, "clusterqueues")


# --- dryRun=All ----------------------------------------------------------------------------------

def test_dry_run_create_is_validated_and_admitted_but_not_stored(v1, api):
    before = api.resource_version
    made = v1.create_namespaced_pod(NS, pod("p0"), dry_run="All")
    assert made.metadata.uid and made.metadata.creation_timestamp and made.metadata.resource_version is None
    assert (made.spec.containers[0].image_pull_policy, made.spec.priority, made.status.qos_class) == \
        ("IfNotPresent", 0, "BestEffort")
    assert api.resource_version == before and api.get("pods", NS, "p0") is None
    expect_error(404, "NotFound", v1.read_namespaced_pod, "p0", NS)
    body = pod("bad")
    body["spec"]["containers"][0]["name"] = "Agent"
    assert expect_error(422, "Invalid", v1.create_namespaced_pod, NS, body, dry_run="All")["message"].startswith(
        'Pod "bad" is invalid: spec.containers[0].name: Invalid value: "Agent"')
    err = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS,
                       pod("p1", priorityClassName="nope"), dry_run="All")
    assert err["message"] == 'pods "p1" is forbidden: no PriorityClass with name nope was found'
    # a watch from before sees the real create only
    v1.create_namespaced_pod(NS, pod("real"))
    expect_error(409, "AlreadyExists", v1.create_namespaced_pod, NS, pod("real"), dry_run="All")
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        v1.list_namespaced_pod, NS, resource_version=before, timeout_seconds=1)]
    assert seen == [("ADDED", "real")]


def test_dry_run_update_patch_and_delete_change_nothing(v1, api):
    cm = v1.create_namespaced_config_map(NS, {"metadata": {"name": "c"}, "data": {"k": "v"}})
    rv = cm.metadata.resource_version
    patched = v1.patch_namespaced_config_map("c", NS, {"data": {"k": "w"}}, dry_run="All")
    assert patched.data == {"k": "w"} and patched.metadata.resource_version == rv
    cm.data = {"k": "x"}
    assert v1.replace_namespaced_config_map("c", NS, cm, dry_run="All").data == {"k": "x"}
    v1.delete_namespaced_config_map("c", NS, dry_run="All")
    assert v1.read_namespaced_config_map("c", NS).data == {"k": "v"} and api.resource_version == rv
    v1.create_namespaced_pod(NS, pod("p0", node="n0"))
    rv = api.resource_version
    going = v1.delete_namespaced_pod("p0", NS, dry_run="All")
    assert going.metadata.deletion_timestamp is not None           # what a real delete would answer
    assert v1.read_namespaced_pod("p0", NS).metadata.deletion_timestamp is None and api.resource_version == rv
    stale = v1.read_namespaced_pod("p0", NS)
    stale.metadata.resource_version = "1"
    expect_error(409, "Conflict", v1.replace_namespaced_pod, "p0", NS, stale, dry_run="All")


def test_an_unknown_dry_run_value_is_the_options_422(v1):
    body = expect_error(422, "Invalid", v1.create_namespaced_pod, NS, pod("p0"), dry_run="Maybe")
    assert body["message"] == ('CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: '
                               '[]string{"Maybe"}: supported values: "All"')
    assert body["details"]["causes"] == [{"reason": "FieldValueNotSupported", "field": "dryRun",
                                          "message": 'Unsupported value: []string{"Maybe"}: supported values: "All"'}]
    v1.create_namespaced_pod(NS, pod("p0"))
    body = expect_error(422, "Invalid", v1.delete_namespaced_pod, "p0", NS, dry_run="all")
    assert body["message"].startswith('DeleteOptions.meta.k8s.io "" is invalid: dryRun')


# --- namespaces and PodSecurity ------------------------------------------------------------------

def test_namespaces_are_cluster_scoped_objects(v1, api):
    assert {"default", "kube-system"} <= {n.metadata.name for n in v1.list_namespace().items}
    ns = v1.create_namespace({"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    assert (ns.status.phase, ns.spec.finalizers) == ("Active", ["kubernetes"])
    assert ns.metadata.labels == {"team": "a", "kubernetes.io/metadata.name": "team-a"}
    assert [n.metadata.name for n in v1.list_namespace(label_selector="team=a").items] == ["team-a"]
    body = expect_error(422, "Invalid", v1.create_namespace, {"metadata": {"name": "Team_B"}})
    assert body["message"].startswith('Namespace "Team_B" is invalid: metadata.name: Invalid value: "Team_B"')
    v1.create_namespaced_pod("team-a", pod("p0"))
    v1.create_namespaced_pod("never-created", pod("p0"))      # as before: a namespace exists implicitly
    gone = v1.delete_namespace("team-a")
    assert gone["status"]["phase"] == "Terminating"   # the client types the answer as a Status
    expect_error(404, "NotFound", v1.read_namespaced_pod, "p0", "team-a")
    expect_error(404, "NotFound", v1.read_namespace, "team-a")
    assert v1.read_namespaced_pod("p0", "never-created").metadata.name == "p0"
    body = expect_error(403, "Forbidden", v1.delete_namespace, "default")
    assert body["message"] == 'namespaces "default" is forbidden: this namespace may not be deleted'


def test_restricted_namespace_refuses_a_plain_pod_with_the_real_message(v1):
    v1.create_namespace({"metadata": {"name": "secure", "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    for dry_run in ("All", None):
        body = expect_error(403, "Forbidden", v1.create_namespaced_pod, "secure", pod("x"), dry_run=dry_run)
        assert body["message"] == (
            'pods "x" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
            '(container "agent" must set securityContext.allowPrivilegeEscalation=false), unrestricted '
            'capabilities (container "agent" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != '
            'true (pod or container "agent" must set securityContext.runAsNonRoot=true), seccompProfile (pod or '
            'container "agent" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
        assert body["details"] == {"name": "x", "kind": "pods"}
    assert v1.list_namespaced_pod("secure").items == []
    v1.create_namespaced_pod("secure", restricted_pod("ok"))
    bad = restricted_pod("root")
    bad["spec"]["securityContext"]["runAsUser"] = 0
    bad["spec"]["volumes"] = [{"name": "data", "hostPath": {"path": "/data"}}]
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, "secure", bad)
    assert body["message"] == ('pods "root" is forbidden: violates PodSecurity "restricted:latest": restricted volume '
                               'types (volume "data" uses restricted volume type "hostPath"), runAsUser=0 (pod must '
                               'not set runAsUser=0)')


def test_baseline_namespace_and_warnings(v1):
    v1.create_namespace({"metadata": {"name": "base", "labels": {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "v1.30",
        "pod-security.kubernetes.io/warn": "restricted"}}})
    host = pod("host", hostNetwork=True, volumes=[{"name": "data", "hostPath": {"path": "/data"}}])
    host["spec"]["containers"][0]["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    host["spec"]["containers"][0]["ports"] = [{"containerPort": 29500, "hostPort": 29500}]
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, "base", host)
    assert body["message"] == (
        'pods "host" is forbidden: violates PodSecurity "baseline:v1.30": non-default capabilities (container '
        '"agent" must not include "SYS_ADMIN" in securityContext.capabilities.add), host namespaces '
        '(hostNetwork=true), hostPath volumes (volume "data"), hostPort (container "agent" uses hostPort 29500), '
        'privileged (container "agent" must not set securityContext.privileged=true)')
    tuned = pod("tuned", securityContext={"sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"},
                                                      {"name": "net.core.somaxconn", "value": "4096"}]})
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, "base", tuned)
    # at v1.30 tcp_rmem is not yet a safe sysctl (1.32 made it one)
    assert body["message"] == ('pods "tuned" is forbidden: violates PodSecurity "baseline:v1.30": forbidden sysctls '
                               '(net.ipv4.tcp_rmem, net.core.somaxconn)')
    labelled = pod("selinux", securityContext={"seLinuxOptions": {"type": "spc_t", "user": "root"},
                                               "appArmorProfile": {"type": "Unconfined"}})
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, "base", labelled)
    assert body["message"] == ('pods "selinux" is forbidden: violates PodSecurity "baseline:v1.30": forbidden AppArmor '
                               'profile (pod must not set AppArmor profile type to "Unconfined"), seLinuxOptions (pod '
                               'set forbidden securityContext.seLinuxOptions: type "spc_t"; user may not be set)')
    # baseline lets a plain pod in; the warn level says what restricted would refuse
    _, code, headers = v1.create_namespaced_pod_with_http_info("base", pod("plain"))
    assert code == 201
    assert headers["Warning"].startswith('299 - "would violate PodSecurity \\"restricted:latest\\": '
                                         'allowPrivilegeEscalation != false')
    _, _, headers = v1.create_namespaced_pod_with_http_info("base", restricted_pod("clean"))
    assert "Warning" not in headers


def test_invalid_pod_security_labels_are_refused(v1):
    body = expect_error(422, "Invalid", v1.create_namespace, {"metadata": {"name": "x", "labels": {
        "pod-security.kubernetes.io/enforce": "strict"}}})
    assert body["message"] == ('Namespace "x" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]: '
                               'Invalid value: "strict": must be one of privileged, baseline, restricted')
    v1.create_namespace({"metadata": {"name": "y"}})
    body = expect_error(422, "Invalid", v1.patch_namespace, "y", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce-version": "1.30"}}})
    assert body["message"].endswith('Invalid value: "1.30": must be "latest" or "v1.x"')


# --- ResourceQuota -------------------------------------------------------------------------------

def gpu_pod(name: str, cpu: str, memory: str, gpus: int) -> dict:
    return with_resources(pod(name), {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)},
                          {"nvidia.com/gpu": str(gpus)})


def test_quota_status_and_the_real_refusals(v1, api):
    v1.create_namespaced_resource_quota(NS, {"metadata": {"name": "compute"}, "spec": {"hard": {
        "requests.cpu": "2", "requests.memory": "4096Mi", "requests.nvidia.com/gpu": "4", "pods": "3"}}})
    quota = v1.read_namespaced_resource_quota("compute", NS)
    assert quota.status.hard == {"requests.cpu": "2", "requests.memory": "4Gi", "requests.nvidia.com/gpu": "4",
                                 "pods": "3"}
    assert quota.status.used == {"requests.cpu": "0", "requests.memory": "0", "requests.nvidia.com/gpu": "0",
                                 "pods": "0"}
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS, pod("bare"))
    assert body["message"] == ('pods "bare" is forbidden: failed quota: compute: must specify requests.cpu for: '
                               'agent; requests.memory for: agent')
    v1.create_namespaced_pod(NS, gpu_pod("p0", "1500m", "1Gi", 4))
    assert v1.read_namespaced_resource_quota("compute", NS).status.used == {
        "requests.cpu": "1500m", "requests.memory": "1Gi", "requests.nvidia.com/gpu": "4", "pods": "1"}
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS, gpu_pod("p1", "1", "1Gi", 1))
    assert body["message"] == ('pods "p1" is forbidden: exceeded quota: compute, requested: requests.cpu=1,'
                               'requests.nvidia.com/gpu=1, used: requests.cpu=1500m,requests.nvidia.com/gpu=4, '
                               'limited: requests.cpu=2,requests.nvidia.com/gpu=4')
    expect_error(403, "Forbidden", v1.create_namespaced_pod, NS, gpu_pod("p1", "1", "1Gi", 1), dry_run="All")
    rv = api.resource_version
    v1.create_namespaced_pod(NS, gpu_pod("p1", "500m", "1Gi", 0), dry_run="All")
    assert api.resource_version == rv
    assert v1.read_namespaced_resource_quota("compute", NS).status.used["requests.cpu"] == "1500m"
    # a finished pod no longer counts
    v1.patch_namespaced_pod_status("p0", NS, {"status": {"phase": "Succeeded"}})
    assert v1.read_namespaced_resource_quota("compute", NS).status.used == {
        "requests.cpu": "0", "requests.memory": "0", "requests.nvidia.com/gpu": "0", "pods": "0"}
    v1.create_namespaced_pod(NS, gpu_pod("p1", "1", "1Gi", 1))


def test_count_pods_counts_finished_pods_and_limits_must_be_given(v1):
    v1.create_namespaced_resource_quota(NS, {"metadata": {"name": "objects"}, "spec": {"hard": {
        "count/pods": "1", "limits.memory": "1Gi"}}})
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS,
                        with_resources(pod("p0"), {"memory": "1Gi"}))
    assert body["message"] == 'pods "p0" is forbidden: failed quota: objects: must specify limits.memory for: agent'
    v1.create_namespaced_pod(NS, with_resources(pod("p0"), limits={"memory": "512Mi"}))
    v1.patch_namespaced_pod_status("p0", NS, {"status": {"phase": "Failed"}})
    assert v1.read_namespaced_resource_quota("objects", NS).status.used == {"count/pods": "1", "limits.memory": "0"}
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS,
                        with_resources(pod("p1"), limits={"memory": "512Mi"}))
    assert body["message"] == ('pods "p1" is forbidden: exceeded quota: objects, requested: count/pods=1, '
                               'used: count/pods=1, limited: count/pods=1')


# --- PriorityClass -------------------------------------------------------------------------------

def test_priority_classes_are_objects(v1, scheduling):
    names = {pc.metadata.name: pc.value for pc in scheduling.list_priority_class().items}
    assert names == {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000, "training": 1000}
    assert v1.create_namespaced_pod(NS, pod("p0", priorityClassName="training")).spec.priority == 1000
    scheduling.create_priority_class({"metadata": {"name": "batch"}, "value": 10, "globalDefault": True,
                                      "preemptionPolicy": "Never"})
    made = v1.create_namespaced_pod(NS, pod("p1"))
    assert (made.spec.priority_class_name, made.spec.priority, made.spec.preemption_policy) == ("batch", 10, "Never")
    body = expect_error(403, "Forbidden", scheduling.create_priority_class,
                        {"metadata": {"name": "other"}, "value": 5, "globalDefault": True})
    assert body["message"] == ('priorityclasses.scheduling.k8s.io "other" is forbidden: PriorityClass batch is '
                               'already marked as default. Only one default can exist')
    body = expect_error(422, "Invalid", scheduling.create_priority_class, {"metadata": {"name": "huge"},
                                                                            "value": 2000000000})
    assert body["message"] == ('PriorityClass.scheduling.k8s.io "huge" is invalid: value: Forbidden: maximum allowed '
                               'value of a user defined priority is 1000000000')
    expect_error(422, "Invalid", scheduling.create_priority_class, {"metadata": {"name": "system-mine"}, "value": 1})
    body = expect_error(422, "Invalid", scheduling.patch_priority_class, "batch", {"value": 11})
    assert body["message"].endswith("value: Forbidden: may not be changed in an update.")
    expect_error(403, "Forbidden", scheduling.delete_priority_class, "system-node-critical")
    scheduling.delete_priority_class("training")
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS, pod("p2", priorityClassName="training"))
    assert body["message"] == 'pods "p2" is forbidden: no PriorityClass with name training was found'


# --- PodDisruptionBudget and eviction ------------------------------------------------------------

def ready(v1, name: str) -> None:
    v1.patch_namespaced_pod_status(name, NS, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}})


def test_eviction_respects_the_disruption_budget(v1, policy, api):
    for i in range(3):
        v1.create_namespaced_pod(NS, pod(f"p{i}", {"app": "trainer"}, node="n0"))
        ready(v1, f"p{i}")
    made = policy.create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "budget"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "trainer"}}}})
    assert made.status.disruptions_allowed == 0 and made.status.observed_generation is None   # not yet synced
    status = policy.read_namespaced_pod_disruption_budget("budget", NS).status
    assert (status.expected_pods, status.current_healthy, status.desired_healthy, status.disruptions_allowed,
            status.observed_generation) == (3, 3, 2, 1, 1)
    assert [(c.type, c.status, c.reason) for c in status.conditions] == [("DisruptionAllowed", "True", "SufficientPods")]
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="p0", namespace=NS))
    v1.create_namespaced_pod_eviction("p0", NS, eviction, dry_run="All")
    assert v1.read_namespaced_pod("p0", NS).metadata.deletion_timestamp is None
    v1.create_namespaced_pod_eviction("p0", NS, eviction)
    assert v1.read_namespaced_pod("p0", NS).metadata.deletion_timestamp is not None    # a graceful delete
    status = policy.read_namespaced_pod_disruption_budget("budget", NS).status
    assert (status.current_healthy, status.disruptions_allowed, status.conditions[0].reason) == (2, 0, "InsufficientPods")
    body = expect_error(429, "TooManyRequests", v1.create_namespaced_pod_eviction, "p1", NS,
                        client.V1Eviction(metadata=client.V1ObjectMeta(name="p1", namespace=NS)))
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget",
                                          "message": "The disruption budget budget needs 2 healthy pods and has 2 currently"}]
    assert v1.read_namespaced_pod("p1", NS).metadata.deletion_timestamp is None
    # a pod the budget does not cover, or a pending one, goes at once
    v1.create_namespaced_pod(NS, pod("lone", {"app": "trainer"}))
    v1.create_namespaced_pod_eviction("lone", NS, client.V1Eviction(metadata=client.V1ObjectMeta(name="lone")))
    expect_error(404, "NotFound", v1.read_namespaced_pod, "lone", NS)
    body = expect_error(400, "BadRequest", v1.create_namespaced_pod_eviction, "p1", NS,
                        client.V1Eviction(metadata=client.V1ObjectMeta(name="p2")))
    assert body["message"] == "name in URL does not match name in Eviction object"


def test_a_budgets_status_follows_each_pod_written_after_it_and_a_new_selector(v1, policy, api):
    """The disruption controller's count is kept pod by pod (a pod write looks at that pod, not
    the namespace): each change of a selected pod, of a pod's labels and of the selector shows."""
    policy.create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "gang"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"attempt": "0"}}}})

    def counts() -> tuple[int, int, int]:
        st = policy.read_namespaced_pod_disruption_budget("gang", NS).status
        return st.expected_pods, st.current_healthy, st.disruptions_allowed

    assert counts() == (0, 0, 0)
    for i in range(3):
        v1.create_namespaced_pod(NS, pod(f"a0-{i}", {"attempt": "0"}, node="n0"))
    v1.create_namespaced_pod(NS, pod("other", {"attempt": "1"}, node="n0"))
    assert counts() == (3, 0, 0)
    for i in range(3):
        ready(v1, f"a0-{i}")
    ready(v1, "other")
    assert counts() == (3, 3, 1)
    v1.patch_namespaced_pod("a0-2", NS, {"metadata": {"labels": {"attempt": "2"}}})    # leaves the selector
    assert counts() == (2, 2, 0)
    v1.patch_namespaced_pod("other", NS, {"metadata": {"labels": {"attempt": "0"}}})   # joins it
    assert counts() == (3, 3, 1)
    v1.delete_namespaced_pod("a0-0", NS)    # graceful: still there, no longer healthy
    assert counts() == (3, 2, 0)
    api.finish_deletion("pods", NS, "a0-0")
    assert counts() == (2, 2, 0)
    policy.patch_namespaced_pod_disruption_budget("gang", NS, {"spec": {"selector": {"matchLabels": {"attempt": "2"}}}})
    assert counts() == (1, 1, 0)
    policy.delete_namespaced_pod_disruption_budget("gang", NS)
    policy.create_namespaced_pod_disruption_budget(NS, {   # the same name again: counted afresh
        "metadata": {"name": "gang"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"attempt": "0"}}}})
    assert counts() == (2, 2, 1)


def test_budgets_by_percentage_need_a_controller_the_fake_cannot_scale(v1, policy):
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1", "controller": True}
    body = pod("p0", {"app": "job"}, node="n0")
    body["metadata"]["ownerReferences"] = [owner]
    v1.create_namespaced_pod(NS, body)
    ready(v1, "p0")
    policy.create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "pct"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "job"}}}})
    status = policy.read_namespaced_pod_disruption_budget("pct", NS).status
    assert status.disruptions_allowed == 0
    assert [(c.status, c.reason, c.message) for c in status.conditions] == [
        ("False", "SyncFailed", 'found no controllers for pod "p0"')]
    expect_error(429, "TooManyRequests", v1.create_namespaced_pod_eviction, "p0", NS,
                 client.V1Eviction(metadata=client.V1ObjectMeta(name="p0")))


def test_a_stricter_enforce_label_warns_about_the_pods_already_there(v1):
    v1.create_namespace({"metadata": {"name": "team"}})
    for name in ("b", "a", "c"):
        v1.create_namespaced_pod("team", pod(name))
    host = pod("h", hostNetwork=True)
    v1.create_namespaced_pod("team", host)
    _, _, headers = v1.patch_namespace_with_http_info("team", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}})
    assert headers.getlist("Warning") == [
        '299 - "existing pods in namespace \\"team\\" violate the new PodSecurity enforce level \\"baseline:latest\\""',
        '299 - "h: host namespaces"']
    _, _, headers = v1.patch_namespace_with_http_info("team", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    assert headers.getlist("Warning")[1:] == [
        '299 - "a (and 2 other pods): allowPrivilegeEscalation != false, unrestricted capabilities, '
        'runAsNonRoot != true, seccompProfile"',
        '299 - "h: host namespaces, allowPrivilegeEscalation != false, unrestricted capabilities, '
        'runAsNonRoot != true, seccompProfile"']
    # the pods stay; a new image on one of them is checked against the new level
    body = expect_error(403, "Forbidden", v1.patch_namespaced_pod, "a", "team",
                        {"spec": {"containers": [{"name": "agent", "image": "trainer:2"}]}})
    assert body["message"].startswith('pods "a" is forbidden: violates PodSecurity "restricted:latest": ')


def test_a_custom_resource_body_must_name_its_own_kind_and_version(crd):
    body = expect_error(400, "BadRequest", crd.create_namespaced_custom_object, *VOLCANO[:2], NS, VOLCANO[2],
                        podgroup("pg", COSCHED))
    assert body["message"] == ("the API version in the data (scheduling.x-k8s.io/v1alpha1) does not match the "
                               "expected API version (scheduling.volcano.sh/v1beta1)")
    wrong = {**podgroup("pg", VOLCANO), "kind": "Queue"}
    body = expect_error(422, "Invalid", crd.create_namespaced_custom_object, *VOLCANO[:2], NS, VOLCANO[2], wrong)
    assert body["message"] == 'PodGroup.scheduling.volcano.sh "pg" is invalid: kind: Invalid value: "Queue": must be PodGroup'
    bare = {k: v for k, v in podgroup("pg", VOLCANO).items() if k != "kind"}
    body = expect_error(400, "BadRequest", crd.create_namespaced_custom_object, *VOLCANO[:2], NS, VOLCANO[2], bare)
    assert body["message"].startswith("Object 'Kind' is missing in '")
    crd.create_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2], podgroup("pg", VOLCANO))
    # unstructured list items keep their kind and apiVersion (built-in ones do not)
    (item,) = crd.list_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2])["items"]
    assert (item["apiVersion"], item["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")


def test_a_gpu_quota_must_name_requests_to_be_enforced(v1):
    """``nvidia.com/gpu`` in a quota is a valid name the pod evaluator ignores: only
    ``requests.nvidia.com/gpu`` limits GPUs, as on a real cluster."""
    v1.create_namespaced_resource_quota(NS, {"metadata": {"name": "loose"}, "spec": {"hard": {"nvidia.com/gpu": "1"}}})
    assert v1.read_namespaced_resource_quota("loose", NS).status.used is None
    v1.create_namespaced_pod(NS, with_resources(pod("p0"), {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "2"}))
    body = expect_error(422, "Invalid", v1.create_namespaced_resource_quota, NS, {
        "metadata": {"name": "bad"}, "spec": {"hard": {"gpus": "1", "pods": "1.5"}}})
    assert body["message"] == ('ResourceQuota "bad" is invalid: [spec.hard[gpus]: Invalid value: "gpus": must be a '
                               'standard resource for quota, spec.hard[pods]: Invalid value: "1.5": must be an integer]')


def test_budget_spec_validation(policy):
    body = expect_error(422, "Invalid", policy.create_namespaced_pod_disruption_budget, NS, {
        "metadata": {"name": "b"}, "spec": {"minAvailable": "150%", "selector": {"matchLabels": {"a": "b"}}}})
    assert body["message"] == ('PodDisruptionBudget.policy "b" is invalid: spec.minAvailable: Invalid value: '
                               'intstr.IntOrString{Type:1, IntVal:0, StrVal:"150%"}: must not be greater than 100%')
    body = expect_error(422, "Invalid", policy.create_namespaced_pod_disruption_budget, NS, {
        "metadata": {"name": "b"}, "spec": {"minAvailable": 1, "maxUnavailable": 1}})
    assert body["message"].endswith("minAvailable and maxUnavailable cannot be both set")


def test_max_unavailable_over_bare_pods_allows_no_disruption(v1, policy):
    v1.create_namespaced_pod(NS, pod("bare", {"app": "bare"}, node="n0"))
    ready(v1, "bare")
    policy.create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "mu"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "bare"}}}})
    status = policy.read_namespaced_pod_disruption_budget("mu", NS).status
    # unmanaged pods have no controller scale to count: nothing is expected, nothing may go
    assert (status.expected_pods, status.current_healthy, status.desired_healthy, status.disruptions_allowed) == \
        (0, 1, 0, 0)
    body = expect_error(429, "TooManyRequests", v1.create_namespaced_pod_eviction, "bare", NS,
                        client.V1Eviction(metadata=client.V1ObjectMeta(name="bare")))
    assert body["details"]["causes"][0]["message"] == "The disruption budget mu needs 0 healthy pods and has 1 currently"
    two = pod("two", {"app": "bare"}, node="n0")
    v1.create_namespaced_pod(NS, two)
    ready(v1, "two")
    policy.create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "again"}, "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "bare"}}}})
    with pytest.raises(ApiException) as info:       # the handler's own Status: no reason
        v1.create_namespaced_pod_eviction("two", NS, client.V1Eviction(metadata=client.V1ObjectMeta(name="two")))
    assert info.value.status == 500
    assert json.loads(info.value.body) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 500,
        "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}


def test_dry_run_on_custom_resources_and_their_status(crd, api):
    made = crd.create_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2], podgroup("pg", VOLCANO), dry_run="All")
    assert made["metadata"]["uid"] and "resourceVersion" not in made["metadata"]
    assert api.objects("podgroups.scheduling.volcano.sh") == []
    crd.create_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2], podgroup("pg", VOLCANO))
    rv = api.resource_version
    after = crd.patch_namespaced_custom_object_status(*VOLCANO[:2], NS, VOLCANO[2], "pg",
                                                      {"status": {"phase": "Running"}}, dry_run="All")
    assert after["status"] == {"phase": "Running"} and after["metadata"]["resourceVersion"] == rv
    assert "status" not in api.get("podgroups.scheduling.volcano.sh", NS, "pg") and api.resource_version == rv


def test_object_count_quotas_name_the_group(v1, crd):
    v1.create_namespaced_resource_quota(NS, {"metadata": {"name": "counts"}, "spec": {"hard": {
        "count/workloads.kueue.x-k8s.io": "1", "count/configmaps": "1", "count/workloads": "0"}}})
    crd.create_namespaced_custom_object(KUEUE, "v1beta1", NS, "workloads", {
        "apiVersion": f"{KUEUE}/v1beta1", "kind": "Workload", "metadata": {"name": "w0"}, "spec": {}})
    v1.create_namespaced_config_map(NS, {"metadata": {"name": "c0"}})
    # count/workloads names a core-group resource that does not exist: it counts nothing
    assert v1.read_namespaced_resource_quota("counts", NS).status.used == {
        "count/configmaps": "1", "count/workloads.kueue.x-k8s.io": "1"}
    body = expect_error(403, "Forbidden", crd.create_namespaced_custom_object, KUEUE, "v1beta1", NS, "workloads", {
        "apiVersion": f"{KUEUE}/v1beta1", "kind": "Workload", "metadata": {"name": "w1"}, "spec": {}})
    assert body["message"] == ('workloads.kueue.x-k8s.io "w1" is forbidden: exceeded quota: counts, requested: '
                               'count/workloads.kueue.x-k8s.io=1, used: count/workloads.kueue.x-k8s.io=1, '
                               'limited: count/workloads.kueue.x-k8s.io=1')
    expect_error(403, "Forbidden", v1.create_namespaced_config_map, NS, {"metadata": {"name": "c1"}})


def test_a_quota_scoped_to_a_priority_class_counts_only_its_pods(v1, scheduling):
    v1.create_namespaced_resource_quota(NS, {"metadata": {"name": "training-gpus"}, "spec": {
        "hard": {"requests.nvidia.com/gpu": "8"},
        "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                                "values": ["training"]}]}}})
    v1.create_namespaced_pod(NS, gpu_pod("other", "1", "1Gi", 16))      # another class: not limited
    hi = gpu_pod("hi", "1", "1Gi", 8)
    hi["spec"]["priorityClassName"] = "training"
    v1.create_namespaced_pod(NS, hi)
    assert v1.read_namespaced_resource_quota("training-gpus", NS).status.used == {"requests.nvidia.com/gpu": "8"}
    more = gpu_pod("more", "1", "1Gi", 1)
    more["spec"]["priorityClassName"] = "training"
    body = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS, more)
    assert body["message"] == ('pods "more" is forbidden: exceeded quota: training-gpus, requested: '
                               'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: '
                               'requests.nvidia.com/gpu=8')
