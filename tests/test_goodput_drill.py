"""The goodput report against a drill with faults injected at known points, on the local
platform with real torchrun agents and gloo ranks: every save made to stall 1.5 s longer
(``slow-save``) and rank 1 killed (SIGKILL) at step 35, with a save every 10 steps.

Each number of ``supervisor report`` is checked against what the test measures on its own,
from the ranks' timing logs and its own clock, not from the controller's events: the steps
recomputed after the restore are the steps both attempts logged; the save stalls are the gaps
the saves left between two steps' records; the restart is the time from the killed rank's
last step to the gang's first step after it; the wall time is the supervisor's lifetime.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import PYTHON, SupervisorRun, read_log

pytestmark = pytest.mark.slow

STALL_S = 1.5
EVERY = 10
KILLED_AT = 35


def test_the_report_s_badput_matches_what_was_injected_and_measured(tmp_path):
    started = time.time()
    run = SupervisorRun(tmp_path, ["--steps", "50", "--checkpoint-every", str(EVERY), "--step-sleep", "0.05"],
                        fault=f"kind=slow-save,ms={int(STALL_S * 1000)};kind=kill,rank=1,step={KILLED_AT},attempt=0")
    try:
        assert run.wait(timeout=240) == 0, run.output()[-4000:]
        ended = time.time()
    finally:
        run.kill()
    png = tmp_path / "goodput.png"
    out = subprocess.run([PYTHON, "-m", "supervisor", "report", "--log-dir", str(run.log_dir), "--json",
                          "--png", str(png)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    total = report["total"]
    bad = total["badput_s"]
    r0, r1 = read_log(run.log_dir / "ranks", 0), read_log(run.log_dir / "ranks", 1)

    # wasted progress: exactly the steps rank 0 logged in attempt 0 and again after the restore
    first = {r["step"] for r in r0 if r["attempt"] == 0}
    again = {r["step"] for r in r0 if r["attempt"] >= 1}
    recomputed = first & again
    assert recomputed and min(recomputed) == KILLED_AT // EVERY * EVERY + 1, sorted(recomputed)
    assert total["wasted_steps"] == len(recomputed), (total, sorted(recomputed))
    # each cost what the loop took per step the first time (the median gap between two steps' records)
    times = [r["time"] for r in sorted((r for r in r0 if r["attempt"] == 0), key=lambda r: r["step"])]
    per_step = sorted(b - a for a, b in zip(times, times[1:]))[len(times) // 2]
    took = per_step * len(recomputed)
    assert bad["wasted_progress"] == pytest.approx(took, abs=0.05 + 0.5 * took)

    # save stalls: each save sat between its step's record and the next step's start
    by_step = {(r["attempt"], r["step"]): r for r in r0}
    gaps = [by_step[(a, s + 1)]["time"] - by_step[(a, s + 1)]["step_s"] - by_step[(a, s)]["time"]
            for (a, s) in by_step if s % EVERY == 0 and (a, s + 1) in by_step]
    assert len(gaps) >= 3 and all(g >= STALL_S for g in gaps), gaps
    blocked = [e for e in run.events("save_blocked")]
    assert len(blocked) >= len(gaps)
    assert bad["save_stall"] >= STALL_S * len(blocked)
    # the controller counts the slowest rank's stall of each save; rank 0's own gaps bound it
    assert bad["save_stall"] == pytest.approx(sum(e["blocked_s"] for e in blocked))
    assert sum(gaps) - 0.5 * len(gaps) <= sum(e["blocked_s"] for e in blocked if (0, e["step"]) in by_step
                                              or (1, e["step"]) in by_step) <= sum(gaps) + 0.5 * len(gaps) + 2.0

    # the restart: from the killed rank's last finished step to the gang's first step after it
    killed = max(r["time"] for r in r1 if r["attempt"] == 0)
    back = min(r["time"] for r in r0 + r1 if r["attempt"] >= 1)
    assert bad["restart"] + bad["restore"] == pytest.approx(back - killed, abs=1.5)

    # the wall time is the supervisor's lifetime (less its interpreter's start), all of it accounted
    assert ended - started - 4.0 <= total["wall_s"] <= ended - started
    first_step = min(r["time"] - r["step_s"] for r in r0 + r1 if r["attempt"] == 0)
    assert bad["startup"] == pytest.approx(first_step - started, abs=4.0)
    assert bad["waiting_for_capacity"] == 0.0
    assert total["productive_s"] == pytest.approx(total["wall_s"] - sum(bad.values()), abs=0.01)
    assert 0 < total["ettr"] < 1 and total["faults"] == 1 and total["restarts"] == 1

    # the advice: measured save cost and restart, the prior MTBF named as such (one fault)
    advice = report["advice"]
    assert advice["save_cost_s"] >= STALL_S and "prior" in advice["mtbf_source"]
    assert advice["restart_cost_s"] == pytest.approx(bad["restart"] + bad["restore"], abs=0.01)
    assert advice["advised_s"] > 0 and advice["advised_steps"] >= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    # the table a person reads says the same
    table = subprocess.run([PYTHON, "-m", "supervisor", "report", "--log-dir", str(run.log_dir)],
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0 and "ETTR" in table.stdout and "advised interval" in table.stdout, table.stdout
    assert f"steps recomputed after restores {len(recomputed)}" in table.stdout
