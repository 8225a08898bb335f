"""The restore point: which checkpoint an attempt resumes from, asked over HTTP.

Rank 0 asks once per attempt: ``GET`` :data:`RESTORE_POINT_PATH` ``?attempt=K&rank=R&launch=L``
with the headers :data:`HEADER_TIME` (unix milliseconds), :data:`HEADER_NONCE` (128 random bits,
hex) and :data:`HEADER_MAC` (hex HMAC-SHA256 under the HTTP key of
:func:`restore_request_string`). The controller refuses it (401 with the reason) outside
:data:`FRESH_S` of its clock, with a bad MAC, or with a nonce it has already taken
(:class:`NonceCache`, bounded). Its answer carries :data:`HEADER_MAC` over the request's nonce,
the status and the body (:func:`restore_answer_mac`): the rank takes only an answer to its own
request that came from the controller.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from supervisor.protocol.errors import (
    REJECT_MALFORMED,
    REJECT_REPLAYED,
    REJECT_SCHEMA,
    REJECT_STALE,
    REJECT_UNAUTHENTICATED,
    ProtocolError,
)
from supervisor.protocol.frames import MAX_RANK, Keys, launch_problem

RESTORE_POINT_PATH = "/v1/restore-point"
HEADER_TIME = "X-Supervisor-Time"
"""The request's time: unix milliseconds, decimal."""
HEADER_NONCE = "X-Supervisor-Nonce"
"""The request's nonce: 128 random bits, 32 lowercase hex digits, never used twice."""
HEADER_MAC = "X-Supervisor-Mac"
"""On a request: :func:`restore_request_mac`; on an answer: :func:`restore_answer_mac` (hex)."""
FRESH_S = 30.0
"""A request stamped further than this from the controller's clock is refused (clock skew
between hosts must stay below it; NTP keeps it to milliseconds)."""
NONCE_CACHE_MAX = 4096
_NONCE_CHARS = 32
_REQUEST_LABEL = b"elastic-supervisor v2 restore-point request"
_ANSWER_LABEL = b"elastic-supervisor v2 restore-point answer"


def restore_request_string(*, method: str, path: str, launch: str, attempt: int, rank: int, time_ms: int,
                           nonce: str) -> bytes:
    """What a restore-point request's MAC covers: one field a line (every field is checked to hold
    no line break: hex, digits, or the method and path the server itself routed)."""
    return b"\n".join([_REQUEST_LABEL, method.encode(), path.encode(), launch.encode(), str(attempt).encode(),
                       str(rank).encode(), str(time_ms).encode(), nonce.encode()])


def restore_request_mac(key: bytes, **fields: Any) -> str:
    return hmac.new(key, restore_request_string(**fields), hashlib.sha256).hexdigest()


def restore_answer_mac(key: bytes, nonce: str, status: int, body: bytes) -> str:
    """The MAC of the controller's answer to the request with ``nonce`` (its status and body)."""
    msg = b"\n".join([_ANSWER_LABEL, nonce.encode(), str(status).encode()]) + b"\n" + body
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class RestoreRequest:
    """A signed restore-point request: its query (to append to :data:`RESTORE_POINT_PATH`), its
    headers, and its nonce (the answer must name it)."""

    query: str
    headers: dict[str, str]
    nonce: str


def restore_request(keys: Keys, *, launch: str, attempt: int, rank: int, now: float | None = None) -> RestoreRequest:
    """A new restore-point request (a fresh nonce and time: sign each try anew)."""
    time_ms = int((time.time() if now is None else now) * 1000)
    nonce = secrets.token_hex(_NONCE_CHARS // 2)
    mac = restore_request_mac(keys.http, method="GET", path=RESTORE_POINT_PATH, launch=launch, attempt=attempt,
                              rank=rank, time_ms=time_ms, nonce=nonce)
    return RestoreRequest(query=f"attempt={attempt}&rank={rank}&launch={launch}",
                          headers={HEADER_TIME: str(time_ms), HEADER_NONCE: nonce, HEADER_MAC: mac}, nonce=nonce)


class NonceCache:
    """The nonces of the authenticated requests of the last :data:`FRESH_S`, at most ``limit``.

    Only a request whose MAC verified is recorded (nobody without the key can fill it). Past the
    limit the oldest entry is dropped and its time becomes a floor: a request stamped at or
    before it is refused, so a dropped nonce can never be used again either."""

    def __init__(self, window_s: float = FRESH_S, limit: int = NONCE_CACHE_MAX) -> None:
        self.window_ms = int(window_s * 1000)
        self.limit = limit
        self.floor_ms = -1
        self._seen: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, nonce: str, time_ms: int, now_ms: int) -> bool:
        """Record ``nonce`` (of a request stamped ``time_ms``); False if it cannot be taken."""
        seen = self._seen
        while seen:
            oldest = next(iter(seen.values()))
            if oldest >= now_ms - self.window_ms:
                break
            seen.popitem(last=False)  # outside the window: the freshness check refuses it now
        if time_ms <= self.floor_ms or nonce in seen:
            return False
        if len(seen) >= self.limit:
            _, dropped = seen.popitem(last=False)
            self.floor_ms = max(self.floor_ms, dropped)
            if time_ms <= self.floor_ms:
                return False
        seen[nonce] = time_ms
        return True


def _digits(value: str | None, limit: int) -> int | None:
    if value is None or not 0 < len(value) <= limit or not value.isascii() or not value.isdigit():
        return None
    return int(value)


