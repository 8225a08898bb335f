"""The fake API server's contract, driven by the real ``kubernetes`` client.

The Kubernetes platform's tests trust this fake to behave as kube-apiserver does; these tests
hold it to that (resourceVersion, conflicts, selectors, watch and 410, patches, status,
graceful deletion, errors as ``Status`` objects) through the same client the platform uses.
"""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from fakes.kube_apiserver import FakeKubeAPIServer

NS = "default"


@pytest.fixture
def api():
    with FakeKubeAPIServer(bookmark_interval_s=30.0) as server:
        yield server


@pytest.fixture
def v1(api):
    return client.CoreV1Api(client.ApiClient(api.configuration()))


@pytest.fixture
def leases(api):
    return client.CoordinationV1Api(client.ApiClient(api.configuration()))


def pod(name: str, labels: dict | None = None, node: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "trainer:1"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def expect_error(code: int, reason: str, fn, *args, **kw) -> dict:
    with pytest.raises(ApiException) as info:
        fn(*args, **kw)
    assert info.value.status == code
    body = status_of(info.value)
    assert (body["kind"], body["status"], body["code"], body["reason"]) == ("Status", "Failure", code, reason)
    return body


def names(items) -> list[str]:
    return sorted(i.metadata.name for i in items)


def events(v1, rv: str, timeout: int = 2, **kw) -> list[tuple[str, str, int]]:
    """Every event of a watch from ``rv`` until the server's timeout ends it."""
    out = []
    for ev in watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=timeout, **kw):
        obj = ev["object"]
        out.append((ev["type"], obj.metadata.name, int(obj.metadata.resource_version)))
    return out


class LiveWatch:
    """A watch read in a thread, so the test can write while it runs."""

    def __init__(self, api, fn, *args, **kw) -> None:
        self.events: list[dict] = []
        self.watch = watch.Watch()
        self.got = threading.Condition()
        before = api.watch_count()
        self.thread = threading.Thread(target=self._read, args=(fn, args, kw), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while api.watch_count() <= before:      # the server has registered it: nothing is missed
            assert time.monotonic() < deadline, "the watch never reached the server"
            time.sleep(0.01)

    def _read(self, fn, args, kw) -> None:
        for ev in self.watch.stream(fn, *args, **kw):
            with self.got:
                self.events.append(ev)
                self.got.notify_all()
        with self.got:
            self.events.append({"type": "END"})
            self.got.notify_all()

    def wait_for(self, n: int, timeout: float = 10) -> list[dict]:
        with self.got:
            assert self.got.wait_for(lambda: len(self.events) >= n, timeout), self.events
            return list(self.events)


# --- objects, resourceVersion, errors -----------------------------------------------------------

def test_one_global_resource_version_bumped_by_every_write(v1, leases, api):
    rvs = [
        v1.create_namespaced_pod(NS, pod("p0")).metadata.resource_version,
        v1.create_namespaced_config_map(NS, {"metadata": {"name": "c"}, "data": {"k": "v"}}).metadata.resource_version,
        leases.create_namespaced_lease(NS, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}).metadata.resource_version,
        v1.create_namespaced_service(NS, {"metadata": {"name": "s"}, "spec": {"clusterIP": "None"}}).metadata.resource_version,
        v1.patch_namespaced_config_map("c", NS, {"data": {"k": "w"}}).metadata.resource_version,
    ]
    numbers = [int(rv) for rv in rvs]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert v1.read_namespaced_config_map("c", NS).metadata.resource_version == rvs[-1]
    assert v1.list_namespaced_pod(NS).metadata.resource_version == rvs[-1] == api.resource_version
    # an update that changes nothing writes nothing
    cm = v1.read_namespaced_config_map("c", NS)
    assert v1.replace_namespaced_config_map("c", NS, cm).metadata.resource_version == rvs[-1]
    assert api.resource_version == rvs[-1]


def test_created_objects_get_server_fields_and_pod_defaults(v1):
    p = v1.create_namespaced_pod(NS, {**pod("p0"), "status": {"phase": "Running"}})
    assert p.metadata.uid and p.metadata.creation_timestamp and p.metadata.namespace == NS
    assert (p.kind, p.api_version) == ("Pod", "v1")
    assert p.status.phase == "Pending"            # the status in a create is ignored
    assert p.spec.termination_grace_period_seconds == 30
    generated = v1.create_namespaced_config_map(NS, {"metadata": {"generateName": "cm-"}})
    assert generated.metadata.name.startswith("cm-") and len(generated.metadata.name) == 8
    expect_error(422, "Invalid", v1.create_namespaced_config_map, NS, {"metadata": {}})


def test_create_of_an_existing_name_is_409_already_exists(v1):
    v1.create_namespaced_pod(NS, pod("p0"))
    body = expect_error(409, "AlreadyExists", v1.create_namespaced_pod, NS, pod("p0"))
    assert body["message"] == 'pods "p0" already exists'
    assert body["details"] == {"name": "p0", "kind": "pods"}
    v1.create_namespaced_pod("other", pod("p0"))      # names are per namespace


