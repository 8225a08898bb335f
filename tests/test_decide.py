"""Table tests for the controller's pure decisions."""

from __future__ import annotations

import pytest

from supervisor.controller.decide import (
    calibration_every_s,
    calibration_stride,
    progress_every_s,
    ACTION_ABORT,
    ACTION_KILL_NODE,
    ACTION_TEAR_DOWN,
    EXIT_CODES,
    FAULT_KINDS,
    RUNG_ABORT,
    RUNG_IN_PLACE,
    RUNG_KILL_NODE,
    RUNG_TEARDOWN,
    Fault,
    History,
    JobPhase,
    Relaunch,
    RestartTimer,
    RestoreReport,
    Rung,
    Stop,
    classify,
    completed,
    evidence_awaited,
    gang_size,
    in_place_ok,
    ladder,
    name_rank_failure,
    parse_skipped,
    next_attempt,
    plan_next,
    rank_ended,
    restarted_in_place,
    rung_worked,
    restore_report,
    root_verdict,
)
from supervisor.health import Finding, Kind
from supervisor.platforms.node.agent_output import RankFailure
from supervisor.platforms.base import NodeState, NodeStatus
from supervisor.protocol import (
    EXIT_PREFLIGHT,
    OUTCOME_FINISHED,
    OUTCOME_STOPPED,
    RANK_EXITS,
    RESTART_PHASES,
    Heartbeat,
    decode_refused,
)


def node(name, state=NodeState.RUNNING, code=None, ours=False, stopped=False):
    return NodeStatus(name=name, attempt=0, state=state, exit_code=code, killed_by_us=ours, stopped=stopped)


RN = {0: "a", 1: "b"}
KW = dict(now=100.0, last_heard={0: 99.0, 1: 90.0}, phase_started={0: 95.0, 1: 80.0}, rank_nodes=RN)


F, S = OUTCOME_FINISHED, OUTCOME_STOPPED
OK0, FAIL1, RUN, LOST = (NodeState.EXITED, 0), (NodeState.EXITED, 1), (NodeState.RUNNING, None), (NodeState.LOST, None)


@pytest.mark.parametrize("agents, outcomes, world, done", [
    # every rank finished and every agent exited 0, whichever arrived first
    ((OK0, OK0), {0: F, 1: F}, 2, True),
    ((OK0, RUN), {0: F, 1: F}, 2, False),          # the ranks' last words came first: not yet
    ((RUN, RUN), {0: F, 1: F}, 2, False),
    ((OK0, OK0), {}, 2, True),                      # no SDK at all: the agents' exit 0 is all there is (warned)
    # an early stop is never completion: a NaN stops every rank cleanly, then the agents fail
    ((RUN, RUN), {0: S, 1: S}, 2, False),           # the ranks said "stopped" before the agents exited
    ((FAIL1, FAIL1), {0: S, 1: S}, 2, False),
    ((FAIL1, OK0), {0: F, 1: ""}, 2, False),
    ((OK0, OK0), {0: S, 1: F}, 2, False),           # even if the agents exited 0
    # adopted agents (exit codes unknown): only every rank's "finished" completes
    ((LOST, LOST), {0: F, 1: F}, 2, True),
    ((LOST, LOST), {0: F}, 2, False),
    ((LOST, LOST), {0: F, 1: S}, 2, False),
    ((), {0: F}, 1, False),
])
def test_completion_means_the_training_finished(agents, outcomes, world, done):
    nodes = {f"n{i}": node(f"n{i}", state, code) for i, (state, code) in enumerate(agents)}
    assert completed(nodes, outcomes, world) is done


def test_a_lost_last_word_is_waited_for_then_the_agents_exit_0_is_taken():
    nodes = {"a": node("a", NodeState.EXITED, 0), "b": node("b", NodeState.EXITED, 0)}
    assert not completed(nodes, {0: F, 1: ""}, 2, waited_s=1.0, grace_s=4.0)  # rank 1's may still come
    assert completed(nodes, {0: F, 1: ""}, 2, waited_s=4.0, grace_s=4.0)
    assert not completed(nodes, {0: F, 1: S}, 2, waited_s=99.0, grace_s=4.0)  # a stop is never waited away


@pytest.mark.parametrize("agents", [(OK0, OK0), (LOST, LOST)])
def test_a_gang_that_ended_content_but_stopped_early_is_a_fault_not_silence(agents):
    # the SDK's SIGTERM path: the ranks saved an emergency checkpoint and the script exited 0;
    # without this the controller would wait forever for a completion that cannot come
    nodes = {f"n{i}": node(f"n{i}", state, code) for i, (state, code) in enumerate(agents)}
    rank_nodes = {0: "n0", 1: "n1"}
    kw = dict(now=1.0, last_heard={}, phase_started={}, rank_nodes=rank_nodes, done_ranks={0, 1})
    f = classify(nodes, [], **kw, stopped_ranks={0: "stop requested (SIGTERM): emergency checkpoint", 1: ""},
                 rank_steps={0: 40, 1: 40})
    assert (f.kind, f.ranks, f.rung, f.step) == ("stopped_early", (0, 1), RUNG_TEARDOWN, 40)
    assert f.detail == "rank 0 stopped before its training finished: stop requested (SIGTERM): emergency checkpoint"
    f = classify(nodes, [], **kw, stopped_ranks={0: "x", 1: "y"}, nonfinite_ranks=[1], rank_steps={1: 9})
    assert (f.kind, f.detail) == ("nonfinite", "rank 1: non-finite loss at step 9")
    assert classify(nodes, [], **kw) is None  # finished: completion decides


@pytest.mark.parametrize("nodes, kind, rung, node_failure", [
    ({"a": node("a"), "b": node("b", NodeState.EXITED, -9)}, "node_lost", RUNG_TEARDOWN, True),
    ({"a": node("a"), "b": node("b", NodeState.LOST)}, "node_lost", RUNG_TEARDOWN, False),
    ({"a": node("a"), "b": node("b", NodeState.EXITED, 1)}, "rank_exit", RUNG_TEARDOWN, False),
    ({"a": node("a"), "b": node("b", NodeState.EXITED, 17)}, "crash", RUNG_TEARDOWN, False),
    ({"a": node("a"), "b": node("b", NodeState.EXITED, 18)}, "nonfinite", RUNG_TEARDOWN, False),
])
def test_node_exits(nodes, kind, rung, node_failure):
    f = classify(nodes, [], **KW)
    assert (f.kind, f.rung, f.node_failure, f.nodes, f.ranks) == (kind, rung, node_failure, ("b",), (1,))


