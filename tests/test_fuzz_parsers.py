"""Every parser of what the supervisor reads holds its contract under fuzzing (issue 32): it
accepts, or raises its one documented error type; each input within a time and a memory bound;
nothing outside what it may touch is touched. docs/parsers.md states each contract.

The inputs that broke a contract once are explicit examples (``@example``). In the normal suite
each property runs a modest, fixed (derandomized) set of examples; a longer, random run:

    HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest tests/test_fuzz_parsers.py -q

(100 times the examples; ``SUPERVISOR_FUZZ_SCALE=N`` sets another multiple).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import hmac
import io
import json
import logging
import os
import random
import shutil
import socket
import time
import tracemalloc
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import tiny_job, train_step
from supervisor import cli, protocol
from supervisor.checkpoint import CheckpointLoadError, ManifestError, Manifest, latest_complete, prune
from supervisor.checkpoint.checksum import hash_file
from supervisor.checkpoint.manifest import parse as parse_manifest
from supervisor.config import ConfigError, load as load_config, safe_load_bounded
from supervisor.controller import state as state_file
from supervisor.controller.decide import History
from supervisor.controller.http import start_http
from supervisor.platforms.node.agent_output import RankFailure, last_error, parse as parse_rank_output
from supervisor.platforms.slurm.hostlist import MAX_HOSTS, expand_hostlist

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"
SCALE = int(os.environ.get("SUPERVISOR_FUZZ_SCALE", "100" if LONG else "1"))


def fuzz(examples: int):
    """Hypothesis settings for one property: ``examples`` (times SCALE) inputs; derandomized in
    the normal suite (the same inputs every run: a failure is reproducible, never a flake)."""
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


def within(fn, *, seconds: float, mib: float, errors: type | tuple = (), trace: bool = True):
    """``fn()`` under a time and a (Python heap) memory bound: its value, or the documented error
    it raised. Any other exception propagates: the contract is broken. Only blocks allocated
    while it runs are traced (what was there before does not count); tracing slows pure-Python
    parsing several times, so ``trace=False`` (a large input) checks the time alone. The time
    bound catches a parser that blows up (quadratic or worse on its input), so it sits far above
    what the parse takes on a loaded 2-core CI machine: it is not a measure of speed (the
    benchmarks are)."""
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        try:
            out = fn()
        except errors as exc:  # type: ignore[misc]
            out = exc
    finally:
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] if trace else 0
        if trace:
            tracemalloc.stop()
    assert took < seconds, f"took {took:.2f} s (bound {seconds} s)"
    assert peak < mib * 2**20, f"peak {peak / 2**20:.1f} MiB of Python heap (bound {mib} MiB)"
    return out


# ------------------------------------------------------------------ values a hostile file holds
HUGE_INTS = [10**400, -(10**400), 2**63, 2**64, -(2**63) - 1]
ODD_TEXT = ["\ud800", "a\udcffb", "a\x00b", "../x", "/abs", "x\\y", "", "a" * 2000, "step-0000000001", "\x0c"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from(HUGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30), st.sampled_from(ODD_TEXT),
)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                      max_leaves=12)


def paths_of(obj, prefix=()) -> list[tuple]:
    """Every path into a JSON value (the value itself, each key and index below it)."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths_of(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths_of(v, prefix + (i,))
    return out


def replaced(obj, path: tuple, value, delete: bool = False):
    obj = copy.deepcopy(obj)
    if not path:
        return value
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


def nested(n: int) -> bytes:
    return b"[" * n + b"]" * n


def dumps(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def mutated_json(base) -> st.SearchStrategy[bytes]:
    """Bytes a damaged or hostile writer leaves where ``base`` (a JSON document) should be: a field
    replaced or removed, the bytes truncated or flipped, deep nesting, or anything at all."""
    paths = paths_of(base)
    good = dumps(base)
    field = st.builds(lambda p, v, d: dumps(replaced(base, p, v, d)), st.sampled_from(paths), values, st.booleans())
    cut = st.integers(0, len(good)).map(lambda n: good[:n])
    flip = st.tuples(st.integers(0, len(good) - 1), st.integers(1, 255)).map(
        lambda t: good[:t[0]] + bytes([good[t[0]] ^ t[1]]) + good[t[0] + 1:])
    return st.one_of(field, field, field, cut, flip, st.integers(1, 20_000).map(nested), st.binary(max_size=200))


# ------------------------------------------------------------------ a real small checkpoint root
S1, S2 = "step-0000000001", "step-0000000002"


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory):
    """Checkpoints of steps 1 and 2 of the tiny job (as the library writes them), restored to
    these bytes after every example."""
    root = tmp_path_factory.mktemp("fuzz") / "ckpt"
    mgr, model, opt, sched, cursor = tiny_job(root, keep=10)
    for step in (1, 2):
        train_step(model, opt, sched, cursor)
        mgr.save(step)
    originals = {p: p.read_bytes() for p in (root / S2).rglob("*") if p.is_file()}
    yield root
    for p, data in originals.items():
        p.write_bytes(data)


