"""The heartbeat thread: one small authenticated UDP datagram per interval, never blocking.

* Sends the latest :class:`~supervisor.worker.telemetry.Snapshot` only: nothing is queued,
  so an unreachable controller costs no memory. Send errors back off exponentially (up to
  30 s) and recover on the next success.
* Listens on the same socket for control messages (``abort``) from the controller; an abort
  for this rank and attempt calls ``on_abort`` (the runtime dumps stacks, then SIGKILLs).
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

from supervisor.protocol import Heartbeat, ProtocolError, decode_frame, encode
from supervisor.worker.session import Session
from supervisor.worker.telemetry import RankState

log = logging.getLogger("supervisor.worker")
MAX_BACKOFF_S = 30.0


class HeartbeatSender:
    def __init__(self, session: Session, state: RankState, on_abort: Callable[[str], None],
                 on_dump: Callable[[str], None] | None = None) -> None:
        self.session = session
        self.state = state
        self.on_abort = on_abort
        self.on_dump = on_dump
        self.seq = 0
        self.sent = 0
        self.send_errors = 0
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="supervisor-heartbeat", daemon=True)
        self._backoff_until = 0.0
        self._backoff = 0.0

    def start(self) -> None:
        if self.session.supervised:
            host, _ = self.session.heartbeat_addr  # type: ignore[misc]
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._sock = socket.socket(family, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.session.heartbeat_interval + 1)
        if self._sock is not None:
            self._sock.close()

    def beat_now(self) -> None:
        """Send one heartbeat immediately (after a watchdog event, say)."""
        self._send()

    def build(self) -> Heartbeat:
        s = self.state.snapshot()
        self.seq += 1
        fields = asdict(s)
        return Heartbeat(
            job=self.session.job, attempt=self.session.attempt, rank=self.session.rank,
            world_size=self.session.world_size, seq=self.seq, node=self.session.node[:256], pid=os.getpid(),
            **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in fields.items()},
        )

    def _run(self) -> None:
        interval = self.session.heartbeat_interval
        next_beat = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._send()
                next_beat = now + interval
            self._receive(timeout=max(0.0, min(interval, next_beat - time.monotonic())))

    def _send(self) -> None:
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
            self._sock.sendto(encode(hb.to_payload(), self.session.token or b""), self.session.heartbeat_addr)  # type: ignore[arg-type]
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

    def _receive(self, timeout: float) -> None:
        if self._sock is None:
            self._stop.wait(timeout)
            return
        try:
            ready, _, _ = select.select([self._sock], [], [], timeout)
        except (OSError, ValueError):
            self._stop.wait(timeout)
            return
        if not ready:
            return
        try:
            frame, _ = self._sock.recvfrom(8192)
        except OSError:  # e.g. ECONNREFUSED reported for an earlier send: ignore
            return
        try:
            msg = decode_frame(frame, self.session.token or b"")
        except ProtocolError as exc:
            log.warning("event=control_message_rejected reason=%s", exc.reason)
            return
        if msg.get("attempt") != self.session.attempt or msg.get("rank") != self.session.rank:
            return
        if msg.get("type") == "abort":
            self.on_abort(str(msg.get("reason", ""))[:400])
        elif msg.get("type") == "dump" and self.on_dump is not None:
            self.on_dump(str(msg.get("reason", ""))[:400])

    def _write_local(self, hb: Heartbeat) -> None:
        log_dir = self.session.log_dir
        if log_dir is None:
            return
        path = log_dir / f"heartbeat-rank-{self.session.rank}.json"
        tmp = path.with_suffix(".json.tmp")
        try:
            tmp.write_text(json.dumps(hb.to_payload() | {"time": time.time()}))
            os.replace(tmp, path)
        except OSError as exc:
            self.send_errors += 1
            if self.send_errors == 1:
                log.warning("event=heartbeat_write_failed path=%s error=%s", path, exc)