def test_missing_object_is_404_not_found(v1, leases):
    body = expect_error(404, "NotFound", v1.read_namespaced_pod, "nope", NS)
    assert body["message"] == 'pods "nope" not found'
    body = expect_error(404, "NotFound", leases.read_namespaced_lease, "nope", NS)
    assert body["message"] == 'leases.coordination.k8s.io "nope" not found'
    expect_error(404, "NotFound", v1.delete_namespaced_config_map, "nope", NS)


def test_put_with_a_stale_resource_version_is_409_conflict(leases, api):
    first = leases.create_namespaced_lease(NS, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    mine = leases.read_namespaced_lease("l", NS)
    theirs = leases.read_namespaced_lease("l", NS)
    theirs.spec.holder_identity = "b"
    won = leases.replace_namespaced_lease("l", NS, theirs)
    assert int(won.metadata.resource_version) > int(first.metadata.resource_version)
    mine.spec.holder_identity = "c"
    body = expect_error(409, "Conflict", leases.replace_namespaced_lease, "l", NS, mine)
    assert "the object has been modified" in body["message"]
    assert api.get("leases", NS, "l")["spec"]["holderIdentity"] == "b"
    # without a resourceVersion the update is unconditional
    mine.metadata.resource_version = None
    assert leases.replace_namespaced_lease("l", NS, mine).spec.holder_identity == "c"
    # a merge patch that names a resourceVersion is conditional too
    expect_error(409, "Conflict", leases.patch_namespaced_lease, "l", NS,
                 {"metadata": {"resourceVersion": first.metadata.resource_version}, "spec": {"holderIdentity": "d"}})


def test_put_to_a_missing_object_is_404(leases):
    body = client.V1Lease(metadata=client.V1ObjectMeta(name="l"), spec=client.V1LeaseSpec(holder_identity="a"))
    expect_error(404, "NotFound", leases.replace_namespaced_lease, "l", NS, body)


# --- selectors ----------------------------------------------------------------------------------

LABELLED = {
    "a": {"job": "j1", "slot": "0", "tier": "train"},
    "b": {"job": "j1", "slot": "1"},
    "c": {"job": "j2", "slot": "0", "tier": "eval"},
    "d": {},
}


@pytest.mark.parametrize("selector, expected", [
    ("job=j1", ["a", "b"]),
    ("job==j1", ["a", "b"]),
    ("job!=j1", ["c", "d"]),                       # != also matches objects without the key
    ("job in (j1, j2)", ["a", "b", "c"]),
    ("slot notin (0)", ["b", "d"]),               # notin also matches objects without the key
    ("tier", ["a", "c"]),
    ("!tier", ["b", "d"]),
    ("job=j1,slot=0", ["a"]),
    ("job in (j1),!tier", ["b"]),
    ("", ["a", "b", "c", "d"]),
])
def test_label_selectors(v1, selector, expected):
    for name, labels in LABELLED.items():
        v1.create_namespaced_pod(NS, pod(name, labels))
    assert names(v1.list_namespaced_pod(NS, label_selector=selector).items) == expected


@pytest.mark.parametrize("selector", ["job in j1", "job=(", "=x", "job=j1,", "job in ()"])
def test_bad_label_selector_is_400(v1, selector):
    expect_error(400, "BadRequest", v1.list_namespaced_pod, NS, label_selector=selector)


def test_field_selectors(v1):
    v1.create_namespaced_pod(NS, pod("a", {"job": "j1"}, node="n1"))
    v1.create_namespaced_pod(NS, pod("b", {"job": "j1"}, node="n2"))
    v1.create_namespaced_pod(NS, pod("c", {"job": "j2"}))
    v1.patch_namespaced_pod_status("a", NS, {"status": {"phase": "Running"}})
    cases = {
        "metadata.name=b": ["b"],
        "status.phase=Running": ["a"],
        "status.phase!=Running": ["b", "c"],
        "spec.nodeName=n2": ["b"],
        "spec.nodeName=": ["c"],                   # unscheduled
        "spec.nodeName!=,status.phase=Pending": ["b"],
    }
    for selector, expected in cases.items():
        assert names(v1.list_namespaced_pod(NS, field_selector=selector).items) == expected, selector
    both = v1.list_namespaced_pod(NS, label_selector="job=j1", field_selector="spec.nodeName=n1")
    assert names(both.items) == ["a"]
    body = expect_error(400, "BadRequest", v1.list_namespaced_pod, NS, field_selector="spec.image=x")
    assert body["message"] == "field label not supported: spec.image"


def test_list_pages_with_limit_and_continue(v1):
    for i in range(5):
        v1.create_namespaced_config_map(NS, {"metadata": {"name": f"c{i}"}})
    seen, token = [], None
    while True:
        page = v1.list_namespaced_config_map(NS, limit=2, _continue=token)
        seen += [i.metadata.name for i in page.items]
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 5 - len(seen)
    assert seen == [f"c{i}" for i in range(5)]


# --- watch --------------------------------------------------------------------------------------

def test_watch_from_a_resource_version_replays_every_later_change_in_order(v1):
    v1.create_namespaced_pod(NS, pod("before"))
    since = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, pod("p0", node="n1"))
    v1.patch_namespaced_pod("p0", NS, {"metadata": {"labels": {"x": "1"}}})
    v1.delete_namespaced_pod("p0", NS, grace_period_seconds=0)
    got = events(v1, since, timeout=1)
    assert [(t, n) for t, n, _ in got] == [("ADDED", "p0"), ("MODIFIED", "p0"), ("DELETED", "p0")]
    rvs = [rv for _, _, rv in got]
    assert rvs == sorted(rvs) and rvs[0] > int(since)


