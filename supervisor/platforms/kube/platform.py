"""The ``kubernetes`` platform: one bare Pod per node slot per attempt.

For attempt k of job J the platform creates, in its namespace:

* one headless Service ``J-rdzv`` (``clusterIP: None``, ``publishNotReadyAddresses: true``)
  selecting the job's pods, so that the first pod has a stable DNS name before it is Ready;
* a Secret ``J-token`` holding the job token, which reaches every rank as
  ``SUPERVISOR_TOKEN`` (``secretKeyRef``): never on a shared filesystem;
* one Pod ``J-aK-SLOT`` per node slot (``restartPolicy: Never``), labelled managed-by, job,
  attempt, slot and launch (a random id per launch; a name still held by another launch's pod
  gets a suffix, ``J-aK-SLOT-1``: a pod stuck Terminating, or an earlier run's finished pod,
  never stands in for a new one), running one torchrun agent (``--max-restarts 0``: recovery is ours). The
  first pod's agent serves the c10d store (``is_host=1``); the others dial it by its DNS name
  under the Service, or by its IP (``rdzv_address: ip``, once the pod has one). The controller
  never hosts the store: its loss would take every healthy agent with it.

Every object carries an owner reference to the release's ConfigMap when one is named
(``owner_configmap``), so deleting the release garbage-collects the pods.

**Observe** by list + watch with a label selector (:class:`~.client.Watcher`), never a GET per
pod per tick: Pending/Running -> running; Succeeded/Failed -> exited with the container's exit
code (``128+N`` -> killed by signal N); gone (deleted by someone else) or ``DisruptionTarget``
(eviction, preemption, taint manager) -> lost, with the reason; the pod's node NotReady (with
``read_nodes``) -> stopped. Every other pod of the job (older attempts', an earlier run's) is
deleted on sight (attempt fencing).

**Act.** ``kill_node`` deletes the pod with ``gracePeriodSeconds: 0``; teardown deletes the gang
with the pods' grace period, waits for it, then forces what is left and moves on: new pod names
per attempt, so a pod stuck Terminating never blocks the relaunch. A machine the controller
excludes is avoided through required node affinity (``NotIn``); with ``read_nodes`` the slots are
the Ready, schedulable nodes themselves (a pod pinned to each), so a lost node shrinks the gang
or hands its slot to a spare.

**Leader election** (:meth:`supervise`): only the holder of the Lease ``J-controller`` runs the
controller; one that loses it stops acting at once (every later call here refuses) and kills
nothing; the Deployment restarts it as a candidate, and the new leader adopts the gang.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import dataclasses
import datetime
import logging
import math
import json
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from supervisor.platforms.node.agent import JOIN_TIMEOUT_S, agent_env, node_rank, torchrun_argv
from supervisor.platforms.node.agent_output import last_error, parse
from supervisor.platforms.base import (
    WAIT_CANNOT_START,
    WAIT_CAPACITY,
    LaunchRefused,
    LaunchSpec,
    NodeState,
    NodeStatus,
    Platform,
    PlatformError,
    free_port,
)
from supervisor.platforms.kube.client import ApiError, KubeApi, Watcher, api_client, own_namespace
from supervisor.platforms.kube import gang, pod_template
from supervisor.platforms.kube.pod_reading import Condition, ContainerFacts, PodFacts, Reading, read_pod
from supervisor.protocol import TOKEN_MAX_CHARS, Env, token_problem

log = logging.getLogger("supervisor.platform.kube")

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "elastic-supervisor"
JOB_LABEL = "elastic-supervisor/job"
ATTEMPT_LABEL = "elastic-supervisor/attempt"
SLOT_LABEL = "elastic-supervisor/slot"
OWNER_LABEL = "elastic-supervisor/owner"
"""The uid of the release's ConfigMap: the release a pod, the Service or the Secret belongs to.
Two releases with one ``config.job`` in one namespace select, count, adopt and fence only
their own objects."""
ROLE_LABEL = "elastic-supervisor/role"
PROBE_ROLE = "capacity-probe"
"""A placeholder pod that asks for one slot's resources while the gang runs without it: once the
scheduler places it, the capacity is back (it is deleted at once and the gang grows)."""
LAUNCH_LABEL = "elastic-supervisor/launch"
"""A random id per launch: a name taken by a pod of another launch (an earlier run's, one still
Terminating, a dead controller's half-made gang) is never mistaken for ours."""
NAME_TRIES = 8
HOSTNAME_LABEL = "kubernetes.io/hostname"
APP_NAME = "elastic-supervisor-worker"
"""The worker pods' ``app.kubernetes.io/name``: never the controller's (``elastic-supervisor``),
whose Service and Deployment select by it and ``app.kubernetes.io/instance``."""
TOKEN_KEY = "token"
REFUSED = frozenset({400, 403, 422})
"""What an API server answers a pod it will never accept as written: a bad request, admission
(PodSecurity, a webhook, RBAC) or quota forbidding it, a spec its schema refuses."""
EVENT_MESSAGE_MAX = 1000
"""Kubernetes caps an Event's message at 1 KiB; the whole record is in events.jsonl."""


def _image_id(pod: Any) -> str:
    """The agent container's image by digest (its status's ``imageID``), when the runtime says it
    as a reference a pod can name (``repo@sha256:...``; a ``docker-pullable://`` prefix dropped)."""
    for c in (pod.status.container_statuses or []) if pod.status is not None else []:
        if c.name == "agent" and c.image_id:
            ref = c.image_id.split("://", 1)[-1]
            return ref if "@sha256:" in ref else ""
    return ""


def describe_event(name: str, fields: dict) -> tuple[str, str, str, list[str]] | None:
    """The Kubernetes Event for one controller event: ``(type, reason, message, slots)``, where
    ``slots`` are the slots whose pods it is about (empty: about the job itself), or None for
    an event no one looks for in ``kubectl describe``/``kubectl get events``."""
    attempt = fields.get("attempt", "?")
    if name == "fault_detected":
        ranks = ",".join(map(str, fields.get("ranks") or []))
        slots = ",".join(map(str, fields.get("nodes") or []))
        who = f"rank(s) {ranks}" if ranks else f"slot(s) {slots}" if slots else "the gang"
        if fields.get("culprit") is False:
            who = f"the gang (no single culprit; waiting: {who})"
        return ("Warning", "RankFault",
                f"attempt {attempt}: {fields.get('kind', 'fault')} on {who} after {fields.get('detection_s', '?')} s: "
                f"{fields.get('detail', '')}", list(fields.get("nodes") or []))
    if name == "action" and fields.get("action") == "kill_node":
        return ("Warning", "KilledBySupervisor",
                f"attempt {attempt}: the supervisor deleted this pod ({fields.get('reason', '')}); the gang restarts "
                "from the newest verified checkpoint", [str(fields.get("node", ""))])
    if name == "launched":
        return ("Normal", "GangLaunched",
                f"attempt {attempt}: {fields.get('world_size', '?')} ranks on {len(fields.get('nodes') or [])} pods, "
                f"restoring {fields.get('restore_from') or 'nothing (fresh start)'}", [])
    if name == "nodes_excluded":
        return ("Warning", "NodesExcluded",
                f"{', '.join(fields.get('nodes') or [])} excluded from the job ({fields.get('reason', '')})",
                list(fields.get("nodes") or []))
    if name == "waiting_for_capacity":
        return ("Warning", "WaitingForCapacity",
                f"attempt {attempt}: the cluster cannot place {len(fields.get('nodes') or [])} pod(s) yet; waiting at "
                f"most {fields.get('limit_s', '?')} s (no attempt spent): {fields.get('detail', '')}", [])
    if name == "capacity_found":
        return ("Normal", "CapacityFound", f"attempt {attempt}: every pod placed after {fields.get('waited_s', '?')} s", [])
    if name == "capacity_shrink":
        return ("Warning", "GangShrunk", f"attempt {attempt}: relaunching on the {len(fields.get('nodes') or [])} "
                f"pod(s) the cluster could place: {fields.get('detail', '')}", [])
    if name == "gang_requeued":
        return ("Warning", "GangRequeued", f"attempt {attempt}: the gang's admission took it back "
                f"({fields.get('reason', '')}); it saves, waits for readmission and resumes (no restart spent): "
                f"{fields.get('detail', '')}", [])
    if name == "restart_complete":
        return ("Normal", "Restarted", f"attempt {attempt} is training again ({fields.get('reason', '')}, "
                f"{fields.get('total_s', '?')} s)", [])
    if name == "release_rolled_back":
        return ("Warning", "ReleaseRolledBack",
                f"release {fields.get('from', '?')} rejected ({fields.get('reason', '')}: {fields.get('why', '')}); the "
                f"job goes back to {fields.get('to', '?')} ({fields.get('runs', '')}) from "
                f"{fields.get('checkpoint') or 'a fresh start'}", [])
    if name == "release_started":
        return ("Normal", "ReleaseStarted", f"version {fields.get('version', '?')} ({fields.get('runs', '')}) is on "
                f"probation for {fields.get('probation_steps', '?')} steps", [])
    if name == "release_known_good":
        return ("Normal", "ReleaseKnownGood", f"version {fields.get('version', '?')} is known-good: "
                f"{fields.get('detail', '')}", [])
    if name == "release_still_rejected":
        return ("Warning", "ReleaseStillRejected", f"version {fields.get('version', '?')} was rejected earlier; "
                f"{fields.get('runs_instead', '?')} runs instead: {fields.get('detail', '')}", [])
    if name == "workers_refused":
        return ("Warning", "WorkerPodRefused", f"{fields.get('error', '')}; no pod was made", [])
    if name == "job_finished":
        ok = fields.get("exit_code") == 0
        return ("Normal" if ok else "Warning", "JobFinished",
                f"{fields.get('phase', '?')} (exit code {fields.get('exit_code', '?')}): {fields.get('reason', '')}", [])
    return None
_DNS = re.compile(r"[^a-z0-9-]+")
HASH_CHARS = 8
"""The stable suffix a name too long for its limit gets: 8 hex digits of its SHA-256 (a
collision between two names of one job is a 1 in 4 billion chance, not a certainty)."""


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as an RFC 1123 label of at most ``limit`` characters: lowercase alphanumerics and
    '-' (other characters become '-'). A text too long for the limit keeps a readable head and
    ends in a hash of the whole text, so that two texts never map to one label by truncation
    (GKE node names differ only at their end)."""
    clean = _DNS.sub("-", text.lower()).strip("-")
    if 0 < len(clean) <= limit:
        return clean
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    head = clean[:max(0, limit - HASH_CHARS - 1)].strip("-")
    return f"{head}-{digest}" if head else digest


def exit_code(terminated_code: int | None) -> int | None:
    """A container's exit code as the platforms report it: 128+N (the runtime's way to say killed
    by signal N) -> -N."""
    if terminated_code is None:
        return None
    return -(terminated_code - 128) if 128 < terminated_code < 128 + 65 else terminated_code


@dataclass
class _Pod:
    slot: str
    name: str
    attempt: int
    killed_by_us: bool = False
    deleted_by_us: bool = False
    seen: bool = False
    final: NodeStatus | None = None


@dataclass
class Settings:
    namespace: str
    job: str
    image: str = ""
    python: str = "python"
    worker: Any = None
    """The job config's ``platform.kubernetes.worker`` (pull policy, resources, tolerations ...)."""
    volumes: Any = None
    """``platform.kubernetes.volumes``: the claims every pod mounts."""
    rdzv_port: int = 29400
    rdzv_address: str = "dns"
    join_timeout_s: float = JOIN_TIMEOUT_S
    """How long a placed pod's agent waits for the rest of its gang to join: at least as long as the
    controller waits for capacity (from_config), or the placed pods exit 1 while the rest are still
    Pending and the wait becomes a failed attempt."""
    controller_address: str = ""
    read_nodes: bool = False
    slots: int = 1
    nodes_min: int = 0
    """The job's least node count (``nodes.min``): the worker pods a quota must hold at the least
    (0: the launch's own size)."""
    pods_per_node: int = 1
    node_selector: dict = field(default_factory=dict)
    termination_grace_s: int = 30
    delete_confirm_s: float = 15.0
    launch_timeout_s: float = 120.0
    leader_election: bool = True
    lease: str = ""
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    owner_configmap: str = ""
    owner_uid: str = ""
    """The uid of ``owner_configmap`` (read at start): the release's identity."""
    token_secret: str = ""
    token_key: str = TOKEN_KEY
    token_file: str = ""
    instance: str = ""
    """The pods' ``app.kubernetes.io/instance`` (the chart's release); empty: the job's name."""
    disruption_budget: bool = False
    """A PodDisruptionBudget per attempt, ``minAvailable`` = the gang (``platform.kubernetes.disruption_budget``)."""
    gang: Any = None
    """``platform.kubernetes.gang`` (:class:`~.gang.GangConfig`): each attempt's pods admitted as
    one group; None: one by one."""


