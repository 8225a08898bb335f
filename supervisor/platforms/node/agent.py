"""The node agent contract, one definition for every platform: the torchrun command line, the
environment it runs in, and how a failed agent's own account of its ranks is read back.

A node is one real ``torchrun`` agent (torch's own, started through :mod:`forking_agent` so that
its Python ranks are forked with torch already imported; c10d rendezvous, ``--nnodes N:N`` for
the N nodes the controller launched, or torch's static rendezvous with the node ranks the
controller hands out (``LaunchSpec.rendezvous``),
``--max-restarts 0``: recovery is the supervisor's job, unless it allows restarts in place:
``LaunchSpec.max_restarts``) running the user's command with
``--no-python``. Every rank's output goes to the node log too (``--tee``), each line
prefixed ``[rankN]:``, which is also how a failure is named (:mod:`agent_output`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Mapping, Sequence

from supervisor.platforms.node.agent_output import RANK_PREFIX, RankFailure, last_error, parse, read_tail
from supervisor.platforms.base import LaunchSpec
from supervisor.platforms.node import forking_agent
from supervisor.platforms.node.forking_agent import FORK_ENV, PREFLIGHT_ENV
from supervisor.protocol import Env


JOIN_TIMEOUT_S = 120.0
"""torchrun's rendezvous join timeout: an agent that waits longer for the others exits 1."""
AGENT_MODULE = forking_agent.__name__
"""The agent every node runs: torchrun's own, starting Python ranks by fork (see the module)."""


def node_rank(nodes: Sequence[str], node: str, host: str | None = None) -> int:
    """``node``'s node rank in a static rendezvous: the node whose agent serves the store
    (``host``, default the first) is 0, the others follow in the launch's order."""
    host = nodes[0] if host is None else host
    rest = [n for n in nodes if n != host]
    return 0 if node == host else 1 + rest.index(node)


def torchrun_argv(python: str, spec: LaunchSpec, *, endpoint: str | None = None, is_host: bool | None = None,
                  join_timeout_s: float = JOIN_TIMEOUT_S, rank: int | None = None) -> list[str]:
    """``python -m supervisor.platforms.node.forking_agent ... COMMAND`` (torchrun's arguments) for one
    node of ``spec``.

    ``endpoint``: the rendezvous address this node dials (default ``spec.rdzv_endpoint``);
    ``is_host``: whether this node's agent serves the c10d store (None: torch decides by
    address, as on one machine); ``join_timeout_s``: how long an agent waits for the others to join
    (longer than torchrun's 120 s: also how long it keeps dialing the store, torch's ``read_timeout``,
    60 s otherwise: a first pod the cluster has not placed yet has no address to dial).

    ``spec.rendezvous == "static"``: torch's static rendezvous, the node rank ``rank`` given here
    (:func:`node_rank`: the controller chose the world, so no agent has to win a join): every
    agent connects once to the store node rank 0 serves at the endpoint, and waits at most
    ``join_timeout_s`` for the others.
    """
    if spec.rendezvous == "static":
        if rank is None:
            raise ValueError("a static rendezvous needs each node's rank")
        return [
            python, "-m", AGENT_MODULE,
            f"--nnodes={spec.nnodes_max}", f"--nproc-per-node={spec.nproc_per_node}",
            "--rdzv-backend=static", f"--rdzv-endpoint={endpoint or spec.rdzv_endpoint}", f"--rdzv-id={spec.rdzv_id}",
            f"--node-rank={rank}", f"--rdzv-conf=timeout={max(1, int(join_timeout_s))}",
            *_agent_tail(spec),
        ]
    conf = f"join_timeout={max(1, int(join_timeout_s))},last_call_timeout=1"  # every launched agent joins at once: no 30 s wait for more
    if join_timeout_s > JOIN_TIMEOUT_S:
        conf += f",read_timeout={int(join_timeout_s)}"
    if is_host is not None:
        conf += f",is_host={'1' if is_host else '0'}"
    return [
        python, "-m", AGENT_MODULE,
        f"--nnodes={spec.nnodes_min}:{spec.nnodes_max}", f"--nproc-per-node={spec.nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint or spec.rdzv_endpoint}", f"--rdzv-id={spec.rdzv_id}",
        f"--rdzv-conf={conf}",
        *_agent_tail(spec),
    ]


def _agent_tail(spec: LaunchSpec) -> list[str]:
    return [
        f"--max-restarts={spec.max_restarts}", "--monitor-interval=0.2",
        "--tee=3",  # every rank's output in the node log too, each line prefixed [rankN]:
        "--no-python",  # the command is argv as given (python script.py ..., or any binary)
        *spec.command,
    ]


def agent_env(spec: LaunchSpec, node: str, tmp_dir: Path) -> dict[str, str]:
    """What every agent adds to its environment (on top of the platform's own)."""
    return dict(spec.env) | {
        Env.NODE: node,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # torch 2.13: reliable restarts
        "TMPDIR": str(tmp_dir),
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX,
        FORK_ENV: "1" if spec.fork_ranks else "0",
    } | ({PREFLIGHT_ENV: "1"} if spec.check_command else {})  # the command is checked where the ranks run


def read_failures(log_path: Path) -> tuple[tuple[RankFailure, ...], str]:
    """A failed agent's ranks as its log tells them, and the last error line when it names no rank."""
    text = read_tail(log_path)
    failures = parse(text)
    return failures, "" if failures else last_error(text)


async def failure_fields(log_path: Path, state_exit_code: int | None, cache: dict) -> Mapping[str, object]:
    """NodeStatus fields for a node whose agent ended with ``state_exit_code``, read once, off the
    event loop (the node's output is the job's: any size, any shape; read_tail caps it)."""
    if state_exit_code in (0, None):
        return {}
    if "failures" not in cache:
        cache["failures"], cache["output_error"] = await asyncio.to_thread(read_failures, log_path)
    return {"failures": cache["failures"], "output_error": cache["output_error"]}


RANK_OUTPUT_GLOB = "torchelastic_*/*/attempt_*/*/std*.log"
"""Where torchrun keeps each rank's own output under the agent's TMPDIR (``--tee`` copies it to
the agent's output from there): ``torchelastic_*/RUN/attempt_K/LOCAL_RANK/{stdout,stderr}.log``."""


def note_uncopied_output(log_path: Path, tmp_dir: Path, *, tail: int = 1 << 20) -> list[Path]:
    """After an agent was killed: if the last line a rank wrote never reached the agent's log
    (``--tee`` copies each rank's output ~0.1 s late, so a rank that dies and is torn down within
    that window is missing from it), append a line to the log naming the files that hold each
    rank's complete output, and return them (empty when the log is complete). Reads the last
    ``tail`` bytes of the log and the last 4 KiB of each file, whatever the job wrote."""

    def last_line(path: Path) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 4096))
                rest = f.read().rstrip(b"\n").rsplit(b"\n", 1)
        except OSError:
            return b""
        return rest[-1]

    files = [p for p in sorted(tmp_dir.glob(RANK_OUTPUT_GLOB)) if last_line(p)]
    if not files:
        return []
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail))
            copied = {line.rstrip(b"\n").split(b"]:", 1)[-1] for line in f if line.startswith(b"[rank")}
    except OSError:
        copied = set()
    if all(last_line(p) in copied for p in files):
        return []
    names = ", ".join(str(p.relative_to(log_path.parent)) for p in files)
    with open(log_path, "a") as f:
        f.write("supervisor: this node's agent was stopped before it had copied every line its ranks wrote; "
                f"each rank's complete output (by local rank): {names}\n")
    return files
