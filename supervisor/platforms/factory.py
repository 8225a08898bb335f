"""One factory for every platform: ``cli.py`` builds the job's platform here and runs it the same
way whatever its kind (each platform's own start-up needs are its ``prepare``, ``banner`` and
``supervise`` hooks, see :class:`~supervisor.platforms.base.Platform`)."""

from __future__ import annotations

from pathlib import Path

from supervisor.platforms.base import Platform, PlatformError


def build_platform(cfg, log_dir: Path) -> Platform:
    """The platform of ``cfg.platform.kind``; :class:`PlatformError` when it cannot start."""
    kind = cfg.platform.kind
    if kind == "local":
        from supervisor.platforms.local import LocalPlatform

        return LocalPlatform(cfg.node_slots, log_dir, warm_agents=cfg.platform.warm_agents)
    if kind == "slurm":
        from supervisor.platforms.slurm import from_config

        return from_config(cfg, log_dir / "slurm")
    if kind == "kubernetes":
        from supervisor.platforms.kube.platform import from_config as kube_from_config

        return kube_from_config(cfg, log_dir)
    raise PlatformError(f"no platform of kind {kind!r}")
