"""The slurm platform on a real multi-node Slurm cluster on this machine.

``scripts/slurm-cluster.sh`` installs Debian's slurm-wlm + munge when missing and starts
slurmctld and three slurmd (n1-n3, each in its own cgroup-v2 folder so a whole node can be
killed or frozen). Tests drive the real platform (srun steps, squeue, scancel) and the real
``supervisor sbatch`` wrapper, inject real faults (a node's cgroup killed or frozen, a rank
SIGSTOPped, the time-limit warning signal, slurmctld stopped) and check what the supervisor
observed, decided and did (events.jsonl) and the loss path against an uninterrupted control.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from conftest import losses_by_step, read_log, run_job
from supervisor.platforms.base import LaunchSpec, NodeState, PlatformError
from supervisor.platforms.slurm import SlurmPlatform

pytestmark = pytest.mark.slow
if os.environ.get("SUPERVISOR_SLURM_TESTS") == "0":
    pytest.skip("real-cluster Slurm tests switched off (SUPERVISOR_SLURM_TESTS=0)", allow_module_level=True)
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
CLUSTER_DIR = os.environ.get("SLURM_CLUSTER_DIR", "/tmp/es-slurm")
PY = sys.executable
TRAIN = str(REPO / "examples" / "train.py")
STEPS = 60
JOB = ["--steps", str(STEPS), "--checkpoint-every", "5", "--step-sleep", "0.3", "--global-batch", "12"]
FAST = {"platform": {"kind": "slurm", "slurm": {"kill_confirm_s": 3, "poll_interval_s": 1, "command_timeout_s": 15}},
        "heartbeat": {"interval_s": 0.5, "timeout_s": 3}, "health": {"phase_floor_s": 5},
        "restart": {"kill_grace_s": 20}}


class Cluster:
    def __init__(self) -> None:
        self.env = {**os.environ, "SLURM_CLUSTER_DIR": CLUSTER_DIR, "SLURM_CONF": f"{CLUSTER_DIR}/slurm.conf",
                    "OMP_NUM_THREADS": "1"}
        self.env = {k: v for k, v in self.env.items() if not k.startswith(("SUPERVISOR_", "SLURM_JOB", "SBATCH_"))}

    def sh(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"slurm-cluster.sh {' '.join(args)}: rc={proc.returncode}\n{proc.stderr[-2000:]}")
        return proc

    def cmd(self, *argv: str, timeout: float = 20, check: bool = True) -> str:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv}: rc={proc.returncode} {proc.stderr}")
        return proc.stdout

    def node_states(self) -> dict[str, str]:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def job(self, job_id: str) -> dict[str, str]:
        out = self.cmd("scontrol", "show", "job", "-o", job_id, check=False)
        return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)

    def wait_job(self, job_id: str, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"),
                 timeout: float = 150) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {self.job(job_id).get('JobState')} after {timeout}s")

    def healthy(self) -> None:
        """No job left; every node idle with a live slurmd (a killed or frozen node is restarted)."""
        self.sh("heal", timeout=150)


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster needs root (slurmd runs the jobs' tasks)")
    c = Cluster()
    if not all(shutil.which(b) for b in ("slurmctld", "slurmd", "srun", "munged")):
        proc = c.sh("install", timeout=600, check=False)
        if proc.returncode != 0:
            pytest.skip(f"Slurm cannot be installed here: {proc.stderr[-500:]}")
    proc = c.sh("start", timeout=120, check=False)
    if proc.returncode != 0:
        c.sh("stop", check=False)
        pytest.skip(f"the Slurm test cluster cannot be started: {proc.stderr[-1000:]}")
    try:
        yield c
    finally:
        c.sh("stop", timeout=120, check=False)


@pytest.fixture
def slurm(cluster):
    cluster.healthy()
    yield cluster
    cluster.cmd("scancel", "--user=root", check=False)


# ---------------------------------------------------------------------------- the platform itself
def allocation(c: Cluster, nodes: int = 3) -> str:
    job_id = c.cmd("sbatch", "--parsable", "--no-kill", f"-N{nodes}", "-o", "/dev/null", "--wrap", "sleep 900").strip()
    c.wait_job(job_id, states=("RUNNING",), timeout=60)
    return job_id


def spec(attempt: int, nodes: list[str], command: list[str]) -> LaunchSpec:
    return LaunchSpec(attempt=attempt, nodes=nodes, nnodes_min=len(nodes), nnodes_max=len(nodes), nproc_per_node=1,
                      command=command, env={"OMP_NUM_THREADS": "1"}, rdzv_endpoint="127.0.0.1:0",
                      rdzv_id=f"t{attempt}-{time.time_ns()}")


def steps(c: Cluster, job_id: str) -> list[str]:
    return [ln.split("|")[1] for ln in c.cmd("squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j").splitlines()
            if "|" in ln and not ln.startswith(f"{job_id}.batch")]


def test_platform_launch_observe_kill_teardown(slurm, tmp_path):
    job_id = allocation(slurm)

    async def scenario():
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = SlurmPlatform(job_id, tmp_path, job="t", kill_confirm_s=5, poll_interval_s=0.5,
                          base_env=slurm.env).start()
        assert p.slots() == ["n1", "n2", "n3"] and p.batch_host == "n1" and p.node_addr("n2") == "127.0.0.1"
        sp = spec(0, ["n1", "n2", "n3"], ["sleep", "120"])
        sp = LaunchSpec(**{**sp.__dict__, "rdzv_endpoint": f"127.0.0.1:{port}"})
        await p.launch(sp)
        assert sorted(steps(slurm, job_id)) == ["sv-t-a0-n1", "sv-t-a0-n2", "sv-t-a0-n3"]
        st = await p.observe()
        assert {n: s.state for n, s in st.items()} == {n: NodeState.RUNNING for n in ("n1", "n2", "n3")}
        t0 = time.monotonic()
        await p.kill_node("n2")
        kill_s = time.monotonic() - t0
        st = await p.observe()
        assert st["n2"].state != NodeState.RUNNING and st["n2"].killed_by_us and not st["n2"].stopped
        assert st["n1"].state == NodeState.RUNNING
        assert "sv-t-a0-n2" not in steps(slurm, job_id)
        t0 = time.monotonic()
        await p.teardown(2.0)
        teardown_s = time.monotonic() - t0
        assert steps(slurm, job_id) == []
        st = await p.observe()
        assert all(s.state != NodeState.RUNNING for s in st.values())
        assert p.slots() == ["n1", "n2", "n3"] and not p.unresponsive
        # a node that is not in the allocation is refused, clearly
        with pytest.raises(PlatformError, match="not in allocation"):
            await p.launch(spec(1, ["n1", "n9"], ["true"]))
        # adoption: a new platform object re-attaches to running steps of the same attempt
        await p.launch(LaunchSpec(**{**sp.__dict__, "attempt": 2}))
        saved = p.describe()
        q = SlurmPlatform(job_id, tmp_path, job="t", base_env=slurm.env).start()
        assert await q.adopt(json.loads(json.dumps(saved)), 2)
        assert {n: s.state for n, s in (await q.observe()).items()} == {n: NodeState.RUNNING for n in ("n1", "n2", "n3")}
        await q.teardown(1.0)
        assert steps(slurm, job_id) == []
        assert not await SlurmPlatform(job_id, tmp_path, job="t", base_env=slurm.env).start().adopt(saved, 2)
        return kill_s, teardown_s

    kill_s, teardown_s = asyncio.run(scenario())
    assert kill_s < 5 and teardown_s < 8, (kill_s, teardown_s)


def test_platform_finds_a_killed_node_unresponsive_and_drops_it(slurm, tmp_path):
    job_id = allocation(slurm)

    async def scenario():
        p = SlurmPlatform(job_id, tmp_path, job="k", kill_confirm_s=2, poll_interval_s=0.5, base_env=slurm.env).start()
        await p.launch(spec(0, ["n1", "n2", "n3"], ["sleep", "120"]))
        slurm.sh("kill-node", "n2")
        await p.teardown(1.0)
        # Either its cancelled step is still listed after kill_confirm_s (unresponsive at once), or
        # slurmctld declared the node down first (SlurmdTimeout, on a loaded machine) and it left
        # the allocation: both drop it, within the node timeout.
        deadline = time.monotonic() + 20
        st = await p.observe()
        while p.slots() != ["n1", "n3"] and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            st = await p.observe()
        assert p.slots() == ["n1", "n3"] and "n2" in p.unresponsive
        # we cancelled it: ended (our srun client's exit code) or lost (Slurm still lists it)
        assert st["n2"].stopped and st["n2"].state in (NodeState.LOST, NodeState.EXITED)
        # the relaunch on the live nodes starts at once (explicit nodes, --overlap)
        t0 = time.monotonic()
        await p.launch(spec(1, ["n1", "n3"], ["sleep", "120"]))
        assert time.monotonic() - t0 < 15
        # the dead node's cancelled step may still be listed (until slurmctld gives n2 up)
        assert sorted(set(steps(slurm, job_id)) - {"sv-k-a0-n2"}) == ["sv-k-a1-n1", "sv-k-a1-n3"]
        await p.teardown(1.0)

    asyncio.run(scenario())


def test_the_kill_of_a_dead_nodes_step_goes_through_slurmctld_and_never_waits_on_its_slurmd(slurm, tmp_path):
    """``scancel --signal=KILL J.S`` signals the step's slurmd from scancel itself: on a dead node it
    waited MessageTimeout (~6 s here) before the kill could start confirming. ``--ctld`` hands the
    SIGKILL to slurmctld, which answers at once; its failed RPC to the node is what then marks the
    node not responding, well before kill_confirm_s runs out."""
    job_id = allocation(slurm)

    async def scenario():
        p = SlurmPlatform(job_id, tmp_path, job="d", kill_confirm_s=20, poll_interval_s=0.5,
                          base_env=slurm.env).start()
        await p.launch(spec(0, ["n1", "n2", "n3"], ["sleep", "120"]))
        cancels = []
        scancel = p.client.scancel

        async def timed(ids, sig, **kw):
            t0 = time.monotonic()
            try:
                await scancel(ids, sig, **kw)
            finally:
                cancels.append((list(ids), sig, kw, time.monotonic() - t0))

        p.client.scancel = timed
        # our srun client for n2 cannot see the node die first and end the step itself (then there
        # would be nothing left to kill, and the route under test would not be taken); the kill
        # ends the client anyway
        os.kill(p.nodes["n2"].popen.pid, signal.SIGSTOP)
        slurm.sh("kill-node", "n2")
        t0 = time.monotonic()
        await p.kill_node("n2")
        kill_s = time.monotonic() - t0
        assert "n2" in p.unresponsive and p.slots() == ["n1", "n3"]
        assert [c[:3] for c in cancels] == [([p.nodes["n2"].step_id], "KILL", {"ctld": True})]
        assert cancels[0][3] < 2, cancels  # the direct scancel took ~6 s on the dead node
        assert kill_s < 12, kill_s  # Slurm said "not responding" (MessageTimeout 5 s), not our 20 s deadline
        await p.teardown(1.0)
        assert set(steps(slurm, job_id)) <= {"sv-d-a0-n2"}  # listed until slurmctld gives n2 up

    asyncio.run(scenario())


def test_slurmctld_stopped_is_a_clear_error_and_the_steps_keep_running(slurm, tmp_path):
    job_id = allocation(slurm)

    async def scenario():
        p = SlurmPlatform(job_id, tmp_path, job="c", command_timeout_s=3, poll_interval_s=0.2, launch_timeout_s=10,
                          base_env=slurm.env).start()
        await p.launch(spec(0, ["n1", "n2"], ["sleep", "120"]))
        slurm.sh("stop-controller")
        try:
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            st = await p.observe()  # no raise, no hang: the last view is kept
            assert time.monotonic() - t0 < 5
            assert all(s.state == NodeState.RUNNING for s in st.values()) and p.last_error
            assert p.slots() == ["n1", "n2", "n3"]
            with pytest.raises(PlatformError):
                await p.poll(force=True)
            with pytest.raises(PlatformError):
                await p.launch(spec(1, ["n3"], ["true"]))
        finally:
            slurm.sh("start-controller")
        st = await p.observe()
        await asyncio.sleep(0.3)
        assert (await p.poll(force=True)).job_state == "RUNNING" and not p.last_error
        await p.teardown(1.0)

    asyncio.run(scenario())


def test_a_new_run_of_the_platform_never_appends_to_an_old_runs_node_log(slurm, tmp_path):
    """A requeued job (or a new run in the same log directory) launches attempt 0 again: its node
    logs start clean, the older run's are kept beside them, and no line is written twice."""
    job_id = allocation(slurm, nodes=2)

    async def run(tag: str) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = SlurmPlatform(job_id, tmp_path, job="r", kill_confirm_s=3, poll_interval_s=0.3, base_env=slurm.env).start()
        sp = spec(0, ["n1", "n2"], ["echo", f"line-of-{tag}"])
        await p.launch(LaunchSpec(**{**sp.__dict__, "rdzv_endpoint": f"127.0.0.1:{port}"}))
        deadline = time.monotonic() + 60
        while not all(s.state == NodeState.EXITED for s in (await p.observe()).values()):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)

    asyncio.run(run("first-run"))
    asyncio.run(run("second-run"))
    for node in ("n1", "n2"):
        text = (tmp_path / "attempt-0" / f"{node}.log").read_text()
        assert text.count("line-of-second-run") == 1 and "line-of-first-run" not in text, text
        (old,) = tmp_path.glob("attempt-0.before-*")
        assert (old / f"{node}.log").read_text().count("line-of-first-run") == 1


