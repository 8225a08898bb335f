"""Saving and restoring in one process: complete state, async semantics, disk faults."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import flip_inside_tensor, make_checkpoints, tiny_job, train_step
from supervisor.checkpoint import (
    CheckpointLoadError,
    CheckpointSaveError,
    RNG_DERIVED,
    RNG_EXACT,
    derived_seed,
    in_flight,
    latest_complete,
)
from supervisor.checkpoint.discovery import candidates
from supervisor.checkpoint.fsutil import HashingFile

REPO = Path(__file__).resolve().parents[1]


class Counter:
    def __init__(self):
        self.n = 0
        self.history = torch.zeros(3)

    def state_dict(self):
        return {"n": self.n, "history": self.history.clone()}

    def load_state_dict(self, sd):
        self.n, self.history = sd["n"], sd["history"]


def snapshot(model, opt):
    return {k: v.clone() for k, v in model.state_dict().items()}, json.dumps(
        {str(k): {n: (t.tolist() if torch.is_tensor(t) else t) for n, t in v.items()} for k, v in opt.state_dict()["state"].items()}
    )


def test_restore_brings_back_every_piece_of_state(tmp_path):
    mgr, model, opt, sched, cursor = tiny_job(tmp_path)
    extra = Counter()
    mgr.register("counter", extra)
    for _ in range(3):
        train_step(model, opt, sched, cursor)
    extra.n, extra.history = 42, torch.tensor([1.0, 2.0, 3.0])
    mgr.save(3)
    # what the uninterrupted job would do next, including its random draws
    expected_params, expected_opt = snapshot(model, opt)
    expected_next = (torch.rand(3), np.random.rand(), __import__("random").random())

    mgr2, model2, opt2, sched2, cursor2 = tiny_job(tmp_path, seed=99)  # other weights, other RNG
    extra2 = Counter()
    mgr2.register("counter", extra2)
    res = mgr2.restore()
    assert res.step == 3 and res.rng == RNG_EXACT and res.skipped == []
    params, opt_state = snapshot(model2, opt2)
    for k in expected_params:
        assert torch.equal(params[k], expected_params[k]), k
    assert opt_state == expected_opt
    assert sched2.state_dict() == sched.state_dict()
    assert cursor2.state_dict() == cursor.state_dict() == {"seed": 0, "epoch": 0, "position": 24, "total": 24}
    assert extra2.n == 42 and torch.equal(extra2.history, torch.tensor([1.0, 2.0, 3.0]))
    got_next = (torch.rand(3), np.random.rand(), __import__("random").random())
    assert torch.equal(got_next[0], expected_next[0]) and got_next[1:] == expected_next[1:]


def test_manifest_records_what_a_reader_needs(tmp_path):
    make_checkpoints(tmp_path, steps=(2,), config={"lr": 0.1})
    m = latest_complete(tmp_path, "full").checkpoint.manifest
    assert m.format_version == 1 and m.status == "complete" and m.global_step == 2
    assert m.writer_world_size == 1 and m.torch_version == torch.__version__
    assert m.states["model"]["tensors"] == 4 and m.states["optimizer"]["logical_state"] == "adamw"
    assert m.trainer_state["data_cursor"]["position"] == 16
    assert m.trainer_state["rng"]["guarantee"]["same_world_size"] == "exact"
    assert m.config == {"lr": 0.1} and m.checksum_algorithm == "xxh3_128"
    assert ".metadata" in m.files and "trainer/scheduler.pt" in m.files


def test_sha256_can_be_chosen_and_is_followed_by_readers(tmp_path):
    make_checkpoints(tmp_path, steps=(1,), checksum="sha256")
    found = latest_complete(tmp_path, "full").checkpoint
    assert found.manifest.checksum_algorithm == "sha256"
    assert all(len(e.digest) == 64 for e in found.manifest.files.values())


def test_restore_falls_back_past_a_corrupt_newest(tmp_path):
    make_checkpoints(tmp_path, steps=(1, 2))
    shard = max((tmp_path / "step-0000000002").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF
    shard.write_bytes(bytes(data))
    mgr, *_ = tiny_job(tmp_path, seed=5)
    res = mgr.restore()
    assert res.step == 1
    assert [s.name for s in res.skipped] == ["step-0000000002"] and "checksum" in res.skipped[0].reason




def test_a_flipped_bit_inside_a_tensor_is_caught_while_loading_and_the_older_checkpoint_wins(tmp_path):
    mgr, model, opt, sched, cursor = tiny_job(tmp_path)
    train_step(model, opt, sched, cursor)
    mgr.save(1)
    at_step_1 = {k: v.clone() for k, v in model.state_dict().items()}
    train_step(model, opt, sched, cursor)
    mgr.save(2)
    flip_inside_tensor(tmp_path / "step-0000000002", model[0].weight)
    assert latest_complete(tmp_path, "fast").checkpoint.step == 2  # sizes intact: only a checksum tells
    mgr2, model2, *_ = tiny_job(tmp_path, seed=7)
    res = mgr2.restore()
    assert res.step == 1 and [s.name for s in res.skipped] == ["step-0000000002"]
    assert "checksum" in res.skipped[0].reason
    # the corrupt load wrote into the model before the mismatch was known; step 1 overwrote all of it
    for k, v in model2.state_dict().items():
        assert torch.equal(v, at_step_1[k]), k


@pytest.mark.parametrize("flip", [None, "weight", "gap"])
def test_big_tensors_are_checksummed_in_the_same_pass_that_reads_them(tmp_path, monkeypatch, flip):
    from supervisor.checkpoint import CheckpointManager
    from supervisor.checkpoint import dcp_io

    readers = []
    init = dcp_io.ManifestReader.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        readers.append(self)

    monkeypatch.setattr(dcp_io.ManifestReader, "__init__", spy)
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)  # 1 MiB of weights: read straight into place
    CheckpointManager(tmp_path, model=model).save(1)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt = tmp_path / "step-0000000001"
    if flip == "weight":
        flip_inside_tensor(ckpt, model.weight)
    elif flip == "gap":  # a byte of the zip/pickle framing between tensors, not tensor data
        shard = next(ckpt.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[10] ^= 0x01
        shard.write_bytes(bytes(data))
    torch.manual_seed(1)
    other = torch.nn.Linear(512, 512)
    mgr = CheckpointManager(tmp_path, model=other)
    if flip is None:
        assert mgr.restore().step == 1
        assert all(torch.equal(v, expected[k]) for k, v in other.state_dict().items())
        assert readers[-1].verified_inline and not readers[-1].verified_whole
    else:
        with pytest.raises(CheckpointLoadError, match="found corrupt only while loading|fails"):
            mgr.restore()


def test_the_only_checkpoint_corrupt_inside_a_tensor_is_an_error_not_a_fresh_start(tmp_path):
    mgr, model, opt, sched, cursor = tiny_job(tmp_path)
    train_step(model, opt, sched, cursor)
    mgr.save(1)
    flip_inside_tensor(tmp_path / "step-0000000001", model[2].weight)
    mgr2, *_ = tiny_job(tmp_path, seed=7)
    with pytest.raises(CheckpointLoadError, match="found corrupt only while loading.*Rebuild"):
        mgr2.restore()
    mgr3, *_ = tiny_job(tmp_path, seed=7)  # a new process, told to leave it out: a fresh start
    assert mgr3.restore(exclude=["step-0000000001"]) is None
    mgr4, *_ = tiny_job(tmp_path, seed=7)  # asked for exactly that one: an error that says what happened
    with pytest.raises(CheckpointLoadError, match="checksum.*found while loading.*rebuild"):
        mgr4.restore(path=tmp_path / "step-0000000001")


def test_fresh_start_returns_none(tmp_path):
    mgr, *_ = tiny_job(tmp_path / "empty")
    assert mgr.restore() is None


def test_restore_into_another_architecture_is_a_clear_error(tmp_path):
    make_checkpoints(tmp_path, steps=(1,))
    from supervisor.checkpoint import CheckpointManager

    model = torch.nn.Linear(3, 3)
    mgr = CheckpointManager(tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(CheckpointLoadError, match="model/optimizer state"):
        mgr.restore()


def test_registered_object_missing_from_checkpoint_is_an_error(tmp_path):
    make_checkpoints(tmp_path, steps=(1,))
    mgr, *_ = tiny_job(tmp_path)
    mgr.register("ema", Counter())
    with pytest.raises(CheckpointLoadError, match="'ema'"):
        mgr.restore()


def test_same_step_saved_twice_never_overwrites(tmp_path):
    mgr, model, opt, sched, cursor = tiny_job(tmp_path, keep=5)
    train_step(model, opt, sched, cursor)
    first = mgr.save(1)
    second = mgr.save(1)
    assert first.path.name == "step-0000000001" and second.path.name == "step-0000000001-1"
    assert latest_complete(tmp_path, "full").checkpoint.name == "step-0000000001-1"


def test_retention_runs_after_each_save(tmp_path):
    make_checkpoints(tmp_path, steps=(1, 2, 3, 4, 5), keep=2)
    assert [c.step for c in candidates(tmp_path)] == [5, 4]


def test_derived_rng_at_another_world_size(tmp_path):
    make_checkpoints(tmp_path, steps=(1,))
    manifest = tmp_path / "step-0000000001" / "manifest.json"
    d = json.loads(manifest.read_text())
    d["writer_world_size"] = 2  # as if written by two ranks
    manifest.write_text(json.dumps(d))
    mgr, *_ = tiny_job(tmp_path, seed=3, verify_on_restore="fast")
    res = mgr.restore()
    assert res.rng == RNG_DERIVED
    got = torch.rand(4)
    torch.manual_seed(derived_seed(3, 1, 0))
    assert torch.equal(got, torch.rand(4))


# ----------------------------------------------------------------- async save

def test_async_save_captures_state_by_value(tmp_path):
    mgr, model, opt, sched, cursor = tiny_job(tmp_path)
    train_step(model, opt, sched, cursor)
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    cursor_at_save = cursor.state_dict()
    fut = mgr.save(1, blocking=False)
    for _ in range(5):  # keep training while the save is in flight
        train_step(model, opt, sched, cursor)
    assert fut.result().step == 1
    mgr2, model2, *_, cursor2 = tiny_job(tmp_path, seed=7)
    mgr2.restore()
    for k, v in model2.state_dict().items():
        assert torch.equal(v, at_save[k]), k
    assert cursor2.state_dict() == cursor_at_save


def test_at_most_one_async_save_in_flight_and_buffers_are_not_mixed(tmp_path):
    mgr, model, opt, sched, cursor = tiny_job(tmp_path, keep=5)
    states = {}
    for step in (1, 2, 3):
        train_step(model, opt, sched, cursor)
        states[step] = {k: v.clone() for k, v in model.state_dict().items()}
        mgr.save(step, blocking=False)  # waits for the previous one, reuses its buffers
    mgr.close()
    for step in (1, 2, 3):
        m2, model2, *_ = tiny_job(tmp_path, seed=11)
        m2.restore(path=tmp_path / f"step-{step:010d}")
        for k, v in model2.state_dict().items():
            assert torch.equal(v, states[step][k]), (step, k)


def _run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO / 'tests')!r})
        from helpers import tiny_job, train_step
        """
    ) + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


