"""Heartbeats aggregated per node (issue 28): each node's agent relays its ranks' heartbeats in
one authenticated frame per interval, so the controller reads one datagram per node.

The frame is a protocol contract (one definition, both sides); the relay runs for real on
loopback sockets; end to end, real torchrun jobs on the local platform count the node frames the
controller took in, and the faults the supervisor detects (a SIGSTOPped rank, a killed one, a
skipped collective, a frozen node) are found and named the same with aggregation off. With it on
(the default), every other end-to-end test of the suite runs through the relays: the same faults
in tests/test_supervisor_local.py, test_never_lose_progress.py, test_plain_scripts.py, and on the
Slurm cluster (tests/test_slurm.py, which also runs a killed and a skipping rank both ways).
"""

from __future__ import annotations

import json
import pickle
import socket
import time

import msgspec
import pytest


from supervisor.controller.decide import relay_flush_s
from supervisor.platforms.node.relay import Relay, start_from_env, urgent
from supervisor.protocol import (
    MAX_DATAGRAM,
    Env,
    Heartbeat,
    ProtocolError,
    aggregate_setting,
    control_message,
    OUTCOME_FINISHED,
    PHASE_DONE,
    RESTORE_RESTORED,
    SOURCE_SDK,
    decode_heartbeat,
    decode_node_beats,
    decode_node_frame,
    derive_keys,
    encode,
    encode_node_frames,
    is_node_frame,
)
from supervisor.protocol.frames import MAGIC, MAC_BYTES, _mac

KEYS = derive_keys(b"ab" * 32)
LAUNCH = "0123456789abcdef" * 2


def beat(rank: int, *, world: int = 8, seq: int = 1, node: str = "gpu-node-00017", attempt: int = 2,
         launch: str = LAUNCH, **kw) -> Heartbeat:
    """A heartbeat as heavy as a training rank's gets (every field the SDK fills, long paths)."""
    fields = dict(step=123_456, phase="collective", phase_s=0.0123, pid=400_000 + rank, coll_seq=987_654,
                  coll_op="allreduce", coll_inside=True, coll_s=0.0021, last_data_s=0.0013, last_compute_s=0.2031,
                  last_collective_s=0.0507, last_step_s=0.2612, ckpt_step=123_000, ckpt_s=1.25, ckpt_persist_s=9.5,
                  ckpt_root="/mnt/shared/checkpoints/a-long-team-name/llama-70b-pretrain-run-17",
                  restore_state="restored", restored="step-0000123000", restore_s=3.2, steps_done=456,
                  first_step_s=1.1, source="sdk", coll_group="0", coll_groups="0=987654/987653 1=12/12")
    fields.update(kw)
    return Heartbeat(job="llama-70b-pretrain", attempt=attempt, rank=rank, world_size=world, seq=seq,
                     launch=launch, node=node, **fields)


# ------------------------------------------------------------------------------ the frame
def test_eight_heavy_heartbeats_fit_one_frame_and_read_back_equal():
    # each rank's own timings, pids, collective and checkpoint progress differ; paths and names are shared
    beats = [(beat(r, phase_s=0.01 + r / 1000, coll_s=0.002 + r / 997, coll_seq=987_654 + r % 2,
                   last_data_s=0.001 + r / 991, last_compute_s=0.2 + r / 983, last_collective_s=0.05 + r / 977,
                   last_step_s=0.26 + r / 971, ckpt_s=1.25 + r / 7, first_step_s=1.1 + r / 13, restore_s=3.2 + r / 11,
                   coll_groups=f"0={987_654 + r}/{987_653 + r} 1=12/12"), 0.25 * r / 8) for r in range(8)]
    (frame,) = encode_node_frames(beats, KEYS.heartbeat)
    assert len(frame) <= MAX_DATAGRAM and is_node_frame(frame)
    back = decode_node_frame(frame, KEYS.heartbeat)
    assert [hb for hb, _ in back] == [hb for hb, _ in beats]
    assert [held for _, held in back] == [round(h, 3) for _, h in beats]
    # one rank's own frame is no node frame
    assert not is_node_frame(encode(beats[0][0].to_payload(), KEYS.heartbeat))


