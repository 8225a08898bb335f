"""The job token: the secret every key of the wire is derived from (HKDF, one key for heartbeats,
one for control frames, one for the HTTP API: :func:`supervisor.protocol.derive_keys`). It is
never sent, neither is any key derived from it; whoever reads it can speak for the controller
to every rank, and for every rank to the controller.

It lives in ``LOG_DIR/token`` (ranks read it through ``SUPERVISOR_TOKEN_FILE``):

* A new token is 48 hex digits (192 bits) from :mod:`secrets`, written to a temporary file
  created with ``O_EXCL|O_NOFOLLOW`` and mode 0600 (no symlink planted in the log directory can
  redirect the write), fsynced, renamed over the old name and the directory fsynced: the file
  is whole or absent after a crash, never empty.
* A token reused (a restarted controller adopting its gang) must be at least as long as a new
  one and hex, in a regular file (not a symlink) owned by this user with no group or other
  permission bits; anything else is refused with a :class:`TokenError` that names the file and
  says what to do. An empty or short token would make the MAC key guessable.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from supervisor.protocol import TOKEN_MAX_CHARS, TOKEN_MIN_CHARS, token_problem

TOKEN_BYTES = TOKEN_MIN_CHARS // 2
TOKEN_CHARS = TOKEN_MIN_CHARS
"""A token is at least this many hex digits (what :func:`load_or_create` writes)."""
_MAX_READ = TOKEN_MAX_CHARS


class TokenError(RuntimeError):
    """The token file cannot be trusted or written; the message names the file and the fix."""


def load_or_create(path: str | os.PathLike, *, reuse: bool) -> bytes:
    """The job token in ``path``: the one there if ``reuse`` and the file exists (checked: see
    the module's docstring), otherwise a new one written durably. Raises :class:`TokenError`."""
    path = Path(path)
    if reuse:
        try:
            return _load(path)
        except FileNotFoundError:
            pass
    return _create(path)


def _load(path: Path) -> bytes:
    fresh = ("remove it to start the job afresh (a gang still running with the old token cannot be adopted: "
             "stop it first)")
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the controller
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TokenError(f"the job token {path} is a symbolic link, not a file of this job: {fresh}") from None
        raise TokenError(f"cannot read the job token {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenError(f"the job token {path} is not a regular file: {fresh}")
        if st.st_uid != os.getuid():
            raise TokenError(f"the job token {path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()}): "
                             f"someone else controls it. Run the supervisor as its owner, or {fresh}")
        if st.st_mode & 0o077:
            raise TokenError(f"the job token {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or others can read "
                             f"it. If nobody else could have read it, run `chmod 600 {path}`; otherwise {fresh}")
        data = b""
        while len(data) <= _MAX_READ and (chunk := os.read(fd, _MAX_READ)):
            data += chunk
    except OSError as exc:
        raise TokenError(f"cannot read the job token {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    token = data.strip()
    problem = token_problem(token)
    if problem:
        raise TokenError(f"the job token {path} holds {problem}: {fresh}")
    return token


def _create(path: Path) -> bytes:
    token = secrets.token_hex(TOKEN_BYTES).encode()
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(token)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a symlink at `path` itself, never its target
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise TokenError(f"cannot write the job token {path}: {exc.strerror or exc}") from None
    return token
