"""The heartbeat thread: one small authenticated UDP datagram per interval, never blocking.

* Sends the latest :class:`~supervisor.worker.telemetry.Snapshot` only: nothing is queued,
  so an unreachable controller costs no memory. Send errors back off exponentially (up to
  30 s) and recover on the next success.
* Listens on the same socket for control messages (``dump``, ``abort``) from the controller;
  an abort for this rank and attempt calls ``on_abort`` (the runtime dumps stacks, then SIGKILLs).
  The socket is connected to the controller's address, so the kernel drops datagrams from any
  other source; a message must carry the MAC of the control key (derived from the job token),
  this rank's launch id (:data:`~supervisor.protocol.REJECT_OTHER_LAUNCH` otherwise: another
  run's frame, replayed) and a ``seq`` above the last one accepted (a replayed frame is
  refused). Rejected datagrams are counted in ``rejected`` and logged at most once per
  :data:`REJECT_LOG_INTERVAL_S` (with the count since the last line).
* Without a controller address it writes the heartbeat atomically to
  ``LOG_DIR/heartbeat-rank-R.json`` (what ``supervisor status`` and people can read).
* A daemon thread: it dies with the process, and a SIGSTOPped process goes silent with it.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import threading
import time
from dataclasses import asdict
from typing import Callable

from supervisor.files import write_atomic
from supervisor.protocol import REJECT_OTHER_LAUNCH, REJECT_REPLAYED, Heartbeat, ProtocolError, decode_control, encode
from supervisor.worker.session import Session
from supervisor.worker.telemetry import RankState

log = logging.getLogger("supervisor.worker")
MAX_BACKOFF_S = 30.0
REJECT_LOG_INTERVAL_S = 30.0


class HeartbeatSender:
    def __init__(self, session: Session, state: RankState, on_abort: Callable[[str], None],
                 on_dump: Callable[[str], None] | None = None, *, before_beat: Callable[[], None] | None = None,
                 sample: Callable[[], None] | None = None, sample_every_s: float = 0.0, seq: int = 0) -> None:
        """``before_beat`` refreshes ``state`` before each heartbeat is built, and ``sample`` runs
        every ``sample_every_s`` between them (both on this thread; the instrumentation's reads of
        torch's records). ``seq`` is the last number this process already sent (a sender that
        takes over from another one numbers on from it)."""
        self.session = session
        self.state = state
        self.on_abort = on_abort
        self.on_dump = on_dump
        self._keys = session.keys  # derived once; the token is never a key
        self.seq = seq
        self.before_beat = before_beat
        self.sample = sample
        self.sample_every_s = sample_every_s
        self.refresh_errors = 0
        self._send_lock = threading.Lock()
        self.sent = 0
        self.send_errors = 0
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="supervisor-heartbeat", daemon=True)
        self._backoff_until = 0.0
        self._backoff = 0.0
        self._connected = False
        self._connect_lock = threading.Lock()
        self.last_control_seq = 0
        """The ``seq`` of the last control message accepted: only a higher one is obeyed."""
        self.rejected: dict[str, int] = {}
        """Control datagrams refused, by reason (malformed, unauthenticated, schema, other_launch, replayed)."""
        self._reject_logged_at: float | None = None
        self._reject_unlogged = 0
        self._wake_r, self._wake_w = socket.socketpair()  # stop() wakes the thread out of its wait

    def start(self) -> None:
        if self.session.supervised:
            host, _ = self.session.heartbeat_addr  # type: ignore[misc]
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._sock = socket.socket(family, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.session.heartbeat_interval + 1)
        if self._sock is not None:
            self._sock.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._reject_unlogged:
            self._log_rejected(None, force=True)

    def beat_now(self) -> None:
        """Send one heartbeat immediately (after a watchdog event, say)."""
        self._send()

    def build(self) -> Heartbeat:
        s = self.state.snapshot()
        self.seq += 1
        fields = asdict(s)
        return Heartbeat(
            job=self.session.job, attempt=self.session.attempt, rank=self.session.rank,
            world_size=self.session.world_size, seq=self.seq, launch=self.session.launch,
            node=self.session.node[:256], pid=os.getpid(),
            **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in fields.items()},
        )

    def _run(self) -> None:
        interval = self.session.heartbeat_interval
        next_beat = time.monotonic()
        every = self.sample_every_s if self.sample is not None and self.sample_every_s > 0 else interval
        next_sample = next_beat + every
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._send()
                next_beat = now + interval
            elif now >= next_sample:
                self._call(self.sample)
                next_sample = now + every
            self._receive(timeout=max(0.0, min(interval, next_beat - time.monotonic(), next_sample - time.monotonic())))

    def _call(self, fn: Callable[[], None] | None) -> None:
        if fn is None:
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a failed read of torch's records must not end the heartbeats
            self.refresh_errors += 1
            if self.refresh_errors in (1, 10) or self.refresh_errors % 1000 == 0:
                log.warning("event=heartbeat_refresh_failed count=%d error=%s: %s", self.refresh_errors,
                            type(exc).__name__, str(exc)[:200])

    def _send(self) -> None:
        # one at a time: a heartbeat numbered later is sent later (the thread's periodic one and a
        # last word sent from the training thread would otherwise race, and the older one land last)
        with self._send_lock:
            self._send_locked()

    def _send_locked(self) -> None:
        self._call(self.before_beat)
        try:
            hb = self.build()
        except (ValueError, TypeError) as exc:  # never let a bad value kill the thread
            log.warning("event=heartbeat_build_failed error=%s", exc)
            return
        if self._sock is None:
            self._write_local(hb)
            return
        now = time.monotonic()
        if now < self._backoff_until:
            return
        try:
            frame = encode(hb.to_payload(), self._keys.heartbeat)
            self._connect()
            try:
                self._sock.send(frame)
            except ConnectionRefusedError:
                # an earlier datagram's "port unreachable" (the controller restarting), reported
                # on this connected socket instead of the datagram: not an error of this one
                self._sock.send(frame)
            self.sent += 1
            if self._backoff:
                log.info("event=heartbeat_recovered after_errors=%d", self.send_errors)
            self._backoff = 0.0
        except (OSError, ProtocolError) as exc:
            self.send_errors += 1
            self._backoff = min(MAX_BACKOFF_S, max(self.session.heartbeat_interval, self._backoff * 2))
            self._backoff_until = now + self._backoff
            if self.send_errors in (1, 10) or self.send_errors % 100 == 0:
                log.warning("event=heartbeat_send_failed errors=%d backoff_s=%.1f error=%s", self.send_errors, self._backoff, exc)

    def _connect(self) -> None:
        """Connect the socket to the controller (once, resolving its name): sends go there, and
        the kernel delivers datagrams from that address only."""
        if self._connected:
            return
        with self._connect_lock:
            if not self._connected:
                self._sock.connect(self.session.heartbeat_addr)  # type: ignore[union-attr]
                self._connected = True

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self._reject_unlogged += 1
        self._log_rejected(reason)

    def _log_rejected(self, reason: str | None, force: bool = False) -> None:
        now = time.monotonic()
        if not force and self._reject_logged_at is not None and now - self._reject_logged_at < REJECT_LOG_INTERVAL_S:
            return
        log.warning("event=control_message_rejected count=%d last_reason=%s totals=%s (logged at most every %gs)",
                    self._reject_unlogged, reason, dict(self.rejected), REJECT_LOG_INTERVAL_S)
        self._reject_logged_at = now
        self._reject_unlogged = 0

    def _receive(self, timeout: float) -> None:
        if self._sock is None:
            self._stop.wait(timeout)
            return
        try:
            ready, _, _ = select.select([self._sock, self._wake_r], [], [], timeout)
        except (OSError, ValueError):
            self._stop.wait(timeout)
            return
        if self._sock not in ready:
            return  # the interval is up, or stop() woke us
        try:
            frame = self._sock.recv(8192)
        except OSError:  # e.g. ECONNREFUSED reported for an earlier send: ignore
            return
        try:
            msg = decode_control(frame, self._keys.control)
        except ProtocolError as exc:
            self._reject(exc.reason)
            return
        if msg.launch != self.session.launch:
            self._reject(REJECT_OTHER_LAUNCH)
            return
        if msg.attempt != self.session.attempt or msg.rank != self.session.rank:
            return
        if msg.seq <= self.last_control_seq:
            self._reject(REJECT_REPLAYED)
            return
        self.last_control_seq = msg.seq
        if msg.kind == "abort":
            self.on_abort(msg.reason)
        elif msg.kind == "dump" and self.on_dump is not None:
            self.on_dump(msg.reason)
            self.state.dump_seq = msg.seq  # the stacks are on disk: say so now, the controller waits for it
            self._send()

    def _write_local(self, hb: Heartbeat) -> None:
        log_dir = self.session.log_dir
        if log_dir is None:
            return
        path = log_dir / f"heartbeat-rank-{self.session.rank}.json"
        try:  # a temporary name of its own: two processes of one rank (a restart in place) never share one
            write_atomic(path, json.dumps(hb.to_payload() | {"time": time.time()}).encode(), mode=0o644, durable=False)
        except OSError as exc:
            self.send_errors += 1
            if self.send_errors == 1:
                log.warning("event=heartbeat_write_failed path=%s error=%s", path, exc)
