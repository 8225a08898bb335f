"""A fake kubelet and a minimal scheduler: the pods of a namespace become local processes.

Pairs with :mod:`fakes.kube_apiserver`. It talks to the API server only through the official
``kubernetes`` client (list + watch with resourceVersion, relist on 410, the binding and status
subresources, Secrets), on background threads, so synchronous tests and an asyncio controller
in the same process both work. What it models:

- N Nodes ``fake-node-0``... (label ``kubernetes.io/hostname``), each Ready with an InternalIP
  ``127.0.0.(i+2)``; a pod's ``podIP`` and ``hostIP`` are its node's IP (host-network-like:
  every "node" is this machine, every IP a loopback address). ``status.capacity`` =
  ``status.allocatable`` = this host's cpu, memory and ephemeral-storage, ``pods`` =
  ``pods_per_node``, overridden by ``allocatable`` (every node) and ``node_allocatable`` (per
  node), extended resources (``nvidia.com/gpu``) included;
- a scheduler (kube-scheduler's default filters): a pod without ``spec.nodeName`` (and the
  default scheduler) is bound through ``pods/binding`` to a node that is not cordoned, has no
  untolerated NoSchedule/NoExecute taint (a NotReady node has ``node.kubernetes.io/not-ready``,
  a silent one ``node.kubernetes.io/unreachable``, as the node lifecycle controller adds them),
  satisfies ``spec.nodeSelector`` and the required node affinity, and fits: the requests of
  the non-terminated pods bound to it, in every namespace (a limit without a request counts as
  the request; init containers as the scheduler counts them), plus this one's, within its
  allocatable, and its pod count below ``pods``. Least loaded first, higher ``spec.priority``
  first. Otherwise ``PodScheduled=False``/``Unschedulable`` with the scheduler's message:
  ``0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2
  Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not
  helpful for scheduling, 2 No preemption victims found for incoming pod.`` (reasons ``Too many
  pods``, ``Insufficient <resource>``, ``node(s) were unschedulable``, ``node(s) had
  untolerated taint {key: value}``), and another try whenever a pod or a node changes. A pod
  with ``spec.schedulingGates`` is not tried: ``PodScheduled=False``/``SchedulingGated``
  ``Scheduling is blocked due to non-empty scheduling gates`` until an update removes them;
- kubelet admission, in the kubelet's order: the device manager (each extended resource of the
  node is served by a device plugin of ``allocatable`` healthy devices, changed by
  :meth:`~FakeKubelet.set_device_health` without touching the Node until
  :meth:`~FakeKubelet.publish_node_status`): too few free healthy devices is ``status.reason:
  UnexpectedAdmissionError``, ``Pod was rejected: Allocate failed due to requested number of
  devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected``
  (``no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu`` at 0);
  then the pod against the Node's allocatable: ``OutOf<resource>``, ``Pod was rejected: Node
  didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000`` (millicores,
  bytes, counts; ``OutOfpods``), then ``NodeAffinity``. A rejected pod is Failed with
  ``startTime`` and no ``containerStatuses``, never started;
- images: a fake registry (``images``, :data:`DEFAULT_IMAGES` by default;
  :meth:`~FakeKubelet.add_image`). References are parsed and normalized as
  distribution/reference does; an unparsable one waits with ``InvalidImageName`` (``Failed to
  apply default image tag "Bad Image": couldn't parse image name "Bad Image": invalid reference
  format...``); an image the registry lacks waits with ``ErrImagePull`` (containerd's ``rpc
  error: code = NotFound desc = failed to pull and unpack image "docker.io/library/nope:1":
  ...: not found``, or ``no such host`` for a registry it has never heard of), then
  ``ImagePullBackOff`` (``Back-off pulling image "nope:1"``) halfway through the back-off, then
  a new pull; the back-off doubles from ``image_pull_backoff_s`` to ``image_pull_backoff_max_s``.
  ``imagePullPolicy: Never`` and an image not there: ``ErrImageNeverPull``. A started
  container reports ``image`` (``docker.io/library/trainer:1``) and ``imageID``
  (``docker.io/library/trainer@sha256:<hex>``). While it waits the pod is Pending with
  ``Ready``/``ContainersReady`` False, ``ContainersNotReady``, ``containers with unready
  status: [agent]``;
- the kubelet: the one container's ``command`` runs as a local process in a session of its
  own, environment = ``os.environ`` + ``TMPDIR`` (fresh per pod) + ``POD_NAME``,
  ``POD_NAMESPACE``, ``POD_IP``, ``NODE_NAME`` + the container's ``env`` (which wins; values
  from ``secretKeyRef``, ``configMapKeyRef`` and ``fieldRef``, ``$(VAR)`` expanded as the
  kubelet does), ``workingDir``, stdout+stderr to ``log_dir/<namespace>_<pod>.log``. Status
  through ``pods/status``: Running with ``startTime``, IPs, conditions and
  ``containerStatuses[0].state.running``; on exit Succeeded/Failed with
  ``state.terminated`` (``exitCode`` 128+N for a signal N, ``Completed``/``Error``,
  ``Ready`` reason PodCompleted/PodFailed). A missing Secret or key leaves the pod Pending with
  ``CreateContainerConfigError`` (``secret "x" not found``, ``couldn't find key token in
  Secret ns/x``; retried); a command that cannot be executed ends it Failed with
  ``StartError`` (exit code 128);
- memory limits: a container with ``resources.limits.memory`` runs in a memory cgroup of its
  own under this process's (v1 ``memory.limit_in_bytes``, or v2 ``memory.max`` with
  ``memory.oom.group``) when the host allows it (:attr:`~FakeKubelet.enforces_memory`), so the
  kernel OOM-kills past the limit; at the first OOM kill the whole container is SIGKILLed (as
  1.28+ on cgroup v2) and ends ``terminated.reason: OOMKilled``, exit code 137, the pod
  Failed. The cgroup goes with the container; a container without a memory limit never
  touches cgroups. Other limits (cpu) are not enforced;
- the container's processes: the main process, its process group, its descendants and every
  process carrying ``FAKE_KUBELET_POD_UID=<uid>`` in its environment (set for each pod; the
  stand-in for a cgroup, it follows torchrun ranks, which get sessions of their own). When
  the main process exits the rest are SIGKILLed, as the end of a pid namespace does;
- graceful deletion: SIGTERM to the main process group, SIGKILL to every container process
  after ``deletionGracePeriodSeconds`` (a later, shorter one wins), then the final status and
  :meth:`FakeKubeAPIServer.finish_deletion`; a pod that vanishes (grace 0) is SIGKILLed at once;
- faults: :meth:`FakeKubelet.node_not_ready` / :meth:`~FakeKubelet.node_ready` (SIGSTOP /
  SIGCONT, the Ready condition and the not-ready taint; the kubelet keeps serving the API
  meanwhile, so a delete still ends in SIGKILL), :meth:`~FakeKubelet.kill_node` (SIGKILL,
  Ready=Unknown, the unreachable taint, and the kubelet of that node falls silent: nothing
  more is reported or acted on for its pods until :meth:`~FakeKubelet.node_ready` brings it
  back), :meth:`~FakeKubelet.evict`, :meth:`~FakeKubelet.preempt`,
  :meth:`~FakeKubelet.kill_pod_process`, :meth:`~FakeKubelet.set_device_health` and
  :meth:`~FakeKubelet.evict_for_pressure` (node-pressure eviction: ``DisruptionTarget``
  True/``TerminationByKubelet`` with ``The node was low on resource: memory. Threshold
  quantity: 100Mi, available: 52Mi. Container agent was using 10528Ki, request is 0, has larger
  consumption of memory. ``, SIGTERM, SIGKILL after the grace, then Failed with
  ``status.reason: Evicted`` and the same message; the pod object stays). The node faults
  return once the scheduler's node cache holds the new condition: a pod created next is
  scheduled against it.

Not modelled: preemption (no pod is ever preempted for a higher priority one: the message
always says no victims), namespaces/isolation (all pods share this host's network,
filesystem and pids), cpu limits, probes, restarts (only ``restartPolicy: Never`` behaves as
specified), init and sidecar containers (counted by the scheduler, not run), volumes (env from
Secrets and ConfigMaps is all), image entrypoints (a container needs a ``command``), pull
durations (``ContainerCreating``), Events, node heartbeats and leases, the taint manager and
node lifecycle evictions (a NotReady node's pods stay), ``activeDeadlineSeconds``. SIGTERM
goes to the main process's group (a container runtime signals only PID 1). The kubelet watches
pods of every namespace (for the scheduler and admission) and runs those of its namespace
and label selector.

Usage::

    with FakeKubeAPIServer() as api, FakeKubelet(api, "default", nodes=2, log_dir=tmp) as kubelet:
        v1.create_namespaced_pod("default", {...})
        kubelet.wait_phase("p0", "Running")
        kubelet.node_not_ready("fake-node-0")
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, Self

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from .kube_apiserver import (QuantityError, default_pull_policy, effective_requests, is_extended_resource,
                             parse_label_selector, parse_quantity)

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


# --- images: a fake registry ------------------------------------------------------------------------

DEFAULT_IMAGES: tuple[str, ...] = ("fake.invalid/worker:1", "trainer:1", "trainer:2", "img:1")
"""The images the fake registry holds unless told otherwise (the ones the project's tests name)."""

_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = _ALNUM + r"(?:" + _SEP + _ALNUM + r")*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = r"(?:" + _DOMAIN_COMPONENT + r"(?:\." + _DOMAIN_COMPONENT + r")*|\[(?:[a-fA-F0-9:]+)\])"
_IMAGE_NAME = r"(?:" + _HOST + r"(?::[0-9]+)?/)?" + _PATH_COMPONENT + r"(?:/" + _PATH_COMPONENT + r")*"
_REFERENCE = re.compile(r"(" + _IMAGE_NAME + r")(?::([\w][\w.-]{0,127}))?"
                        r"(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}))?", re.ASCII)


class ImageReferenceError(ValueError):
    """Not an image reference (the kubelet's ``InvalidImageName``); the message is distribution/reference's."""


def _split_docker_domain(name: str) -> tuple[str, str]:
    if "/" not in name:
        return "docker.io", "library/" + name
    maybe_domain, remote = name.split("/", 1)
    if maybe_domain == "index.docker.io":
        domain = "docker.io"
    elif maybe_domain == "localhost" or any(ch in maybe_domain for ch in ".:") or maybe_domain.lower() != maybe_domain:
        domain = maybe_domain
    else:
        domain, remote = "docker.io", name
    if domain == "docker.io" and "/" not in remote:
        remote = "library/" + remote
    return domain, remote


def normalize_image(image: str) -> tuple[str, str]:
    """(the reference the runtime pulls, e.g. ``docker.io/library/x:latest``, its repository
    ``docker.io/library/x``) as ParseNormalizedNamed and the kubelet's default tag make them.
    Raises :class:`ImageReferenceError`."""
    if re.fullmatch(r"[a-f0-9]{64}", image):
        raise ImageReferenceError(f"invalid repository name ({image}), cannot specify 64-byte hexadecimal strings")
    domain, remainder = _split_docker_domain(image)
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        raise ImageReferenceError(f"invalid reference format: repository name ({remote}) must be lowercase")
    full = f"{domain}/{remainder}"
    m = _REFERENCE.fullmatch(full)
    if not m:
        if _REFERENCE.fullmatch(full.lower()):
            raise ImageReferenceError("invalid reference format: repository name must be lowercase")
        raise ImageReferenceError("invalid reference format")
    name, tag, digest = m.groups()
    if len(name.split("/", 1)[1]) > 255:
        raise ImageReferenceError("repository name must not be more than 255 characters")
    if digest:
        return f"{name}@{digest}", name
    return f"{name}:{tag or 'latest'}", name


def image_id(ref: str) -> str:
    """The runtime's ``imageID`` (a repo digest) of a pulled reference: ``repo@sha256:<hex>``
    (a reference by digest is its own)."""
    if "@" in ref:
        return ref
    repo = ref.split("@", 1)[0]
    last = repo.rsplit("/", 1)
    if ":" in last[-1]:
        repo = repo.rsplit(":", 1)[0]
    return f"{repo}@sha256:{hashlib.sha256(ref.encode()).hexdigest()}"


def _pull_error(ref: str, known_hosts: set[str]) -> str:
    """What containerd says of a reference the registry does not have (the ``ErrImagePull`` message)."""
    head = f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}"'
    host = ref.split("/", 1)[0]
    if host in known_hosts:
        return f"rpc error: code = NotFound desc = {head}: {ref}: not found"
    name, _, tag = ref.partition("@")[0].rpartition(":")
    path = name.split("/", 1)[1]
    return (f'rpc error: code = Unknown desc = {head}: failed to do request: Head "https://{host}/v2/{path}/'
            f'manifests/{tag}": dial tcp: lookup {host.split(":")[0]}: no such host')


