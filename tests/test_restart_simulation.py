"""The restart-at-scale model (benchmarks/restart_simulation.py): pure functions, checked as such.

Determinism, the per-trial total, the detection bounds, monotonicity (more nodes never make a
tail phase faster; less bandwidth never makes the restore faster), clear errors for bad
parameters, and the report/CLI end to end on a small configuration.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]


def _load():
    name = "restart_simulation"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "restart_simulation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


rs = _load()
TAIL_PHASES = ("teardown", "schedule", "rendezvous", "first_step")


def q(a: np.ndarray, p: float) -> float:
    return float(np.quantile(a, p, method="inverted_cdf"))


# ---------------------------------------------------------------------------- determinism
def test_same_seed_gives_the_same_numbers():
    m = rs.with_overrides(rs.model_for(64), {"restore.p_newest_corrupt": 0.3})
    a, b = rs.simulate(m, 300, seed=7), rs.simulate(m, 300, seed=7)
    for p in rs.PHASES:
        assert np.array_equal(a.phases[p], b.phases[p]), p
    assert np.array_equal(a.total, b.total)
    assert np.array_equal(a.fallback, b.fallback)


def test_another_seed_gives_other_numbers():
    m = rs.model_for(64)
    a, b = rs.simulate(m, 300, seed=1), rs.simulate(m, 300, seed=2)
    assert not np.array_equal(a.total, b.total)


def test_report_is_deterministic():
    m = rs.model_for(16)
    one = rs.report(m, trials=40, seed=3, scaling=(8, 16))
    two = rs.report(m, trials=40, seed=3, scaling=(8, 16))
    assert one == two


def test_a_change_in_one_phase_leaves_the_others_draws_alone():
    base = rs.model_for(128)
    slower = rs.with_overrides(base, {"restore.aggregate_read_Bps": base.restore.aggregate_read_Bps / 4})
    a, b = rs.simulate(base, 200, 0), rs.simulate(slower, 200, 0)
    for p in ("detect", "teardown", "schedule", "rendezvous", "first_step"):
        assert np.array_equal(a.phases[p], b.phases[p]), p


# ---------------------------------------------------------------------------- total
@pytest.mark.parametrize("overrides", [
    {},
    {"restore.p_newest_corrupt": 0.5},
    {"cluster.platform": "kubernetes", "cluster.slow_nodes": 2},
    {"detect.fault_kind": "silent", "rendezvous.nodes_min_fraction": 0.8},
])
def test_total_is_the_sum_of_the_phases_per_trial(overrides):
    res = rs.simulate(rs.with_overrides(rs.model_for(32), overrides), 250, seed=11)
    summed = sum(res.phases[p] for p in rs.PHASES)
    np.testing.assert_allclose(res.total, summed, rtol=1e-12, atol=0)
    assert res.total.shape == (250,)
    for p in rs.PHASES:
        assert (res.phases[p] >= 0).all(), p


# ---------------------------------------------------------------------------- detection bounds
@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["collective_hang", "silent"]),
    interval=st.floats(0.05, 10.0),
    timeout_mult=st.floats(2.0, 50.0),
    floor=st.floats(1.0, 600.0),
    scan=st.floats(0.01, 5.0),
    seed=st.integers(0, 2**31),
)
def test_detection_is_never_below_the_timeout_nor_above_timeout_plus_scan_plus_interval(
        kind, interval, timeout_mult, floor, scan, seed):
    d = rs.Detect(fault_kind=kind, heartbeat_interval_s=interval, silence_timeout_s=interval * timeout_mult,
                  phase_floor_s=floor, phase_ceiling_s=max(floor, 1800.0), scan_period_s=scan)
    m = replace(rs.model_for(8), detect=d)
    timeout = rs.hang_timeout_s(m)
    detect = rs.detect_phase(m, 500, seed)
    assert (detect >= timeout).all()
    assert (detect <= timeout + scan + interval).all()
    assert (detect <= timeout + scan).all()  # the model's own, tighter bound: the wait for the next tick


def test_hang_timeout_is_calibrated_like_the_controller():
    m = rs.model_for(8)
    step = rs.step_time_s(m)
    assert rs.hang_timeout_s(m) == max(m.detect.phase_floor_s, m.detect.phase_factor * step)
    big = rs.with_overrides(m, {"restore.params": 4e12})  # long steps: factor x step, clamped to the ceiling
    assert rs.hang_timeout_s(big) == min(m.detect.phase_ceiling_s, m.detect.phase_factor * rs.step_time_s(big))
    silent = rs.with_overrides(m, {"detect.fault_kind": "silent"})
    assert rs.hang_timeout_s(silent) == m.detect.silence_timeout_s
    forced = rs.with_overrides(m, {"detect.hang_timeout_override_s": 77.0})
    assert rs.hang_timeout_s(forced) == 77.0


# ---------------------------------------------------------------------------- monotonicity
@pytest.fixture(scope="module")
def by_nodes():
    return {n: rs.simulate(rs.model_for(n), 300, seed=5) for n in (8, 64, 256, 1024)}


@pytest.mark.parametrize("phase", TAIL_PHASES)
def test_more_nodes_never_make_a_tail_phase_faster(by_nodes, phase):
    counts = sorted(by_nodes)
    for p in (0.5, 0.95, 0.99):
        values = [q(by_nodes[n].phases[phase], p) for n in counts]
        assert all(b >= a for a, b in zip(values, values[1:])), (phase, p, values)


@pytest.mark.parametrize("phase", ("teardown", "first_step"))
def test_more_nodes_never_make_a_max_over_nodes_faster_in_any_trial(by_nodes, phase):
    # node-major draws: the first n nodes of a trial are the same at any node count
    counts = sorted(by_nodes)
    for a, b in zip(counts, counts[1:]):
        assert (by_nodes[b].phases[phase] >= by_nodes[a].phases[phase] - 1e-12).all(), (phase, a, b)


def test_more_nodes_never_make_agents_ready_sooner():
    small, large = rs.model_for(50), rs.model_for(400)
    r_small, r_large = rs.agent_ready(small, 200, 9), rs.agent_ready(large, 200, 9)
    shift = r_large[:50] - r_small  # coupled: the same nodes draw the same start times ...
    assert (shift >= 0).all() and np.allclose(shift, shift.flat[0])  # ... plus one more fan-out hop
    assert (r_large.max(axis=0) >= r_small.max(axis=0)).all()


@pytest.mark.parametrize("field_name", ["aggregate_read_Bps", "node_read_cap_Bps", "rank_load_Bps"])
def test_less_bandwidth_never_makes_the_restore_faster(field_name):
    for nodes in (8, 256):
        m = rs.model_for(nodes)
        slower = rs.with_overrides(m, {f"restore.{field_name}": getattr(m.restore, field_name) / 2})
        a, b = rs.restore_phase(m, 300, 4), rs.restore_phase(slower, 300, 4)
        assert (b >= a).all()


def test_halving_the_binding_bandwidth_slows_the_restore():
    m = rs.model_for(1024)  # 1 TB/s shared by 1,024 nodes binds before the 12.5 GB/s per-node cap
    slower = rs.with_overrides(m, {"restore.aggregate_read_Bps": m.restore.aggregate_read_Bps / 2})
    a, b = rs.restore_phase(m, 300, 4), rs.restore_phase(slower, 300, 4)
    assert (b > a).all()
    assert q(b, 0.5) - q(a, 0.5) > 0.5


def test_a_bigger_checkpoint_never_restores_faster():
    m = rs.model_for(64)
    big = rs.with_overrides(m, {"restore.params": 405e9})
    assert (rs.restore_phase(big, 200, 1) > rs.restore_phase(m, 200, 1)).all()


# ---------------------------------------------------------------------------- the pieces
def test_rendezvous_store_saturates_somewhere_past_1024_nodes_with_torch_defaults():
    m = rs.model_for(1024)
    u = rs.store_utilisation(m, np.array([8, 64, 256, 1024, 4096]))
    assert (np.diff(u) > 0).all()
    sat = rs.saturation_nodes(m)
    assert sat is not None and 1024 < sat < 4096
    # a longer keep-alive interval moves the knee out
    later = rs.saturation_nodes(rs.with_overrides(m, {"rendezvous.keep_alive_interval_s": 60.0}))
    assert later is None or later > sat


def test_a_saturated_c10d_rendezvous_never_completes_and_a_static_one_does():
    m = rs.model_for(4096)
    res = rs.simulate(m, 20, 0)
    assert np.isinf(res.phases["rendezvous"]).all() and np.isinf(res.total).all()
    assert res.completed == 0.0
    static = rs.simulate(rs.with_overrides(m, {"rendezvous.backend": "static"}), 20, 0)
    assert np.isfinite(static.total).all() and static.completed == 1.0


def test_warm_agents_take_the_agent_start_out_of_the_schedule_in_every_trial():
    m = rs.model_for(256)
    cold = rs.agent_ready(m, 200, 0)
    warm = rs.agent_ready(rs.with_overrides(m, {"schedule.warm_agents": True}), 200, 0)
    assert (warm < cold).all()
    # what is left: choosing the checkpoint, the step's launch and the hand-over itself
    s = m.schedule
    assert warm.max() < s.pick_checkpoint_s + 1.0 + 5 * s.warm_handover_s
    assert warm.min() > s.pick_checkpoint_s


def test_one_node_lost_at_16384_gpus_each_path_of_the_supervisor_helps():
    models = rs.lost_node_models(rs.Model())
    assert [m.cluster.ranks for _, m in models] == [16_384] * 3
    assert all(m.detect.fault_kind == "silent" for _, m in models)
    totals = [rs.simulate(m, 100, 0).total for _, m in models]
    p99 = [q(t, 0.99) for t in totals]
    assert p99[2] < p99[0] and p99[2] <= p99[1]
    assert (totals[2] <= totals[1]).all()  # warm agents: the same draws, never slower in a trial
    text = rs.report(rs.model_for(16), trials=60, seed=0, scaling=(8, 16))
    assert "## One node lost at 16,384 GPUs" in text
    assert "- **One node lost at 16,384 GPUs** (2,048 nodes x 8), static rendezvous and warm agents:" in text


def test_a_missing_agent_blocks_a_rigid_rendezvous_but_not_an_elastic_one():
    rigid = rs.with_overrides(rs.model_for(64), {"rendezvous.missing_nodes": 1})
    assert np.isinf(rs.simulate(rigid, 50, 0).phases["rendezvous"]).all()
    elastic = rs.with_overrides(rigid, {"rendezvous.nodes_min_fraction": 0.9})
    res = rs.simulate(elastic, 50, 0)
    assert np.isfinite(res.total).all()
    complete = rs.simulate(rs.with_overrides(elastic, {"rendezvous.missing_nodes": 0}), 50, 0)
    # the world forms last_call_s after the 90% mark instead of at the last join
    assert q(res.total, 0.5) - q(complete.total, 0.5) > 0.6 * elastic.rendezvous.last_call_s


def test_an_elastic_launch_cuts_off_stragglers():
    m = rs.with_overrides(rs.model_for(512), {"schedule.p_slow_start": 0.05})
    rigid = rs.simulate(m, 300, 2)
    elastic = rs.simulate(rs.with_overrides(m, {"rendezvous.nodes_min_fraction": 0.9}), 300, 2)
    gang = lambda r: r.phases["schedule"] + r.phases["rendezvous"]  # noqa: E731
    assert q(gang(elastic), 0.99) < q(gang(rigid), 0.99)


def test_a_slow_node_slows_the_per_node_phases():
    base = rs.model_for(64)
    slow = rs.with_overrides(base, {"cluster.slow_nodes": 1})
    a, b = rs.simulate(base, 200, 3), rs.simulate(slow, 200, 3)
    for p in ("schedule", "restore", "first_step"):
        assert (b.phases[p] >= a.phases[p] - 1e-9).all(), p
        assert q(b.phases[p], 0.5) > q(a.phases[p], 0.5), p


def test_a_corrupt_newest_checkpoint_costs_a_second_relaunch_cycle():
    base = rs.model_for(32)
    bad = rs.with_overrides(base, {"restore.p_newest_corrupt": 1.0})
    a, b = rs.simulate(base, 200, 6), rs.simulate(bad, 200, 6)
    assert b.fallback.all() and not a.fallback.any()
    for p in ("teardown", "schedule", "rendezvous", "restore"):
        assert (b.phases[p] > a.phases[p]).all(), p
    for p in ("detect", "first_step"):
        assert np.array_equal(b.phases[p], a.phases[p]), p


def test_teardown_waits_the_grace_when_ranks_are_blocked():
    m = rs.model_for(16)
    t = rs.teardown_phase(m, 200, 0)
    assert (t >= m.teardown.kill_grace_s + m.teardown.abort_grace_s).all()
    quick = rs.with_overrides(m, {"teardown.p_blocked_on_sigterm": 0.0, "teardown.p_unkillable": 0.0})
    assert (rs.teardown_phase(quick, 200, 0) < t).all()


def test_loglog_interpolation_hits_the_measured_points_and_never_decreases():
    table = rs.Rendezvous().cas_server_s
    for x, y in table:
        assert math.isclose(float(rs._loglog(table, x)), y, rel_tol=1e-9)
    xs = np.geomspace(1e3, 1e7, 200)
    assert (np.diff(rs._loglog(table, xs)) >= 0).all()


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize("make, message", [
    (lambda: rs.Cluster(nodes=0), "cluster.nodes: must be >= 1"),
    (lambda: rs.Cluster(nodes=2.5), "cluster.nodes: must be a whole number"),
    (lambda: rs.Cluster(gpus_per_node=0), "cluster.gpus_per_node: must be >= 1"),
    (lambda: rs.Cluster(platform="pbs"), "cluster.platform: 'pbs' is not one of slurm, kubernetes"),
    (lambda: rs.Cluster(nodes=4, slow_nodes=5), "cluster.slow_nodes: 5 is more than cluster.nodes 4"),
    (lambda: rs.Restore(aggregate_read_Bps=-1.0), "restore.aggregate_read_Bps: must be > 0"),
    (lambda: rs.Restore(aggregate_read_Bps=float("nan")), "restore.aggregate_read_Bps: must be finite"),
    (lambda: rs.Restore(p_newest_corrupt=1.5), "restore.p_newest_corrupt: must be <= 1"),
    (lambda: rs.FirstStep(mfu=1.5), "first_step.mfu: must be <= 1"),
    (lambda: rs.FirstStep(peak_flops="fast"), "first_step.peak_flops: must be a number"),
    (lambda: rs.Teardown(kill_grace_s=-1.0), "teardown.kill_grace_s: must be >= 0"),
    (lambda: rs.Detect(heartbeat_interval_s=1.0, silence_timeout_s=1.5),
     "detect.silence_timeout_s: 1.5 is below 2 x heartbeat_interval_s"),
    (lambda: rs.Detect(phase_floor_s=100.0, phase_ceiling_s=50.0), "detect.phase_ceiling_s: must be >="),
    (lambda: rs.Detect(fault_kind="oops"), "detect.fault_kind: 'oops' is not one of"),
    (lambda: rs.Rendezvous(cas_server_s=((1e5, 2e-3), (2e5, 1e-3))),
     "rendezvous.cas_server_s: costs must not decrease"),
    (lambda: rs.Rendezvous(get_server_s=((2e5, 1e-3), (1e5, 2e-3))), "rendezvous.get_server_s: sizes must be strictly"),
    (lambda: rs.Rendezvous(gloo_init_s=((1, 1.0),)), "rendezvous.gloo_init_s: needs at least two"),
    (lambda: rs.Rendezvous(nodes_min_fraction=0.0), "rendezvous.nodes_min_fraction: must be > 0"),
    (lambda: rs.Model(budget_s=0.0), "budget_s: must be a finite number > 0"),
    (lambda: rs.Model(cluster=rs.Cluster(nodes=2), rendezvous=rs.Rendezvous(missing_nodes=2)),
     "rendezvous.missing_nodes: 2 leaves no node"),
    (lambda: rs.with_overrides(rs.Model(), {"restore.bandwidth": 1.0}), "restore.bandwidth: restore has no field"),
    (lambda: rs.with_overrides(rs.Model(), {"storage.x": 1.0}), "storage.x: not a parameter"),
    (lambda: rs.parse_override("restore.params", rs.Model()), "expected SECTION.FIELD=VALUE"),
    (lambda: rs.parse_override("restore.params=lots", rs.Model()), "takes a number"),
    (lambda: rs.parse_override("cluster.nodes=1.5", rs.Model()), "takes a whole number"),
    (lambda: rs.parse_override("nothing.here=1", rs.Model()), "unknown parameter"),
    (lambda: rs.simulate(rs.Model(), trials=0), "trials: must be a whole number >= 1"),
    (lambda: rs.simulate(rs.Model(), trials=10, seed=-1), "seed: must be a whole number >= 0"),
])
def test_invalid_parameters_raise_a_clear_value_error(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert message in str(err.value)


def test_every_parameter_says_where_its_number_comes_from():
    m = rs.Model()
    seen = 0
    for section in rs.SECTIONS:
        for f in fields(getattr(m, section)):
            assert f.metadata["kind"] in rs.KINDS, f.name
            assert len(f.metadata["source"]) > 8, f.name
            seen += 1
    assert seen > 50


# ---------------------------------------------------------------------------- report and CLI
def test_report_shows_the_verdict_headroom_and_tables():
    m = rs.model_for(16)
    text = rs.report(m, trials=60, seed=0, scaling=(8, 16))
    for heading in ("# The restart at scale", "## Headline", "## Result at 16 nodes", "## Scaling",
                    "## Sensitivity", "## The model", "## The assumptions that matter most",
                    "## What the model leaves out", "## Parameters"):
        assert heading in text, heading
    assert "| `restore.aggregate_read_Bps` |" in text
    for p in rs.PHASES:
        assert f"| {p} |" in text
    assert "- **PASS**: at 16 nodes" in text and "headroom" in text
    assert "Dominant phase: **" in text


def test_a_tiny_budget_is_a_miss_with_negative_headroom():
    m = rs.with_overrides(rs.model_for(8), {"budget_s": 10.0})
    res = rs.simulate(m, 50, 0)
    verdict, headroom = rs._verdict(res)
    assert verdict == "MISS" and headroom < 0
    assert "- **MISS**: at 8 nodes" in rs.report(m, 30, 0, scaling=(8,))


def test_cli_writes_the_report(tmp_path, capsys):
    out = tmp_path / "docs" / "restart.md"
    rc = rs.main(["--nodes", "16", "--trials", "40", "--scaling", "8,16", "--quiet", "--out", str(out),
                  "--set", "restore.aggregate_read_Bps=5e11", "--set", "cluster.platform=kubernetes"])
    assert rc == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert "--set restore.aggregate_read_Bps=5e11" in text
    assert "Platform kubernetes" in text
    assert text.startswith("# The restart at scale, on paper\n\n<!-- generated by: ")


def test_cli_refuses_bad_values_with_exit_2(capsys):
    assert rs.main(["--nodes", "0", "--trials", "10", "--quiet"]) == 2
    assert "cluster.nodes: must be >= 1" in capsys.readouterr().err
    assert rs.main(["--trials", "10", "--quiet", "--set", "restore.mfu=1"]) == 2
    assert "unknown parameter 'restore.mfu'" in capsys.readouterr().err


def test_scenarios_that_do_not_fit_a_tiny_job_are_left_out():
    names = [name for name, _ in rs.scenarios(rs.model_for(1, gpus_per_node=1))]
    assert names and not any("never starts" in n for n in names)
    assert any("never starts" in n for n, _ in rs.scenarios(rs.model_for(8)))


def test_the_model_has_the_controllers_restart_phases_one_section_each():
    from supervisor.protocol import RESTART_PHASES

    assert rs.PHASES == RESTART_PHASES and rs.SECTIONS == ("cluster", *RESTART_PHASES)
    assert set(rs.SECTIONS) <= {f.name for f in fields(rs.Model)}
    res = rs.simulate(rs.model_for(8), trials=20, seed=0)
    assert tuple(res.phases) == RESTART_PHASES