def test_watch_without_resource_version_starts_with_the_current_objects(v1):
    v1.create_namespaced_pod(NS, pod("a"))
    v1.create_namespaced_pod(NS, pod("b"))
    v1.delete_namespaced_pod("a", NS)
    got = events(v1, "", timeout=1)
    assert [(t, n) for t, n, _ in got] == [("ADDED", "b")]


def test_watch_sees_objects_enter_and_leave_its_selector(v1):
    since = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, pod("p0", {"attempt": "1"}))
    v1.patch_namespaced_pod("p0", NS, {"metadata": {"labels": {"attempt": "2"}}})
    v1.patch_namespaced_pod("p0", NS, {"metadata": {"labels": {"attempt": "1"}}})
    v1.create_namespaced_pod(NS, pod("other", {"attempt": "2"}))
    got = events(v1, since, timeout=1, label_selector="attempt=1")
    assert [(t, n) for t, n, _ in got] == [("ADDED", "p0"), ("DELETED", "p0"), ("ADDED", "p0")]


def test_live_watch_delivers_changes_as_they_happen(api, v1):
    live = LiveWatch(api, v1.list_namespaced_pod, NS, resource_version=api.resource_version,
                     label_selector="job=j1", timeout_seconds=20)
    v1.create_namespaced_pod(NS, pod("ignored", {"job": "j2"}))
    v1.create_namespaced_pod(NS, pod("p0", {"job": "j1"}))
    got = live.wait_for(1)
    assert (got[0]["type"], got[0]["object"].metadata.name) == ("ADDED", "p0")
    api.close_watches()
    assert live.wait_for(2)[-1]["type"] == "END"
    assert api.watch_count() == 0


def test_bookmarks_only_when_asked(api, v1):
    plain = LiveWatch(api, v1.list_namespaced_pod, NS, resource_version=api.resource_version, timeout_seconds=20)
    marked = LiveWatch(api, v1.list_namespaced_pod, NS, resource_version=api.resource_version,
                       allow_watch_bookmarks=True, timeout_seconds=20)
    api.send_bookmarks()
    bookmark = marked.wait_for(1)[0]
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["resourceVersion"] == api.resource_version
    assert marked.watch.resource_version == api.resource_version   # the client resumes from it
    v1.create_namespaced_pod(NS, pod("p0"))
    assert [e["type"] for e in plain.wait_for(1)] == ["ADDED"]         # no bookmark before it
    assert [e["type"] for e in marked.wait_for(2)] == ["BOOKMARK", "ADDED"]
    api.close_watches()
    assert plain.wait_for(2)[-1]["type"] == marked.wait_for(3)[-1]["type"] == "END"


def test_bookmarks_arrive_on_their_own_when_the_watch_is_quiet(v1):
    with FakeKubeAPIServer(bookmark_interval_s=0.2) as api:
        v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
        v1.create_namespaced_pod(NS, pod("p0"))
        since = api.resource_version
        v1.create_namespaced_config_map(NS, {"metadata": {"name": "elsewhere"}})   # not a pod
        w = watch.Watch()
        for ev in w.stream(v1.list_namespaced_pod, NS, resource_version=since,
                           allow_watch_bookmarks=True, timeout_seconds=10):
            assert ev["type"] == "BOOKMARK"
            assert ev["raw_object"]["metadata"]["resourceVersion"] == api.resource_version
            w.stop()


def test_watch_from_a_compacted_resource_version_is_410_expired(api, v1):
    since = api.resource_version
    v1.create_namespaced_pod(NS, pod("p0"))
    api.compact()
    # on the wire: HTTP 200 and a single ERROR event, as kube-apiserver answers
    raw = v1.list_namespaced_pod(NS, watch=True, resource_version=since, timeout_seconds=2,
                                 _preload_content=False)
    assert raw.status == 200
    lines = [json.loads(line) for line in raw.data.decode().splitlines() if line]
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    assert {k: lines[0]["object"][k] for k in ("kind", "code", "reason")} == \
        {"kind": "Status", "code": 410, "reason": "Expired"}
    # the client turns it into ApiException(410)
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version=since, timeout_seconds=2))
    assert info.value.status == 410
    # a watch from the current resourceVersion is fine
    assert events(v1, api.resource_version, timeout=1) == []


