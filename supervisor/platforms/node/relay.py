"""The node's heartbeat relay: its ranks' heartbeats in, one authenticated frame per interval out.

The node agent (:mod:`forking_agent`) starts it before its ranks and points their
``SUPERVISOR_HEARTBEAT_ADDR`` at it (a UDP port on 127.0.0.1); the controller's own address
moves to ``SUPERVISOR_HEARTBEAT_UPSTREAM``. So the controller reads one datagram per node and
interval, not one per rank (:func:`supervisor.protocol.encode_node_frames`), which is what
bounds one controller at ~20,000 ranks otherwise.

* Each rank's heartbeat is authenticated here with the heartbeat key (the agent holds the job
  token, as its ranks do) and kept, the latest per rank; what failed the check is counted and
  dropped, as the controller would.
* Every ``interval`` (``SUPERVISOR_AGGREGATE``: the controller's choice, at most the heartbeat
  interval, less where the heartbeat timeout is tight) the held heartbeats go up in as few frames as they fit in, each with how
  long it was held, so the controller measures a rank's silence from when the rank spoke, not
  from when the frame came. A heartbeat that says something the controller acts on at once (a
  rank's first, its last words, a stack dump answered, a restore's outcome, a non-finite loss,
  its first step) goes up at once, with whatever else is held.
* Control frames from the controller (``dump``, ``abort``) come back to the relay's address:
  each is authenticated with the control key and passed, as it came, to the rank it names, at
  the address that rank's heartbeats came from. The rank checks it as it always does.
* A rank that stops speaking is simply not in the next frame: the controller's timeout finds it,
  as before. A relay that dies takes its agent's heartbeats with it: the node goes silent.

A daemon thread of the agent, standard library and the protocol only (no torch).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, MutableMapping

from supervisor.protocol import (
    MAX_DATAGRAM,
    PHASE_DONE,
    PHASE_FAILED,
    Env,
    Heartbeat,
    Keys,
    ProtocolError,
    decode_frame,
    decode_heartbeat,
    derive_keys,
    encode_node_frames,
)

log = logging.getLogger("supervisor.relay")

URGENT_FIELDS = ("dump_seq", "restore_state", "restored", "outcome", "error", "loss_ok", "watchdog",
                 "stack_file", "trace_file")
"""A heartbeat whose value of one of these differs from the rank's last one sent goes up at once."""
LAST_WORDS = (PHASE_DONE, PHASE_FAILED)
"""Phases that go up at once. The others change many times a step (data, compute, collective):
a training rank's heartbeat names a new one nearly every time, and the timeouts that read them
are seconds to minutes long."""


def urgent(hb: Heartbeat, last: Heartbeat | None) -> bool:
    """Whether ``hb`` must reach the controller now, not at the next interval: a rank's first
    heartbeat (of its process), its last words, a change the controller acts on at once, or its
    first completed step."""
    if last is None or last.pid != hb.pid or last.attempt != hb.attempt:
        return True
    if hb.steps_done and not last.steps_done:
        return True
    if hb.phase != last.phase and hb.phase in LAST_WORDS:
        return True
    return any(getattr(hb, f) != getattr(last, f) for f in URGENT_FIELDS)


