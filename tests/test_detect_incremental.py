"""The incremental detection tick (issue 28): the registry indexes when each rank's last
heartbeat could next make a finding, and detect() answers [] without visiting the ranks while
none has come; its findings are always those of the pass over every rank (detect_full)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.health import Kind, Registry, Timeouts, detect
from supervisor.health.detect import detect_full
from supervisor.health.registry import BRIEF_S, SLOT_S
from supervisor.protocol import (
    PHASE_CHECKPOINT,
    PHASE_COLLECTIVE,
    PHASE_COMPUTE,
    PHASE_DATA,
    PHASE_DONE,
    PHASE_FAILED,
    PHASE_IDLE,
    PHASE_INIT,
    PHASE_RESTORE,
    PHASE_TRAINING,
    PHASES,
    Heartbeat,
)

T = Timeouts(heartbeat_s=5, startup_s=60, checkpoint_s=100, data_s=10, compute_s=20, collective_s=30)
AT = 1000.0
EARLY = SLOT_S + 1e-5
"""How early the index may put a deadline: waits are indexed by when they began, rounded down."""


def only(field=None, limit=0.0, heartbeat_s=1000.0):
    """Timeouts in which one rule comes first: every other phase timeout is 500 s."""
    t = Timeouts(heartbeat_s=heartbeat_s, startup_s=500, checkpoint_s=500, data_s=500, compute_s=500,
                 collective_s=500)
    return replace(t, **{field: limit}) if field else t


def hb(rank=0, **kw):
    base = dict(job="j", attempt=0, rank=rank, world_size=kw.pop("world", 4), seq=kw.pop("seq", 1), step=10,
                phase=PHASE_COMPUTE, phase_s=0.0, node=f"n{rank // 2}")
    return Heartbeat(**(base | kw))


def one(beat, at=AT):
    r = Registry(0, 1)
    r.observe(beat, at)
    return r


# ------------------------------------------------------------------ the deadline of one heartbeat
@pytest.mark.parametrize("name, beat, timeouts, expected, early, kind", [
    ("silent", hb(phase=PHASE_IDLE), only(heartbeat_s=5), AT + 5, 0, Kind.DEAD),
    ("silent before its phase's timeout", hb(phase=PHASE_COMPUTE, phase_s=2), T, AT + 5, 0, Kind.DEAD),
    ("waiting in a collective", hb(phase=PHASE_DATA, coll_inside=True, coll_s=4, phase_s=4, coll_seq=3),
     only("collective_s", 30), AT + 26, EARLY, Kind.COLLECTIVE_HANG),
    ("collective wait sooner than the phase", hb(phase=PHASE_COMPUTE, coll_inside=True, coll_s=25, phase_s=2),
     only("collective_s", 30), AT + 5, EARLY, Kind.COLLECTIVE_HANG),
    ("compute", hb(phase=PHASE_COMPUTE, phase_s=2), only("compute_s", 20), AT + 18, EARLY, Kind.HANG),
    ("data", hb(phase=PHASE_DATA, phase_s=2), only("data_s", 10), AT + 8, EARLY, Kind.DATA_STALL),
    ("checkpoint", hb(phase=PHASE_CHECKPOINT, phase_s=2), only("checkpoint_s", 100), AT + 98, EARLY,
     Kind.CHECKPOINT_STALL),
    ("init", hb(phase=PHASE_INIT, phase_s=2), only("startup_s", 60), AT + 58, EARLY, Kind.STARTUP_STALL),
    ("restore", hb(phase=PHASE_RESTORE, phase_s=2), only("startup_s", 60), AT + 58, EARLY, Kind.STARTUP_STALL),
    ("training (the controller's own timer)", hb(phase=PHASE_TRAINING, phase_s=2), only("compute_s", 20),
     AT + 18, EARLY, Kind.HANG),
    ("collective phase, outside any collective", hb(phase=PHASE_COLLECTIVE, phase_s=2), only("collective_s", 30),
     AT + 28, EARLY, Kind.HANG),
    ("a brief phase: read as begun BRIEF_S before its receipt", hb(phase=PHASE_COMPUTE, phase_s=0.25),
     only("compute_s", 20), AT + 19.75, BRIEF_S, Kind.HANG),
    ("idle: no phase timeout, only silence", hb(phase=PHASE_IDLE, phase_s=200), only(heartbeat_s=50), AT + 50, 0,
     Kind.DEAD),
    ("failed: no phase timeout, only silence", hb(phase=PHASE_FAILED, phase_s=200), only(heartbeat_s=50), AT + 50, 0,
     Kind.DEAD),
    ("non-finite loss: at once", hb(loss_ok=False), T, -math.inf, 0, Kind.NONFINITE),
    ("done: never", hb(phase=PHASE_DONE, phase_s=1e6), T, math.inf, 0, None),
    ("done with a non-finite loss: never", hb(phase=PHASE_DONE, loss_ok=False), T, math.inf, 0, None),
])
def test_the_deadline_of_one_heartbeat(name, beat, timeouts, expected, early, kind):
    r = one(beat)
    deadline = r.next_deadline(timeouts)
    if math.isfinite(expected):
        assert expected - early - 1e-5 <= deadline <= expected, name
        # detect() agrees: nothing a moment before, the finding a moment after
        assert detect(r, expected - 0.01, timeouts, launched_at=0) == []
        assert {f.kind for f in detect(r, expected + 0.01, timeouts, launched_at=0)} == {kind}
    else:
        assert deadline == expected, name
        if kind is not None:
            assert {f.kind for f in detect(r, AT, timeouts, launched_at=0)} == {kind}
        else:
            assert detect(r, AT + 1e9, timeouts, launched_at=0) == []


def test_every_wire_phase_is_in_the_table():
    timed = {PHASE_COMPUTE, PHASE_DATA, PHASE_CHECKPOINT, PHASE_INIT, PHASE_RESTORE, PHASE_TRAINING,
             PHASE_COLLECTIVE}
    assert {p for p in PHASES if T.for_phase(p) is not None} == timed
    assert set(PHASES) == timed | {PHASE_IDLE, PHASE_FAILED, PHASE_DONE}


def test_a_heartbeat_already_past_its_timeout_is_due_from_its_receipt():
    for phase_s in (20.1, 0.6):  # compute_s is 20, or 0.5: indexed or brief, the same
        timeouts = only("compute_s", 20.0 if phase_s > 20 else 0.5)
        r = one(hb(phase=PHASE_COMPUTE, phase_s=phase_s))
        assert r.next_deadline(timeouts) <= AT
        assert r.due(AT, timeouts)
        # even on a clock read a moment before the heartbeat arrived (detect() counts no silence then)
        assert r.due(AT - 0.5, timeouts)
        assert [f.kind for f in detect(r, AT - 0.5, timeouts, launched_at=0)] == [Kind.HANG]


def test_the_deadline_follows_the_newest_heartbeat_and_the_timeouts_the_reader_holds():
    r = one(hb(phase=PHASE_DATA, phase_s=0, seq=1))
    assert r.next_deadline(T) == pytest.approx(AT + 5)
    r.observe(hb(phase=PHASE_DATA, phase_s=3, seq=2), AT + 3)  # in the data phase since AT
    assert r.next_deadline(T) == pytest.approx(AT + 8)
    assert AT + 10 - EARLY <= r.next_deadline(replace(T, heartbeat_s=60)) <= AT + 10  # data_s
    assert AT + 40 - EARLY <= r.next_deadline(only("data_s", 40)) <= AT + 40  # recalibrated: nothing to redo
    r.observe(hb(phase=PHASE_DATA, phase_s=4, seq=1), AT + 4)  # replayed: changes nothing
    assert r.next_deadline(T) == pytest.approx(AT + 8)
    r.observe(hb(phase=PHASE_DATA, phase_s=5.5, seq=3), AT + 5)  # its clock: it began 0.5 s earlier
    assert AT + 39.5 - EARLY <= r.next_deadline(only("data_s", 40)) <= AT + 39.5
    r.observe(hb(phase=PHASE_DATA, phase_s=2, seq=4), AT + 10)  # a new spell of the phase
    assert AT + 48 - EARLY <= r.next_deadline(only("data_s", 40)) <= AT + 48
    r.observe(hb(phase=PHASE_COMPUTE, phase_s=0.5, seq=5), AT + 11)  # a brief spell of another one: read as
    assert r.next_deadline(only("data_s", 40)) == pytest.approx(AT + 11 + 40 - BRIEF_S)  # the shortest timeout
    r.observe(hb(phase=PHASE_DONE, seq=6), AT + 12)
    assert r.next_deadline(T) == math.inf


def test_the_deadline_follows_a_rank_into_another_phase_that_began_at_the_same_moment():
    r = one(hb(phase=PHASE_DATA, phase_s=5, seq=1))
    r.observe(hb(phase=PHASE_COMPUTE, phase_s=6, seq=2), AT + 1)  # (not off the wire: a phase change resets it)
    assert AT + 15 - EARLY <= r.next_deadline(only("compute_s", 20)) <= AT + 15


def test_the_deadline_follows_a_rank_into_and_out_of_collectives_and_non_finite_losses():
    timeouts = only("collective_s", 30)
    r = one(hb(phase=PHASE_COMPUTE, phase_s=0.5, seq=1))
    assert r.next_deadline(timeouts) == pytest.approx(AT + 30 - BRIEF_S)  # brief: the shortest timeout
    r.observe(hb(phase=PHASE_COMPUTE, phase_s=5, coll_inside=True, coll_s=4, seq=2), AT + 5)
    assert AT + 31 - EARLY <= r.next_deadline(timeouts) <= AT + 31  # inside since AT + 1
    r.observe(hb(phase=PHASE_COMPUTE, phase_s=9, coll_inside=True, coll_s=2, seq=3), AT + 9)
    assert AT + 37 - EARLY <= r.next_deadline(timeouts) <= AT + 37  # another collective, since AT + 7
    r.observe(hb(phase=PHASE_COMPUTE, phase_s=10, seq=4), AT + 10)
    assert r.next_deadline(timeouts) == pytest.approx(AT + 10 + 30 - BRIEF_S)  # out of it
    r.observe(hb(phase=PHASE_COMPUTE, phase_s=11, loss_ok=False, seq=5), AT + 11)
    assert r.next_deadline(timeouts) == -math.inf
    r.observe(hb(phase=PHASE_COMPUTE, phase_s=12, seq=6), AT + 12)
    assert r.next_deadline(timeouts) == pytest.approx(AT + 12 + 30 - BRIEF_S)


def test_the_earliest_rank_sets_the_registry_deadline():
    r = Registry(0, 3)
    r.observe(hb(0, phase=PHASE_COMPUTE, phase_s=0), AT - 2)
    r.observe(hb(1, phase=PHASE_COMPUTE, phase_s=0), AT)
    r.observe(hb(2, phase=PHASE_DONE), AT)
    assert r.next_deadline(T) == pytest.approx(AT + 3)
    assert not r.due(AT + 2.9, T) and r.due(AT + 3.1, T)
    r.observe(hb(0, phase=PHASE_COMPUTE, phase_s=2, seq=2), AT)
    assert r.next_deadline(T) == pytest.approx(AT + 5)
    r.reset(1, 3)
    assert r.next_deadline(T) == math.inf and not r.all_heard()


def test_ranks_heard_again_and_again_are_due_from_their_latest_receipt_and_one_that_stops_is_found_on_time():
    # a healthy rank's heartbeat leaves it where it was indexed; the look that could be due moves it on
    r = Registry(0, 3)
    for k in range(9):
        for rank in range(3):
            if rank != 0 or k <= 4:  # rank 0 is last heard at AT + 4
                r.observe(hb(rank, world=3, seq=k + 1), AT + k)
        now = AT + k + 0.5
        assert r.due(now, T) is (now >= AT + 4 + 5)
        assert detect(r, now, T, launched_at=0) == detect_full(r, now, T, launched_at=0) == []
    assert r.next_deadline(T, AT + 8.5) > AT + 8.5
    assert r.next_deadline(T) == pytest.approx(AT + 9)  # without a clock: exact
    assert r.due(AT + 9.1, T)
    found = detect(r, AT + 9.1, T, launched_at=0)
    assert [(f.kind, f.ranks) for f in found] == [(Kind.DEAD, (0,))] and found == detect_full(r, AT + 9.1, T,
                                                                                          launched_at=0)
    # dated back by its node's relay to before where it is indexed: moved back at once
    r.observe(hb(1, world=3, seq=20), AT + 2)
    assert r.next_deadline(T, AT + 9.1) == pytest.approx(AT + 2 + 5)  # now before rank 0's
    assert r.silent(AT + 7.5, 5) == [1] and detect(r, AT + 9.1, T, launched_at=0) == detect_full(
        r, AT + 9.1, T, launched_at=0)


def test_receipts_out_of_order_are_read_right():
    r = Registry(0, 2)
    r.observe(hb(0), AT)
    r.observe(hb(1), AT - 3)  # a node's relay dates a heartbeat back to when it was sent
    assert r.next_deadline(T) == pytest.approx(AT + 2)
    assert detect(r, AT + 2.5, T, launched_at=0) == detect_full(r, AT + 2.5, T, launched_at=0) != []


def test_not_started_is_found_without_any_deadline():
    r = Registry(0, 4)
    for rank in (0, 1, 2, 4):  # rank 4 is outside the world: rank 3 is still missing
        r.observe(hb(rank), AT)
    assert not r.all_heard() and not r.due(AT + 1, T)
    assert detect(r, AT + 1, T, launched_at=AT - 59) == []
    assert [(f.kind, f.ranks) for f in detect(r, AT + 1, T, launched_at=AT - 61)] == [(Kind.NOT_STARTED, (3,))]
    r.observe(hb(3), AT + 1)
    assert r.all_heard() and detect(r, AT + 2, T, launched_at=AT - 61) == []


def test_a_ranks_dict_replaced_by_hand_is_indexed_again():
    full = Registry(0, 4)
    for rank in range(4):
        full.observe(hb(rank), AT + rank)
    before = full.next_deadline(T)
    sub = Registry(0, 2)
    sub.ranks = {r: rec for r, rec in full.ranks.items() if r < 2}
    assert sub.all_heard()
    assert sub.next_deadline(T) == pytest.approx(AT + 5)
    assert detect(sub, AT + 5.5, T, launched_at=0) == detect_full(sub, AT + 5.5, T, launched_at=0) != []
    # the records the two dicts shared are the first one's still: indexing the second moved none of them
    sub.observe(hb(0, seq=2, phase=PHASE_DATA, phase_s=3.0), AT + 9)
    assert full.next_deadline(T) == before and full.ranks[0].hb.seq == 1
    assert detect(full, AT + 8.5, T, launched_at=0) == detect_full(full, AT + 8.5, T, launched_at=0) != []


def _floor_by_pass(r: Registry) -> tuple[int, int]:
    beats = [rec.hb for rec in r.ranks.values()]
    return (min(b.step for b in beats), min(b.ckpt_step for b in beats)) if beats else (0, -1)


@pytest.mark.parametrize("beats", [
    [],
    [hb(0, step=7, ckpt_step=5)],                                             # ranks 1-3 not heard yet
    [hb(r, step=10 + r, ckpt_step=-1 if r == 2 else 9) for r in range(4)],   # one rank saved nothing yet
    [hb(0, step=7), hb(6, step=3, world=8)],                                  # a rank outside the world size
    [hb(0, step=7), hb(1, step=2**70)],                                       # a step no array holds (by hand)
    [hb(1, step=9, ckpt_step=4), hb(1, seq=2, step=12, ckpt_step=11), hb(3, step=11, ckpt_step=6)],
])
def test_the_floor_is_the_slowest_rank_s_step_and_oldest_save_however_the_ranks_were_heard(beats):
    r = Registry(0, 4)
    for b in beats:
        r.observe(b, AT)
    assert r.floor() == _floor_by_pass(r)
    if beats:  # a dict replaced by hand: read again from its records
        r.ranks = {k: v for k, v in r.ranks.items() if k != beats[0].rank}
        assert r.floor() == _floor_by_pass(r)


# ------------------------------------------------------------------ detect() == detect_full(), always
def check(r: Registry, now: float, timeouts: Timeouts, launched_at: float) -> tuple[bool, list]:
    """detect() agrees with the full pass at ``now``: (whether it answered without one, the findings)."""
    gated = not r.due(now, timeouts) and not (r.world_size and now - launched_at > timeouts.startup_s
                                              and not r.all_heard())
    full = detect_full(r, now, timeouts, launched_at=launched_at)
    assert detect(r, now, timeouts, launched_at=launched_at) == full
    # the gang-wide reads the index answers without a pass, and the one pass for the floor
    beats = [rec.hb for rec in r.ranks.values()]
    assert r.all_finite() == all(hb.loss_ok for hb in beats)
    assert r.floor() == ((min(hb.step for hb in beats), min(hb.ckpt_step for hb in beats)) if beats else (0, -1))
    if gated:
        assert full == []
    return gated, full


def edges(r: Registry, timeouts: Timeouts) -> list[float]:
    """The clock readings at which some rule of some rank turns, as detect() computes them."""
    out = []
    for rec in r.ranks.values():
        b = rec.hb
        out.append(rec.received + timeouts.heartbeat_s)
        if b.coll_inside:
            out.append(rec.received + (timeouts.collective_s - b.coll_s))
        limit = timeouts.for_phase(b.phase)
        if limit is not None:
            out.append(rec.received + (limit - b.phase_s))
    return out


SECONDS = st.one_of(st.sampled_from([0.0, 0.001, 0.2, 1.0, 1.001, 4.999, 5.0, 5.001, 9.99, 10.0, 10.001, 30.0,
                                     30.01]), st.floats(0, 60, allow_nan=False))
TIMEOUTS = st.builds(
    Timeouts, heartbeat_s=st.sampled_from([0.5, 3.0, 5.0, 1000.0]), startup_s=st.sampled_from([5.0, 60.0]),
    checkpoint_s=st.sampled_from([10.0, 100.0]), data_s=st.sampled_from([1.0, 10.0, 30.0]),
    compute_s=st.sampled_from([1.0, 10.0, 30.0]), collective_s=st.sampled_from([1.0, 10.0, 30.0]))
BEAT = st.tuples(st.just("beat"), st.integers(0, 5), st.sampled_from(PHASES), st.booleans(), SECONDS, SECONDS,
                 st.integers(0, 9), SECONDS, st.integers(0, 9), st.integers(0, 3), st.sampled_from(["", "0", "1"]),
                 st.sampled_from([0.0, 0.0, 0.0, 0.01, 0.5, 2.0]))
"""(op, rank, phase, coll_inside, coll_s, phase_s, loss draw (0: non-finite), clock advance, seq draw
(0: replayed), coll_seq, coll_group, held: how long a node's relay held it (its receipt is dated back))"""
GOES_ON = st.tuples(st.just("goes_on"), st.integers(0, 5), SECONDS, st.floats(-0.06, 0.06))
"""(op, rank, advance, jitter): the rank's next heartbeat in the same phase, its clock ``jitter`` off ours."""
OPS = st.lists(st.one_of(
    BEAT, GOES_ON,
    st.tuples(st.just("tick"), st.one_of(st.floats(-1.0, 60.0), st.floats(-0.05, 0.0))),
    st.tuples(st.just("edge"), st.integers(0, 1000), st.integers(-2, 2)),
    st.tuples(st.just("calibrate"), TIMEOUTS),
    st.tuples(st.just("reset"), st.integers(0, 6)),
), max_size=80)


def drive(ops, start: float, timeouts: Timeouts) -> None:
    """Runs ``ops`` on a registry, checking detect() against the full pass after every step."""
    r = Registry(0, 4)
    clock, launched_at, attempt = start, start, 0
    seqs: dict[int, int] = {}
    for op in ops:
        kind = op[0]
        if kind == "beat":
            _, rank, phase, inside, coll_s, phase_s, loss, advance, seq, coll_seq, group, held = op
            clock += advance
            seqs[rank] = seqs.get(rank, 0) + (1 if seq else 0)
            r.observe(hb(rank, world=r.world_size or 1, seq=seqs[rank], attempt=attempt, phase=phase, phase_s=phase_s,
                         coll_inside=inside, coll_s=coll_s, loss_ok=loss != 0, coll_seq=coll_seq, coll_group=group,
                         pid=100 + rank), clock - held)
        elif kind == "goes_on":
            _, rank, advance, jitter = op
            rec = r.ranks.get(rank)
            if rec is None:
                continue
            clock += advance
            seqs[rank] = seqs.get(rank, 0) + 1
            b = rec.hb
            r.observe(msgspec.structs.replace(b, seq=seqs[rank], phase_s=max(0.0, b.phase_s + advance + jitter),
                              coll_s=max(0.0, b.coll_s + advance + jitter) if b.coll_inside else b.coll_s), clock)
        elif kind == "tick":
            check(r, clock + op[1], timeouts, launched_at)
        elif kind == "edge":  # exactly at, or a float step either side of, a rule's turning point
            _, pick, steps = op
            at = edges(r, timeouts) + [launched_at + timeouts.startup_s]
            now = at[pick % len(at)]
            for _ in range(abs(steps)):
                now = math.nextafter(now, math.inf if steps > 0 else -math.inf)
            check(r, now, timeouts, launched_at)
        elif kind == "calibrate":
            timeouts = op[1]
        else:
            attempt += 1
            r.reset(attempt, op[1])
            launched_at, seqs = clock, {}
        check(r, clock, timeouts, launched_at)


@settings(max_examples=400, deadline=None)
@given(ops=OPS, start=st.sampled_from([0.0, 1000.1, 987654.321]), timeouts=TIMEOUTS)
def test_detect_is_the_full_pass_on_any_heartbeat_stream(ops, start, timeouts):
    drive(ops, start, timeouts)


def test_a_long_healthy_run_is_answered_without_a_pass_and_stays_exact():
    """A gang beating for a long while, a rank that hangs, one that goes silent, a recalibration
    and an attempt restarted: detect() agrees with the full pass on every tick, finds both, and
    answers the ticks that find nothing without a pass (but for a few, a deadline read early)."""
    rng = random.Random(28)
    timeouts = Timeouts(heartbeat_s=5, startup_s=60, checkpoint_s=100, data_s=30, compute_s=30, collective_s=30)
    r = Registry(0, 8)
    clock = launched_at = 5000.0
    seq = 0
    started = {rank: clock for rank in range(8)}
    phase = {rank: PHASE_DATA for rank in range(8)}
    quiet = passes = 0  # ticks that found nothing, and how many of those made the pass all the same
    found: set[Kind] = set()
    hung, silent = 3, 5
    for k in range(4000):
        clock += 0.05
        seq += 1
        rank = k % 8
        if rank == hung and k == 1003:
            phase[rank], started[rank] = PHASE_COMPUTE, clock  # computes for 45 s: a hang, then goes on
        if rank == silent and 2000 <= k < 2600:
            pass  # silent for 30 s: found dead, then heard again
        else:
            if rng.random() < 0.3 and not (rank == hung and 1000 <= k < 1900):
                phase[rank] = rng.choice([PHASE_DATA, PHASE_COMPUTE, PHASE_COLLECTIVE, PHASE_IDLE])
                started[rank] = clock - rng.uniform(0, 0.01)
            elapsed = clock - started[rank] + rng.uniform(-0.02, 0.02)
            r.observe(hb(rank, world=8, seq=seq, phase=phase[rank], phase_s=max(0.0, elapsed),
                         coll_inside=phase[rank] == PHASE_COLLECTIVE, coll_seq=k // 8,
                         coll_s=max(0.0, elapsed) if phase[rank] == PHASE_COLLECTIVE else 0.0), clock)
        if k == 2500:
            timeouts = replace(timeouts, data_s=20, compute_s=20, collective_s=20)
        if k == 3000:
            r.reset(1, 8)
            launched_at, seq = clock, 0
        if k % 4 == 0:
            answered, findings = check(r, clock, timeouts, launched_at)
            found |= {f.kind for f in findings}
            if not findings:
                quiet += 1
                passes += not answered
    assert found == {Kind.DEAD, Kind.HANG}
    assert quiet > 700 and passes <= 0.02 * quiet


def test_no_rounding_makes_a_deadline_late():
    """Around each rule's turning point, float step by float step, on clocks of a long-lived host:
    wherever the full pass finds something, detect() does too."""
    rng = random.Random(2028)
    for _ in range(3000):
        received = rng.choice([0.0, 1.0, 1e3, 1e6, 3e7]) + rng.uniform(0, 1e3)
        limit = rng.choice([0.5, 1.0, 5.0, 30.0, 300.0]) * rng.uniform(0.5, 2.0)
        elapsed = rng.uniform(0, limit)
        inside = rng.random() < 0.5
        timeouts = Timeouts(heartbeat_s=limit if rng.random() < 0.3 else 1e7, startup_s=1e7, checkpoint_s=limit,
                            data_s=limit, compute_s=limit, collective_s=limit)
        beat = hb(phase=rng.choice([PHASE_DATA, PHASE_COMPUTE, PHASE_CHECKPOINT, PHASE_IDLE]),
                  phase_s=0.0 if inside else elapsed, coll_inside=inside, coll_s=elapsed if inside else 0.0)
        r = one(beat, received)
        for edge in edges(r, timeouts):
            now = edge
            for _ in range(6):
                now = math.nextafter(now, -math.inf)
            for _ in range(12):
                check(r, now, timeouts, launched_at=received)
                now = math.nextafter(now, math.inf)


class _Watched(dict):
    """A ranks dict that counts the passes over it."""

    passes = 0

    def items(self):
        _Watched.passes += 1
        return super().items()

    def values(self):
        _Watched.passes += 1
        return super().values()


def test_silent_ranks_are_read_off_the_index_without_a_pass_over_every_rank():
    # two ranks went silent; the others beat on: each look names the two without visiting the rest
    # (silent ranks stay silent until the gang is torn down: a pass per look would cost O(ranks))
    r = Registry(0, 1000)
    for rank in range(1000):
        r.observe(hb(rank, world=1000), AT)
    # rank 7 died 6 s into its collective phase, 2 s into the wait: its indexed waits run out at
    # AT + 24 and AT + 28 (30 s), but a silent rank is not judged on them: they must not bring the
    # pass back
    r.observe(hb(7, world=1000, seq=2, phase=PHASE_COLLECTIVE, coll_inside=True, coll_s=2.0, phase_s=6.0), AT)
    for k in range(4, 40, 4):  # the others beat on
        for rank in range(1000):
            if rank not in (3, 7):
                r.observe(hb(rank, world=1000, seq=1 + k), AT + k)
    r.ranks = _Watched(r.ranks)
    r.due(AT, T)  # (a dict replaced by hand is indexed again at the next read: that pass is not counted)
    _Watched.passes = 0
    for now in (AT + 36.5, AT + 38, AT + 40):
        found = detect(r, now, T, launched_at=AT)
        assert [(f.kind, f.ranks) for f in found] == [(Kind.DEAD, (3,)), (Kind.DEAD, (7,))]
    assert _Watched.passes == 0
    assert found == detect_full(r, AT + 40, T, launched_at=AT)
    # a rank still heard that is now past its phase's timeout: the look is the full pass again
    r.observe(hb(5, world=1000, seq=50, phase=PHASE_DATA, phase_s=9.5), AT + 40)
    found = detect(r, AT + 40.6, T, launched_at=AT)
    assert _Watched.passes > 0 and (Kind.DATA_STALL, (5,)) in [(f.kind, f.ranks) for f in found]
    assert found == detect_full(r, AT + 40.6, T, launched_at=AT)


def test_the_ranks_done_stopped_failed_and_non_finite_are_read_off_the_index_as_their_last_heartbeats_say():
    r = Registry(0, 4)
    for rank in range(4):
        r.observe(hb(rank), AT)
    assert (r.done(), r.stopped(), r.failed(), r.nonfinite()) == (frozenset(), [], [], [])
    r.observe(hb(0, seq=2, phase=PHASE_FAILED, error="RuntimeError: x"), AT + 1)
    r.observe(hb(1, seq=2, phase=PHASE_DONE, outcome="stopped"), AT + 1)
    r.observe(hb(2, seq=2, phase=PHASE_DONE, outcome="finished", loss_ok=False), AT + 1)
    r.observe(hb(3, seq=2, loss_ok=False), AT + 1)
    assert (r.done(), r.stopped(), r.failed(), r.nonfinite()) == (frozenset({1, 2}), [1], [0], [2, 3])
    # a rank says it stops early just before its phase is done: stopped already
    r.observe(hb(3, seq=3, outcome="stopped"), AT + 1.5)
    assert r.stopped() == [1, 3]
    # a healthy heartbeat after each (a rank restarted in place, say): each set forgets it
    for rank in range(4):
        r.observe(hb(rank, seq=4), AT + 2)
    assert (r.done(), r.stopped(), r.failed(), r.nonfinite()) == (frozenset(), [], [], [])
    # what the index says is what a pass over the ranks says, after a dict replaced by hand too
    r.observe(hb(2, seq=5, phase=PHASE_FAILED), AT + 3)
    r.ranks = dict(r.ranks)
    assert r.failed() == [rank for rank, rec in r.ranks.items() if rec.hb.phase == PHASE_FAILED] == [2]


def test_a_receipt_that_is_not_a_finite_time_is_judged_by_the_full_pass_however_often_the_index_catches_up():
    r = Registry(0, 2)
    r.observe(hb(0), -math.inf)
    r.observe(hb(1), AT)
    for now in (AT + 1, AT + 6, AT + 30):
        assert detect(r, now, T, launched_at=0) == detect_full(r, now, T, launched_at=0)
    assert 0 in {rank for f in detect(r, AT + 1, T, launched_at=0) for rank in f.ranks}
