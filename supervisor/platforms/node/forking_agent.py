"""torchrun, with Python ranks forked from the agent that has already imported torch.

Every node runs ``python -m supervisor.platforms.node.forking_agent <torchrun arguments>``: torch's
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

What a fork would otherwise leak is undone in the rank: the agent's sockets are closed,
multiprocessing forgets it is a child (a script may set its own start method), numpy's global
random state is reseeded, torch's thread count follows the rank's ``OMP_NUM_THREADS``, ``-u`` and
``PYTHONUNBUFFERED`` make stdio unbuffered, and the script's ``__main__`` stays installed while
atexit handlers and non-daemon threads finish (waited for, as at interpreter exit). A rank that
ends with ``os._exit(0)`` counts as finished. The agent asks torch about CUDA through NVML (it
never initialises CUDA), and checks with one throw-away fork that its children could use it;
where they could not, every rank is a new interpreter. What it cannot undo: a script that sets
``os.environ`` before ``import torch`` to configure torch's import (torch is already imported),
and environment variables the agent's preloaded modules read at import (the platform starts a
warm agent cold when the job's environment differs from the one it imported under).
``platform.fork_ranks: false`` is the way out for a script that needs a pristine interpreter.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import select
import shutil
import signal
import sys
import threading
import time
import uuid
from typing import Sequence

from supervisor import preflight as _preflight
from supervisor.files import write_atomic
from supervisor.platforms.node import relay
from supervisor.protocol import EXIT_PREFLIGHT, Env

FORK_ENV = "SUPERVISOR_FORK_RANKS"
PREFLIGHT_ENV = "SUPERVISOR_AGENT_PREFLIGHT"
"""``1``: the agent checks the job's command where its ranks run before it starts them (the
controller could not: ``LaunchSpec.check_command``). Its own interpreter's torch is always checked."""
PRELOAD_ENV = "SUPERVISOR_FORK_PRELOAD"
PRELOAD = ("torch.distributed.checkpoint", "torch.nn.parallel", "supervisor.worker.runtime", "torch._dynamo")
"""What the agent imports for its ranks before it forks them (``SUPERVISOR_FORK_PRELOAD``: a
comma-separated list instead); one that fails to import is left to the rank. ``torch._dynamo``
is the agent's own: torch's log formatter imports it (0.6-0.9 s) when it logs a failed rank."""

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


_AGENT_MAIN_PROCESS = __import__("multiprocessing").current_process()
"""The agent's own ``MainProcess`` record (multiprocessing does not let one make another), for
its forked ranks to be main processes again."""


def _close_inherited_sockets() -> None:
    """The agent's sockets (its rendezvous store's listening socket and connections, its store
    client) are not the rank's: held open in a rank, a dead agent's port stays bound and its
    peers see no reset. torch's own pipes and queues to the agent are pipes, not sockets."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd > 2:
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    os.close(fd)
            except OSError:
                pass


def _as_fresh_process() -> None:
    """Undo what being a forked child of the agent shows a script: multiprocessing's start
    method already set and this process named a child; numpy's global random state shared
    with every sibling; the thread count torch took from the agent's environment, not the
    rank's ``OMP_NUM_THREADS``."""
    import multiprocessing
    import multiprocessing.process as mp_process

    multiprocessing.set_start_method(None, force=True)  # a script may set its own, as in a fresh one
    mp_process._current_process = _AGENT_MAIN_PROCESS  # its identity: "MainProcess", no parent
    mp_process._parent_process = None
    mp_process._children = set()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()  # fresh entropy, as a new interpreter's first use gets
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))


def _unbuffered_stdio() -> None:
    """``python -u`` / ``PYTHONUNBUFFERED``: every write reaches the node log at once (a rank
    that is SIGKILLed loses nothing it printed)."""
    import io

    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True,
                                            encoding=getattr(old, "encoding", None) or "utf-8",
                                            errors=getattr(old, "errors", None) or "backslashreplace"))


