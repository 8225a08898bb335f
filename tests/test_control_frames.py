"""Control frames (dump, abort) to a rank: only from the controller's address, numbered, never
replayed, only of the rank's own launch, and a flood of junk writes a line, not a line per datagram.
Real UDP sockets, a real heartbeat thread."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from supervisor.protocol import (
    REJECT_OTHER_LAUNCH,
    REJECT_REPLAYED,
    REJECT_SCHEMA,
    ControlSequencer,
    ProtocolError,
    control_message,
    decode_control,
    decode_heartbeat,
    derive_keys,
    encode,
    new_launch_id,
)
from supervisor.worker.heartbeat import HeartbeatSender
from supervisor.worker.session import Session
from supervisor.worker.telemetry import RankState

TOKEN = b"control-frames-token"
KEYS = derive_keys(TOKEN)
LAUNCH = new_launch_id()


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
                          heartbeat_interval=0.05, job="j", launch=LAUNCH)
        self.aborts: list[str] = []
        self.dumps: list[str] = []
        self.sender = HeartbeatSender(session, RankState(), on_abort=self.aborts.append, on_dump=self.dumps.append)
        self.sender.start()
        frame, self.addr = self.srv.recvfrom(8192)  # the rank's address: where the controller answers
        decode_heartbeat(frame, KEYS.heartbeat)

    def send(self, payload: dict, key: bytes = KEYS.control) -> None:
        self.srv.sendto(encode(payload, key), self.addr)

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
    frame = encode(control_message("abort", launch=LAUNCH, attempt=2, rank=1, reason="hang", seq=7), KEYS.control)
    msg = decode_control(frame, KEYS.control)
    assert (msg.kind, msg.launch, msg.attempt, msg.rank, msg.seq, msg.reason) == ("abort", LAUNCH, 2, 1, 7, "hang")
    # the control key verifies control frames only: neither the token nor the heartbeat key does
    for key in (TOKEN, KEYS.heartbeat, KEYS.http):
        with pytest.raises(ProtocolError) as exc:
            decode_control(frame, key)
        assert exc.value.reason == "unauthenticated"
    # without a seq the message is numbered by this process's sequencer
    a = control_message("dump", launch=LAUNCH, attempt=0, rank=0)["seq"]
    assert control_message("dump", launch=LAUNCH, attempt=0, rank=0)["seq"] > a > 0
    # an unnumbered frame (what a controller before numbering sent) is refused
    with pytest.raises(ProtocolError) as exc:
        decode_control(encode({"type": "abort", "launch": LAUNCH, "attempt": 2, "rank": 1, "reason": ""}, KEYS.control),
                       KEYS.control)
    assert exc.value.reason == REJECT_SCHEMA
    # one without a launch id (what a controller before launch ids sent) is refused too
    with pytest.raises(ProtocolError) as exc:
        decode_control(encode({"type": "abort", "attempt": 2, "rank": 1, "seq": 9, "reason": ""}, KEYS.control),
                       KEYS.control)
    assert exc.value.reason == REJECT_SCHEMA
    with pytest.raises(ValueError):
        control_message("reboot", launch=LAUNCH, attempt=0, rank=0)


def test_an_abort_from_another_address_is_not_obeyed(rank):
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        # correctly signed and addressed, but not from the controller's address
        other.sendto(encode(control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason="from a stranger"),
                            KEYS.control), rank.addr)
    finally:
        other.close()
    rank.send(control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason="from the controller"))
    wait_for(lambda: rank.aborts, "the controller's abort")
    assert rank.aborts == ["from the controller"]


def test_a_replayed_control_frame_is_refused(rank):
    seq = ControlSequencer()
    first = control_message("dump", launch=LAUNCH, attempt=3, rank=1, reason="first", seq=seq.next())
    rank.send(first)
    wait_for(lambda: rank.dumps, "the first dump")
    rank.send(first)  # captured and sent again
    rank.send(control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason="older", seq=first["seq"] - 1))
    rank.send(control_message("dump", launch=LAUNCH, attempt=3, rank=1, reason="second", seq=seq.next()))
    wait_for(lambda: len(rank.dumps) == 2, "the second dump")
    assert rank.dumps == ["first", "second"] and rank.aborts == []
    assert rank.sender.rejected == {REJECT_REPLAYED: 2}
    # a restarted controller (a new sequencer, no saved state) still numbers above its predecessor
    rank.send(control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason="after a restart", seq=ControlSequencer().next()))
    wait_for(lambda: rank.aborts, "the restarted controller's abort")
    assert rank.aborts == ["after a restart"]


def test_a_control_frame_of_another_launch_is_refused_counted_and_changes_nothing(rank):
    # A fresh rank process (it has accepted no number yet) is sent orders of another launch, with
    # the same token, its own attempt and rank: what an abort captured in an earlier run of the
    # job (a token reused) looks like when replayed into this one. Before launch ids it was obeyed.
    other = new_launch_id()
    rank.send(control_message("abort", launch=other, attempt=3, rank=1, reason="captured in another run",
                              seq=ControlSequencer().next()))
    rank.send(control_message("dump", launch=other, attempt=3, rank=1, reason="also", seq=ControlSequencer().next()))
    wait_for(lambda: rank.sender.rejected.get(REJECT_OTHER_LAUNCH) == 2, "both refusals")
    # their numbers were not taken either: the controller's own next order, numbered low, is obeyed
    rank.send(control_message("dump", launch=LAUNCH, attempt=3, rank=1, reason="ours", seq=1))
    wait_for(lambda: rank.dumps, "the controller's dump")
    assert rank.dumps == ["ours"] and rank.aborts == [] and rank.sender.rejected == {REJECT_OTHER_LAUNCH: 2}


def test_a_ranks_own_heartbeat_sent_back_to_it_is_not_an_order(rank):
    frame, _ = rank.srv.recvfrom(8192)  # a genuine heartbeat, MAC'd with the heartbeat key
    rank.srv.sendto(frame, rank.addr)
    # and one re-typed as an abort under the key a sniffer could once read off the wire (the token)
    rank.send(control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason="forged"), TOKEN)
    wait_for(lambda: sum(rank.sender.rejected.values()) == 2, "both refusals")
    assert rank.sender.rejected == {"unauthenticated": 2} and rank.aborts == [] and rank.dumps == []


def test_a_flood_of_junk_writes_one_log_line_with_a_count(rank, caplog):
    caplog.set_level(logging.WARNING, logger="supervisor.worker")
    sent = 0
    for burst in range(10):  # in bursts the socket buffer holds: every datagram is read and rejected
        for i in range(100):
            payload = control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason=f"junk {burst}/{i}")
            rank.srv.sendto(encode(payload, b"not the token") if i % 2 else b"SV1 garbage", rank.addr)
        sent += 100
        wait_for(lambda: sum(rank.sender.rejected.values()) == sent, f"{sent} rejections")
    rank.send(control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason="real"))
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
                      heartbeat_interval=600.0, job="j", launch=LAUNCH)  # no regular beat can arrive during the test
    dumps: list[str] = []
    sender = HeartbeatSender(session, RankState(), on_abort=lambda reason: None, on_dump=dumps.append)
    sender.start()
    try:
        frame, addr = srv.recvfrom(8192)
        assert decode_heartbeat(frame, KEYS.heartbeat).dump_seq == 0
        msg = control_message("dump", launch=LAUNCH, attempt=3, rank=1, reason="hang", seq=ControlSequencer().next())
        srv.sendto(encode(msg, KEYS.control), addr)
        answer = decode_heartbeat(srv.recvfrom(8192)[0], KEYS.heartbeat)
        assert dumps == ["hang"] and answer.dump_seq == msg["seq"]
    finally:
        sender.stop()
        srv.close()
