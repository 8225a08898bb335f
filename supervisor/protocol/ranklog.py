"""The rank log: ``LOG_DIR/ranks/rank-R.jsonl``, one JSON object a line for every step a rank
completed, appended by the worker SDK. Its readers: the controller (the last step an attempt
logged), ``supervisor drill`` (rank 0's loss path) and the efficiency report (step timings).

A record holds :data:`FIELDS` (``loss`` and ``loss_hex`` are null for a step without a loss;
``loss_hex`` is the exact float, ``float.hex``), then whatever the training script added.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from supervisor.protocol.errors import REJECT_MALFORMED, REJECT_SCHEMA, ProtocolError

RANKS_DIR = "ranks"
"""The ranks' directory under the job's log directory (the ranks' ``SUPERVISOR_LOG_DIR``)."""
GLOB = "rank-*.jsonl"
FIELDS = ("step", "loss", "loss_hex", "world_size", "attempt", "rank", "node", "pid", "data_s", "compute_s",
          "collective_s", "step_s", "time")
LINE_MAX_CHARS = 1 << 20
"""A longer line is not a record."""


def log_name(rank: int) -> str:
    return f"rank-{rank}.jsonl"


def rank_of(name: str) -> int | None:
    """The rank whose log is named ``name``, or None."""
    digits = name.removeprefix("rank-").removesuffix(".jsonl")
    if not name.startswith("rank-") or not name.endswith(".jsonl") or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


def step_record(*, step: int, loss: float | None, world_size: int, attempt: int, rank: int, node: str, pid: int,
                data_s: float, compute_s: float, collective_s: float, step_s: float, time: float,
                extra: Mapping[str, Any] | None = None) -> str:
    """One line of the log (newline included): the step's record, the script's ``extra`` after it."""
    values = (step, loss, float(loss).hex() if loss is not None else None, world_size, attempt, rank, node, pid,
              round(data_s, 6), round(compute_s, 6), round(collective_s, 6), round(step_s, 6), time)
    return json.dumps(dict(zip(FIELDS, values)) | dict(extra or {})) + "\n"


def parse_records(lines: Iterable[str | bytes], *, source: str = "<log>", strict: bool = False) -> list[dict]:
    """The records of a log's lines; blank lines are passed over. A line that is not a JSON object
    (the one being written, a torn tail) is passed over too, or, ``strict``, a
    :class:`ProtocolError` naming ``source`` and the line."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            if len(line) > LINE_MAX_CHARS:
                raise ValueError(f"over {LINE_MAX_CHARS} characters")
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if strict:
                raise ProtocolError(REJECT_MALFORMED, f"{source}:{n}: not JSON: {exc}"[:400]) from None
            continue
        if not isinstance(rec, dict):
            if strict:
                raise ProtocolError(REJECT_SCHEMA, f"{source}:{n}: expected a JSON object, got {type(rec).__name__}")
            continue
        out.append(rec)
    return out


def read_log(path: str | os.PathLike, *, strict: bool = False, tail_bytes: int | None = None) -> list[dict]:
    """The records of the log at ``path`` (:func:`parse_records`); of its last ``tail_bytes`` only
    when given (the first, partial line dropped). A log that cannot be read has none, or,
    ``strict``, is an ``OSError``."""
    try:
        with open(path, "rb") as f:
            if tail_bytes is not None and os.fstat(f.fileno()).st_size > tail_bytes:
                f.seek(-tail_bytes, os.SEEK_END)
                f.readline()
            data = f.read()
    except OSError:
        if strict:
            raise
        return []
    return parse_records(data.decode(errors="replace").splitlines(), source=str(path), strict=strict)


def read_logs(directory: str | os.PathLike, *, strict: bool = False) -> dict[int, list[dict]]:
    """Every rank's records under ``directory``, as ``{rank: records}`` in rank order."""
    found = {rank_of(p.name): p for p in Path(directory).glob(GLOB)}
    return {rank: read_log(found[rank], strict=strict) for rank in sorted(r for r in found if r is not None)}
