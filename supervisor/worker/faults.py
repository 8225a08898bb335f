"""Fault injection for restart drills, driven by one environment variable.

Syntax (``SUPERVISOR_FAULT``)::

    kind=KIND[,rank=R][,step=S][,attempt=A][,ms=N]  [; another fault ...]

* ``kind``: ``crash`` (exit 17, ``EXIT_CRASH``), ``kill`` (SIGKILL self), ``hang`` (block forever in
  compute), ``stop`` (SIGSTOP self), ``skip-collective`` (skip this step's gradient
  all-reduce so the peers block inside it), ``slow`` (+``ms`` per step from ``step`` on,
  default 200), ``nan`` (the loss becomes NaN), ``crash-in-save`` (SIGKILL self after the
  first shard file of the save at ``step`` is written), ``node-kill`` (SIGKILL every process
  of this rank's node: its torchrun agent and every rank under it, a lost machine) and
  ``node-stop`` (SIGSTOP them all: a frozen machine), ``oom`` (allocate and touch memory
  until the kernel's OOM killer ends the process: a memory bug, under a container's memory
  limit), ``slow-save`` (each periodic save from ``step`` on blocks ``ms`` longer: a save stall,
  what slow storage does). The node faults fire from the rank named by ``rank`` and take its whole node down
  with it.
* ``rank``: the global rank it fires on (default: every rank).
* ``step``: the step at which it fires (default 1; ``slow`` applies from it on).
* ``attempt``: fire only in this attempt (default: every attempt). Without it a fault fires
  again after every restart, which is how a crash loop is drilled.

A malformed spec raises :class:`FaultSpecError` at start-up; it is never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("crash", "kill", "hang", "stop", "skip-collective", "slow", "nan", "crash-in-save", "node-kill", "node-stop",
         "oom", "slow-save")
_KEYS = {"kind", "rank", "step", "attempt", "ms"}


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None
    step: int = 1
    attempt: int | None = None
    ms: int = 200

    def applies(self, *, rank: int, attempt: int) -> bool:
        return (self.rank is None or self.rank == rank) and (self.attempt is None or self.attempt == attempt)

    def fires_at(self, step: int) -> bool:
        return step >= self.step if self.kind in ("slow", "slow-save") else step == self.step


def parse_faults(spec: str | None) -> list[Fault]:
    if spec is None or not spec.strip():
        return []
    faults = []
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        fields: dict[str, str] = {}
        for item in part.split(","):
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise FaultSpecError(f"fault {part!r}: {item!r} is not key=value")
            if key not in _KEYS:
                raise FaultSpecError(f"fault {part!r}: unknown key {key!r} (known: {', '.join(sorted(_KEYS))})")
            if key in fields:
                raise FaultSpecError(f"fault {part!r}: {key!r} given twice")
            fields[key] = value
        kind = fields.pop("kind", None)
        if kind not in KINDS:
            raise FaultSpecError(f"fault {part!r}: kind must be one of {', '.join(KINDS)}")
        ints: dict[str, int] = {}
        for key, value in fields.items():
            try:
                ints[key] = int(value)
            except ValueError:
                raise FaultSpecError(f"fault {part!r}: {key} must be an integer, got {value!r}") from None
            if ints[key] < 0 or (key == "step" and ints[key] < 1):
                raise FaultSpecError(f"fault {part!r}: {key} out of range: {value}")
        faults.append(Fault(kind=kind, **ints))
    return faults
