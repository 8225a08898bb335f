"""A controller SIGKILLed at each stage of a recovery (it kills itself there, as a drill:
SUPERVISOR_CONTROLLER_FAULT=die_before=ACTION, after the stage was saved) is replaced by one that
finishes that recovery from the same stage: one fault, one teardown, the same restart timer, and
the job's loss path bit for bit the uninterrupted one's."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from test_supervisor_local import JOB, STEPS, control  # noqa: F401 (the uninterrupted control run)
from supervisor.controller.executor import CONTROLLER_FAULT

pytestmark = pytest.mark.slow


def _unix(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()


@pytest.mark.parametrize("fault,die_before,stage,kind", [
    ("kind=hang,rank=1,step=13,attempt=0", "AskForStacks", "evidence", "hang"),
    ("kind=hang,rank=1,step=13,attempt=0", "WriteEvidence", "record", "hang"),
    ("kind=hang,rank=1,step=13,attempt=0", "AbortRanks", "rung", "hang"),
    ("kind=stop,rank=1,step=13,attempt=0", "KillNodes", "rung", "dead"),
    ("kind=hang,rank=1,step=13,attempt=0", "TearDown", "rung", "hang"),
    ("kind=hang,rank=1,step=13,attempt=0", "Launch", "launch", "hang"),
])
def test_a_controller_killed_mid_recovery_is_replaced_by_one_that_finishes_it(
        supervisor_run, control, fault, die_before, stage, kind):
    run = supervisor_run(JOB, fault=fault, env={CONTROLLER_FAULT: f"die_before={die_before}"})
    assert run.wait() == -9, run.output()[-3000:]  # it killed itself at that stage
    del run.env[CONTROLLER_FAULT]
    run.start()  # the same command again
    resumed = run.wait_event("recovery_resumed")
    assert resumed["stage"] == stage and resumed["kind"] == kind
    assert run.wait() == 0, run.output()[-3000:]
    faults = run.events("fault_detected")
    assert [f["kind"] for f in faults] == [kind]  # one fault: the replacement did not detect it again
    teardowns = [e for e in run.events("action") if e["action"] == "tear_down"]
    assert len(teardowns) == 1, teardowns  # the gang went once
    assert bool(teardowns[0].get("resumed")) == (die_before == "TearDown")  # carried out again, and said so
    if die_before in ("AskForStacks", "WriteEvidence"):
        # the replacement waited for the adopted ranks' heartbeats: the evidence holds them all
        evidence = json.loads(Path(run.wait_event("evidence_saved")["path"]).read_text())
        assert sorted(evidence["ranks"]) == ["0", "1"]
        # asked again at the evidence stage; at the record stage the first controller had asked
        assert evidence["asked"] == ([0, 1] if die_before == "AskForStacks" else [])
    if die_before == "AbortRanks":
        assert run.wait_event("action", action="abort_ranks")["resumed"] is True
    launched = run.events("launched")
    assert launched[-1]["restore_from"] == "step-0000000010" and len(launched) == 2
    done = run.wait_event("restart_complete")
    assert done["reason"] == kind
    # the timer ran from the fault, through the controller's death, to the first step
    assert done["total_s"] >= _unix(resumed["time"]) - _unix(faults[0]["time"])
    got = {r["step"]: r for r in run.rank_log(0)}
    assert sorted(got) == list(range(1, STEPS + 1))
    assert all(got[s]["loss_hex"] == rec["loss_hex"] for s, rec in control.items())
