"""The release decisions (supervisor.controller.releases), as tables: plain data in, a ledger
and what to tell out. And the plan after a rejected release (decide.plan_next)."""

from __future__ import annotations

import pytest

from supervisor.controller import releases as rel
from supervisor.controller.decide import Fault, History, Relaunch, RestoreReport, Stop, plan_next

POLICY = rel.Policy(probation_steps=20)


def version(vid: str, *cmd: str) -> rel.Version:
    return rel.Version(vid, {"command": vid}, tuple(cmd) or ("python", f"{vid}.py"))


V1, V2, V3 = version("aaaaaaaaaaa1"), version("aaaaaaaaaaa2"), version("aaaaaaaaaaa3")


def ledger(*entries: tuple[rel.Version, str, float], current: rel.Version | None = None) -> rel.Ledger:
    return rel.Ledger({v.id: rel.Release(v, state, t, t) for v, state, t in entries},
                      current.id if current else (entries[-1][0].id if entries else ""))


# ---------------------------------------------------------------------------- a version arrives
def test_the_first_version_of_a_job_is_a_release_on_probation():
    out, told = rel.arrive(rel.Ledger(), V1, now_unix=100.0, policy=POLICY)
    assert out.current == V1.id and out.get(V1.id).state == rel.PROBATION
    assert told.event == "release_started" and told.fields["previous"] is None


def test_a_known_version_goes_on_where_it_was_without_an_event():
    start = ledger((V1, rel.KNOWN_GOOD, 1.0))
    out, told = rel.arrive(start, V1, now_unix=100.0, policy=POLICY)
    assert told is None and out == start


def test_another_version_is_a_release_naming_the_previous_one():
    out, told = rel.arrive(ledger((V1, rel.KNOWN_GOOD, 1.0)), V2, now_unix=100.0, policy=POLICY)
    assert out.current == V2.id and told.fields["previous"] == V1.id and out.get(V1.id).state == rel.KNOWN_GOOD


@pytest.mark.parametrize("rollback, runs, event", [
    (True, V1.id, "release_still_rejected"),   # the rejected version is not tried again
    (False, V2.id, None),                      # release.rollback: false: as before, it runs
])
def test_a_rejected_version_asked_again_gives_way_to_the_known_good_one(rollback, runs, event):
    start = ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.REJECTED, 2.0), current=V1)
    out, told = rel.arrive(start, V2, now_unix=100.0, policy=rel.Policy(rollback=rollback))
    assert out.current == runs and (told.event if told else None) == event


@pytest.mark.parametrize("arrives, kept", [
    (V2, True),    # the controller came back to the same version: its teardown and rollback go on
    (V3, False),   # another version was released meanwhile: V2's verdict is stale, V2 stays on probation
])
def test_a_pending_rejection_outlives_a_controller_only_for_the_version_that_runs(arrives, kept):
    start = rel.Ledger({V1.id: rel.Release(V1, rel.KNOWN_GOOD, 1.0, 1.0),
                        V2.id: rel.Release(V2, rel.PROBATION, 2.0, 2.0)}, V2.id,
                       pending=rel.Reject(V2.id, "startup_failure", "it failed before its first step", V1.id))
    out, _ = rel.arrive(start, arrives, now_unix=100.0, policy=POLICY)
    assert (out.pending is not None) == kept and out.current == arrives.id
    assert out.get(V2.id).state == rel.PROBATION  # a verdict not carried out rejects nothing


def test_an_allowed_version_is_on_probation_again():
    start = ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.REJECTED, 2.0), current=V1)
    allowed = rel.allow(start, V2.id, now_unix=50.0)
    assert allowed.get(V2.id).state == rel.PROBATION and allowed.get(V2.id).allowed
    out, told = rel.arrive(allowed, V2, now_unix=100.0, policy=POLICY)
    assert out.current == V2.id and told is None
    assert rel.allow(start, V1.id, now_unix=50.0) == start  # only a rejected one is allowed