def test_the_test_clusters_node_logs_hold_each_line_once(slurm):
    """slurmd and slurmctld run in the foreground (-D) and copy their log to stderr: the
    cluster's .out files keep only what the log files do not get."""
    log_dir = Path(CLUSTER_DIR) / "log"
    files = [log_dir / f"{n}.{ext}" for n in ("slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3") for ext in ("log", "out")]
    sizes = {f: f.stat().st_size if f.exists() else 0 for f in files}
    slurm.cmd("srun", "-N3", "true", timeout=60)
    slurm.cmd("sbatch", "--parsable", "--wait", "-N2", "-o", "/dev/null", "--wrap", "srun true", timeout=60)

    def new_lines(f: Path, strip) -> list[str]:
        if not f.exists():
            return []
        with open(f, errors="replace") as fh:
            fh.seek(sizes[f])
            return [strip(ln) for ln in fh.read().splitlines() if ln.strip()]

    for name in ("slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3"):
        logged = new_lines(log_dir / f"{name}.log", lambda ln: ln.split("] ", 1)[-1])
        copied = new_lines(log_dir / f"{name}.out", lambda ln: ln.split(": ", 1)[-1])
        assert logged, name  # the jobs were logged ...
        assert not set(logged) & set(copied), (name, sorted(set(logged) & set(copied))[:5])  # ... once