@contextlib.contextmanager
def damaged(root: Path, files: dict[str, bytes], manifest: bytes | None = None, rehash: bool = True):
    """Step 2 with ``files`` replaced and, with ``rehash``, its manifest agreeing with them (content
    whose digests match: only a parser can refuse it), or its manifest replaced by ``manifest``."""
    ck = root / S2
    saved = {p: p.read_bytes() for p in ck.rglob("*") if p.is_file()}
    try:
        m = json.loads(saved[ck / "manifest.json"])
        for rel, data in files.items():
            (ck / rel).write_bytes(data)
            if rehash:
                size, digest = hash_file(ck / rel, m["checksums"]["algorithm"])
                m["checksums"]["files"][rel] = {"size": size, "digest": digest}
        (ck / "manifest.json").write_bytes(manifest if manifest is not None else json.dumps(m).encode())
        yield ck
    finally:
        for p in list(ck.rglob("*")):
            if p.is_file() and p not in saved:
                p.unlink()
        for p, data in saved.items():
            p.write_bytes(data)


def base_manifest(root: Path) -> dict:
    return json.loads((root / S2 / "manifest.json").read_bytes())


_MANIFEST_BASE: dict = {}


def manifest_base() -> dict:
    """A real manifest (the tiny job's, step 2), built once for the strategies."""
    if not _MANIFEST_BASE:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            mgr, model, opt, sched, cursor = tiny_job(Path(d), keep=10)
            train_step(model, opt, sched, cursor)
            mgr.save(2)
            _MANIFEST_BASE.update(json.loads((Path(d) / S2 / "manifest.json").read_bytes()))
    return _MANIFEST_BASE


ISSUE_MANIFESTS = [
    # checksums.algorithm a list: TypeError (unhashable) out of latest_complete/prune
    lambda m: replaced(m, ("checksums", "algorithm"), ["xxh3_128"]),
    # created_unix of 400 digits: OverflowError (float()) out of latest_complete/prune
    lambda m: replaced(m, ("created_unix",), 10**400),
]


# ------------------------------------------------------------------ manifests
@fuzz(300)
@given(data=mutated_json(manifest_base()))
@example(data=dumps(ISSUE_MANIFESTS[0](manifest_base())))
@example(data=dumps(ISSUE_MANIFESTS[1](manifest_base())))
@example(data=nested(100_000))
@example(data=dumps(replaced(manifest_base(), ("trainer_state", "data_cursor"), [1, 2])))
@example(data=dumps(replaced(manifest_base(), ("checksums", "files", "\ud800"), {"size": 1, "digest": "ab" * 8})))
def test_a_manifest_parses_or_is_a_manifest_error(data):
    m = within(lambda: parse_manifest(data), seconds=2, mib=64, errors=ManifestError)
    if isinstance(m, Manifest):  # what a restore does with it: broadcast as a dict, read again, logged
        again = Manifest.from_dict(json.loads(json.dumps(m.to_dict())))
        assert again == m
        str(m).encode()
    else:
        assert m.reason and len(m.reason) < 2000


@fuzz(60)
@given(data=mutated_json(manifest_base()))
@example(data=dumps(ISSUE_MANIFESTS[0](manifest_base())))
@example(data=dumps(ISSUE_MANIFESTS[1](manifest_base())))
def test_discovery_moves_on_past_a_damaged_newest_manifest(ckpt_root, data):
    with damaged(ckpt_root, {}, manifest=data):
        found = within(lambda: latest_complete(ckpt_root, "fast"), seconds=5, mib=64)
        assert found.checkpoint is not None and found.checkpoint.name in (S1, S2)  # never hidden: S1 is good
        if found.checkpoint.name == S1:
            assert [s.name for s in found.skipped] == [S2] and found.skipped[0].reason
        pruned = within(lambda: prune(ckpt_root, 2, dry_run=True), seconds=5, mib=64)
        assert S1 in pruned.kept and not pruned.removed  # the good one is never deleted
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["checkpoints", "verify", str(ckpt_root)])
            listed = cli.main(["checkpoints", "list", "--json", str(ckpt_root)])
        assert code == (0 if found.checkpoint.name == S2 else 1), err.getvalue()
        assert listed == 0 and "Traceback" not in err.getvalue()


# ------------------------------------------------------------------ restore over a real checkpoint
def snapshot(model, opt, sched, cursor) -> dict:
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optim": copy.deepcopy(opt.state_dict()), "sched": copy.deepcopy(sched.state_dict()),
            "cursor": cursor.state_dict(), "rng": (random.getstate(), np.random.get_state()[1].tolist(),
                                                   torch.get_rng_state().clone())}


