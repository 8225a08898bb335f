"""The job token file: full length, written durably and privately, refused when it cannot be trusted."""

from __future__ import annotations

import os
import stat

import pytest

from helpers import record_durability
from supervisor.controller.token import TOKEN_CHARS, TokenError, load_or_create


def test_a_new_token_is_private_full_length_and_reused(tmp_path):
    path = tmp_path / "token"
    token = load_or_create(path, reuse=False)
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert len(token) == TOKEN_CHARS and path.read_bytes() == token
    assert int(token, 16) >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]  # no temporary file left behind
    assert load_or_create(path, reuse=True) == token
    again = load_or_create(path, reuse=False)
    assert again != token and path.read_bytes() == again


def test_reuse_without_a_file_creates_one(tmp_path):
    token = load_or_create(tmp_path / "token", reuse=True)
    assert len(token) == TOKEN_CHARS and (tmp_path / "token").read_bytes() == token


def test_a_new_token_never_writes_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "token")
    token = load_or_create(tmp_path / "token", reuse=False)
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "token").is_symlink() and (tmp_path / "token").read_bytes() == token


@pytest.mark.parametrize("content", [b"", b"\n", b"abc123\n", b"0" * (TOKEN_CHARS - 1), b"z" * TOKEN_CHARS])
def test_an_empty_short_or_garbled_token_is_refused(tmp_path, content):
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(TokenError, match=rf"{path}.*at least {TOKEN_CHARS} hex digits.*remove it"):
        load_or_create(path, reuse=True)
    assert path.read_bytes() == content  # refused, not silently replaced


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_token_readable_by_others_is_refused(tmp_path, mode):
    path = tmp_path / "token"
    path.write_bytes(b"ab" * TOKEN_CHARS)
    path.chmod(mode)
    with pytest.raises(TokenError, match=rf"{path} has mode {mode:04o}.*chmod 600 {path}"):
        load_or_create(path, reuse=True)
    path.chmod(0o600)
    assert load_or_create(path, reuse=True) == b"ab" * TOKEN_CHARS


def test_a_symlinked_token_is_refused(tmp_path):
    real = tmp_path / "elsewhere"
    real.write_bytes(b"cd" * TOKEN_CHARS)
    real.chmod(0o600)
    os.symlink(real, tmp_path / "token")
    with pytest.raises(TokenError, match="symbolic link"):
        load_or_create(tmp_path / "token", reuse=True)


def test_a_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "token", 0o600)
    with pytest.raises(TokenError, match="not a regular file"):
        load_or_create(tmp_path / "token", reuse=True)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_token_owned_by_another_user_is_refused(tmp_path):
    path = tmp_path / "token"
    path.write_bytes(b"ef" * TOKEN_CHARS)
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(TokenError, match=rf"{path} is owned by uid 65534"):
        load_or_create(path, reuse=True)


def test_a_new_token_is_fsynced_whole_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    """Issue 11: after a power cut the token file is whole or absent, never empty (an empty key
    would make every heartbeat's MAC forgeable)."""
    path = tmp_path / "token"
    load_or_create(path, reuse=False)  # an old token: the new one replaces it
    ops = record_durability(monkeypatch)
    token = load_or_create(path, reuse=False)
    monkeypatch.undo()
    assert path.read_bytes() == token
    [at] = [i for i, op in enumerate(ops) if op[0] == "replace"]
    tmp = ops[at][1]
    assert ops[at][2] == str(path) and tmp != str(path) and os.path.dirname(tmp) == str(tmp_path)
    assert ("fsync", tmp, len(token)) in ops[:at], ops
    assert ("fsync", str(tmp_path), "dir") in ops[at + 1:], ops
