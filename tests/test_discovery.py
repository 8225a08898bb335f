"""The corruption matrix on real checkpoints: every case falls back or fails with its reason."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from helpers import make_checkpoints, tiny_job, train_step
from supervisor.checkpoint import (
    NoCheckpointError,
    UnsafePathError,
    VerificationError,
    latest_complete,
    prune,
    read_manifest,
    require_latest,
    verify,
)
from supervisor.checkpoint.discovery import candidates


@pytest.fixture
def root(tmp_path) -> Path:
    make_checkpoints(tmp_path / "ckpt", steps=(1, 2, 3), keep=10)
    return tmp_path / "ckpt"


def newest(root: Path) -> Path:
    return root / "step-0000000003"


def biggest_shard(ckpt: Path) -> Path:
    return max(ckpt.glob("*.distcp"), key=lambda p: p.stat().st_size)


def rewrite_manifest(ckpt: Path, mutate) -> None:
    d = json.loads((ckpt / "manifest.json").read_text())
    mutate(d)
    (ckpt / "manifest.json").write_text(json.dumps(d))


def assert_falls_back(root: Path, reason: str, level="fast") -> None:
    found = latest_complete(root, level)
    assert found.checkpoint is not None and found.checkpoint.step == 2, found.explain()
    assert [s.name for s in found.skipped] == ["step-0000000003"]
    assert reason in found.skipped[0].reason, found.skipped[0].reason


def test_clean_root_picks_newest_at_both_levels(root):
    for level in ("fast", "full"):
        found = latest_complete(root, level)
        assert found.checkpoint.step == 3 and found.skipped == []


def test_truncated_manifest(root):
    data = (newest(root) / "manifest.json").read_bytes()
    (newest(root) / "manifest.json").write_bytes(data[: len(data) // 2])
    assert_falls_back(root, "not valid JSON")


def test_garbled_manifest(root):
    (newest(root) / "manifest.json").write_bytes(os.urandom(300))
    assert_falls_back(root, "not valid JSON")


def test_missing_manifest(root):
    (newest(root) / "manifest.json").unlink()
    assert_falls_back(root, "no manifest")


def test_complete_manifest_but_shard_missing(root):
    biggest_shard(newest(root)).unlink()
    assert_falls_back(root, "is missing")


def test_complete_manifest_but_shard_short(root):
    shard = biggest_shard(newest(root))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 7)
    assert_falls_back(root, "truncated")


def test_flipped_bit_is_caught_by_full_verification_only(root):
    shard = biggest_shard(newest(root))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    assert latest_complete(root, "fast").checkpoint.step == 3  # sizes still match
    assert_falls_back(root, "checksum", level="full")


def test_corrupt_rng_file_is_caught(root):
    f = newest(root) / "rng" / "rank-00000.json"
    data = bytearray(f.read_bytes())
    data[10] ^= 1
    f.write_bytes(bytes(data))
    assert_falls_back(root, "checksum", level="full")


def test_unknown_format_version(root):
    rewrite_manifest(newest(root), lambda d: d.update(format_version=7))
    assert_falls_back(root, "unknown manifest format_version 7")


@pytest.mark.parametrize("escape", ["../step-0000000002/.metadata", "/etc/hostname"])
def test_manifest_entry_escaping_the_directory(root, escape):
    def mutate(d):
        d["checksums"]["files"][escape] = {"size": 1, "digest": "0" * 32}

    rewrite_manifest(newest(root), mutate)
    assert_falls_back(root, "escapes" if escape.startswith("..") else "absolute")


def test_symlinked_shard_is_refused(root, tmp_path):
    shard = biggest_shard(newest(root))
    outside = tmp_path / "outside.bin"
    shutil.move(shard, outside)
    os.symlink(outside, shard)  # same bytes, same size: only the symlink check can catch it
    assert_falls_back(root, "symlink")
    with pytest.raises(UnsafePathError):
        verify(newest(root), "full")


def test_symlinked_subdirectory_is_refused(root, tmp_path):
    rng = newest(root) / "rng"
    shutil.move(rng, tmp_path / "rng-outside")
    os.symlink(tmp_path / "rng-outside", rng)
    assert_falls_back(root, "symlink")


def test_symlinked_checkpoint_directory_is_refused(root, tmp_path):
    shutil.move(newest(root), tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", newest(root))
    assert_falls_back(root, "symlink")


def test_renamed_directory_cannot_masquerade_as_a_newer_step(root):
    shutil.copytree(root / "step-0000000001", root / "step-0000000009")
    found = latest_complete(root, "fast")
    assert found.checkpoint.step == 3
    assert "name says step 9" in found.skipped[0].reason


def test_partial_and_dot_directories_are_never_candidates(root):
    shutil.copytree(newest(root), root / ".tmp-step-0000000004-abcdef")
    (root / ".tmp-step-0000000004-abcdef" / "manifest.json").unlink()
    (root / "unrelated").mkdir()
    assert [c.name for c in candidates(root)][0] == "step-0000000003"
    assert latest_complete(root).checkpoint.step == 3


def test_every_checkpoint_bad_means_none_and_all_reasons(root):
    for c in candidates(root):
        (c.path / "manifest.json").write_text("{")
    found = latest_complete(root, "full")
    assert found.checkpoint is None and len(found.skipped) == 3
    with pytest.raises(NoCheckpointError) as exc:
        require_latest(root)
    assert len(exc.value.skipped) == 3


def test_never_answers_nothing_while_an_old_good_one_exists(root):
    for name in ("step-0000000003", "step-0000000002"):
        biggest_shard(root / name).unlink()
    found = latest_complete(root, "full")
    assert found.checkpoint.step == 1 and len(found.skipped) == 2


def test_empty_or_missing_root(tmp_path):
    assert latest_complete(tmp_path / "nope").checkpoint is None
    assert latest_complete(tmp_path).checkpoint is None


def test_verify_reports_the_reason(root):
    biggest_shard(newest(root)).unlink()
    with pytest.raises(VerificationError, match="missing"):
        verify(newest(root))
    assert read_manifest(newest(root)).global_step == 3  # the manifest itself is fine


# ----------------------------------------------------------------- retention

def test_prune_keeps_k_newest(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3, 4, 5), keep=10)
    result = prune(root, keep=2)
    assert sorted(result.removed) == ["step-0000000001", "step-0000000002", "step-0000000003"]
    assert [c.step for c in candidates(root)] == [5, 4]


def test_a_new_releases_saves_never_prune_the_last_checkpoint_its_predecessor_can_read(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2), keep=10, release="v1aaaaaaaaaa")
    mgr, model, opt, sched, cursor = tiny_job(root, keep=2, release="v2bbbbbbbbbb")
    for step in range(1, 6):
        train_step(model, opt, sched, cursor)
        if step >= 3:
            mgr.save(step)
    # keep=2 of v2's own, and v1's newest (a rollback to v1 resumes from it); v1's older one goes
    assert [c.step for c in candidates(root)] == [5, 4, 2]
    assert json.loads((root / "step-0000000002" / "manifest.json").read_text())["release"] == "v1aaaaaaaaaa"
    assert json.loads((root / "step-0000000005" / "manifest.json").read_text())["release"] == "v2bbbbbbbbbb"
    # without a release of its own, retention is by count alone, as before
    assert prune(root, keep=2).removed == ["step-0000000002"]


def test_prune_refuses_keep_below_two(root):
    with pytest.raises(ValueError, match="at least 2"):
        prune(root, keep=1)


def test_prune_never_deletes_newest_verified_or_bad_ones(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3, 4, 5), keep=10)
    for name in ("step-0000000005", "step-0000000004"):
        (root / name / "manifest.json").write_text("garbage")
    result = prune(root, keep=2)
    left = [c.name for c in candidates(root)]
    # the two bad ones stay (evidence), the two newest good ones stay, step 1 goes
    assert left == ["step-0000000005", "step-0000000004", "step-0000000003", "step-0000000002"]
    assert result.removed == ["step-0000000001"]
    assert latest_complete(root).checkpoint.step == 3


def test_prune_leaves_saves_in_flight(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3), keep=10)
    live = root / ".tmp-step-0000000004-aaaa"
    live.mkdir()
    (live / "OWNER.json").write_text(json.dumps(
        {"host": os.uname().nodename, "pid": os.getpid(), "attempt": 0, "created_unix": time.time()}))
    dead = root / ".tmp-step-0000000004-bbbb"
    dead.mkdir()
    (dead / "OWNER.json").write_text(json.dumps(
        {"host": os.uname().nodename, "pid": 2**22 + 12345, "attempt": 0, "created_unix": time.time()}))
    result = prune(root, keep=2, remove_partial=True)
    assert live.exists(), "a save whose writer is alive must never be removed"
    assert not dead.exists() and result.removed_partial == [dead.name]


def test_dry_run_removes_nothing(tmp_path):
    root = tmp_path / "ckpt"
    make_checkpoints(root, steps=(1, 2, 3), keep=10)
    result = prune(root, keep=2, dry_run=True)
    assert result.removed == ["step-0000000001"]
    assert len(candidates(root)) == 3
