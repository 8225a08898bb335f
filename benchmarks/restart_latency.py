"""Detection and restart latency per fault kind, side by side with plain torchrun.

One command; every number comes from real runs of ``examples/train.py`` (2 ranks, DDP over
gloo, CPU) made in this invocation, on this machine:

* **baselines**: a cold start of the job under the supervisor (``launched`` -> first step)
  and a cold start that restores a checkpoint (the same job started again on a checkpoint
  root that holds a step-10 checkpoint), plus plain torchrun's cold start;
* **faults under the supervisor** (``supervisor launch --nnodes 2``, heartbeat every 0.5 s,
  heartbeat timeout 3 s, hang-timeout floor 3 s): ``kill`` (SIGKILL of rank 1 mid-step),
  ``stop`` (SIGSTOP), ``hang`` (blocks in compute), ``skip-collective`` (skips its gradient
  all-reduce) at step 13 through ``SUPERVISOR_FAULT`` (attempt 0 only), and ``node`` (this
  script SIGKILLs node1's agent and its rank, each in its own process group, once step 12 is
  logged; a spare slot replaces the node);
* **plain torchrun, same job** (``--standalone --nproc-per-node 2 --max-restarts 1``,
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): its restart after ``kill``; ``stop``, ``hang``
  and ``skip-collective`` with a 30 s process-group timeout (a ``python -c`` shim sets
  ``init_process_group(timeout=30 s)``); ``stop`` with defaults (capped wait).

Times are wall-clock: the injected fault from the rank's ``event=fault_injected`` log line
(or the moment this script killed the node), detection from the controller's
``fault_detected`` event, the first resumed step from the rank logs (``rank-R.jsonl``,
the latest first step of the new attempt over all ranks). The phase breakdown uses the
controller's events and the ranks' ``event=checkpoint_restored`` log line.

Usage: python benchmarks/restart_latency.py [--rounds 2] [--out docs/benchmarks/restart_latency.md]
       [--faults kill,stop,hang,skip-collective,node] [--torchrun-slow-rounds 1] [--stop-wait 90]
"""

from __future__ import annotations

import argparse
import atexit
import calendar
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from supervisor.checkpoint import latest_complete  # noqa: E402
from supervisor.protocol import RESTART_PHASES  # noqa: E402

PY = sys.executable
TRAIN = REPO / "examples" / "train.py"
STEPS, EVERY, SLEEP, FAULT_STEP = 40, 5, 0.05, 13
JOB = ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--step-sleep", str(SLEEP)]
HB_INTERVAL, HB_TIMEOUT, HANG_FLOOR, PHASE_FACTOR = 0.5, 3.0, 3.0, 5.0
SV_FLAGS = ["--heartbeat-interval", str(HB_INTERVAL), "--heartbeat-timeout", str(HB_TIMEOUT),
            "--hang-timeout-floor", str(HANG_FLOOR)]
PG_TIMEOUT_S = 30
FAULTS = ("kill", "stop", "hang", "skip-collective", "node")
DETECTOR = {
    "kill": "agent exit (process)", "node": "node agent gone (process)", "stop": "heartbeat timeout",
    "hang": "phase timeout (compute)", "skip-collective": "collective wait timeout",
}
PHASES = RESTART_PHASES  # the controller's restart phases (its restart_complete event), measured here
OVERHEAD_TARGET_S = 3.0

# A python -c shim: the example has no timeout flag; give init_process_group a 30 s timeout.
PG_SHIM = (
    "import datetime, runpy, sys\n"
    "import torch.distributed as d\n"
    "_ipg = d.init_process_group\n"
    "_timeout = datetime.timedelta(seconds=float(sys.argv[1]))\n"
    "def init_process_group(*a, **k):\n"
    "    k.setdefault('timeout', _timeout)\n"
    "    return _ipg(*a, **k)\n"
    "d.init_process_group = init_process_group\n"
    "path = sys.argv[2]\n"
    "sys.argv = [path] + sys.argv[3:]\n"
    "runpy.run_path(path, run_name='__main__')\n"
)

# ---------------------------------------------------------------------------------------------
# process hygiene: every session we start is killed (whole process group) on the way out

_SESSIONS: list[subprocess.Popen] = []
_LOG_DIRS: list[Path] = []


def _killpg(pid: int) -> None:
    for sig in (signal.SIGKILL, signal.SIGCONT):  # a stopped process dies only once continued
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_agents(log_dir: Path) -> None:
    """The supervisor's agents run in their own sessions: kill them by the state file's pids."""
    try:
        state = json.loads((log_dir / "supervisor-state.json").read_text())
    except (OSError, ValueError):
        return
    for info in state.get("platform", {}).get("nodes", {}).values():
        _killpg(int(info["pid"]))