@dataclass
class _Pull:
    """A container whose image cannot be pulled: the kubelet's image back-off."""
    backoff_s: float
    retry_at: float                 # monotonic time of the next pull
    backoff_shown_at: float         # when the status turns to ImagePullBackOff
    shown: str = "ErrImagePull"


# --- memory limits: real cgroups ---------------------------------------------------------------------

class MemoryCgroups:
    """Memory cgroups for containers with ``resources.limits.memory``, under this process's own one.

    cgroup v1 (the memory controller's ``memory.limit_in_bytes``, ``memory.oom_control``'s
    ``oom_kill``) or v2 (``memory.max``, ``memory.swap.max`` 0, ``memory.oom.group`` 1,
    ``memory.events``' ``oom_kill``). Nothing is touched until a container needs it.
    """

    def __init__(self) -> None:
        self._probed = False
        self.version: int | None = None
        self.base: Path | None = None         # this process's memory cgroup
        self.why_not = ""
        self._root: Path | None = None        # this kubelet's folder under base
        self._lock = threading.Lock()

    @staticmethod
    def _own_cgroups() -> tuple[str | None, str | None]:
        v1 = v2 = None
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None, None
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if "memory" in parts[1].split(","):
                v1 = parts[2]
            elif parts[0] == "0" and parts[1] == "":
                v2 = parts[2]
        return v1, v2

    def available(self) -> bool:
        with self._lock:
            if not self._probed:
                self._probed = True
                self._probe()
            return self.version is not None

    def _probe(self) -> None:
        v1, v2 = self._own_cgroups()
        candidates: list[tuple[int, Path]] = []
        if v1 is not None:
            candidates.append((1, Path("/sys/fs/cgroup/memory") / v1.lstrip("/")))
        if v2 is not None:
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if (mount / "cgroup.controllers").exists():
                    candidates.append((2, mount / v2.lstrip("/")))
                    break
        reasons = []
        for version, base in candidates:
            if version == 2:
                try:
                    if "memory" not in (base / "cgroup.subtree_control").read_text().split():
                        (base / "cgroup.subtree_control").write_text("+memory")
                except OSError as exc:
                    reasons.append(f"cgroup v2 at {base}: no memory controller for children ({exc})")
                    continue
            probe = base / f"fake-kubelet-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            try:
                probe.mkdir()
                try:
                    (probe / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(64 << 20))
                finally:
                    probe.rmdir()
            except OSError as exc:
                reasons.append(f"cgroup v{version} at {base}: {exc}")
                continue
            self.version, self.base = version, base
            return
        self.why_not = "; ".join(reasons) or "no memory cgroup controller on this host"

    def create(self, name: str, limit: int) -> Path:
        """A cgroup limited to ``limit`` bytes (the container's processes join it at exec)."""
        assert self.base is not None
        with self._lock:
            if self._root is None:
                self._root = self.base / f"fake-kubelet-{os.getpid()}-{uuid.uuid4().hex[:6]}"
                self._root.mkdir()
        path = self._root / name
        path.mkdir()
        if self.version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit))
            try:                                   # no swap either (absent without swap accounting)
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
            except OSError:
                pass
        else:
            (path / "memory.max").write_text(str(limit))
            for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                try:
                    (path / knob).write_text(value)
                except OSError:
                    pass
        return path

    def oom_kills(self, path: Path) -> int:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            for line in (path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    @staticmethod
    def pids(path: Path) -> set[int]:
        try:
            return {int(p) for p in (path / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return set()

    def remove(self, path: Path, timeout: float = 5.0) -> None:
        """SIGKILL what is left in it and remove it."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids(path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)

    def close(self) -> None:
        with self._lock:
            root, self._root = self._root, None
        if root is not None:
            for child in list(root.iterdir()) if root.exists() else []:
                if child.is_dir():
                    self.remove(child)
            self.remove(root)


def _join_cgroup(procs: bytes) -> Callable[[], None]:
    """A preexec_fn: the child writes its pid into ``procs`` (a cgroup.procs path) before exec."""
    def join() -> None:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
    return join


# --- resources ---------------------------------------------------------------------------------------

def pod_requests(pod: JSON) -> dict[str, Fraction]:
    """What the scheduler counts for a pod: per resource, the sum over its containers (a limit
    without a request is the request) or the largest init container's, whichever is more."""
    spec = pod.get("spec") or {}
    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        for name, value in effective_requests(c).items():
            total[name] = total.get(name, Fraction(0)) + parse_quantity(value)
    for c in spec.get("initContainers") or []:
        for name, value in effective_requests(c).items():
            total[name] = max(total.get(name, Fraction(0)), parse_quantity(value))
    return {k: v for k, v in total.items() if v}


def resource_units(resource: str, amount: Fraction) -> int:
    """A quantity in the units the scheduler and kubelet print: millicores for cpu, else whole units."""
    value = amount * 1000 if resource == "cpu" else amount
    return -(-value.numerator // value.denominator)


def format_bytes(n: int) -> str:
    """Bytes as resource.Quantity writes them (BinarySI): ``10528Ki``, ``1Gi``, ``1000``."""
    for suffix, size in (("Ei", 2 ** 60), ("Pi", 2 ** 50), ("Ti", 2 ** 40), ("Gi", 2 ** 30), ("Mi", 2 ** 20),
                         ("Ki", 2 ** 10)):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def _rss_bytes(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    return total


def _host_allocatable(pods: int) -> dict[str, str]:
    """A node as big as this host (every fake node is this host)."""
    memory = "0"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1])}Ki"
    except (OSError, ValueError, IndexError):
        pass
    disk = shutil.disk_usage(tempfile.gettempdir()).total
    return {"cpu": str(os.cpu_count() or 1), "memory": memory, "ephemeral-storage": str(disk),
            "pods": str(pods)}


def _tolerates(tolerations: list[JSON], taint: JSON) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def node_taints(node: JSON) -> list[JSON]:
    """The node's taints, with the NoSchedule one the node lifecycle controller adds for a node that
    is not Ready (not-ready) or silent (unreachable), as soon as the condition says so."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    cond = _condition(node, "Ready")
    status = (cond or {}).get("status", "Unknown")
    implied = None if status == "True" else (NOT_READY_TAINT if status == "False" else UNREACHABLE_TAINT)
    if implied and not any(t.get("key") == implied and t.get("effect") == "NoSchedule" for t in taints):
        taints.append({"key": implied, "effect": "NoSchedule"})
    return taints

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
    cgroup: Path | None = None          # the memory cgroup (a container with a memory limit)
    oom_killed: bool = False            # the kernel's OOM killer fired in it
    evicted: str | None = None          # the eviction message (node-pressure eviction)
    image_ref: str = ""                 # the pulled reference, as the runtime names it
    image_id: str = ""

    @property
    def pid(self) -> int:
        return self.popen.pid


class FakeKubelet:
    """See the module docstring. ``start()``/``stop()`` or ``with FakeKubelet(api) as kubelet:``.

    ``api``: the :class:`~fakes.kube_apiserver.FakeKubeAPIServer`; ``namespace``: the pods it
    runs; ``nodes``: how many Nodes it registers and runs; ``pods_per_node``: the pods a node
    holds (its ``pods`` allocatable); ``log_dir``: where pod logs go (a temporary directory by
    default); ``label_selector``: only pods that match; ``node_labels``: extra labels per node
    name; ``node_prefix``: the node names' prefix; ``allocatable``: resources of every node
    (``{"nvidia.com/gpu": "8", "cpu": "16"}``; unnamed ones are this host's cpu, memory,
    ephemeral-storage), ``node_allocatable``: per node name, over that; a node's ``capacity``
    is its allocatable; every extended resource is served by a healthy device plugin of that
    many devices (:meth:`set_device_health`); ``images``: the registry's references
    (:data:`DEFAULT_IMAGES` by default); ``image_pull_backoff_s`` / ``image_pull_backoff_max_s``:
    the image back-off's first and longest delay (a real kubelet: 10 s and 300 s);
    ``enforce_memory``: run containers with a memory limit in a memory cgroup when the host
    allows it (:attr:`enforces_memory`).
    """

    def __init__(self, api: Any, namespace: str = "default", *, nodes: int = 2, pods_per_node: int = 1,
                 log_dir: str | os.PathLike | None = None, label_selector: str | None = None,
                 node_labels: dict[str, dict[str, str]] | None = None,
                 node_prefix: str = "fake-node-",
                 allocatable: dict[str, str] | None = None,
                 node_allocatable: dict[str, dict[str, str]] | None = None,
                 images: Iterable[str] | None = None,
                 image_pull_backoff_s: float = 1.0, image_pull_backoff_max_s: float = 16.0,
                 enforce_memory: bool = True) -> None:
        self.api = api
        self.namespace = namespace
        self.pods_per_node = pods_per_node
        self.label_selector = label_selector
        self._selector = parse_label_selector(label_selector or "")
        self.nodes = [f"{node_prefix}{i}" for i in range(nodes)]
        host = _host_allocatable(pods_per_node)
        self._allocatable = {n: {k: str(v) for k, v in {**host, **(allocatable or {}),
                                                          **(node_allocatable or {}).get(n, {})}.items()}
                             for n in self.nodes}
        for n, values in self._allocatable.items():
            for v in values.values():
                parse_quantity(v)           # a bad quantity fails here, not in the scheduler
        self._devices: dict[str, dict[str, int]] = {
            n: {k: int(parse_quantity(v)) for k, v in values.items() if is_extended_resource(k)}
            for n, values in self._allocatable.items()}
        self._registry: set[str] = {normalize_image(ref)[0] for ref in (DEFAULT_IMAGES if images is None else images)}
        self.image_pull_backoff_s = image_pull_backoff_s
        self.image_pull_backoff_max_s = image_pull_backoff_max_s
        self.enforce_memory = enforce_memory
        self._cgroups = MemoryCgroups()
        self._ips = {name: f"127.0.0.{i + 2}" for i, name in enumerate(self.nodes)}
        self._node_labels = node_labels or {}
        self._own_dir = tempfile.mkdtemp(prefix="fake-kubelet-")
        self.log_dir = Path(log_dir) if log_dir is not None else Path(self._own_dir) / "logs"
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._pods: dict[str, JSON] = {}            # the watch cache of its pods: name -> pod
        self._all: dict[tuple[str, str], JSON] = {}  # every pod of the cluster: (namespace, name) -> pod
        self._admitted: set[str] = set()             # pod uids the kubelet admitted
        self._rejected: set[str] = set()             # pod uids it rejected
        self._pulls: dict[str, _Pull] = {}           # pod uid -> the image back-off
        self._resync_at: dict[str, float] = {}       # pod name -> when to sync it again
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
            if c.cgroup is not None:
                for pid in self._cgroups.pids(c.cgroup):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        for c in containers:
            try:
                c.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self._reap_rest(c)
            if c.waiter is not None:
                c.waiter.join(timeout=5)
        self._cgroups.close()
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

    @property
    def enforces_memory(self) -> bool:
        """Whether a container's memory limit is a real cgroup limit here (the kernel OOM-kills
        past it); False where the host has no usable memory controller (see
        :attr:`memory_unavailable_reason`)."""
        return self.enforce_memory and self._cgroups.available()

    @property
    def memory_unavailable_reason(self) -> str:
        return "" if self.enforces_memory else (self._cgroups.why_not or "enforce_memory=False")

    def add_image(self, image: str) -> None:
        """Push ``image`` to the fake registry (a pod waiting for it starts at its next pull)."""
        ref, _ = normalize_image(image)
        with self._lock:
            self._registry.add(ref)

    @property
    def images(self) -> set[str]:
        """The registry's references, normalized (``docker.io/library/trainer:1``)."""
        with self._lock:
            return set(self._registry)

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
        self._set_taint(node, NOT_READY_TAINT)

    def node_ready(self, node: str) -> None:
        """SIGCONT the node's pods, Ready=True; a killed node's kubelet comes back and resyncs."""
        with self._lock:
            revived = node in self._dead
            self._dead.discard(node)
        for c in self._node_containers(node):
            self._signal_container(c, signal.SIGCONT)
        self._set_taint(node, None)
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
        self._set_taint(node, UNREACHABLE_TAINT)

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

    def evict_for_pressure(self, pod: str, resource: str = "memory", *, grace_s: float = 0,
                           threshold: str = "100Mi", available: str = "52Mi") -> str:
        """Node-pressure eviction of a running pod, as the kubelet's eviction manager does it.

        ``DisruptionTarget`` (True, ``TerminationByKubelet``, the eviction message) first, then
        SIGTERM to the container and SIGKILL after ``grace_s`` (0: a hard eviction, SIGKILL at
        once), then phase Failed with ``status.reason: Evicted`` and ``status.message`` the same
        message; the container terminated with its exit code (137 when killed). The pod object
        stays. Returns the message, e.g. ``The node was low on resource: memory. Threshold
        quantity: 100Mi, available: 52Mi. Container agent was using 10528Ki, request is 0, has
        larger consumption of memory. `` (with the trailing space, as the kubelet writes it).
        """
        c = self._current(pod)
        if c is None or c.exited.is_set():
            raise LookupError(f"pod {self.namespace}/{pod} has no running container")
        message = f"The node was low on resource: {resource}. Threshold quantity: {threshold}, available: {available}. "
        with self._lock:
            spec_pod = self._pods.get(pod) or {}
        container = ((spec_pod.get("spec") or {}).get("containers") or [{}])[0]
        if resource == "memory":
            usage = _rss_bytes(_container_pids(c.pid, c.uid, c.popen.returncode is None))
            request = effective_requests(container).get("memory")
            request_bytes = int(parse_quantity(request)) if request is not None else 0
            if usage > request_bytes:
                message += (f"Container {container.get('name', 'agent')} was using {format_bytes(usage)}, "
                            f"request is {request if request is not None else '0'}, has larger consumption of "
                            f"{resource}. ")
        c.evicted = message

        def flag(status: JSON) -> JSON:
            _set_condition(status.setdefault("conditions", []), "DisruptionTarget", "True", "TerminationByKubelet",
                           message)
            return status
        self._update_pod_status(pod, c.uid, flag)
        with self._lock:
            kill_at = time.monotonic() + grace_s
            c.kill_at = kill_at if c.kill_at is None else min(c.kill_at, kill_at)
        if grace_s <= 0:
            self._signal_container(c, signal.SIGKILL)
        else:
            threading.Thread(target=self._kill_after_grace, args=(c,), name=f"fake-kubelet-evict-{pod}",
                             daemon=True).start()
        return message

    def set_device_health(self, node: str, resource: str, healthy: int | None, *, publish: bool = False) -> None:
        """The node's device plugin now reports ``healthy`` devices of ``resource`` (None: no plugin
        serves it, as before it registers). The kubelet's own count changes at once; the Node's
        ``allocatable`` only with ``publish`` or :meth:`publish_node_status` (the next node status
        update), so the scheduler can still bind pods the kubelet then rejects
        (UnexpectedAdmissionError)."""
        if node not in self._ips:
            raise LookupError(f"no node {node}")
        with self._lock:
            if healthy is None:
                self._devices.setdefault(node, {}).pop(resource, None)
            else:
                self._devices.setdefault(node, {})[resource] = int(healthy)
        if publish:
            self.publish_node_status(node)

    def device_health(self, node: str) -> dict[str, int]:
        """The kubelet's own healthy device count per extended resource of ``node``."""
        with self._lock:
            return dict(self._devices.get(node, {}))

    def publish_node_status(self, node: str) -> None:
        """A node status update: ``allocatable`` of each device-plugin resource becomes the healthy
        count (``capacity`` keeps the total, as the device manager reports them)."""
        with self._lock:
            devices = dict(self._devices.get(node, {}))

        def change(status: JSON) -> None:
            alloc = status.setdefault("allocatable", {})
            capacity = status.setdefault("capacity", {})
            for res, healthy in devices.items():
                alloc[res] = str(healthy)
                capacity[res] = str(max(healthy, int(parse_quantity(capacity.get(res, "0")))))
        self._update_node_status(node, change)

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
            "capacity": dict(self._allocatable[name]),
            "allocatable": dict(self._allocatable[name]),
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

    def _write_node(self, node: str, change: Callable[[JSON], bool | None], *, status: bool) -> bool:
        """Read the Node, ``change(node)`` in place (False: nothing to write), write it back (its
        status subresource when ``status``), retrying conflicts; return once the scheduler's
        watch cache holds the write (it decides from that cache). True when it wrote."""
        write = self.v1.replace_node_status if status else self.v1.replace_node
        for _ in range(20):
            new = copy.deepcopy(json.loads(self.v1.read_node(node, _preload_content=False).data))
            if change(new) is False:
                return False
            try:
                written = json.loads(write(node, new, _preload_content=False).data)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            else:
                self._wait_cached(node, int(written["metadata"]["resourceVersion"]))
                return True
        raise RuntimeError(f"could not update node {node}: too many conflicts")

    def _set_node_ready(self, node: str, status: str, reason: str, message: str) -> None:
        def ready(new: JSON) -> None:
            conds = new.setdefault("status", {}).setdefault("conditions", [])
            _set_condition(conds, "Ready", status, reason, message)
            for cond in conds:
                if cond["type"] == "Ready":
                    cond["lastHeartbeatTime"] = _timestamp()
        self._write_node(node, ready, status=True)

    def _update_node_status(self, node: str, change: Callable[[JSON], None]) -> None:
        """Read the Node, ``change(status)`` in place, write the status; return once cached."""
        self._write_node(node, lambda new: change(new.setdefault("status", {})), status=True)
        with self._lock:
            self._schedule = True
            self._wake.notify_all()

    def _set_taint(self, node: str, key: str | None) -> None:
        """The node lifecycle controller's NoSchedule taint for a NotReady (``not-ready``) or silent
        (``unreachable``) node; None: the node is Ready again, neither."""
        def taint(new: JSON) -> bool:
            spec = new.setdefault("spec", {})
            old = spec.get("taints") or []
            taints = [t for t in old if t.get("key") not in (NOT_READY_TAINT, UNREACHABLE_TAINT)]
            if key is not None:
                taints.append({"key": key, "effect": "NoSchedule"})
            if taints == old:
                return False
            if taints:
                spec["taints"] = taints
            else:
                spec.pop("taints", None)
            return True
        self._write_node(node, taint, status=False)

    def _wait_cached(self, node: str, rv: int, timeout: float = 10.0) -> None:
        with self._lock:
            if not self._wake.wait_for(lambda: int((self._nodes.get(node) or {}).get("metadata", {})
                                                   .get("resourceVersion", 0)) >= rv
                                       or self._stopping.is_set(), timeout):
                raise RuntimeError(f"the node watch never delivered {node} at resourceVersion {rv}")

    # --- list + watch ---

    def _list(self, kind: str) -> tuple[list[JSON], str]:
        if kind == "pods":       # every namespace: the scheduler and admission count them all
            resp = self.v1.list_pod_for_all_namespaces(_preload_content=False)
        else:
            resp = self.v1.list_node(_preload_content=False)
        body = json.loads(resp.data)
        return body.get("items") or [], body["metadata"]["resourceVersion"]

    def _watch_loop(self, kind: str) -> None:
        rv: str | None = None
        func = self.v1.list_pod_for_all_namespaces if kind == "pods" else self.v1.list_node
        args: tuple = ()
        kwargs: JSON = {}
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

    def _mine(self, pod: JSON) -> bool:
        """A pod this kubelet runs: of its namespace, matching its label selector."""
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        return meta.get("namespace") == self.namespace and all(r.matches(labels) for r in self._selector)

    def _replace(self, kind: str, items: list[JSON]) -> None:
        """A (re)list: the cache becomes the list; what vanished counts as deleted."""
        with self._lock:
            if kind == "pods":
                self._all = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in items}
                fresh = {o["metadata"]["name"]: o for o in items if self._mine(o)}
                self._dirty |= set(self._pods) | set(fresh)
                self._pods = fresh
            else:
                self._nodes = {o["metadata"]["name"]: o for o in items}
            self._schedule = True
            self._wake.notify_all()

    def _apply(self, kind: str, type_: str, obj: JSON) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            if kind == "pods":
                key = (obj["metadata"].get("namespace", ""), name)
                if type_ == "DELETED":
                    self._all.pop(key, None)
                else:
                    self._all[key] = obj
                if type_ != "DELETED" and self._mine(obj):
                    self._pods[name] = obj
                    self._dirty.add(name)
                elif key[0] == self.namespace and name in self._pods:
                    del self._pods[name]      # gone, or out of the selector: as a DELETED
                    self._dirty.add(name)
            elif type_ == "DELETED":
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = obj
            self._schedule = True
            self._wake.notify_all()

    # --- the worker: scheduling and pod sync ---

    def _work(self) -> None:
        next_retry = time.monotonic() + 0.5
        while not self._stopping.is_set():
            with self._lock:
                wake = min([next_retry, *self._resync_at.values()])
                self._wake.wait_for(lambda: self._dirty or self._schedule or self._stopping.is_set(),
                                    timeout=max(0.0, wake - time.monotonic()))
                if self._stopping.is_set():
                    return
                now = time.monotonic()
                if now >= next_retry:
                    self._dirty |= self._config_errors   # the kubelet's periodic resync
                    next_retry = now + 0.5
                for name in [n for n, at in self._resync_at.items() if at <= now]:
                    del self._resync_at[name]           # an image back-off step is due
                    self._dirty.add(name)
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

    def _node_usage(self) -> dict[str, tuple[int, dict[str, Fraction]]]:
        """Per node: how many non-terminated pods are bound to it (every namespace, the ones just
        bound included) and the sum of their requests."""
        counts = dict.fromkeys(self.nodes, 0)
        used: dict[str, dict[str, Fraction]] = {n: {} for n in self.nodes}
        with self._lock:
            pods = list(self._all.values())
            assumed = dict(self._assumed)
        for pod in pods:
            meta = pod["metadata"]
            node = (pod.get("spec") or {}).get("nodeName") or (
                assumed.get(meta["name"]) if meta.get("namespace") == self.namespace else None)
            if node not in counts or (pod.get("status") or {}).get("phase") in TERMINAL:
                continue
            counts[node] += 1
            try:
                requests = pod_requests(pod)
            except QuantityError:
                continue
            for res, q in requests.items():
                used[node][res] = used[node].get(res, Fraction(0)) + q
        return {n: (counts[n], used[n]) for n in self.nodes}

    @staticmethod
    def _filter(pod: JSON, requests: dict[str, Fraction], node: JSON,
                usage: tuple[int, dict[str, Fraction]]) -> tuple[list[str], bool]:
        """The default scheduler's filter plugins in their order (the first that fails gives the
        node's reasons): NodeUnschedulable, TaintToleration, NodeAffinity (none of them helped by
        preemption), NodeResourcesFit (every resource short, and ``Too many pods``).
        Returns (reasons, whether preemption could help); no reasons: the pod fits."""
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        if (node.get("spec") or {}).get("unschedulable") and not _tolerates(
                tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return ["node(s) were unschedulable"], False
        for taint in node_taints(node):
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
                return [f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"], False
        if not node_matches(pod, node):
            return ["node(s) didn't match Pod's node affinity/selector"], False
        alloc = {k: parse_quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        count, used = usage
        reasons = ["Too many pods"] if count + 1 > int(alloc.get("pods", 0)) else []
        for res, q in sorted(requests.items()):
            if q > alloc.get(res, Fraction(0)) - used.get(res, Fraction(0)):
                reasons.append(f"Insufficient {res}")
        return reasons, True

    @staticmethod
    def unschedulable_message(pod: JSON, verdicts: list[tuple[list[str], bool]]) -> str:
        """The FitError message of kube-scheduler: the reasons' histogram, sorted, then the
        preemption plugin's own (no pod here has a lower priority to preempt)."""
        if not verdicts:
            return "no nodes available to schedule pods"
        n = len(verdicts)
        histogram: dict[str, int] = {}
        preemption: dict[str, int] = {}
        for reasons, resolvable in verdicts:
            for reason in reasons:
                histogram[reason] = histogram.get(reason, 0) + 1
            why = "No preemption victims found for incoming pod" if resolvable else \
                "Preemption is not helpful for scheduling"
            preemption[why] = preemption.get(why, 0) + 1
        message = f"0/{n} nodes are available: " + ", ".join(sorted(f"{v} {k}" for k, v in histogram.items())) + "."
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            return message + " preemption: not eligible due to preemptionPolicy=Never."
        return message + f" preemption: 0/{n} nodes are available: " + \
            ", ".join(sorted(f"{v} {k}" for k, v in preemption.items())) + "."

    def _set_scheduled_condition(self, pod: JSON, reason: str, message: str) -> None:
        cond = _condition(pod, "PodScheduled")
        if cond and (cond.get("status"), cond.get("reason"), cond.get("message")) == ("False", reason, message):
            return

        def unschedulable(status: JSON) -> JSON | None:
            if (status.get("phase") or "Pending") != "Pending":
                return None
            status["phase"] = "Pending"
            _set_condition(status.setdefault("conditions", []), "PodScheduled", "False", reason, message)
            return status
        self._update_pod_status(pod["metadata"]["name"], pod["metadata"]["uid"], unschedulable)

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
                key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0),
                               p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
            nodes = [copy.deepcopy(self._nodes[n]) for n in self.nodes if n in self._nodes]
        for pod in pending:
            name = pod["metadata"]["name"]
            if (pod.get("spec") or {}).get("schedulingGates"):
                # the scheduling queue's PreEnqueue: a gated pod is not even tried
                self._set_scheduled_condition(pod, "SchedulingGated",
                                              "Scheduling is blocked due to non-empty scheduling gates")
                continue
            try:
                requests = pod_requests(pod)
            except QuantityError:
                continue
            usage = self._node_usage()
            verdicts = [(n, *self._filter(pod, requests, n, usage[n["metadata"]["name"]])) for n in nodes]
            fits = [n for n, reasons, _ in verdicts if not reasons]
            if not fits:
                self._set_scheduled_condition(pod, "Unschedulable", self.unschedulable_message(
                    pod, [(reasons, resolvable) for _, reasons, resolvable in verdicts]))
                continue
            target = min(fits, key=lambda n: (usage[n["metadata"]["name"]][0], n["metadata"]["name"]))
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
            with self._lock:
                self._resync_at.pop(name, None)
                live = {p["metadata"]["uid"] for p in self._pods.values()}
                for uid in [u for u in self._pulls if u not in live]:
                    del self._pulls[uid]
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

    def _admit(self, pod: JSON, node: str) -> tuple[str, str] | None:
        """The kubelet's admission: (status.reason, message) of a rejection, or None.

        In the kubelet's order: the device manager allocates the extended resources its device
        plugins serve (UnexpectedAdmissionError when it has fewer healthy devices free than asked),
        then the predicate handler checks the pod against the node's allocatable as the API has it
        (OutOf<resource>; extended resources the node does not list at all are not checked) and the
        node affinity/selector.
        """
        uid = pod["metadata"]["uid"]
        with self._lock:
            node_obj = copy.deepcopy(self._nodes.get(node))
            others = [p for p in self._all.values()
                      if (p.get("spec") or {}).get("nodeName") == node and p["metadata"]["uid"] != uid
                      and (p.get("status") or {}).get("phase") not in TERMINAL
                      and p["metadata"]["uid"] not in self._rejected]
            devices = dict(self._devices.get(node, {}))
        spec = pod.get("spec") or {}
        in_use: dict[str, int] = {}
        for other in others:
            for c in (other.get("spec") or {}).get("containers") or []:
                for res, raw in ((c.get("resources") or {}).get("limits") or {}).items():
                    if devices.get(res) is not None:
                        in_use[res] = in_use.get(res, 0) + int(parse_quantity(raw))
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            for res, raw in ((c.get("resources") or {}).get("limits") or {}).items():
                healthy = devices.get(res)
                needed = int(parse_quantity(raw))
                if healthy is None or needed == 0:
                    continue
                if healthy == 0:
                    why = f"no healthy devices present; cannot allocate unhealthy devices {res}"
                elif healthy - in_use.get(res, 0) < needed:
                    why = (f"requested number of devices unavailable for {res}. Requested: {needed}, "
                           f"Available: {max(0, healthy - in_use.get(res, 0))}")
                else:
                    in_use[res] = in_use.get(res, 0) + needed
                    continue
                return "UnexpectedAdmissionError", f"Allocate failed due to {why}, which is unexpected"
        if node_obj is None:
            return None
        alloc = {k: parse_quantity(v) for k, v in ((node_obj.get("status") or {}).get("allocatable") or {}).items()}
        wanted = {res: q for res, q in pod_requests(pod).items() if not is_extended_resource(res) or res in alloc}
        used: dict[str, Fraction] = {}
        for other in others:
            for res, q in pod_requests(other).items():
                used[res] = used.get(res, Fraction(0)) + q
        pods = int(alloc.get("pods", 0))
        if len(others) + 1 > pods:
            return "OutOfpods", (f"Node didn't have enough resource: pods, requested: 1, used: {len(others)}, "
                                 f"capacity: {pods}")
        order = [r for r in ("cpu", "memory", "ephemeral-storage") if r in wanted] + \
            sorted(r for r in wanted if r not in ("cpu", "memory", "ephemeral-storage"))
        for res in order:
            have, taken = alloc.get(res, Fraction(0)), used.get(res, Fraction(0))
            if wanted[res] > have - taken:
                return f"OutOf{res}", (f"Node didn't have enough resource: {res}, requested: "
                                       f"{resource_units(res, wanted[res])}, used: {resource_units(res, taken)}, "
                                       f"capacity: {resource_units(res, have)}")
        if not node_matches(pod, node_obj):
            return "NodeAffinity", "Predicate NodeAffinity failed"
        return None

    def _reject(self, name: str, uid: str, reason: str, message: str) -> None:
        """rejectPod: phase Failed, the reason, "Pod was rejected: ..."; no container ever existed."""
        with self._lock:
            self._rejected.add(uid)

        def rejected(status: JSON) -> JSON | None:
            if status.get("phase") in TERMINAL:
                return None
            status.update(phase="Failed", reason=reason, message=f"Pod was rejected: {message}")
            status.setdefault("startTime", _timestamp())
            return status
        self._update_pod_status(name, uid, rejected)

    def _resync(self, name: str, at: float) -> None:
        with self._lock:
            self._resync_at[name] = min(at, self._resync_at.get(name, at))
            self._wake.notify_all()

    def _ensure_image(self, name: str, uid: str, ip: str, container: JSON) -> tuple[str, str] | None:
        """The kubelet's image manager: (the reference, its imageID) once the image is there;
        None while the container waits (InvalidImageName, ErrImageNeverPull, ErrImagePull and
        ImagePullBackOff in turn, the back-off doubling up to its maximum)."""
        image = str(container.get("image") or "")
        now = time.monotonic()
        try:
            ref, _ = normalize_image(image)
        except ImageReferenceError as exc:
            self._write_waiting(name, uid, ip, "InvalidImageName", f'Failed to apply default image tag "{image}": '
                                f"couldn't parse image name \"{image}\": {exc}", container)
            self._resync(name, now + 1.0)
            return None
        with self._lock:
            # a registry serves an image by its tag and by its digest (the imageID a pod reported)
            present = ref in self._registry or ("@" in ref and ref in {image_id(r) for r in self._registry})
        policy = container.get("imagePullPolicy") or default_pull_policy(image)
        if present:
            self._pulls.pop(uid, None)
            return ref, image_id(ref)
        if policy == "Never":
            self._write_waiting(name, uid, ip, "ErrImageNeverPull",
                                f'Container image "{image}" is not present with pull policy of Never', container)
            self._resync(name, now + 1.0)
            return None
        pull = self._pulls.get(uid)
        if pull is None or now >= pull.retry_at:
            backoff = self.image_pull_backoff_s if pull is None else min(pull.backoff_s * 2, self.image_pull_backoff_max_s)
            pull = self._pulls[uid] = _Pull(backoff, now + backoff, now + backoff / 2)
            with self._lock:
                hosts = {r.split("/", 1)[0] for r in self._registry} | {"docker.io"}
            self._write_waiting(name, uid, ip, "ErrImagePull", _pull_error(ref, hosts), container)
        elif now >= pull.backoff_shown_at and pull.shown != "ImagePullBackOff":
            pull.shown = "ImagePullBackOff"
            self._write_waiting(name, uid, ip, "ImagePullBackOff", f'Back-off pulling image "{image}"', container)
        self._resync(name, pull.backoff_shown_at if now < pull.backoff_shown_at else pull.retry_at)
        return None

    def _start(self, pod: JSON, node: str) -> None:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        container = containers[0]
        ip = self._ips[node]
        with self._lock:
            admitted = uid in self._admitted
        if not admitted:
            rejection = self._admit(pod, node)
            if rejection is not None:
                self._reject(name, uid, *rejection)
                return
            with self._lock:
                self._admitted.add(uid)
        pulled = self._ensure_image(name, uid, ip, container)
        if pulled is None:
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
        cgroup = None
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if limit is not None and self.enforce_memory and self.enforces_memory:
            cgroup = self._cgroups.create(uid, int(parse_quantity(limit)))
        log_path = self.log_path(name)
        started_at = _timestamp()
        with open(log_path, "wb") as log:
            try:
                popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_join_cgroup(str(cgroup / "cgroup.procs").encode())
                                         if cgroup is not None else None)
            except (OSError, subprocess.SubprocessError) as exc:
                if cgroup is not None:
                    self._cgroups.remove(cgroup)
                log.write(f"fake kubelet: cannot start {argv[0]!r}: {exc}\n".encode())
                self._write_start_error(name, uid, ip, str(exc), container, started_at)
                return
        c = _Container(pod=name, uid=uid, node=node, popen=popen, log_path=log_path, tmpdir=tmpdir,
                       started_at=started_at, container_id=f"fake://{node}/{popen.pid}", cgroup=cgroup,
                       image_ref=pulled[0], image_id=pulled[1])
        with c.status_lock:
            with self._lock:
                self._containers[uid] = c
            c.waiter = threading.Thread(target=self._wait_exit, args=(c,), name=f"fake-kubelet-wait-{name}",
                                        daemon=True)
            c.waiter.start()
            self._update_pod_status(name, uid, lambda status: self._running_status(status, c, container, ip))

    def _container_status(self, container: JSON, state: JSON, *, ready: bool, c: _Container | None) -> JSON:
        status: JSON = {"name": container.get("name", "agent"),
                        "image": c.image_ref if c is not None else container.get("image", ""),
                        "imageID": c.image_id if c is not None else "", "ready": ready, "restartCount": 0,
                        "started": "running" in state, "state": state}
        if c is not None:
            status["containerID"] = c.container_id
        return status

    def _kubelet_conditions(self, status: JSON, ready: bool, reason: str | None, *, sandbox: bool = True,
                            unready: list[str] | None = None) -> None:
        conds = status.setdefault("conditions", [])
        _set_condition(conds, "PodReadyToStartContainers", "True" if sandbox else "False")
        _set_condition(conds, "PodScheduled", "True")
        _set_condition(conds, "Initialized", "True")
        message = f"containers with unready status: [{' '.join(unready)}]" \
            if reason == "ContainersNotReady" and unready else None
        for type_ in ("ContainersReady", "Ready"):
            _set_condition(conds, type_, "True" if ready else "False", None if ready else reason,
                           None if ready else message)

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
            status.update(phase="Pending", hostIP=ip, hostIPs=[{"ip": ip}], podIP=ip, podIPs=[{"ip": ip}])
            status.setdefault("startTime", _timestamp())
            self._kubelet_conditions(status, False, "ContainersNotReady",
                                     unready=[str(container.get("name", "agent"))])
            status["containerStatuses"] = [self._container_status(
                container, {"waiting": {"reason": reason, "message": message}}, ready=False, c=None)]
            return status
        self._update_pod_status(name, uid, waiting)

    def _write_start_error(self, name: str, uid: str, ip: str, message: str, container: JSON,
                           started_at: str) -> None:
        def failed(status: JSON) -> JSON:
            status.update(phase="Failed", hostIP=ip, hostIPs=[{"ip": ip}], podIP=ip, podIPs=[{"ip": ip}])
            status.setdefault("startTime", started_at)
            self._kubelet_conditions(status, False, "PodFailed", sandbox=False)
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
        if c.cgroup is None:
            c.popen.wait()
        else:
            # memory.oom.group: the first OOM kill in the container ends the whole container
            while c.popen.poll() is None:
                if not c.oom_killed and self._cgroups.oom_kills(c.cgroup) > 0:
                    c.oom_killed = True
                    for pid in self._cgroups.pids(c.cgroup):
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
                    self._signal_container(c, signal.SIGKILL)
                time.sleep(0.02)
            if self._cgroups.oom_kills(c.cgroup) > 0:
                c.oom_killed = True
        c.finished_at = _timestamp()
        self._reap_rest(c)
        if c.cgroup is not None:
            self._cgroups.remove(c.cgroup)
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
            phase = "Failed" if code != 0 or c.evicted else "Succeeded"
            status["phase"] = phase
            if c.evicted:
                status.update(reason="Evicted", message=c.evicted)
            self._kubelet_conditions(status, False, "PodFailed" if phase == "Failed" else "PodCompleted",
                                     sandbox=False)
            reason = "OOMKilled" if c.oom_killed else ("Completed" if code == 0 else "Error")
            status["containerStatuses"] = [self._container_status(container, {"terminated": {
                "exitCode": code, "reason": reason,
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