def test_adopted_node_that_finished_is_not_a_fault():
    nodes = {"a": node("a"), "b": node("b", NodeState.LOST)}
    assert classify(nodes, [], **KW, done_ranks={1}) is None
    assert classify(nodes, [], **KW, done_ranks={0}).kind == "node_lost"


def test_the_culprit_node_is_named_not_the_one_that_lost_its_peer():
    # rank 1 killed by SIGKILL; rank 0 failed "connection reset by peer"; both agents exited 1
    both = {"a": node("a", NodeState.EXITED, 1), "b": node("b", NodeState.EXITED, 1)}
    reset = {0: "RuntimeError: Read error: Connection reset by peer"}
    f = classify(both, [], **KW, failed_ranks={0: True}, failed_errors=reset)
    assert (f.nodes, f.ranks, f.secondary) == (("b",), (1,), False)
    # rank 1 failed on its own error, rank 0 lost its peer: rank 1 is the culprit
    f = classify(both, [], **KW, failed_ranks={0: True, 1: False},
                 failed_errors=reset | {1: "ValueError: bad batch"})
    assert f.nodes == ("b",) and "ValueError: bad batch" in f.detail
    # only the victim's agent has exited so far: a fault, but secondary (the caller waits)
    f = classify({"a": node("a", NodeState.EXITED, 1), "b": node("b")}, [], **KW, failed_ranks={0: True},
                 failed_errors=reset)
    assert f.nodes == ("a",) and f.secondary and "Connection reset by peer" in f.detail
    # the culprit's whole node died: no agent exit, only silence. Its silence wins over the
    # victim's exit; the victim's own silence (it said it failed) is no culprit
    dead = Finding(Kind.DEAD, (1,), ("b",), "silent for 3.2s")
    victim_silent = Finding(Kind.DEAD, (0,), ("a",), "silent for 3.1s")
    f = classify({"a": node("a", NodeState.EXITED, 1), "b": node("b")}, [victim_silent, dead], **KW,
                 failed_ranks={0: True}, failed_errors=reset)
    assert (f.kind, f.nodes, f.ranks, f.secondary) == ("dead", ("b",), (1,), False)
    f = classify({"a": node("a", NodeState.EXITED, 1), "b": node("b")}, [victim_silent], **KW,
                 failed_ranks={0: True}, failed_errors=reset)
    assert f.kind == "rank_exit" and f.secondary
    # a rank that failed on its own error is never secondary
    f = classify({"a": node("a", NodeState.EXITED, 1), "b": node("b")}, [], **KW, failed_ranks={0: False})
    assert f.nodes == ("a",) and not f.secondary


def test_nodes_we_killed_or_that_finished_are_not_faults():
    assert classify({"a": node("a", NodeState.EXITED, -9, ours=True), "b": node("b", NodeState.EXITED, 0)}, [], **KW) is None


def test_findings_pick_the_ladder_rung():
    dead = Finding(Kind.DEAD, (1,), ("b",), "silent")
    f = classify({"a": node("a"), "b": node("b")}, [dead], **KW)
    assert (f.kind, f.rung, f.node_failure, f.fault_at) == ("dead", RUNG_KILL_NODE, False, 90.0)
    f = classify({"a": node("a"), "b": node("b", stopped=True)}, [dead], **KW)
    assert f.node_failure  # the agent itself is frozen: a node-level failure
    hang = Finding(Kind.COLLECTIVE_HANG, (1,), ("b",), "never entered")
    f = classify({"a": node("a"), "b": node("b")}, [hang], **KW)
    assert (f.kind, f.rung, f.fault_at) == ("collective_hang", RUNG_ABORT, 80.0)
    # a named culprit wins over an unnamed one; silence wins over a hang
    unnamed = Finding(Kind.COLLECTIVE_HANG, (0, 1), ("a", "b"), "all inside", culprit=False)
    assert classify({}, [unnamed, hang], **KW).ranks == (1,)
    assert classify({}, [hang, dead], **KW).kind == "dead"
    assert classify({}, [Finding(Kind.NONFINITE, (0,), ("a",), "nan")], **KW) is None


def fault(kind="hang", nodes=("b",), node_failure=False):
    return Fault(kind, (1,), nodes, "x", RUNG_ABORT, node_failure, 0.0)


C10, C20, C30 = "step-0000000010", "step-0000000020", "step-0000000030"
RESTORED_10_STEPPED = RestoreReport(state="restored", restored=C10, stepped=True, ranks_reported=2)
PLAN = dict(slots=["a", "b", "c"], previous_nodes=["a", "b"], nodes_min=1, nodes_max=2, max_restarts=5,
            guard_attempts=3, exclude_after=1, checkpoints=[C20, C10], made_progress=True,
            report=RESTORED_10_STEPPED)


def hb(restore_state="", restored="", skipped="", steps_done=0, root=""):
    # ``skipped`` in an older SDK's form (``name: why; ...``), read as the controller reads it
    return Heartbeat(job="j", attempt=1, rank=0, world_size=2, seq=1, step=0, phase="compute", phase_s=0.0,
                     restore_state=restore_state, restored=restored, restore_refused=decode_refused(skipped),
                     steps_done=steps_done, ckpt_root=root)


def test_relaunch_same_nodes_from_latest():
    h = History()
    d, h = plan_next(history=h, fault=fault(), **PLAN)
    assert d == Relaunch(("a", "b"), C20, (), (), require_checkpoint=True)
    assert h.restarts == 1 and h.attempts_without_progress == 0


def test_lost_node_is_excluded_and_a_spare_used():
    h = History()
    d, h = plan_next(history=h, fault=fault("node_lost", node_failure=True), **PLAN)
    assert d.nodes == ("a", "c") and d.newly_excluded == ("b",) and h.excluded == ("b",)