def test_a_drained_node_does_not_hold_back_a_job_of_two_to_three_nodes(slurm, tmp_path):
    """--min-nodes reaches Slurm (--nodes=2-3): with n3 drained the job starts on n1 and n2."""
    slurm.cmd("scontrol", "update", "nodename=n3", "state=drain", "reason=es-test")
    code = "import os; print('ran on', os.environ['SUPERVISOR_NODE'])"
    job = Submitted(slurm, tmp_path, [PY, "-c", code], nodes=3, min_nodes=2)
    info = job.finish(timeout=120)
    assert info["NumNodes"] == "2" and job.wait_event("launched")["nodes"] == ["n1", "n2"]


def test_sbatch_refuses_more_nodes_than_the_partition_has_and_a_failed_sbatch_leaves_nothing(slurm, tmp_path):
    def sbatch(*args: str) -> subprocess.CompletedProcess:
        argv = [PY, "-m", "supervisor", "sbatch", "--log-dir", str(tmp_path / "logs"), "--time", "10:00", *args,
                "--", PY, "-c", "pass"]
        return subprocess.run(argv, env=slurm.env, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    too_many = sbatch("--nodes", "5")
    assert too_many.returncode == 2, too_many.stderr
    assert "partition debug (3 nodes) has fewer nodes: the job would pend forever" in too_many.stderr
    assert slurm.cmd("squeue", "-h") == "" and not (tmp_path / "logs").exists()
    # sbatch itself refuses (this cluster has no GPUs): nothing written, nothing queued
    refused = sbatch("--nodes", "2", "--gres=gpu:1")
    assert refused.returncode == 1 and "Invalid generic resource" in refused.stderr, refused.stderr
    assert slurm.cmd("squeue", "-h") == "" and not (tmp_path / "logs").exists()


def test_the_dry_run_script_submitted_as_is_runs_the_job(slurm, tmp_path):
    out = tmp_path / "argv"
    out.mkdir()
    code = ("import json, os, sys; from pathlib import Path; "
            "Path(os.environ['ARGV_OUT'], os.environ['SUPERVISOR_NODE']).write_text(json.dumps(sys.argv[1:]))")
    (tmp_path / "base.json").write_text(json.dumps(FAST))
    dry = subprocess.run([PY, "-m", "supervisor", "sbatch", "--config", "base.json", "--nodes", "2", "--time", "10:00",
                          "--log-dir", str(tmp_path / "logs"), "--env", f"ARGV_OUT={out}", "--dry-run", "--",
                          PY, "-c", code, *NASTY], env=slurm.env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0, dry.stderr
    (tmp_path / "saved.sbatch").write_text(dry.stdout)
    (tmp_path / "logs").mkdir()  # as the dry run says: Slurm does not create the --output folder
    job_id = slurm.cmd("sbatch", "--parsable", str(tmp_path / "saved.sbatch")).strip()
    info = slurm.wait_job(job_id, timeout=150)
    assert info["JobState"] == "COMPLETED", (tmp_path / "logs" / f"slurm-{job_id}.out").read_text()[-3000:]
    assert {p.name: json.loads(p.read_text()) for p in out.iterdir()} == {"n1": NASTY, "n2": NASTY}


# ---------------------------------------------------------------------------- end to end (sbatch)
class Submitted:
    def __init__(self, c: Cluster, tmp: Path, command: list[str], *, nodes: int = 3, min_nodes: int = 2,
                 extra: list[str] | None = None, config: dict | None = None) -> None:
        self.c, self.tmp = c, tmp
        self.log_dir, self.ckpt = tmp / "logs", tmp / "ckpt"
        base = tmp / "base.json"
        base.write_text(json.dumps(config or FAST))
        argv = [PY, "-m", "supervisor", "sbatch", "--config", str(base), "--nodes", str(nodes), "--min-nodes",
                str(min_nodes), "--time", "10:00", "--log-dir", str(self.log_dir), "--checkpoint-dir", str(self.ckpt),
                *(extra or []), "--", *command]
        proc = subprocess.run(argv, env=c.env, cwd=tmp, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        self.job_id = proc.stdout.strip()
        assert self.job_id.isdigit(), proc.stdout

    def events(self, name: str | None = None) -> list[dict]:
        try:
            lines = (self.log_dir / "events.jsonl").read_text().splitlines()
        except OSError:
            return []
        return [e for e in map(json.loads, filter(str.strip, lines)) if name is None or e["event"] == name]

    def wait_event(self, name: str, timeout: float = 120, after: int = 0, **match) -> dict:
        """The first event ``name`` with the fields ``match``, past the first ``after`` of its name."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events(name)[after:]:
                if all(e.get(k) == v for k, v in match.items()):
                    return e
            time.sleep(0.2)
        raise AssertionError(f"no event {name} {match} in {timeout}s: {self.events()}\n{self.output()}")

    def wait_checkpoint(self, step: int, timeout: float = 120) -> None:
        from supervisor.checkpoint import latest_complete

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = latest_complete(self.ckpt).checkpoint if self.ckpt.exists() else None
            if found is not None and found.step >= step:
                return
            time.sleep(0.1)
        raise AssertionError(f"no checkpoint of step {step}: {self.events()}\n{self.output()}")

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.log_dir.glob("slurm-*.out"))

    def finish(self, timeout: float = 180) -> dict:
        info = self.c.wait_job(self.job_id, timeout=timeout)
        assert info["JobState"] == "COMPLETED", f"{info.get('JobState')}: {self.events()}\n{self.output()}"
        assert self.events("job_finished")[-1]["phase"] == "completed"
        return info

    def losses(self) -> dict[int, dict]:
        return losses_by_step(read_log(self.log_dir / "ranks", 0))


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """The uninterrupted control: the same job under plain torchrun, 3 ranks."""
    tmp = tmp_path_factory.mktemp("slurm-control")
    run_job(tmp, 3, [*JOB, "--log-dir", str(tmp / "log")], timeout=300)
    return {r["step"]: r for r in read_log(tmp / "log", 0)}


def assert_same_path(got: dict[int, dict], control: dict[int, dict], exact: bool) -> None:
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, rec in control.items():
        if exact:
            assert got[step]["loss_hex"] == rec["loss_hex"], step
        else:
            assert math.isclose(got[step]["loss"], rec["loss"], rel_tol=1e-4), (step, got[step]["loss"], rec["loss"])


NASTY = ["a b", 'c"d', "e'f", "$(touch /tmp/pwned-by-sbatch)", "`id`", "x;y", "*", "", "--flag=1 2", "ünï"]


def test_sbatch_end_to_end_arguments_arrive_intact(slurm, tmp_path):
    out = tmp_path / "argv"
    out.mkdir()
    code = ("import json, os, sys; from pathlib import Path; "
            "Path(os.environ['ARGV_OUT'], os.environ['SUPERVISOR_NODE']).write_text(json.dumps(sys.argv[1:]))")
    job = Submitted(slurm, tmp_path, [PY, "-c", code, *NASTY], nodes=2, min_nodes=2, extra=["--env", f"ARGV_OUT={out}"])
    job.finish(timeout=150)
    got = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    assert got == {"n1": NASTY, "n2": NASTY}
    assert not Path("/tmp/pwned-by-sbatch").exists()
    launched = job.wait_event("launched")
    assert launched["nodes"] == ["n1", "n2"]
    # the standing node guards (on by default) watched the controller and were ended with the job,
    # without acting: the job completed with the batch script's exit code
    assert job.c.job(job.job_id)["ExitCode"] == "0:0"
    assert_guards_ended_quietly(job, ["n1", "n2"])


def assert_guards_ended_quietly(job: "Submitted", nodes: list[str]) -> None:
    for node in nodes:
        text = (job.log_dir / "slurm" / f"guard-{node}.log").read_text()
        assert text.count("event=guard_started") == 1, text  # one for the job's life: never restarted
        assert "event=controller_answered" in text and "event=guard_stopped" in text, text
        assert "controller_lost" not in text and "guard_not_acting" not in text, text
    assert not (job.log_dir / "slurm" / "controller-lost.json").exists() and not job.events("controller_lost")


def test_sbatch_trains_checkpoints_and_completes(slurm, tmp_path, control):
    job = Submitted(slurm, tmp_path, [PY, TRAIN, *JOB])
    job.finish()
    assert job.events("launched")[0]["nodes"] == ["n1", "n2", "n3"] and not job.events("fault_detected")
    assert_same_path(job.losses(), control, exact=True)


@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_node_killed_relaunches_on_two_nodes_from_the_last_checkpoint(slurm, tmp_path, control, rendezvous):
    config = FAST | {"platform": FAST["platform"] | {"rendezvous_backend": rendezvous}}
    job = Submitted(slurm, tmp_path, [PY, TRAIN, *JOB], config=config)
    assert job.wait_event("launched", attempt=0, timeout=90)["rendezvous"] == rendezvous
    job.wait_checkpoint(10)
    slurm.sh("kill-node", "n2")  # slurmd, step daemons and ranks of n2, at once
    relaunch = job.wait_event("launched", attempt=1, timeout=90)
    assert relaunch["nodes"] == ["n1", "n3"] and relaunch["world_size"] == 2
    assert relaunch["rendezvous"] == rendezvous
    assert relaunch["restore_from"] and int(relaunch["restore_from"].split("-")[1]) >= 10
    job.finish()
    assert job.c.job(job.job_id)["JobState"] == "COMPLETED"  # the same allocation, never requeued
    resumed = [r for r in read_log(job.log_dir / "ranks", 0) if r["attempt"] == 1]
    assert resumed[0]["step"] == int(relaunch["restore_from"].split("-")[1]) + 1 and resumed[0]["world_size"] == 2
    if rendezvous == "static":  # the node ranks given: the store's node (the batch host's, n1) first, n3 next
        assert resumed[0]["node"] == "n1" and read_log(job.log_dir / "ranks", 1)[-1]["node"] == "n3"
    assert_same_path(job.losses(), control, exact=False)
    # the standing guards of n1 and n3 watched through the teardown and the relaunch (n2's died with it)
    assert_guards_ended_quietly(job, ["n1", "n3"])


def test_frozen_node_is_detected_excluded_and_relaunched_with_overlap(slurm, tmp_path, control):
    job = Submitted(slurm, tmp_path, [PY, TRAIN, *JOB])
    job.wait_checkpoint(10)
    # the fault that follows the freeze: on a loaded host a first attempt has once ended on its own
    # before it (CI saw a 'rank_exit'), and the supervisor's recovery from that is not what this tests
    earlier = job.events("fault_detected")
    if earlier:  # not this test's subject, but never to pass unseen: it shows in the run's summary
        warnings.warn(f"faults before the freeze: {[(e.get('kind'), e.get('detail')) for e in earlier]}")
    slurm.sh("freeze-node", "n3")
    try:
        fault = job.wait_event("fault_detected", timeout=60, after=len(earlier))
        faults = [{k: e.get(k) for k in ("attempt", "kind", "nodes", "ranks", "detail")}
                  for e in job.events("fault_detected")]
        assert fault["kind"] == "dead" and fault["nodes"] == ["n3"], faults
        relaunch = job.wait_event("launched", attempt=fault["attempt"] + 1, timeout=90)
        assert relaunch["nodes"] == ["n1", "n2"] and relaunch["world_size"] == 2, (relaunch, faults)
        job.finish()
    finally:
        slurm.sh("thaw-node", "n3")
    assert_same_path(job.losses(), control, exact=False)


def test_rank_sigstopped_inside_a_step_is_killed_and_relaunched(slurm, tmp_path, control):
    job = Submitted(slurm, tmp_path, [PY, TRAIN, *JOB], extra=["--env", "SUPERVISOR_FAULT=kind=stop,rank=1,step=13,attempt=0"])
    fault = job.wait_event("fault_detected", timeout=150)
    assert fault["kind"] == "dead" and fault["ranks"] == [1], fault
    kill = job.wait_event("action", action="kill_node")
    relaunch = job.wait_event("launched", attempt=1, timeout=90)
    assert relaunch["nodes"] == ["n1", "n2", "n3"], relaunch  # the node was fine: all three again
    assert kill["node"] == fault["nodes"][0]
    job.finish()
    # same world size, but 3 ranks: a resumed run's gradient sums may round differently in the last
    # bits (measured: ~1e-7 relative); with 2 ranks (a+b == b+a) the local tests are bit-exact
    assert_same_path(job.losses(), control, exact=False)


@pytest.mark.parametrize("fault, kind, aggregate", [
    ("kind=kill,rank=1,step=13,attempt=0", "rank_killed", True),
    ("kind=skip-collective,rank=1,step=13,attempt=0", "collective_hang", True),
    ("kind=stop,rank=1,step=13,attempt=0", "dead", False),
    ("kind=kill,rank=1,step=13,attempt=0", "rank_killed", False),
    ("kind=skip-collective,rank=1,step=13,attempt=0", "collective_hang", False),
])
def test_a_rank_s_fault_is_named_with_heartbeats_through_the_node_relay_and_without(slurm, tmp_path, control,
                                                                                      fault, kind, aggregate):
    """Each node's agent relays its ranks' heartbeats (one frame per node and interval) or, with
    heartbeat.aggregate false, every rank sends its own: the fault is found and named the same."""
    # a killed rank is named from its agent's word once Slurm reports the step's end: on a loaded host that can
    # come after a 3 s silence (then the rank is named too, as dead), so the kill runs with a 10 s timeout
    timeout = {"timeout_s": 10} if kind == "rank_killed" else {}
    config = FAST | {"heartbeat": FAST["heartbeat"] | {"aggregate": aggregate} | timeout}
    job = Submitted(slurm, tmp_path, [PY, TRAIN, *JOB], config=config, extra=["--env", f"SUPERVISOR_FAULT={fault}"])
    found = job.wait_event("fault_detected", timeout=150)
    assert found["kind"] == kind and found["ranks"] == [1], found
    job.finish()
    beats = job.events("job_finished")[-1]["heartbeats"]
    assert (beats["node_frames"] > 0) is aggregate and beats["received"] > 0, beats
    assert_same_path(job.losses(), control, exact=False)


def test_a_script_without_the_sdk_has_its_stopped_rank_found_and_named(slurm, tmp_path):
    """A torch-only script (tests/workloads/plain_train.py: no supervisor import) on the real
    cluster: the instrumentation the agents install reports for it; a SIGSTOPped rank is found
    within the heartbeat timeout + 1 s, named, and the job completes as it does uninterrupted."""
    plain = str(Path(__file__).parent / "workloads" / "plain_train.py")
    ctl = tmp_path / "control"
    run_job(ctl, 3, ["--steps", str(STEPS), "--out", str(ctl / "out")], script=Path(plain), timeout=300)
    out = tmp_path / "out"
    job = Submitted(slurm, tmp_path, [PY, plain, "--steps", str(STEPS), "--out", str(out)])
    assert job.wait_event("running", timeout=150)["reported_by"] == {"torch": 3}
    deadline = time.monotonic() + 60
    while not (out / "rank-1.jsonl").exists() or len(read_log(out, 1)) < 8:
        assert time.monotonic() < deadline, job.output()
        time.sleep(0.1)
    os.kill(read_log(out, 1)[-1]["pid"], signal.SIGSTOP)
    fault = job.wait_event("fault_detected", timeout=60)
    assert (fault["kind"], fault["ranks"], fault["reported_by"]) == ("dead", [1], {"torch": [1]}), fault
    assert fault["detection_s"] <= FAST["heartbeat"]["timeout_s"] + 1.0, fault
    job.finish()
    assert_same_path(losses_by_step(read_log(out, 0)), losses_by_step(read_log(ctl / "out", 0)), exact=False)


def test_a_resubmission_as_a_release_that_dies_at_import_rolls_back_to_v1(slurm, tmp_path, control):
    """v1 trains past its probation and is cancelled (scancel); the job is resubmitted on the same
    directories as v2, the same script edited in place to import a module the nodes lack: the
    supervisor rejects v2 at its first failure and the job completes on v1's snapshot, on the
    path an uninterrupted v1 takes."""
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    shutil.copy(TRAIN, script)
    v1 = Submitted(slurm, tmp_path, [PY, str(script), *JOB])
    known = v1.wait_event("release_known_good", timeout=150)
    slurm.cmd("scancel", v1.job_id)
    assert slurm.wait_job(v1.job_id)["JobState"] == "CANCELLED"
    v1.wait_event("job_finished", phase="cancelled", timeout=60)
    lines = script.read_text().splitlines(keepends=True)
    at = next(i + 1 for i, line in enumerate(lines) if line.startswith("from __future__"))
    script.write_text("".join(lines[:at] + ["import a_module_the_nodes_lack  # v2\n"] + lines[at:]))
    v2 = Submitted(slurm, tmp_path, [PY, str(script), *JOB])
    back = v2.wait_event("release_rolled_back", timeout=150)
    assert back["to"] == known["version"] and back["reason"] == "startup_failure", back
    assert "a_module_the_nodes_lack" in back["why"]
    assert v2.wait_event("launched", release=known["version"], run=2)["restore_from"] == back["checkpoint"]
    v2.finish()
    losses: dict[int, dict] = {}
    for folder in [*sorted(v2.log_dir.glob("ranks.run*")), v2.log_dir / "ranks"]:
        losses |= losses_by_step(read_log(folder, 0))
    assert_same_path(losses, control, exact=False)  # 3 ranks: see the SIGSTOP test


def test_warning_signal_checkpoints_and_the_requeued_job_resumes(slurm, tmp_path, control):
    job = Submitted(slurm, tmp_path, [PY, TRAIN, *JOB, "--checkpoint-every", "50"], extra=["--requeue"])
    job.wait_event("running", timeout=120)
    time.sleep(3)
    # what Slurm does --warning-seconds before the time limit (sbatch --signal=B:USR1@120)
    slurm.cmd("scancel", "--batch", "--signal=USR1", job.job_id)
    job.wait_event("slurm_warning_signal", timeout=30)
    requeued = job.wait_event("slurm_requeued", timeout=90)
    assert requeued["job_id"] == job.job_id
    # Slurm holds a requeued job for the credential lifetime (cred_expire: 120 s by default, 20 s on
    # the test cluster); then the same batch script runs again and resumes by itself.
    from supervisor.checkpoint import latest_complete

    emergency = latest_complete(job.ckpt).checkpoint
    assert emergency is not None and emergency.step % 50 != 0  # written on the signal, not by the schedule
    # the first run ends as a planned requeue (its own phase and exit code: no page), and names the
    # emergency checkpoint its ranks wrote on the way out
    first_end = job.events("job_finished")[0]
    assert (first_end["phase"], first_end["exit_code"]) == ("requeued", 9), first_end
    saved = job.events("emergency_checkpoint")
    assert saved and saved[0]["name"] == emergency.name and saved[0]["step"] == emergency.step, saved
    info = job.finish(timeout=240)
    assert int(info.get("Restarts", "0")) >= 1
    second = [e for e in job.events("launched") if e["restore_from"]]
    assert second and second[0]["restore_from"] == emergency.name
    # the requeued job continues its run (its restart count and suspects carry on) with new
    # attempt numbers, so no node log holds two runs' lines
    assert job.wait_event("requeue_resumed")["attempt"] == 0
    assert [e["attempt"] for e in job.events("launched")] == [0, 1]
    for log in (job.log_dir / "slurm").glob("attempt-*/n*.log"):
        assert log.read_text().count("event=worker_started") <= 1, log
    assert_same_path(job.losses(), control, exact=False)  # 3 ranks: see the SIGSTOP test


# ------------------------------------------------------- `supervisor drill` inside an allocation
DRILL_STEPS = 20
DRILL_JOB = ["--steps", str(DRILL_STEPS), "--checkpoint-every", "5", "--step-sleep", "0.2", "--global-batch", "12"]


class Drill:
    """What a user runs to drill the slurm platform, one command: ``sbatch --no-kill --nodes=N
    --wrap "supervisor drill --config JOB.json --fault F --out OUT"``. Both runs (control, then
    the faulted one) go to that one allocation; the nodes it has beyond ``nodes.max`` are spares."""

    def __init__(self, c: Cluster, tmp: Path, *, alloc: int, nodes: dict, fault: str) -> None:
        import shlex

        job = {**FAST, "job": "dj", "command": [PY, TRAIN, *DRILL_JOB], "nodes": nodes, "nproc_per_node": 1,
               "platform": {**FAST["platform"], "host": "auto"}, "intake": {"host": "auto"}, "http": {"host": "auto"}}
        (tmp / "job.json").write_text(json.dumps(job))
        self.out = tmp / "drill-out"
        wrap = shlex.join([PY, "-m", "supervisor", "drill", "--config", str(tmp / "job.json"), "--fault", fault,
                           "--out", str(self.out)])
        self.job_id = c.cmd("sbatch", "--parsable", "--no-kill", f"--nodes={alloc}", "--time=10:00",
                            f"--output={tmp}/drill-%j.out", f"--chdir={tmp}", "--wrap", wrap).strip()
        self.info = c.wait_job(self.job_id, timeout=300)
        self.report = (tmp / f"drill-{self.job_id}.out").read_text(errors="replace")

    def events(self, run: str, name: str | None) -> list[dict]:
        lines = (self.out / run / "logs" / "events.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, filter(str.strip, lines)) if name is None or e["event"] == name]

    def losses(self, run: str) -> dict[int, dict]:
        return losses_by_step(read_log(self.out / run / "logs" / "ranks", 0))

    def check_passed(self) -> tuple[dict, dict]:
        """The drill passed (exit 0, its report says so), both runs in this allocation; the fault
        fired on rank 1's node: (the fault, the relaunch) as the drill's events record them."""
        assert (self.info["JobState"], self.info["ExitCode"]) == ("COMPLETED", "0:0"), self.report[-6000:]
        assert "drill PASSED" in self.report and "drill FAILED" not in self.report, self.report[-6000:]
        for run in ("control", "drill"):
            state = json.loads((self.out / run / "logs" / "supervisor-state.json").read_text())
            assert state["platform"]["job_id"] == self.job_id and state["phase"] == "completed", (run, state)
            assert sorted(self.losses(run)) == list(range(1, DRILL_STEPS + 1)), run
        (fault,) = self.events("drill", "fault_detected")
        rank1 = read_log(self.out / "drill" / "logs" / "ranks", 1)[0]
        assert fault["attempt"] == 0 and fault["nodes"] == [rank1["node"]], (fault, rank1)
        assert f"nodes {fault['nodes']}" in self.report  # the report names the fault's node
        (relaunch,) = [e for e in self.events("drill", "launched") if e["attempt"] > 0]
        # (seen once in CI: restore_from None; the events around it say what the controller had seen)
        assert relaunch["attempt"] == 1 and relaunch["restore_from"] == "step-0000000010", \
            (relaunch, [e for e in self.events("drill", None) if e["event"] in (
                "checkpoint_complete", "fault_detected", "teardown", "torn_down", "restored", "restore_reported",
                "emergency_checkpoint", "launched")])
        return fault, relaunch


def test_drill_on_slurm_a_frozen_node_with_a_spare_keeps_the_world_size_bit_for_bit(slurm, tmp_path):
    # 3 nodes allocated, the job needs 2: one spare. node-stop: rank 1's agent and ranks SIGSTOPped
    drill = Drill(slurm, tmp_path, alloc=3, nodes={"min": 2, "max": 2},
                  fault="kind=node-stop,rank=1,step=13,attempt=0")
    fault, relaunch = drill.check_passed()
    assert fault["kind"] == "dead" and fault["ranks"] == [1], fault
    (first,) = [e for e in drill.events("drill", "launched") if e["attempt"] == 0]
    assert len(first["nodes"]) == 2 and first["world_size"] == 2, first
    assert len(relaunch["nodes"]) == 2 and relaunch["world_size"] == 2, relaunch
    assert "world size 2 (was 2)" in drill.report
    # the same world size: every step bit for bit, and the report does not speak of a tolerance
    control, drilled = drill.losses("control"), drill.losses("drill")
    assert all(drilled[s]["loss_hex"] == control[s]["loss_hex"] for s in control)
    assert "compared within relative tolerance" not in drill.report


def test_drill_on_slurm_a_killed_node_without_a_spare_continues_smaller(slurm, tmp_path):
    # 2 nodes allocated, the job runs on 1 to 2: no spare. node-kill: rank 1's agent and ranks SIGKILLed
    drill = Drill(slurm, tmp_path, alloc=2, nodes={"min": 1, "max": 2},
                  fault="kind=node-kill,rank=1,step=13,attempt=0")
    fault, relaunch = drill.check_passed()
    assert fault["kind"] == "node_lost" and fault["node_failure"], fault
    assert relaunch["world_size"] == 1 and fault["nodes"][0] not in relaunch["nodes"], relaunch
    assert relaunch["excluded"] == fault["nodes"], relaunch
    assert "world size 1 (was 2)" in drill.report
    # the steps after the restore ran at world size 1: within the resize tolerance, and the report says so
    assert "10 steps ran at world size 1 (control: 2): compared within relative tolerance 0.0001" in drill.report
    control, drilled = drill.losses("control"), drill.losses("drill")
    for s in range(1, DRILL_STEPS + 1):
        if s <= 10:
            assert drilled[s]["loss_hex"] == control[s]["loss_hex"], s
        else:
            assert drilled[s]["world_size"] == 1 and math.isclose(drilled[s]["loss"], control[s]["loss"], rel_tol=1e-4)


# ------------------------------------------------------------- losing the batch host (the controller)
GUARDED = {**FAST, "platform": {"kind": "slurm", "slurm": {**FAST["platform"]["slurm"], "controller_timeout_s": 10,
                                                            "controller_probe_s": 1}}}


def test_losing_the_batch_host_requeues_the_job_which_resumes_from_its_last_checkpoint(slurm, tmp_path, control):
    job = Submitted(slurm, tmp_path, [PY, TRAIN, *JOB], extra=["--requeue"], config=GUARDED)
    job.wait_checkpoint(10)
    assert job.c.job(job.job_id)["BatchHost"] == "n1"
    # the batch host: the controller, n1's agent (which serves the rendezvous store) and its ranks.
    # Slurm (--no-kill) keeps the job RUNNING on n2, n3; their node guards notice the silence.
    slurm.sh("kill-node", "n1")
    lost = job.wait_event("controller_lost", timeout=90)
    assert lost["action"] == "requeued" and lost["node"] in ("n2", "n3") and lost["silent_s"] >= 10, lost
    assert lost["run"] == 1
    recovered = job.wait_event("controller_loss_recovered", timeout=150)  # the requeued job's controller
    assert recovered["lost"]["node"] == lost["node"]
    relaunch = job.wait_event("launched", attempt=1, timeout=60)
    assert relaunch["nodes"] == ["n2", "n3"] and relaunch["world_size"] == 2, relaunch
    assert int(relaunch["restore_from"].split("-")[1]) >= 10
    info = job.finish(timeout=240)
    assert int(info["Restarts"]) == 1 and "controller-lost" in info.get("Comment", ""), info
    assert [e["run"] for e in job.events("launched")] == [1, 1]  # one run, continued
    assert not (job.log_dir / "slurm" / "controller-lost.json").exists()  # set aside: the next loss is claimable
    assert list((job.log_dir / "slurm").glob("controller-lost.handled-*.json"))
    guard_logs = "".join(p.read_text() for p in (job.log_dir / "slurm").glob("guard-n*.log"))
    assert "event=controller_lost" in guard_logs
    assert_same_path(job.losses(), control, exact=False)


def test_losing_the_batch_host_before_the_first_launch_cancels_the_job_and_says_why(slurm, tmp_path):
    """No agent step runs yet (the controller is in its preflight: the job's interpreter takes 60 s
    to answer its probe, as from a cold shared filesystem), so only the standing node guards watch
    the controller. Without them the job stayed RUNNING on n2, n3 to its time limit."""
    mark = tmp_path / "preflight-probe-started"
    slow = tmp_path / "bin" / "python-on-a-slow-filesystem"
    slow.parent.mkdir()
    slow.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && {{ : > {shlex.quote(str(mark))}; sleep 60; }}\n'
                    f'exec {shlex.quote(PY)} "$@"\n')
    slow.chmod(0o755)
    job = Submitted(slurm, tmp_path, [str(slow), TRAIN, *JOB], config=GUARDED)
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert time.monotonic() < deadline, f"the preflight never probed the interpreter: {job.output()}"
        time.sleep(0.2)
    guard_log = lambda n: (job.log_dir / "slurm" / f"guard-{n}.log")  # noqa: E731
    deadline = time.monotonic() + 30
    while not all(guard_log(n).exists() and "event=controller_answered" in guard_log(n).read_text()
                  for n in ("n1", "n2", "n3")):
        assert time.monotonic() < deadline, "the standing guards never heard the controller"
        time.sleep(0.2)
    # a guard step per node and nothing else: the window before the first launch
    assert sorted(steps(slurm, job.job_id)) == [f"sv-job-guard-n{i}" for i in (1, 2, 3)]
    assert not job.events("launched")
    killed = time.monotonic()
    slurm.sh("kill-node", "n1")  # the batch host: the controller, in its preflight, and n1's guard
    lost = job.wait_event("controller_lost", timeout=60)
    acted_s = time.monotonic() - killed
    assert lost["action"] == "cancelled" and lost["node"] in ("n2", "n3") and lost["silent_s"] >= 10, lost
    # controller_timeout_s (10) + a probe (1) + the confirming probe and scontrol, with room for a busy machine
    assert acted_s < 20, acted_s
    # Slurm keeps the cancelled job COMPLETING until it gives the dead batch host up (SlurmdTimeout)
    info = slurm.wait_job(job.job_id, states=("CANCELLED", "FAILED", "NODE_FAIL", "COMPLETED"), timeout=90)
    ended_s = time.monotonic() - killed
    assert info["JobState"] == "CANCELLED", info
    assert info["Comment"].startswith("elastic-supervisor:controller-lost:no-answer-for-"), info
    assert not job.events("launched")
    print(f"batch host killed before the first launch -> guard cancelled the job after {acted_s:.1f}s, "
          f"CANCELLED after {ended_s:.1f}s")


def test_a_node_guard_whose_controller_is_gone_cancels_the_job_and_says_why(slurm, tmp_path):
    from supervisor.platforms.slurm.guard import GUARD_PATH, GuardConfig, guard_argv, guard_mac

    import dataclasses
    import http.server
    import threading

    job_id = allocation(slurm, nodes=2)
    token = b"0123456789abcdef" * 3
    (tmp_path / "token").write_bytes(token)  # the job token the guards check the answers with
    (tmp_path / "token").chmod(0o600)

    class Controller(http.server.BaseHTTPRequestHandler):  # answers the challenge until it is shut down
        def do_GET(self):
            path, _, query = self.path.partition("?")
            body = json.dumps({"mac": guard_mac(token, query.partition("nonce=")[2])}).encode()
            self.send_response(200 if path == GUARD_PATH else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Controller)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = GuardConfig(job_id=job_id, api=f"http://127.0.0.1:{server.server_address[1]}", job="guarded", node="n2",
                      log_dir=tmp_path, timeout_s=6, probe_s=0.5, action="cancel")
    # a guard left from an earlier run of this job (started before a requeue), quicker to give up:
    # it must never act on this run
    stale = dataclasses.replace(cfg, node="n1", restart_count="3", timeout_s=2)
    sruns = [subprocess.Popen(["srun", f"--jobid={job_id}", "-N1", "-n1", "-w", c.node, "--overlap",
                               *guard_argv(PY, c)], env=slurm.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for c in (cfg, stale)]
    log = lambda n: (tmp_path / "slurm" / f"guard-{n}.log").read_text()  # noqa: E731
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / "slurm" / f"guard-{n}.log").exists() and "event=controller_answered" in log(n)
                      for n in ("n1", "n2")):
            assert time.monotonic() < deadline, "the guards never heard the controller"
            time.sleep(0.2)
        server.shutdown()  # the controller goes away after the guards have heard it
        server.server_close()
        assert sruns[1].wait(30) == 0  # the stale guard: silent for 2 s, then it looked and left
        assert slurm.job(job_id)["JobState"] == "RUNNING"
        assert "job " + job_id + " is at restart 0, this guard watched restart 3" in log("n1"), log("n1")
        info = slurm.wait_job(job_id, states=("CANCELLED",), timeout=60)
    finally:
        server.shutdown()
        for srun in sruns:
            srun.kill()
            srun.wait()
    assert info["Comment"].startswith("elastic-supervisor:controller-lost:no-answer-for-"), info
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["action"], e["node"]) for e in events] == [("controller_lost", "cancelled", "n2")]
    assert "submit it again" in events[0]["detail"]
    assert json.loads((tmp_path / "slurm" / "controller-lost.json").read_text())["action"] == "cancel"


def test_a_process_squatting_the_dead_controllers_port_does_not_keep_the_slurm_job_alive(slurm, tmp_path):
    """Issue 24: the guards challenge their controller (GET /v1/guard, a nonce MAC'd under a key
    derived from the job token). The controller's real HTTP app answers them; once it is gone, a
    process on the same port answering 200 to everything is silence to them: one guard cancels
    the job within its timeout, as for a controller that does not answer at all."""
    from supervisor.platforms.slurm.guard import GuardConfig, guard_argv

    import http.server
    import threading

    from test_guard_challenge import TOKEN, ServedController, Squatter, write_token

    job_id = allocation(slurm, nodes=2)
    write_token(tmp_path / "token", TOKEN)  # the job token on the shared log directory
    controller = ServedController(tmp_path / "controller", token=TOKEN)
    port = controller.port
    guards = [GuardConfig(job_id=job_id, api=f"http://127.0.0.1:{port}", job="guarded", node=n, log_dir=tmp_path,
                          timeout_s=4, probe_s=0.5, action="cancel") for n in ("n1", "n2")]
    sruns = [subprocess.Popen(["srun", f"--jobid={job_id}", "-N1", "-n1", "-w", g.node, "--overlap",
                               *guard_argv(PY, g)], env=slurm.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for g in guards]
    log = lambda n: (tmp_path / "slurm" / f"guard-{n}.log").read_text()  # noqa: E731
    squatter = None
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / "slurm" / f"guard-{n}.log").exists() and "event=controller_answered" in log(n)
                      for n in ("n1", "n2")):
            assert time.monotonic() < deadline, "the guards never heard the controller"
            time.sleep(0.2)
        controller.close()
        http.server.ThreadingHTTPServer.allow_reuse_address = True
        squatter = http.server.ThreadingHTTPServer(("127.0.0.1", port), Squatter)  # the port, taken at once
        squatter.probes = 0
        threading.Thread(target=squatter.serve_forever, daemon=True).start()
        lost_from = time.monotonic()
        info = slurm.wait_job(job_id, states=("CANCELLED",), timeout=60)
        took = time.monotonic() - lost_from
    finally:
        if squatter is not None:
            squatter.shutdown()
            squatter.server_close()
        for srun in sruns:
            srun.kill()
            srun.wait()
    logs = log("n1") + log("n2")
    assert squatter.probes >= 4, squatter.probes  # it answered the guards all along
    assert "event=controller_unauthenticated" in logs and "event=controller_lost" in logs, logs
    assert info["Comment"].startswith("elastic-supervisor:controller-lost:no-answer-for-"), info
    assert took < 4 + 15, took  # the guard's timeout, its last probe, scontrol and Slurm's own end of the job
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["action"]) for e in events] == [("controller_lost", "cancelled")]
    print(f"squatter on the dead controller's port -> job cancelled by its guard after {took:.1f}s")