def _proc_table() -> dict[int, int]:
    """pid -> ppid for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    out[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for c, pp in _proc_table().items():
        children.setdefault(pp, []).append(c)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def strays(root: Path) -> list[int]:
    """Live processes started under ``root`` (their TMPDIR is inside it) that outlived their parents.

    torchrun starts every worker in a session of its own, so killing an agent's process group
    leaves its ranks running: they are found by the TMPDIR this script (or the supervisor, for
    its agents) gave them, all inside this run's work dir.
    """
    marker = b"TMPDIR=" + str(root).encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and any(v.startswith(marker) for v in env):
            found.append(int(d))
    return found


def kill_strays(root: Path) -> int:
    pids = strays(root)
    for pid in pids:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    return len(pids)


WORK: Path | None = None


def cleanup() -> None:
    for p in _SESSIONS:
        if p.poll() is None:
            _killpg(p.pid)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for d in _LOG_DIRS:
        kill_agents(d)
    if WORK is not None:
        kill_strays(WORK)


def start(cmd: list[str], *, env: dict[str, str], out: Path, cwd: Path) -> subprocess.Popen:
    with open(out, "ab") as f:
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=cwd)
    _SESSIONS.append(p)
    return p


def stop_session(p: subprocess.Popen) -> None:
    if p.poll() is None:
        _killpg(p.pid)
    p.wait(timeout=30)


def job_env(tmp: Path, fault: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "TORCHELASTIC_"))}
    if fault:
        env["SUPERVISOR_FAULT"] = fault
    (tmp / "tmpdir").mkdir(parents=True, exist_ok=True)
    env.update(TMPDIR=str(tmp / "tmpdir"), OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


# ---------------------------------------------------------------------------------------------
# readers: events (ISO UTC), rank logs (epoch), python logging lines (local), torch glog lines

# a rank's lines reach the node log through torchrun's --tee, each prefixed "[rankN]:"
RANK_PREFIX = r"^(?:\[rank\d+\]:)?"
LOG_LINE = re.compile(RANK_PREFIX + r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
GLOG_LINE = re.compile(RANK_PREFIX + r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+) ")


def iso_epoch(s: str) -> float:
    base, _, frac = s.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + float("0." + (frac or "0"))


def line_epoch(line: str) -> float | None:
    m = LOG_LINE.match(line)
    if m:
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
    g = GLOG_LINE.match(line)
    if g:
        mon, day, hh, mm, ss, frac = g.groups()
        year = time.localtime().tm_year
        return time.mktime((year, int(mon), int(day), int(hh), int(mm), int(ss), 0, 0, -1)) + float("0." + frac)
    return None


def read_jsonl(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def rank_records(rank_dir: Path) -> list[dict]:
    return [r for p in sorted(rank_dir.glob("rank-*.jsonl")) for r in read_jsonl(p)]


def first_step_time(records: list[dict], attempt: int) -> float | None:
    """The gang's first step of ``attempt``: the latest over ranks of each rank's first record."""
    firsts: dict[int, float] = {}
    for r in records:
        if r.get("attempt") == attempt:
            firsts[r["rank"]] = min(firsts.get(r["rank"], r["time"]), r["time"])
    return max(firsts.values()) if firsts else None


def log_times(paths: list[Path], pattern: str) -> list[float]:
    out = []
    for p in paths:
        try:
            lines = p.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if pattern in line:
                t = line_epoch(line)
                if t is not None:
                    out.append(t)
    return sorted(out)


def event(events: list[dict], name: str, **match) -> dict | None:
    for e in events:
        if e["event"] == name and all(e.get(k) == v for k, v in match.items()):
            return e
    return None


def et(e: dict | None) -> float | None:
    return iso_epoch(e["time"]) if e else None


def sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def med(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------
# supervisor runs


@dataclass
class SvRun:
    name: str
    kind: str | None
    rc: int | None = None
    t_fault: float | None = None
    fault_source: str = ""
    cold_start: float | None = None  # launched (attempt 0) -> first step
    restore_load: float | None = None  # restore_point_from_supervisor -> checkpoint_restored
    ctrl: dict = field(default_factory=dict)  # the controller's own numbers
    phases: dict = field(default_factory=dict)  # measured, wall clock
    detect: float | None = None
    total: float | None = None
    detector_kind: str = ""
    detail: str = ""
    hang_timeout: float | None = None
    load: tuple = ()
    note: str = ""
    leaked: int | None = None
    paired_overhead: float | None = None  # total - detect - (this run's own cold start + checkpoint load)
    teardown_parts: dict = field(default_factory=dict)  # evidence wait, culprit gone, the rest torn down


_EXTRA: list[str] | None = None


def launch_extra() -> list[str]:
    """Options of this checkout's ``supervisor launch`` that keep the measurement clean, where it has them."""
    global _EXTRA
    if _EXTRA is None:
        help_text = subprocess.run([PY, "-m", "supervisor", "launch", "--help"], capture_output=True, text=True,
                                   env=os.environ | {"PYTHONPATH": str(REPO)}, cwd=REPO).stdout
        # after the job ends, do not keep serving /metrics: the run is over when the ranks are
        _EXTRA = ["--metrics-linger", "0"] if "--metrics-linger" in help_text else []
    return _EXTRA


def sv_launch(work: Path, name: str, *, fault: str | None = None, slots: int = 2, ckpt: Path | None = None):
    d = work / name
    d.mkdir(parents=True)
    logs, ckpt = d / "logs", ckpt or d / "ckpt"
    cmd = [PY, "-m", "supervisor", "launch", "--nnodes", "2", "--slots", str(slots), "--checkpoint-dir", str(ckpt),
           "--log-dir", str(logs), *SV_FLAGS, *launch_extra(), "--", PY, str(TRAIN), *JOB]
    _LOG_DIRS.append(logs)
    p = start(cmd, env=job_env(d, fault), out=d / "supervisor-output.txt", cwd=d)
    return p, logs, ckpt