def test_watch_window_is_the_last_history_size_changes():
    with FakeKubeAPIServer(history_size=3) as api:
        v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
        rvs = [v1.create_namespaced_pod(NS, pod(f"p{i}")).metadata.resource_version for i in range(5)]
        assert [n for _, n, _ in events(v1, rvs[1], timeout=1)] == ["p2", "p3", "p4"]
        with pytest.raises(ApiException) as info:
            events(v1, rvs[0], timeout=1)
        assert info.value.status == 410


# --- patches and the status subresource ----------------------------------------------------------

def test_merge_and_strategic_merge_patches(v1):
    v1.create_namespaced_config_map(NS, {"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}},
                                         "data": {"k": "v", "gone": "x"}})
    merged = v1.patch_namespaced_config_map(
        "c", NS, {"metadata": {"labels": {"b": None, "c": "3"}}, "data": {"gone": None, "new": "n"}},
        _content_type="application/merge-patch+json")
    assert merged.metadata.labels == {"a": "1", "c": "3"}
    assert merged.data == {"k": "v", "new": "n"}
    # a dict body goes as a strategic merge patch, treated the same way
    strategic = v1.patch_namespaced_config_map("c", NS, {"data": {"k": "w"}})
    assert strategic.data == {"k": "w", "new": "n"}
    patched = v1.patch_namespaced_config_map("c", NS, [
        {"op": "test", "path": "/data/k", "value": "w"},
        {"op": "replace", "path": "/data/k", "value": "z"},
        {"op": "add", "path": "/metadata/labels/d", "value": "4"},
        {"op": "remove", "path": "/data/new"}])
    assert patched.data == {"k": "z"} and patched.metadata.labels["d"] == "4"
    expect_error(422, "Invalid", v1.patch_namespaced_config_map, "c", NS,
                 [{"op": "test", "path": "/data/k", "value": "wrong"}])
    expect_error(415, "UnsupportedMediaType", v1.patch_namespaced_config_map, "c", NS,
                 {"data": {"k": "a"}}, _content_type="application/apply-patch+yaml")
    assert v1.read_namespaced_config_map("c", NS).data == {"k": "z"}


def test_status_subresource_changes_only_status(v1):
    created = v1.create_namespaced_pod(NS, pod("p0", {"job": "j1"}, node="n1"))
    after = v1.patch_namespaced_pod_status("p0", NS, {"metadata": {"labels": {"job": "hacked"}},
                                                      "status": {"phase": "Running", "podIP": "127.0.0.2"}})
    assert (after.status.phase, after.status.pod_ip) == ("Running", "127.0.0.2")
    assert after.metadata.labels == {"job": "j1"}
    assert int(after.metadata.resource_version) > int(created.metadata.resource_version)
    # the main resource cannot change the status
    relabelled = v1.patch_namespaced_pod("p0", NS, {"metadata": {"labels": {"job": "j2"}},
                                                    "status": {"phase": "Failed"}})
    assert relabelled.status.phase == "Running" and relabelled.metadata.labels == {"job": "j2"}
    # PUT /status with a stale resourceVersion conflicts
    stale = after
    stale.status.phase = "Succeeded"
    expect_error(409, "Conflict", v1.replace_namespaced_pod_status, "p0", NS, stale)
    fresh = v1.read_namespaced_pod_status("p0", NS)
    fresh.status.phase = "Succeeded"
    assert v1.replace_namespaced_pod_status("p0", NS, fresh).status.phase == "Succeeded"


def test_pod_spec_changes_are_refused_except_image(v1):
    v1.create_namespaced_pod(NS, pod("p0", node="n1"))
    assert v1.patch_namespaced_pod("p0", NS, {"spec": {"containers": [{"name": "main", "image": "trainer:2"}]}}) \
        .spec.containers[0].image == "trainer:2"
    expect_error(422, "Invalid", v1.patch_namespaced_pod, "p0", NS, {"spec": {"nodeName": "n2"}})


def test_binding_schedules_a_pod_once(v1, api):
    # _preload_content=False: the server answers a Status and the client would parse it as a
    # V1Binding and fail (kubernetes-client/python#825, #547), against a real cluster too
    v1.create_namespaced_pod(NS, pod("p0"))
    v1.create_namespaced_pod_binding("p0", NS, client.V1Binding(
        metadata=client.V1ObjectMeta(name="p0"), target=client.V1ObjectReference(kind="Node", name="n1")),
        _preload_content=False)
    assert v1.read_namespaced_pod("p0", NS).spec.node_name == "n1"
    with pytest.raises(ApiException) as info:
        v1.create_namespaced_pod_binding("p0", NS, client.V1Binding(
            metadata=client.V1ObjectMeta(name="p0"), target=client.V1ObjectReference(kind="Node", name="n2")),
            _preload_content=False)
    assert info.value.status == 409
    assert api.get("pods", NS, "p0")["spec"]["nodeName"] == "n1"


# --- deletion -----------------------------------------------------------------------------------

