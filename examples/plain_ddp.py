"""A plain DDP training loop, as in the PyTorch tutorials: torch only, no supervisor import.

Run it the same way under both launchers::

    torchrun --standalone --nproc-per-node 2 examples/plain_ddp.py --steps 2000
    supervisor launch --nnodes 2 -- python examples/plain_ddp.py --steps 2000

Then stop one rank (``kill -STOP <pid>``; each rank prints its pid). Under torchrun the job hangs:
gloo waits for the stopped rank for its 30-minute default timeout and nothing is named. Under
the supervisor the rank goes silent, is named (``fault_detected kind=dead ranks=[1]``) within
the heartbeat timeout, the other rank's stacks and flight-recorder trace are kept in
``supervisor-logs/ranks/``, and the gang is relaunched; this script has no resume of its own,
so it starts again from step 1 (``supervisor.checkpoint`` is what resumes a job exactly).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank}: pid {os.getpid()}", flush=True)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 32)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
