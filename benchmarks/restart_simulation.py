"""The restart at 1,024 nodes, on paper: a seeded Monte Carlo model of every restart phase.

One command prints (and writes) the per-phase p50/p95/p99 at the chosen scale, a scaling
table (8 ... 16,384 nodes), the total against the restart budget (15 min) with PASS/MISS and
headroom, the dominant phase, a sensitivity table, and every parameter with its source:

    python benchmarks/restart_simulation.py [--nodes 1024] [--gpus-per-node 8] [--trials 2000]
        [--seed 0] [--out docs/restart-at-scale.md] [--set restore.aggregate_read_Bps=5e11 ...]
    python benchmarks/restart_simulation.py --calibrate   # re-measure the "measured here" inputs

Why a model and not a measurement: nobody here has 1,024 nodes. What this *can* do is put
every phase on one page with its parameters in plain view, so an argument about the budget
becomes an argument about a named number and its source. Every parameter is a field of a
frozen dataclass whose metadata says where the value comes from:

* ``measured here``: measured on this project's machines (2-core CPU boxes; see
  /work/shared/*.md and ``--calibrate``); small-machine numbers, used as such;
* ``code``: a default read from this repository or from torch 2.13's source;
* ``public``: a published figure (vendor spec, paper, upstream PR), cited;
* ``assumption``: a guess, labelled as one. These are the numbers to argue about.

The phases follow the restart the controller runs (``supervisor/controller``):

``detect``      fault -> detected. The controller's clock starts a silent rank's fault at its
                last heartbeat received and a hang at the start of the stuck phase, and it
                evaluates findings every ``scan_period_s`` (its tick); so detect is the
                timeout plus the wait for the next tick.
``teardown``    evidence (every rank dumps stacks), the escalation ladder (abort rung for a
                hang, kill the culprit's node), then SIGTERM to the whole gang, a grace, and
                SIGKILL; done when every node is gone (a node that stays in D state is given
                up on after the platform's unkillable timeout and excluded).
``schedule``    pick the checkpoint, launch one torchrun agent per node (Slurm step or pods),
                until every agent is up (Python + ``import torch``) and ready to rendezvous.
                The maximum over N nodes is the phase: its tail is modelled explicitly.
``rendezvous``  torch elastic's c10d rendezvous on one TCPStore (every join is a
                compare-and-set of one pickled state that grows with N; waiting agents poll
                it every second and keep-alive every 5 s), then workers spawn, import torch,
                init CUDA and connect to the process group's store (one server, serialised).
``restore``     DCP planning (central, O(ranks)), then every node reads its slice of the
                checkpoint (aggregate storage bandwidth shared by N, a per-node cap, per-rank
                deserialisation), xxh3 verification spread across ranks; max over nodes.
``first_step``  data-loader warm-up, torch.compile warm start, NCCL communicator init
                (a per-node base + O(ranks) bootstrap + the O(ranks^2) ring building NCCL
                PR #1789 measured), one training step, and the heartbeat that reports it.

The model is a set of pure functions of (parameters, trials, seed): no clock, no I/O. Random
draws come from one stream per (phase, quantity), drawn node-major, so the first N nodes of
a trial see the same draws at any node count: more nodes can only add work to a maximum, and
one parameter's change does not reshuffle the other phases (common random numbers).

What it leaves out is listed in ``docs/restart-at-scale.md``: the main ones are a second
fault during the restart, scheduler queueing for replacement nodes, and any dependence
between phases beyond the ones written here.
"""

from __future__ import annotations

import argparse
import math
import sys
import zlib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from supervisor.protocol import RESTART_PHASES  # noqa: E402

PHASES = RESTART_PHASES  # the controller's phases of a restart (its events and metrics), modelled here
SCALING_NODES = (8, 64, 256, 1024, 2048, 4096, 16384)
QUANTILES = (0.50, 0.95, 0.99)

MEASURED = "measured here"
CODE = "code"
PUBLIC = "public"
ASSUMED = "assumption"
KINDS = (MEASURED, CODE, PUBLIC, ASSUMED)


# ------------------------------------------------------------------------------------ parameters
def param(default: Any, kind: str, source: str, unit: str = "", *, ge: float | None = None,
          gt: float | None = None, le: float | None = None, choices: Sequence[str] | None = None,
          integer: bool = False) -> Any:
    """A model parameter: its default, where the number comes from, and its valid range."""
    if kind not in KINDS:
        raise ValueError(f"param kind {kind!r} is not one of {KINDS}")
    return field(default=default, metadata={
        "kind": kind, "source": source, "unit": unit, "ge": ge, "gt": gt, "le": le,
        "choices": tuple(choices) if choices else None, "integer": integer,
    })


def _validate_fields(obj: Any, section: str) -> None:
    for f in fields(obj):
        md, v, name = f.metadata, getattr(obj, f.name), f"{section}.{f.name}"
        if md.get("choices"):
            if v not in md["choices"]:
                raise ValueError(f"{name}: {v!r} is not one of {', '.join(md['choices'])}")
            continue
        if isinstance(v, tuple):
            continue  # tables are checked by their owner
        if isinstance(v, bool):
            continue
        if md.get("integer"):
            if not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name}: must be a whole number (got {v!r})")
        elif not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"{name}: must be a number (got {v!r})")
        if not math.isfinite(v):
            raise ValueError(f"{name}: must be finite (got {v!r})")
        if md.get("gt") is not None and not v > md["gt"]:
            raise ValueError(f"{name}: must be > {md['gt']:g} (got {v!r})")
        if md.get("ge") is not None and not v >= md["ge"]:
            raise ValueError(f"{name}: must be >= {md['ge']:g} (got {v!r})")
        if md.get("le") is not None and not v <= md["le"]:
            raise ValueError(f"{name}: must be <= {md['le']:g} (got {v!r})")


def _validate_table(table: tuple, name: str) -> None:
    if len(table) < 2:
        raise ValueError(f"{name}: needs at least two (bytes, seconds) points")
    for point in table:
        if len(point) != 2 or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in point):
            raise ValueError(f"{name}: every point must be (bytes > 0, seconds > 0), got {point!r}")
    xs, ys = [p[0] for p in table], [p[1] for p in table]
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{name}: sizes must be strictly increasing")
    if any(b < a for a, b in zip(ys, ys[1:])):
        raise ValueError(f"{name}: costs must not decrease with size")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The job's shape and where it runs."""

    nodes: int = param(1024, ASSUMED, "the issue's scale", "nodes", ge=1, integer=True)
    gpus_per_node: int = param(8, PUBLIC, "HGX H100/H200 nodes: 8 GPUs, one rank per GPU", "GPUs", ge=1,
                               integer=True)
    platform: str = param("slurm", CODE, "platforms the design names (Slurm steps in a --no-kill allocation, or pods)",
                          choices=("slurm", "kubernetes"))
    slow_nodes: int = param(0, ASSUMED, "sensitivity knob: nodes slow at everything per-node (start, worker start, "
                            "read, warm-up)", "nodes", ge=0, integer=True)
    slow_node_factor: float = param(10.0, ASSUMED, "how much slower a slow node is", "x", ge=1.0)

    def __post_init__(self) -> None:
        _validate_fields(self, "cluster")
        if self.slow_nodes > self.nodes:
            raise ValueError(f"cluster.slow_nodes: {self.slow_nodes} is more than cluster.nodes {self.nodes}")

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class Detect:
    """Fault -> detected, as the controller times it (supervisor/health/detect.py, controller/decide.py)."""

    fault_kind: str = param("collective_hang", CODE,
                            "health.detect finding kinds: a rank stuck in a collective (heartbeats still flow) "
                            "or a silent rank (SIGSTOP, frozen or lost node)", choices=("collective_hang", "silent"))
    heartbeat_interval_s: float = param(1.0, CODE, "HeartbeatConfig.interval_s (1 Hz)", "s", gt=0)
    silence_timeout_s: float = param(5.0, CODE, "HeartbeatConfig.timeout_s: silent this long = dead", "s", gt=0)
    phase_factor: float = param(5.0, CODE, "HealthConfig.phase_factor: hang timeout = factor x median step", "x", ge=1)
    phase_floor_s: float = param(30.0, CODE, "HealthConfig.phase_floor_s", "s", gt=0)
    phase_ceiling_s: float = param(1800.0, CODE, "HealthConfig.phase_ceiling_s", "s", gt=0)
    hang_timeout_override_s: float = param(0.0, ASSUMED, "0 = calibrated as the controller does; > 0 forces a "
                                           "hang timeout (sensitivity)", "s", ge=0)
    scan_period_s: float = param(0.2, CODE, "controller TICK_S (findings evaluated every tick)", "s", gt=0)

    def __post_init__(self) -> None:
        _validate_fields(self, "detect")
        if self.silence_timeout_s < 2 * self.heartbeat_interval_s:
            raise ValueError(f"detect.silence_timeout_s: {self.silence_timeout_s} is below 2 x heartbeat_interval_s "
                             f"({2 * self.heartbeat_interval_s}); one late datagram would kill a healthy rank")
        if self.phase_ceiling_s < self.phase_floor_s:
            raise ValueError("detect.phase_ceiling_s: must be >= detect.phase_floor_s")


