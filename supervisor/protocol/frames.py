"""The datagrams between ranks and the controller: authenticated heartbeats and control frames,
the keys derived from the job token, launch ids and the token's own check.

Transport: UDP. A heartbeat is small, periodic and only its latest value matters: a lost one
is replaced by the next, so there is nothing to retransmit, no connection to keep per rank
and nothing to buffer when the controller is away. One core parses and authenticates well
over 16,384 of them per second (``benchmarks/heartbeat_intake.py``); an HTTP request per
heartbeat costs roughly ten times more.

Keys. The job token (``SUPERVISOR_TOKEN`` or ``SUPERVISOR_TOKEN_FILE``) never leaves the hosts
that hold it, and is never a MAC key itself: :func:`derive_keys` derives three independent
256-bit keys from it with HKDF-SHA256 (RFC 5869; :data:`HKDF_SALT`, one ``info`` label each,
:data:`KEY_LABELS`): one for heartbeats (rank -> controller), one for control frames
(controller -> rank) and one for HTTP. A key that verifies one kind of message cannot make
another, and nothing that verifies a message is ever sent.

Frame (version 2)::

    b"SV2" | HMAC-SHA256(key, payload)[:16] | payload (UTF-8 JSON object)

``key`` is the heartbeat key for ``type: hb`` frames and the control key for control frames.
A frame over :data:`MAX_DATAGRAM` bytes, with a bad MAC, not JSON, or with fields of the wrong
type or range is rejected with a reason (counted by the controller, never acted upon).
Heartbeats (``type: hb``) go up, control messages come back to the heartbeat's source address:
``dump`` (write every thread's stack to the rank's log, the evidence taken before anything is
killed) and ``abort`` (dump, then SIGKILL yourself).

Every frame belongs to one launch: ``launch`` is the random id of the launch that started the
rank (``SUPERVISOR_LAUNCH``, new for every launch of the gang; a rank restarted in place by its
agent keeps its launch's environment, so its id; its ``attempt`` is the next one). The
controller takes heartbeats of its current launch only (another launch of this run is a
``stale_attempt``; any other id, e.g. an earlier run with the same token, is
:data:`REJECT_OTHER_LAUNCH`), and a rank obeys only control frames of its own launch, attempt
and rank. Control messages are numbered (``seq``, :class:`ControlSequencer`): within its
launch, a rank obeys only a number above the last one it accepted (no replay), and only from
the address its heartbeats go to. Heartbeat ``seq`` numbers count per rank process, within a
launch and attempt.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec

from supervisor.protocol.errors import (
    REJECT_MALFORMED,
    REJECT_OVERSIZED,
    REJECT_SCHEMA,
    REJECT_UNAUTHENTICATED,
    ProtocolError,
)
from supervisor.protocol.groups import decode_groups
from supervisor.protocol.skipped import LEGACY_CHARS, NAME_CHARS, REFUSED_MAX, WHY_CHARS, decode_refused
from supervisor.protocol.vocabulary import OUTCOMES, PHASES, RESTORE_STATES, SOURCES

MAGIC = b"SV2"
MAC_BYTES = 16
_MAGIC_BYTES = len(MAGIC)
_HEADER = _MAGIC_BYTES + MAC_BYTES  # the magic and the MAC: the payload starts here
MAX_DATAGRAM = 4096
MAX_RANK = 1 << 20


# ------------------------------------------------------------------------------------- keys
HKDF_SALT = b"elastic-supervisor job token v2"
"""HKDF's salt (RFC 5869 section 3.1: a fixed, public value is allowed; it only separates this
use of the token from any other)."""
KEY_HEARTBEAT, KEY_CONTROL, KEY_HTTP = "heartbeat", "control", "http"
KEY_LABELS = {
    KEY_HEARTBEAT: b"elastic-supervisor v2 heartbeat frames, rank to controller",
    KEY_CONTROL: b"elastic-supervisor v2 control frames, controller to rank",
    KEY_HTTP: b"elastic-supervisor v2 http requests and answers",
}
"""HKDF's ``info`` for each derived key. On the wire implicitly: never change one (every rank of
a running gang derives its keys with these)."""
KEY_BYTES = 32


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-Extract then HKDF-Expand with HMAC-SHA256 (RFC 5869), from the standard library: the
    worker SDK runs in the job's own image, and this is a few lines of HMAC."""
    if not 0 < length <= 255 * 32:
        raise ValueError("HKDF-SHA256 makes 1 to 8160 bytes")
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


@dataclass(frozen=True)
class Keys:
    """The keys derived from one job token (:func:`derive_keys`). Their repr shows none of them."""

    heartbeat: bytes = field(repr=False)
    control: bytes = field(repr=False)
    http: bytes = field(repr=False)


