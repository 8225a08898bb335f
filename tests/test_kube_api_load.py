"""benchmarks/kube_api_load.py at a small size: the claim its results document makes at 1,024
pods (no per-pod request in steady state; the attempt's PodGroup and PodDisruptionBudget cost
requests per launch, not per pod) holds for the same code at 64 pods, with each gang mode."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from fakes.kube_apiserver import FakeKubeAPIServer

REPO = Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("kube_api_load", REPO / "benchmarks" / "kube_api_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gang, group_resource", [("volcano", "podgroups.scheduling.volcano.sh"),
                                                  ("coscheduling", "podgroups.scheduling.x-k8s.io"),
                                                  ("none", None)])
def test_steady_state_makes_no_per_pod_request_and_the_attempts_objects_are_per_launch(tmp_path, gang,
                                                                                       group_resource):
    bench = load()
    api = FakeKubeAPIServer(history_size=5000).start()
    try:
        out = asyncio.run(bench.measure(api, 64, 1.0, tmp_path, gang, True))
    finally:
        api.stop()
    launch, steady, restart = out["launch"], out["steady"], out["restart"]
    assert steady.per_pod() == 0 and steady.ticks > 0
    assert not [k for k in steady.counts if k[1] in ("poddisruptionbudgets", group_resource)]
    assert launch.counts[("create", "pods")] == 64 and launch.counts[("create", "poddisruptionbudgets")] == 1
    # teardown deletes attempt 0's budget (the launch of attempt 1 does not again), then attempt 1 makes its own
    assert restart.counts[("delete", "poddisruptionbudgets")] == 1 and restart.counts[("create", "poddisruptionbudgets")] == 1
    if group_resource:
        assert launch.counts[("create", group_resource)] == 1
        assert restart.counts[("delete", group_resource)] == 1 and restart.counts[("create", group_resource)] == 1
        assert launch.kubelet[("patch", f"{group_resource}/status")] == 1   # the scheduler's, not the controller's
        assert ("patch", f"{group_resource}/status") not in launch.counts
    else:
        assert not [k for k in launch.counts | restart.counts if k[1].startswith("podgroups")]
