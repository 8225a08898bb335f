"""The ``slurm`` platform: every node is a torchrun agent in its own ``srun`` step.

The supervisor runs inside one ``sbatch --no-kill`` allocation (on its batch host) and
starts, for attempt k, one step per node::

    srun --jobid=J --nodes=1 --ntasks=1 --nodelist=NODE --overlap --job-name=sv-JOB-aK-NODE \\
         python -m supervisor.platforms.node.forking_agent --nnodes=N:N --rdzv-backend=c10d ... -- COMMAND

Beside them, for the job's whole life, one standing node guard per node (its own ``--overlap``
step, ``sv-JOB-guard-NODE``, :mod:`supervisor.platforms.slurm.guard`) ends the job when the
controller on the batch host stops answering: a lost batch host never leaves the job RUNNING,
whether agents run at that moment or not.

One step per node gives every node its own life: ``kill_node`` is ``scancel J.STEP`` of that
node's step (and the end of its ``srun`` client), the exit of one ``srun`` client is that
node's exit code, and a relaunch names exactly the nodes it wants.

Traps this package is built around (measured on Slurm 22.05, see docs/slurm.md):

* After a node leaves the allocation ``SLURM_JOB_NODELIST``/``SLURM_NNODES`` are stale: a plain
  ``srun`` fails and ``srun -N3`` waits forever. The live node list is always read from
  ``squeue -j J -o %N``, and ``srun`` runs with every ``SLURM_*``/``SRUN_*`` input variable
  removed from its environment and explicit ``--jobid --nodes --ntasks --nodelist``.
* A frozen node blocks a new step on its CPUs ("Requested nodes are busy") until it returns:
  steps run with ``--overlap``.
* A dead or frozen node cannot confirm a cancel: Slurm notices it only after ``SlurmdTimeout``.
  A cancelled step still listed after ``kill_confirm_s`` marks its node *unresponsive*: it is
  reported ``stopped`` (the controller then counts a node failure) and no longer offered as a
  slot, so the relaunch goes to the live nodes.
* Every Slurm command runs under ``command_timeout_s``; a failure is a :class:`PlatformError`
  (launch, kill) or a logged, rate-limited warning (the periodic observation: with slurmctld
  down the steps keep running and the controller keeps watching heartbeats).

Which module holds what:

* :mod:`~supervisor.platforms.slurm.hostlist`: Slurm's hostlist syntax (``n[1-3,5]``), pure parsing.
* :mod:`~supervisor.platforms.slurm.client`: the Slurm client, the only code here that runs Slurm
  commands (``squeue``, ``scontrol``, ``scancel``, ``sinfo``, the ``srun`` argv and its start,
  ``sbatch``), and the parsing of their output (``Key=Value`` fields, node states, step lists,
  srun's exit codes and its node-failure messages), each under ``command_timeout_s``.
* :mod:`~supervisor.platforms.slurm.platform`: :class:`SlurmPlatform`, the state machine (steps,
  unresponsive nodes, launch, kill, teardown, adoption, the warning signal) over the client;
  :func:`from_config` and :func:`resolve_hosts`.
* :mod:`~supervisor.platforms.slurm.sbatch`: the ``supervisor sbatch`` wrapper: the batch script,
  the time limit, the checks before submitting and the submission.
* :mod:`~supervisor.platforms.slurm.guard`: the node guard, run on every node; it never imports
  the platform, and this package imports its modules only when one of the names below is used, so
  ``python -m supervisor.platforms.slurm.guard`` loads the guard alone.
"""

import importlib

_EXPORTS = {
    "client": ("SlurmClient", "partition_sizes", "srun_env", "srun_exit_code"),
    "hostlist": ("expand_hostlist",),
    "platform": ("SlurmPlatform", "from_config", "resolve_hosts"),
    "sbatch": ("CONFIG_HEREDOC", "TIME_FORMS", "BatchScript", "node_count_problem", "parse_time_limit",
               "render_batch_script", "sbatch_partitions", "submit", "warning_problems"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is not None:
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    try:  # a submodule (``slurm.platform``), as when this package imported them all
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
