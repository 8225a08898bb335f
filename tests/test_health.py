"""Table tests for the pure detectors, on a fake clock."""

from __future__ import annotations

import pytest

from supervisor.health import Kind, Registry, Timeouts, calibrate, detect, straggler_scores
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
    TIMED_PHASES,
    Heartbeat,
)

T = Timeouts(heartbeat_s=5, startup_s=60, checkpoint_s=100, data_s=10, compute_s=10, collective_s=10)


def hb(rank, **kw):
    base = dict(job="j", attempt=0, rank=rank, world_size=kw.pop("world", 4), seq=kw.pop("seq", 1), step=10,
                phase="compute", phase_s=0.1, node=f"n{rank // 2}")
    return Heartbeat(**(base | kw))


def reg(*beats, now=100.0, world=4):
    r = Registry(0, world)
    for b in beats:
        if isinstance(b, tuple):
            b, at = b
        else:
            at = now
        r.observe(b, at)
    return r


def kinds(findings):
    return {(f.kind, f.ranks) for f in findings}


def test_healthy_gang_has_no_findings():
    r = reg(*(hb(i) for i in range(4)))
    assert detect(r, 100.0, T, launched_at=0) == []


def test_dead_rank_after_heartbeat_timeout():
    r = reg(hb(0), hb(1), hb(2), (hb(3), 94.0))
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.DEAD, (3,))}
    assert f[0].nodes == ("n1",) and "silent for 6.0s" in f[0].detail
    assert detect(r, 98.9, T, launched_at=0) == []  # 4.9 s silent: not yet


def test_not_started():
    r = reg(hb(0), hb(1))
    assert detect(r, 50.0, T, launched_at=0) == []
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.NOT_STARTED, (2, 3))}


def test_finished_rank_is_not_dead():
    r = reg(hb(0, phase="done"), hb(1, phase="done"), hb(2, phase="done"), hb(3, phase="done"), now=0.0)
    assert detect(r, 100.0, T, launched_at=0) == []


def test_skipped_collective_names_the_rank_that_never_entered():
    r = reg(
        hb(0, coll_seq=7, coll_inside=True, coll_s=12, phase="collective", phase_s=12, coll_op="allreduce"),
        hb(1, coll_seq=6, coll_inside=False, phase="data", phase_s=12),
        hb(2, coll_seq=7, coll_inside=True, coll_s=11, phase="collective", phase_s=11, coll_op="allreduce"),
        hb(3, coll_seq=7, coll_inside=True, coll_s=13, phase="collective", phase_s=13, coll_op="allreduce"),
    )
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.COLLECTIVE_HANG, (1,))}
    assert f[0].culprit and "rank 1 never entered it (in phase data" in f[0].detail
    assert "ranks 0,2,3 wait in allreduce #7" in f[0].detail


def test_a_rank_idle_in_data_past_its_timeout_while_peers_wait_is_a_skipped_collective_whichever_came_first():
    # the culprit went idle in data a moment before its peers entered the collective: its data
    # timeout comes first, before theirs in the collective (CI met this on a loaded host)
    r = reg(
        hb(0, coll_seq=7, coll_inside=True, coll_s=9.8, phase="collective", phase_s=9.8, coll_op="allreduce"),
        hb(1, coll_seq=6, coll_inside=False, phase="data", phase_s=10.1),
        world=2,
    )
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.COLLECTIVE_HANG, (1,))}, f
    assert f[0].culprit and "rank 1 never entered it (in phase data" in f[0].detail
    # not behind its peers (it left #7 already; they are on their way out): its own data stall
    r = reg(
        hb(0, coll_seq=7, coll_inside=True, coll_s=0.5, phase="collective", phase_s=0.5, coll_op="allreduce"),
        hb(1, coll_seq=7, coll_inside=False, phase="data", phase_s=10.1),
        world=2,
    )
    assert kinds(detect(r, 100.0, T, launched_at=0)) == {(Kind.DATA_STALL, (1,))}


def test_hang_in_compute_is_the_culprit_of_the_collective_wait():
    r = reg(
        hb(0, coll_seq=7, coll_inside=True, coll_s=30, phase="collective", phase_s=30),
        hb(1, coll_seq=6, phase="compute", phase_s=31, watchdog="compute running 25s"),
        world=2,
    )
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.HANG, (1,))}  # found by its own phase timeout
    assert "rank 1 never entered it (in phase compute" in f[0].detail