class KubernetesPlatform(Platform):
    kind = "kubernetes"
    hands_off_on_sigterm = True   # SIGTERM: our pod is replaced (upgrade, drain); the gang trains on
    reruns_finished = False       # the Deployment restarts a controller that exited: the verdict stands
    checks_command_here = False   # the controller's image is not the workers': each pod's agent checks it

    def __init__(self, api: KubeApi, settings: Settings) -> None:
        self.api = api
        self.s = settings
        self.ns = settings.namespace
        self.job = dns_label(settings.job, 40)
        self.owner_uid = settings.owner_uid
        # A job's objects are its release's: with an owner, their names carry a hash of its uid,
        # so that two releases with one config.job in one namespace can never take each other's
        # names, and the release's label, so that neither selects, counts or fences the other's.
        self.base = dns_label(f"{self.job}-{hashlib.sha256(self.owner_uid.encode()).hexdigest()[:5]}", 46) \
            if self.owner_uid else self.job
        self.service = f"{self.base}-rdzv"
        self.secret = settings.token_secret or f"{self.base}-token"
        self.token_key = settings.token_key if settings.token_secret else TOKEN_KEY
        self.labels = {MANAGED_BY: MANAGER, JOB_LABEL: self.job} | ({OWNER_LABEL: self.owner_uid} if self.owner_uid else {})
        """The labels of every object this release makes (and the rendezvous Service's selector)."""
        self.selector = f"{MANAGED_BY}={MANAGER},{JOB_LABEL}={self.job}"
        """What the pod watch lists: every pod of this job name (of any release: :meth:`owns` tells
        ours from another's, and a pod made before releases had the label by its owner reference)."""
        self.pods: dict[str, _Pod] = {}
        self.attempt = -1
        self.excluded: list[str] = []
        self.token_path: Path | None = None
        self.fenced = ""
        """Why this platform refuses to act (leadership lost); empty while it may."""
        self._owner: list[dict] | None = None
        self._ensured: set[str] = set()
        self._fencing: set[str] = set()
        self._fence_retry: dict[str, tuple[float, int]] = {}
        """A fenced pod whose deletion failed: when it is tried again (monotonic), and how many failed."""
        self._tasks: set[asyncio.Task] = set()
        self._token_written: bytes | None = None
        self._launch_id = ""
        self._deferred: tuple[LaunchSpec, str, list[str]] | None = None
        self._torn_down = -1
        """The attempt this controller tore down (its PodGroup and budget deleted): a launch deletes an
        earlier attempt's only when it was not (a controller that died before its teardown left them)."""
        self.probes: dict[str, str] = {}
        """slot -> the name of its capacity probe (:meth:`probe_capacity`)."""
        """(spec, port, slots) of a gang whose first pod had no IP yet at launch."""
        self._elected = ""
        self._events_allowed = True
        self.pod_watch = Watcher("pods", api.core.list_namespaced_pod, namespace=self.ns, label_selector=self.selector,
                                 timeout_s=api.timeout_s)
        self.node_watch = (Watcher("nodes", api.core.list_node, timeout_s=api.timeout_s,
                                   label_selector=",".join(f"{k}={v}" for k, v in settings.node_selector.items()))
                           if settings.read_nodes else None)

    def start(self, wait_s: float = 30.0) -> "KubernetesPlatform":
        self.pod_watch.start(wait_s)
        if self.node_watch is not None:
            self.node_watch.start(wait_s)
        return self

    def close(self) -> None:
        self.pod_watch.stop()
        if self.node_watch is not None:
            self.node_watch.stop()

    # ------------------------------------------------------------------ what the platform owns
    def slots(self) -> list[str]:
        if self.node_watch is None:
            return [f"slot-{i}" for i in range(self.s.slots)]
        out = []
        for name, node in sorted(self.node_watch.snapshot().items()):
            if not _node_ready(node) or (node.spec and node.spec.unschedulable) or name in self.excluded:
                continue
            out += [name] if self.s.pods_per_node == 1 else [f"{name}--{i}" for i in range(self.s.pods_per_node)]
        return out

    def exclude(self, hosts: Sequence[str]) -> None:
        self.excluded = sorted(set(hosts))

    def rendezvous_endpoint(self, attempt: int, host: str) -> str:
        # the port; the host (the first pod, by name or IP) is settled at launch
        port = self.s.rdzv_port or free_port("127.0.0.1")
        return f"{self.service}.{self.ns}.svc:{port}"

    def controller_address(self, bind_host: str) -> str:
        return self.s.controller_address or os.environ.get("POD_IP") or bind_host

    def job_token(self) -> bytes | None:
        if not self.s.token_secret:
            return None  # the controller makes one; launch() writes it into <job>-token
        return read_mounted_token(Path(self.s.token_file))

    def token_env(self, token_path: Path) -> dict[str, str]:
        self.token_path = token_path  # without a token Secret of the release's, written from it at launch
        return {}

    def banner(self, cfg) -> str:
        return (f"supervisor: job {cfg.job}: {cfg.nodes.min}-{cfg.nodes.max} pods x {cfg.nproc_per_node} in "
                f"namespace {self.ns} (slots: {self.slots()}); pods {self.base}-aK-SLOT labelled "
                f"{','.join(f'{k}={v}' for k, v in self.labels.items())}; "
                f"events and state in {cfg.log_dir}; watch with `kubectl get pods -n {self.ns} -l {JOB_LABEL}={self.job}`")

    # ------------------------------------------------------------------ launch
    def _pod_name(self, attempt: int, slot: str, try_: int = 0) -> str:
        suffix = f"-{try_}" if try_ else ""
        return dns_label(f"{self.base}-a{attempt}-{slot}", 63 - len(suffix)) + suffix

    def _check_fenced(self) -> None:
        if self.fenced:
            raise PlatformError(f"not acting: {self.fenced}")

    async def launch(self, spec: LaunchSpec) -> None:
        self._check_fenced()
        await self._ensure_owner()
        await self._ensure_service()
        await self._ensure_token()
        self.attempt = spec.attempt
        self._launch_id = secrets.token_hex(4)
        self.pods = {slot: _Pod(slot, self._pod_name(spec.attempt, slot), spec.attempt) for slot in spec.nodes}
        self._fence_older()
        await self._ensure_pod_group(spec)
        await self._ensure_budget(spec)
        port = spec.rdzv_endpoint.rsplit(":", 1)[1]
        first = spec.nodes[0]
        await self._create_pod(spec, first, port, is_host=True)
        first_name = self.pods[first].name
        # by DNS name the others can be made at once: their agents keep dialing the name until
        # the first pod is placed (torchrun's join and read timeouts: join_timeout_s)
        endpoint = (self._host_endpoint(first, port) or await self._wait_first(first_name, port)) \
            if self.s.rdzv_address == "ip" else self._endpoint_of(None, port, name=first_name)
        if endpoint is None:
            # the first pod waits (for capacity, or it cannot start): the others, which dial its
            # IP, are made once it has one (observe), and the controller reads the wait meanwhile
            self._deferred = (spec, port, list(spec.nodes[1:]))
            log.info("event=pods_deferred attempt=%d first=%s rest=%s (made once the first pod has an IP)",
                     spec.attempt, first_name, list(spec.nodes[1:]))
            return
        await self._create_rest(spec, spec.nodes[1:], endpoint)

    async def check_workers(self, spec: LaunchSpec) -> list[str]:
        """A server-side dry run (``dryRun=All``) of the first slot's worker pod, as :meth:`launch`
        would make it: the API server runs its schema, its admission (PodSecurity, webhooks) and
        its quota and stores nothing. Refused: a :class:`PlatformError` with the API server's
        message; a quota that others hold now: a warning (the launch's pods are refused while they
        hold it), unless its limit leaves room for fewer worker pods than the job's least node
        count whatever else ends (:func:`quota_never_holds`): refused (no launch could ever run)."""
        self._check_fenced()
        await self._ensure_owner()
        slot = spec.nodes[0]
        pod = self._pod_body(spec, slot, spec.rdzv_endpoint.rsplit(":", 1)[1], is_host=True)
        pod["metadata"]["name"] = dns_label(f"{self.base}-dry-run-check")
        try:
            await self.api.call(self.api.core.create_namespaced_pod, self.ns, pod, dry_run="All", ok=(409,))
        except ApiError as exc:
            said = exc.said
            if exc.status not in REFUSED or "does not support dry run" in said:
                # no answer, or a webhook with side effects that the API server will not call on a
                # dry run: the cluster cannot tell without making the pod
                return [f"the worker pod could not be checked with a dry run ({said}); launching as configured"]
            if "exceeded quota" in said:
                never = quota_never_holds(said, self.s.nodes_min or spec.nnodes_min)
                if never:
                    raise PlatformError(f"{never} (a dry run: nothing was made); raise the quota or lower the "
                                        "workers' requests (chart values workers.resources, config "
                                        "platform.kubernetes.worker.resources)") from None
                # (a ResourceQuota refuses a pod's creation: none waits Pending for it, unlike a
                # queue's quota under Kueue)
                return [f"the namespace's quota does not hold a worker pod now ({said}); the launch fails while "
                        "it does not (a first launch ends the controller, exit 1; a relaunch is retried, then fails)"]
            if exc.status == 403 and "cannot create resource" in said:
                raise PlatformError(f"the controller may not create worker pods in namespace {self.ns}: {said}; "
                                    "grant it pods create (the chart's Role: rbac.create)") from None
            raise PlatformError(f"the API server refuses the worker pod (a dry run: nothing was made): {said}; "
                                "fix the worker pod (chart values workers.*, config platform.kubernetes.worker) "
                                "and upgrade the release") from None
        log.info("event=worker_pod_accepted namespace=%s (dry run: schema, admission, PodSecurity and quota passed)",
                 self.ns)
        return []

    async def _create_rest(self, spec: LaunchSpec, slots: Sequence[str], endpoint: str) -> None:
        for slot in slots:
            await self._create_pod(spec, slot, endpoint, is_host=False)
        log.info("event=pods_created attempt=%d pods=%s rendezvous=%s", spec.attempt,
                 [p.name for p in self.pods.values()], endpoint)

    async def _create_deferred(self, pods: dict) -> None:
        """The rest of a gang whose first pod was not placed at launch, once it is. A create that
        fails is tried again at the next observation (a pod made already is kept: ``_create_pod``)."""
        if self._deferred is None:
            return
        spec, port, slots = self._deferred
        first = pods.get(self.pods[spec.nodes[0]].name) if spec.nodes[0] in self.pods else None
        endpoint = self._endpoint_of(first, port)
        if endpoint is None:
            return
        await self._create_rest(spec, slots, endpoint)
        self._deferred = None

    def _host_endpoint(self, slot: str, port: str) -> str | None:
        """With ``rendezvous: ip``, host-network pods pinned to their nodes (``node_reads``): the
        first pod's IP is its node's InternalIP, known before the pod is placed, so the whole gang
        is made at once (a gang admitted whole needs every pod to exist). None otherwise."""
        w = self.s.worker
        template = (w.pod_template if w is not None and isinstance(w.pod_template, dict) else None) or {}
        if self.node_watch is None or not (template.get("spec") or {}).get("hostNetwork"):
            return None
        node = self.node_watch.snapshot().get(slot.split("--", 1)[0])
        for address in (node.status.addresses or []) if node is not None and node.status else []:
            if address.type == "InternalIP" and address.address:
                return f"{address.address}:{port}"
        return None

    def _endpoint_of(self, first: Any, port: str, name: str = "") -> str | None:
        """Where the other pods dial the first pod's store: its DNS name under the Service, or
        (``rdzv_address: ip``) its IP once it has one (None before)."""
        if self.s.rdzv_address != "ip":
            return f"{name or first.metadata.name}.{self.service}.{self.ns}.svc:{port}"
        ip = first.status.pod_ip if first is not None and first.status else None
        return f"{ip}:{port}" if ip else None

    async def _create_pod(self, spec: LaunchSpec, slot: str, endpoint: str, is_host: bool) -> None:
        """Create the slot's pod. On a name already taken: ours (a create whose answer was lost
        and was retried) is kept; another's (an earlier run's or launch's, or one still
        Terminating) is left to the fencing and this pod takes the next name. ``endpoint`` is
        the store's ``host:port``, or its port alone for the pod that serves it."""
        p = self.pods[slot]
        self.pod_watch.forget([p.name])  # a retried launch's names are new again
        for try_ in range(NAME_TRIES):
            pod = self._pod_body(spec, slot, endpoint, is_host)
            try:
                created = await self.api.call(self.api.core.create_namespaced_pod, self.ns, pod, ok=(409,))
            except ApiError as exc:
                never = quota_never_holds(exc.said, self.s.nodes_min or spec.nnodes_min) if exc.status == 403 else None
                if never is None:
                    raise
                # the dry run passed (one pod fits) but the gang does not: say so, not the bare 403,
                # and stop (no retry makes the quota larger)
                raise LaunchRefused(f"{never}: pod {p.name} refused ({exc.said}); raise the quota or lower the "
                                    "workers' requests") from None
            if created is not None or await self._ours(p.name):
                return
            taken = p.name
            other = self.pod_watch.snapshot().get(taken)
            if other is not None and not self.owns(other):
                refs = [f"{r.kind} {r.name}" for r in other.metadata.owner_references or []]
                raise PlatformError(
                    f"pod name {taken} is held by another release's pod (owned by {', '.join(refs) or 'nothing'}, "
                    f"label {OWNER_LABEL}={(other.metadata.labels or {}).get(OWNER_LABEL, '-')}); this release never "
                    f"touches it: give one of the two releases another config.job")
            p.name = self._pod_name(spec.attempt, slot, try_ + 1)
            self.pod_watch.forget([p.name])
            log.warning("event=pod_name_taken pod=%s by=another_launch action=delete_it,use_name new=%s", taken, p.name)
            if taken not in self._fencing:
                # a dead controller's pod for this very slot: it holds the slot's node (the new pod
                # is pinned there too) and must go now, not at the first observation after this launch
                self._fencing.add(taken)
                self._spawn(self._delete(taken, 0))
        raise PlatformError(f"pod names for slot {slot} of attempt {spec.attempt} are all taken "
                            f"(`kubectl get pods -n {self.ns} -l {self.selector}`)")

    async def _ours(self, name: str) -> bool:
        """Whether the pod already named ``name`` is this launch's (seen through the watch, which
        shows any existing pod within its latency; never a GET: the Role has no pods/get)."""
        deadline = time.monotonic() + min(5.0, self.api.timeout_s)
        while True:
            pod = self.pod_watch.snapshot().get(name)
            if pod is not None:
                labels = pod.metadata.labels or {}
                return labels.get(LAUNCH_LABEL) == self._launch_id and not pod.metadata.deletion_timestamp
            if time.monotonic() >= deadline:
                return False  # gone already (deleted as we asked), or never seen: take a new name
            await asyncio.sleep(0.05)

    def worker_pod(self, spec: LaunchSpec, slot: str, endpoint: str = "") -> dict:
        """The pod :meth:`launch` creates for ``slot`` of ``spec``'s attempt: the generated pod with
        ``worker.pod_template`` merged over it (:mod:`.pod_template`). ``endpoint``: the store's
        ``host:port`` the pod dials; empty: the first pod's name under the rendezvous Service, as
        launch makes it (with ``rendezvous: ip`` the first pod's IP must be given: it has one only
        once placed). The first slot's pod serves the store. Needs no cluster: the chart's tests
        build a pod from a rendered config with it."""
        is_host = slot == spec.nodes[0]
        port = spec.rdzv_endpoint.rsplit(":", 1)[1]
        if not endpoint and not is_host:
            endpoint = self._endpoint_of(None, port, name=self._name_of(spec, spec.nodes[0])) or ""
            if not endpoint:
                raise PlatformError("rendezvous ip: the first pod's IP:port is needed to build the others")
        return self._pod_body(spec, slot, port if is_host else endpoint, is_host)

    def _name_of(self, spec: LaunchSpec, slot: str) -> str:
        p = self.pods.get(slot)
        return p.name if p is not None and p.attempt == spec.attempt else self._pod_name(spec.attempt, slot)

    def _app_labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": dns_label(self.s.instance or self.job),
                "app.kubernetes.io/component": "worker"}

    def _pod_body(self, spec: LaunchSpec, slot: str, endpoint: str, is_host: bool) -> dict:
        name = self._name_of(spec, slot)
        if is_host:
            # the store's own pod dials itself: by its name, or by its IP, which Kubernetes puts in
            # its command ($(POD_IP) from the downward API) before the pod is known to anyone else
            endpoint = (f"$(POD_IP):{endpoint}" if self.s.rdzv_address == "ip"
                        else f"{name}.{self.service}.{self.ns}.svc:{endpoint}")
        argv = torchrun_argv(self.s.python, spec, endpoint=endpoint, is_host=is_host,
                             join_timeout_s=self.s.join_timeout_s, rank=node_rank(spec.nodes, slot))
        env = agent_env(spec, slot, Path("/tmp"))
        env.pop("TMPDIR", None)  # the container's own
        env_list: list[dict] = [{"name": k, "value": v} for k, v in sorted(env.items())]
        env_list.append({"name": Env.TOKEN, "valueFrom": {"secretKeyRef": {"name": self.secret,
                                                                                    "key": self.token_key}}})
        env_list.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        w = self.s.worker
        container: dict[str, Any] = {"name": pod_template.AGENT, "image": spec.image or self.s.image, "command": argv,
                                     "env": env_list}
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never", "hostname": name, "subdomain": self.service,
            "terminationGracePeriodSeconds": self.s.termination_grace_s,
            "automountServiceAccountToken": False,  # ranks never call the Kubernetes API
        }
        volumes, mounts = self._volumes()
        if volumes:
            pod_spec["volumes"], container["volumeMounts"] = volumes, mounts
        self._place(slot, container, pod_spec)
        labels = dict(w.labels if w is not None else {}) | self.labels | self._app_labels() | {
            ATTEMPT_LABEL: str(spec.attempt), SLOT_LABEL: dns_label(slot), LAUNCH_LABEL: self._launch_id}
        annotations = dict(w.annotations if w is not None else {}) | {
            "elastic-supervisor/slot": slot, "elastic-supervisor/rdzv": endpoint}
        g = self.s.gang
        if g is not None and g.enabled:
            # the attempt's pods are one group, admitted whole (the template may not change these)
            g_labels, g_annotations, scheduler = gang.pod_fields(g, self._group(spec.attempt), len(spec.nodes))
            labels |= g_labels
            annotations |= g_annotations
            if scheduler:
                pod_spec["schedulerName"] = scheduler
        meta: dict[str, Any] = {"name": name, "namespace": self.ns, "labels": labels, "annotations": annotations}
        if self._owner:
            meta["ownerReferences"] = self._owner
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
        return pod_template.apply(pod, w.pod_template if w is not None else None)

    def _group(self, attempt: int) -> str:
        """The attempt's pod group name (Kueue's pod-group-name, the PodGroup's name): a label value."""
        return dns_label(gang.group_name(self.base, attempt), 63)

    def _custom_objects(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api.api_client)

    async def _ensure_pod_group(self, spec: LaunchSpec) -> None:
        """The attempt's PodGroup (volcano, coscheduling), made before its pods: the gang
        scheduler binds none of them until ``minMember`` can be placed together. 409: made already
        (a launch retried)."""
        g = self.s.gang
        if g is None or g.api is None:
            return
        if spec.attempt > 0 and self._torn_down != spec.attempt - 1:
            await self._delete_pod_group(spec.attempt - 1)  # left by a controller that died before its teardown
        w = self.s.worker
        body = gang.pod_group(g, self._group(spec.attempt), self.ns, len(spec.nodes),
                              labels=dict(self.labels) | {ATTEMPT_LABEL: str(spec.attempt)}, owner=self._owner,
                              priority_class=w.priority_class_name if w is not None else "")
        group, version, plural = g.api
        objects, where = self._custom_objects(), (group, version, self.ns, plural)
        await self._ensure_made("PodGroup", body, (objects.create_namespaced_custom_object, where, ()),
                                (objects.get_namespaced_custom_object, where, ()),
                                (objects.delete_namespaced_custom_object, where, ()))
        log.info("event=pod_group_created name=%s api=%s/%s minMember=%d", body["metadata"]["name"], group, version,
                 len(spec.nodes))

    async def _ensure_made(self, kind: str, body: dict, create: tuple, read: tuple, delete: tuple) -> None:
        """Create ``body``. 409, made already: kept where its spec holds everything ``body``'s does
        (a launch retried), else deleted and made again (an earlier run's, left by a controller that
        died before its teardown: a run starts at attempt 0 again, and its gang may be another size
        or its pods other labels). ``create``, ``read``, ``delete``: the client's method, and its
        arguments before and after the body or the name."""
        def call(op: tuple, x: Any, **kw: Any) -> Any:
            fn, before, after = op
            return self.api.call(fn, *before, x, *after, **kw)

        name = body["metadata"]["name"]
        if await call(create, body, ok=(409,)) is not None:
            return
        found = await call(read, name, ok=(404,))
        if found is not None:
            found = self.api.api_client.sanitize_for_serialization(found)
            meta, have = found.get("metadata") or {}, found.get("spec") or {}
            if not meta.get("deletionTimestamp") and all(have.get(k) == v for k, v in body["spec"].items()):
                return
            log.warning("event=stale_object_replaced kind=%s name=%s deleting=%s had=%s wanted=%s", kind, name,
                        bool(meta.get("deletionTimestamp")), json.dumps(have, sort_keys=True)[:400],
                        json.dumps(body["spec"], sort_keys=True)[:400])
            if not meta.get("deletionTimestamp"):
                await call(delete, name, ok=(404,))
            # gone before it is made again (a finalizer may hold it a while)
            deadline = time.monotonic() + self.s.delete_confirm_s
            while found is not None:
                if time.monotonic() > deadline:
                    raise PlatformError(f"{kind} {name} (an earlier launch's, for another gang) is still being "
                                        f"deleted after {self.s.delete_confirm_s:g} s (finalizers: "
                                        f"{', '.join(meta.get('finalizers') or []) or 'none'})")
                await asyncio.sleep(0.2)
                found = await call(read, name, ok=(404,))
        if await call(create, body, ok=(409,)) is None:
            raise PlatformError(f"{kind} {name} was made again by someone else while this launch replaced it")

    def _budget_name(self, attempt: int) -> str:
        return dns_label(f"{self.base}-a{attempt}", 63)

    async def _ensure_budget(self, spec: LaunchSpec) -> None:
        """The attempt's PodDisruptionBudget (``disruption_budget``): ``minAvailable`` = the gang,
        so that a drain or the autoscaler's consolidation (evictions) waits for the job instead of
        taking the gang apart pod by pod, one whole restart each. The controller's own deletes are
        not evictions: it never blocks a restart. An earlier attempt's budget (a controller that
        died before its teardown) goes first. 409: made already (a launch retried)."""
        if not self.s.disruption_budget:
            return
        if spec.attempt > 0 and self._torn_down != spec.attempt - 1:
            await self._delete_budget(spec.attempt - 1)
        selector = dict(self.labels) | {ATTEMPT_LABEL: str(spec.attempt)}
        body = disruption_budget(self._budget_name(spec.attempt), self.ns, selector, len(spec.nodes), self._owner)
        policy, ns = self._policy(), (self.ns,)
        await self._ensure_made("PodDisruptionBudget", body, (policy.create_namespaced_pod_disruption_budget, ns, ()),
                                (policy.read_namespaced_pod_disruption_budget, (), ns),
                                (policy.delete_namespaced_pod_disruption_budget, (), ns))
        log.info("event=disruption_budget_created name=%s minAvailable=%d", body["metadata"]["name"], len(spec.nodes))

    async def _delete_budget(self, attempt: int) -> None:
        if not self.s.disruption_budget or attempt < 0:
            return
        try:
            await self.api.call(self._policy().delete_namespaced_pod_disruption_budget, self._budget_name(attempt),
                                self.ns, ok=(404,))
        except PlatformError as exc:
            log.warning("event=disruption_budget_delete_failed name=%s error=%s", self._budget_name(attempt), exc)

    def _policy(self) -> Any:
        from kubernetes import client

        return client.PolicyV1Api(self.api.api_client)

    async def _delete_pod_group(self, attempt: int) -> None:
        g = self.s.gang
        if g is None or g.api is None or attempt < 0:
            return
        group, version, plural = g.api
        try:
            await self.api.call(self._custom_objects().delete_namespaced_custom_object, group, version, self.ns, plural,
                                self._group(attempt), ok=(404,))
        except PlatformError as exc:
            log.warning("event=pod_group_delete_failed name=%s error=%s", self._group(attempt), exc)

    def _place(self, slot: str, container: dict, pod_spec: dict) -> None:
        """What makes a pod land where the slot's worker lands and ask for what it asks (a worker
        pod and its slot's capacity probe alike): the worker's pull policy, resources, pull
        secrets, service account, tolerations and priority; the slot's affinity; the node selector."""
        w = self.s.worker
        if w is not None:
            container["imagePullPolicy"] = w.image_pull_policy
            if w.resources:
                container["resources"] = _quantities(w.resources)
            if w.image_pull_secrets:
                pod_spec["imagePullSecrets"] = copy.deepcopy(list(w.image_pull_secrets))
            if w.service_account:
                pod_spec["serviceAccountName"] = w.service_account
            if w.tolerations:
                pod_spec["tolerations"] = copy.deepcopy(list(w.tolerations))
            if w.priority_class_name:
                pod_spec["priorityClassName"] = w.priority_class_name
        pod_spec["containers"] = [container]
        affinity = self._affinity(slot)
        if affinity:
            pod_spec["affinity"] = affinity
        if self.s.node_selector:
            pod_spec["nodeSelector"] = dict(self.s.node_selector)

    def _volumes(self) -> tuple[list[dict], list[dict]]:
        """The shared claims (checkpoints, logs: the same paths as the controller's) and /dev/shm."""
        volumes: list[dict] = []
        mounts: list[dict] = []
        v = self.s.volumes
        for key in ("checkpoints", "logs"):
            vol = getattr(v, key, None) if v is not None else None
            if vol is None or not vol.claim_name or not vol.mount_path:
                continue
            volumes.append({"name": key, "persistentVolumeClaim": {"claimName": vol.claim_name}})
            mounts.append({"name": key, "mountPath": vol.mount_path, **({"subPath": vol.sub_path} if vol.sub_path else {})})
        w = self.s.worker
        if w is not None and w.shm_size:
            volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": w.shm_size}})
            mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        return volumes, mounts

    def _affinity(self, slot: str) -> dict:
        terms: list[dict] = []
        if self.node_watch is not None:
            node = slot.split("--", 1)[0]
            terms.append({"key": HOSTNAME_LABEL, "operator": "In", "values": [node]})
        elif self.excluded:
            terms.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(self.excluded)})
        if not terms:
            return {}
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": terms}]}}}

    async def _wait_first(self, name: str, port: str) -> str | None:
        """The first pod's store endpoint (:meth:`_endpoint_of`), or None when it waits for
        capacity, cannot start, ended, or is not reachable within ``launch_timeout_s``: the
        controller then reads its state (observe), and the rest are made once it is placed."""
        deadline = time.monotonic() + self.s.launch_timeout_s
        while time.monotonic() < deadline:
            pod = self.pod_watch.snapshot().get(name)
            endpoint = self._endpoint_of(pod, port)
            if endpoint is not None:
                return endpoint
            if pod is not None and read_pod(pod_facts(pod)).kind not in (Reading.STARTING, Reading.RUNNING):
                return None
            await asyncio.sleep(0.05)
        log.warning("event=first_pod_not_placed pod=%s after_s=%g (its state decides: `kubectl describe pod -n %s %s`)",
                    name, self.s.launch_timeout_s, self.ns, name)
        return None

    def owns(self, pod: Any) -> bool:
        """Whether a pod of this job's name is this release's: its owner label, or (a pod made
        before releases were labelled) its owner reference. Without an owner every unlabelled pod of
        the job's name is the job's (one Lease per job name then keeps to one controller)."""
        meta = pod.metadata
        label = (meta.labels or {}).get(OWNER_LABEL)
        if not self.owner_uid:
            return label is None  # a release's pod is that release's, never an ownerless job's
        if label is not None:
            return label == self.owner_uid
        return any(ref.uid == self.owner_uid for ref in meta.owner_references or [])

    def _pods(self) -> dict[str, Any]:
        """The watched pods that are this release's (another release's are never ours to touch)."""
        return {name: pod for name, pod in self.pod_watch.snapshot().items() if self.owns(pod)}

    async def _ensure_owner(self) -> None:
        if self._owner is not None or not self.s.owner_configmap:
            self._owner = self._owner or []
            return
        if self.owner_uid:
            self._owner = [{"apiVersion": "v1", "kind": "ConfigMap", "name": self.s.owner_configmap,
                            "uid": self.owner_uid}]
            return
        cm = await self.api.call(self.api.core.read_namespaced_config_map, self.s.owner_configmap, self.ns, ok=(404,))
        if cm is None:
            log.warning("event=owner_missing configmap=%s (objects get no owner reference)", self.s.owner_configmap)
            self._owner = []
            return
        self._owner = [{"apiVersion": "v1", "kind": "ConfigMap", "name": cm.metadata.name, "uid": cm.metadata.uid}]

    async def _ensure_service(self) -> None:
        if "service" in self._ensured:
            return
        body = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": self.service, "namespace": self.ns, "labels": dict(self.labels),
                             **({"ownerReferences": self._owner} if self._owner else {})},
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                         "selector": dict(self.labels),
                         "ports": [{"name": "c10d", "port": self.s.rdzv_port or 29400}]}}
        await self.api.call(self.api.core.create_namespaced_service, self.ns, body, ok=(409,))
        self._ensured.add("service")

    async def _ensure_token(self) -> None:
        if self.s.token_secret:  # the release's Secret: the pods read the same one the controller has mounted
            return
        if self.token_path is None:
            raise PlatformError("no job token to hand to the pods (token_env was never asked)")
        token = self.token_path.read_bytes().strip()
        data = {TOKEN_KEY: base64.b64encode(token).decode()}
        if self._token_written == token:
            return
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                "metadata": {"name": self.secret, "namespace": self.ns, "labels": dict(self.labels),
                             **({"ownerReferences": self._owner} if self._owner else {})}}
        made = await self.api.call(self.api.core.create_namespaced_secret, self.ns, body, ok=(409,))
        if made is None:  # exists: a new run may have a new token
            await self.api.call(self.api.core.patch_namespaced_secret, self.secret, self.ns, {"data": data})
        self._token_written = token

    # ------------------------------------------------------------------ observe
    async def observe(self) -> dict[str, NodeStatus]:
        pods = self._pods()
        nodes = self.node_watch.snapshot() if self.node_watch is not None else {}
        self._fence_older(pods)
        await self._create_deferred(pods)
        deferred = set(self._deferred[2]) if self._deferred is not None else set()
        out: dict[str, NodeStatus] = {}
        for slot, p in self.pods.items():
            if p.final is not None:
                out[slot] = p.final
                continue
            if slot in deferred:
                first = out.get(self._deferred[0].nodes[0]) if self._deferred is not None else None
                waits = first is not None and first.waiting == WAIT_CAPACITY
                out[slot] = NodeStatus(slot, p.attempt, NodeState.RUNNING, waiting=WAIT_CAPACITY if waits else "",
                                       reason=first.reason if waits else "",
                                       detail=f"pod {p.name} not made yet: it dials the first pod by its IP, which "
                                              f"it has not got{f' ({first.detail})' if waits else ''}")
                continue
            obj = pods.get(p.name)
            if obj is None:
                gone = self.pod_watch.gone(p.name)
                if gone is None and not p.seen:
                    out[slot] = NodeStatus(slot, p.attempt, NodeState.RUNNING)  # created, not seen yet
                    continue
                status = self._final(p, gone, deleted=True)
                p.final = status
                out[slot] = status
                continue
            p.seen = True
            status = self._status(p, obj, nodes)
            if status.state != NodeState.RUNNING:
                status = await self._with_failures(p, status)
                p.final = status
            out[slot] = status
        if self.probes and out and all(st.state != NodeState.RUNNING for st in out.values()):
            # the gang they would grow has ended (completed, or failed: a relaunch plans anew): a
            # probe left behind would hold its slot's GPUs once placed, until `helm uninstall`
            probes, self.probes = list(self.probes.values()), {}
            log.info("event=capacity_probes_deleted pods=%s (the gang has ended)", probes)
            await asyncio.gather(*(self._delete(name, 0) for name in probes))
        return out

    async def _with_failures(self, p: _Pod, status: NodeStatus) -> NodeStatus:
        """A failed agent's ranks as its own output (the pod's log) tells them, read once."""
        if status.state != NodeState.EXITED or status.exit_code in (0, None) or p.killed_by_us:
            return status
        try:
            text = await self.api.call(self.api.core.read_namespaced_pod_log, p.name, self.ns, tail_lines=400,
                                       limit_bytes=POD_LOG_BYTES, container="agent", ok=(400, 404), retry_s=5.0) or ""
        except PlatformError as exc:
            log.warning("event=pod_log_unreadable pod=%s error=%s", p.name, exc)
            return status
        # off the loop: a pod's output is the job's, of any shape
        failures, error = await asyncio.to_thread(_read_failures, text[-POD_LOG_BYTES:])
        return dataclasses.replace(status, failures=failures, output_error=error)

    def _status(self, p: _Pod, pod: Any, nodes: dict) -> NodeStatus:
        """What the pod says (:func:`~.pod_reading.read_pod`), as the controller takes a node."""
        host = (pod.spec.node_name if pod.spec else None) or ""
        facts = pod_facts(pod)  # once per pod and tick: at 1,024 pods each reading is milliseconds
        r = read_pod(facts)
        base = dict(name=p.slot, attempt=p.attempt, host=host, killed_by_us=p.killed_by_us, reason=r.reason)
        if r.kind == Reading.REJECTED_BY_NODE:
            return NodeStatus(**base, state=NodeState.LOST, bad_host=True,
                              detail=f"pod {p.name} rejected by node {host or '?'}: {r.reason}: {r.message}")
        requeued = self._requeued(facts)
        if requeued is not None and not p.deleted_by_us:
            return NodeStatus(**dict(base, reason=requeued.reason), state=NodeState.LOST, requeued=True,
                              detail=f"pod {p.name} {requeued.reason}: {requeued.message}".strip(": "))
        if r.kind in (Reading.DISRUPTED, Reading.EVICTED) and not p.deleted_by_us:
            return NodeStatus(**base, state=NodeState.LOST, detail=f"pod {p.name} {r.reason}: {r.message}".strip(": "))
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            return self._final(p, pod, deleted=False)
        if _terminated(pod, agent_only=True) is not None:
            # the agent ended; a container the pod template added keeps the pod Running
            return self._final(p, pod, deleted=False)
        if r.kind == Reading.WAITING_FOR_CAPACITY:
            return NodeStatus(**base, state=NodeState.RUNNING, waiting=WAIT_CAPACITY,
                              detail=f"pod {p.name} {r.reason}: {r.message}")
        if r.kind == Reading.CANNOT_START:
            return NodeStatus(**base, state=NodeState.RUNNING, waiting=WAIT_CANNOT_START,
                              detail=f"pod {p.name} cannot start its container {r.container}: {r.reason}: {r.message}")
        node = nodes.get(host) if host else None
        stopped = node is not None and not _node_ready(node)
        return NodeStatus(p.slot, p.attempt, NodeState.RUNNING, host=host, stopped=stopped,
                          detail=f"node {host} is not Ready" if stopped else "", image_id=_image_id(pod))

    def _final(self, p: _Pod, pod: Any, deleted: bool) -> NodeStatus:
        """A pod that ended or went away. One deleted by someone else (``kubectl delete``, a
        controller of the cluster) is lost, not failed: its SIGTERM exit says nothing against
        its machine. One whose container its memory limit killed is out of memory, whoever
        deletes it after."""
        host = (pod.spec.node_name if pod is not None and pod.spec else None) or ""
        term = _terminated(pod)
        code = exit_code(term.exit_code) if term is not None else None
        facts = pod_facts(pod) if pod is not None else None
        r = read_pod(facts) if facts is not None else None
        if r is not None and r.kind == Reading.OUT_OF_MEMORY:
            return NodeStatus(p.slot, p.attempt, NodeState.EXITED, exit_code=code if code is not None else -9,
                              killed_by_us=p.killed_by_us, host=host, reason=r.reason, out_of_memory=True,
                              detail=f"pod {p.name}: {r.message}")
        by_other = not p.deleted_by_us and (deleted or bool(pod is not None and pod.metadata.deletion_timestamp))
        if code is not None and not by_other:
            why = f"pod {p.name} {term.reason or 'terminated'} (exit code {term.exit_code})"
            return NodeStatus(p.slot, p.attempt, NodeState.EXITED, exit_code=code, killed_by_us=p.killed_by_us,
                              host=host, detail=why, reason=term.reason or "")
        requeued = self._requeued(facts) if facts is not None and not p.deleted_by_us else None
        if requeued is not None:
            return NodeStatus(p.slot, p.attempt, NodeState.LOST, killed_by_us=p.killed_by_us, host=host, requeued=True,
                              reason=requeued.reason, detail=f"pod {p.name} {requeued.reason}: {requeued.message}")
        who = "deleted by us" if p.deleted_by_us else "deleted by someone else"
        ended = f" (exit code {term.exit_code})" if term is not None else " before it reported an exit code"
        return NodeStatus(p.slot, p.attempt, NodeState.LOST, killed_by_us=p.killed_by_us, host=host,
                          detail=f"pod {p.name} {who}{ended}")

    def _requeued(self, facts: PodFacts) -> Condition | None:
        """The condition by which the gang's admission took this pod's group back (Kueue's
        eviction, a gang scheduler's preemption: :func:`~.gang.requeued`), if it did: from the
        pod's facts (:func:`pod_facts`), read once per pod and tick."""
        g = self.s.gang
        if g is None or not g.enabled:
            return None
        return next((c for c in facts.conditions
                     if c.status == "True" and gang.requeued(g, c.type, c.reason)), None)

    def _fence_older(self, pods: dict | None = None) -> None:
        """Delete, once, every pod of this job that is not the current gang's: older attempts',
        an earlier run's (a run restarts at attempt 0), a dead controller's half-made launch.
        Only the one acting controller (the Lease holder) gets here, and only once it has
        launched or adopted (or refused to adopt) a gang."""
        if self.fenced or self.attempt < 0:
            return
        current = {p.name for p in self.pods.values()} | set(self.probes.values())
        now = time.monotonic()
        for name, pod in (pods if pods is not None else self._pods()).items():
            if name in current or pod.metadata.deletion_timestamp:
                continue
            retry = self._fence_retry.get(name)
            if name in self._fencing and not (retry is not None and retry[0] <= now):
                continue
            if retry is not None:  # tried again now: not by the looks while this deletion is under way
                self._fence_retry[name] = (math.inf, retry[1])
            self._fencing.add(name)
            log.warning("event=stale_pod_deleted pod=%s attempt=%s current=%d", name,
                        (pod.metadata.labels or {}).get(ATTEMPT_LABEL, "?"), self.attempt)
            self._spawn(self._delete(name, 0))

    # ------------------------------------------------------------------ events
    def release_parts(self) -> dict[str, str]:
        """The worker image (as configured: a tag or a digest) and the pod template the workers
        are made from (the worker settings, the volumes, the agent's python)."""
        template = json.dumps({"worker": dataclasses.asdict(self.s.worker) if dataclasses.is_dataclass(self.s.worker)
                               else repr(self.s.worker),
                               "volumes": repr(self.s.volumes), "python": self.s.python}, sort_keys=True, default=str)
        return {"image": self.s.image, "template": hashlib.sha256(template.encode()).hexdigest()}

    def tell(self, name: str, fields: dict) -> None:
        """Post the controller's fault, kill, launch and end records as Kubernetes Events: on the
        culprit's pod (``kubectl describe pod``), or on the release's ConfigMap for the job's own
        (``kubectl get events``). Best effort, in the background: never in the way of a restart."""
        said = describe_event(name, fields)
        if said is None or not self._events_allowed or self.fenced:
            return
        kind, reason, message, slots = said
        targets: list[tuple[str, str, str]] = []  # (kind, name, uid)
        pods = self.pod_watch.snapshot()
        for slot in slots:
            p = self.pods.get(slot)
            if p is not None:
                seen = pods.get(p.name) or self.pod_watch.gone(p.name)
                targets.append(("Pod", p.name, (seen.metadata.uid or "") if seen is not None else ""))
        if not targets and self._owner:
            targets.append(("ConfigMap", self._owner[0]["name"], self._owner[0]["uid"]))
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        for target in targets:
            self._spawn(self._post_event(kind, reason, message, target))

    async def _post_event(self, kind: str, reason: str, message: str, target: tuple[str, str, str]) -> None:
        what, name, uid = target
        now = datetime.datetime.now(datetime.timezone.utc)
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": self.ns,
                         "labels": dict(self.labels)},
            "involvedObject": {"apiVersion": "v1", "kind": what, "name": name, "namespace": self.ns,
                               **({"uid": uid} if uid else {})},
            "type": kind, "reason": reason, "message": message[:EVENT_MESSAGE_MAX],
            "firstTimestamp": now.isoformat(), "lastTimestamp": now.isoformat(), "count": 1,
            "source": {"component": MANAGER}, "reportingComponent": MANAGER,
            "reportingInstance": os.environ.get("HOSTNAME", ""),
        }
        try:
            made = await self.api.call(self.api.core.create_namespaced_event, self.ns, body, ok=(403,), retry_s=2.0)
        except PlatformError as exc:
            log.debug("event=k8s_event_failed reason=%s error=%s", reason, exc)
            return
        if made is None and self._events_allowed:
            self._events_allowed = False
            log.warning("event=k8s_events_forbidden: the Role does not allow creating Events in %s; the "
                        "supervisor's events stay in events.jsonl and the logs only", self.ns)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete(self, name: str, grace: int) -> None:
        """Delete pod ``name``. A pod being fenced (it may hold a node the gang needs) whose deletion
        failed (refused, or no answer within the client's retries) is fenced again by an observation
        FENCE_RETRY_S later, doubling with each failure up to FENCE_RETRY_MAX_S; one whose deletion
        was cancelled before it was answered, by the next observation."""
        try:
            await self.api.call(self.api.core.delete_namespaced_pod, name, self.ns, grace_period_seconds=grace,
                                ok=(404,))
            self._fence_retry.pop(name, None)
        except PlatformError as exc:
            if name not in self._fencing:
                log.warning("event=pod_delete_failed pod=%s error=%s", name, exc)
                return
            failed = self._fence_retry.get(name, (0.0, 0))[1] + 1
            delay = min(FENCE_RETRY_MAX_S, FENCE_RETRY_S * 2 ** (failed - 1))
            self._fence_retry[name] = (time.monotonic() + delay, failed)
            log.warning("event=pod_delete_failed pod=%s error=%s (a stale pod: tried again in %g s, failure %d)",
                        name, exc, delay, failed)
        except asyncio.CancelledError:
            if name in self._fencing:
                self._fence_retry[name] = (time.monotonic(), self._fence_retry.get(name, (0.0, 0))[1])
            raise

    # ------------------------------------------------------------------ act
    async def kill_node(self, name: str) -> None:
        self._check_fenced()
        p = self.pods.get(name)
        if p is None:
            return
        p.killed_by_us = p.deleted_by_us = True
        await self.api.call(self.api.core.delete_namespaced_pod, p.name, self.ns, grace_period_seconds=0, ok=(404,))
        log.info("event=pod_killed pod=%s slot=%s", p.name, name)

    async def teardown(self, grace_s: float) -> None:
        self._check_fenced()
        self._deferred = None
        probes, self.probes = list(self.probes.values()), {}
        live = list(self.pods.values())  # every pod we made, seen by the watch yet or not (404 is fine)
        for name in probes:
            self._spawn(self._delete(name, 0))
        for p in live:
            p.deleted_by_us = True
        grace = max(0, int(round(grace_s)))
        await asyncio.gather(*(self._delete(p.name, grace) for p in live), self._delete_pod_group(self.attempt),
                             self._delete_budget(self.attempt))
        self._torn_down = self.attempt
        deadline = time.monotonic() + grace + self.s.delete_confirm_s
        while time.monotonic() < deadline:
            left = [p.name for p in live if p.name in self.pod_watch.snapshot()]
            if not left:
                return
            await asyncio.sleep(0.1)
        left = [p.name for p in live if p.name in self.pod_watch.snapshot()]
        if left:  # stuck Terminating (a node that does not answer): force, and do not wait for it
            log.warning("event=pods_forced pods=%s after_s=%.0f (new pod names per attempt: the relaunch is not "
                        "blocked)", left, grace + self.s.delete_confirm_s)
            await asyncio.gather(*(self._delete(n, 0) for n in left))

    # ------------------------------------------------------------------ capacity probes
    async def probe_capacity(self, slots: Sequence[str]) -> None:
        self._check_fenced()
        await self._ensure_owner()
        for slot in slots:
            if slot in self.probes:
                continue
            name = dns_label(f"{self.base}-probe-{slot}", 63)
            container: dict[str, Any] = {
                "name": "probe", "image": self.s.image,
                # holds the slot's resources until deleted; never runs the job
                "command": [self.s.python, "-c", "import time\nwhile True: time.sleep(3600)"]}
            pod_spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                        "automountServiceAccountToken": False}
            self._place(slot, container, pod_spec)
            meta: dict[str, Any] = {"name": name, "namespace": self.ns, "labels": dict(self.labels) | {
                ROLE_LABEL: PROBE_ROLE, SLOT_LABEL: dns_label(slot)}, "annotations": {"elastic-supervisor/slot": slot}}
            if self._owner:
                meta["ownerReferences"] = self._owner
            w = self.s.worker
            meta["labels"] |= dict(w.labels if w is not None else {}) | self._app_labels()
            pod = pod_template.apply({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec},
                                     pod_template.placement(w.pod_template if w is not None else None, "probe"))
            self.probes[slot] = name
            self.pod_watch.forget([name])
            await self.api.call(self.api.core.create_namespaced_pod, self.ns, pod, ok=(409,))
            log.info("event=capacity_probe pod=%s slot=%s (the gang grows back once the scheduler places it)", name, slot)

    def capacity_returned(self) -> list[str]:
        if self.fenced or not self.probes:
            return []
        pods = self._pods()
        back = []
        for slot, name in list(self.probes.items()):
            pod = pods.get(name)
            if pod is None or pod.metadata.deletion_timestamp:
                continue
            r = read_pod(pod_facts(pod))
            if pod.spec is not None and pod.spec.node_name and r.kind in (Reading.STARTING, Reading.RUNNING):
                back.append(slot)
                del self.probes[slot]
                self._spawn(self._delete(name, 0))  # its resources are the gang's now
        return back

    # ------------------------------------------------------------------ adoption
    def describe(self) -> dict:
        return {"namespace": self.ns, "attempt": self.attempt, "excluded": list(self.excluded),
                "pods": {slot: p.name for slot, p in self.pods.items()}, "probes": dict(self.probes)}

    async def adopt(self, saved: dict, attempt: int) -> bool:
        saved = saved or {}
        names = saved.get("pods") or {}
        self.excluded = list(saved.get("excluded") or self.excluded)
        pods = self._pods()
        live = {slot: name for slot, name in names.items()
                if name in pods and not pods[name].metadata.deletion_timestamp
                and (pods[name].status is None or pods[name].status.phase in (None, "Pending", "Running"))}
        self.attempt = attempt
        if not names or len(live) != len(names):
            log.info("event=adopt_refused attempt=%d saved=%s live=%s", attempt, sorted(names), sorted(live))
            self.attempt = attempt  # older pods are fenced once the relaunch raises the attempt
            return False
        self.pods = {slot: _Pod(slot, name, attempt, seen=True) for slot, name in names.items()}
        # a gang shrunk for capacity keeps its capacity probes (else they are fenced as strays
        # and the gang never grows back)
        probes = saved.get("probes") if isinstance(saved.get("probes"), dict) else {}
        self.probes = {slot: name for slot, name in probes.items()
                       if isinstance(name, str) and name in pods and not pods[name].metadata.deletion_timestamp}
        log.info("event=gang_adopted attempt=%d pods=%s probes=%s", attempt, sorted(names.values()),
                 sorted(self.probes.values()))
        return True

    # ------------------------------------------------------------------ leader election
    def elected(self) -> str:
        return self._elected

    async def supervise(self, job) -> int:
        code = await self._lead(job)
        if self.fenced or job.handed_off:  # not the end of the job: leave (and be replaced)
            return code
        return await self._idle(job, code)

    async def _idle(self, job, code: int) -> int:
        """The job has ended: stay up (a Deployment restarts a container that exits, and a
        restarted controller would only report the same verdict) until SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        log.info("event=idle exit_code=%d: the job has ended; this controller stays up so that its Deployment does "
                 "not restart it, and keeps answering /healthz, /status and /metrics (`helm uninstall` removes the "
                 "job, its pods and this controller)", code)
        await job.serve_ended(done)
        return code

    async def _lead(self, job) -> int:
        if not self.s.leader_election:
            try:
                return await job.run()
            finally:
                self.close()
        from kubernetes import client

        from supervisor.platforms.kube.lease import LeaseConfig, LeaseElector, default_identity

        identity = default_identity()  # <hostname (the pod's name)>_<random>: a restarted controller is new
        lease = LeaseConfig(namespace=self.ns, name=self.s.lease or f"{self.job}-controller", identity=identity,
                            lease_duration_s=self.s.lease_duration_s, renew_deadline_s=self.s.renew_deadline_s,
                            retry_period_s=min(2.0, self.s.renew_deadline_s / 3),
                            request_timeout_s=min(5.0, self.s.renew_deadline_s))
        elector = LeaseElector(client.CoordinationV1Api(self.api.api_client), lease)
        campaign = elector.start()
        log.info("event=leader_election lease=%s/%s identity=%s (only the holder acts)", self.ns, lease.name, identity)
        waiting = asyncio.ensure_future(elector.wait_leading())
        await asyncio.wait({waiting, campaign}, return_when=asyncio.FIRST_COMPLETED)
        if campaign.done():
            waiting.cancel()
            self.close()
            campaign.result()  # raises the elector's PlatformError (RBAC, bad name)
            return 1
        log.info("event=leading lease=%s/%s identity=%s", self.ns, lease.name, identity)
        self._elected = f"Lease {self.ns}/{lease.name} held by {identity}"
        run = asyncio.ensure_future(job.run())
        lost = asyncio.ensure_future(elector.wait_not_leading())
        try:
            await asyncio.wait({run, lost, campaign}, return_when=asyncio.FIRST_COMPLETED)
            if run.done():
                return run.result()
            # leadership lost: stop acting at once, kill nothing; the new leader adopts the gang
            self.fenced = f"the Lease {self.ns}/{lease.name} is no longer ours"
            log.error("event=leadership_lost lease=%s/%s identity=%s: stopping without touching the gang",
                      self.ns, lease.name, identity)
            job.event("leadership_lost", lease=f"{self.ns}/{lease.name}", identity=identity,
                      detail="another controller leads now; this one stopped acting and killed nothing")
            run.cancel()
            try:
                await run
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - we are leaving; the leader acts
                pass
            return 1
        finally:
            for t in (lost,):
                t.cancel()
            await elector.stop()
            self.close()


def disruption_budget(name: str, namespace: str, selector: dict[str, str], min_available: int,
                      owner: list[dict] | None) -> dict:
    """A policy/v1 PodDisruptionBudget over an attempt's pods: evictions wait while fewer than
    ``min_available`` of them would be left Ready."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(selector)}
    if owner:
        meta["ownerReferences"] = copy.deepcopy(owner)
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
            # a pod Running but not Ready (starting, or broken) may be evicted: it is not training,
            # and under the default (IfHealthyBudget) one such pod would block every drain of the node
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": dict(selector)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


