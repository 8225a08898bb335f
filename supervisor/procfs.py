"""Process liveness from /proc, shared by the checkpoint library and the local platform.

``kill -0`` is not enough here: a zombie passes it, and this machine's PID 1 reaps slowly.
"""

from __future__ import annotations

import os


def proc_state(pid: int) -> str | None:
    """The kernel's state letter for ``pid`` (R, S, T, Z, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def children(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """The live direct children of ``pid`` (from /proc, or from a :func:`process_tree` taken once)."""
    return list((process_tree() if tree is None else tree).get(pid, []))


def descendants(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """Every live descendant of ``pid`` (children, grandchildren, ...), from /proc (or ``tree``)."""
    children = process_tree() if tree is None else tree
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def process_tree() -> dict[int, list[int]]:
    """Every live process's children, by parent pid: one scan of /proc, to share between callers
    (each scan reads every process's stat; a controller tick needs one, not one per node)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{entry}/stat", os.O_RDONLY)
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
            ppid = int(raw.rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def pids_with_env(name: str, value: str) -> list[int]:
    """Live processes of this user whose environment holds ``name=value`` (from /proc).

    How a supervisor finds what is left of a gang it no longer has a record of: every agent
    and rank it starts carries the job's log directory in its environment.
    """
    needle = f"{name}={value}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0") and pid_alive(int(entry)):
            out.append(int(entry))
    return out