def test_everyone_inside_means_no_culprit_is_named():
    r = reg(*(hb(i, coll_seq=7, coll_inside=True, coll_s=20, phase="collective", phase_s=20) for i in range(4)))
    f = detect(r, 100.0, T, launched_at=0)
    assert len(f) == 1 and not f[0].culprit and f[0].ranks == (0, 1, 2, 3)


def test_silent_rank_is_the_culprit_not_its_waiting_peers():
    r = reg(
        hb(0, coll_seq=7, coll_inside=True, coll_s=20, phase="collective"),
        (hb(1, coll_seq=6, phase="compute"), 80.0),
        world=2,
    )
    assert kinds(detect(r, 100.0, T, launched_at=0)) == {(Kind.DEAD, (1,))}


def test_collective_waited_time_grows_between_heartbeats():
    r = reg(hb(0, coll_seq=3, coll_inside=True, coll_s=8, phase="collective"), hb(1, coll_seq=2), world=2)
    assert detect(r, 100.0, T, launched_at=0) == []
    assert kinds(detect(r, 103.0, T, launched_at=0)) == {(Kind.COLLECTIVE_HANG, (1,))}  # 8 + 3 s > 10


@pytest.mark.parametrize("phase, phase_s, kind", [
    ("compute", 11, Kind.HANG),
    ("data", 11, Kind.DATA_STALL),
    ("checkpoint", 50, None),          # a long save is not a hang ...
    ("checkpoint", 101, Kind.CHECKPOINT_STALL),  # ... until its own timeout
    ("init", 50, None),
    ("restore", 61, Kind.STARTUP_STALL),
    ("idle", 1000, None),
])
def test_phase_timeouts(phase, phase_s, kind):
    r = reg(hb(0, phase=phase, phase_s=phase_s), hb(1), world=2)
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == ({(kind, (0,))} if kind else set())


def test_nonfinite_loss():
    r = reg(hb(0, loss_ok=False), hb(1), world=2)
    assert kinds(detect(r, 100.0, T, launched_at=0)) == {(Kind.NONFINITE, (0,))}


def test_registry_ignores_replayed_and_reordered_heartbeats():
    r = Registry(0, 2)
    r.observe(hb(0, seq=5, step=10, world=2), 1.0)
    r.observe(hb(0, seq=4, step=9, world=2), 2.0)
    assert r.ranks[0].hb.step == 10 and r.ranks[0].received == 1.0


def test_calibration_clamps():
    kw = dict(heartbeat_s=5, startup_s=300, checkpoint_s=900, factor=5, floor_s=30, ceiling_s=600)
    assert calibrate([], **kw).compute_s == 300
    assert calibrate([0.1, 0.2, 0.3], **kw).compute_s == 30          # floor
    assert calibrate([20, 20, 20], **kw).collective_s == 100         # 5 x median
    assert calibrate([500], **kw).data_s == 600                      # ceiling
    assert calibrate([1], **kw).checkpoint_s == 900
    assert "compute=24.000" in calibrate([1], **kw).watchdog_env()   # 0.8 x 30


def test_straggler_scores():
    r = Registry(0, 3)
    for rank, work in ((0, 0.1), (1, 0.1), (2, 0.35)):
        r.observe(hb(rank, work_median_s=work, step_median_s=0.4, world=3), 1.0)
    scores = straggler_scores(r)
    assert scores[2] == pytest.approx(3.5) and scores[0] == pytest.approx(0.1 / 0.225)
    two = Registry(0, 2)
    two.observe(hb(0, work_median_s=0.1, world=2), 1.0)
    two.observe(hb(1, work_median_s=0.3, world=2), 1.0)
    assert straggler_scores(two)[1] == pytest.approx(3.0)
    # a rank that has not said its median yet (fewer than 3 steps, or an older SDK) is left out
    two.observe(hb(1, seq=2, work_median_s=0.0, world=2), 2.0)
    assert straggler_scores(two) == {0: 1.0}


def test_straggler_scores_match_the_definition_at_scale():
    import random
    import statistics as st

    rng = random.Random(3)
    r = Registry(0, 300)
    meds = {rank: rng.uniform(0.1, 0.5) for rank in range(300)}
    for rank, work in meds.items():
        r.observe(hb(rank, work_median_s=work, world=300), 1.0)
    scores = straggler_scores(r)
    for rank in (0, 17, 299):
        peers = st.median(v for q, v in meds.items() if q != rank)
        assert scores[rank] == pytest.approx(meds[rank] / peers)


