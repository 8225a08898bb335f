"""Goodput accounting and the checkpoint-interval advice (supervisor.reports.goodput), as tables
checked by hand: events in (as the controller writes them), a breakdown and advice out."""

from __future__ import annotations

import math
import time

import pytest

from supervisor.reports import goodput as gp

T0 = 1_764_000_000.0  # any unix time: the events carry their times as the controller writes them


def ev(t: float, event: str, /, run: int = 1, **fields) -> dict:
    at = T0 + t
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(round(at * 1000)) % 1000:03d}Z"
    return {"time": stamp, "event": event, "job": "j", "run": run, **fields}


# one run of 1,000 s with every cause of badput in it, each a round number
RUN = [
    ev(0, "run_started"),
    ev(0, "launched", attempt=0, restore_from=None),
    ev(30, "training", attempt=0, step=1, since_launch_s=30.0),                     # start-up: 30 s
    ev(99, "save_blocked", attempt=0, step=50, blocked_s=2.0),                      # save stalls: 2 + 2 s
    ev(100, "checkpoint_complete", name="step-0000000050", step=50),
    ev(199, "save_blocked", attempt=0, step=100, blocked_s=2.0, persist_s=9.0),
    ev(200, "checkpoint_complete", name="step-0000000100", step=100),
    ev(250, "fault_detected", attempt=0, kind="dead", step=121, completed_step=120, step_time_s=0.5),  # at 120
    ev(260, "launched", attempt=1, restore_from="step-0000000100"),                   # 20 steps x 0.5 s = 10 s
    ev(290, "restart_complete", attempt=1, total_s=40.0,
       phases={"detect": 3.0, "teardown": 5.0, "schedule": 2.0, "rendezvous": 10.0, "restore": 8.0,
               "first_step": 12.0}),                                                  # restart 32 s, restore 8 s
    ev(290, "training", attempt=1, step=101, since_launch_s=30.0),                   # a restart's: not start-up
    ev(360, "capacity_found", waited_s=60.0),                                         # capacity: 60 s
    ev(1000, "job_finished", phase="completed"),
]


def test_one_run_splits_into_productive_time_and_badput_by_cause():
    runs, total = gp.account(RUN, now_unix=T0 + 5000)
    (b,) = runs
    assert b.wall_s == pytest.approx(1000.0, abs=1e-3) and b.ended == "completed"
    assert {k: round(v, 3) for k, v in b.badput_s.items()} == {
        "startup": 30.0, "waiting_for_capacity": 60.0, "restart": 32.0, "restore": 8.0, "save_stall": 4.0,
        "wasted_progress": 10.0}
    assert b.wasted_steps == 20 and b.faults == 1 and b.restarts == 1 and b.saves == 2
    # 1000 - (30 + 60 + 32 + 8 + 4 + 10) = 856
    assert b.productive_s == pytest.approx(856.0, abs=1e-3) and b.ettr == pytest.approx(0.856, abs=1e-6)
    assert b.checkpoint_interval_s == pytest.approx(100.0, abs=1e-3)
    assert b.save_persist_s == [9.0] and gp.advise(b).persist_s == 9.0  # an async save's whole time, measured
    assert total.wall_s == b.wall_s and total.badput_s == b.badput_s


def test_runs_add_up_a_run_still_going_counts_to_now_and_a_lost_one_to_its_last_word():
    later = [
        ev(2000, "run_started", run=2),
        ev(2004, "launched", run=2, attempt=0, restore_from="step-0000000100"),  # 4 s of the run before its launch
        ev(2010, "training", run=2, attempt=0, since_launch_s=6.0),
        ev(2050, "save_blocked", run=2, attempt=0, step=150, blocked_s=1.0),
        # run 2's controller was killed here (no job_finished); run 3 takes the job over
        ev(3000, "run_started", run=3),
        ev(3020, "waiting_for_capacity", run=3),
    ]
    runs, total = gp.account(RUN + later, now_unix=T0 + 3100)
    by = {b.run: b for b in runs}
    assert by[2].wall_s == pytest.approx(50.0, abs=1e-3) and by[2].ended == "lost"  # 2000 -> its last event
    assert by[3].wall_s == pytest.approx(100.0, abs=1e-3) and by[3].ended == ""     # 3000 -> now
    assert by[3].badput_s["waiting_for_capacity"] == pytest.approx(80.0, abs=1e-3)  # 3020 -> now, still waiting
    assert total.wall_s == pytest.approx(1150.0, abs=1e-3)
    assert by[2].badput_s["startup"] == pytest.approx(10.0, abs=1e-3)  # 4 before the launch + 6 to the first step
    # 856 + (50 - 10 - 1) + (100 - 80)
    assert total.productive_s == pytest.approx(856.0 + 39.0 + 20.0, abs=1e-3)