@dataclass(frozen=True, kw_only=True)
class Teardown:
    """Detected -> every node of the old gang gone (controller _recover + Platform.teardown)."""

    evidence_write_s_per_rank: float = param(20e-6, ASSUMED, "writing one rank's last heartbeat into the evidence "
                                             "JSON (the 1 s dump wait itself is code: min(1, 1.2 x interval))",
                                             "s", ge=0)
    abort_grace_s: float = param(5.0, CODE, "RestartConfig.abort_grace_s: a hang's rung 1 waits this long for the "
                                 "aborted node to exit; torchrun's own stop path waits 30 s (measured here), so the "
                                 "wait runs out and rung 2 kills the node", "s", ge=0)
    kill_rpc_s: float = param(0.025, MEASURED, "Slurm `scancel JOB.STEP` ends a step in ~25 ms (TEST-STACK.md)", "s",
                              ge=0)
    tree_width: int = param(50, PUBLIC, "slurm.conf(5) TreeWidth (message fan-out; the default differs by release)",
                            "", ge=2, integer=True)
    hop_latency_s: float = param(0.01, ASSUMED, "one hop of slurmd's fan-out tree", "s", ge=0)
    kill_grace_s: float = param(10.0, CODE, "RestartConfig.kill_grace_s: SIGTERM, grace, SIGKILL", "s", ge=0)
    p_blocked_on_sigterm: float = param(1.0, CODE, "the SDK's SIGTERM handler only sets a flag acted on at the next "
                                        "step boundary (worker/runtime.py); ranks blocked in a collective never reach "
                                        "one, so after a hang or a lost peer every node waits the full grace",
                                        "", ge=0, le=1)
    graceful_exit_median_s: float = param(2.0, ASSUMED, "a node whose ranks do act on SIGTERM: exit + CUDA teardown",
                                          "s", gt=0)
    graceful_exit_sigma: float = param(0.5, ASSUMED, "log-normal spread of the above", "", ge=0)
    sigkill_exit_median_s: float = param(1.0, ASSUMED, "SIGKILL to process gone, incl. the driver freeing 8 GPU "
                                         "contexts", "s", gt=0)
    sigkill_exit_sigma: float = param(0.6, ASSUMED, "log-normal spread of the above", "", ge=0)
    p_unkillable: float = param(1e-4, ASSUMED, "per node: a process stuck in D state (driver, NFS) after SIGKILL",
                                "", ge=0, le=1)
    unkillable_timeout_s: float = param(60.0, PUBLIC, "slurm.conf UnkillableStepTimeout default (60 s): then the node "
                                        "is drained and excluded", "s", ge=0)

    def __post_init__(self) -> None:
        _validate_fields(self, "teardown")


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Torn down -> every torchrun agent up and ready to rendezvous."""

    pick_checkpoint_s: float = param(0.5, ASSUMED, "newest complete, non-suspect checkpoint: manifest reads on shared "
                                     "storage ('fast' verification)", "s", ge=0)
    slurm_step_create_s: float = param(0.05, ASSUMED, "srun step creation RPC to slurmctld (same order as the measured "
                                       "25 ms scancel)", "s", ge=0)
    k8s_pods_per_s: float = param(100.0, ASSUMED, "pod create + bind throughput of API server and scheduler",
                                  "pods/s", gt=0)
    k8s_container_start_median_s: float = param(1.5, PUBLIC, "Kubernetes SLO: stateless pod start-up p99 <= 5 s, "
                                                "image pull excluded (image cached on the node)", "s", gt=0)
    agent_start_median_s: float = param(3.0, MEASURED, "torchrun agent up: import torch 1.2-1.5 s + torchrun's ~1.3 s "
                                        "(CHECKPOINT-NOTES.md, TEST-STACK.md; 2-core box, warm page cache)", "s", gt=0)
    agent_start_sigma: float = param(0.25, ASSUMED, "log-normal spread across healthy nodes", "", ge=0)
    p_slow_start: float = param(0.002, ASSUMED, "per node: a slow start (cold page cache, busy or degraded node)",
                                "", ge=0, le=1)
    slow_start_scale_s: float = param(10.0, ASSUMED, "scale of the slow start's Pareto-II (Lomax) extra delay", "s",
                                      ge=0)
    slow_start_alpha: float = param(2.0, ASSUMED, "tail index of that delay (P(extra > x) = (1 + x/scale)^-alpha)",
                                    "", gt=0)
    startup_timeout_s: float = param(300.0, CODE, "HealthConfig.startup_timeout_s: a node not up by then is a new "
                                     "fault (the phase is capped there: optimistic, the restart that follows is not "
                                     "modelled)", "s", gt=0)
    warm_agents: bool = param(False, CODE, "platform.warm_agents: an agent per slot waits with torch's agent "
                              "imported (started at the fault, or standing by since the last launch); a launch "
                              "hands each node to one (off here: the baseline is every agent starting cold)")
    warm_handover_s: float = param(0.1, MEASURED, "a launch handing a node to a waiting agent: teardown + schedule "
                                   "0.07-0.19 s with warm agents (docs/benchmarks/restart_latency.md)", "s", ge=0)
    env_on_shared_fs: bool = param(False, ASSUMED, "Python env (venv/site-packages) on a shared file system with "
                                   "cold client caches; default: node-local image or warm caches")
    metadata_ops_per_import: float = param(19_000.0, MEASURED, "file-metadata syscalls of `import torch` "
                                           "(strace -c -e trace=%file: 17.7k stat + 1.4k open)", "ops", ge=0)
    mds_ops_per_s: float = param(50_000.0, ASSUMED, "metadata server throughput of the shared file system", "ops/s",
                                 gt=0)

    def __post_init__(self) -> None:
        _validate_fields(self, "schedule")


# Server CPU per TCPStore op by value size, torch 2.13 libuv backend, one client, loopback,
# measured here (benchmarks/restart_simulation.py --calibrate). compare_set is superlinear.
_CAS_TABLE = ((1e4, 0.023e-3), (5e4, 0.072e-3), (1e5, 0.168e-3), (2e5, 0.476e-3), (4e5, 2.0e-3), (8e5, 8.8e-3),
              (1.6e6, 30.2e-3))
_GET_TABLE = ((1e4, 0.026e-3), (5e4, 0.027e-3), (1e5, 0.033e-3), (2e5, 0.047e-3), (4e5, 0.055e-3), (8e5, 0.35e-3),
              (1.6e6, 0.35e-3))  # the last point measured 0.315 ms: held at 0.35 so the table never decreases


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Agents ready -> process group formed: c10d rendezvous, worker start, store connect."""

    backend: str = param("c10d", CODE, "torchrun --rdzv-backend: c10d (what the design uses: dynamic, elastic) or "
                         "static (node ranks handed out by the supervisor, which chooses every world anyway)",
                         choices=("c10d", "static"))

    state_base_bytes: float = param(288.0, MEASURED, "pickled + base64 empty _RendezvousState (torch 2.13)", "B", ge=0)
    bytes_per_participant: float = param(91.0, MEASURED, "growth of that state per participant (30-char host names)",
                                         "B", gt=0)
    client_serde_s_per_participant: float = param(2.5e-6, MEASURED, "agent-side pickle+base64 encode and decode of the "
                                                  "state, per participant (median ~2.1 us; a GC pass can make one "
                                                  "decode 10-80x slower)", "s", ge=0)
    rtt_s: float = param(1e-4, ASSUMED, "agent <-> store TCP round trip in one data centre", "s", ge=0)
    cas_server_s: tuple = param(_CAS_TABLE, MEASURED, "TCPStore compare_set server CPU by value size (log-log "
                                "interpolated; superlinear above ~200 kB)", "(B, s)")
    get_server_s: tuple = param(_GET_TABLE, MEASURED, "TCPStore get server CPU by value size", "(B, s)")
    small_op_server_s: float = param(18e-6, MEASURED, "server CPU of a small get/add", "s", ge=0)
    poll_period_s: float = param(1.0, CODE, "torch dynamic_rendezvous: a waiting agent re-reads the state every 1 s "
                                 "(SYNC delay, cache_duration=1)", "s", gt=0)
    keep_alive_interval_s: float = param(5.0, CODE, "torch default keep_alive_interval: every participant rewrites "
                                         "the state (a compare_set) this often", "s", gt=0)
    join_jitter_s: float = param(0.3, CODE, "torch next_rendezvous starts with a random 0-0.3 s delay", "s", ge=0)
    max_store_utilisation: float = param(0.95, ASSUMED, "past this the agents' own polls and keep-alives fill the "
                                         "store; every read-modify-write loses its race (livelock): the rendezvous "
                                         "times out", "", gt=0, le=1)
    join_timeout_s: float = param(600.0, CODE, "torch default join_timeout: a rendezvous not complete this long "
                                  "after the first agent joined fails (the restart does not complete)", "s", gt=0)
    nodes_min_fraction: float = param(1.0, ASSUMED, "the launch's --nnodes MIN:MAX as MIN/MAX (the supervisor sets MIN "
                                      "= MAX = the nodes it chose): 1 = rigid, the world waits for every "
                                      "agent; < 1 = a straggler is cut off last_call_s after MIN agents joined",
                                      "", gt=0, le=1)
    missing_nodes: int = param(0, ASSUMED, "agents that never start (a rigid rendezvous then never completes)",
                               "nodes", ge=0, integer=True)
    last_call_s: float = param(30.0, CODE, "torch default last_call timeout", "s", ge=0)
    rank_assign_ops_per_agent: float = param(3.0, ASSUMED, "small store ops per agent to assign worker ranks", "ops",
                                             ge=0)
    worker_start_median_s: float = param(4.0, ASSUMED, "8 workers spawn, import torch (1.2-1.5 s alone, measured "
                                         "here) concurrently, create CUDA contexts, start the SDK", "s", gt=0)
    worker_start_sigma: float = param(0.2, ASSUMED, "log-normal spread across nodes", "", ge=0)
    store_connect_s_per_rank: float = param(1.0e-3, PUBLIC, "libuv TCPStore: 96K ranks connected in ~100 s (PyTorch "
                                            "tutorial 'TCPStore libuv backend'); serialised on the one server. "
                                            "Measured here (--calibrate): 0.1-0.2 ms per client (connect + add) "
                                            "with 1,024-2,048 clients on one 2-core box; the public figure, "
                                            "5-10x slower, is kept", "s", ge=0)
    gloo_group: bool = param(False, ASSUMED, "a gloo process group is also created (e.g. 'cpu:gloo,cuda:nccl')")
    gloo_init_s: tuple = param(((2048, 18.0), (4096, 25.0), (8192, 85.0)), PUBLIC,
                               "gloo PG init after TCPStore batching (pytorch/gloo PR #408, Meta jobs; its '2k/4k/8k "
                               "job' read as ranks; 8k took 55 min before it)", "(ranks, s)")

    def __post_init__(self) -> None:
        _validate_fields(self, "rendezvous")
        _validate_table(self.cas_server_s, "rendezvous.cas_server_s")
        _validate_table(self.get_server_s, "rendezvous.get_server_s")
        _validate_table(self.gloo_init_s, "rendezvous.gloo_init_s")


