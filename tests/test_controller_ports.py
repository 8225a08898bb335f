"""Issue 13 §5: the controller's ports on a restart over a saved state. The HTTP port given wins;
a saved HTTP port another process holds is replaced; the heartbeat port an adopted gang sends to
must be had, and when another process holds it the controller says so and leaves the gang alone.
Real sockets hold the ports; the controller runs whole (Controller.run) on a platform that
launches nothing."""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import pytest

from supervisor.config import from_dict
from supervisor.controller.daemon import Controller
from supervisor.controller.state import STATE_FILE, StateError, load, save
from supervisor.platforms.base import NodeStatus, Platform

SAVED = {"job": "j", "phase": "running", "attempt": 4, "nodes": ["node0"], "restore_from": None,
         "history": {"restarts": 4}, "intake_port": 0, "http_port": 0, "http_host": "127.0.0.1",
         "platform": {"nodes": {}}, "pid": 1, "updated": 1.0}


class Recording(Platform):
    """No slots (a relaunch stops at once: no capacity); ``adopts``: whether a live gang is found.
    Every call that would touch a gang is recorded."""

    kind = "none"

    def __init__(self, adopts: bool):
        self.adopts = adopts
        self.calls: list[str] = []

    async def adopt(self, saved, attempt) -> bool:
        self.calls.append("adopt")
        return self.adopts

    async def launch(self, spec) -> None:
        self.calls.append("launch")

    async def observe(self) -> dict[str, NodeStatus]:
        return {}

    async def kill_node(self, name: str) -> None:
        self.calls.append("kill_node")

    async def teardown(self, grace_s: float) -> None:
        self.calls.append("teardown")

    def slots(self) -> list[str]:
        return []


def job(tmp_path, http_port: int = 0):
    return from_dict({"command": [sys.executable, "-c", "pass"], "job": "j", "log_dir": str(tmp_path / "logs"),
                      "checkpoint_dir": str(tmp_path / "ckpt"), "http": {"port": http_port},
                      "metrics_linger_s": 0})


def saved_state(tmp_path, **fields) -> None:
    (tmp_path / "logs").mkdir(exist_ok=True)
    save(tmp_path / "logs" / STATE_FILE, SAVED | fields)


def free_port(kind=socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def held(kind=socket.SOCK_STREAM) -> socket.socket:
    """A port another process holds (here: this test), on the controller's host."""
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    if kind == socket.SOCK_STREAM:
        s.listen()
    return s


def events(tmp_path) -> list[dict]:
    path = tmp_path / "logs" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_http_port_given_wins_over_the_saved_one(tmp_path):
    saved_port, given = free_port(), free_port()
    assert saved_port != given
    saved_state(tmp_path, http_port=saved_port)
    platform = Recording(adopts=False)
    asyncio.run(Controller(job(tmp_path, http_port=given), platform).run())
    assert load(tmp_path / "logs" / STATE_FILE)["http_port"] == given
    assert not [e for e in events(tmp_path) if e["event"] == "http_port_changed"]


def test_a_saved_http_port_another_process_holds_is_replaced_and_said(tmp_path):
    with held() as other:
        taken = other.getsockname()[1]
        saved_state(tmp_path, http_port=taken)
        asyncio.run(Controller(job(tmp_path), Recording(adopts=False)).run())
    port = load(tmp_path / "logs" / STATE_FILE)["http_port"]
    assert port not in (0, taken)
    changed = [e for e in events(tmp_path) if e["event"] == "http_port_changed"]
    assert len(changed) == 1 and changed[0]["old"] == taken


def test_a_given_http_port_that_is_taken_is_an_error_that_names_it(tmp_path):
    with held() as other:
        taken = other.getsockname()[1]
        platform = Recording(adopts=False)
        with pytest.raises(StateError, match=f"cannot serve HTTP on 127.0.0.1:{taken}"):
            asyncio.run(Controller(job(tmp_path, http_port=taken), platform).run())
    assert "launch" not in platform.calls


def test_a_taken_heartbeat_port_of_an_adopted_gang_is_refused_clearly_and_the_gang_left_alone(tmp_path):
    """The running gang's ranks send to the saved heartbeat port: the controller cannot replace
    it. It must say who to look for and what to do, and neither launch nor kill anything."""
    with held(socket.SOCK_DGRAM) as other:
        taken = other.getsockname()[1]
        saved_state(tmp_path, intake_port=taken)
        platform = Recording(adopts=True)
        with pytest.raises(StateError) as exc:
            asyncio.run(Controller(job(tmp_path), platform).run())
    says = str(exc.value)
    assert f"127.0.0.1:{taken}" in says and "another process holds it" in says
    assert f"sport = :{taken}" in says and "--fresh" in says
    assert platform.calls == ["adopt"]  # looked at, never launched, torn down or killed
    after = load(tmp_path / "logs" / STATE_FILE)
    assert (after["phase"], after["attempt"], after["intake_port"]) == ("running", 4, taken)  # the record stands
