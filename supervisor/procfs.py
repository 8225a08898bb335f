"""Process liveness from /proc, shared by the checkpoint library and the local platform.

``kill -0`` is not enough here: a zombie passes it, and this machine's PID 1 reaps slowly.
"""

from __future__ import annotations


def proc_state(pid: int) -> str | None:
    """The kernel's state letter for ``pid`` (R, S, T, Z, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")