@dataclass(frozen=True, kw_only=True)
class Restore:
    """Process group up -> every rank has loaded and verified its state (DCP)."""

    params: float = param(70e9, ASSUMED, "model size (the issue's example: 70B)", "params", gt=0)
    bytes_per_param: float = param(14.0, PUBLIC, "bf16 weights (2) + fp32 master, Adam m and v (12): mixed-precision "
                                   "Adam's usual accounting", "B", gt=0)
    read_amplification: float = param(1.0, ASSUMED, "bytes read / checkpoint bytes: 1 = fully sharded, each byte read "
                                      "once; HSDP with R replicas reading the same shards = R", "x", ge=1)
    aggregate_read_Bps: float = param(1.0e12, ASSUMED, "shared storage read bandwidth available to the job (Llama 3: "
                                      "Tectonic sustained 2 TB/s, peaked 7 TB/s for 16K GPUs)", "B/s", gt=0)
    node_read_cap_Bps: float = param(12.5e9, ASSUMED, "per-node storage client cap (one 100 Gb/s storage NIC)", "B/s",
                                     gt=0)
    rank_load_Bps: float = param(1.2e9, MEASURED, "one rank's dcp.load, cold, 0.89 s/GiB (CHECKPOINT-NOTES.md)",
                                 "B/s", gt=0)
    node_bw_sigma: float = param(0.15, ASSUMED, "log-normal spread of per-node read speed", "", ge=0)
    p_slow_reader: float = param(0.005, ASSUMED, "per node: reads from a hot or degraded storage target", "", ge=0,
                                 le=1)
    slow_reader_factor: float = param(0.2, ASSUMED, "that node's share of its bandwidth", "x", gt=0, le=1)
    verify_Bps_per_rank: float = param(11.2 * 2**30, MEASURED, "xxh3_64, one thread (CHECKPOINT-NOTES.md)", "B/s",
                                       gt=0)
    plan_s_per_rank: float = param(5e-4, ASSUMED, "DCP load planning: the coordinator gathers, dedups and scatters "
                                   "every rank's plan", "s", ge=0)
    metadata_s: float = param(1.0, ASSUMED, "manifest + DCP .metadata read by every rank", "s", ge=0)
    p_newest_corrupt: float = param(0.0, ASSUMED, "the newest checkpoint fails verification; the attempt dies and the "
                                    "next one restores the previous checkpoint (a second relaunch cycle)", "", ge=0,
                                    le=1)

    def __post_init__(self) -> None:
        _validate_fields(self, "restore")

    @property
    def checkpoint_bytes(self) -> float:
        return self.params * self.bytes_per_param


@dataclass(frozen=True, kw_only=True)
class FirstStep:
    """Restored -> the controller has heard every rank finish its first resumed step."""

    dataloader_warmup_median_s: float = param(3.0, ASSUMED, "data-loader workers start, first batch fetched", "s",
                                              ge=0)
    compile_warmup_median_s: float = param(20.0, ASSUMED, "torch.compile with a warm on-disk cache (0 for eager)",
                                           "s", ge=0)
    warmup_sigma: float = param(0.15, ASSUMED, "log-normal spread of the two warm-ups across nodes", "", ge=0)
    nccl_init_median_s: float = param(3.0, ASSUMED, "NCCL communicator: per-node base (topology, IB QPs, proxies)",
                                      "s", ge=0)
    nccl_init_s_per_rank: float = param(2e-5, ASSUMED, "NCCL bootstrap all-gather, linear in ranks", "s", ge=0)
    nccl_init_s_per_rank2: float = param(26.0 / 98304**2, PUBLIC, "O(ranks^2) ring building: ~26 s at 96K ranks "
                                         "(NVIDIA/nccl PR #1789, before that fix)", "s", ge=0)
    tokens_per_gpu_per_step: float = param(2048.0, ASSUMED, "weak scaling: a 16M-token batch on 8,192 GPUs", "tokens",
                                           gt=0)
    peak_flops: float = param(989e12, PUBLIC, "H100 SXM dense BF16 peak", "FLOP/s", gt=0)
    mfu: float = param(0.40, PUBLIC, "Llama 3 405B pre-training reported 38-43% BF16 MFU", "", gt=0, le=1)
    step_sigma: float = param(0.05, ASSUMED, "log-normal spread of one node's step time", "", ge=0)

    def __post_init__(self) -> None:
        _validate_fields(self, "first_step")


@dataclass(frozen=True, kw_only=True)
class Model:
    cluster: Cluster = field(default_factory=Cluster)
    detect: Detect = field(default_factory=Detect)
    teardown: Teardown = field(default_factory=Teardown)
    schedule: Schedule = field(default_factory=Schedule)
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    restore: Restore = field(default_factory=Restore)
    first_step: FirstStep = field(default_factory=FirstStep)
    budget_s: float = param(900.0, CODE, "RestartConfig.budget_s: fault to first resumed step (15 min)", "s", gt=0)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "budget_s" and not isinstance(getattr(self, f.name), f.default_factory):  # type: ignore[misc]
                raise ValueError(f"{f.name}: must be a {f.default_factory.__name__}")  # type: ignore[union-attr]
        _validate_fields_only(self, ("budget_s",))
        if self.rendezvous.missing_nodes >= self.cluster.nodes:
            raise ValueError(f"rendezvous.missing_nodes: {self.rendezvous.missing_nodes} leaves no node of "
                             f"cluster.nodes={self.cluster.nodes}")


