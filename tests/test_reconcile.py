"""What a look at the gang decides (supervisor.controller.reconcile), told as stories with a fake
clock: the nodes and the ranks' last heartbeats in, the memory and a verdict out. No process."""

from __future__ import annotations

import pytest

from supervisor.controller.decide import Shrink, Stop
from supervisor.controller.reconcile import (
    Calibration,
    CapacityPolicy,
    Detection,
    Look,
    Memory,
    Placed,
    Policy,
    Reported,
    Running,
    SavesTo,
    Waiting,
    calibrated,
    ended,
    ended_ranks,
    fault,
    placement,
    started,
)
from supervisor.health import Registry, Timeouts
from supervisor.model import NodeState, NodeStatus
from supervisor.protocol import Heartbeat

POLICY = Policy(heartbeat_timeout_s=3.0, in_place_timeout_s=20.0, secondary_grace_s=2.0)
TIMEOUTS = Timeouts(heartbeat_s=3.0, startup_s=60.0, checkpoint_s=60.0)
RUNNING = {"n0": NodeStatus("n0", 0, NodeState.RUNNING), "n1": NodeStatus("n1", 0, NodeState.RUNNING)}


def hb(rank, **kw):
    return Heartbeat(**(dict(job="j", attempt=0, rank=rank, world_size=2, seq=kw.pop("seq", 1), step=10,
                             phase="compute", phase_s=0.1, node=f"n{rank}", pid=100 + rank) | kw))


def registry(*beats, at=100.0):
    reg = Registry(0, 2)
    for b in beats:
        reg.observe(b, at)
    return reg


def look(now, nodes, reg, **kw):
    return Look(now=now, nodes=nodes, registry=reg, attempt=0, gang=("n0", "n1"), timeouts=TIMEOUTS,
                **{"launched_at": 99.0} | kw)


def exited(name, code, **kw):
    return NodeStatus(name, 0, NodeState.EXITED, code, **kw)


def test_a_gang_whose_ranks_finished_and_agents_exited_0_completes():
    reg = registry(hb(0, phase="done", outcome="finished"), hb(1, phase="done", outcome="finished"))
    mem, done = ended(Memory(), look(101, {"n0": exited("n0", 0), "n1": exited("n1", 0)}, reg), POLICY)
    assert done is not None and done.missing == () and done.heard and mem.agents_ended_at == 101


def test_a_last_word_lost_on_the_way_completes_after_the_grace_naming_the_rank():
    reg = registry(hb(0, phase="done", outcome="finished"), hb(1, step=39))
    nodes = {"n0": exited("n0", 0), "n1": exited("n1", 0)}
    mem, done = ended(Memory(), look(101, nodes, reg), POLICY)
    assert done is None and mem.agents_ended_at == 101  # rank 1's "done" may still be on its way
    mem, done = ended(mem, look(102.6, nodes, reg), POLICY)  # past half the heartbeat timeout
    assert done is not None and done.missing == (1,)
    # an agent running again (a node that came back) forgets when they ended
    assert ended(mem, look(103, RUNNING, reg), POLICY)[0].agents_ended_at is None


def test_nothing_is_wrong_while_every_rank_beats_and_every_node_runs():
    mem, found, findings = fault(Memory(), look(101, RUNNING, registry(hb(0), hb(1))), POLICY)
    assert found is None and findings == [] and mem == Memory()


def test_a_rank_that_lost_a_peer_waits_for_the_culprit_and_is_named_only_after_the_grace():
    # rank 0 failed because its peer broke the collective; rank 1 (the culprit) still looks alive
    reg = registry(hb(0, phase="failed", error="peer closed", error_peer=True), hb(1))
    nodes = RUNNING | {"n0": exited("n0", 1)}
    mem, found, _ = fault(Memory(), look(101, nodes, reg), POLICY)
    assert found is None and mem.secondary_since == 101
    reg.observe(hb(1, seq=2), 103.5)  # the culprit still beats
    mem, found, _ = fault(mem, look(103.9, nodes, reg), POLICY)
    assert found is None  # the grace is the heartbeat timeout + 1 s: a silent culprit is seen by then
    reg.observe(hb(1, seq=3), 105.0)
    mem, found, _ = fault(mem, look(105.1, nodes, reg), POLICY)
    assert found is not None and found.secondary and mem.secondary_since is None


def test_the_culprits_own_exit_during_the_grace_is_the_fault_named():
    reg = registry(hb(0, phase="failed", error="peer closed", error_peer=True), hb(1))
    mem, _, _ = fault(Memory(), look(101, RUNNING | {"n0": exited("n0", 1)}, reg), POLICY)
    mem, found, _ = fault(mem, look(101.5, {"n0": exited("n0", 1), "n1": exited("n1", -9)}, reg), POLICY)
    assert found is not None and not found.secondary and "n1" in found.nodes


