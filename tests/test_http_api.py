"""The controller's HTTP API on a real aiohttp server, spoken to over a raw socket."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from supervisor.controller.http import build_app

TOKEN = b"0123456789abcdef" * 3


class JobView:
    """What the restore-point endpoint reads of the controller before it answers: the job's
    token and the current attempt."""

    token = TOKEN
    attempt = 2
    ready = True


def raw_request(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def serve_and_ask(*heads: bytes) -> list[bytes]:
    async def main() -> list[bytes]:
        runner = web.AppRunner(build_app(JobView()), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return [await asyncio.to_thread(raw_request, port, h) for h in heads]
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def get_restore_point(auth: bytes) -> bytes:
    return (b"GET /v1/restore-point?attempt=1 HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth
            + b"\r\nConnection: close\r\n\r\n")


def test_a_non_utf8_authorization_header_is_401_not_a_500():
    bad, latin, wrong, right = serve_and_ask(
        get_restore_point(b"Bearer \xff\xfe\xe9" + TOKEN[3:]),
        get_restore_point("Bearer é".encode()),
        get_restore_point(b"Bearer " + b"x" * len(TOKEN)),
        get_restore_point(b"Bearer " + TOKEN),
    )
    for reply in (bad, latin, wrong):
        assert reply.startswith(b"HTTP/1.1 401 "), reply[:200]
        assert b'"unauthenticated"' in reply
    # the right token gets past the check (attempt 1 is not the current attempt 2: 409)
    assert right.startswith(b"HTTP/1.1 409 "), right[:200]
