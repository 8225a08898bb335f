"""One-process equivalence: DDP at W ranks with global batch B == one process with batch B.

Gradients are means over the same B samples; only the float32 summation order differs
(W partial means averaged by an all-reduce), so we allow rtol 1e-5 / atol 1e-7.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_job

WORKLOAD = Path(__file__).parent / "workloads" / "grad_equiv.py"


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ddp_matches_one_process(tmp_path, world):
    single = tmp_path / "single.pt"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("WORLD_SIZE", None)
    subprocess.run([sys.executable, str(WORKLOAD), str(single), "16"], check=True, env=env, timeout=120)
    multi = tmp_path / "ddp.pt"
    run_job(tmp_path, world, [str(multi), "16"], script=WORKLOAD)
    a, b = torch.load(single), torch.load(multi)
    torch.testing.assert_close(b["loss"], a["loss"], rtol=1e-6, atol=0)
    assert a["grads"].keys() == b["grads"].keys() and len(a["grads"]) > 10
    for name in a["grads"]:
        torch.testing.assert_close(b["grads"][name], a["grads"][name], rtol=1e-5, atol=1e-7, msg=name)
    # and the check can fail: a different batch gives different gradients
    other = tmp_path / "other.pt"
    subprocess.run([sys.executable, str(WORKLOAD), str(other), "8"], check=True, env=env, timeout=120)
    assert not torch.allclose(torch.load(other)["loss"], a["loss"])
