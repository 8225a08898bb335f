"""Run a scheduler command (``squeue``, ``scontrol``, ``scancel`` ...) under a timeout.

Every call has a deadline; a command that is missing, times out or exits non-zero raises
:class:`~supervisor.platforms.base.PlatformError` with the command, the reason and the tail
of its stderr, never a subprocess exception and never a hang. A timed-out command is killed
with its whole process group.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from supervisor.platforms.base import PlatformError


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _describe(argv: Sequence[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


def _tail(text: str, n: int = 400) -> str:
    text = " ".join(text.strip().split())
    return text[-n:]


def _check(argv: Sequence[str], code: int, out: str, err: str, started: float, check: bool) -> Result:
    res = Result(tuple(argv), code, out, err, time.monotonic() - started)
    if check and code != 0:
        raise PlatformError(f"`{_describe(argv)}` failed (exit {code}): {_tail(err or out) or 'no output'}")
    return res


async def run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
              check: bool = True) -> Result:
    """Run ``argv`` (no shell) with ``timeout`` seconds; PlatformError on any failure."""
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=None if env is None else dict(env), start_new_session=True)
    except OSError as exc:
        raise PlatformError(f"cannot run `{_describe(argv)}`: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        _kill_group(proc.pid)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:
            pass
        raise PlatformError(f"`{_describe(argv)}` timed out after {timeout:g}s (is slurmctld up?)") from None
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        raise
    return _check(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), started, check)


def run_sync(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
             check: bool = True, input: str | None = None) -> Result:
    """The same for the few calls made outside an event loop (start-up, the sbatch wrapper);
    ``input``: text for the command's standard input (none otherwise)."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=None if env is None else dict(env), start_new_session=True)
    except OSError as exc:
        raise PlatformError(f"cannot run `{_describe(argv)}`: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(None if input is None else input.encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        raise PlatformError(f"`{_describe(argv)}` timed out after {timeout:g}s (is slurmctld up?)") from None
    return _check(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), started, check)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