def test_a_fault_before_any_launch_restores_wastes_nothing_and_unreadable_events_are_passed_over():
    events = [
        ev(0, "run_started"),
        {"event": "fault_detected", "run": 1},            # no time: passed over
        ev(5, "fault_detected", kind="dead", step=8, completed_step=7),  # no step time: what it cost is not known
        ev(6, "launched", attempt=1, restore_from=None),
        ev(10, "job_finished", phase="failed"),
    ]
    (b,), _ = gp.account(events, now_unix=T0 + 100)
    assert b.faults == 1 and b.wasted_steps == 0 and b.badput_s["wasted_progress"] == 0.0 and b.wall_s == 10.0
    # no restart completed before the run ended: from the fault to the end is the restart's
    assert b.badput_s["restart"] == pytest.approx(5.0, abs=1e-3)
    with pytest.raises(gp.GoodputError, match="log directory"):
        gp.account([{"event": "x"}], now_unix=T0)


def test_a_capacity_wait_inside_a_restart_counts_once_and_a_restart_under_way_counts_to_now():
    events = [
        ev(0, "run_started"),
        ev(100, "fault_detected", kind="node_lost", step=51, completed_step=50, step_time_s=1.0,
           detection_s=4.0),  # hit at 96
        ev(110, "waiting_for_capacity"),
        ev(150, "capacity_found", waited_s=40.0),
        ev(151, "launched", attempt=1, restore_from="step-0000000040"),
        ev(170, "restart_complete", attempt=1, total_s=74.0,
           phases={"detect": 4.0, "teardown": 6.0, "schedule": 45.0, "rendezvous": 5.0, "restore": 4.0,
                   "first_step": 10.0}),
        ev(200, "fault_detected", kind="dead", step=80, step_time_s=1.0, detection_s=2.0),   # hit at 198
    ]
    (b,), _ = gp.account(events, now_unix=T0 + 230)
    assert b.badput_s["waiting_for_capacity"] == pytest.approx(40.0, abs=1e-3)
    # (4 + 6 + 45 + 5 + 10) - 40 of capacity = 30, then the restart under way: 198 -> 230 = 32
    assert b.badput_s["restart"] == pytest.approx(30.0 + 32.0, abs=1e-3)
    assert b.badput_s["restore"] == 4.0 and b.wasted_steps == 10


def test_without_the_sdk_no_steps_are_said_to_be_recomputed():
    """A script without the SDK restores on its own: its step count is its optimizer steps since
    its launch, so the fault carries no completed step and nothing is counted as recomputed."""
    events = [ev(0, "run_started"), ev(10, "fault_detected", kind="dead", step=40, step_time_s=0.1),
              ev(12, "launched", attempt=1, restore_from=None), ev(20, "job_finished", phase="completed")]
    (b,), _ = gp.account(events, now_unix=T0 + 30)
    assert b.wasted_steps == 0 and b.badput_s["wasted_progress"] == 0.0 and b.faults == 1


def test_feeding_one_event_at_a_time_is_the_same_as_accounting_them_all():
    acc = gp.Accountant()
    for e in RUN[:6]:
        acc.feed(e)
    runs, _ = acc.breakdowns(T0 + 300, spans=False)
    assert runs[0].wall_s == pytest.approx(300.0, abs=1e-3) and runs[0].spans == []
    for e in RUN[6:]:
        acc.feed(e)
    assert acc.breakdowns(T0)[1].to_dict() == gp.account(RUN, now_unix=T0)[1].to_dict()


# ---------------------------------------------------------------------------- the formulas
M_LLAMA = 3.09 * 3600  # 11,124 s


@pytest.mark.parametrize("c, m, seconds", [
    (5.0, M_LLAMA, 333.53),      # sqrt(2 x 5 x 11124) = sqrt(111240) = 333.53 s = 5.56 min (the 5.6)
    (0.2, M_LLAMA, 66.71),       # sqrt(4449.6) = 66.71 s: about a minute with a 0.2 s async save
    (120.0, M_LLAMA, 1633.94),   # sqrt(2669760) = 1633.94 s = 27.2 min with a 2-minute blocking save
    (50.0, 10_000.0, 1000.0),    # sqrt(1,000,000)
])
def test_young(c, m, seconds):
    assert gp.young(c, m) == pytest.approx(seconds, abs=0.01)


