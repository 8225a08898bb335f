"""A rank that checkpoints through the worker SDK but never restores (issue 13 §3): it still
tells the supervisor where it saves. ``save_only.py ROOT STEPS``; one rank, no process group."""

import sys
import time

import torch

from supervisor.checkpoint import CheckpointManager
from supervisor.worker import Worker
from supervisor.worker.runtime import Verdict

root, steps = sys.argv[1], int(sys.argv[2])
worker = Worker.from_env()
worker.start()
ckpt = CheckpointManager(root, model=torch.nn.Linear(4, 4))
for step in range(1, steps + 1):
    with worker.step(step):
        time.sleep(0.2)
    worker.after_step(ckpt, step, Verdict(loss=1.0, nonfinite=False, stop=False, save_due=True))
ckpt.close()
worker.close()
