"""Heartbeats in: the UDP endpoint of the controller (authenticated, validated, fenced by launch
and attempt); bad datagrams are counted by reason and change nothing."""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import sys
from typing import TYPE_CHECKING

from supervisor.protocol import (
    MAX_DATAGRAM,
    REJECT_OTHER_LAUNCH,
    REJECT_STALE_ATTEMPT,
    REJECT_UNAUTHENTICATED,
    ControlSequencer,
    Keys,
    ProtocolError,
    decode_heartbeat,
    decode_node_beats,
    derive_keys,
    encode,
    is_node_frame,
    new_launch_id,
)

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller

RECEIVE_BUFFER_BYTES = 16 << 20  # ~1 s of 16,384 heartbeats: the kernel's default holds ~10 ms
DRAIN_MAX = 256
"""Heartbeats read per wake-up at most: bounded so that a flood cannot starve the ticks and the
HTTP API sharing the loop (a full drain is followed at once by the next one)."""
COALESCE_S = 0.005
"""After a wake-up that read heartbeats, the intake stops watching its socket this long and lets
them queue in the kernel (interrupt coalescing): a reader woken for every datagram pays an
``epoll_wait``, a loop iteration and a failed read per heartbeat, which at 16,384 ranks a second
was most of the controller's CPU. Heartbeats wait at most this long; timeouts are seconds."""
_READ_SIZE = MAX_DATAGRAM + 1
"""What one read asks for: asyncio's datagram transport reads with a 256 KiB buffer (its
``max_size``); a frame longer than :data:`MAX_DATAGRAM` arrives cut to this size and is still
refused as oversized."""


