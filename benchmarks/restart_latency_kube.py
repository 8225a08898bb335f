"""Restart latency on the Kubernetes platform per fault, beside the local platform's, in one run.

One command; every number comes from real runs made in this invocation, on this machine:
``examples/train.py`` with 2 ranks (one per node, DDP over gloo, CPU) on

* **kube**: ``supervisor run`` with ``platform.kind: kubernetes`` as a real subprocess, driving
  the real ``kubernetes`` client against the in-repo fake API server
  (``tests/fakes/kube_apiserver.py``); the fake kubelet (``tests/fakes/kubelet.py``) runs each
  pod as real local processes (one torchrun agent per pod) on 3 fake nodes (one spare), with
  ``node_reads`` and ``rendezvous: ip``, the settings of ``tests/test_kube_platform.py``;
* **local** (the baseline): ``supervisor launch --nnodes 2`` (node fault: ``--slots 3``), the
  same job, the same heartbeat settings: ``benchmarks/restart_latency.py``'s own runner.

Faults, each once per round on each platform:

* ``kill``: rank 1 SIGKILLs itself inside step 13 (``SUPERVISOR_FAULT=kind=kill``), as in the
  local benchmark;
* ``stop``: rank 1 SIGSTOPs itself inside step 13 (``SUPERVISOR_FAULT=kind=stop``);
* ``node``: kube: the node of rank 1's pod goes NotReady (``FakeKubelet.node_not_ready``: its
  processes SIGSTOPped, ``Ready=False``); local: node1's agent and rank SIGKILLed (the local
  benchmark's node fault). Both once rank 0 logged step 12 and a checkpoint exists.

Times and phases are those of ``benchmarks/restart_latency.py`` (the same analysis code): the
fault from the rank's ``event=fault_injected`` log line or this script's clock just before it
injects the node fault, detection from the controller's ``fault_detected`` event, the first
resumed step from the rank logs, the phases from the controller's events.

Usage: python benchmarks/restart_latency_kube.py [--rounds 2] [--faults kill,stop,node]
       [--out docs/benchmarks/restart_latency_kube.md] [--work DIR] [--from-results DIR/results.json]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import restart_latency as rl  # noqa: E402  (the local benchmark's runners and analysers)
from _common import git_state  # noqa: E402

from supervisor.protocol import ranklog  # noqa: E402

REPO = rl.REPO
PY = rl.PY
sys.path.insert(0, str(REPO / "tests"))
from fakes.kube_apiserver import FakeKubeAPIServer  # noqa: E402
from fakes.kubelet import FakeKubelet  # noqa: E402

NS = "ml"
JOB_NAME = "kjob"
FAULTS = ("kill", "stop", "node")
DETECTOR = {  # what should notice the fault first, per platform
    ("kill", "kube"): "agent exit (pod Failed, seen by the pod watch; its log names the rank)",
    ("kill", "local"): "agent exit (process)",
    ("stop", "kube"): "heartbeat timeout", ("stop", "local"): "heartbeat timeout",
    ("node", "kube"): "heartbeat timeout (the node's processes are stopped; its NotReady marks a node failure)",
    ("node", "local"): "node agent gone (process)",
}
KUBE = {"namespace": NS, "worker": {"image": "fake.invalid/worker:1"}, "python": PY, "rdzv_port": 0,
        "rendezvous": "ip", "node_reads": True, "controller_address": "127.0.0.1", "termination_grace_s": 10,
        "delete_confirm_s": 5, "lease_duration_s": 4, "renew_deadline_s": 3, "api_retry_s": 20}
PHASES = rl.PHASES


class Cluster:
    """A fake API server and a fake kubelet with 3 nodes, fresh per run (as the tests' ``Cluster``)."""

    def __init__(self, d: Path) -> None:
        self.api = FakeKubeAPIServer().start()
        self.kubelet = FakeKubelet(self.api, NS, nodes=3, log_dir=d / "pod-logs").start()
        self.api.log_source = lambda ns, name: (self.kubelet.logs(name) if self.kubelet.log_path(name).exists()
                                                else None)
        self.kubeconfig = d / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.api.url}}],
            "users": [{"name": "me", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me", "namespace": NS}}]}))

    def stop(self) -> None:
        self.kubelet.stop()
        self.api.stop()


def kube_config(cluster: Cluster, logs: Path, ckpt: Path, fault: str | None) -> dict:
    env = {"OMP_NUM_THREADS": "1", **({"SUPERVISOR_FAULT": fault} if fault else {})}
    return {"job": JOB_NAME, "command": [PY, str(rl.TRAIN), *rl.JOB], "nproc_per_node": 1,
            "nodes": {"min": 2, "max": 2},
            "platform": {"kind": "kubernetes", "kubernetes": KUBE | {"kubeconfig": str(cluster.kubeconfig)}},
            "checkpoint_dir": str(ckpt), "log_dir": str(logs),
            "heartbeat": {"interval_s": rl.HB_INTERVAL, "timeout_s": rl.HB_TIMEOUT},
            "health": {"phase_floor_s": rl.HANG_FLOOR}, "restart": {"kill_grace_s": 10}, "metrics_linger_s": 0,
            "env": env}


def rank_node(logs: Path, rank: int, attempt: int) -> str | None:
    """The node slot (with ``node_reads``: the node's name) ``rank`` ran on in ``attempt``."""
    for rec in ranklog.read_log(logs / ranklog.RANKS_DIR / ranklog.log_name(rank)):
        if rec.get("attempt") == attempt and rec.get("node"):
            return rec["node"]
    return None


def wait_finished(p, logs: Path, timeout: float) -> int | None:
    """The job's verdict (``job_finished``'s exit code), or None: the controller stays up after
    it (so that its Deployment does not restart it) and leaves on SIGTERM."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        done = rl.event(rl.read_jsonl(logs / "events.jsonl"), "job_finished")
        if done is not None:
            return done.get("exit_code")
        time.sleep(0.2)
    return None


def agent_logs(d: Path) -> Path:
    """The pod logs as ``attempt-K/SLOT.log`` (the layout the local platform writes and the
    analysis reads): pod ``kjob-aK-SLOT``."""
    out = d / "agents"
    for f in sorted((d / "pod-logs").glob(f"{NS}_{JOB_NAME}-a*.log")):
        attempt, _, slot = f.name[len(f"{NS}_{JOB_NAME}-a"):-len(".log")].partition("-")
        (out / f"attempt-{attempt}").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, out / f"attempt-{attempt}" / f"{slot}.log")
    return out


def kube_run(work: Path, name: str, fault: str) -> rl.SvRun:
    d = work / name
    d.mkdir(parents=True)
    logs, ckpt = d / "logs", d / "ckpt"
    load0 = os.getloadavg()
    cluster = Cluster(d)
    spec = f"kind={fault},rank=1,step={rl.FAULT_STEP},attempt=0" if fault in ("kill", "stop") else None
    config = d / "controller.json"
    config.write_text(json.dumps(kube_config(cluster, logs, ckpt, spec)))
    t_fault, node, rc = None, None, None
    try:
        p = rl.start([PY, "-m", "supervisor", "run", "--config", str(config)], env=rl.job_env(d),
                     out=d / "controller-output.txt", cwd=d)
        if fault == "node" and rl.wait_mid_run(p, logs, ckpt, timeout=180):
            node = rank_node(logs, 1, 0)
            if node:
                t_fault = time.time()
                cluster.kubelet.node_not_ready(node)
        rc = wait_finished(p, logs, 240)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - killed below
            pass
        rl.stop_session(p)
    finally:
        if node:
            cluster.kubelet.node_ready(node)
        cluster.stop()
    run = rl.analyse_fault(name, fault, logs, t_fault, rc, load0 + os.getloadavg(), agent_logs=agent_logs(d))
    if t_fault is not None:
        run.fault_source = f"this script, before `node_not_ready({node})`"
    run.note = f"relaunched on {world(logs)}"
    return run


def local_run(work: Path, name: str, fault: str) -> rl.SvRun:
    run = rl.sv_fault_run(work, name, fault)  # node: --slots 3, node1's agent and rank SIGKILLed
    if fault == "node" and run.t_fault is not None:
        run.fault_source = "this script, before os.killpg(SIGKILL)"
    run.note = f"relaunched on {world(work / name / 'logs')}"
    return run


def world(logs: Path) -> str:
    e = rl.event(rl.read_jsonl(logs / "events.jsonl"), "launched", attempt=1)
    return ", ".join(e["nodes"]) if e else "?"


# ---------------------------------------------------------------------------------------------
# report

def build_report(args, runs: dict[tuple[str, str], list[rl.SvRun]], started: str, wall: float,
                 loads: list[float], commit: str) -> str:
    f2, med = rl.f2, rl.med
    L = ["# Restart latency on Kubernetes per fault, beside the local platform", ""]
    L.append(f"Command: `python benchmarks/restart_latency_kube.py --rounds {args.rounds} --faults "
             f"{','.join(args.faults)}` ({started}, {wall / 60:.1f} min; commit {commit}).")
    L.append("")
    loads_txt = (f"1-min load average over the runs: min {min(loads):.2f}, median {rl.statistics.median(loads):.2f}, "
                 f"max {max(loads):.2f}" if loads else "load average not recorded")
    L.append(f"Environment: {rl.environment()[0]}; the Kubernetes side is the in-repo fake API server and fake "
             f"kubelet on this machine (pods are local processes). The machine is shared and noisy: {loads_txt}, "
             f"on {os.cpu_count()} cores. Every number is a median over {args.rounds} round(s); the ratio "
             "compares the two platforms within this run only.")
    L.append("")
    L.append("## Summary")
    L.append("")
    L.append("| fault | platform | detector (seen as) | detect s | teardown | schedule | rendezvous | restore | "
             "first step | total s | kube / local (total) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for fault in args.faults:
        totals = {}
        for plat in ("kube", "local"):
            rs = runs.get((fault, plat), [])
            totals[plat] = med(r.total for r in rs)
            ph = {k: med(r.phases.get(k) for r in rs) for k in PHASES}
            kinds = sorted({r.detector_kind for r in rs if r.detector_kind})
            ratio = ""
            if plat == "local" and totals.get("kube") and totals.get("local"):
                ratio = f"**{totals['kube'] / totals['local']:.2f}x**"
            L.append(f"| {fault} | {plat} | {DETECTOR[fault, plat]} ({', '.join(kinds) or '—'}) | "
                     + " | ".join(f2(ph[k]) for k in PHASES) + f" | {f2(totals[plat])} | {ratio} |")
    L.append("")
    L.append("Teardown split (medians, s): *evidence* = `fault_detected` -> `evidence_saved` (stack dumps asked for "
             "first); *culprit* = -> `tear_down` (the culprit's node killed and its end confirmed: on Kubernetes "
             "its pod deleted with grace 0 and the pod watch seeing it gone); *rest* = -> relaunch (the other "
             "pods deleted with the teardown grace, then seen gone).")
    L.append("")
    L.append("| fault | platform | evidence | culprit | rest |")
    L.append("|---|---|---|---|---|")
    for fault in args.faults:
        for plat in ("kube", "local"):
            rs = runs.get((fault, plat), [])
            parts = {k: med(r.teardown_parts.get(k) for r in rs) for k in ("evidence", "culprit", "rest")}
            L.append(f"| {fault} | {plat} | {f2(parts['evidence'])} | {f2(parts['culprit'])} | {f2(parts['rest'])} |")
    L.append("")
    L.append("## Reading")
    L.append("")
    for fault in args.faults:
        k, lo = runs.get((fault, "kube"), []), runs.get((fault, "local"), [])
        if not k or not lo:
            continue
        diffs = {ph: (med(r.phases.get(ph) for r in k) or 0) - (med(r.phases.get(ph) for r in lo) or 0)
                 for ph in PHASES}
        ph, d = max(diffs.items(), key=lambda kv: abs(kv[1]))
        tk, tl = med(r.total for r in k), med(r.total for r in lo)
        after_k = med(None if r.total is None or r.detect is None else r.total - r.detect for r in k)
        after_l = med(None if r.total is None or r.detect is None else r.total - r.detect for r in lo)
        L.append(f"* **{fault}**: kube {f2(tk)} s, local {f2(tl)} s"
                 + (f" ({tk / tl:.2f}x)" if tk and tl else "")
                 + f"; the phase that differs most is {ph} ({'+' if d >= 0 else ''}{f2(d)} s on kube). After "
                 f"detection (total - detect) kube takes {f2(after_k)} s, local {f2(after_l)} s"
                 + (f" ({after_k / after_l:.2f}x)." if after_k and after_l else "."))
    L.append("* What Kubernetes adds, by phase: *detect* is the same detector on both platforms except where "
             "the fault shows on the platform first (an agent that exits: on kube a pod going Failed, seen "
             "through the pod watch, on local the process exit); *teardown* deletes pods (the culprit's with "
             "grace 0) and waits for the watch to see them gone, where local signals processes; *rendezvous* "
             "creates the pods one by one, waits for the first pod's IP (`rendezvous: ip`) and for the fake "
             "scheduler and kubelet to bind and start each pod, where local starts processes directly.")
    L.append("* *teardown* after a silent rank (stop, node) is about 1 s longer on kube, all of it in *rest*: the "
             "surviving pod is deleted with the teardown grace (2 s); its rank fails at once (its peer's pod was "
             "deleted first, the collective's connection is reset) but the pod is gone for the controller only once "
             "its torchrun agent has exited on SIGTERM, the kubelet has reported it and completed the deletion, "
             "and the watch has delivered that (the teardown polls the watch cache every 0.1 s); the local "
             "platform waits on the agent process itself. After a kill the survivors have already exited and "
             "teardown is the same on both.")
    L.append("* A node that goes NotReady is not what detects the fault: the node's processes are stopped, so "
             "the heartbeat timeout does; the node's NotReady condition (through the Node watch) is what marks "
             "the fault a node failure, excludes the node and hands its slot to the spare node. Local has no "
             "such signal: there the node fault is a killed agent, noticed on its exit, which is why the node row's detection differs by the heartbeat timeout; compare "
             "the platforms there after detection.")
    L.append("* Caveats: the API server is the in-repo fake and the kubelet a fake one, both in this script's "
             "process on this machine: no network, no etcd, no image pulls, no container runtime, no real "
             "scheduler (the fake binds within milliseconds), pods are plain local processes sharing the "
             "machine's 2 cores with the controller and the fakes. The numbers show what the platform's own "
             "logic costs on top of the local platform's (API round trips, watch latency, pod create and delete "
             "paths); a real cluster adds its scheduling, image and container start times to *rendezvous* and "
             "its kubelet's termination path to *teardown*. Two rounds per fault: medians of two runs, on a "
             "shared machine.")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append(
        f"The job: `examples/train.py {' '.join(rl.JOB)}`, 2 ranks (one per node), a checkpoint every {rl.EVERY} "
        f"steps. Heartbeat every {rl.HB_INTERVAL} s, a rank silent {rl.HB_TIMEOUT} s is dead, hang floor "
        f"{rl.HANG_FLOOR} s, on both platforms. Kube: `supervisor run --config` with `nodes: {{min: 2, max: 2}}` "
        f"and `platform.kubernetes` = `{json.dumps(KUBE)}` (plus the kubeconfig of the fake API server); a fresh "
        "fake API server and fake kubelet (3 nodes) per run; the controller runs as a local process beside them, "
        "holds the Lease, and uses the real `kubernetes` client. Local: `supervisor launch --nnodes 2 "
        f"{' '.join(rl.SV_FLAGS)}` (node: `--slots 3`), i.e. `benchmarks/restart_latency.py`'s own runner. Rank "
        f"faults fire in rank 1 (`SUPERVISOR_FAULT=kind=K,rank=1,step={rl.FAULT_STEP},attempt=0`) and their time "
        "is the rank's `event=fault_injected` log line (in the pod's log on kube). The node faults are injected by "
        f"this script once rank 0 logged step {rl.FAULT_STEP - 1} and a checkpoint exists; the fault time is this "
        "script's clock just before it. Phases: detect = fault -> `fault_detected`; teardown = -> relaunch, "
        "less the controller's schedule time; rendezvous = `launched` -> every rank heard (`running`; on kube "
        "this includes creating the pods, the fake scheduler binding them, the first pod's IP, the kubelet "
        "starting each process); restore = -> rank 0's `event=checkpoint_restored`; first step = -> the gang's "
        "first resumed step (latest over ranks).")
    L.append("")
    L.append("## Every run")
    L.append("")
    L.append("| run | exit code | fault time from | " + " | ".join(PHASES) + " | total | relaunched on | "
             "detected as | load before/after |")
    L.append("|---|---|---|" + "---|" * len(PHASES) + "---|---|---|---|")
    for (fault, plat), rs in sorted(runs.items()):
        for r in rs:
            L.append(f"| {r.name} | {r.rc} | {r.fault_source or '—'} | "
                     + " | ".join(f2(r.phases.get(k)) for k in PHASES)
                     + f" | {f2(r.total)} | {r.note.rsplit('on ', 1)[-1]} | {r.detector_kind or '—'}: "
                     f"{r.detail[:90]} | " + "/".join(f"{x:.2f}" for x in (r.load[0], r.load[3]) if r.load) + " |")
    L.append("")
    return "\n".join(L)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated: " + ",".join(FAULTS))
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "restart_latency_kube.md")
    p.add_argument("--work", type=Path, help="keep every run's files here (default: a temp dir, removed)")
    p.add_argument("--from-results", type=Path, metavar="RESULTS.json",
                   help="rebuild the report from a kept work dir's results.json (runs nothing)")
    args = p.parse_args()
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if set(args.faults) - set(FAULTS):
        p.error(f"unknown faults {sorted(set(args.faults) - set(FAULTS))}")
    if args.from_results:
        saved = json.loads(args.from_results.read_text())
        args.rounds, args.faults = saved["rounds"], saved["faults"]
        runs = {tuple(k.split("|")): [rl.SvRun(**r) for r in v] for k, v in saved["runs"].items()}
        report = build_report(args, runs, saved["started"], saved["wall"], saved["loads"], saved["commit"])
        args.out.write_text(report)
        print(report)
        return 0
    # the fake kubelet starts pods with this process's environment (+ the pod's own)
    for k in [k for k in os.environ if k.startswith(("SUPERVISOR_", "TORCHELASTIC_"))]:
        del os.environ[k]
    os.environ.update(OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
                      PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    atexit.register(rl.cleanup)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    work = (args.work or Path(tempfile.mkdtemp(prefix="restart-latency-kube-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rl.WORK = work
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    commit = git_state("supervisor")
    t0 = time.monotonic()
    runs: dict[tuple[str, str], list[rl.SvRun]] = {}
    loads: list[float] = []
    try:
        for rnd in range(1, args.rounds + 1):
            for fault in args.faults:
                for plat, fn in (("kube", kube_run), ("local", local_run)):
                    r = fn(work, f"r{rnd}-{plat}-{fault}", fault)
                    runs.setdefault((fault, plat), []).append(r)
                    loads.append(r.load[0])
                    print(f"[{time.monotonic() - t0:6.0f}s] {r.name}: rc {r.rc}, {r.detector_kind}, detect "
                          f"{rl.f2(r.detect)} s, total {rl.f2(r.total)} s, phases "
                          f"{', '.join(f'{k} {rl.f2(v)}' for k, v in r.phases.items())} ({r.note})", flush=True)
    finally:
        rl.cleanup()
    wall = time.monotonic() - t0
    (work / "results.json").write_text(json.dumps({
        "rounds": args.rounds, "faults": args.faults, "started": started, "wall": wall, "loads": loads,
        "commit": commit, "runs": {"|".join(k): [asdict(r) for r in v] for k, v in runs.items()}}, indent=1))
    rl.publish(build_report(args, runs, started, wall, loads, commit), args.out, work, bool(args.work),
               "every run's files and results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