def _validate_fields_only(obj: Any, names: Iterable[str]) -> None:
    for f in fields(obj):
        if f.name in names:
            v = getattr(obj, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= f.metadata["gt"]:
                raise ValueError(f"{f.name}: must be a finite number > {f.metadata['gt']:g} (got {v!r})")


SECTIONS = ("cluster", *PHASES)  # the parameter sections: the cluster, then one per phase


def with_overrides(model: Model, overrides: Mapping[str, Any]) -> Model:
    """A copy of ``model`` with ``{"section.field": value}`` replaced (validated by the dataclasses)."""
    changes: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "budget_s":
            top[key] = value
            continue
        section, _, name = key.partition(".")
        if section not in SECTIONS or not name:
            raise ValueError(f"{key}: not a parameter (use SECTION.FIELD, sections: {', '.join(SECTIONS)})")
        if name not in {f.name for f in fields(getattr(model, section))}:
            raise ValueError(f"{key}: {section} has no field {name!r}")
        changes.setdefault(section, {})[name] = value
    for section, kv in changes.items():
        top[section] = replace(getattr(model, section), **kv)
    return replace(model, **top)


def parse_override(text: str, model: Model) -> tuple[str, Any]:
    """``"restore.aggregate_read_Bps=5e11"`` -> (key, value typed like the current value)."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise ValueError(f"--set {text!r}: expected SECTION.FIELD=VALUE")
    key = key.strip()
    section, _, name = key.partition(".")
    holder = model if key == "budget_s" else getattr(model, section, None)
    if holder is None or not hasattr(holder, name if key != "budget_s" else key):
        raise ValueError(f"--set {text!r}: unknown parameter {key!r}")
    current = getattr(holder, key if key == "budget_s" else name)
    raw = raw.strip()
    if isinstance(current, bool):
        if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"--set {text!r}: {key} takes true/false")
        return key, raw.lower() in ("true", "1", "yes")
    if isinstance(current, int):
        try:
            return key, int(raw)
        except ValueError:
            raise ValueError(f"--set {text!r}: {key} takes a whole number") from None
    if isinstance(current, float):
        try:
            return key, float(raw)
        except ValueError:
            raise ValueError(f"--set {text!r}: {key} takes a number") from None
    if isinstance(current, str):
        return key, raw
    raise ValueError(f"--set {text!r}: {key} is a table; edit it in the code")


# ------------------------------------------------------------------------------------ random streams
def _rng(seed: int, *names: str) -> np.random.Generator:
    """One independent stream per (seed, phase, quantity): phases never share draws."""
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


def _node_draws(seed: int, name: str, nodes: int, trials: int, kind: str = "normal") -> np.ndarray:
    """(nodes, trials) draws, node-major: the first n nodes are the same for any node count."""
    g = _rng(seed, name)
    if kind == "normal":
        return g.standard_normal((nodes, trials))
    return g.random((nodes, trials))


def _trial_uniform(seed: int, name: str, trials: int) -> np.ndarray:
    return _rng(seed, name).random(trials)


def _lognormal(z: np.ndarray, median: float, sigma: float) -> np.ndarray:
    return median * np.exp(sigma * z)


def _max_of_uniforms(u: np.ndarray, n: int) -> np.ndarray:
    """The maximum of n U(0,1) draws from one U(0,1) per trial (Beta(n, 1) by inversion; grows with n)."""
    return u ** (1.0 / max(n, 1))


def _slow_factor(c: Cluster, nodes: int) -> np.ndarray:
    f = np.ones((nodes, 1))
    f[: min(c.slow_nodes, nodes)] = c.slow_node_factor
    return f


def _loglog(table: Sequence[tuple[float, float]], x: float | np.ndarray) -> np.ndarray:
    """Piecewise log-log interpolation of a (size, cost) table, extrapolated with the end slopes."""
    xs = np.log([p[0] for p in table])
    ys = np.log([p[1] for p in table])
    lx = np.log(np.maximum(np.asarray(x, dtype=float), 1e-12))
    out = np.interp(lx, xs, ys)
    lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
    hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    out = np.where(lx < xs[0], ys[0] + lo_slope * (lx - xs[0]), out)
    out = np.where(lx > xs[-1], ys[-1] + hi_slope * (lx - xs[-1]), out)
    return np.exp(out)


# ------------------------------------------------------------------------------------ phases
def step_time_s(m: Model) -> float:
    """One training step (weak scaling): 6 * params * tokens per GPU / (peak * MFU)."""
    fs = m.first_step
    return 6.0 * m.restore.params * fs.tokens_per_gpu_per_step / (fs.peak_flops * fs.mfu)


def hang_timeout_s(m: Model) -> float:
    """The timeout that ends the detect phase, as the controller would set it."""
    d = m.detect
    if d.fault_kind == "silent":
        return d.silence_timeout_s
    if d.hang_timeout_override_s > 0:
        return d.hang_timeout_override_s
    return min(max(d.phase_factor * step_time_s(m), d.phase_floor_s), d.phase_ceiling_s)


def detect_phase(m: Model, trials: int, seed: int) -> np.ndarray:
    """Timeout plus the wait for the controller's next tick (its clock starts the fault at the last
    heartbeat received, or at the start of the stuck phase; so detect is never below the timeout)."""
    u = _trial_uniform(seed, "detect.tick", trials)
    return hang_timeout_s(m) + (1.0 - u) * m.detect.scan_period_s  # (timeout, timeout + scan]


def teardown_phase(m: Model, trials: int, seed: int, tag: str = "") -> np.ndarray:
    t, c = m.teardown, m.cluster
    n = c.nodes
    evidence = min(1.0, 1.2 * m.detect.heartbeat_interval_s) + t.evidence_write_s_per_rank * c.ranks
    ladder = t.kill_rpc_s + (t.abort_grace_s if m.detect.fault_kind == "collective_hang" else 0.0)
    hops = max(1, math.ceil(math.log(max(n, 2)) / math.log(t.tree_width)))
    fanout = t.kill_rpc_s + hops * t.hop_latency_s
    blocked = _node_draws(seed, f"teardown.blocked{tag}", n, trials, "uniform") < t.p_blocked_on_sigterm
    graceful = np.minimum(_lognormal(_node_draws(seed, f"teardown.graceful{tag}", n, trials),
                                     t.graceful_exit_median_s, t.graceful_exit_sigma), t.kill_grace_s)
    killed = t.kill_grace_s + _lognormal(_node_draws(seed, f"teardown.sigkill{tag}", n, trials),
                                         t.sigkill_exit_median_s, t.sigkill_exit_sigma)
    exit_s = np.where(blocked, killed, graceful)
    unkillable = _node_draws(seed, f"teardown.unkillable{tag}", n, trials, "uniform") < t.p_unkillable
    exit_s = np.where(unkillable, t.kill_grace_s + t.unkillable_timeout_s, exit_s)
    return evidence + ladder + fanout + exit_s.max(axis=0)


def agent_ready(m: Model, trials: int, seed: int, tag: str = "") -> np.ndarray:
    """Each agent's ready time (nodes, trials), from the start of the schedule phase."""
    s, c = m.schedule, m.cluster
    n = c.nodes
    if s.warm_agents:  # the agents imported torch before the launch: it only hands each node over
        start = _lognormal(_node_draws(seed, f"schedule.agent{tag}", n, trials), s.warm_handover_s,
                           s.agent_start_sigma) * _slow_factor(c, n)
    else:
        start = _lognormal(_node_draws(seed, f"schedule.agent{tag}", n, trials), s.agent_start_median_s,
                           s.agent_start_sigma)
        slow = _node_draws(seed, f"schedule.slow{tag}", n, trials, "uniform") < s.p_slow_start
        u = _node_draws(seed, f"schedule.tail{tag}", n, trials, "uniform")
        lomax = s.slow_start_scale_s * ((1.0 - u) ** (-1.0 / s.slow_start_alpha) - 1.0)
        start = (start + np.where(slow, lomax, 0.0)) * _slow_factor(c, n)
    if s.env_on_shared_fs and not s.warm_agents:  # every agent's import waits on the metadata server
        start = np.maximum(start, n * s.metadata_ops_per_import / s.mds_ops_per_s)
    if c.platform == "slurm":
        hops = max(1, math.ceil(math.log(max(n, 2)) / math.log(m.teardown.tree_width)))
        launch = s.slurm_step_create_s + hops * m.teardown.hop_latency_s
        ready = launch + start
    else:
        created = (np.arange(n, dtype=float)[:, None] + 1.0) / s.k8s_pods_per_s
        container = _lognormal(_node_draws(seed, f"schedule.container{tag}", n, trials),
                               s.k8s_container_start_median_s, 0.3)
        ready = created + container + start
    return s.pick_checkpoint_s + np.minimum(ready, s.startup_timeout_s)


def store_utilisation(m: Model, participants: int | np.ndarray) -> np.ndarray:
    """Fraction of the rendezvous store's time taken by the waiting agents' polls and keep-alives."""
    r = m.rendezvous
    p = np.asarray(participants, dtype=float)
    size = r.state_base_bytes + p * r.bytes_per_participant
    polls = _loglog(r.get_server_s, size) / r.poll_period_s
    keep_alives = _loglog(r.cas_server_s, size) / r.keep_alive_interval_s
    return p * (polls + keep_alives)


def saturation_nodes(m: Model, limit: int = 1 << 20) -> int | None:
    """The smallest agent count at which the c10d store saturates (None below ``limit``)."""
    lo, hi = 1, limit
    if store_utilisation(m, hi) < m.rendezvous.max_store_utilisation:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if store_utilisation(m, mid) >= m.rendezvous.max_store_utilisation:
            hi = mid
        else:
            lo = mid + 1
    return lo