# ------------------------------------------------------------------------------ the contract with the ranks
# Every phase a rank can report, and what a rank stuck in it far past every timeout is found to be
# (None: not a timed phase, never stuck in it).
STUCK_IN = {PHASE_INIT: Kind.STARTUP_STALL, PHASE_RESTORE: Kind.STARTUP_STALL, PHASE_DATA: Kind.DATA_STALL,
            PHASE_COMPUTE: Kind.HANG, PHASE_COLLECTIVE: Kind.HANG, PHASE_CHECKPOINT: Kind.CHECKPOINT_STALL,
            PHASE_IDLE: None, PHASE_DONE: None, PHASE_FAILED: None, PHASE_TRAINING: Kind.HANG}
CONTROLLER_ONLY = (PHASE_TRAINING,)
"""Timed by the controller only: an instrumented rank has no SDK watchdog (SUPERVISOR_WATCHDOG)."""


def test_the_table_covers_every_wire_phase():
    assert tuple(STUCK_IN) == PHASES
    assert tuple(p for p, k in STUCK_IN.items() if k is not None) == TIMED_PHASES + CONTROLLER_ONLY


@pytest.mark.parametrize("phase", PHASES)
def test_a_phase_has_a_timeout_exactly_when_it_is_a_timed_phase(phase):
    assert (T.for_phase(phase) is not None) == (phase in TIMED_PHASES + CONTROLLER_ONLY)
    r = reg(hb(0, phase=phase, phase_s=1e6), hb(1), world=2)
    expected = STUCK_IN[phase]
    assert kinds(detect(r, 100.0, T, launched_at=0)) == ({(expected, (0,))} if expected else set())


def test_the_rank_watchdog_gets_every_timed_phase_in_order_below_ours():
    t = Timeouts(heartbeat_s=5, startup_s=60, checkpoint_s=100, data_s=10, compute_s=20, collective_s=40)
    items = [item.split("=") for item in t.watchdog_env(0.5).split(",")]
    assert tuple(p for p, _ in items) == TIMED_PHASES
    assert {p: float(v) for p, v in items} == {p: 0.5 * t.for_phase(p) for p in TIMED_PHASES}


# ------------------------------------------------------------------------------ ranks watched through torch's records
def tb(rank, group="0", groups="", **kw):
    """A heartbeat of an instrumented rank (flight-recorder numbers, phase training)."""
    return hb(rank, source="torch", phase=kw.pop("phase", "training"), coll_group=group, coll_groups=groups, **kw)


def test_flight_recorder_culprit_is_compared_in_the_group_the_others_wait_in():
    # ranks 0 and 1 wait in group 1's collective #5; rank 2's own report is about group 0 (where it
    # is further along) but its group 1 number is 4: it never entered #5; rank 3 is not in group 1
    r = reg(
        tb(0, group="1", groups="0=9/9 1=5/4", coll_seq=5, coll_inside=True, coll_s=12, coll_op="gloo:all_reduce"),
        tb(1, group="1", groups="0=9/9 1=5/4", coll_seq=5, coll_inside=True, coll_s=11, coll_op="gloo:all_reduce"),
        tb(2, group="0", groups="0=9/9 1=4/4", coll_seq=9, phase_s=12),
        tb(3, group="0", groups="0=9/9", coll_seq=9, phase_s=1),
    )
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.COLLECTIVE_HANG, (2,))}, f
    assert "ranks 0,1 wait in gloo:all_reduce #5 of process group 1" in f[0].detail
    assert "rank 2 never entered it (in phase training" in f[0].detail


def test_flight_recorder_skipped_collective_is_a_collective_hang_not_a_hang():
    # the culprit sits outside any collective past the compute timeout too: without an SDK phase
    # nobody can tell a skipped collective from compute, and it is named the culprit either way
    r = reg(tb(0, groups="0=44/43", coll_seq=44, coll_inside=True, coll_s=12, phase_s=12),
            tb(1, groups="0=43/43", coll_seq=43, phase_s=12), world=2)
    assert kinds(detect(r, 100.0, T, launched_at=0)) == {(Kind.COLLECTIVE_HANG, (1,))}


def test_an_idle_instrumented_rank_past_its_timeout_is_the_culprit_of_peers_that_wait_less_long():
    # rank 1 went idle after #43 completed; rank 0 computed its step first, so it has waited less
    # than the timeout in #44 when rank 1's own no-progress clock runs out
    r = reg(tb(0, groups="0=44/43", coll_seq=44, coll_inside=True, coll_s=8, phase_s=8),
            tb(1, groups="0=43/43", coll_seq=43, phase_s=10.5), world=2)
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.COLLECTIVE_HANG, (1,))} and "rank 1 never entered it" in f[0].detail, f