class Relay:
    """One node's relay (see the module). ``start`` binds and runs the thread; ``address`` is
    what the ranks send to; ``close`` stops it."""

    def __init__(self, upstream: tuple[str, int], keys: Keys, interval_s: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.upstream = upstream
        self.keys = keys
        self.interval_s = interval_s
        self.clock = clock
        self.held: dict[int, tuple[Heartbeat, float]] = {}
        """The latest heartbeat of each rank not yet sent up, with when it came."""
        self.last_sent: dict[int, Heartbeat] = {}
        self.rank_addr: dict[int, tuple] = {}
        self.frames_sent = 0
        self.beats_sent = 0
        self.rejected: dict[str, int] = {}
        self.controls_passed = 0
        self.send_errors = 0
        self._stop = threading.Event()
        family = socket.AF_INET6 if ":" in upstream[0] else socket.AF_INET
        self._up = socket.socket(family, socket.SOCK_DGRAM)
        self._up.setblocking(False)
        self._local = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._local.bind(("127.0.0.1", 0))
        self._local.setblocking(False)
        for sock in (self._up, self._local):
            os.set_inheritable(sock.fileno(), False)
        self._thread = threading.Thread(target=self._run, name="supervisor-relay", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._local.getsockname()[:2]
        return f"{host}:{port}"

    def start(self) -> "Relay":
        try:
            self._up.connect(self.upstream)  # only the controller's datagrams come back on it
        except OSError as exc:  # an address not resolvable yet: sendto each time instead
            log.warning("event=relay_upstream_unconnected upstream=%s:%s error=%s", *self.upstream, exc)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s + 1)
        self._up.close()
        self._local.close()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        next_flush = self.clock() + self.interval_s
        while not self._stop.is_set():
            wait = max(0.0, min(next_flush - self.clock(), 0.2))
            try:
                ready, _, _ = select.select([self._local, self._up], [], [], wait)
            except (OSError, ValueError):  # closed under us: the agent is ending
                return
            now_urgent = False
            if self._local in ready:
                now_urgent = self._read_ranks()
            if self._up in ready:
                self._read_controller()
            if now_urgent or self.clock() >= next_flush:
                self.flush()
                if not now_urgent or self.clock() >= next_flush:
                    next_flush = self.clock() + self.interval_s

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def _read_ranks(self) -> bool:
        """Take what the ranks sent; whether any of it must go up at once."""
        found = False
        for _ in range(256):
            try:
                data, addr = self._local.recvfrom(MAX_DATAGRAM + 1)
            except OSError:
                break
            try:
                hb = decode_heartbeat(data, self.keys.heartbeat)
            except ProtocolError as exc:
                self._reject(exc.reason)
                continue
            held = self.held.get(hb.rank)
            if held is not None and held[0].pid == hb.pid and hb.seq <= held[0].seq:
                continue  # reordered on the way: keep the newer
            self.held[hb.rank] = (hb, self.clock())
            self.rank_addr[hb.rank] = addr
            found = found or urgent(hb, self.last_sent.get(hb.rank))
        return found

    def _read_controller(self) -> None:
        for _ in range(64):
            try:
                data, _addr = self._up.recvfrom(MAX_DATAGRAM + 1)
            except OSError:
                return
            try:
                rank = decode_frame(data, self.keys.control).get("rank")
            except ProtocolError as exc:
                self._reject(exc.reason)
                continue
            addr = self.rank_addr.get(rank) if type(rank) is int else None
            if addr is None:
                self._reject("unknown_rank")
                continue
            self.controls_passed += 1
            try:
                self._local.sendto(data, addr)  # as it came: the rank checks it
            except OSError:
                self.send_errors += 1

    def flush(self) -> None:
        """Send what is held, now."""
        if not self.held:
            return
        now = self.clock()
        beats = [(hb, now - at) for hb, at in self.held.values()]
        self.held = {}
        try:
            frames = encode_node_frames(beats, self.keys.heartbeat)
        except ProtocolError as exc:  # a heartbeat too large for any frame: what the rank's own send would do
            self._reject(exc.reason)
            return
        self.frames_sent += len(frames)  # counted before they leave: whoever reads a frame sees it counted
        self.beats_sent += len(beats)
        for hb, _ in beats:
            self.last_sent[hb.rank] = hb
        connected = self._connected()
        for frame in frames:
            try:
                self._up.send(frame) if connected else self._up.sendto(frame, self.upstream)
            except OSError:
                self.send_errors += 1  # the controller away: the next interval's frame replaces this one

    def _connected(self) -> bool:
        try:
            self._up.getpeername()
            return True
        except OSError:
            return False


def start_from_env(env: MutableMapping[str, str]) -> Relay | None:
    """A relay for this node's ranks, started, with ``env`` pointing them at it; None (and
    ``env`` unchanged: each rank sends on its own) where the agent has no controller to report
    to, aggregation is off (``SUPERVISOR_AGGREGATE=off``) or the relay cannot start."""
    addr = env.get(Env.HEARTBEAT_ADDR, "")
    if not addr or env.get(Env.AGGREGATE, "on") == "off" or env.get(Env.HEARTBEAT_UPSTREAM):
        return None  # an upstream set already: a relay of this agent's own is running (or an outer one)
    try:
        token = _token(env)
        host, sep, port = addr.rpartition(":")
        if not token or not sep or not port.isdigit():
            return None  # the ranks' own session reports what is missing or wrong
        flush = env.get(Env.AGGREGATE, "") or env.get(Env.HEARTBEAT_INTERVAL, "") or "1"
        every = float(flush if flush[0].isdigit() else env.get(Env.HEARTBEAT_INTERVAL, "1") or 1)
        relay = Relay((host.strip("[]"), int(port)), derive_keys(token), min(max(every, 0.05), 60.0)).start()
    except (OSError, ValueError) as exc:
        log.warning("event=relay_not_started error=%s (each rank sends its own heartbeats)", exc)
        return None
    env[Env.HEARTBEAT_UPSTREAM] = addr
    env[Env.HEARTBEAT_ADDR] = relay.address
    return relay


def _token(env: Mapping[str, str]) -> bytes:
    if env.get(Env.TOKEN_FILE):
        return Path(env[Env.TOKEN_FILE]).read_bytes().strip()
    return env.get(Env.TOKEN, "").encode()
