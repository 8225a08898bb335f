"""The pure decisions about what a real cluster says (issue: Kubernetes on a real cluster):
waiting for capacity, a node that cannot start, out of memory, a kubelet's admission reject.
Plain NodeStatus values in, a decision out: no platform, no clock."""

from __future__ import annotations

import pytest

from supervisor.controller.decide import (
    RUNG_TEARDOWN,
    CapacityWait,
    History,
    JobPhase,
    Relaunch,
    RestoreReport,
    Shrink,
    Stop,
    capacity,
    classify,
    grow,
    plan_next,
)
from supervisor.platforms.node.agent_output import RankFailure
from supervisor.platforms.base import WAIT_CANNOT_START, WAIT_CAPACITY, NodeState, NodeStatus

SCHED = "pod j-a0-c Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
RUN = NodeStatus("a", 0, NodeState.RUNNING)


def waits(name, why=SCHED):
    return NodeStatus(name, 0, NodeState.RUNNING, waiting=WAIT_CAPACITY, reason="Unschedulable", detail=why)


def gang(*nodes):
    return {n.name: n for n in nodes}


CAP = dict(wait_limit_s=900.0, shrink_after_s=60.0, nodes_min=3, nodes_max=3)


@pytest.mark.parametrize("nodes, waited, kw, expect", [
    # every pod placed (or on its way): nothing to decide
    (gang(RUN, NodeStatus("b", 0, NodeState.RUNNING)), 0.0, {}, None),
    # one pod cannot be placed: wait, quoting the scheduler
    (gang(RUN, NodeStatus("b", 0, NodeState.RUNNING), waits("c")), 10.0, {}, CapacityWait(("c",), ("a", "b"), SCHED)),
    # not elastic: waiting past the shrink grace changes nothing
    (gang(RUN, NodeStatus("b", 0, NodeState.RUNNING), waits("c")), 120.0, {}, CapacityWait(("c",), ("a", "b"), SCHED)),
    # past the limit: stop, naming how many and why
    (gang(RUN, waits("b"), waits("c")), 900.0, {}, Stop(JobPhase.STOPPED_NO_CAPACITY, "")),
    # elastic, past the grace: the pods that were placed, in launch order
    (gang(RUN, NodeStatus("b", 0, NodeState.RUNNING), waits("c")), 60.0, {"nodes_min": 1},
     Shrink(("a", "b"), "")),
    # elastic, before the grace: wait
    (gang(RUN, waits("b"), waits("c")), 59.0, {"nodes_min": 1}, CapacityWait(("b", "c"), ("a",), SCHED)),
    # elastic, but fewer placed than nodes.min: wait (and stop at the limit)
    (gang(RUN, waits("b"), waits("c")), 61.0, {"nodes_min": 2}, CapacityWait(("b", "c"), ("a",), SCHED)),
    # elastic: a pod that ended is not placed (the fault is classify's)
    (gang(RUN, NodeStatus("b", 0, NodeState.EXITED, exit_code=1), waits("c")), 61.0, {"nodes_min": 1},
     Shrink(("a",), "")),
    # elastic, and the world size must be even: 3 placed of 4 relaunch as 2
    (gang(RUN, NodeStatus("b", 0, NodeState.RUNNING), NodeStatus("c", 0, NodeState.RUNNING), waits("d")), 61.0,
     {"nodes_min": 1, "nodes_max": 4, "world_size_multiple_of": 2}, Shrink(("a", "b"), "")),
])
def test_capacity(nodes, waited, kw, expect):
    got = capacity(nodes, waited_s=waited, **(CAP | kw))
    if isinstance(expect, (Stop, Shrink)):
        assert type(got) is type(expect)
        assert getattr(got, "phase", None) == getattr(expect, "phase", None)
        assert getattr(got, "nodes", None) == getattr(expect, "nodes", None)
        assert "Insufficient nvidia.com/gpu" in (got.reason if isinstance(got, (Stop, Shrink)) else "")
    else:
        assert got == expect


def test_a_pod_that_cannot_start_is_a_fault_at_once_and_stops_the_job():
    bad = NodeStatus("b", 0, NodeState.RUNNING, waiting=WAIT_CANNOT_START, reason="ErrImagePull",
                     detail='pod j-a0-b cannot start its container agent: ErrImagePull: failed to pull "nope:1"')
    f = classify(gang(RUN, bad), [], now=5.0, last_heard={}, phase_started={}, rank_nodes={0: "a", 1: "b"})
    assert (f.kind, f.nodes, f.rung, f.node_failure) == ("cannot_start", ("b",), RUNG_TEARDOWN, False)
    assert "failed to pull" in f.detail
    d, _ = plan_next(history=History(), fault=f, **PLAN)
    assert isinstance(d, Stop) and d.phase == JobPhase.STOPPED_STARTUP_FAILURE
    assert "ErrImagePull" in d.reason


