"""RNG capture, derived seeds, the data cursor and the resumable sampler."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.checkpoint.state import DataCursor, capture_rng, derived_seed, restore_rng
from supervisor.worker.sampler import ResumableSampler, epoch_order


def draws():
    return random.random(), float(np.random.rand()), torch.rand(2).tolist(), random.gauss(0, 1)


def test_rng_roundtrip_restores_every_stream():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    state = capture_rng()
    expected = draws()
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(state)
    assert draws() == expected


def test_derived_seed_depends_on_seed_step_rank_only():
    assert derived_seed(1, 2, 3) == derived_seed(1, 2, 3)
    assert len({derived_seed(1, 2, r) for r in range(64)}) == 64
    assert derived_seed(1, 2, 3) != derived_seed(1, 3, 2) != derived_seed(2, 2, 3)
    assert 0 <= derived_seed(10**30, 5, 5) < 2**63


def test_cursor_validation():
    c = DataCursor()
    with pytest.raises(ValueError):
        c.load_state_dict({"seed": 0, "epoch": -1, "position": 0, "total": 0})
    with pytest.raises(ValueError):
        c.load_state_dict({"seed": 0, "epoch": 0, "position": True, "total": 0})
    with pytest.raises(ValueError):
        c.advance(-1)


def test_sampler_rejects_bad_geometry():
    with pytest.raises(ValueError, match="divisible"):
        ResumableSampler(DataCursor(), 100, 10, 0, 3)
    with pytest.raises(ValueError, match="smaller"):
        ResumableSampler(DataCursor(), 5, 10, 0, 1)
    with pytest.raises(ValueError, match="rank"):
        ResumableSampler(DataCursor(), 100, 10, 2, 2)


def test_order_depends_on_seed_and_epoch_only():
    assert torch.equal(epoch_order(3, 1, 50), epoch_order(3, 1, 50))
    assert not torch.equal(epoch_order(3, 1, 50), epoch_order(3, 2, 50))


def consume(cursor: DataCursor, n: int, world: int, steps: int, batch: int) -> list[int]:
    samplers = [ResumableSampler(DataCursor(**cursor.state_dict()), n, batch, r, world) for r in range(world)]
    seen = []
    for _ in range(steps):
        for s in samplers:
            seen.extend(s.next_indices())
    cursor.load_state_dict(samplers[0].cursor.state_dict())
    return seen


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=12, max_value=200),
    segments=st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 6, 12]), st.integers(0, 30)), min_size=1, max_size=8),
    seed=st.integers(0, 2**31),
)
def test_every_sample_of_an_epoch_exactly_once_across_resumes(n, segments, seed):
    """Over any sequence of resumes at changing world sizes, each epoch's samples are
    consumed exactly once, in the same order an uninterrupted run consumes them."""
    batch = 12
    cursor = DataCursor(seed=seed)
    resumed: list[int] = []
    total_steps = 0
    for world, steps in segments:
        # each segment is a fresh job at another world size resuming from the saved cursor
        saved = DataCursor(**cursor.state_dict())
        resumed += consume(saved, n, world, steps, batch)
        cursor = saved
        total_steps += steps
    control = consume(DataCursor(seed=seed), n, 1, total_steps, batch)
    assert resumed == control
    per_epoch = n // batch * batch  # drop_last: the short tail is never used
    for start in range(0, len(control) - per_epoch + 1, per_epoch):
        epoch = control[start : start + per_epoch]
        assert len(set(epoch)) == per_epoch  # none twice within an epoch
    assert cursor.total == total_steps * batch
