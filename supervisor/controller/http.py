"""The controller's HTTP API (aiohttp).

* ``GET /metrics``: Prometheus exposition (unauthenticated, like any exporter; it holds no
  secret and changes nothing). Rendered off the event loop from a snapshot
  (:class:`supervisor.metrics.Exporter`), gzip-compressed when the scraper accepts it.
* ``GET /healthz``: the process is up. ``GET /readyz``: the gang is launched or adopted.
* ``GET /status``: the state as JSON (what ``supervisor status`` renders).
* ``GET /v1/restore-point?attempt=K``: which checkpoint attempt K resumes from. Requires
  ``Authorization: Bearer <job token>``; an attempt other than the current one gets 409. A
  rank restarted in place may ask for the next attempt before the controller has caught up
  with its agent: that request waits up to ``IN_PLACE_WAIT_S`` for the controller's choice.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from supervisor.metrics import Exporter, accepts_gzip

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller

IN_PLACE_WAIT_S = 4.0
"""Below the ranks' own 5 s request timeout: a rank asks again (3 tries) if it is not enough."""
EXPORTER = web.AppKey("exporter", Exporter)
"""The app's /metrics exporter (its ``last`` rendering: render time, bytes)."""


def build_app(controller: "Controller") -> web.Application:
    exporter = Exporter(controller)
    app = web.Application(client_max_size=64 * 1024)
    app[EXPORTER] = exporter

    async def metrics(request: web.Request) -> web.Response:
        controller.scrapes += 1  # a scraper is watching: after the job ends, linger for its last scrape
        out = await exporter.render(accepts_gzip(request.headers.get("Accept-Encoding", "")))
        headers = {"Content-Type": CONTENT_TYPE_LATEST, "Vary": "Accept-Encoding"}
        if out.gzipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=out.body, headers=headers)

    async def close_exporter(_app: web.Application) -> None:
        exporter.close()

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(_request: web.Request) -> web.Response:
        ready = controller.ready
        return web.json_response({"ready": ready, "phase": controller.phase.value}, status=200 if ready else 503)

    async def status(_request: web.Request) -> web.Response:
        return web.json_response(controller.status())

    async def restore_point(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        try:
            given = auth[7:].encode() if auth.startswith("Bearer ") else b""
        except UnicodeEncodeError:  # bytes that are not UTF-8 (kept as surrogates): not the token
            given = b""
        if not hmac.compare_digest(given, controller.token):
            return web.json_response({"error": "unauthenticated"}, status=401)
        try:
            attempt = int(request.query.get("attempt", ""))
        except ValueError:
            return web.json_response({"error": "attempt must be an integer"}, status=400)
        if controller.attempt < attempt <= controller.launch_attempt + controller.in_place_allowed:
            # a rank restarted in place asks before the controller has caught up with its agent:
            # the answer is the checkpoint the controller then chooses (briefly waited for)
            deadline = time.monotonic() + IN_PLACE_WAIT_S
            while controller.attempt < attempt and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if attempt != controller.attempt:
            return web.json_response({"error": f"attempt {attempt} is not the current attempt {controller.attempt}"},
                                     status=409)
        return web.json_response(controller.restore_point())

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)
    app.router.add_get("/v1/restore-point", restore_point)
    app.on_cleanup.append(close_exporter)
    return app


async def start_http(controller: "Controller", host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(build_app(controller), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    controller.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner
