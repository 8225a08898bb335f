"""Restart latency on the slurm platform per fault, beside the local platform's, in one run.

One command; every number comes from real runs made in this invocation, on this machine:
``examples/train.py`` with 3 ranks (one per node, DDP over gloo, CPU) on

* **slurm**: a real 3-node Slurm cluster on this machine (``scripts/slurm-cluster.sh``:
  slurmctld + 3 slurmd, each node in its own cgroup), the job submitted with
  ``supervisor sbatch --nodes 3 --min-nodes 2``: the supervisor on the batch host, one
  torchrun agent per node as an ``srun`` step;
* **local** (the baseline): ``supervisor launch --nnodes 2:3 --slots 3``, the same job,
  the same heartbeat settings, three torchrun agents on this machine.

Faults, each once per round on each platform, after step 12 and a checkpoint exist:

* ``node-kill``: a whole non-batch node dies. Slurm: ``slurm-cluster.sh kill-node n2``
  (cgroup.kill: its slurmd, step daemons and rank at once). Local: SIGKILL of node1's
  agent and rank (each in its own process group).
* ``node-freeze``: a whole node hangs. Slurm: ``slurm-cluster.sh freeze-node n3``
  (cgroup.freeze). Local: SIGSTOP of node2's agent and rank.
* ``rank-stop``: rank 1 SIGSTOPs itself inside step 13 (``SUPERVISOR_FAULT``).

Times are wall clock: the fault from this script's clock just before it injects it (or the
rank's ``event=fault_injected`` log line), detection from the controller's
``fault_detected`` event, the first resumed step from the rank logs; the phase breakdown is
the one of ``benchmarks/restart_latency.py`` (same code).

Usage: python benchmarks/restart_latency_slurm.py [--rounds 2] [--faults node-kill,node-freeze,rank-stop]
       [--out docs/benchmarks/restart_latency_slurm.md] [--work DIR]
Needs root (slurmd runs the tasks); installs and starts the test cluster when it is not up.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import restart_latency as rl  # noqa: E402  (the local benchmark's runners and analysers)
from _common import git_state  # noqa: E402

REPO = rl.REPO
PY = rl.PY
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
CLUSTER_DIR = os.environ.get("SLURM_CLUSTER_DIR", "/tmp/es-slurm")
JOB = [*rl.JOB, "--global-batch", "12"]  # 3 ranks: 4 samples each
FAULTS = ("node-kill", "node-freeze", "rank-stop")
DETECTOR = {  # what should notice the fault first, per platform
    ("node-kill", "local"): "agent exit",
    ("node-kill", "slurm"): "heartbeat timeout (the node's agent dies with it)",
    ("node-freeze", "local"): "heartbeat timeout", ("node-freeze", "slurm"): "heartbeat timeout",
    ("rank-stop", "local"): "heartbeat timeout", ("rank-stop", "slurm"): "heartbeat timeout",
}
SLURM_NODE = {"node-kill": "n2", "node-freeze": "n3"}
LOCAL_NODE = {"node-kill": "node1", "node-freeze": "node2"}
CONFIG = {"platform": {"kind": "slurm"},
          "heartbeat": {"interval_s": rl.HB_INTERVAL, "timeout_s": rl.HB_TIMEOUT},
          "health": {"phase_floor_s": rl.HANG_FLOOR}}
PHASES = rl.PHASES


def cluster_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "SLURM_JOB", "SBATCH_"))}
    env.update(SLURM_CLUSTER_DIR=CLUSTER_DIR, SLURM_CONF=f"{CLUSTER_DIR}/slurm.conf", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def cluster(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(SCRIPT), *args], env=cluster_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"slurm-cluster.sh {' '.join(args)} failed (rc {proc.returncode}): {proc.stderr[-1500:]}")
    return proc


def slurm_cmd(*argv: str, timeout: float = 20) -> str:
    return subprocess.run(list(argv), env=cluster_env(), capture_output=True, text=True, timeout=timeout).stdout


def job_state(job_id: str) -> str:
    out = slurm_cmd("scontrol", "show", "job", "-o", job_id)
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    return fields.get("JobState", "UNKNOWN")


TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def slurm_run(work: Path, name: str, fault: str) -> rl.SvRun:
    d = work / name
    d.mkdir(parents=True)
    logs, ckpt = d / "logs", d / "ckpt"
    base = d / "config.json"
    base.write_text(json.dumps(CONFIG))
    extra = ["--env", f"SUPERVISOR_FAULT=kind=stop,rank=1,step={rl.FAULT_STEP},attempt=0"] if fault == "rank-stop" else []
    load0 = os.getloadavg()
    proc = subprocess.run([PY, "-m", "supervisor", "sbatch", "--config", str(base), "--nodes", "3", "--min-nodes", "2",
                           "--time", "15:00", "--log-dir", str(logs), "--checkpoint-dir", str(ckpt), *extra,
                           "--", PY, str(rl.TRAIN), *JOB],
                          env=cluster_env(), cwd=d, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"supervisor sbatch failed: {proc.stderr[-1500:]}")
    job_id = proc.stdout.strip()
    t_fault = None
    try:
        if fault in SLURM_NODE:
            if rl.wait_mid_run(lambda: job_state(job_id) in TERMINAL, logs, ckpt, timeout=240):
                t_fault = time.time()
                cluster(f"{fault.split('-')[1]}-node", SLURM_NODE[fault])
        deadline = time.monotonic() + 300
        state = job_state(job_id)
        while state not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
            state = job_state(job_id)
    finally:
        cluster("heal", timeout=150)  # cancel the job if it is still there; thaw and restart the node
    return analyse_slurm(name, fault, logs, t_fault, 0 if state == "COMPLETED" else state, load0 + os.getloadavg(),
                         f"job {job_id} {state}")


def analyse_slurm(name: str, fault: str, logs: Path, t_fault: float | None, rc, load, what: str) -> rl.SvRun:
    run = rl.analyse_fault(name, fault, logs, t_fault, rc, load, agent_logs=logs / "slurm")
    if t_fault is not None:
        run.fault_source = f"this script, before `slurm-cluster.sh {fault.split('-')[1]}-node`"
    run.note = f"{what}; relaunched on {world(logs)} nodes"
    return run


def local_run(work: Path, name: str, fault: str) -> rl.SvRun:
    d = work / name
    d.mkdir(parents=True)
    logs, ckpt = d / "logs", d / "ckpt"
    spec = f"kind=stop,rank=1,step={rl.FAULT_STEP},attempt=0" if fault == "rank-stop" else None
    cmd = [PY, "-m", "supervisor", "launch", "--nnodes", "2:3", "--slots", "3", "--checkpoint-dir", str(ckpt),
           "--log-dir", str(logs), *rl.SV_FLAGS, *rl.launch_extra(), "--", PY, str(rl.TRAIN), *JOB]
    rl._LOG_DIRS.append(logs)
    load0 = os.getloadavg()
    p = rl.start(cmd, env=rl.job_env(d, spec), out=d / "supervisor-output.txt", cwd=d)
    t_fault = None
    sig = local_signal(fault)
    if fault in LOCAL_NODE and rl.wait_mid_run(p, logs, ckpt, timeout=240):
        t_fault = rl.signal_node(logs, LOCAL_NODE[fault], sig)
    rc, leaked = rl.finish(p, logs, 240)
    run = rl.analyse_fault(name, fault, logs, t_fault, rc, load0 + os.getloadavg())
    if t_fault is not None:
        run.fault_source = f"this script, before os.killpg({sig.name})"
    run.leaked = leaked
    run.note = f"relaunched on {world(logs)} nodes"
    return run


def local_signal(fault: str) -> signal.Signals:
    return signal.SIGKILL if fault == "node-kill" else signal.SIGSTOP


def world(logs: Path) -> str:
    e = rl.event(rl.read_jsonl(logs / "events.jsonl"), "launched", attempt=1)
    return str(len(e["nodes"])) if e else "?"


# ---------------------------------------------------------------------------------------------
# report

def build_report(args, runs: dict[tuple[str, str], list[rl.SvRun]], started: str, wall: float,
                 loads: list[float], commit: str) -> str:
    f2, med = rl.f2, rl.med
    L = ["# Restart latency on Slurm per fault, beside the local platform", ""]
    L.append(f"Command: `python benchmarks/restart_latency_slurm.py --rounds {args.rounds} --faults "
             f"{','.join(args.faults)}` ({started}, {wall / 60:.1f} min; commit {commit}).")
    L.append("")
    loads_txt = (f"1-min load average over the runs: min {min(loads):.2f}, median {rl.statistics.median(loads):.2f}, "
                 f"max {max(loads):.2f}" if loads else "load average not recorded")
    L.append(f"Environment: {rl.environment()[0]}; Slurm {slurm_version()} (Debian slurm-wlm), 3 slurmd and one "
             f"slurmctld on this machine (`scripts/slurm-cluster.sh`). The machine is shared and noisy: {loads_txt}, "
             f"on {os.cpu_count()} cores. Every number is a median over {args.rounds} round(s); the ratio compares "
             "the two platforms within this run only.")
    L.append("")
    L.append("## Summary")
    L.append("")
    L.append("| fault | platform | detector | detect s | teardown | schedule | rendezvous | restore | first step | "
             "total s | slurm / local (total) | relaunched on |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fault in args.faults:
        totals = {}
        for plat in ("slurm", "local"):
            rs = runs.get((fault, plat), [])
            totals[plat] = med(r.total for r in rs)
            ph = {k: med(r.phases.get(k) for r in rs) for k in PHASES}
            kinds = sorted({r.detector_kind for r in rs if r.detector_kind})
            ratio = ""
            if plat == "local" and totals.get("slurm") and totals.get("local"):
                ratio = f"{totals['slurm'] / totals['local']:.2f}x"
            L.append(f"| {fault} | {plat} | {DETECTOR[fault, plat]} ({', '.join(kinds) or '—'}) | {f2(ph['detect'])} | "
                     f"{f2(ph['teardown'])} | {f2(ph['schedule'])} | {f2(ph['rendezvous'])} | {f2(ph['restore'])} | "
                     f"{f2(ph['first_step'])} | {f2(totals[plat])} | {ratio} | "
                     f"{', '.join(sorted({r.note.rsplit('on ', 1)[-1] for r in rs})) or '—'} |")
    L.append("")
    L.append("Teardown split (medians, s): *evidence* = `fault_detected` -> `evidence_saved` (stack dumps asked for "
             "first); *culprit* = -> `tear_down`, the kill + confirm of the silent rank's node (on Slurm "
             "`scancel --ctld --signal=KILL JOB.STEP`, then the step seen gone, or the node marked unresponsive: "
             "Slurm lists it as not responding, or `kill_confirm_s` ran out); *rest* = -> relaunch (the other "
             "nodes ended).")
    L.append("")
    L.append("| fault | platform | evidence | culprit (kill + confirm) | rest |")
    L.append("|---|---|---|---|---|")
    for fault in args.faults:
        for plat in ("slurm", "local"):
            rs = runs.get((fault, plat), [])
            parts = {k: med(r.teardown_parts.get(k) for r in rs) for k in ("evidence", "culprit", "rest")}
            L.append(f"| {fault} | {plat} | {f2(parts['evidence'])} | {f2(parts['culprit'])} | {f2(parts['rest'])} |")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append(
        f"The job: `examples/train.py {' '.join(JOB)}`, 3 ranks (one per node), a checkpoint every {rl.EVERY} "
        f"steps. Heartbeat every {rl.HB_INTERVAL} s, a rank silent {rl.HB_TIMEOUT} s is dead, hang floor "
        f"{rl.HANG_FLOOR} s, on both platforms. Slurm: `supervisor sbatch --nodes 3 --min-nodes 2 --config "
        f"{json.dumps(CONFIG)}`, the Slurm platform's own defaults otherwise (`poll_interval_s` 2, "
        "`kill_confirm_s` 10, `command_timeout_s` 20); the supervisor runs on the batch host n1. Local: `supervisor "
        "launch --nnodes 2:3 --slots 3`. Node faults are injected by this script once rank 0 logged step "
        f"{rl.FAULT_STEP - 1} and a checkpoint exists; the fault time is this script's clock just before it "
        "(for Slurm, before `slurm-cluster.sh` runs: a bash start, ~10 ms). The rank stop fires in the rank "
        f"(`SUPERVISOR_FAULT=kind=stop,rank=1,step={rl.FAULT_STEP},attempt=0`) and its time is the rank's "
        "`event=fault_injected` log line. Phases: detect = fault -> `fault_detected`; teardown = -> relaunch, "
        "less the controller's schedule time; rendezvous = `launched` -> every rank heard (`running`; on Slurm "
        "this includes srun's step start on each node); restore = -> rank 0's `event=checkpoint_restored`; first "
        "step = -> the gang's first resumed step (latest over ranks). Between runs `slurm-cluster.sh heal` "
        "cancels what is left and thaws/restarts the faulted node.")
    L.append("")
    L.append("## Every run")
    L.append("")
    L.append("| run | result | fault time from | " + " | ".join(PHASES) + " | total | detected as | load before/after |")
    L.append("|---|---|---|" + "---|" * len(PHASES) + "---|---|---|")
    for (fault, plat), rs in sorted(runs.items()):
        for r in rs:
            L.append(f"| {r.name} | {r.rc} ({r.note}) | {r.fault_source or '—'} | "
                     + " | ".join(f2(r.phases.get(k)) for k in PHASES)
                     + f" | {f2(r.total)} | {r.detector_kind or '—'}: {r.detail[:90]} | "
                     + "/".join(f"{x:.2f}" for x in (r.load[0], r.load[3]) if r.load) + " |")
    L.append("")
    return "\n".join(L)


def slurm_version() -> str:
    out = slurm_cmd("sinfo", "-V").strip()
    return out.split()[-1] if out else "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated: " + ",".join(FAULTS))
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "restart_latency_slurm.md")
    p.add_argument("--work", type=Path, help="keep every run's files here (default: a temp dir, removed)")
    p.add_argument("--from-results", type=Path, metavar="RESULTS.json",
                   help="rebuild the report from a kept work dir's results.json, re-reading its logs (runs nothing)")
    args = p.parse_args()
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if set(args.faults) - set(FAULTS):
        p.error(f"unknown faults {sorted(set(args.faults) - set(FAULTS))}")
    if args.from_results:
        saved = json.loads(args.from_results.read_text())
        args.rounds, args.faults = saved["rounds"], saved["faults"]
        runs = {tuple(k.split("|")): [rl.SvRun(**r) for r in v] for k, v in saved["runs"].items()}
        work = args.from_results.parent
        for (fault, plat), rs in runs.items():  # re-read the kept logs: an analysis fix needs no rerun
            for i, r in enumerate(rs):
                logs = work / r.name / "logs"
                if not logs.is_dir():
                    continue
                external = r.t_fault if r.fault_source.startswith(("this script", "killpg")) else None
                if plat == "slurm":
                    rs[i] = analyse_slurm(r.name, fault, logs, external, r.rc, tuple(r.load), r.note.split(";")[0])
                else:
                    fresh = rl.analyse_fault(r.name, fault, logs, external, r.rc, tuple(r.load))
                    if external is not None:
                        fresh.fault_source = f"this script, before os.killpg({local_signal(fault).name})"
                    fresh.leaked, fresh.note = r.leaked, r.note
                    rs[i] = fresh
        report = build_report(args, runs, saved["started"], saved["wall"], saved["loads"],
                              saved.get("commit", "unknown"))
        args.out.write_text(report)
        print(report)
        return 0
    if os.geteuid() != 0:
        p.error("needs root: the test cluster's slurmd runs the tasks")
    if not all(shutil.which(b) for b in ("slurmctld", "slurmd", "srun", "munged")):
        cluster("install", timeout=900)
    if cluster("status", check=False).returncode != 0:
        cluster("start")
    atexit.register(rl.cleanup)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    work = (args.work or Path(tempfile.mkdtemp(prefix="restart-latency-slurm-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rl.WORK = work
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    commit = git_state("supervisor")  # what is measured, also when the report is rebuilt later
    t0 = time.monotonic()
    runs: dict[tuple[str, str], list[rl.SvRun]] = {}
    loads: list[float] = []
    try:
        cluster("heal", timeout=150)
        for rnd in range(1, args.rounds + 1):
            for fault in args.faults:
                for plat, fn in (("slurm", slurm_run), ("local", local_run)):
                    r = fn(work, f"r{rnd}-{plat}-{fault}", fault)
                    runs.setdefault((fault, plat), []).append(r)
                    loads.append(r.load[0])
                    print(f"[{time.monotonic() - t0:6.0f}s] {r.name}: {r.rc}, {r.detector_kind}, detect "
                          f"{rl.f2(r.detect)} s, total {rl.f2(r.total)} s ({r.note})", flush=True)
    finally:
        rl.cleanup()
    wall = time.monotonic() - t0
    (work / "results.json").write_text(json.dumps({
        "rounds": args.rounds, "faults": args.faults, "started": started, "wall": wall, "loads": loads,
        "commit": commit,
        "runs": {"|".join(k): [asdict(r) for r in v] for k, v in runs.items()}}, indent=1))
    rl.publish(build_report(args, runs, started, wall, loads, commit), args.out, work, bool(args.work),
               "every run's files and results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
