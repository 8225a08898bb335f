"""Bad input never costs progress or a clear message (issue 32), end to end: the real CLI on a
checkpoint root whose newest manifest is malformed, the resume that follows, configs refused
with the field named, and `supervisor launch --fresh` over a state file nobody can read.
The parsers' own contracts are fuzzed in tests/test_fuzz_parsers.py."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import subprocess
import sys
import typing

import pytest
import torch

from conftest import PYTHON, TRAIN, job_env
from helpers import tiny_job, train_step
from supervisor import cli
from supervisor.config import ConfigError, JobConfig, load as load_config
from supervisor.controller import state as state_file

S1, S2 = "step-0000000001", "step-0000000002"
BAD_MANIFESTS = {
    "checksums.algorithm a list": lambda m: m["checksums"].update(algorithm=["xxh3_128"]),
    "created_unix of 400 digits": lambda m: m.update(created_unix=10**400),
}


def two_steps(root):
    """Checkpoints of steps 1 and 2 of the tiny job."""
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    for step in (1, 2):
        train_step(model, opt, sched, cursor)
        mgr.save(step)


def spoil(ckpt, how) -> None:
    m = json.loads((ckpt / "manifest.json").read_text())
    how(m)
    (ckpt / "manifest.json").write_text(json.dumps(m))


def state(mgr, model, opt, sched, cursor):
    return ({k: v.detach().clone() for k, v in model.state_dict().items()}, opt.state_dict(), sched.state_dict(),
            cursor.state_dict(), torch.get_rng_state().clone())


def assert_identical(a, b) -> None:
    pa, oa, sa, ca, ra = a
    pb, ob, sb, cb, rb = b
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert sa == sb and ca == cb and torch.equal(ra, rb)
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        for k, v in oa["state"][i].items():
            assert torch.equal(v, ob["state"][i][k]) if torch.is_tensor(v) else v == ob["state"][i][k]


@pytest.mark.parametrize("bad", list(BAD_MANIFESTS))
def test_verify_names_the_malformed_newest_manifest_and_a_resume_restores_the_older_step_exactly(tmp_path, bad):
    root, control = tmp_path / "ckpt", tmp_path / "control"
    two_steps(root)
    control.mkdir()
    shutil.copytree(root / S1, control / S1)  # the same job with step 2 never written
    spoil(root / S2, BAD_MANIFESTS[bad])

    verify = subprocess.run([PYTHON, "-m", "supervisor", "checkpoints", "verify", str(root)], capture_output=True,
                            text=True, timeout=120, env=job_env(tmp_path))
    assert verify.returncode == 1, verify.stderr
    assert "Traceback" not in verify.stderr
    why = "checksum algorithm" if "algorithm" in bad else "created_unix"
    assert f"FAILED {S2}:" in verify.stdout and why in verify.stdout, verify.stdout
    assert f"OK {S1}: step 1" in verify.stdout
    assert f"a restore would fall back to {S1} (step 1)" in verify.stderr, verify.stderr
    listed = subprocess.run([PYTHON, "-m", "supervisor", "checkpoints", "list", str(root)], capture_output=True,
                            text=True, timeout=120, env=job_env(tmp_path))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr and "invalid" in listed.stdout

    # the resume in the same state: step 1, bit for bit what a job that never saw step 2 restores
    # (each job restores, then takes its next step, before the other: the RNG is process-wide)
    runs = []
    for job_root, seed in ((root, 3), (control, 4)):
        job = tiny_job(job_root, seed=seed, keep=10)
        restored = job[0].restore()
        restored_state = state(*job)
        loss = train_step(*job[1:])
        runs.append((restored, restored_state, loss, state(*job)))
    (got, got_state, got_loss, got_next), (want, want_state, want_loss, want_next) = runs
    assert got.path.name == S1 and got.step == 1 and [s.name for s in got.skipped] == [S2]
    assert want.path.name == S1 and got.rng == want.rng == "exact"
    assert_identical(got_state, want_state)
    assert got_loss == want_loss  # and the next step is the same step
    assert_identical(got_next, want_next)


# ------------------------------------------------------------------ configs: exit 2, the field named
def numeric_fields(cls=JobConfig, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from numeric_fields(tp, f"{prefix}{f.name}.")
        elif tp in (int, float):
            yield f"{prefix}{f.name}", tp


def config_text(field: str, value: str) -> str:
    """A config with ``field`` (a dotted path) set to the YAML scalar ``value``."""
    *parents, leaf = field.split(".")
    inner = f"{leaf}: {value}"
    for p in reversed(parents):
        inner = f"{p}: {{{inner}}}"
    return "command: [python, t.py]\n" + inner + "\n"


ABSURD = [".nan", ".inf", "-.inf", "1e400", "1" + "0" * 400, "1" + "0" * 5000, "0x" + "f" * 200, "1" + ":1" * 300]


@pytest.mark.parametrize("field, kind", list(numeric_fields()))
def test_every_number_field_refuses_non_finite_and_absurd_values_naming_itself(tmp_path, field, kind):
    for value in ABSURD:
        if kind is int and value in (".nan", ".inf", "-.inf", "1e400"):
            continue  # not an integer at all: refused as such (checked below for one field)
        (tmp_path / "job.yaml").write_text(config_text(field, value))
        with pytest.raises(ConfigError) as err:
            load_config(tmp_path / "job.yaml")
        assert field in str(err.value), (value[:20], str(err.value))


@pytest.mark.parametrize("text, field", [
    ("command: [x]\nrestart: {budget_s: .nan}\n", "restart.budget_s"),
    ("command: [x]\nnproc_per_node: 1" + "0" * 5000 + "\n", "nproc_per_node"),
    ("command: [x]\nnproc_per_node: .inf\n", "nproc_per_node"),
    ("command: [x]\njob: a\x0cb\n", "position"),  # a byte YAML does not allow is named by where it is
])
def test_supervisor_run_refuses_a_bad_config_with_exit_2_naming_the_field(tmp_path, text, field):
    (tmp_path / "job.yaml").write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["run", "--config", str(tmp_path / "job.yaml")])
    assert code == 2 and field in err.getvalue() and "Traceback" not in err.getvalue(), err.getvalue()


def test_a_long_integer_is_text_where_a_string_is_wanted(tmp_path):
    digits = "1" + "0" * 5000
    (tmp_path / "job.yaml").write_text(f"command: [python, t.py, {digits}]\nenv: {{N: {digits}}}\n")
    cfg = load_config(tmp_path / "job.yaml")
    assert cfg.command[-1] == digits and cfg.env["N"] == digits


# ------------------------------------------------------------------ the state file and --fresh
BAD_STATES = {
    "100,000 nested [": b"[" * 100_000,
    "last_checkpoint without its fields": json.dumps({"job": "local", "phase": "completed", "attempt": 0,
                                                      "exit_code": 0, "last_checkpoint": {"x": 1}}).encode(),
    "a lone surrogate in job": b'{"job": "\\ud800", "phase": "completed", "attempt": 0}',
    "job a/b in a finished run": json.dumps({"job": "a/b", "phase": "completed", "attempt": 0}).encode(),
    "run_started of 400 digits": b'{"job": "local", "phase": "running", "attempt": 1, "run_started": 1'
                                 + b"0" * 400 + b"}",
    "NaN timestamps": b'{"job": "local", "phase": "running", "attempt": 1, "updated": NaN}',
    "a directory": None,
}


def put_state(log_dir, data) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / state_file.STATE_FILE
    if data is None:
        path.mkdir()
    else:
        path.write_bytes(data)


@pytest.mark.parametrize("bad", list(BAD_STATES))
def test_status_on_a_bad_state_file_says_why_and_fresh_sets_it_aside(tmp_path, bad):
    log_dir = tmp_path / "logs"
    put_state(log_dir, BAD_STATES[bad])
    status = subprocess.run([PYTHON, "-m", "supervisor", "status", "--log-dir", str(log_dir)], capture_output=True,
                            text=True, timeout=120, env=job_env(tmp_path))
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    assert "--fresh" in status.stderr  # and what to do about it
    path = log_dir / state_file.STATE_FILE
    with pytest.raises(state_file.StateError):
        state_file.load(path)
    # what --fresh does with a state it cannot use (controller/startup.py: Startup.open_history)
    where = state_file.archive(path, "unreadable")
    assert not path.exists() and where.parent == log_dir and where.name.startswith("supervisor-state.unreadable-")


@pytest.mark.parametrize("answer", [b'{"x": 1}', b"[" * 100_000, b"[1, 2]", b"not json"])
def test_status_names_a_port_that_is_not_the_jobs_supervisor(tmp_path, answer):
    """A state file whose recorded port another service now holds: status says so, no traceback."""
    import http.server
    import threading

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        log_dir = tmp_path / "logs"
        put_state(log_dir, json.dumps({"job": "local", "phase": "running", "attempt": 1, "http_host": "127.0.0.1",
                                       "http_port": server.server_address[1]}).encode())
        status = subprocess.run([PYTHON, "-m", "supervisor", "status", "--log-dir", str(log_dir)],
                                capture_output=True, text=True, timeout=120, env=job_env(tmp_path))
    finally:
        server.shutdown()
    assert "Traceback" not in status.stderr, status.stderr[-2000:]
    if answer == b'{"x": 1}':
        assert status.returncode == 1 and "not this job's supervisor" in status.stderr
    else:  # not a status at all: the last recorded state instead, with a warning
        assert status.returncode == 0 and "no supervisor answers" in status.stderr and "job local" in status.stdout


@pytest.mark.slow
def test_launch_fresh_runs_the_job_over_a_state_file_nested_100000_deep(tmp_path):
    """The state file that defeated --fresh (RecursionError: `controller_crashed ... run the same
    command again`, the file left in place): the job now runs."""
    log_dir = tmp_path / "logs"
    put_state(log_dir, BAD_STATES["100,000 nested ["])
    cmd = [PYTHON, "-m", "supervisor", "launch", "--fresh", "--nnodes", "1", "--log-dir", str(log_dir),
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-linger", "0", "--heartbeat-interval", "0.5",
           "--heartbeat-timeout", "3", "--", PYTHON, str(TRAIN), "--steps", "5", "--checkpoint-every", "5"]
    run = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "controller_crashed" not in run.stderr
    assert json.loads((log_dir / state_file.STATE_FILE).read_text())["phase"] == "completed"
    aside = list(log_dir.glob("supervisor-state.unreadable-*.json"))
    assert len(aside) == 1 and aside[0].read_bytes() == BAD_STATES["100,000 nested ["]  # kept for the post-mortem
    assert (tmp_path / "ckpt" / "step-0000000005" / "manifest.json").exists()  # it trained