# ---------------------------------------------------------------------------- probation
@pytest.mark.parametrize("steps, finite, state", [
    (19, True, rel.PROBATION), (20, True, rel.KNOWN_GOOD), (35, False, rel.PROBATION),
])
def test_probation_ends_after_its_steps_with_a_finite_loss(steps, finite, state):
    out, told = rel.trained(ledger((V1, rel.PROBATION, 1.0)), steps, finite=finite, now_unix=9.0, policy=POLICY)
    assert out.get(V1.id).state == state and out.get(V1.id).steps == steps
    assert (told is not None) == (state == rel.KNOWN_GOOD)


def test_steps_are_the_most_in_one_attempt():
    start = ledger((V1, rel.PROBATION, 1.0))
    once, _ = rel.trained(start, 12, finite=True, now_unix=9.0, policy=POLICY)
    again, told = rel.trained(once, 5, finite=True, now_unix=9.0, policy=POLICY)  # a resume went back
    assert again is once and told is None


# ---------------------------------------------------------------------------- judging a fault
@pytest.mark.parametrize("kind, step, stepped, node_failure, reason", [
    ("rank_error", None, False, False, "startup_failure"),    # dies at import
    ("cannot_start", None, False, False, "startup_failure"),  # an image that cannot be pulled
    ("rank_exit", 3, True, False, None),                       # after a step: once is not enough
    ("nonfinite", 25, True, False, "nonfinite"),
    ("node_lost", None, False, True, None),                    # not its doing
    ("preempted", 4, True, False, None),
    ("rank_killed", None, False, True, None),
])
def test_a_fault_rejects_a_version_on_probation_only_when_it_is_its_own(kind, step, stepped, node_failure, reason):
    out, verdict = rel.judge(ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.PROBATION, 2.0)), kind=kind, detail="d",
                             step=step, stepped=stepped, node_failure=node_failure, policy=POLICY)
    assert (verdict.reason if verdict else None) == reason
    assert out.pending == verdict and (verdict is None or verdict.to == V1.id)


def test_with_nothing_to_go_back_to_a_version_is_not_rejected_but_the_verdict_is_said():
    start = ledger((V2, rel.PROBATION, 2.0))
    out, verdict = rel.judge(start, kind="rank_error", detail="d", step=None, stepped=False, node_failure=False,
                             policy=POLICY)
    assert verdict.reason == "startup_failure" and verdict.to == "" and out.pending is None
    base = rel.Version(rel.BASELINE, {"baseline": "x"}, ("python", "base.py"))
    out, verdict = rel.judge(start, kind="rank_error", detail="d", step=None, stepped=False, node_failure=False,
                             policy=rel.Policy(baseline=base))
    assert verdict.to == rel.BASELINE and out.pending == verdict


def test_twice_at_the_same_step_rejects_it():
    start = ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.PROBATION, 2.0))
    once, first = rel.judge(start, kind="crash", detail="d", step=7, stepped=True, node_failure=False, policy=POLICY)
    assert first is None and once.get(V2.id).fault_steps == (7,)
    other, _ = rel.judge(once, kind="crash", detail="d", step=9, stepped=True, node_failure=False, policy=POLICY)
    _, second = rel.judge(other, kind="hang", detail="d", step=7, stepped=True, node_failure=False, policy=POLICY)
    assert second.reason == "repeated_fault" and "step 7" in second.why


@pytest.mark.parametrize("state, policy", [(rel.KNOWN_GOOD, POLICY), (rel.PROBATION, rel.Policy(rollback=False))])
def test_a_known_good_version_or_rollback_off_is_never_rejected(state, policy):
    _, verdict = rel.judge(ledger((V2, state, 2.0)), kind="rank_error", detail="d", step=None, stepped=False,
                           node_failure=False, policy=policy)
    assert verdict is None


# ---------------------------------------------------------------------------- what it goes back to
def test_the_target_is_the_newest_known_good_then_the_baseline_then_nothing():
    base = rel.Version(rel.BASELINE, {"baseline": "x"}, ("python", "base.py"))
    many = ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.KNOWN_GOOD, 5.0), (V3, rel.PROBATION, 6.0))
    assert rel.rollback_target(many, V3.id, POLICY) == V2
    alone = ledger((V3, rel.PROBATION, 6.0))
    assert rel.rollback_target(alone, V3.id, rel.Policy(baseline=base)) == base
    assert rel.rollback_target(alone, V3.id, POLICY) is None