def test_graceful_pod_deletion_waits_for_the_kubelet(api, v1):
    v1.create_namespaced_pod(NS, pod("p0", node="n1"))
    since = api.resource_version
    terminating = v1.delete_namespaced_pod("p0", NS, grace_period_seconds=20)
    assert terminating.metadata.deletion_grace_period_seconds == 20
    assert terminating.metadata.deletion_timestamp is not None
    assert v1.read_namespaced_pod("p0", NS).metadata.deletion_timestamp is not None   # still there
    # a second delete may shorten the grace period, never lengthen it
    assert v1.delete_namespaced_pod("p0", NS, grace_period_seconds=60).metadata.deletion_grace_period_seconds == 20
    assert v1.delete_namespaced_pod("p0", NS, grace_period_seconds=5).metadata.deletion_grace_period_seconds == 5
    api.finish_deletion("pods", NS, "p0")
    expect_error(404, "NotFound", v1.read_namespaced_pod, "p0", NS)
    assert [t for t, _, _ in events(v1, since, timeout=1)] == ["MODIFIED", "MODIFIED", "DELETED"]
    with pytest.raises(LookupError):
        api.finish_deletion("pods", NS, "p0")


def test_pod_default_grace_period_and_immediate_deletions(api, v1):
    v1.create_namespaced_pod(NS, pod("scheduled", node="n1"))
    assert v1.delete_namespaced_pod("scheduled", NS).metadata.deletion_grace_period_seconds == 30
    v1.create_namespaced_pod(NS, pod("forced", node="n1"))
    v1.delete_namespaced_pod("forced", NS, body=client.V1DeleteOptions(grace_period_seconds=0))
    v1.create_namespaced_pod(NS, pod("unscheduled"))
    v1.delete_namespaced_pod("unscheduled", NS)       # no kubelet to wait for
    v1.create_namespaced_pod(NS, pod("finished", node="n1"))
    v1.patch_namespaced_pod_status("finished", NS, {"status": {"phase": "Succeeded"}})
    v1.delete_namespaced_pod("finished", NS)
    assert [p["metadata"]["name"] for p in api.objects("pods", NS)] == ["scheduled"]
    v1.delete_namespaced_pod("scheduled", NS, grace_period_seconds=0)     # force a terminating pod
    assert api.objects("pods", NS) == []


def test_finalizers_hold_an_object_until_removed(api, v1):
    v1.create_namespaced_config_map(NS, {"metadata": {"name": "c", "finalizers": ["example.com/keep"]}})
    held = v1.delete_namespaced_config_map("c", NS)
    assert v1.read_namespaced_config_map("c", NS).metadata.deletion_timestamp is not None
    assert held is not None
    expect_error(422, "Invalid", v1.patch_namespaced_config_map, "c", NS,
                 {"metadata": {"finalizers": ["example.com/keep", "example.com/more"]}})
    v1.patch_namespaced_config_map("c", NS, {"metadata": {"finalizers": None}})
    expect_error(404, "NotFound", v1.read_namespaced_config_map, "c", NS)


def test_delete_preconditions(v1):
    created = v1.create_namespaced_config_map(NS, {"metadata": {"name": "c"}})
    body = expect_error(409, "Conflict", v1.delete_namespaced_config_map, "c", NS,
                        body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="someone-else")))
    assert "Precondition failed: UID in precondition" in body["message"]
    v1.delete_namespaced_config_map("c", NS, body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=created.metadata.uid)))
    expect_error(404, "NotFound", v1.read_namespaced_config_map, "c", NS)


def test_delete_collection_by_label(api, v1):
    for name, attempt in (("a1", "1"), ("b1", "1"), ("a2", "2")):
        v1.create_namespaced_pod(NS, pod(name, {"attempt": attempt}, node="n1"))
    v1.delete_collection_namespaced_pod(NS, label_selector="attempt=1", grace_period_seconds=0)
    assert [p["metadata"]["name"] for p in api.objects("pods", NS)] == ["a2"]


# --- other types --------------------------------------------------------------------------------

