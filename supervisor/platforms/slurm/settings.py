"""``platform.slurm``: the Slurm platform's settings, a section of the job config
(:mod:`supervisor.platforms.registry` names it; :mod:`supervisor.config` reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.config import ConfigError


@dataclass(frozen=True)
class SlurmConfig:
    """``platform.slurm``: how the slurm platform drives the allocation it runs in."""

    job_id: str = ""
    """The allocation (an ``sbatch --no-kill`` job) whose nodes run the gang; empty: ``$SLURM_JOB_ID``."""
    command_timeout_s: float = 20.0
    """Every Slurm command (squeue, scontrol, scancel, sinfo) is killed after this; its failure is a
    platform error the controller logs and retries, never a hang."""
    poll_interval_s: float = 2.0
    """How often the live node list, node states and steps are read from Slurm."""
    launch_timeout_s: float = 60.0
    """From ``srun`` to its step being listed by Slurm, at most; past it the launch failed."""
    kill_confirm_s: float = 10.0
    """A cancelled step still listed after this is on a node that cannot answer (dead or frozen):
    the node is reported stopped and is no longer offered as a slot."""
    overlap: bool = True
    """``srun --overlap``: a step on a frozen node keeps its CPUs; without it a relaunch on the same
    nodes waits ("Requested nodes are busy")."""
    srun_args: tuple[str, ...] = ()
    """Extra ``srun`` options for every node's step (e.g. ``[--mem=0, --cpus-per-task=8]``)."""
    bin_dir: str = ""
    """Folder of the Slurm commands; empty: found on PATH."""
    warning_signal: str = "USR1"
    """The signal sbatch's ``--signal=B:SIG@T`` sends the supervisor before the time limit: it stops
    the gang with SIGTERM (every rank writes its emergency checkpoint) and ends the supervisor."""
    requeue_on_warning: bool = False
    """After the warning signal's emergency checkpoint, ``scontrol requeue`` the job: the requeued
    job resumes from the newest verified checkpoint. The same choice (requeue, else cancel) ends a job whose
    controller is lost (``controller_timeout_s``)."""
    controller_timeout_s: float = 60.0
    """Every node of the allocation runs a standing guard (a step of its own for the job's life,
    from before the first launch) that asks the controller (on the batch host) every
    ``controller_probe_s``; after this long without an answer the batch host is taken as lost and
    one guard requeues or cancels the job (Slurm then stops every agent: SIGTERM, an emergency
    checkpoint when every rank is alive), so it is never left RUNNING empty. 0: no guard."""
    controller_probe_s: float = 5.0
    """How often each node's guard asks the controller whether it is alive (``GET /healthz``)."""

    def __post_init__(self) -> None:
        for name in ("command_timeout_s", "poll_interval_s", "launch_timeout_s", "kill_confirm_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"platform.slurm.{name}: must be > 0")
        if self.controller_timeout_s < 0:
            raise ConfigError("platform.slurm.controller_timeout_s: must be >= 0 (0: no node guard)")
        if self.controller_probe_s <= 0:
            raise ConfigError("platform.slurm.controller_probe_s: must be > 0")
        if self.controller_timeout_s and self.controller_timeout_s < 2 * self.controller_probe_s:
            raise ConfigError(f"platform.slurm.controller_timeout_s ({self.controller_timeout_s:g}) must be at least "
                              f"twice controller_probe_s ({self.controller_probe_s:g}): one lost probe is not a lost "
                              "controller")
        if self.job_id and not self.job_id.replace("_", "").isdigit():
            raise ConfigError(f"platform.slurm.job_id: {self.job_id!r} is not a Slurm job id")
        if self.warning_signal.upper().removeprefix("SIG") not in ("USR1", "USR2", "TERM", "INT", "HUP", "URG"):
            raise ConfigError(f"platform.slurm.warning_signal: {self.warning_signal!r} is not one of USR1, USR2, "
                              "TERM, INT, HUP, URG")