FENCE_RETRY_S = 2.0
"""After a stale pod's deletion failed, the wait before it is tried again (doubled per failure)."""
FENCE_RETRY_MAX_S = 60.0


_EXCEEDED = re.compile(r"exceeded quota: ([^,\s]+), requested: (\S+), used: (\S+), limited: (\S+)")
"""The quota admission's refusal (kube-apiserver's resourcequota plugin): ``exceeded quota: NAME,
requested: R=Q,..., used: R=Q,..., limited: R=Q,...``, each list the resources over the limit."""


def quota_never_holds(said: str, pods_min: int) -> str | None:
    """Why the quota named in the API server's refusal ``said`` can never hold ``pods_min`` worker
    pods, whatever else ends (its limit is below their requests), or None: it may once others free
    what they hold, or the refusal is not one it can read. The ``requested`` of a pod's refusal
    are that one pod's."""
    m = _EXCEEDED.search(said[:4096])
    if m is None:
        return None
    name, requested, limited = m.group(1), _resource_list(m.group(2)), _resource_list(m.group(4))
    if requested is None or limited is None:
        return None
    for resource, (asked_text, asked) in requested.items():
        limit_text, limit = limited.get(resource, ("", None))
        if limit is None or asked <= 0:
            continue
        if asked * pods_min <= limit:  # (products, not a quotient: Decimal's // fails past 28 digits)
            continue
        room = next(n for n in range(pods_min) if asked * (n + 1) > limit)
        return (f"the namespace's quota {name} can never hold the gang: a worker pod requests "
                f"{resource}={asked_text} and the quota allows {resource}={limit_text} in all, room for "
                f"{room} worker pod{'s' if room != 1 else ''} where the job needs at least {pods_min}")
    return None


