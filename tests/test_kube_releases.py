"""Safe releases on the fake Kubernetes cluster, the controller as its image ships (no torch): a
``helm upgrade`` of the workers (the controller's pod replaced, its config changed) to an image
the cluster cannot pull, then to one whose command crashes, each goes back to the known-good
image and command on its own, and the job completes on the uninterrupted path."""

from __future__ import annotations

import json
import signal
import time

import pytest

from kube_harness import (  # noqa: F401  (cluster, control, kube_run: fixtures)
    PY,
    assert_same_path,
    cluster,
    control,
    finished,
    kube_run,
)

pytestmark = pytest.mark.slow


def helm_upgrade(run, **worker) -> None:
    """What a ``helm upgrade`` that changes the workers does to the controller: its pod is replaced
    (SIGTERM: it hands the running gang over), and the next one reads the new values."""
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 0, run.output()[-3000:]
    cfg = json.loads(run.config.read_text())
    if "image" in worker:
        cfg["platform"]["kubernetes"]["worker"]["image"] = worker["image"]
    if "command" in worker:
        cfg["command"] = worker["command"]
    run.config.write_text(json.dumps(cfg))
    run.start()


def test_a_helm_upgrade_to_an_unpullable_then_a_crashing_image_rolls_back_to_the_known_good_one(
        cluster, kube_run, control):
    run = kube_run(job=["--steps", "30", "--checkpoint-every", "5", "--step-sleep", "0.25"],
                   overrides={"release": {"probation_steps": 6}})
    v1 = run.wait_event("release_known_good", timeout=180)["version"]
    helm_upgrade(run, image="registry.invalid/trainer:does-not-exist")
    bad = run.wait_event("release_started", previous=v1, timeout=60)["version"]
    run.wait_event("release_relaunch", version=bad, timeout=60)
    back = run.wait_event("release_rolled_back", timeout=180)
    assert (back["from"], back["to"], back["reason"]) == (bad, v1, "startup_failure"), back
    assert "registry.invalid/trainer:does-not-exist" in back["why"], back
    run.wait_event("launched", release=v1, restore_from=back["checkpoint"], attempt=back["attempt"] + 1)
    run.wait_event("restart_complete", attempt=back["attempt"] + 1)
    # the pods of the rollback run the known-good image again: by the digest v1's pods ran
    (digest,) = [r["digest"] for r in json.loads((run.log_dir / "releases" / "ledger.json").read_text())["releases"]
                 if r["id"] == v1]
    assert digest.startswith("fake.invalid/worker@sha256:"), digest
    image = {c["image"] for p in cluster.pods() if p["status"].get("phase") == "Running"
             for c in p["spec"]["containers"]}
    assert image == {digest}, image
    # a second upgrade: an image that is there, with a command that crashes before its first step
    helm_upgrade(run, image="trainer:2", command=[PY, "-c", "import a_module_the_image_lacks"])
    deadline = time.monotonic() + 60
    while not (new := [e for e in run.events("release_started") if e["version"] not in (v1, bad)]):
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.1)
    assert new[0]["previous"] == v1  # the running version (the rollback's), not the rejected one
    again = run.wait_event("release_rolled_back", **{"from": new[0]["version"]}, timeout=180)
    assert again["to"] == v1 and "a_module_the_image_lacks" in again["why"], again
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control, exact=False)