def c10d_join(m: Model, arrivals: np.ndarray, seed: int, tag: str = "",
              max_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(when every agent knows the c10d rendezvous is complete, the last joined agent's arrival), per trial.

    One store, one pickled state that every join rewrites by compare-and-set. Join i costs a
    read-modify-write window (round trip + (de)serialising i participants + the server's CAS);
    the i-1 agents already in keep-alive the state every ``keep_alive_interval_s`` (each a
    winning CAS), so a join needs exp(rate x window) tries on average; q agents contending at
    once cost q CASes on the server; the waiting agents' polls and keep-alives take a share
    rho of the server, stretching every service by 1/(1-rho). Past ``max_store_utilisation``
    (or the join timeout) the rendezvous does not complete: inf.
    """
    r = m.rendezvous
    n, trials = arrivals.shape
    max_nodes = n if max_nodes is None else max_nodes
    a = np.sort(arrivals, axis=0)
    big = float(a.max()) + 1.0
    offsets = np.arange(trials, dtype=float) * big
    flat = (a.T + offsets[:, None]).ravel()  # rows sorted and disjoint: globally sorted
    base = np.arange(trials) * n
    i = np.arange(1, n + 1, dtype=float)
    size = r.state_base_bytes + i * r.bytes_per_participant
    cas = _loglog(r.cas_server_s, size)
    window = r.rtt_s + r.client_serde_s_per_participant * i + cas
    tries = np.exp(np.minimum((i - 1) / r.keep_alive_interval_s * window, 50.0))
    rho = store_utilisation(m, i - 1)
    stretch = 1.0 / (1.0 - np.minimum(rho, r.max_store_utilisation))
    k_min = max(1, math.ceil(r.nodes_min_fraction * max_nodes))
    if k_min > n:
        return np.full(trials, np.inf), a[-1].copy()
    cutoff = a[k_min - 1] + r.last_call_s if (k_min < max_nodes) else np.full(trials, np.inf)
    done = np.zeros(trials)
    last = np.zeros(trials)
    joined = np.zeros(trials, dtype=int)
    for k in range(n):
        take = a[k] <= cutoff
        start = np.maximum(a[k], done)
        arrived = np.minimum(np.searchsorted(flat, start + offsets, side="right") - base, n)
        contenders = np.maximum(arrived - k, 1)
        served = start + np.maximum(tries[k] * window[k], contenders * cas[k]) * stretch[k]
        done = np.where(take, served, done)
        last = np.where(take, a[k], last)
        joined = joined + take
    saturated = np.nonzero(rho >= r.max_store_utilisation)[0]
    if saturated.size:
        done = np.where(joined > saturated[0], np.inf, done)
    if n < max_nodes or k_min < max_nodes:  # completes at the last join, or at the last-call deadline
        done = np.where(joined < max_nodes, np.maximum(done, cutoff), done)
    done = np.where(done - a[0] > r.join_timeout_s, np.inf, done)
    notice = _max_of_uniforms(_trial_uniform(seed, f"rendezvous.notice{tag}", trials), n - 1) * r.poll_period_s
    return done + notice + float(_loglog(r.get_server_s, size[-1])), last


def gang_formation(m: Model, ready: np.ndarray, trials: int, seed: int, tag: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(schedule, rendezvous) per trial: the schedule phase ends when the last agent that joins is
    ready; the rendezvous phase runs from there to a process group every rank has joined."""
    r, c = m.rendezvous, m.cluster
    present = c.nodes - r.missing_nodes
    ready = ready[:present]
    if r.backend == "static":  # each agent connects once and learns its node rank from the launch
        jit_free = ready.max(axis=0)
        complete = jit_free + present * r.store_connect_s_per_rank
        if present < c.nodes:
            complete = np.full(trials, np.inf)
    else:
        jitter = _node_draws(seed, f"rendezvous.jitter{tag}", present, trials, "uniform") * r.join_jitter_s
        complete, last = c10d_join(m, ready + jitter, seed, tag, max_nodes=c.nodes)
        jit_free = np.minimum(last, ready.max(axis=0))  # the schedule phase excludes torch's join jitter
    n = present
    assign = n * r.rank_assign_ops_per_agent * r.small_op_server_s
    workers = (_lognormal(_node_draws(seed, f"rendezvous.workers{tag}", n, trials), r.worker_start_median_s,
                          r.worker_start_sigma) * _slow_factor(c, n)).max(axis=0)
    ranks = n * c.gpus_per_node
    connect = ranks * r.store_connect_s_per_rank
    gloo = float(_loglog(r.gloo_init_s, ranks)) if r.gloo_group else 0.0
    return jit_free, (complete - jit_free) + assign + workers + connect + gloo


def restore_phase(m: Model, trials: int, seed: int, tag: str = "") -> np.ndarray:
    s, c = m.restore, m.cluster
    n, g = c.nodes, c.gpus_per_node
    per_node_bytes = s.checkpoint_bytes * s.read_amplification / n
    fair = min(s.node_read_cap_Bps, s.aggregate_read_Bps / n, g * s.rank_load_Bps)
    speed = _lognormal(_node_draws(seed, f"restore.bw{tag}", n, trials), 1.0, s.node_bw_sigma)
    slow = _node_draws(seed, f"restore.slow{tag}", n, trials, "uniform") < s.p_slow_reader
    speed = np.where(slow, speed * s.slow_reader_factor, speed) / _slow_factor(c, n)
    read = per_node_bytes / (fair * speed)
    verify = s.checkpoint_bytes / n / (g * s.verify_Bps_per_rank)
    report = (_max_of_uniforms(_trial_uniform(seed, f"restore.report{tag}", trials), c.ranks)
              * m.detect.heartbeat_interval_s)
    return s.metadata_s + s.plan_s_per_rank * c.ranks + (read + verify).max(axis=0) + report


def first_step_phase(m: Model, trials: int, seed: int) -> np.ndarray:
    f, c = m.first_step, m.cluster
    n, ranks = c.nodes, c.ranks
    slow = _slow_factor(c, n)
    warm = (_lognormal(_node_draws(seed, "first.loader", n, trials), f.dataloader_warmup_median_s, f.warmup_sigma)
            + _lognormal(_node_draws(seed, "first.compile", n, trials), f.compile_warmup_median_s, f.warmup_sigma)
            + _lognormal(_node_draws(seed, "first.nccl", n, trials), f.nccl_init_median_s, f.warmup_sigma)) * slow
    nccl_scale = f.nccl_init_s_per_rank * ranks + f.nccl_init_s_per_rank2 * ranks**2
    jitter = _lognormal(_node_draws(seed, "first.step", n, trials), 1.0, f.step_sigma) * slow
    step = step_time_s(m) * jitter.max(axis=0)
    report = _max_of_uniforms(_trial_uniform(seed, "first.report", trials), ranks) * m.detect.heartbeat_interval_s
    return warm.max(axis=0) + nccl_scale + step + report


@dataclass(frozen=True)
class Result:
    model: Model
    trials: int
    seed: int
    phases: dict[str, np.ndarray]
    total: np.ndarray
    fallback: np.ndarray  # trials where the newest checkpoint failed and a second relaunch ran

    def quantile(self, name: str, q: float) -> float:
        data = self.total if name == "total" else self.phases[name]
        return float(np.quantile(data, q, method="inverted_cdf"))

    @property
    def completed(self) -> float:
        return float(np.isfinite(self.total).mean())


def simulate(m: Model, trials: int = 2000, seed: int = 0) -> Result:
    """Every phase for ``trials`` independent restarts; the total is the per-trial sum."""
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise ValueError(f"trials: must be a whole number >= 1 (got {trials!r})")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be a whole number >= 0 (got {seed!r})")
    phases = {"detect": detect_phase(m, trials, seed), "teardown": teardown_phase(m, trials, seed)}
    phases["schedule"], phases["rendezvous"] = gang_formation(m, agent_ready(m, trials, seed), trials, seed)
    phases["restore"] = restore_phase(m, trials, seed)
    phases["first_step"] = first_step_phase(m, trials, seed)
    fallback = _trial_uniform(seed, "restore.corrupt", trials) < m.restore.p_newest_corrupt
    if fallback.any():
        # The ranks find the bad shard after a full read + verify, exit, and the controller runs
        # one more cycle (relaunch on the same nodes, restore the previous checkpoint).
        silent = replace(m, detect=replace(m.detect, fault_kind="silent"))  # a rank exit: no abort rung
        extra = {"teardown": teardown_phase(silent, trials, seed, ".retry") + m.detect.scan_period_s}
        extra["schedule"], extra["rendezvous"] = gang_formation(m, agent_ready(m, trials, seed, ".retry"), trials,
                                                                seed, ".retry")
        extra["restore"] = restore_phase(m, trials, seed, ".retry")
        for name, add in extra.items():
            phases[name] = np.where(fallback, phases[name] + add, phases[name])
    total = np.zeros(trials)
    for name in PHASES:
        total = total + phases[name]
    return Result(m, trials, seed, phases, total, fallback)


def model_for(nodes: int, gpus_per_node: int = 8, base: Model | None = None) -> Model:
    base = base or Model()
    return replace(base, cluster=replace(base.cluster, nodes=nodes, gpus_per_node=gpus_per_node))


# ------------------------------------------------------------------------------------ scenarios
LOST_NODE_GPUS = 16_384
"""The headline's second scale: a job of this many GPUs losing one node."""


def lost_node_models(base: Model) -> list[tuple[str, Model]]:
    """A node lost at :data:`LOST_NODE_GPUS` GPUs, each of the supervisor's paths added in turn."""
    m = model_for(max(1, LOST_NODE_GPUS // base.cluster.gpus_per_node), base.cluster.gpus_per_node, base)
    m = with_overrides(m, {"detect.fault_kind": "silent"})
    static = with_overrides(m, {"rendezvous.backend": "static"})
    return [("c10d rendezvous, cold agents", m),
            ("static rendezvous (node ranks from the supervisor)", static),
            ("static rendezvous and warm agents", with_overrides(static, {"schedule.warm_agents": True}))]


def scenarios(base: Model) -> list[tuple[str, Model]]:
    """The sensitivity cases: one change each against ``base`` (those that do not fit its size are left out)."""
    doubled = 2 * hang_timeout_s(base)
    r = base.rendezvous
    cases: list[tuple[str, Any]] = [
        ("baseline (a rank hangs in a collective)", base),
        ("fault: a node is lost (heartbeat silence, 5 s)", {"detect.fault_kind": "silent"}),
        ("storage bandwidth halved", {"restore.aggregate_read_Bps": base.restore.aggregate_read_Bps / 2}),
        (f"hang timeout doubled ({hang_timeout_s(base):.0f} s -> {doubled:.0f} s)",
         {"detect.hang_timeout_override_s": doubled}),
        (f"one slow node ({base.cluster.slow_node_factor:.0f}x at start, read, warm-up)", {"cluster.slow_nodes": 1}),
        ("SIGTERM grace 30 s (Slurm KillWait / K8s default)", {"teardown.kill_grace_s": 30.0}),
        ("newest checkpoint corrupt: fall back one", {"restore.p_newest_corrupt": 1.0}),
        ("cold torch.compile cache (300 s)", {"first_step.compile_warmup_median_s": 300.0}),
        ("Python env on shared FS, cold caches", {"schedule.env_on_shared_fs": True}),
        ("405B model (5.7 TB checkpoint)", {"restore.params": 405e9}),
        ("HSDP, 8 replicas read the same shards", {"restore.read_amplification": 8.0}),
        ("Kubernetes pods (100 pods/s)", {"cluster.platform": "kubernetes"}),
        ("gloo process group as well", {"rendezvous.gloo_group": True}),
        ("elastic launch (nodes.min = 90%): stragglers cut off", {"rendezvous.nodes_min_fraction": 0.9}),
        ("elastic (90%) and one agent never starts",
         {"rendezvous.nodes_min_fraction": 0.9, "rendezvous.missing_nodes": 1}),
        ("rendezvous keep_alive_interval 60 s (--rdzv-conf)", {"rendezvous.keep_alive_interval_s": 60.0}),
        ("c10d store and agent CPU 2x slower than measured here", {
            "rendezvous.cas_server_s": tuple((a, 2 * b) for a, b in r.cas_server_s),
            "rendezvous.get_server_s": tuple((a, 2 * b) for a, b in r.get_server_s),
            "rendezvous.client_serde_s_per_participant": 2 * r.client_serde_s_per_participant}),
        ("agents start in a tight burst (spread 0.05)", {"schedule.agent_start_sigma": 0.05}),
        ("static rendezvous instead of c10d", {"rendezvous.backend": "static"}),
    ]
    out = []
    for name, change in cases:
        try:
            out.append((name, change if isinstance(change, Model) else with_overrides(base, change)))
        except ValueError:
            continue  # e.g. "one agent never starts" on a one-node job
    return out


# ------------------------------------------------------------------------------------ report
def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "never"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}"


def _verdict(res: Result) -> tuple[str, float]:
    p99 = res.quantile("total", 0.99)
    return ("PASS" if p99 <= res.model.budget_s else "MISS"), res.model.budget_s - p99


def dominant_phase(res: Result) -> tuple[str, float]:
    """The phase with the largest share of the mean total (over completed trials)."""
    ok = np.isfinite(res.total)
    if not ok.any():
        bad = [p for p in PHASES if not np.isfinite(res.phases[p]).all()]
        return (bad[0] if bad else PHASES[0]), 1.0
    means = {p: float(res.phases[p][ok].mean()) for p in PHASES}
    name = max(means, key=means.get)  # type: ignore[arg-type]
    return name, means[name] / float(res.total[ok].mean())


def tail_phase(res: Result, q: float = 0.95) -> tuple[str, float]:
    """The phase with the largest share of the total in the slowest trials (total >= its q-quantile)."""
    cut = res.quantile("total", q)
    tail = res.total >= cut
    if not np.isfinite(cut):
        return dominant_phase(res)
    means = {p: float(res.phases[p][tail].mean()) for p in PHASES}
    name = max(means, key=means.get)  # type: ignore[arg-type]
    return name, means[name] / float(res.total[tail].mean())


def phase_table(res: Result) -> list[str]:
    lines = ["| phase | p50 (s) | p95 (s) | p99 (s) | mean share |", "|---|---:|---:|---:|---:|"]
    ok = np.isfinite(res.total)
    mean_total = float(res.total[ok].mean()) if ok.any() else float("nan")
    for p in PHASES:
        share = float(res.phases[p][ok].mean()) / mean_total if ok.any() else float("nan")
        lines.append(f"| {p} | {_fmt(res.quantile(p, .5))} | {_fmt(res.quantile(p, .95))} | "
                     f"{_fmt(res.quantile(p, .99))} | {share:.0%} |")
    lines.append(f"| **total** | **{_fmt(res.quantile('total', .5))}** | **{_fmt(res.quantile('total', .95))}** | "
                 f"**{_fmt(res.quantile('total', .99))}** | 100% |")
    return lines


def parameter_table(m: Model) -> list[str]:
    lines = ["| parameter | value | unit | kind | source |", "|---|---|---|---|---|"]

    def show(v: Any) -> str:
        if isinstance(v, tuple):
            return "table: " + ", ".join(f"{a:g}->{b:g}" for a, b in v)
        if isinstance(v, float):
            return f"{v:g}"
        return str(v)

    for section in SECTIONS:
        obj = getattr(m, section)
        for f in fields(obj):
            md = f.metadata
            lines.append(f"| `{section}.{f.name}` | {show(getattr(obj, f.name))} | {md['unit']} | {md['kind']} | "
                         f"{md['source']} |")
    f = next(x for x in fields(m) if x.name == "budget_s")
    lines.append(f"| `budget_s` | {m.budget_s:g} | s | {f.metadata['kind']} | {f.metadata['source']} |")
    return lines


@dataclass(frozen=True)
class Summary:
    """What the report keeps of one simulation (no per-trial arrays)."""

    label: str
    model: Model
    q: dict[str, dict[float, float]]
    verdict: str
    headroom: float
    dominant: tuple[str, float]
    tail: tuple[str, float]
    completed: float


def summarise(label: str, res: Result) -> Summary:
    names = (*PHASES, "total")
    v, h = _verdict(res)
    return Summary(label, res.model, {n: {p: res.quantile(n, p) for p in QUANTILES} for n in names}, v, h,
                   dominant_phase(res), tail_phase(res), res.completed)


def _signed(x: float) -> str:
    if not math.isfinite(x):
        return "never"
    return "0" if abs(x) < 0.05 else f"{x:+,.1f}"


def report(base: Model, trials: int, seed: int, scaling: Sequence[int] = SCALING_NODES,
           progress: Any = None, static_rows: bool = True) -> str:
    """The whole markdown document: explanation, results, findings, parameters (pure)."""
    def note(msg: str) -> None:
        if progress:
            progress(msg)

    c = base.cluster
    note(f"headline: {c.nodes} nodes")
    head_res = simulate(base, trials, seed)
    head = summarise("baseline", head_res)
    phase_lines = phase_table(head_res)
    del head_res

    rows: list[Summary] = []
    models = [(f"{n:,}", model_for(n, c.gpus_per_node, base)) for n in scaling]
    if static_rows and base.rendezvous.backend == "c10d":
        models += [(f"{n:,} static rdzv", with_overrides(model_for(n, c.gpus_per_node, base),
                                                          {"rendezvous.backend": "static"}))
                   for n in scaling if n >= 2048]
    for label, model in models:
        note(f"scaling: {label} nodes")
        rows.append(replace(head, label=label) if model == base else summarise(label, simulate(model, trials, seed)))
    lost: list[tuple[str, Summary]] = []
    for name, model in lost_node_models(base):
        note(f"one node lost at {LOST_NODE_GPUS:,} GPUs: {name}")
        lost.append((name, summarise(name, simulate(model, trials, seed))))
    sens: list[tuple[str, Summary]] = []
    for name, model in scenarios(base):
        note(f"sensitivity: {name}")
        sens.append((name, head if model is base else summarise(name, simulate(model, trials, seed))))

    p50, p99 = head.q["total"][0.5], head.q["total"][0.99]
    hr = head.headroom
    ckpt_tb = base.restore.checkpoint_bytes / 1e12
    sat = saturation_nodes(base)
    out = [
        "# The restart at scale, on paper",
        "",
        "A seeded Monte Carlo model of one restart (fault -> first resumed step) at "
        f"{c.nodes:,} nodes, against the {base.budget_s / 60:g}-minute budget. Nobody here has "
        f"{c.nodes:,} nodes: every number below comes from the parameters at the end, each labelled "
        "*measured here*, *code*, *public* or *assumption*. Argue with a parameter, change it "
        "(`--set SECTION.FIELD=VALUE`), and rerun: the model is `benchmarks/restart_simulation.py`, "
        "its tests `tests/test_restart_simulation.py`.",
        "",
        "## Headline",
        "",
        f"- **{head.verdict}**: at {c.nodes:,} nodes x {c.gpus_per_node} GPUs ({c.ranks:,} ranks), "
        f"{base.restore.params / 1e9:g}B params ({ckpt_tb:.2f} TB checkpoint), a restart takes "
        f"**{_fmt(p50)} s at p50 and {_fmt(p99)} s at p99** against {base.budget_s:.0f} s: "
        + (f"headroom {_fmt(hr)} s ({hr / base.budget_s:.0%} of the budget) at p99."
           if math.isfinite(hr) else "the restart does not complete."),
        f"- Dominant phase: **{head.dominant[0]}** ({head.dominant[1]:.0%} of the mean restart); in the "
        f"slowest 5% of restarts, **{head.tail[0]}** ({head.tail[1]:.0%}).",
    ]
    worst = sorted(((s.q["total"][0.99] - p99, name, s) for name, s in sens[1:]),
                   key=lambda t: -t[0] if math.isfinite(t[0]) else -math.inf)
    top = [t for t in worst if t[0] > 0][:4]
    if top:
        out.append("- Largest single risks (p99 change): " + "; ".join(
            f"{name} **{_signed(d)} s** ({s.verdict})" for d, name, s in top) + ".")
    best = lost[-1][1]
    out.append(f"- **One node lost at {LOST_NODE_GPUS:,} GPUs** ({best.model.cluster.nodes:,} nodes x "
               f"{best.model.cluster.gpus_per_node}), {lost[-1][0]}: **{_fmt(best.q['total'][0.5])} s at p50, "
               f"{_fmt(best.q['total'][0.99])} s at p99** ({best.verdict}); with c10d and cold agents "
               f"{_fmt(lost[0][1].q['total'][0.5])} / {_fmt(lost[0][1].q['total'][0.99])} s (see that section).")
    misses = [r for r in rows if r.verdict == "MISS"]
    if misses:
        first = misses[0]
        broken = [p for p in PHASES if not math.isfinite(first.q[p][0.99])]
        why = (f"the {broken[0]} phase never completes" if broken else
               f"p99 {_fmt(first.q['total'][0.99])} s, {first.dominant[0]} dominant")
        out.append(f"- Scaling with c10d throughout: the first node count that misses is **{first.label}** ({why}).")
    statics = [r for r in rows if r.label.endswith("static rdzv")]
    if statics:
        missed = [r for r in statics if r.verdict == "MISS"]
        last = statics[-1]
        out.append("- With the static rendezvous (the supervisor's default from 256 nodes up): " + (
            f"the first node count that misses is **{missed[0].label}**" if missed else
            f"**no node count up to {last.model.cluster.nodes:,} misses**") +
            f" (at {last.model.cluster.nodes:,} nodes p99 {_fmt(last.q['total'][0.99])} s, {last.tail[0]} the "
            "largest phase of the slowest 5%).")
    if sat:
        out.append(f"- torch's c10d rendezvous store saturates from **{sat:,} agents** with its default "
                   f"keep-alive ({base.rendezvous.keep_alive_interval_s:g} s); join contention makes it slow "
                   "well before that (see the rendezvous column of the scaling table).")
    out += [
        "",
        f"## Result at {c.nodes:,} nodes",
        "",
        f"Platform {c.platform}; fault: {base.detect.fault_kind.replace('_', ' ')} (timeout "
        f"{hang_timeout_s(base):.0f} s); {trials:,} trials, seed {seed}. The total is summed per trial, so "
        "per-phase quantiles do not add up to the total's.",
        "",
        *phase_lines,
        "",
        f"Control-plane load here: {c.ranks / base.detect.heartbeat_interval_s:,.0f} heartbeats/s into the "
        f"controller; the c10d store is {float(store_utilisation(base, c.nodes)):.0%} busy with polls and "
        "keep-alives once every agent waits.",
        "",
        "## Scaling",
        "",
        "p50 / p99 seconds per phase (weak scaling: the same model and tokens per GPU); the verdict is the "
        "total's p99 against the budget. `never`: the phase does not complete (the c10d rendezvous store "
        "is past saturation, or the join times out).",
        "",
        "| nodes | ranks | " + " | ".join(PHASES) + " | total p50 | total p99 | verdict |",
        "|---|---:|" + "---:|" * (len(PHASES) + 2) + "---|",
    ]
    for r in rows:
        cells = [f"{_fmt(r.q[p][0.5])} / {_fmt(r.q[p][0.99])}" for p in PHASES]
        out.append(f"| {r.label} | {r.model.cluster.ranks:,} | " + " | ".join(cells)
                   + f" | {_fmt(r.q['total'][0.5])} | {_fmt(r.q['total'][0.99])} | {r.verdict} |")
    out += [
        "",
        f"## One node lost at {LOST_NODE_GPUS:,} GPUs",
        "",
        f"A node goes silent (its heartbeats stop: {base.detect.silence_timeout_s:g} s to detect) in a "
        f"{LOST_NODE_GPUS // c.gpus_per_node:,}-node job; the gang is relaunched on a spare. Each row adds one of "
        "the supervisor's own paths to the one above. A restart in place (rung 0) does not apply: the node is "
        "gone, and a restart in place keeps every node. What the supervisor runs by default on Slurm and "
        "Kubernetes is the second row: from 256 nodes up each launch hands the agents their node ranks "
        "(torch's static rendezvous on a libuv TCPStore served by the first node; "
        "`platform.rendezvous_backend`, `auto` by default), agents started at the launch; warm agents are "
        "the local platform's only.",
        "",
        "| configuration | " + " | ".join(PHASES) + " | total p50 | total p99 | verdict |",
        "|---|" + "---:|" * (len(PHASES) + 2) + "---|",
    ]
    for name, r in lost:
        cells = [f"{_fmt(r.q[p][0.5])} / {_fmt(r.q[p][0.99])}" for p in PHASES]
        out.append(f"| {name} | " + " | ".join(cells)
                   + f" | {_fmt(r.q['total'][0.5])} | {_fmt(r.q['total'][0.99])} | {r.verdict} |")
    out += [
        "",
        f"## Sensitivity at {c.nodes:,} nodes",
        "",
        "One change at a time against the baseline, same seed (the other phases draw the same numbers).",
        "",
        "| scenario | total p50 | total p99 | p50 vs baseline | p99 vs baseline | dominant phase "
        "| verdict (headroom) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, s in sens:
        out.append(f"| {name} | {_fmt(s.q['total'][0.5])} | {_fmt(s.q['total'][0.99])} | "
                   f"{_signed(s.q['total'][0.5] - p50)} | "
                   f"{_signed(s.q['total'][0.99] - p99)} | {s.dominant[0]} ({s.dominant[1]:.0%}) | "
                   f"{s.verdict} ({_fmt(s.headroom) if math.isfinite(s.headroom) else 'none'} s) |")
    out += ["", explanation(base), "", "## Parameters", "", *parameter_table(base), ""]
    return "\n".join(out)


def explanation(m: Model) -> str:
    """The model in words (static text with the current parameter values filled in)."""
    r, s, t, f, st = m.restore, m.schedule, m.teardown, m.first_step, m.rendezvous
    n = m.cluster.nodes
    p_unkillable = 1.0 - (1.0 - t.p_unkillable) ** n
    sat = saturation_nodes(m)
    sat_text = f"saturates from {sat:,} agents" if sat else "does not saturate"
    return f"""## The model

Each trial draws every per-node quantity for every node, takes the maximum over nodes where the
gang waits for its slowest member, and sums the phases. Draws are node-major and separate per
quantity, so a trial's first N nodes are the same at any node count (more nodes can only add to
a maximum) and a change to one parameter leaves the other phases' draws alone.

- **detect** = timeout + the wait for the controller's next tick ({m.detect.scan_period_s:g} s). The
  controller starts a hang's clock when the stuck phase began and a silent rank's at its last
  heartbeat received (`controller/decide.py`), so the phase is never shorter than the timeout; the
  true fault of a silent rank can be up to one heartbeat interval later, so for it the exported
  number overstates the real latency by up to {m.detect.heartbeat_interval_s:g} s. A hang's timeout
  is calibrated: {m.detect.phase_factor:g} x the median step ({step_time_s(m):.1f} s here), clamped
  to [{m.detect.phase_floor_s:g}, {m.detect.phase_ceiling_s:g}] s.
- **teardown** = evidence (every rank dumps stacks: a fixed 1 s wait) + for a hang the abort rung
  ({t.abort_grace_s:g} s: torchrun's own 30 s stop grace outlasts it, so the node is killed) +
  the kill fan-out + the slowest node's exit: SIGTERM, {t.kill_grace_s:g} s grace, SIGKILL. The
  SDK's SIGTERM handler acts at the next step boundary, which ranks blocked in a collective never
  reach, so after a hang or a lost peer every node waits the full grace. With probability
  {t.p_unkillable:g} per node a process stays in D state and the node is given up on after
  {t.unkillable_timeout_s:g} s (Slurm's UnkillableStepTimeout): at {n:,} nodes {p_unkillable:.0%} of
  restarts meet one such node, which is what the teardown tail is made of.
- **schedule** = checkpoint pick + launch (Slurm step or pods at {s.k8s_pods_per_s:g}/s) + the
  slowest agent's start: log-normal around the measured {s.agent_start_median_s:g} s, and with
  probability {s.p_slow_start:g} per node a Pareto-II extra delay (scale {s.slow_start_scale_s:g} s,
  tail index {s.slow_start_alpha:g}), capped at the controller's startup timeout. With
  {n * s.p_slow_start:.1f} slow nodes per restart on average at {n:,} nodes, this assumed tail sets the
  restart's p99.
- **rendezvous** = c10d: one TCPStore, one pickled state ({st.bytes_per_participant:g} B per agent,
  measured) rewritten by compare-and-set at every join. The store's CAS cost was measured here and
  grows faster than the state (0.17 ms at 100 kB, 2 ms at 400 kB, 30 ms at 1.6 MB); agents
  retry a lost CAS at once, so q agents in a burst cost q CASes per successful join (O(N^2) in a
  burst), joined agents keep-alive every {st.keep_alive_interval_s:g} s (more lost races) and poll every
  {st.poll_period_s:g} s. Upstream says as much: the keep-alive defaults "are not suitable for jobs
  with thousands of ranks" (pytorch PR #145228, which made them configurable), and participants
  "race to update a global state ... easy to get slowed down by collisions" (review of PR #117066).
  Then workers start ({st.worker_start_median_s:g} s median per node, assumed),
  {m.cluster.gpus_per_node} per node connect to one store ({st.store_connect_s_per_rank * 1e3:g} ms per
  rank, serialised: from PyTorch's libuv TCPStore benchmark), optionally a gloo group.
- **restore** = metadata + central DCP planning ({r.plan_s_per_rank * 1e3:g} ms per rank, assumed) +
  the slowest node's read of its 1/N share at min(per-node cap {r.node_read_cap_Bps / 1e9:g} GB/s,
  aggregate {r.aggregate_read_Bps / 1e12:g} TB/s / N, {m.cluster.gpus_per_node} x the measured
  {r.rank_load_Bps / 1e9:g} GB/s per-rank dcp.load), with per-node spread and rare slow readers, + xxh3
  verification of that share spread over the node's ranks + the heartbeat that reports it. A
  corrupt newest checkpoint costs a whole second cycle (teardown, schedule, rendezvous, restore).
- **first_step** = the slowest node's data-loader warm-up + torch.compile warm start
  ({f.compile_warmup_median_s:g} s, assumed) + NCCL init base, + NCCL's O(ranks) and O(ranks^2) terms,
  + one step ({step_time_s(m):.2f} s = 6 x params x {f.tokens_per_gpu_per_step:g} tokens/GPU / (peak x
  {f.mfu:g} MFU)), + the heartbeat that reports it. In a real run NCCL may initialise during the
  restore (DCP's planning collectives); the total does not change.

## The assumptions that matter most

1. **The straggler tail at start-up** (`schedule.p_slow_start`, `slow_start_*`): an assumption, and
   it sets the p99. Measure it: the controller exports per-phase histograms, and a fleet's launch
   logs give the per-node start distribution. An elastic launch (`nodes.min` < `nodes.max`) caps a
   straggler's cost at torch's last-call timeout ({st.last_call_s:g} s) at the price of a smaller world.
2. **Warm-up before the first step** (`first_step.compile_warmup_median_s` and friends): the largest
   phase at the median. A cold torch.compile cache can take the restart past the budget on its own;
   keep the compile cache on the nodes (or shared) and warm.
3. **The c10d rendezvous at scale** (store costs measured on a 2-core box, torch's defaults): read
   the rendezvous column of the scaling table. The store {sat_text} (polls and keep-alives
   alone), and the O(N^2) join contention makes the rendezvous slow well before that. Where the knee
   sits moves with the store host's CPU and how bunched the agents arrive (both in the sensitivity
   table), but the shape comes from torch's algorithm (every join rewrites one shared state). The
   supervisor chooses every world itself, so a static rendezvous (node ranks handed out at launch)
   removes the problem, and it launches one from 256 nodes up (`platform.rendezvous_backend: auto`);
   a longer `keep_alive_interval` alone does not.
4. **Storage**: at 70B the checkpoint is ~1 GB per node at 1,024 nodes, so bandwidth barely matters
   (halving it costs seconds); it starts to matter with 405B, HSDP replicas reading the same shards,
   or a fallback to an older checkpoint.
5. **The Python environment**: from a shared file system with cold caches, `import torch` on every
   node is a metadata storm (~{s.metadata_ops_per_import:,.0f} metadata ops per import, measured here,
   against an assumed {s.mds_ops_per_s:,.0f} ops/s server). Ship it in the image or on node-local disk.

## What the model leaves out

- A second fault during the restart, and the restart that a node missing the startup timeout
  would trigger (the schedule phase is capped at that timeout: optimistic).
- Queueing for replacement nodes: the gang relaunches on the healthy nodes it has (Slurm
  `--no-kill` allocation, or pods on nodes already up). Image pulls on new nodes are not modelled.
- Correlated failures (a switch, a storage target, a rack) beyond the per-node probabilities.
- The controller's own load: {m.cluster.ranks / m.detect.heartbeat_interval_s:,.0f} heartbeats/s at
  this scale is assumed to be absorbed without loss.
- Contention between phases (e.g. restore reads slowing a neighbour's start-up), and any
  validation at scale: the rendezvous model in particular is built from single-client store
  measurements and torch's source, not from a 1,000-node run.

## How the phases map to the controller's marks

The controller (`RestartTimer` in `supervisor/controller/decide.py`) marks *scheduled* when its
launch call returns, *rendezvous* when every rank has been heard from, *restored* when no rank is
in its init/restore phase, *first step* when every rank reports a step past the restored one. So
the controller's exported `schedule` is only the launch call, its `rendezvous` includes agent
start-up, and its `restore` includes the process-group store connect; the model splits the same
time at torch's own boundaries. The totals are the same.
"""


# ------------------------------------------------------------------------------------ calibration
def calibrate() -> str:  # pragma: no cover - measures this machine; needs torch and xxhash
    """Re-measure the ``measured here`` inputs on this machine and print them next to the defaults."""
    import base64
    import multiprocessing as mp
    import os
    import pickle
    import shutil
    import subprocess
    import time
    from datetime import datetime, timezone

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    lines = []
    empty = len(base64.b64encode(pickle.dumps(_RendezvousState())))
    st = _RendezvousState()
    now = datetime.now(timezone.utc)
    for i in range(4096):
        nd = _NodeDesc(f"node-{i:05d}.cluster.example.com", 100000 + i, 0)
        st.participants[nd] = 0
        st.last_heartbeats[nd] = now
    times = []
    for _ in range(9):  # median: a cyclic-GC pass now and then makes one decode 10-80x slower
        t0 = time.perf_counter()
        blob = base64.b64encode(pickle.dumps(st))
        pickle.loads(base64.b64decode(blob))
        times.append(time.perf_counter() - t0)
    lines.append(f"rendezvous state: empty {empty} B, {(len(blob) - empty) / 4096:.1f} B/participant, "
                 f"serde {sorted(times)[4] / 4096 * 1e6:.2f} us/participant (median of 9)")

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_store_server, args=(q,), daemon=True)
    proc.start()
    port = q.get(timeout=60)
    cli = dist.TCPStore("127.0.0.1", port, is_master=False)

    def cpu() -> float:
        f = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    for size in (10_000, 100_000, 400_000, 1_600_000):
        v = b"a" * size
        cli.set("big", v)
        for op in ("get", "cas"):
            k, c0, t0 = 0, cpu(), time.perf_counter()
            while time.perf_counter() - t0 < 2.0:
                cli.get("big") if op == "get" else cli.compare_set("big", v, v)
                k += 1
            lines.append(f"TCPStore {op} {size:>9,} B: server CPU {(cpu() - c0) / k * 1e3:.3f} ms/op ({k} ops)")
    for n in (1024, 2048):  # clients joining one libuv store at once (what a static rendezvous costs it)
        from concurrent.futures import ThreadPoolExecutor
        from datetime import timedelta

        def join(_: int) -> Any:
            c = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
            c.add("joined", 1)
            return c

        with ThreadPoolExecutor(64) as ex:
            list(ex.map(join, range(8)))  # (the first connections pay name lookups: not counted)
            t0 = time.perf_counter()
            joined = list(ex.map(join, range(n)))
        dt = time.perf_counter() - t0
        lines.append(f"TCPStore: {n} clients connect + add: {dt:.2f} s, {dt / n * 1e3:.3f} ms/client")
        del joined
    proc.terminate()

    py = sys.executable
    t0 = time.perf_counter()
    subprocess.run([py, "-c", "import torch"], check=True)
    lines.append(f"import torch (cold process): {time.perf_counter() - t0:.2f} s")
    if shutil.which("strace"):
        r = subprocess.run(["strace", "-f", "-c", "-e", "trace=%file", "-o", "/dev/stdout", py, "-c", "import torch"],
                           capture_output=True, text=True)
        total = [ln for ln in r.stdout.splitlines() if ln.strip().endswith("total")]
        lines.append(f"import torch file-metadata syscalls: {total[-1].split()[3] if total else '?'}")
    import xxhash
    buf = np.random.default_rng(0).integers(0, 255, size=256 << 20, dtype=np.uint8).tobytes()
    t0 = time.perf_counter()
    xxhash.xxh3_64(buf).intdigest()
    lines.append(f"xxh3_64: {0.25 / (time.perf_counter() - t0):.1f} GiB/s (one thread)")
    return "\n".join(lines)


def _store_server(q: Any) -> None:  # pragma: no cover - runs in a child process
    import time

    import torch.distributed as dist
    s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    q.put(s.port)
    time.sleep(600)


# ------------------------------------------------------------------------------------ CLI
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the report to this markdown file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="override a parameter, e.g. restore.aggregate_read_Bps=5e11 (repeatable)")
    ap.add_argument("--scaling", default=",".join(map(str, SCALING_NODES)), help="node counts for the scaling table")
    ap.add_argument("--calibrate", action="store_true", help="re-measure the 'measured here' inputs and exit")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    if args.calibrate:
        print(calibrate())
        return 0
    try:
        model = model_for(args.nodes, args.gpus_per_node)
        model = with_overrides(model, dict(parse_override(s, model) for s in args.overrides))
        scaling = tuple(int(x) for x in args.scaling.split(",") if x.strip())
        if not scaling or min(scaling) < 1:
            raise ValueError("--scaling: node counts must be whole numbers >= 1")
        text = report(model, args.trials, args.seed, scaling,
                      progress=None if args.quiet else (lambda s: print(f"... {s}", file=sys.stderr)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cmd = "python benchmarks/restart_simulation.py " + " ".join(
        a for a in (f"--nodes {args.nodes}" if args.nodes != 1024 else "",
                    f"--gpus-per-node {args.gpus_per_node}" if args.gpus_per_node != 8 else "",
                    f"--trials {args.trials}" if args.trials != 2000 else "",
                    f"--seed {args.seed}" if args.seed else "",
                    *(f"--set {s}" for s in args.overrides)) if a)
    title, _, rest = text.partition("\n")
    text = f"{title}\n\n<!-- generated by: {cmd.strip()} -->\n{rest}"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
