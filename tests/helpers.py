"""Small real checkpoints written by the library in this process (no mocks), and a platform
that runs nothing for controller tests that drive the controller's state directly."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import torch

from supervisor.checkpoint import CheckpointManager, DataCursor


def tiny_job(root: Path, *, seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    cursor = DataCursor(seed=seed)
    mgr = CheckpointManager(root, model=model, optimizer=opt, scheduler=sched, cursor=cursor, seed=seed, **kw)
    return mgr, model, opt, sched, cursor


def train_step(model, opt, sched, cursor) -> float:
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    cursor.advance(8)
    return float(loss.detach())


def make_checkpoints(root: Path, steps=(1, 2, 3), **kw) -> CheckpointManager:
    mgr, model, opt, sched, cursor = tiny_job(root, **kw)
    for step in range(1, max(steps) + 1):
        train_step(model, opt, sched, cursor)
        if step in steps:
            mgr.save(step)
    return mgr


def flip_inside_tensor(ckpt: Path, tensor: torch.Tensor) -> None:
    """Bit rot: one byte in the middle of ``tensor``'s raw bytes in the checkpoint's data files;
    every size stays the same (only a checksum can tell)."""
    raw = tensor.detach().contiguous().numpy().tobytes()
    for shard in ckpt.glob("*.distcp"):
        data = bytearray(shard.read_bytes())
        at = data.find(raw)
        if at >= 0:
            data[at + len(raw) // 2] ^= 0x01
            shard.write_bytes(bytes(data))
            return
    raise AssertionError("tensor bytes not found in any shard")


def no_platform(slots: list[str] | None = None):
    """A Platform with the given slots that launches and observes nothing."""
    from supervisor.platforms.base import NodeStatus, Platform

    class NoPlatform(Platform):
        kind = "none"

        async def launch(self, spec) -> None: ...

        async def observe(self) -> dict[str, NodeStatus]:
            return {}

        async def kill_node(self, name: str) -> None: ...

        async def teardown(self, grace_s: float) -> None: ...

        def slots(self) -> list[str]:
            return list(slots or [])

    return NoPlatform()


def record_durability(monkeypatch) -> list[tuple]:
    """Every os.fsync (the path the descriptor names and its size then, or "dir") and os.replace,
    in the order they happen."""
    ops: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        ops.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), "dir" if stat.S_ISDIR(st.st_mode) else st.st_size))
        return real_fsync(fd)

    def replace(src, dst, **kw):
        ops.append(("replace", str(src), str(dst)))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return ops


def view_registry(view):
    """A Prometheus registry over one JobView, rendered as /metrics renders a controller's
    (supervisor.metrics.take_snapshot, then its families)."""
    from prometheus_client import CollectorRegistry

    from supervisor.metrics import MetricsState, families, take_snapshot

    reg = CollectorRegistry(auto_describe=False)

    class Collector:
        def collect(self):
            yield from families(take_snapshot(view, MetricsState()))

    reg.register(Collector())
    return reg
