"""The Slurm node guard as a process, on this machine: it is invisible while the controller
answers (exit codes, deaths by signal and signals pass through) and it never acts on a short
silence. Its action on a lost controller (requeue or cancel) runs against the real cluster in
tests/test_slurm.py."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from supervisor.config import ConfigError, SlurmConfig
from supervisor.platforms.slurm_guard import MARKER, GuardConfig, guard_argv

PY = sys.executable


class Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the stdlib's name)
        self.server.probes += 1
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

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


def start_guard(tmp_path: Path, port: int, agent: list[str], timeout_s: float = 30.0) -> subprocess.Popen:
    cfg = GuardConfig(job_id="999999", api=f"http://127.0.0.1:{port}", job="j", node="n9", log_dir=tmp_path,
                      timeout_s=timeout_s, probe_s=0.2, grace_s=5, action="cancel", bin_dir=str(tmp_path / "no-slurm"))
    return subprocess.Popen([*guard_argv(PY, cfg), "--", *agent], stderr=subprocess.PIPE, text=True)


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


@pytest.fixture
def controller():
    c = Controller()
    yield c
    c.close()


def test_the_agents_exit_code_passes_through_while_the_controller_answers(tmp_path, controller):
    proc = start_guard(tmp_path, controller.port, [PY, "-c", "import sys; sys.exit(3)"])
    assert proc.wait(30) == 3, proc.stderr.read()
    assert controller.server.probes >= 1  # it asked before exiting
    assert "event=agent_exited exit_code=3" in guard_log(tmp_path)
    assert not (tmp_path / "slurm" / MARKER).exists()


def test_an_agent_killed_by_a_signal_kills_its_guard_by_the_same_signal(tmp_path, controller):
    # the controller reads a step's srun exit 128+N as "killed by N": the guard must not hide it
    proc = start_guard(tmp_path, controller.port, [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert proc.wait(30) == -signal.SIGKILL


def test_sigterm_reaches_the_agent_which_ends_as_it_chooses(tmp_path, controller):
    flag = tmp_path / "got-term"
    agent = [PY, "-c", "import signal, sys, time, pathlib\n"
             f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(flag)!r}).write_text('TERM'), sys.exit(7)))\n"
             f"pathlib.Path({str(flag)!r} + '.ready').write_text('')\n"
             "time.sleep(60)"]
    proc = start_guard(tmp_path, controller.port, agent)
    wait_for(lambda: Path(str(flag) + ".ready").exists(), 30, "the agent to install its handler")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 7
    assert flag.read_text() == "TERM"


def test_an_agent_that_ends_while_the_controller_is_briefly_silent_waits_for_it_and_does_not_act(tmp_path):
    port = free_port()  # nothing listens yet: the controller "restarts"
    proc = start_guard(tmp_path, port, [PY, "-c", "import sys; sys.exit(5)"], timeout_s=60)
    wait_for(lambda: "event=agent_exited_controller_silent exit_code=5" in guard_log(tmp_path), 30,
             "the guard to see its agent end while the controller is silent")
    assert proc.poll() is None, "the guard exited while the controller did not answer"
    back = Controller(port)
    try:
        assert proc.wait(30) == 5
        assert back.server.probes >= 1
    finally:
        back.close()
    assert not (tmp_path / "slurm" / MARKER).exists()
    assert "controller_lost" not in guard_log(tmp_path)


def test_the_guard_refuses_a_command_line_without_an_agent(tmp_path):
    proc = subprocess.run([PY, "-m", "supervisor.platforms.slurm_guard", "--job-id", "1", "--api", "http://x:1",
                           "--log-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "no agent command after --" in proc.stderr


@pytest.mark.parametrize("fields, message", [
    ({"controller_timeout_s": -1}, "controller_timeout_s: must be >= 0"),
    ({"controller_probe_s": 0}, "controller_probe_s: must be > 0"),
    ({"controller_timeout_s": 5, "controller_probe_s": 5}, "must be at least twice controller_probe_s"),
])
def test_guard_settings_are_checked(fields, message):
    with pytest.raises(ConfigError, match=message):
        SlurmConfig(**fields)


def test_a_controller_never_reached_is_a_wrong_address_not_a_lost_controller(tmp_path):
    # e.g. http.host left at 127.0.0.1 while the guard runs on another node: it must not end the job
    proc = start_guard(tmp_path, free_port(), [PY, "-c", "import time; time.sleep(2.5); raise SystemExit(4)"],
                       timeout_s=1)
    assert proc.wait(60) == 4
    assert "event=controller_never_answered" in guard_log(tmp_path)
    assert not (tmp_path / "slurm" / MARKER).exists() and "event=controller_lost" not in guard_log(tmp_path)