def test_more_ranks_than_a_frame_holds_split_into_frames_under_the_limit():
    # each rank times its own phases: those fields differ from rank to rank (the rest goes in common)
    beats = [(beat(r, world=64, phase_s=0.01 + r / 1000, coll_s=0.002 + r / 997, last_data_s=0.001 + r / 991,
                   last_compute_s=0.2 + r / 983, last_collective_s=0.05 + r / 977, last_step_s=0.26 + r / 971), 0.1)
             for r in range(64)]
    frames = encode_node_frames(beats, KEYS.heartbeat)
    assert len(frames) > 1 and all(len(f) <= MAX_DATAGRAM for f in frames)
    back = [hb for f in frames for hb, _ in decode_node_frame(f, KEYS.heartbeat)]
    assert back == [hb for hb, _ in beats]


def test_heartbeats_of_another_attempt_or_launch_read_back_each_as_sent():
    # each heartbeat of a frame is whole (the intake fences each on its own, as if it came alone)
    beats = [(beat(0), 0.0), (beat(1, attempt=3), 0.0), (beat(2, launch="f" * 32), 0.0), (beat(3), 0.0)]
    (frame,) = encode_node_frames(beats, KEYS.heartbeat)
    assert [(hb.attempt, hb.launch) for hb, _ in decode_node_frame(frame, KEYS.heartbeat)] == [
        (2, LAUNCH), (3, LAUNCH), (2, "f" * 32), (2, LAUNCH)]


def test_a_heartbeat_travels_as_an_array_in_field_order_its_default_tail_left_out():
    hb = Heartbeat(job="j", attempt=0, rank=1, world_size=2, seq=7, step=3, phase="compute", phase_s=0.5,
                   launch=LAUNCH, node="n0", pid=42)
    (frame,) = encode_node_frames([(hb, 0.25)], KEYS.heartbeat)
    body = json.loads(frame[len(MAGIC) + MAC_BYTES:])
    assert body == {"type": "node", "held": [0.25],
                    "beats": [["j", 0, 1, 2, 7, 3, "compute", 0.5, LAUNCH, "n0", 42]]}
    # an older agent's shorter array reads as the defaults; a newer one's longer array keeps what is known
    assert decode_node_frame(frame_of(body | {"beats": [body["beats"][0][:9]]}), KEYS.heartbeat)[0][0] == \
        msgspec.structs.replace(hb, node="", pid=0)
    longer = json.loads(msgspec.json.encode(hb)) + ["a field of tomorrow"]
    assert decode_node_frame(frame_of(body | {"beats": [longer]}), KEYS.heartbeat) == [(hb, 0.25)]


def frame_of(body: dict, key: bytes = KEYS.heartbeat) -> bytes:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return MAGIC + _mac(key, raw) + raw


GOOD_BEAT = ["j", 0, 0, 2, 1, 0, "init", 0.0, LAUNCH, "n0"]
GOOD = {"type": "node", "held": [0.1], "beats": [GOOD_BEAT]}


def _with(**at) -> list:
    """GOOD's heartbeat with the fields named changed (by name: their place in the array)."""
    fields = msgspec.structs.fields(Heartbeat)
    out = list(GOOD_BEAT)
    for name, value in at.items():
        i = Heartbeat.__struct_fields__.index(name)
        out += [json.loads(msgspec.json.encode(f.default)) for f in fields[len(out):i + 1]]  # the defaults between
        out[i] = value
    return out


