"""A rank that reports what its interpreter looks like, then ends as told (tests/test_forking_agent.py).

Prints one ``probe {...}`` JSON line: whether torch was imported before this script ran, argv,
sys.path[0], __name__, the SIGTERM/SIGINT handlers, its session and process name. Then, in the
agent's first run (``TORCHELASTIC_RESTART_COUNT`` 0), the rank named by ``--fail-rank`` ends
as ``--how`` says: ``raise`` (an uncaught exception), ``exit`` (``sys.exit(18)``), ``kill``
(SIGKILL to itself). Every rank registers an atexit handler that appends a line to ``--atexit``.
"""

import argparse
import atexit
import json
import os
import signal
import sys

torch_was_imported = "torch" in sys.modules  # before this script imports anything of its own

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--how", choices=("raise", "exit", "kill", "os-exit-0"), default="raise")
parser.add_argument("--atexit", required=True)
args = parser.parse_args()
rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def at_exit() -> None:
    with open(args.atexit, "a") as f:
        f.write(f"rank{rank} restart{restart}\n")


atexit.register(at_exit)
with open("/proc/self/comm") as f:
    comm = f.read().strip()
import multiprocessing  # noqa: E402

multiprocessing.set_start_method("spawn")  # what many training scripts do first: allowed in a fresh process


def is_socket(fd: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    except OSError:
        return False


sockets = sum(1 for fd in os.listdir("/proc/self/fd") if is_socket(fd))  # none inherited from the agent
import numpy  # noqa: E402
import torch  # noqa: E402
print("probe " + json.dumps({
    "rank": rank, "restart": restart, "torch_was_imported": torch_was_imported, "argv": sys.argv,
    "path0": sys.path[0], "name": __name__, "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "own_session": os.getsid(0) == os.getpid(), "comm": comm, "ppid": os.getppid(),
    "process_name": multiprocessing.current_process().name, "parent": multiprocessing.parent_process() is not None,
    "sockets": sockets, "numpy_draw": int(numpy.random.randint(1 << 30)), "threads": torch.get_num_threads(),
    "main_file": sys.modules["__main__"].__dict__.get("__file__"),
}), flush=True)
if restart == 0 and rank == args.fail_rank:
    if args.how == "raise":
        raise ValueError(f"boom from rank {rank}")
    if args.how == "exit":
        sys.exit(18)
    if args.how == "os-exit-0":
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)
