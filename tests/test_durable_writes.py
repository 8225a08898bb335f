"""Durable files are written under a temporary name of their own (issue 24, item 4): two writers
of the same state file, even with the same pid, never write into one temporary file, and a
reader never sees a torn or empty state; rotated files (events.jsonl) keep their archived
generations and are read whole."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from supervisor.controller.state import load
from supervisor.files import generations, read_lines, rotate, write_atomic

REPO = Path(__file__).resolve().parents[1]

# a writer as a controller that is PID 1 in its container: two of them on one shared volume
# (the split-brain window the lease closes) have the same pid
WRITER = textwrap.dedent("""
    import os, sys, time
    os.getpid = lambda: 1
    from supervisor.controller.state import save
    path, who, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    state = {"job": "j", "phase": "running", "attempt": who, "nodes": [f"node-{who}-{i:05d}" for i in range(3000)],
             "restore_from": None, "history": {"restarts": who}, "intake_port": 5000, "http_port": 5001,
             "platform": {"nodes": {}}, "pid": 1, "updated": 0.0}
    n = 0
    while time.monotonic() < until:
        state["updated"] = float(n)
        save(__import__("pathlib").Path(path), state)
        n += 1
    print(n)
""")


def test_two_writers_of_the_state_file_race_and_no_reader_sees_a_torn_or_empty_file(tmp_path):
    path = tmp_path / "supervisor-state.json"
    until = time.monotonic() + 3.0
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(who), str(until)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for who in (1, 2)]
    reads, seen, bad = 0, set(), []
    while any(w.poll() is None for w in writers):
        try:
            st = load(path)
        except Exception as exc:  # noqa: BLE001 - every refusal is what the test counts
            bad.append(repr(exc)[:200])
            continue
        if st is None:
            if reads or seen:  # absent only before the first rename
                bad.append("the state file vanished")
            continue
        reads += 1
        seen.add(st["attempt"])
        assert len(st["nodes"]) == 3000 and all(n.startswith(f"node-{st['attempt']}-") for n in st["nodes"])
    outs = [w.communicate() for w in writers]
    assert all(w.returncode == 0 for w in writers), outs
    written = [int(out) for out, _ in outs]
    assert not bad, f"{len(bad)} of {reads + len(bad)} reads refused, e.g. {bad[:3]}"
    # both writers really raced (each renamed many files over the other's), and the reader saw both
    assert min(written) > 20 and reads > 50 and seen == {1, 2}, (written, reads, seen)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_an_atomic_write_never_reuses_a_name_and_never_follows_a_planted_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    path = tmp_path / "f.json"
    names = []
    real_open = os.open

    def recording_open(p, flags, *a):
        names.append((os.fspath(p), flags))
        return real_open(p, flags, *a)

    os.open = recording_open
    try:
        write_atomic(path, b"one")
        write_atomic(path, b"two")
    finally:
        os.open = real_open
    tmps = [(p, flags) for p, flags in names if p.endswith(".tmp")]
    assert len(tmps) == 2 and tmps[0][0] != tmps[1][0]
    assert all(flags & os.O_EXCL and flags & os.O_NOFOLLOW for _, flags in tmps)
    assert path.read_bytes() == b"two" and oct(path.stat().st_mode & 0o777) == "0o600"
    path.unlink()
    path.symlink_to(target)  # a link planted at the name: replaced, its target untouched
    write_atomic(path, b"three")
    assert not path.is_symlink() and path.read_bytes() == b"three" and target.read_bytes() == b"keep"


def test_a_rotated_file_keeps_its_newest_generations_and_reads_whole_oldest_first(tmp_path):
    path = tmp_path / "events.jsonl"
    for i in range(5):
        path.write_text(f"line {i}a\nline {i}b\n")
        rotate(path, keep=3)
    path.write_text("line 5a\n")
    assert [p.name for p in generations(path)] == ["events.jsonl.3", "events.jsonl.2", "events.jsonl.1",
                                                    "events.jsonl"]
    assert list(read_lines(path)) == ["line 2a", "line 2b", "line 3a", "line 3b", "line 4a", "line 4b", "line 5a"]


def test_the_submitted_batch_script_is_kept_private_and_its_config_written_under_a_name_of_its_own(tmp_path):
    """The batch script holds the job's config, its ``env`` too (API keys): kept 0600, and the
    config it writes goes through a temporary file of its own (mktemp), never a fixed name."""
    import subprocess as sp

    from supervisor.config import from_dict
    from supervisor.platforms.slurm.sbatch import render_batch_script, submit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\ncat > /dev/null\necho 4711\n")
    (bin_dir / "sbatch").chmod(0o755)
    cfg = from_dict({"command": ["python", "x.py"], "job": "j", "log_dir": str(tmp_path / "logs"),
                     "env": {"WANDB_API_KEY": "secret-key"}, "nodes": {"min": 1, "max": 1},
                     "platform": {"kind": "slurm", "slurm": {"bin_dir": str(bin_dir)}}})
    old = os.umask(0o022)  # the usual umask: a plain write would leave it world-readable
    try:
        rendered = render_batch_script(cfg, time_limit=None, warning_s=60, requeue=False, sbatch_opts=[],
                                       python="python3", workdir=str(tmp_path))
        assert submit(rendered) == "4711"
    finally:
        os.umask(old)
    kept = tmp_path / "logs" / "slurm-submit" / "j-4711.sbatch"
    assert "secret-key" in kept.read_text() and oct(kept.stat().st_mode & 0o777) == "0o600"
    assert '$config.tmp' not in rendered.script and 'tmp=$(mktemp "$config.XXXXXXXX")' in rendered.script
    sp.run(["bash", "-n"], input=rendered.script, text=True, check=True)
