"""The node guard: one standing Slurm step per node for the job's life, so that losing the batch
host never leaves a job RUNNING with nothing in it.

The controller *is* the batch script, on the batch host. When that host dies, Slurm (with
``--no-kill``) removes it from the job and keeps the job RUNNING on the other nodes: with the
controller gone nothing will ever relaunch anything there, and the job holds its nodes to the
time limit (docs/slurm.md, "Traps"). The guard is what is left on those nodes. The slurm
platform starts one per node of the allocation as soon as the controller answers (before the
first launch), as a step of its own::

    srun --jobid=J --nodelist=NODE --overlap --job-name=sv-JOB-guard-NODE ... \\
         python -m supervisor.platforms.slurm.guard --job-id=J --restart-count=R --api=URL ...

``--overlap`` lets it share the node's CPUs, memory and GRES with every other step (the agents'
steps, with ``--overlap`` or without), so it neither holds nor waits for what the agents need.
It is not an agent's step: the controller's teardowns never touch it, so it watches through the
whole life of the job, including when no agent runs (start-up, between a teardown and the
relaunch, launch retries).

* Every ``--probe`` seconds it challenges the controller: ``GET /v1/guard?nonce=N`` with a fresh
  random nonce, answered with ``{"mac": HMAC(guard key, nonce)}`` (:func:`guard_mac`; the guard
  key is derived from the job token, ``LOG_DIR/token`` on the shared log directory, by HKDF with
  its own label, so it verifies nothing else). Only a right answer is the controller's: any
  other answer (a bare 200 from a process squatting the dead controller's port, a wrong MAC, no
  token to check it with) counts as silence.
* When the controller has not answered for ``--timeout`` seconds (refused, timed out, reset,
  unauthenticated) after answering once, the controller is lost. The guard asks Slurm whether the job is still
  this run's (``RUNNING`` with the restart count it was started with: a guard left from before a
  requeue, or a job ending, is not acted on; no answer from Slurm: asked again at the next
  probe). The first guard to claim ``LOG_DIR/slurm/controller-lost.json`` (``O_EXCL`` on the
  shared log directory) then writes the reason into the job's comment, ends the job with
  ``scontrol requeue`` (``--action requeue``, from ``--requeue``: the requeued job resumes) or
  ``scancel`` (``--action cancel``), and writes an event into ``events.jsonl``. Slurm's end of the
  job stops every agent step (SIGTERM, ``KillWait``, SIGKILL: ranks that are all alive write an
  emergency checkpoint). The other guards stop there.
* SIGTERM, SIGINT or SIGHUP (the controller ending the guards when the job ends, ``scancel`` of
  the job, Slurm ending it) ends the guard at once, exit 0, without acting: only silence acts.
* A controller never heard (a wrong address: http.host on loopback) is never taken as lost.

It imports neither torch nor the controller: it starts in milliseconds.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import stat
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from supervisor.platforms.base import PlatformError
from supervisor.platforms.clients import commands

log = logging.getLogger("supervisor.platform.slurm_guard")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
MARKER = "controller-lost.json"
EVENTS_FILE = "events.jsonl"
STATE_FILE = "supervisor-state.json"
LOST_EXIT = 75
"""The guard's exit code when it found the controller lost (whether it or another guard acted)."""
GUARD_PATH = "/v1/guard"
"""The controller's challenge endpoint: ``GET /v1/guard?nonce=HEX`` -> ``{"mac": HEX}``."""
GUARD_KEY_SALT = b"elastic-supervisor job token v2"
GUARD_KEY_INFO = b"elastic-supervisor slurm guard v1"
"""HKDF's ``info`` for the guard key (RFC 5869; the heartbeat, control and HTTP keys have their
own): what a challenge answer is MAC'd with."""
NONCE_CHARS = 32
"""A challenge's nonce: 128 random bits, in hex (the controller takes 16 to 128 hex digits)."""
MAX_TOKEN_BYTES = 4096


