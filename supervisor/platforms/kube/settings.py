"""``platform.kubernetes``: the Kubernetes platform's settings, a section of the job config
(:mod:`supervisor.platforms.registry` names it; :mod:`supervisor.config` reads it). The Helm
chart renders it; no kubernetes client here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from supervisor.config import ConfigError
from supervisor.platforms.kube.gang import GangConfig, owned_by_gang
from supervisor.platforms.kube.pod_template import OWNED_PREFIX, owned_label, problems


@dataclass(frozen=True)
class TokenSecretConfig:
    name: str = ""
    """The Secret holding the job token (the Helm chart's); empty: the platform writes its own,
    ``<job>-token``, from the controller's token."""
    key: str = "token"


@dataclass(frozen=True)
class VolumeConfig:
    claim_name: str = ""
    """A PersistentVolumeClaim (ReadWriteMany) every worker pod mounts; empty: none (the path must
    exist in the worker image, e.g. a host or CSI mount of its own)."""
    sub_path: str = ""
    mount_path: str = ""


@dataclass(frozen=True)
class VolumesConfig:
    checkpoints: VolumeConfig = field(default_factory=VolumeConfig)
    logs: VolumeConfig = field(default_factory=VolumeConfig)


@dataclass(frozen=True)
class WorkerConfig:
    """The worker pods: what the Helm chart's ``workers`` values become."""

    image: str = ""
    """The worker image (python, torch, the training code, this package)."""
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: Any = ()
    """``[{name: regcred}]``."""
    service_account: str = ""
    """The pods' service account (no API token is mounted: ranks never call the Kubernetes API)."""
    resources: Any = None
    """The container's resources, e.g. ``{limits: {nvidia.com/gpu: 8}}``."""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: Any = ()
    priority_class_name: str = ""
    shm_size: str = ""
    """A memory-backed ``/dev/shm`` of this size (DataLoader workers, NCCL); empty: none."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    pod_template: Any = None
    """A pod template fragment, ``{metadata: {labels, annotations}, spec: {...}}``, merged over
    each worker pod the controller generates (affinity, topology spread, scheduler, host network,
    security contexts, volumes and mounts, env and envFrom, init containers and sidecars ...; the
    worker container is the one named ``agent``). What the controller owns is refused here,
    naming the field; :mod:`supervisor.platforms.kube.pod_template` says what and how it merges."""

    def __post_init__(self) -> None:
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise ConfigError(f"platform.kubernetes.worker.image_pull_policy: {self.image_pull_policy!r} is not "
                              "Always, IfNotPresent or Never")
        for name, kind in (("image_pull_secrets", (list, tuple)), ("tolerations", (list, tuple)),
                           ("resources", (dict, type(None)))):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"platform.kubernetes.worker.{name}: must be a "
                                  f"{'list' if kind[0] is list else 'mapping'}")
        for key in self.labels:
            if owned_label(key):
                raise ConfigError(f"platform.kubernetes.worker.labels.{key}: owned by the controller")
        for key in self.annotations:
            if key.startswith(OWNED_PREFIX):
                raise ConfigError(f"platform.kubernetes.worker.annotations.{key}: owned by the controller")
        if self.pod_template is not None:
            for where, why in problems(self.pod_template):
                raise ConfigError(f"platform.kubernetes.worker.pod_template{'.' + where if where else ''}: {why}")


@dataclass(frozen=True)
class KubernetesConfig:
    """``platform.kubernetes``: one bare Pod per node slot per attempt, a headless Service for
    rendezvous, leader election over a Lease (docs/kubernetes.md). The Helm chart renders the
    first block; the rest has defaults for a real cluster."""

    namespace: str = ""
    """Where the pods, the Service and the Lease live; empty: the controller pod's own namespace."""
    service: str = ""
    """The controller's Service: ranks send heartbeats and API calls to ``SERVICE.NAMESPACE.svc``."""
    owner_config_map: str = ""
    """A ConfigMap (the release's job config) set as the owner of every object the platform makes:
    deleting the release garbage-collects the pods."""
    lease: str = ""
    """The Lease of the leader election; empty: ``<job>-controller``."""
    token_secret: TokenSecretConfig = field(default_factory=TokenSecretConfig)
    token_file: str = ""
    """Where the controller finds the job token (the ``token_secret`` mounted); with
    ``token_secret.name`` the ranks get the same Secret through ``secretKeyRef``."""
    node_reads: bool = False
    """List and watch Nodes (needs that RBAC): the slots are then the Ready, schedulable nodes (one
    pod pinned to each), a lost node shrinks the gang or hands its slot to a spare, and a node
    going NotReady stops its pod at once. Without it the slots are ``slots`` pod indexes."""
    instance: str = ""
    """The ``app.kubernetes.io/instance`` label of the worker pods (the chart's release name);
    empty: the job's name. Their ``app.kubernetes.io/name`` is ``elastic-supervisor-worker``,
    never the controller's, whose Service and Deployment select by those two labels."""
    rendezvous: str = "dns"
    """``dns``: agents dial the first pod by its name under the headless Service; ``ip``: by its
    ``status.podIP`` (clusters without pod DNS)."""
    volumes: VolumesConfig = field(default_factory=VolumesConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    gang: GangConfig = field(default_factory=GangConfig)
    """Gang admission: each attempt's pods admitted as one group by Kueue, Volcano or the
    scheduler-plugins coscheduling plugin (:mod:`supervisor.platforms.kube.gang`); ``none``: one by one."""
    python: str = "python"
    """The worker image's python (it runs the node agent, ``python -m supervisor.platforms.node.forking_agent``:
    torchrun's own, with its arguments)."""
    kubeconfig: str = ""
    """A kubeconfig file to reach the API server; empty: the in-cluster service account, else
    ``~/.kube/config``."""
    context: str = ""
    rdzv_port: int = 29400
    """The c10d store's port on the first pod. 0: a port free on this machine, per attempt (for a
    test cluster whose pods all share one host)."""
    controller_address: str = ""
    """What ranks dial to reach the controller; empty: ``service`` as above, else ``$POD_IP``, else
    ``intake.host``."""
    slots: int = 0
    """Pod slots without ``node_reads`` (0: ``nodes.max``)."""
    pods_per_node: int = 1
    """With ``node_reads``: how many pods of this job one node takes (one slot each)."""
    termination_grace_s: int = 30
    """The pods' ``terminationGracePeriodSeconds``: the ranks' emergency checkpoint on SIGTERM."""
    delete_confirm_s: float = 15.0
    """A deleted pod still present after its grace and this is forced (grace 0), not waited for."""
    api_timeout_s: float = 10.0
    """Each API request's timeout."""
    api_retry_s: float = 60.0
    """A failing API call (5xx, 429, refused) is retried this long, then it is a platform error;
    the watches keep reconnecting meanwhile and training never stops for it."""
    leader_election: bool = True
    """Only the holder of the Lease acts; a standby controller waits for it."""
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    disruption_budget: bool = True
    """A PodDisruptionBudget per attempt (``minAvailable`` = the gang, deleted with its attempt): a
    node drain or the autoscaler's consolidation waits for the job instead of evicting its pods
    one by one (one whole restart each). Off: voluntary disruptions take pods when they like."""

    def __post_init__(self) -> None:
        if self.rendezvous not in ("dns", "ip"):
            raise ConfigError(f"platform.kubernetes.rendezvous: {self.rendezvous!r} is not dns or ip")
        if not 0 <= self.rdzv_port < 65536:
            raise ConfigError("platform.kubernetes.rdzv_port: must be in [0, 65535]")
        for name in ("slots", "termination_grace_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"platform.kubernetes.{name}: must be >= 0")
        if self.instance and not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", self.instance):
            raise ConfigError(f"platform.kubernetes.instance: {self.instance!r} is not a label value (63 characters "
                              "at most, alphanumerics, '-', '_', '.')")
        if self.pods_per_node < 1:
            raise ConfigError("platform.kubernetes.pods_per_node: must be >= 1")
        for name in ("delete_confirm_s", "api_timeout_s", "api_retry_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"platform.kubernetes.{name}: must be > 0")
        if self.lease_duration_s < 2 or not 0 < self.renew_deadline_s < self.lease_duration_s:
            raise ConfigError("platform.kubernetes.renew_deadline_s: must be above 0 and under lease_duration_s "
                              "(>= 2)")
        mounts = [v.mount_path for v in (self.volumes.checkpoints, self.volumes.logs) if v.claim_name and v.mount_path]
        mounts += ["/dev/shm"] if self.worker.shm_size else []
        for where, why in problems(self.worker.pod_template or {}, mount_paths=mounts):
            raise ConfigError(f"platform.kubernetes.worker.pod_template.{where}: {why}")
        template = self.worker.pod_template if isinstance(self.worker.pod_template, dict) else {}
        meta = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
        spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
        if self.gang.enabled and self.rendezvous == "ip" and not (self.node_reads and spec.get("hostNetwork")):
            raise ConfigError(f"platform.kubernetes.gang.mode: {self.gang.mode} admits the gang only once every pod "
                              "exists, and with rendezvous ip the pods after the first are made once it has an IP: "
                              "use rendezvous dns (or host-network pods with node_reads, whose first IP is its node's)")
        for where, why in owned_by_gang(self.gang, self.worker.labels, self.worker.annotations, None):
            raise ConfigError(f"platform.kubernetes.worker.{where}: {why}")
        for where, why in owned_by_gang(self.gang, meta.get("labels") or {}, meta.get("annotations") or {},
                                        spec.get("schedulerName")):
            raise ConfigError(f"platform.kubernetes.worker.pod_template.{'' if where.startswith('spec') else 'metadata.'}"
                              f"{where}: {why}")
        if self.token_secret.name and not self.token_file:
            raise ConfigError("platform.kubernetes.token_file: required with token_secret.name (where the controller "
                              "has the Secret mounted)")