def same(a: dict, b: dict) -> bool:
    return (a["params"].keys() == b["params"].keys() and all(torch.equal(a["params"][k], b["params"][k])
                                                             for k in a["params"])
            and a["optim"] == b["optim"] and a["sched"] == b["sched"] and a["cursor"] == b["cursor"]
            and a["rng"][0] == b["rng"][0] and a["rng"][1] == b["rng"][1] and torch.equal(a["rng"][2], b["rng"][2]))


def torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


RNG = "rng/rank-00000.json"
SCHED = "trainer/scheduler.pt"


def rng_base() -> dict:
    from supervisor.checkpoint.state import capture_rng

    return json.loads(json.dumps(capture_rng()))


trainer_damage = st.one_of(
    st.builds(lambda b: {SCHED: b}, st.binary(max_size=64)),
    st.builds(lambda v: {SCHED: torch_bytes(v)}, values),
    st.builds(lambda b: {RNG: b}, mutated_json(rng_base())),
)

ISSUE_RESTORE = {
    "scheduler not a torch file": {SCHED: b"not a torch file"},
    "scheduler empty": {SCHED: b""},
    "scheduler not a dict": {SCHED: torch_bytes([1, 2, 3])},
    "scheduler a tuple": {SCHED: torch_bytes((1,))},
    "rng torch state of the wrong size": {RNG: json.dumps(rng_base() | {"torch": "AAAA"}).encode()},
    "rng numpy pos out of range": {RNG: json.dumps(replaced(rng_base(), ("numpy", "pos"), 10**30)).encode()},
    "rng python word out of range": {RNG: json.dumps(replaced(rng_base(), ("python", "state", 0), 2**40)).encode()},
    "rng nested 5000 deep": {RNG: nested(5000)},
}


@fuzz(25)
@given(files=trainer_damage)
@example(files=ISSUE_RESTORE["scheduler not a torch file"])
@example(files=ISSUE_RESTORE["scheduler empty"])
@example(files=ISSUE_RESTORE["scheduler not a dict"])
@example(files=ISSUE_RESTORE["scheduler a tuple"])
@example(files=ISSUE_RESTORE["rng torch state of the wrong size"])
@example(files=ISSUE_RESTORE["rng numpy pos out of range"])
@example(files=ISSUE_RESTORE["rng python word out of range"])
@example(files=ISSUE_RESTORE["rng nested 5000 deep"])
def test_restore_refuses_damaged_trainer_state_before_touching_anything(ckpt_root, files):
    with damaged(ckpt_root, files):
        mgr, model, opt, sched, cursor = tiny_job(ckpt_root, seed=7, keep=10)
        before = snapshot(model, opt, sched, cursor)
        out = within(lambda: mgr.restore(path=ckpt_root / S2), seconds=20, mib=256, errors=CheckpointLoadError)
        if isinstance(out, CheckpointLoadError):
            assert same(snapshot(model, opt, sched, cursor), before), "a refused checkpoint left a trace"
            assert SCHED in out.reason or "scheduler" in out.reason, out.reason  # the file that is wrong
        else:
            assert out.step == 2
            if RNG in files:  # an RNG file is never a refusal: exactly what it holds, or the derived seed
                assert out.rng in ("exact", "derived")
                if out.rng == "exact":
                    saved = base64.b64decode(json.loads(files[RNG])["torch"])
                    assert torch.get_rng_state().numpy().tobytes() == saved
            else:  # a scheduler state its loader took: the scheduler holds it
                held = sched.state_dict()
                assert all(repr(held.get(k)) == repr(v) for k, v in torch.load(io.BytesIO(files[SCHED])).items())
        # discovery passes over it to the good one; nothing but a CheckpointError ever leaves restore
        mgr2, *_ = tiny_job(ckpt_root, seed=8, keep=10)
        found = within(lambda: mgr2.restore(), seconds=20, mib=256)
        assert found is not None and found.path.name == (S1 if isinstance(out, CheckpointLoadError) else S2)


@fuzz(25)
@given(cursor=values)
@example(cursor=[1, 2])
@example(cursor={"seed": 0, "epoch": 0, "position": 10**400, "total": 0})
def test_a_data_cursor_that_is_not_one_is_refused_before_anything_loads(ckpt_root, cursor):
    m = replaced(base_manifest(ckpt_root), ("trainer_state", "data_cursor"), cursor)
    with damaged(ckpt_root, {}, manifest=json.dumps(m).encode()):
        mgr, model, opt, sched, c = tiny_job(ckpt_root, seed=7, keep=10)
        before = snapshot(model, opt, sched, c)
        out = within(lambda: mgr.restore(path=ckpt_root / S2), seconds=20, mib=256, errors=CheckpointLoadError)
        if isinstance(out, CheckpointLoadError):
            assert "data_cursor" in out.reason and same(snapshot(model, opt, sched, c), before)
        else:
            assert c.state_dict() == cursor


