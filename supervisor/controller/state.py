"""One run's memory on disk: the controller's state file, its schema, and the job lock.

``LOG_DIR/supervisor-state.json`` is what a restarted controller adopts a running gang from,
so it must survive a crash at any instant and must never be misread:

* written durably: a temporary file of its own (a random name, ``O_EXCL``), fsync, rename over
  the old one, fsync of the directory
  (a power loss leaves the old state or the new one, never a truncated file);
* read with a size bound and checked against its schema: a file that does not parse, or
  holds a field of another version or of the wrong type, is refused with a message that says
  what to do (``--fresh``), never silently replaced by a new run that would neither adopt nor
  kill the old gang;
* one run's history belongs to that run: a new run after a finished one archives the old
  state beside it (``supervisor-state.<time>.json``, kept for the post-mortem) and starts a
  new history.

``LOG_DIR/supervisor.lock`` is held (``flock``) for the controller's whole life: a second
controller on the same log directory is refused at once, naming the running one. Beside it,
``LOG_DIR/supervisor.owner.json`` is an owner lease (host, pid, the platform's own fields, renewed every
``LEASE_S / 3``) that refuses a controller on another host sharing the log directory, where a
``flock`` may not reach (see :class:`JobLock`).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import errno
import fcntl
import json
import logging
import math
import os
import secrets
import socket
import stat
import threading
import time
import typing
from pathlib import Path
from typing import Any

from supervisor.controller.decide import History, JobPhase, RestartTimer
from supervisor.controller.recovery import Recovery
from supervisor.files import fsync_dir, set_aside, write_atomic
from supervisor.platforms.base import LockOwner
from supervisor.procfs import pid_alive, start_time

STATE_FILE = "supervisor-state.json"
LOCK_FILE = "supervisor.lock"
OWNER_FILE = "supervisor.owner.json"
LEASE_S = 30.0
MAX_STATE_BYTES = 8 << 20
MAX_CAPACITY_MESSAGE = 4096
"""The most of the scheduler's words on a wait for capacity kept in the state (the rest is cut)."""
MAX_STATE_DEPTH = 32
"""Nesting of the whole file (the controller writes 4 levels at most)."""
MAX_STATE_INT = (1 << 63) - 1
VERSION = 2
_log = logging.getLogger("supervisor.controller")


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
    "launch_attempt": (_INT, False),
    "in_place_allowed": (_INT, False),
    "in_place_used": (_INT, False),
    "launch_id": (_STR, False),
    "recovery": (_DICT, False),
    "restart_timer": (_DICT, False),
    "capacity_since": (_NUM, False),
    "capacity_message": (_STR, False),
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
        elif origin in (list, tuple):  # a JSON list (a tuple in the value)
            good = isinstance(value, list) and all(isinstance(x, args[0]) and not isinstance(x, bool) for x in value)
        elif origin in (dict, collections.abc.Mapping):
            good = isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(v, args[1]) and not isinstance(v, bool) for k, v in value.items())
        else:  # a field type this checker does not know: refuse rather than guess
            good = False
        if not good:
            raise ValueError(f"history.{name}: {value!r:.80} is not a {tp}")
        kwargs[name] = value
    return History(**kwargs)