def _resource_list(text: str) -> dict[str, tuple[str, Any]] | None:
    """``requests.cpu=1,pods=1`` as resource -> (its text, its quantity: a Decimal); None if any
    item does not read."""
    from kubernetes.utils import parse_quantity

    out = {}
    for item in text.split(",")[:64]:
        resource, sep, quantity = item.partition("=")
        if not sep or not resource:
            return None
        try:
            out[resource] = (quantity, parse_quantity(quantity))
        except (ValueError, TypeError, ArithmeticError):
            return None
    return out


def _quantities(resources: dict) -> dict:
    """``{limits: {nvidia.com/gpu: 8}}`` as the API's quantities: strings (YAML gives numbers)."""
    return {section: ({k: str(v) for k, v in values.items()} if isinstance(values, dict) else copy.deepcopy(values))
            for section, values in resources.items()}


POD_LOG_BYTES = 256 * 1024
"""The most of a failed pod's log read back (its last lines: torchrun's failure summary)."""


def _read_failures(text: str) -> tuple[tuple, str]:
    failures = parse(text)
    return failures, "" if failures else last_error(text)


def pod_facts(pod: Any) -> PodFacts:
    """The plain facts of a pod (a ``V1Pod``) that :func:`~.pod_reading.read_pod` reads."""
    status, spec = pod.status, pod.spec
    limits = {c.name: ((c.resources.limits or {}).get("memory", "") if c.resources else "")
              for c in (spec.containers if spec and spec.containers else [])}
    containers = []
    # the agent's first: its exit code is the pod's, whatever a sidecar says
    for cs in sorted((status.container_statuses or []) if status else [], key=lambda cs: cs.name != pod_template.AGENT):
        waiting = cs.state.waiting if cs.state else None
        term = cs.state.terminated if cs.state else None
        containers.append(ContainerFacts(
            name=cs.name or "", waiting_reason=(waiting.reason or "") if waiting else "",
            waiting_message=(waiting.message or "") if waiting else "",
            terminated_reason=(term.reason or "") if term else "", terminated_message=(term.message or "") if term else "",
            exit_code=term.exit_code if term else None, memory_limit=str(limits.get(cs.name, "") or "")))
    return PodFacts(
        phase=(status.phase or "") if status else "", reason=(status.reason or "") if status else "",
        message=(status.message or "") if status else "",
        conditions=tuple(Condition(c.type or "", c.status or "", c.reason or "", c.message or "")
                         for c in ((status.conditions or []) if status else [])),
        scheduling_gates=tuple(g.name for g in (spec.scheduling_gates or [])) if spec else (),
        containers=tuple(containers), node_name=(spec.node_name or "") if spec else "")