# ------------------------------------------------------------------ the state file and its consumers
STATE_BASE = {
    "job": "local", "phase": "running", "attempt": 2, "nodes": ["local-0"], "restore_from": "step-0000000010",
    "restored": "step-0000000010", "restored_step": 10, "ckpt_step_at_attempt_start": 10,
    "history": {"restarts": 1, "suspects": ["step-0000000020"], "suspect_why": {"step-0000000020": "corrupt"},
                "node_failures": {"local-1": 1}, "nonfinite_steps": [3], "had_checkpoint": True},
    "intake_port": 40000, "platform": {"kind": "local", "pids": {"local-0": 123}}, "pid": 1234,
    "updated": 1.7e9, "stop_reason": "", "ckpt_root": "/tmp/ckpt",
    "last_checkpoint": {"name": "step-0000000010", "step": 10, "created_unix": 1.7e9, "writer_world_size": 2},
    "run": 1, "run_started": 1.7e9, "launch_attempt": 2, "in_place_allowed": 0, "in_place_used": 0, "version": 2,
}
ISSUE_STATES = [
    nested(100_000),  # RecursionError: status died, --fresh left it in place
    dumps(STATE_BASE | {"last_checkpoint": {"x": 1}}),  # KeyError in status
    dumps(STATE_BASE | {"job": "\ud800"}),  # UnicodeEncodeError printing it
    dumps(STATE_BASE | {"job": "a/b", "phase": "completed", "exit_code": 0}),  # ValueError from set_aside
    dumps(STATE_BASE | {"run_started": 10**400}),  # OverflowError from float() in the daemon
]


@fuzz(150)
@given(data=mutated_json(STATE_BASE))
@example(data=ISSUE_STATES[0])
@example(data=ISSUE_STATES[1])
@example(data=ISSUE_STATES[2])
@example(data=ISSUE_STATES[3])
@example(data=ISSUE_STATES[4])
def test_a_state_file_loads_or_is_a_state_error_and_its_consumers_hold(tmp_path_factory, data):
    log_dir = tmp_path_factory.mktemp("state")
    path = log_dir / state_file.STATE_FILE
    path.write_bytes(data)
    saved = within(lambda: state_file.load(path), seconds=2, mib=64, errors=state_file.StateError)
    if isinstance(saved, dict):
        rec = state_file.to_json(saved)
        rec.pop("http_port", None)  # status would ask whatever listens there
        json.dumps(rec)
        text = cli.render_final(rec, str(log_dir))
        text.encode()
        float(saved.get("run_started", 0.0)), int(saved.get("run", 1))  # what the daemon takes from it
        path.write_text(json.dumps(rec))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["status", "--log-dir", str(log_dir)])
    assert code == (0 if isinstance(saved, dict) else 1) and "Traceback" not in err.getvalue()
    if not isinstance(saved, dict):
        # what --fresh does with a state it cannot use: set it aside, whatever its bytes
        where = state_file.archive(path, "unreadable")
        assert not path.exists() and where.parent == log_dir and where.read_bytes() == data
    shutil.rmtree(log_dir)


# ------------------------------------------------------------------ release ledgers
def _ledger_base() -> dict:
    from supervisor.controller import releases as rel

    v1 = rel.Version("0123456789ab", {"command": "[]", "code": "ab" * 32}, ("python", "train.py", "--steps", "9"),
                     {"A": "1"}, 1, "", "/code")
    v2 = rel.Version("ba9876543210", {"command": "[]"}, ("python", "train.py"), {}, 1, "reg/x:2", "")
    ledger = rel.Ledger({v1.id: rel.Release(v1, rel.KNOWN_GOOD, 1.7e9, 1.7e9, "trained", 25, (3,), (S1, S2)),
                         v2.id: rel.Release(v2, rel.REJECTED, 1.7e9, 1.7e9, "it failed", 0, (), (), False)},
                        v1.id, 1, {"startup_failure": 1},
                        last_rollback={"unix": 1.7e9, "from": v2.id, "to": v1.id, "reason": "startup_failure"},
                        pending=rel.Reject(v2.id, "startup_failure", "why", v1.id))
    return ledger.to_saved()