@functools.lru_cache(maxsize=16)
def derive_keys(token: bytes) -> Keys:
    """The heartbeat, control and HTTP keys of the job token ``token`` (stripped, as read)."""
    return Keys(**{name: hkdf_sha256(token, salt=HKDF_SALT, info=label) for name, label in KEY_LABELS.items()})


_SHA256_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


@functools.lru_cache(maxsize=16)
def _keyed(key: bytes) -> "tuple[hashlib._Hash, hashlib._Hash]":
    """HMAC-SHA256's inner and outer hashes for ``key``, each past its first block (RFC 2104: the
    key, padded to a block, XOR ipad and XOR opad): what every MAC under ``key`` starts from."""
    if len(key) > _SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_SHA256_BLOCK, b"\0")
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


def _mac(key: bytes, payload: bytes) -> bytes:
    """HMAC-SHA256(key, payload), truncated to :data:`MAC_BYTES` (RFC 2104 section 5). The key
    schedule is done once per key (:func:`_keyed`), and each frame's MAC is six calls in C: the
    standard library's ``hmac`` object adds ~0.5 µs of Python per frame to the same hashes (the
    controller checks 16,384 frames a second)."""
    inner, outer = _keyed(key)
    inner = inner.copy()
    inner.update(payload)
    outer = outer.copy()
    outer.update(inner.digest())
    return outer.digest()[:MAC_BYTES]


def encode(payload: dict[str, Any], key: bytes) -> bytes:
    """One frame of ``payload`` under ``key`` (a derived key: :attr:`Keys.heartbeat` for a
    heartbeat, :attr:`Keys.control` for a control message)."""
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    frame = MAGIC + _mac(key, body) + body
    if len(frame) > MAX_DATAGRAM:
        raise ProtocolError(REJECT_OVERSIZED, f"{len(frame)} bytes > {MAX_DATAGRAM}")
    return frame


def _authenticated_body(frame: bytes, key: bytes) -> memoryview:
    """The payload of ``frame`` once its MAC checks out: a view into the frame, not a copy (the
    controller authenticates 16,384 frames of ~2 KiB a second)."""
    n = len(frame)
    if n > MAX_DATAGRAM:
        raise ProtocolError(REJECT_OVERSIZED, f"{n} bytes")
    if n < _HEADER + 2 or not frame.startswith(MAGIC):
        raise ProtocolError(REJECT_MALFORMED, "not an SV2 frame")
    body = memoryview(frame)[_HEADER:]
    if not hmac.compare_digest(frame[_MAGIC_BYTES:_HEADER], _mac(key, body)):
        raise ProtocolError(REJECT_UNAUTHENTICATED, "bad MAC (wrong token?)")
    return body