def test_no_spare_means_a_smaller_gang_then_no_capacity():
    h = History()
    kw = PLAN | {"slots": ["a", "b"]}
    d, h = plan_next(history=h, fault=fault("node_lost", node_failure=True), **kw)
    assert d.nodes == ("a",)
    d, h = plan_next(history=h, fault=fault("node_lost", nodes=("a",), node_failure=True), **kw | {"previous_nodes": ["a"]})
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_NO_CAPACITY


def test_progress_guard_and_max_restarts():
    h = History()
    kw = PLAN | {"made_progress": False}
    d, h = plan_next(history=h, fault=fault(), **kw)
    assert isinstance(d, Relaunch)
    d, h = plan_next(history=h, fault=fault(), **kw)
    assert isinstance(d, Relaunch)
    d, h = plan_next(history=h, fault=fault(), **kw)
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_NO_PROGRESS and "3 attempts" in d.reason
    h = History(restarts=5)
    d, h = plan_next(history=h, fault=fault(), **PLAN)
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_MAX_RESTARTS


@pytest.mark.parametrize("reports, suspects, pick", [
    # a crash one step after a good restore says nothing against the checkpoint (the bug that
    # sent a job back to step 0: "first step" was inferred from sampled heartbeats)
    ([RESTORED_10_STEPPED] * 3, [], C20),
    # restored, and no step after it: once is not evidence, twice is
    ([RestoreReport(state="restored", restored=C20)], [], C20),
    ([RestoreReport(state="restored", restored=C20)] * 2, [C20], C10),
    # the ranks refused it (checksum): suspect at once, the next older one is used
    ([RestoreReport(state="restored", restored=C10, refused=((C20, "fails its sha256 checksum (corrupt)"),),
                    stepped=False)], [C20], C10),
    # nothing reported (died before restoring): no evidence about any checkpoint
    ([RestoreReport()] * 3, [], C20),
])
def test_a_checkpoint_is_suspect_only_on_evidence_about_it(reports, suspects, pick):
    h = History()
    for report in reports:
        d, h = plan_next(history=h, fault=fault("hang"), **PLAN | {"report": report, "guard_attempts": 10})
    assert list(h.suspects) == suspects and d.restore_from == pick and d.require_checkpoint
    assert all(h.suspect_why[n] for n in suspects)


@pytest.mark.parametrize("kind", ["node_lost", "rank_killed", "dead", "preempted", "nonfinite"])
def test_failures_the_restored_state_cannot_have_caused_never_make_it_suspect(kind):
    h = History()
    no_step = RestoreReport(state="restored", restored=C20)
    for _ in range(3):
        d, h = plan_next(history=h, fault=Fault(kind, (1,), ("b",), "x", RUNG_TEARDOWN, False, 0.0, step=21),
                      **PLAN | {"report": no_step, "guard_attempts": 10, "skip_batches": 5, "nonfinite_window": 0})
    assert h.suspects == () and d.restore_from == C20


def test_no_usable_checkpoint_stops_instead_of_training_from_scratch():
    h = History()
    refused = RestoreReport(state="failed", refused=((C20, "corrupt"), (C10, "corrupt")))
    d, h = plan_next(history=h, fault=fault("crash"), **PLAN | {"report": refused})
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_NO_CHECKPOINT and EXIT_CODES[d.phase] == 6
    assert C20 in d.reason and "refusing to train from scratch" in d.reason
    # the operator's explicit flag allows it
    h = History()
    d, h = plan_next(history=h, fault=fault("crash"), **PLAN | {"report": refused, "allow_fresh_start": True})
    assert isinstance(d, Relaunch) and d.restore_from is None and not d.require_checkpoint
    # a job that never had a checkpoint starts from scratch as before
    h = History()
    d, h = plan_next(history=h, fault=fault("crash"), **PLAN | {"checkpoints": [], "report": RestoreReport(state="fresh")})
    assert isinstance(d, Relaunch) and d.restore_from is None and not d.require_checkpoint
    # one that had one and lost them all (deleted) stops too
    h = History(had_checkpoint=True)
    d, h = plan_next(history=h, fault=fault("crash"), **PLAN | {"checkpoints": []})
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_NO_CHECKPOINT


def test_restore_report_folds_the_ranks_last_words():
    r = restore_report([hb("restored", C10, f"{C20}: fails its sha256 checksum (corrupt); {C30}: excluded by the "
                           "caller (marked suspect)", steps_done=0, root="/ck"),
                        hb("restored", C10, "", steps_done=3, root="/ck")])
    assert r.state == "restored" and r.restored == C10 and r.stepped and r.ranks_reported == 2
    assert r.refused == ((C20, "fails its sha256 checksum (corrupt)"),)  # the supervisor's own exclusion is not a refusal
    assert restore_report([hb("restored", C10), hb("failed", "", "no checkpoint verifies")]).state == "failed"
    assert restore_report([hb(), hb("fresh")]).state == "fresh" and restore_report([hb()]).state == ""
    assert parse_skipped("") == []


@pytest.mark.parametrize("roots, verdict", [
    ((), ("ok", "")),
    (("/ck",), ("ok", "")),
    (("/mine",), ("adopt", "/mine")),
    (("/a", "/b"), ("conflict", "the ranks save checkpoints to different roots: /a, /b")),
])
def test_the_supervisor_watches_the_root_the_ranks_write(roots, verdict):
    assert root_verdict("/ck", RestoreReport(roots=roots)) == verdict


def test_exclusion_threshold_counts_node_failures():
    h = History()
    kw = PLAN | {"exclude_after": 2}
    d, h = plan_next(history=h, fault=fault("dead", node_failure=True), **kw)
    assert d.nodes == ("a", "b")
    d, h = plan_next(history=h, fault=fault("dead", node_failure=True), **kw)
    assert d.nodes == ("a", "c")