PLAN = dict(made_progress=True, report=RestoreReport(), slots=["a", "b", "c"], previous_nodes=["a", "b"],
            nodes_min=2, nodes_max=2, max_restarts=10, guard_attempts=3, exclude_after=1, checkpoints=["step-0000000010"])


def oom_node(failures=()):
    return NodeStatus("b", 0, NodeState.EXITED, exit_code=-9, out_of_memory=True, reason="OOMKilled", host="n2",
                      detail="pod j-a0-b: container agent OOMKilled (exit code 137, memory limit 1Gi)",
                      failures=tuple(failures))


def test_an_oom_is_the_ranks_fault_not_the_machines_and_the_same_again_stops():
    f = classify(gang(RUN, oom_node()), [], now=5.0, last_heard={}, phase_started={}, rank_nodes={0: "a", 1: "b"},
                 rank_steps={0: 12, 1: 12})
    assert (f.kind, f.ranks, f.node_failure, f.step) == ("oom", (1,), False, 12)
    assert "rank 1 out of memory at step 12" in f.detail and "memory limit 1Gi" in f.detail
    h = History()
    first, h = plan_next(history=h, fault=f, **PLAN)
    assert isinstance(first, Relaunch) and first.newly_excluded == () and h.excluded == ()
    again, h = plan_next(history=h, fault=f, **PLAN)
    assert isinstance(again, Stop) and again.phase == JobPhase.STOPPED_OUT_OF_MEMORY
    assert "same rank ran out of memory at the same step" in again.reason


def test_an_oom_at_another_step_is_restarted_again():
    h = History()
    for step in (12, 20):
        f = classify(gang(RUN, oom_node()), [], now=5.0, last_heard={}, phase_started={},
                     rank_nodes={0: "a", 1: "b"}, rank_steps={1: step})
        d, h = plan_next(history=h, fault=f, **PLAN)
        assert isinstance(d, Relaunch)


def test_an_oom_names_the_rank_the_agent_names():
    killed = RankFailure(rank=3, exit_code=-9, error="", root_cause=True)
    f = classify(gang(RUN, oom_node([killed])), [], now=5.0, last_heard={}, phase_started={},
                 rank_nodes={0: "a", 2: "b", 3: "b"}, rank_steps={3: 7})
    assert (f.kind, f.ranks, f.step) == ("oom", (3,), 7)


def test_a_kubelets_admission_reject_excludes_its_machine_at_once():
    rejected = NodeStatus("b", 0, NodeState.LOST, bad_host=True, host="n2", reason="UnexpectedAdmissionError",
                          detail="pod j-a0-b rejected by node n2: UnexpectedAdmissionError: Allocate failed")
    f = classify(gang(RUN, rejected), [], now=5.0, last_heard={}, phase_started={}, rank_nodes={0: "a", 1: "b"})
    assert (f.kind, f.node_failure, f.exclude_now) == ("node_rejected", True, True)
    h = History()
    d, h = plan_next(history=h, fault=f, **(PLAN | {"exclude_after": 3}), hosts={"b": "n2"})
    assert isinstance(d, Relaunch)
    assert d.newly_excluded == ("n2",) and h.excluded == ("n2",)


def test_an_evicted_pod_is_lost_not_a_bad_node():
    evicted = NodeStatus("b", 0, NodeState.LOST, host="n2", reason="Evicted",
                         detail="pod j-a0-b Evicted: The node was low on resource: memory.")
    f = classify(gang(RUN, evicted), [], now=5.0, last_heard={}, phase_started={}, rank_nodes={0: "a", 1: "b"})
    assert (f.kind, f.node_failure, f.exclude_now) == ("node_lost", False, False)
    assert "low on resource" in f.detail


@pytest.mark.parametrize("current, returned, kw, expect", [
    (("a", "b"), ("c",), {}, ("a", "b", "c")),             # the running nodes first, then the returned one
    (("a", "b"), (), {}, None),                             # nothing came back
    (("a", "b", "c"), ("d",), {}, None),                    # already at nodes.max
    (("a", "b"), ("c",), {"excluded": ("c",)}, None),       # an excluded machine never comes back
    (("a", "b"), ("c", "d"), {"nodes_max": 4, "world_size_multiple_of": 2}, ("a", "b", "c", "d")),
    (("a", "b"), ("c",), {"nodes_max": 4, "world_size_multiple_of": 2}, None),  # 3 is not a size the job accepts
])
def test_grow(current, returned, kw, expect):
    assert grow(current, returned, **({"nodes_min": 1, "nodes_max": 3} | kw)) == expect
