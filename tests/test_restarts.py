"""A restart's marks and what the views show of the run's restarts, told with a fake clock
(supervisor.controller.restarts: the controller gives the clock and what the ranks said)."""

from __future__ import annotations

import pytest

from supervisor.controller.decide import RUNG_TEARDOWN, Fault, RestartTimer
from supervisor.controller.restarts import Restarts

BUDGET = 900.0


def fault(kind="rank_killed", fault_at=100.0):
    return Fault(kind, (1,), ("n1",), f"{kind} on rank 1", RUNG_TEARDOWN, False, fault_at)


def begun(detected=101.0, torn_down=102.0, scheduled=103.0) -> Restarts:
    rs = Restarts()
    f = fault()
    rs.begin(f, 0, RestartTimer(0, f.kind, f.fault_at, detected), unix=1.7e9, culprits=[(1, "n1")])
    rs.current.torn_down_at, rs.current.scheduled_at = torn_down, scheduled
    return rs


def look(rs: Restarts, now: float, *, heard=True, steps=(1, 1), first=(0.1, 0.2), restore=(0.5, 0.4)):
    return rs.progress(now, attempt=1, all_heard=heard, steps_done=steps, first_step_s=first, restore_s=restore,
                       budget_s=BUDGET)


def test_a_fault_begins_a_restart_counted_by_its_kind_and_kept_as_the_last_fault():
    rs = begun()
    second = fault("collective_hang", 200.0)
    rs.begin(second, 1, RestartTimer(1, second.kind, 200.0, 205.0), unix=1.8e9, culprits=[(1, "n1")])
    assert rs.by_reason == {"rank_killed": 1, "collective_hang": 1}
    assert rs.last is second and rs.active is second and rs.last_attempt == 1 and rs.last_unix == 1.8e9
    assert [t.reason for t in rs.timers] == ["rank_killed", "collective_hang"] and rs.open is rs.timers[-1]
    # a resumed recovery whose controller saved no timer: counted, no timer of its own
    rs.begin(fault("dead"), 2, None, unix=1.9e9, culprits=[])
    assert rs.by_reason["dead"] == 1 and len(rs.timers) == 2


def test_the_restart_ends_at_the_first_step_with_each_phase_from_the_ranks_own_clocks():
    rs = begun()
    assert look(rs, 104.0, heard=False, steps=()) == []  # nobody heard yet: nothing marked
    assert look(rs, 105.0, steps=(0, 0)) == []  # every rank heard: the rendezvous
    assert rs.current.rendezvous_at == 105.0
    (told,) = look(rs, 107.0, steps=(1, 1))  # every rank took its first step
    assert told.event == "restart_complete" and told.fields["within_budget"] is True
    t = rs.current
    # the restore ended at now - the slowest first step (0.2 s), and began 0.5 s before that
    assert t.first_step_at == 107.0 and t.restored_at == pytest.approx(106.8) and t.rendezvous_at == 105.0
    assert told.fields["total_s"] == pytest.approx(7.0) and set(told.fields["phases"]) == set(RestartTimer.PHASES)
    assert rs.open is None and look(rs, 108.0) == []  # done: later looks change nothing
    assert rs.budget_remaining(BUDGET, 500.0) == BUDGET


def test_ranks_first_heard_after_their_first_step_date_the_rendezvous_back_from_their_clocks():
    rs = begun()
    (told,) = look(rs, 110.0, steps=(3, 3), first=(1.0, 1.5), restore=(2.0, 2.5))
    t = rs.current
    # heard first in this look: the rendezvous is when their restore began (110 - 1.5 - 2.5),
    # never before the launch (scheduled at 103)
    assert t.rendezvous_at == pytest.approx(106.0) and t.restored_at == pytest.approx(108.5)
    rs2 = begun(scheduled=109.0)
    look(rs2, 110.0, steps=(3, 3), first=(1.0, 1.5), restore=(2.0, 2.5))
    assert rs2.current.rendezvous_at == 109.0


def test_a_restart_past_its_budget_says_so_once_and_its_end_still_counts_it_as_over():
    rs = begun()
    assert rs.budget_remaining(BUDGET, 400.0) == pytest.approx(BUDGET - 300.0)
    (told,) = look(rs, 1001.0, heard=False, steps=())
    assert told.event == "budget_exceeded" and told.fields == {"attempt": 1, "budget_s": BUDGET}
    assert rs.budget_exceeded and look(rs, 1002.0, heard=False, steps=()) == []
    (done,) = look(rs, 1003.0)
    assert done.event == "restart_complete" and done.fields["within_budget"] is False and rs.budget_exceeded


def test_a_later_restart_within_its_budget_clears_the_exceeded_flag():
    rs = begun()
    look(rs, 1001.0, heard=False, steps=())
    assert rs.budget_exceeded
    f = fault(fault_at=2000.0)
    rs.begin(f, 2, RestartTimer(2, f.kind, 2000.0, 2001.0), unix=1.8e9, culprits=[])
    look(rs, 2003.0)
    assert not rs.budget_exceeded
