"""The node guard: the parent of every node's torchrun agent on Slurm, so that losing the
batch host never leaves a job RUNNING with nothing in it.

The controller *is* the batch script, on the batch host. When that host dies, Slurm (with
``--no-kill``) removes it from the job and keeps the job RUNNING on the other nodes: the steps
there outlive their ``srun`` clients, but with the rendezvous store and the controller gone
nothing will ever relaunch them, and the job holds its nodes to the time limit (seen on the
test cluster: 4+ minutes RUNNING, no requeue). The guard is what is left on those nodes::

    srun ... python -m supervisor.platforms.slurm_guard --job-id J --api URL ... -- torchrun ...

* It runs the agent as its child, forwards every signal Slurm sends (TERM, INT, HUP, USR1/2,
  CONT) and ends as the agent ended (same exit code, or killed by the same signal), so to the
  controller a guarded step is the agent's step.
* Every ``--probe`` seconds it asks the controller's ``/healthz``. When the agent ends it asks
  once more before exiting: a controller that answers sees the exit as always.
* When the controller has not answered for ``--timeout`` seconds (refused, timed out, reset),
  the controller is lost. The guard sends its agent SIGTERM (when every rank is still alive
  the ranks agree to stop and write an emergency checkpoint; with ranks lost on the batch host
  they cannot, and the job resumes from the newest verified checkpoint as for any node loss),
  waits ``--grace`` seconds, then SIGKILLs it. The first guard to claim
  ``LOG_DIR/slurm/controller-lost.json`` (``O_EXCL`` on the shared log directory) then writes
  the reason into the Slurm job's comment and an event into ``events.jsonl``, and ends the job:
  ``scontrol requeue`` (``--action requeue``, from ``--requeue``: the requeued job resumes) or
  ``scancel`` (``--action cancel``). The other guards only stop their agents.

It imports neither torch nor the controller: it starts in milliseconds beside every agent.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
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

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)
MARKER = "controller-lost.json"
EVENTS_FILE = "events.jsonl"
STATE_FILE = "supervisor-state.json"
LOST_EXIT = 75
"""The guard's exit code when it ended its agent because the controller was lost."""