def test_no_step_and_no_collective_progress_is_a_hang():
    r = reg(tb(0, groups="0=40/40", coll_seq=40, phase_s=11), tb(1, groups="0=40/40", coll_seq=40, phase_s=2), world=2)
    f = detect(r, 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.HANG, (0,))} and "phase training running 11.0s (> 10.0s)" in f[0].detail
    assert detect(reg(tb(0, phase_s=9.5), tb(1, phase_s=1), world=2), 100.0, T, launched_at=0) == []


@pytest.mark.parametrize("source", ["torch", "sdk"])
def test_waiting_for_a_rank_that_saves_is_not_a_hang_until_the_checkpoint_timeout(source):
    def gang(saving_s):
        return reg(hb(0, source=source, coll_seq=8, coll_inside=True, coll_s=saving_s, phase="collective",
                      phase_s=saving_s),
                   hb(1, source=source, coll_seq=7, phase="checkpoint", phase_s=saving_s), world=2)

    assert detect(gang(50.0), 100.0, T, launched_at=0) == []  # past the collective timeout, within the save's
    f = detect(gang(101.0), 100.0, T, launched_at=0)
    assert kinds(f) == {(Kind.COLLECTIVE_HANG, (1,))}, f  # a save past its own timeout: the waiters' culprit


def test_a_culprit_computing_all_the_while_its_peers_waited_is_a_hang_even_a_tick_short_of_its_timeout():
    # its phase clock, extrapolated from its last heartbeat, reads a little short of the wait it caused
    r = reg(hb(0, coll_seq=25, coll_inside=True, coll_s=10.2, phase="collective", phase_s=10.2, coll_op="allreduce"),
            hb(1, coll_seq=24, phase="compute", phase_s=9.95), world=2)
    assert kinds(detect(r, 100.0, T, launched_at=0)) == {(Kind.HANG, (1,))}
    # a culprit that has computed for a fraction of the wait skipped the collective
    r = reg(hb(0, coll_seq=25, coll_inside=True, coll_s=10.2, phase="collective", phase_s=10.2, coll_op="allreduce"),
            hb(1, coll_seq=24, phase="compute", phase_s=2.0), world=2)
    assert kinds(detect(r, 100.0, T, launched_at=0)) == {(Kind.COLLECTIVE_HANG, (1,))}


@pytest.mark.parametrize("said, expected", [
    ((), 0.0),  # no rank
    ((0.0, 0.0), 0.0),  # an older SDK, or before two steps: nobody says
    ((0.05,), 0.05),
    ((0.05, 0.0, 0.06), 0.06),  # the ranks that say it, their median
    ((0.05, 0.05, 0.05, 9.0), 0.05),  # one rank's slow loop does not move it
])
def test_the_gang_s_loop_time_per_step_is_the_median_the_ranks_say(said, expected):
    r = Registry(0, max(1, len(said)))
    for rank, t in enumerate(said):
        r.observe(hb(rank, world=max(1, len(said)), loop_step_s=t), 1.0)
    assert r.loop_step_time() == expected


def test_an_instrumented_rank_that_skipped_an_all_reduce_is_named_when_its_peer_s_recorder_marks_a_collective_late():
    # rank 0 went past all-reduce #27 (its recorder has not marked it completed yet: 0=28/26) and waits
    # in #28, the newest it entered; rank 1 completed #27 and never entered #28
    t = Timeouts(heartbeat_s=5, startup_s=60, checkpoint_s=100, data_s=3, compute_s=3, collective_s=3)
    r = Registry(0, 2)
    r.observe(hb(0, world=2, phase="training", phase_s=3.1, coll_seq=28, coll_inside=True, coll_s=3.18,
                 coll_group="0", coll_groups="0=28/26", coll_op="gloo:all_reduce", source="torch"), 100.0)
    r.observe(hb(1, world=2, phase="training", phase_s=3.16, coll_seq=27, coll_group="0", coll_groups="0=27/27",
                 source="torch"), 100.0)
    found = detect(r, 100.01, t, launched_at=0)
    assert [(f.kind, f.ranks) for f in found] == [(Kind.COLLECTIVE_HANG, (1,))]
    assert "rank 1 never entered it" in found[0].detail
