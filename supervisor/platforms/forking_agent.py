"""torchrun, with Python ranks forked from the agent that has already imported torch.

Every node runs ``python -m supervisor.platforms.forking_agent <torchrun arguments>``: torch's
own agent (``torch.distributed.run``'s argument parsing, rendezvous, monitoring, restarts),
with one change. When the command is a Python script or module run by this very interpreter
(``python [-u] script.py ...``, ``python [-u] -m module ...``, ``python -c CODE ...``), the
agent starts its ranks with torch's ``fork`` start method instead of a new interpreter: a
rank begins with ``torch``, its distributed and checkpoint modules and the worker SDK already
imported (:data:`PRELOAD`, imported by the agent before its first rendezvous). A rank that
fails and is restarted in place by its agent (``--max-restarts``) pays no ``import torch``
(1-2 s of CPU per rank, paid by every rank at once on a real node), and neither does a cold
start.

Inside, a forked rank is what a fresh interpreter would have made of the same command:
``sys.argv``, ``sys.path[0]``, ``__main__``, default signal handlers, a session of its own
(as torchrun gives each worker), an uncaught exception printed by ``sys.excepthook`` (which
the SDK hooks for its last heartbeat) and exit status 1, ``sys.exit(N)`` as exit status N,
``atexit`` handlers run. Any other command (a binary, another interpreter, interpreter flags
other than ``-u``) runs exactly as under torchrun; so does every command when
``SUPERVISOR_FORK_RANKS=0`` is in the agent's environment (``platform.fork_ranks: false``).

Fork is safe here because the agent never initialises CUDA, OpenMP pools or a process group
before it forks; a script that needs a pristine interpreter turns it off with that setting.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import signal
import sys
import uuid
from typing import Sequence

FORK_ENV = "SUPERVISOR_FORK_RANKS"
PRELOAD_ENV = "SUPERVISOR_FORK_PRELOAD"
PRELOAD = ("torch.distributed.checkpoint", "torch.nn.parallel", "supervisor.worker", "torch._dynamo")
"""What the agent imports for its ranks before it forks them (``SUPERVISOR_FORK_PRELOAD``: a
comma-separated list instead). A module that fails to import is skipped: the rank that needs
it imports it itself and reports the error as it would have anyway. ``torch._dynamo`` is the
agent's own: torch's log formatter imports it (0.6-0.9 s) the first time the agent logs a
failed forked rank's exception, which is on the path of every restart in place."""

_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""Handled by the agent (torch's agent turns TERM, HUP and QUIT into an exception); a fresh
interpreter leaves them at their defaults."""


def forkable(cmd: str, cmd_args: Sequence[str], *, executable: str | None = None) -> tuple[str, str, list[str]] | None:
    """``(mode, target, argv_rest)`` when ``cmd cmd_args`` runs Python code with this interpreter
    (mode ``path``, ``module`` or ``code``), else None: run it as a command."""
    exe = os.path.abspath(executable or sys.executable)
    path = cmd if os.sep in cmd else shutil.which(cmd)
    if not path:
        return None
    path = os.path.abspath(path)
    try:
        # the same file in the same directory: `python` and `python3` of one venv are one
        # interpreter; another venv's `python` links to the same binary but not the same packages
        if os.path.dirname(path) != os.path.dirname(exe) or not os.path.samefile(path, exe):
            return None
    except OSError:
        return None
    args = list(cmd_args)
    while args and args[0] == "-u":
        args.pop(0)
    if not args:
        return None
    if args[0] in ("-m", "-c"):
        if len(args) < 2:
            return None
        return ("module" if args[0] == "-m" else "code"), args[1], args[2:]
    if args[0].startswith("-"):
        return None  # an interpreter flag a fork cannot honour (-X, -O, -W, ...): a real interpreter
    return "path", args[0], args[1:]


def _interpreter_exit(code: object) -> int:
    """The exit status an interpreter gives ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_rank(mode: str, target: str, *argv: str) -> None:
    """A forked rank: run ``target`` as ``python`` would have (see the module docstring)."""
    os.setsid()  # torchrun starts every worker in a session of its own
    try:  # `ps`/`top` tell the ranks from their agent (a fork keeps the agent's command line)
        with open("/proc/self/comm", "w") as f:
            f.write(f"rank{os.environ.get('RANK', '')}"[:15])
    except OSError:
        pass
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode == "path":
        sys.argv = [target, *argv]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    elif mode == "module":
        sys.argv = [target, *argv]  # runpy puts the module's file here, as -m does
        sys.path[0] = os.getcwd()
    else:
        sys.argv = ["-c", *argv]
        sys.path[0] = ""
    import runpy

    code = 0
    try:
        if mode == "path":
            runpy.run_path(target, run_name="__main__")
        elif mode == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            import types

            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = _interpreter_exit(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    atexit._run_exitfuncs()  # a forked child skips them otherwise; an interpreter runs them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if code:
        os._exit(code)  # torch reads a failed rank's exit status, as for a subprocess
    # success: return, so that torch's wrapper hands the agent its (None) return value


def preload(names: Sequence[str]) -> list[str]:
    """Import ``names`` into the agent (for its forked ranks); the ones that failed."""
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank will meet (and report) the same error itself
            failed.append(name)
    return failed


def main(argv: Sequence[str] | None = None) -> None:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch

    @record
    def launch() -> None:
        args = torchrun.parse_args(list(sys.argv[1:] if argv is None else argv))
        target = None
        if os.environ.get(FORK_ENV, "1") != "0" and (args.standalone or args.rdzv_backend != "static"):
            if args.standalone:  # as torchrun's own run() does
                args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
            if args.master_port is None:
                args.master_port = 29500  # as torchrun's own run() (unused by c10d)
            config, cmd, cmd_args = torchrun.config_from_args(args)
            target = forkable(cmd, cmd_args) if isinstance(cmd, str) else None
        if target is None:
            torchrun.run(args)
            return
        names = [n for n in os.environ.get(PRELOAD_ENV, ",".join(PRELOAD)).split(",") if n.strip()]
        preload([n.strip() for n in names])
        config.start_method = "fork"
        mode, script, rest = target
        elastic_launch(config=config, entrypoint=run_rank)(mode, script, *rest)

    launch()


if __name__ == "__main__":
    main()
