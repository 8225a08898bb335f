"""One run's memory on disk: the controller's state file, its schema, and the job lock.

``LOG_DIR/supervisor-state.json`` is what a restarted controller adopts a running gang from,
so it must survive a crash at any instant and must never be misread:

* written durably: a temporary file, fsync, rename over the old one, fsync of the directory
  (a power loss leaves the old state or the new one, never a truncated file);
* read with a size bound and checked against its schema: a file that does not parse, or
  holds a field of another version or of the wrong type, is refused with a message that says
  what to do (``--fresh``), never silently replaced by a new run that would neither adopt nor
  kill the old gang;
* one run's history belongs to that run: a new run after a finished one archives the old
  state beside it (``supervisor-state.<time>.json``, kept for the post-mortem) and starts a
  new history.

``LOG_DIR/supervisor.lock`` is held (``flock``) for the controller's whole life: a second
controller on the same log directory is refused at once, naming the running one.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import time
import typing
from pathlib import Path
from typing import Any

from supervisor.controller.decide import History, JobPhase

STATE_FILE = "supervisor-state.json"
LOCK_FILE = "supervisor.lock"
MAX_STATE_BYTES = 8 << 20
VERSION = 2


class StateError(Exception):
    """The job's state cannot be used as it is; the message says why and what to do."""


_INT, _NUM, _STR, _OPT_STR, _LIST_STR, _DICT = "int", "number", "str", "str|null", "list[str]", "object"
# field -> (kind, required)
_SCHEMA: dict[str, tuple[str, bool]] = {
    "job": (_STR, True),
    "phase": (_STR, True),
    "attempt": (_INT, True),
    "nodes": (_LIST_STR, False),
    "restore_from": (_OPT_STR, False),
    "restored": (_OPT_STR, False),
    "restored_step": (_INT, False),
    "ckpt_step_at_attempt_start": (_INT, False),
    "history": (_DICT, False),
    "intake_port": (_INT, False),
    "http_port": (_INT, False),
    "http_host": (_STR, False),
    "platform": (_DICT, False),
    "pid": (_INT, False),
    "updated": (_NUM, False),
    "stop_reason": (_STR, False),
    "exit_code": (_INT, False),
    "ckpt_root": (_STR, False),
    "last_checkpoint": (_DICT, False),
    "run": (_INT, False),
    "run_started": (_NUM, False),
    "version": (_INT, False),
}


def _ok(kind: str, v: Any) -> bool:
    if kind == _INT:
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == _NUM:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == _STR:
        return isinstance(v, str)
    if kind == _OPT_STR:
        return v is None or isinstance(v, str)
    if kind == _LIST_STR:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    return v is None or isinstance(v, dict)


def _check_history(raw: dict) -> History:
    hints = typing.get_type_hints(History)
    kwargs = {}
    for name, value in raw.items():
        if name not in hints:
            raise ValueError(f"history.{name}: unknown field (written by another version?)")
        tp = hints[name]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is bool:
            good = isinstance(value, bool)
        elif tp is int:
            good = isinstance(value, int) and not isinstance(value, bool)
        elif tp is str:
            good = isinstance(value, str)
        elif origin is list:
            good = isinstance(value, list) and all(isinstance(x, args[0]) and not isinstance(x, bool) for x in value)
        elif origin is dict:
            good = isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(v, args[1]) and not isinstance(v, bool) for k, v in value.items())
        else:  # a field type this checker does not know: refuse rather than guess
            good = False
        if not good:
            raise ValueError(f"history.{name}: {value!r:.80} is not a {tp}")
        kwargs[name] = value
    return History(**kwargs)


def validate(obj: Any) -> dict[str, Any]:
    """The state as a dict whose every field has the right type; raises ValueError naming the field."""
    if not isinstance(obj, dict):
        raise ValueError("the top level is not an object")
    for name, (kind, required) in _SCHEMA.items():
        if name not in obj:
            if required:
                raise ValueError(f"{name}: missing")
            continue
        if not _ok(kind, obj[name]):
            raise ValueError(f"{name}: {obj[name]!r:.80} is not a {kind}")
    unknown = sorted(set(obj) - set(_SCHEMA))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (written by another version?)")
    try:
        JobPhase(obj["phase"])
    except ValueError:
        raise ValueError(f"phase: {obj['phase']!r:.40} is not a known phase") from None
    if obj["attempt"] < 0:
        raise ValueError("attempt: negative")
    obj = dict(obj)
    obj["history"] = _check_history(obj.get("history") or {})
    return obj


def load(path: Path) -> dict[str, Any] | None:
    """The saved state (``history`` as a :class:`History`), ``None`` when there is none.

    Raises :class:`StateError` when the file exists but cannot be used.
    """
    fresh_hint = (f"A gang started from it may still be running. Run the same command with --fresh to stop what "
                  f"is left of that gang and start a new run (the file is kept beside it).")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path} cannot be read ({exc}). {fresh_hint}") from None
    if len(data) > MAX_STATE_BYTES:
        raise StateError(f"{path} is larger than {MAX_STATE_BYTES} bytes: not a supervisor state. {fresh_hint}")
    try:
        obj = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise StateError(f"{path} is unreadable (truncated or not JSON: {exc}). {fresh_hint}") from None
    try:
        return validate(obj)
    except ValueError as exc:
        raise StateError(f"{path} is not a state this version understands ({exc}). {fresh_hint}") from None


def to_json(state: dict[str, Any]) -> dict[str, Any]:
    out = dict(state)
    if isinstance(out.get("history"), History):
        out["history"] = dataclasses.asdict(out["history"])
    out["version"] = VERSION
    return out


def save(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` so that a crash at any instant leaves the old file or the new one."""
    data = json.dumps(to_json(state), indent=1).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def archive(path: Path, label: str) -> Path:
    """Move the state aside (kept for the post-mortem); returns where it went."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    n = 0
    while True:
        dest = path.with_name(f"{path.stem}.{label}-{stamp}{f'-{n}' if n else ''}{path.suffix}")
        if not os.path.lexists(dest):
            break
        n += 1
    os.rename(path, dest)
    _fsync_dir(path.parent)
    return dest


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JobLock:
    """An exclusive ``flock`` on ``LOG_DIR/supervisor.lock`` for the controller's life.

    The kernel drops it when the process dies (``kill -9`` included), so a crashed controller
    never blocks the next one; a live one always does.
    """

    def __init__(self, log_dir: Path) -> None:
        self.path = Path(log_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = ""
            try:
                holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
            except OSError:
                pass
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                log_dir = self.path.parent
                raise StateError(
                    f"another supervisor ({holder or 'pid unknown'}) is running this job in {log_dir}: only one "
                    f"controller may act on a job. Watch it with `supervisor status --log-dir {log_dir}`; stop it "
                    "with SIGTERM to that pid.") from None
            raise StateError(f"cannot lock {self.path}: {exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
