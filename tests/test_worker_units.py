"""Worker SDK pieces in one process: session, fault spec, wire protocol, heartbeats, watchdog."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.protocol import (
    EXIT_CRASH,
    MAX_DATAGRAM,
    PHASE_CHECKPOINT,
    PHASE_TRAINING,
    PHASE_COMPUTE,
    PHASE_DATA,
    PHASE_DONE,
    PHASE_RESTORE,
    PHASES,
    RANK_EXITS,
    TIMED_PHASES,
    Heartbeat,
    ProtocolError,
    control_message,
    decode_frame,
    decode_heartbeat,
    derive_keys,
    encode,
)
from supervisor.worker.faults import Fault, FaultSpecError, parse_faults
from supervisor.worker.heartbeat import HeartbeatSender
from supervisor.worker.session import DEFAULT_TIMEOUTS, Session, SessionError
from supervisor.worker.telemetry import RankState
from supervisor.worker.watchdog import Watchdog

TOKEN = b"s3cret-token"
KEYS = derive_keys(TOKEN)
LAUNCH = "a" * 32


# ----------------------------------------------------------------- session

def test_session_defaults_without_supervisor():
    s = Session.from_env({})
    assert (s.rank, s.world_size, s.attempt, s.supervised) == (0, 1, 0, False)


def test_session_from_torchrun_and_supervisor_env(tmp_path):
    (tmp_path / "tok").write_text("abc\n")
    s = Session.from_env({
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RESTART_COUNT": "2",
        "SUPERVISOR_ATTEMPT": "5", "SUPERVISOR_HEARTBEAT_ADDR": "127.0.0.1:9999",
        "SUPERVISOR_TOKEN_FILE": str(tmp_path / "tok"), "SUPERVISOR_WATCHDOG": "compute=7, collective=3",
        "SUPERVISOR_JOB": "llm", "SUPERVISOR_NODE": "n2", "SUPERVISOR_LAUNCH": LAUNCH,
    })
    assert (s.rank, s.local_rank, s.world_size, s.attempt) == (3, 1, 4, 5)
    assert s.heartbeat_addr == ("127.0.0.1", 9999) and s.token == b"abc" and s.supervised and s.launch == LAUNCH
    assert s.keys == derive_keys(b"abc") and b"abc" not in repr(s).encode()
    assert s.timeouts["compute"] == 7 and s.timeouts["collective"] == 3 and s.timeouts["data"] == 60
    assert Session.from_env({"TORCHELASTIC_RESTART_COUNT": "2"}).attempt == 2


@pytest.mark.parametrize("env, match", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below"),
    ({"WORLD_SIZE": "x"}, "not an integer"),
    ({"WORLD_SIZE": "0"}, "below 1"),
    ({"SUPERVISOR_HEARTBEAT_ADDR": "nohost"}, "host:port"),
    ({"SUPERVISOR_HEARTBEAT_ADDR": "h:70000", "SUPERVISOR_TOKEN": "t"}, "host:port"),
    ({"SUPERVISOR_HEARTBEAT_ADDR": "h:1"}, "no SUPERVISOR_TOKEN"),
    ({"SUPERVISOR_HEARTBEAT_ADDR": "h:1", "SUPERVISOR_TOKEN": "t"}, "SUPERVISOR_LAUNCH"),
    ({"SUPERVISOR_HEARTBEAT_ADDR": "h:1", "SUPERVISOR_TOKEN": "t", "SUPERVISOR_LAUNCH": "x" * 32}, "not a launch id"),
    ({"SUPERVISOR_HEARTBEAT_INTERVAL": "0"}, "outside"),
    ({"SUPERVISOR_WATCHDOG": "compute"}, "PHASE=SECONDS"),
    ({"SUPERVISOR_WATCHDOG": "lunch=5"}, "PHASE=SECONDS"),
    ({"SUPERVISOR_WATCHDOG": "compute=-1"}, "> 0"),
    ({"SUPERVISOR_TOKEN_FILE": "/nonexistent/tok"}, "SUPERVISOR_TOKEN_FILE"),
])
def test_session_errors_name_the_variable(env, match):
    with pytest.raises(SessionError, match=match):
        Session.from_env(env)


# ----------------------------------------------------------------- fault spec

# an "agent" that starts the same rank twice (a restart in place), as torchrun's does
AGENT = ("import os, subprocess, sys\n"
         "child = 'from supervisor.worker.session import Session; s = Session.from_env(); "
         "assert Session.from_env().attempt == s.attempt; print(s.attempt)'\n"
         "for _ in range(2):\n"
         "    print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, check=True)"
         ".stdout.strip(), flush=True)\n")


def test_a_rank_restarted_in_place_by_its_agent_counts_the_restart_in_its_attempt(tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, SUPERVISOR_ATTEMPT="3", SUPERVISOR_IN_PLACE="2", TMPDIR=str(tmp_path),
               TORCHELASTIC_RUN_ID="job-3", LOCAL_RANK="0", TORCHELASTIC_RESTART_COUNT="0")
    first = subprocess.run([sys.executable, "-c", AGENT], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["3", "4"]  # the launch's attempt, then one restart in place
    # another agent (a new launch of the same attempt number): it starts from the launch's again
    again = subprocess.run([sys.executable, "-c", AGENT], env=env, capture_output=True, text=True, check=True)
    assert again.stdout.split() == ["3", "4"]
    # without SUPERVISOR_IN_PLACE nothing is counted: every start is the launch's attempt
    env.pop("SUPERVISOR_IN_PLACE")
    plain = subprocess.run([sys.executable, "-c", AGENT], env=env, capture_output=True, text=True, check=True)
    assert plain.stdout.split() == ["3", "3"]


def test_fault_spec_parses_several_faults():
    faults = parse_faults("kind=hang,rank=1,step=30; kind=slow,ms=50,step=2 ;kind=crash,attempt=0")
    assert faults == [Fault("hang", rank=1, step=30), Fault("slow", step=2, ms=50), Fault("crash", attempt=0)]
    assert faults[0].applies(rank=1, attempt=3) and not faults[0].applies(rank=0, attempt=3)
    assert faults[2].applies(rank=7, attempt=0) and not faults[2].applies(rank=7, attempt=1)
    assert faults[1].fires_at(2) and faults[1].fires_at(9) and not faults[1].fires_at(1)
    assert faults[0].fires_at(30) and not faults[0].fires_at(31)
    assert parse_faults("") == [] and parse_faults(None) == []


@pytest.mark.parametrize("spec, match", [
    ("kind=explode", "kind must be one of"),
    ("rank=1", "kind must be one of"),
    ("kind=hang,rank=one", "rank must be an integer"),
    ("kind=hang,step=0", "out of range"),
    ("kind=hang,rank=-1", "out of range"),
    ("kind=hang,when=3", "unknown key 'when'"),
    ("kind=hang,rank", "not key=value"),
    ("kind=hang,rank=1,rank=2", "given twice"),
])
def test_malformed_fault_spec_is_an_error(spec, match):
    with pytest.raises(FaultSpecError, match=match):
        parse_faults(spec)


# ----------------------------------------------------------------- protocol

def hb(**kw) -> Heartbeat:
    base = dict(job="j", attempt=1, rank=0, world_size=2, seq=1, step=5, phase="compute", phase_s=0.5)
    return Heartbeat(**(base | kw))


def test_heartbeat_roundtrip():
    h = hb(coll_seq=9, coll_inside=True, watchdog="compute running 3.0s")
    assert decode_heartbeat(encode(h.to_payload(), KEYS.heartbeat), KEYS.heartbeat) == h


@pytest.mark.parametrize("frame, reason", [
    (b"garbage", "malformed"),
    (b"SV2" + b"\0" * 16 + b"{}", "unauthenticated"),
    (b"SV1" + b"\0" * 16 + b"{}", "malformed"),  # the first wire (MAC'd with the token itself)
    (b"x" * (MAX_DATAGRAM + 1), "oversized"),
])
def test_bad_frames(frame, reason):
    with pytest.raises(ProtocolError) as exc:
        decode_heartbeat(frame, KEYS.heartbeat)
    assert exc.value.reason == reason


def test_wrong_token_and_tampering_are_unauthenticated():
    frame = encode(hb().to_payload(), KEYS.heartbeat)
    with pytest.raises(ProtocolError, match="unauthenticated"):
        decode_heartbeat(frame, b"other")
    tampered = frame[:-3] + b"9}" + frame[-1:]
    with pytest.raises(ProtocolError, match="unauthenticated"):
        decode_heartbeat(tampered, KEYS.heartbeat)


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(rank=2),  # >= world_size
    lambda d: d.update(rank=-1),
    lambda d: d.update(phase="lunch"),
    lambda d: d.update(phase_s=float("inf")) or d,
    lambda d: d.update(step="5"),
    lambda d: d.update(coll_inside=1),
    lambda d: d.pop("attempt"),
    lambda d: d.update(type="other"),
    lambda d: d.update(job="x" * 500),
])
def test_schema_violations(mutate):
    d = hb().to_payload()
    mutate(d)
    import hashlib
    import hmac

    body = json.dumps(d).encode()
    frame = b"SV2" + hmac.new(KEYS.heartbeat, body, hashlib.sha256).digest()[:16] + body
    with pytest.raises(ProtocolError) as exc:
        decode_heartbeat(frame, KEYS.heartbeat)
    assert exc.value.reason in ("schema", "malformed")


def _framed(d) -> bytes:
    import hashlib
    import hmac

    body = json.dumps(d).encode() if not isinstance(d, bytes) else d
    return b"SV2" + hmac.new(KEYS.heartbeat, body, hashlib.sha256).digest()[:16] + body


def _verdict(decode):
    try:
        return decode()
    except ProtocolError as exc:
        return exc.reason


_VALUES = [0, 1, -1, 2, 7, 2**31, 2**63, 1e9, 1e10, 0.5, -0.5, True, False, None, "", "compute", "x" * 600, [], {}]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(hb().to_payload())), st.sampled_from(_VALUES)), max_size=4),
       st.lists(st.sampled_from(sorted(hb().to_payload())), max_size=2))
def test_the_fast_decoder_accepts_exactly_what_the_schema_checks_accept(changes, dropped):
    # decode_heartbeat (msgspec, one pass) against the plain path (json + from_payload)
    d = hb().to_payload()
    for k, v in changes:
        d[k] = v
    for k in dropped:
        d.pop(k, None)
    frame = _framed(d)
    fast = _verdict(lambda: decode_heartbeat(frame, KEYS.heartbeat))
    plain = _verdict(lambda: Heartbeat.from_payload(decode_frame(frame, KEYS.heartbeat)))
    assert fast == plain


@pytest.mark.parametrize("body, reason", [
    (b"[1, 2]", "schema"),
    (b"\xff\xfe{}", "malformed"),
    (b'{"type": "hb"', "malformed"),
    (json.dumps({**hb().to_payload(), "rank": True}).encode(), "schema"),
])
def test_odd_payloads(body, reason):
    with pytest.raises(ProtocolError) as exc:
        decode_heartbeat(_framed(body), KEYS.heartbeat)
    assert exc.value.reason == reason


def test_control_messages():
    frame = encode(control_message("abort", launch=LAUNCH, attempt=2, rank=1, reason="hang", seq=9), KEYS.control)
    msg = decode_frame(frame, KEYS.control)
    assert msg == {"type": "abort", "launch": LAUNCH, "attempt": 2, "rank": 1, "seq": 9, "reason": "hang"}
    with pytest.raises(ValueError):
        control_message("reboot", attempt=0, rank=0)


# ----------------------------------------------------------------- heartbeat sender

def udp_server():
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(5)
    return srv


def test_heartbeats_flow_and_abort_is_obeyed_only_when_addressed():
    srv = udp_server()
    session = Session(rank=1, world_size=2, attempt=3, heartbeat_addr=srv.getsockname(), token=TOKEN,
                      heartbeat_interval=0.05, job="j", launch=LAUNCH)
    state = RankState()
    aborts: list[str] = []
    sender = HeartbeatSender(session, state, on_abort=aborts.append)
    sender.start()
    try:
        state.step = 4
        state.set_phase("compute")
        frames = []
        while len(frames) < 3:
            frame, addr = srv.recvfrom(8192)
            frames.append(decode_heartbeat(frame, KEYS.heartbeat))
        assert [f.seq for f in frames] == sorted(f.seq for f in frames)
        assert frames[-1].step == 4 and frames[-1].phase == "compute" and frames[-1].attempt == 3
        # not for us: wrong attempt, wrong rank, wrong token
        srv.sendto(encode(control_message("abort", launch=LAUNCH, attempt=2, rank=1), KEYS.control), addr)
        srv.sendto(encode(control_message("abort", launch=LAUNCH, attempt=3, rank=0), KEYS.control), addr)
        srv.sendto(encode(control_message("abort", launch=LAUNCH, attempt=3, rank=1), b"forged"), addr)
        time.sleep(0.3)
        assert aborts == []
        srv.sendto(encode(control_message("abort", launch=LAUNCH, attempt=3, rank=1, reason="hung in allreduce"), KEYS.control), addr)
        deadline = time.monotonic() + 5
        while not aborts and time.monotonic() < deadline:
            time.sleep(0.02)
        assert aborts == ["hung in allreduce"]
    finally:
        sender.stop()
        srv.close()


def test_unreachable_controller_backs_off_and_buffers_nothing():
    # A name that cannot resolve: every send fails. The sender must keep going, back off,
    # and never queue (there is no queue: only the latest snapshot is ever sent).
    session = Session(heartbeat_addr=("no-such-host.invalid", 9), token=TOKEN, heartbeat_interval=0.05)
    sender = HeartbeatSender(session, RankState(), on_abort=lambda r: None)
    sender.start()
    time.sleep(1.0)
    sender.stop()
    assert sender.sent == 0
    assert 1 <= sender.send_errors <= 6, sender.send_errors  # 20 intervals, but backed off


def test_local_heartbeat_file_without_supervisor(tmp_path):
    session = Session(rank=0, log_dir=tmp_path, heartbeat_interval=0.05)
    state = RankState()
    sender = HeartbeatSender(session, state, on_abort=lambda r: None)
    sender.start()
    state.step = 11
    time.sleep(0.3)
    sender.stop()
    rec = json.loads((tmp_path / "heartbeat-rank-0.json").read_text())
    assert rec["step"] == 11 and rec["seq"] >= 2 and abs(rec["time"] - time.time()) < 5


# ----------------------------------------------------------------- watchdog and telemetry

class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_watchdog_fires_once_per_episode_and_dumps_stacks(tmp_path):
    clock = FakeClock()
    state = RankState(clock=clock)
    fired = []
    wd = Watchdog(state, {"compute": 10.0, "collective": 5.0}, tmp_path / "stacks.txt", on_fire=fired.append)
    state.set_phase("compute")
    clock.t += 9
    assert wd.check() is None
    clock.t += 2
    event = wd.check()
    assert event and "compute running 11.0s > 10s" in event
    assert wd.check() is None  # same episode: one dump
    text = (tmp_path / "stacks.txt").read_text()
    assert "watchdog: compute running" in text and "test_watchdog_fires_once" in text  # this thread's stack
    assert state.watchdog == event and state.stack_file == str(tmp_path / "stacks.txt")
    # a new episode: a collective that stays in flight
    seq = state.coll_enter("allreduce")
    clock.t += 6
    assert "allreduce #1 running 6.0s > 5s" in wd.check()
    state.coll_exit(seq)
    assert len(fired) == 2


def test_snapshot_reports_collective_in_flight():
    clock = FakeClock()
    state = RankState(clock=clock)
    state.set_phase("compute")
    a = state.coll_enter("allreduce")
    b = state.coll_enter("allreduce")
    clock.t += 2
    s = state.snapshot()
    assert (s.phase, s.coll_seq, s.coll_inside, s.coll_s) == ("collective", 2, True, 2.0)
    state.coll_exit(a)
    state.coll_exit(b)
    s = state.snapshot()
    assert (s.phase, s.coll_inside) == ("compute", False)
    assert state.take_collective_busy() == {"compute": 2.0}  # wall time, not 2 x 2 s
    assert state.take_collective_busy() == {}


@pytest.mark.parametrize("ended", ["sdk", "optimizer hook"])
def test_a_rank_s_loop_time_per_step_leaves_its_saves_out_and_one_slow_step_does_not_move_it(ended):
    clock = FakeClock()
    state = RankState(clock=clock)

    def step(n):
        if ended == "sdk":
            state.step_ended((0.0, 0.02, 0.0, 0.02))
        else:
            state.set_step(n, (0.0, 0.0, 0.0, 0.0), "compute")

    step(1)
    assert state.snapshot().loop_step_s == 0.0  # one step end: nothing to measure from
    for n in range(2, 30):
        clock.t += 0.05  # the loop: the step, then what the script does around it
        if n % 10 == 0:  # a save blocks the loop 1.5 s, in the checkpoint phase
            with state.phase_scope("checkpoint"):
                clock.t += 1.5
        if n == 17:
            clock.t += 0.4  # one slow step
        step(n)
    assert state.snapshot().loop_step_s == pytest.approx(0.05)
    for n in range(30, 60):  # the loop slows down: the median follows within its window
        clock.t += 0.2
        step(n)
    assert state.snapshot().loop_step_s == pytest.approx(0.2)


def test_a_step_that_ends_inside_a_save_leaves_the_save_out_of_both_iterations_once():
    clock = FakeClock()
    state = RankState(clock=clock)
    state.step_ended((0.0, 0.05, 0.0, 0.05))
    clock.t += 0.05
    state.step_ended((0.0, 0.05, 0.0, 0.05))  # an iteration of 0.05 s
    with state.phase_scope("checkpoint"):  # a save of 1 s, and a step ends half way through it
        clock.t += 0.5
        state.step_ended((0.0, 0.0, 0.0, 0.01))  # nothing but the save before it: 0 s
        clock.t += 0.5
    clock.t += 0.05
    state.step_ended((0.0, 0.05, 0.0, 0.05))  # the save's second half left out: 0.05 s
    assert state.snapshot().loop_step_s == pytest.approx(0.05)  # the median of 0.05, 0, 0.05


def test_a_rank_says_the_medians_of_its_last_steps_times_and_work_once_it_took_three():
    state = RankState(clock=FakeClock())
    state.step_ended((0.0, 0.0, 0.0, 0.0))  # a step with no timing (an instrumented rank's first): not counted
    for n, step_s in enumerate((0.4, 9.0), start=1):
        state.step_ended((0.1, step_s / 2, 0.05, step_s))
    s = state.snapshot()
    assert (s.step_median_s, s.work_median_s) == (0.0, 0.0)  # two steps: too few to say
    state.step_ended((0.1, 0.2, 0.05, 0.5))
    s = state.snapshot()
    assert (s.step_median_s, s.work_median_s) == (0.5, pytest.approx(0.3))
    for _ in range(40):  # the last 20 only: the old slow step is gone from them
        state.step_ended((0.0, 0.1, 0.0, 0.2))
    s = state.snapshot()
    assert (s.step_median_s, s.work_median_s) == (0.2, 0.1)


# ----------------------------------------------------------------- a rank's last word

RAISES = """
import sys
from supervisor.worker import Worker
w = Worker.from_env().start()
w.state.step = 7
raise {exc}
"""


@pytest.mark.parametrize("exc, peer", [
    ('RuntimeError("[pair.cc:537] Read error [127.0.0.1]:26511: Connection reset by peer. Check the logs '
     'of the remote worker")', True),
    ('ValueError("bad batch shape (3, 4)")', False),
])
def test_an_uncaught_exception_sends_a_last_heartbeat_that_names_it(exc, peer):
    import subprocess
    import sys

    srv = udp_server()
    env = dict(os.environ, SUPERVISOR_HEARTBEAT_ADDR="127.0.0.1:%d" % srv.getsockname()[1],
               SUPERVISOR_TOKEN=TOKEN.decode(), SUPERVISOR_LAUNCH=LAUNCH, RANK="0", WORLD_SIZE="1",
               SUPERVISOR_HEARTBEAT_INTERVAL="30")
    proc = subprocess.run([sys.executable, "-c", RAISES.format(exc=exc)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and exc.split("(")[0] in proc.stderr  # the traceback is still printed
    beats = []
    srv.settimeout(1)
    try:
        while True:
            beats.append(decode_heartbeat(srv.recv(8192), KEYS.heartbeat))
    except socket.timeout:
        pass
    srv.close()
    last = beats[-1]
    assert (last.phase, last.step, last.error_peer) == ("failed", 7, peer)
    assert last.error.startswith(exc.split("(")[0] + ": ")


# ----------------------------------------------------------------- the contract with the controller
def test_every_phase_a_rank_reports_is_a_wire_phase_and_every_wire_phase_is_reachable():
    clock = FakeClock()
    state = RankState(clock=clock)
    seen = [state.snapshot().phase]                      # init
    for phase in (PHASE_RESTORE, PHASE_DATA, PHASE_CHECKPOINT):
        with state.phase_scope(phase):
            seen.append(state.snapshot().phase)
    seen.append(state.snapshot().phase)                  # idle between phases
    with state.phase_scope(PHASE_COMPUTE):
        seen.append(state.snapshot().phase)
        seq = state.coll_enter("allreduce")
        seen.append(state.snapshot().phase)              # collective while one is in flight
        state.coll_exit(seq)
    state.set_step(1, (0.0, 0.0, 0.0, 0.0), PHASE_TRAINING)  # the instrumentation's step hook (no SDK)
    seen.append(state.snapshot().phase)
    state.set_failed("ValueError: x", peer=False)
    seen.append(state.snapshot().phase)
    state.set_phase(PHASE_DONE)                          # what Worker.close() sets
    seen.append(state.snapshot().phase)
    assert sorted(set(seen)) == sorted(PHASES)
    for phase in seen:                                   # and the controller accepts each
        hb = Heartbeat(job="j", attempt=0, rank=0, world_size=1, seq=1, step=1, phase=phase, phase_s=0.0)
        assert decode_heartbeat(encode(hb.to_payload(), KEYS.heartbeat), KEYS.heartbeat).phase == phase


@pytest.mark.parametrize("phase", PHASES)
def test_the_rank_watchdog_times_a_phase_exactly_when_it_is_a_timed_phase(phase, tmp_path):
    assert tuple(DEFAULT_TIMEOUTS) == TIMED_PHASES
    clock = FakeClock()
    state = RankState(clock=clock)
    wd = Watchdog(state, Session.from_env({}).timeouts, tmp_path / "stacks.txt")
    state.set_phase(phase)
    clock.t += 1e6
    assert (wd.check() is not None) == (phase in TIMED_PHASES)


def test_the_controllers_watchdog_timeouts_are_what_a_rank_parses():
    from supervisor.health import Timeouts

    t = Timeouts(heartbeat_s=5, startup_s=100, checkpoint_s=1000, data_s=20, compute_s=30, collective_s=40)
    got = Session.from_env({"SUPERVISOR_WATCHDOG": t.watchdog_env()}).timeouts
    assert got == pytest.approx({p: 0.8 * t.for_phase(p) for p in TIMED_PHASES})
    assert all(got[p] != DEFAULT_TIMEOUTS[p] for p in TIMED_PHASES)  # every default was replaced


CRASH_DRILL = """
from supervisor.worker import Worker
w = Worker.from_env().start()
w.state.step = 2
w.fault_point()
raise SystemExit("the crash drill did not fire")
"""


def test_the_exit_codes_a_rank_ends_with_are_the_ones_the_controller_classifies():
    import subprocess
    import sys

    import supervisor.worker as sdk

    # the SDK's codes: the crash drill's, and the two a training script exits with (the example)
    assert {EXIT_CRASH, sdk.EXIT_NONFINITE, sdk.EXIT_PREEMPTED} == set(RANK_EXITS)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", SUPERVISOR_FAULT="kind=crash,step=2")
    for k in ("SUPERVISOR_HEARTBEAT_ADDR", "SUPERVISOR_API", "SUPERVISOR_TOKEN", "SUPERVISOR_TOKEN_FILE"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", CRASH_DRILL], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_CRASH, proc.stderr[-2000:]


# ----------------------------------------------------------------- checkpoints: root and refusal (issue 13)

def heartbeats_until(srv, token, predicate):
    """Heartbeats from ``srv`` until one satisfies ``predicate`` (socket.timeout if none comes),
    and the sender's address."""
    while True:
        frame, addr = srv.recvfrom(8192)
        hb = decode_heartbeat(frame, token)
        if predicate(hb):
            return hb, addr


