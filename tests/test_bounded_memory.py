"""What a long job accumulates is bounded (issue 24, item 5): the Kubernetes watcher's memory of
gone pods, events.jsonl (archived beside it past a size cap, read whole by `supervisor status`),
the evidence folder (the oldest files go past a cap)."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

from helpers import no_platform
from supervisor import cli
from supervisor.config import from_dict
from supervisor.controller import daemon
from supervisor.controller.daemon import Controller
from supervisor.files import generations, prune_oldest, read_lines
from supervisor.platforms.kube.client import Watcher


def pod(name: str):
    return SimpleNamespace(metadata=SimpleNamespace(name=name, resource_version=None))


def test_the_watcher_remembers_only_the_newest_gone_objects(tmp_path):
    lists = {"n": 0}
    relisted = threading.Event()

    def list_pods(**_kw):  # every list a new gang of 3 pods: the previous ones went away
        n = lists["n"]
        lists["n"] += 1
        if n >= 8:
            relisted.set()
        # no resourceVersion: the watcher lists again instead of watching (each list a new gang)
        return SimpleNamespace(items=[pod(f"pod-{n}-{i}") for i in range(3)],
                               metadata=SimpleNamespace(resource_version=None))

    w = Watcher("pods", list_pods, deleted_kept=5)
    w.start(wait_s=10)
    try:
        assert relisted.wait(30), "the watcher did not list again"
    finally:
        w.stop()
    time.sleep(0.3)  # a list in flight when stop() came ends
    gone = list(w.deleted)
    assert len(gone) == 5  # 24+ pods went away; the newest 5 are remembered
    newest = max(int(name.split("-")[1]) for name in gone)
    assert all(w.gone(f"pod-{n}-{i}") is None for n in range(newest - 2) for i in range(3))
    assert w.gone(gone[-1]) is not None and gone[-1].startswith(f"pod-{newest}-")


def test_events_rotate_past_their_cap_and_status_still_finds_the_last_fault(tmp_path, monkeypatch):
    monkeypatch.setattr(daemon, "EVENTS_MAX_BYTES", 4096)
    monkeypatch.setattr(daemon, "EVENTS_KEPT", 3)
    cfg = from_dict({"command": ["true"], "job": "j", "log_dir": str(tmp_path / "logs"),
                     "checkpoint_dir": str(tmp_path / "ckpt")})
    (tmp_path / "logs").mkdir()
    c = Controller(cfg, no_platform())
    for i in range(200):
        c.event("tick", i=i, pad="x" * 100)
    c.event("fault_detected", attempt=3, kind="hang", ranks=[7], detail="rank 7 stuck in all_reduce")
    for i in range(200, 240):  # the fault's line is now in an archived generation
        c.event("tick", i=i, pad="x" * 100)
    path = tmp_path / "logs" / "events.jsonl"
    gens = generations(path)
    assert [g.name for g in gens] == ["events.jsonl.3", "events.jsonl.2", "events.jsonl.1", "events.jsonl"]
    assert not (tmp_path / "logs" / "events.jsonl.4").exists()
    assert all(g.stat().st_size < 4096 + 200 for g in gens)
    assert "fault_detected" not in path.read_text()
    import json

    ticks = [json.loads(line)["i"] for line in read_lines(path) if '"tick"' in line]
    assert ticks == list(range(ticks[0], 240)) and ticks[0] > 0  # the newest, in order, none lost between
    saved = {"job": "j", "phase": "failed", "attempt": 3, "run": 1}
    assert "last fault (attempt 3): hang ranks [7]: rank 7 stuck in all_reduce" in cli.render_final(saved, str(path.parent))


def test_the_evidence_folder_keeps_its_newest_files_under_the_cap(tmp_path):
    ev = tmp_path / "evidence"
    ev.mkdir()
    for i in range(10):
        f = ev / f"attempt-{i}-{1000 + i}-hang.json"
        f.write_bytes(b"x" * 1000)
        os.utime(f, ns=(i * 10**9, i * 10**9))
    (ev / ".attempt-9-1009-hang.json.ab12.tmp").write_bytes(b"y" * 5000)  # a write in flight is not touched
    removed = prune_oldest(ev, 4500, suffix=".json", keep=["attempt-0-1000-hang.json"])
    assert [p.name for p in removed] == [f"attempt-{i}-{1000 + i}-hang.json" for i in range(1, 7)]
    assert sorted(p.name for p in ev.iterdir() if not p.name.startswith(".")) == (
        ["attempt-0-1000-hang.json"] + [f"attempt-{i}-{1000 + i}-hang.json" for i in range(7, 10)])
