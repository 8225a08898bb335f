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
    ({"command": ["x"], "platform": {"rendezvous_backend": "etcd"}},
     r"platform.rendezvous_backend: 'etcd' is not one of auto, c10d, static"),
    ({"command": ["x"], "platform": {"static_rendezvous_nodes": 0}}, r"platform.static_rendezvous_nodes: must be >= 1"),
    ({"command": ["x"], "platform": {"static_rendezvous_nodes": 2.5}}, r"platform.static_rendezvous_nodes: must be an integer"),
    ({"command": ["x"], "platform": {"kind": "kubernetes", "kubernetes": {"rendezvous": "mdns"}}},
     r"platform.kubernetes.rendezvous: 'mdns' is not dns or ip"),
    ({"command": ["x"], "platform": {"kubernetes": {"worker": {"resources": ["gpu"]}}}},
     r"platform.kubernetes.worker.resources: must be a mapping"),
    ({"command": ["x"], "platform": {"kubernetes": {"worker": {"tolerations": [{1: "x"}]}}}},
     r"platform.kubernetes.worker.tolerations\[0\]: mapping keys must be strings"),
    ({"command": ["x"], "platform": {"kubernetes": {"token_secret": {"name": "t"}}}},
     r"platform.kubernetes.token_file: required with token_secret.name"),
    ({"command": ["x"], "platform": {"kubernetes": {"renew_deadline_s": 20}}}, r"platform.kubernetes.renew_deadline_s"),
    ({"command": ["x"], "platform": {"kubernetes": {"pods_per_node": 0}}}, r"platform.kubernetes.pods_per_node"),
    ({"command": ["x"], "platform": {"nodes": 1}, "nodes": {"min": 2, "max": 2}}, r"platform.nodes"),
    ({"command": ["x"], "job": "a b"}, r"job:"),
    ({"command": ["x"], "env": {"SUPERVISOR_TOKEN": "x"}}, r"env.SUPERVISOR_TOKEN"),
    ({"command": ["x"], "health": {"exclude_stragglers": "yes"}}, r"health.exclude_stragglers: must be true or false"),
    ({"command": ["x"], "http": {"port": 70000}}, r"port"),
    ({"command": ["x"], "restart": []}, r"restart: must be a mapping"),
    ({"command": ["x"], "release": {"probation_steps": 0}}, r"release.probation_steps: must be in \[1"),
    ({"command": ["x"], "release": {"rollback": "no"}}, r"release.rollback: must be true or false"),
    ({"command": ["x"], "release": {"max_code_mb": 0}}, r"release.max_code_mb"),
    ({"command": ["x"], "release": {"baseline": {"command": "python old.py"}}}, r"release.baseline.command: must be a list"),
    ({"command": ["x"], "release": {"baseline": {"imag": "x"}}}, r"release.baseline.imag: unknown key"),
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


# ----------------------------------------------------------------- env, alias bombs

@pytest.mark.parametrize("env, match", [
    ({"A": ["x", "y"]}, r"env.A: must be a string, number or boolean, got list"),
    ({"A": {"k": "v"}}, r"env.A: must be a string, number or boolean, got dict"),
    ({"A": None}, r"env.A: must be a string, number or boolean, got NoneType"),
    ({"A=B": "x"}, r"env: 'A=B' is not a variable name"),
    ({"1A": "x"}, r"env: '1A' is not a variable name"),
    ({"A\0B": "x"}, r"is not a variable name"),
    ({"": "x"}, r"env: '' is not a variable name"),
    ({"A B": "x"}, r"is not a variable name"),
    ({"A": "x\0y"}, r"env.A: must be a string without NUL"),
])
def test_env_takes_scalars_under_variable_names_only(env, match):
    with pytest.raises(ConfigError, match=match):
        from_dict({"command": ["x"], "env": env})


def test_env_scalars_become_strings():
    cfg = from_dict({"command": ["x"], "env": {"A": 1, "B": 2.5, "C": True, "D": False, "_e9": "s"}})
    assert cfg.env == {"A": "1", "B": "2.5", "C": "true", "D": "false", "_e9": "s"}


def test_an_alias_bomb_of_a_few_hundred_bytes_is_refused(tmp_path):
    # 6 levels of 9 aliases: 531,441 strings from 281 bytes (9 levels: 387 million)
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcde", "bcdef")]
    text = "command: [x]\nenv:\n  " + "\n  ".join(lines) + "\n  BOMB: *f\n"
    assert len(text) < 400
    (tmp_path / "bomb.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"bomb.yaml: its aliases expand to over 100000 YAML nodes"):
        load(tmp_path / "bomb.yaml")
    # merge keys copy mappings the same way
    merge = ["a: &a {x: 1, y: 2}"] + [f"{c}: &{c} {{<<: [*{p}, *{p}]}}" for p, c in
                                       zip("abcdefghijklmnopqrst", "bcdefghijklmnopqrstu")]
    (tmp_path / "merge.yaml").write_text("command: [x]\n" + "\n".join(merge) + "\n")
    with pytest.raises(ConfigError, match=r"aliases expand to over"):
        load(tmp_path / "merge.yaml")
    (tmp_path / "loop.yaml").write_text("command: &c [x, *c]\n")
    with pytest.raises(ConfigError, match=r"recursive"):
        load(tmp_path / "loop.yaml")


def test_a_few_aliases_are_fine(tmp_path):
    (tmp_path / "ok.yaml").write_text("command: &cmd [python, t.py]\nenv: &e {A: '1'}\n"
                                      "platform: {kind: local, nodes: 2}\nnodes: {min: 1, max: 2}\n")
    cfg = load(tmp_path / "ok.yaml")
    assert cfg.command == ("python", "t.py") and cfg.env == {"A": "1"}


def test_a_file_that_reports_no_size_is_read_within_the_limit(tmp_path):
    # a FIFO has st_size 0 and can stream forever: the limit is on the bytes read
    import os
    import threading

    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)

    def writer():
        with open(fifo, "wb") as f:
            try:
                for _ in range(64):
                    f.write(b"#" * (64 * 1024))
            except BrokenPipeError:
                pass

    t = threading.Thread(target=writer)
    t.start()
    try:
        with pytest.raises(ConfigError, match="limit"):
            load(fifo)
    finally:
        t.join(timeout=10)