def _terminated(pod: Any, agent_only: bool = False) -> Any:
    """The agent container's terminated state, else (``agent_only`` False) another container's."""
    if pod is None or not pod.status:
        return None
    for cs in sorted(pod.status.container_statuses or [], key=lambda cs: cs.name != pod_template.AGENT):
        if cs.state and cs.state.terminated and (cs.name == pod_template.AGENT or not agent_only):
            return cs.state.terminated
    return None


def _node_ready(node: Any) -> bool:
    for c in (node.status.conditions or []) if node.status else []:
        if c.type == "Ready":
            return c.status == "True"
    return False


def read_mounted_token(path: Path) -> bytes:
    """The job token from a mounted Secret. The kubelet writes a Secret volume as symlinks
    (``token -> ..data/token``, ``..data -> ..2026_12_01...``) owned by root: follow them, but only
    within the volume's own folder, and check what is read is a token."""
    folder = path.parent.resolve()
    try:
        real = path.resolve(strict=True)
    except OSError as exc:
        raise PlatformError(f"platform.kubernetes.token_file: cannot read {path}: {exc.strerror or exc} (is the "
                            "token Secret mounted there?)") from None
    if folder not in real.parents:
        raise PlatformError(f"platform.kubernetes.token_file: {path} leads outside its own folder ({real})")
    try:
        with open(real, "rb") as f:
            token = f.read(TOKEN_MAX_CHARS + 1).strip()
    except OSError as exc:
        raise PlatformError(f"platform.kubernetes.token_file: cannot read {path}: {exc.strerror or exc}") from None
    problem = token_problem(token)
    if problem:
        raise PlatformError(f"platform.kubernetes.token_file: {path} holds {problem}")
    return token


