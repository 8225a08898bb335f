"""Issue 24 §1-2: no key on the wire, and frames that belong to one launch.

The wire contract's pieces first (HKDF against RFC 5869, the restore-point request bound to every
field, the bounded nonce cache). Then real jobs (local platform, 2 ranks, real torchrun and gloo)
whose every datagram and HTTP exchange between ranks and controller crosses a recording proxy
(:class:`Recorder`; the ranks are pointed at it by ``tests/workloads/via_proxy.py``, nothing else
changes): nothing recorded holds the token or a key derived from it; forgeries made from the
recording are refused and counted; a heartbeat and an abort captured in one run and replayed,
byte for byte, into the next run of the same job with the same token (the Kubernetes
``token.existingSecret`` way: ``tests/workloads/existing_secret_launch.py``) are refused,
counted by reason, and change nothing.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import hmac
import json
import re
import secrets
import select
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, TRAIN, SupervisorRun, kill_leftovers
from supervisor.protocol import (
    HEADER_MAC,
    HEADER_NONCE,
    HEADER_TIME,
    MAC_BYTES,
    MAGIC,
    RESTORE_POINT_PATH,
    NonceCache,
    ProtocolError,
    check_restore_request,
    decode_control,
    decode_frame,
    decode_heartbeat,
    derive_keys,
    encode,
    hkdf_sha256,
    new_launch_id,
    restore_request,
)

TOKEN = b"ab" * 24
KEYS = derive_keys(TOKEN)
LAUNCH = new_launch_id()


# ------------------------------------------------------------------------------ the contract
def test_hkdf_is_rfc_5869():
    # RFC 5869 appendix A, test cases 1 and 3 (HMAC-SHA256; case 3: no salt, no info)
    ikm = bytes([0x0B] * 22)
    assert hkdf_sha256(ikm, salt=bytes(range(13)), info=bytes(range(0xF0, 0xFA)), length=42).hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")
    assert hkdf_sha256(ikm, salt=b"", info=b"", length=42).hex() == (
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")


@pytest.mark.parametrize("key", [b"", bytes([0x0B] * 20), KEYS.heartbeat, bytes(range(64)), bytes([0xAA] * 131)])
def test_the_frame_mac_is_hmac_sha256_for_a_key_of_any_length(key):
    # the MAC is computed from HMAC-SHA256's two keyed states (RFC 2104; a key longer than a block
    # is hashed first, RFC 4231 case 6's 131 bytes): it must be the standard library's HMAC
    payload = {"type": "dump", "launch": LAUNCH, "attempt": 1, "rank": 0, "seq": 7, "reason": "x" * 300}
    made = encode(payload, key)
    body = made[len(MAGIC) + MAC_BYTES:]
    assert made[len(MAGIC):len(MAGIC) + MAC_BYTES] == hmac.new(key, body, hashlib.sha256).digest()[:MAC_BYTES]
    assert decode_frame(frame(payload, key), key) == payload
    with pytest.raises(ProtocolError) as err:
        decode_frame(frame(payload, key + b"x"), key)
    assert err.value.reason == "unauthenticated"


def test_three_independent_keys_none_of_them_the_token():
    keys = [KEYS.heartbeat, KEYS.control, KEYS.http]
    assert len(set(keys)) == 3 and all(len(k) == 32 and TOKEN not in k for k in keys)
    assert derive_keys(bytes(TOKEN)) == KEYS and derive_keys(b"cd" * 24).heartbeat != KEYS.heartbeat
    assert "heartbeat=" not in repr(KEYS) and KEYS.http.hex() not in repr(KEYS)


def signed_fields(now: float):
    req = restore_request(KEYS, launch=LAUNCH, attempt=4, rank=0, now=now)
    query = dict(part.split("=") for part in req.query.split("&"))
    return req, query


def test_a_restore_request_is_bound_to_its_method_path_launch_attempt_rank_time_and_nonce():
    now = time.time()
    req, query = signed_fields(now)
    ok = dict(method="GET", path=RESTORE_POINT_PATH, query=query, headers=req.headers, now=now)
    assert check_restore_request(KEYS.http, nonces=NonceCache(), **ok) == (LAUNCH, 4, 0)
    changed = [
        {"method": "POST"}, {"path": "/v1/restore-point/"},
        {"query": query | {"launch": new_launch_id()}}, {"query": query | {"attempt": "5"}},
        {"query": query | {"rank": "1"}},
        {"headers": req.headers | {HEADER_TIME: str(int(req.headers[HEADER_TIME]) + 1)}},
        {"headers": req.headers | {HEADER_NONCE: secrets.token_hex(16)}},
        {"headers": req.headers | {HEADER_MAC: "0" * 64}},
    ]
    for change in changed:
        with pytest.raises(ProtocolError) as exc:
            check_restore_request(KEYS.http, nonces=NonceCache(), **(ok | change))
        assert exc.value.reason == "unauthenticated", change
    with pytest.raises(ProtocolError) as exc:  # the right MAC under another job's key
        check_restore_request(derive_keys(b"cd" * 24).http, nonces=NonceCache(), **ok)
    assert exc.value.reason == "unauthenticated"
    for late in (now + 31, now - 31):  # outside the freshness window, either way
        with pytest.raises(ProtocolError) as exc:
            check_restore_request(KEYS.http, nonces=NonceCache(), **(ok | {"now": late}))
        assert exc.value.reason == "stale"
    nonces = NonceCache()
    check_restore_request(KEYS.http, nonces=nonces, **ok)
    with pytest.raises(ProtocolError) as exc:
        check_restore_request(KEYS.http, nonces=nonces, **ok)
    assert exc.value.reason == "replayed"


def test_the_nonce_cache_is_bounded_and_never_takes_a_nonce_twice():
    cache = NonceCache(window_s=30, limit=4)
    now = 1_000_000
    for i in range(4):
        assert cache.admit(f"n{i}", now + i, now + i)
    assert cache.admit("n4", now + 4, now + 4) and len(cache) == 4  # the oldest went; its time is a floor
    assert not cache.admit("n0", now, now + 5)          # so the dropped nonce is still refused
    assert not cache.admit("fresh", now, now + 5)       # and so is anything stamped at or before it
    assert not cache.admit("n3", now + 3, now + 5)      # a nonce it holds is refused
    assert cache.admit("n5", now + 5, now + 5)
    # past the window every entry expires (the freshness check refuses those requests anyway)
    assert cache.admit("late", now + 40_000, now + 40_000) and len(cache) == 1


# ------------------------------------------------------------------------------ the recorder
class Recorder:
    """A man in the middle between the ranks and their controller, recording every datagram each
    way and every byte of every HTTP exchange, and able to send datagrams to a rank from the
    address its controller speaks from (what an attacker on the path, or one spoofing the
    controller's address, can do). The controller's ports come from its state file (``run``:
    the run whose file it must be)."""

    def __init__(self, state_path: Path, run: int = 1) -> None:
        self.state_path, self.run = state_path, run
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.tcp.settimeout(0.1)
        self.up: list[tuple[tuple, bytes]] = []    # (rank address, datagram): rank -> controller
        self.down: list[tuple[tuple, bytes]] = []  # (rank address, datagram): controller -> rank
        self.http: list[dict[str, bytearray]] = []  # per connection: every byte of the request, of the answer
        self._lock = threading.Lock()
        self._upstream: dict[tuple, socket.socket] = {}
        self._rank_of: dict[socket.socket, tuple] = {}
        self._ports: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._udp_loop, daemon=True),
                         threading.Thread(target=self._tcp_loop, daemon=True)]
        for t in self._threads:
            t.start()

    @property
    def env(self) -> dict[str, str]:
        return {"WIRE_PROXY_UDP": f"127.0.0.1:{self.udp.getsockname()[1]}",
                "WIRE_PROXY_HTTP": f"http://127.0.0.1:{self.tcp.getsockname()[1]}"}

    def ports(self) -> tuple[int, int]:
        """(intake, http) of the controller."""
        deadline = time.monotonic() + 90
        while self._ports is None:
            try:
                st = json.loads(self.state_path.read_text())
            except (OSError, ValueError):
                st = {}
            if st.get("run") == self.run and st.get("intake_port") and st.get("http_port"):
                self._ports = (st["intake_port"], st["http_port"])
            elif time.monotonic() > deadline:
                raise AssertionError(f"no state of run {self.run} in {self.state_path}")
            else:
                time.sleep(0.05)
        return self._ports

    def inject(self, frame: bytes, rank_addr: tuple) -> None:
        """A datagram to a rank, from the address its controller answers from."""
        self.udp.sendto(frame, rank_addr)

    def from_ranks(self) -> list[tuple[tuple, bytes]]:
        with self._lock:
            return list(self.up)

    def to_ranks(self) -> list[tuple[tuple, bytes]]:
        with self._lock:
            return list(self.down)

    def exchanges(self) -> list[dict[str, bytes]]:
        with self._lock:
            return [{k: bytes(v) for k, v in ex.items()} for ex in self.http]

    def blobs(self) -> list[bytes]:
        """Every datagram and every HTTP request and answer recorded."""
        return [d for _, d in self.from_ranks() + self.to_ranks()] + [
            b for ex in self.exchanges() for b in ex.values()]

    def _udp_loop(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.udp, *self._upstream.values()], [], [], 0.05)
            for s in ready:
                try:
                    data, addr = s.recvfrom(65536)
                except OSError:  # the controller went away (port unreachable): nothing to relay
                    continue
                if s is self.udp:
                    with self._lock:
                        self.up.append((addr, data))
                    up = self._upstream.get(addr)
                    if up is None:
                        up = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        up.connect(("127.0.0.1", self.ports()[0]))
                        self._upstream[addr], self._rank_of[up] = up, addr
                    try:
                        up.send(data)
                    except OSError:
                        pass
                else:
                    rank = self._rank_of[s]
                    with self._lock:
                        self.down.append((rank, data))
                    self.udp.sendto(data, rank)

    def _tcp_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        exchange = {"request": bytearray(), "answer": bytearray()}
        with self._lock:
            self.http.append(exchange)
        up = socket.create_connection(("127.0.0.1", self.ports()[1]), timeout=30)

        def pump(src: socket.socket, dst: socket.socket, into: bytearray) -> None:
            try:
                while chunk := src.recv(65536):
                    with self._lock:
                        into += chunk
                    dst.sendall(chunk)
            except OSError:
                pass
            finally:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        back = threading.Thread(target=pump, args=(up, conn, exchange["answer"]), daemon=True)
        back.start()
        pump(conn, up, exchange["request"])
        back.join(30)
        conn.close()
        up.close()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for s in [self.udp, self.tcp, *self._upstream.values()]:
            s.close()


# ------------------------------------------------------------------------------ the jobs
VIA_PROXY = REPO / "tests" / "workloads" / "via_proxy.py"
EXISTING_SECRET = REPO / "tests" / "workloads" / "existing_secret_launch.py"
STEPS = 40
JOB = ["--steps", str(STEPS), "--checkpoint-every", "5", "--step-sleep", "0.1"]
HANG = "kind=hang,rank=1,step=8,attempt=0"  # found as a hang: the controller dumps, then aborts rank 1


class WireRun(SupervisorRun):
    """``supervisor launch`` of the example job (2 nodes, a rank each) whose ranks talk to their
    controller through ``recorder``; ``launcher``: a script run instead of ``-m supervisor``."""

    def __init__(self, tmp: Path, recorder: Recorder, *, fault: str | None = None, launcher: Path | None = None,
                 env: dict[str, str] | None = None, ckpt: Path | None = None) -> None:
        self.recorder, self.launcher, self.extra_env, self.ckpt_dir = recorder, launcher, env or {}, ckpt
        super().__init__(tmp, JOB, fault=fault)

    def start(self) -> None:
        cmd = [str(VIA_PROXY) if c == str(TRAIN) else c for c in self.cmd]
        if self.launcher is not None:
            i = cmd.index("-m")
            cmd[i:i + 2] = [str(self.launcher)]
        if self.ckpt_dir is not None:
            self.ckpt = self.ckpt_dir
            cmd[cmd.index("--checkpoint-dir") + 1] = str(self.ckpt_dir)
        self.cmd = cmd
        self.env.update(self.recorder.env | self.extra_env)
        super().start()


@pytest.fixture
def wire(tmp_path):
    made: list = []

    def make(kind, *args, **kw):
        thing = kind(*args, **kw)
        made.append(thing)
        return thing

    yield make
    for thing in reversed(made):
        if isinstance(thing, WireRun):
            thing.kill()
            kill_leftovers(thing.log_dir)
        else:
            thing.close()


def heartbeats(recorder: Recorder, keys):
    """(rank address, frame, heartbeat) of every datagram a rank sent (all authentic)."""
    return [(addr, data, decode_heartbeat(data, keys.heartbeat)) for addr, data in recorder.from_ranks()]


def orders(recorder: Recorder, keys):
    """(rank address, frame, order) of every datagram the controller sent a rank (all authentic)."""
    return [(addr, data, decode_control(data, keys.control)) for addr, data in recorder.to_ranks()]


def wait_until(what: str, cond, run: WireRun, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        assert run.proc.poll() is None, f"the job ended before {what}:\n{run.output()[-4000:]}"
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}:\n{run.output()[-4000:]}")


def status(http_port: int) -> dict:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=10).read())


def secrets_of(token: bytes) -> dict[str, bytes]:
    """Everything that would let its holder verify or make a frame, in the forms it could travel in."""
    keys = derive_keys(token)
    out = {"token": token, "token (raw)": bytes.fromhex(token.decode()), "token (base64)": base64.b64encode(token)}
    for name in ("heartbeat", "control", "http"):
        key = getattr(keys, name)
        out |= {f"{name} key": key, f"{name} key (hex)": key.hex().encode(), f"{name} key (base64)": base64.b64encode(key)}
    return out


def candidate_keys(recorder: Recorder) -> list[bytes]:
    """What a sniffer could try as a key: every hex string in the recording (nonces, MACs, launch
    ids), as text and as bytes, and every frame's MAC."""
    found: set[bytes] = {b""}
    for blob in recorder.blobs():
        for m in re.findall(rb"[0-9a-fA-F]{16,}", blob):
            found.add(m)
            if len(m) % 2 == 0:
                found.add(bytes.fromhex(m.decode()))
        if blob.startswith(MAGIC):
            found.add(blob[len(MAGIC):len(MAGIC) + MAC_BYTES])
    return sorted(found)


def frame(payload: dict, key: bytes) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return MAGIC + hmac.new(key, body, hashlib.sha256).digest()[:MAC_BYTES] + body


def paced(send, frames: list[bytes]) -> None:
    """Send ``frames`` in bursts a socket buffer holds (a refusal is counted only if it arrives)."""
    for i, f in enumerate(frames):
        send(f)
        if i % 16 == 15:
            time.sleep(0.02)


def rank_refusals(log_dir: Path, attempt: int) -> list[dict]:
    """The ``totals`` of every control_message_rejected line the ranks of ``attempt`` logged."""
    out = []
    for path in sorted((log_dir / f"attempt-{attempt}").glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            m = re.search(r"event=control_message_rejected .*totals=(\{[^}]*\})", line)
            if m:
                out.append(ast.literal_eval(m.group(1)))
    return out


def test_nothing_recorded_verifies_a_frame_and_forgeries_made_from_the_recording_are_refused(tmp_path, wire):
    log_dir = tmp_path / "sv-logs"
    rec = wire(Recorder, log_dir / "supervisor-state.json")
    run = wire(WireRun, tmp_path, rec, fault=HANG)
    token_path = log_dir / "token"
    wait_until("the job token", token_path.exists, run)
    token = token_path.read_bytes().strip()
    keys = derive_keys(token)
    intake, http = rec.ports()

    def relaunched():  # both ranks of attempt 1 are past their restore
        latest = {h.rank: (addr, h) for addr, _, h in heartbeats(rec, keys) if h.attempt == 1 and h.steps_done}
        return latest if len(latest) == 2 else None

    ranks = wait_until("attempt 1 training", relaunched, run)
    rank1_addr, hb1 = ranks[1]
    # the orders of attempt 0: stack dumps for both ranks, then rank 1's abort
    recorded = orders(rec, keys)
    abort_frame = next(data for _, data, o in recorded if o.kind == "abort")
    abort = decode_frame(abort_frame, keys.control)
    assert abort["attempt"] == 0 and abort["rank"] == 1
    assert {o.kind for _, _, o in recorded} == {"dump", "abort"}

    # forged heartbeats (rank 1 says it finished, far ahead) and aborts for the running attempt,
    # each under every key a sniffer could take from the recording, and each genuine MAC kept
    # over the changed body
    done = hb1.to_payload() | {"phase": "done", "outcome": "finished", "step": 10**6, "seq": hb1.seq + 10**6}
    order = abort | {"attempt": 1, "launch": hb1.launch, "seq": abort["seq"] + 10**6, "reason": "forged"}
    genuine_hb = next(data for _, data, h in heartbeats(rec, keys) if h.attempt == 1)
    forged_hbs = [frame(done, k) for k in candidate_keys(rec)] + [
        genuine_hb[:len(MAGIC) + MAC_BYTES] + json.dumps(done).encode()]
    forged_orders = [frame(order, k) for k in candidate_keys(rec)] + [
        abort_frame[:len(MAGIC) + MAC_BYTES] + json.dumps(order).encode(),
        genuine_hb]  # a rank's own heartbeat sent back to it
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        paced(lambda f: s.sendto(f, ("127.0.0.1", intake)), forged_hbs)
    paced(lambda f: rec.inject(f, rank1_addr), forged_orders)
    # and the rank's restore-point request replayed, and replayed with another attempt
    (request,) = [ex["request"] for ex in rec.exchanges() if b"attempt=1&" in ex["request"]]
    replies = []
    for raw in (request, request.replace(b"attempt=1&", b"attempt=0&")):
        with socket.create_connection(("127.0.0.1", http), timeout=10) as c:
            c.sendall(raw)  # as recorded (urllib asks for Connection: close)
            replies.append(b"".join(iter(lambda: c.recv(65536), b"")))
    assert [r.split(b" ", 2)[1] for r in replies] == [b"401", b"401"]
    assert [json.loads(r.partition(b"\r\n\r\n")[2])["error"] for r in replies] == ["replayed", "unauthenticated"]

    counted = wait_until("the forged heartbeats counted", lambda: (st := status(http))["rejected_heartbeats"].get(
        "unauthenticated") == len(forged_hbs) and st, run, timeout=15)
    assert counted["rejected_heartbeats"].get("unauthenticated") == len(forged_hbs)
    assert all(r["phase"] != "done" and r["step"] < 10**6 for r in counted["ranks"])
    assert run.wait() == 0, run.output()[-4000:]

    # nothing forged was taken: one fault (the drill's), two launches, the job completed
    assert [f["attempt"] for f in run.events("fault_detected")] == [0]
    launches = run.events("launched")
    assert [e["attempt"] for e in launches] == [0, 1] and run.events("job_finished")[-1]["phase"] == "completed"
    # every frame names its launch: a new id for the relaunch, the orders their target's
    assert launches[0]["launch"] != launches[1]["launch"]
    assert {h.launch for _, _, h in heartbeats(rec, keys) if h.attempt == 0} == {launches[0]["launch"]}
    assert {h.launch for _, _, h in heartbeats(rec, keys) if h.attempt == 1} == {launches[1]["launch"]}
    assert abort["launch"] == launches[0]["launch"]
    # rank 1 refused every forged order as unauthenticated (its last line sums them up)
    refusals = rank_refusals(log_dir, 1)
    assert refusals and max(refusals, key=lambda t: sum(t.values())) == {"unauthenticated": len(forged_orders)}

    # and nothing on the wire could verify a frame: no token, no derived key, in any form
    blobs = rec.blobs()
    assert len(rec.from_ranks()) > 20 and len(rec.to_ranks()) >= 3 and len(rec.exchanges()) == 2
    for name, needle in secrets_of(token).items():
        assert not any(needle in b for b in blobs), f"the {name} was on the wire"
    for ex in rec.exchanges():
        assert b"Authorization" not in ex["request"] and HEADER_MAC.encode() in ex["request"]
        assert ex["answer"].startswith(b"HTTP/1.1 200") and HEADER_MAC.encode() in ex["answer"]


def test_a_heartbeat_and_an_abort_of_one_run_replayed_into_the_next_are_refused_counted_and_change_nothing(
        tmp_path, wire):
    secret = tmp_path / "existing-secret"
    secret.write_bytes(secrets.token_hex(24).encode())
    secret.chmod(0o600)
    keys = derive_keys(secret.read_bytes())
    log_dir = tmp_path / "sv-logs"
    env = {"WIRE_TOKEN_FILE": str(secret)}

    # run 1: a hang, so that the capture holds an abort for rank 1 of attempt 0
    rec1 = wire(Recorder, log_dir / "supervisor-state.json", run=1)
    run1 = wire(WireRun, tmp_path, rec1, fault=HANG, launcher=EXISTING_SECRET, env=env)
    assert run1.wait() == 0, run1.output()[-4000:]
    assert not (log_dir / "token").exists()  # the platform's token, as with an existing Secret
    captured_aborts = [data for _, data, o in orders(rec1, keys) if o.kind == "abort"]
    assert [decode_control(a, keys.control).rank for a in captured_aborts] == [1]
    last = {}  # each rank's last heartbeat: its training finished, the highest seq it sent
    for _, data, h in heartbeats(rec1, keys):
        if h.rank not in last or (h.attempt, h.seq) > (last[h.rank][1].attempt, last[h.rank][1].seq):
            last[h.rank] = (data, h)
    captured_hbs = [data for data, _ in last.values()]
    assert sorted(h.phase for _, h in last.values()) == ["done", "done"]

    # run 2 of the same job: same token, same log directory, attempt 0 and ranks 0 and 1 again
    rec2 = wire(Recorder, log_dir / "supervisor-state.json", run=2)
    run2 = wire(WireRun, tmp_path, rec2, launcher=EXISTING_SECRET, env=env, ckpt=tmp_path / "ckpt-run2")
    intake, http = rec2.ports()

    def training():
        latest = {h.rank: (addr, h) for addr, _, h in heartbeats(rec2, keys) if h.steps_done >= 2}
        return latest if len(latest) == 2 else None

    ranks = wait_until("run 2 training", training, run2)
    assert {h.attempt for _, h in ranks.values()} == {0}
    assert {h.launch for _, h in ranks.values()} != {h.launch for _, h in last.values()}
    before = status(http)["rejected_heartbeats"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for f in captured_hbs:  # exactly the bytes captured
            s.sendto(f, ("127.0.0.1", intake))
    for addr, _ in ranks.values():  # from the controller's address, to both ranks
        for f in captured_aborts:
            rec2.inject(f, addr)
    after = wait_until("the replays counted", lambda: (st := status(http))["rejected_heartbeats"].get(
        "other_launch", 0) >= len(captured_hbs) and st, run2, timeout=15)
    assert after["rejected_heartbeats"] == before | {"other_launch": len(captured_hbs)}
    # neither replayed "done" was taken: both ranks train on, at their own steps
    assert all(r["phase"] != "done" and r["step"] < STEPS for r in after["ranks"]), after["ranks"]
    assert run2.wait() == 0, run2.output()[-4000:]

    events = [e for e in run2.events() if e.get("run") == 2]
    assert [e["attempt"] for e in events if e["event"] == "launched"] == [0]
    assert not [e for e in events if e["event"] in ("fault_detected", "action")]
    assert [e["phase"] for e in events if e["event"] == "job_finished"] == ["completed"]
    assert [r["step"] for r in run2.rank_log(0)] == list(range(1, STEPS + 1))
    # each rank refused the replayed abort as another launch's (counted; its last line sums up)
    assert rank_refusals(log_dir, 0) == [{"other_launch": 1}] * 2