@fuzz(150)
@given(data=mutated_json(_ledger_base()))
def test_a_release_ledger_loads_or_is_a_release_error_and_its_decisions_hold(tmp_path_factory, data):
    from supervisor.controller import release_store, releases as rel

    log_dir = tmp_path_factory.mktemp("ledger")
    (log_dir / "releases").mkdir()
    (log_dir / "releases" / "ledger.json").write_bytes(data)
    ledger = within(lambda: release_store.load(log_dir), seconds=2, mib=64, errors=release_store.ReleaseError)
    if isinstance(ledger, rel.Ledger):
        # what a controller does with it at its start: every decision takes it, and it saves again
        policy = rel.Policy()
        v = rel.Version("feedfacecafe", {"x": "1"}, ("python", "t.py"))
        ledger, _ = rel.arrive(ledger, v, now_unix=1.8e9, policy=policy)
        ledger, _ = rel.judge(ledger, kind="rank_error", detail="x", step=None, stepped=False, node_failure=False,
                              policy=policy)
        rel.summary(ledger, policy)
        release_store.save(log_dir, ledger)
        assert release_store.load(log_dir) == ledger
    else:
        assert "ledger" in str(ledger) and "\n" not in str(ledger)
    shutil.rmtree(log_dir)


# ------------------------------------------------------------------ configs
YAML_ALPHABET = ":-[]{}#&*!|>'\"%@`,? \n\t\x0c\x00\x1b0123456789.eE+_abxyz~"
CONFIG_BASE = "command: [python, t.py]\nnproc_per_node: @@\nrestart: {budget_s: 900}\nheartbeat: {interval_s: 1}\n"
absurd_scalars = st.one_of(
    st.sampled_from([".nan", ".inf", "-.inf", ".NaN", "1e400", "-1e400", "0x" + "f" * 200, "1:2:3", "!!int 12",
                     "!!float abc", "2001-13-01", "~", "yes", "[1, 2]", "{a: 1}", "'x'", "0o777", "0b" + "1" * 90]),
    st.integers(1, 6000).map(lambda n: "1" + "0" * n),
    st.integers(1, 3000).map(lambda n: "1" + ":1" * n),
    st.text(YAML_ALPHABET, max_size=30),
)
ISSUE_CONFIGS = [
    "command: [x]\njob: a\x0cb\n",  # ReaderError (the loader was built outside the try)
    "command: [x]\nrestart: {budget_s: 1" + "0" * 400 + "}\n",  # OverflowError: float() of a huge integer
    "command: [x]\nnproc_per_node: 1" + "0" * 5000 + "\n",  # ValueError past 4,300 digits, no field named
    "command: [x]\njob: 1" + "0" * 5000 + "\n",
    "command: [x]\nnodes: {min: 2, max: 1" + "0" * 5000 + "}\n",
    "command: [x]\nrestart: {budget_s: .nan}\n",  # accepted: ran a job
    "command: [x]\nheartbeat: {interval_s: 1, timeout_s: .inf}\n",
    "command: [x]\nnproc_per_node: 1" + ":1" * ((1 << 19) - 40) + "\n",  # 1 MiB of base 60: 25-55 s, accepted
]


@fuzz(150)
@given(text=st.one_of(absurd_scalars.map(lambda v: CONFIG_BASE.replace("@@", v)),
                      st.text(YAML_ALPHABET, max_size=300).map(lambda t: "command: [x]\n" + t),
                      st.text(YAML_ALPHABET, max_size=300)))
@example(text=ISSUE_CONFIGS[0])
@example(text=ISSUE_CONFIGS[1])
@example(text=ISSUE_CONFIGS[2])
@example(text=ISSUE_CONFIGS[3])
@example(text=ISSUE_CONFIGS[4])
@example(text=ISSUE_CONFIGS[5])
@example(text=ISSUE_CONFIGS[6])
@example(text=ISSUE_CONFIGS[7])
def test_a_config_loads_or_is_a_config_error_with_finite_bounded_numbers(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "job.yaml"
    path.write_text(text)
    cfg = within(lambda: load_config(path), seconds=5, mib=64, errors=ConfigError, trace=len(text) < 100_000)
    if isinstance(cfg, ConfigError):
        assert type(cfg) is ConfigError and str(cfg)
        return
    stack = [cfg.to_dict()]
    while stack:  # every number the job runs with is finite and sane
        v = stack.pop()
        if isinstance(v, dict):
            stack += v.values()
        elif isinstance(v, (list, tuple)):
            stack += v
        elif isinstance(v, float):
            assert abs(v) <= 1e9
        elif isinstance(v, int) and not isinstance(v, bool):
            assert abs(v) <= 2**53


@fuzz(150)
@given(text=st.text(YAML_ALPHABET, max_size=400))
def test_yaml_parsing_alone_is_bounded(text):
    within(lambda: safe_load_bounded(text), seconds=2, mib=64, errors=ConfigError)


# ------------------------------------------------------------------ Slurm hostlists
hostlists = st.one_of(
    st.text("n0123456789[]-,x² ", max_size=40),
    st.builds(lambda p, rs, s: f"{p}[{','.join(rs)}]{s}", st.sampled_from(["n", "gpu", ""]),
              st.lists(st.one_of(st.integers(0, 10**12).map(str),
                                 st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)).map(lambda t: f"{t[0]}-{t[1]}")),
                       min_size=1, max_size=4),
              st.sampled_from(["", "-ib"])),
)


