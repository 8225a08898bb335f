"""Job config: every bad input is a ConfigError naming the field; defaults are documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import MAX_CONFIG_BYTES, ConfigError, from_dict, load

REPO = Path(__file__).resolve().parents[1]


def test_example_config_loads():
    cfg = load(REPO / "examples" / "job.yaml")
    assert cfg.job == "demo" and cfg.nodes.max == 2 and cfg.node_slots == 3
    assert cfg.command[:2] == ("python", "examples/train.py") and cfg.restart.budget_s == 900


def test_defaults():
    cfg = from_dict({"command": ["python", "t.py"]})
    assert cfg.restart.budget_s == 900 and cfg.heartbeat.interval_s == 1.0 and cfg.platform.kind == "local"
    assert cfg.node_slots == 1 and cfg.restart.progress_guard_attempts == 3


@pytest.mark.parametrize("raw, match", [
    ({}, "command"),
    ({"command": []}, "command"),
    ({"command": "python t.py"}, "command: must be a list"),
    ({"command": ["x"], "restart": {"budget_s": 0}}, r"restart.budget_s: must be > 0"),
    ({"command": ["x"], "restart": {"budgit_s": 5}}, r"restart.budgit_s: unknown key"),
    ({"command": ["x"], "nodes": {"min": 3, "max": 2}}, r"nodes.max: 2 is below nodes.min 3"),
    ({"command": ["x"], "nodes": {"min": "two"}}, r"nodes.min: must be an integer"),
    ({"command": ["x"], "heartbeat": {"interval_s": 1, "timeout_s": 1.5}}, r"heartbeat.timeout_s: must be >= 2"),
    ({"command": ["x"], "platform": {"kind": "mesos"}}, r"platform.kind"),
    ({"command": ["x"], "platform": {"kind": "kubernetes"}}, r"not implemented yet"),
    ({"command": ["x"], "platform": {"nodes": 1}, "nodes": {"min": 2, "max": 2}}, r"platform.nodes"),
    ({"command": ["x"], "job": "a b"}, r"job:"),
    ({"command": ["x"], "env": {"SUPERVISOR_TOKEN": "x"}}, r"env.SUPERVISOR_TOKEN"),
    ({"command": ["x"], "health": {"exclude_stragglers": "yes"}}, r"health.exclude_stragglers: must be true or false"),
    ({"command": ["x"], "http": {"port": 70000}}, r"port"),
    ({"command": ["x"], "restart": []}, r"restart: must be a mapping"),
])
def test_bad_values_name_the_field(raw, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(raw)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("command: [python\n  oops: {")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load(tmp_path / "list.yaml")
    (tmp_path / "tag.yaml").write_text("command: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(tmp_path / "tag.yaml")
    (tmp_path / "big.yaml").write_text("#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match="limit"):
        load(tmp_path / "big.yaml")
