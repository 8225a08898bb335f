"""One DDP step's loss and gradients for one global batch, written by rank 0 (or alone)."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train import DeepMLP, make_batch  # noqa: E402

from supervisor.checkpoint import DataCursor  # noqa: E402
from supervisor.worker.sampler import ResumableSampler  # noqa: E402

out, global_batch = Path(sys.argv[1]), int(sys.argv[2])
distributed = "WORLD_SIZE" in os.environ
if distributed:
    dist.init_process_group("gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
torch.manual_seed(0)
model = DeepMLP(64, 4)
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
sampler = ResumableSampler(DataCursor(seed=0), 4096, global_batch, rank, world)
x, y = make_batch(sampler.next_indices(), 0, 64)
loss = nn.functional.mse_loss(model(x), y)
loss.backward()
mean_loss = loss.detach().clone()
if distributed:
    dist.all_reduce(mean_loss)
    mean_loss /= world
if rank == 0:
    net = model.module if distributed else model
    torch.save({"loss": mean_loss, "grads": {n: p.grad for n, p in net.named_parameters()}}, out)
if distributed:
    dist.barrier()  # nobody tears its process group down while a peer still uses it
    dist.destroy_process_group()
# Skip interpreter teardown: twice in full-suite runs a rank aborted there ("terminate called
# without an active exception", from torch's C++ destructors) after its work was done.
sys.stdout.flush()
os._exit(0)