def from_config(cfg, log_dir: Path) -> KubernetesPlatform:
    """The platform of a JobConfig with ``platform.kind: kubernetes`` (lists its pods now)."""
    k = cfg.platform.kubernetes
    settings = settings_from_config(cfg, k.namespace or own_namespace())
    api = KubeApi(api_client(k.kubeconfig, k.context), timeout_s=k.api_timeout_s, retry_s=k.api_retry_s)
    if settings.owner_configmap:
        settings.owner_uid = owner_uid(api, settings.namespace, settings.owner_configmap, wait_s=k.api_retry_s)
    return KubernetesPlatform(api, settings).start(wait_s=k.api_retry_s)


def settings_from_config(cfg, namespace: str) -> Settings:
    """The platform's settings from a JobConfig's ``platform.kubernetes``, in ``namespace``, with
    no cluster asked (``owner_uid`` is read at start by :func:`from_config`)."""
    k = cfg.platform.kubernetes
    if not k.worker.image:
        raise PlatformError("platform.kubernetes.worker.image: required (the worker image: python, torch, the "
                            "training code and elastic-supervisor)")
    address = k.controller_address or (f"{k.service}.{namespace}.svc" if k.service else "")
    return Settings(
        namespace=namespace, job=cfg.job, image=k.worker.image, python=k.python, worker=k.worker, volumes=k.volumes,
        rdzv_port=k.rdzv_port, rdzv_address=k.rendezvous, controller_address=address, read_nodes=k.node_reads,
        slots=k.slots or cfg.nodes.max, nodes_min=cfg.nodes.min, pods_per_node=k.pods_per_node,
        node_selector=dict(k.worker.node_selector),
        termination_grace_s=k.termination_grace_s, delete_confirm_s=k.delete_confirm_s,
        leader_election=k.leader_election, lease=k.lease, lease_duration_s=k.lease_duration_s,
        renew_deadline_s=k.renew_deadline_s, owner_configmap=k.owner_config_map, token_secret=k.token_secret.name,
        token_key=k.token_secret.key, token_file=k.token_file, join_timeout_s=join_timeout_s(cfg), instance=k.instance,
        disruption_budget=k.disruption_budget,
        gang=k.gang,
    )