def test_a_rollback_rejects_runs_the_target_counts_and_clears_the_pending_verdict():
    start, verdict = rel.judge(ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.PROBATION, 2.0)), kind="nonfinite",
                               detail="loss nan", step=23, stepped=True, node_failure=False, policy=POLICY)
    out, told = rel.roll_back(start, verdict, V1, now_unix=9.0)
    assert out.current == V1.id and out.get(V2.id).state == rel.REJECTED and out.pending is None
    assert out.rollbacks == 1 and out.rollback_reasons == {"nonfinite": 1}
    assert told.fields["from"] == V2.id and told.fields["to"] == V1.id and "step 23" in told.fields["why"]
    assert rel.settle(start).pending is None


def test_checkpoints_a_rejected_version_wrote_are_not_restorable():
    led = ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.REJECTED, 2.0), current=V1)
    ckpts = ["step-0000000030", "step-0000000028", "step-0000000024", "step-0000000010"]
    writers = {"step-0000000030": V2.id, "step-0000000028": V2.id, "step-0000000024": V1.id}
    # step 10 names no release (written before releases were recorded): kept
    assert rel.restorable(ckpts, writers, led) == ["step-0000000024", "step-0000000010"]


def test_a_ledger_survives_its_saved_form():
    led, _ = rel.judge(ledger((V1, rel.KNOWN_GOOD, 1.0), (V2, rel.PROBATION, 2.0)), kind="rank_error", detail="d",
                       step=None, stepped=False, node_failure=False, policy=POLICY)
    led = rel.wrote(led, V1.id, "step-0000000004")
    assert rel.Ledger.from_saved(led.to_saved()) == led


@pytest.mark.parametrize("broken, field", [
    ({"format": 2}, "format"),
    ({"format": 1, "releases": [{"id": "0123456789ab", "command": []}]}, "command"),
    ({"format": 1, "releases": [], "current": "nope"}, "current"),
    ({"format": 1, "releases": [{"id": "0123456789ab", "command": ["p"], "state": "maybe"}]}, "state"),
    # an id names a folder under LOG_DIR/releases: nothing but a version id is taken
    ({"format": 1, "releases": [{"id": "../../etc", "command": ["p"], "state": "known_good"}]}, r"releases\[0\]\.id"),
    ({"format": 1, "releases": [{"id": "0123456789ab\n", "command": ["p"], "state": "known_good"}]}, "id"),
])
def test_a_ledger_that_is_not_one_is_a_ledger_error_naming_the_field(broken, field):
    with pytest.raises(rel.LedgerError, match=field):
        rel.Ledger.from_saved(broken)


# ---------------------------------------------------------------------------- the plan after a rejection
def plan(fault: Fault, **kw):
    args = dict(history=History(had_checkpoint=True), fault=fault, made_progress=False,
                report=RestoreReport(state="restored", restored="step-0000000024"), slots=["n0", "n1"],
                previous_nodes=["n0", "n1"], nodes_min=2, nodes_max=2, max_restarts=5, guard_attempts=1,
                exclude_after=2, checkpoints=["step-0000000024"])
    return plan_next(**(args | kw))


@pytest.mark.parametrize("kind", ["cannot_start", "rank_error"])
def test_a_rejected_release_is_relaunched_where_the_job_would_have_stopped(kind):
    fault = Fault(kind, (0,), ("n0",), "no module named x", 3, False, 0.0)
    stopped, _ = plan(fault)
    assert isinstance(stopped, Stop)  # the guard (1 attempt without progress), or a job that cannot start
    back, history = plan(fault, release_rejected=True)
    assert isinstance(back, Relaunch) and back.restore_from == "step-0000000024"
    assert history.attempts_without_progress == 0 and history.startup_failure == ""


def test_a_rejected_release_s_nan_is_not_the_job_s():
    fault = Fault("nonfinite", (0,), ("n0",), "nan", 3, False, 0.0, step=27)
    _, history = plan(fault, release_rejected=True, guard_attempts=3)
    assert history.nonfinite_steps == ()
    _, plain = plan(fault, guard_attempts=3)
    assert plain.nonfinite_steps == (27,)