def _check_plain(obj: Any) -> None:
    """Bounds on every value, checked without recursion before any field is read: nesting, 64-bit
    integers, finite numbers, strings that are valid Unicode without NUL (a lone surrogate cannot
    be printed; a NUL cannot be a path). ValueError naming the field."""
    stack: list[tuple[Any, int, str]] = [(obj, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -MAX_STATE_INT <= value <= MAX_STATE_INT:
                raise ValueError(f"{where}: an integer of {len(str(abs(value)))} digits is out of range (64 bits)")
        elif isinstance(value, float):
            if not math.isfinite(value) or abs(value) > MAX_STATE_INT:
                raise ValueError(f"{where}: {value} is not a finite number in range")
        elif isinstance(value, (dict, list)):
            if depth > MAX_STATE_DEPTH:
                raise ValueError(f"{where or 'the top level'}: nested deeper than {MAX_STATE_DEPTH} levels")
            if isinstance(value, dict):
                for k, v in value.items():
                    _check_text(k, where)
                    stack.append((v, depth + 1, f"{where}.{k}".lstrip(".")[:120]))
            else:
                stack.extend((v, depth + 1, f"{where}[{i}]"[:120]) for i, v in enumerate(value))


def _check_text(s: str, where: str) -> None:
    if "\0" in s:
        raise ValueError(f"{where or 'a key'}: holds a NUL character")
    if not s.isascii():
        try:
            s.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"{where or 'a key'}: not valid Unicode ({exc.reason} at character {exc.start})") from None


def _checkpoint_name(v: Any) -> bool:
    from supervisor.checkpoint.discovery import parse_name

    return isinstance(v, str) and parse_name(v) is not None


def _check_fields(obj: dict) -> None:
    """What consumers rely on beyond the types: names that become paths, ports, a checkpoint record."""
    job = obj["job"]
    if not job or len(job) > 64 or not all(c.isalnum() or c in "-_." for c in job):
        raise ValueError(f"job: {job!r:.80} is not a job name (1-64 letters, digits, '-', '_', '.')")
    if obj.get("restore_from") is not None and not _checkpoint_name(obj["restore_from"]):
        # the controller's own pick among the root's checkpoints: a name the ranks join to their root
        raise ValueError(f"restore_from: {obj['restore_from']!r:.80} is not a checkpoint name (step-N)")
    restored = obj.get("restored")
    if restored is not None and (not restored or len(restored) > 255 or "/" in restored or restored in (".", "..")):
        # what the ranks said they loaded (a directory's name: the SDK may be given any path)
        raise ValueError(f"restored: {restored!r:.80} is not a directory name")
    for name in ("intake_port", "http_port"):
        if name in obj and not 0 <= obj[name] < 65536:
            raise ValueError(f"{name}: {obj[name]} is not a port")
    for name in ("run", "launch_attempt", "in_place_allowed", "in_place_used", "restored_step"):
        if name in obj and obj[name] < 0:
            raise ValueError(f"{name}: negative")
    # a recovery a replacement controller resumes, and its restart's timer (wall-clock marks)
    if obj.get("recovery") is not None:
        Recovery.from_saved(obj["recovery"], float)
    if obj.get("restart_timer") is not None:
        RestartTimer.from_saved(obj["restart_timer"], float)
    # the scheduler's words on the launch's wait for capacity (capacity_since, when it began, is a
    # finite number: _check_plain)
    if len(obj.get("capacity_message", "")) > MAX_CAPACITY_MESSAGE:
        raise ValueError(f"capacity_message: longer than {MAX_CAPACITY_MESSAGE} characters")
    ck = obj.get("last_checkpoint")
    if ck is not None:
        if not _checkpoint_name(ck.get("name")):
            raise ValueError(f"last_checkpoint.name: {ck.get('name')!r:.80} is not a checkpoint name")
        for key, kind in (("step", _INT), ("created_unix", _NUM), ("writer_world_size", _INT)):
            if (key in ck or key == "step") and not _ok(kind, ck.get(key)):
                raise ValueError(f"last_checkpoint.{key}: {ck.get(key)!r:.80} is not a {kind}")


def plain_text(text: str, limit: int) -> str:
    """``text`` as the state keeps another's words: at most ``limit`` characters, no NUL, no lone
    surrogate (what :func:`validate` would refuse on the next load)."""
    return text[:limit].replace("\0", "").encode("utf-8", "replace").decode("utf-8")


def validate(obj: Any) -> dict[str, Any]:
    """The state as a dict whose every field has the right type; raises ValueError naming the field."""
    if not isinstance(obj, dict):
        raise ValueError("the top level is not an object")
    _check_plain(obj)
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
    _check_fields(obj)
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
        # never through a symlink, never blocked on a FIFO: only a regular file is a state
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path} cannot be read ({exc.strerror or exc}). {fresh_hint}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise StateError(f"{path} is unreadable: not a regular file. {fresh_hint}")
            data = f.read(min(st.st_size, MAX_STATE_BYTES) + 1)  # read(n) allocates n at once
    except OSError as exc:
        raise StateError(f"{path} cannot be read ({exc.strerror or exc}). {fresh_hint}") from None
    if len(data) > MAX_STATE_BYTES:
        raise StateError(f"{path} is larger than {MAX_STATE_BYTES} bytes: not a supervisor state. {fresh_hint}")
    try:
        obj = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise StateError(f"{path} is unreadable (truncated or not JSON: {str(exc)[:200]}). {fresh_hint}") from None
    except RecursionError:
        raise StateError(f"{path} is unreadable (nested too deeply to be a supervisor state). {fresh_hint}") from None
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


