"""The job configuration: YAML in, frozen validated dataclasses out.

Every field has a documented default; unknown keys are errors (a typo must not silently
become a default); every error names the field's path (``restart.budget_s: ...``). The file is read up to
:data:`MAX_CONFIG_BYTES` and parsed by YAML's safe loader with its aliases bounded (a document
whose nodes, aliases expanded, number over :data:`MAX_CONFIG_NODES` is refused: a few hundred
bytes of nested aliases would otherwise expand to gigabytes), so no tags, no code, bounded cost.

Example (``examples/job.yaml``)::

    job: demo
    platform: {kind: local, nodes: 3}       # 3 node slots on this machine: one is a spare
    nodes: {min: 1, max: 2}
    nproc_per_node: 1
    command: [python, examples/train.py, --steps, "200", --checkpoint-every, "10"]
    checkpoint_dir: ckpt
    log_dir: logs
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from supervisor.model import RENDEZVOUS_BACKENDS

MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000
"""YAML nodes in a config file, every alias counted as the nodes it stands for."""
MAX_NUMBER_CHARS = 100
"""An integer scalar longer than this is never converted (YAML 1.1's base-60 ``1:2:3`` form costs
quadratic time in its length, and past 4,300 digits Python refuses to convert at all): a field
that takes a number refuses it; one that takes a string gets the text."""
MAX_CONFIG_INT = 1 << 53
MAX_CONFIG_FLOAT = 1e9
"""Every number field: finite and at most this (about 31 years in seconds; any wait on it must
stay under ``threading.TIMEOUT_MAX``)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, or out of range."""


@dataclass(frozen=True)
class PlatformConfig:
    kind: str = "local"
    """Where nodes run: ``local`` (process groups on this machine), ``slurm`` (srun steps inside the
    allocation the supervisor runs in), ``kubernetes``."""
    nodes: int = 0
    """local: node slots on this machine (capacity, spares included); 0 means ``nodes.max``.
    slurm: unused (the slots are the allocation's live nodes)."""
    warm_agents: bool = True
    """local: keep one torchrun agent per slot that has already imported torch, started when the
    job starts and again when a fault is found, so that a launch does not wait for the agents'
    ``import torch`` (``--no-warm-agents``: every agent starts cold)."""
    fork_ranks: bool = True
    """Every platform: a node's Python ranks (``python script.py``, ``python -m module``, by the
    interpreter that runs the agent) start forked from their agent, with torch, its distributed
    and checkpoint modules and the worker SDK already imported, so neither a start nor a
    restart in place pays ``import torch`` per rank. ``false`` (``--no-fork-ranks``): every rank
    is a new interpreter, as under plain torchrun (for a script that must not start from a
    fork). Other commands always start as under torchrun."""
    rendezvous_backend: str = "auto"
    """Every platform: how a launch's agents form the gang. ``c10d``: torch's dynamic rendezvous,
    every agent joins by compare-and-set on one store (each join contends with all the others:
    docs/restart-at-scale.md). ``static``: the controller, which chose the nodes, hands each agent
    its node rank; the agents connect once to the store node rank 0 serves, and no join contends.
    ``auto``: static from ``static_rendezvous_nodes`` nodes up, c10d below."""
    static_rendezvous_nodes: int = 256
    """``rendezvous_backend: auto``: the node count from which a launch uses the static rendezvous."""
    host: str = "127.0.0.1"
    """local: the address agents rendezvous on and the controller listens on. slurm: the address
    the nodes reach the supervisor at; ``auto`` = the batch host's NodeAddr (then an ``auto``
    ``intake.host``/``http.host`` takes it too)."""
    sections: dict[str, Any] = field(default_factory=dict)
    """Each platform's own settings by section name, ``platform.slurm``, ``platform.kubernetes``
    (the kinds and their sections are :mod:`supervisor.platforms.registry`'s): read as
    ``cfg.platform.slurm``; a section not given has its defaults."""

    def __post_init__(self) -> None:
        from supervisor.platforms import registry

        kinds = registry.kinds()
        if self.kind not in kinds:
            raise ConfigError(f"platform.kind: {self.kind!r} is not one of {', '.join(kinds)}")
        if self.nodes < 0:
            raise ConfigError("platform.nodes: must be >= 0")
        if self.rendezvous_backend not in RENDEZVOUS_BACKENDS:
            raise ConfigError(f"platform.rendezvous_backend: {self.rendezvous_backend!r} is not one of "
                              f"{', '.join(RENDEZVOUS_BACKENDS)}")
        if self.static_rendezvous_nodes < 1:
            raise ConfigError("platform.static_rendezvous_nodes: must be >= 1")
        if self.host == "auto" and not registry.KINDS[self.kind].host_auto:
            raise ConfigError(f"platform.host: 'auto' is for the "
                              f"{' or '.join(k for k in kinds if registry.KINDS[k].host_auto)} platform only")
        given = dict(self.sections)
        strays = sorted(set(given) - set(registry.sections()))
        if strays:
            raise ConfigError(f"platform.{strays[0]}: no platform has this section")
        object.__setattr__(self, "sections", {name: given[name] if given.get(name) is not None
                                              else registry.section_class(name)() for name in registry.sections()})

    def __getattr__(self, name: str) -> Any:
        # only for what is not an attribute: a platform's section (cfg.platform.slurm)
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@dataclass(frozen=True)
class NodesConfig:
    min: int = 1
    """Smallest gang worth running; below it the job waits, then stops (no capacity)."""
    max: int = 1
    """Largest gang; relaunches use the largest healthy count in [min, max] whose world size
    (nodes x nproc_per_node) the job accepts."""
    world_sizes: tuple[int, ...] = ()
    """The world sizes (ranks) the job accepts, e.g. ``[2, 4, 8]`` for a global batch that must
    divide evenly; empty: any."""
    world_size_multiple_of: int = 1
    """The world size must be a multiple of this (e.g. a tensor-parallel degree)."""

    def __post_init__(self) -> None:
        if self.min < 1:
            raise ConfigError("nodes.min: must be >= 1")
        if self.max < self.min:
            raise ConfigError(f"nodes.max: {self.max} is below nodes.min {self.min}")
        if any(w < 1 for w in self.world_sizes):
            raise ConfigError("nodes.world_sizes: every world size must be >= 1")
        if self.world_size_multiple_of < 1:
            raise ConfigError("nodes.world_size_multiple_of: must be >= 1")


@dataclass(frozen=True)
class RestartConfig:
    budget_s: float = 900.0
    """Fault to first resumed step, at most (15 min). Past it the job is flagged (alert) but goes on."""
    max_restarts: int = 20
    """Restarts before the job stops in STOPPED_MAX_RESTARTS."""
    progress_guard_attempts: int = 3
    """Failed attempts in a row without a new complete checkpoint before STOPPED_NO_PROGRESS."""
    abort_grace_s: float = 5.0
    """Rung 1 -> 2: how long aborted ranks get to die before their node is killed."""
    kill_grace_s: float = 30.0
    """Stopping a healthy gang (SIGINT/SIGTERM to the supervisor): SIGTERM grace before SIGKILL,
    time enough for the ranks' emergency checkpoint."""
    teardown_grace_s: float = 2.0
    """Tearing down a gang broken by a fault: it cannot checkpoint (a collective save needs every
    rank), so the SIGTERM grace before SIGKILL is short. The grace is the ranks': on the local
    platform an agent whose ranks have ended is SIGKILLed at once, not waited for."""
    exclude_node_after: int = 1
    """Node-level failures (node lost, frozen, unresponsive) before a node is excluded."""
    allow_fresh_start: bool = False
    """Whether the job may train from scratch after having had a checkpoint, when none is left
    that verifies and is not suspect. Off by default: the job stops in STOPPED_NO_CHECKPOINT
    (exit 6) instead of silently throwing its progress away (``--allow-fresh-start``)."""
    in_place_restarts: int = 0
    """Restarts in place per launch (``--in-place-restarts``): a rank that crashed or was aborted
    on a node whose agent is healthy is restarted by that torchrun agent (``--max-restarts``),
    with the rest of the gang re-rendezvousing around it, instead of the whole gang being torn
    down and launched again. The controller still decides: the checkpoint it resumes from (the
    ranks ask for it), whether the cheap path applies at all (same nodes, no node excluded, no
    batch to skip), and when it has failed (``in_place_timeout_s``: then the gang is torn down).
    0 (the default): every restart is a full relaunch."""
    in_place_timeout_s: float = 60.0
    """How long the restarted ranks get to report in before an in-place restart counts as failed
    and the gang is torn down and launched again."""
    capacity_wait_s: float = 0.0
    """How long a gang the cluster cannot place (Kubernetes: pods Unschedulable or held by a
    scheduling gate) may wait before the job stops in STOPPED_NO_CAPACITY (exit 5), quoting the
    scheduler. Waiting is not a fault, spends no attempt, and stops the startup timeout.
    0 (the default): ``budget_s``."""
    shrink_after_s: float = 60.0
    """An elastic job (``nodes.min < nodes.max``) whose gang has waited this long for capacity is
    relaunched at the largest size whose pods were placed (at least ``nodes.min``)."""

    def __post_init__(self) -> None:
        if self.in_place_restarts < 0:
            raise ConfigError("restart.in_place_restarts: must be >= 0")
        for name in ("budget_s", "abort_grace_s", "kill_grace_s", "teardown_grace_s", "in_place_timeout_s",
                     "shrink_after_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"restart.{name}: must be > 0")
        if self.capacity_wait_s < 0:
            raise ConfigError("restart.capacity_wait_s: must be >= 0 (0: restart.budget_s)")
        if self.max_restarts < 0:
            raise ConfigError("restart.max_restarts: must be >= 0")
        if self.progress_guard_attempts < 1:
            raise ConfigError("restart.progress_guard_attempts: must be >= 1")
        if self.exclude_node_after < 1:
            raise ConfigError("restart.exclude_node_after: must be >= 1")


@dataclass(frozen=True)
class NonfiniteConfig:
    """What a non-finite loss (NaN/inf; every rank stops before the optimizer step) leads to.

    The first one is taken as transient (a bad batch, a silent data corruption): restart from
    the newest verified checkpoint. One again within ``window_steps`` of an earlier one is not:
    the job skips that step's batch while fewer than ``skip_batches`` were skipped, else stops
    in ``stopped_nonfinite`` (exit 7) instead of looping."""

    window_steps: int = 0
    """How close (in steps) a second non-finite loss must be to an earlier one to count as the
    same one recurring. 0: only at the very same step (the deterministic case: the same batch
    on the same weights)."""
    skip_batches: int = 0
    """How many offending batches the job may skip in total (the ranks consume the batch of
    that step and take no optimizer step on it; the script calls ``Worker.skip_batch``). 0:
    never skip, stop instead."""

    def __post_init__(self) -> None:
        if self.window_steps < 0 or self.skip_batches < 0:
            raise ConfigError("nonfinite.window_steps and nonfinite.skip_batches: must be >= 0")


@dataclass(frozen=True)
class HeartbeatConfig:
    interval_s: float = 1.0
    """How often every rank reports."""
    timeout_s: float = 5.0
    """A rank silent this long is dead (SIGSTOP, frozen node, lost network)."""
    aggregate: bool = True
    """Each node's agent relays its ranks' heartbeats to the controller, one frame per node and
    interval (:mod:`supervisor.platforms.node.relay`): the controller reads one datagram per node,
    not per rank. ``false`` (``--no-aggregate``): every rank sends its own. A rank whose launcher
    is not the supervisor's agent always sends its own."""

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 60:
            raise ConfigError("heartbeat.interval_s: must be in [0.05, 60]")
        if self.timeout_s < 2 * self.interval_s:
            raise ConfigError(f"heartbeat.timeout_s: must be >= 2 x interval_s ({2 * self.interval_s})")


@dataclass(frozen=True)
class HealthConfig:
    startup_timeout_s: float = 300.0
    """Launch to every rank's first heartbeat, and restore phases, at most."""
    checkpoint_timeout_s: float = 900.0
    """A rank in its checkpoint phase is not hung before this (no false alarm in a long save)."""
    phase_factor: float = 5.0
    """Calibrated data/compute/collective timeout = factor x median observed step time ..."""
    phase_floor_s: float = 30.0
    """... but never below this floor ..."""
    phase_ceiling_s: float = 1800.0
    """... and never above this ceiling."""
    straggler_threshold: float = 1.5
    """A rank whose step time is this many times its peers' median is a straggler."""
    exclude_stragglers: bool = False
    """Exclude a persistent straggler's node at the next restart."""

    def __post_init__(self) -> None:
        if self.phase_floor_s <= 0 or self.phase_ceiling_s < self.phase_floor_s:
            raise ConfigError("health.phase_floor_s/phase_ceiling_s: need 0 < floor <= ceiling")
        if self.phase_factor < 1:
            raise ConfigError("health.phase_factor: must be >= 1")
        if self.straggler_threshold <= 1:
            raise ConfigError("health.straggler_threshold: must be > 1")
        if self.startup_timeout_s <= 0 or self.checkpoint_timeout_s <= 0:
            raise ConfigError("health.startup_timeout_s/checkpoint_timeout_s: must be > 0")


@dataclass(frozen=True)
class InstrumentConfig:
    enabled: bool = True
    """Watch a rank whose script does not start the worker SDK through torch's own records: the
    optimizer step hook, the flight recorder, stacks on request, its uncaught exception
    (``supervisor.worker.instrument``; a rank that starts the SDK is watched by the SDK instead).
    ``false`` (``--no-instrument``): such a rank is run as torchrun runs it, unwatched."""
    fr_buffer: int = 2000
    """Flight-recorder entries each rank keeps (``TORCH_FR_BUFFER_SIZE``, unless the job's ``env``
    sets it); 0 turns the recorder off (and with it the collective numbers of an SDK-less rank)."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("instrument.enabled: must be true or false")
        if not 0 <= self.fr_buffer <= 1_000_000:
            raise ConfigError("instrument.fr_buffer: must be in [0, 1000000] entries")


@dataclass(frozen=True)
class BaselineConfig:
    """``release.baseline``: what runs when a release is rejected and no version of the job is
    known-good yet: a command (argv, run as given) or, on Kubernetes, a worker image."""

    command: tuple[str, ...] = ()
    image: str = ""

    def __post_init__(self) -> None:
        if self.command and (not all(isinstance(a, str) and a and "\0" not in a for a in self.command)):
            raise ConfigError("release.baseline.command: a list of non-empty strings")
        if not isinstance(self.image, str) or len(self.image) > 1024:
            raise ConfigError("release.baseline.image: an image reference")


@dataclass(frozen=True)
class ReleaseConfig:
    """Safe releases (:mod:`supervisor.controller.releases`): a new version of the job is on
    probation until it has trained ``probation_steps`` steps; one that cannot train goes back to
    the last known-good version on its own."""

    rollback: bool = True
    """false: a version that cannot train ends the job, as before (no probation, no rollback)."""
    probation_steps: int = 20
    code_dir: str = ""
    """The folder of the training code, hashed into the version and snapshotted for a rollback
    (local and Slurm). "": the entry script's folder."""
    max_code_mb: float = 256.0
    """The code folder's size at most (a rollback needs a copy of it): past it the job does not start."""
    baseline: BaselineConfig = field(default_factory=BaselineConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.rollback, bool):
            raise ConfigError("release.rollback: must be true or false")
        if not 1 <= self.probation_steps <= 10_000_000:
            raise ConfigError("release.probation_steps: must be in [1, 10000000]")
        if not 0 < self.max_code_mb <= 65536:
            raise ConfigError("release.max_code_mb: must be in (0, 65536]")


@dataclass(frozen=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port (recorded in the state file so a restarted controller reuses it)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError("port: must be in [0, 65535]")


@dataclass(frozen=True)
class JobConfig:
    command: tuple[str, ...]
    """The training command each rank runs (argv; no shell)."""
    job: str = "job"
    """Job name: labels metrics and events."""
    platform: PlatformConfig = field(default_factory=PlatformConfig)
    nodes: NodesConfig = field(default_factory=NodesConfig)
    nproc_per_node: int = 1
    checkpoint_dir: str = "checkpoints"
    """Checkpoint root the job writes (passed to ranks as SUPERVISOR_CHECKPOINT_DIR)."""
    log_dir: str = "supervisor-logs"
    """Events, the state file, rank logs and stack dumps."""
    restart: RestartConfig = field(default_factory=RestartConfig)
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    nonfinite: NonfiniteConfig = field(default_factory=NonfiniteConfig)
    instrument: InstrumentConfig = field(default_factory=InstrumentConfig)
    release: ReleaseConfig = field(default_factory=ReleaseConfig)
    http: ListenConfig = field(default_factory=ListenConfig)
    intake: ListenConfig = field(default_factory=ListenConfig)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every rank."""
    metrics_linger_s: float = 15.0
    """After the job ends, keep serving /metrics this long (a signal cuts it short), so that
    Prometheus scrapes the final phase at least once: only when /metrics has been scraped during
    the run (without a scraper the command returns as soon as the job ends)."""
    metrics_per_rank_limit: int = 256
    """/metrics exports per-rank series (heartbeat age, step, straggler score, phase, node: 13
    series a rank) for every rank while the world size is at most this; above it, only for the
    10 stalest ranks past the heartbeat timeout and the 10 worst stragglers, beside the job-level
    aggregates (so a 16,384-rank job stays under a few hundred series). 0: only those ranks."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("command: must be a non-empty list of arguments")
        if not self.job or len(self.job) > 64 or not all(c.isalnum() or c in "-_." for c in self.job):
            raise ConfigError("job: 1-64 characters of letters, digits, '-', '_', '.'")
        if self.metrics_linger_s < 0:
            raise ConfigError("metrics_linger_s: must be >= 0")
        if self.metrics_per_rank_limit < 0:
            raise ConfigError("metrics_per_rank_limit: must be >= 0")
        if self.platform.rendezvous_backend == "static" and self.restart.in_place_restarts:
            raise ConfigError("platform.rendezvous_backend: static cannot restart in place (torch's static "
                              "rendezvous never re-forms the gang, so the other nodes' agents would wait on a store "
                              "that is gone): use c10d or auto, or restart.in_place_restarts: 0")
        if self.nproc_per_node < 1:
            raise ConfigError("nproc_per_node: must be >= 1")
        if self.platform.nodes and self.platform.nodes < self.nodes.min:
            raise ConfigError(f"platform.nodes: {self.platform.nodes} slots cannot hold nodes.min={self.nodes.min}")
        for k, v in self.env.items():
            if not isinstance(k, str) or not ENV_NAME.fullmatch(k):
                raise ConfigError(f"env: {k!r} is not a variable name (letters, digits and '_', not starting with a "
                                  "digit)")
            if not isinstance(v, str) or "\0" in v:
                raise ConfigError(f"env.{k}: must be a string without NUL characters, got {v!r}"[:200])
            if k.startswith("SUPERVISOR_") and k != "SUPERVISOR_FAULT":
                raise ConfigError(f"env.{k}: SUPERVISOR_* variables are set by the supervisor")

    @property
    def node_slots(self) -> int:
        return self.platform.nodes or self.nodes.max

    def to_dict(self) -> dict[str, Any]:
        """The config as its YAML is written (``from_dict`` reads it back): each platform's section
        under ``platform``, by its name."""
        out = dataclasses.asdict(self)
        out["platform"] |= out["platform"].pop("sections")
        return out


def load(path: str | os.PathLike) -> JobConfig:
    return from_dict(load_raw(path))


def load_raw(path: str | os.PathLike) -> dict[str, Any]:
    """The YAML mapping in ``path``, unvalidated, read within the limits: at most
    :data:`MAX_CONFIG_BYTES` bytes (however the file reports its size) and
    :data:`MAX_CONFIG_NODES` nodes with aliases expanded. ConfigError otherwise."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: over the {MAX_CONFIG_BYTES} byte limit")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        raw = safe_load_bounded(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return raw


@dataclasses.dataclass(frozen=True)
class LongNumber:
    """An integer scalar of more than :data:`MAX_NUMBER_CHARS` characters, kept as its text."""

    text: str

    def __repr__(self) -> str:
        return f"<an integer of {len(self.text)} characters>"

    __str__ = __repr__


class _Loader(yaml.SafeLoader):
    """The safe loader, whose integers are converted only when they are short."""

    def construct_yaml_int(self, node: yaml.Node) -> Any:
        value = self.construct_scalar(node)
        if isinstance(value, str) and len(value) > MAX_NUMBER_CHARS:
            return LongNumber(value)
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def safe_load_bounded(text: str, max_nodes: int = MAX_CONFIG_NODES) -> Any:
    """``yaml.safe_load`` that refuses, before building anything, a document whose node graph
    expands (aliases and merge keys counted as copies) past ``max_nodes`` nodes, or nests
    too deeply. ConfigError otherwise (a character YAML does not allow, such as a C0 control
    character, is named by its position)."""
    try:
        loader = _Loader(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_nodes(node, max_nodes)
        if expanded > max_nodes:
            raise ConfigError(f"its aliases expand to over {max_nodes} YAML nodes (an alias bomb?): refused")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError("nested too deeply") from None
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor's own refusal (a 13th month)
        raise ConfigError(f"not valid YAML: {type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        loader.dispose()


def _expanded_nodes(root: yaml.Node, limit: int) -> int:
    """Nodes of the tree the graph under ``root`` stands for (shared nodes counted at every
    use), computed over the graph (each node visited once), capped just above ``limit``."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        if done:
            on_path.discard(key)
            size[key] = min(limit + 1, 1 + sum(size[id(c)] for c in children))
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError("an alias refers to a node that contains it (a recursive structure): refused")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)]


def from_dict(raw: dict[str, Any]) -> JobConfig:
    return _build(JobConfig, raw, "")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: must be a mapping")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    # platform: each kind's section is a key of its own (platform.slurm), read with its own class
    sections = _platform_sections() if cls is PlatformConfig else {}
    if sections:
        del known["sections"]
    odd = [k for k in raw if not isinstance(k, str)]
    if odd:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: keys must be strings, got {_brief(odd[0])}")
    unknown = sorted(set(raw) - set(known) - set(sections))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key (known: {', '.join(sorted({*known, *sections}))})")
    missing = [f.name for f in known.values() if f.name not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]}: required (see examples/job.yaml)")
    kwargs: dict[str, Any] = {"sections": {}} if sections else {}
    for name, value in raw.items():
        if name in sections:
            kwargs["sections"][name] = _build(sections[name], value, f"{prefix}{name}.")
        else:
            kwargs[name] = _convert(hints[name], value, f"{prefix}{name}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{prefix or 'config'}: {exc}") from None


