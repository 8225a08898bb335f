"""A fake kubelet and a minimal scheduler: the pods of a namespace become local processes.

Pairs with :mod:`fakes.kube_apiserver`. It talks to the API server only through the official
``kubernetes`` client (list + watch with resourceVersion, relist on 410, the binding and status
subresources, Secrets), on background threads, so synchronous tests and an asyncio controller
in the same process both work. What it models:

- N Nodes ``fake-node-0``... (label ``kubernetes.io/hostname``), each Ready with an InternalIP
  ``127.0.0.(i+2)``; a pod's ``podIP`` and ``hostIP`` are its node's IP (host-network-like:
  every "node" is this machine, every IP a loopback address);
- a scheduler: a pod without ``spec.nodeName`` (and the default scheduler) is bound through
  ``pods/binding`` to a Ready, schedulable node with a free slot (``pods_per_node`` pods that
  have not terminated) that satisfies ``spec.nodeSelector`` and the required node affinity
  (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``; ``matchFields`` on
  ``metadata.name``), the least loaded first; otherwise ``PodScheduled=False``/``Unschedulable``
  and another try whenever a pod or a node changes;
- the kubelet: the one container's ``command`` runs as a local process in a session of its
  own, environment = ``os.environ`` + ``TMPDIR`` (fresh per pod) + ``POD_NAME``,
  ``POD_NAMESPACE``, ``POD_IP``, ``NODE_NAME`` + the container's ``env`` (which wins; values
  from ``secretKeyRef``, ``configMapKeyRef`` and ``fieldRef``, ``$(VAR)`` expanded as the
  kubelet does), ``workingDir``, stdout+stderr to ``log_dir/<namespace>_<pod>.log``. Status
  through ``pods/status``: Running with ``startTime``, IPs, conditions and
  ``containerStatuses[0].state.running``; on exit Succeeded/Failed with
  ``state.terminated`` (``exitCode`` 128+N for a signal N, ``Completed``/``Error``). A missing
  Secret or key leaves the pod Pending with ``CreateContainerConfigError`` (retried); a
  command that cannot be executed ends it Failed with ``StartError`` (exit code 128);
- the container's processes: the main process, its process group, its descendants and every
  process carrying ``FAKE_KUBELET_POD_UID=<uid>`` in its environment (set for each pod; the
  stand-in for a cgroup, it follows torchrun ranks, which get sessions of their own). When
  the main process exits the rest are SIGKILLed, as the end of a pid namespace does;
- graceful deletion: SIGTERM to the main process group, SIGKILL to every container process
  after ``deletionGracePeriodSeconds`` (a later, shorter one wins), then the final status and
  :meth:`FakeKubeAPIServer.finish_deletion`; a pod that vanishes (grace 0) is SIGKILLed at once;
- faults: :meth:`FakeKubelet.node_not_ready` / :meth:`~FakeKubelet.node_ready` (SIGSTOP /
  SIGCONT and the Ready condition; the kubelet keeps serving the API meanwhile, so a delete
  still ends in SIGKILL), :meth:`~FakeKubelet.kill_node` (SIGKILL, Ready=Unknown, and the
  kubelet of that node falls silent: nothing more is reported or acted on for its pods until
  :meth:`~FakeKubelet.node_ready` brings it back), :meth:`~FakeKubelet.evict`,
  :meth:`~FakeKubelet.preempt` and :meth:`~FakeKubelet.kill_pod_process`. The node faults
  return once the scheduler's node cache holds the new condition: a pod created next is
  scheduled against it.

Not modelled: images and pulls, cgroups and resource limits, namespaces/isolation (all pods
share this host's network, filesystem and pids), probes, restarts (only ``restartPolicy:
Never`` behaves as specified), init and sidecar containers, volumes (env from Secrets and
ConfigMaps is all), taints and tolerations, priorities, node heartbeats and leases, the node
lifecycle controller (a NotReady node's pods are not evicted), ``activeDeadlineSeconds``.
SIGTERM goes to the main process's group (a container runtime signals only PID 1).
The scheduler counts only the pods this kubelet watches (its namespace and selector).

Usage::

    with FakeKubeAPIServer() as api, FakeKubelet(api, "default", nodes=2, log_dir=tmp) as kubelet:
        v1.create_namespaced_pod("default", {...})
        kubelet.wait_phase("p0", "Running")
        kubelet.node_not_ready("fake-node-0")
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

JSON = dict[str, Any]

MARKER = "FAKE_KUBELET_POD_UID"
"""The environment variable that marks every process of a pod's container."""

USER_AGENT = "fake-kubelet/1.37"
TERMINAL = ("Succeeded", "Failed")


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(conditions: list[JSON], type_: str, status: str, reason: str | None = None,
                   message: str | None = None) -> None:
    """Set one condition in place; ``lastTransitionTime`` moves only when the status does."""
    now = _timestamp()
    for cond in conditions:
        if cond.get("type") == type_:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            cond["status"] = status
            for key, value in (("reason", reason), ("message", message)):
                if value is None:
                    cond.pop(key, None)
                else:
                    cond[key] = value
            return
    new: JSON = {"type": type_, "status": status, "lastTransitionTime": now}
    if reason is not None:
        new["reason"] = reason
    if message is not None:
        new["message"] = message
    conditions.append(new)