def decode_frame(frame: bytes, key: bytes) -> dict[str, Any]:
    """Authenticate and parse one frame into a JSON object (no schema check)."""
    body = _authenticated_body(frame, key)
    try:
        obj = json.loads(str(body, "utf-8"))  # UTF-8 only (the frame's definition); skips encoding detection
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError(REJECT_MALFORMED, "payload is not JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError(REJECT_SCHEMA, "payload is not an object")
    return obj


_BIG = 1 << 62
# The wire's bounds, on the types of Heartbeat's fields (msgspec checks them in C when decoding).
Str16 = Annotated[str, msgspec.Meta(max_length=16)]
Str32 = Annotated[str, msgspec.Meta(max_length=32)]
Str64 = Annotated[str, msgspec.Meta(max_length=64)]
Str128 = Annotated[str, msgspec.Meta(max_length=128)]
Str256 = Annotated[str, msgspec.Meta(max_length=256)]
Str512 = Annotated[str, msgspec.Meta(max_length=512)]
Str1024 = Annotated[str, msgspec.Meta(max_length=1024)]
Attempt = Annotated[int, msgspec.Meta(ge=0, le=1 << 31)]
Pid = Annotated[int, msgspec.Meta(ge=0, le=1 << 31)]
Rank = Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK)]
WorldSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_RANK)]
Count = Annotated[int, msgspec.Meta(ge=0, le=_BIG)]
Step = Annotated[int, msgspec.Meta(ge=-1, le=_BIG)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
"""A duration: finite (NaN and infinities fail the bounds), never negative."""
Phase = Literal[PHASES]
Outcome = Literal[OUTCOMES]
Source = Literal[SOURCES]
RestoreState = Literal[RESTORE_STATES]
"""The enumerated fields are checked in C as they are decoded, and decode to the vocabulary's own
string objects: no string made per heartbeat, none to free when the next one replaces it."""
RefusedPairs = Annotated[tuple[tuple[Annotated[str, msgspec.Meta(max_length=NAME_CHARS)],
                                     Annotated[str, msgspec.Meta(max_length=WHY_CHARS)]], ...],
                         msgspec.Meta(max_length=REFUSED_MAX)]
"""Checkpoints a restore refused, ``(name, why)`` pairs (:mod:`supervisor.protocol.skipped`)."""


MEDIAN_STEPS = 20
"""How many of its last steps a rank's ``step_median_s`` and ``work_median_s`` are the medians of."""
MEDIAN_MIN_STEPS = 3
"""The steps a rank has taken before it says those medians (fewer say too little)."""


class Heartbeat(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """What a rank says about itself, once per interval.

    One definition for both sides: the field types carry the wire's bounds (checked in C when a
    node frame's heartbeats are decoded straight into this class, or into a subclass that also
    fences them, :func:`_fenced_decoder`; :data:`_FIELDS` is read off them for the JSON object
    form). ``gc=False``: the controller holds one per rank (131,072 at the largest scale) and
    replaces each every interval; Python's garbage collector never has to walk them. In a node
    frame a heartbeat travels as an array in field order: a field is only ever added at the end,
    with a default (an older peer's shorter array reads as those defaults; a newer peer's longer
    one is read without the fields this side does not know).

    ``coll_seq`` counts collectives this rank has *entered*; ``coll_inside`` says whether the
    latest one is still running. Peers blocked in collective N while one rank sits at N-1
    outside any collective name that rank as the culprit.
    """

    job: Str128
    attempt: Attempt
    rank: Rank
    world_size: WorldSize
    seq: Count
    step: Step
    phase: Phase
    phase_s: Seconds
    launch: Str64 = ""
    """The id of the launch that started this rank (``SUPERVISOR_LAUNCH``): required on the wire."""
    node: Str256 = ""
    pid: Pid = 0
    coll_seq: Count = 0
    coll_op: Str64 = ""
    coll_inside: bool = False
    coll_s: Seconds = 0.0
    last_data_s: Seconds = 0.0
    last_compute_s: Seconds = 0.0
    last_collective_s: Seconds = 0.0
    last_step_s: Seconds = 0.0
    ckpt_step: Step = -1
    ckpt_state: Str32 = "idle"
    ckpt_s: Seconds = 0.0
    """How long the rank's last checkpoint save blocked its training loop."""
    ckpt_persist_s: Seconds = 0.0
    """An asynchronous save's whole time, from its start to its files on storage (0: the last
    save was blocking, or none finished yet): the next save cannot start before it."""
    loss_ok: bool = True
    watchdog: Str512 = ""
    stack_file: Str1024 = ""
    error: Str512 = ""
    """Phase ``failed``: the exception that is ending this rank (type and message, truncated)."""
    error_peer: bool = False
    """The error is a communication failure caused by another rank (a peer that died or hung)."""
    ckpt_root: Str512 = ""
    """The checkpoint root this rank saves to and restores from (absolute), once it is known."""
    restore_state: RestoreState = ""
    """One of :data:`RESTORE_STATES`: what this rank's restore came to ("" while not done)."""
    restored: Str64 = ""
    """The checkpoint this rank restored (``step-N``), or "" (none, or not yet)."""
    restore_refused: RefusedPairs = ()
    """Checkpoints the restore refused, with why: ``(name, reason)`` pairs, newest first, bounded
    (:mod:`supervisor.protocol.skipped`; an older SDK's ``restore_skipped`` string is read into it)."""
    restore_s: Seconds = 0.0
    """How long this rank's restore took (its own clock)."""
    steps_done: Count = 0
    """Steps this process completed (since its restore). Sent at once when the first completes."""
    first_step_s: Seconds = 0.0
    """From the end of the restore to the end of the first step (this rank's own clock)."""
    outcome: Outcome = ""
    """Phase ``done``: :data:`OUTCOME_FINISHED` (the training ran to its end) or
    :data:`OUTCOME_STOPPED` (it stopped early: a non-finite loss, a stop request); the reason
    is in ``error``."""
    dump_seq: Count = 0
    """The ``seq`` of the last stack-dump request this rank carried out (its stacks are on disk;
    sent at once): the controller's evidence wait ends when every rank it asked has answered."""
    source: Source = ""
    """Who filled this heartbeat: :data:`SOURCE_SDK` (or "", an older SDK) or :data:`SOURCE_TORCH`
    (the supervisor's instrumentation, from torch's optimizer hooks and flight recorder)."""
    coll_group: Str64 = ""
    """The process group ``coll_seq`` counts in (the flight recorder's group id), or "" (the SDK's
    own count of the collectives it wrapped)."""
    coll_groups: Str1024 = ""
    """Every process group's flight-recorder sequence numbers, ``GROUP=ENQUEUED/COMPLETED`` items
    joined by spaces (:func:`supervisor.protocol.groups.decode_groups`); "" from the SDK."""
    trace_file: Str1024 = ""
    """The flight recorder's trace, written with the stacks of the last dump request ("" if none)."""
    loop_step_s: Seconds = 0.0
    """The training loop's wall time per step (the median of this rank's last 16: from one step's
    end to the next's, less the time saves blocked it; 0 before two steps): what a step recomputed
    after a restore costs. ``last_step_s`` is the step's own time, without what the loop does
    around it."""
    step_median_s: Seconds = 0.0
    """The median of this rank's last :data:`MEDIAN_STEPS` steps' ``last_step_s`` (0 before
    :data:`MEDIAN_MIN_STEPS`): what calibrates the phase timeouts."""
    work_median_s: Seconds = 0.0
    """The median of its last :data:`MEDIAN_STEPS` steps' exposed work (``last_data_s`` +
    ``last_compute_s``; 0 before :data:`MEDIAN_MIN_STEPS`): its straggler score's numerator. The
    rank keeps its own history, so the controller keeps none per rank."""

    def to_payload(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in _FIELDS}
        d["type"] = "hb"
        return d

    @classmethod
    def from_payload(cls, obj: dict[str, Any]) -> "Heartbeat":
        # The controller's hot path (16,384 a second at scale): checks are precomputed and exact
        # JSON types take the short branch.
        if obj.get("type") != "hb":
            raise ProtocolError(REJECT_SCHEMA, "not a heartbeat")
        values = dict(_DEFAULTS)
        for name, code, lo, hi, required in _CHECKS:
            if name not in obj:
                if required:
                    raise ProtocolError(REJECT_SCHEMA, f"missing {name}")
                continue
            v = obj[name]
            t = type(v)
            if code == _INT:
                ok = (t is int or (t is not bool and isinstance(v, int))) and lo <= v <= hi
            elif code == _FLOAT:  # finite bounds: NaN and infinities fail the range test
                ok = (t is float or t is int or (t is not bool and isinstance(v, (int, float)))) and lo <= v <= hi
                if ok:
                    v = float(v)
            elif code == _BOOL:
                ok = t is bool
            elif code == _PAIRS:
                ok = t is list
                if ok:
                    v = decode_refused(v)
            else:
                ok = isinstance(v, str) and len(v) <= hi
            if not ok:
                raise ProtocolError(REJECT_SCHEMA, f"bad {name}: {v!r}"[:120])
            values[name] = v
        return _build(values)


def _spec(t: Any) -> tuple[type, float, float]:
    """(kind, low, high) of one field's wire type: a number's bounds, a string's or tuple's length."""
    if isinstance(t, msgspec.inspect.IntType):
        return int, t.ge, t.le
    if isinstance(t, msgspec.inspect.FloatType):
        return float, t.ge, t.le
    if isinstance(t, msgspec.inspect.StrType):
        return str, 0, t.max_length
    if isinstance(t, msgspec.inspect.LiteralType):  # (its values are checked by _checked)
        return str, 0, max(map(len, t.values))
    if isinstance(t, msgspec.inspect.BoolType):
        return bool, 0, 0
    if isinstance(t, msgspec.inspect.VarTupleType):
        return tuple, 0, t.max_length
    raise TypeError(f"a Heartbeat field of a type the wire does not carry: {t}")


_FIELDS: dict[str, tuple[type, float, float]] = {
    f.name: _spec(f.type) for f in msgspec.inspect.type_info(Heartbeat).fields}
"""Each heartbeat field's kind and bounds, read off :class:`Heartbeat`'s annotations."""
_REQUIRED = {"job", "attempt", "rank", "world_size", "seq", "step", "phase", "phase_s", "launch"}
_LEGACY = {"restore_skipped": (str, 0, LEGACY_CHARS)}
"""Fields an older SDK sends that this one does not: read, then folded into their successor (_build)."""
_WIRE_FIELDS = _FIELDS | _LEGACY
_INT, _FLOAT, _BOOL, _STR, _PAIRS = range(5)
_CHECKS = tuple((name, {int: _INT, float: _FLOAT, bool: _BOOL, str: _STR, tuple: _PAIRS}[kind], lo, hi,
                 name in _REQUIRED) for name, (kind, lo, hi) in _WIRE_FIELDS.items())
_PHASE_SET = frozenset(PHASES)
_RESTORE_SET = frozenset(RESTORE_STATES)
_OUTCOME_SET = frozenset(OUTCOMES)
_SOURCE_SET = frozenset(SOURCES)
_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(Heartbeat) if f.default is not msgspec.NODEFAULT}
_DEFAULTS["restore_skipped"] = ""


def _build(values: dict[str, Any]) -> Heartbeat:
    """The heartbeat, from every wire field typed and in range (an older SDK's
    ``restore_skipped`` folded into its successor), checked across fields."""
    legacy = values.pop("restore_skipped")
    if legacy and not values["restore_refused"]:
        values["restore_refused"] = decode_refused(legacy)
    return _checked(Heartbeat(**values))


def _checked(hb: Heartbeat) -> Heartbeat:
    """``hb`` (its fields each typed and in range) if its fields agree with each other and name
    known phases, outcomes, sources and restore states; ProtocolError (schema) otherwise."""
    if hb.rank >= hb.world_size:
        raise ProtocolError(REJECT_SCHEMA, "rank >= world_size")
    if hb.phase not in _PHASE_SET:
        raise ProtocolError(REJECT_SCHEMA, f"unknown phase {hb.phase!r}"[:120])
    if hb.outcome not in _OUTCOME_SET:
        raise ProtocolError(REJECT_SCHEMA, f"unknown outcome {hb.outcome!r}"[:120])
    if hb.coll_groups:
        decode_groups(hb.coll_groups)  # ProtocolError (schema) when it is not GROUP=ENQUEUED/COMPLETED items
    if hb.source not in _SOURCE_SET:
        raise ProtocolError(REJECT_SCHEMA, f"unknown source {hb.source!r}"[:120])
    if hb.restore_state not in _RESTORE_SET:
        raise ProtocolError(REJECT_SCHEMA, f"unknown restore_state {hb.restore_state!r}"[:120])
    return hb


# The same schema as Heartbeat's field types (and an older SDK's restore_skipped), as the JSON object a
# rank sends, decoded and checked in C: several times cheaper per heartbeat than json.loads +
# from_payload (docs/benchmarks/heartbeat_intake.md).
_LEGACY_TYPES = {"restore_skipped": Annotated[str, msgspec.Meta(max_length=LEGACY_CHARS)]}
_WIRE = msgspec.defstruct(
    "_WireHeartbeat",
    [("type", Literal["hb"])]
    + [(f.name, f.type) for f in msgspec.structs.fields(Heartbeat) if f.name in _REQUIRED]
    + [(f.name, f.type, _DEFAULTS[f.name]) for f in msgspec.structs.fields(Heartbeat) if f.name not in _REQUIRED]
    + [(name, kind, _DEFAULTS[name]) for name, kind in _LEGACY_TYPES.items()],
    kw_only=True, gc=False,
)
_WIRE_DECODER = msgspec.json.Decoder(_WIRE)
_to_dict = msgspec.structs.asdict


def _decoded(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    """``body`` decoded and checked by ``decoder`` (in C), its failures as the protocol's error."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ProtocolError(REJECT_SCHEMA, str(exc)[:120]) from None
    except msgspec.DecodeError:
        raise ProtocolError(REJECT_MALFORMED, "payload is not JSON") from None


def decode_heartbeat(frame: bytes, key: bytes) -> Heartbeat:
    """Authenticate (``key``: :attr:`Keys.heartbeat`), parse and check one heartbeat frame (what
    :meth:`Heartbeat.from_payload` accepts from :func:`decode_frame`, in one pass). Whose launch
    it is, is the caller's check (one string compare)."""
    wire = _decoded(_WIRE_DECODER, _authenticated_body(frame, key))
    values = _to_dict(wire)
    del values["type"]
    return _build(values)


CONTROL_KINDS = ("ack", "abort", "dump")


class ControlSequencer:
    """Numbers one controller's control messages (``seq``); a rank accepts only a number above
    the last one it accepted, so a captured frame cannot be replayed.

    The numbers are strictly increasing and start at the wall clock in nanoseconds: a controller
    restarted after a crash, whose adopted ranks accepted its predecessor's numbers, numbers
    above them without any saved state (unless the clock was set back by more than the outage).
    """

    def __init__(self, floor: int = 0) -> None:
        self.last = floor
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self.last = max(self.last + 1, time.time_ns())
            return self.last


_CONTROL_SEQ = ControlSequencer()


def control_message(kind: str, *, attempt: int, rank: int, reason: str = "", seq: int | None = None,
                    launch: str = "") -> dict[str, Any]:
    """A control message for one rank of launch ``launch``; ``seq`` defaults to the next number of
    this process's :class:`ControlSequencer` (one controller per process). The controller's
    intake stamps its current launch on whatever it sends."""
    if kind not in CONTROL_KINDS:
        raise ValueError(f"unknown control message {kind!r}")
    if seq is None:
        seq = _CONTROL_SEQ.next()
    return {"type": kind, "launch": launch, "attempt": attempt, "rank": rank, "seq": seq, "reason": reason[:400]}


@dataclass(frozen=True)
class Control:
    kind: str
    attempt: int
    rank: int
    seq: int
    reason: str = ""
    launch: str = ""


def decode_control(frame: bytes, key: bytes) -> Control:
    """Authenticate (``key``: :attr:`Keys.control`) and check one control message (what a rank
    receives); ProtocolError otherwise. Whose launch it is, is the rank's check."""
    obj = decode_frame(frame, key)
    kind = obj.get("type")
    if kind not in CONTROL_KINDS:
        raise ProtocolError(REJECT_SCHEMA, f"not a control message: {kind!r}"[:120])
    values = {}
    for name, hi in (("attempt", 1 << 31), ("rank", MAX_RANK), ("seq", _BIG)):
        v = obj.get(name)
        if type(v) is not int or not 0 <= v <= hi:
            raise ProtocolError(REJECT_SCHEMA, f"bad {name}: {v!r}"[:120])
        values[name] = v
    reason = obj.get("reason", "")
    if not isinstance(reason, str):
        raise ProtocolError(REJECT_SCHEMA, "bad reason")
    launch = obj.get("launch")
    if not isinstance(launch, str) or len(launch) > 64:
        raise ProtocolError(REJECT_SCHEMA, f"bad launch: {launch!r}"[:120])
    return Control(kind=kind, reason=reason[:400], launch=launch, **values)


# ------------------------------------------------------------------------------ node frames
NODE_FRAME_PREFIX = b'{"type":"node"'
"""How a node frame's payload begins (``type`` is written first): the intake tells the two kinds
of heartbeat frame apart by it, after the MAC."""
MAX_HELD_S = 60.0
"""The longest a node's agent may say it held a heartbeat (``held``) before sending it on."""
MAX_NODE_BEATS = 1024
NODE_FRAMES_VERSION = 2
"""The node frame's format. The controller asks agents for node frames of this format
(:func:`aggregate_setting`); an agent that makes another reads no setting it knows, starts no
relay, and its ranks send their own heartbeats, which every controller reads (version 1, before
heartbeats travelled as arrays, was a JSON object per heartbeat against a shared ``common``)."""


def aggregate_setting(flush_s: float | None) -> str:
    """``SUPERVISOR_AGGREGATE`` as the controller sets it: ``VERSION:SECONDS`` (node frames of
    :data:`NODE_FRAMES_VERSION`, sent every ``flush_s``), or ``off``."""
    return f"{NODE_FRAMES_VERSION}:{flush_s}" if flush_s else "off"


def aggregate_flush_s(value: str) -> float | None:
    """How often to send node frames, as ``SUPERVISOR_AGGREGATE`` asks (:func:`aggregate_setting`):
    None where it asks for none, for another format (a controller of another version: an older
    one set a bare number), or for a period outside [0.05, 60] s."""
    version, sep, seconds = value.partition(":")
    if not sep or version != str(NODE_FRAMES_VERSION):
        return None
    try:
        every = float(seconds)
    except ValueError:
        return None
    return every if 0.05 <= every <= 60.0 else None
_HB_FIELDS = Heartbeat.__struct_fields__
_HB_DEFAULTS = tuple(_DEFAULTS.get(name, msgspec.NODEFAULT) for name in _HB_FIELDS)
_MIN_ITEMS = _HB_FIELDS.index("launch") + 1
"""A heartbeat array is never cut shorter than this: up to ``launch``, every field the JSON
object form requires."""
_HELD_ROOM = len(b",60.000")
_ENCODER = msgspec.json.Encoder()


def encode_node_frames(beats: "list[tuple[Heartbeat, float]]", key: bytes) -> list[bytes]:
    """Heartbeats of one node's ranks, each with how long the agent held it (seconds, to the
    millisecond), in as few frames of at most :data:`MAX_DATAGRAM` bytes as they fit in (greedily,
    in order), under the heartbeat key as a rank's own heartbeat is::

        {"type":"node","held":[H0,H1,...],"beats":[[JOB,ATTEMPT,RANK,...],...]}

    Each heartbeat is an array of :class:`Heartbeat`'s fields in their order, its trailing fields
    that hold their defaults left out (never those up to ``launch``); ``held[i]`` is how long the
    agent held ``beats[i]``. A single heartbeat too large for a frame is refused as it would be on
    its own."""
    room = MAX_DATAGRAM - len(MAGIC) - MAC_BYTES - len(b'{"type":"node","held":[],"beats":[]}')
    frames: list[bytes] = []
    parts: list[bytes] = []
    helds: list[float] = []
    size = 0
    for hb, held in beats:
        values = msgspec.structs.astuple(hb)
        n = len(values)
        while n > _MIN_ITEMS and values[n - 1] == _HB_DEFAULTS[n - 1]:
            n -= 1
        part = _ENCODER.encode(values[:n])
        if len(part) + _HELD_ROOM > room:
            raise ProtocolError(REJECT_OVERSIZED, f"one heartbeat of rank {hb.rank} does not fit a frame")
        if parts and (size + len(part) + 1 + _HELD_ROOM > room or len(parts) >= MAX_NODE_BEATS):
            frames.append(_node_frame(helds, parts, key))
            parts, helds, size = [], [], 0
        parts.append(part)
        helds.append(round(min(max(held, 0.0), MAX_HELD_S), 3))
        size += len(part) + 1 + _HELD_ROOM
    if parts:
        frames.append(_node_frame(helds, parts, key))
    return frames


def _node_frame(helds: list[float], parts: list[bytes], key: bytes) -> bytes:
    body = b'{"type":"node","held":' + _ENCODER.encode(helds) + b',"beats":[' + b",".join(parts) + b"]}"
    frame = MAGIC + _mac(key, body) + body
    if len(frame) > MAX_DATAGRAM:  # encode_node_frames sized it: a bug if not
        raise ProtocolError(REJECT_OVERSIZED, f"{len(frame)} bytes > {MAX_DATAGRAM}")
    return frame


def is_node_frame(frame: bytes) -> bool:
    """Whether ``frame``'s payload is a node frame (not yet authenticated: only a hint)."""
    return frame.startswith(NODE_FRAME_PREFIX, _HEADER)


_Held = Annotated[list[Annotated[float, msgspec.Meta(ge=0, le=MAX_HELD_S)]], msgspec.Meta(max_length=MAX_NODE_BEATS)]


class _WireNode(msgspec.Struct, gc=False):
    type: Literal["node"]
    held: _Held
    beats: Annotated[list[Heartbeat], msgspec.Meta(min_length=1, max_length=MAX_NODE_BEATS)]


_NODE_DECODER = msgspec.json.Decoder(_WireNode)


Fence = tuple[str, int, str, int]
"""What the controller expects of every heartbeat it records: ``(launch, attempt, job, world_size)``."""


def _same_fields(self: Heartbeat, other: Any) -> Any:
    """A fenced heartbeat's ``==``: equal to any :class:`Heartbeat` of the same values."""
    if not isinstance(other, Heartbeat):
        return NotImplemented
    return msgspec.structs.astuple(self) == msgspec.structs.astuple(other)


def _other_fields(self: Heartbeat, other: Any) -> Any:
    same = _same_fields(self, other)
    return same if same is NotImplemented else not same


def _hash_as_heartbeat(self: Heartbeat) -> int:
    """A fenced heartbeat's hash: that of the :class:`Heartbeat` it equals (msgspec's hash is its type's too)."""
    return hash(Heartbeat(*msgspec.structs.astuple(self)))


def _as_heartbeat(self: Heartbeat) -> tuple:
    """A fenced heartbeat pickles as the :class:`Heartbeat` it equals (its class is made at run time)."""
    return Heartbeat, msgspec.structs.astuple(self)


def _on_the_wire(name: str, value: Any) -> bool:
    """Whether ``value`` is one :class:`Heartbeat`'s field ``name`` can hold on the wire (its type,
    its bounds: :data:`_FIELDS`)."""
    kind, lo, hi = _FIELDS[name]
    if type(value) is not kind:
        return False
    return lo <= len(value) <= hi if kind is str else lo <= value <= hi


@functools.lru_cache(maxsize=8)
def _fenced_decoder(fence: Fence) -> msgspec.json.Decoder | None:
    """A decoder of the node frames whose every heartbeat is of ``fence`` (a launch, attempt, job
    and world size; a rank below the world size), refusing any other: the fence is checked in C
    as each heartbeat is decoded, and its four fields decode to the fence's own objects (no string
    per heartbeat for the job and the launch, no int for the world size: nothing to make, nothing
    to free when the next heartbeat replaces it). Its heartbeats are of a subclass of
    :class:`Heartbeat` with the fields' types narrowed (the same fields, in the same order; equal
    to, hashed and pickled as a :class:`Heartbeat` of the same values). None where no heartbeat
    on the wire could be of ``fence`` (a value of another type or outside the field's bounds):
    the frames then go the general way. One per launch and attempt; the last 8 are kept (each
    class ~6 KiB; typing's own caches may keep a few hundred of them alive at most)."""
    launch, attempt, job, world = fence
    if not all(map(_on_the_wire, ("launch", "attempt", "job", "world_size"), fence)):
        return None
    beat = msgspec.defstruct(
        "Heartbeat",
        [("job", Literal[job]), ("attempt", Literal[attempt]),
         ("rank", Annotated[int, msgspec.Meta(ge=0, lt=world)]), ("world_size", Literal[world]),
         ("launch", Literal[launch])],
        bases=(Heartbeat,), frozen=True, gc=False, array_like=True, module=__name__,
        namespace={"__eq__": _same_fields, "__ne__": _other_fields, "__hash__": _hash_as_heartbeat,
                   "__reduce__": _as_heartbeat},
    )
    node = msgspec.defstruct(
        "_FencedNode",
        [("type", Literal["node"]), ("held", _Held),
         ("beats", Annotated[list[beat], msgspec.Meta(min_length=1, max_length=MAX_NODE_BEATS)])],
        gc=False, module=__name__,
    )
    return msgspec.json.Decoder(node)


def decode_node_beats(frame: bytes, key: bytes, fence: Fence | None = None) -> tuple[list[Heartbeat], list[float], bool]:
    """Authenticate (the heartbeat key) and check one node frame: its heartbeats, how long the
    node's agent held each, and whether every one of them is of ``fence`` (the caller's launch,
    attempt, job and world size), every heartbeat checked as a rank's own frame would be (one bad
    heartbeat refuses the frame: one agent made all of it). The controller's hot path (16,384
    frames a second at 131,072 ranks): a frame all of the fence is decoded and fenced in one pass
    in C (:func:`_fenced_decoder`); any other is decoded again without the fence, checked, and
    returned with False (its heartbeats are then fenced one by one by the caller)."""
    body = _authenticated_body(frame, key)
    # (no fence with no launch: an empty one would match a heartbeat missing its own; with no
    # world size, the intake fences none: every heartbeat goes through the checks one by one)
    decoder = _fenced_decoder(fence) if fence is not None and fence[0] and fence[3] else None
    wire = None
    if decoder is not None:
        try:
            wire = decoder.decode(body)
        except msgspec.DecodeError:  # (a ValidationError too) not all of the fence, or not good at all
            pass
    fenced = wire is not None
    if not fenced:
        wire = _decoded(_NODE_DECODER, body)
    beats = wire.beats
    if len(wire.held) != len(beats):
        raise ProtocolError(REJECT_SCHEMA, f"{len(wire.held)} held times for {len(beats)} heartbeats")
    if fenced:
        # every field's type and bounds, the enumerations and the fence (rank < world size
        # included) were checked by the decoder; what is left are the collective groups
        for hb in beats:
            if hb.coll_groups:
                decode_groups(hb.coll_groups)  # ProtocolError (schema) when it is not GROUP=ENQUEUED/COMPLETED items
        return beats, wire.held, True
    for hb in beats:  # what _checked does, inline: a function call per heartbeat costs more than these
        if hb.rank >= hb.world_size or not hb.launch or hb.coll_groups:
            if not hb.launch:
                raise ProtocolError(REJECT_SCHEMA, "missing launch")
            _checked(hb)
    return beats, wire.held, False


def decode_node_frame(frame: bytes, key: bytes) -> list[tuple[Heartbeat, float]]:
    """:func:`decode_node_beats` as ``(heartbeat, held)`` pairs."""
    beats, held, _ = decode_node_beats(frame, key)
    return list(zip(beats, held))


# ------------------------------------------------------------------------------ launches
LAUNCH_ID_CHARS = 32


def new_launch_id() -> str:
    """A launch's id: 128 random bits, hex (what the controller puts in ``SUPERVISOR_LAUNCH``)."""
    return secrets.token_hex(LAUNCH_ID_CHARS // 2)


def launch_problem(launch: str) -> str | None:
    """Why ``launch`` cannot be a launch id (16 to 64 lowercase hex digits), or None."""
    if not 16 <= len(launch) <= 64 or not all(c in "0123456789abcdef" for c in launch):
        return f"{launch[:80]!r} is not a launch id (16 to 64 lowercase hex digits)"
    return None

# ------------------------------------------------------------------------------ the job token
TOKEN_MIN_CHARS = 48
"""A job token is at least this many hex digits (192 bits): what the controller generates."""
TOKEN_MAX_CHARS = 4096


def token_problem(token: bytes) -> str | None:
    """Why ``token`` (stripped) cannot be a job token, or None: too short (an empty or truncated
    file would make the MAC key guessable), too long, or not hex."""
    if len(token) < TOKEN_MIN_CHARS:
        return f"{len(token)} bytes, not a token of at least {TOKEN_MIN_CHARS} hex digits (empty or truncated?)"
    if len(token) > TOKEN_MAX_CHARS:
        return f"over {TOKEN_MAX_CHARS} bytes"
    if not all(c in b"0123456789abcdefABCDEF" for c in token):
        return f"{len(token)} bytes that are not all hex digits, not a token of at least {TOKEN_MIN_CHARS} hex digits"
    return None