def test_clean_exit_flushes_the_async_save(tmp_path):
    proc = _run_script(tmp_path, f"""
        mgr, model, opt, sched, cursor = tiny_job({str(tmp_path / 'ckpt')!r})
        train_step(model, opt, sched, cursor)
        mgr.save(1, blocking=False)
        # no close(): the interpreter must still finish the save before exiting
    """)
    assert proc.returncode == 0, proc.stderr
    assert latest_complete(tmp_path / "ckpt", "full").checkpoint.step == 1


def test_kill_during_background_save_leaves_previous_latest(tmp_path):
    proc = _run_script(tmp_path, f"""
        import os, signal
        def die(step, rel):
            if rel.endswith('.distcp') and step == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        mgr, model, opt, sched, cursor = tiny_job({str(tmp_path / 'ckpt')!r}, after_file=die)
        for step in (1, 2):
            train_step(model, opt, sched, cursor)
            mgr.save(step, blocking=False)
        mgr.close()
    """)
    assert proc.returncode == -9
    root = tmp_path / "ckpt"
    assert latest_complete(root, "full").checkpoint.step == 1
    assert [p.name[:21] for p in in_flight(root)] == [".tmp-step-0000000002-"]


# ----------------------------------------------------------------- disk faults

@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB tmpfs: ENOSPC comes from the kernel, not from a mock."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path, leave: int) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with open(filler, "r+b") as f:
        f.truncate(filler.stat().st_size - leave)
    return filler