def stop_sender(sender, srv, addr):
    """Stop a sender with a long interval at once: control frames addressed to nobody (ignored)
    wake its receive wait until it has seen the stop, instead of an interval later."""
    import threading

    done = threading.Event()
    frame = encode(control_message("dump", launch=LAUNCH, attempt=999, rank=999), KEYS.control)

    def wake():
        while not done.wait(0.05):
            srv.sendto(frame, addr)

    waker = threading.Thread(target=wake, daemon=True)
    waker.start()
    try:
        sender.stop()
    finally:
        done.set()
        waker.join()


def test_a_script_that_saves_without_restoring_reports_its_checkpoint_root_at_once(tmp_path):
    """Issue 13 §3: the root used to be reported from restore() only; a script that saves through
    after_step() and never restores left the supervisor watching a directory nobody writes."""
    import torch

    from supervisor.checkpoint import CheckpointManager
    from supervisor.worker.runtime import Verdict, Worker

    srv = udp_server()
    # one heartbeat a minute: only a heartbeat sent at the save can arrive within the test
    w = Worker(Session(rank=0, world_size=1, attempt=1, heartbeat_addr=srv.getsockname(), token=TOKEN,
                       heartbeat_interval=60, job="j"))
    w.heartbeat.start()
    first, addr = heartbeats_until(srv, KEYS.heartbeat, lambda h: True)
    try:
        assert first.ckpt_root == ""  # nothing saved yet
        root = tmp_path / "myckpt"
        ckpt = CheckpointManager(root, model=torch.nn.Linear(4, 4))
        assert w.after_step(ckpt, 1, Verdict(loss=1.0, nonfinite=False, stop=False, save_due=True))
        hb, _ = heartbeats_until(srv, KEYS.heartbeat, lambda h: h.ckpt_root)
        assert hb.ckpt_root == str(root.resolve()) and hb.ckpt_step == 1 and hb.restore_state == ""
        assert (root / "step-0000000001" / "manifest.json").exists()
    finally:
        stop_sender(w.heartbeat, srv, addr)
        srv.close()


