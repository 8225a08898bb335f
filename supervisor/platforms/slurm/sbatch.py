"""The ``supervisor sbatch`` wrapper: the self-contained batch script, sbatch's time limit, the
checks made before submitting (warning signal, partitions, node count) and the submission.

Rendering and checking run no Slurm command; :func:`submit` runs ``sbatch`` and
:func:`~supervisor.platforms.slurm.client.partition_sizes` runs ``sinfo``, both through the
Slurm client.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from supervisor.files import write_atomic
from supervisor.platforms.base import PlatformError
from supervisor.platforms.slurm import client

log = logging.getLogger("supervisor.platform.slurm")

CONFIG_HEREDOC = "SUPERVISOR_CONFIG_JSON"
TIME_FORMS = "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES or DAYS-HOURS:MINUTES:SECONDS"


@dataclass(frozen=True)
class BatchScript:
    """A self-contained batch script: every sbatch option in ``#SBATCH`` lines, the job config
    inline (the script writes it to ``LOG_DIR/slurm-submit/JOB-$SLURM_JOB_ID.json`` and runs
    ``supervisor run --config`` on it). ``sbatch --parsable`` reads it on its standard input."""

    script: str
    config_json: str
    sbatch_argv: tuple[str, ...]
    output_dir: Path     # the folder of #SBATCH --output: Slurm does not create it
    record_dir: Path     # LOG_DIR/slurm-submit: the submitted script is kept here, named by job id
    job: str

    @property
    def sbatch_command_text(self) -> str:
        import shlex

        return shlex.join(self.sbatch_argv)


_SAFE = re.compile(r"^[A-Za-z0-9_./:@%=+,-]+$")


def parse_time_limit(text: str) -> int | None:
    """Seconds of an sbatch ``--time`` value, ``None`` for no limit (``0``, ``UNLIMITED``,
    ``INFINITE``). Slurm itself accepts fields out of range and carries them over (``0:10:99``
    becomes 12 minutes); here every field after the first must be in range, else ValueError."""
    t = text.strip()
    if t.upper() in ("UNLIMITED", "INFINITE", "-1"):
        return None
    bad = ValueError(f"--time {text!r}: not a Slurm time ({TIME_FORMS}, every field after the first in range: "
                     "seconds and minutes below 60, hours after DAYS- below 24)")
    days = 0
    if "-" in t:
        d, _, t = t.partition("-")
        if not d.isdigit():
            raise bad
        days = int(d)
    parts = t.split(":")
    if not all(x.isdigit() for x in parts) or len(parts) > 3:
        raise bad
    nums = [int(x) for x in parts]
    if days or "-" in text:  # D-H, D-H:M, D-H:M:S
        h, m, s = (nums + [0, 0])[:3]
        if h >= 24 or m >= 60 or s >= 60:
            raise bad
    elif len(nums) == 1:  # minutes
        h, m, s = 0, nums[0], 0
    elif len(nums) == 2:  # minutes:seconds
        h, (m, s) = 0, nums
        if s >= 60:
            raise bad
    else:  # hours:minutes:seconds
        h, m, s = nums
        if m >= 60 or s >= 60:
            raise bad
    total = ((days * 24 + h) * 60 + m) * 60 + s
    return total or None  # 0: no time limit


def warning_problems(cfg, *, warning_s: int, time_limit_s: int | None, requeue: bool,
                     checkpoint_s: float | None = None) -> list[str]:
    """Why ``--signal=B:SIG@warning_s`` would not leave the job time to stop cleanly (empty: it does).

    On the warning the supervisor sends SIGTERM to every rank and waits at most
    ``restart.kill_grace_s`` for their emergency checkpoint, then confirms the steps are gone
    (up to ``platform.slurm.kill_confirm_s``) and, with ``--requeue``, runs ``scontrol requeue``
    (up to ``command_timeout_s``): all of it must fit before the time limit. The ranks' own
    checkpoint time (``checkpoint_s``, when known) must fit in the kill grace."""
    sc = cfg.platform.slurm
    grace = cfg.restart.kill_grace_s
    out = []
    if warning_s <= 0:
        out.append(f"--warning-seconds {warning_s}: must be > 0 (the signal comes that long before the time limit)")
        return out
    need = grace + sc.kill_confirm_s + (sc.command_timeout_s if requeue else 0)
    if warning_s < need:
        out.append(f"--warning-seconds {warning_s} is shorter than stopping the job takes: restart.kill_grace_s "
                   f"{grace:g} (the ranks' emergency checkpoint) + platform.slurm.kill_confirm_s {sc.kill_confirm_s:g}"
                   + (f" + platform.slurm.command_timeout_s {sc.command_timeout_s:g} (scontrol requeue)" if requeue
                      else "") + f" = {need:g} s")
    if checkpoint_s is not None and checkpoint_s > grace:
        out.append(f"--checkpoint-seconds {checkpoint_s:g} is longer than restart.kill_grace_s {grace:g}: the ranks "
                   "would be killed in the middle of their emergency checkpoint (raise restart.kill_grace_s, and "
                   "--warning-seconds with it)")
    if time_limit_s is not None and warning_s >= time_limit_s:
        out.append(f"--warning-seconds {warning_s} is not below the time limit ({time_limit_s} s): the signal would "
                   "come at once")
    return out


def sbatch_partitions(sbatch_opts: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The partitions named by ``-p/--partition`` in sbatch options (else ``$SBATCH_PARTITION``);
    empty: the cluster's default partition."""
    found: list[str] = []
    opts = list(sbatch_opts)
    for i, opt in enumerate(opts):
        name, eq, value = opt.partition("=")
        if re.fullmatch(r"--part(i(t(i(o(n)?)?)?)?)?", name):
            value = value if eq else (opts[i + 1] if i + 1 < len(opts) else "")
        elif opt.startswith("-p") and not opt.startswith("--"):
            value = opt[2:] or (opts[i + 1] if i + 1 < len(opts) else "")
        else:
            continue
        found = [p for p in value.split(",") if p]  # the last one given wins, as in sbatch
    if not found and env.get("SBATCH_PARTITION"):
        found = [p for p in env["SBATCH_PARTITION"].split(",") if p]
    return found