@dataclass(frozen=True)
class GuardConfig:
    job_id: str
    api: str
    job: str
    node: str
    log_dir: Path
    timeout_s: float
    probe_s: float
    action: str               # "requeue" | "cancel"
    restart_count: str = "0"  # the job's run this guard watches (Slurm's Restarts when it was started)
    command_timeout_s: float = 20.0
    bin_dir: str = ""
    token_file: Path | None = None
    """The job token the controller's answers are checked with (None: ``LOG_DIR/token``)."""

    def bin(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name

    @property
    def token_path(self) -> Path:
        return self.token_file if self.token_file is not None else self.log_dir / "token"


def guard_key(token: bytes) -> bytes:
    """The guard key of the job token ``token`` (stripped, as read): HKDF-SHA256, one block."""
    prk = hmac.new(GUARD_KEY_SALT, token, hashlib.sha256).digest()
    return hmac.new(prk, GUARD_KEY_INFO + b"\x01", hashlib.sha256).digest()


def guard_mac(token: bytes, nonce: str) -> str:
    """The answer to the challenge ``nonce`` that only a holder of the job token can give."""
    return hmac.new(guard_key(token), b"guard\0" + nonce.encode("ascii"), hashlib.sha256).hexdigest()


def valid_nonce(nonce: str) -> bool:
    return 16 <= len(nonce) <= 128 and all(c in "0123456789abcdef" for c in nonce)


def read_token(path: Path) -> bytes:
    """The job token in ``path`` (stripped), read without following a link or blocking on a FIFO.
    OSError or ValueError when there is none to use."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file")
        token = f.read(MAX_TOKEN_BYTES + 1).strip()
    if not token or len(token) > MAX_TOKEN_BYTES:
        raise ValueError(f"{path} holds no job token")
    return token


class Verdict:
    """One probe's answer: ``ok`` (the controller, authenticated), and why not."""

    def __init__(self, ok: bool, why: str = "") -> None:
        self.ok, self.why = ok, why

    def __bool__(self) -> bool:
        return self.ok


def controller_answers(api: str, timeout: float, token_file: Path) -> Verdict:
    """Whether the controller answers a fresh challenge within ``timeout`` with the MAC only the
    holder of the job token in ``token_file`` can make (anything else: not the controller)."""
    try:
        token = read_token(token_file)
    except (OSError, ValueError) as exc:
        return Verdict(False, f"no job token to check the answer with ({exc})")
    nonce = secrets.token_hex(NONCE_CHARS // 2)
    try:
        with urllib.request.urlopen(f"{api.rstrip('/')}{GUARD_PATH}?nonce={nonce}", timeout=timeout) as resp:
            body = resp.read(4096)
    except (OSError, urllib.error.URLError, ValueError):
        return Verdict(False)  # no answer at all: plain silence
    try:
        mac = json.loads(body).get("mac", "")
    except (ValueError, AttributeError):
        mac = ""
    if isinstance(mac, str) and hmac.compare_digest(mac.encode("ascii", "replace"), guard_mac(token, nonce).encode()):
        return Verdict(True)
    return Verdict(False, "an answer without the job token's MAC: not this job's controller (a process on its port?)")


class Silence:
    """How long the controller has not answered (0 while it does)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_answer = clock()

    def heard(self) -> None:
        self.last_answer = self.clock()

    @property
    def seconds(self) -> float:
        return self.clock() - self.last_answer


def _run(cfg: GuardConfig, *argv: str) -> commands.Result:
    return commands.run_sync([cfg.bin(argv[0]), *argv[1:]], timeout=cfg.command_timeout_s)


def not_this_run(cfg: GuardConfig) -> str:
    """Why the job is no longer the run this guard watches ("" when it is): ended or ending, or
    requeued since (another restart count). PlatformError when Slurm does not answer."""
    fields = {}
    for tok in _run(cfg, "scontrol", "show", "job", "-o", cfg.job_id).stdout.split():
        k, sep, v = tok.partition("=")
        if sep:
            fields[k] = v
    state, restarts = fields.get("JobState", ""), fields.get("Restarts", "0")
    if state != "RUNNING":
        return f"job {cfg.job_id} is {state or 'not listed'}"
    if restarts != str(cfg.restart_count):
        return f"job {cfg.job_id} is at restart {restarts}, this guard watched restart {cfg.restart_count}"
    return ""


def _event(cfg: GuardConfig, name: str, **fields) -> None:
    """One line in the controller's events.jsonl (the controller is gone: nobody else writes it)."""
    run = None
    try:
        run = json.loads((cfg.log_dir / STATE_FILE).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        pass
    now = time.time()
    rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z",
           "event": name, "job": cfg.job, **({"run": run} if run is not None else {}), **fields}
    try:
        with open(cfg.log_dir / EVENTS_FILE, "a") as f:
            f.write(json.dumps(rec) + "\n")
    except OSError as exc:
        log.error("event=guard_event_write_failed path=%s error=%s", cfg.log_dir / EVENTS_FILE, exc)


def _claim(cfg: GuardConfig, record: dict) -> bool:
    """The first guard to create the marker acts for the job; False when another one did."""
    path = cfg.log_dir / "slurm" / MARKER
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:  # no shared log directory to agree on: act anyway (requeue/cancel are idempotent)
        log.warning("event=guard_marker_failed path=%s error=%s (acting without it)", path, exc)
        return True
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    return True


def end_job(cfg: GuardConfig, reason: str) -> str:
    """Name the reason in the job's comment, then requeue or cancel it. Returns what was done."""
    # no spaces: `scontrol show job -o` prints Key=Value pairs split by spaces, and readers (ours too)
    # split on them
    comment = f"elastic-supervisor:controller-lost:{'-'.join(reason.split())}"[:250]
    try:
        _run(cfg, "scontrol", "update", f"JobId={cfg.job_id}", f"Comment={comment}")
    except PlatformError as exc:  # the comment is a courtesy; ending the job is what matters
        log.warning("event=guard_comment_failed error=%s", exc)
    if cfg.action == "requeue":
        try:
            _run(cfg, "scontrol", "requeue", cfg.job_id)
            return "requeued"
        except PlatformError as exc:
            log.error("event=guard_requeue_failed error=%s (cancelling the job instead)", exc)
    _run(cfg, "scancel", cfg.job_id)
    return "cancelled"


def guard(cfg: GuardConfig) -> int:
    """Watch the controller until told to stop (exit 0) or until it is lost (:data:`LOST_EXIT`)."""
    stop: list[int] = []

    def on_stop(sig: int, _frame) -> None:
        stop.append(sig)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_stop)
    silence = Silence()
    log.info("event=guard_started controller=%s timeout_s=%g probe_s=%g action=%s restart_count=%s", cfg.api,
             cfg.timeout_s, cfg.probe_s, cfg.action, cfg.restart_count)
    probe_timeout = max(0.5, min(cfg.probe_s, 5.0))
    ever_heard = warned_never = False
    last_unconfirmed = last_refused = ""
    while not stop:
        answer = controller_answers(cfg.api, probe_timeout, cfg.token_path)
        if not answer and answer.why and answer.why != last_refused:
            log.warning("event=controller_unauthenticated api=%s reason=%r (counted as silence)", cfg.api, answer.why)
        last_refused = answer.why if not answer else ""
        if answer:
            if not ever_heard:
                log.info("event=controller_answered api=%s", cfg.api)
            ever_heard = True
            silence.heard()
        elif stop:
            break
        elif silence.seconds >= cfg.timeout_s and ever_heard:
            # one more probe first: a guard paused itself (its node frozen, then thawed) must not
            # take its own pause for the controller's silence
            if controller_answers(cfg.api, probe_timeout, cfg.token_path):
                silence.heard()
                continue
            try:
                why_not = not_this_run(cfg)
            except PlatformError as exc:  # no answer from Slurm: it could neither confirm nor act
                if str(exc) != last_unconfirmed:
                    log.error("event=controller_silent_job_unconfirmed silent_s=%.1f error=%s (asking again)",
                              silence.seconds, exc)
                last_unconfirmed = str(exc)
            else:
                if why_not:
                    log.info("event=guard_not_acting silent_s=%.1f reason=%r", silence.seconds, why_not)
                    return 0
                return _controller_lost(cfg, silence.seconds)
        elif silence.seconds >= cfg.timeout_s and not warned_never:
            # never reached: a wrong address (a loopback http.host?) is not a lost controller
            warned_never = True
            log.error("event=controller_never_answered api=%s after_s=%.0f: this guard will not end the job; "
                      "check http.host (the nodes must reach it)", cfg.api, silence.seconds)
        deadline = time.monotonic() + cfg.probe_s
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    log.info("event=guard_stopped signal=%s controller_answering=%s", signal.Signals(stop[0]).name,
             silence.seconds < cfg.timeout_s)
    return 0


def _controller_lost(cfg: GuardConfig, silent_s: float) -> int:
    # acting now: Slurm's end of the job (ours or another guard's) signals this step too
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    reason = (f"elastic-supervisor: the controller ({cfg.api}, on the batch host) did not answer for "
              f"{silent_s:.0f}s: batch host lost")
    log.error("event=controller_lost node=%s silent_s=%.1f action=%s", cfg.node, silent_s, cfg.action)
    record = {"node": cfg.node, "job_id": cfg.job_id, "restart_count": cfg.restart_count, "api": cfg.api,
              "silent_s": round(silent_s, 1), "action": cfg.action, "time": time.time()}
    if not _claim(cfg, record):
        log.info("event=controller_lost_handled_elsewhere node=%s marker=%s", cfg.node,
                 cfg.log_dir / "slurm" / MARKER)
        return LOST_EXIT
    try:
        done = end_job(cfg, f"no answer for {silent_s:.0f}s from {cfg.api} (batch host)")
    except PlatformError as exc:
        log.error("event=guard_end_job_failed error=%s", exc)
        _event(cfg, "controller_lost", node=cfg.node, silent_s=round(silent_s, 1), job_id=cfg.job_id,
               action="failed", error=str(exc), detail=reason)
        return LOST_EXIT
    _event(cfg, "controller_lost", node=cfg.node, silent_s=round(silent_s, 1), job_id=cfg.job_id, action=done,
           detail=reason + (": requeued, the job resumes from the newest verified checkpoint" if done == "requeued"
                            else ": job cancelled; submit it again to resume from the newest verified checkpoint"))
    log.error("event=job_%s job_id=%s reason=%r", done, cfg.job_id, reason)
    return LOST_EXIT


def guard_argv(python: str, cfg: GuardConfig) -> list[str]:
    """The command line that runs ``cfg``'s guard."""
    return [python, "-m", "supervisor.platforms.slurm.guard", f"--job-id={cfg.job_id}", f"--api={cfg.api}",
            f"--job={cfg.job}", f"--node={cfg.node}", f"--log-dir={cfg.log_dir}", f"--timeout={cfg.timeout_s:g}",
            f"--probe={cfg.probe_s:g}", f"--action={cfg.action}", f"--restart-count={cfg.restart_count}",
            f"--command-timeout={cfg.command_timeout_s:g}", *([f"--bin-dir={cfg.bin_dir}"] if cfg.bin_dir else []),
            *([f"--token-file={cfg.token_file}"] if cfg.token_file is not None else [])]


def _log_to(path: Path, where: str) -> None:
    """Log to ``path`` on the shared log directory (stderr when it cannot be opened): once the batch
    host is lost, the guards' srun clients are gone with it and their output goes nowhere."""
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s slurm_guard {where}: %(message)s")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path)
    except OSError as exc:
        print(f"slurm_guard: cannot log to {path}: {exc}", file=sys.stderr, flush=True)
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m supervisor.platforms.slurm.guard",
        description="Watch the controller on the batch host from a node of its Slurm job and end the job "
                    "(requeue or cancel) when the controller stops answering. Started by the slurm platform, one "
                    "step per node for the job's life; not meant to be run by hand.")
    p.add_argument("--job-id", required=True, help="the Slurm job to requeue or cancel")
    p.add_argument("--restart-count", default="0", help="the job's restart count (Slurm's Restarts) this guard "
                   "watches: after a requeue it does not act (default: %(default)s)")
    p.add_argument("--api", required=True, help="the controller's HTTP address (its /v1/guard is challenged)")
    p.add_argument("--job", default="job", help="the job's name (for events.jsonl)")
    p.add_argument("--node", default=os.environ.get("SLURMD_NODENAME", ""), help="this node's name")
    p.add_argument("--log-dir", required=True, type=Path, help="the job's log directory (events.jsonl, slurm/)")
    p.add_argument("--timeout", type=_positive, default=60.0, help="silence (seconds) after which the controller "
                   "is lost (default: %(default)s)")
    p.add_argument("--probe", type=_positive, default=5.0, help="seconds between probes (default: %(default)s)")
    p.add_argument("--action", choices=("requeue", "cancel"), default="cancel",
                   help="what ends the job once the controller is lost (default: %(default)s)")
    p.add_argument("--command-timeout", type=_positive, default=20.0, help="timeout of scontrol/scancel")
    p.add_argument("--bin-dir", default="", help="folder of the Slurm commands (default: PATH)")
    p.add_argument("--token-file", type=Path, default=None, help="the job token the controller's answers are "
                   "checked with (default: LOG_DIR/token)")
    args = p.parse_args(argv)
    _log_to(args.log_dir / "slurm" / f"guard-{args.node or 'node'}.log",
            f"node={args.node} job={args.job_id} restart={args.restart_count}")
    cfg = GuardConfig(job_id=args.job_id, api=args.api, job=args.job, node=args.node, log_dir=args.log_dir,
                      timeout_s=args.timeout, probe_s=args.probe, action=args.action,
                      restart_count=args.restart_count, command_timeout_s=args.command_timeout, bin_dir=args.bin_dir,
                      token_file=args.token_file)
    return guard(cfg)


if __name__ == "__main__":
    sys.exit(main())
