"""The checks about the training command run where the ranks run (Kubernetes, end to end).

The controller runs as its image ships (tests/controller_venv.py: no torch), so it cannot check
the workers' interpreter on its own host; each pod's agent checks it before it starts a rank. A
worker image without torch is then one clear startup failure (exit 8) in seconds, on the first
attempt, with the check's own message in the verdict, ``supervisor status`` and the events.
"""

from __future__ import annotations

import subprocess
from datetime import datetime

import pytest

from conftest import TRAIN
from controller_venv import controller_python
from kube_harness import (  # noqa: F401  (cluster, kube_run: fixtures)
    JOB,
    cluster,
    finished,
    kube_run,
)

pytestmark = pytest.mark.slow


def at(event: dict) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("torch_in", ["neither", "the command only"])
def test_a_worker_image_without_torch_stops_at_once_with_the_agents_check(cluster, kube_run, tmp_path_factory,
                                                                         torch_in):
    # the image-like controller's interpreter: this package and its requirements, without torch
    no_torch = str(controller_python(tmp_path_factory))
    if torch_in == "neither":
        # the chart's `command: [python, train.py]` in a worker image whose python has no torch
        run = kube_run(kube={"python": no_torch}, overrides={"command": [no_torch, str(TRAIN), *JOB]})
        expect = f"the job's interpreter {no_torch} cannot import torch"
    else:
        # the job's python has torch, but the one that runs the node agent (torchrun) has not
        run = kube_run(kube={"python": no_torch})
        expect = f"the node agent's interpreter {no_torch} cannot import torch"
    launched = run.wait_event("launched", attempt=0)
    done = run.wait_event("job_finished", timeout=120)
    assert done["phase"] == "stopped_startup_failure" and done["exit_code"] == 8, done
    assert expect in done["reason"] and "PreflightError" in done["reason"], done
    assert at(done) - at(launched) < 20, (launched, done)  # seconds, not a startup timeout or three attempts
    assert len(run.events("launched")) == 1, run.events("launched")  # one attempt: no relaunch loop
    (fault,) = run.events("fault_detected")
    assert fault["kind"] == "preflight_failed" and fault["nodes"][0] in launched["nodes"], fault
    for pod in run.cluster.pods():  # the agent's one line, not a traceback from `import torch`
        log = run.cluster.kubelet.logs(pod["metadata"]["name"])
        assert "Traceback" not in log and expect in log, log
    # what the operator sees with `supervisor status` (the image's own CLI; the idle controller serves it)
    status = subprocess.run([no_torch, "-m", "supervisor", "status", "--log-dir", str(run.log_dir)],
                            capture_output=True, text=True, timeout=60, env=run.env)
    assert "stopped_startup_failure" in status.stdout and expect in status.stdout, status.stdout + status.stderr
    assert finished(run, code=8)["reason"] == done["reason"]