class Wire:
    """The controller's side of the wire: the job token and the keys derived from it, this run's
    launch ids, the numbering of control frames, and what the intake counted."""

    def __init__(self) -> None:
        self._token = b""
        self.keys: Keys | None = None
        """Frames and HTTP requests are MAC'd with these (None without a token: nothing is then
        authenticated)."""
        self.launch_ids: collections.deque[str] = collections.deque(maxlen=64)
        """This run's launch ids, the current one last: a frame of an earlier one is a stale attempt's."""
        self.control_seq = ControlSequencer()  # numbers abort/dump orders: a captured one cannot be replayed
        self.received = 0
        self.node_frames = 0
        """Frames from node agents' relays (each holding several ranks' heartbeats) taken in."""
        self.rejected: dict[str, int] = {}

    @property
    def token(self) -> bytes:
        """The job token. It never leaves this host: only the keys derived from it are used."""
        return self._token

    @token.setter
    def token(self, token: bytes) -> None:
        self._token = token
        self.keys = derive_keys(token) if token else None

    def new_launch(self) -> str:
        """A new launch of the gang: a new random id, for its ranks' environment and frames."""
        launch = new_launch_id()
        self.launch_ids.append(launch)
        return launch

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Intake(asyncio.DatagramProtocol):
    """Heartbeats in: authenticate, validate, fence by attempt, record. Never raises.

    The transport is kept for sending (control messages); reading is done by the intake itself,
    on its own handle of the socket: up to :data:`DRAIN_MAX` datagrams per wake-up, then a pause
    of :data:`COALESCE_S`. Where the transport cannot pause its own reading, it reads (one
    datagram per callback, into ``datagram_received``) and the intake drains what else is queued.
    """

    def __init__(self, controller: "Controller") -> None:
        self.c = controller
        self.transport: asyncio.DatagramTransport | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set while the intake reads for itself
        self._resume: asyncio.Handle | None = None  # watching again after a pause (COALESCE_S)

    def connection_made(self, transport) -> None:
        self.transport = transport
        try:  # our own handle on the same socket
            self._sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
            self._sock.setblocking(False)
        except (OSError, AttributeError):
            self._sock = None  # one datagram per callback, as asyncio does
            return
        pause = getattr(transport, "pause_reading", None)
        if pause is None:
            return
        try:
            loop = asyncio.get_running_loop()
            pause()
            self._loop = loop
            self._watch()
        except (RuntimeError, NotImplementedError):  # a loop without add_reader: the transport reads
            self._loop = None
            resume = getattr(transport, "resume_reading", None)
            if resume is not None:
                resume()

    def connection_lost(self, exc) -> None:
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())  # a no-op while paused
            self._loop = None
            self._sock.close()
            self._sock = None

    def _watch(self) -> None:
        self._resume = None
        if self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._readable)

    def _readable(self) -> None:
        n = self._drain()
        loop = self._loop
        if loop is None or self._sock is None or n == 0:
            return
        loop.remove_reader(self._sock.fileno())
        # more queued than one drain takes: go on after whatever else is ready; else coalesce
        self._resume = loop.call_soon(self._watch) if n >= DRAIN_MAX else loop.call_later(COALESCE_S, self._watch)

    def datagram_received(self, data: bytes, addr) -> None:
        self._take(data, addr)
        self._drain()

    def _drain(self) -> int:
        """Read and take what is queued, up to :data:`DRAIN_MAX` datagrams; how many were read."""
        sock = self._sock
        if sock is None:
            return 0
        recvfrom, take = sock.recvfrom, self._take
        for n in range(DRAIN_MAX):
            try:
                data, addr = recvfrom(_READ_SIZE)
            except OSError:  # BlockingIOError: nothing more queued
                return n
            take(data, addr)
        return DRAIN_MAX

    def _take(self, data: bytes, addr) -> None:
        c = self.c
        wire = c.wire
        keys = wire.keys
        state = c.state  # (its fields, not the controller's InState views: read once per frame, the hot path)
        try:
            if keys is None:
                raise ProtocolError(REJECT_UNAUTHENTICATED, "no job token yet")
            if is_node_frame(data):  # a node agent's relay: its ranks' heartbeats in one frame
                beats, held, fenced = decode_node_beats(
                    data, keys.heartbeat, (state.launch_id, state.attempt, c.cfg.job, c.registry.world_size))
            else:
                self._take_one(decode_heartbeat(data, keys.heartbeat), addr, 0.0)
                return
        except ProtocolError as exc:
            wire.reject(exc.reason)
            return
        wire.node_frames += 1
        if not fenced:  # some are not of this launch, attempt and gang: one at a time, counted by reason
            for hb, h in zip(beats, held):
                self._take_one(hb, addr, h)
            return
        # each heartbeat fenced and checked as _take_one does (in the decode's one pass), and the
        # frame's recorded in one call (the controller's hot path: 16,384 frames a second at
        # 131,072 ranks)
        wire.received += len(beats)
        # only an accepted heartbeat moves its rank's reply address (kept on its record)
        if c.registry.observe_many(beats, c.clock(), held, addr) and c.signals.wants_heartbeats:
            c.wake()

    def _take_one(self, hb, addr, held: float) -> None:
        """One authenticated heartbeat, sent ``held`` seconds ago (by its node's relay; 0: by the
        rank itself): fenced by launch and attempt, then recorded as received when it was sent."""
        c = self.c
        wire = c.wire
        if hb.launch != c.launch_id:
            # not this launch's: an earlier launch of this run (its ranks on their way out), or a
            # launch this controller never made (another run's frame with the same token: replayed)
            wire.reject(REJECT_STALE_ATTEMPT if hb.launch in wire.launch_ids else REJECT_OTHER_LAUNCH)
            return
        if hb.attempt != c.attempt or hb.job != c.cfg.job:
            if hb.job == c.cfg.job and c.attempt < hb.attempt <= c.launch_attempt + c.in_place_allowed:
                # ranks restarted in place by their agents, ahead of the controller: the
                # controller catches up (restarted_in_place), then takes their heartbeats
                c.heard.ahead_attempt = max(c.heard.ahead_attempt or 0, hb.attempt)
                return
            wire.reject(REJECT_STALE_ATTEMPT)
            return
        if hb.world_size != c.registry.world_size and c.registry.world_size:
            wire.reject("schema")
            return
        wire.received += 1
        # only an accepted heartbeat moves its rank's reply address (kept on its record)
        if c.registry.observe(hb, c.clock() - held, addr) and c.signals.wants_heartbeats:
            c.wake()

    def send(self, payload: dict, addr) -> None:
        """A control message to a rank of the current launch (stamped with its id), under the
        control key."""
        c = self.c
        keys = c.wire.keys
        if self.transport is not None and addr is not None and keys is not None:
            self.transport.sendto(encode(payload | {"launch": c.launch_id}, keys.control), addr)


_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33 if sys.platform.startswith("linux") else None)
"""Linux's SO_RCVBUFFORCE (33; Python's socket module does not name it, so without the number
the buffer stayed capped at net.core.rmem_max even as root)."""


def grow_receive_buffer(sock) -> None:
    """Room for bursts of heartbeats while a tick runs; beyond net.core.rmem_max only as root."""
    if sock is None:
        return
    for opt in (_SO_RCVBUFFORCE, socket.SO_RCVBUF):
        if opt is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, RECEIVE_BUFFER_BYTES)
            return
        except OSError:
            continue