def check_restore_request(key: bytes, *, method: str, path: str, query: Mapping[str, str],
                          headers: Mapping[str, str], nonces: NonceCache, now: float | None = None) -> tuple[str, int, int]:
    """``(launch, attempt, rank)`` of an authentic, fresh, first-seen restore-point request;
    :class:`ProtocolError` otherwise (reason :data:`REJECT_SCHEMA`, :data:`REJECT_STALE`,
    :data:`REJECT_UNAUTHENTICATED` or :data:`REJECT_REPLAYED`)."""
    attempt = _digits(query.get("attempt"), 10)
    rank = _digits(query.get("rank"), 7)
    launch = query.get("launch") or ""
    time_ms = _digits(headers.get(HEADER_TIME), 16)
    nonce = headers.get(HEADER_NONCE) or ""
    mac = headers.get(HEADER_MAC) or ""
    if attempt is None or rank is None or rank > MAX_RANK or attempt > 1 << 31:
        raise ProtocolError(REJECT_SCHEMA, "attempt and rank must be integers")
    if launch_problem(launch):
        raise ProtocolError(REJECT_SCHEMA, "launch must be a launch id")
    if time_ms is None or len(nonce) != _NONCE_CHARS or not all(c in "0123456789abcdef" for c in nonce):
        raise ProtocolError(REJECT_UNAUTHENTICATED, f"{HEADER_TIME} and {HEADER_NONCE} are required")
    now_ms = int((time.time() if now is None else now) * 1000)
    if abs(now_ms - time_ms) > nonces.window_ms:
        raise ProtocolError(REJECT_STALE, f"stamped {(time_ms - now_ms) / 1000:+.1f} s from the controller's clock "
                                          f"(more than {nonces.window_ms / 1000:g} s: clocks apart, or a replay)")
    want = restore_request_mac(key, method=method, path=path, launch=launch, attempt=attempt, rank=rank,
                               time_ms=time_ms, nonce=nonce)
    if not (mac.isascii() and hmac.compare_digest(mac.encode(), want.encode())):
        raise ProtocolError(REJECT_UNAUTHENTICATED, "bad MAC (wrong token?)")
    if not nonces.admit(nonce, time_ms, now_ms):
        raise ProtocolError(REJECT_REPLAYED, "this request was already answered")
    return launch, attempt, rank


def check_restore_answer(key: bytes, nonce: str, status: int, body: bytes, mac: str | None) -> None:
    """Raises :class:`ProtocolError` (``unauthenticated``) unless the answer ``body`` with
    ``status`` came from the controller, in answer to the request with ``nonce``."""
    want = restore_answer_mac(key, nonce, status, body)
    if not mac or not mac.isascii() or not hmac.compare_digest(mac.encode(), want.encode()):
        raise ProtocolError(REJECT_UNAUTHENTICATED, "the answer is not the controller's (bad or missing MAC)")



# ------------------------------------------------------------------------------ the answer
ANSWER_MAX_BYTES = 1 << 20
"""A rank reads at most this much of an answer (more is not JSON to it: refused)."""
NAME_MAX_CHARS = 64
EXCLUDE_MAX = 16384
"""At most this many names never to load (the suspects) in one answer."""
ANSWER_FIELDS = ("attempt", "checkpoint", "exclude", "required")
"""An answer's fields: the attempt it is for, the checkpoint to resume from (null: the newest that
verifies), the names never to load, and whether one must load (the job has had one)."""


@dataclass(frozen=True)
class RestorePoint:
    """What the controller answers a restore-point request with (:func:`parse_restore_point`)."""

    checkpoint: str | None = None
    exclude: tuple[str, ...] = ()
    required: bool = False


def restore_point_answer(*, attempt: int, checkpoint: str | None, exclude: Iterable[str],
                         required: bool) -> dict[str, Any]:
    """The controller's answer body (JSON) for ``attempt``; :func:`parse_restore_point` reads it."""
    return dict(zip(ANSWER_FIELDS, (attempt, checkpoint, list(exclude), bool(required))))


def parse_restore_point(body: bytes, *, is_name: Callable[[str], object]) -> RestorePoint:
    """The controller's answer ``body``; :class:`ProtocolError` (``malformed`` or ``schema``)
    unless it is a JSON object whose checkpoint (or null) and excluded names are checkpoint
    names (``is_name``: the checkpoint library's ``parse_name``), at most
    :data:`NAME_MAX_CHARS` each and :data:`EXCLUDE_MAX` of them. ``required`` is true only when
    it is ``true``."""
    if len(body) > ANSWER_MAX_BYTES:
        raise ProtocolError(REJECT_SCHEMA, f"an answer of {len(body)} bytes (at most {ANSWER_MAX_BYTES})")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        raise ProtocolError(REJECT_MALFORMED, "the answer is not JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError(REJECT_SCHEMA, "the answer is not a JSON object")

    def name_ok(v: object) -> bool:
        return isinstance(v, str) and len(v) <= NAME_MAX_CHARS and bool(is_name(v))

    name, exclude = obj.get("checkpoint"), obj.get("exclude", [])
    if name is not None and not name_ok(name):
        raise ProtocolError(REJECT_SCHEMA, f"bad checkpoint: {name!r}"[:120])
    if not isinstance(exclude, list) or len(exclude) > EXCLUDE_MAX or not all(name_ok(e) for e in exclude):
        raise ProtocolError(REJECT_SCHEMA, "bad exclude: not a list of checkpoint names")
    return RestorePoint(checkpoint=name, exclude=tuple(exclude), required=obj.get("required") is True)
