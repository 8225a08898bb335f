"""Counting every collective a rank enters, with entry and completion.

* DDP: a communication hook (the same all-reduce as DDP's default hook) that marks entry
  when a gradient bucket is handed over and completion from the work's future.
* FSDP2: ``set_custom_all_gather``/``set_custom_reduce_scatter`` with subclasses of FSDP's
  default comms that do the same around each all-gather and reduce-scatter.
* Explicit calls: :func:`traced` wraps any ``torch.distributed`` call (``all_reduce``,
  ``barrier``, ...) the training script makes itself.

The count is the basis of culprit naming: peers stuck inside collective N while one rank sits
at N-1 outside any collective name that rank.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from supervisor.worker.telemetry import RankState


def _complete_on(work: Any, state: RankState, seq: int) -> Any:
    if work is None:  # synchronous: already done
        state.coll_exit(seq)
        return work
    try:
        work.get_future().then(lambda _f: state.coll_exit(seq))
    except (RuntimeError, AttributeError):  # a backend without futures: count at issue only
        state.coll_exit(seq)
    return work


def ddp_comm_hook(state: RankState) -> Callable:
    """A DDP comm hook: average the bucket with one all-reduce, counted.

    Floating-point gradients below 64 bits are summed in float64 and rounded once. The sum of
    a few float32 values is (almost always) exact in float64, so the result no longer depends
    on the order in which the all-reduce adds them. That order follows DDP's bucket layout,
    which DDP rebuilds after the first iteration of every process, so without this a job
    resumed at 3+ ranks drifts from its uninterrupted twin in the last bits (with 2 ranks the
    order cannot matter). It doubles the bytes on the wire for float32 gradients: the price
    of next-step equivalence.
    """

    # No annotations: DDP compares them to dist.GradBucket, and postponed evaluation
    # (``from __future__ import annotations``) turns them into strings.
    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        world = dist.get_world_size(group)
        buffer = bucket.buffer()
        wide = buffer.is_floating_point() and buffer.dtype != torch.float64
        tensor = buffer.to(torch.float64) if wide else buffer
        seq = state.coll_enter("allreduce")
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            state.coll_exit(seq)
            total = f.value()[0]
            if wide:
                return buffer.copy_(total.div_(world))
            return total.div_(world)

        return fut.then(done)

    return hook


def instrument_fsdp(model: torch.nn.Module, state: RankState) -> int:
    """Count the all-gathers and reduce-scatters of every FSDP2 module; returns how many."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class CountingAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            seq = state.coll_enter("allgather")
            return _complete_on(super().__call__(output_tensor, input_tensor, group, async_op), state, seq)

    class CountingReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            seq = state.coll_enter("reduce_scatter")
            return _complete_on(super().__call__(output_tensor, input_tensor, group, op, async_op), state, seq)

    count = 0
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(CountingAllGather())
            module.set_custom_reduce_scatter(CountingReduceScatter())
            count += 1
    return count


def traced(state: RankState, name: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call a ``torch.distributed`` collective, counted (``async_op=True`` is honoured)."""
    seq = state.coll_enter(name)
    try:
        result = fn(*args, **kwargs)
    except BaseException:
        state.coll_exit(seq)
        raise
    if kwargs.get("async_op"):
        return _complete_on(result, state, seq)
    state.coll_exit(seq)
    return result