def join_timeout_s(cfg) -> float:
    """The agents' rendezvous join timeout for a job that may wait for capacity: the longest wait
    (restart.capacity_wait_s, else restart.budget_s) plus the startup timeout once placed; never
    below torchrun's usual 120 s."""
    r = cfg.restart
    return max(JOIN_TIMEOUT_S, (r.capacity_wait_s or r.budget_s) + cfg.health.startup_timeout_s)


def owner_uid(api: KubeApi, namespace: str, name: str, wait_s: float) -> str:
    """The uid of the release's ConfigMap (its identity), read once at start; "" (with a warning)
    when it is not there: the job is then identified by its name alone."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + wait_s
    while True:
        try:
            cm = api.core.read_namespaced_config_map(name, namespace, _request_timeout=api.timeout_s)
            return cm.metadata.uid or ""
        except ApiException as exc:
            if exc.status == 404:
                log.warning("event=owner_missing configmap=%s/%s: objects get no owner reference and the job is "
                            "identified by its name alone", namespace, name)
                return ""
            if exc.status in (401, 403) or time.monotonic() >= deadline:
                raise PlatformError(f"cannot read the release's ConfigMap {namespace}/{name}: "
                                    f"{exc.status} {exc.reason}") from None
        except Exception as exc:  # noqa: BLE001 - the API server not answering yet: retried until wait_s
            if time.monotonic() >= deadline:
                raise PlatformError(f"cannot read the release's ConfigMap {namespace}/{name}: {exc}") from None
        time.sleep(0.5)