@pytest.mark.parametrize("change, reason", [
    ({}, None),
    ({"beats": [], "held": []}, "schema"),
    ({"beats": [_with(rank=2)]}, "schema"),                           # rank >= world_size: the frame goes
    ({"held": [61.0]}, "schema"),                                      # held longer than an agent may
    ({"held": [0.1, 0.2]}, "schema"),                                  # a held time for no heartbeat
    ({"beats": [_with(phase="sleeping")]}, "schema"),
    ({"beats": [GOOD_BEAT[:5]]}, "schema"),                            # no step, phase, ...
    ({"beats": [GOOD_BEAT[:8]]}, "schema"),                            # no launch
    ({"beats": [_with(attempt=-1)]}, "schema"),
    ({"beats": [_with(launch=None)]}, "schema"),
    ({"beats": [_with(phase_s=1e10)]}, "schema"),                     # beyond the bound of a duration
    ({"beats": [_with(coll_groups="0=1/1")]}, None),                   # (the padding of _with is good)
    ({"beats": [_with(coll_groups="0=x")]}, "schema"),
    ({"beats": [GOOD_BEAT, _with(outcome="won")], "held": [0.1, 0.1]}, "schema"),  # one bad heartbeat: the frame goes
])
def test_a_node_frame_is_checked_like_each_of_its_heartbeats(change, reason):
    frame = frame_of(GOOD | change)
    if reason is None:
        ((hb, held),) = decode_node_frame(frame, KEYS.heartbeat)
        assert (hb.rank, hb.node, hb.launch, held) == (0, "n0", LAUNCH, 0.1)
        return
    with pytest.raises(ProtocolError) as err:
        decode_node_frame(frame, KEYS.heartbeat)
    assert err.value.reason == reason


FENCE = (LAUNCH, 0, "j", 2)  # GOOD's launch, attempt, job and world size


@pytest.mark.parametrize("change, fence, fenced, reason", [
    ({}, FENCE, True, None),
    ({}, None, False, None),                                            # no fence: the frame's own checks only
    ({}, (LAUNCH, 1, "j", 2), False, None),                            # another attempt: read, not fenced
    ({}, ("f" * 32, 0, "j", 2), False, None),                          # another launch
    ({}, (LAUNCH, 0, "k", 2), False, None),                            # another job
    ({}, (LAUNCH, 0, "j", 4), False, None),                            # another world size
    ({"beats": [GOOD_BEAT, _with(attempt=1)], "held": [0.1, 0.1]}, FENCE, False, None),  # one of another attempt
    ({"beats": [_with(coll_groups="0=1/1")]}, FENCE, True, None),     # groups parsed, then fenced
    ({"beats": [_with(coll_groups="0=x")]}, FENCE, None, "schema"),
    ({"beats": [_with(rank=2)]}, FENCE, None, "schema"),              # rank >= world_size, fence or not
    ({"beats": [_with(rank=2, world_size=3)]}, FENCE, False, None),   # a good heartbeat of another gang
    ({"beats": [_with(phase="sleeping")]}, FENCE, None, "schema"),    # enumerations checked as decoded
    ({"beats": [_with(source="elsewhere")]}, FENCE, None, "schema"),
    ({"beats": [_with(restore_state="maybe")]}, FENCE, None, "schema"),
    ({"beats": [GOOD_BEAT[:8]]}, ("", 0, "j", 2), None, "schema"),   # no launch: a fence of none matches nothing
    ({}, (LAUNCH, 0, "j", 0), False, None),                            # no world size yet: one at a time
    ({"beats": [_with(work_median_s=0.2) + ["a field of tomorrow"]]}, FENCE, True, None),  # a newer agent's
    ({"beats": [GOOD_BEAT[:9]]}, FENCE, True, None),                  # an older agent's: the defaults
    ({"beats": [GOOD_BEAT[:2] + [True] + GOOD_BEAT[3:]]}, FENCE, None, "schema"),  # a rank that is no int
    ({"beats": [_with(attempt=False)]}, FENCE, None, "schema"),       # False == 0 in Python, not on the wire
    ({}, (LAUNCH, 0, "j", 1 << 21), False, None),                      # a fence no heartbeat can be of
    ({"beats": [_with(world_size=(1 << 20) + 5, rank=(1 << 20) + 1)]}, (LAUNCH, 0, "j", (1 << 20) + 5), None,
     "schema"),                                                         # (nor one beyond the wire's ranks)
    ({}, (LAUNCH, True, "j", 2), False, None),                         # a fence of another type: unfenced
])
def test_the_intake_s_fence_is_read_in_the_same_pass_as_the_frame_s_checks(change, fence, fenced, reason):
    frame = frame_of(GOOD | change)
    if reason is not None:
        with pytest.raises(ProtocolError) as err:
            decode_node_beats(frame, KEYS.heartbeat, fence)
        assert err.value.reason == reason
        return
    beats, held, ok = decode_node_beats(frame, KEYS.heartbeat, fence)
    assert ok is fenced
    assert [hb for hb, _ in decode_node_frame(frame, KEYS.heartbeat)] == beats and len(held) == len(beats)


