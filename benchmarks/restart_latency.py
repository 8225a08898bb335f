"""Detection and restart latency per fault kind, side by side with plain torchrun.

One command; every number comes from real runs of ``examples/train.py`` (2 ranks, DDP over
gloo, CPU) made in this invocation, on this machine:

* **baselines**: a cold start of the job under the supervisor (``launched`` -> first step)
  and a cold start that restores a checkpoint (the same job started again on a checkpoint
  root that holds a step-10 checkpoint), plus plain torchrun's cold start;
* **faults under the supervisor** (``supervisor launch --nnodes 2``, heartbeat every 0.5 s,
  heartbeat timeout 3 s, hang-timeout floor 3 s): ``kill`` (SIGKILL of rank 1 mid-step),
  ``stop`` (SIGSTOP), ``hang`` (blocks in compute), ``skip-collective`` (skips its gradient
  all-reduce) at step FAULT_STEP (270) through ``SUPERVISOR_FAULT`` (attempt 0 only), and ``node`` (this
  script SIGKILLs node1's agent and its rank, each in its own process group, once step 269 is
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

* **cold starts, like for like** (``--cold-rounds``): the job under the supervisor and under plain
  torchrun in the same shape, (a) one node/agent with 2 ranks and (b) two nodes/agents with one
  rank each (c10d rendezvous, the supervisor's rendezvous conf), process start -> first step,
  split into phases from the agents' and ranks' log lines.

Usage: python benchmarks/restart_latency.py [--rounds 2] [--out docs/benchmarks/restart_latency.md]
       [--faults kill,stop,hang,skip-collective,node] [--torchrun-slow-rounds 1] [--stop-wait 90]
       [--cold-rounds 3] [--no-bytecode-warm]
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
from supervisor.protocol import RESTART_PHASES, ranklog  # noqa: E402

PY = sys.executable
TRAIN = REPO / "examples" / "train.py"
STEPS, EVERY, SLEEP, FAULT_STEP = 300, 5, 0.05, 270
"""The fault fires ~20 s into the training (not at its start): by then the controller has its warm
agents standing by (``STANDBY_AFTER_S`` after the gang runs, then their imports), as it has for
any fault of a job that has run a while; the "agents standing by" column says when they started."""
JOB = ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--step-sleep", str(SLEEP)]
HB_INTERVAL, HB_TIMEOUT, HANG_FLOOR, PHASE_FACTOR = 0.5, 3.0, 3.0, 5.0
SV_FLAGS = ["--heartbeat-interval", str(HB_INTERVAL), "--heartbeat-timeout", str(HB_TIMEOUT),
            "--hang-timeout-floor", str(HANG_FLOOR)]
PG_TIMEOUT_S = 30
IN_PLACE = "-in-place"
"""A fault's name with this suffix: the same fault under ``--in-place-restarts 2`` (rung 0: the
agents restart the ranks in place; nothing is launched)."""
ONE_NODE = "-1x2"
"""A fault's name with this suffix: the job runs as 1 node x 2 ranks (``--nnodes 1
--nproc-per-node 2``), the shape of the plain torchrun baseline (``--standalone
--nproc-per-node 2``), instead of 2 nodes x 1 rank: like for like with torchrun's own restart."""
NO_SPARE = "node-nospare"
"""node1 is killed as in ``node``, but there is no spare slot: the job goes on with one node
(``--nnodes 1:2``), a smaller world, resumed from the same checkpoint."""
FAULTS = ("kill", "stop", "hang", "skip-collective", "node", NO_SPARE, "nan", "kill" + IN_PLACE, "hang" + IN_PLACE,
          "skip-collective" + IN_PLACE, "kill" + IN_PLACE + ONE_NODE)
NO_TORCHRUN_RUN = ("node", NO_SPARE, "nan")
"""Faults with no torchrun run of their own: a standalone torchrun that loses its node is gone,
and it has no notion of a non-finite loss; each is held to the issue's bar instead, its detection
plus torchrun's own restart after kill -9."""
DETECTOR = {
    "kill": "agent exit (process)", "node": "node agent gone (process)", "stop": "heartbeat timeout",
    NO_SPARE: "node agent gone (process)", "nan": "ranks stop on an agreed non-finite loss (exit code)",
    "hang": "phase timeout (compute)", "skip-collective": "collective wait timeout",
    "kill" + IN_PLACE: "rank process gone under its agent", "hang" + IN_PLACE: "phase timeout (compute)",
    "skip-collective" + IN_PLACE: "collective wait timeout",
    "kill" + IN_PLACE + ONE_NODE: "rank process gone under its agent",
}


def base_kind(kind: str) -> str:
    """The injected fault of a benchmark fault name (``kill-in-place`` -> ``kill``)."""
    return kind.removesuffix(ONE_NODE).removesuffix(IN_PLACE)


