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

from helpers import flip_inside_tensor, make_checkpoints, tiny_job, train_step
from supervisor.checkpoint import CheckpointLoadError, latest_complete, prune, read_manifest
from supervisor.checkpoint.checksum import hash_file
from supervisor.checkpoint.discovery import candidates


def name(step: int) -> str:
    return f"step-{step:010d}"


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)




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


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_reduce_payload_in_a_non_tensor_entry_never_runs_and_the_older_checkpoint_wins(tmp_path, level):
    # DCP stores non-tensor state (the optimizer's param_groups) as pickles that its planner
    # loads with weights_only=False: a writer of the root could hide code there
    root, marker = tmp_path / "ckpt", tmp_path / "pwned"
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    at = {}
    for step in (1, 2, 3):
        train_step(model, opt, sched, cursor)
        if step == 3:  # an entry every restore reads; pickled at save time, never run
            opt.param_groups[0]["weight_decay"] = _RunsCommand(marker)
        mgr.save(step)
        at[step] = params(model)
    assert not marker.exists()
    fresh, model2, *_ = tiny_job(root, seed=5, verify_on_restore=level)
    res = fresh.restore()
    assert not marker.exists(), "a non-tensor entry ran code on restore"
    assert res.step == 2 and [s.name for s in res.skipped] == [name(3)]
    assert "would run code" in res.skipped[0].reason and "refused without running it" in res.skipped[0].reason
    assert same(params(model2), at[2])


def test_checkpoint_root_is_created_private(tmp_path):
    old = os.umask(0o022)  # the usual umask: a plain mkdir would make the root world-readable
    try:
        mgr, model, opt, sched, cursor = tiny_job(tmp_path / "jobs" / "ckpt")
        train_step(model, opt, sched, cursor)
        mgr.save(1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "jobs" / "ckpt").st_mode) == 0o700


# ----------------------------------------------------------------- retention

def test_prune_keeps_the_only_fully_good_checkpoint_behind_two_bit_rotted_newer_ones(tmp_path):
    root = tmp_path / "ckpt"
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    for step in (1, 2, 3):
        train_step(model, opt, sched, cursor)
        mgr.save(step)
        if step > 1:
            flip_inside_tensor(root / name(step), model[0].weight)  # sizes intact: fast checks pass
    assert latest_complete(root, "fast").checkpoint.step == 3
    result = prune(root, keep=2)
    assert result.removed == []
    assert [c.name for c in candidates(root)] == [name(3), name(2), name(1)]
    assert sorted(f.name for f in result.failed) == [name(2), name(3)]
    assert all("checksum" in f.reason for f in result.failed) and result.verified == [name(1)]
    assert latest_complete(root, "full").checkpoint.step == 1


def test_prune_counts_vouched_names_without_hashing_and_never_counts_known_bad_ones(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3, 4), keep=10)
    # step 3 is known bad to the caller (it refused it): kept, not counted, so 2 counts instead
    result = prune(root, keep=2, known_bad={name(3)}, dry_run=True)
    assert result.removed == [name(1)] and [f.name for f in result.failed] == [name(3)]
    # a vouched name is taken as verified without its checksums being read: a flipped bit in
    # it is not noticed (the caller's promise), and it counts toward keep
    shard = max((root / name(4)).glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    vouched = prune(root, keep=2, verified={name(4)}, dry_run=True)
    assert vouched.removed == [name(2), name(1)] and vouched.verified == [name(3)]
    unvouched = prune(root, keep=2, dry_run=True)
    assert [f.name for f in unvouched.failed] == [name(4)] and unvouched.removed == [name(1)]


def test_prune_never_removes_a_protected_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3, 4), keep=10)
    result = prune(root, keep=2, protect={name(1)})  # e.g. the supervisor's restore point
    assert result.removed == [name(2)] and name(1) in result.kept
    assert [c.name for c in candidates(root)] == [name(4), name(3), name(1)]


