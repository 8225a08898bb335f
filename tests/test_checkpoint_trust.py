"""Issue 11, checkpoint library: durability before publication, what a writer of the checkpoint
root can make a restore do (nothing: no code runs, no byte from outside loads), and retention
that never deletes the newest checkpoint whose checksums hold. Real checkpoints, real faults."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import stat
from pathlib import Path

import pytest
import torch

from helpers import make_checkpoints, tiny_job, train_step
from supervisor.checkpoint import CheckpointLoadError, latest_complete, prune, read_manifest
from supervisor.checkpoint.checksum import hash_file
from supervisor.checkpoint.discovery import candidates


def name(step: int) -> str:
    return f"step-{step:010d}"


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def flip_inside_tensor(ckpt: Path, tensor: torch.Tensor) -> None:
    """Bit rot: one byte in the middle of ``tensor``'s raw bytes; every size stays the same."""
    raw = tensor.detach().contiguous().numpy().tobytes()
    for shard in ckpt.glob("*.distcp"):
        data = bytearray(shard.read_bytes())
        at = data.find(raw)
        if at >= 0:
            data[at + len(raw) // 2] ^= 0x01
            shard.write_bytes(bytes(data))
            return
    raise AssertionError("tensor bytes not found in any shard")


def forge_metadata(ckpt: Path, payload: bytes) -> None:
    """What a writer of the root can do: replace .metadata and make the (unkeyed) manifest agree."""
    (ckpt / ".metadata").write_bytes(payload)
    m = json.loads((ckpt / "manifest.json").read_text())
    size, digest = hash_file(ckpt / ".metadata", m["checksums"]["algorithm"])
    m["checksums"]["files"][".metadata"] = {"size": size, "digest": digest}
    (ckpt / "manifest.json").write_text(json.dumps(m))


def three_steps(root: Path) -> dict[int, dict]:
    """Checkpoints of steps 1, 2, 3 under ``root`` and the model's parameters at each."""
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    at = {}
    for step in (1, 2, 3):
        train_step(model, opt, sched, cursor)
        mgr.save(step)
        at[step] = params(model)
    return at


def metadata_reading_outside(tmp_path: Path) -> tuple[bytes, dict]:
    """A real DCP .metadata of another job whose storage paths lead to ``tmp_path/outside``
    (two levels up from ``tmp_path/ckpt/step-N``), and that job's parameters."""
    src = tmp_path / "other-job"
    mgr, model, opt, sched, cursor = tiny_job(src, seed=123)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)  # unmistakable
    mgr.save(1)
    outside = tmp_path / "outside"
    outside.mkdir()
    md = pickle.loads((src / name(1) / ".metadata").read_bytes())  # our own trusted file, in the test
    for shard in (src / name(1)).glob("*.distcp"):
        (outside / shard.name).write_bytes(shard.read_bytes())
    md.storage_data = {k: dataclasses.replace(v, relative_path=f"../../outside/{v.relative_path}")
                       for k, v in md.storage_data.items()}
    return pickle.dumps(md), params(model)


# ----------------------------------------------------------------- durability

def test_every_listed_file_is_fsynced_with_all_its_bytes_before_the_manifest(tmp_path, monkeypatch):
    """DCP fsyncs .metadata.tmp through fileno() before its buffered writer flushed: when the
    pickle's last write is smaller than the file's buffer (st_blksize: 4 KiB on ext4/tmpfs,
    MiBs on Lustre/GPFS, where it is every time), that fsync covered an empty file. Record, at
    each fsync, which file it was and how many of its bytes the kernel had; every file the
    manifest lists must have had an fsync covering all its bytes before the manifest's own."""
    events: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        events.append((os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
        return real_fsync(fd)

    from supervisor.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp_path, model=torch.nn.Linear(4, 4), io_threads=2)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    published = mgr.save(1).path
    monkeypatch.undo()

    def rel(path: str) -> str | None:
        head, sep, tail = path.partition("/.tmp-step-0000000001-")
        if not sep or "/" not in tail:
            return None
        r = tail.split("/", 1)[1]
        return r[: -len(".tmp")] if r == ".metadata.tmp" else r

    named = [(rel(p), size) for p, size in events]
    at_manifest = next(i for i, (r, _) in enumerate(named) if r == "manifest.json")
    listed = read_manifest(published).files
    assert listed[".metadata"].size < os.stat(published / ".metadata").st_blksize  # the case that was lost
    assert any(r.endswith(".distcp") for r in listed) and any(r.startswith("rng/") for r in listed)
    for r, entry in listed.items():
        covered = [size for n, size in named[:at_manifest] if n == r]
        assert entry.size in covered, f"{r}: fsynced at sizes {covered}, but it has {entry.size} bytes"


# ----------------------------------------------------------------- trust

@pytest.mark.parametrize("level", ["fast", "full"])
def test_metadata_naming_files_outside_the_checkpoint_is_refused(tmp_path, level):
    at = three_steps(tmp_path / "ckpt")
    payload, outside_params = metadata_reading_outside(tmp_path)
    forge_metadata(tmp_path / "ckpt" / name(3), payload)
    mgr, model, *_ = tiny_job(tmp_path / "ckpt", seed=5, verify_on_restore=level)
    res = mgr.restore()
    assert res.step == 2 and [s.name for s in res.skipped] == [name(3)]
    assert "../../outside/" in res.skipped[0].reason and "does not list" in res.skipped[0].reason
    assert same(params(model), at[2]) and not same(params(model), outside_params)
    # asked for exactly that checkpoint: an error with the reason, never the outside bytes
    mgr2, model2, *_ = tiny_job(tmp_path / "ckpt", seed=5, verify_on_restore=level)
    before = params(model2)
    with pytest.raises(CheckpointLoadError, match="does not list"):
        mgr2.restore(path=tmp_path / "ckpt" / name(3))
    assert same(params(model2), before)


class _RunsCommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _ExecsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


@pytest.mark.parametrize("payload", [_RunsCommand, _ExecsCode])
@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_reduce_payload_in_metadata_never_runs_and_the_older_checkpoint_wins(tmp_path, level, payload):
    at = three_steps(tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    forge_metadata(tmp_path / "ckpt" / name(3), pickle.dumps(payload(marker)))
    mgr, model, *_ = tiny_job(tmp_path / "ckpt", seed=5, verify_on_restore=level)
    res = mgr.restore()
    assert not marker.exists(), "the crafted pickle ran code"
    assert res.step == 2 and [s.name for s in res.skipped] == [name(3)]
    reason = res.skipped[0].reason
    assert "refused without running it" in reason and ("system" in reason or "exec" in reason), reason
    assert same(params(model), at[2])


def test_checkpoint_root_is_created_private(tmp_path):
    old = os.umask(0o022)  # the usual umask: a plain mkdir would make the root world-readable
    try:
        mgr, model, opt, sched, cursor = tiny_job(tmp_path / "jobs" / "ckpt")
        train_step(model, opt, sched, cursor)
        mgr.save(1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "jobs" / "ckpt").st_mode) == 0o700
