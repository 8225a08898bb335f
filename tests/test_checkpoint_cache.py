"""Checkpoint discovery for the controller (issue 24, item 3): fast verification remembered by
directory name (supervisor.checkpoint.cache.VerifiedCache), so that a poll verifies only what is
new or changed, with the same answers as latest_complete; and the controller runs it off its
event loop."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path

from supervisor.checkpoint import latest_complete
from supervisor.checkpoint.cache import VerifiedCache
from supervisor.checkpoint.discovery import checkpoint_name
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from supervisor.config import from_dict
from supervisor.controller.daemon import Controller
from supervisor.platforms.base import NodeState, NodeStatus, Platform


def publish(root: Path, step: int, *, broken: bool = False, generation: int = 0) -> Path:
    """A published checkpoint as the fast checks see it: a manifest listing a DCP .metadata file
    (``broken``: the manifest says it is longer than it is, as after a truncation)."""
    d = root / checkpoint_name(step, generation)
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"m" * 16)
    m = Manifest(global_step=step, writer_world_size=1, checksum_algorithm="sha256",
                 files={".metadata": FileEntry(17 if broken else 16, "ab" * 32)}, created_unix=1000.0 + step)
    (d / MANIFEST_NAME).write_bytes(m.to_bytes())
    return d


def test_a_poll_verifies_only_what_is_new_or_changed(tmp_path):
    root = tmp_path / "ckpt"
    for step in range(1, 41):
        publish(root, step, broken=step in (39, 40))
    cache = VerifiedCache()
    first = cache.scan(root, usable=True)
    assert first.verified == 40 and first.discovery.checkpoint.step == 38
    assert [s.name for s in first.discovery.skipped] == [checkpoint_name(40), checkpoint_name(39)]
    assert first.usable == [checkpoint_name(s) for s in range(38, 0, -1)]
    again = cache.scan(root, usable=True)
    assert again.verified == 0 and again.usable == first.usable and again.discovery == first.discovery
    publish(root, 41)
    newer = cache.scan(root)
    assert newer.verified == 1 and newer.discovery.checkpoint.step == 41
    # a manifest replaced (a new inode, as any rewrite by rename makes): verified again, and its new verdict kept
    d = root / checkpoint_name(20)
    m = (d / MANIFEST_NAME).read_bytes()
    (d / "m.tmp").write_bytes(m.replace(b'"size": 16', b'"size": 99'))
    os.replace(d / "m.tmp", d / MANIFEST_NAME)
    changed = cache.scan(root, usable=True)
    assert changed.verified == 1 and checkpoint_name(20) not in changed.usable
    # a directory removed and published again under the same name: a new directory, verified again
    for p in sorted((root / checkpoint_name(41)).iterdir()):
        p.unlink()
    (root / checkpoint_name(41)).rmdir()
    publish(root, 41, broken=True)
    republished = cache.scan(root)
    assert republished.verified == 1 and republished.discovery.checkpoint.step == 38
    # names gone from the root are forgotten
    for step in range(1, 11):
        for p in sorted((root / checkpoint_name(step)).iterdir()):
            p.unlink()
        (root / checkpoint_name(step)).rmdir()
    cache.scan(root, usable=True)
    assert len(cache) == 31


def test_the_cache_answers_as_latest_complete_does(tmp_path):
    rng = random.Random(7)
    root = tmp_path / "ckpt"
    cache = VerifiedCache()
    made = 0
    for round_ in range(12):
        for _ in range(rng.randint(0, 4)):
            made += 1
            publish(root, made, broken=rng.random() < 0.4)
        (root / f".tmp-step-{made + 1:010d}-ab12").mkdir(exist_ok=True)  # a save in flight is no candidate
        names = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
        exclude = set(rng.sample(names, k=min(len(names), rng.randint(0, 2))))
        want = latest_complete(root, "fast", exclude=exclude)
        got = cache.scan(root, exclude=exclude, usable=round_ % 2 == 0).discovery
        assert (got.checkpoint and got.checkpoint.name) == (want.checkpoint and want.checkpoint.name), round_
        assert got.skipped == want.skipped, round_


class OneNode(Platform):
    """One slot; the node it launches exits 0 at once (a command that never sends a heartbeat)."""

    kind = "one"

    def __init__(self):
        self.launched: list = []

    async def launch(self, spec) -> None:
        self.launched.append(spec)

    async def observe(self):
        return {"node0": NodeStatus("node0", s.attempt, NodeState.EXITED, 0) for s in self.launched[-1:]}

    async def kill_node(self, name: str) -> None: ...

    async def teardown(self, grace_s: float) -> None: ...

    def slots(self):
        return ["node0"]


def test_the_controller_looks_at_its_checkpoints_off_the_loop_and_answers_meanwhile(tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    for step in (1, 2, 3):
        publish(root, step)
    cfg = from_dict({"command": [sys.executable, "-c", "pass"], "job": "j", "log_dir": str(tmp_path / "logs"),
                     "checkpoint_dir": str(root), "metrics_linger_s": 0, "heartbeat": {"interval_s": 0.5, "timeout_s": 1.0}})
    platform = OneNode()
    c = Controller(cfg, platform)
    entered, release = threading.Event(), threading.Event()
    scanned_in: list[threading.Thread] = []
    real = VerifiedCache.scan

    def slow_scan(self, *a, **kw):  # the first look takes as long as the test says
        scanned_in.append(threading.current_thread())
        entered.set()
        assert release.wait(30)
        return real(self, *a, **kw)

    monkeypatch.setattr(VerifiedCache, "scan", slow_scan)
    answers: list[int] = []

    def probe():
        assert entered.wait(60), "no look at the checkpoints"
        for _ in range(10):  # the loop answers while the look is under way
            with urllib.request.urlopen(f"http://127.0.0.1:{c.http_port}/healthz", timeout=5) as resp:
                answers.append(resp.status)
        release.set()

    prober = threading.Thread(target=probe)
    prober.start()
    loop_thread = threading.current_thread()
    t0 = time.monotonic()
    code = asyncio.run(c.run())
    prober.join(30)
    assert answers == [200] * 10
    assert code == 0 and time.monotonic() - t0 < 60
    assert scanned_in and all(t is not loop_thread for t in scanned_in)
    # and what the look found was used: the launch resumes from the newest checkpoint
    assert platform.launched[0].env and c.restore_from == checkpoint_name(3)
