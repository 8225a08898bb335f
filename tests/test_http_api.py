"""The controller's HTTP API on a real aiohttp server, spoken to over a raw socket."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from types import SimpleNamespace

import pytest
from aiohttp import web

from supervisor.controller.http import build_app
from supervisor.protocol import (
    FRESH_S,
    HEADER_MAC,
    HEADER_NONCE,
    HEADER_TIME,
    RESTORE_POINT_PATH,
    ProtocolError,
    check_restore_answer,
    derive_keys,
    restore_request,
)

TOKEN = b"0123456789abcdef" * 3
KEYS = derive_keys(TOKEN)
LAUNCH = "c" * 32


class JobView:
    """What the restore-point endpoint reads of the controller before it answers: the keys
    derived from the job's token, the running launch and the current attempt."""

    wire = SimpleNamespace(keys=KEYS)
    launch_id = LAUNCH
    attempt = 2
    launch_attempt = 2
    in_place_allowed = 0
    ready = True

    def restore_point(self) -> dict:
        return {"attempt": self.attempt, "checkpoint": "step-0000000010", "exclude": [], "required": True}


class NoToken(JobView):
    wire = SimpleNamespace(keys=None)  # a controller that holds no token (one serving a finished job's verdict, say)


def raw_request(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def serve_and_ask(*heads: bytes, view=JobView) -> list[bytes]:
    async def main() -> list[bytes]:
        runner = web.AppRunner(build_app(view()), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return [await asyncio.to_thread(raw_request, port, h) for h in heads]
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def get(query: str, headers: dict[str, str] | bytes = b"") -> bytes:
    extra = headers if isinstance(headers, bytes) else "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    return (f"GET {RESTORE_POINT_PATH}?{query} HTTP/1.1\r\nHost: x\r\n".encode() + extra
            + b"Connection: close\r\n\r\n")


def signed(attempt: int = 2, *, launch: str = LAUNCH, keys=KEYS, now: float | None = None):
    req = restore_request(keys, launch=launch, attempt=attempt, rank=0, now=now)
    return req, get(req.query, req.headers)


def split(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_a_signed_request_is_answered_with_the_controllers_mac_for_its_nonce():
    req, head = signed()
    (reply,) = serve_and_ask(head)
    status, headers, body = split(reply)
    assert status == 200 and json.loads(body)["checkpoint"] == "step-0000000010"
    check_restore_answer(KEYS.http, req.nonce, 200, body, headers[HEADER_MAC.lower()])
    with pytest.raises(ProtocolError):  # bound to this request: not an answer to any other
        check_restore_answer(KEYS.http, "0" * 32, 200, body, headers[HEADER_MAC.lower()])
    assert TOKEN not in head and KEYS.http.hex().encode() not in head and b"Authorization" not in head


def test_replayed_stale_tampered_or_unsigned_requests_are_401_and_answered_without_a_mac():
    req, head = signed()
    _, stale = signed(now=time.time() - FRESH_S - 5)
    _, future = signed(now=time.time() + FRESH_S + 5)
    tampered = get(req.query.replace("attempt=2", "attempt=3"), req.headers)  # the MAC covers the attempt
    _, wrong_key = signed(keys=derive_keys(b"another job's token " * 3))
    stamp = f"{HEADER_TIME}: {req.headers[HEADER_TIME]}\r\n{HEADER_NONCE}: {req.headers[HEADER_NONCE]}\r\n"
    bad_bytes = get(req.query, stamp.encode() + HEADER_MAC.encode() + b": \xff\xfe\xe9\r\n")  # not UTF-8: 401, not 500
    bearer = get("attempt=2&rank=0&launch=" + LAUNCH, b"Authorization: Bearer " + TOKEN + b"\r\n")  # the old scheme
    replies = serve_and_ask(head, head, stale, future, tampered, wrong_key, bad_bytes, bearer)
    first, *refused = [split(r) for r in replies]
    assert first[0] == 200
    reasons = [json.loads(body)["error"] for status, _, body in refused]
    assert reasons == ["replayed", "stale", "stale", "unauthenticated", "unauthenticated", "unauthenticated",
                       "unauthenticated"]
    assert all(status == 401 and HEADER_MAC.lower() not in headers for status, headers, _ in refused)


def test_another_launch_or_attempt_is_409_and_a_controller_without_a_token_answers_nobody():
    (_, other_launch), (_, other_attempt) = signed(launch="d" * 32), signed(attempt=1)
    launch_reply, attempt_reply = (split(r) for r in serve_and_ask(other_launch, other_attempt))
    assert launch_reply[0] == 409 and "another launch" in json.loads(launch_reply[2])["error"]
    assert attempt_reply[0] == 409 and "not the current attempt 2" in json.loads(attempt_reply[2])["error"]
    (reply,) = serve_and_ask(signed()[1], view=NoToken)
    assert split(reply)[0] == 401