def test_a_fenced_heartbeat_holds_the_fence_s_own_objects_and_equals_the_same_heartbeat_unfenced():
    # no string made per heartbeat for the job and launch, no int for the world size: the decode
    # checks them against the fence and keeps the fence's objects
    fence = (LAUNCH, 2, "llama-70b-pretrain", 1000)
    sent = [beat(r, world=1000) for r in range(996, 1000)]
    (one,) = encode_node_frames([(hb, 0.0) for hb in sent[:2]], KEYS.heartbeat)
    (two,) = encode_node_frames([(hb, 0.0) for hb in sent[2:]], KEYS.heartbeat)
    first, _, fenced = decode_node_beats(one, KEYS.heartbeat, fence)
    second, _, fenced_too = decode_node_beats(two, KEYS.heartbeat, fence)
    beats = first + second
    assert fenced and fenced_too and beats == sent and sent == beats and not beats != sent
    assert len({id(hb.launch) for hb in beats}) == len({id(hb.job) for hb in beats}) == 1
    assert len({id(hb.world_size) for hb in beats}) == 1
    unfenced = [hb for f in (one, two) for hb, _ in decode_node_frame(f, KEYS.heartbeat)]
    assert len({id(hb.launch) for hb in unfenced}) == 4  # (what the fence saves: a string per heartbeat)
    beats, sent = beats[2:], sent[2:]
    assert isinstance(beats[0], Heartbeat) and repr(beats[0]) == repr(sent[0])
    assert {*beats} == {*sent} and beats[0] != sent[1] and beats[0] != "a heartbeat"
    assert msgspec.structs.replace(beats[0], seq=5) == msgspec.structs.replace(sent[0], seq=5)
    back = pickle.loads(pickle.dumps(beats[0]))
    assert type(back) is Heartbeat and back == sent[0]


def test_enumerated_fields_decode_to_the_vocabulary_s_own_strings():
    # no string made per heartbeat for its phase, outcome, source or restore state (the controller
    # replaces 131,072 heartbeats a second: each allocation is also one to free)
    (frame,) = encode_node_frames([(beat(r, outcome="finished", phase="done"), 0.0) for r in range(2)],
                                  KEYS.heartbeat)
    a, b = (hb for hb, _ in decode_node_frame(frame, KEYS.heartbeat))
    assert a.phase is b.phase is PHASE_DONE and a.outcome is b.outcome is OUTCOME_FINISHED
    assert a.source is b.source is SOURCE_SDK and a.restore_state is b.restore_state is RESTORE_RESTORED


def test_a_node_frame_under_another_key_or_cut_or_oversized_is_refused():
    frame = frame_of(GOOD)
    for bad, reason in [(frame_of(GOOD, KEYS.control), "unauthenticated"), (frame[:-5], "unauthenticated"),
                        (frame[: len(MAGIC) + MAC_BYTES], "malformed"), (frame + b" " * MAX_DATAGRAM, "oversized")]:
        with pytest.raises(ProtocolError) as err:
            decode_node_frame(bad, KEYS.heartbeat)
        assert err.value.reason == reason


@pytest.mark.parametrize("change, now", [
    ({}, False), ({"phase": "compute"}, False), ({"phase": "checkpoint"}, False), ({"dump_seq": 4}, True),
    ({"loss_ok": False}, True),
    ({"outcome": "finished", "phase": "done"}, True), ({"error": "RuntimeError: x", "phase": "failed"}, True),
    ({"step": 124_000, "seq": 9, "phase_s": 0.5}, False), ({"pid": 1}, True), ({"attempt": 3}, True),
])
def test_what_goes_up_at_once(change, now):
    last = beat(0)
    assert urgent(beat(0, **change), last) is now
    assert urgent(last, None)  # a rank's first heartbeat
    assert urgent(beat(0, steps_done=1), beat(0, steps_done=0))  # its first completed step