@fuzz(300)
@given(expr=hostlists)
@example(expr="n[1-999999999]")  # MemoryError
@example(expr="n[1-10000000]")  # 10 million names, 3 s
@example(expr="n[0-" + "9" * 5000 + "]")
@example(expr="n[1-3],m[1-" + str(MAX_HOSTS) + "]")
def test_a_hostlist_expands_within_its_bounds_or_is_a_value_error(expr):
    out = within(lambda: expand_hostlist(expr), seconds=2, mib=64, errors=ValueError)
    if isinstance(out, list):
        assert len(out) <= MAX_HOSTS and all(isinstance(n, str) and n for n in out)


@fuzz(100)
@given(prefix=st.sampled_from(["n", "gpu-", "a"]), spans=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 20),
                                                                           st.integers(1, 4)), min_size=1, max_size=4))
def test_a_valid_hostlist_expands_to_exactly_its_names(prefix, spans):
    items, names = [], []
    for lo, n, width in spans:
        items.append(f"{lo:0{width}d}-{lo + n:0{width}d}")
        names += [f"{prefix}{i:0{width}d}" for i in range(lo, lo + n + 1)]
    assert expand_hostlist(f"{prefix}[{','.join(items)}]") == names


# ------------------------------------------------------------------ rank output
summary_lines = st.one_of(
    st.builds(lambda r: f"  rank      : {r} (local_rank: 0)", st.one_of(st.integers(0, 99), st.just("1" * 5000))),
    st.builds(lambda c: f"  exitcode  : {c} (pid: 1)", st.one_of(st.integers(-15, 3), st.just("-" + "9" * 5000))),
    st.builds(lambda t: f"  traceback : {t}", st.text(max_size=20)),
    st.builds(lambda r: f"[rank{r}]: ValueError: boom", st.one_of(st.integers(0, 9), st.just("7" * 5000))),
    st.sampled_from(["train.py FAILED", "Root Cause (first observed failure):", "[0]:", "", " " * 1000]),
    st.integers(1, 5000).map(lambda n: "\n" * n),
    st.text(max_size=40),
)
ISSUE_RANK_OUTPUT = [
    " FAILED\n" + "\n" * 65536,  # quadratic failure-block regex: 4.4 s
    " FAILED\n" + "\n" * 160_000,  # 13 s
    " FAILED\n  rank : 1" + "0" * 5000 + "\n  exitcode : 1\n  traceback : x\n",  # ValueError past 4,300 digits
    " FAILED\n  rank : 1\n  exitcode : -1" + "0" * 5000 + "\n  traceback : x\n",
    "[rank" + "1" * 5000 + "]: ValueError: boom\n x FAILED\n",
]


@fuzz(200)
@given(text=st.lists(summary_lines, max_size=40).map("\n".join))
@example(text=ISSUE_RANK_OUTPUT[0])
@example(text=ISSUE_RANK_OUTPUT[1])
@example(text=ISSUE_RANK_OUTPUT[2])
@example(text=ISSUE_RANK_OUTPUT[3])
@example(text=ISSUE_RANK_OUTPUT[4])
def test_rank_output_is_parsed_in_bounded_time_and_never_raises(text):
    failures = within(lambda: parse_rank_output(text), seconds=10, mib=64)
    assert isinstance(failures, tuple) and all(isinstance(f, RankFailure) for f in failures)
    assert all(abs(f.exit_code) < 10**9 and 0 <= f.rank < 10**9 for f in failures)
    assert isinstance(within(lambda: last_error(text), seconds=10, mib=64), str)


def test_rank_output_of_any_size_is_parsed_within_its_byte_cap():
    # what a platform may hand over without a cap of its own: 8 MiB of output, its summary at the end
    summary = "\n train.py FAILED\n  rank : 3 (local_rank: 0)\n  exitcode : 1 (pid: 9)\n  traceback : boom\n"
    huge = "\n" * (8 << 20) + summary
    failures = within(lambda: parse_rank_output(huge), seconds=10, mib=64)
    assert [(f.rank, f.exit_code, f.error) for f in failures] == [(3, 1, "boom")]
    assert within(lambda: last_error(huge + "\n" * (8 << 20)), seconds=10, mib=64) == ""


# ------------------------------------------------------------------ wire frames (supervisor.protocol)
KEYS = protocol.derive_keys(b"0123456789abcdef" * 3)
_GOOD_CONTROL = protocol.encode(protocol.control_message("abort", attempt=1, rank=2, seq=5, launch="a" * 32),
                                KEYS.control)