def wait_mid_run(p: "subprocess.Popen | Callable[[], bool]", logs: Path, ckpt: Path, timeout: float = 180) -> bool:
    """Until step FAULT_STEP-1 is logged by rank 0 and a complete checkpoint exists, or the run
    ended (``p`` exited, or ``p()`` says so)."""
    ended = p if callable(p) else (lambda: p.poll() is not None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not ended():
        recs = read_jsonl(logs / "ranks" / "rank-0.jsonl")
        if recs and recs[-1]["step"] >= FAULT_STEP - 1 and recs[-1]["attempt"] == 0:
            found = latest_complete(ckpt).checkpoint if ckpt.exists() else None
            if found is not None and found.step >= EVERY:
                return True
        time.sleep(0.01)
    return False


def signal_node(logs: Path, node: str, sig: int) -> float:
    """Signal a local node at once: its agent (pid from the state file) and its ranks, each in a
    session of its own (killpg of the agent alone would not reach them). Returns the time sent."""
    state = json.loads((logs / "supervisor-state.json").read_text())
    agent = int(state["platform"]["nodes"][node]["pid"])
    pids = [agent, *descendants(agent)]
    sent = time.time()
    for pid in pids:
        try:
            os.killpg(os.getpgid(pid), sig)
        except ProcessLookupError:
            pass
    return sent


def publish(report: str, out: Path, work: Path, keep: bool, kept_note: str) -> None:
    """Write the report, print it, and remove the work dir unless asked to keep it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print()
    print(report)
    print(f"\nwritten to {out}" + (f"; {kept_note} in {work}" if keep else ""))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def finish(p: subprocess.Popen, logs: Path, timeout: float) -> tuple[int | None, int | None]:
    """Wait for the supervisor; then kill what is left. Returns (exit code, rank processes it left behind)."""
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    leaked = None
    if rc is not None:
        time.sleep(1.0)  # anything under this run's dir still alive a second after the supervisor exited
        leaked = len(strays(logs.parent))
    stop_session(p)
    kill_agents(logs)
    kill_strays(logs.parent)
    return rc, leaked


def analyse_cold(name: str, logs: Path, load) -> SvRun:
    run = SvRun(name, None, load=load)
    events = read_jsonl(logs / "events.jsonl")
    recs = rank_records(logs / "ranks")
    run.cold_start = sub(first_step_time(recs, 0), et(event(events, "launched", attempt=0)))
    node_logs = sorted((logs / "attempt-0").glob("*.log"))
    hint = log_times(node_logs, "event=restore_point_from_supervisor")
    done = log_times(node_logs, "event=checkpoint_restored")
    if hint and done:
        run.restore_load = done[0] - hint[0]
        running = et(event(events, "running", attempt=0))
        launched = et(event(events, "launched", attempt=0))
        run.phases = {"rendezvous": sub(running, launched), "restore": sub(done[0], running),
                      "first_step": sub(first_step_time(recs, 0), done[0])}
    return run


def analyse_fault(name: str, kind: str, logs: Path, t_fault_ext: float | None, rc, load,
                  agent_logs: Path | None = None) -> SvRun:
    """``agent_logs``: where the platform put ``attempt-K/NODE.log`` (default ``logs``)."""
    run = SvRun(name, kind, rc=rc, load=load)
    agents = agent_logs or logs
    events = read_jsonl(logs / "events.jsonl")
    recs = rank_records(logs / "ranks")
    launched0 = et(event(events, "launched", attempt=0))
    run.cold_start = sub(first_step_time(recs, 0), launched0)
    step_s = [r["step_s"] for r in recs if r.get("attempt") == 0]
    run.hang_timeout = max(HANG_FLOOR, PHASE_FACTOR * statistics.median(step_s)) if step_s else HANG_FLOOR
    if t_fault_ext is not None:
        run.t_fault, run.fault_source = t_fault_ext, "killpg time"
    else:
        injected = log_times(sorted((agents / "attempt-0").glob("*.log")), "event=fault_injected")
        if injected:
            run.t_fault, run.fault_source = injected[0], "fault_injected log line"
        else:  # skip-collective logs nothing: the end of the step before it, plus the step sleep
            before = [r["time"] for r in recs if r.get("attempt") == 0 and r["step"] == FAULT_STEP - 1]
            if before:
                run.t_fault, run.fault_source = max(before) + SLEEP, f"est.: step {FAULT_STEP - 1} logged + sleep"
    det = event(events, "fault_detected")
    rc_ev = event(events, "restart_complete")
    launched1 = event(events, "launched", attempt=1)
    running1 = et(event(events, "running", attempt=1))
    if det:
        run.detector_kind, run.detail = det["kind"], det["detail"]
        run.ctrl["detection_s"] = det["detection_s"]
    if rc_ev:
        run.ctrl["phases"] = rc_ev["phases"]
        run.ctrl["total_s"] = rc_ev["total_s"]
        run.ctrl["time"] = iso_epoch(rc_ev["time"])
    t_det = et(det)
    restored = log_times(sorted((agents / "attempt-1").glob("*.log")), "event=checkpoint_restored")
    hint = log_times(sorted((agents / "attempt-1").glob("*.log")), "event=restore_point_from_supervisor")
    if restored and hint:
        run.restore_load = restored[0] - hint[0]
    t_restored = restored[0] if restored else None
    t_first = first_step_time(recs, 1)
    run.detect = sub(t_det, run.t_fault)
    run.total = sub(t_first, run.t_fault)
    schedule = (rc_ev or {}).get("phases", {}).get("schedule", 0.0)
    down_and_sched = sub(et(launched1), t_det)
    run.phases = {
        "detect": run.detect,
        "teardown": None if down_and_sched is None else down_and_sched - schedule,
        "schedule": None if down_and_sched is None else schedule,
        "rendezvous": sub(running1, et(launched1)),
        "restore": sub(t_restored, running1),
        "first_step": sub(t_first, t_restored),
    }
    t_evidence = et(event(events, "evidence_saved"))
    t_down = et(event(events, "action", action="tear_down"))
    if t_det is not None and t_evidence is not None and t_down is not None and launched1 is not None:
        run.teardown_parts = {"evidence": t_evidence - t_det, "culprit": t_down - t_evidence,
                              "rest": et(launched1) - t_down - schedule}
    if run.total is not None and run.detect is not None and run.cold_start is not None:
        run.paired_overhead = run.total - run.detect - run.cold_start - (run.restore_load or 0.0)
    if t_first is not None and rc_ev:
        run.ctrl["late_s"] = run.ctrl["time"] - t_first  # restart_complete written this long after the step
    if rc is None:
        run.note = "timed out"
    return run


def sv_fault_run(work: Path, name: str, kind: str) -> SvRun:
    load0 = os.getloadavg()
    if kind == "node":
        p, logs, ckpt = sv_launch(work, name, slots=3)
        t_fault = None
        if wait_mid_run(p, logs, ckpt):
            t_fault = signal_node(logs, "node1", signal.SIGKILL)
        rc, leaked = finish(p, logs, 240)
        run = analyse_fault(name, kind, logs, t_fault, rc, load0 + os.getloadavg())
        run.leaked = leaked
        return run
    spec = f"kind={kind},rank=1,step={FAULT_STEP},attempt=0"
    p, logs, _ = sv_launch(work, name, fault=spec)
    rc, leaked = finish(p, logs, 240)
    run = analyse_fault(name, kind, logs, None, rc, load0 + os.getloadavg())
    run.leaked = leaked
    return run


def sv_cold_runs(work: Path, rnd: int) -> tuple[SvRun, SvRun]:
    """A cold start; stopped (SIGKILL) once a checkpoint exists; then a cold start that restores it."""
    load0 = os.getloadavg()
    p, logs, ckpt = sv_launch(work, f"r{rnd}-cold")
    wait_mid_run(p, logs, ckpt)
    finish(p, logs, 0.01)  # SIGKILL: the supervisor, its agents and (by TMPDIR) the ranks
    cold = analyse_cold(f"r{rnd}-cold", logs, load0 + os.getloadavg())
    load0 = os.getloadavg()
    p, logs, _ = sv_launch(work, f"r{rnd}-cold-restore", ckpt=ckpt)
    rc, leaked = finish(p, logs, 240)
    warm = analyse_cold(f"r{rnd}-cold-restore", logs, load0 + os.getloadavg())
    warm.rc, warm.leaked = rc, leaked
    return cold, warm


# ---------------------------------------------------------------------------------------------
# plain torchrun


@dataclass
class TrRun:
    name: str
    kind: str
    variant: str
    rc: int | None = None
    cold_start: float | None = None
    detect: float | None = None  # fault -> the agent's "failed (exitcode" line
    total: float | None = None  # fault -> first resumed step
    waited: float = 0.0
    load: tuple = ()


def torchrun_run(work: Path, name: str, kind: str, *, pg_timeout: int | None, cap: float) -> TrRun:
    d = work / name
    d.mkdir(parents=True)
    logs, ckpt = d / "logs", d / "ckpt"
    base = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=1"]
    job = [*JOB, "--checkpoint-dir", str(ckpt), "--log-dir", str(logs)]
    if pg_timeout is None:
        cmd = [*base, str(TRAIN), *job]
    else:
        cmd = [*base, "--no-python", PY, "-c", PG_SHIM, str(pg_timeout), str(TRAIN), *job]
    variant = "defaults" if pg_timeout is None else f"pg timeout {pg_timeout}s"
    load0 = os.getloadavg()
    t_launch = time.time()
    p = start(cmd, env=job_env(d, f"kind={kind},rank=1,step={FAULT_STEP},attempt=0"), out=d / "output.txt", cwd=d)
    deadline = time.monotonic() + cap + 120
    t_fault = None
    while time.monotonic() < deadline and p.poll() is None:
        if t_fault is None:
            found = log_times([d / "output.txt"], "event=fault_injected")
            if found:
                t_fault = found[0]
                deadline = time.monotonic() + cap  # from the fault on: wait at most `cap` for a resumed step
        elif first_step_time(rank_records(logs), 1) is not None:
            time.sleep(0.2)
            break
        time.sleep(0.05)
    run = TrRun(name, kind, variant)
    run.rc = p.poll()
    stop_session(p)
    kill_strays(d)
    run.load = load0 + os.getloadavg()
    recs = rank_records(logs)
    run.cold_start = sub(first_step_time(recs, 0), t_launch)
    t_fault = t_fault or next(iter(log_times([d / "output.txt"], "event=fault_injected")), None)
    if t_fault is not None:
        # the agent acts on a failed worker: it stops the others ("closing signal") or reports the failure
        acted = [t for pat in ("closing signal", "failed (exitcode") for t in log_times([d / "output.txt"], pat)
                 if t >= t_fault - 0.5]
        run.detect = min(acted) - t_fault if acted else None
        run.total = sub(first_step_time(recs, 1), t_fault)
        run.waited = time.time() - t_fault
    return run


# ---------------------------------------------------------------------------------------------
# report


def f2(x: float | None, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def environment() -> list[str]:
    import torch

    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown"
    return [f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python {platform.python_version()}, "
            f"torch {torch.__version__}, gloo on CPU, `OMP_NUM_THREADS=1`"]


def build_report(args, sv: dict[str, list[SvRun]], colds: list[SvRun], warms: list[SvRun],
                 tr: dict[tuple[str, str], list[TrRun]], loads: list[float], started: str, wall: float) -> str:
    cold_nores = [r.cold_start for runs in sv.values() for r in runs] + [c.cold_start for c in colds]
    cold_res = [w.cold_start for w in warms]
    load_samples = [w.restore_load for w in warms] + [r.restore_load for runs in sv.values() for r in runs]
    # the baseline: median cold start (every run's attempt 0: many samples, robust to a load spike) plus the
    # median checkpoint load; the dedicated restore runs (cold_res) are its cross-check
    base = None if med(cold_nores) is None else med(cold_nores) + (med(load_samples) or 0.0)
    loads_txt = (f"1-min load average over the runs: min {min(loads):.2f}, median {statistics.median(loads):.2f}, "
                 f"max {max(loads):.2f}" if loads else "load average not recorded")
    L: list[str] = []
    L.append("# Detection and restart latency per fault kind, against plain torchrun")
    L.append("")
    L.append(f"Command: `python benchmarks/restart_latency.py --rounds {args.rounds} --faults {','.join(args.faults)}"
             f" --torchrun-slow-rounds {args.torchrun_slow_rounds} --stop-wait {args.stop_wait:.0f}` "
             f"({started}, {wall / 60:.1f} min).")
    L.append("")
    L.append("Environment: " + environment()[0] + ". The machine is shared and noisy (other test suites may run at "
             f"the same time): {loads_txt}, on {os.cpu_count()} cores. Every number below is a median over "
             f"{args.rounds} round(s) unless marked; ratios compare runs of this invocation only.")
    L.append("")
    summary_at = len(L)
    L.append("## Method")
    L.append("")
    L.append(
        f"The job is `examples/train.py {' '.join(JOB)}` (DDP, 2 ranks, gloo; a checkpoint every {EVERY} steps). "
        f"Under the supervisor: `supervisor launch --nnodes 2 {' '.join(SV_FLAGS)}` (node kill: `--slots 3`, a spare "
        f"replaces the lost node, world size stays 2). Faults fire on rank 1 at step {FAULT_STEP} in attempt 0 "
        "(`SUPERVISOR_FAULT=kind=K,rank=1,step=13,attempt=0`); the node kill is this script's `os.killpg(SIGKILL)` "
        "of node1's agent (pid from `supervisor-state.json`) and of its rank's process group (torchrun puts each "
        "worker in a session of its own, so the agent's group alone does not hold the rank) once step 12 is logged. "
        "**Fault time**: the rank's `event=fault_injected` log line (ms resolution), the killpg "
        "time (node), or, where a rank logs no such line, the end of step 12 plus the 0.05 s step sleep "
        "(an estimate, within ~10 ms). **Detected**: the controller's `fault_detected` event (wall clock). "
        "**First resumed step**: the latest, over ranks, of each rank's first step record of attempt 1 "
        "(`rank-R.jsonl`). **Phases** (wall clock): detect = fault -> `fault_detected`; teardown = "
        "`fault_detected` -> relaunch minus the controller's schedule time (includes the 0.6 s evidence wait: stack "
        "dumps are requested before anything is killed); schedule = the controller's; rendezvous = `launched` -> "
        "`running` (every rank's first heartbeat: process start, `import torch`, rendezvous, "
        "`init_process_group`); restore = `running` -> rank 0's `event=checkpoint_restored` (model build, DDP "
        "wrap, restore point, checkpoint load); first step = that -> first resumed step. "
        "**Baseline** (same run): a cold start of the same job under the supervisor (`launched` -> first step) "
        "on an empty checkpoint root, and a cold start on a root holding a step-10 checkpoint (the cold run is "
        "killed once it exists, then the job is launched again on the same root): *cold start + checkpoint load*. "
        "**Overhead** = total - detect - (median cold start + median checkpoint load): what a restart costs beyond "
        f"noticing the fault and starting the job again from its checkpoint (target <= {OVERHEAD_TARGET_S:.0f} s). "
        "*Paired* overhead uses the same run's own attempt-0 cold start plus its measured checkpoint load instead "
        "(seconds apart, so less exposed to the machine's load drifting between runs). "
        "**torchrun**: `torchrun --standalone --nproc-per-node 2 --max-restarts 1` with "
        "`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, the same job and fault (under torchrun the attempt is "
        "`TORCHELASTIC_RESTART_COUNT`, so `attempt=0` fires in its first run only; the job resumes from its "
        f"checkpoint dir by itself). Stop, hang and skip-collective with a {PG_TIMEOUT_S} s process-group timeout "
        "(a `python -c` shim passes `timeout=` to `init_process_group`), and stop with defaults, waiting at most "
        f"{args.stop_wait:.0f} s. torchrun's detection = its agent's first `Sending process ... closing signal` or "
        "`failed (exitcode ...)` log line after the fault (the agent acting on a failed worker)."
    )
    L.append("")
    L.append("## Baselines (measured in this run)")
    L.append("")
    L.append("| baseline | median s | min | max | n |")
    L.append("|---|---|---|---|---|")

    def brow(name, xs):
        xs = [x for x in xs if x is not None]
        if xs:
            L.append(f"| {name} | {f2(med(xs))} | {f2(min(xs))} | {f2(max(xs))} | {len(xs)} |")
        else:
            L.append(f"| {name} | — | — | — | 0 |")

    brow("supervisor cold start (`launched` -> first step, empty checkpoint root; every run's attempt 0)", cold_nores)
    brow("supervisor cold start + checkpoint load (`launched` -> first step, restoring step 10)", cold_res)
    brow("  of which rendezvous (`launched` -> `running`)", [w.phases.get("rendezvous") for w in warms])
    brow("  of which restore (`running` -> `checkpoint_restored`)", [w.phases.get("restore") for w in warms])
    brow("  of which first step", [w.phases.get("first_step") for w in warms])
    brow("checkpoint load alone (`restore_point_from_supervisor` -> `checkpoint_restored`, rank 0)", load_samples)
    brow("plain torchrun cold start (process start -> first step)",
         [t.cold_start for runs in tr.values() for t in runs])
    L.append("")
    L.append(f"Baseline used for the overhead: median cold start + median checkpoint load = **{f2(base)} s** "
             f"(the dedicated cold-start-with-restore runs, median {f2(med(cold_res))} s, are its cross-check; a "
             "median over every run's cold start is less exposed to one run caught in a load spike).")
    L.append("")
    L.append("## Restart latency per fault kind")
    L.append("")
    L.append("| fault | detector | detection s (target) | teardown | schedule | rendezvous | restore | first step "
             f"| total s | overhead beyond cold start + load (target <= {OVERHEAD_TARGET_S:.0f} s) "
             "| torchrun equivalent | ratio vs torchrun |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    totals: dict[str, tuple] = {}
    for kind in args.faults:
        runs = sv.get(kind, [])
        if not runs:
            continue
        det = med(r.detect for r in runs)
        if kind in ("kill", "node"):
            target, tgt_txt = None, "none: process exit"
        elif kind == "stop":
            target = HB_TIMEOUT + 1
            tgt_txt = f"<= {target:.1f}: heartbeat timeout + 1"
        else:
            target = med(r.hang_timeout for r in runs) + 1
            tgt_txt = f"<= {target:.1f}: hang timeout + 1"
        phases = {p: med(r.phases.get(p) for r in runs) for p in PHASES}
        total = med(r.total for r in runs)
        overheads = [None if (r.total is None or r.detect is None or base is None) else r.total - r.detect - base
                     for r in runs]
        ovh = med(overheads)
        paired = med(r.paired_overhead for r in runs)
        tr_kind = "kill" if kind == "node" else kind
        trk = tr.get((tr_kind, "kill" if tr_kind == "kill" else f"pg{PG_TIMEOUT_S}"), [])
        tr_total = med(t.total for t in trk)
        if kind == "node":
            tr_txt = ("no equivalent: a standalone torchrun that loses its node is gone; "
                      f"kill -9 of one rank restarts in {f2(tr_total)} s")
            ratio = "—"
        elif trk:
            what = "restart after kill -9" if kind == "kill" else f"{PG_TIMEOUT_S} s pg timeout"
            n_ok = sum(1 for t in trk if t.total is not None)
            tr_txt = (f"{f2(tr_total)} s ({what}; detect {f2(med(t.detect for t in trk))} s; n={len(trk)})"
                      if n_ok else f"not recovered within {max(t.waited for t in trk):.0f} s ({what})")
            ratio = f"{total / tr_total:.2f}" if total and tr_total else "—"
        else:
            tr_txt, ratio = "not measured", "—"
        det_ok = "—" if target is None or det is None else ("met" if det <= target else "MISSED")
        ovh_ok = "—" if ovh is None else ("met" if ovh <= OVERHEAD_TARGET_S else "MISSED")
        dets = "/".join(f2(r.detect) for r in runs)
        L.append(f"| {kind} | {DETECTOR[kind]} (`{runs[0].detector_kind or '?'}`) | {f2(det)} ({tgt_txt}; {det_ok}) "
                 f"| {' | '.join(f2(phases[p]) for p in PHASES[1:])} | {f2(total)} "
                 f"| {f2(ovh)} ({ovh_ok}; paired {f2(paired)}) "
                 f"| {tr_txt} | {ratio} |")
        dominant = max(((p, v) for p, v in phases.items() if v is not None), key=lambda pv: pv[1], default=(None, 0))
        verdicts.append((kind, det, target, det_ok, ovh, ovh_ok, dominant, dets, phases, paired))
        totals[kind] = (total, tr_total if kind != "node" else None, ratio)
    L.append("")
    L.append("Teardown, split by the controller's events (medians, s): *evidence* = `fault_detected` -> "
             "`evidence_saved` (stack dumps are requested from every rank first); *culprit* = -> `tear_down` "
             "(abort the named rank and wait for its node to exit, up to `abort_grace_s`, or SIGKILL a silent "
             "rank's node); *rest* = -> relaunch (SIGTERM the other nodes, SIGKILL after `teardown_grace_s` = 2 s).")
    L.append("")
    L.append("| fault | evidence | culprit | rest |")
    L.append("|---|---|---|---|")
    for kind in args.faults:
        runs = sv.get(kind, [])
        if runs:
            L.append(f"| {kind} | " + " | ".join(f2(med(r.teardown_parts.get(k) for r in runs))
                                                for k in ("evidence", "culprit", "rest")) + " |")
    L.append("")
    L.append("Each column is a median of its own, so the phases need not add up to the median total.")
    L.append("")
    L.append("Ratio = supervisor total / torchrun total (below 1: the supervisor resumes sooner). Per-round "
             "detection times: " + "; ".join(f"{v[0]} {v[7]} s" for v in verdicts) + ".")
    stop_def = tr.get(("stop", "defaults"), [])
    if stop_def:
        t = stop_def[0]
        L.append("")
        L.append("Plain torchrun with defaults and a SIGSTOPped rank: "
                 + (f"resumed {f2(t.total)} s after the fault." if t.total is not None else
                    f"**not detected within {t.waited:.0f} s** (measured; its process-group timeout is 30 min, "
                    "and it has no heartbeat). Hang and skip-collective rely on the same timeout (not measured "
                    "with defaults)."))
    L.append("")
    L.append("TEST-STACK reference (cited, not measured here): torchrun after kill -9 with "
             "`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` resumed in 3-4 s; a SIGSTOPped worker with a 30 s process-group "
             "timeout resumed after ~63 s (the agent's stop path waits a fixed 30 s after SIGTERM).")
    L.append("")
    L.append("## The controller's own numbers (`restart_complete` event)")
    L.append("")
    L.append("| run | `fault_detected.detection_s` | " + " | ".join(PHASES) + " | `total_s` | measured total "
             "(fault -> first resumed step) | event written after the first resumed step by |")
    L.append("|---|---|" + "---|" * len(PHASES) + "---|---|---|")
    for kind in args.faults:
        for r in sv.get(kind, []):
            ph = r.ctrl.get("phases", {})
            L.append(f"| {r.name} | {f2(r.ctrl.get('detection_s'))} | "
                     + " | ".join(f2(ph.get(p)) for p in PHASES)
                     + f" | {f2(r.ctrl.get('total_s'))} | {f2(r.total)} | {f2(r.ctrl.get('late_s'))} |")
    L.append("")
    L.append("## Every run")
    L.append("")
    L.append("| run | rc | fault time from | detect | " + " | ".join(PHASES[1:]) + " | total | paired overhead "
             "| cold start "
             "(attempt 0) | checkpoint load | rank processes alive 1 s after the supervisor exited "
             "| load avg before/after |")
    L.append("|---|---|---|---|" + "---|" * (len(PHASES) - 1) + "---|---|---|---|---|---|")
    for kind in args.faults:
        for r in sv.get(kind, []):
            L.append(f"| {r.name} | {r.rc} | {r.fault_source or '—'} | {f2(r.detect)} | "
                     + " | ".join(f2(r.phases.get(p)) for p in PHASES[1:])
                     + f" | {f2(r.total)} | {f2(r.paired_overhead)} | {f2(r.cold_start)} | {f2(r.restore_load, 3)} "
                     f"| {'—' if r.leaked is None else r.leaked} | {r.load[0]:.2f}/{r.load[3]:.2f} |")
    for c in colds + warms:
        L.append(f"| {c.name} | {'killed' if c.rc is None else c.rc} | — | — | — | — "
                 f"| {f2(c.phases.get('rendezvous'))} | "
                 f"{f2(c.phases.get('restore'))} | {f2(c.phases.get('first_step'))} | — | — | {f2(c.cold_start)} | "
                 f"{f2(c.restore_load, 3)} | {'— (killed)' if c.leaked is None else c.leaked} "
                 f"| {c.load[0]:.2f}/{c.load[3]:.2f} |")
    L.append("")
    L.append("| torchrun run | variant | rc | cold start | detect | total (fault -> first resumed step) | "
             "load avg before/after |")
    L.append("|---|---|---|---|---|---|---|")
    for runs in tr.values():
        for t in runs:
            total = f2(t.total) if t.total is not None else f"not resumed ({t.waited:.0f} s waited)"
            rc = "killed after resuming" if t.rc is None and t.total is not None else t.rc
            L.append(f"| {t.name} | {t.variant} | {rc} | {f2(t.cold_start)} | {f2(t.detect)} | {total} "
                     f"| {t.load[0]:.2f}/{t.load[3]:.2f} |")
    L.append("")
    L.append("## Reading: targets, misses and what dominates")
    L.append("")
    evidence_wait = min(1.0, HB_INTERVAL * 1.2)
    for kind, det, target, det_ok, ovh, ovh_ok, dominant, dets, phases, paired in verdicts:
        parts = []
        if target is not None:
            parts.append(f"detection {f2(det)} s against <= {target:.1f} s: {det_ok}")
        else:
            parts.append(f"detection {f2(det)} s (no timeout involved: the fault is a process exit, noticed when "
                         "the node's torchrun agent has exited)")
        parts.append(f"overhead {f2(ovh)} s (paired {f2(paired)} s) against <= {OVERHEAD_TARGET_S:.0f} s: {ovh_ok}")
        td, sc = phases.get("teardown"), phases.get("schedule")
        if td is not None and sc is not None:
            tp = {k: med(r.teardown_parts.get(k) for r in sv.get(kind, [])) for k in ("evidence", "culprit", "rest")}
            parts.append(f"the phases a cold start does not have, teardown + schedule, take {f2(td + sc)} s "
                         f"(evidence {f2(tp['evidence'])}, culprit {f2(tp['culprit'])}, rest {f2(tp['rest'])}; the "
                         f"evidence wait is a fixed {f2(evidence_wait, 1)} s)")
        startup = [phases.get(p) for p in ("rendezvous", "restore", "first_step")]
        if None not in startup and base is not None:
            parts.append(f"the relaunch itself (rendezvous + restore + first step) took {f2(sum(startup))} s against "
                         f"the baseline's {f2(base)} s")
        if dominant[0]:
            parts.append(f"largest phase: {dominant[0]} ({f2(dominant[1])} s)")
        L.append(f"* **{kind}**: " + "; ".join(parts) + ".")
    L.append("* Reading the teardown split: *rest* close to `teardown_grace_s` (2 s) means a surviving rank did not "
             "exit on SIGTERM (it is blocked in a collective with the dead or stopped peer; the SDK's SIGTERM handler "
             "only asks for a checkpoint at the next step boundary) and was SIGKILLed when the grace ran out; "
             "*culprit* of 1-2 s after an abort is the aborted rank's torchrun agent noticing its death and exiting "
             "(the controller waits for the node's agent, not for the rank). The same agent exit path is the "
             "detection time of `kill`: the agent logs the dead worker within ~0.3 s, then takes the rest to exit.")
    late = [r.ctrl.get("late_s") for runs in sv.values() for r in runs if r.ctrl.get("late_s") is not None]
    missing = [r.name for runs in sv.values() for r in runs if not r.ctrl.get("phases")]
    if late and max(late) > 0.5 or missing:
        L.append(
            f"* The controller's `restart_complete` event came {f2(med(late))} s "
            f"(median; max {f2(max(late or [0]))} s) "
            "after the first resumed step was logged"
            + (f", and was never written in {', '.join(missing)}" if missing else "")
            + ": its `restore` mark waits until every rank's heartbeat shows a phase other than `init`/`restore`, "
            "but between phase scopes a rank reports `init` again (`RankState.phase_scope` restores the previous "
            "phase, which is `init` for the whole run), so with 0.5 s heartbeats and a step spent mostly in its "
            "sleep the mark lands late. That is why this table measures restore and first step from the rank logs; "
            "the controller's `restore` column overstates and its `total_s` is late by the same amount.")
    leaks = {r.name: r.leaked for runs in sv.values() for r in runs if r.leaked}
    if leaks:
        L.append(
            "* Rank processes left behind: " + ", ".join(f"{k}: {v}" for k, v in leaks.items())
            + " still alive a second after the supervisor had exited (this script then killed them, found by "
            "their TMPDIR). torchrun starts every worker in a session of its own, so the local platform's "
            "`killpg(agent)` in `kill_node`/`teardown` never reaches the ranks: a SIGSTOPped rank stays stopped "
            "forever, and a peer blocked in a collective outlives its agent (it ignores SIGTERM until the "
            "collective returns, and the agent is SIGKILLed after the teardown grace).")
    kills = sv.get("kill", [])
    if kills and med(r.detect for r in kills):
        L.append(f"* kill: the controller reports `detection_s` 0 (its fault time is when it saw the agent exit), but "
                 f"the agent exits {f2(med(r.detect for r in kills))} s after the SIGKILL (it logs the dead worker "
                 "within its 0.2 s monitor interval; the rest is its exit path).")
    L.append("")
    # a summary at the top, from the same numbers
    S = ["## Summary", ""]
    timed = [v for v in verdicts if v[2] is not None]
    if timed:
        S.append("* **Detection** of a silent or hung rank: " + "; ".join(
            f"{v[0]} {f2(v[1])} s (target <= {v[2]:.1f} s: {v[3]})" for v in timed)
            + ". Process exits: " + "; ".join(f"{v[0]} {f2(v[1])} s" for v in verdicts if v[2] is None) + ".")
    S.append(f"* **Restart overhead** beyond a cold start plus the checkpoint load ({f2(base)} s), target <= "
             f"{OVERHEAD_TARGET_S:.0f} s: " + "; ".join(
                 f"{v[0]} {f2(v[4])} s (paired {f2(v[9])} s: {v[5]})" for v in verdicts)
             + ". The part a cold start does not have (teardown + schedule): " + "; ".join(
                 f"{v[0]} {f2((v[8].get('teardown') or 0) + (v[8].get('schedule') or 0))} s" for v in verdicts) + ".")
    cmp = [f"{k} {f2(t)} s vs {f2(tt)} s ({r}x)" for k, (t, tt, r) in totals.items() if tt is not None]
    if cmp:
        S.append("* **Against plain torchrun** (fault -> first resumed step, supervisor vs torchrun): " + "; ".join(cmp)
                 + f" (kill: torchrun's own restart; the others: torchrun with a {PG_TIMEOUT_S} s process-group "
                 "timeout).")
    if stop_def:
        t = stop_def[0]
        S.append("* torchrun with defaults " + (f"resumed {f2(t.total)} s after a SIGSTOP." if t.total is not None else
                                               f"did not notice a SIGSTOPped rank within {t.waited:.0f} s."))
    S.append("")
    L[summary_at:summary_at] = S
    return "\n".join(L)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "restart_latency.md")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated: " + ",".join(FAULTS))
    p.add_argument("--torchrun-slow-rounds", type=int, default=1,
                   help="rounds of the slow torchrun runs (30 s pg timeout ~70 s each, the capped default stop)")
    p.add_argument("--stop-wait", type=float, default=90.0,
                   help="cap on waiting for torchrun (defaults) to notice a stop")
    p.add_argument("--no-torchrun", action="store_true", help="skip every plain torchrun run")
    p.add_argument("--work", type=Path, help="keep every run's files here (default: a temp dir, removed)")
    p.add_argument("--from-results", type=Path, metavar="RESULTS.json",
                   help="rebuild the report from a kept work dir's results.json (runs nothing)")
    args = p.parse_args()
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    bad = set(args.faults) - set(FAULTS)
    if bad:
        p.error(f"unknown faults {sorted(bad)}")
    if args.from_results:
        saved = json.loads(args.from_results.read_text())
        for k in ("rounds", "faults", "torchrun_slow_rounds", "stop_wait"):
            setattr(args, k, saved["args"][k])
        sv = {k: [SvRun(**r) for r in v] for k, v in saved["sv"].items()}
        tr = {tuple(k.split("|")): [TrRun(**t) for t in v] for k, v in saved["tr"].items()}
        report = build_report(args, sv, [SvRun(**r) for r in saved["colds"]], [SvRun(**r) for r in saved["warms"]],
                              tr, saved["loads"], saved["started"], saved["wall"])
        print(report)
        args.out.write_text(report)
        return 0
    atexit.register(cleanup)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    global WORK
    work = args.work or Path(tempfile.mkdtemp(prefix="restart-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    WORK = work
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    t0 = time.monotonic()
    loads: list[float] = []
    sv: dict[str, list[SvRun]] = {}
    colds: list[SvRun] = []
    warms: list[SvRun] = []
    tr: dict[tuple[str, str], list[TrRun]] = {}

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.0f}s] {msg}", flush=True)

    try:
        for rnd in range(1, args.rounds + 1):
            say(f"round {rnd}: cold start, then cold start + checkpoint load")
            cold, warm = sv_cold_runs(work, rnd)
            colds.append(cold)
            warms.append(warm)
            loads += [cold.load[0], warm.load[0]]
            say(f"  cold {f2(cold.cold_start)} s, cold + load {f2(warm.cold_start)} s "
                f"(load {f2(warm.restore_load, 3)} s)")
            for kind in args.faults:
                r = sv_fault_run(work, f"r{rnd}-{kind}", kind)
                sv.setdefault(kind, []).append(r)
                loads.append(r.load[0])
                say(f"  {kind}: rc {r.rc}, detector {r.detector_kind}, detect {f2(r.detect)} s, total {f2(r.total)} s, "
                    f"phases {', '.join(f'{k} {f2(v)}' for k, v in r.phases.items())}")
            if args.no_torchrun:
                continue
            t = torchrun_run(work, f"r{rnd}-torchrun-kill", "kill", pg_timeout=None, cap=60)
            tr.setdefault(("kill", "kill"), []).append(t)
            loads.append(t.load[0])
            say(f"  torchrun kill: cold {f2(t.cold_start)} s, detect {f2(t.detect)} s, total {f2(t.total)} s")
            if rnd <= args.torchrun_slow_rounds:
                for kind in ("stop", "hang", "skip-collective"):
                    if kind not in args.faults:
                        continue
                    t = torchrun_run(work, f"r{rnd}-torchrun-{kind}-pg{PG_TIMEOUT_S}", kind, pg_timeout=PG_TIMEOUT_S,
                                     cap=150)
                    tr.setdefault((kind, f"pg{PG_TIMEOUT_S}"), []).append(t)
                    loads.append(t.load[0])
                    say(f"  torchrun {kind} (pg timeout {PG_TIMEOUT_S}s): detect {f2(t.detect)} s, "
                        f"total {f2(t.total)} s")
                if "stop" in args.faults and rnd == 1:
                    t = torchrun_run(work, f"r{rnd}-torchrun-stop-defaults", "stop", pg_timeout=None,
                                     cap=args.stop_wait)
                    tr.setdefault(("stop", "defaults"), []).append(t)
                    loads.append(t.load[0])
                    say(f"  torchrun stop (defaults): total {f2(t.total)} s (waited {t.waited:.0f} s)")
    finally:
        cleanup()
    wall = time.monotonic() - t0
    (work / "results.json").write_text(json.dumps({
        "args": {"rounds": args.rounds, "faults": args.faults, "torchrun_slow_rounds": args.torchrun_slow_rounds,
                 "stop_wait": args.stop_wait},
        "sv": {k: [asdict(r) for r in v] for k, v in sv.items()}, "colds": [asdict(r) for r in colds],
        "warms": [asdict(r) for r in warms], "tr": {"|".join(k): [asdict(t) for t in v] for k, v in tr.items()},
        "loads": loads, "started": started, "wall": wall}, indent=1))
    publish(build_report(args, sv, colds, warms, tr, loads, started, wall), args.out, work, bool(args.work),
            "every run's files and results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
