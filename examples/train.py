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
from supervisor.worker import (
    EXIT_NONFINITE,
    EXIT_PREEMPTED,
    FaultSpecError,
    NonFiniteLoss,
    ResumableSampler,
    SessionError,
    Worker,
)


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
    p.add_argument("--checkpoint-every-seconds", type=float, default=0.0, help="also save every T seconds (0: off)")
    p.add_argument("--async-save", action="store_true", help="save in the background")
    p.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, help="per-rank timing log, heartbeats, stack dumps (default $SUPERVISOR_LOG_DIR)")
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
    if args.checkpoint_dir is None and os.environ.get("SUPERVISOR_CHECKPOINT_DIR"):
        args.checkpoint_dir = Path(os.environ["SUPERVISOR_CHECKPOINT_DIR"])  # set by the supervisor
    if args.steps < 0 or args.checkpoint_every < 0 or args.global_batch < 1:
        p.error("--steps, --checkpoint-every must be >= 0 and --global-batch >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        worker = Worker.from_env(log_dir=args.log_dir)  # session, SUPERVISOR_FAULT, watchdog config
    except (FaultSpecError, SessionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    session = worker.session
    distributed = "MASTER_ADDR" in os.environ and session.world_size >= 1 and "RANK" in os.environ
    use_cuda = torch.cuda.is_available()
    if distributed:
        if use_cuda:
            torch.cuda.set_device(session.local_rank)
        dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = session.rank, session.world_size
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    worker.start()

    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = DeepMLP(args.dim, args.layers).to(device)
    if distributed and args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif distributed:
        model = nn.parallel.DistributedDataParallel(model)
    if distributed:
        worker.instrument(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.steps, max(1, args.steps // 10)))
    scaler = torch.amp.GradScaler("cuda") if use_cuda else None
    cursor = DataCursor(seed=args.seed)
    sampler = ResumableSampler(cursor, args.dataset_size, args.global_batch, rank, world)

    def after_file(save_step: int, rel: str) -> None:  # the crash-in-save drill
        for f in worker.faults:
            if f.kind == "crash-in-save" and f.fires_at(save_step) and rel.endswith(".distcp"):
                os.kill(os.getpid(), signal.SIGKILL)

    ckpt = None
    step = 0
    if args.checkpoint_dir:
        ckpt = CheckpointManager(
            args.checkpoint_dir, model=model, optimizer=opt, scheduler=sched, grad_scaler=scaler,
            cursor=cursor, seed=args.seed, config=vars(args) | {"world_size": world}, keep=args.keep,
            attempt=session.attempt, after_file=after_file,
        )
        worker.checkpoint_schedule(every_steps=args.checkpoint_every, every_seconds=args.checkpoint_every_seconds,
                                   async_save=args.async_save)
        restored = worker.restore(ckpt)
        if restored is not None:
            step = restored.step

    model.train()
    exit_code = 0
    try:
        while step < args.steps:
            if worker.skip_batch(step + 1):  # its loss was non-finite twice: the supervisor asks to skip it
                sampler.next_indices()
                continue
            with worker.step(step + 1) as rec:
                with worker.phase("data"):
                    indices = sampler.next_indices()
                    x, y = make_batch(indices, args.seed, args.dim)
                    x, y = x.to(device), y.to(device)
                with worker.phase("compute"), worker.skip_collective_if_drilled(model):
                    worker.fault_point()
                    with torch.autocast(device.type, enabled=use_cuda):
                        loss = nn.functional.mse_loss(model(x), y)
                    (scaler.scale(loss) if scaler else loss).backward()
                verdict = worker.agree(loss)  # before the optimizer: a NaN anywhere stops every rank
                with worker.phase("compute"):
                    if scaler:
                        scaler.step(opt)
                        scaler.update()
                    else:
                        opt.step()
                    opt.zero_grad(set_to_none=True)
                    sched.step()
                rec.loss = verdict.loss
                rec.log(lr=sched.get_last_lr()[0], **({"samples": indices} if args.log_samples else {}))
            step += 1
            if not worker.after_step(ckpt, step, verdict):
                exit_code = EXIT_PREEMPTED  # emergency checkpoint written; the scheduler may requeue
                break
            if args.step_sleep:
                time.sleep(args.step_sleep)
    except NonFiniteLoss as exc:
        logging.getLogger("train").error("stopping: %s (no optimizer step was taken)", exc)
        exit_code = EXIT_NONFINITE
    if ckpt:
        ckpt.close()
    if args.final_state and exit_code == 0:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save(full, args.final_state)
    worker.close()
    if distributed:
        if exit_code == 0:
            dist.barrier()
        dist.destroy_process_group()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