def test_nodes_are_cluster_scoped_with_a_status(v1):
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    v1.create_node({"metadata": {"name": "n1", "labels": {"pool": "gpu"}}, "status": ready})
    v1.create_node({"metadata": {"name": "n2"}, "spec": {"unschedulable": True}})
    assert v1.read_node("n1").status.conditions[0].status == "True"          # kept from the create
    assert names(v1.list_node(label_selector="pool=gpu").items) == ["n1"]
    assert names(v1.list_node(field_selector="spec.unschedulable=false").items) == ["n1"]
    not_ready = v1.patch_node_status("n1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert not_ready.status.conditions[0].status == "False"


def test_events_and_secrets(v1):
    v1.create_namespaced_pod(NS, pod("p0"))
    for name, obj in (("e1", "p0"), ("e2", "p1")):
        v1.create_namespaced_event(NS, {"metadata": {"name": name}, "reason": "Evicted", "type": "Warning",
                                        "involvedObject": {"kind": "Pod", "name": obj, "namespace": NS}})
    picked = v1.list_namespaced_event(NS, field_selector="involvedObject.name=p0,reason=Evicted")
    assert names(picked.items) == ["e1"]
    v1.create_namespaced_secret(NS, {"metadata": {"name": "token"}, "stringData": {"token": "s3cret"}})
    secret = v1.read_namespaced_secret("token", NS)
    assert secret.data == {"token": base64.b64encode(b"s3cret").decode()} and secret.type == "Opaque"
    assert secret.string_data is None


def test_pod_logs_come_from_the_kubelets_source_with_tail_lines(api, v1):
    v1.create_namespaced_pod(NS, pod("p0"))
    expect_error(400, "BadRequest", v1.read_namespaced_pod_log, "p0", NS)  # no output yet: waiting to start
    api.log_source = lambda ns, name: "".join(f"{ns}/{name} line {i}\n" for i in range(5))
    assert v1.read_namespaced_pod_log("p0", NS, tail_lines=2) == f"{NS}/p0 line 3\n{NS}/p0 line 4\n"
    assert v1.read_namespaced_pod_log("p0", NS).count("\n") == 5
    expect_error(404, "NotFound", v1.read_namespaced_pod_log, "nope", NS)


# --- test hooks: counters and faults ------------------------------------------------------------

def test_request_counter_per_verb_and_resource(api, v1):
    v1.create_namespaced_pod(NS, pod("p0"))
    v1.list_namespaced_pod(NS)
    v1.list_namespaced_pod(NS, label_selector="a=b")
    v1.patch_namespaced_pod_status("p0", NS, {"status": {"phase": "Running"}})
    events(v1, api.resource_version, timeout=1)
    with pytest.raises(ApiException):
        v1.read_namespaced_pod("nope", NS)
    counts = api.request_counts()
    assert counts[("create", "pods")] == 1
    assert counts[("list", "pods")] == 2
    assert counts[("patch", "pods/status")] == 1
    assert counts[("watch", "pods")] == 1
    assert counts[("get", "pods")] == 1
    assert api.request_count(verb="get", resource="pods", code=404) == 1
    assert api.request_count(resource="pods") == 5     # pods/status is a resource of its own



def test_request_counter_per_user_agent(api):
    """What one client alone asked for (a controller's calls, against its RBAC), the
    watch counted as its own verb, as the API server's authorizer sees it."""
    a = client.ApiClient(api.configuration())
    a.user_agent = "elastic-supervisor-controller"
    b = client.ApiClient(api.configuration())
    b.user_agent = "fake-kubelet"
    va, vb = client.CoreV1Api(a), client.CoreV1Api(b)
    va.create_namespaced_pod(NS, pod("p0"))
    va.list_namespaced_pod(NS)
    for _ in watch.Watch().stream(va.list_namespaced_pod, NS, resource_version=api.resource_version,
                                  timeout_seconds=1):
        pass
    vb.patch_namespaced_pod_status("p0", NS, {"status": {"phase": "Running"}})
    vb.list_namespaced_pod(NS)
    client.CoordinationV1Api(a).create_namespaced_lease(NS, {"metadata": {"name": "l"}, "spec": {}})
    assert api.request_counts(user_agent="elastic-supervisor-controller") == {
        ("create", "pods"): 1, ("list", "pods"): 1, ("watch", "pods"): 1, ("create", "leases"): 1}
    assert api.request_counts(user_agent="fake-kubelet") == {("patch", "pods/status"): 1, ("list", "pods"): 1}
    assert api.request_counts(user_agent="nobody") == {}
    assert api.request_counts() == api.request_counts(user_agent="")  # every request, whoever sent it
    assert api.request_counts()[("list", "pods")] == 2

def test_injected_faults_answer_with_a_status_and_can_be_scoped(api):
    a = client.ApiClient(api.configuration())
    a.user_agent = "elector-a"
    b = client.ApiClient(api.configuration())
    b.user_agent = "elector-b"
    va, vb = client.CoreV1Api(a), client.CoreV1Api(b)
    fault = api.inject_fault(503, verb="list", resource="pods", user_agent="elector-a", times=2)
    for _ in range(2):
        body = expect_error(503, "ServiceUnavailable", va.list_namespaced_pod, NS)
        assert body["message"] == "injected by the test"
    vb.list_namespaced_pod(NS)          # another client is not affected
    va.list_namespaced_pod(NS)          # and the fault is spent
    assert fault.hits == 2
    slow = api.inject_fault(None, delay_s=0.5, verb="get")
    started = time.monotonic()
    expect_error(404, "NotFound", va.read_namespaced_pod, "nope", NS)
    assert time.monotonic() - started >= 0.5
    api.remove_fault(slow)
    api.inject_fault(500)
    expect_error(500, "InternalError", vb.list_node)
    api.clear_faults()
    vb.list_node()


# --- validation: the 1.30 schema and the API's own rules --------------------------------------

def raw_create(api, v1, plural: str, body: dict, query: str = ""):
    """A create through the real client's transport, past its own model checks (the client refuses
    unknown fields and wrong types before sending: these are what the server says of them)."""
    ac = v1.api_client
    resp = ac.call_api("POST", f"{api.url}/api/v1/namespaces/{NS}/{plural}{query}",
                       header_params={"Content-Type": "application/json", "Accept": "application/json"}, body=body)
    resp.read()
    return resp


def test_a_label_value_of_64_characters_is_422_invalid_with_its_cause(v1):
    body = expect_error(422, "Invalid", v1.create_namespaced_pod, NS, pod("p0", {"team": "x" * 64}))
    value = json.dumps("x" * 64)
    assert body["message"] == f'Pod "p0" is invalid: metadata.labels: Invalid value: {value}: must be no more than 63 characters'
    assert body["details"] == {"name": "p0", "kind": "Pod", "causes": [{
        "reason": "FieldValueInvalid", "message": f"Invalid value: {value}: must be no more than 63 characters",
        "field": "metadata.labels"}]}
    v1.create_namespaced_pod(NS, pod("p0", {"team": "x" * 63}))


def test_a_misspelled_field_is_a_strict_decoding_error_or_dropped_with_a_warning(api, v1):
    bad = pod("p0")
    bad["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    resp = raw_create(api, v1, "pods", bad)
    assert resp.status == 400
    body = json.loads(resp.data)
    assert (body["reason"], body["message"]) == ("BadRequest", 'Pod in version "v1" cannot be handled as a Pod: '
                                                 'strict decoding error: unknown field "spec.containers[0].imagePullPolcy"')
    warned = raw_create(api, v1, "pods", bad, "?fieldValidation=Warn")    # the real server's default
    assert warned.status == 201
    assert warned.headers["Warning"] == '299 - "unknown field \\"spec.containers[0].imagePullPolcy\\""'
    assert "imagePullPolcy" not in json.dumps(api.get("pods", NS, "p0"))
    typed = pod("p1")
    typed["spec"]["terminationGracePeriodSeconds"] = "30"
    resp = raw_create(api, v1, "pods", typed)
    assert resp.status == 400 and json.loads(resp.data)["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal string into Go struct field '
        'PodSpec.spec.terminationGracePeriodSeconds of type int64')


@pytest.mark.parametrize("change, message", [
    (lambda p: p["spec"].update(containers=[]), "spec.containers: Required value"),
    (lambda p: p["spec"]["containers"][0].update(image=""), "spec.containers[0].image: Required value"),
    (lambda p: p["spec"]["containers"][0].update(name="Agent"),
     'spec.containers[0].name: Invalid value: "Agent": a lowercase RFC 1123 label must consist of lower case '
     "alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
     "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
    (lambda p: p["spec"].update(hostname="a.b"), 'spec.hostname: Invalid value: "a.b": must not contain dots'),
    (lambda p: p["spec"].update(subdomain="x" * 64), f'spec.subdomain: Invalid value: "{"x" * 64}": must be no more '
                                                     "than 63 characters"),
    (lambda p: p["spec"]["containers"][0].update(env=[{"name": "1X", "value": "v"}]),
     'spec.containers[0].env[0].name: Invalid value: "1X": a valid environment variable name must consist of '
     "alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or "
     "'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"),
    (lambda p: p["spec"].update(restartPolicy="Sometimes"),
     'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "Never", "OnFailure"'),
    (lambda p: p["spec"]["containers"][0].update(resources={"limits": {"nvidia.com/gpu": "1"},
                                                            "requests": {"nvidia.com/gpu": "2"}}),
     'spec.containers[0].resources.requests: Invalid value: "2": must be equal to nvidia.com/gpu limit of 1'),
    (lambda p: p["spec"]["containers"][0].update(resources={"requests": {"nvidia.com/gpu": "1"}}),
     "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"),
    (lambda p: p["spec"]["containers"][0].update(volumeMounts=[{"name": "ckpt", "mountPath": "/ckpt"}]),
     'spec.containers[0].volumeMounts[0].name: Not found: "ckpt"'),
    (lambda p: p["spec"].update(schedulingGates=[{"name": "g"}], nodeName="n1"),
     "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared"),
    (lambda p: p["metadata"].update(name="Bad_Name"),
     'metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain must consist of lower case '
     "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
     "'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
])
def test_pods_the_real_server_refuses_are_refused(v1, change, message):
    body = pod("p0")
    change(body)
    err = expect_error(422, "Invalid", v1.create_namespaced_pod, NS, body)
    assert err["message"] == f'Pod "{body["metadata"]["name"]}" is invalid: {message}'
    assert [c["field"] for c in err["details"]["causes"]] == [message.split(":")[0]]


def test_several_errors_are_listed_in_brackets(v1):
    body = pod("p0", {"a": "-bad-"})
    body["spec"]["hostname"] = "UPPER"
    err = expect_error(422, "Invalid", v1.create_namespaced_pod, NS, body)
    assert err["message"].startswith('Pod "p0" is invalid: [metadata.labels: Invalid value: "-bad-": ')
    assert ", spec.hostname: Invalid value: \"UPPER\": " in err["message"] and err["message"].endswith("]")
    assert len(err["details"]["causes"]) == 2


def test_service_names_are_dns_1035_labels_and_other_kinds_subdomains(v1):
    err = expect_error(422, "Invalid", v1.create_namespaced_service, NS,
                       {"metadata": {"name": "1-rdzv"}, "spec": {"clusterIP": "None"}})
    assert err["message"].startswith('Service "1-rdzv" is invalid: metadata.name: Invalid value: "1-rdzv": a DNS-1035 label')
    v1.create_namespaced_config_map(NS, {"metadata": {"name": "1-rdzv.config"}})
    err = expect_error(422, "Invalid", v1.create_namespaced_secret, NS,
                       {"metadata": {"name": "s"}, "data": {"bad key": "eA=="}})
    assert err["message"].startswith('Secret "s" is invalid: data[bad key]: Invalid value: "bad key": a valid config key')


def test_pod_defaults_and_admission(v1, api):
    created = v1.create_namespaced_pod(NS, pod("p0"))
    c = created.spec.containers[0]
    assert (c.image_pull_policy, c.termination_message_path, c.termination_message_policy) == \
        ("IfNotPresent", "/dev/termination-log", "File")
    assert (created.spec.dns_policy, created.spec.scheduler_name, created.spec.service_account_name,
            created.spec.priority) == ("ClusterFirst", "default-scheduler", "default", 0)
    assert {(t.key, t.effect, t.toleration_seconds) for t in created.spec.tolerations} == {
        ("node.kubernetes.io/not-ready", "NoExecute", 300), ("node.kubernetes.io/unreachable", "NoExecute", 300)}
    assert created.status.qos_class == "BestEffort"
    body = pod("p1")
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    assert v1.create_namespaced_pod(NS, body).status.qos_class == "Guaranteed"
    err = expect_error(403, "Forbidden", v1.create_namespaced_pod, NS, {**pod("p2"), "spec": {
        **pod("p2")["spec"], "priorityClassName": "high"}})
    assert err["message"] == 'pods "p2" is forbidden: no PriorityClass with name high was found'


def test_validation_can_be_switched_off_and_costs_little(api, v1):
    import time as clock

    from fakes.kube_apiserver import RESOURCES, decode_check, semantic_errors
    body = pod("p0", {"elastic-supervisor/job": "j1"})
    body["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x"} for i in range(40)]
    body.update(apiVersion="v1", kind="Pod")
    decode_check(RESOURCES["pods"], body)        # the schema loads once per kind
    started = clock.perf_counter()
    for _ in range(20):
        decode_check(RESOURCES["pods"], body)
        semantic_errors(RESOURCES["pods"], body)
    per_pod = (clock.perf_counter() - started) / 20
    assert per_pod < 0.020, f"{per_pod * 1000:.1f} ms per pod"
    api.validate = False
    v1.create_namespaced_pod(NS, pod("p1", {"team": "x" * 64}))


def test_kinds_without_a_schema_are_not_checked():
    from fakes.kube_apiserver import ResourceType, decode_check
    crd = ResourceType("widgets", "Widget", group="example.com")
    assert decode_check(crd, {"apiVersion": "example.com/v1", "kind": "Widget", "spce": {}}) == ([], [])


def test_parse_quantity():
    from fractions import Fraction

    from fakes.kube_apiserver import QuantityError, parse_quantity
    assert parse_quantity("500m") == Fraction(1, 2)
    assert parse_quantity("1Gi") == 2 ** 30 and parse_quantity("1G") == 10 ** 9
    assert parse_quantity("1.5Ki") == 1536 and parse_quantity("2e3") == 2000 and parse_quantity(8) == 8
    assert parse_quantity("100Mi") == 100 * 2 ** 20 and parse_quantity("1k") == 1000
    for bad in ("1GB", "", " 1", "1 ", "abc", "1.2.3", "--1", True, None):
        with pytest.raises(QuantityError):
            parse_quantity(bad)


def test_initial_events_end_with_an_annotated_bookmark(api, v1):
    v1.create_namespaced_pod(NS, pod("p0"))
    raw = v1.api_client.call_api("GET", f"{api.url}/api/v1/namespaces/{NS}/pods?watch=true&sendInitialEvents=true"
                                 "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1")
    raw.read()
    events = [json.loads(line) for line in raw.data.decode().splitlines() if line]
    assert [e["type"] for e in events[:2]] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"] == {"resourceVersion": api.resource_version,
                                               "annotations": {"k8s.io/initial-events-end": "true"}}
    refused = v1.api_client.call_api("GET", f"{api.url}/api/v1/namespaces/{NS}/pods?watch=true&sendInitialEvents=true")
    refused.read()
    assert refused.status == 422 and "sendInitialEvents requires setting allowWatchBookmarks to true" in refused.data.decode()


def test_plain_bookmarks_carry_only_the_resource_version(api, v1):
    marked = LiveWatch(api, v1.list_namespaced_pod, NS, resource_version=api.resource_version,
                       allow_watch_bookmarks=True, timeout_seconds=20)
    api.send_bookmarks()
    assert marked.wait_for(1)[0]["object"]["metadata"] == {"resourceVersion": api.resource_version}
    api.close_watches()
