"""What a training script imports (the worker SDK).

* :class:`~supervisor.worker.runtime.Worker`: session from the environment, heartbeats,
  phase timers, the collective watchdog, restore/save helpers, the timing log, drills.
* :class:`~supervisor.worker.sampler.ResumableSampler`: world-size-independent data order.
* :mod:`~supervisor.worker.faults`: the ``SUPERVISOR_FAULT`` drill syntax.

The SDK talks to the controller only over the wire (:mod:`supervisor.protocol`).
"""

from supervisor.worker.faults import Fault, FaultSpecError, parse_faults
from supervisor.protocol import EXIT_NONFINITE, EXIT_PREEMPTED
from supervisor.worker.runtime import NonFiniteLoss, Verdict, Worker
from supervisor.worker.sampler import ResumableSampler
from supervisor.worker.session import Session, SessionError

__all__ = [
    "EXIT_NONFINITE", "EXIT_PREEMPTED", "Fault", "FaultSpecError", "NonFiniteLoss", "ResumableSampler",
    "Session", "SessionError", "Verdict", "Worker", "parse_faults",
]
