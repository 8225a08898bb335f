"""The Helm chart's RBAC as rendered, and whether it allows a request: shared by
tests/test_helm_chart.py (the rules themselves) and tests/test_kube_platform.py (every request
the controller really sent is allowed by them)."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "elastic-supervisor"


def rendered_rbac(values: dict, *, release: str = "demo", namespace: str = "train") -> dict[str, list[dict]]:
    """The rules of the chart's Role and ClusterRole (an empty list for one not rendered)."""
    import helm_python

    helm_python.enable_logging(logging.WARNING)
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    rules: dict[str, list[dict]] = {"Role": [], "ClusterRole": []}
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc and doc["kind"] in rules:
                rules[doc["kind"]].extend(doc.get("rules") or [])
    return rules


def allows(rules: list[dict], verb: str, group: str, resource: str) -> bool:
    """Whether ``rules`` grant ``verb`` on ``resource`` (``pods``, ``pods/log``) of API ``group``,
    as the RBAC authorizer decides it (``*`` matches anything; a subresource is its own resource)."""
    return any((group in r.get("apiGroups", []) or "*" in r.get("apiGroups", []))
               and (resource in r.get("resources", []) or "*" in r.get("resources", []))
               and (verb in r.get("verbs", []) or "*" in r.get("verbs", []))
               for r in rules)
