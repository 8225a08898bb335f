"""A rank's identity and its supervisor's coordinates, parsed once from the environment.

torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` (and ``TORCHELASTIC_RESTART_COUNT``);
the supervisor adds the variables below. Without them the SDK still works (plain torchrun or
one process): heartbeats are written to the rank's log directory instead of being sent.

========================================  ===================================================
``SUPERVISOR_ATTEMPT``                    the supervisor's attempt number (fences messages)
``SUPERVISOR_LAUNCH``                     the launch's random id (required with an address)
``SUPERVISOR_JOB``                        job name (default ``local``)
``SUPERVISOR_NODE``                       node name (default: host name)
``SUPERVISOR_HEARTBEAT_ADDR``             ``host:port`` of the controller's UDP intake
``SUPERVISOR_API``                        ``http://host:port`` of the controller's HTTP API
``SUPERVISOR_TOKEN`` / ``..._TOKEN_FILE`` the job's secret (required with an address)
``SUPERVISOR_LOG_DIR``                    per-rank logs: timing, heartbeats, stack dumps
``SUPERVISOR_HEARTBEAT_INTERVAL``         seconds between heartbeats (default 1)
``SUPERVISOR_WATCHDOG``                   phase timeouts, e.g. ``compute=120,collective=60``
``SUPERVISOR_SKIP_STEPS``                 steps whose batch to skip (non-finite twice), ``9,12``
``SUPERVISOR_IN_PLACE``                   set when the agents restart ranks in place (below)
========================================  ===================================================

With ``SUPERVISOR_IN_PLACE`` the torchrun agent may restart the rank in place, without a new
launch, so the environment stays the launch's. The rank's attempt is then the launch's plus
how many times its agent started it before (:func:`restarts_in_place`): every restart in place
restarts every rank of the gang once (an agent restarts its whole worker group, and the others
re-rendezvous with it), so the count is the same on every rank. ``TORCHELASTIC_RESTART_COUNT``
is not: an agent restarted by another's failure does not count it.
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from supervisor.procfs import start_time

from supervisor.protocol import (
    Env,
    Keys,
    PHASE_CHECKPOINT,
    PHASE_COLLECTIVE,
    PHASE_COMPUTE,
    PHASE_DATA,
    PHASE_INIT,
    PHASE_RESTORE,
    ProtocolError,
    decode_watchdog,
    derive_keys,
    launch_problem,
)

# Rank watchdog timeouts (s), one per protocol.TIMED_PHASES in order; SUPERVISOR_WATCHDOG overrides them.
# Below the supervisor's hang timeouts (rank < supervisor < budget): stacks are dumped before any kill.
DEFAULT_TIMEOUTS: dict[str, float] = {
    PHASE_INIT: 600.0,
    PHASE_RESTORE: 600.0,
    PHASE_DATA: 60.0,
    PHASE_COMPUTE: 120.0,
    PHASE_COLLECTIVE: 120.0,
    PHASE_CHECKPOINT: 900.0,
}


class SessionError(ValueError):
    """The environment describes an impossible session; the message names the variable."""


@dataclass(frozen=True)
class Session:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    attempt: int = 0
    job: str = "local"
    node: str = field(default_factory=socket.gethostname)
    heartbeat_addr: tuple[str, int] | None = None
    api: str | None = None
    token: bytes | None = field(default=None, repr=False)
    launch: str = ""
    """The id of the launch that started this rank (:data:`Env.LAUNCH`): in its every frame."""
    log_dir: Path | None = None
    heartbeat_interval: float = 1.0
    timeouts: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    skip_steps: dict[int, int] = field(default_factory=dict)
    """Step -> how many batches to skip there (a step may be listed more than once)."""

    @property
    def supervised(self) -> bool:
        return self.heartbeat_addr is not None

    @property
    def keys(self) -> Keys:
        """The keys derived from the job token (the token itself is never a key, nor sent)."""
        return derive_keys(self.token or b"")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, log_dir: str | os.PathLike | None = None) -> "Session":
        env = os.environ if env is None else env
        world = _int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _int(env, "RANK", 0, minimum=0)
        if rank >= world:
            raise SessionError(f"RANK={rank} is not below WORLD_SIZE={world}")
        attempt = _int(env, Env.ATTEMPT, _int(env, "TORCHELASTIC_RESTART_COUNT", 0, minimum=0), minimum=0)
        if env.get(Env.IN_PLACE) and env.get(Env.ATTEMPT):
            attempt += restarts_in_place(env)
        addr = None
        if env.get(Env.HEARTBEAT_ADDR):
            host, sep, port = env[Env.HEARTBEAT_ADDR].rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise SessionError(f"SUPERVISOR_HEARTBEAT_ADDR={env['SUPERVISOR_HEARTBEAT_ADDR']!r} is not host:port")
            addr = (host.strip("[]"), int(port))
        token = None
        if env.get(Env.TOKEN_FILE):
            try:
                token = Path(env[Env.TOKEN_FILE]).read_bytes().strip()
            except OSError as exc:
                raise SessionError(f"SUPERVISOR_TOKEN_FILE: {exc}") from None
        elif env.get(Env.TOKEN):
            token = env[Env.TOKEN].encode()
        if (addr or env.get(Env.API)) and not token:
            raise SessionError("a supervisor address is set but no SUPERVISOR_TOKEN(_FILE): refusing to talk unauthenticated")
        launch = env.get(Env.LAUNCH, "")
        if (addr or env.get(Env.API)) and launch_problem(launch):
            raise SessionError(f"a supervisor address is set but {Env.LAUNCH} {launch_problem(launch)} (the supervisor "
                               "sets it for every launch)")
        interval = _float(env, Env.HEARTBEAT_INTERVAL, 1.0)
        if not 0.05 <= interval <= 60:
            raise SessionError(f"SUPERVISOR_HEARTBEAT_INTERVAL={interval} is outside [0.05, 60] seconds")
        try:
            timeouts = DEFAULT_TIMEOUTS | decode_watchdog(env.get(Env.WATCHDOG, ""))
        except ProtocolError as exc:
            raise SessionError(f"{Env.WATCHDOG}: {exc.detail}") from None
        skip: dict[int, int] = {}
        for item in filter(None, (s.strip() for s in env.get(Env.SKIP_STEPS, "").split(","))):
            if not item.isdigit() or int(item) < 1:
                raise SessionError(f"SUPERVISOR_SKIP_STEPS: {item!r} is not a step number >= 1")
            skip[int(item)] = skip.get(int(item), 0) + 1
        ld = log_dir if log_dir is not None else env.get(Env.LOG_DIR) or None
        job = env.get(Env.JOB, "local")
        if len(job) > 128:
            raise SessionError("SUPERVISOR_JOB is longer than 128 characters")
        return cls(
            rank=rank, local_rank=_int(env, "LOCAL_RANK", 0, minimum=0), world_size=world, attempt=attempt,
            job=job, node=env.get(Env.NODE) or socket.gethostname(), heartbeat_addr=addr,
            api=env.get(Env.API) or None, token=token, launch=launch, log_dir=Path(ld) if ld else None,
            heartbeat_interval=interval, timeouts=timeouts, skip_steps=skip,
        )


_STARTS: dict[str, int] = {}


def restarts_in_place(env: Mapping[str, str]) -> int:
    """How many times this rank's agent started it before this process (0 the first time).

    Counted in a file of the agent's own temporary directory, one byte per start, keyed by the
    agent's pid and start time (a reused pid is another agent), the rendezvous run and the local
    rank. Counted once per process: asking again returns the same number."""
    agent = os.getppid()
    key = f"{agent}-{start_time(agent)}-{env.get('TORCHELASTIC_RUN_ID', '')}-{env.get('LOCAL_RANK', '0')}"
    if key not in _STARTS:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)[:200]
        path = Path(env.get("TMPDIR") or tempfile.gettempdir()) / f"supervisor-starts-{safe}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, b".")
                _STARTS[key] = os.fstat(fd).st_size - 1
            finally:
                os.close(fd)
        except OSError as exc:
            raise SessionError(f"{Env.IN_PLACE}: cannot count this rank's restarts in {path}: {exc}") from None
    return _STARTS[key]


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SessionError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SessionError(f"{name}={value} is below {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SessionError(f"{name}={raw!r} is not a number") from None