def in_place(kind: str) -> bool:
    return kind.removesuffix(ONE_NODE).endswith(IN_PLACE)
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


_PYCACHES: list[Path] = []


def warm_bytecode() -> None:
    """Compile this checkout's sources once, as an installed package has them. Processes read the
    ``.pyc`` files even under ``PYTHONDONTWRITEBYTECODE=1``; without them such an environment
    recompiles the supervisor's and the SDK's modules from source in every process it starts
    (~0.1-0.2 s each here). The ``__pycache__`` folders this creates are removed at the end."""
    dirs = [p.parent for pkg in ("supervisor", "examples") for p in (REPO / pkg).rglob("*.py")]
    _PYCACHES.extend(sorted({d / "__pycache__" for d in dirs if not (d / "__pycache__").exists()}))
    subprocess.run([PY, "-m", "compileall", "-q", str(REPO / "supervisor"), str(REPO / "examples")],
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                   check=False, stdout=subprocess.DEVNULL)


def drop_bytecode() -> None:
    for d in _PYCACHES:
        shutil.rmtree(d, ignore_errors=True)


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
    return [r for recs in ranklog.read_logs(rank_dir).values() for r in recs]


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
    standby: float | None = None  # when the warm agents were started to stand by, relative to the fault


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


def sv_launch(work: Path, name: str, *, fault: str | None = None, slots: int = 2, ckpt: Path | None = None,
              extra: tuple[str, ...] = (), nnodes: int = 2, nnodes_min: int | None = None):
    d = work / name
    d.mkdir(parents=True)
    logs, ckpt = d / "logs", ckpt or d / "ckpt"
    span = str(nnodes) if nnodes_min is None else f"{nnodes_min}:{nnodes}"
    cmd = [PY, "-m", "supervisor", "launch", "--nnodes", span, "--slots", str(max(slots, nnodes)), "--checkpoint-dir", str(ckpt),
           "--log-dir", str(logs), *SV_FLAGS, *launch_extra(), *extra, "--", PY, str(TRAIN), *JOB]
    _LOG_DIRS.append(logs)
    p = start(cmd, env=job_env(d, fault), out=d / "supervisor-output.txt", cwd=d)
    return p, logs, ckpt


