"""The platform's watch (supervisor.platforms.kube.client.Watcher) against the fake API server
through the real client: a BOOKMARK moves the resourceVersion it resumes from, so a watch that
ends after a compaction resumes without listing again; an expired one (410) lists again quietly."""

from __future__ import annotations

import logging
import time

import pytest
from kubernetes import client

from fakes.kube_apiserver import FakeKubeAPIServer
from supervisor.platforms.kube.client import Watcher
from test_kube_platform_units import until

NS = "ml"


@pytest.fixture
def api():
    server = FakeKubeAPIServer(bookmark_interval_s=3600).start()  # bookmarks only when the test sends them
    yield server
    server.stop()


def pod(name: str, job: str) -> dict:
    return {"metadata": {"name": name, "labels": {"job": job}},
            "spec": {"containers": [{"name": "c", "image": "img:1"}]}}


def churn_elsewhere(v1: client.CoreV1Api, n: int) -> None:
    """Changes the watch does not select: the cluster's resourceVersion moves past the watch's."""
    for i in range(n):
        v1.create_namespaced_config_map(NS, {"metadata": {"name": f"other-{i}-{time.monotonic_ns()}"}})


def test_a_bookmark_lets_a_watch_resume_after_a_compaction_without_listing_again(api, caplog):
    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    v1.create_namespaced_pod(NS, pod("mine", "a"))
    w = Watcher("pods", v1.list_namespaced_pod, namespace=NS, label_selector="job=a", timeout_s=5).start(10)
    try:
        until(lambda: api.watch_count("pods") == 1)
        churn_elsewhere(v1, 3)
        api.send_bookmarks()  # the watch learns the current resourceVersion
        until(lambda: w.resource_version == api.resource_version)
        api.compact()  # every change before now is forgotten: a watch from its old version gets 410
        with caplog.at_level(logging.DEBUG, logger="supervisor.platform.kube"):
            api.close_watches()  # the server ends the stream (a timeout, an apiserver restart)
            until(lambda: api.watch_count("pods") == 1)
            v1.create_namespaced_pod(NS, pod("later", "a"))
            until(lambda: "later" in w.snapshot())
        assert w.relists == 1, "resumed from the bookmark's resourceVersion, no list again"
    finally:
        w.stop()


def test_an_expired_watch_lists_again_quietly(api, caplog):
    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    w = Watcher("pods", v1.list_namespaced_pod, namespace=NS, label_selector="job=a", timeout_s=5).start(10)
    try:
        until(lambda: api.watch_count("pods") == 1)
        churn_elsewhere(v1, 3)  # no bookmark: the watch still holds the version it listed at
        api.compact()
        with caplog.at_level(logging.DEBUG, logger="supervisor.platform.kube"):
            api.close_watches()
            until(lambda: w.relists == 2)
            v1.create_namespaced_pod(NS, pod("later", "a"))
            until(lambda: "later" in w.snapshot())
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert not warned, [r.getMessage() for r in warned]
        assert any("kube_watch_expired" in r.getMessage() for r in caplog.records)
    finally:
        w.stop()
