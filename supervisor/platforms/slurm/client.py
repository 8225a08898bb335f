"""The Slurm client: the only code of the slurm platform that runs Slurm commands (``squeue``,
``scontrol``, ``scancel``, ``sinfo``, ``srun``, ``sbatch``), and the parsing of what they print.

Every command runs through :mod:`supervisor.platforms.clients.commands`, under a timeout; a
failure is a :class:`~supervisor.platforms.base.PlatformError`. Nothing here keeps state about
a job: :class:`SlurmClient` only knows where the commands are (``bin_dir``), how long they may
take and the environment they run with (the allocation's stale ``SLURM_*`` inputs removed).
"""

from __future__ import annotations


import os
import re
import signal
import subprocess
from pathlib import Path
from typing import IO, Mapping, Sequence

from supervisor.platforms.base import PlatformError
from supervisor.platforms.clients import commands
from supervisor.platforms.slurm.hostlist import expand_hostlist

# srun's output when the node under a step is lost rather than the step's command failing
_NODE_FAILURE = re.compile(
    r"Node failure on|Communication connection failure|Task launch for \S+ failed on node|Unable to contact slurm "
    r"node|Zero Bytes were transmitted|Job step aborted: Waiting up to|Lost connection", re.I)
_STEP_GONE = re.compile(r"Invalid job id specified|already completing or completed|Job/step already completing|"
                        r"does not exist|Job step .* not found", re.I)
_BAD_NODE_STATES = ("down", "drain", "fail", "future", "unknown", "power", "reboot", "maint", "inval")