def test_a_failed_pod_counts_against_its_machine_not_its_slot_index():
    # Kubernetes: slots are pod indexes, the failure domain is the node the pod ran on
    h = History()
    kw = PLAN | {"slots": ["slot-0", "slot-1", "slot-2"], "previous_nodes": ["slot-0", "slot-1"],
                 "exclude_after": 2}
    pod = fault("node_lost", nodes=("slot-1",), node_failure=True)
    _, h = plan_next(history=h, fault=pod, hosts={"slot-0": "k8s-a", "slot-1": "k8s-b"}, **kw)
    assert h.node_failures == {"k8s-b": 1} and h.excluded == ()
    # the next attempt's slot-0 ran on the same machine: two failures there, whatever the slot
    d, h = plan_next(history=h, fault=fault("node_lost", nodes=("slot-0",), node_failure=True),
                  hosts={"slot-0": "k8s-b", "slot-1": "k8s-c"}, **kw)
    assert h.excluded == ("k8s-b",) and d.newly_excluded == ("k8s-b",)
    assert d.nodes == ("slot-0", "slot-1")  # pod indexes stay usable: the platform avoids the machine


def test_a_lost_node_is_named_with_the_platforms_account_of_it():
    lost = NodeStatus("slot-1", 0, NodeState.LOST, detail="pod j-a0-slot-1 PreemptionByScheduler: preempted")
    f = classify({"slot-1": lost}, [], **KW)
    assert f.kind == "node_lost" and f.detail == "node slot-1: pod j-a0-slot-1 PreemptionByScheduler: preempted"
    assert f.node_failure is False  # not a hardware fault: the machine is not excluded
    assert "vanished (exit code unknown)" in classify({"a": NodeStatus("a", 0, NodeState.LOST)}, [], **KW).detail


def test_restart_timer():
    t = RestartTimer(0, "hang", fault_at=10.0, detected_at=13.0, torn_down_at=14.0, scheduled_at=14.5,
                     rendezvous_at=17.0, restored_at=18.0, first_step_at=18.5)
    assert t.durations() == {"detect": 3.0, "teardown": 1.0, "schedule": 0.5, "rendezvous": 2.5, "restore": 1.0,
                             "first_step": 0.5}
    assert t.total(100.0) == 8.5 and t.budget_remaining(900, 100.0) == 891.5
    assert RestartTimer(0, "x", 10.0, 12.0).budget_remaining(5.0, 20.0) == -5.0


def failed_node(name, *failures, code=1):
    return NodeStatus(name=name, attempt=0, state=NodeState.EXITED, exit_code=code, failures=tuple(failures))


@pytest.mark.parametrize("failure, steps, kind, detail", [
    (RankFailure(1, -9, "", True), {1: 60}, "rank_killed", "rank 1 killed by signal 9 (SIGKILL) at step 60"),
    (RankFailure(1, 18, "", True), {1: 9}, "nonfinite", "rank 1: non-finite loss at step 9"),
    (RankFailure(1, 1, "ModuleNotFoundError: No module named 'torch'", True), {}, "rank_error",
     "rank 1 crashed: ModuleNotFoundError: No module named 'torch'"),
    (RankFailure(1, 17, "", True), {1: 12}, "crash", "rank 1 crashed (exit 17) at step 12"),
    (RankFailure(1, 3, "", True), {1: 4}, "rank_exit", "rank 1 exited with code 3 at step 4"),
])
def test_a_failed_node_is_named_from_its_ranks_own_end(failure, steps, kind, detail):
    nodes = {"a": node("a"), "b": failed_node("b", failure, RankFailure(0, -15))}
    f = classify(nodes, [], **KW, rank_steps=steps)
    assert (f.kind, f.detail, f.ranks, f.nodes) == (kind, detail, (1,), ("b",))
    assert f.step == steps.get(1)


def test_a_nan_reported_in_the_heartbeat_names_the_fault_even_without_an_exit_code():
    nodes = {"a": node("a"), "b": NodeStatus("b", 0, NodeState.EXITED, 1)}
    f = classify(nodes, [], **KW, rank_steps={1: 9}, nonfinite_ranks=[1])
    assert f.kind == "nonfinite" and f.detail == "rank 1: non-finite loss at step 9"
    # every rank exits 18 on an agreed NaN; the agent that exits first may hold the innocent one:
    # the rank whose own loss was not finite is named, wherever it runs
    nodes = {"a": node("a"), "b": failed_node("b", RankFailure(1, 18, "", True))}
    f = classify(nodes, [], **KW, rank_steps={0: 9, 1: 9}, nonfinite_ranks=[0])
    assert (f.kind, f.detail, f.ranks, f.step) == ("nonfinite", "rank 0: non-finite loss at step 9", (0,), 9)
    lone = {"a": NodeStatus("a", 0, NodeState.EXITED, 1, output_error="ModuleNotFoundError: No module named 'x'")}
    f = classify(lone, [], now=1.0, last_heard={}, phase_started={}, rank_nodes={})
    assert "ModuleNotFoundError: No module named 'x'" in f.detail


def nan_fault(step):
    return Fault("nonfinite", (0,), ("a",), "nan", RUNG_TEARDOWN, False, 0.0, step=step)


@pytest.mark.parametrize("steps, window, skips, outcome", [
    ([9], 0, 0, "relaunch"),                      # the first one is transient
    ([9, 9], 0, 0, "stop"),                       # the same step again: not transient
    ([9, 12], 0, 0, "relaunch"),                  # elsewhere: a new transient
    ([9, 12], 5, 0, "stop"),                      # within the configured window
    ([9, 9], 0, 1, "skip"),                       # skipping allowed: skip that batch
    ([9, 9, 9], 0, 1, "stop"),                    # only as many skips as allowed
])
def test_nonfinite_policy(steps, window, skips, outcome):
    h = History()
    for s in steps:
        d, h = plan_next(history=h, fault=nan_fault(s), **PLAN | {"nonfinite_window": window, "skip_batches": skips,
                                                               "guard_attempts": 10})
    if outcome == "stop":
        assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_NONFINITE and EXIT_CODES[d.phase] == 7
        assert f"step {steps[-1]}" in d.reason
    else:
        assert isinstance(d, Relaunch) and d.skip_steps == ((steps[-1],) if outcome == "skip" else ())