def _shutdown_like_an_interpreter() -> None:
    """What CPython does at exit, in its order: wait for non-daemon threads, run atexit
    handlers, flush Python's and C's stdio."""
    import threading

    try:
        threading._shutdown()  # joins non-daemon threads (an async checkpoint save, an upload)
    except Exception:  # noqa: BLE001 - a thread's own failure is not the rank's exit status
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # printf / std::cout output of extensions
    except (OSError, AttributeError):
        pass


def _exec_main(mode: str, target: str) -> None:
    """Run ``target`` in a new ``__main__`` that stays installed after it returns (atexit
    handlers and threads still pickle the script's classes), as the interpreter does."""
    import runpy
    import types

    if mode == "module":
        runpy._run_module_as_main(target, alter_argv=True)  # what `python -m` itself calls
        return
    import builtins

    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __spec__=None, __loader__=None, __package__=None, __cached__=None)
    if mode == "code":
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), main.__dict__)
        return
    path = os.path.abspath(target)
    if not os.path.isfile(path):  # a directory or zip with __main__.py: runpy knows those
        runpy.run_path(target, run_name="__main__")
        return
    main.__file__ = path
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        source = f.read()
    exec(compile(source, path, "exec"), main.__dict__)


def run_rank(mode: str, target: str, unbuffered: bool, *argv: str) -> None:
    """A forked rank: run ``target`` as ``python`` would have (see the module docstring)."""
    os.setsid()  # torchrun starts every worker in a session of its own
    try:  # `ps`/`top` tell the ranks from their agent (a fork keeps the agent's command line)
        with open("/proc/self/comm", "w") as f:
            f.write(f"rank{os.environ.get('RANK', '')}"[:15])
    except OSError:
        pass
    _close_inherited_sockets()
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _as_fresh_process()
    if unbuffered or os.environ.get("PYTHONUNBUFFERED"):
        _unbuffered_stdio()
    _instrument()
    if mode == "path":
        sys.argv = [target, *argv]
        sys.path[0] = os.path.dirname(os.path.realpath(target))  # as CPython sets it (symlinks resolved)
    elif mode == "module":
        sys.argv = [target, *argv]  # runpy puts the module's file here, as -m does
        sys.path[0] = os.getcwd()
    else:
        sys.argv = ["-c", *argv]
        sys.path[0] = ""

    code = 0
    try:
        _exec_main(mode, target)
    except SystemExit as exc:
        code = _interpreter_exit(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    _shutdown_like_an_interpreter()
    if code:
        os._exit(code)  # torch reads a failed rank's exit status, as for a subprocess
    # success: return, so that torch's wrapper hands the agent its (None) return value; until
    # every rank has, this one waits there, and a stop (SIGTERM) must end it, not the script's handler
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


INSTRUMENT_MODULE = "supervisor.worker.instrument"
"""What watches a rank whose script does not start the worker SDK (heartbeats from torch's own
records). A rank-side module, named here, not imported by the agent: platforms do not depend on
the SDK, and a node image without it runs its ranks as torchrun would."""
BOOT_PACKAGE = "supervisor.worker.boot"
"""Its ``sitecustomize``, on the ``PYTHONPATH`` of ranks started as new interpreters."""


def _instrument() -> None:
    """A forked rank: install the instrumentation before the script runs (it decides whether it
    is wanted: :func:`supervisor.worker.instrument.wanted_here`)."""
    try:
        importlib.import_module(INSTRUMENT_MODULE).install()
    except ImportError:
        pass


def _instrument_new_interpreters(env: dict) -> None:
    """Ranks started as new interpreters run the boot ``sitecustomize`` first (through
    ``PYTHONPATH``, which they inherit from this agent), unless the job turned instrumentation off."""
    if env.get(Env.INSTRUMENT, "").lower() in ("off", "0", "false", "no"):
        return
    try:
        spec = importlib.util.find_spec(BOOT_PACKAGE)
    except ImportError:
        return
    if spec is None or not spec.submodule_search_locations:
        return
    boot = list(spec.submodule_search_locations)[0]
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *parts])


