"""The chart's optional NetworkPolicy (issue 24, item 3): off by default; on, it admits to the
controller only the job's worker pods (UDP heartbeats and HTTP) and the scrapers of a configured
namespace selector (HTTP), plus extra rules. Rendered by Helm's engine and validated strict as
tests/test_helm_chart.py does every object."""

from __future__ import annotations

import helm_python
import kubernetes_validate
import pytest

from supervisor.platforms.kube.platform import JOB_LABEL, MANAGED_BY, MANAGER
from test_helm_chart import (  # noqa: F401 - the chart fixture and the render helpers
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    by_kind,
    chart,
    objects,
    one,
    render,
    rendered_job_config,
)

ON = {"networkPolicy": {"enabled": True}}


def policy(chart, values: dict) -> tuple[dict, list[dict]]:
    objs = objects(render(chart, values))
    return one(objs, "NetworkPolicy"), objs


def test_off_by_default(chart):
    assert "NetworkPolicy" not in by_kind(objects(render(chart, {})))


@pytest.mark.parametrize("kube_version", ["v1.30.0", f"v{kubernetes_validate.latest_version()}"])
def test_lint_strict_with_the_policy(kube_version):
    report = helm_python.lint(CHART, ON, strict=True, namespace=NAMESPACE, kube_version=kube_version)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", [
    ON,
    {"networkPolicy": {"enabled": True, "scrapers": {
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["obs", "sre"]}]},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        "extraIngress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}],
                          "ports": [{"port": "http", "protocol": "TCP"}]}]}},
    {"networkPolicy": {"enabled": True, "scrapers": {"enabled": False}}},
], ids=["defaults", "custom", "no_scrapers"])
def test_the_policy_validates_strict(chart, values):
    pol, _ = policy(chart, values)
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(pol, version, strict=True)


def test_it_admits_the_jobs_workers_and_the_scrapers_to_the_controller_only(chart):
    pol, objs = policy(chart, ON)
    spec = pol["spec"]
    pod = one(objs, "Deployment")["spec"]["template"]
    # it selects the controller's pod and no other
    assert spec["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p for p in pod["spec"]["containers"][0]["ports"]}
    assert ports["heartbeat"]["protocol"] == "UDP" and ports["http"]["protocol"] == "TCP"
    workers, scrapers = spec["ingress"]
    # the worker pods are those the Kubernetes platform labels for this job
    job = rendered_job_config(objs)["job"]
    assert workers["from"] == [{"podSelector": {"matchLabels": {MANAGED_BY: MANAGER, JOB_LABEL: job}}}]
    assert workers["ports"] == [{"port": "heartbeat", "protocol": "UDP"}, {"port": "http", "protocol": "TCP"}]
    # the controller's own pod is no worker (Helm manages it): it is not the peer admitted
    assert pod["metadata"]["labels"][MANAGED_BY] == "Helm"
    # scrapers: the configured namespaces, HTTP only (no heartbeat can come from there)
    assert scrapers["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert scrapers["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_scrapers_and_extra_rules_as_configured(chart):
    extra = {"from": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}], "ports": [{"port": "http", "protocol": "TCP"}]}
    pol, _ = policy(chart, {"networkPolicy": {"enabled": True, "scrapers": {
        "namespaceSelector": {"matchLabels": {"name": "obs"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}, "extraIngress": [extra]}})
    _, scrapers, got_extra = pol["spec"]["ingress"]
    # one peer: both selectors ANDed (prometheus pods of the obs namespace), not either
    assert scrapers["from"] == [{"namespaceSelector": {"matchLabels": {"name": "obs"}},
                                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    assert got_extra == extra
    pol, _ = policy(chart, {"networkPolicy": {"enabled": True, "scrapers": {"namespace": "prom"}}})
    assert pol["spec"]["ingress"][1]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "prom"}}}]
    pol, _ = policy(chart, {"networkPolicy": {"enabled": True, "scrapers": {"namespace": ""}}})
    assert pol["spec"]["ingress"][1]["from"] == [{"namespaceSelector": {}}]  # every namespace, as documented
    pol, _ = policy(chart, {"networkPolicy": {"enabled": True, "scrapers": {"enabled": False}}})
    assert len(pol["spec"]["ingress"]) == 1  # the workers only


def test_a_long_release_name_selects_its_own_job(chart):
    release = "a-release-name-that-is-quite-long-for-a-training-job"
    objs = objects(render(chart, ON, name=release))
    pol = one(objs, "NetworkPolicy")
    job = rendered_job_config(objs)["job"]
    assert len(job) <= 40 and pol["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"][JOB_LABEL] == job
    assert len(pol["metadata"]["name"]) <= 63


@pytest.mark.parametrize("values,field", [
    ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
    ({"networkPolicy": {"ingress": []}}, "additional properties 'ingress'"),
    ({"networkPolicy": {"scrapers": {"namespace": "Not A Namespace"}}}, "/networkPolicy/scrapers/namespace"),
    ({"networkPolicy": {"scrapers": {"namespaceSelector": {"matchLabel": {"a": "b"}}}}}, "'matchLabel'"),
    ({"networkPolicy": {"scrapers": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}}},
     "/networkPolicy/scrapers/podSelector/matchExpressions/0/operator"),
])
def test_the_schema_refuses_bad_policy_values_naming_the_field(chart, values, field):
    with pytest.raises(helm_python.HelmValuesError) as exc:
        render(chart, values)
    assert field in str(exc.value)