def wait_mid_run(p: "subprocess.Popen | Callable[[], bool]", logs: Path, ckpt: Path, timeout: float = 180) -> bool:
    """Until step FAULT_STEP-1 is logged by rank 0 and a complete checkpoint exists, or the run
    ended (``p`` exited, or ``p()`` says so)."""
    ended = p if callable(p) else (lambda: p.poll() is not None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not ended():
        recs = ranklog.read_log(logs / ranklog.RANKS_DIR / ranklog.log_name(0))
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
    run.standby = sub(et(event(events, "agents_standing_by", attempt=0)), run.t_fault)
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
    # restarted in place, attempt 1's ranks write to attempt 0's agent logs: only what follows the fault
    ranks_out = sorted((agents / ("attempt-0" if in_place(kind) else "attempt-1")).glob("*.log"))
    after = run.t_fault or 0.0
    restored = [t for t in log_times(ranks_out, "event=checkpoint_restored") if t > after]
    hint = [t for t in log_times(ranks_out, "event=restore_point_from_supervisor") if t > after]
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
    t_down = et(event(events, "action", action="tear_down") or event(events, "action", action="restart_in_place"))
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
    if kind in ("node", NO_SPARE):
        p, logs, ckpt = sv_launch(work, name, slots=3) if kind == "node" else sv_launch(work, name, nnodes_min=1)
        t_fault = None
        if wait_mid_run(p, logs, ckpt):
            t_fault = signal_node(logs, "node1", signal.SIGKILL)
        rc, leaked = finish(p, logs, 240)
        run = analyse_fault(name, kind, logs, t_fault, rc, load0 + os.getloadavg())
        run.leaked = leaked
        return run
    spec = f"kind={base_kind(kind)},rank=1,step={FAULT_STEP},attempt=0"
    extra = ("--in-place-restarts", "2") if in_place(kind) else ()
    p, logs, _ = sv_launch(work, name, fault=spec, nnodes=1 if kind.endswith(ONE_NODE) else 2,
                           extra=extra + (("--nproc-per-node", "2") if kind.endswith(ONE_NODE) else ()))
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
# like-for-like cold starts: the same gang shape under the supervisor and under plain torchrun

# One rank-side probe, the same in every shape: it times `import torch` and the worker SDK's
# imports (the ones examples/train.py makes, checkpoint manager included), then runs the script.
PROBE_SHIM = (
    "import os, runpy, sys, time\n"
    "_t0 = time.time()\n"
    "import torch, torch.distributed, torch.nn\n"
    "_t1 = time.time()\n"
    "import supervisor.worker, supervisor.checkpoint.manager\n"
    "_t2 = time.time()\n"
    "print(f\"cold_probe rank={os.environ.get('RANK', '0')} start={_t0:.6f} torch={_t1:.6f} sdk={_t2:.6f}\", "
    "file=sys.stderr, flush=True)\n"
    "path = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(path, run_name='__main__')\n"
)
PROBE_LINE = re.compile(r"cold_probe rank=(\d+) start=([\d.]+) torch=([\d.]+) sdk=([\d.]+)")
COLD_SHAPES = {
    "sv-1x2": "supervisor, 1 node x 2 ranks (`supervisor launch --nnodes 1 --nproc-per-node 2`)",
    "tr-1x2": "plain torchrun, 1 agent x 2 ranks (`torchrun --standalone --nproc-per-node 2`)",
    "sv-2x1": "supervisor, 2 nodes x 1 rank (`supervisor launch --nnodes 2`: two agents, c10d rendezvous)",
    "tr-2x1": "plain torchrun, 2 agents x 1 rank (two `torchrun --nnodes 2 --rdzv-backend c10d` processes)",
}
# the cold-start phases, each from the latest of its marks over agents/ranks (the gang waits for the slowest)
COLD_PHASES = (
    ("launcher", "launcher start -> agents spawned (supervisor: the controller's start-up, to `launched`)"),
    ("agent_import", "agent spawned -> agent ready (`import torch.distributed.run`; `Starting elastic_operator`)"),
    ("rendezvous", "agent ready -> rendezvous complete"),
    ("spawn", "rendezvous complete -> rank interpreter up"),
    ("import_torch", "`import torch`"),
    ("import_sdk", "the worker SDK's imports (incl. `torch.distributed.checkpoint`)"),
    ("init", "script start -> `worker_started` (args, `init_process_group`, `Worker.start`)"),
    ("first_step", "`worker_started` -> first step (model, DDP, restore point + checkpoint scan, step 1)"),
)


@dataclass
class ColdRun:
    name: str
    shape: str
    total: float | None = None  # launcher process start -> first step (every rank)
    from_launched: float | None = None  # supervisor: `launched` -> first step (the long-standing baseline)
    phases: dict = field(default_factory=dict)
    load: tuple = ()
    note: str = ""
    cpu: dict = field(default_factory=dict)  # role -> CPU seconds (user + system) by the first step


AGENT_MODULES = (b"torch.distributed.run", b"supervisor.platforms.node.forking_agent", b"supervisor.platforms.node.warm_agent")


def cpu_by_role(roots: list[int]) -> dict[str, float]:
    """CPU seconds used so far by the launcher (supervisor controller or torchrun agent), every other
    torchrun agent, and the ranks, found under ``roots`` (their sessions) and by parentage."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = set(roots)
    for r in roots:
        pids.update(descendants(r))
    out: dict[str, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/comm", "rb") as f:
                comm = f.read().strip()
        except OSError:
            continue
        # a forked rank keeps its agent's command line; its process name says "rankN"
        role = ("ranks" if comm.startswith(b"rank") or any(a.startswith(b"import os, runpy") for a in argv)
                else "agents" if any(a in AGENT_MODULES for a in argv[:3])
                else "controller" if b"supervisor" in argv[:3] else "other")
        # utime, stime, and the children's reaped (preflight probe, helpers)
        out[role] = out.get(role, 0.0) + sum(int(x) for x in fields[11:15]) / tick
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent_rdzv_conf() -> str:
    """The ``--rdzv-conf`` the supervisor's agents get (supervisor/platforms/node/agent.py), is_host left to torch."""
    from supervisor.platforms.node.agent import torchrun_argv
    from supervisor.platforms.base import LaunchSpec

    spec = LaunchSpec(attempt=0, nodes=["n"], nnodes_min=2, nnodes_max=2, nproc_per_node=1, command=["x"], env={},
                      rdzv_endpoint="127.0.0.1:1", rdzv_id="x")
    return next(a.split("=", 1)[1] for a in torchrun_argv(PY, spec) if a.startswith("--rdzv-conf="))


def cold_shape_run(work: Path, name: str, shape: str, timeout: float = 180) -> ColdRun:
    """One cold start of ``shape`` (a COLD_SHAPES key), killed once every rank has logged step 1."""
    d = work / name
    d.mkdir(parents=True)
    logs, ckpt = d / "logs", d / "ckpt"
    env = job_env(d) | {"LOGLEVEL": "INFO"}  # the agents log their start, rendezvous and worker spawn (glog lines)
    nnodes, nproc = (1, 2) if shape.endswith("1x2") else (2, 1)
    job = [PY, "-c", PROBE_SHIM, str(TRAIN), *JOB]
    load0 = os.getloadavg()
    procs: list[subprocess.Popen] = []
    t0 = time.time()
    if shape.startswith("sv"):
        cmd = [PY, "-m", "supervisor", "launch", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
               "--checkpoint-dir", str(ckpt), "--log-dir", str(logs), *SV_FLAGS, *launch_extra(), "--", *job]
        _LOG_DIRS.append(logs)
        procs.append(start(cmd, env=env, out=d / "supervisor-output.txt", cwd=d))
        rank_dir, outs = logs / "ranks", lambda: sorted((logs / "attempt-0").glob("*.log"))
    else:
        train_args = ["--checkpoint-dir", str(ckpt), "--log-dir", str(logs)]
        if shape == "tr-1x2":
            cmds = [[PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--no-python", *job,
                     *train_args]]
        else:
            rdzv = [f"--rdzv-endpoint=127.0.0.1:{_free_port()}", f"--rdzv-id={name}", f"--rdzv-conf={_agent_rdzv_conf()}"]
            cmds = [[PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                     *rdzv, "--no-python", *job, *train_args]] * 2
        for i, cmd in enumerate(cmds):
            procs.append(start(cmd, env=env, out=d / f"output-{i}.txt", cwd=d))
        rank_dir, outs = logs, lambda: sorted(d.glob("output-*.txt"))
    world = nnodes * nproc
    deadline = time.monotonic() + timeout
    recs: list[dict] = []
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        recs = rank_records(rank_dir)
        if len({r["rank"] for r in recs if r.get("attempt") == 0}) >= world:
            break
        time.sleep(0.05)
    cpu = cpu_by_role([p.pid for p in procs])  # before anything is killed: CPU seconds spent by the first step
    for p in procs:
        stop_session(p)
    if shape.startswith("sv"):
        kill_agents(logs)
    kill_strays(d)
    run = ColdRun(name, shape, load=load0 + os.getloadavg(), cpu=cpu)
    recs = rank_records(rank_dir)
    t_first = first_step_time(recs, 0)
    if t_first is None or len({r["rank"] for r in recs if r.get("attempt") == 0}) < world:
        run.note = "no first step on every rank"
        return run
    run.total = t_first - t0
    paths = outs()
    t_spawned = t0
    if shape.startswith("sv"):
        t_spawned = et(event(read_jsonl(logs / "events.jsonl"), "launched", attempt=0))
        run.from_launched = sub(t_first, t_spawned)
    ready = log_times(paths, "Starting elastic_operator")
    rdzv = log_times(paths, "Rendezvous complete for workers")
    started = log_times(paths, "event=worker_started")
    probes: dict[int, tuple[float, float, float]] = {}
    for p in paths:
        for m in PROBE_LINE.finditer(p.read_text(errors="replace")):
            probes[int(m.group(1))] = (float(m.group(2)), float(m.group(3)), float(m.group(4)))
    t_ready = ready[-1] if len(ready) >= nnodes else None
    t_rdzv = rdzv[-1] if len(rdzv) >= nnodes else None
    up, torch_done, sdk_done = (max(v[i] for v in probes.values()) if len(probes) >= world else None
                                for i in range(3))
    t_started = started[-1] if len(started) >= world else None
    marks = [t0, t_spawned, t_ready, t_rdzv, up, torch_done, sdk_done, t_started, t_first]
    run.phases = {key: sub(b, a) for (key, _), a, b in zip(COLD_PHASES, marks, marks[1:])}
    return run


def cold_rows(runs: list[ColdRun]) -> dict[str, dict]:
    """Per shape: medians of the total, of `launched` -> first step, and of each phase."""
    out = {}
    for shape in COLD_SHAPES:
        rs = [r for r in runs if r.shape == shape]
        if rs:
            out[shape] = {"n": sum(r.total is not None for r in rs), "total": med(r.total for r in rs),
                          "min": min((r.total for r in rs if r.total is not None), default=None),
                          "max": max((r.total for r in rs if r.total is not None), default=None),
                          "from_launched": med(r.from_launched for r in rs),
                          "phases": {k: med(r.phases.get(k) for r in rs) for k, _ in COLD_PHASES}}
    return out


def cold_pairs(runs: list[ColdRun], a: str, b: str) -> list[tuple[float | None, float | None]]:
    """(a's total, b's total) of each round that ran both: the shapes run back to back in a round."""
    by = {(r.name.split("-cold-")[0], r.shape): r.total for r in runs}
    return [(by[(rnd, a)], by.get((rnd, b))) for rnd, shape in by if shape == a and (rnd, b) in by]


def sub_ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or not y else x / y


def cold_section(runs: list[ColdRun], like: dict[str, dict]) -> list[str]:
    shapes = [s for s in COLD_SHAPES if s in like]
    L = ["## Cold start, like for like: where it goes", ""]
    L.append(
        "Each round starts the same job (`examples/train.py`, empty checkpoint root) in four shapes back to back, "
        "each stopped once every rank has logged step 1: " + "; ".join(f"**{s}** = {COLD_SHAPES[s]}" for s in shapes)
        + ". Plain torchrun's two agents get the rendezvous the supervisor's agents get "
        f"(`--rdzv-conf={_agent_rdzv_conf()}`, c10d, `--nnodes 2`) but torchrun's own defaults otherwise; the "
        "supervisor's agents also have `--monitor-interval=0.2 --tee=3 --max-restarts=0`. The command is the "
        "same in every shape: a `python -c` probe that times `import torch` and the SDK's imports, then runs the "
        "script. `LOGLEVEL=INFO` makes each agent log when it is up (`Starting elastic_operator`) and when its "
        "rendezvous completes. Each phase ends at the latest of its marks over agents or ranks (the gang waits "
        "for the slowest), so the phases add up to the total. CPU = user + system seconds spent by the first "
        "step, by role.")
    L.append("")
    L.append("| phase (median s) | " + " | ".join(shapes) + " |")
    L.append("|---|" + "---|" * len(shapes))
    for key, label in COLD_PHASES:
        L.append(f"| {label} | " + " | ".join(f2(like[s]['phases'].get(key)) for s in shapes) + " |")
    L.append("| **process start -> first step** | " + " | ".join(f"**{f2(like[s]['total'])}**" for s in shapes) + " |")
    L.append("| `launched` -> first step (the supervisor's usual cold-start number) | "
             + " | ".join(f2(like[s]['from_launched']) for s in shapes) + " |")
    for role in ("controller", "agents", "ranks"):
        L.append(f"| CPU s, {role} | " + " | ".join(
            f2(med(r.cpu.get(role, 0.0) for r in runs if r.shape == s and r.total is not None)) for s in shapes) + " |")
    L.append("| runs | " + " | ".join(str(like[s]["n"]) for s in shapes) + " |")
    L.append("")
    L.append("| cold run | total | " + " | ".join(k for k, _ in COLD_PHASES) + " | CPU controller/agents/ranks "
             "| load avg before/after |")
    L.append("|---|---|" + "---|" * len(COLD_PHASES) + "---|---|")
    for r in runs:
        L.append(f"| {r.name} | {f2(r.total)}{' (' + r.note + ')' if r.note else ''} | "
                 + " | ".join(f2(r.phases.get(k)) for k, _ in COLD_PHASES)
                 + f" | {'/'.join(f2(r.cpu.get(x, 0.0)) for x in ('controller', 'agents', 'ranks'))} "
                 f"| {r.load[0]:.2f}/{r.load[3]:.2f} |")
    L.append("")
    g = lambda s, k: like.get(s, {}).get("phases", {}).get(k)  # noqa: E731
    L.append("Reading:")
    L.append("")
    L.append(f"* **The supervisor's own cost is its controller's start-up**, before any agent exists: "
             f"{f2(g('sv-1x2', 'launcher'))} s (1 node) / {f2(g('sv-2x1', 'launcher'))} s (2 nodes) from "
             "`python -m supervisor launch` to `launched` (Python, importing the controller, aiohttp and "
             "prometheus_client, the token, binding the heartbeat and HTTP ports, the preflight, the state file). "
             "It is not in the `launched` -> first step number, which is why that one looked closer to torchrun "
             "than the whole command is. After that the controller costs "
             f"{f2(med(r.cpu.get('controller') for r in runs if r.shape == 'sv-2x1'))} s of CPU in all (start-up "
             "included) by the first step; the ranks' supervised extras (heartbeat thread, rank 0's restore-point "
             "GET, ~10 ms) do not show against the noise.")
    L.append(f"* **The rest is the gang's shape, and plain torchrun pays it too**: two agents instead of one import "
             f"torch side by side on 2 cores (agent start-up {f2(g('tr-2x1', 'agent_import'))} s vs "
             f"{f2(g('tr-1x2', 'agent_import'))} s under plain torchrun), and torch's c10d rendezvous between two "
             f"agents takes {f2(g('tr-2x1', 'rendezvous'))} s against {f2(g('tr-1x2', 'rendezvous'))} s for one: "
             "the agent that joins first polls the store once a second (`_delay(seconds=1)` in "
             "`DynamicRendezvousHandler`'s join loop) after a random 0-0.3 s first-round delay. That, not the "
             "supervisor, is most of the gap between the old baselines (a 2-agent supervisor job against a "
             "1-agent standalone torchrun).")
    L.append("* Cut here: the preflight asks this interpreter (`importlib.util.find_spec`) instead of starting "
             "another Python when the job's interpreter is the controller's own with the same search path (one "
             "Python start-up, ~50 ms idle and several times that on a loaded host, off the serial path before "
             "the agents start); the worker SDK no longer imports the checkpoint manager "
             "(`torch.distributed.checkpoint`, ~1 s) nor tenacity at import time (a script that checkpoints "
             "through `CheckpointManager` still pays it, when it imports it; this job does); and this benchmark "
             "compiles the checkout once before it measures (an environment with `PYTHONDONTWRITEBYTECODE=1` "
             "otherwise recompiles the supervisor's modules in every process: ~0.1-0.2 s of the controller's "
             "start-up, which no installed package pays).")
    L.append("* Not cut here (code other engineers are changing now): (1) the local platform's `observe()` scans "
             "all of `/proc` for every node at every 0.2 s controller tick (`procfs.descendants`, and in the "
             "working tree measured here a second scan for the agent's direct children): ~2 ms a scan idle, ~10 ms "
             "on this loaded host, so 20 scans a second with 2 nodes are most of the controller's CPU above after "
             "its start-up, taken from ranks importing torch on 2 cores; one scan per tick shared by every node, "
             "read with `os.open`/`os.read` (2.4x cheaper than text `open()`), makes it ~1 ms a tick. (2) The "
             "controller imports aiohttp and prometheus_client and starts its HTTP server before it launches the "
             "agents (`daemon.py`, `_run_locked`); binding the HTTP socket first (its port goes into the ranks' "
             "environment), launching, then serving on that socket (`web.SockSite`) takes that import, ~0.1-0.2 s, "
             "off the serial path: no rank asks the API before it has imported torch.")
    L.append("")
    return L


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
                 tr: dict[tuple[str, str], list[TrRun]], loads: list[float], started: str, wall: float,
                 cold_runs: list[ColdRun] = ()) -> str:
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
             f" --torchrun-slow-rounds {args.torchrun_slow_rounds} --stop-wait {args.stop_wait:.0f}"
             f" --cold-rounds {getattr(args, 'cold_rounds', 0)}"
             f"{' --no-bytecode-warm' if getattr(args, 'no_bytecode_warm', False) else ''}` "
             f"({started}, {wall / 60:.1f} min).")
    L.append("")
    L.append("Environment: " + environment()[0] + ". The machine is shared and noisy (other test suites may run at "
             f"the same time): {loads_txt}, on {os.cpu_count()} cores. Every number below is a median over "
             f"{args.rounds} round(s) unless marked; ratios compare runs of this invocation only. "
             + ("The checkout's sources were compiled to bytecode once before the runs (as an installed package "
                "is), so that no process recompiles them under `PYTHONDONTWRITEBYTECODE=1`."
                if not getattr(args, "no_bytecode_warm", False) else "The checkout was not compiled first."))
    L.append("")
    summary_at = len(L)
    L.append("## Method")
    L.append("")
    L.append(
        f"The job is `examples/train.py {' '.join(JOB)}` (DDP, 2 ranks, gloo; a checkpoint every {EVERY} steps). "
        f"Under the supervisor: `supervisor launch --nnodes 2 {' '.join(SV_FLAGS)}` (node kill: `--slots 3`, a spare "
        f"replaces the lost node, world size stays 2; `-in-place`: `--in-place-restarts 2`, the agents restart "
        f"the ranks; `-1x2`: `--nnodes 1 --nproc-per-node 2`, one agent, the shape of the torchrun baseline). "
        f"Every rank is forked from its agent with torch imported (`platform.fork_ranks`, the default). "
        f"Faults fire on rank 1 at step {FAULT_STEP} in attempt 0 "
        f"(`SUPERVISOR_FAULT=kind=K,rank=1,step={FAULT_STEP},attempt=0`); the node kill is this script's `os.killpg(SIGKILL)` "
        "of node1's agent (pid from `supervisor-state.json`) and of its rank's process group (torchrun puts each "
        f"worker in a session of its own, so the agent's group alone does not hold the rank) once step {FAULT_STEP - 1} is logged. "
        "**Fault time**: the rank's `event=fault_injected` log line (ms resolution), the killpg "
        f"time (node), or, where a rank logs no such line, the end of step {FAULT_STEP - 1} plus the 0.05 s step sleep "
        "(an estimate, within ~10 ms). **Detected**: the controller's `fault_detected` event (wall clock). "
        "**First resumed step**: the latest, over ranks, of each rank's first step record of attempt 1 "
        "(`rank-R.jsonl`). **Phases** (wall clock): detect = fault -> `fault_detected`; teardown = "
        "`fault_detected` -> relaunch minus the controller's schedule time (includes the evidence wait: stack "
        "dumps are requested before anything is killed, and the controller waits until every rank that can "
        "answer has, at most 0.6 s here); schedule = the controller's; rendezvous = `launched` -> "
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
    like = cold_rows(list(cold_runs))
    for shape in COLD_SHAPES:
        rs = [r.total for r in cold_runs if r.shape == shape]
        if rs:
            brow(f"like for like: {COLD_SHAPES[shape]}, process start -> first step", rs)
            if shape.startswith("sv"):
                brow("  the same runs, `launched` -> first step", [r.from_launched for r in cold_runs if r.shape == shape])
    L.append("")
    for sv_shape, tr_shape, label in (("sv-1x2", "tr-1x2", "(a) 1 node x 2 ranks"),
                                      ("sv-2x1", "tr-2x1", "(b) 2 nodes x 1 rank")):
        a, b = like.get(sv_shape), like.get(tr_shape)
        if a and b and a["total"] and b["total"]:
            paired = med(sub_ratio(x, y) for x, y in cold_pairs(list(cold_runs), sv_shape, tr_shape))
            L.append(f"**Cold start, like for like, {label}**: supervisor {f2(a['total'])} s vs plain torchrun "
                     f"{f2(b['total'])} s (process start -> first step, medians): **{a['total'] / b['total']:.2f}x** "
                     f"(median of the per-round ratios {f2(paired)}x; target <= 1.10x: "
                     f"{'met' if a['total'] / b['total'] <= 1.10 else 'MISSED'}).")
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
        bk = base_kind(kind)
        if bk == "kill" or bk in NO_TORCHRUN_RUN:  # a process exit: no timeout involved
            target, tgt_txt = None, "none: process exit"
        elif bk == "stop":
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
        tr_kind = "kill" if bk in NO_TORCHRUN_RUN else bk
        trk = tr.get((tr_kind, "kill" if tr_kind == "kill" else f"pg{PG_TIMEOUT_S}"), [])
        tr_total = med(t.total for t in trk)
        if kind in NO_TORCHRUN_RUN:
            bar = None if det is None or tr_total is None else det + tr_total
            why = ("a standalone torchrun that loses its node is gone" if kind != "nan"
                   else "torchrun has no notion of a non-finite loss")
            tr_txt = (f"no equivalent ({why}); the bar: its detection + torchrun's kill -9 restart "
                      f"({f2(tr_total)} s) = {f2(bar)} s")
            ratio = f"{total / bar:.2f} of the bar" if total and bar else "—"
        elif trk:
            what = "restart after kill -9" if bk == "kill" else f"{PG_TIMEOUT_S} s pg timeout"
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
        totals[kind] = (total, tr_total if kind not in NO_TORCHRUN_RUN else None, ratio)
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
             "| agents standing by (s from the fault; negative: before it) | load avg before/after |")
    L.append("|---|---|---|---|" + "---|" * (len(PHASES) - 1) + "---|---|---|---|---|---|---|")
    for kind in args.faults:
        for r in sv.get(kind, []):
            L.append(f"| {r.name} | {r.rc} | {r.fault_source or '—'} | {f2(r.detect)} | "
                     + " | ".join(f2(r.phases.get(p)) for p in PHASES[1:])
                     + f" | {f2(r.total)} | {f2(r.paired_overhead)} | {f2(r.cold_start)} | {f2(r.restore_load, 3)} "
                     f"| {'—' if r.leaked is None else r.leaked} | {f2(r.standby)} | {r.load[0]:.2f}/{r.load[3]:.2f} |")
    for c in colds + warms:
        L.append(f"| {c.name} | {'killed' if c.rc is None else c.rc} | — | — | — | — "
                 f"| {f2(c.phases.get('rendezvous'))} | "
                 f"{f2(c.phases.get('restore'))} | {f2(c.phases.get('first_step'))} | — | — | {f2(c.cold_start)} | "
                 f"{f2(c.restore_load, 3)} | {'— (killed)' if c.leaked is None else c.leaked} "
                 f"| — | {c.load[0]:.2f}/{c.load[3]:.2f} |")
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
            parts.append(f"detection {f2(det)} s (no timeout involved: the fault is a process exit, which the "
                         "node's agent records the moment the rank ends)")
        parts.append(f"overhead {f2(ovh)} s (paired {f2(paired)} s) against <= {OVERHEAD_TARGET_S:.0f} s: {ovh_ok}")
        td, sc = phases.get("teardown"), phases.get("schedule")
        if td is not None and sc is not None:
            tp = {k: med(r.teardown_parts.get(k) for r in sv.get(kind, [])) for k in ("evidence", "culprit", "rest")}
            parts.append(f"the phases a cold start does not have, teardown + schedule, take {f2(td + sc)} s "
                         f"(evidence {f2(tp['evidence'])}, culprit {f2(tp['culprit'])}, rest {f2(tp['rest'])}; the "
                         f"evidence wait ends when the ranks that can answer have dumped their stacks, at most "
                         f"{f2(evidence_wait, 1)} s)")
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
             "(the controller waits for the node's agent, not for the rank).")
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
        L.append(f"* kill: the controller reports `detection_s` 0 (its fault time is when it saw the rank's end), "
                 f"{f2(med(r.detect for r in kills))} s after the SIGKILL: the node's agent records the end the moment "
                 "it happens (`SUPERVISOR_RANK_EXITS`, through a pidfd) and the controller reads it at its next tick, "
                 "where it used to wait for the agent's own exit (~1.3 s: its 0.2 s monitor interval, then stopping "
                 "its other ranks, closing its rendezvous and ending its interpreter).")
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
    bars = [f"{k} {f2(t)} s ({r})" for k, (t, tt, r) in totals.items() if tt is None and k in NO_TORCHRUN_RUN]
    if bars:
        S.append("* **No torchrun equivalent** (a lost node, a non-finite loss), against the bar of their detection "
                 "plus torchrun's restart after kill -9: " + "; ".join(bars) + ".")
    if stop_def:
        t = stop_def[0]
        S.append("* torchrun with defaults " + (f"resumed {f2(t.total)} s after a SIGSTOP." if t.total is not None else
                                               f"did not notice a SIGSTOPped rank within {t.waited:.0f} s."))
    for sv_shape, tr_shape, label in (("sv-1x2", "tr-1x2", "1 node x 2 ranks"), ("sv-2x1", "tr-2x1", "2 nodes x 1 rank")):
        a, b = like.get(sv_shape), like.get(tr_shape)
        if a and b and a["total"] and b["total"]:
            S.append(f"* **Cold start, like for like** ({label}, process start -> first step): supervisor "
                     f"{f2(a['total'])} s vs plain torchrun {f2(b['total'])} s: {a['total'] / b['total']:.2f}x "
                     f"(target <= 1.10x: {'met' if a['total'] / b['total'] <= 1.10 else 'MISSED'}).")
    S.append("")
    L[summary_at:summary_at] = S
    if cold_runs:
        L += cold_section(list(cold_runs), like)
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
    p.add_argument("--cold-rounds", type=int, default=3,
                   help="rounds of the like-for-like cold starts (supervisor vs torchrun, 1x2 and 2x1; ~40 s a "
                        "round; 0: skip them)")
    p.add_argument("--no-bytecode-warm", action="store_true",
                   help="do not compile the checkout first (measure what PYTHONDONTWRITEBYTECODE=1 costs)")
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
        args.cold_rounds = saved["args"].get("cold_rounds", 0)
        sv = {k: [SvRun(**r) for r in v] for k, v in saved["sv"].items()}
        tr = {tuple(k.split("|")): [TrRun(**t) for t in v] for k, v in saved["tr"].items()}
        report = build_report(args, sv, [SvRun(**r) for r in saved["colds"]], [SvRun(**r) for r in saved["warms"]],
                              tr, saved["loads"], saved["started"], saved["wall"],
                              [ColdRun(**r) for r in saved.get("cold", [])])
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
    cold_runs: list[ColdRun] = []

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.0f}s] {msg}", flush=True)

    if not args.no_bytecode_warm:
        warm_bytecode()
        atexit.register(drop_bytecode)
    try:
        for rnd in range(1, args.cold_rounds + 1):
            shapes = [s for s in COLD_SHAPES if not (args.no_torchrun and s.startswith("tr"))]
            for shape in shapes:
                c = cold_shape_run(work, f"r{rnd}-cold-{shape}", shape)
                cold_runs.append(c)
                loads.append(c.load[0])
            say(f"cold starts, round {rnd}: " + ", ".join(f"{c.shape} {f2(c.total)} s" for c in cold_runs[-len(shapes):]))
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
                    if not {kind, kind + IN_PLACE} & set(args.faults):
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
                 "stop_wait": args.stop_wait, "cold_rounds": args.cold_rounds},
        "sv": {k: [asdict(r) for r in v] for k, v in sv.items()}, "colds": [asdict(r) for r in colds],
        "warms": [asdict(r) for r in warms], "tr": {"|".join(k): [asdict(t) for t in v] for k, v in tr.items()},
        "loads": loads, "started": started, "wall": wall, "cold": [asdict(c) for c in cold_runs]}, indent=1))
    publish(build_report(args, sv, colds, warms, tr, loads, started, wall, cold_runs), args.out, work, bool(args.work),
            "every run's files and results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
