"""The I/O of releases (:mod:`supervisor.controller.releases` decides): what version a config
runs (its code hashed), the content-addressed snapshot a rollback runs from, and the ledger
file, kept beside the job's state and surviving its runs.

Under ``LOG_DIR/releases/``:

* ``ledger.json``: the versions and their states (written atomically on every change);
* ``VERSION/code/``: a copy of the version's code folder, taken when it is first released
  (local and Slurm), so that an edited file cannot make the old version unrunnable;
* ``allow/VERSION``: the operator's ``supervisor release allow`` (taken in at the next start).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

from supervisor.controller.releases import BASELINE, Ledger, LedgerError, Version
from supervisor.files import write_atomic

RELEASES_DIR = "releases"
LEDGER_FILE = "ledger.json"
LEDGER_MAX_BYTES = 8 << 20
SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", ".mypy_cache", ".pytest_cache",
                          ".hypothesis", "node_modules", ".tox", ".ipynb_checkpoints",
                          # what training tools write beside the code: outputs, not code
                          "wandb", "mlruns", "lightning_logs", "outputs", "runs", "tb_logs"})
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".log", ".swp")
MAX_FILES = 100_000


class ReleaseError(Exception):
    """The version cannot be identified or kept (one line saying what to do)."""


def releases_dir(log_dir: Path) -> Path:
    return Path(log_dir) / RELEASES_DIR


def entry_script(command: Sequence[str], cwd: Path) -> int:
    """The index of the command's entry script (the first argument after the interpreter that
    names an existing ``.py`` file), -1 when none does (``python -m pkg``, a binary)."""
    for i, arg in enumerate(command):
        if i == 0 and not arg.endswith(".py"):
            continue
        if arg.endswith(".py") and (cwd / arg).is_file():
            return i
    return -1


def identify(*, command: Sequence[str], env: Mapping[str, str], trained: Mapping[str, Any], log_dir: Path,
             checkpoint_dir: Path, code_dir: str = "", max_code_bytes: int, cwd: Path | None = None,
             platform_parts: Mapping[str, str] | None = None, hash_code: bool = True) -> Version:
    """The version a config runs: its command, the environment it sets, the config fields that
    change what is trained (``trained``), and either the platform's own identity of the code
    (``platform_parts``: on Kubernetes the worker image and pod template) or, with ``hash_code``,
    a content hash of the entry script and the code folder (``code_dir``, default the entry
    script's) and the Python it runs on. :class:`ReleaseError` past ``max_code_bytes``."""
    cwd = Path.cwd() if cwd is None else cwd
    parts: dict[str, str] = {
        "command": json.dumps(list(command)),
        "env": json.dumps(dict(sorted(env.items()))),
        "trained": json.dumps(dict(trained), sort_keys=True, default=str),
    }
    parts.update(platform_parts or {})
    entry = entry_script(command, cwd)
    folder = ""
    if hash_code:
        if code_dir:
            root = (cwd / code_dir).resolve()
            if not root.is_dir():
                raise ReleaseError(f"release.code_dir: {root} is not a directory (the folder of the training code)")
        elif entry >= 0:
            root = (cwd / command[entry]).resolve().parent
        else:
            root = None
        if root is not None:
            skip = {p.resolve() for p in (Path(log_dir), Path(checkpoint_dir))}
            for where, d in (("log directory", Path(log_dir).resolve()), ("checkpoint directory",
                                                                       Path(checkpoint_dir).resolve())):
                if root == d:
                    raise ReleaseError(
                        f"the code folder {root} is the job's {where}: what the job writes "
                        "there would make every start a new release. Keep the training code in its own folder "
                        "(release.code_dir, --code-dir), move the log or checkpoint directory out of it, or turn "
                        "rollbacks off (release.rollback: false, --no-rollback)")
            parts["code"] = _hash_tree(root, skip, max_code_bytes)
            folder = str(root)
        if entry >= 0:
            parts["entry"] = hashlib.sha256((cwd / command[entry]).read_bytes()).hexdigest()
        parts["python"] = _python(command)
    return Version(Version.identify(parts), parts, tuple(command), dict(env), entry,
                   (platform_parts or {}).get("image", ""), folder)


def baseline(command: Sequence[str], image: str, env: Mapping[str, str], default_command: Sequence[str]) -> Version | None:
    """The operator's named baseline (``release.baseline``) as a version: run as given."""
    if not command and not image:
        return None
    return Version(BASELINE, {"baseline": json.dumps([list(command), image])}, tuple(command or default_command),
                   dict(env), -1, image, "")


def _python(command: Sequence[str]) -> str:
    """The interpreter the ranks run and, when it is this one, its torch (read from the
    package metadata: nothing imported)."""
    exe = shutil.which(command[0]) or command[0]
    real = os.path.realpath(exe)
    torch = ""
    if real == os.path.realpath(sys.executable):
        try:
            torch = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch = "none"
    return json.dumps({"interpreter": real, "torch": torch})


def _walk(root: Path, skip: set[Path]):
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and (here / d).resolve() not in skip
                             and not (here / d).is_symlink())
        for name in sorted(filenames):
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            path = here / name
            if path.is_file() and not path.is_symlink():
                yield path


