"""Small real checkpoints written by the library in this process (no mocks)."""

from __future__ import annotations

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
