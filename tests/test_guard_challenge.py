"""The Slurm node guard authenticates its controller (issue 24, item 5): it challenges the real
controller's ``/v1/guard`` with a fresh nonce and takes only the job token's MAC as an answer,
so a process squatting the dead controller's port does not keep the job alive past the guard's
timeout. The real guard process, the controller's real HTTP app, a squatter on the same port and
stand-in Slurm commands (``scontrol``/``scancel`` scripts that record what they were asked):
the real-cluster variant of the guard's action is tests/test_slurm.py's."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import no_platform
from supervisor.config import from_dict
from supervisor.controller.daemon import Controller
from supervisor.controller.http import start_http
from supervisor.platforms.slurm.guard import LOST_EXIT, MARKER, GuardConfig, guard_argv, guard_mac

TOKEN = b"fedcba9876543210" * 3
JOB_ID = "4242"


class ServedController:
    """A controller's real HTTP app (controller.http.start_http) on its own event loop thread."""

    def __init__(self, tmp_path: Path, token: bytes = TOKEN) -> None:
        cfg = from_dict({"command": ["true"], "job": "j", "log_dir": str(tmp_path / "logs"),
                         "checkpoint_dir": str(tmp_path / "ckpt")})
        self.c = Controller(cfg, no_platform())
        self.c.wire.token = token
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.runner = asyncio.run_coroutine_threadsafe(start_http(self.c, "127.0.0.1", 0), self.loop).result(10)
        self.port = self.c.http_port

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


class Squatter(http.server.BaseHTTPRequestHandler):
    """Whatever took the port: 200 to everything, with a body shaped like the controller's."""

    def do_GET(self):  # noqa: N802
        self.server.probes += 1
        body = json.dumps({"ok": True, "mac": "0" * 64}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def fake_slurm(bin_dir: Path, record: Path) -> None:
    """scontrol (the job RUNNING at restart 0; updates and requeues recorded) and scancel (recorded)."""
    bin_dir.mkdir()
    for name, out in (("scontrol", f"JobId={JOB_ID} JobState=RUNNING Restarts=0"), ("scancel", "")):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {record}\n"
                          + (f"[ \"$1\" = show ] && echo '{out}'\n" if out else "") + "exit 0\n")
        script.chmod(0o755)


def write_token(path: Path, token: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, token + b"\n")
    os.close(fd)


def guard_log(log_dir: Path) -> str:
    path = log_dir / "slurm" / "guard-n2.log"
    return path.read_text() if path.exists() else ""


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start_guard(tmp_path: Path, port: int, timeout_s: float, with_token: bool = True) -> subprocess.Popen:
    log_dir = tmp_path / "shared"
    log_dir.mkdir(exist_ok=True)
    if with_token:
        write_token(log_dir / "token", TOKEN)
    fake_slurm(tmp_path / "bin", tmp_path / "slurm-calls")
    cfg = GuardConfig(job_id=JOB_ID, api=f"http://127.0.0.1:{port}", job="j", node="n2", log_dir=log_dir,
                      timeout_s=timeout_s, probe_s=0.2, action="cancel", command_timeout_s=5,
                      bin_dir=str(tmp_path / "bin"))
    return subprocess.Popen(guard_argv(sys.executable, cfg), stderr=subprocess.PIPE, text=True)


def test_a_process_squatting_the_dead_controllers_port_does_not_keep_the_job_alive(tmp_path):
    controller = ServedController(tmp_path)
    port = controller.port
    proc = start_guard(tmp_path, port, timeout_s=2.0)
    log_dir = tmp_path / "shared"
    squatter = None
    try:
        # the real controller's answer is taken: it holds the job token
        wait_for(lambda: "event=controller_answered" in guard_log(log_dir), 30, "the guard to hear the controller")
        controller.close()
        http.server.ThreadingHTTPServer.allow_reuse_address = True
        squatter = http.server.ThreadingHTTPServer(("127.0.0.1", port), Squatter)  # the same port, at once
        squatter.probes = 0
        threading.Thread(target=squatter.serve_forever, daemon=True).start()
        lost_from = time.monotonic()
        code = proc.wait(30)
        took = time.monotonic() - lost_from
    finally:
        if proc.poll() is None:
            proc.kill()
        if squatter is not None:
            squatter.shutdown()
            squatter.server_close()
    log = guard_log(log_dir)
    assert code == LOST_EXIT, (code, log, proc.stderr.read())
    assert squatter.probes >= 3  # it answered 200 all along, and was not taken for the controller
    assert "event=controller_unauthenticated" in log and "not this job's controller" in log, log
    assert "event=controller_lost" in log and took < 2.0 + 5.0, (took, log)
    calls = (tmp_path / "slurm-calls").read_text()
    assert f"scancel {JOB_ID}" in calls, calls
    assert json.loads((log_dir / "slurm" / MARKER).read_text())["action"] == "cancel"


def test_the_controller_answers_a_challenge_only_with_the_job_tokens_mac(tmp_path):
    controller = ServedController(tmp_path)
    base = f"http://127.0.0.1:{controller.port}/v1/guard"
    try:
        nonce = os.urandom(16).hex()
        with urllib.request.urlopen(f"{base}?nonce={nonce}", timeout=5) as resp:
            assert json.loads(resp.read()) == {"mac": guard_mac(TOKEN, nonce)}
        assert guard_mac(TOKEN, nonce) != guard_mac(TOKEN[::-1], nonce) != guard_mac(TOKEN, nonce[::-1])
        for bad in ("", "abc", "zz" * 16, "A" * 32, "0" * 130):
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(f"{base}?nonce={bad}", timeout=5)
            assert exc.value.code == 400
    finally:
        controller.close()
    tokenless = ServedController(tmp_path / "b", token=b"")  # e.g. a controller serving a finished job's verdict
    try:
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://127.0.0.1:{tokenless.port}/v1/guard?nonce={'0' * 32}", timeout=5)
        assert exc.value.code == 503
    finally:
        tokenless.close()


def test_a_guard_that_cannot_read_the_token_never_takes_an_answer_for_its_controller(tmp_path):
    # an answer it cannot check is no answer: it never hears a controller, so it never acts
    controller = ServedController(tmp_path)
    proc = start_guard(tmp_path, controller.port, timeout_s=1.0, with_token=False)
    log_dir = tmp_path / "shared"
    try:
        wait_for(lambda: "event=controller_never_answered" in guard_log(log_dir), 30, "the guard to give up hearing")
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
        controller.close()
    log = guard_log(log_dir)
    assert "no job token to check the answer with" in log and "event=controller_answered" not in log, log
    assert not (log_dir / "slurm" / MARKER).exists()
