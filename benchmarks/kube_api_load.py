"""The Kubernetes controller's load on the API server at 1,024 pods, against a GET-per-pod design.

One command; every number comes from this invocation, on this machine. The real
``KubernetesPlatform`` (built from ``Settings`` with the ``platform.kubernetes`` defaults, so a
PodDisruptionBudget per attempt, and the gang mode of ``--gang``: by default ``volcano``, a
PodGroup per attempt; the real ``kubernetes`` client) drives the in-repo fake API server
(``tests/fakes/kube_apiserver.py``), which counts every request by verb, resource and User-Agent.
No processes run: this script is a trivial kubelet and gang scheduler itself, writing through the
API what they write (``pods/binding`` to a node, ``pods/status`` Running, Failed for the lost pod;
with a PodGroup, its status ``Running`` once its pods are bound, as the gang scheduler does) and
ending terminating pods with ``FakeKubeAPIServer.finish_deletion`` (the kubelet's last word once
a pod's processes are gone). Its requests carry their own User-Agent and are counted apart from
the controller's (the controller's User-Agent, ``elastic-supervisor-controller``). The
controller side is what the daemon does: ``observe()`` every ``TICK_S`` (0.2 s,
``supervisor/controller/daemon.py``) and the Lease elector with the config's defaults (as
``KubernetesPlatform.supervise`` runs it).

Windows:

* **launch**: attempt 0 of 1,024 pods (``launch``) until the watch has seen every pod Running;
* **steady state**: ``--steady`` seconds (default 20) of ticks with every pod Running;
* **restart**: one pod written Failed (exit 137) -> ``observe()`` sees it -> ``teardown``
  (``restart.teardown_grace_s`` = 2 s; deletions completed by the kubelet as they come) ->
  ``launch`` attempt 1 -> the watch has seen all 1,024 new pods Running.

Baseline, computed in the same run: a design that GETs each pod every tick costs
1,024 / TICK_S requests per second; one such sweep (1,024 sequential GETs) is also timed
against the same fake server.

Usage: python benchmarks/kube_api_load.py [--pods 1024] [--steady 20] [--gang volcano|coscheduling|none]
       [--no-disruption-budget] [--out docs/benchmarks/kube_api_load.md]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_state  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
import kubernetes  # noqa: E402
from kubernetes import client  # noqa: E402

from fakes.kube_apiserver import FakeKubeAPIServer  # noqa: E402
from supervisor.config import RestartConfig  # noqa: E402
from supervisor.controller.daemon import TICK_S  # noqa: E402
from supervisor.platforms.base import LaunchSpec, NodeState  # noqa: E402
from supervisor.platforms.kube.client import USER_AGENT, KubeApi  # noqa: E402
from supervisor.platforms.kube.gang import GangConfig  # noqa: E402
from supervisor.platforms.kube.lease import LeaseConfig, LeaseElector  # noqa: E402
from supervisor.platforms.kube.platform import KubernetesPlatform, Settings  # noqa: E402
from supervisor.platforms.kube.settings import KubernetesConfig  # noqa: E402

NS = "ml"
JOB = "load"
PER_POD_VERBS = ("get", "create", "update", "patch", "delete")
BUDGETS = "poddisruptionbudgets"


class Kubelet:
    """Writes through the API what a kubelet would, from a thread pool (its own client)."""

    def __init__(self, api: FakeKubeAPIServer, threads: int = 8) -> None:
        self.api = api
        ac = client.ApiClient(api.configuration())
        ac.user_agent = "bench-kubelet"
        ac.rest_client.pool_manager.connection_pool_kw["maxsize"] = threads
        self.v1 = client.CoreV1Api(ac)
        self.crd = client.CustomObjectsApi(ac)
        self.pool = ThreadPoolExecutor(threads)
        self.sent: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    def _count(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.sent[key] += 1

    def run_pod(self, name: str, i: int) -> None:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": f"node-{i}"}}
        self.v1.create_namespaced_pod_binding(name, NS, body, _preload_content=False)
        self._count(("create", "pods/binding"))
        self.set_status(name, {"phase": "Running", "podIP": f"10.{i // 250}.{i % 250}.1", "containerStatuses": [
            {"name": "agent", "ready": True, "restartCount": 0, "image": "img:1", "imageID": "",
             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]})

    def set_status(self, name: str, status: dict) -> None:
        self.v1.patch_namespaced_pod_status(name, NS, {"status": status}, _preload_content=False)
        self._count(("patch", "pods/status"))

    def run_pods(self, names: list[str], group: tuple[str, str, str, str] | None = None) -> None:
        """Bind and run ``names``; ``group``: their PodGroup (group, version, plural, name), whose
        status the gang scheduler sets ``Running`` once the whole group is bound."""
        list(self.pool.map(self.run_pod, names, range(len(names))))
        if group is not None:
            g, version, plural, name = group
            self.crd.patch_namespaced_custom_object_status(g, version, NS, plural, name, {"status": {
                "phase": "Running", "running": len(names)}})
            self._count(("patch", f"{plural}/status"))

    def fail(self, name: str, code: int = 137) -> None:
        self.set_status(name, {"phase": "Failed", "containerStatuses": [
            {"name": "agent", "ready": False, "restartCount": 0, "image": "img:1", "imageID": "",
             "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]})

    def start_reaping(self) -> None:
        """Complete every graceful deletion as it appears (the pod's processes are gone)."""
        self._stop.clear()

        def reap() -> None:
            while not self._stop.is_set():
                for pod in self.api.objects("pods", NS):
                    if pod["metadata"].get("deletionTimestamp"):
                        try:
                            self.api.finish_deletion("pods", NS, pod["metadata"]["name"])
                        except LookupError:
                            pass
                self._stop.wait(0.1)

        self._reaper = threading.Thread(target=reap, name="bench-kubelet-reaper", daemon=True)
        self._reaper.start()

    def stop_reaping(self) -> None:
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=10)

    def close(self) -> None:
        self.stop_reaping()
        self.pool.shutdown()
        self.v1.api_client.close()