def node_count_problem(nodes: int, partitions: Sequence[str], sizes: Mapping[str, int], default: str) -> str:
    """Why ``nodes`` cannot run in these partitions ('' if it can): a job asking more nodes than a
    partition has pends forever."""
    names = list(partitions) or ([default] if default else [])
    if not names:
        return ""
    unknown = [p for p in names if p not in sizes]
    if unknown and len(unknown) == len(names):
        return (f"partition {', '.join(unknown)} not found by sinfo (partitions: "
                f"{', '.join(f'{p} ({n} nodes)' for p, n in sorted(sizes.items())) or 'none'})")
    biggest = max(sizes.get(p, 0) for p in names)
    if nodes > biggest:
        where = " or ".join(f"{p} ({sizes.get(p, 0)} nodes)" for p in names)
        return (f"--nodes {nodes}: partition {where} has fewer nodes: the job would pend forever. Ask for at most "
                f"{biggest} nodes, or another partition (--partition)")
    return ""


def _sbatch_token(tok: str) -> str:
    """One argument in a ``#SBATCH`` line: sbatch groups by double quotes and takes \\\\ and \\" as
    escapes inside them."""
    if _SAFE.match(tok):
        return tok
    return '"' + tok.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_batch_script(cfg, *, time_limit: str | None, warning_s: int, requeue: bool,
                        sbatch_opts: Sequence[str], python: str, workdir: str, sbatch: str = "sbatch") -> BatchScript:
    """The self-contained batch script of ``supervisor sbatch`` (what ``--dry-run`` prints).

    The node count is ``--nodes=MIN-MAX`` from ``nodes.min``/``nodes.max``: Slurm starts the job
    on as many nodes as it has, from MIN (a drained node does not hold it) up to MAX.

    Every option (the wrapper's and yours) is in a ``#SBATCH`` line, so the printed script can be
    saved and submitted as is. The job config is inline, as JSON in a quoted heredoc the script
    writes to ``LOG_DIR/slurm-submit/JOB-$SLURM_JOB_ID.json`` before ``exec supervisor run
    --config`` on it: the training command is a JSON list there and no shell ever parses it (JSON
    is ASCII here, and no line of it can be the heredoc's end marker).

    sbatch options are written into a ``#`` comment line of the script: a line break in one would
    end the comment and run the rest as shell, so an option holding a newline or a carriage
    return (or a NUL) is a :class:`PlatformError`.
    """
    import json
    import shlex

    for opt in (*sbatch_opts, *([time_limit] if time_limit else [])):
        if "\n" in opt or "\r" in opt or "\0" in opt:
            raise PlatformError(f"sbatch option {opt!r} holds a line break: refused (in the batch script's comment "
                                "line it would end the comment and run the rest as shell)")
    log_dir = Path(cfg.log_dir)
    sub_dir = log_dir / "slurm-submit"
    config_json = json.dumps(cfg.to_dict(), indent=1, default=list, ensure_ascii=True) + "\n"
    if CONFIG_HEREDOC in config_json.splitlines():  # cannot happen (JSON lines are indented or brackets)
        raise PlatformError("the job config holds the heredoc's end marker")
    signal_name = cfg.platform.slurm.warning_signal.upper().removeprefix("SIG")
    lo, hi = cfg.nodes.min, cfg.nodes.max
    # no --ntasks-per-node: with a node range Slurm would allocate MIN nodes even with MAX idle
    # (docs/slurm.md); the agents are srun steps with their own --ntasks=1
    ours = [f"--job-name={cfg.job}", f"--nodes={lo}-{hi}" if lo < hi else f"--nodes={hi}", "--no-kill", f"--signal=B:{signal_name}@{int(warning_s)}", "--requeue" if requeue else "--no-requeue",
            f"--output={log_dir / 'slurm-%j.out'}", "--open-mode=append"]
    if time_limit:
        ours.append(f"--time={time_limit}")
    lines = [
        "#!/bin/bash",
        f"# Written by `supervisor sbatch` ({time.strftime('%Y-%m-%d %H:%M:%S')}); self-contained: submit it as is",
        f"# (the --output folder must exist: mkdir -p {shlex.quote(str(log_dir))}). The supervisor runs here, on the",
        "# batch host; it starts one torchrun agent per node as an srun step inside this --no-kill allocation.",
        "# The job config is the JSON below (the training command is an argv list in it: no shell parses it).",
        *(f"#SBATCH {_sbatch_token(o)}" for o in ours),
    ]
    if sbatch_opts:
        lines.append("#SBATCH " + " ".join(_sbatch_token(o) for o in sbatch_opts))
    config_path = shlex.quote(str(sub_dir / f"{cfg.job}-")) + '"${SLURM_JOB_ID:-manual}"' + shlex.quote(".json")
    lines += [
        "set -eu",
        f"cd {shlex.quote(workdir)}",
        "export PYTHONUNBUFFERED=1",
        f"mkdir -p {shlex.quote(str(sub_dir))}",
        f"config={config_path}",
        # a temporary file of its own (mktemp: a random name, O_EXCL, mode 0600): two runs of the
        # script (a requeue racing a manual one) never write into one file
        'tmp=$(mktemp "$config.XXXXXXXX")',
        f"cat >\"$tmp\" <<'{CONFIG_HEREDOC}'",
        config_json + CONFIG_HEREDOC,
        'mv -f "$tmp" "$config"',
        f'exec {shlex.quote(python)} -m supervisor run --config "$config"',
        "",
    ]
    bin_dir = cfg.platform.slurm.bin_dir
    argv = (str(Path(bin_dir) / sbatch) if bin_dir else sbatch, "--parsable")
    return BatchScript("\n".join(lines), config_json, argv, log_dir, sub_dir, cfg.job)