def framed(body: bytes, key: bytes) -> bytes:
    """A frame whose MAC is right for ``body`` (HMAC-SHA256, truncated: the documented frame): what
    only a holder of the key can send, so only the parser stands between ``body`` and its reader."""
    return protocol.MAGIC + hmac.new(key, body, hashlib.sha256).digest()[:protocol.MAC_BYTES] + body


@fuzz(200)
@given(body=st.one_of(st.binary(max_size=300), mutated_json(json.loads(_GOOD_CONTROL[len(protocol.MAGIC) + protocol.MAC_BYTES:])),
                      st.integers(1, 5000).map(nested)),
       raw=st.binary(max_size=100))
def test_frames_decode_or_are_a_protocol_error(body, raw):
    for key, decode in ((KEYS.heartbeat, protocol.decode_heartbeat), (KEYS.control, protocol.decode_control),
                        (KEYS.control, protocol.decode_frame)):
        for frame in (framed(body, key), raw, protocol.MAGIC + raw):
            within(lambda: decode(frame, key), seconds=1, mib=32, errors=protocol.ProtocolError)


_GOOD_NODE = protocol.encode_node_frames(
    [(protocol.Heartbeat(job="j", attempt=1, rank=r, world_size=4, seq=9, step=7, phase="collective", phase_s=0.5,
                         launch="a" * 32, node="n0", pid=100 + r, coll_seq=70 + r % 2, coll_inside=bool(r % 2),
                         ckpt_root="/ckpt", restored="step-0000000005", restore_state="restored",
                         restore_refused=(("step-0000000006", "truncated"),)), 0.25) for r in range(4)],
    KEYS.heartbeat)[0]


_NODE_BODY = _GOOD_NODE[len(protocol.MAGIC) + protocol.MAC_BYTES:]
_NODE_CHANGES = [
    (b'"held":[0.25,', b'"held":[1e999,'),                   # an infinite held time
    (b'"held":[0.25,', b'"held":['),                         # one held time short
    (b'[["j",1,0,4,9,7,', b'[["j",1,9,4,9,7,'),              # rank >= world size
    (b'"' + b"a" * 32 + b'"', b'""'),                        # a heartbeat of no launch
    (b',"' + b"a" * 32 + b'"', b""),                         # its launch left out: the fields after it shift
]


def test_each_node_frame_example_changes_the_good_frame():
    assert all(old in _NODE_BODY for old, _ in _NODE_CHANGES)


@fuzz(200)
@given(body=st.one_of(mutated_json(json.loads(_NODE_BODY)),
                      st.integers(1, 5000).map(nested)))
@example(body=_NODE_BODY.replace(*_NODE_CHANGES[0], 1))
@example(body=_NODE_BODY.replace(*_NODE_CHANGES[1], 1))
@example(body=_NODE_BODY.replace(*_NODE_CHANGES[2], 1))
@example(body=_NODE_BODY.replace(*_NODE_CHANGES[3], 1))
@example(body=_NODE_BODY.replace(*_NODE_CHANGES[4], 1))
def test_a_node_frame_decodes_or_is_a_protocol_error(body):
    frame = framed(body, KEYS.heartbeat)
    beats = within(lambda: protocol.decode_node_frame(frame, KEYS.heartbeat), seconds=1, mib=32,
                   errors=protocol.ProtocolError)
    if isinstance(beats, list):  # whatever was accepted is a heartbeat a rank could have sent on its own
        for hb, held in beats:
            assert 0 <= held <= protocol.MAX_HELD_S and hb.rank < hb.world_size
            assert protocol.decode_heartbeat(protocol.encode(hb.to_payload(), KEYS.heartbeat), KEYS.heartbeat) == hb


_GOOD_ANSWER = protocol.restore_point_answer(attempt=3, checkpoint="step-0000000002", exclude=["step-0000000003"],
                                            required=True)
_GOOD_REFUSED = [["step-0000000003", "fails its sha256 checksum (corrupt)"], ["step-0000000002", "unreadable"]]


@fuzz(200)
@given(body=mutated_json(_GOOD_ANSWER), refused=mutated_json(_GOOD_REFUSED),
       text=st.one_of(st.text(max_size=2000), st.just("compute=1e999,data=nan"), st.just("init=" + "9" * 5000),
                      st.just("0=5/4 1=-1/-1"), st.just("0=4/5"), st.just("0=" + "9" * 5000 + "/1"),
                      st.just(" ".join(f"{i}=1/1" for i in range(40)))))
