"""Layering that import-linter cannot see: the controller runs without torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_controller_and_the_cli_import_without_torch():
    # the controller's container image need not carry torch: discovery and verification of
    # checkpoints are plain Python; only saving and restoring (the ranks) need it
    probe = ("import sys\n"
             "import supervisor.cli, supervisor.controller.daemon, supervisor.controller.http\n"
             "import supervisor.platforms.local, supervisor.platforms.slurm, supervisor.checkpoint\n"
             "from supervisor.checkpoint import latest_complete, verify, prune\n"
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]
    # and the names that need torch still load on first use
    probe = "from supervisor.checkpoint import CheckpointManager, DataCursor; print(CheckpointManager.__name__)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "CheckpointManager"