def test_a_rank_end_its_agent_recorded_is_the_fault_before_the_agent_exits():
    # without restarts in place: rank 1 was SIGKILLed (its agent recorded it), the agent still runs
    nodes = RUNNING | {"n1": NodeStatus("n1", 0, NodeState.RUNNING, exit_codes=((101, -9, 1.0),))}
    reg = registry(hb(0), hb(1))
    mem, found, findings = fault(Memory(), look(101, nodes, reg, logged_steps={1: 12}), POLICY)
    assert found is not None and found.ranks == (1,) and findings is None
    assert found.step == 13  # the step after the last one its own log recorded
    assert ended_ranks(nodes, reg) == {1}


def test_a_restart_in_place_that_does_not_report_in_is_torn_down_and_not_tried_again():
    reg = registry(hb(0), at=118.5)
    mem = Memory(in_place_deadline=120.0)
    mem1, found, _ = fault(mem, look(119, RUNNING, reg, in_place_allowed=2, launched_at=110.0), POLICY)
    assert found is None and mem1.in_place_deadline == 120.0  # on their way: old exits are not faults
    mem2, found, _ = fault(mem, look(120.5, RUNNING, reg, in_place_allowed=2, launched_at=110.0), POLICY)
    assert found is not None and found.kind == "startup_stall" and found.ranks == (1,)
    assert mem2.in_place_deadline is None and mem2.in_place_failed


@pytest.mark.parametrize("nodes,kind", [
    ({"n0": NodeStatus("n0", 0, NodeState.RUNNING), "n1": NodeStatus("n1", 0, NodeState.LOST)}, "node_lost"),
    ({"n0": NodeStatus("n0", 0, NodeState.RUNNING), "n1": exited("n1", -9)}, None),
])
def test_a_node_gone_is_a_fault_at_once(nodes, kind):
    _, found, _ = fault(Memory(), look(101, nodes, registry(hb(0), hb(1))), POLICY)
    assert found is not None and "n1" in found.nodes and (kind is None or found.kind == kind)


def test_a_silent_rank_is_found_by_the_detectors():
    reg = registry(hb(0), (hb(1)))
    reg.observe(hb(0, seq=2), 104.0)  # rank 0 beats on; rank 1 last beat at 100
    _, found, findings = fault(Memory(), look(104.5, RUNNING, reg), POLICY)
    assert findings and found is not None and found.ranks == (1,)


# ---------------------------------------------------------------------------- placement
CAPACITY = CapacityPolicy(wait_limit_s=300.0, shrink_after_s=60.0, nodes_min=1, nodes_max=2, nproc_per_node=1)
PENDING = NodeStatus("n1", 0, NodeState.RUNNING, waiting="capacity",
                     detail="0/3 nodes are available: 3 Insufficient nvidia.com/gpu")


def test_a_gang_that_cannot_be_placed_waits_then_shrinks_to_what_was_placed():
    nodes = RUNNING | {"n1": PENDING}
    mem, said = placement(Memory(), nodes, 100.0, CAPACITY)
    assert said == [Waiting(True, ("n1",), said[0].message)] and mem.capacity_since == 100.0
    assert "Insufficient nvidia.com/gpu" in said[0].message
    mem, said = placement(mem, nodes, 130.0, CAPACITY)
    assert said == [Waiting(False, ("n1",), said[0].message)] and mem.capacity_since == 100.0
    mem, said = placement(mem, nodes, 161.0, CAPACITY)  # past shrink_after_s: the placed node goes on alone
    assert isinstance(said[-1], Shrink) and said[-1].nodes == ("n0",) and mem.capacity_since is None


def test_a_gang_placed_after_a_wait_says_how_long_and_one_that_never_fits_stops():
    mem, _ = placement(Memory(), RUNNING | {"n1": PENDING}, 100.0, CAPACITY)
    after, said = placement(mem, RUNNING, 112.5, CAPACITY)
    assert said == [Placed(12.5, True)] and after.capacity_since is None
    rigid = CapacityPolicy(wait_limit_s=30.0, shrink_after_s=0.0, nodes_min=2, nodes_max=2, nproc_per_node=1)
    mem, _ = placement(Memory(), RUNNING | {"n1": PENDING}, 100.0, rigid)
    _, said = placement(mem, RUNNING | {"n1": PENDING}, 131.0, rigid)
    assert isinstance(said[-1], Stop) and said[-1].phase.value == "stopped_no_capacity"


def test_a_node_that_cannot_start_is_not_a_wait_and_a_placed_node_that_ended_ends_it():
    cannot = NodeStatus("n1", 0, NodeState.RUNNING, waiting="cannot_start", detail="ErrImagePull")
    assert placement(Memory(), RUNNING | {"n1": cannot}, 100.0, CAPACITY) == (Memory(), [])
    mem, _ = placement(Memory(), RUNNING | {"n1": PENDING}, 100.0, CAPACITY)
    _, said = placement(mem, {"n0": exited("n0", -9), "n1": PENDING}, 101.0, CAPACITY)
    assert said == [Placed(1.0, False)]  # the fault that follows names the ended node


