"""What a torchrun agent's own output says about its failed ranks (pure parsing).

torchrun's agent exits 1 for any failed worker, so its exit code says nothing about what
happened. Its output does: the ``ChildFailedError`` summary names the *root cause* (the
first rank that failed: its global rank, exit code or signal) and every other failure, and
with ``--tee`` and a ``[rankN]:`` line prefix (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``)
each rank's own last error line (``ModuleNotFoundError: No module named 'torch'``). The
platforms read the tail of a failed agent's log and hand the controller these facts as
data; the controller names the fault from them.
"""

from __future__ import annotations

import re

from supervisor.model import RankFailure  # the type this parsing fills (pure decisions read it)

TAIL_BYTES = 64 << 10
MAX_PARSE_CHARS = 4 * TAIL_BYTES
""":func:`parse` and :func:`last_error` read at most the last this many characters of what they
are given (the summary and the last error line are at the end): bounded time and memory whatever
a platform hands them."""
MAX_NUMBER_DIGITS = 9
"""A rank or exit code of more digits is not one (and is never converted: past 4,300 digits
``int()`` refuses)."""
# A rank line as the local platform has torchrun prefix it.
RANK_PREFIX = "[rank${rank}]:"
_PREFIXED = re.compile(r"\[rank([0-9]{1,%d})\]:(.*)" % MAX_NUMBER_DIGITS)
# One field of a failure block of torchrun's summary ("  rank      : 1 (local_rank: 1)"), matched
# line by line: every pattern here is anchored to one line, so parsing is linear in the text.
_FIELD = re.compile(r"\s+(rank|exitcode|traceback)\s*:\s*(.*)")
_RANK_VALUE = re.compile(r"([0-9]{1,%d})(?![0-9])" % MAX_NUMBER_DIGITS)
_CODE_VALUE = re.compile(r"(-?[0-9]{1,%d})(?![0-9])" % MAX_NUMBER_DIGITS)
_AGENT_ERRORS = ("ChildFailedError", "ProcessExitedException", "ProcessRaisedException")
"""The agent's own account of a failed rank (its summary; the exception it logs for a forked
rank that exited), never a rank's error line."""
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure)): ?(.*)$")


def _blocks(summary: str):
    """(offset, rank, exit code, traceback) of each failure block: a ``rank :`` line, the next
    ``exitcode :`` line, the next ``traceback :`` line (other lines between are passed over)."""
    at, want, rank, code, start = 0, "rank", 0, 0, 0
    for line in summary.splitlines(keepends=True):
        m = _FIELD.match(line)
        if m is not None and m.group(1) == want:
            value = m.group(2)
            if want == "rank":
                v = _RANK_VALUE.match(value)
                if v is not None:
                    rank, start, want = int(v.group(1)), at, "exitcode"
            elif want == "exitcode":
                v = _CODE_VALUE.match(value)
                if v is not None:
                    code, want = int(v.group(1)), "traceback"
            else:
                yield start, rank, code, value.strip()
                want = "rank"
        at += len(line)


def parse(text: str) -> tuple[RankFailure, ...]:
    """Every failed rank the agent's summary names (root cause first), with the last error
    line each rank printed; empty when the text holds no summary. Reads the last
    :data:`MAX_PARSE_CHARS` characters, in time linear in them; never raises for any text."""
    text = text[-MAX_PARSE_CHARS:]
    errors: dict[int, str] = {}
    for line in text.splitlines():
        m = _PREFIXED.match(line)
        if m:
            e = _ERROR_LINE.match(m.group(2).strip())
            if e and not e.group(1).endswith(_AGENT_ERRORS):
                errors[int(m.group(1))] = f"{e.group(1)}: {e.group(2)}".strip().rstrip(":")[:300]
    failed = text.rfind(" FAILED\n")
    if failed < 0:
        return ()
    summary = text[failed:]
    root_at = summary.find("Root Cause")
    out: dict[int, RankFailure] = {}
    for start, rank, code, trace in _blocks(summary):
        is_root = root_at >= 0 and start > root_at
        error = errors.get(rank, "")
        if not error and trace and not trace.startswith(("To enable traceback", "Signal ")):
            error = trace[:300]
        out[rank] = RankFailure(rank, code, error, is_root)
    roots = [f for f in out.values() if f.root_cause and not f.error]
    if len(roots) == 1 and not errors:  # unprefixed output: the last error line is the root cause's
        unprefixed = last_error(text[:failed])
        if unprefixed:
            f = roots[0]
            out[f.rank] = RankFailure(f.rank, f.exit_code, unprefixed, True)
    return tuple(sorted(out.values(), key=lambda f: (not f.root_cause, f.rank)))


def last_error(text: str) -> str:
    """The last error line in output with no summary (an agent that died before its ranks
    ran, or a command that is not a torchrun job): what a person would look for first. Reads
    the last :data:`MAX_PARSE_CHARS` characters."""
    for line in reversed(text[-MAX_PARSE_CHARS:].splitlines()):
        m = _PREFIXED.match(line)
        body = (m.group(2) if m else line).strip()
        e = _ERROR_LINE.match(body)
        if e and not e.group(1).endswith(_AGENT_ERRORS):
            return body[:300]
    return ""


def read_tail(path, limit: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