@pytest.mark.parametrize("c, m, seconds", [
    # x = C/2M = 50/20000 = 0.0025, sqrt x = 0.05: 1000 (1 + 0.05/3 + 0.0025/9) - 50
    #   = 1000 x 1.0169444 - 50 = 966.94
    (50.0, 10_000.0, 966.94),
    # x = 120/22248 = 0.0053937, sqrt x = 0.0734419: 1633.94 x (1 + 0.0244806 + 0.0005993) - 120
    #   = 1633.94 x 1.0250799 - 120 = 1554.92
    (120.0, M_LLAMA, 1554.92),
    (300.0, 100.0, 100.0),       # C >= 2M: Daly's interval is M
])
def test_daly(c, m, seconds):
    assert gp.daly(c, m) == pytest.approx(seconds, abs=0.05)


@pytest.mark.parametrize("tau, c, r, m, ettr", [
    # wall / work = M e^(R/M) (e^((tau + C)/M) - 1) / tau
    (100.0, 10.0, 0.0, 1000.0, 1 / 1.1627807),    # e^0.11 - 1 = 0.1162781; x 1000/100
    (100.0, 10.0, 100.0, 1000.0, 1 / (1.1627807 * math.e ** 0.1)),  # a restart of R multiplies by e^(R/M)
    (10.0, 0.0, 0.0, 1e9, 1.0),                   # no failures, free saves: everything trains
    (0.0, 1.0, 1.0, 1000.0, 0.0),                 # no interval: nothing is said to train
])
def test_predicted_ettr(tau, c, r, m, ettr):
    assert gp.predicted_ettr(tau, c=c, r=r, m=m) == pytest.approx(ettr, abs=1e-6)


def test_the_advised_interval_is_the_best_one_the_model_predicts():
    c, r, m = 5.0, 60.0, M_LLAMA
    best = gp.daly(c, m)
    at_best = gp.predicted_ettr(best, c=c, r=r, m=m)
    for tau in (best / 2, best * 0.9, best * 1.1, best * 2):
        assert gp.predicted_ettr(tau, c=c, r=r, m=m) < at_best


# ---------------------------------------------------------------------------- the advice
def breakdown(**kw) -> gp.Breakdown:
    b = gp.Breakdown(0, wall_s=kw.pop("wall_s", 36_000.0))
    for k, v in kw.items():
        setattr(b, k, v)
    return b


def test_with_few_faults_the_prior_is_used_and_said_as_such():
    b = breakdown(faults=2, save_blocked_s=[4.0, 6.0], restart_totals_s=[30.0], step_times_s=[0.5, 0.5, 2.0],
                  checkpoint_times=[0.0, 600.0, 1200.0])
    a = gp.advise(b)
    assert a.mtbf_s == gp.PRIOR_MTBF_S and "Llama 3" in a.mtbf_source and "fewer than 3" in a.mtbf_source
    assert a.save_cost_s == 5.0 and a.restart_cost_s == 30.0 and a.step_time_s == 0.5
    assert a.young_s == pytest.approx(333.53, abs=0.01) and a.advised_s == a.daly_s
    # saves 600 s apart, each blocking 5 s: 595 s of training between them, 1,190 steps of 0.5 s
    assert a.current_interval_s == 595.0 and a.steps(a.current_interval_s) == 1190
    assert a.steps(a.advised_s) == round(a.daly_s / 0.5)
    assert a.ettr_advised > a.ettr_now  # 10 min is longer than the ~5.5 min advised
    assert a.per_second_of_c > 0 and a.per_minute_of_r > 0


def test_with_enough_faults_the_job_s_own_rate_is_fitted_and_the_persist_time_bounds_the_interval():
    b = breakdown(faults=4, save_blocked_s=[0.2], restart_totals_s=[], step_times_s=[])
    a = gp.advise(b, persist_s=120.0)
    assert a.mtbf_s == 9000.0 and a.mtbf_source.startswith("fitted: 4 faults in 10.00 h")  # 36,000 s / 4
    assert a.restart_cost_s == gp.PRIOR_RESTART_S and "prior" in a.restart_source
    # sqrt(2 x 0.2 x 9000) = 60 s, shorter than the 120 s a save takes to reach storage
    assert a.young_s == pytest.approx(60.0) and a.advised_s == 120.0 and a.steps(a.advised_s) is None


def test_no_save_measured_advises_no_interval():
    a = gp.advise(breakdown(faults=0))
    assert a.save_cost_s is None and a.advised_s is None
    assert "no interval advised" in gp.render_table([], breakdown(), a)
