"""A training script that knows nothing of the supervisor: torch only, DDP or FSDP2 on gloo.

What a user brings on day one: it never imports ``supervisor``. Every rank logs one JSON line
per step (``--out DIR/rank-R.jsonl``: step, loss, its pid) so that tests can compare loss paths
and find a rank's process. With ``--save-dir`` it saves and resumes by itself (``torch.save``
of the model and optimizer every ``--save-every`` steps, the newest one loaded at start), as
many scripts do.

Faults the tests inject from inside (everything else, SIGKILL and SIGSTOP, comes from outside):
``PLAIN_FAULT=raise@STEP:RANK`` raises at that step; ``skip@STEP:RANK`` skips the step's
collectives on that rank and then waits for ever, as a rank that ran out of data does, while
its peers wait inside the all-reduce. ``PLAIN_FAULT_ONCE=PATH`` makes it fire once (the file
marks it fired), so the restarted job runs clean.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def fault(step: int, rank: int) -> str:
    spec = os.environ.get("PLAIN_FAULT", "")
    if not spec:
        return ""
    kind, _, where = spec.partition("@")
    at, _, who = where.partition(":")
    if int(at) != step or int(who) != rank:
        return ""
    once = os.environ.get("PLAIN_FAULT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return ""
    return kind


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--out", required=True)
    p.add_argument("--save-dir", default="")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.05)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        net = fully_shard(model)
    else:
        net = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    start = 0
    ckpt = os.path.join(args.save_dir, f"own-rank-{rank}.pt") if args.save_dir else ""
    if ckpt:
        os.makedirs(args.save_dir, exist_ok=True)
    if ckpt and os.path.exists(ckpt):
        saved = torch.load(ckpt, weights_only=False)
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = saved["step"]
        # every rank must have the same step: the newest one every rank saved
        agreed = torch.tensor([start])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        assert int(agreed) == start, f"rank {rank} saved step {start}, another rank fewer"

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"env-rank-{rank}.json"), "w") as f:  # what torch was told, for the tests
        json.dump({k: v for k, v in os.environ.items() if k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}, f)
    log = open(os.path.join(args.out, f"rank-{rank}.jsonl"), "a", buffering=1)
    for step in range(start + 1, args.steps + 1):
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(16, 32, generator=g)
        y = x.sum(dim=1, keepdim=True)
        kind = fault(step, rank)
        if kind == "raise":
            raise RuntimeError(f"injected failure at step {step}")
        if kind == "skip":
            while True:  # no collective: the peers wait inside theirs
                time.sleep(3600)
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        log.write(json.dumps({"step": step, "loss": float(mean), "loss_hex": float(mean).hex(), "pid": os.getpid(),
                              "rank": rank}) + "\n")
        if ckpt and step % args.save_every == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
            dist.barrier()
        if args.step_sleep:
            time.sleep(args.step_sleep)
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
