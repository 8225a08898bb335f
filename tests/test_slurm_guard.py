"""The standing Slurm node guard as a process, on this machine: it ends at once and quietly when
told to (the job ending), it never acts on a short silence, on a controller it never reached, or
when Slurm cannot confirm the job is still its run. Its action on a lost controller (requeue or
cancel) runs against the real cluster in tests/test_slurm.py."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from supervisor.config import ConfigError
from supervisor.platforms.slurm.settings import SlurmConfig
from supervisor.platforms.slurm.guard import GUARD_PATH, MARKER, GuardConfig, guard_argv, guard_mac

PY = sys.executable
TOKEN = b"0123456789abcdef" * 3
"""The job token in the guards' LOG_DIR/token (start_guard writes it)."""


class Healthz(http.server.BaseHTTPRequestHandler):
    """Answers the guard's challenge as the controller does (the MAC of the nonce under the job token)."""

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        self.server.probes += 1
        path, _, query = self.path.partition("?")
        nonce = query.partition("nonce=")[2]
        body = json.dumps({"mac": guard_mac(TOKEN, nonce)}).encode() if path == GUARD_PATH else b"{}"
        self.send_response(200 if path in (GUARD_PATH, "/healthz") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Controller:
    """A real HTTP server answering /healthz, as the controller does."""

    def __init__(self, port: int = 0) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Healthz)
        self.server.probes = 0
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_guard(tmp_path: Path, port: int, timeout_s: float = 30.0) -> subprocess.Popen:
    token = tmp_path / "token"
    if not token.exists():
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, TOKEN)
        os.close(fd)
    cfg = GuardConfig(job_id="999999", api=f"http://127.0.0.1:{port}", job="j", node="n9", log_dir=tmp_path,
                      timeout_s=timeout_s, probe_s=0.2, action="cancel", command_timeout_s=5,
                      bin_dir=str(tmp_path / "no-slurm"))
    return subprocess.Popen(guard_argv(PY, cfg), stderr=subprocess.PIPE, text=True)


def guard_log(tmp_path: Path) -> str:
    path = tmp_path / "slurm" / "guard-n9.log"
    return path.read_text() if path.exists() else ""


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_in_log(tmp_path: Path, text: str, timeout: float = 30) -> None:
    wait_for(lambda: text in guard_log(tmp_path), timeout, repr(text))


@pytest.fixture
def controller():
    c = Controller()
    yield c
    c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_guard_ends_at_once_and_quietly_when_told_to(tmp_path, controller, sig):
    # the controller ends its guards with the job, Slurm ends the job's steps, scancel: never a loss
    proc = start_guard(tmp_path, controller.port)
    wait_in_log(tmp_path, "event=controller_answered")
    t0 = time.monotonic()
    proc.send_signal(sig)
    assert proc.wait(10) == 0, proc.stderr.read()
    assert time.monotonic() - t0 < 2
    assert f"event=guard_stopped signal={sig.name} controller_answering=True" in guard_log(tmp_path)
    assert not (tmp_path / "slurm" / MARKER).exists()


def test_a_guard_told_to_stop_after_its_controller_went_away_does_not_act(tmp_path, controller):
    # a job ending normally: its controller exits first, then its guards are ended
    proc = start_guard(tmp_path, controller.port, timeout_s=5)
    wait_in_log(tmp_path, "event=controller_answered")
    controller.close()
    time.sleep(1)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert "controller_answering=True" in guard_log(tmp_path)  # 1 s of silence, well inside the 5 s timeout
    assert not (tmp_path / "slurm" / MARKER).exists() and "controller_lost" not in guard_log(tmp_path)


def test_a_silence_shorter_than_the_timeout_is_not_a_lost_controller(tmp_path):
    port = free_port()
    first = Controller(port)
    proc = start_guard(tmp_path, port, timeout_s=4)
    try:
        wait_in_log(tmp_path, "event=controller_answered")
        first.close()  # the controller "restarts" on the same address within the timeout
        time.sleep(2)
        back = Controller(port)
        try:
            wait_for(lambda: back.server.probes >= 2, 10, "the guard to probe the controller again")
            time.sleep(4)  # past the timeout counted from the first silence: heard meanwhile, nothing to do
            assert proc.poll() is None
        finally:
            back.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert not (tmp_path / "slurm" / MARKER).exists() and "controller_lost" not in guard_log(tmp_path)


def test_a_controller_never_reached_is_a_wrong_address_not_a_lost_controller(tmp_path):
    # e.g. http.host left at 127.0.0.1 while the guard runs on another node: it must not end the job
    proc = start_guard(tmp_path, free_port(), timeout_s=1)
    wait_in_log(tmp_path, "event=controller_never_answered")
    time.sleep(1)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert not (tmp_path / "slurm" / MARKER).exists() and "event=controller_lost" not in guard_log(tmp_path)


def test_a_lost_controller_is_not_acted_on_while_slurm_cannot_say_the_job_is_still_this_run(tmp_path, controller):
    # no scontrol here (as with slurmctld down): neither a requeue nor a cancel could be done, and a
    # guard left over from before a requeue must not act on the next run: it asks again, and waits
    proc = start_guard(tmp_path, controller.port, timeout_s=1)
    wait_in_log(tmp_path, "event=controller_answered")
    controller.close()
    wait_in_log(tmp_path, "event=controller_silent_job_unconfirmed")
    assert proc.poll() is None
    assert not (tmp_path / "slurm" / MARKER).exists() and "event=controller_lost" not in guard_log(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_the_guard_refuses_a_command_line_without_its_controller(tmp_path):
    proc = subprocess.run([PY, "-m", "supervisor.platforms.slurm.guard", "--job-id", "1", "--log-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "--api" in proc.stderr


@pytest.mark.parametrize("fields, message", [
    ({"controller_timeout_s": -1}, "controller_timeout_s: must be >= 0"),
    ({"controller_probe_s": 0}, "controller_probe_s: must be > 0"),
    ({"controller_timeout_s": 5, "controller_probe_s": 5}, "must be at least twice controller_probe_s"),
])
def test_guard_settings_are_checked(fields, message):
    with pytest.raises(ConfigError, match=message):
        SlurmConfig(**fields)


def test_the_guard_loads_alone_on_its_node():
    # it runs in front of every agent: the Slurm package's platform, torch and aiohttp stay unloaded
    code = ("import sys, supervisor.platforms.slurm.guard; "
            "print(sorted(m for m in sys.modules if m.startswith(('supervisor.platforms.slurm', 'torch', 'aiohttp'))))")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "['supervisor.platforms.slurm', 'supervisor.platforms.slurm.guard']"
