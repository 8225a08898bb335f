"""The checks about a job's command, one definition for the two places they run.

* the command's program resolves on the PATH the ranks will have;
* a Python command's interpreter can import torch (the job's ``python`` from the system
  instead of the virtualenv is the classic), and the worker SDK (a warning: a script may not
  use it).

Where the controller shares the workers' environment (the local and Slurm platforms:
``Platform.checks_command_here``), the controller's preflight (:mod:`supervisor.controller.preflight`)
runs them before its first launch. Where it does not (Kubernetes: the controller's image has no
torch, the workers' image has the training code), the node agent
(:mod:`supervisor.platforms.node.forking_agent`) runs them where its ranks will run, before it imports
torch, and a failure ends it with :data:`~supervisor.protocol.EXIT_PREFLIGHT` and one line,
:func:`error_line`, that the controller turns into a startup failure at once.

Each check costs milliseconds (``find_spec``, not an import); a second Python is started only
for an interpreter other than this one. This module imports nothing of the controller, the
platforms or torch: both sides may import it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

_PROBE = ("import importlib.util as u, sys\n"
          "print(' '.join(n for n in ('torch', 'supervisor') if u.find_spec(n) is None))")


# what decides where an interpreter finds its modules, besides the interpreter itself
_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH",
              "PYTHONPLATLIBDIR", "VIRTUAL_ENV")

_PREFIX = "preflight: "
ERROR_NAME = "PreflightError"
"""How a node agent's failed check begins its line (:func:`error_line`): the shape of an error
line the platforms read from a node's output (``NodeStatus.output_error``)."""


def _same_interpreter(resolved: str, env: Mapping[str, str]) -> bool:
    """Whether the job's interpreter is this process's, searching the same paths: the path itself
    (not its real path: a virtualenv's python is a link to the base interpreter, which sees other
    packages) and every variable that moves the search path, as this process started with them."""
    if not sys.executable or os.path.abspath(resolved) != os.path.abspath(sys.executable):
        return False
    return all(env.get(k) == os.environ.get(k) for k in _PATH_VARS)


class PreflightError(Exception):
    """The job cannot start as configured; the message says what to change."""


def error_line(exc: PreflightError) -> str:
    """``exc`` as the one line a node agent prints before it exits with ``EXIT_PREFLIGHT``:
    ``PreflightError: the job's interpreter ... cannot import torch ...``."""
    message = " ".join(str(exc).split())
    return f"{ERROR_NAME}: {message[len(_PREFIX):] if message.startswith(_PREFIX) else message}"


def missing_modules(python: str, env: Mapping[str, str]) -> list[str]:
    """Which of torch and the worker SDK (``supervisor``) the interpreter ``python`` (a resolved
    path) cannot import with ``env``. Raises :class:`PreflightError` when it does not run."""
    if _same_interpreter(python, env):
        # this very interpreter with the same search path: ask it here instead of starting
        # another Python (tens of ms on the cold start's serial path, more on a loaded host)
        return [n for n in ("torch", "supervisor") if importlib.util.find_spec(n) is None]
    try:
        probe = subprocess.run([python, "-c", _PROBE], env=dict(env), capture_output=True, text=True,
                               timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(f"{_PREFIX}{python} does not run: {exc}") from None
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
        raise PreflightError(f"{_PREFIX}the job's interpreter {python} fails to start: {tail}"[:400])
    return probe.stdout.split()


def check_command(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Raise :class:`PreflightError` when ``command``, run with ``env``, would fail every rank;
    return warnings."""
    warnings: list[str] = []
    program = command[0]
    resolved = shutil.which(program, path=env.get("PATH", os.defpath))
    if resolved is None:
        raise PreflightError(f"{_PREFIX}the command's program {program!r} is not found (PATH={env.get('PATH', '')!r}"[:300]
                             + "); give its full path, e.g. /path/to/.venv/bin/python")
    if Path(resolved).name.startswith("python"):
        missing = missing_modules(resolved, env)
        if "torch" in missing:
            raise PreflightError(
                f"{_PREFIX}the job's interpreter {resolved} cannot import torch, so every rank would fail with "
                "ModuleNotFoundError: use an interpreter that has torch in the command (e.g. .venv/bin/python), or "
                "put its bin directory first on PATH")
        if "supervisor" in missing:
            warnings.append(f"{resolved} cannot import the worker SDK (supervisor): ranks will send no heartbeats, "
                            "so hangs, checkpoints and restores are not watched")
    return warnings


def check_agent_interpreter() -> None:
    """The node agent's own interpreter (it runs torchrun) can import torch: raise
    :class:`PreflightError` naming it when not, before the agent's ``import torch`` would."""
    if importlib.util.find_spec("torch") is None:
        raise PreflightError(
            f"{_PREFIX}the node agent's interpreter {sys.executable} cannot import torch, and it runs torchrun: "
            "the platform's python (platform.kubernetes.python) must be the worker image's interpreter that has "
            "torch and this package")
