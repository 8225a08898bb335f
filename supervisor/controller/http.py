"""The controller's HTTP API (aiohttp).

* ``GET /metrics``: Prometheus exposition (unauthenticated, like any exporter; it holds no
  secret and changes nothing). Rendered off the event loop from a snapshot
  (:class:`supervisor.metrics.Exporter`), gzip-compressed when the scraper accepts it.
* ``GET /healthz``: the process is up. ``GET /readyz``: the gang is launched or adopted.
* ``GET /v1/guard?nonce=HEX``: the Slurm node guards' challenge, answered with
  ``{"mac": HMAC(guard key, nonce)}`` (:func:`supervisor.platforms.slurm.guard.guard_mac`: a key
  derived from the job token, good for nothing else); 503 without a token.
* ``GET /status``: the state as JSON (what ``supervisor status`` renders), from a snapshot taken at
  most once a second and rendered off the event loop (:class:`StatusView`). Per-rank detail is
  capped above 256 ranks (the stalest and the slowest; ``ranks_summary`` sums up the rest);
  ``?offset=K&limit=N`` pages through every rank in rank order (``N`` at most 1,024).
* ``GET /v1/restore-point?attempt=K&rank=R&launch=L``: which checkpoint attempt K resumes
  from. The request is MAC'd with the HTTP key derived from the job token, over its method,
  path, launch, attempt, rank, time and nonce (:func:`supervisor.protocol.check_restore_request`;
  401 naming the reason otherwise: stale, unauthenticated, replayed; no key is ever sent); the
  answer carries the controller's MAC for that nonce. Another launch or an attempt other than
  the current one gets 409. A rank restarted in place may ask for the next attempt before the
  controller has caught up with its agent: that request waits up to ``IN_PLACE_WAIT_S`` for
  the controller's choice.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST

from supervisor.metrics import Exporter, accepts_gzip
from supervisor.platforms.slurm.guard import GUARD_PATH, guard_mac, valid_nonce
from supervisor.protocol import (
    HEADER_MAC,
    HEADER_NONCE,
    RESTORE_POINT_PATH,
    NonceCache,
    ProtocolError,
    check_restore_request,
    restore_answer_mac,
    restore_point_answer,
)

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller

IN_PLACE_WAIT_S = 4.0
"""Below the ranks' own 5 s request timeout: a rank asks again (3 tries) if it is not enough."""
EXPORTER = web.AppKey("exporter", Exporter)
"""The app's /metrics exporter (its ``last`` rendering: render time, bytes)."""
STATUS_SNAPSHOT_S = 1.0
"""``/status`` takes a new snapshot of the controller at most this often; requests meanwhile are
answered from the last one (each distinct page rendered once per snapshot)."""
STATUS_PAGES_KEPT = 16
"""Renderings of one snapshot kept for the requests that follow (distinct ``offset``/``limit``)."""


class StatusView:
    """``/status`` for a controller, as ``/metrics`` is served (:class:`Exporter`): a snapshot on
    the event loop (:meth:`Controller.view`: references and list copies), taken at
    most every :data:`STATUS_SNAPSHOT_S`; the document built and JSON-encoded in one worker
    thread (:func:`supervisor.controller.view.status_json`), one rendering per page per
    snapshot shared by every request that asks for it meanwhile. A flood of requests at 16,384
    ranks costs the loop a dictionary lookup each."""

    def __init__(self, controller: "Controller") -> None:
        self.c = controller
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="status-render")
        self._snap = None
        self._taken = -float("inf")
        self._bodies: dict[tuple, asyncio.Future] = {}
        self.snapshots = 0
        """Snapshots taken so far."""

    async def render(self, offset: int | None, limit: int | None) -> bytes:
        from supervisor.controller.view import status_json

        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._snap is None or now - self._taken >= STATUS_SNAPSHOT_S:
            self._snap, self._taken, self._bodies = self.c.view(), now, {}
            self.snapshots += 1
        key = (offset, limit)
        fut = self._bodies.get(key)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = loop.run_in_executor(self._pool, functools.partial(status_json, self._snap, offset=offset,
                                                                     limit=limit))
            if len(self._bodies) < STATUS_PAGES_KEPT:
                self._bodies[key] = fut
        return await asyncio.shield(fut)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


STATUS = web.AppKey("status", StatusView)
"""The app's /status view (``snapshots``: how many it took)."""