class RestorePoint:
    """A stand-in for the controller's /v1/restore-point on the wire contract
    (:mod:`supervisor.protocol`): answers ``reply`` to a request MAC'd with ``token``'s HTTP key,
    with its own MAC (``forge_answer``: a MAC made with another key, as a stranger would)."""

    def __init__(self, reply: dict, token: bytes, forge_answer: bool = False):
        import http.server
        import threading
        import urllib.parse

        from supervisor.protocol import (HEADER_MAC, HEADER_NONCE, NonceCache, check_restore_request,
                                         restore_answer_mac)

        outer = self
        self.asked: list[str] = []
        self.refused: list[str] = []
        nonces = NonceCache()
        answer_key = derive_keys(b"not the token" * 4).http if forge_answer else derive_keys(token).http

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.asked.append(self.path)
                url = urllib.parse.urlsplit(self.path)
                try:
                    check_restore_request(derive_keys(token).http, method="GET", path=url.path,
                                          query=dict(urllib.parse.parse_qsl(url.query)), headers=self.headers,
                                          nonces=nonces)
                    ok = True
                except ProtocolError as exc:
                    outer.refused.append(exc.reason)
                    ok = False
                body = json.dumps(reply if ok else {"error": "unauthenticated"}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if ok:
                    self.send_header(HEADER_MAC, restore_answer_mac(answer_key, self.headers[HEADER_NONCE], 200, body))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("required", [True, False])
def test_a_rank_told_a_checkpoint_is_required_refuses_to_train_from_scratch(tmp_path, required):
    """Issue 13 §1: every checkpoint on disk is corrupt. When the controller's restore point says
    the job has had one (required), the rank's restore fails and says so in a heartbeat at once;
    otherwise it starts fresh."""
    from helpers import tiny_job, train_step
    from supervisor.checkpoint import CheckpointLoadError
    from supervisor.worker.runtime import Worker

    root = tmp_path / "ckpt"
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    for step in (1, 2):
        train_step(model, opt, sched, cursor)
        mgr.save(step)
        rng = sorted((root / f"step-{step:010d}" / "rng").iterdir())[0]  # bit rot, found before any tensor loads
        data = bytearray(rng.read_bytes())
        data[len(data) // 2] ^= 0x01
        rng.write_bytes(bytes(data))
    api = RestorePoint({"checkpoint": "step-0000000002", "exclude": [], "required": required}, TOKEN)
    srv = udp_server()
    w = Worker(Session(rank=0, world_size=1, attempt=3, heartbeat_addr=srv.getsockname(), token=TOKEN,
                       heartbeat_interval=60, job="j", api=api.url, launch=LAUNCH))
    w.heartbeat.start()
    _, addr = heartbeats_until(srv, KEYS.heartbeat, lambda h: True)
    try:
        fresh, *_ = tiny_job(root, seed=7)
        if required:
            with pytest.raises(CheckpointLoadError) as exc:
                w.restore(fresh)
            assert sorted(s.name for s in exc.value.skipped) == ["step-0000000001", "step-0000000002"]
            assert "refusing to train from scratch" in str(exc.value)
            hb, _ = heartbeats_until(srv, KEYS.heartbeat, lambda h: h.restore_state)
            assert hb.restore_state == "failed" and hb.restored == ""
            refused = [name for name, _why in hb.restore_refused]
            assert "step-0000000002" in refused and "step-0000000001" in refused
        else:
            assert w.restore(fresh) is None
            hb, _ = heartbeats_until(srv, KEYS.heartbeat, lambda h: h.restore_state)
            assert hb.restore_state == "fresh"
        assert w.state.restore_state == hb.restore_state
        assert hb.ckpt_root == str(root.resolve())
        # the controller was asked, once, with a request that names no key
        assert api.asked == [f"/v1/restore-point?attempt=3&rank=0&launch={LAUNCH}"] and api.refused == []
    finally:
        stop_sender(w.heartbeat, srv, addr)
        srv.close()
        api.close()


def test_a_rank_takes_only_the_controllers_own_answer_and_its_request_names_no_key(caplog):
    from supervisor.worker.runtime import Worker

    reply = {"checkpoint": "step-0000000002", "exclude": ["step-0000000003"], "required": True}
    genuine, forged = RestorePoint(reply, TOKEN), RestorePoint(reply, TOKEN, forge_answer=True)
    other_token = RestorePoint(reply, b"another job's token")
    try:
        session = dict(rank=0, world_size=1, attempt=3, token=TOKEN, launch=LAUNCH)
        assert Worker(Session(api=genuine.url, **session)).restore_point() == reply
        # an answer without the controller's MAC (a stranger on the path answering for it) is not taken
        assert Worker(Session(api=forged.url, **session)).restore_point() is None
        assert "restore_point_unavailable" in caplog.text and "the answer is not the controller's" in caplog.text
        # a controller with another token refuses the request: the rank's MAC is not its key's
        assert Worker(Session(api=other_token.url, **session)).restore_point() is None
        assert other_token.refused == ["unauthenticated"] * 3  # tried 3 times, each signed anew
        for url in genuine.asked + forged.asked + other_token.asked:
            assert TOKEN.decode() not in url and "Bearer" not in url
    finally:
        for api in (genuine, forged, other_token):
            api.close()