# ---------------------------------------------------------------------------- output parsing
def srun_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of an ``srun`` client: the allocation's stale SLURM_* inputs removed."""
    keep = {"SLURM_CONF"}
    env = {k: v for k, v in base.items()
           if k in keep or not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_"))}
    env.update(extra)
    return env


def srun_exit_code(code: int) -> int:
    """srun returns 128+N when a task was killed by signal N: report that as -N (like Popen)."""
    if 128 < code < 160:
        return -(code - 128)
    return code


def _kv(line: str) -> dict[str, str]:
    """``scontrol -o`` output: ``Key=Value Key=Value ...`` (values without spaces)."""
    out = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep:
            out[k] = v
    return out


def node_state_is_bad(state: str) -> bool:
    """A node state (``sinfo %T``, lower case) of a node that cannot run or confirm a step: not
    responding (``*``), down, drained, failing, powered off, rebooting ..."""
    return state.endswith("*") or state.startswith(_BAD_NODE_STATES)


def srun_log_says_node_failed(path: Path) -> bool:
    """Whether the ``srun:`` lines at the end of an srun client's output say the node under the
    step was lost (rather than the step's command failing)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 8192))
            tail = f.read().decode(errors="replace")
    except OSError:
        return False
    return bool(_NODE_FAILURE.search("\n".join(ln for ln in tail.splitlines() if ln.startswith("srun:"))))


def _node_fields(stdout: str) -> dict[str, dict[str, str]]:
    """``scontrol show node -o`` output: NodeName -> its fields."""
    out = {}
    for line in stdout.splitlines():
        f = _kv(line)
        if f.get("NodeName"):
            out[f["NodeName"]] = f
    return out


# ---------------------------------------------------------------------------- one job's commands
class SlurmClient:
    """Slurm's commands as the platform runs them: ``bin_dir`` (empty: from PATH), ``timeout``
    seconds each, with ``base_env`` less the allocation's stale ``SLURM_*`` inputs."""

    def __init__(self, *, bin_dir: str = "", timeout: float = 20.0, base_env: Mapping[str, str] | None = None) -> None:
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.base_env = dict(os.environ) if base_env is None else base_env

    def bin(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name

    def env(self) -> dict[str, str]:
        return srun_env(self.base_env, {})

    async def _run(self, name: str, *args: str, check: bool = True) -> commands.Result:
        return await commands.run([self.bin(name), *args], timeout=self.timeout, env=self.env(), check=check)

    def _run_sync(self, name: str, *args: str) -> commands.Result:
        return commands.run_sync([self.bin(name), *args], timeout=self.timeout, env=self.env())

    # ------------------------------------------------------------------ scontrol
    def show_job_sync(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o J``: its fields (JobState, NodeList, BatchHost, Restarts ...)."""
        return _kv(self._run_sync("scontrol", "show", "job", "-o", job_id).stdout)

    def show_nodes_sync(self, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
        """``scontrol show node -o N1,N2``: NodeName -> its fields (NodeAddr, State ...)."""
        return _node_fields(self._run_sync("scontrol", "show", "node", "-o", ",".join(nodes)).stdout)

    async def show_nodes(self, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
        return _node_fields((await self._run("scontrol", "show", "node", "-o", ",".join(nodes))).stdout)

    async def requeue(self, job_id: str) -> None:
        """``scontrol requeue J``: Slurm ends the job and queues it again (same job id).

        Asked from inside the job itself, the command can be ended by the very SIGTERM with which
        Slurm ends the job's processes for the requeue (seen: exit -15 after a requeue that
        happened): then the job's restart count (against this run's ``SLURM_RESTART_COUNT``), or its
        state, says whether it was requeued."""
        before = {"Restarts": os.environ.get("SLURM_RESTART_COUNT") or "0"}
        res = await self._run("scontrol", "requeue", job_id, check=False)
        if res.returncode == 0:
            return
        if res.returncode == -signal.SIGTERM:
            after = _kv((await self._run("scontrol", "show", "job", "-o", job_id, check=False)).stdout)
            if (after.get("Restarts", "") != before.get("Restarts", "")
                    or after.get("JobState", "").startswith(("REQUEUE", "PENDING"))):
                return
        raise PlatformError(f"`scontrol requeue {job_id}` failed (exit {res.returncode}): "
                            f"{(res.stderr or res.stdout).strip()[-300:] or 'no output'}")

    # ------------------------------------------------------------------ squeue, sinfo
    async def job(self, job_id: str) -> tuple[str, list[str]] | None:
        """``squeue -j J``: the job's state and its live node list (not SLURM_JOB_NODELIST);
        None when Slurm no longer lists the job."""
        res = await self._run("squeue", "-h", "-j", job_id, "-o", "%T|%N")
        line = res.stdout.strip().splitlines()
        if not line:
            return None
        state, _, nodelist = line[0].partition("|")
        return state.strip(), expand_hostlist(nodelist.strip())

    async def steps(self, job_id: str) -> dict[str, tuple[str, str]]:
        """``squeue -s -j J``: step name -> (step id, nodes)."""
        res = await self._run("squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j|%N")
        out = {}
        for row in res.stdout.splitlines():
            parts = row.strip().split("|")
            if len(parts) == 3:
                out[parts[1]] = (parts[0], parts[2])
        return out

    async def node_states(self, nodes: Sequence[str]) -> dict[str, str]:
        """``sinfo -N -n N1,N2``: node -> its state, lower case (``idle``, ``mixed*`` ...)."""
        res = await self._run("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T")
        out = {}
        for row in res.stdout.splitlines():
            name, _, st = row.strip().partition("|")
            out[name] = st.lower()
        return out

    # ------------------------------------------------------------------ scancel
    async def scancel(self, step_ids: Sequence[str], sig: str | None, *, ctld: bool = False) -> None:
        """``scancel [--ctld] [--signal=SIG] J.S ...``; a step that ended meanwhile is not an error,
        anything else (no controller) is a PlatformError. ``ctld``: the request goes to slurmctld,
        which signals the nodes itself, asynchronously (scancel does not wait for a node's slurmd)."""
        if not step_ids:
            return
        args = ["--quiet", *(["--ctld"] if ctld else []), *([f"--signal={sig}"] if sig else []), *step_ids]
        res = await self._run("scancel", *args, check=False)
        if res.returncode != 0:
            errors = [ln for ln in res.stderr.splitlines() if ln.strip() and not _STEP_GONE.search(ln)]
            if errors:
                raise PlatformError(f"`scancel {' '.join(args)}` failed (exit {res.returncode}): "
                                    f"{' '.join(errors)[-400:]}")

    # ------------------------------------------------------------------ srun
    def srun_argv(self, job_id: str, node: str, step_name: str, *, overlap: bool,
                  srun_args: Sequence[str] = ()) -> list[str]:
        """``srun`` for one step on one node of the job, explicit about everything (the
        allocation's own variables are stale once a node left it)."""
        return [
            self.bin("srun"), f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            f"--job-name={step_name}", "--kill-on-bad-exit=0", "--input=none",
            "--unbuffered", *(["--overlap"] if overlap else []), *srun_args,
        ]

    @staticmethod
    def start_step(argv: Sequence[str], *, env: Mapping[str, str], output: IO[bytes]) -> subprocess.Popen:
        """Start an srun client (``argv`` from :meth:`srun_argv` and the step's command) in its own
        session, its output to ``output``; OSError when it cannot start."""
        return subprocess.Popen(list(argv), env=dict(env), stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=os.getcwd())


# ---------------------------------------------------------------------------- the sbatch wrapper's commands
def partition_sizes(*, env: Mapping[str, str] | None = None, timeout: float = 20.0, sinfo: str = "sinfo",
                    ) -> tuple[dict[str, int], str]:
    """Nodes per partition as ``sinfo`` shows them (hidden ones too), and the default partition.
    PlatformError when sinfo cannot be run or fails."""
    res = commands.run_sync([sinfo, "-h", "-a", "-N", "-o", "%N|%P"], timeout=timeout, env=env)
    nodes: dict[str, set[str]] = {}
    default = ""
    for row in res.stdout.splitlines():
        node, _, part = row.strip().partition("|")
        if not node or not part:
            continue
        if part.endswith("*"):
            part = default = part[:-1]
        nodes.setdefault(part, set()).add(node)
    return {p: len(n) for p, n in nodes.items()}, default


def sbatch_submit(argv: Sequence[str], script: str, *, timeout: float, env: Mapping[str, str] | None = None) -> str:
    """Run ``sbatch --parsable`` (``argv``) with ``script`` on its standard input; the job id.
    PlatformError when sbatch fails or prints no job id."""
    res = commands.run_sync(list(argv), timeout=timeout, env=env, input=script)
    job_id = res.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise PlatformError(f"sbatch printed no job id: {res.stdout.strip()!r} {res.stderr.strip()!r}")
    return job_id