def test_enospc_during_save_keeps_previous_latest(small_disk):
    root = small_disk / "ckpt"
    mgr, model, opt, sched, cursor = tiny_job(root)
    train_step(model, opt, sched, cursor)
    first = mgr.save(1)
    size = first.bytes
    filler = fill(small_disk, leave=size // 2)  # room for about half a checkpoint
    train_step(model, opt, sched, cursor)
    with pytest.raises(CheckpointSaveError, match="No space left"):
        mgr.save(2)
    assert latest_complete(root, "full").checkpoint.step == 1
    assert in_flight(root) == [] and [c.step for c in candidates(root)] == [1]
    filler.unlink()  # space is back: the next save works
    assert mgr.save(2).step == 2
    assert latest_complete(root, "full").checkpoint.step == 2


def test_enospc_in_async_save_is_reported_by_wait(small_disk):
    root = small_disk / "ckpt"
    mgr, model, opt, sched, cursor = tiny_job(root)
    train_step(model, opt, sched, cursor)
    size = mgr.save(1).bytes
    fill(small_disk, leave=size // 3)
    train_step(model, opt, sched, cursor)
    mgr.save(2, blocking=False)
    with pytest.raises(CheckpointSaveError, match="No space left"):
        mgr.wait()
    assert latest_complete(root, "full").checkpoint.step == 1


def test_eio_during_shard_write_keeps_previous_latest(tmp_path, monkeypatch):
    mgr, model, opt, sched, cursor = tiny_job(tmp_path)
    train_step(model, opt, sched, cursor)
    mgr.save(1)
    real_write = HashingFile.write

    def failing_write(self, data):
        if self.path.suffix == ".distcp" and self.size > 1000:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real_write(self, data)

    monkeypatch.setattr(HashingFile, "write", failing_write)
    train_step(model, opt, sched, cursor)
    with pytest.raises(CheckpointSaveError, match="Input/output error") as exc:
        mgr.save(2)
    assert isinstance(exc.value, Exception)  # DCP's BaseException was wrapped
    monkeypatch.undo()
    assert latest_complete(tmp_path, "full").checkpoint.step == 1
    assert in_flight(tmp_path) == []


def test_preferred_checkpoint_that_fails_falls_back_to_discovery(tmp_path):
    make_checkpoints(tmp_path, steps=(1, 2, 3))
    shard = max((tmp_path / "step-0000000003").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[7] ^= 1
    shard.write_bytes(bytes(data))
    mgr, *_ = tiny_job(tmp_path, seed=4)
    res = mgr.restore(prefer="step-0000000003")  # the supervisor's (fast-verified) pick is corrupt
    assert res.step == 2 and [s.name for s in res.skipped] == ["step-0000000003"]
    mgr2, *_ = tiny_job(tmp_path, seed=4)
    assert mgr2.restore(prefer="step-0000000001").step == 1  # a good preference is honoured
    mgr3, *_ = tiny_job(tmp_path, seed=4)
    assert mgr3.restore(prefer="step-0000000099").step == 2  # a missing one is skipped
    with pytest.raises(CheckpointLoadError, match="checksum"):
        tiny_job(tmp_path, seed=4)[0].restore(path=tmp_path / "step-0000000003")  # explicit: no fallback


def test_background_copy_holds_the_next_optimizer_step_until_done(tmp_path, monkeypatch):
    from supervisor.checkpoint import CheckpointManager

    real_stage = CheckpointManager._stage

    def slow_stage(self, state, prefix=""):
        if not prefix:
            import time as _t

            _t.sleep(0.4)  # a slow copy: training must not run ahead of it
        return real_stage(self, state, prefix)

    monkeypatch.setattr(CheckpointManager, "_stage", slow_stage)
    mgr, model, opt, sched, cursor = tiny_job(tmp_path)
    train_step(model, opt, sched, cursor)
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    fut = mgr.save(1, blocking=False)
    assert fut.done() is False  # returned before the copy
    train_step(model, opt, sched, cursor)  # its optimizer.step() waits for the copy
    fut.result()
    mgr2, model2, *_ = tiny_job(tmp_path, seed=3)
    mgr2.restore()
    for k, v in model2.state_dict().items():
        assert torch.equal(v, at_save[k]), k


def test_restore_reads_whole_tensors_straight_into_place(tmp_path, monkeypatch):
    """The fast path (no temporary tensor) is taken for whole contiguous tensors, DCP's own
    path for the rest (0-dim optimizer steps here), and the result is exact either way."""
    from supervisor.checkpoint.dcp_io import ManifestReader

    mgr, model, opt, sched, cursor = tiny_job(tmp_path)
    for _ in range(2):
        train_step(model, opt, sched, cursor)
    mgr.save(2)
    expected_params, expected_opt = snapshot(model, opt)
    counts = {}
    real = ManifestReader.read_data

    def spy(self, plan, planner):
        out = real(self, plan, planner)
        counts.update(direct=self.direct_reads, fallback=self.fallback_reads)
        return out

    monkeypatch.setattr(ManifestReader, "read_data", spy)
    mgr2, model2, opt2, *_ = tiny_job(tmp_path, seed=8)
    mgr2.restore()
    assert counts["direct"] == 4 + 8 and counts["fallback"] == 4  # params + exp_avg(_sq); the 4 'step' scalars
    params, opt_state = snapshot(model2, opt2)
    assert all(torch.equal(params[k], v) for k, v in expected_params.items()) and opt_state == expected_opt