@dataclass(frozen=True)
class GuardConfig:
    job_id: str
    api: str
    job: str
    node: str
    log_dir: Path
    timeout_s: float
    probe_s: float
    grace_s: float
    action: str               # "requeue" | "cancel"
    command_timeout_s: float = 20.0
    bin_dir: str = ""

    def bin(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name


def controller_answers(api: str, timeout: float) -> bool:
    """Whether the controller's HTTP server answers ``/healthz`` within ``timeout``."""
    try:
        with urllib.request.urlopen(f"{api.rstrip('/')}/healthz", timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


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


def _exit_like(code: int) -> int:
    """Return the child's exit code; for a child killed by signal N, die by N ourselves."""
    if code < 0:
        sig = -code
        if sig != signal.SIGKILL:  # SIGKILL's disposition cannot be set (and is always deadly)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # not reached for a deadly signal
    return code


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
    run = lambda *argv: commands.run_sync([cfg.bin(argv[0]), *argv[1:]], timeout=cfg.command_timeout_s)  # noqa: E731
    # no spaces: `scontrol show job -o` prints Key=Value pairs split by spaces, and readers (ours too)
    # split on them
    comment = f"elastic-supervisor:controller-lost:{'-'.join(reason.split())}"[:250]
    try:
        run("scontrol", "update", f"JobId={cfg.job_id}", f"Comment={comment}")
    except PlatformError as exc:  # the comment is a courtesy; ending the job is what matters
        log.warning("event=guard_comment_failed error=%s", exc)
    if cfg.action == "requeue":
        try:
            run("scontrol", "requeue", cfg.job_id)
            return "requeued"
        except PlatformError as exc:
            log.error("event=guard_requeue_failed error=%s (cancelling the job instead)", exc)
    run("scancel", cfg.job_id)
    return "cancelled"


def _stop_child(child: subprocess.Popen, grace_s: float) -> None:
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def guard(cfg: GuardConfig, argv: Sequence[str]) -> int:
    try:
        child = subprocess.Popen(list(argv))
    except OSError as exc:
        print(f"slurm_guard: cannot start {argv[0]!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 127

    def forward(sig: int, _frame) -> None:
        try:
            child.send_signal(sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    silence = Silence()
    log.info("event=guard_started agent_pid=%d controller=%s timeout_s=%g probe_s=%g action=%s", child.pid, cfg.api,
             cfg.timeout_s, cfg.probe_s, cfg.action)
    probe_timeout = max(0.5, min(cfg.probe_s, 5.0))
    next_probe = 0.0
    waiting = False
    ever_heard = False
    warned_never = False
    while True:
        code = child.poll()
        now = time.monotonic()
        if code is not None or now >= next_probe:
            if controller_answers(cfg.api, probe_timeout):
                if not ever_heard:
                    log.info("event=controller_answered api=%s", cfg.api)
                ever_heard = True
                silence.heard()
                if code is not None:
                    log.info("event=agent_exited exit_code=%d", code)
                    return _exit_like(code)
            elif code is not None and not waiting:
                # the agent ended and the controller does not answer: it may be gone with the batch
                # host (whose rendezvous store this agent lost). Stay to find out; exit as soon as
                # it answers again.
                waiting = True
                log.warning("event=agent_exited_controller_silent exit_code=%d silent_s=%.1f (waiting up to %gs for "
                            "the controller)", code, silence.seconds, cfg.timeout_s)
            next_probe = time.monotonic() + cfg.probe_s
        if silence.seconds >= cfg.timeout_s and ever_heard:
            return _controller_lost(cfg, child, silence.seconds, code)
        if silence.seconds >= cfg.timeout_s and not warned_never:
            # never reached: a wrong address (a loopback http.host?) is not a lost controller
            warned_never = True
            log.error("event=controller_never_answered api=%s after_s=%.0f: this guard will not end the job; "
                      "check http.host (the nodes must reach it)", cfg.api, silence.seconds)
        if code is not None and not ever_heard and silence.seconds >= cfg.timeout_s:
            return _exit_like(code)
        try:
            child.wait(timeout=max(0.05, min(cfg.probe_s, next_probe - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass


def _controller_lost(cfg: GuardConfig, child: subprocess.Popen, silent_s: float, code: int | None) -> int:
    reason = (f"elastic-supervisor: the controller ({cfg.api}, on the batch host) did not answer for "
              f"{silent_s:.0f}s: batch host lost")
    log.error("event=controller_lost node=%s silent_s=%.1f agent=%s action=%s", cfg.node, silent_s,
              "exited" if code is not None else "running: stopping it (SIGTERM: emergency checkpoint if every rank is "
              f"alive, SIGKILL after {cfg.grace_s:g}s)", cfg.action)
    _stop_child(child, cfg.grace_s)
    record = {"node": cfg.node, "job_id": cfg.job_id, "api": cfg.api, "silent_s": round(silent_s, 1),
              "action": cfg.action, "time": time.time()}
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
    """The command line that runs ``cfg``'s guard in front of an agent's argv (append ``--``, argv)."""
    return [python, "-m", "supervisor.platforms.slurm_guard", f"--job-id={cfg.job_id}", f"--api={cfg.api}",
            f"--job={cfg.job}", f"--node={cfg.node}", f"--log-dir={cfg.log_dir}", f"--timeout={cfg.timeout_s:g}",
            f"--probe={cfg.probe_s:g}", f"--grace={cfg.grace_s:g}", f"--action={cfg.action}",
            f"--command-timeout={cfg.command_timeout_s:g}", *([f"--bin-dir={cfg.bin_dir}"] if cfg.bin_dir else [])]


def _log_to(path: Path, where: str) -> None:
    """Log to stderr (the node log, while its srun client lives) and to ``path`` on the shared log
    directory: once the batch host is lost, its srun clients are gone and stderr goes nowhere."""
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s slurm_guard {where}: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path))
    except OSError as exc:
        print(f"slurm_guard: cannot log to {path}: {exc}", file=sys.stderr, flush=True)
    for h in handlers:
        h.setFormatter(fmt)
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m supervisor.platforms.slurm_guard",
        description="Run a node's torchrun agent inside its Slurm step and end the job (requeue or cancel) "
                    "when the controller on the batch host stops answering. Started by the slurm platform; "
                    "not meant to be run by hand.")
    p.add_argument("--job-id", required=True, help="the Slurm job to requeue or cancel")
    p.add_argument("--api", required=True, help="the controller's HTTP address (its /healthz is probed)")
    p.add_argument("--job", default="job", help="the job's name (for events.jsonl)")
    p.add_argument("--node", default=os.environ.get("SLURMD_NODENAME", ""), help="this node's name")
    p.add_argument("--log-dir", required=True, type=Path, help="the job's log directory (events.jsonl, slurm/)")
    p.add_argument("--timeout", type=_positive, default=60.0, help="silence (seconds) after which the controller "
                   "is lost (default: %(default)s)")
    p.add_argument("--probe", type=_positive, default=5.0, help="seconds between probes (default: %(default)s)")
    p.add_argument("--grace", type=_positive, default=30.0, help="seconds the agent gets after SIGTERM "
                   "(default: %(default)s)")
    p.add_argument("--action", choices=("requeue", "cancel"), default="cancel",
                   help="what ends the job once the controller is lost (default: %(default)s)")
    p.add_argument("--command-timeout", type=_positive, default=20.0, help="timeout of scontrol/scancel")
    p.add_argument("--bin-dir", default="", help="folder of the Slurm commands (default: PATH)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the agent's command line")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no agent command after --")
    _log_to(args.log_dir / "slurm" / f"guard-{args.node or 'node'}.log",
            f"node={args.node} attempt={os.environ.get('SUPERVISOR_ATTEMPT', '?')}")
    cfg = GuardConfig(job_id=args.job_id, api=args.api, job=args.job, node=args.node, log_dir=args.log_dir,
                      timeout_s=args.timeout, probe_s=args.probe, grace_s=args.grace, action=args.action,
                      command_timeout_s=args.command_timeout, bin_dir=args.bin_dir)
    return guard(cfg, command)


if __name__ == "__main__":
    sys.exit(main())
