"""A resumable, world-size-independent sampler over a map-style dataset of ``n`` samples.

The global order of an epoch is a permutation that depends on ``(seed, epoch)`` only. Each
step consumes one *global batch* of ``B`` consecutive positions of that order; rank ``r`` of
``W`` takes positions ``[p + r*B/W, p + (r+1)*B/W)`` where ``p`` is the cursor's position.
The cursor advances by ``B`` per step whatever ``W`` is, so a job resumed at another world
size continues with exactly the next unseen samples.

Semantics at the end of an epoch (drop_last): a tail shorter than one global batch is not
used; the epoch ends, the cursor moves to the next epoch at position 0. No padding and no
sample repeated within an epoch. ``B`` must be divisible by ``W``.
"""

from __future__ import annotations

import torch

from supervisor.checkpoint.state import DataCursor


def epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + epoch) & ((1 << 63) - 1))
    return torch.randperm(n, generator=g)


class ResumableSampler:
    def __init__(self, cursor: DataCursor, dataset_size: int, global_batch: int, rank: int, world_size: int) -> None:
        if dataset_size < global_batch:
            raise ValueError(f"dataset_size {dataset_size} is smaller than one global batch {global_batch}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        if global_batch % world_size:
            raise ValueError(f"global batch {global_batch} is not divisible by world size {world_size}")
        self.cursor = cursor
        self.n = dataset_size
        self.global_batch = global_batch
        self.rank = rank
        self.world_size = world_size
        self._order_epoch: int | None = None
        self._order: torch.Tensor | None = None

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size

    def _order_for(self, epoch: int) -> torch.Tensor:
        if self._order_epoch != epoch:
            self._order = epoch_order(self.cursor.seed, epoch, self.n)
            self._order_epoch = epoch
        return self._order  # type: ignore[return-value]

    def next_indices(self) -> list[int]:
        """This rank's sample indices for the next step; advances the shared cursor by B."""
        if self.cursor.position + self.global_batch > self.n:  # drop_last: skip the short tail
            self.cursor.epoch += 1
            self.cursor.position = 0
        order = self._order_for(self.cursor.epoch)
        start = self.cursor.position + self.rank * self.local_batch
        idx = order[start : start + self.local_batch].tolist()
        self.cursor.advance(self.global_batch)
        return idx