class Window:
    """Requests the API server counted between ``open`` and ``close``: the controller's (its
    User-Agent) and, apart, the rest (this script as the kubelet and the gang scheduler)."""

    def __init__(self, name: str, api: FakeKubeAPIServer) -> None:
        self.name, self.api = name, api
        self.t0 = time.monotonic()
        self.before = api.request_counts()
        self.before_ours = api.request_counts(user_agent=USER_AGENT)
        self.seconds = 0.0
        self.counts: collections.Counter = collections.Counter()
        self.kubelet: collections.Counter = collections.Counter()
        self.ticks = 0
        self.tick_s: list[float] = []
        self.marks: dict[str, float] = {}

    def mark(self, what: str) -> None:
        self.marks[what] = time.monotonic() - self.t0

    def close(self) -> "Window":
        self.seconds = time.monotonic() - self.t0
        ours = self.api.request_counts(user_agent=USER_AGENT)
        ours.subtract(self.before_ours)
        every = self.api.request_counts()
        every.subtract(self.before)
        for key, n in every.items():
            if n - ours.get(key, 0):
                self.kubelet[key] += n - ours.get(key, 0)
            if ours.get(key, 0):
                self.counts[key] += ours[key]
        return self

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def per_pod(self) -> int:
        return sum(n for (verb, res), n in self.counts.items() if res == "pods" and verb in PER_POD_VERBS)

    def of(self, resource: str) -> str:
        """The controller's requests on ``resource`` (a plural, or its qualified name), by verb."""
        got = sorted((verb, n) for (verb, res), n in self.counts.items() if res.split(".")[0] == resource)
        return ", ".join(f"{n} {verb}" for verb, n in got) or "0"


def spec(attempt: int, slots: list[str]) -> LaunchSpec:
    return LaunchSpec(attempt=attempt, nodes=slots, nnodes_min=len(slots), nnodes_max=len(slots), nproc_per_node=1,
                      command=["python", "train.py"], env={"SUPERVISOR_JOB": JOB},
                      rdzv_endpoint="ignored:29400", rdzv_id=f"{JOB}-{attempt}")