@pytest.mark.parametrize("interval, timeout, flush", [
    (1.0, 5.0, 1.0),     # the defaults: once an interval
    (0.5, 3.0, 0.5),
    (1.0, 2.0, 0.5),     # the tightest timeout the config allows: a rank is seen silent 1.5 s at most, not 2
    (1.0, 2.5, 0.75),
    (0.1, 0.2, 0.05),
    (0.05, 0.1, None),   # no room for a flush every 50 ms or less: each rank sends its own
])
def test_the_relay_flushes_so_that_a_live_rank_never_reads_as_silent_past_the_timeout(interval, timeout, flush):
    got = relay_flush_s(interval, timeout)
    assert got == flush
    if got is not None:  # the longest a live rank's heartbeat looks old, with half the slack left over
        assert interval + got <= timeout - (timeout - interval) / 2 + 1e-9


# ------------------------------------------------------------------------------ the relay
@pytest.fixture
def loop(request):
    """A controller's socket, a relay sending to it (every 0.3 s, or the test's ``interval`` mark),
    and rank sockets to the relay."""
    mark = request.node.get_closest_marker("interval")
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctl.bind(("127.0.0.1", 0))
    ctl.settimeout(10)
    relay = Relay(ctl.getsockname(), KEYS, mark.args[0] if mark else 0.3).start()
    host, port = relay.address.rsplit(":", 1)
    ranks = []
    for _ in range(3):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((host, int(port)))
        s.settimeout(10)
        ranks.append(s)
    yield ctl, relay, ranks
    relay.close()
    for s in [ctl, *ranks]:
        s.close()


def receive(ctl, n: int) -> tuple[list[tuple[Heartbeat, float]], tuple]:
    got, addr = [], None
    while len(got) < n:
        data, addr = ctl.recvfrom(MAX_DATAGRAM + 1)
        got += decode_node_frame(data, KEYS.heartbeat)
    return got, addr


@pytest.mark.interval(60.0)
def test_first_heartbeats_go_up_at_once_not_an_interval_later(loop):
    ctl, relay, ranks = loop
    t0 = time.monotonic()
    for r, s in enumerate(ranks):
        s.send(encode(beat(r, world=3, phase="init").to_payload(), KEYS.heartbeat))
    got, _ = receive(ctl, 3)  # the controller's "running": long before the relay's 60 s interval ends
    assert sorted(hb.rank for hb, _ in got) == [0, 1, 2] and time.monotonic() - t0 < 10


def test_a_heartbeat_of_no_launch_is_dropped_at_the_relay_and_its_node_s_others_go_up(loop):
    # the controller refuses a node frame holding one (one agent made all of it): the relay keeps
    # it out, so one bad rank does not silence its node
    ctl, relay, ranks = loop
    ranks[0].send(encode(beat(0, world=3, launch="").to_payload(), KEYS.heartbeat))
    for r in (1, 2):
        ranks[r].send(encode(beat(r, world=3).to_payload(), KEYS.heartbeat))
    got, _ = receive(ctl, 2)
    assert sorted(hb.rank for hb, _ in got) == [1, 2] and relay.rejected == {"other_launch": 1}


def test_the_relay_sends_one_frame_per_interval_with_how_long_it_held_each(loop):
    ctl, relay, ranks = loop
    t0 = time.monotonic()
    for r, s in enumerate(ranks):
        s.send(encode(beat(r, world=3, phase="init").to_payload(), KEYS.heartbeat))
    receive(ctl, 3)
    first_frames = relay.frames_sent
    for r, s in enumerate(ranks):
        s.send(encode(beat(r, world=3, phase="init", seq=2, step=123_457).to_payload(), KEYS.heartbeat))
    t1 = time.monotonic()
    frames = []
    while sum(len(f) for f in frames) < 3:
        frames.append(decode_node_frame(ctl.recv(MAX_DATAGRAM + 1), KEYS.heartbeat))
    waited = time.monotonic() - t1
    # held until the interval's frame (one, or two where the three straddled its end): nothing new to say
    assert len(frames) <= 2 and sorted(hb.seq for f in frames for hb, _ in f) == [2, 2, 2]
    # held: how long the relay kept each, so the controller times silence from the rank's send
    assert all(0 <= held <= waited + 0.05 for f in frames for _, held in f)
    assert waited < 0.3 + 1.0 and time.monotonic() - t0 < 5
    assert relay.frames_sent == first_frames + len(frames) and relay.beats_sent == 6


