"""Shared fixtures: real torchrun launches of the example job, and log readers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"
PYTHON = sys.executable


def torchrun_cmd(nproc: int) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def job_env(tmp: Path, fault: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")}
    if fault:
        env["SUPERVISOR_FAULT"] = fault
    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(parents=True, exist_ok=True)
    env.update(TMPDIR=str(tmpdir), OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    env.update(extra or {})
    return env


def run_job(tmp: Path, nproc: int, args: list[str], *, fault: str | None = None, expect_ok: bool = True,
            timeout: float = 240, script: Path = TRAIN, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` under a real torchrun agent (gloo, CPU) with its own TMPDIR."""
    env = job_env(tmp, fault, env)
    cmd = torchrun_cmd(nproc) + [str(script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"job failed rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    if not expect_ok and proc.returncode == 0:
        raise AssertionError(f"job was expected to fail but succeeded\n{proc.stderr[-3000:]}")
    return proc


def kill_tree(pid: int) -> None:
    """SIGKILL a process, every descendant, and their process groups (torchrun gives each
    worker a session of its own, so killing the agent's group alone leaks the ranks)."""
    from supervisor.procfs import descendants

    for p in [pid, *descendants(pid)]:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            for kill in (os.killpg, os.kill):
                try:
                    kill(p, sig)
                except (ProcessLookupError, PermissionError):
                    pass


class BackgroundJob:
    """A torchrun job in its own session, killed (whole process group) when the test ends."""

    def __init__(self, tmp: Path, nproc: int, args: list[str], *, fault: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.out = open(tmp / "job-output.txt", "w")
        self.proc = subprocess.Popen(torchrun_cmd(nproc) + [str(TRAIN), *args], env=job_env(tmp, fault, env),
                                     stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
        self.output_path = tmp / "job-output.txt"

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None and not predicate():
                raise AssertionError(f"job exited rc={self.proc.returncode} before {what}:\n{self.output()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output()[-4000:]}")

    def output(self) -> str:
        self.out.flush()
        return self.output_path.read_text(errors="replace")

    def kill(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait(timeout=30)
        self.out.close()


class SupervisorRun:
    """``supervisor launch`` as a real subprocess (its own session), with its files at hand."""

    def __init__(self, tmp: Path, job_args: list[str], *, nnodes: str = "2", slots: int = 0, fault: str | None = None,
                 extra: list[str] | None = None, log_dir: Path | None = None,
                 env: dict[str, str] | None = None, script: Path = TRAIN) -> None:
        self.tmp = tmp
        self.log_dir = log_dir or tmp / "sv-logs"
        self.ckpt = tmp / "sv-ckpt"
        self.cmd = [PYTHON, "-m", "supervisor", "launch", "--nnodes", nnodes, "--slots", str(slots),
                    "--checkpoint-dir", str(self.ckpt), "--log-dir", str(self.log_dir),
                    "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3", "--hang-timeout-floor", "3",
                    "--metrics-linger", "0",
                    *(extra or []), "--", PYTHON, str(script), *job_args]
        self.env = job_env(tmp, fault, env)
        self.start()

    def start(self) -> None:
        self.out = open(self.tmp / "supervisor-output.txt", "a")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.tmp)

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervisor still running after {timeout}s\n{self.output()[-5000:]}") from None

    def output(self) -> str:
        self.out.flush()
        return (self.tmp / "supervisor-output.txt").read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict]:
        try:
            lines = (self.log_dir / "events.jsonl").read_text().splitlines()
        except OSError:
            return []
        evs = [json.loads(line) for line in lines if line.strip()]
        return [e for e in evs if name is None or e["event"] == name]

    def wait_event(self, name: str, /, timeout: float = 90, **match) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events(name):
                if all(e.get(k) == v for k, v in match.items()):
                    return e
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no event {name} {match}; events: {self.events()}\n{self.output()[-4000:]}")

    def rank_log(self, rank: int) -> list[dict]:
        return read_log(self.log_dir / "ranks", rank)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.out.close()


def kill_leftovers(log_dir: Path) -> None:
    """Kill every agent process group a test's supervisor left behind (by the state file)."""
    try:
        state = json.loads((Path(log_dir) / "supervisor-state.json").read_text())
    except (OSError, ValueError):
        return
    from supervisor.procfs import start_time

    for info in state.get("platform", {}).get("nodes", {}).values():
        kill_tree(int(info["pid"]))
        for pid, started in (info.get("ranks") or {}).items():
            if start_time(int(pid)) == started:  # not a reused pid
                kill_tree(int(pid))


def read_heartbeat(log_dir: Path, rank: int) -> dict | None:
    try:
        return json.loads((Path(log_dir) / f"heartbeat-rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def read_log(log_dir: Path, rank: int = 0) -> list[dict]:
    path = Path(log_dir) / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses_by_step(records: list[dict], attempt_filter=None) -> dict[int, dict]:
    """Last record per step (a resumed run re-logs the steps after its checkpoint)."""
    out: dict[int, dict] = {}
    for r in records:
        out[r["step"]] = r
    return out


def copy_root_upto(src: Path, dst: Path, max_step: int) -> Path:
    """A copy of a checkpoint root holding only checkpoints of steps <= max_step."""
    from supervisor.checkpoint.discovery import candidates

    dst.mkdir(parents=True)
    for c in candidates(src):
        if c.step <= max_step:
            shutil.copytree(c.path, dst / c.name)
    return dst


@pytest.fixture
def supervisor_run(tmp_path: Path):
    runs: list[SupervisorRun] = []

    def start(job_args: list[str], **kw) -> SupervisorRun:
        run = SupervisorRun(tmp_path, job_args, **kw)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill()
        kill_leftovers(run.log_dir)


@pytest.fixture
def background_job(tmp_path: Path):
    jobs: list[BackgroundJob] = []

    def start(nproc: int, args: list[str], **kw) -> BackgroundJob:
        job = BackgroundJob(tmp_path, nproc, args, **kw)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()
