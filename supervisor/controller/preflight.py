"""Checks before the first launch of a run: the commonest mistakes as one clear line in
seconds, instead of three failed attempts and a cause buried in a node log.

* the checks about the command (:func:`supervisor.preflight.check_command`: its program
  resolves, its Python imports torch, and the worker SDK, a warning), where the controller
  shares the workers' environment (``Platform.checks_command_here``: local, Slurm). Elsewhere
  (Kubernetes: the controller's image has no torch) each node's agent runs the same checks
  where its ranks run, and its failure stops the job at once (``preflight_failed``);
* the checkpoint root exists or can be created, and is writable (the controller's own mount,
  on every platform).

The rendezvous port is not checked. The local and Slurm platforms choose one per attempt
(``Platform.rendezvous_endpoint``: a port the kernel reports free on the controller's host at
that moment), so there is none to check before the launch, and a clash fails only that
attempt, whose relaunch picks another. Kubernetes uses a fixed port
(``platform.kubernetes.rdzv_port``, 29400) served by the first pod, in that pod's own network
namespace; it cannot be probed from the controller before the pod exists.

Each check costs milliseconds (``find_spec``, not an import), so a cold start barely notices.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from supervisor.preflight import PreflightError, check_command

__all__ = ["PreflightError", "check"]


def check(command: Sequence[str], env: Mapping[str, str], checkpoint_root: Path, *,
          command_here: bool = True) -> list[str]:
    """Raise :class:`PreflightError` on a mistake that would fail every rank; return warnings.
    ``command_here``: the command runs in this host's environment, so check it here too."""
    warnings = check_command(command, env) if command_here else []
    try:
        checkpoint_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe_file = checkpoint_root / f".preflight-{os.getpid()}"
        probe_file.write_bytes(b"")
        probe_file.unlink()
    except OSError as exc:
        raise PreflightError(f"preflight: the checkpoint root {checkpoint_root} is not writable: {exc.strerror or exc}"
                             ) from None
    return warnings