def _hash_tree(root: Path, skip: set[Path], max_bytes: int) -> str:
    h = hashlib.sha256()
    total = files = 0
    for path in _walk(root, skip):
        size = path.stat().st_size
        total += size
        files += 1
        if total > max_bytes or files > MAX_FILES:
            raise ReleaseError(
                f"the code folder {root} holds more than {max_bytes / 2**20:g} MiB or {MAX_FILES} files (a rollback "
                "keeps a copy of it): name the folder of the training code in release.code_dir (--code-dir), raise "
                "release.max_code_mb, or turn rollbacks off (release.rollback: false, --no-rollback)")
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def snapshot(log_dir: Path, version: Version, checkpoint_dir: Path) -> Path | None:
    """Keep a copy of ``version``'s code folder (once: content-addressed by its id); returns
    where, or None when it has none. Copied to a temporary name and renamed: a copy cut short
    is never taken for a whole one."""
    if not version.code_dir:
        return None
    dest = releases_dir(log_dir) / version.id / "code"
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".code.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    root = Path(version.code_dir)
    skip = {p.resolve() for p in (Path(log_dir), Path(checkpoint_dir))}
    for path in _walk(root, skip):
        target = tmp / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    tmp.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, dest)
    return dest


def launch_command(log_dir: Path, version: Version, *, cwd: Path | None = None) -> tuple[str, ...]:
    """The command a launch of ``version`` runs: with its entry script taken from its snapshot
    when it has one (an earlier version, whose files may have been edited since)."""
    cwd = Path.cwd() if cwd is None else cwd
    cmd = list(version.command)
    snap = releases_dir(log_dir) / version.id / "code"
    if version.entry < 0 or not version.code_dir or not snap.is_dir():
        return tuple(cmd)
    script = (cwd / cmd[version.entry]).resolve()
    try:
        rel = script.relative_to(Path(version.code_dir))
    except ValueError:
        return tuple(cmd)
    cmd[version.entry] = str(snap / rel)
    return tuple(cmd)


def load(log_dir: Path) -> Ledger:
    """The job's ledger (empty when it has none). :class:`ReleaseError` when it is unreadable."""
    path = releases_dir(log_dir) / LEDGER_FILE
    try:
        with open(path, "rb") as f:
            data = f.read(LEDGER_MAX_BYTES + 1)
    except FileNotFoundError:
        return Ledger()
    except OSError as exc:
        raise ReleaseError(f"cannot read the release ledger {path}: {exc}") from None
    if len(data) > LEDGER_MAX_BYTES:
        raise ReleaseError(f"the release ledger {path} is larger than {LEDGER_MAX_BYTES >> 20} MiB: not one")
    try:
        return Ledger.from_saved(json.loads(data))
    except (ValueError, RecursionError, LedgerError) as exc:
        raise ReleaseError(f"the release ledger {path} is not readable ({exc}); move it aside to start the job's "
                           "release history over (its versions' snapshots stay)") from None


def save(log_dir: Path, ledger: Ledger) -> None:
    folder = releases_dir(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / LEDGER_FILE, json.dumps(ledger.to_saved(), indent=1).encode(), mode=0o644)


def ask_allow(log_dir: Path, vid: str) -> Path:
    """``supervisor release allow``: the mark the controller takes in at its next start."""
    folder = releases_dir(log_dir) / "allow"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / vid
    write_atomic(path, b"", mode=0o644)
    return path


def allowed(log_dir: Path) -> list[str]:
    folder = releases_dir(log_dir) / "allow"
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_file())
    except OSError:
        return []


def taken(log_dir: Path, vid: str) -> None:
    try:
        (releases_dir(log_dir) / "allow" / vid).unlink()
    except OSError:
        pass