async def tick(platform: KubernetesPlatform, w: Window) -> dict:
    t = time.perf_counter()
    got = await platform.observe()
    w.tick_s.append(time.perf_counter() - t)
    w.ticks += 1
    return got


async def until_running(platform: KubernetesPlatform, w: Window, attempt: int, n: int, timeout: float = 300) -> None:
    """Tick until the controller's watch has seen ``n`` pods of ``attempt`` Running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await tick(platform, w)
        pods = platform.pod_watch.snapshot().values()
        if sum(1 for p in pods if p.status and p.status.phase == "Running"
               and (p.metadata.labels or {}).get("elastic-supervisor/attempt") == str(attempt)) >= n:
            return
        await asyncio.sleep(TICK_S)
    raise SystemExit(f"the watch did not see {n} pods of attempt {attempt} Running within {timeout:.0f} s")


async def measure(api: FakeKubeAPIServer, n: int, steady_s: float, tmp: Path, gang: str, budget: bool) -> dict:
    k = KubernetesConfig()
    grace = RestartConfig().teardown_grace_s
    settings = Settings(namespace=NS, job=JOB, image="img:1", slots=n, termination_grace_s=k.termination_grace_s,
                        delete_confirm_s=k.delete_confirm_s, lease_duration_s=k.lease_duration_s,
                        renew_deadline_s=k.renew_deadline_s, disruption_budget=budget, gang=GangConfig(mode=gang))
    ac = client.ApiClient(api.configuration())
    ac.user_agent = USER_AGENT
    kube = KubeApi(ac, timeout_s=k.api_timeout_s, retry_s=k.api_retry_s)
    platform = KubernetesPlatform(kube, settings).start(wait_s=30)
    (tmp / "token").write_text("ab" * 24)
    platform.token_env(tmp / "token")
    lease = LeaseConfig(namespace=NS, name=f"{JOB}-controller", identity="bench_controller",
                        lease_duration_s=k.lease_duration_s, renew_deadline_s=k.renew_deadline_s,
                        retry_period_s=min(2.0, k.renew_deadline_s / 3), request_timeout_s=min(5.0, k.renew_deadline_s))
    elector = LeaseElector(client.CoordinationV1Api(ac), lease)
    elector.start()
    await elector.wait_leading()
    kubelet = Kubelet(api)
    out: dict = {"grace": grace, "lease": lease, "settings": settings}

    def group(attempt: int) -> tuple[str, str, str, str] | None:
        """The attempt's PodGroup, as the gang scheduler finds it (None: the mode makes none)."""
        if settings.gang.api is None:
            return None
        g, version, plural = settings.gang.api
        (made,) = [pg for pg in api.objects(f"{plural}.{g}", NS)
                   if pg["metadata"]["labels"].get("elastic-supervisor/attempt") == str(attempt)]
        return g, version, plural, made["metadata"]["name"]
    try:
        slots = platform.slots()
        # launch: attempt 0
        w = Window(f"launch (attempt 0: create {n:,} pods, until all seen Running)", api)
        await platform.launch(spec(0, slots))
        w.mark("pods created")
        names = [p.name for p in platform.pods.values()]
        runner = asyncio.get_running_loop().run_in_executor(None, kubelet.run_pods, names, group(0))
        await until_running(platform, w, 0, n)
        await runner
        out["launch"] = w.close()
        # steady state
        w = Window(f"steady state ({steady_s:.0f} s of ticks, every pod Running)", api)
        while time.monotonic() - w.t0 < steady_s:
            got = await tick(platform, w)
            assert sum(1 for s in got.values() if s.state == NodeState.RUNNING) == n, "a pod left Running"
            await asyncio.sleep(TICK_S)
        out["steady"] = w.close()
        # restart: one pod lost -> teardown -> relaunch
        w = Window("restart (one pod Failed -> detect -> teardown -> launch attempt 1 -> all seen Running)", api)
        lost = slots[n // 2]
        await asyncio.to_thread(kubelet.fail, platform.pods[lost].name)
        while True:
            got = await tick(platform, w)
            if got[lost].state == NodeState.EXITED:
                break
            await asyncio.sleep(TICK_S)
        w.mark("detected")
        kubelet.start_reaping()
        await platform.teardown(grace)
        kubelet.stop_reaping()
        w.mark("torn down")
        await platform.launch(spec(1, slots))
        w.mark("pods created")
        names = [p.name for p in platform.pods.values()]
        runner = asyncio.get_running_loop().run_in_executor(None, kubelet.run_pods, names, group(1))
        await until_running(platform, w, 1, n)
        await runner
        w.mark("all Running")
        out["restart"] = w.close()
        # the baseline's own cost: one sweep of GETs, one per pod, as a GET-per-pod tick would make
        v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
        t = time.monotonic()
        for name in names:
            v1.read_namespaced_pod(name, NS, _preload_content=False)
        out["sweep_s"] = time.monotonic() - t
        v1.api_client.close()
        out["kubelet_sent"] = kubelet.sent
    finally:
        kubelet.close()
        await elector.stop()
        platform.close()
    return out


def fmt_counts(c: collections.Counter) -> str:
    return ", ".join(f"{v} {r} {n}" for (v, r), n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def report(args, out: dict, started: str, wall: float, commit: str, loads: list[float]) -> str:
    n = args.pods
    baseline = n / TICK_S
    steady, restart, launch = out["steady"], out["restart"], out["launch"]
    L = [f"# Kubernetes controller: API server load at {n:,} pods", ""]
    flags = f" --gang {args.gang}" + (" --no-disruption-budget" if args.no_disruption_budget else "")
    L.append(f"Command: `python benchmarks/kube_api_load.py --pods {n} --steady {args.steady:g}{flags}` ({started}, "
             f"{wall:.0f} s; commit {commit}).")
    s = out["settings"]
    g = s.gang
    L.append("")
    L.append(f"Controller: gang mode `{g.mode}` (" + (
        f"a `{g.api[0]}/{g.api[1]}` PodGroup per attempt, `minMember` {n:,}, made before its pods and deleted with "
        "its attempt, as the budget" if g.api else "no pod-group object") + "); " + (
        f"a PodDisruptionBudget per attempt (`minAvailable` {n:,}, the default), made at each launch and deleted "
        "with its attempt (a launch deletes the previous attempt's only when no teardown of this controller did: "
        "one a dead controller left)"
        if s.disruption_budget else "no PodDisruptionBudget") + ".")
    L.append("")
    L.append(f"Environment: {os.cpu_count()} cores, Python {sys.version.split()[0]}, kubernetes client "
             f"{kubernetes.__version__}; the in-repo fake API server in "
             f"this process (its own thread and event loop). The machine is shared and noisy: 1-min load average "
             f"{min(loads):.2f}-{max(loads):.2f} during the run. The request counts do not depend on the load; the "
             "seconds do.")
    L.append("")
    L.append("## Summary")
    L.append("")
    L.append(f"| window | seconds | controller requests | requests/s | GET-per-pod baseline ({n:,} / {TICK_S} s tick) "
             "requests/s | ratio (controller / baseline) | per-pod requests | PodGroup requests | "
             "PodDisruptionBudget requests | ticks | observe() per tick, median / max ms |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for w in (launch, steady, restart):
        rate = w.total / w.seconds if w.seconds else 0.0
        L.append(f"| {w.name} | {w.seconds:.1f} | {w.total} | {rate:.2f} | {baseline:,.0f} | "
                 f"**{rate / baseline:.5f}** | {w.per_pod()} | {w.of('podgroups')} | {w.of(BUDGETS)} | {w.ticks} | "
                 f"{statistics.median(w.tick_s) * 1e3:.1f} / {max(w.tick_s) * 1e3:.1f} |")
    L.append("")
    ok = steady.per_pod() == 0
    L.append(f"* **Steady state makes no per-pod requests: {'yes' if ok else 'NO'}** ({steady.per_pod()} per-pod "
             f"requests in {steady.seconds:.0f} s; a GET-per-pod design makes {baseline * steady.seconds:,.0f} in "
             f"the same time). What it does send: {fmt_counts(steady.counts)}.")
    L.append(f"* The attempt's own objects cost requests per launch, not per pod or per tick. PodGroup: launch "
             f"{launch.of('podgroups')}, restart {restart.of('podgroups')}, steady state {steady.of('podgroups')}. "
             f"PodDisruptionBudget: launch {launch.of(BUDGETS)}, restart {restart.of(BUDGETS)}, steady state "
             f"{steady.of(BUDGETS)}.")
    L.append(f"* Restart: {restart.total} controller requests in {restart.seconds:.1f} s "
             f"({restart.total / restart.seconds:.1f}/s), i.e. about {restart.total / n:.2f} per pod for the whole "
             f"restart; a GET-per-pod design spends {n} requests on every single tick. Marks (s from the Failed "
             "status write): " + ", ".join(f"{k} {v:.2f}" for k, v in restart.marks.items()) + ".")
    sweep = out["sweep_s"]
    L.append(f"* One GET-per-pod sweep ({n:,} sequential GETs of one client against this fake server) took "
             f"**{sweep:.2f} s**, against a {TICK_S} s tick: "
             + (f"on this machine such a design could not even keep its tick ({sweep / TICK_S:.1f} ticks' worth "
                "of time per sweep)." if sweep > TICK_S else
                f"it fits in a tick here, at {sweep / TICK_S:.0%} of the tick spent on requests."))
    L.append("")
    L.append("## Requests by verb and resource (the controller's; the kubelet's and gang scheduler's apart)")
    L.append("")
    L.append("| window | verb | resource | requests | per second |")
    L.append("|---|---|---|---|---|")
    for w in (launch, steady, restart):
        for (verb, res), c in sorted(w.counts.items(), key=lambda kv: (-kv[1], kv[0])):
            L.append(f"| {w.name.split(' (')[0]} | {verb} | {res} | {c} | {c / w.seconds:.2f} |")
        for (verb, res), c in sorted(w.kubelet.items()):
            L.append(f"| {w.name.split(' (')[0]} | {verb} | {res} (this script as the kubelet or gang scheduler, "
                     f"not counted above) | {c} | {c / w.seconds:.2f} |")
    L.append("")
    L.append("## Method")
    L.append("")
    lease = out["lease"]
    L.append(
        f"`KubernetesPlatform(KubeApi(...), Settings(namespace={NS!r}, job={JOB!r}, slots={n}, "
        f"termination_grace_s={s.termination_grace_s}, delete_confirm_s={s.delete_confirm_s:g}, "
        f"disruption_budget={s.disruption_budget}, gang=GangConfig(mode={g.mode!r})))` (the "
        "`platform.kubernetes` defaults; without `node_reads`, so no Node watch), the controller's User-Agent, "
        f"and a `LeaseElector` with the defaults the platform uses (lease {lease.lease_duration_s} s, renew "
        f"deadline {lease.renew_deadline_s:g} s, retry period {lease.retry_period_s:g} s). The controller side "
        f"runs on one asyncio loop: `observe()` every {TICK_S} s (`TICK_S`), the restart's `teardown("
        f"{out['grace']:g})` (`restart.teardown_grace_s`) and `launch`. The pods are watched (list + watch with a "
        "label selector, the `Watcher`); the requests counted are the fake API server's own counter "
        "(`request_counts()`), by verb and resource, over each window: the controller's are those with its "
        "User-Agent. This script is the kubelet and the gang scheduler: a pool of 8 threads binds each pod to a "
        "node (`pods/binding`; with a PodGroup, the gang scheduler's whole-group bind, after the group exists) and "
        "writes its status (`pods/status`: Running; Failed with exit code 137 for the lost pod), then sets the "
        "attempt's PodGroup `Running` (`podgroups/status`), and a thread completes each graceful deletion with "
        "`finish_deletion` (in process, not a request). Its requests carry their own User-Agent and are listed "
        "apart, not counted as the controller's. A window ends when the controller's own watch has seen what it waits for. "
        f"Baseline: a controller that GETs every pod on every tick sends {n} / {TICK_S} = {baseline:,.0f} "
        "requests/s whatever happens; the ratio is the controller's rate over that. The sweep is timed with one "
        "client, sequential GETs, after the windows.")
    L.append("")
    L.append("## What the numbers mean, and caveats")
    L.append("")
    L.append(
        "* Steady state costs the API server only what does not grow with the pods: the Lease renewals "
        "(a GET and an UPDATE of `leases` every retry period) and, once a minute per watch, a watch re-opened "
        "(the watch's `timeoutSeconds` is 60, so a 20 s window may see none). Pod changes arrive as watch "
        "events on one open stream; `observe()` reads the watch cache, never the API.\n"
        "* A launch is one POST per pod (plus the Service and the Secret the first time, and the attempt's "
        "PodGroup and PodDisruptionBudget: one POST each, whatever the gang's size); a teardown one DELETE "
        "per live pod (and one for each of the attempt's two objects); the lost pod's log is read once "
        "(`pods/log`) for its ranks' failures. The pod requests are per-pod but happen once per restart, not "
        "per tick.\n"
        f"* The controller's own cost per tick at {n:,} pods: `observe()` (a copy of the watch cache and a "
        f"status per pod, no request) took {statistics.median(steady.tick_s) * 1e3:.1f} ms median in steady "
        f"state, {statistics.median(steady.tick_s) / TICK_S:.0%} of a {TICK_S} s tick. The daemon sleeps "
        f"`TICK_S` after each tick, so it ticks a little under {1 / TICK_S:g} times a second "
        f"({steady.ticks} ticks in {steady.seconds:.0f} s here); the baseline uses the nominal rate.\n"
        f"* The restart's seconds are dominated by the per-pod writes: {n:,} DELETEs (through the asyncio "
        f"default executor: {min(32, (os.cpu_count() or 1) + 4)} threads on this machine) and {n:,} sequential CREATEs, each a round trip to this fake server, while this "
        "script's kubelet writes as many bindings and statuses.\n"
        "* Caveats: a fake API server on one machine, in this process, sharing its 2 cores with the controller "
        "and this kubelet: no etcd, no admission, no authentication, no network; the seconds (and so the "
        "rates) are this machine's, the request counts are the design's. No pods run (no real kubelet: its "
        "own status writes, about 2 per pod start, are the cluster's load whatever the controller does). The fake "
        "server keeps 20,000 changes of history here (so that a watch re-opened after a burst of a thousand "
        "pod writes resumes rather than relists; etcd keeps about five minutes of changes). Its disruption "
        "controller updates the budget's status on the write path of each pod write it concerns (a real "
        "kube-controller-manager does it from its own queue, off the API server), looking at that pod only. A real "
        "API server also serves watch events to every watcher, which the counts here do not show: the controller "
        "holds one pod watch (and, with `node_reads`, one Node watch).")
    L.append("")
    return "\n".join(L)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=1024)
    p.add_argument("--steady", type=float, default=20.0, help="seconds of steady state")
    p.add_argument("--gang", choices=("volcano", "coscheduling", "none"), default="volcano",
                   help="platform.kubernetes.gang.mode: volcano and coscheduling make a PodGroup per attempt")
    p.add_argument("--no-disruption-budget", action="store_true",
                   help="platform.kubernetes.disruption_budget: false (default: a PodDisruptionBudget per attempt)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "kube_api_load.md")
    args = p.parse_args()
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # "connection pool is full" under the delete burst
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    commit = git_state("supervisor")
    t0 = time.monotonic()
    loads = [os.getloadavg()[0]]
    api = FakeKubeAPIServer(history_size=20000).start()  # a launch's 1,024 creates plus statuses in the history
    try:
        with tempfile.TemporaryDirectory(prefix="kube-api-load-") as tmp:
            out = asyncio.run(measure(api, args.pods, args.steady, Path(tmp), args.gang,
                                      not args.no_disruption_budget))
    finally:
        api.stop()
    loads.append(os.getloadavg()[0])
    text = report(args, out, started, time.monotonic() - t0, commit, loads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
