"""A fault's recovery told as stories with a fake clock: each step's observation in, the
recovery and its actions out (supervisor.controller.recovery, no process, no I/O)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from supervisor.controller.decide import RUNG_ABORT, RUNG_IN_PLACE, RUNG_KILL_NODE, RUNG_TEARDOWN, Fault
from supervisor.controller.recovery import (
    AbortRanks,
    AskForStacks,
    KillNodes,
    Launch,
    Observation,
    PlanNext,
    Policy,
    Recovery,
    Stage,
    TearDown,
    TryInPlace,
    WriteEvidence,
    begin,
    poll_s,
    resume,
    step,
)
from supervisor.platforms.base import NodeState, NodeStatus

POLICY = Policy(abort_grace_s=3.0, evidence_wait_s=1.0)
RUNNING = {"n0": NodeStatus("n0", 0, NodeState.RUNNING), "n1": NodeStatus("n1", 0, NodeState.RUNNING)}
N1_EXITED = RUNNING | {"n1": NodeStatus("n1", 0, NodeState.EXITED, -6)}


def fault(kind="collective_hang", rung=RUNG_ABORT, ranks=(1,), nodes=("n1",)):
    return Fault(kind, ranks, nodes, f"{kind} on rank {ranks}", rung, False, 100.0)


def tell(rec, story):
    """Walk ``rec`` through ``story``: (time, observation fields) per step; returns the actions of
    each step (by type name, with their main field) and the recovery at the end."""
    said = []
    for now, fields in story:
        rec, actions = step(rec, Observation(now=now, **fields), POLICY)
        said.append([_name(a) for a in actions])
        if rec is None:
            break
    return said, rec


def _name(a):
    if isinstance(a, AbortRanks):
        return f"abort{list(a.ranks)}"
    if isinstance(a, KillNodes):
        return f"kill{list(a.nodes)}"
    if isinstance(a, Launch):
        return f"launch@{a.attempt}"
    if isinstance(a, TearDown):
        return "teardown"
    return type(a).__name__


@pytest.mark.parametrize("kind,rung,story,expected", [
    # a hang: the culprit is told to abort; it does not exit in the grace: its node is killed, then the gang
    ("collective_hang", RUNG_ABORT,
     [(101, {}), (101.2, {"answered": True}), (101.3, {}), (102, {"nodes": RUNNING}), (104.4, {"nodes": RUNNING}),
      (104.5, {"nodes": RUNNING}), (104.6, {})],
     [["AskForStacks"], ["WriteEvidence"], ["abort[1]"], [], ["kill['n1']"], ["teardown"], ["PlanNext"]]),
    # the same hang, but the aborted rank's node exits within the grace: no node kill
    ("collective_hang", RUNG_ABORT,
     [(101, {}), (101.2, {"answered": True}), (101.3, {}), (101.8, {"nodes": N1_EXITED}), (101.9, {})],
     [["AskForStacks"], ["WriteEvidence"], ["abort[1]"], ["teardown"], ["PlanNext"]]),
    # a SIGSTOPped rank (silent: it cannot obey an abort): its node is killed at once
    ("dead", RUNG_KILL_NODE,
     [(101, {}), (101.2, {"answered": True}), (101.3, {}), (101.4, {}), (101.5, {})],
     [["AskForStacks"], ["WriteEvidence"], ["kill['n1']"], ["teardown"], ["PlanNext"]]),
    # kill -9 of a rank: its process is gone, the gang goes
    ("rank_killed", RUNG_TEARDOWN,
     [(101, {}), (101.2, {"answered": True}), (101.3, {}), (101.4, {})],
     [["AskForStacks"], ["WriteEvidence"], ["teardown"], ["PlanNext"]]),
    # no rank answers the dump order (older workers): the evidence is written after evidence_wait_s
    ("node_lost", RUNG_TEARDOWN,
     [(101, {}), (101.5, {}), (101.99, {}), (102.01, {}), (102.1, {}), (102.2, {})],
     [["AskForStacks"], [], [], ["WriteEvidence"], ["teardown"], ["PlanNext"]]),
    # a second fault during the abort's grace (another node dies): the ladder goes on; the teardown takes both
    ("hang", RUNG_ABORT,
     [(101, {}), (101.1, {"answered": True}), (101.2, {}),
      (102, {"nodes": RUNNING | {"n0": NodeStatus("n0", 0, NodeState.LOST)}}), (104.3, {"nodes": RUNNING}),
      (104.4, {"nodes": RUNNING}), (104.5, {})],
     [["AskForStacks"], ["WriteEvidence"], ["abort[1]"], [], ["kill['n1']"], ["teardown"], ["PlanNext"]]),
])
def test_the_ladder_of_each_fault_kind(kind, rung, story, expected):
    said, rec = tell(begin(fault(kind, rung), in_place=False), story)
    assert said == expected
    assert rec is not None and rec.stage == Stage.PLAN and rec.acted  # the executor plans what follows


def test_a_restart_in_place_taken_ends_the_recovery_and_one_declined_climbs_the_ladder():
    f = fault("rank_exit", RUNG_IN_PLACE)
    said, rec = tell(begin(f, in_place=True), [(101, {}), (101.1, {"answered": True}), (101.2, {}),
                                                (101.3, {"in_place": True})])
    assert said == [["AskForStacks"], ["WriteEvidence"], ["TryInPlace"], []] and rec is None
    said, rec = tell(begin(f, in_place=True), [(101, {}), (101.1, {"answered": True}), (101.2, {}),
                                                (101.3, {"in_place": False})])
    assert said == [["AskForStacks"], ["WriteEvidence"], ["TryInPlace"], ["teardown"]]
    assert rec.stage == Stage.RUNG


def test_the_launch_stage_launches_the_desired_attempt_once():
    rec = Recovery(fault(), Stage.LAUNCH, launch=(4, ("n0", "n1"), "step-0000000010"))
    rec, actions = step(rec, Observation(now=110), POLICY)
    assert actions == [Launch(4, ("n0", "n1"), "step-0000000010")] and rec.acted
    assert step(rec, Observation(now=111), POLICY) == (rec, [])  # the executor ends it once launched


def _saved(rec, shift):
    """Through the state file: wall-clock times, read back by a controller whose clock is ``shift`` ahead."""
    return Recovery.from_saved(rec.to_saved(lambda t: t + 5000.0), lambda u: u - 5000.0 + shift)


@pytest.mark.parametrize("stop_at,expected", [
    (1, ["AskForStacks"]),            # killed while the ranks dumped their stacks: asked again
    (2, ["WriteEvidence"]),           # killed while the evidence was written: written again
    (3, ["abort[1]"]),                # killed during the abort's grace: the abort is sent again
    (5, ["kill['n1']"]),              # killed while the culprit's node was killed: killed again
    (6, ["teardown"]),                # killed during the teardown: finished
])
def test_a_controller_killed_at_a_rung_is_replaced_by_one_that_resumes_there(stop_at, expected):
    story = [(101, {}), (101.2, {"answered": True}), (101.3, {}), (102, {"nodes": RUNNING}),
             (104.4, {"nodes": RUNNING}), (104.5, {"nodes": RUNNING})]
    rec = begin(fault(), in_place=False)
    for now, fields in story[:stop_at]:
        rec, _ = step(rec, Observation(now=now, **fields), POLICY)
    before = rec
    rec = resume(_saved(rec, shift=-60.0), gang_found=True, now=50.0, hold_s=1.5)
    assert (rec.stage, rec.rung, rec.fault.kind) == (before.stage, before.rung, before.fault.kind)
    assert rec.fault.fault_at == pytest.approx(before.fault.fault_at - 60.0)  # the same instant, the new clock
    # the adopted ranks are waited for (their reply addresses), at most hold_s
    assert step(rec, Observation(now=50.5, nodes=RUNNING), POLICY) == (rec, [])
    rec, actions = step(rec, Observation(now=50.6, nodes=RUNNING, heard=True), POLICY)
    assert [_name(a) for a in actions] == expected and not rec.resumed  # "resumed" is the first action's
    # and from there the ladder ends in one teardown at most
    teardowns = sum(isinstance(a, TearDown) for a in actions)
    now = 50.6
    while rec is not None and rec.stage != Stage.PLAN:
        now += 5.0
        rec, actions = step(rec, Observation(now=now, nodes=RUNNING, answered=True), POLICY)
        teardowns += sum(isinstance(a, TearDown) for a in actions)
    assert teardowns == 1


def test_a_replacement_that_finds_no_gang_plans_at_once_and_one_cut_mid_launch_launches_the_next_attempt():
    rec = Recovery(fault(), Stage.RUNG, rung=0, acted=True, deadline=103.0)
    gone = resume(_saved(rec, 0.0), gang_found=False)
    assert gone.stage == Stage.PLAN and not gone.acted
    assert [_name(a) for a in step(gone, Observation(now=200), POLICY)[1]] == ["PlanNext"]
    cut = Recovery(fault(), Stage.LAUNCH, acted=True, launch=(4, ("n0",), None))
    again = resume(_saved(cut, 0.0), gang_found=False)
    assert step(again, Observation(now=200), POLICY)[1] == [Launch(5, ("n0",), None)]
    planned = Recovery(fault(), Stage.LAUNCH, acted=False, launch=(4, ("n0",), None))
    assert step(resume(_saved(planned, 0.0), gang_found=False), Observation(now=200), POLICY)[1] == \
        [Launch(4, ("n0",), None)]


def test_a_gang_found_running_at_the_plan_or_the_launch_is_torn_down_first():
    # its teardown did not take (or the platform failed to confirm it): the new gang never joins the old
    at_plan = resume(Recovery(fault(), Stage.PLAN, acted=True), gang_found=True)
    rec, actions = step(at_plan, Observation(now=200, heard=True), POLICY)
    assert [_name(a) for a in actions] == ["teardown"]
    assert [_name(a) for a in step(rec, Observation(now=201), POLICY)[1]] == ["PlanNext"]
    at_launch = resume(Recovery(fault(), Stage.LAUNCH, launch=(4, ("n0",), None)), gang_found=True)
    rec, actions = step(at_launch, Observation(now=200), POLICY)
    assert [_name(a) for a in actions] == ["teardown"]
    assert step(rec, Observation(now=201), POLICY)[1] == [Launch(4, ("n0",), None)]


def test_the_stage_whose_action_failed_is_carried_out_again():
    # the controller saves a stage as carried out before its action; an action that raised (the
    # platform refused it) is marked not carried out, and the next step repeats it
    rec, actions = step(begin(fault("rank_killed", RUNG_TEARDOWN), in_place=False), Observation(now=101), POLICY)
    rec, _ = step(rec, Observation(now=101.1, answered=True), POLICY)
    rec, actions = step(rec, Observation(now=101.2), POLICY)
    assert [_name(a) for a in actions] == ["teardown"] and rec.acted
    failed = replace(rec, acted=False)
    assert [_name(a) for a in step(failed, Observation(now=102), POLICY)[1]] == ["teardown"]


GOOD_FAULT = {"kind": "x", "ranks": [1], "nodes": ["n1"], "detail": "", "rung": 1, "node_failure": False,
              "fault_unix": 1.0}


@pytest.mark.parametrize("raw", [
    {}, {"stage": "evidence"}, {"stage": "nope", "fault": {}},
    {"stage": "rung", "rung": -5, "fault": GOOD_FAULT},
    {"stage": "rung", "rung": 3, "fault": GOOD_FAULT},  # this fault's ladder has three rungs: 0, 1, 2
    {"stage": "launch", "fault": GOOD_FAULT, "launch": None},
    {"stage": "launch", "fault": GOOD_FAULT, "launch": {"attempt": 2, "nodes": "node0"}},
    {"stage": "launch", "fault": GOOD_FAULT, "launch": {"attempt": 2, "nodes": ["n0"], "restore_from": 7}},
    {"stage": "rung", "fault": GOOD_FAULT | {"ranks": "12"}},
    {"stage": "rung", "fault": GOOD_FAULT | {"node_failure": "no"}},
    {"stage": "rung", "deadline_unix": 1.0, "fault": {"kind": "x", "ranks": ["a"], "nodes": [], "detail": "",
                                                      "rung": 1, "node_failure": False, "fault_unix": 1.0}},
    {"stage": "rung", "deadline_unix": 1.0, "fault": []},
])
def test_a_saved_recovery_that_is_not_one_is_refused_by_name(raw):
    with pytest.raises(ValueError, match="recovery"):
        Recovery.from_saved(raw, float)


def test_the_loop_looks_again_soon_only_while_a_stage_waits():
    rec = begin(fault(), in_place=False)
    assert poll_s(None, 0.2) == 0.2 and poll_s(rec, 0.2) == 0.0
    rec, _ = step(rec, Observation(now=101), POLICY)
    assert poll_s(rec, 0.2) == 0.05  # the stacks come within milliseconds (and their heartbeats wake the loop)
    assert isinstance(step(rec, Observation(now=101.1, answered=True), POLICY)[1][0], WriteEvidence)
    assert isinstance(step(begin(fault(), in_place=True), Observation(now=1), POLICY)[1][0], AskForStacks)
    assert PlanNext() == PlanNext() and TryInPlace() == TryInPlace()
    assert poll_s(replace(rec, hold_until=5.0), 0.2) == 0.05  # waiting for an adopted gang's heartbeats
