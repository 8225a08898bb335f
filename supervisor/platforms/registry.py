"""Every platform kind in one table: its config section, its builder, its own commands.

``platform.kind`` names an entry here. The config reads ``platform.<section>`` with the entry's
section class, the ``supervisor`` command builds the job's platform with its builder and offers
its commands (``supervisor sbatch``), and ``supervisor status`` asks it where the controller is
reached from another host. What an entry names is imported only when it is used (``module:name``
strings), so reading a config imports no platform, and never the kubernetes client.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Command:
    """A command of the platform's own under ``supervisor`` (it parses its own arguments)."""

    name: str
    run: str
    """``module:function``, called with the arguments after the command's name; returns the exit code."""
    help: str
    description: str = ""


@dataclass(frozen=True)
class PlatformKind:
    name: str
    build: str
    """``module:function(cfg, log_dir) -> Platform``; raises ``PlatformError`` when it cannot start."""
    section: str = ""
    """``module:Class``, the dataclass of ``platform.<name>`` (its settings); empty: none."""
    host_auto: bool = False
    """``platform.host: auto`` means something here (the platform resolves it in ``prepare``)."""
    reached_at: str = ""
    """``module:function(described) -> str``: the address another host (a login node) reaches the
    controller's host at, from what the platform's ``describe()`` saved; "" when it cannot tell."""
    drill_problem: str = ""
    """``module:function(cfg, env) -> str``: why ``supervisor drill`` cannot run here ("" when it can)."""
    commands: tuple[Command, ...] = ()


KINDS: dict[str, PlatformKind] = {k.name: k for k in (
    PlatformKind("local", build="supervisor.platforms.local:from_config"),
    PlatformKind(
        "slurm", build="supervisor.platforms.slurm.platform:build",
        section="supervisor.platforms.slurm.settings:SlurmConfig", host_auto=True,
        reached_at="supervisor.platforms.slurm.platform:reached_at",
        drill_problem="supervisor.platforms.slurm.platform:drill_problem",
        commands=(Command(
            "sbatch", run="supervisor.platforms.slurm.command:main",
            help="submit a job to Slurm under the supervisor (supervisor sbatch --help)",
            description="supervisor sbatch --nodes N [--min-nodes M] [--time T] [sbatch options] -- COMMAND ..."),),
    ),
    PlatformKind(
        "kubernetes", build="supervisor.platforms.kube.platform:from_config",
        section="supervisor.platforms.kube.settings:KubernetesConfig"),
)}


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def kinds() -> tuple[str, ...]:
    return tuple(KINDS)


def get(kind: str) -> PlatformKind | None:
    return KINDS.get(kind)


def sections() -> tuple[str, ...]:
    """The ``platform.<section>`` keys, one per kind that has settings."""
    return tuple(k.name for k in KINDS.values() if k.section)


def section_class(name: str) -> type:
    """The settings dataclass of ``platform.<name>`` (KeyError if no kind has that section)."""
    kind = KINDS[name]
    if not kind.section:
        raise KeyError(name)
    return _load(kind.section)


def build(cfg: Any, log_dir: Path) -> Any:
    """The platform of ``cfg.platform.kind``; ``PlatformError`` when it cannot start."""
    from supervisor.platforms.base import PlatformError

    kind = KINDS.get(cfg.platform.kind)
    if kind is None:
        raise PlatformError(f"no platform of kind {cfg.platform.kind!r}")
    return _load(kind.build)(cfg, log_dir)


def reached_at(described: Any) -> str:
    """Where another host reaches the controller whose platform saved ``described`` (its
    ``describe()``, from the state file); "" when no platform can tell (it runs here)."""
    if not isinstance(described, dict):
        return ""
    for kind in KINDS.values():
        if kind.reached_at:
            addr = _load(kind.reached_at)(described)
            if addr:
                return str(addr)
    return ""


def drill_problem(cfg: Any, env: Mapping[str, str]) -> str:
    """Why a drill of ``cfg`` cannot run where this command runs ("" when it can)."""
    kind = KINDS.get(cfg.platform.kind)
    return _load(kind.drill_problem)(cfg, env) if kind is not None and kind.drill_problem else ""


def commands() -> tuple[Command, ...]:
    return tuple(c for k in KINDS.values() for c in k.commands)


def command(name: str) -> Callable[[list[str]], int]:
    """The entry point of the platform command ``name``."""
    return _load(next(c.run for c in commands() if c.name == name))