def submit(rendered: BatchScript, *, timeout: float = 60.0, env: Mapping[str, str] | None = None) -> str:
    """Run ``sbatch --parsable`` with the script on its standard input; return the job id.

    The ``--output`` folder is created first (Slurm does not create it: the job would fail at
    launch with no trace but slurmd's log) and removed again if sbatch fails and it was new. The
    script is kept as ``LOG_DIR/slurm-submit/JOB-ID.sbatch`` (mode 0600: it holds the job's
    ``env``) only once sbatch accepted it: a failed submission leaves nothing behind."""
    created = []
    for d in (rendered.output_dir, *rendered.output_dir.parents):
        if d.exists():
            break
        created.append(d)
    rendered.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        job_id = client.sbatch_submit(rendered.sbatch_argv, rendered.script, timeout=timeout, env=env)
    except BaseException:
        for d in created:  # deepest first
            try:
                d.rmdir()
            except OSError:
                break
        raise
    try:
        rendered.record_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mode 0600: the script holds the job's config, its env too (API keys)
        write_atomic(rendered.record_dir / f"{rendered.job}-{job_id}.sbatch", rendered.script.encode(), mode=0o600)
    except OSError as exc:  # the job is submitted: a missing copy is not a failure
        log.warning("event=sbatch_record_not_written job_id=%s error=%s", job_id, exc)
    return job_id