def save(path: Path, state: dict[str, Any], *, durable: bool = True) -> None:
    """Write ``state`` so that a crash at any instant leaves the old file or the new one
    (``durable=False``: no fsync; a killed process's write survives, a lost machine's may not)."""
    # a temporary name of its own (random, O_EXCL): two controllers that are both PID 1 (two
    # pods on one shared volume) never write into the same temporary file
    write_atomic(path, json.dumps(to_json(state), indent=1).encode(), durable=durable)


def archive(path: Path, label: str) -> Path:
    """Move the state aside (kept for the post-mortem); returns where it went. The label is made
    a plain file-name part (a job name from a state file is not trusted to be one)."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in label)[:64]
    return set_aside(path, safe.strip(".") or "state")


class JobLock:
    """The job's lock for the controller's life: a local ``flock`` and an owner lease that holds
    across hosts on a shared filesystem.

    ``LOG_DIR/supervisor.lock`` is held with ``flock``: the kernel drops it when the process dies
    (``kill -9`` included), so a crashed controller never blocks the next one on the same host. A
    ``flock`` may not reach other hosts (NFS without lock support, Lustre without ``-o flock``),
    so beside it ``LOG_DIR/supervisor.owner.json`` records the holder: host, pid, what the platform's
    :class:`~supervisor.platforms.base.LockOwner` adds (Slurm: node, job id and restart count), and a
    lease renewed every ``lease_s / 3`` (by a thread of this lock, and by
    :meth:`renew` when the controller calls it). A controller elsewhere is refused while that lease
    is fresh, and takes over a record whose holder is known gone: its lease expired, its pid is
    dead on this very host, or the owner says this run supersedes it (Slurm: an earlier run of
    this job, requeued since), or the platform's own election (a Kubernetes Lease, :attr:`elected`)
    has since made another controller the job's one actor. The record is created with ``link()`` (atomic, NFS included) and
    replaced with ``rename()``; one takeover per stale record is claimed with ``O_EXCL``. Leases
    compare wall clocks across hosts: keep them in sync (NTP) to well under ``lease_s``.
    """

    def __init__(self, log_dir: Path, *, lease_s: float = LEASE_S, owner: LockOwner | None = None) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be > 0")
        self.path = Path(log_dir) / LOCK_FILE
        self.owner_path = Path(log_dir) / OWNER_FILE
        self.lease_s = float(lease_s)
        self.took_over: dict[str, Any] | None = None
        """The record of a holder found gone and replaced at :meth:`acquire`, if any (with ``reason``)."""
        self.lost = ""
        """Why the lease was lost while held (another controller took the job over); empty while held."""
        self.elected = ""
        """Set before :meth:`acquire` when the platform's own election (a Kubernetes Lease) made this
        controller the job's only actor: a record of a holder elected otherwise is then taken over at
        once, not after its lease runs out (that holder has lost the election and stopped acting)."""
        self.owner = LockOwner() if owner is None else owner
        """Who this controller is, in its platform's terms (:meth:`Platform.lock_owner`)."""
        self._fd: int | None = None
        self._me: dict[str, Any] | None = None
        self._renewed_at: float | None = None  # the caller's clock, at its last :meth:`renew_every`
        self._loss_told = False
        self._renew_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the API
    def acquire(self) -> None:
        """Take the job, or raise :class:`StateError` naming the holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                holder = ""
                try:
                    holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
                except OSError:
                    pass
                os.close(fd)
                log_dir = self.path.parent
                raise StateError(
                    f"another supervisor ({holder or 'pid unknown'}) is running this job in {log_dir}: only one "
                    f"controller may act on a job. Watch it with `supervisor status --log-dir {log_dir}`; stop it "
                    "with SIGTERM to that pid.") from None
            if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                os.close(fd)
                raise StateError(f"cannot lock {self.path}: {exc}") from None
            # a filesystem without flock: the owner lease below is the lock
        try:
            self._claim()
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        self._fd = fd
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="job-lock-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Extend the lease now. Raises :class:`StateError` when it was lost (another controller
        took the job over: stop acting on it) or cannot be written (the filesystem is away)."""
        if self._me is None:
            raise StateError(f"{self.owner_path}: not held")
        with self._renew_lock:
            cur = self._read()
            if not isinstance(cur, dict) or cur.get("owner") != self._me["owner"]:
                self.lost = (f"the job's owner record {self.owner_path} now names "
                             f"{self.owner.describe(cur) if isinstance(cur, dict) else 'no holder'}: "
                             "this controller's lease was taken over")
                raise StateError(self.lost)
            me = dict(self._me, renewed=time.time())
            try:
                self._replace(me)
            except OSError as exc:
                raise StateError(f"cannot renew the lease in {self.owner_path}: {exc}") from None
            self._me = me

    def renew_every(self, now: float, every_s: float) -> None:
        """:meth:`renew` when ``every_s`` has passed (``now``: the caller's clock) since the last
        time; a filesystem hiccup is logged and retried next time. Raises :class:`StateError` only
        when the lease was lost."""
        if self._renewed_at is not None and now - self._renewed_at < every_s:
            return
        self._renewed_at = now
        try:
            self.renew()
        except StateError as exc:
            if self.lost:
                raise
            logging.getLogger("supervisor.controller").warning("event=job_lease_renew_failed error=%s (retrying)", exc)

    def loss_news(self) -> bool:
        """Whether the lease is lost and this is the first time the caller asks (to say so once)."""
        if not self.lost or self._loss_told:
            return False
        self._loss_told = True
        return True

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None
        if self._me is not None:
            with self._renew_lock:
                cur = self._read()
                if isinstance(cur, dict) and cur.get("owner") == self._me["owner"]:
                    try:
                        os.unlink(self.owner_path)
                    except OSError:
                        pass
                self._me = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ the owner record
    def _identity(self) -> dict[str, Any]:
        pid = os.getpid()
        return {"host": socket.gethostname(), "boot_id": _boot_id(), **self.owner.fields(),
                "pid": pid, "pid_start": start_time(pid), **({"elected": self.elected} if self.elected else {})}

    def _claim(self) -> None:
        now = time.time()
        me = self._identity() | {"owner": secrets.token_hex(8), "acquired": now, "renewed": now,
                                 "lease_s": self.lease_s}
        for _ in range(5):
            cur = self._read()
            if cur is None:
                if self._create(me):
                    self._me = me
                    return
                continue  # created meanwhile by another: read it
            gone = self._gone(cur)
            if not gone:
                raise StateError(self._held_message(cur))
            token = cur.get("owner") if isinstance(cur, dict) else None
            tag = token if isinstance(token, str) and token.isalnum() else f"unreadable-{_mtime(self.owner_path)}"
            claim = self.owner_path.with_name(f"{OWNER_FILE}.takeover-{tag}")
            try:
                os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            except FileExistsError:
                if time.time() - _mtime(claim) < self.lease_s:
                    raise StateError(f"another supervisor is taking over the job in {self.owner_path.parent} right "
                                     f"now (from {self.owner.describe(cur)}); try again in a few seconds") from None
                os.unlink(claim)  # a claim left by a taker that died in between
                continue
            try:
                again = self._read()
                if again != cur:
                    continue  # it changed under us: decide again from what it is now
                self._replace(me)
                self._me = me
                self.took_over = (dict(cur) if isinstance(cur, dict) else {"unreadable": True}) | {"reason": gone}
                return
            finally:
                try:
                    os.unlink(claim)
                except OSError:
                    pass
        raise StateError(f"{self.owner_path} keeps changing: another supervisor is starting this job; try again")

    def _gone(self, cur: dict[str, Any] | str) -> str:
        """Why the recorded holder is known gone ('' while it may still be acting on the job)."""
        now = time.time()
        if not isinstance(cur, dict):  # unreadable (half written by hand?): judged by its age
            age = now - _mtime(self.owner_path)
            return f"unreadable record untouched for {age:.0f}s" if age > self.lease_s else ""
        mine = self._identity()
        if cur.get("host") == mine["host"] and cur.get("boot_id") == mine["boot_id"] and isinstance(cur.get("pid"), int):
            pid = cur["pid"]
            if not pid_alive(pid) or (cur.get("pid_start") is not None and start_time(pid) != cur.get("pid_start")):
                return f"its process {pid} on this host is gone"
            if pid == mine["pid"]:
                return "it is this process"
            return ""  # alive here: it holds the job (even if it cannot renew)
        theirs = cur.get("elected")
        if self.elected and isinstance(theirs, str) and theirs and theirs != self.elected:
            return f"an election since made this controller the job's actor ({self.elected}; the holder was {theirs})"
        superseded = self.owner.supersedes(cur)
        if superseded:
            return superseded
        renewed, lease = cur.get("renewed"), cur.get("lease_s")
        if not _finite(renewed) or not _finite(lease):  # NaN would never expire
            return "the record has no lease"
        if now - renewed > lease:
            return f"its lease expired {now - renewed - lease:.0f}s ago (renewed {now - renewed:.0f}s ago, lease {lease:g}s)"
        return ""

    def _held_message(self, cur: dict[str, Any] | str) -> str:
        log_dir = self.owner_path.parent
        if not isinstance(cur, dict):
            return (f"another supervisor is starting the job in {log_dir} ({self.owner_path} is being written); try "
                    "again in a few seconds")
        now = time.time()
        renewed = cur.get("renewed") if isinstance(cur.get("renewed"), (int, float)) else now
        lease = cur.get("lease_s") if isinstance(cur.get("lease_s"), (int, float)) else self.lease_s
        stop = self.owner.stop_hint(cur)
        return (f"another supervisor holds the job in {log_dir}: {self.owner.describe(cur)}, lease renewed "
                f"{max(0.0, now - renewed):.0f}s ago (lease {lease:g}s). Only one controller may act on a job: two "
                f"would share its state file and checkpoints. Watch it with `supervisor status --log-dir {log_dir}`; "
                f"stop it with `{stop}`, or use another --log-dir. A holder that died without releasing is taken over "
                "once its lease expires.")

    def _read(self) -> dict[str, Any] | str | None:
        """The record; None when there is none; its text when it is not a JSON object."""
        try:
            with open(self.owner_path, "rb") as f:
                data = f.read(65536)
        except FileNotFoundError:
            return None
        try:
            obj = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError, RecursionError):
            return data.decode(errors="replace")
        return obj if isinstance(obj, dict) else data.decode(errors="replace")

    def _write_tmp(self, rec: dict[str, Any]) -> Path:
        tmp = self.owner_path.with_name(f".{OWNER_FILE}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(rec, indent=1).encode())
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def _create(self, rec: dict[str, Any]) -> bool:
        """Create the record with its content in one step; False if one exists."""
        tmp = self._write_tmp(rec)
        try:
            os.link(tmp, self.owner_path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            try:  # no hard links here: exclusive create (readers treat a young unreadable record as held)
                fd = os.open(self.owner_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(rec, indent=1).encode())
                f.flush()
                os.fsync(f.fileno())
            return True
        finally:
            os.unlink(tmp)
            fsync_dir(self.owner_path.parent)

    def _replace(self, rec: dict[str, Any]) -> None:
        tmp = self._write_tmp(rec)
        try:
            os.replace(tmp, self.owner_path)
        except BaseException:
            os.unlink(tmp)
            raise
        fsync_dir(self.owner_path.parent)

    def _renew_loop(self) -> None:
        failing = False
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.renew()
                if failing:
                    _log.warning("event=job_lease_renewed_again path=%s", self.owner_path)
                failing = False
            except StateError as exc:
                if self.lost:
                    _log.error("event=job_lease_lost %s", self.lost)
                    return
                if not failing:
                    _log.error("event=job_lease_renew_failed error=%s (retrying every %.0fs)", exc, self.lease_s / 3)
                failing = True


def _finite(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return abs(v) <= MAX_STATE_INT if isinstance(v, int) else math.isfinite(v)


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""
