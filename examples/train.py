"""The example job every test and drill runs: small but real distributed training.

A deep residual MLP regresses a fixed random "teacher" on deterministic synthetic data
(sample ``i`` is generated from ``(seed, i)`` alone, so data never depends on the world
size). AdamW with warm-up + cosine LR; DDP or FSDP2 (``fully_shard``); gloo on CPU, NCCL on
CUDA (+ grad scaler); checkpoints through :mod:`supervisor.checkpoint`; one JSON line per
step per rank in ``--log-dir`` (``rank-R.jsonl``), with the loss in exact hex so two runs
can be compared bit for bit.

Runs alone (one process), under plain ``torchrun``, or under the supervisor::

    torchrun --standalone --nproc-per-node 2 examples/train.py --steps 50 \
        --checkpoint-dir /tmp/ckpt --checkpoint-every 10 --log-dir /tmp/logs

Fault injection for drills: see ``supervisor.worker.faults`` (``SUPERVISOR_FAULT``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from supervisor.checkpoint import CheckpointManager, DataCursor
from supervisor.worker.faults import CRASH_EXIT_CODE, FaultSpecError, parse_faults
from supervisor.worker.sampler import ResumableSampler


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class DeepMLP(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)  # (batch, 1): no view for FSDP2's hooks to trip on


def make_batch(indices: list[int], seed: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``i`` depends on (seed, i) only; the target is a fixed random teacher."""
    xs = [torch.randn(dim, generator=torch.Generator().manual_seed(seed * 7_919 + i)) for i in indices]
    x = torch.stack(xs)
    w = torch.randn(dim, generator=torch.Generator().manual_seed(seed + 12_345)) / math.sqrt(dim)
    y = torch.sin(x @ w) + 0.1 * (x[:, :4] ** 2).sum(-1)
    return x, y.unsqueeze(-1)


def lr_lambda(total: int, warmup: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps")
    p.add_argument("--checkpoint-dir", type=Path, help="checkpoint root (none: no checkpoints)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="save every N steps (0: never)")
    p.add_argument("--async-save", action="store_true", help="save in the background")
    p.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, help="per-rank JSON-lines timing log")
    p.add_argument("--global-batch", type=int, default=16, help="samples per step, all ranks together")
    p.add_argument("--dataset-size", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep")
    p.add_argument("--log-samples", action="store_true", help="log each rank's sample indices")
    p.add_argument("--final-state", type=Path, help="rank 0 writes the full final model state here (torch.save)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (slows tests down to kill mid-run)")
    args = p.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 0 or args.global_batch < 1:
        p.error("--steps, --checkpoint-every must be >= 0 and --global-batch >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        faults = parse_faults(os.environ.get("SUPERVISOR_FAULT"))
    except FaultSpecError as exc:
        print(f"error: SUPERVISOR_FAULT: {exc}", file=sys.stderr)
        return 2
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) >= 1 and "MASTER_ADDR" in os.environ
    use_cuda = torch.cuda.is_available()
    if distributed:
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if use_cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    attempt = int(os.environ.get("SUPERVISOR_ATTEMPT", os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    faults = [f for f in faults if f.applies(rank=rank, attempt=attempt)]
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")

    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = DeepMLP(args.dim, args.layers).to(device)
    if distributed and args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.steps, max(1, args.steps // 10)))
    scaler = torch.amp.GradScaler("cuda") if use_cuda else None
    cursor = DataCursor(seed=args.seed)
    sampler = ResumableSampler(cursor, args.dataset_size, args.global_batch, rank, world)

    def after_file(save_step: int, rel: str) -> None:
        for f in faults:
            if f.kind == "crash-in-save" and f.fires_at(save_step) and rel.endswith(".distcp"):
                os.kill(os.getpid(), signal.SIGKILL)

    ckpt = None
    step = 0
    if args.checkpoint_dir:
        ckpt = CheckpointManager(
            args.checkpoint_dir, model=model, optimizer=opt, scheduler=sched, grad_scaler=scaler,
            cursor=cursor, seed=args.seed, config=vars(args) | {"world_size": world}, keep=args.keep,
            attempt=attempt, after_file=after_file,
        )
        restored = ckpt.restore()
        if restored is not None:
            step = restored.step
    log_file = None
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(args.log_dir / f"rank-{rank}.jsonl", "a", buffering=1)

    model.train()
    while step < args.steps:
        t0 = time.perf_counter()
        indices = sampler.next_indices()
        x, y = make_batch(indices, args.seed, args.dim)
        x, y = x.to(device), y.to(device)
        t_data = time.perf_counter()
        next_step = step + 1
        firing = [f for f in faults if f.fires_at(next_step)]
        for f in firing:
            if f.kind == "crash":
                sys.exit(CRASH_EXIT_CODE)
            if f.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if f.kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if f.kind == "hang":
                while True:
                    time.sleep(3600)
            if f.kind == "slow":
                time.sleep(f.ms / 1000)
        skip_allreduce = any(f.kind == "skip-collective" for f in firing) and isinstance(model, nn.parallel.DistributedDataParallel)
        with torch.autocast(device.type, enabled=use_cuda):
            if skip_allreduce:
                with model.no_sync():  # this rank never enters the step's all-reduce
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
            else:
                loss = nn.functional.mse_loss(model(x), y)
                if any(f.kind == "nan" for f in firing):
                    loss = loss * float("nan")
                (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        t_compute = time.perf_counter()
        mean_loss = loss.detach().clone()
        if distributed:
            dist.all_reduce(mean_loss)
            mean_loss /= world
        step = next_step
        t_end = time.perf_counter()
        if log_file:
            rec = {
                "step": step, "loss": float(mean_loss), "loss_hex": float(mean_loss).hex(),
                "world_size": world, "attempt": attempt, "rank": rank, "pid": os.getpid(),
                "data_s": round(t_data - t0, 6), "compute_s": round(t_compute - t_data, 6),
                "collective_s": round(t_end - t_compute, 6), "lr": sched.get_last_lr()[0],
                "time": time.time(),
            }
            if args.log_samples:
                rec["samples"] = indices
            log_file.write(json.dumps(rec) + "\n")
        if ckpt and args.checkpoint_every and step % args.checkpoint_every == 0:
            ckpt.save(step, blocking=not args.async_save)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if ckpt:
        ckpt.close()
    if args.final_state:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save(full, args.final_state)
    if log_file:
        log_file.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