@pytest.mark.interval(60.0)
def test_last_words_go_up_before_the_interval_ends_and_a_phase_within_a_step_waits(loop):
    ctl, relay, ranks = loop
    ranks[0].send(encode(beat(0, world=3).to_payload(), KEYS.heartbeat))
    receive(ctl, 1)
    ranks[0].send(encode(beat(0, world=3, seq=2, phase="compute").to_payload(), KEYS.heartbeat))  # held
    t0 = time.monotonic()
    ranks[0].send(encode(beat(0, world=3, seq=3, phase="failed", error="RuntimeError: boom").to_payload(),
                         KEYS.heartbeat))
    (hb, _), = receive(ctl, 1)[0]  # the relay's interval is 60 s: only the urgent path delivers this soon
    assert hb.phase == "failed" and hb.error == "RuntimeError: boom" and hb.seq == 3
    assert time.monotonic() - t0 < 10 and relay.beats_sent == 2  # the held compute beat was replaced, not sent


@pytest.mark.interval(60.0)
def test_closing_the_relay_sends_what_it_holds(loop):
    ctl, relay, ranks = loop
    ranks[1].send(encode(beat(1, world=3).to_payload(), KEYS.heartbeat))
    receive(ctl, 1)
    ranks[1].send(encode(beat(1, world=3, seq=2, step=123_999).to_payload(), KEYS.heartbeat))
    deadline = time.monotonic() + 10
    while relay.rank_addr.get(1) is None or 1 not in relay.held:  # taken in, held for the interval
        assert time.monotonic() < deadline
        time.sleep(0.01)
    relay.close()  # the agent is ending
    (hb, _), = receive(ctl, 1)[0]
    assert (hb.rank, hb.seq, hb.step) == (1, 2, 123_999)


def test_an_earlier_process_of_a_rank_never_replaces_the_one_restarted_in_place(loop):
    ctl, relay, ranks = loop
    ranks[0].send(encode(beat(0, world=3, attempt=3, pid=7).to_payload(), KEYS.heartbeat))
    ranks[0].send(encode(beat(0, world=3, attempt=2, pid=6, seq=99).to_payload(), KEYS.heartbeat))  # late
    ranks[0].send(encode(beat(2, world=3, attempt=3, pid=8).to_payload(), KEYS.heartbeat))  # a marker behind it
    got = []
    while {hb.rank for hb, _ in got} != {0, 2}:
        data = ctl.recv(MAX_DATAGRAM + 1)
        got += decode_node_frame(data, KEYS.heartbeat)
    assert [(hb.attempt, hb.pid) for hb, _ in got if hb.rank == 0][-1] == (3, 7)


def test_control_frames_reach_the_rank_they_name_and_forgeries_reach_none(loop):
    ctl, relay, ranks = loop
    for r, s in enumerate(ranks):
        s.send(encode(beat(r, world=3).to_payload(), KEYS.heartbeat))
    _, relay_addr = receive(ctl, 3)
    forged = encode(control_message("abort", attempt=2, rank=1, seq=7), KEYS.heartbeat)  # not the control key
    ctl.sendto(forged, relay_addr)
    order = encode(control_message("abort", attempt=2, rank=1, seq=8) | {"launch": LAUNCH}, KEYS.control)
    ctl.sendto(order, relay_addr)
    assert ranks[1].recv(MAX_DATAGRAM + 1) == order  # as it came: the rank checks it itself
    ctl.sendto(encode(control_message("dump", attempt=2, rank=2, seq=9), KEYS.control), relay_addr)
    assert ranks[2].recv(MAX_DATAGRAM + 1).startswith(MAGIC)
    deadline = time.monotonic() + 5
    while relay.controls_passed < 2 or relay.rejected.get("unauthenticated", 0) < 1:
        assert time.monotonic() < deadline, (relay.controls_passed, relay.rejected)
        time.sleep(0.01)
    ranks[1].settimeout(0)
    with pytest.raises(BlockingIOError):  # the forgery was never passed on: only the order came
        ranks[1].recv(MAX_DATAGRAM + 1)


