"""A job's identity on Kubernetes is its release: names that fit their limits without ever
colliding, and two releases with one ``config.job`` in one namespace that never select, count,
adopt or fence each other's pods. The platform against the fake API server through the real
client (the end-to-end run of two releases is in tests/test_kube_cluster_states.py)."""

from __future__ import annotations

import re

import pytest
from kubernetes import client

from fakes.kube_apiserver import FakeKubeAPIServer
from supervisor.platforms.base import NodeState
from supervisor.platforms.kube.client import KubeApi
from supervisor.platforms.kube.platform import KubernetesPlatform, Settings, dns_label
from test_kube_platform_units import NS, TOKEN, run, spec, until

LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
GKE = [f"gke-prod-us-central1-a3-highgpu-8g-pool-{suffix}" for suffix in ("7f9c2b1d-x4kq", "7f9c2b1d-x4kr",
                                                                          "7f9c2b1d-z0aa")]


def test_long_names_that_differ_only_at_the_end_stay_distinct_and_fit():
    assert all(len(n) > 50 for n in GKE)
    names = [dns_label(f"job-a12-{n}", 63) for n in GKE]
    assert len(set(names)) == len(GKE)
    assert all(len(n) <= 63 and LABEL.match(n) for n in names)
    assert dns_label(f"job-a12-{GKE[0]}", 63) == names[0]  # stable: the same slot, the same name
    assert dns_label("kjob-a0-slot-1") == "kjob-a0-slot-1"  # a name that fits is left as it is


@pytest.fixture
def api():
    server = FakeKubeAPIServer().start()
    yield server
    server.stop()


def release(api, tmp_path, name: str) -> KubernetesPlatform:
    """One Helm release's platform: its own ConfigMap (the owner), the same config.job."""
    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    cm = v1.create_namespaced_config_map(NS, {"metadata": {"name": f"{name}-config"}, "data": {}})
    (tmp_path / f"{name}-token").write_text(TOKEN)
    settings = Settings(namespace=NS, job="job", image="img:1", slots=2, owner_configmap=f"{name}-config",
                        owner_uid=cm.metadata.uid)
    p = KubernetesPlatform(KubeApi(client.ApiClient(api.configuration()), timeout_s=2, retry_s=2), settings)
    p.start(wait_s=10)
    p.token_env(tmp_path / f"{name}-token")
    return p


def test_two_releases_with_one_job_name_never_touch_each_other(api, tmp_path):
    a, b = release(api, tmp_path, "team-a"), release(api, tmp_path, "team-b")
    try:
        run(a.launch(spec(attempt=0)))
        until(lambda: len(api.objects("pods", NS)) == 2)
        # b launches its first attempt, then a later one: it fences only its own older pods
        run(b.launch(spec(attempt=0)))
        until(lambda: len(api.objects("pods", NS)) == 4)
        run(b.launch(spec(attempt=1)))

        def b_fenced():
            run(b.observe())
            names = {p["metadata"]["name"] for p in api.objects("pods", NS)
                     if not p["metadata"].get("deletionTimestamp")}
            return names if sum(1 for n in names if n.startswith(b.base)) == 2 else None
        names = until(b_fenced)
        assert {n for n in names if n.startswith(a.base)} == {a.pods[s].name for s in a.pods}  # untouched
        assert a.base != b.base and a.service != b.service and a.secret != b.secret
        seen_by_a = run(a.observe())
        assert set(seen_by_a) == {"slot-0", "slot-1"}
        assert all(st.state == NodeState.RUNNING for st in seen_by_a.values())
        for pod in api.objects("pods", NS):
            owner = pod["metadata"]["labels"]["elastic-supervisor/owner"]
            assert pod["metadata"]["ownerReferences"][0]["uid"] == owner
        svc = {s["metadata"]["name"]: s for s in api.objects("services", NS)}
        assert svc[a.service]["spec"]["selector"]["elastic-supervisor/owner"] == a.owner_uid
        # b adopts only its own gang, by its saved description
        assert run(b.adopt(b.describe(), 1))
        assert not run(b.adopt(a.describe(), 0))
    finally:
        a.close()
        b.close()


def test_a_job_without_a_release_never_fences_a_releases_pods(api, tmp_path):
    a = release(api, tmp_path, "team-a")
    (tmp_path / "plain-token").write_text(TOKEN)
    plain = KubernetesPlatform(KubeApi(client.ApiClient(api.configuration()), timeout_s=2, retry_s=2),
                               Settings(namespace=NS, job="job", image="img:1", slots=2)).start(wait_s=10)
    plain.token_env(tmp_path / "plain-token")
    try:
        run(a.launch(spec(attempt=0)))
        until(lambda: len(api.objects("pods", NS)) == 2)
        run(plain.launch(spec(attempt=3)))

        def settled():
            run(plain.observe())
            live = {p["metadata"]["name"] for p in api.objects("pods", NS) if not p["metadata"].get("deletionTimestamp")}
            return live if len(live) == 4 else None
        live = until(settled)
        assert {a.pods[s].name for s in a.pods} <= live  # the release's pods untouched
    finally:
        a.close()
        plain.close()
