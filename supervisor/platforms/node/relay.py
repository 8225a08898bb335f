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
    REJECT_OTHER_LAUNCH,
    Env,
    Heartbeat,
    Keys,
    ProtocolError,
    aggregate_flush_s,
    decode_frame,
    decode_heartbeat,
    derive_keys,
    encode,
    encode_node_frames,
)

log = logging.getLogger("supervisor.relay")
LOG_EVERY_S = 30.0

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
        self.errors = 0
        self._logged_counts = (0, 0)
        self._logged_at = -LOG_EVERY_S
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
        self._pid = os.getpid()
        self._up_connected = False

    @property
    def address(self) -> str:
        host, port = self._local.getsockname()[:2]
        return f"{host}:{port}"

    def start(self) -> "Relay":
        try:
            self._up.connect(self.upstream)  # only the controller's datagrams come back on it
            self._up_connected = True
        except OSError as exc:  # an address not resolvable yet: sendto each time instead
            log.warning("event=relay_upstream_unconnected upstream=%s:%s error=%s", *self.upstream, exc)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop, sending up first what the ranks said last (their last words: the agent is ending).
        Only in the agent that started it (a rank forked from the agent inherits the object)."""
        if os.getpid() != self._pid:
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s + 1)
        if not self._thread.is_alive():  # else it still uses the sockets: leave them to the process's end
            try:
                self._read_ranks()
                self.flush()
            except Exception as exc:  # noqa: BLE001 - closing must not fail the agent's exit
                log.warning("event=relay_last_flush_failed error=%s: %s", type(exc).__name__, exc)
            self._up.close()
            self._local.close()
        self._log_counts(force=True)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        next_flush = self.clock() + self.interval_s
        while not self._stop.is_set():
            wait = max(0.0, min(next_flush - self.clock(), 0.2))
            try:
                ready, _, _ = select.select([self._local, self._up], [], [], wait)
            except (OSError, ValueError):  # closed under us: the agent is ending
                return
            try:
                now_urgent = False
                if self._local in ready:
                    now_urgent = self._read_ranks()
                if self._up in ready:
                    self._read_controller()
                if now_urgent or self.clock() >= next_flush:
                    self.flush()
                    if not now_urgent or self.clock() >= next_flush:
                        next_flush = self.clock() + self.interval_s
                self._log_counts()
            except Exception as exc:  # noqa: BLE001 - a bug here must not silence the node: say it, go on
                self.errors += 1
                if self.errors in (1, 10) or self.errors % 1000 == 0:
                    log.exception("event=relay_error count=%d error=%s", self.errors, type(exc).__name__)
                time.sleep(0.01)

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def _log_counts(self, force: bool = False) -> None:
        """What was refused or could not be sent, on the agent's log at most every LOG_EVERY_S."""
        counts = (sum(self.rejected.values()), self.send_errors)
        now = self.clock()
        if counts != self._logged_counts and (force or now - self._logged_at >= LOG_EVERY_S):
            log.warning("event=relay_counts rejected=%s send_errors=%d frames_sent=%d beats_sent=%d",
                        dict(self.rejected), self.send_errors, self.frames_sent, self.beats_sent)
            self._logged_counts, self._logged_at = counts, now

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
            if not hb.launch:  # of no launch: the controller would refuse it, and a node frame holding it
                self._reject(REJECT_OTHER_LAUNCH)
                continue
            held = self.held.get(hb.rank)
            newest = held[0] if held is not None else self.last_sent.get(hb.rank)
            if newest is not None and (hb.attempt < newest.attempt or (newest.pid == hb.pid and hb.seq <= newest.seq)):
                continue  # reordered on the way, or the rank's earlier process (restarted in place): keep the newer
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
        except ProtocolError:  # a heartbeat too large for a frame: it goes alone, as the rank's own frame
            frames = []
            for beat in beats:
                try:
                    frames += encode_node_frames([beat], self.keys.heartbeat)
                except ProtocolError:
                    frames.append(encode(beat[0].to_payload(), self.keys.heartbeat))  # fits: the rank sent it so
        self.frames_sent += len(frames)  # counted before they leave: whoever reads a frame sees it counted
        self.beats_sent += len(beats)
        for hb, _ in beats:
            self.last_sent[hb.rank] = hb
        for frame in frames:
            try:
                self._up.send(frame) if self._up_connected else self._up.sendto(frame, self.upstream)
            except OSError:
                self.send_errors += 1  # the controller away: the next interval's frame replaces this one


def start_from_env(env: MutableMapping[str, str]) -> Relay | None:
    """A relay for this node's ranks, started, with ``env`` pointing them at it, where the
    controller asked for one (``SUPERVISOR_AGGREGATE`` set to how often to send: a controller that
    reads node frames); None (``env`` unchanged: each rank sends its own) otherwise, where the agent
    has no controller to report to, or where the relay cannot start."""
    addr = env.get(Env.HEARTBEAT_ADDR, "")
    if not addr or env.get(Env.HEARTBEAT_UPSTREAM):
        return None  # an upstream set already: a relay of this agent's own is running (or an outer one)
    every = aggregate_flush_s(env.get(Env.AGGREGATE, ""))
    if every is None:
        return None  # "off", unset, or another node frame format: a controller of another version
    try:
        token = _token(env)
        host, sep, port = addr.rpartition(":")
        if not token or not sep or not port.isdigit():
            return None  # the ranks' own session reports what is missing or wrong
        relay = Relay((host.strip("[]"), int(port)), derive_keys(token), every).start()
    except Exception as exc:  # noqa: BLE001 - no relay is no reason to fail the agent: the ranks send their own
        log.warning("event=relay_not_started error=%s: %s (each rank sends its own heartbeats)",
                    type(exc).__name__, exc)
        return None
    env[Env.HEARTBEAT_UPSTREAM] = addr
    env[Env.HEARTBEAT_ADDR] = relay.address
    return relay


def _token(env: Mapping[str, str]) -> bytes:
    if env.get(Env.TOKEN_FILE):
        return Path(env[Env.TOKEN_FILE]).read_bytes().strip()
    return env.get(Env.TOKEN, "").encode()