def test_the_same_failure_before_the_first_step_twice_stops_at_once():
    h = History()
    broken = Fault("rank_error", (0,), ("a",), "rank 0 crashed: ModuleNotFoundError: No module named 'torch'",
                   RUNG_TEARDOWN, False, 0.0)
    nothing = RestoreReport()
    d, h = plan_next(history=h, fault=broken, **PLAN | {"report": nothing})
    assert isinstance(d, Relaunch)
    same_on_another_rank = Fault("rank_error", (1,), ("b",), "rank 1 crashed: ModuleNotFoundError: No module named "
                                 "'torch'", RUNG_TEARDOWN, False, 0.0)
    d, h = plan_next(history=h, fault=same_on_another_rank, **PLAN | {"report": nothing})
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_STARTUP_FAILURE and EXIT_CODES[d.phase] == 8
    assert "ModuleNotFoundError" in d.reason and h.restarts == 2
    # once a step was taken, the same crash is no startup failure (the progress guard handles it)
    h = History()
    for _ in range(2):
        d, h = plan_next(history=h, fault=broken, **PLAN | {"report": RESTORED_10_STEPPED})
    assert isinstance(d, Relaunch)
    # a different failure each time is not "the same"
    h = History()
    _, h = plan_next(history=h, fault=broken, **PLAN | {"report": nothing})
    other = Fault("rank_error", (0,), ("a",), "rank 0 crashed: OSError: disk full", RUNG_TEARDOWN, False, 0.0)
    d, h = plan_next(history=h, fault=other, **PLAN | {"report": nothing})
    assert isinstance(d, Relaunch)


NO_TORCH = "PreflightError: the job's interpreter /usr/bin/python cannot import torch, so every rank would fail"


@pytest.mark.parametrize("b, kind, said", [
    # the node's agent refused the command before it started a rank: its own line says why
    (NodeStatus("b", 0, NodeState.EXITED, exit_code=EXIT_PREFLIGHT, output_error=NO_TORCH), "preflight_failed",
     f"node b: {NO_TORCH}"),
    # its line unread (the log gone): the check is still named
    (NodeStatus("b", 0, NodeState.EXITED, exit_code=EXIT_PREFLIGHT), "preflight_failed",
     f"node b: its check of the command failed (exit code {EXIT_PREFLIGHT})"),
    # the same code where the agent names a rank that ran and ended with it: that rank's exit
    (NodeStatus("b", 0, NodeState.EXITED, exit_code=EXIT_PREFLIGHT,
                failures=(RankFailure(1, EXIT_PREFLIGHT, "", True),)), "rank_exit", ""),
    # the agent's ordinary failure code, whatever its last line: a plain exit, restarted
    (NodeStatus("b", 0, NodeState.EXITED, exit_code=1, output_error=NO_TORCH), "rank_exit", ""),
])
def test_a_nodes_failed_preflight_stops_the_job_on_its_first_attempt(b, kind, said):
    assert EXIT_PREFLIGHT not in RANK_EXITS and "preflight_failed" in FAULT_KINDS
    f = classify({"a": node("a"), "b": b}, [], **KW)
    assert f.kind == kind and f.nodes == ("b",)
    h = History()
    d, h = plan_next(history=h, fault=f, **PLAN | {"report": RestoreReport()})
    if said:
        assert f.detail == said
        assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_STARTUP_FAILURE and EXIT_CODES[d.phase] == 8
        assert said in d.reason and h.restarts == 0  # at once: no restart spent, none planned
    else:
        assert isinstance(d, Relaunch)


@pytest.mark.parametrize("available, lo, hi, nproc, sizes, multiple, want", [
    (3, 1, 3, 1, (), 1, 3),
    (3, 1, 3, 1, (1, 2, 4, 8), 1, 2),      # global batch 16: 3 ranks do not divide it, 2 do
    (3, 1, 3, 2, (), 4, 2),                # 2 per node, a multiple of 4: 4 ranks on 2 nodes
    (1, 2, 3, 1, (), 1, None),             # below min
    (3, 3, 3, 1, (2, 4), 1, None),         # nothing accepted in range
])
def test_the_gang_is_the_largest_with_an_accepted_world_size(available, lo, hi, nproc, sizes, multiple, want):
    assert gang_size(available, lo, hi, nproc, sizes, multiple) == want


def test_a_relaunch_after_a_lost_node_picks_an_accepted_world_size():
    h = History()
    kw = PLAN | {"slots": ["a", "b", "c", "d"], "previous_nodes": ["a", "b", "c", "d"], "nodes_max": 4,
                 "world_sizes": (1, 2, 4, 8)}
    d, h = plan_next(history=h, fault=fault("node_lost", nodes=("d",), node_failure=True), **kw)
    assert d.nodes == ("a", "b")  # 3 healthy nodes; 3 is not an accepted world size, 2 is
    d, _ = plan_next(history=History(), fault=fault("node_lost", nodes=("d",), node_failure=True),
                  **kw | {"world_sizes": (4,)})
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_NO_CAPACITY and "world size" in d.reason


# ------------------------------------------------------------------------------ the contract with the ranks
def test_the_rank_exit_codes_and_restart_phases_keep_their_wire_values():
    # on the wire, in events and in metric labels: a rename or renumbering breaks dashboards,
    # alerts and ranks of an older SDK, so it must be a deliberate change of this table
    assert RANK_EXITS == {17: "crash", 18: "nonfinite", 143: "preempted"}
    assert RESTART_PHASES == ("detect", "teardown", "schedule", "rendezvous", "restore", "first_step")


@pytest.mark.parametrize("code", sorted(RANK_EXITS))
def test_every_rank_exit_code_is_classified_as_its_own_fault_kind(code):
    kind = RANK_EXITS[code]
    assert kind in FAULT_KINDS  # a restart for it is counted under a label exported from the start
    # from the rank's own exit code (the agent's error file) ...
    assert name_rank_failure(1, code, "", 5)[0] == kind
    f = classify({"a": node("a"), "b": failed_node("b", RankFailure(1, code, "", True))}, [], **KW)
    assert f.kind == kind
    # ... and from the agent's exit code alone
    assert classify({"a": node("a"), "b": node("b", NodeState.EXITED, code)}, [], **KW).kind == kind


@pytest.mark.parametrize("code", [1, 2, 3, 16, 19, 137, 142, 144])
def test_an_exit_code_outside_the_contract_is_a_plain_rank_exit(code):
    assert code not in RANK_EXITS
    assert name_rank_failure(1, code, "", 5)[0] == "rank_exit"
    assert classify({"a": node("a"), "b": node("b", NodeState.EXITED, code)}, [], **KW).kind == "rank_exit"


