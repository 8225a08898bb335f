"""Helpers shared by the benchmark commands (not a package: each script adds this folder)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git_state(subdir: str) -> str:
    """The commit a result was measured on, and whether ``subdir`` had uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", subdir],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (f" ({subdir}/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