def test_a_heartbeat_under_the_wrong_key_is_counted_and_never_sent_up(loop):
    ctl, relay, ranks = loop
    ranks[0].send(encode(beat(0, world=3).to_payload(), KEYS.control))
    ranks[1].send(b"SV2" + b"x" * 40)
    ranks[2].send(encode(beat(2, world=3).to_payload(), KEYS.heartbeat))
    (hb, _), = receive(ctl, 1)[0]
    assert hb.rank == 2 and relay.rejected == {"unauthenticated": 2}


def test_the_agent_starts_a_relay_only_where_it_has_a_controller_and_aggregation_is_on(tmp_path):
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctl.bind(("127.0.0.1", 0))
    addr = "%s:%d" % ctl.getsockname()
    token = tmp_path / "token"
    token.write_text("ab" * 32)
    base = {Env.HEARTBEAT_ADDR: addr, Env.TOKEN_FILE: str(token), Env.HEARTBEAT_INTERVAL: "0.5",
            Env.AGGREGATE: aggregate_setting(0.5)}
    env = dict(base)
    relay = start_from_env(env)
    try:
        assert relay is not None and env[Env.HEARTBEAT_UPSTREAM] == addr and env[Env.HEARTBEAT_ADDR] == relay.address
        assert start_from_env(dict(env)) is None  # the ranks of a nested agent keep the relay they have
    finally:
        relay.close()
        ctl.close()
    older = {k: v for k, v in base.items() if k != Env.AGGREGATE}  # a controller that reads no node frames
    # off, unset, out of range, without a controller, or node frames of another format (an older
    # controller set a bare number: it reads the frames of version 1, which this agent no longer makes)
    for env in ({**base, Env.AGGREGATE: "off"}, older, {**base, Env.AGGREGATE: aggregate_setting(0.01)},
                {Env.TOKEN_FILE: str(token)}, {Env.HEARTBEAT_ADDR: addr, Env.AGGREGATE: aggregate_setting(1.0)},
                {**base, Env.AGGREGATE: "0.5"}, {**base, Env.AGGREGATE: "1:0.5"}, {**base, Env.AGGREGATE: "2:x"}):
        before = dict(env)
        assert start_from_env(env) is None and env == before


# ------------------------------------------------------------------------------ end to end
JOB = ["--steps", "30", "--checkpoint-every", "5", "--step-sleep", "0.05"]


@pytest.mark.slow
def test_a_job_s_heartbeats_come_in_node_frames_and_each_rank_is_still_seen(supervisor_run):
    run = supervisor_run(JOB, nnodes="2", extra=["--nproc-per-node", "2"])
    assert run.wait() == 0, run.output()[-3000:]
    end = run.events("job_finished")[-1]
    beats = end["heartbeats"]
    # 4 ranks on 2 nodes: every heartbeat came in a node frame, several to a frame (a rank's first
    # heartbeat, first step and last words go up at once, alone or not)
    assert 0 < beats["node_frames"] < beats["received"], beats
    assert beats["rejected"] == 0 and end["phase"] == "completed"
    assert run.wait_event("running", attempt=0)["world_size"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("fault, kind, rung_action, slots", [
    ("kind=stop,rank=1,step=13,attempt=0", "dead", "kill_node", 2),
    ("kind=kill,rank=1,step=13,attempt=0", "rank_killed", None, 2),
    ("kind=skip-collective,rank=1,step=13,attempt=0", "collective_hang", "abort_ranks", 2),
    ("kind=node-stop,rank=1,step=13,attempt=0", "dead", "kill_node", 3),  # the frozen node is left out: a spare
])
def test_with_aggregation_off_each_fault_is_found_and_named_as_before(supervisor_run, fault, kind, rung_action, slots):
    run = supervisor_run(JOB, fault=fault, slots=slots, extra=["--no-aggregate"])
    assert run.wait() == 0, run.output()[-3000:]
    found = run.wait_event("fault_detected")
    assert found["kind"] == kind and found["ranks"] == [1] and found["nodes"] == ["node1"], found
    if rung_action:
        assert run.wait_event("action", action=rung_action)
    end = run.events("job_finished")[-1]
    assert end["phase"] == "completed" and end["heartbeats"]["node_frames"] == 0, end
    assert end["heartbeats"]["received"] > 0
