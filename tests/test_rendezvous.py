"""How a launch's agents form the gang: torch's c10d rendezvous, or the static one with the node
ranks the controller hands out (issue 28: a rendezvous that does not saturate at scale).

The decision is a table; the agent's arguments are read back by torch's own torchrun parser;
the static path is run for real on the local platform (real torchrun agents, gloo), through a
node lost and replaced by a spare, against an uninterrupted control.
"""

from __future__ import annotations

import json
import time

import pytest
from torch.distributed import run as torchrun

from conftest import kill_tree, losses_by_step, read_log, run_job
from supervisor.checkpoint import latest_complete
from supervisor.config import ConfigError, from_dict
from supervisor.controller.decide import rendezvous_backend
from supervisor.platforms.base import LaunchSpec
from supervisor.platforms.node.agent import node_rank, torchrun_argv


@pytest.mark.parametrize("configured, nodes, static_from, in_place, chosen", [
    ("auto", 2, 256, 0, "c10d"),
    ("auto", 255, 256, 0, "c10d"),
    ("auto", 256, 256, 0, "static"),
    ("auto", 2_048, 256, 0, "static"),
    ("auto", 2, 2, 0, "static"),
    ("auto", 2_048, 256, 2, "c10d"),     # restarts in place need every agent to re-form the gang
    ("c10d", 16_384, 256, 0, "c10d"),    # said outright: whatever the size
    ("static", 1, 256, 0, "static"),
])
def test_the_rendezvous_backend_by_the_gang_s_size(configured, nodes, static_from, in_place, chosen):
    assert rendezvous_backend(configured, nodes, static_from=static_from, in_place_restarts=in_place) == chosen


def test_a_static_rendezvous_with_restarts_in_place_is_refused_with_both_fields_named():
    with pytest.raises(ConfigError, match=r"platform.rendezvous_backend: static cannot restart in place.*"
                       r"restart.in_place_restarts: 0"):
        from_dict({"command": ["x"], "platform": {"rendezvous_backend": "static"},
                   "restart": {"in_place_restarts": 1}})
    assert from_dict({"command": ["x"], "platform": {"rendezvous_backend": "auto"},
                      "restart": {"in_place_restarts": 1}}).platform.rendezvous_backend == "auto"


@pytest.mark.parametrize("nodes, host, ranks", [
    (["node0", "node1", "node2"], None, {"node0": 0, "node1": 1, "node2": 2}),
    (["node0", "node2"], None, {"node0": 0, "node2": 1}),                 # a spare took node1's place
    (["a", "b", "c", "d"], "c", {"c": 0, "a": 1, "b": 2, "d": 3}),       # the store's node is rank 0
])
def test_node_ranks_follow_the_launch_order_with_the_store_s_node_first(nodes, host, ranks):
    assert {n: node_rank(nodes, n, host) for n in nodes} == ranks


def spec(rendezvous: str, nodes: list[str]) -> LaunchSpec:
    return LaunchSpec(attempt=3, nodes=nodes, nnodes_min=len(nodes), nnodes_max=len(nodes), nproc_per_node=8,
                      command=["python", "train.py", "--steps", "5"], env={}, rdzv_endpoint="10.0.0.7:29400",
                      rdzv_id="job-3", rendezvous=rendezvous, max_restarts=2)


def test_torchrun_reads_the_static_arguments_as_a_fixed_gang_with_the_given_node_rank():
    nodes = ["n0", "n1", "n2", "n3"]
    for node in nodes:
        argv = torchrun_argv("python", spec("static", nodes), rank=node_rank(nodes, node), join_timeout_s=900)
        assert argv[:3] == ["python", "-m", "supervisor.platforms.node.forking_agent"]
        args = torchrun.parse_args(argv[3:])
        config, cmd, cmd_args = torchrun.config_from_args(args)
        assert config.rdzv_backend == "static" and (config.min_nodes, config.max_nodes) == (4, 4)
        assert config.rdzv_endpoint == "10.0.0.7:29400" and config.run_id == "job-3"
        assert config.rdzv_configs["rank"] == node_rank(nodes, node)
        assert int(config.rdzv_configs["timeout"]) == 900  # how long rank 0's store waits for the others
        assert config.max_restarts == 2 and config.nproc_per_node == 8
        assert [cmd, *cmd_args] == ["python", "train.py", "--steps", "5"]


def test_a_static_launch_without_node_ranks_is_refused_and_c10d_is_unchanged():
    with pytest.raises(ValueError, match="needs each node's rank"):
        torchrun_argv("python", spec("static", ["n0", "n1"]))
    args = torchrun.parse_args(torchrun_argv("python", spec("c10d", ["n0", "n1"]))[3:])
    config, _, _ = torchrun.config_from_args(args)
    assert config.rdzv_backend == "c10d" and "rank" not in config.rdzv_configs


STEPS = 24
JOB = ["--steps", str(STEPS), "--checkpoint-every", "5", "--step-sleep", "0.15"]


@pytest.mark.slow
def test_a_static_gang_loses_a_node_and_a_spare_takes_node_rank_1(tmp_path, supervisor_run):
    control_dir = tmp_path / "control"
    run_job(control_dir, 2, [*JOB, "--log-dir", str(control_dir / "log")])
    control = {r["step"]: r for r in read_log(control_dir / "log", 0)}

    run = supervisor_run(JOB, slots=3, nnodes="2", extra=["--rendezvous-backend", "static"])
    first = run.wait_event("launched", attempt=0)
    assert first["rendezvous"] == "static" and first["nodes"] == ["node0", "node1"]
    deadline = time.monotonic() + 90
    while (found := latest_complete(run.ckpt).checkpoint) is None or found.step < 10:
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.05)
    state = json.loads((run.log_dir / "supervisor-state.json").read_text())
    kill_tree(state["platform"]["nodes"]["node1"]["pid"])  # the agent and its rank: a node lost
    assert run.wait() == 0, run.output()[-3000:]
    assert run.wait_event("fault_detected")["nodes"] == ["node1"]
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["nodes"] == ["node0", "node2"] and relaunch["rendezvous"] == "static"
    assert relaunch["world_size"] == 2 and relaunch["restore_from"] is not None
    # node2's agent joined as node rank 1: its rank is 1 (node0, which serves the store, holds rank 0)
    resumed = {r["rank"]: r["node"] for rank in (0, 1) for r in read_log(run.log_dir / "ranks", rank)
               if r["attempt"] == 1}
    assert resumed == {0: "node0", 1: "node2"}, resumed
    got = losses_by_step(run.rank_log(0))
    assert sorted(got) == list(range(1, STEPS + 1))
    assert all(got[s]["loss_hex"] == rec["loss_hex"] for s, rec in control.items())
    assert run.events("job_finished")[-1]["phase"] == "completed"
