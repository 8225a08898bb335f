"""The platform registry is the one list of kinds: the config, the CLI and the builders read it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from supervisor.config import ConfigError, from_dict
from supervisor.platforms import registry
from supervisor.platforms.base import Platform


def test_every_kind_names_a_builder_and_its_section_a_dataclass_the_config_reads():
    assert registry.kinds() == ("local", "slurm", "kubernetes")
    for kind in registry.KINDS.values():
        assert callable(registry._load(kind.build)), kind.name
    for name in registry.sections():
        cls = registry.section_class(name)
        assert dataclasses.is_dataclass(cls)
        cfg = from_dict({"command": ["x"], "platform": {"kind": "local", name: {}}})
        assert getattr(cfg.platform, name) == cls()  # a section not given has its defaults
    with pytest.raises(ConfigError, match=r"platform.kind: 'pbs' is not one of local, slurm, kubernetes"):
        from_dict({"command": ["x"], "platform": {"kind": "pbs"}})
    with pytest.raises(ConfigError, match=r"platform.pbs: unknown key \(known: fork_ranks, host, kind, kubernetes, "
                                          r"nodes, rendezvous_backend, slurm, static_rendezvous_nodes, warm_agents\)"):
        from_dict({"command": ["x"], "platform": {"pbs": {}}})


def test_the_config_round_trips_with_each_section_under_its_own_key():
    import json

    cfg = from_dict({"command": ["x"], "platform": {"kind": "slurm", "slurm": {"job_id": "42"}}})
    raw = json.loads(json.dumps(cfg.to_dict(), default=list))
    assert "sections" not in raw["platform"] and raw["platform"]["slurm"]["job_id"] == "42"
    assert from_dict(raw).platform.slurm == cfg.platform.slurm
    assert dataclasses.replace(cfg.platform, host="10.0.0.1").slurm.job_id == "42"


def test_reading_a_config_imports_no_kubernetes_client():
    probe = ("import sys; from supervisor.config import from_dict\n"
             "c = from_dict({'command': ['x'], 'platform': {'kind': 'kubernetes', 'kubernetes': {'namespace': 'n'}}})\n"
             "assert c.platform.kubernetes.namespace == 'n'\n"
             "print(sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]


def test_the_platform_facts_the_cli_needs_come_from_the_registry():
    # where a login node reaches the controller: Slurm's batch host; nothing recorded, nothing said
    assert registry.reached_at({"batch_addr": "10.9.8.7", "nodes": {}}) == "10.9.8.7"
    assert registry.reached_at({"nodes": {}}) == "" and registry.reached_at(None) == ""
    # a drill on Slurm runs inside its allocation; elsewhere anywhere
    slurm = from_dict({"command": ["x"], "platform": {"kind": "slurm"}})
    assert "inside its allocation" in registry.drill_problem(slurm, {})
    assert registry.drill_problem(slurm, {"SLURM_JOB_ID": "7"}) == ""
    assert registry.drill_problem(from_dict({"command": ["x"]}), {}) == ""
    assert [c.name for c in registry.commands()] == ["sbatch"]
    assert callable(registry.command("sbatch"))


def test_the_lock_owner_is_the_platforms():
    from supervisor.platforms.slurm.lock import SlurmLockOwner

    assert Platform.lock_owner(None).fields() == {}
    owner = SlurmLockOwner({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "2", "SLURMD_NODENAME": "n1"})
    assert owner.fields() == {"node": "n1", "slurm_job_id": "7", "slurm_restart_count": 2}
    assert "requeued" in owner.supersedes({"slurm_job_id": "7", "slurm_restart_count": 1})
    assert owner.supersedes({"slurm_job_id": "7", "slurm_restart_count": 2}) == ""
    assert owner.supersedes({"slurm_job_id": "8", "slurm_restart_count": 0}) == ""
    assert owner.stop_hint({"slurm_job_id": "7"}) == "scancel 7"
    assert owner.describe({"host": "h", "node": "n1", "slurm_job_id": "7", "pid": 3}) == \
        "host h (Slurm node n1), Slurm job 7, pid 3"