def test_the_ranks_contracts_parse_or_are_a_protocol_error(body, refused, text):
    from supervisor.checkpoint.discovery import parse_name
    from supervisor.protocol import ranklog

    point = within(lambda: protocol.parse_restore_point(body, is_name=parse_name), seconds=1, mib=32,
                   errors=protocol.ProtocolError)
    if isinstance(point, protocol.RestorePoint):
        assert all(parse_name(n) for n in point.exclude + ((point.checkpoint,) if point.checkpoint else ()))
    try:
        value = json.loads(refused)
    except (ValueError, RecursionError):
        value = refused.decode(errors="replace")
    pairs = within(lambda: protocol.decode_refused(value), seconds=1, mib=32, errors=protocol.ProtocolError)
    if isinstance(pairs, tuple):
        assert len(pairs) <= protocol.REFUSED_MAX and all(isinstance(n, str) and isinstance(w, str) for n, w in pairs)
    groups = within(lambda: protocol.decode_groups(text), seconds=1, mib=32, errors=protocol.ProtocolError)
    if isinstance(groups, dict):
        assert len(groups) <= protocol.GROUPS_MAX and all(-1 <= c <= e for e, c in groups.values())
        assert protocol.decode_groups(protocol.encode_groups(groups)) == groups
    got = within(lambda: protocol.decode_watchdog(text), seconds=1, mib=32, errors=protocol.ProtocolError)
    if isinstance(got, dict):
        assert all(0 < v < float("inf") for v in got.values()) and set(got) <= set(protocol.TIMED_PHASES)
    records = within(lambda: ranklog.parse_records(text.splitlines() + [body.decode(errors="replace")]), seconds=1,
                     mib=32)
    assert all(isinstance(r, dict) for r in records)


# ------------------------------------------------------------------ the controller's HTTP API
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def ask(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


@contextlib.contextmanager
def serving():
    """The controller's real HTTP server (start_http) on a loop in another thread, with a log
    handler that sees every record at any level."""
    import threading

    handler = _Records()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    controller = types.SimpleNamespace(http_port=None)
    runner = asyncio.run_coroutine_threadsafe(start_http(controller, "127.0.0.1", 0), loop).result(30)
    try:
        yield controller.http_port, handler.records
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        root.removeHandler(handler)
        root.setLevel(old_level)


malformed_requests = st.one_of(
    st.builds(lambda v: b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: " + v + b"\r\n\r\n",
              st.sampled_from([b"abc", b"-1", b"1 2", b"\xff", b"99999999999999999999999999"])),
    st.builds(lambda h: b"GET /healthz HTTP/1.1\r\n" + h + b"\r\n\r\n",
              st.sampled_from([b"no colon here", b": empty name", b"Bad\x00Name: x", b"X: \x00", b" folded: x"])),
    st.builds(lambda v: b"GET /healthz HTTP/" + v + b"\r\nHost: x\r\n\r\n", st.sampled_from([b"9.9", b"1.x", b"", b"11"])),
    st.builds(lambda p: b"GET " + p + b" HTTP/1.1\r\nHost: x\r\n\r\n", st.sampled_from([b"", b"\x00", b"/a b/c"])),
    st.builds(lambda n: b"GET /healthz HTTP/1.1\r\nX: " + b"a" * n + b"\r\n\r\n", st.just(70_000)),
    st.builds(lambda a, b: b"GET /status HTTP/1.1\r\nX: " + a + b"\x00" + b + b"\r\n\r\n",
              *[st.binary(max_size=30).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b""))] * 2),
)


@fuzz(30)
@given(requests=st.lists(malformed_requests, min_size=1, max_size=5))
def test_malformed_requests_are_400_with_one_log_line_and_no_traceback(requests):
    with serving() as (port, records):
        answers = [ask(port, r) for r in requests * 4]
    assert all(a.split(b" ", 2)[:2] in ([b"HTTP/1.0", b"400"], [b"HTTP/1.1", b"400"]) for a in answers), \
        {a[:40] for a in answers}
    assert not [r for r in records if r.exc_info and r.levelno >= logging.INFO], \
        [r.getMessage() for r in records if r.exc_info][:3]
    assert len([r for r in records if r.levelno >= logging.WARNING]) <= 1


def test_a_flood_of_malformed_requests_is_one_log_line_naming_how_many():
    # the issue's input: aiohttp logged a full traceback for each one
    bad = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"
    with serving() as (port, records):
        answers = [ask(port, bad) for _ in range(50)]
    assert all(a.split(b" ", 2)[:2] in ([b"HTTP/1.0", b"400"], [b"HTTP/1.1", b"400"]) for a in answers)
    logged = [r for r in records if r.levelno >= logging.WARNING]
    assert len(logged) == 1 and logged[0].exc_info is None, [r.getMessage() for r in logged][:3]
    assert "Content-Length" in logged[0].getMessage() and "event=http_bad_request" in logged[0].getMessage()
