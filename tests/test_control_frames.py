"""Control frames (dump, abort) to a rank: only from the controller's address, numbered, never
replayed, and a flood of junk writes a line, not a line per datagram. Real UDP sockets, a real
heartbeat thread."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from supervisor.protocol import (
    REJECT_REPLAYED,
    REJECT_SCHEMA,
    ControlSequencer,
    ProtocolError,
    control_message,
    decode_control,
    decode_heartbeat,
    encode,
)
from supervisor.worker.heartbeat import HeartbeatSender
from supervisor.worker.session import Session
from supervisor.worker.telemetry import RankState

TOKEN = b"control-frames-token"


def wait_for(cond, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Rank:
    """A heartbeat sender for rank 1 of attempt 3, its controller's socket and what it obeyed."""

    def __init__(self) -> None:
        self.srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.settimeout(5)
        session = Session(rank=1, world_size=2, attempt=3, heartbeat_addr=self.srv.getsockname(), token=TOKEN,
                          heartbeat_interval=0.05, job="j")
        self.aborts: list[str] = []
        self.dumps: list[str] = []
        self.sender = HeartbeatSender(session, RankState(), on_abort=self.aborts.append, on_dump=self.dumps.append)
        self.sender.start()
        frame, self.addr = self.srv.recvfrom(8192)  # the rank's address: where the controller answers
        decode_heartbeat(frame, TOKEN)

    def send(self, payload: dict, token: bytes = TOKEN) -> None:
        self.srv.sendto(encode(payload, token), self.addr)

    def close(self) -> None:
        self.sender.stop()
        self.srv.close()


@pytest.fixture
def rank():
    r = Rank()
    yield r
    r.close()


def test_control_messages_are_numbered_and_decoded():
    seq = ControlSequencer()
    numbers = [seq.next() for _ in range(1000)]
    assert numbers == sorted(set(numbers))  # strictly increasing
    msg = decode_control(encode(control_message("abort", attempt=2, rank=1, reason="hang", seq=7), TOKEN), TOKEN)
    assert (msg.kind, msg.attempt, msg.rank, msg.seq, msg.reason) == ("abort", 2, 1, 7, "hang")
    # without a seq the message is numbered by this process's sequencer
    a = control_message("dump", attempt=0, rank=0)["seq"]
    assert control_message("dump", attempt=0, rank=0)["seq"] > a > 0
    # an unnumbered frame (what a controller before numbering sent) is refused
    with pytest.raises(ProtocolError) as exc:
        decode_control(encode({"type": "abort", "attempt": 2, "rank": 1, "reason": ""}, TOKEN), TOKEN)
    assert exc.value.reason == REJECT_SCHEMA
    with pytest.raises(ValueError):
        control_message("reboot", attempt=0, rank=0)


def test_an_abort_from_another_address_is_not_obeyed(rank):
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        # correctly signed and addressed, but not from the controller's address
        other.sendto(encode(control_message("abort", attempt=3, rank=1, reason="from a stranger"), TOKEN), rank.addr)
    finally:
        other.close()
    rank.send(control_message("abort", attempt=3, rank=1, reason="from the controller"))
    wait_for(lambda: rank.aborts, "the controller's abort")
    assert rank.aborts == ["from the controller"]


def test_a_replayed_control_frame_is_refused(rank):
    seq = ControlSequencer()
    first = control_message("dump", attempt=3, rank=1, reason="first", seq=seq.next())
    rank.send(first)
    wait_for(lambda: rank.dumps, "the first dump")
    rank.send(first)  # captured and sent again
    rank.send(control_message("abort", attempt=3, rank=1, reason="older", seq=first["seq"] - 1))
    rank.send(control_message("dump", attempt=3, rank=1, reason="second", seq=seq.next()))
    wait_for(lambda: len(rank.dumps) == 2, "the second dump")
    assert rank.dumps == ["first", "second"] and rank.aborts == []
    assert rank.sender.rejected == {REJECT_REPLAYED: 2}
    # a restarted controller (a new sequencer, no saved state) still numbers above its predecessor
    rank.send(control_message("abort", attempt=3, rank=1, reason="after a restart", seq=ControlSequencer().next()))
    wait_for(lambda: rank.aborts, "the restarted controller's abort")
    assert rank.aborts == ["after a restart"]


def test_a_flood_of_junk_writes_one_log_line_with_a_count(rank, caplog):
    caplog.set_level(logging.WARNING, logger="supervisor.worker")
    sent = 0
    for burst in range(10):  # in bursts the socket buffer holds: every datagram is read and rejected
        for i in range(100):
            payload = control_message("abort", attempt=3, rank=1, reason=f"junk {burst}/{i}")
            rank.srv.sendto(encode(payload, b"not the token") if i % 2 else b"SV1 garbage", rank.addr)
        sent += 100
        wait_for(lambda: sum(rank.sender.rejected.values()) == sent, f"{sent} rejections")
    rank.send(control_message("abort", attempt=3, rank=1, reason="real"))
    wait_for(lambda: rank.aborts, "the real abort after the flood")
    assert rank.aborts == ["real"]
    assert rank.sender.rejected == {"unauthenticated": 500, "malformed": 500}
    lines = [r.getMessage() for r in caplog.records if "control_message_rejected" in r.getMessage()]
    assert len(lines) == 1, lines[:5]
    rank.sender.stop()  # the rest are summed up in one last line
    lines = [r.getMessage() for r in caplog.records if "control_message_rejected" in r.getMessage()]
    assert len(lines) == 2 and "count=999" in lines[1], lines


def test_a_dump_is_answered_at_once_with_a_heartbeat_that_names_it():
    # the controller's evidence wait ends on this answer instead of waiting out a heartbeat interval
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(10)
    session = Session(rank=1, world_size=2, attempt=3, heartbeat_addr=srv.getsockname(), token=TOKEN,
                      heartbeat_interval=600.0, job="j")  # no regular beat can arrive during the test
    dumps: list[str] = []
    sender = HeartbeatSender(session, RankState(), on_abort=lambda reason: None, on_dump=dumps.append)
    sender.start()
    try:
        frame, addr = srv.recvfrom(8192)
        assert decode_heartbeat(frame, TOKEN).dump_seq == 0
        msg = control_message("dump", attempt=3, rank=1, reason="hang", seq=ControlSequencer().next())
        srv.sendto(encode(msg, TOKEN), addr)
        answer = decode_heartbeat(srv.recvfrom(8192)[0], TOKEN)
        assert dumps == ["hang"] and answer.dump_seq == msg["seq"]
    finally:
        sender.stop()
        srv.close()