# ---------------------------------------------------------------------------- calibration
CAL = Calibration(heartbeat_s=3.0, startup_s=60.0, checkpoint_s=60.0, factor=5.0, floor_s=3.0, ceiling_s=600.0,
                  every_s=2.0)


def stepping(rank_seconds: dict[int, float], steps: int = 4) -> Registry:
    """Ranks that each took ``steps`` steps of their given duration (half of it computing), as
    their heartbeats say it: the medians of their last steps."""
    reg = Registry(0, len(rank_seconds))
    for step in range(1, steps + 1):
        for rank, s in rank_seconds.items():
            said = {"step_median_s": s, "work_median_s": s / 2} if step >= 3 else {}
            reg.observe(hb(rank, seq=step, step=step, last_step_s=s, last_compute_s=s / 2, **said), 100.0 + step)
    return reg


def test_timeouts_follow_the_step_times_seen_at_most_every_few_seconds_and_name_the_straggler():
    det = Detection(TIMEOUTS)
    before = calibrated(det, 100.0, Registry(0, 2), CAL)
    assert before.timeouts.compute_s == 60.0 and before.stragglers == {}  # no step seen: the startup timeout
    reg = stepping({0: 1.0, 1: 3.0})
    # within every_s of the last calibration: nothing is recomputed
    assert calibrated(before, 101.0, reg, CAL) is before
    after = calibrated(before, 102.0, reg, CAL)
    assert after.calibrated_at == 102.0 and after.timeouts.compute_s == 5.0 * 2.0  # factor x the median step
    assert after.stragglers[1] == pytest.approx(3.0) and after.stragglers[0] == pytest.approx(1 / 3)


def test_a_large_gang_recalibrates_less_often_from_a_sample_of_its_ranks_and_scores_every_rank():
    # 32,768 ranks: every 4 s (2 s up to 16,384 ranks); the median from every 9th rank's step times
    # (3,641 of them), by rank number, through every local rank of 8-rank nodes: local rank 0 of
    # every node took 1 s steps, the others 2 s (an even stride would read only the fast ones)
    ranks = {r: (1.0 if r % 8 == 0 else 2.0) for r in range(32_768)}
    ranks[5] = 9.0  # a straggler off the sample is still scored
    reg = stepping(ranks)
    first = calibrated(Detection(TIMEOUTS), 100.0, reg, CAL)
    assert first.timeouts.compute_s == 5.0 * 2.0
    assert first.stragglers[5] == pytest.approx(4.5) and len(first.stragglers) == 32_768  # 9 s against 2 s
    assert calibrated(first, 103.9, reg, CAL) is first
    assert calibrated(first, 104.0, reg, CAL).calibrated_at == 104.0


@pytest.mark.parametrize("seconds,phase_s", [(0.1, 3.0), (500.0, 600.0)])
def test_calibrated_timeouts_stay_between_the_floor_and_the_ceiling(seconds, phase_s):
    got = calibrated(Detection(TIMEOUTS), 100.0, stepping({0: seconds, 1: seconds}), CAL)
    assert got.timeouts.compute_s == got.timeouts.collective_s == got.timeouts.data_s == phase_s


# ---------------------------------------------------------------------------- the gang's start
@pytest.mark.parametrize("beats,kw,said", [
    # one rank of two heard: nothing yet
    ([hb(0)], {"starting": True}, []),
    # both heard while starting: it runs (no restore report yet: the ranks are still restoring)
    ([hb(0), hb(1)], {"starting": True}, [Running]),
    # both reported their restore: it runs, and the report is taken, once
    ([hb(0, restore_state="restored", restored="step-10"), hb(1, restore_state="restored", restored="step-10")],
     {"starting": True}, [Running, Reported]),
    ([hb(0, restore_state="restored", restored="step-10"), hb(1, restore_state="restored", restored="step-10")],
     {"starting": False, "reported": True}, []),
    # ranks that save without restoring say where: checked once
    ([hb(0, ckpt_root="/ck"), hb(1, ckpt_root="/ck")], {"starting": False}, [SavesTo]),
    ([hb(0, ckpt_root="/ck"), hb(1, ckpt_root="/ck")], {"starting": False, "root_judged": True}, []),
    # one rank has not said where it saves: not yet
    ([hb(0, ckpt_root="/ck"), hb(1)], {"starting": False}, []),
])
def test_the_start_of_an_attempt_is_said_once_each_running_restore_report_where_ranks_save(beats, kw, said):
    got = started(registry(*beats), **({"reported": False, "root_judged": False} | kw))
    assert [type(v) for v in got] == said
    for v in got:
        if isinstance(v, Reported):
            assert (v.report.state, v.report.restored, v.report.ranks_reported) == ("restored", "step-10", 2)
        elif isinstance(v, SavesTo):
            assert v.report.roots == ("/ck",) and v.report.state == ""