def test_the_restart_timer_has_one_mark_per_restart_phase_in_order():
    marks = [10.0 + i * i for i in range(len(RESTART_PHASES) + 1)]  # fault, then the end of each phase
    t = RestartTimer(0, "crash", *marks)
    assert tuple(t.durations()) == RESTART_PHASES and RestartTimer.PHASES == RESTART_PHASES
    assert list(t.durations().values()) == [b - a for a, b in zip(marks, marks[1:])]
    assert t.done and t.total(1e9) == marks[-1] - marks[0]
    # a restart still under way reports the phases it finished, a prefix of the same names
    assert tuple(RestartTimer(0, "crash", *marks[:4]).durations()) == RESTART_PHASES[:3]


# ------------------------------------------------------------------ restarts in place

def agent(name, exited=(), state=NodeState.RUNNING, stopped=False):
    return NodeStatus(name=name, attempt=0, state=state, stopped=stopped, exited_pids=tuple(exited))


PIDS = {0: 100, 1: 101}
IP = dict(now=50.0, rank_pids=PIDS, rank_nodes=RN)


@pytest.mark.parametrize("nodes, extra, kind, ranks", [
    # nothing ended, nobody ahead: no fault
    ({"a": agent("a"), "b": agent("b")}, {}, None, None),
    # an old attempt's pid (not a rank of this attempt) says nothing
    ({"a": agent("a"), "b": agent("b", exited=[77])}, {}, None, None),
    # rank 1's process ended under its running agent
    ({"a": agent("a"), "b": agent("b", exited=[101])}, {}, "rank_exit", (1,)),
    # both ended: the one that only lost a peer is not the culprit
    ({"a": agent("a", exited=[100]), "b": agent("b", exited=[101])}, {"failed_ranks": {0: True}}, "rank_exit", (1,)),
    # the culprit said why
    ({"a": agent("a"), "b": agent("b", exited=[101])},
     {"failed_ranks": {1: False}, "failed_errors": {1: "ValueError: bad batch"}}, "rank_error", (1,)),
    # a non-finite loss: every rank stops; the rank whose loss it was is named
    ({"a": agent("a", exited=[100]), "b": agent("b", exited=[101])}, {"nonfinite_ranks": [0]}, "nonfinite", (0,)),
    # a rank that said it was done and exited has finished
    ({"a": agent("a"), "b": agent("b", exited=[101])}, {"done_ranks": {1}}, None, None),
    # an exited agent is the classic path's (classify), not this one's
    ({"a": agent("a"), "b": agent("b", exited=[101], state=NodeState.EXITED)}, {}, None, None),
    # no process view (Kubernetes): ranks of the next attempt already report in
    ({"a": agent("a"), "b": agent("b")}, {"ahead_attempt": 1, "failed_ranks": {0: True, 1: False}}, "rank_exit", (1,)),
])
def test_a_restart_in_place_is_seen_from_the_ranks_that_ended_or_the_ranks_ahead(nodes, extra, kind, ranks):
    fault = restarted_in_place(nodes, **IP, **extra)
    if kind is None:
        assert fault is None
    else:
        assert (fault.kind, fault.ranks, fault.rung, fault.node_failure) == (kind, ranks, RUNG_IN_PLACE, False), fault
        assert "in place" in fault.detail


def told(name, *ends, state=NodeState.RUNNING, ours=False):
    """A node whose agent recorded how its ranks ended: ``ends`` are (pid, exit status), in order."""
    return NodeStatus(name=name, attempt=0, state=state, killed_by_us=ours,
                      exited_pids=tuple(pid for pid, _ in ends),
                      exit_codes=tuple((pid, code, 1000.0 + i) for i, (pid, code) in enumerate(ends)))


OWN = {"failed_ranks": {1: False}}  # rank 1's last heartbeat said it failed on its own error


@pytest.mark.parametrize("nodes, extra, kind, ranks, detail", [
    # nothing ended: no fault
    ({"a": told("a"), "b": told("b")}, {}, None, None, None),
    # rank 1 SIGKILLed under its running agent: named at once (no last words to wait for)
    ({"a": told("a"), "b": told("b", (101, -9))}, {}, "rank_killed", (1,), "rank 1 killed by signal 9 (SIGKILL) at step 41"),
    # a failure code once its own last words are in, named from them
    ({"a": told("a"), "b": told("b", (101, 1))}, {**OWN, "failed_errors": {1: "ValueError: bad"}},
     "rank_error", (1,), "rank 1 crashed at step 41: ValueError: bad"),
    ({"a": told("a"), "b": told("b", (101, 3))}, OWN, "rank_exit", (1,), "rank 1 exited with code 3 at step 41"),
    ({"a": told("a"), "b": told("b", (101, 17))}, OWN, "crash", (1,), "rank 1 crashed (exit 17) at step 41"),
    # ... and not before (they may be on their way, or lost): the agent's exit tells then
    ({"a": told("a"), "b": told("b", (101, 3))}, {}, None, None, None),
    # the victim that said a peer broke it is not the culprit; the SIGKILLed one is
    ({"a": told("a", (100, 1)), "b": told("b", (101, -9))}, {"failed_ranks": {0: True}}, "rank_killed", (1,), None),
    # only the victim so far: wait (its culprit shows, or the agents' exits tell)
    ({"a": told("a", (100, 1)), "b": told("b")}, {"failed_ranks": {0: True}}, None, None, None),
    # a sibling SIGTERMed by its agent stopping the others is not the culprit, though it ended first
    ({"a": told("a", (100, -15), (101, 5))}, {**OWN, "rank_nodes": {0: "a", 1: "a"}}, "rank_exit", (1,), None),
    # of two of a kind, the earlier one
    ({"a": told("a", (100, -9)), "b": told("b", (101, -9))}, {}, "rank_killed", (0,), None),
    # finished, preempted (the gang may still be writing its emergency checkpoint), done (an agreed
    # non-finite loss: every rank closes its SDK, then exits 18): not early
    ({"a": told("a"), "b": told("b", (101, 0))}, {}, None, None, None),
    ({"a": told("a"), "b": told("b", (101, 143))}, OWN, None, None, None),
    ({"a": told("a", (100, 18)), "b": told("b", (101, 18))}, {"done_ranks": {0, 1}, "nonfinite_ranks": [1]},
     None, None, None),
    # a pid that is no rank of this gang (an earlier generation's) says nothing
    ({"a": told("a"), "b": told("b", (77, -9))}, {}, None, None, None),
    # an agent that exited or vanished on its own is a node failure: classify's, and it wins
    ({"a": told("a"), "b": told("b", (101, -9), state=NodeState.EXITED)}, {}, None, None, None),
    ({"a": told("a", state=NodeState.LOST), "b": told("b", (101, -9))}, {}, None, None, None),
    # nodes we are killing are the teardown's business
    ({"a": told("a"), "b": told("b", (101, -9), ours=True)}, {}, None, None, None),
])
def test_a_rank_that_ended_is_a_fault_before_its_agent_exits(nodes, extra, kind, ranks, detail):
    args = {"now": 50.0, "rank_pids": PIDS, "rank_nodes": RN, "rank_steps": {0: 41, 1: 41}, **extra}
    fault = rank_ended(nodes, **args)
    if kind is None:
        assert fault is None
        return
    assert (fault.kind, fault.ranks, fault.rung, fault.node_failure, fault.step) == (kind, ranks, RUNG_TEARDOWN, False, 41)
    assert fault.nodes == (args["rank_nodes"][ranks[0]],)
    if detail is not None:
        assert fault.detail == detail