@pytest.mark.parametrize("fault", ["bit-rot", "forged-metadata"])
def test_the_jobs_own_pruning_keeps_the_checkpoint_it_restored_past_a_bad_newest(tmp_path, fault):
    """A restore skipped step 3 and loaded step 2; the next save's pruning (keep=2) must not
    delete step 2. With forged metadata, step 3's checksums all match (the manifest was
    rewritten too): only the restore's own refusal says it is bad."""
    root = tmp_path / "ckpt"
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    for step in (1, 2, 3):
        train_step(model, opt, sched, cursor)
        mgr.save(step)
    if fault == "bit-rot":
        flip_inside_tensor(root / name(3), model[0].weight)
    else:
        forge_metadata(root / name(3), metadata_reading_outside(tmp_path)[0])
    mgr2, model2, opt2, sched2, cursor2 = tiny_job(root, seed=9, keep=2)
    res = mgr2.restore()
    assert res.step == 2 and [s.name for s in res.skipped] == [name(3)]
    at_restore = params(model2)
    train_step(model2, opt2, sched2, cursor2)
    saved = mgr2.save(3).path
    left = [c.name for c in candidates(root)]
    assert left == [saved.name, name(3), name(2)], left  # step 3 kept as evidence; step 1 pruned
    mgr3, model3, *_ = tiny_job(root, seed=4)
    assert mgr3.restore(path=root / name(2)).step == 2 and same(params(model3), at_restore)


def test_prune_leaves_a_symlinked_in_flight_directory_alone(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3), keep=10)
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "data.bin").write_bytes(b"x" * 100)
    (victim / "OWNER.json").write_text(json.dumps(  # looks like a dead writer's leftovers
        {"host": os.uname().nodename, "pid": 2**22 + 12345, "attempt": 0, "created_unix": 0.0}))
    link = root / ".tmp-step-0000000004-abcdef"
    os.symlink(victim, link)
    result = prune(root, keep=2, remove_partial=True, partial_grace_s=0)
    assert [s.name for s in result.skipped] == [link.name] and "symlink" in result.skipped[0].reason
    assert result.removed_partial == [] and result.removed == [name(1)]
    assert link.is_symlink() and (victim / "data.bin").read_bytes() == b"x" * 100


def test_the_jobs_own_pruning_never_counts_the_supervisors_suspects(tmp_path):
    root = tmp_path / "ckpt"
    three_steps(root)  # step 3 verifies in full, but the supervisor holds it suspect
    mgr, model, opt, sched, cursor = tiny_job(root, seed=5, keep=2)
    assert mgr.restore(exclude=[name(3)]).step == 2
    train_step(model, opt, sched, cursor)
    mgr.save(3)  # published as step-3's next generation
    left = [c.name for c in candidates(root)]
    # counted toward keep=2: the new save and step 2, the checkpoint this job restored from;
    # the suspect stays as evidence and step 1 goes
    assert name(2) in left and name(3) in left and name(1) not in left, left


# ----------------------------------------------------------------- never from scratch (issue 13 §1)

def rot_rng(ckpt: Path) -> None:
    """Bit rot in a small checksummed file: found by full verification before any tensor loads."""
    f = sorted((ckpt / "rng").iterdir())[0]
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("rot", ["rng", "tensor"])
def test_a_required_restore_with_every_checkpoint_corrupt_raises_with_the_reasons(tmp_path, rot):
    root = tmp_path / "ckpt"
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    for step in (1, 2):
        train_step(model, opt, sched, cursor)
        mgr.save(step)
        if rot == "rng":
            rot_rng(root / name(step))
        else:  # found only while loading: some tensors already hold its bytes
            flip_inside_tensor(root / name(step), model[0].weight)
    fresh, model2, *_ = tiny_job(root, seed=7)
    before = params(model2)
    with pytest.raises(CheckpointLoadError) as exc:
        fresh.restore(required=True)
    assert [s.name for s in exc.value.skipped] == [name(2), name(1)]
    assert all("checksum" in s.reason for s in exc.value.skipped)
    if rot == "rng":
        assert "refusing to train from scratch" in exc.value.reason
        assert same(params(model2), before)  # nothing was loaded
        # not required (the job never had a checkpoint): a fresh start, with nothing loaded
        assert tiny_job(root, seed=8)[0].restore() is None
