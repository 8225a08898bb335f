"""What a training script imports (the worker SDK).

* :class:`~supervisor.worker.runtime.Worker`: session from the environment, heartbeats,
  phase timers, the collective watchdog, restore/save helpers, the timing log, drills.
* :class:`~supervisor.worker.sampler.ResumableSampler`: world-size-independent data order.
* :mod:`~supervisor.worker.faults`: the ``SUPERVISOR_FAULT`` drill syntax.
* :mod:`~supervisor.worker.instrument`: what the supervisor installs in a rank whose script
  imports none of this (heartbeats from torch's own records).

The SDK talks to the controller only over the wire (:mod:`supervisor.protocol`). Its names are
loaded on first use: importing a submodule (the heartbeat, the instrumentation, which run before
a script imports torch) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "EXIT_NONFINITE": "supervisor.protocol", "EXIT_PREEMPTED": "supervisor.protocol",
    "Fault": "supervisor.worker.faults", "FaultSpecError": "supervisor.worker.faults",
    "parse_faults": "supervisor.worker.faults",
    "NonFiniteLoss": "supervisor.worker.runtime", "Verdict": "supervisor.worker.runtime",
    "Worker": "supervisor.worker.runtime",
    "ResumableSampler": "supervisor.worker.sampler",
    "Session": "supervisor.worker.session", "SessionError": "supervisor.worker.session",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor.worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
