"""The job lock's owner under Slurm: the batch node, the job id and its restart count, so that a
requeued run of the job (a higher ``SLURM_RESTART_COUNT``) takes the job over at once."""

from __future__ import annotations

from typing import Any, Mapping

from supervisor.platforms.base import LockOwner


class SlurmLockOwner(LockOwner):
    def __init__(self, env: Mapping[str, str]) -> None:
        try:
            restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
        except ValueError:
            restarts = 0
        self._fields = {"node": env.get("SLURMD_NODENAME", ""), "slurm_job_id": env.get("SLURM_JOB_ID", ""),
                        "slurm_restart_count": restarts}

    def fields(self) -> dict[str, Any]:
        return dict(self._fields)

    def supersedes(self, held: dict[str, Any]) -> str:
        job, restarts = held.get("slurm_job_id"), held.get("slurm_restart_count")
        mine = self._fields["slurm_restart_count"]
        if job and job == self._fields["slurm_job_id"] and isinstance(restarts, int) and mine > restarts:
            return f"Slurm requeued job {job} (restart {restarts} -> {mine}): that run is over"
        return ""

    def describe(self, held: dict[str, Any]) -> str:
        where = f"host {held.get('host')}" + (f" (Slurm node {held['node']})" if held.get("node") else "")
        job = f", Slurm job {held['slurm_job_id']}" if held.get("slurm_job_id") else ""
        return f"{where}{job}, pid {held.get('pid')}"

    def stop_hint(self, held: dict[str, Any]) -> str:
        job = held.get("slurm_job_id")
        return f"scancel {job}" if job else super().stop_hint(held)