def _platform_sections() -> dict[str, type]:
    from supervisor.platforms import registry

    return {name: registry.section_class(name) for name in registry.sections()}


_PLAIN_MAX_DEPTH = 12
_PLAIN_MAX_ITEMS = 10_000


def _plain(value: Any, path: str, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A value passed through as data (a Kubernetes resources block, tolerations): mappings with
    string keys, lists, strings, numbers, booleans and null only; bounded in depth and size."""
    budget = [_PLAIN_MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    if depth > _PLAIN_MAX_DEPTH or budget[0] < 0:
        raise ConfigError(f"{path}: nested too deep or too large (at most {_PLAIN_MAX_DEPTH} levels, "
                          f"{_PLAIN_MAX_ITEMS} values)")
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{path}: mapping keys must be strings")
        return {k: _plain(v, f"{path}.{k}", depth + 1, budget) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{path}[{i}]", depth + 1, budget) for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float, LongNumber)):
        return _number(value, path, int if isinstance(value, int) else float)
    raise ConfigError(f"{path}: {type(value).__name__} is not a plain value (mapping, list, string, number)")


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(value: Any, path: str, kind: type) -> Any:
    """A number within the bounds every field shares: finite, at most MAX_CONFIG_INT (integers)
    or MAX_CONFIG_FLOAT (other numbers) in size; the error names the field."""
    if isinstance(value, LongNumber):
        raise ConfigError(f"{path}: an integer of {len(value.text)} characters is out of range (at most "
                          f"{MAX_NUMBER_CHARS} characters)")
    if kind is int:
        if not -MAX_CONFIG_INT <= value <= MAX_CONFIG_INT:
            raise ConfigError(f"{path}: {value} is out of range (at most 2**53 in size)")
        return value
    # an integer is compared before float(): a 400-digit one does not fit a float
    if not (-MAX_CONFIG_FLOAT <= value <= MAX_CONFIG_FLOAT):
        what = "a finite number" if value != value or isinstance(value, float) and abs(value) == float("inf") else \
            f"at most {MAX_CONFIG_FLOAT:g} in size"
        raise ConfigError(f"{path}: must be {what}, got {_brief(value) if not isinstance(value, int) else 'a larger one'}")
    return float(value)


def _convert(tp: Any, value: Any, path: str) -> Any:
    if tp is Any:
        return _plain(value, path)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path + ".")
    origin = typing.get_origin(tp)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: must be true or false, got {value!r}")
        return value
    if isinstance(value, LongNumber) and tp is str:
        value = value.text  # a field of strings takes the text as written
    if tp is int:
        if isinstance(value, LongNumber):
            return _number(value, path, int)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{path}: must be an integer, got {_brief(value)}")
        return _number(value, path, int)
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 (PyYAML) reads 1e3 (no dot) as a string: a number written so is still one
            if len(value) > MAX_NUMBER_CHARS:
                raise ConfigError(f"{path}: must be a number, got a string of {len(value)} characters")
            try:
                value = float(value.strip().replace("_", ""))
            except ValueError:
                raise ConfigError(f"{path}: must be a number, got {value!r}") from None
        if isinstance(value, LongNumber):
            return _number(value, path, float)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}: must be a number, got {_brief(value)}")
        return _number(value, path, float)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}: must be a string, got {_brief(value)}")
        return str(value)
    if origin is tuple and typing.get_args(tp)[:1] == (int,):
        if not isinstance(value, list) or not all(isinstance(v, (int, LongNumber)) and not isinstance(v, bool)
                                                  for v in value):
            raise ConfigError(f"{path}: must be a list of integers, got {_brief(value)}")
        return tuple(_number(v, f"{path}[{i}]", int) for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float, LongNumber)) and not isinstance(v, bool)
                                                  for v in value):
            raise ConfigError(f"{path}: must be a list of strings")
        return tuple(v.text if isinstance(v, LongNumber) else str(v) for v in value)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{path}: must be a mapping of strings")
        out = {}
        for k, v in value.items():
            if isinstance(v, bool):
                out[k] = "true" if v else "false"
            elif isinstance(v, (str, int, float)):
                out[k] = str(v)
            elif isinstance(v, LongNumber):
                out[k] = v.text
            else:  # a list, a mapping, or null: no one string it could mean
                raise ConfigError(f"{path}.{k}: must be a string, number or boolean, got {type(v).__name__}")
        return out
    if origin in (typing.Union, types.UnionType):
        return value
    raise ConfigError(f"{path}: unsupported type {tp}")