@pytest.mark.parametrize("code, last_words", [(-9, ""), (-11, ""), (1, "ValueError: bad batch"), (17, "RuntimeError: x"),
                                              (3, "")])
def test_a_rank_end_told_early_is_named_as_its_agents_exit_names_it(code, last_words):
    """The same end seen twice: from the agent's record while it runs (rank_ended), and from its
    exit ~1 s later (classify, the rank's failure read from the agent's summary)."""
    said = {} if code < 0 else {"failed_ranks": {1: False}, "failed_errors": {1: last_words}}
    early = rank_ended({"a": told("a"), "b": told("b", (101, code))}, now=50.0, rank_pids=PIDS, rank_nodes=RN,
                       rank_steps={0: 41, 1: 41}, **said)
    exited = NodeStatus(name="b", attempt=0, state=NodeState.EXITED, exit_code=1,
                        failures=(RankFailure(1, code, last_words, True),))
    late = classify({"a": node("a"), "b": exited}, [], **{**KW, "now": 50.0}, rank_steps={0: 41, 1: 41}, **said)
    assert early is not None and late is not None
    assert (early.kind, early.ranks, early.nodes, early.detail, early.step, early.rung, early.node_failure) == \
        (late.kind, late.ranks, late.nodes, late.detail, late.step, late.rung, late.node_failure)


SAME = Relaunch(("a", "b"), "step-0000000010", ())
RUNNING = {"a": agent("a"), "b": agent("b")}


def ip_fault(kind="rank_exit", rung=RUNG_IN_PLACE, node_failure=False):
    return Fault(kind, (1,), ("b",), "x", rung, node_failure, 1.0)


@pytest.mark.parametrize("change, why", [
    ({}, ""),
    ({"fault": ip_fault("hang", RUNG_ABORT)}, ""),  # a live culprit obeys the abort, then its agent restarts it
    ({"allowed": 0}, "off"),
    ({"used": 2}, "spent"),
    ({"last_failed": True}, "did not come back"),
    ({"fault": ip_fault("dead", RUNG_KILL_NODE)}, "silent rank"),
    # a platform that can kill the silent rank's process (its agent healthy) restarts it in place
    ({"fault": ip_fault("dead", RUNG_KILL_NODE), "kills_ranks": True}, ""),
    # not when its node is frozen with it
    ({"fault": ip_fault("dead", RUNG_KILL_NODE), "kills_ranks": True,
      "nodes": {"a": agent("a"), "b": agent("b", stopped=True)}}, "not running: b"),
    ({"fault": ip_fault("node_lost", RUNG_TEARDOWN, True)}, "needs a new gang"),
    ({"fault": ip_fault("preempted", RUNG_TEARDOWN)}, "needs a new gang"),
    ({"decision": Stop(JobPhase.STOPPED_NO_PROGRESS, "no progress")}, "the job stops"),
    ({"nodes": {"a": agent("a"), "b": agent("b", state=NodeState.EXITED)}}, "not running: b"),
    ({"nodes": {"a": agent("a"), "b": agent("b", stopped=True)}}, "not running: b"),
    ({"decision": Relaunch(("a", "c"), "step-0000000010", ())}, "differs"),
    ({"decision": Relaunch(("a", "b"), "step-0000000010", (), newly_excluded=("x",))}, "excluded"),
    ({"decision": Relaunch(("a", "b"), "step-0000000010", (), skip_steps=(12,))}, "skipped"),
])
def test_the_cheap_rung_is_taken_only_when_the_same_gang_may_go_on(change, why):
    args = dict(fault=ip_fault(), decision=SAME, nodes=RUNNING, previous_nodes=["a", "b"], allowed=2, used=0,
                skip_steps=[]) | change
    got = in_place_ok(**args)
    assert (got == "") if not why else (why in got), got


# ---------------------------------------------------------------- evidence: whose stacks are waited for
_ASKED = {0: ("compute", 9.5), 1: ("compute", 9.6), 2: ("collective", 9.7), 3: ("failed", 9.8), 4: ("done", 9.9),
          5: ("compute", 7.0)}  # 5: last heard 3 s ago


