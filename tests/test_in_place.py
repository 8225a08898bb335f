"""Restarts in place (``--in-place-restarts``) on the local platform, with real torchrun agents.

The cheap rung: a rank that ends on a healthy node is restarted by its own torchrun agent, the
gang re-rendezvouses with no new launch, and resumes from the checkpoint the controller chose.
Each test injects a real fault and checks the path taken (events.jsonl, the agents' pids) and
that the loss path is bit-identical to an uninterrupted control; and that the ladder still ends
in a full teardown when the cheap path cannot be taken or does not work.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from conftest import PYTHON, TRAIN, job_env, kill_leftovers, losses_by_step, read_log, run_job
from test_supervisor_local import JOB, assert_same_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("control")
    run_job(tmp, 2, [*JOB, "--log-dir", str(tmp / "log")])
    return {r["step"]: r for r in read_log(tmp / "log", 0)}


def agents(run) -> list[str]:
    """The node agents this run launched (one line per agent process the platform started)."""
    return [line for line in run.output().splitlines() if "event=node_launched" in line]


def test_a_killed_rank_is_restarted_in_place_from_the_controllers_checkpoint(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=kill,rank=1,step=13,attempt=0", extra=["--in-place-restarts", "2"])
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["attempt"] == 0 and fault["ranks"] == [1] and fault["rung"] == 0, fault
    assert "restarts the gang in place" in fault["detail"]
    act = run.wait_event("action", action="restart_in_place")
    assert act["restore_from"] == "step-0000000010" and act["left"] == 1
    again = run.wait_event("launched", attempt=1)
    assert again["in_place"] is True and again["restore_from"] == "step-0000000010"
    # the agents restarted their ranks in the launch's environment: the same launch id, a new attempt
    assert again["launch"] == run.wait_event("launched", attempt=0)["launch"]
    assert not run.events("action") or all(a["action"] != "tear_down" for a in run.events("action"))
    assert len(agents(run)) == 2  # the two agents of attempt 0 and no others
    # every rank of attempt 1 restored the controller's pick, and said so with attempt 1
    for rank in (0, 1):
        restarted = [r for r in read_log(run.log_dir / "ranks", rank) if r.get("attempt") == 1]
        assert restarted and restarted[0]["step"] == 11, restarted[:1]
    done = run.wait_event("restart_complete")
    assert done["attempt"] == 1 and done["within_budget"]
    assert run.events("job_finished")[-1]["phase"] == "completed"
    assert_same_path(run, control)


def test_a_crash_loop_spends_the_restarts_in_place_then_the_gang_is_torn_down(supervisor_run, control):
    # rank 1 crashes at step 13 in attempts 0 and 1: one restart in place allowed, so the second
    # crash ends its agent (torchrun's --max-restarts 1) and the controller relaunches the gang
    run = supervisor_run(JOB, fault="kind=kill,rank=1,step=13,attempt=0;kind=kill,rank=1,step=13,attempt=1",
                         extra=["--in-place-restarts", "1"])
    assert run.wait() == 0, run.output()[-3000:]
    first, second = run.events("fault_detected")[:2]
    assert first["attempt"] == 0 and second["attempt"] == 1 and second["ranks"] == [1], (first, second)
    assert [a["attempt"] for a in run.events("action") if a["action"] == "restart_in_place"] == [0]
    declined = run.wait_event("in_place_declined", attempt=1)
    # the controller saw the second crash first (spent), or the agent, out of restarts, first
    assert "spent" in declined["reason"] or "not running" in declined["reason"], declined
    assert run.wait_event("action", action="tear_down")["attempt"] == 1
    relaunch = run.wait_event("launched", attempt=2)
    assert "in_place" not in relaunch and relaunch["restore_from"] == "step-0000000010"
    assert len(agents(run)) == 4  # attempt 0's two agents, then a new gang of two
    assert run.events("job_finished")[-1]["phase"] == "completed"
    assert_same_path(run, control)


def test_a_sigstopped_rank_is_killed_alone_and_restarted_in_place_by_its_healthy_agent(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=stop,rank=1,step=13,attempt=0", extra=["--in-place-restarts", "2"])
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "dead" and fault["ranks"] == [1] and fault["node_failure"] is False, fault
    killed = run.wait_event("action", action="kill_ranks")
    assert killed["node"] == "node1" and killed["ranks"] == [1]
    assert run.wait_event("action", action="restart_in_place")["reason"] == "dead"
    assert run.wait_event("launched", attempt=1)["in_place"] is True
    assert not [a for a in run.events("action") if a["action"] in ("kill_node", "tear_down")]
    assert len(agents(run)) == 2
    assert_same_path(run, control)


def test_a_frozen_node_is_not_restarted_in_place_but_killed_and_replaced_by_a_spare(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=node-stop,rank=1,step=13,attempt=0", slots=3,
                         extra=["--in-place-restarts", "2"])
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "dead" and fault["node_failure"] is True, fault
    declined = run.wait_event("in_place_declined", attempt=0)
    assert "needs a new gang" in declined["reason"] or "not running" in declined["reason"], declined
    assert run.wait_event("action", action="kill_node")["node"] == "node1"
    relaunch = run.wait_event("launched", attempt=3)  # above any in-place number of attempt 0
    assert "in_place" not in relaunch and "node1" not in relaunch["nodes"] and relaunch["world_size"] == 2
    assert_same_path(run, control)


def test_a_hung_rank_is_aborted_and_the_gang_restarted_in_place(supervisor_run, control):
    run = supervisor_run(JOB, fault="kind=hang,rank=0,step=13,attempt=0", extra=["--in-place-restarts", "2"])
    assert run.wait() == 0, run.output()[-3000:]
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "hang" and fault["ranks"] == [0], fault
    assert run.wait_event("action", action="restart_in_place")["reason"] == "hang"
    assert run.wait_event("launched", attempt=1)["in_place"] is True
    assert len(agents(run)) == 2
    stacks = (run.log_dir / "ranks" / "stacks-rank-0.txt").read_text()
    assert "stack dump requested by the supervisor" in stacks  # evidence kept before the abort
    assert_same_path(run, control)


def test_a_restart_in_place_that_does_not_come_back_in_time_ends_in_a_full_teardown(tmp_path, control):
    """The ladder still ends in a gang teardown when the cheap rung does not work within its
    timeout: here no restarted rank can report in within 0.5 s (``restart.in_place_timeout_s``)."""
    log_dir = tmp_path / "logs"
    config = {
        "job": "slow-in-place", "platform": {"kind": "local", "nodes": 2}, "nodes": {"min": 2, "max": 2},
        "command": [PYTHON, str(TRAIN), *JOB], "checkpoint_dir": str(tmp_path / "ckpt"), "log_dir": str(log_dir),
        "metrics_linger_s": 0, "heartbeat": {"interval_s": 0.5, "timeout_s": 3}, "health": {"phase_floor_s": 3},
        "restart": {"in_place_restarts": 2, "in_place_timeout_s": 0.5},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    try:
        proc = subprocess.run([PYTHON, "-m", "supervisor", "run", "--config", str(tmp_path / "job.yaml")],
                              env=job_env(tmp_path, "kind=kill,rank=1,step=13,attempt=0"), capture_output=True,
                              text=True, timeout=240, cwd=tmp_path, start_new_session=True)
    finally:
        kill_leftovers(log_dir)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    evs = [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]
    actions = [(e["attempt"], e["action"]) for e in evs if e["event"] == "action"]
    assert (0, "restart_in_place") in actions and (1, "tear_down") in actions, actions
    stall = [e for e in evs if e["event"] == "fault_detected" and e["attempt"] == 1]
    assert stall and "did not report in within 0.5 s" in stall[0]["detail"], stall
    declined = [e for e in evs if e["event"] == "in_place_declined" and e["attempt"] == 1]
    assert declined and "did not come back" in declined[0]["reason"], declined
    relaunched = [e for e in evs if e["event"] == "launched" and not e.get("in_place")]
    assert [e["attempt"] for e in relaunched] == [0, 3], relaunched  # above attempt 0's in-place numbers
    assert [e for e in evs if e["event"] == "job_finished"][-1]["phase"] == "completed"
    got = losses_by_step(read_log(log_dir / "ranks", 0))
    assert all(got[s]["loss_hex"] == control[s]["loss_hex"] for s in control)
