"""Checks before the first launch of a run: the commonest mistakes as one clear line in
seconds, instead of three failed attempts and a cause buried in a node log.

* the command's program resolves on the PATH the agents will use;
* a Python command's interpreter can import torch (the job's ``python`` from the system
  instead of the virtualenv is the classic), and the worker SDK (a warning: a script may not
  use it);
* the checkpoint root exists or can be created, and is writable.

The rendezvous port is not checked. The local and Slurm platforms choose one per attempt
(``Platform.rendezvous_endpoint``: a port the kernel reports free on the controller's host at
that moment), so there is none to check before the launch, and a clash fails only that
attempt, whose relaunch picks another. Kubernetes uses a fixed port
(``platform.kubernetes.rdzv_port``, 29400) served by the first pod, in that pod's own network
namespace; it cannot be probed from the controller before the pod exists.

Each check costs milliseconds (``find_spec``, not an import), so a cold start barely notices.
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


def _same_interpreter(resolved: str, env: Mapping[str, str]) -> bool:
    """Whether the job's interpreter is this process's, searching the same paths: the path itself
    (not its real path: a virtualenv's python is a link to the base interpreter, which sees other
    packages) and every variable that moves the search path, as this process started with them."""
    if not sys.executable or os.path.abspath(resolved) != os.path.abspath(sys.executable):
        return False
    return all(env.get(k) == os.environ.get(k) for k in _PATH_VARS)


class PreflightError(Exception):
    """The job cannot start as configured; the message says what to change."""


def check(command: Sequence[str], env: Mapping[str, str], checkpoint_root: Path) -> list[str]:
    """Raise :class:`PreflightError` on a mistake that would fail every rank; return warnings."""
    warnings: list[str] = []
    program = command[0]
    resolved = shutil.which(program, path=env.get("PATH", os.defpath))
    if resolved is None:
        raise PreflightError(f"preflight: the command's program {program!r} is not found (PATH={env.get('PATH', '')!r}"[:300]
                             + "); give its full path, e.g. /path/to/.venv/bin/python")
    if Path(resolved).name.startswith("python"):
        if _same_interpreter(resolved, env):
            # this very interpreter with the same search path: ask it here instead of starting
            # another Python (tens of ms on the cold start's serial path, more on a loaded host)
            missing = [n for n in ("torch", "supervisor") if importlib.util.find_spec(n) is None]
        else:
            try:
                probe = subprocess.run([resolved, "-c", _PROBE], env=dict(env), capture_output=True, text=True,
                                       timeout=30, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise PreflightError(f"preflight: {resolved} does not run: {exc}") from None
            if probe.returncode != 0:
                tail = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
                raise PreflightError(f"preflight: the job's interpreter {resolved} fails to start: {tail}"[:400])
            missing = probe.stdout.split()
        if "torch" in missing:
            raise PreflightError(
                f"preflight: the job's interpreter {resolved} cannot import torch, so every rank would fail with "
                "\"ModuleNotFoundError: No module named 'torch'\". Use the interpreter of the environment that has "
                "torch (e.g. .venv/bin/python) in the command, or put its bin directory first on PATH")
        if "supervisor" in missing:
            warnings.append(f"{resolved} cannot import the worker SDK (supervisor): ranks will send no heartbeats, "
                            "so hangs, checkpoints and restores are not watched")
    try:
        checkpoint_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe_file = checkpoint_root / f".preflight-{os.getpid()}"
        probe_file.write_bytes(b"")
        probe_file.unlink()
    except OSError as exc:
        raise PreflightError(f"preflight: the checkpoint root {checkpoint_root} is not writable: {exc.strerror or exc}"
                             ) from None
    return warnings