@pytest.mark.parametrize("kind, ranks, rung, awaited", [
    # a hung culprit (rung 1) still answers: its stacks matter most
    ("hang", (1,), RUNG_ABORT, {0, 1, 2}),
    ("collective_hang", (1,), RUNG_ABORT, {0, 1, 2}),
    # a silent rank (rung 2) or a rank / node gone (rung 3) cannot answer
    ("dead", (1,), RUNG_KILL_NODE, {0, 2}),
    ("rank_killed", (1,), RUNG_TEARDOWN, {0, 2}),
    ("node_lost", (0, 1), RUNG_TEARDOWN, {2}),
    # a rank whose process ended under a running agent (rung 0: restarted in place) is gone too
    ("rank_exit", (1,), RUNG_IN_PLACE, {0, 2}),
])
def test_the_evidence_waits_only_for_ranks_that_can_answer(kind, ranks, rung, awaited):
    fault = Fault(kind, ranks, ("node0",), "", rung, False, 9.0)
    # never a rank that ended (failed, done), nor one not heard from within fresh_s
    assert evidence_awaited(fault, _ASKED, now=10.0, fresh_s=1.0) == awaited
    assert evidence_awaited(fault, {}, now=10.0, fresh_s=1.0) == frozenset()


# ---------------------------------------------------------------- the escalation ladder
@pytest.mark.parametrize("rung, nodes, expected", [
    # a stuck rank is ordered to abort; if its node does not exit in time, the node is killed
    (RUNG_ABORT, ("node1",), [Rung(ACTION_ABORT, (1,), ("node1",), 5.0), Rung(ACTION_KILL_NODE, (), ("node1",)),
                              Rung(ACTION_TEAR_DOWN)]),
    # a silent rank cannot obey: its node is killed first
    (RUNG_KILL_NODE, ("node1",), [Rung(ACTION_KILL_NODE, (), ("node1",)), Rung(ACTION_TEAR_DOWN)]),
    (RUNG_KILL_NODE, (), [Rung(ACTION_TEAR_DOWN)]),  # no node known: nothing to kill alone
    # a node that failed, or ranks restarted in place that the controller did not let go on
    (RUNG_TEARDOWN, ("node1",), [Rung(ACTION_TEAR_DOWN)]),
    (RUNG_IN_PLACE, ("node1",), [Rung(ACTION_TEAR_DOWN)]),
])
def test_the_ladder_starts_at_the_faults_rung_and_always_ends_in_a_teardown(rung, nodes, expected):
    fault = Fault("hang", (1,), nodes, "", rung, False, 0.0)
    assert list(ladder(fault, abort_grace_s=5.0)) == expected


ABORT1 = Rung(ACTION_ABORT, ranks=(1,), nodes=("b",), wait_s=5.0)


@pytest.mark.parametrize("rung, nodes, worked", [
    (ABORT1, {"a": agent("a"), "b": agent("b")}, False),                         # nothing yet
    (ABORT1, {"a": agent("a"), "b": agent("b", state=NodeState.EXITED)}, True),  # its node's agent exited
    (ABORT1, {"a": agent("a"), "b": agent("b", exited=[101])}, True),            # the aborted rank ended
    (ABORT1, {"a": agent("a", exited=[100]), "b": agent("b")}, False),           # another rank ended, not it
    (ABORT1, {"a": agent("a"), "b": agent("b", exited=[77])}, False),            # an earlier generation's pid
    # a node killed (rung 2) has worked only when its agent is gone
    (Rung(ACTION_KILL_NODE, nodes=("b",), wait_s=5.0), {"b": agent("b", exited=[101])}, False),
    (Rung(ACTION_KILL_NODE, nodes=("b",), wait_s=5.0), {"b": agent("b", state=NodeState.LOST)}, True),
])
def test_a_rung_has_worked_when_its_nodes_are_gone_or_the_ranks_it_aborted_ended(rung, nodes, worked):
    assert rung_worked(rung, nodes, PIDS) is worked


@pytest.mark.parametrize("attempt,launched_as,in_place,expected", [
    (0, 0, 0, 1),   # a relaunch takes the next number
    (0, 0, 2, 3),   # above any number the running agents could still give a rank they restart in place
    (2, 0, 2, 3),   # restarted in place twice already: the next number is still above them
    (5, 5, 0, 6),
])
def test_the_next_attempt_number_is_above_every_one_the_old_gang_could_use(attempt, launched_as, in_place, expected):
    assert next_attempt(attempt, launched_as, in_place) == expected


@pytest.mark.parametrize("latest,at_start,had,steps,progressed", [
    (20, 10, True, 0, True),       # a newer checkpoint of ours
    (10, 10, True, 500, False),    # none: steps of an SDK-less rank do not count once the job has checkpoints
    (None, -1, False, 7, True),    # a script without the SDK and no checkpoint of ours: it took steps
    (None, -1, False, 0, False),   # ... and none: a crash before its first step
])
def test_progress_is_a_newer_checkpoint_or_for_a_script_without_the_sdk_steps_taken(latest, at_start, had, steps,
                                                                                    progressed):
    from supervisor.controller.decide import made_progress

    assert made_progress(latest_step=latest, step_at_start=at_start, had_checkpoint=had,
                         steps_without_sdk=steps) is progressed


@pytest.mark.parametrize("ranks, calibration_s, progress_s, stride", [
    (8, 2.0, 0.00006103515625, 1),
    (4_096, 2.0, 0.03125, 1),
    (4_097, 2.0, 4_097 / 131_072, 3),
    (16_384, 2.0, 0.125, 5),
    (131_072, 16.0, 1.0, 33),
])
def test_reads_over_every_rank_slow_down_with_the_gang(ranks, calibration_s, progress_s, stride):
    assert calibration_every_s(2.0, ranks) == calibration_s
    assert progress_every_s(ranks) == progress_s
    assert calibration_stride(ranks) == stride


@pytest.mark.parametrize("ranks, render_cpu_s, every_s", [
    (16_384, 0.0, 0.0),     # every scrape renders up to 16,384 ranks
    (16_384, 1.0, 0.0),     # however long a rendering took
    (65_536, 0.0, 2.0),     # beyond, in proportion to the gang
    (131_072, 0.01, 4.0),
    (131_072, 0.14, 7.0),   # and long enough that renderings take at most 2 % of a core
    (131_072, 0.5, 15.0),   # never older than a common scrape interval
])
def test_a_large_gang_s_metrics_rendering_is_served_again_for_a_while(ranks, render_cpu_s, every_s):
    from supervisor.controller.decide import metrics_every_s

    assert metrics_every_s(ranks, render_cpu_s) == pytest.approx(every_s)