def preload(names: Sequence[str]) -> list[str]:
    """Import ``names`` into the agent (for its forked ranks); the ones that failed."""
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank will meet (and report) the same error itself
            failed.append(name)
    return failed


def _cuda_poisoned() -> bool:
    """Whether a child forked now could not use CUDA (torch marks forks of a process that has
    initialised it): then the ranks must be new interpreters. One throw-away fork asks."""
    import torch

    in_bad_fork = getattr(torch._C, "_cuda_isInBadFork", None)
    if in_bad_fork is None:  # a build without CUDA
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(1 if in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def _take_silent_exits_as_returns() -> None:
    """A forked rank that ends with status 0 without returning (``os._exit(0)``, as some
    scripts do to skip a hanging shutdown) never hands torch its return value, and torch's
    agent would wait for it for ever; a fresh interpreter's status 0 is success. Count it so."""
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api.MultiprocessContext, "_poll", None)
    if original is None or getattr(original, "takes_silent_exits", False):
        return

    def _poll(self):
        result = original(self)
        pc = getattr(self, "_pc", None)
        if result is None and pc is not None:
            for local_rank, proc in enumerate(pc.processes):
                if (proc.exitcode == 0 and local_rank not in self._return_values
                        and self._ret_vals[local_rank].empty()):
                    self._return_values[local_rank] = None
        return result

    _poll.takes_silent_exits = True
    api.MultiprocessContext._poll = _poll


def _record_exit(directory: str, pid: int, code: int) -> None:
    """Write one rank's end for the platform (:data:`~supervisor.protocol.Env.RANK_EXITS`),
    whole or not at all."""
    record = json.dumps({"pid": pid, "exit_code": code, "at": time.time()})
    path = os.path.join(directory, str(pid))
    try:
        os.makedirs(directory, exist_ok=True)
        write_atomic(path, record.encode(), mode=0o644, durable=False)  # a temporary name of its own
    except OSError as exc:  # the agent's own exit still tells, later
        print(f"forking_agent: cannot record the end of rank process {pid}: {exc}", file=sys.stderr, flush=True)


def _watch_exits(pids: Sequence[int], directory: str) -> None:
    """Record each of ``pids`` (this agent's rank processes) as it ends. A pidfd turns readable
    the moment its process ends; ``WNOWAIT`` reads the status and leaves the process to torch to
    reap, so its own monitoring sees exactly what it would have."""
    poller = select.poll()
    fds = {}
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # already reaped: torch's own account of it (the agent's exit) tells
            continue
        fds[fd] = pid
        poller.register(fd, select.POLLIN)
    while fds:
        for fd, _ in poller.poll():
            pid = fds.pop(fd)
            poller.unregister(fd)
            try:
                info = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except OSError:  # torch reaped it first (ECHILD), or the kernel cannot wait on a pidfd
                info = None
            finally:
                os.close(fd)
            if info is not None:
                _record_exit(directory, pid, info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)


def _report_rank_exits(directory: str) -> None:
    """Have every start of ranks (a launch, a restart in place) watched by :func:`_watch_exits`,
    so the platform reads a rank's end at once, not ~1 s later from the agent's exit
    (docs/design.md). Without pidfds (Linux < 5.4) nothing is watched: the agent's exit tells."""
    from torch.distributed.elastic.multiprocessing import api

    original = api.PContext.start
    if getattr(original, "reports_exits", False) or not hasattr(os, "pidfd_open") or not hasattr(os, "P_PIDFD"):
        return

    def start(self) -> None:
        original(self)
        try:
            pids = list(self.pids().values())
        except Exception:  # noqa: BLE001 - no pids to watch: the agent's exit tells
            return
        threading.Thread(target=_watch_exits, args=(pids, directory), name="rank-exits", daemon=True).start()

    start.reports_exits = True
    api.PContext.start = start


def _unbuffered_flag(cmd_args: Sequence[str]) -> bool:
    """``python -u ...`` (the flags :func:`forkable` lets through are leading ``-u``s)."""
    return list(cmd_args[:1]) == ["-u"]


def command_of(argv: Sequence[str]) -> list[str]:
    """The job's command in the agent's torchrun arguments: what follows the options, which
    :func:`~supervisor.platforms.node.agent.torchrun_argv` writes as ``--name=value`` or bare flags."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return list(argv[i + 1:])
        if not arg.startswith("-"):
            return list(argv[i:])
    return []


def check_before_torch(argv: Sequence[str]) -> None:
    """Before anything imports torch: with :data:`PREFLIGHT_ENV`, the job's command (its program
    resolves on this PATH, its Python imports torch and, a warning, the worker SDK:
    :func:`supervisor.preflight.check_command`, the controller's own checks); always, this
    interpreter's torch. A failure is one line on stderr and exit :data:`EXIT_PREFLIGHT`, not a
    traceback from ``import torch``."""
    try:
        command = command_of(argv) if os.environ.get(PREFLIGHT_ENV) == "1" else []
        warnings = _preflight.check_command(command, os.environ) if command else []
        _preflight.check_agent_interpreter()
    except _preflight.PreflightError as exc:
        print(_preflight.error_line(exc), file=sys.stderr, flush=True)
        sys.exit(EXIT_PREFLIGHT)
    for warning in warnings:
        print(f"preflight: warning: {warning}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    check_before_torch(list(sys.argv[1:] if argv is None else argv))
    # torch's LaunchConfig asks torch.cuda.is_available(): through the CUDA runtime that would
    # make every forked rank unable to use CUDA; through NVML it does not
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch

    if os.environ.get(Env.RANK_EXITS):
        _report_rank_exits(os.environ[Env.RANK_EXITS])
    os.environ[Env.AGENT_PID] = str(os.getpid())  # the instrumentation starts in this agent's children only
    node_relay = relay.start_from_env(os.environ)  # the ranks' heartbeats go up through this agent
    if node_relay is not None:
        atexit.register(node_relay.close)  # what the ranks said last goes up before the agent ends

    @record
    def launch() -> None:
        args = torchrun.parse_args(list(sys.argv[1:] if argv is None else argv))
        target = None
        # static with no endpoint is torchrun's --master-addr path (run() completes it); with one, as any backend
        static_bare = args.rdzv_backend == "static" and not args.rdzv_endpoint
        if os.environ.get(FORK_ENV, "1") != "0" and (args.standalone or not static_bare):
            if args.standalone:  # as torchrun's own run() does
                args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
            if args.master_port is None:
                args.master_port = 29500  # as torchrun's own run() (unused by c10d)
            config, cmd, cmd_args = torchrun.config_from_args(args)
            target = forkable(cmd, cmd_args) if isinstance(cmd, str) else None
            if target is not None and _cuda_poisoned():
                print("forking_agent: CUDA is initialised in the agent, so forked ranks could not use it: every "
                      "rank starts as a new interpreter", file=sys.stderr, flush=True)
                target = None
        if target is None:
            _instrument_new_interpreters(os.environ)
            torchrun.run(args)
            return
        names = [n for n in os.environ.get(PRELOAD_ENV, ",".join(PRELOAD)).split(",") if n.strip()]
        preload([n.strip() for n in names])
        _take_silent_exits_as_returns()
        config.start_method = "fork"
        mode, script, rest = target
        elastic_launch(config=config, entrypoint=run_rank)(mode, script, _unbuffered_flag(cmd_args), *rest)

    launch()


if __name__ == "__main__":
    main()