def _condition(obj: JSON, type_: str) -> JSON | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def exit_code(returncode: int) -> int:
    """What a container runtime reports: the exit status, or 128+N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# --- processes ------------------------------------------------------------------------------------

def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def proc_state(pid: int) -> str | None:
    """The kernel's state letter of ``pid`` (R, S, T, Z, ...), or None when it is gone."""
    stat = _proc_stat(pid)
    return stat[0] if stat else None


def _alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def _container_pids(main: int, uid: str, main_alive: bool = True) -> set[int]:
    """Live processes of a container: ``main``'s group, its descendants, the marked ones.

    Once ``main`` is reaped its pid may be reused: then only the group (whose id Linux does not
    hand out again while it has members) and the marked processes count, with descendants.
    """
    needle = f"{MARKER}={uid}".encode()
    stats: dict[int, tuple[str, int, int]] = {}
    marked: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        stats[pid] = stat
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    marked.add(pid)
        except OSError:
            pass
    found = marked | {pid for pid, (_, _, pgrp) in stats.items() if pgrp == main}
    if main_alive and main in stats:
        found.add(main)
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found) + ([main] if main_alive else [])
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(os.getpid())
    return found


# --- scheduling -----------------------------------------------------------------------------------

def _match_expression(expr: JSON, labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    present, value = key in labels, labels.get(key)
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        try:
            have, want = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_matches(pod: JSON, node: JSON) -> bool:
    """``spec.nodeSelector`` and the required node affinity of ``pod`` against ``node``."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in required.get("nodeSelectorTerms") or []:     # terms are ORed, expressions ANDed
        exprs, field_exprs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not field_exprs:
            continue        # an empty term matches nothing
        if all(_match_expression(e, labels) for e in exprs) and \
                all(_match_expression(e, fields) for e in field_exprs):
            return True
    return False


def node_is_ready(node: JSON) -> bool:
    cond = _condition(node, "Ready")
    return bool(cond and cond.get("status") == "True")


# --- environment ----------------------------------------------------------------------------------

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined names replaced, ``$$`` escapes a ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_REF.sub(sub, text)


class ConfigError(Exception):
    """The container cannot be configured (``CreateContainerConfigError``)."""


@dataclass
class _Container:
    pod: str
    uid: str
    node: str
    popen: subprocess.Popen
    log_path: Path
    tmpdir: Path
    started_at: str
    container_id: str
    status_lock: threading.Lock = field(default_factory=threading.Lock)
    exited: threading.Event = field(default_factory=threading.Event)
    finished_at: str | None = None
    reported: bool = False              # the terminated status is written
    terminating: bool = False           # a graceful deletion is under way
    kill_at: float | None = None        # monotonic time of the SIGKILL
    finished_deletion: bool = False
    waiter: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


class FakeKubelet:
    """See the module docstring. ``start()``/``stop()`` or ``with FakeKubelet(api) as kubelet:``.

    ``api``: the :class:`~fakes.kube_apiserver.FakeKubeAPIServer`; ``namespace``: the pods it
    runs; ``nodes``: how many Nodes it registers and runs; ``pods_per_node``: the pods a node
    holds; ``log_dir``: where pod logs go (a temporary directory by default);
    ``label_selector``: only pods that match; ``node_labels``: extra labels per node name;
    ``node_prefix``: the node names' prefix.
    """

    def __init__(self, api: Any, namespace: str = "default", *, nodes: int = 2, pods_per_node: int = 1,
                 log_dir: str | os.PathLike | None = None, label_selector: str | None = None,
                 node_labels: dict[str, dict[str, str]] | None = None,
                 node_prefix: str = "fake-node-") -> None:
        self.api = api
        self.namespace = namespace
        self.pods_per_node = pods_per_node
        self.label_selector = label_selector
        self.nodes = [f"{node_prefix}{i}" for i in range(nodes)]
        self._ips = {name: f"127.0.0.{i + 2}" for i, name in enumerate(self.nodes)}
        self._node_labels = node_labels or {}
        self._own_dir = tempfile.mkdtemp(prefix="fake-kubelet-")
        self.log_dir = Path(log_dir) if log_dir is not None else Path(self._own_dir) / "logs"
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._pods: dict[str, JSON] = {}            # the watch cache: name -> pod
        self._nodes: dict[str, JSON] = {}
        self._containers: dict[str, _Container] = {}  # pod uid -> container
        self._dead: set[str] = set()                # nodes whose kubelet is killed
        self._assumed: dict[str, str] = {}           # pod name -> node, bound but not yet seen
        self._dirty: set[str] = set()
        self._schedule = False
        self._config_errors: set[str] = set()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, watch.Watch] = {}
        self._synced = {"pods": threading.Event(), "nodes": threading.Event()}
        self._v1: client.CoreV1Api | None = None

    # --- lifecycle ---

    def start(self) -> Self:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        api_client = client.ApiClient(self.api.configuration())
        api_client.user_agent = USER_AGENT
        self._v1 = client.CoreV1Api(api_client)
        for target, name in ((self._watch_loop, "pods"), (self._watch_loop, "nodes"), (self._work, None)):
            thread = threading.Thread(target=target, args=(name,) if name else (),
                                      name=f"fake-kubelet-{name or 'worker'}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for kind, synced in self._synced.items():
            if not synced.wait(30):
                raise RuntimeError(f"the fake kubelet could not list {kind}")
        for name in self.nodes:
            self._register_node(name)
        return self

    def stop(self) -> None:
        """Kill every process it started and wait for them; end its threads."""
        self._stopping.set()
        with self._lock:
            self._wake.notify_all()
        deadline = time.monotonic() + 10
        for thread in self._threads:        # no pod starts after this
            while thread.is_alive() and time.monotonic() < deadline:
                for w in list(self._watches.values()):
                    w.stop()
                thread.join(timeout=0.1)
        self._threads = []
        with self._lock:
            containers = list(self._containers.values())
        for c in containers:
            self._signal_container(c, signal.SIGKILL)
        for c in containers:
            try:
                c.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self._reap_rest(c)
            if c.waiter is not None:
                c.waiter.join(timeout=5)
        if self._v1 is not None:
            self._v1.api_client.close()
        shutil.rmtree(self._own_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what tests read ---

    @property
    def v1(self) -> client.CoreV1Api:
        assert self._v1 is not None, "start() the kubelet first"
        return self._v1

    def node_ip(self, node: str) -> str:
        return self._ips[node]

    def log_path(self, pod: str) -> Path:
        """The pod's log file (``kubectl logs``); it exists once the container has started."""
        return self.log_dir / f"{self.namespace}_{pod}.log"

    def logs(self, pod: str) -> str:
        try:
            return self.log_path(pod).read_text(errors="replace")
        except OSError:
            return ""

    def _current(self, pod: str) -> _Container | None:
        """The newest container of the pod named ``pod``."""
        with self._lock:
            found = [c for c in self._containers.values() if c.pod == pod]
        return found[-1] if found else None

    def pid(self, pod: str) -> int | None:
        """The pid of the pod's main process while it runs, else None."""
        c = self._current(pod)
        return c.pid if c is not None and c.popen.returncode is None else None

    def container_pids(self, pod: str) -> set[int]:
        """Every live process of the pod's container (main, group, descendants, marked)."""
        c = self._current(pod)
        return _container_pids(c.pid, c.uid, c.popen.returncode is None) if c is not None else set()

    def pods_running(self) -> dict[str, int]:
        """Pod name -> pid of the main process, for every pod whose process runs."""
        with self._lock:
            containers = list(self._containers.values())
        return {c.pod: c.pid for c in containers if c.popen.returncode is None}

    def wait_phase(self, pod: str, phase: str, timeout: float = 10.0) -> client.V1Pod:
        """Poll the API until the pod's ``status.phase`` is ``phase``; the pod, as the client reads it."""
        deadline = time.monotonic() + timeout
        seen = None
        while True:
            try:
                current = self.v1.read_namespaced_pod(pod, self.namespace)
                seen = current.status.phase if current.status else None
                if seen == phase:
                    return current
                if seen in TERMINAL and phase not in TERMINAL:
                    raise AssertionError(f"pod {pod} ended {seen} while waiting for {phase}:\n"
                                         f"{current.status}\n{self.logs(pod)[-3000:]}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
                seen = "<gone>"
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {pod} is {seen}, not {phase}, after {timeout}s\n"
                                     f"{current.status if seen not in (None, '<gone>') else ''}\n"
                                     f"{self.logs(pod)[-3000:]}")
            time.sleep(0.02)

    def wait_gone(self, pod: str, timeout: float = 10.0) -> None:
        """Poll the API until the pod no longer exists."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.v1.read_namespaced_pod(pod, self.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {pod} still exists after {timeout}s")
            time.sleep(0.02)

    # --- faults ---

    def node_not_ready(self, node: str) -> None:
        """SIGSTOP every process of the node's pods; the node's Ready condition goes False."""
        for c in self._node_containers(node):
            self._signal_container(c, signal.SIGSTOP)
        self._set_node_ready(node, "False", "KubeletNotReady", "the fake kubelet stopped the node's pods")

    def node_ready(self, node: str) -> None:
        """SIGCONT the node's pods, Ready=True; a killed node's kubelet comes back and resyncs."""
        with self._lock:
            revived = node in self._dead
            self._dead.discard(node)
        for c in self._node_containers(node):
            self._signal_container(c, signal.SIGCONT)
        self._set_node_ready(node, "True", "KubeletReady", "kubelet is posting ready status")
        if revived:
            for c in self._node_containers(node):
                if c.exited.is_set() and not (c.reported and (c.finished_deletion or not c.terminating)):
                    threading.Thread(target=self._report_exit, args=(c,), daemon=True).start()
            with self._lock:
                self._dirty.update(p for p, obj in self._pods.items()
                                   if (obj.get("spec") or {}).get("nodeName") == node)
                self._wake.notify_all()

    def kill_node(self, node: str) -> None:
        """SIGKILL every process of the node's pods, Ready=Unknown; its kubelet reports nothing more."""
        with self._lock:
            self._dead.add(node)
        for c in self._node_containers(node):
            self._signal_container(c, signal.SIGKILL)
        self._set_node_ready(node, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")

    def evict(self, pod: str) -> None:
        """The Eviction API: ``DisruptionTarget`` (EvictionByEvictionAPI), then a graceful delete."""
        self._disrupt(pod, "EvictionByEvictionAPI", "Eviction API: evicting")

    def preempt(self, pod: str) -> None:
        """Scheduler preemption: ``DisruptionTarget`` (PreemptionByScheduler), then a graceful delete."""
        self._disrupt(pod, "PreemptionByScheduler",
                      "default-scheduler: preempting to accommodate a higher priority pod")

    def kill_pod_process(self, pod: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the pod's main process only."""
        pid = self.pid(pod)
        if pid is None:
            raise LookupError(f"pod {pod} has no running process")
        os.kill(pid, sig)

    def _disrupt(self, pod: str, reason: str, message: str) -> None:
        raw = self._read_pod(pod)
        if raw is None:
            raise LookupError(f"pod {self.namespace}/{pod} not found")

        def add(status: JSON) -> JSON:
            _set_condition(status.setdefault("conditions", []), "DisruptionTarget", "True", reason, message)
            return status
        self._update_pod_status(pod, raw["metadata"]["uid"], add)
        # the pod's terminationGracePeriodSeconds (the API server's default: 30)
        self.v1.delete_namespaced_pod(pod, self.namespace)

    # --- nodes ---

    def _node_containers(self, node: str) -> list[_Container]:
        with self._lock:
            return [c for c in self._containers.values() if c.node == node]

    def _register_node(self, name: str) -> None:
        ip = self._ips[name]
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  **self._node_labels.get(name, {})}
        status: JSON = {
            "conditions": [],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "capacity": {"pods": str(self.pods_per_node)},
            "allocatable": {"pods": str(self.pods_per_node)},
            "nodeInfo": {"kubeletVersion": "v1.37.0-fake", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "fake://local-processes",
                         "bootID": f"boot-{name}", "kernelVersion": os.uname().release, "kubeProxyVersion": "",
                         "machineID": f"machine-{name}", "osImage": "fake", "systemUUID": f"uuid-{name}"},
        }
        _set_condition(status["conditions"], "Ready", "True", "KubeletReady", "kubelet is posting ready status")
        try:
            created = self.v1.create_node({"metadata": {"name": name, "labels": labels}, "spec": {},
                                           "status": status}, _preload_content=False)
            self._wait_cached(name, int(json.loads(created.data)["metadata"]["resourceVersion"]))
        except ApiException as exc:
            if exc.status != 409:
                raise
            self._set_node_ready(name, "True", "KubeletReady", "kubelet is posting ready status")

    def _set_node_ready(self, node: str, status: str, reason: str, message: str) -> None:
        for _ in range(20):
            raw = json.loads(self.v1.read_node(node, _preload_content=False).data)
            new = copy.deepcopy(raw)
            conds = new.setdefault("status", {}).setdefault("conditions", [])
            _set_condition(conds, "Ready", status, reason, message)
            for cond in conds:
                if cond["type"] == "Ready":
                    cond["lastHeartbeatTime"] = _timestamp()
            try:
                written = json.loads(self.v1.replace_node_status(node, new, _preload_content=False).data)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            else:
                # the scheduler decides from the watch cache: return once it holds this write
                self._wait_cached(node, int(written["metadata"]["resourceVersion"]))
                return
        raise RuntimeError(f"could not update node {node}: too many conflicts")

    def _wait_cached(self, node: str, rv: int, timeout: float = 10.0) -> None:
        with self._lock:
            if not self._wake.wait_for(lambda: int((self._nodes.get(node) or {}).get("metadata", {})
                                                   .get("resourceVersion", 0)) >= rv
                                       or self._stopping.is_set(), timeout):
                raise RuntimeError(f"the node watch never delivered {node} at resourceVersion {rv}")

    # --- list + watch ---

    def _list(self, kind: str) -> tuple[list[JSON], str]:
        if kind == "pods":
            resp = self.v1.list_namespaced_pod(self.namespace, label_selector=self.label_selector,
                                               _preload_content=False)
        else:
            resp = self.v1.list_node(_preload_content=False)
        body = json.loads(resp.data)
        return body.get("items") or [], body["metadata"]["resourceVersion"]

    def _watch_loop(self, kind: str) -> None:
        rv: str | None = None
        func = self.v1.list_namespaced_pod if kind == "pods" else self.v1.list_node
        args = (self.namespace,) if kind == "pods" else ()
        kwargs: JSON = {"label_selector": self.label_selector} if kind == "pods" and self.label_selector else {}
        while not self._stopping.is_set():
            try:
                if rv is None:
                    items, rv = self._list(kind)
                    self._replace(kind, items)
                    self._synced[kind].set()
                w = watch.Watch()
                self._watches[kind] = w
                if self._stopping.is_set():
                    return
                # timeout_seconds: the client leaves re-watching (and 410) to this loop
                for ev in w.stream(func, *args, resource_version=rv, allow_watch_bookmarks=True,
                                   timeout_seconds=60, **kwargs):
                    obj = ev["raw_object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] != "BOOKMARK":
                        self._apply(kind, ev["type"], obj)
            except ApiException as exc:
                if self._stopping.is_set():
                    return
                if exc.status == 410:
                    rv = None           # too old: list again
                else:
                    self._stopping.wait(0.2)
            except (OSError, urllib3.exceptions.HTTPError, ValueError):   # a dropped connection: watch again
                if self._stopping.is_set():
                    return
                self._stopping.wait(0.2)

    def _replace(self, kind: str, items: list[JSON]) -> None:
        """A (re)list: the cache becomes the list; what vanished counts as deleted."""
        with self._lock:
            cache = self._pods if kind == "pods" else self._nodes
            fresh = {o["metadata"]["name"]: o for o in items}
            changed = set(cache) | set(fresh)
            cache.clear()
            cache.update(fresh)
            if kind == "pods":
                self._dirty |= changed
            self._schedule = True
            self._wake.notify_all()

    def _apply(self, kind: str, type_: str, obj: JSON) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            cache = self._pods if kind == "pods" else self._nodes
            if type_ == "DELETED":
                cache.pop(name, None)
            else:
                cache[name] = obj
            if kind == "pods":
                self._dirty.add(name)
            self._schedule = True
            self._wake.notify_all()

    # --- the worker: scheduling and pod sync ---

    def _work(self) -> None:
        next_retry = time.monotonic() + 0.5
        while not self._stopping.is_set():
            with self._lock:
                self._wake.wait_for(lambda: self._dirty or self._schedule or self._stopping.is_set(),
                                    timeout=max(0.0, next_retry - time.monotonic()))
                if self._stopping.is_set():
                    return
                if time.monotonic() >= next_retry:
                    self._dirty |= self._config_errors   # the kubelet's periodic resync
                    next_retry = time.monotonic() + 0.5
                dirty, self._dirty = self._dirty, set()
                schedule, self._schedule = self._schedule, False
            for name in sorted(dirty):
                try:
                    self._sync_pod(name)
                except Exception as exc:   # noqa: BLE001 - an API hiccup: try again on the next pass
                    if self._stopping.is_set():
                        return
                    print(f"fake kubelet: sync of pod {name} failed: {exc!r}")
                    with self._lock:
                        self._dirty.add(name)
                    self._stopping.wait(0.1)
            if schedule:
                try:
                    self._schedule_pending()
                except Exception as exc:   # noqa: BLE001 - the same: the next pass tries again
                    if self._stopping.is_set():
                        return
                    print(f"fake kubelet: scheduling failed: {exc!r}")
                    with self._lock:
                        self._schedule = True
                    self._stopping.wait(0.1)

    def _node_load(self) -> dict[str, int]:
        """Non-terminated pods per node, the ones just bound included."""
        load = dict.fromkeys(self.nodes, 0)
        with self._lock:
            for name, pod in self._pods.items():
                node = (pod.get("spec") or {}).get("nodeName") or self._assumed.get(name)
                if node in load and (pod.get("status") or {}).get("phase") not in TERMINAL:
                    load[node] += 1
        return load

    def _schedule_pending(self) -> None:
        with self._lock:
            for name in [n for n, node in self._assumed.items()
                         if (self._pods.get(n) or {}).get("spec", {}).get("nodeName") or n not in self._pods]:
                del self._assumed[name]
            pending = sorted(
                (p for n, p in self._pods.items()
                 if n not in self._assumed and not (p.get("spec") or {}).get("nodeName")
                 and not p["metadata"].get("deletionTimestamp")
                 and (p.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"
                 and (p.get("status") or {}).get("phase", "Pending") == "Pending"),
                key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
            nodes = [copy.deepcopy(self._nodes[n]) for n in self.nodes if n in self._nodes]
        for pod in pending:
            name = pod["metadata"]["name"]
            load = self._node_load()
            not_ready = [n for n in nodes if not node_is_ready(n)]
            cordoned = [n for n in nodes if node_is_ready(n) and (n.get("spec") or {}).get("unschedulable")]
            usable = [n for n in nodes if n not in not_ready and n not in cordoned]
            mismatched = [n for n in usable if not node_matches(pod, n)]
            full = [n for n in usable if n not in mismatched and load[n["metadata"]["name"]] >= self.pods_per_node]
            fits = [n for n in usable if n not in mismatched and n not in full]
            if not fits:
                reasons = [f"{len(group)} {what}" for group, what in (
                    (not_ready, "node(s) were not ready"),
                    (cordoned, "node(s) were unschedulable"),
                    (mismatched, "node(s) didn't match Pod's node affinity/selector"),
                    (full, "Too many pods")) if group]
                message = f"0/{len(nodes)} nodes are available: {', '.join(reasons)}."
                cond = _condition(pod, "PodScheduled")
                if not cond or (cond.get("status"), cond.get("reason"), cond.get("message")) != \
                        ("False", "Unschedulable", message):
                    def unschedulable(status: JSON, message: str = message) -> JSON | None:
                        if (status.get("phase") or "Pending") != "Pending":
                            return None
                        status["phase"] = "Pending"
                        _set_condition(status.setdefault("conditions", []), "PodScheduled", "False",
                                       "Unschedulable", message)
                        return status
                    self._update_pod_status(name, pod["metadata"]["uid"], unschedulable)
                continue
            target = min(fits, key=lambda n: (load[n["metadata"]["name"]], n["metadata"]["name"]))
            node = target["metadata"]["name"]
            body = client.V1Binding(metadata=client.V1ObjectMeta(name=name, uid=pod["metadata"]["uid"]),
                                    target=client.V1ObjectReference(kind="Node", name=node))
            try:
                # _preload_content=False: the answer is a Status the client would misread as a
                # Binding (kubernetes-client/python#825)
                self.v1.create_namespaced_pod_binding(name, self.namespace, body, _preload_content=False)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                continue
            with self._lock:
                self._assumed[name] = node

    def _sync_pod(self, name: str) -> None:
        with self._lock:
            pod = copy.deepcopy(self._pods.get(name))
            stale = [c for c in self._containers.values()
                     if c.pod == name and (pod is None or pod["metadata"]["uid"] != c.uid)]
        for c in stale:          # the pod is gone (deleted with grace 0): kill at once
            if c.node not in self._dead and not c.exited.is_set():
                self._signal_container(c, signal.SIGKILL)
        if pod is None:
            self._config_errors.discard(name)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self._ips or node in self._dead:
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            c = self._containers.get(uid)
        phase = (pod.get("status") or {}).get("phase")
        if pod["metadata"].get("deletionTimestamp"):
            self._config_errors.discard(name)
            grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            if c is None:
                self._finish_deletion(name)
            else:
                self._terminate(c, grace)
            return
        if c is None and phase not in TERMINAL:
            self._start(pod, node)

    # --- running a pod ---

    def _read_pod(self, name: str) -> JSON | None:
        try:
            return json.loads(self.v1.read_namespaced_pod(name, self.namespace, _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _update_pod_status(self, name: str, uid: str, mutate: Callable[[JSON], JSON | None]) -> bool:
        """Read, change the status with ``mutate`` (None: leave it), write with the resourceVersion."""
        for _ in range(50):
            raw = self._read_pod(name)
            if raw is None or raw["metadata"]["uid"] != uid:
                return False
            old = raw.get("status") or {}
            new = mutate(copy.deepcopy(old))
            if new is None or new == old:
                return True
            raw["status"] = new
            try:
                self.v1.replace_namespaced_pod_status(name, self.namespace, raw, _preload_content=False)
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise
        raise RuntimeError(f"could not update the status of pod {name}: too many conflicts")

    def _secret_value(self, kind: str, ref: JSON) -> str | None:
        name, key, optional = ref.get("name"), ref.get("key"), bool(ref.get("optional"))
        try:
            if kind == "Secret":
                obj = json.loads(self.v1.read_namespaced_secret(name, self.namespace, _preload_content=False).data)
            else:
                obj = json.loads(self.v1.read_namespaced_config_map(name, self.namespace, _preload_content=False).data)
        except ApiException as exc:
            if exc.status != 404:
                raise
            if optional:
                return None
            raise ConfigError(f'{kind.lower()} "{name}" not found') from None
        if kind == "Secret":
            data = obj.get("data") or {}
            if key in data:
                return base64.b64decode(data[key]).decode()
        else:
            data = obj.get("data") or {}
            if key in data:
                return data[key]
        if optional:
            return None
        raise ConfigError(f"couldn't find key {key} in {kind} {self.namespace}/{name}")

    def _field_value(self, pod: JSON, path: str, node: str) -> str:
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return (pod["metadata"].get(m.group(1)) or {}).get(m.group(2), "")
        values = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": self.namespace,
                  "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": node,
                  "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
                  "status.podIP": self._ips[node], "status.hostIP": self._ips[node]}
        if path not in values:
            raise ConfigError(f"unsupported fieldRef {path!r}")
        return values[path]

    def _container_env(self, pod: JSON, container: JSON, node: str) -> tuple[dict[str, str], dict[str, str]]:
        """(the process environment, the container's declared env for ``$(VAR)`` expansion)."""
        declared: dict[str, str] = {}
        for var in container.get("env") or []:
            source = var.get("valueFrom")
            if source is None:
                declared[var["name"]] = expand(str(var.get("value", "")), declared)
                continue
            if "secretKeyRef" in source:
                value = self._secret_value("Secret", source["secretKeyRef"])
            elif "configMapKeyRef" in source:
                value = self._secret_value("ConfigMap", source["configMapKeyRef"])
            elif "fieldRef" in source:
                value = self._field_value(pod, source["fieldRef"].get("fieldPath", ""), node)
            else:
                raise ConfigError(f"unsupported valueFrom {sorted(source)} for {var['name']}")
            if value is not None:
                declared[var["name"]] = value
        env = dict(os.environ)
        env.update(POD_NAME=pod["metadata"]["name"], POD_NAMESPACE=self.namespace,
                   POD_IP=self._ips[node], NODE_NAME=node)
        env.update(declared)
        env[MARKER] = pod["metadata"]["uid"]
        return env, declared

    def _start(self, pod: JSON, node: str) -> None:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        container = containers[0]
        ip = self._ips[node]
        with self._lock:
            load = sum(1 for c in self._containers.values() if c.node == node and not c.exited.is_set())
            node_obj = self._nodes.get(node)
        # the kubelet's admission: a pod bound past the scheduler still has to fit
        rejection = None
        if load >= self.pods_per_node:
            rejection = ("OutOfpods", "Pod was rejected: Node didn't have enough resource: pods")
        elif node_obj is not None and not node_matches(pod, node_obj):
            rejection = ("NodeAffinity", "Pod was rejected: Predicate NodeAffinity failed")
        if rejection is not None:
            def rejected(status: JSON) -> JSON:
                status.update(phase="Failed", reason=rejection[0], message=rejection[1])
                return status
            self._update_pod_status(name, uid, rejected)
            return
        try:
            if not container.get("command"):
                raise ConfigError("no command: the fake kubelet runs no images")
            env, declared = self._container_env(pod, container, node)
            argv = [expand(str(a), declared) for a in container["command"] + (container.get("args") or [])]
        except ConfigError as exc:
            self._config_errors.add(name)
            self._write_waiting(name, uid, ip, "CreateContainerConfigError", str(exc), container)
            return
        self._config_errors.discard(name)
        tmp_root = Path(self._own_dir) / "pods"
        tmp_root.mkdir(parents=True, exist_ok=True)
        tmpdir = Path(tempfile.mkdtemp(prefix=f"{self.namespace}_{name}-", dir=tmp_root))
        env["TMPDIR"] = str(tmpdir) if "TMPDIR" not in declared else declared["TMPDIR"]
        cwd = container.get("workingDir") or None
        if cwd:
            os.makedirs(cwd, exist_ok=True)
        log_path = self.log_path(name)
        started_at = _timestamp()
        with open(log_path, "wb") as log:
            try:
                popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                log.write(f"fake kubelet: cannot start {argv[0]!r}: {exc}\n".encode())
                self._write_start_error(name, uid, ip, str(exc), container, started_at)
                return
        c = _Container(pod=name, uid=uid, node=node, popen=popen, log_path=log_path, tmpdir=tmpdir,
                       started_at=started_at, container_id=f"fake://{node}/{popen.pid}")
        with c.status_lock:
            with self._lock:
                self._containers[uid] = c
            c.waiter = threading.Thread(target=self._wait_exit, args=(c,), name=f"fake-kubelet-wait-{name}",
                                        daemon=True)
            c.waiter.start()
            self._update_pod_status(name, uid, lambda status: self._running_status(status, c, container, ip))

    def _container_status(self, container: JSON, state: JSON, *, ready: bool, c: _Container | None) -> JSON:
        status: JSON = {"name": container.get("name", "agent"), "image": container.get("image", ""),
                        "imageID": "", "ready": ready, "restartCount": 0, "started": "running" in state,
                        "state": state}
        if c is not None:
            status["containerID"] = c.container_id
        return status

    def _kubelet_conditions(self, status: JSON, ready: bool, reason: str | None) -> None:
        conds = status.setdefault("conditions", [])
        _set_condition(conds, "PodScheduled", "True")
        _set_condition(conds, "Initialized", "True")
        for type_ in ("ContainersReady", "Ready"):
            _set_condition(conds, type_, "True" if ready else "False", None if ready else reason)

    def _running_status(self, status: JSON, c: _Container, container: JSON, ip: str) -> JSON | None:
        if status.get("phase") in TERMINAL or c.exited.is_set():
            return None
        status.update(phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP=ip, hostIPs=[{"ip": ip}])
        status.setdefault("startTime", c.started_at)
        self._kubelet_conditions(status, True, None)
        status["containerStatuses"] = [self._container_status(
            container, {"running": {"startedAt": c.started_at}}, ready=True, c=c)]
        return status

    def _write_waiting(self, name: str, uid: str, ip: str, reason: str, message: str, container: JSON) -> None:
        def waiting(status: JSON) -> JSON | None:
            if status.get("phase") not in (None, "Pending"):
                return None
            status.update(phase="Pending", hostIP=ip, hostIPs=[{"ip": ip}])
            status.setdefault("startTime", _timestamp())
            self._kubelet_conditions(status, False, "ContainersNotReady")
            status["containerStatuses"] = [self._container_status(
                container, {"waiting": {"reason": reason, "message": message}}, ready=False, c=None)]
            return status
        self._update_pod_status(name, uid, waiting)

    def _write_start_error(self, name: str, uid: str, ip: str, message: str, container: JSON,
                           started_at: str) -> None:
        def failed(status: JSON) -> JSON:
            status.update(phase="Failed", hostIP=ip, hostIPs=[{"ip": ip}], podIP=ip, podIPs=[{"ip": ip}])
            status.setdefault("startTime", started_at)
            self._kubelet_conditions(status, False, "PodFailed")
            status["containerStatuses"] = [self._container_status(container, {"terminated": {
                "exitCode": 128, "reason": "StartError", "message": message,
                "startedAt": started_at, "finishedAt": _timestamp()}}, ready=False, c=None)]
            return status
        self._update_pod_status(name, uid, failed)

    # --- exits and deletions ---

    def _signal_container(self, c: _Container, sig: int) -> None:
        """``sig`` to every process of the container, until no new one turns up."""
        seen: set[int] = set()
        for _ in range(5):
            pids = _container_pids(c.pid, c.uid, c.popen.returncode is None) - seen
            if c.popen.returncode is None:
                pids.add(c.pid)
            pids -= seen
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            seen |= pids

    def _reap_rest(self, c: _Container, timeout: float = 5.0) -> None:
        """The main process is gone: SIGKILL what is left of the container and wait for it."""
        deadline = time.monotonic() + timeout
        while True:
            rest = _container_pids(c.pid, c.uid, main_alive=False)
            if not rest or time.monotonic() > deadline:
                return
            for pid in rest:
                for sig in (signal.SIGKILL, signal.SIGCONT):
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.01)

    def _wait_exit(self, c: _Container) -> None:
        c.popen.wait()
        c.finished_at = _timestamp()
        self._reap_rest(c)
        c.exited.set()
        self._report_exit(c)
        with self._lock:
            self._schedule = True       # a slot is free
            self._wake.notify_all()

    def _report_exit(self, c: _Container) -> None:
        """Write the terminated status, and end a deletion, unless the node's kubelet is dead."""
        if self._stopping.is_set() or c.node in self._dead:
            return
        code = exit_code(c.popen.returncode)
        with self._lock:
            pod = self._pods.get(c.pod)
            containers = ((pod or {}).get("spec") or {}).get("containers") or [{}]
        container = containers[0]

        def terminated(status: JSON) -> JSON:
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            self._kubelet_conditions(status, False, "PodCompleted")
            status["containerStatuses"] = [self._container_status(container, {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "startedAt": c.started_at, "finishedAt": c.finished_at, "containerID": c.container_id}},
                ready=False, c=c)]
            return status
        try:
            with c.status_lock:
                if not c.reported:
                    self._update_pod_status(c.pod, c.uid, terminated)
                    c.reported = True
            if c.terminating and not c.finished_deletion:
                c.finished_deletion = True
                self._finish_deletion(c.pod)
        except Exception as exc:   # noqa: BLE001 - a thread of its own: say why and end
            if not self._stopping.is_set():
                print(f"fake kubelet: reporting the exit of pod {c.pod} failed: {exc!r}")

    def _finish_deletion(self, name: str) -> None:
        try:
            self.api.finish_deletion("pods", self.namespace, name)
        except LookupError:
            pass            # already gone (a delete with grace 0 came first)

    def _terminate(self, c: _Container, grace: int) -> None:
        """A graceful deletion: SIGTERM now, SIGKILL after ``grace`` (a shorter later one wins)."""
        with self._lock:
            kill_at = time.monotonic() + grace
            if c.terminating:
                if c.kill_at is not None and kill_at < c.kill_at:
                    c.kill_at = kill_at
                return
            c.terminating, c.kill_at = True, kill_at
        if c.exited.is_set():       # it ended before: the final status is (being) written
            threading.Thread(target=self._report_exit, args=(c,), daemon=True).start()
            return
        threading.Thread(target=self._kill_after_grace, args=(c,), name=f"fake-kubelet-term-{c.pod}",
                         daemon=True).start()

    def _kill_after_grace(self, c: _Container) -> None:
        try:
            os.killpg(c.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        while not c.exited.is_set() and not self._stopping.is_set():
            with self._lock:
                remaining = (c.kill_at or 0) - time.monotonic()
            if remaining <= 0:
                if c.node not in self._dead:
                    self._signal_container(c, signal.SIGKILL)
                return
            c.exited.wait(min(remaining, 0.05))
