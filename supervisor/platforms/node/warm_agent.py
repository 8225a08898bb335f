"""A torchrun agent started before it is needed: it pays ``import torch`` ahead of time.

The local platform starts one per node slot (``python -m supervisor.platforms.node.warm_agent``, in
a session of its own, stdin a pipe from the platform). It imports torch's agent, then waits
for one JSON line on stdin::

    {"argv": [...torchrun arguments...], "env": {...}, "log": "/path/NODE.log", "cwd": "/path"}

and becomes that agent: its output goes to ``log``, its environment is ``env`` (as a freshly
started agent's would be), and it runs :mod:`forking_agent` (torchrun) with ``argv``; where
that environment differs from the one it imported under in anything an import may read
(:func:`imported_under`), it execs a cold agent instead (same pid). It has
imported what that agent preloads for its forked ranks too (:data:`forking_agent.PRELOAD`).
Its pid is the agent's pid, and the ranks it starts are its children, exactly as with a cold
start. End of
input without a line (the platform closed, or its controller died) ends it, having done
nothing. A warm agent that has not been handed a node is never a node: the platform starts a
cold agent whenever no live warm one is ready.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading


RUNTIME_ENV_PREFIXES = ("SUPERVISOR_", "TORCHELASTIC_")
RUNTIME_ENV = {"TMPDIR", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "PYTORCH_NVML_BASED_CUDA_CHECK"}
"""What the platform puts into an agent's environment that nothing reads at import time (the
agent and its ranks read these when they run): a difference here does not make the imports
this process paid stale. Any other difference (PYTHONPATH, TORCH_LOGS, OMP_NUM_THREADS, the
job's own variables...) does: a cold agent is started in its place."""


def imported_under(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that can shape what an import does."""
    return {k: v for k, v in env.items() if k not in RUNTIME_ENV and not k.startswith(RUNTIME_ENV_PREFIXES)}


def main() -> int:
    got: list[bytes] = []
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # no import initialises CUDA here
    startup_env = dict(os.environ)

    def listen() -> None:
        line = sys.stdin.buffer.readline()
        if not line.strip():
            os._exit(0)  # not needed after all (or the platform is gone): at once, even mid-import
        got.append(line)

    listener = threading.Thread(target=listen, name="hand-over", daemon=True)
    listener.start()
    import torch.distributed.run  # noqa: F401 - the cost this process exists to pay early

    from supervisor.platforms.node import forking_agent

    forking_agent.preload(forking_agent.PRELOAD)  # and its ranks' imports (they are forked from it)
    listener.join()
    line = got[0].decode()
    try:
        spec = json.loads(line)
        argv, env, log, cwd = list(spec["argv"]), dict(spec["env"]), str(spec["log"]), str(spec["cwd"])
    except (ValueError, KeyError, TypeError) as exc:
        print(f"warm agent: bad hand-over: {exc}", file=sys.stderr)
        return 2
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is the node's now
    os.chdir(cwd)
    if imported_under(env) != imported_under(startup_env):
        # torch and the job's modules were imported under another environment than the node's:
        # become a cold agent (same pid, so the same node to the platform) that imports under it
        os.execve(sys.executable, [sys.executable, "-m", forking_agent.__name__, *argv], env)
    sys.argv = [forking_agent.__file__, *argv]
    forking_agent.main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