def build_app(controller: "Controller") -> web.Application:
    exporter = Exporter(controller)
    status_view = StatusView(controller)
    app = web.Application(client_max_size=64 * 1024)
    app[EXPORTER] = exporter
    app[STATUS] = status_view

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

    async def guard(request: web.Request) -> web.Response:
        # the Slurm node guards' challenge: only the holder of the job token can answer it, so a
        # process squatting this port after the controller is gone cannot keep the job alive
        nonce = request.query.get("nonce", "")
        if not valid_nonce(nonce):
            return web.json_response({"error": "nonce must be 16 to 128 lowercase hex digits"}, status=400)
        if not controller.wire.token:
            return web.json_response({"error": "this controller holds no job token"}, status=503)
        return web.json_response({"mac": guard_mac(controller.wire.token, nonce)})

    async def readyz(_request: web.Request) -> web.Response:
        ready = controller.ready
        return web.json_response({"ready": ready, "phase": controller.phase.value}, status=200 if ready else 503)

    async def status(request: web.Request) -> web.Response:
        try:
            page = {k: int(request.query[k]) for k in ("offset", "limit") if k in request.query}
        except ValueError:
            return web.json_response({"error": "offset and limit must be integers"}, status=400)
        if any(v < 0 for v in page.values()):
            return web.json_response({"error": "offset and limit must not be negative"}, status=400)
        body = await status_view.render(page.get("offset"), page.get("limit"))
        return web.Response(body=body, content_type="application/json")

    async def close_status(_app: web.Application) -> None:
        status_view.close()

    nonces = NonceCache()  # the nonces of the restore-point requests taken in the freshness window

    async def restore_point(request: web.Request) -> web.Response:
        keys = controller.wire.keys
        if keys is None:  # no job token: nothing can be authenticated, nothing is answered
            return web.json_response({"error": "unauthenticated", "detail": "this controller holds no job token"},
                                     status=401)
        try:
            launch, attempt, _rank = check_restore_request(keys.http, method=request.method, path=request.path,
                                                           query=request.query, headers=request.headers,
                                                           nonces=nonces)
        except ProtocolError as exc:  # nothing MAC'd back: an unauthenticated request learns nothing
            return web.json_response({"error": exc.reason, "detail": str(exc)}, status=401)
        nonce = request.headers[HEADER_NONCE]

        def answer(obj: dict, status: int = 200) -> web.Response:
            body = json.dumps(obj).encode()
            return web.Response(body=body, status=status, content_type="application/json",
                                headers={HEADER_MAC: restore_answer_mac(keys.http, nonce, status, body)})

        if launch != controller.launch_id:
            return answer({"error": "another launch: this rank's gang is not the controller's current one"}, 409)
        if controller.attempt < attempt <= controller.launch_attempt + controller.in_place_allowed:
            # a rank restarted in place asks before the controller has caught up with its agent:
            # the answer is the checkpoint the controller then chooses (briefly waited for)
            deadline = time.monotonic() + IN_PLACE_WAIT_S
            while controller.attempt < attempt and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if attempt != controller.attempt:
            return answer({"error": f"attempt {attempt} is not the current attempt {controller.attempt}"}, 409)
        return answer(restore_point_answer(**controller.restore_point()))

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get(GUARD_PATH, guard)
    app.router.add_get("/status", status)
    app.router.add_get(RESTORE_POINT_PATH, restore_point)
    app.on_cleanup.append(close_exporter)
    app.on_cleanup.append(close_status)
    return app


BAD_REQUEST_LOG_EVERY_S = 60.0
"""At most one log line per this many seconds for malformed requests (each is still answered)."""


class BadRequestLog(logging.LoggerAdapter):
    """The logger aiohttp's request handler reports through. A request aiohttp cannot parse (it
    answers 400 and closes) is one warning line without a traceback, at most one per ``every_s``,
    which counts those left unlogged since the last: an unauthenticated client cannot flood the
    log. Any other error (a handler's own defect: a 500) keeps its traceback."""

    def __init__(self, logger: logging.Logger, *, every_s: float = BAD_REQUEST_LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(logger, {})
        self.every_s = every_s
        self.clock = clock
        self.unlogged = 0
        self._last: float | None = None

    def exception(self, msg: object, *args: object, exc_info: object = True, **kw: object) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if not isinstance(exc, HttpProcessingError):
            self.logger.error(msg, *args, exc_info=exc_info, **kw)  # type: ignore[arg-type]
            return
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            self.unlogged += 1
            return
        self._last = now
        remote = args[0] if args else "?"
        what = " ".join(str(exc.message or exc).split())[:200]
        self.logger.warning("event=http_bad_request remote=%s status=%s error=%s unlogged_since_last=%d",
                            remote, exc.code or 400, what, self.unlogged)
        self.unlogged = 0


def http_runner(app: web.Application, **kw: object) -> web.AppRunner:
    """The runner the controller serves ``app`` with: no access log, malformed requests logged
    by :class:`BadRequestLog` (``kw`` goes to it)."""
    return web.AppRunner(app, access_log=None,
                         logger=BadRequestLog(logging.getLogger("supervisor.controller.http"), **kw))


async def start_http(controller: "Controller", host: str, port: int) -> web.AppRunner:
    runner = http_runner(build_app(controller))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    controller.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner
