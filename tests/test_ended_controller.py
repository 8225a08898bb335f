"""A controller restarted after its job finished (Controller.serve_ended: a Kubernetes Deployment
restarts what exits; platforms/kube/platform.py's idle controller) keeps answering /healthz,
/readyz and /status with the verdict, and still requires credentials for /v1/restore-point
(issue 24, item 5): it holds no job token, so nothing is authenticated and nothing is answered."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

from helpers import no_platform
from supervisor.config import from_dict
from supervisor.controller.daemon import Controller
from supervisor.controller.decide import JobPhase


def get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_finished_jobs_controller_answers_the_verdict_but_no_restore_point_without_credentials(tmp_path):
    cfg = from_dict({"command": ["true"], "job": "j", "log_dir": str(tmp_path / "logs"),
                     "checkpoint_dir": str(tmp_path / "ckpt")})
    (tmp_path / "logs").mkdir()
    c = Controller(cfg, no_platform())
    c.phase, c.stop_reason, c.attempt = JobPhase.COMPLETED, "every rank finished", 3
    c.restore_from = "step-0000000100"
    loop = asyncio.new_event_loop()
    until: list[asyncio.Event] = []
    served = threading.Event()

    async def main():
        until.append(asyncio.Event())
        task = asyncio.ensure_future(c.serve_ended(until[0]))
        while not c.ready or not c.http_port:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # bound
        served.set()
        await task

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()))
    thread.start()
    try:
        assert served.wait(20)
        base = f"http://127.0.0.1:{c.http_port}"
        assert get(f"{base}/healthz")[0] == 200 and get(f"{base}/readyz")[0] == 200
        status, body = get(f"{base}/status")
        assert status == 200 and json.loads(body)["phase"] == "completed"
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer x"},
                        {"X-Supervisor-Mac": "0" * 64, "X-Supervisor-Nonce": "0" * 32}):
            status, body = get(f"{base}/v1/restore-point?attempt=3&rank=0", headers)
            assert status == 401, (headers, status, body)
            assert b"step-0000000100" not in body
        assert get(f"{base}/v1/guard?nonce={'0' * 32}")[0] == 503  # no token: no challenge answered either
    finally:
        if until:
            loop.call_soon_threadsafe(until[0].set)
        thread.join(20)
    assert not thread.is_alive()

