"""/metrics at scale and over time (issue 14 §1, issue 12 §3), on a real Controller's state.

* a 16,384-rank job renders job-level aggregates and per-rank series only for the ranks
  worth looking at: under 10,000 series (in fact under 1,000), every aggregate right;
* a small job gets every rank's series; per-rank series carry no node (that is
  ``supervisor_rank_info``), so a relaunch on other nodes keeps them;
* labelled counters have every known label value at 0 before the first event;
* the last fault, the checkpoint interval, the step rate, the stop request and the run's
  start time are exported as the alert rules read them;
* ``GET /metrics`` renders in a worker thread and gzips when the scraper accepts it.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import signal
import subprocess
import threading
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers import no_platform
from supervisor import metrics as sv_metrics
from supervisor.config import ConfigError, from_dict
from supervisor.controller.daemon import Controller
from supervisor.controller.decide import FAULT_KINDS, Fault, JobPhase, RestartTimer
from supervisor.metrics import WORST_RANKS, make_registry
from supervisor.protocol import PHASES, REJECT_REASONS, RESTART_PHASES, Heartbeat

NOW = 10_000.0
TIMEOUT_S = 5.0  # heartbeat.timeout_s default


def make_controller(tmp_path, **cfg) -> Controller:
    c = Controller(from_dict({"command": ["python", "x.py"], "job": "j", "log_dir": str(tmp_path / "logs"),
                              "checkpoint_dir": str(tmp_path / "ckpt")} | cfg), no_platform(), clock=lambda: NOW)
    return c


def beat(c: Controller, rank: int, world: int, *, age: float = 0.5, step: int = 100, phase: str = "compute",
         node: str | None = None, ckpt_s: float = 0.0) -> None:
    c.registry.observe(Heartbeat(job="j", attempt=c.attempt, rank=rank, world_size=world, seq=1, step=step,
                                 phase=phase, phase_s=0.1, node=node or f"node{rank // 8}", ckpt_s=ckpt_s),
                       NOW - age)


def series(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def per_rank(samples, name: str) -> dict[str, dict[str, str]]:
    return {labels["rank"]: labels for n, labels, _ in samples if n == name}


# ------------------------------------------------------------------------------ at scale
@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """16,384 ranks: ranks 0-39 silent for 10-49 s, ranks 100-129 straggling (scores 1.6-1.89),
    one rank in its checkpoint phase, steps between 100 and 103."""
    c = make_controller(tmp_path_factory.mktemp("big"))
    world = 16384
    c.registry.reset(0, world)
    for r in range(world):
        stale = r < 40
        beat(c, r, world, age=10.0 + r if stale else 0.5, step=100 + r % 4,
             phase="checkpoint" if r == 5000 else ("data" if r % 2 else "compute"), ckpt_s=0.25 if r == 7 else 0.0)
    c.detection = replace(c.detection, stragglers={r: 1.0 for r in range(world)} | {100 + i: 1.6 + i / 100
                                                                                     for i in range(30)})
    c.phase = JobPhase.RUNNING
    text = generate_latest(make_registry(c)).decode()
    return c, text, series(text)


def test_a_16384_rank_job_stays_far_under_10000_series(big):
    _, text, samples = big
    assert len(samples) < 1000, len(samples)
    assert len(text) < 100_000
    if shutil.which("promtool"):
        proc = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_job_level_aggregates_of_a_16384_rank_job(big):
    c, _, _ = big
    v = make_registry(c).get_sample_value
    job = {"job": "j"}
    assert v("supervisor_world_size", job) == 16384
    assert v("supervisor_alive_ranks", job) == 16384 - 40
    assert v("supervisor_stale_ranks", job) == 40
    assert v("supervisor_rank_heartbeat_age_max_seconds", job) == pytest.approx(49.0)
    # 40 of 16,384 ages are above 0.5 s: the 99th percentile is still a live rank's
    assert v("supervisor_rank_heartbeat_age_p99_seconds", job) == pytest.approx(0.5)
    assert v("supervisor_rank_step_min", job) == 100 and v("supervisor_rank_step_max", job) == 103
    assert v("supervisor_straggler_score_max", job) == pytest.approx(1.89)
    assert v("supervisor_stragglers", job) == 30
    assert v("supervisor_ranks_in_phase", job | {"phase": "checkpoint"}) == 1
    assert v("supervisor_ranks_in_phase", job | {"phase": "data"}) == 8192
    assert v("supervisor_ranks_in_phase", job | {"phase": "compute"}) == 8191
    assert v("supervisor_ranks_in_phase", job | {"phase": "collective"}) == 0
    assert v("supervisor_checkpoint_save_seconds", job) == 0.25


def test_above_the_limit_only_the_stalest_and_slowest_ranks_get_series(big):
    _, _, samples = big
    stalest = {str(r) for r in range(39, 39 - WORST_RANKS, -1)}  # ranks 30-39: 40-49 s old
    slowest = {str(r) for r in range(129, 129 - WORST_RANKS, -1)}  # ranks 120-129: the highest scores
    shown = stalest | slowest
    for name in ("supervisor_rank_heartbeat_age_seconds", "supervisor_rank_step", "supervisor_rank_info"):
        assert set(per_rank(samples, name)) == shown, name
    assert set(per_rank(samples, "supervisor_straggler_score")) == shown
    assert {labels["node"] for labels in per_rank(samples, "supervisor_rank_info").values()} == {
        "node3", "node4", "node15", "node16"}
    phases = [(labels["rank"], labels["phase"]) for n, labels, _ in samples if n == "supervisor_rank_phase"]
    assert len(phases) == len(shown) * len(PHASES)


# ------------------------------------------------------------------------------ small jobs
def test_a_small_job_gets_every_rank_and_the_node_only_in_rank_info(tmp_path):
    c = make_controller(tmp_path)
    c.registry.reset(0, 4)
    for r in range(4):
        beat(c, r, 4, age=0.5 + r, node=f"node{r // 2}", phase="collective" if r == 3 else "compute")
    samples = series(generate_latest(make_registry(c)).decode())
    for name in ("supervisor_rank_heartbeat_age_seconds", "supervisor_rank_step", "supervisor_rank_phase"):
        got = [labels for n, labels, _ in samples if n == name]
        assert {labels["rank"] for labels in got} == {"0", "1", "2", "3"}, name
        assert all("node" not in labels for labels in got), name
    assert per_rank(samples, "supervisor_rank_info")["3"]["node"] == "node1"
    v = make_registry(c).get_sample_value
    assert v("supervisor_rank_heartbeat_age_seconds", {"job": "j", "rank": "2"}) == 2.5
    assert v("supervisor_rank_phase", {"job": "j", "rank": "3", "phase": "collective"}) == 1
    assert v("supervisor_rank_phase", {"job": "j", "rank": "3", "phase": "compute"}) == 0


def test_a_relaunch_on_other_nodes_keeps_every_per_rank_series(tmp_path):
    c = make_controller(tmp_path)

    def rank_series(node_prefix: str) -> tuple[set, set]:
        c.registry.reset(c.attempt, 4)
        for r in range(4):
            beat(c, r, 4, node=f"{node_prefix}{r}")
        samples = series(generate_latest(make_registry(c)).decode())
        keep = {(n, tuple(sorted(labels.items()))) for n, labels, _ in samples
                if n.startswith("supervisor_rank_") and n != "supervisor_rank_info" and "rank" in labels}
        info = {(labels["rank"], labels["node"]) for n, labels, _ in samples if n == "supervisor_rank_info"}
        return keep, info

    before, info_before = rank_series("old")
    c.attempt += 1
    after, info_after = rank_series("new")
    assert before and before == after
    assert info_before != info_after


def test_the_per_rank_limit_is_a_validated_config_knob(tmp_path):
    c = make_controller(tmp_path, metrics_per_rank_limit=2)
    c.registry.reset(0, 4)
    for r in range(4):
        beat(c, r, 4, age=30.0 if r == 2 else 0.5)
    samples = series(generate_latest(make_registry(c)).decode())
    assert set(per_rank(samples, "supervisor_rank_heartbeat_age_seconds")) == {"2"}
    with pytest.raises(ConfigError, match="metrics_per_rank_limit"):
        from_dict({"command": ["x"], "metrics_per_rank_limit": -1})


# ------------------------------------------------------------------------------ counters
def test_every_known_label_value_of_the_counters_is_exported_at_zero_from_the_start(tmp_path):
    c = make_controller(tmp_path)
    v = make_registry(c).get_sample_value
    # every fault kind the controller can name a restart by (decide.FAULT_KINDS is that list:
    # a kind added there and not exported would start its restart-storm rule one restart late)
    assert {"rank_killed", "rank_error", "stopped_early", "nonfinite"} <= set(FAULT_KINDS)
    for reason in FAULT_KINDS:
        assert v("supervisor_restarts_total", {"job": "j", "reason": reason}) == 0.0, reason
    for reason in REJECT_REASONS:
        assert v("supervisor_heartbeats_rejected_total", {"job": "j", "reason": reason}) == 0.0, reason
    assert v("supervisor_heartbeats_received_total", {"job": "j"}) == 0.0
    # the first restart moves its own series from 0 to 1; a reason nobody listed still shows
    c.restarts.by_reason = {"crash": 1, "a_new_kind": 1}
    assert v("supervisor_restarts_total", {"job": "j", "reason": "crash"}) == 1.0
    assert v("supervisor_restarts_total", {"job": "j", "reason": "dead"}) == 0.0
    assert v("supervisor_restarts_total", {"job": "j", "reason": "a_new_kind"}) == 1.0


# ------------------------------------------------------------------------------ what alerts read
def test_the_last_fault_keeps_ten_culprits_and_counts_them_all(tmp_path):
    c = make_controller(tmp_path)
    fault = Fault("dead", tuple(range(40)), ("node0", "node1"), "rack lost", 2, True, NOW - 5)
    c.restarts.begin(fault, 3, None, unix=1.7e9, culprits=[(r, f"node{r // 8}") for r in fault.ranks])
    samples = series(generate_latest(make_registry(c)).decode())
    culprits = [labels for n, labels, _ in samples if n == "supervisor_last_fault_info"]
    assert len(culprits) == WORST_RANKS
    assert {labels["kind"] for labels in culprits} == {"dead"} and culprits[0]["attempt"] == "3"
    v = make_registry(c).get_sample_value
    assert v("supervisor_last_fault_ranks", {"job": "j"}) == 40
    assert v("supervisor_last_fault_timestamp_seconds", {"job": "j"}) == 1.7e9


def test_the_checkpoint_interval_is_what_the_supervisor_saw_between_new_checkpoints(tmp_path):
    c = make_controller(tmp_path)
    reg = make_registry(c)
    v = reg.get_sample_value
    assert v("supervisor_checkpoint_interval_seconds", {"job": "j"}) is None
    for step, created in ((10, 1000.0), (20, 1600.0), (20, 1600.0), (30, 1900.0)):
        c.latest_ckpt = {"name": f"step-{step:010d}", "step": step, "created_unix": created, "writer_world_size": 1}
        generate_latest(reg)
    # the longest of the last intervals (600 s and 300 s): a faster save does not lower the bar
    assert v("supervisor_checkpoint_interval_seconds", {"job": "j"}) == 600.0
    assert v("supervisor_last_checkpoint_step", {"job": "j"}) == 30


def test_step_rate_stop_request_and_run_start_are_exported(tmp_path):
    c = make_controller(tmp_path)
    v = make_registry(c).get_sample_value
    c.heard.step_marks = [(10.0, 100), (12.0, 105)]  # 5 steps in 2 s
    assert v("supervisor_step_rate", {"job": "j"}) == 2.5
    c.heard.step_marks = [(10.0, 100), (12.0, 92)]  # a window that spans a resume from an older checkpoint
    assert v("supervisor_step_rate", {"job": "j"}) == 0.0
    assert v("supervisor_stop_requested", {"job": "j"}) == 0.0
    c.request_stop(signal.SIGTERM)
    assert v("supervisor_stop_requested", {"job": "j"}) == 1.0
    assert v("supervisor_run_start_time_seconds", {"job": "j"}) > 1.6e9


def test_the_running_release_and_rollbacks_by_reason_are_exported(tmp_path):
    from supervisor.controller import releases as rel

    c = make_controller(tmp_path)
    v = make_registry(c).get_sample_value
    for reason in rel.ROLLBACK_REASONS:  # at 0 from the start: the page's increase() sees the first one
        assert v("supervisor_release_rollbacks_total", {"job": "j", "reason": reason}) == 0.0
    good, bad = (rel.Version(i, {"x": i}, ("python", f"{i}.py")) for i in ("aaaaaaaaaaa1", "aaaaaaaaaaa2"))
    c.releases = rel.Ledger({good.id: rel.Release(good, rel.KNOWN_GOOD, 1.0, 1.0),
                             bad.id: rel.Release(bad, rel.PROBATION, 2.0, 2.0)}, bad.id)
    c.releases, verdict = rel.judge(c.releases, kind="nonfinite", detail="nan", step=4, stepped=True,
                                    node_failure=False, policy=rel.Policy())
    c.releases, _ = rel.roll_back(c.releases, verdict, good, now_unix=3.0)
    assert v("supervisor_release_rollbacks_total", {"job": "j", "reason": "nonfinite"}) == 1.0
    assert v("supervisor_release_info", {"job": "j", "version": good.id, "state": "known_good",
                                         "known_good": good.id}) == 1.0
    assert v("supervisor_release_last_rollback_timestamp_seconds", {"job": "j", "from": bad.id, "to": good.id,
                                                                    "reason": "nonfinite"}) == 3.0
    assert c.status()["release"]["rejected"] == [bad.id]


def test_the_run_s_suspect_checkpoints_are_counted_from_none_as_the_ranks_refuse_them(tmp_path):
    from supervisor.controller.decide import RestoreReport, note_refusals

    c = make_controller(tmp_path)
    v = make_registry(c).get_sample_value
    # at 0 from the start: the warning sees the first rise
    assert v("supervisor_suspect_checkpoints", {"job": "j"}) == 0.0
    refused = RestoreReport(state="restored", restored="step-0000000010",
                            refused=(("step-0000000015", "fails its sha256 checksum (corrupt)"),))
    c.history, newly = note_refusals(c.history, refused)
    assert [n for n, _ in newly] == ["step-0000000015"]
    assert v("supervisor_suspect_checkpoints", {"job": "j"}) == 1.0
    c.history, newly = note_refusals(c.history, refused)  # refused again by the next attempt: still one
    assert newly == [] and v("supervisor_suspect_checkpoints", {"job": "j"}) == 1.0

# ------------------------------------------------------------------------------ the endpoint
def test_metrics_endpoint_renders_in_a_worker_thread_and_gzips_when_accepted(tmp_path, monkeypatch):
    from aiohttp.test_utils import TestClient, TestServer

    from supervisor.controller.http import build_app

    c = make_controller(tmp_path)
    c.registry.reset(0, 2)
    beat(c, 0, 2)
    beat(c, 1, 2)
    threads: list[str] = []
    real = sv_metrics.families

    def spy(snapshot):
        threads.append(threading.current_thread().name)
        yield from real(snapshot)

    monkeypatch.setattr(sv_metrics, "families", spy)

    async def scrape() -> tuple[dict, bytes, dict, bytes]:
        async with TestClient(TestServer(build_app(c))) as client:
            r1 = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
            zipped = await r1.read()
            r2 = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
            plain = await r2.read()
            return dict(r1.headers), zipped, dict(r2.headers), plain

    h1, zipped, h2, plain = asyncio.run(scrape())
    assert h1["Content-Encoding"] == "gzip" and h2.get("Content-Encoding") is None
    assert h1["Content-Type"].startswith("text/plain;") and h1["Vary"] == "Accept-Encoding"
    unzipped = gzip.decompress(zipped)
    assert len(zipped) < len(unzipped)
    for body in (unzipped, plain):
        assert set(per_rank(series(body.decode()), "supervisor_rank_info")) == {"0", "1"}
    assert threads and all(t.startswith("metrics-render") for t in threads), threads
    assert threading.main_thread().name not in threads


def test_a_large_gang_s_rendering_serves_the_scrapes_that_follow_until_it_ages_or_the_job_moves_on(tmp_path):
    from supervisor.controller.decide import metrics_every_s

    clock = [NOW]
    c = Controller(from_dict({"command": ["python", "x.py"], "job": "j", "log_dir": str(tmp_path / "logs"),
                              "checkpoint_dir": str(tmp_path / "ckpt")}), no_platform(), clock=lambda: clock[0])
    world = 65_536
    every = metrics_every_s(world)
    assert every == 2.0 and metrics_every_s(16_384) == 0.0  # up to 16,384 ranks every scrape renders
    c.registry.reset(0, world)
    c.registry.observe(Heartbeat(job="j", attempt=0, rank=0, world_size=world, seq=1, step=100, phase="compute",
                                 phase_s=0.1, node="node0"), clock[0])
    exporter = sv_metrics.Exporter(c)

    def scrape():
        return asyncio.run(exporter.render(True))

    try:
        first = scrape()
        assert not first.reused
        c.registry.observe(Heartbeat(job="j", attempt=0, rank=1, world_size=world, seq=1, step=7, phase="compute",
                                     phase_s=0.1, node="node0"), clock[0])
        clock[0] += every / 2
        again = scrape()
        assert again.reused and again.body == first.body  # the same bytes: rank 1 not in them yet
        clock[0] += every / 2
        fresh = scrape()
        assert not fresh.reused and fresh.body != first.body
        min_step = {labels["job"]: value for n, labels, value in series(gzip.decompress(fresh.body).decode())
                    if n == "supervisor_rank_step_min"}
        assert min_step == {"j": 7.0}
        c.phase = JobPhase.RECOVERING  # the job moved on: the next scrape renders at once
        moved = scrape()
        assert not moved.reused
        phase = {labels["phase"]: value for n, labels, value in series(gzip.decompress(moved.body).decode())
                 if n == "supervisor_job_phase"}
        assert phase[JobPhase.RECOVERING.value] == 1.0
        c.registry.reset(0, 2)  # a small gang: every scrape renders
        assert not scrape().reused and not scrape().reused
    finally:
        exporter.close()


@pytest.mark.parametrize("header, ok", [
    ("gzip", True), ("gzip, deflate, br", True), ("deflate;q=1, gzip;q=0.5", True), ("*", True),
    ("gzip;q=0", False), ("identity", False), ("", False), ("br", False),
])
def test_accept_encoding_negotiation(header, ok):
    assert sv_metrics.accepts_gzip(header) is ok


# ------------------------------------------------------------------------------ the contract with the ranks
def test_the_phase_labels_are_exactly_the_wire_phases_and_the_restart_phases(tmp_path):
    c = make_controller(tmp_path)
    c.registry.reset(0, 2)
    beat(c, 0, 2, phase="compute")
    beat(c, 1, 2, phase="checkpoint")
    marks = [900.0 + i for i in range(len(RESTART_PHASES) + 1)]
    c.restarts.timers = [RestartTimer(0, "crash", *marks)]
    samples = series(generate_latest(make_registry(c)).decode())
    # every phase a rank can report has a series (0 when no rank is in it), and no other does
    assert {labels["phase"] for n, labels, _ in samples if n == "supervisor_ranks_in_phase"} == set(PHASES)
    assert {labels["phase"] for n, labels, _ in samples if n == "supervisor_rank_phase"} == set(PHASES)
    # every phase the restart timer reports has a histogram, and the restart landed in each once
    restart = {labels["phase"]: value for n, labels, value in samples if n == "supervisor_restart_phase_seconds_count"}
    assert restart == dict.fromkeys(RESTART_PHASES, 1.0)


def test_goodput_and_the_advised_interval_are_exported_over_every_run_of_the_log_directory(tmp_path):
    c = make_controller(tmp_path)
    (tmp_path / "logs").mkdir()
    v = make_registry(c).get_sample_value
    assert v("supervisor_goodput_wall_seconds", {"job": "j"}) is None  # nothing said yet: nothing to account
    c.event("run_started")
    c.event("launched", attempt=0, restore_from=None)
    c.event("save_blocked", attempt=0, step=10, blocked_s=3.0)
    c.event("checkpoint_complete", name="step-0000000010", step=10)
    assert v("supervisor_goodput_badput_seconds", {"job": "j", "cause": "save_stall"}) == 3.0
    for cause in ("startup", "waiting_for_capacity", "restart", "restore", "wasted_progress"):
        assert v("supervisor_goodput_badput_seconds", {"job": "j", "cause": cause}) is not None
    # a save's cost is measured: an interval is advised (the prior MTBF, the prior restart cost)
    assert v("supervisor_checkpoint_interval_advised_seconds", {"job": "j"}) == pytest.approx(
        sv_metrics_daly(3.0), rel=1e-3)
    assert 0 < v("supervisor_goodput_ettr_predicted", {"job": "j", "at": "advised"}) < 1
    c.event("job_finished", phase="completed")
    first_wall = v("supervisor_goodput_wall_seconds", {"job": "j"})
    # the next run's controller on the same log directory counts the first run's too
    again = make_controller(tmp_path)
    again.run_no = 2  # (what its start-up makes of the state file the first run left)
    again.event("run_started")
    again.event("save_blocked", attempt=0, step=20, blocked_s=1.0)
    w = make_registry(again).get_sample_value
    assert w("supervisor_goodput_badput_seconds", {"job": "j", "cause": "save_stall"}) == 4.0
    assert w("supervisor_goodput_wall_seconds", {"job": "j"}) >= first_wall
    assert 0 <= w("supervisor_goodput_ettr", {"job": "j"}) <= 1
    assert again.status()["goodput"]["badput_s"]["save_stall"] == 4.0


def sv_metrics_daly(c: float) -> float:
    from supervisor.reports import goodput

    return goodput.daly(c, goodput.PRIOR_MTBF_S)
