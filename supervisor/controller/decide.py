"""Pure decisions of the controller: what went wrong, where the ladder starts, what comes next.

The job's phases::

    STARTING --all ranks heard from--> RUNNING --fault--> RECOVERING --relaunch--> STARTING
        |                                 |                    |
        |                                 +--all ranks done--> COMPLETED (exit 0)
        +--fault--> RECOVERING             RECOVERING --guard--> STOPPED_NO_PROGRESS (3)
                                                      --guard--> STOPPED_MAX_RESTARTS (4)
                                                      --no capacity--> STOPPED_NO_CAPACITY (5)
                                                      --no usable checkpoint--> STOPPED_NO_CHECKPOINT (6)
                                                      --non-finite again--> STOPPED_NONFINITE (7)
                                                      --same failure before the first step--> STOPPED_STARTUP_FAILURE (8)
                                                      --the same rank out of memory at the same step--> STOPPED_OUT_OF_MEMORY (11)
    STARTING --the cluster cannot place the gang--> WAITING_FOR_CAPACITY --placed--> STARTING
                                                                          --too long--> STOPPED_NO_CAPACITY (5)
    any phase --SIGTERM/SIGINT (scancel, Ctrl-C)--> CANCELLED (10); --time-limit warning + requeue--> REQUEUED (9)

Progress is never thrown away on a guess: a checkpoint becomes suspect only on evidence about
it (a rank refused it when verifying or loading it, or two attempts restored it and neither
completed a step after it, as the ranks themselves reported), the next attempt resumes from
the newest checkpoint that is not suspect, and a job that has had a checkpoint never trains
from scratch on its own: with none left it stops (``STOPPED_NO_CHECKPOINT``) unless the
operator allowed a fresh start.

A fault is handled by an escalation ladder whose first rung depends on the fault: rung 1
aborts the stuck ranks in place (they obey the SDK's abort order), rung 2 kills their nodes,
rung 3 tears the gang down. A silent rank cannot obey an order, so it starts at rung 2; a
node that already failed leaves a broken gang, so it starts at rung 3.

With restarts in place allowed (``restart.in_place_restarts``), a cheaper rung 0 comes first
when :func:`in_place_ok` says it may: the node agents restart the ranks in place (the ranks
that still run are aborted), the same gang re-rendezvouses and resumes from the checkpoint the
controller chose, and nothing is launched. When the restarted ranks do not report in within
``in_place_timeout_s``, or an agent exits, the ladder goes on with a full teardown.

Nothing here performs I/O or reads a clock: every function takes what it needs.
"""

from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping

from supervisor.health import Finding, Kind
from supervisor.model import WAIT_CANNOT_START, WAIT_CAPACITY, NodeState, NodeStatus
from supervisor.protocol import (
    EXIT_NONFINITE,
    EXIT_PREFLIGHT,
    EXIT_PREEMPTED,
    OUTCOME_FINISHED,
    OUTCOME_STOPPED,
    PHASE_DONE,
    PHASE_FAILED,
    RANK_EXITS,
    RESTART_PHASES,
    RESTORE_FAILED,
    RESTORE_FRESH,
    RESTORE_RESTORED,
    decode_refused,
)


class JobPhase(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    STOPPED_NO_PROGRESS = "stopped_no_progress"
    STOPPED_MAX_RESTARTS = "stopped_max_restarts"
    STOPPED_NO_CAPACITY = "stopped_no_capacity"
    STOPPED_NO_CHECKPOINT = "stopped_no_checkpoint"
    STOPPED_NONFINITE = "stopped_nonfinite"
    STOPPED_STARTUP_FAILURE = "stopped_startup_failure"
    STOPPED_OUT_OF_MEMORY = "stopped_out_of_memory"
    WAITING_FOR_CAPACITY = "waiting_for_capacity"
    REQUEUED = "requeued"
    CANCELLED = "cancelled"
    FAILED = "failed"


TERMINAL = frozenset({JobPhase.COMPLETED, JobPhase.STOPPED_NO_PROGRESS, JobPhase.STOPPED_MAX_RESTARTS,
                      JobPhase.STOPPED_NO_CAPACITY, JobPhase.STOPPED_NO_CHECKPOINT, JobPhase.STOPPED_NONFINITE,
                      JobPhase.STOPPED_STARTUP_FAILURE, JobPhase.STOPPED_OUT_OF_MEMORY, JobPhase.REQUEUED,
                      JobPhase.CANCELLED, JobPhase.FAILED})
# Ended on purpose (an operator's scancel or Ctrl-C, a planned requeue): never a failure page.
ON_PURPOSE = frozenset({JobPhase.REQUEUED, JobPhase.CANCELLED})
EXIT_CODES = {
    JobPhase.COMPLETED: 0,
    JobPhase.FAILED: 1,
    JobPhase.STOPPED_NO_PROGRESS: 3,
    JobPhase.STOPPED_MAX_RESTARTS: 4,
    JobPhase.STOPPED_NO_CAPACITY: 5,
    JobPhase.STOPPED_NO_CHECKPOINT: 6,
    JobPhase.STOPPED_NONFINITE: 7,
    JobPhase.STOPPED_STARTUP_FAILURE: 8,
    JobPhase.REQUEUED: 9,
    JobPhase.CANCELLED: 10,
    JobPhase.STOPPED_OUT_OF_MEMORY: 11,
}
RUNG_IN_PLACE, RUNG_ABORT, RUNG_KILL_NODE, RUNG_TEARDOWN = 0, 1, 2, 3

# Rank exit codes the SDK and the example use, and the fault kind of each (supervisor.protocol).
_EXIT_KINDS = RANK_EXITS
# Every fault kind a restart can carry (the label values of supervisor_restarts_total{reason}).
FAULT_KINDS = ("node_lost", "rank_killed", "rank_error", "rank_exit", *RANK_EXITS.values(), "stopped_early",
               "oom", "cannot_start", "node_rejected", "preflight_failed",
               *(k.value for k in Kind if k != Kind.NONFINITE))
# Faults no restart fixes: the job stops at once with the fault's own message (exit 8).
STOP_AT_ONCE = frozenset({"cannot_start", "preflight_failed"})
# Failures that repeat the same way before the first step are a broken job, not bad luck.
_STARTUP_KINDS = frozenset({"rank_error", "rank_exit", "crash"})
# Failures after a restore and before a step that may be the restored state's doing.
_LOAD_IMPLICATING = _STARTUP_KINDS | {"startup_stall", "hang", "collective_hang"}
# Faults whose ranks an agent can restart in place: a rank ended (or obeys an abort) on a node
# that is fine, or a silent rank whose process the platform can kill while its agent runs on
# (in_place_ok checks that). Not a preemption (the node is going away), not a node failure.
IN_PLACE_KINDS = frozenset({"rank_killed", "rank_error", "rank_exit", "crash", "nonfinite", "hang",
                            "collective_hang", "data_stall", "checkpoint_stall", "stopped_early", "dead"})


@dataclass(frozen=True)
class Fault:
    kind: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    detail: str
    rung: int
    node_failure: bool
    fault_at: float
    secondary: bool = False
    """Every failed rank said a peer broke it: the culprit has probably not shown up yet."""
    step: int | None = None
    """The culprit rank's step when it failed (its last heartbeat), where known."""
    exclude_now: bool = False
    """The machine itself refused the node (``NodeStatus.bad_host``): exclude it at once."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "ranks": list(self.ranks), "nodes": list(self.nodes), "detail": self.detail,
                "rung": self.rung, "node_failure": self.node_failure}


def completed(nodes: Mapping[str, NodeStatus], outcomes: Mapping[int, str], world_size: int, *,
              waited_s: float = 0.0, grace_s: float = 0.0) -> bool:
    """Whether the job finished its work: never on a guess, never on an early stop.

    ``outcomes`` holds the last word of every rank heard from (:data:`~supervisor.protocol.
    OUTCOMES`; "" for one that has not closed its SDK). Completed when no agent runs, none
    failed, no rank stopped early, and every rank of the world said its training finished,
    with every agent exited 0 (or, adopted, exit codes unknown). Whatever order the agents'
    exits and the ranks' last heartbeats arrive in, the answer is the same once both are in:
    ranks done but agents running is "not yet"; an agent that failed is a fault.

    Two allowances: a command that never started the SDK (no rank heard: the agents' exit 0
    is all there is), and a last heartbeat lost on the way (UDP) once every agent exited 0:
    after ``grace_s`` (``waited_s`` since the last agent ended) the agents' word is taken.
    """
    if not nodes or any(n.state == NodeState.RUNNING for n in nodes.values()):
        return False
    if any(n.state == NodeState.EXITED and n.exit_code != 0 for n in nodes.values()):
        return False
    if any(o == OUTCOME_STOPPED for o in outcomes.values()):
        return False
    every_rank_finished = (world_size > 0 and len(outcomes) == world_size
                           and all(o == OUTCOME_FINISHED for o in outcomes.values()))
    if all(n.state == NodeState.EXITED for n in nodes.values()):  # every agent exited 0
        return every_rank_finished or not outcomes or waited_s >= grace_s
    return every_rank_finished


def stopped_early(nodes: Mapping[str, NodeStatus], stopped: Mapping[int, str], rank_nodes: Mapping[int, str],
                  nonfinite: Iterable[int], steps: Mapping[int, int], now: float) -> "Fault | None":
    """The gang ended (no agent runs) with every agent content but some rank's training stopped
    early (its SDK said so: a non-finite loss, a stop request): not completion, and not nothing
    either; a fault the ladder restarts from the newest verified checkpoint."""
    if not stopped or not nodes or any(n.state == NodeState.RUNNING for n in nodes.values()):
        return None
    bad = sorted(set(nonfinite))
    if bad:
        r = bad[0]
        return Fault("nonfinite", (r,), (rank_nodes.get(r, ""),), f"rank {r}: non-finite loss at step "
                     f"{steps.get(r, '?')}", RUNG_TEARDOWN, False, now, step=steps.get(r))
    r = min(stopped)
    return Fault("stopped_early", tuple(sorted(stopped)), tuple(sorted({rank_nodes.get(x, "") for x in stopped} - {""})),
                 f"rank {r} stopped before its training finished: {stopped[r] or 'no reason given'}"[:400],
                 RUNG_TEARDOWN, False, now, step=steps.get(r))


_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def name_rank_failure(rank: int, code: int, error: str, step: int | None) -> tuple[str, str]:
    """(kind, detail) of one rank's end, from its own exit code or signal and last words."""
    at = f" at step {step}" if step is not None and step >= 0 else ""
    if code < 0:
        sig = _SIGNALS.get(-code, "")
        return "rank_killed", f"rank {rank} killed by signal {-code}{f' ({sig})' if sig else ''}{at}"
    if code == EXIT_NONFINITE:
        return _EXIT_KINDS[code], f"rank {rank}: non-finite loss{at}"
    if code == EXIT_PREEMPTED:
        return _EXIT_KINDS[code], f"rank {rank} stopped on SIGTERM (exit {code}){at}"
    if code in _EXIT_KINDS:
        return _EXIT_KINDS[code], f"rank {rank} crashed (exit {code}){at}" + (f": {error}" if error else "")
    if error:
        return "rank_error", f"rank {rank} crashed{at}: {error}"
    return "rank_exit", f"rank {rank} exited with code {code}{at}"


def classify(
    nodes: Mapping[str, NodeStatus],
    findings: Iterable[Finding],
    *,
    now: float,
    last_heard: Mapping[int, float],
    phase_started: Mapping[int, float],
    rank_nodes: Mapping[int, str],
    done_ranks: frozenset[int] | set[int] = frozenset(),
    failed_ranks: Mapping[int, bool] | None = None,
    failed_errors: Mapping[int, str] | None = None,
    rank_steps: Mapping[int, int] | None = None,
    nonfinite_ranks: Iterable[int] = (),
    stopped_ranks: Mapping[int, str] | None = None,
) -> Fault | None:
    """The fault to act on now, if any. Node failures win over findings (the gang is broken).

    A node that vanished without an exit code (an adopted agent: not our child) is a fault
    unless all its ranks said they were done; it does not count toward excluding the node,
    since its cause is unknown. A node killed by a signal we did not send does.

    ``failed_ranks`` maps the ranks that reported their own end (phase ``failed``) to whether
    a peer caused it; ``failed_errors`` holds their messages for the fault's detail. A fault
    whose failed ranks all lost a peer is ``secondary``: the caller may wait for the culprit
    to show, either as its node's exit or as a silent rank (a dead or frozen node), which
    then wins.

    A failed node's fault is named from what its culprit rank itself said (the agent's
    account of its exit code or signal, the rank's last error line, its last heartbeat):
    "rank 1 killed by signal 9 at step 60", "rank 0: non-finite loss at step 9", "rank 2
    crashed: ModuleNotFoundError: ...", not from torchrun's own exit code (1 for anything).
    """
    failed = failed_ranks or {}
    steps = rank_steps or {}
    nonfinite = set(nonfinite_ranks)
    for name, n in sorted(nodes.items()):
        if n.waiting == WAIT_CANNOT_START and not n.killed_by_us:
            # its container never starts as specified: no restart fixes that (the platform's message)
            ranks = tuple(sorted(r for r, node in rank_nodes.items() if node == name))
            return Fault("cannot_start", ranks, (name,), f"node {name}: {n.detail or n.reason or 'cannot start'}",
                         RUNG_TEARDOWN, False, now)
    candidates = []
    for name, n in sorted(nodes.items()):
        if n.killed_by_us or n.state == NodeState.RUNNING:
            continue
        if n.state == NodeState.EXITED and n.exit_code == 0:
            continue  # finished; completion is decided when all have
        ranks = tuple(sorted(r for r, node in rank_nodes.items() if node == name))
        if n.state == NodeState.LOST and ranks and all(r in done_ranks for r in ranks):
            continue  # an adopted agent that finished its work
        # The culprit first: a node killed by a signal, or with a rank that died without a
        # word; then one whose rank failed on its own error; last, one whose ranks all lost a
        # peer (when one rank is killed, the others fail "connection reset by peer" at once,
        # and their agent may exit first).
        reported = [r for r in ranks if r in failed]
        if (n.exit_code is not None and n.exit_code < 0) or not ranks or len(reported) < len(ranks):
            order = 0
        elif not all(failed[r] for r in reported):
            order = 1
        else:
            order = 2
        candidates.append((order, name, n, ranks))
    # A rank that said it failed and then went quiet is not a silent culprit: it is gone, and
    # its node's exit (or its peers') says so.
    findings = [f for f in findings if f.kind != Kind.NONFINITE  # the job stops itself on NaN
                and not (f.kind == Kind.DEAD and all(r in failed for r in f.ranks))]
    if candidates:
        order, name, n, ranks = min(candidates, key=lambda c: (c[0], c[1]))
        silent_culprits = [f for f in findings if f.kind in (Kind.DEAD, Kind.NOT_STARTED)]
        if order < 2 or not silent_culprits:
            errors = "; ".join(f"rank {r}: {failed_errors.get(r, '')}"[:240] for r in ranks if r in failed) \
                if failed_errors else ""
            suffix = f" ({errors})" if errors else ""
            if n.state == NodeState.LOST and n.bad_host:
                # the machine refused it (its kubelet's admission): the machine's fault, at once
                return Fault("node_rejected", ranks, (name,), f"node {name}: {n.detail or n.reason}",
                             RUNG_TEARDOWN, True, now, exclude_now=True)
            if n.state == NodeState.LOST:
                what = n.detail or "vanished (exit code unknown)"  # the platform's account, when it has one
                return Fault("node_lost", ranks, (name,), f"node {name}: {what}{suffix}",
                             RUNG_TEARDOWN, False, now, secondary=order == 2)
            if n.out_of_memory:
                # killed for its memory limit: the rank's doing (a memory bug, a batch too big),
                # never the machine's; the rank the agent names, else the node's ranks
                root = next((f for f in n.failures if f.root_cause), n.failures[0] if n.failures else None)
                culprits = (root.rank,) if root is not None else ranks
                step = next((steps[r] for r in culprits if r in steps), None)
                who = f"rank {culprits[0]}" if len(culprits) == 1 else \
                    f"ranks {', '.join(map(str, culprits))}" if culprits else f"node {name}"
                at = f" at step {step}" if step is not None else ""
                return Fault("oom", culprits, (name,), f"{who} out of memory{at} ({n.detail or n.reason})",
                             RUNG_TEARDOWN, False, now, step=step)
            if n.exit_code is not None and n.exit_code < 0:
                return Fault("node_lost", ranks, (name,), f"node {name} killed by signal {-n.exit_code}",
                             RUNG_TEARDOWN, True, now)
            if n.exit_code == EXIT_PREFLIGHT and not n.failures:
                # its agent checked the command where the ranks run and refused it before starting
                # any (supervisor.preflight): the check's own line, and no restart fixes that
                said = n.output_error or f"its check of the command failed (exit code {n.exit_code})"
                return Fault("preflight_failed", ranks, (name,), f"node {name}: {said}", RUNG_TEARDOWN, False, now)
            root = next((f for f in n.failures if f.root_cause), n.failures[0] if n.failures else None)
            if root is not None:
                error = (failed_errors or {}).get(root.rank) or root.error
                kind, detail = name_rank_failure(root.rank, root.exit_code, error, steps.get(root.rank))
                culprits = (root.rank,)
            else:
                culprits = ranks
                kind = _EXIT_KINDS.get(n.exit_code or 0, "rank_exit")
                own = f": {n.output_error}" if n.output_error else ""
                detail = f"node {name}: exited with code {n.exit_code}{own}{suffix}" if own or suffix or not ranks \
                    else f"node {name}: a rank exited with code {n.exit_code}"
            kind, detail, culprits = _own_nonfinite(kind, detail, culprits, nonfinite, steps)
            step = next((steps[r] for r in culprits if r in steps), None)
            return Fault(kind, culprits, (name,), detail, RUNG_TEARDOWN, False, now, secondary=order == 2, step=step)
        # only peers of the culprit have failed, and the culprit is a silent rank (its whole
        # node died or froze, so no agent exit tells of it): name it
        findings = silent_culprits
    if not findings:
        # every agent ended content, yet a rank's training stopped early: say so (never a silent
        # nothing: the controller would wait forever for a completion that cannot come)
        return stopped_early(nodes, stopped_ranks or {}, rank_nodes, nonfinite, steps, now)
    # Prefer named culprits; among them, the silent ones (they cannot be aborted).
    order = {Kind.DEAD: 0, Kind.NOT_STARTED: 1, Kind.COLLECTIVE_HANG: 2, Kind.HANG: 3, Kind.DATA_STALL: 4,
             Kind.CHECKPOINT_STALL: 5, Kind.STARTUP_STALL: 6}
    f = min(findings, key=lambda x: (not x.culprit, order.get(x.kind, 9)))
    silent = f.kind in (Kind.DEAD, Kind.NOT_STARTED)
    stopped_nodes = {name for name in f.nodes if nodes.get(name) and nodes[name].stopped}
    if silent:
        fault_at = min((last_heard.get(r, now) for r in f.ranks), default=now)
    else:
        fault_at = min((phase_started.get(r, now) for r in f.ranks), default=now)
    return Fault(
        kind=f.kind.value, ranks=f.ranks, nodes=f.nodes or tuple(sorted({rank_nodes.get(r, "") for r in f.ranks} - {""})),
        detail=f.detail, rung=RUNG_KILL_NODE if silent else RUNG_ABORT,
        node_failure=bool(stopped_nodes) and stopped_nodes == set(f.nodes), fault_at=fault_at,
    )


def _own_nonfinite(kind: str, detail: str, culprits: tuple[int, ...], nonfinite: Iterable[int],
                   steps: Mapping[int, int]) -> tuple[str, str, tuple[int, ...]]:
    """Every rank stops on an agreed non-finite loss: name the rank whose own loss was not finite
    (its heartbeat says so), wherever its node is, rather than the first rank that exited."""
    bad = min(nonfinite, default=None)
    if bad is None or kind not in ("nonfinite", "rank_exit", "rank_error", "crash"):
        return kind, detail, culprits
    return "nonfinite", f"rank {bad}: non-finite loss at step {steps.get(bad, '?')}", (bad,)


def rank_ended(
    nodes: Mapping[str, NodeStatus],
    *,
    now: float,
    rank_pids: Mapping[int, int],
    rank_nodes: Mapping[int, str],
    done_ranks: frozenset[int] | set[int] = frozenset(),
    failed_ranks: Mapping[int, bool] | None = None,
    failed_errors: Mapping[int, str] | None = None,
    rank_steps: Mapping[int, int] | None = None,
    nonfinite_ranks: Iterable[int] = (),
) -> Fault | None:
    """The fault when a rank of the running gang ended in failure and its agent told how
    (``NodeStatus.exit_codes``), for agents that may not restart in place: such an agent exits
    because of it, and :func:`classify` would name the same fault from that exit ~1 s later
    (the agent first stops its other ranks, closes its rendezvous and ends its interpreter).

    Taken early only when it is named exactly as :func:`classify` would name it then: a rank
    killed by a signal (it has no last words to wait for), or a rank that exited with a failure
    code after its own last heartbeat said why (``failed_ranks`` False for it: its own error, not
    a peer's). Not taken early (None; the agents' exits tell, as before): a failure code whose
    last words have not arrived (yet, or ever: UDP); a rank that finished (status 0, or it said it
    was done); a rank stopped on SIGTERM for a preemption (``EXIT_PREEMPTED``: the gang may still
    be writing its emergency checkpoint); a rank that said a peer broke it; a process that is no
    rank of this gang (``rank_pids``, from the heartbeats: an earlier generation's); anything
    while a node has ended or vanished on its own (node failures are :func:`classify`'s: they win).
    Among several, the culprit is one killed by a signal, then one that exited with a failure,
    last one SIGTERMed (what an agent stopping its other ranks sends); the earliest of a kind."""
    failed = failed_ranks or {}
    steps = rank_steps or {}
    if any(n.state != NodeState.RUNNING and not n.killed_by_us for n in nodes.values()):
        return None
    by_pid = {pid: r for r, pid in rank_pids.items() if pid}
    ended = []
    for name, n in sorted(nodes.items()):
        if n.killed_by_us:
            continue
        for pid, code, at in n.exit_codes:
            rank = by_pid.get(pid)
            if rank is None or code in (0, EXIT_PREEMPTED) or rank in done_ranks:
                continue
            if code > 0 and failed.get(rank, True):
                continue  # a peer's victim, or its own last words are not in
            ended.append((2 if code == -signal.SIGTERM else 0 if code < 0 else 1, at, rank, code, name))
    if not ended:
        return None
    _, _, rank, code, name = min(ended)
    kind, detail = name_rank_failure(rank, code, (failed_errors or {}).get(rank, ""), steps.get(rank))
    kind, detail, culprits = _own_nonfinite(kind, detail, (rank,), nonfinite_ranks, steps)
    return Fault(kind, culprits, (rank_nodes.get(culprits[0], name),), detail, RUNG_TEARDOWN, False, now,
                 step=next((steps[r] for r in culprits if r in steps), None))


@dataclass(frozen=True)
class CapacityWait:
    """The cluster cannot place part of the gang yet: wait (not a fault, not an attempt)."""

    waiting: tuple[str, ...]
    placed: tuple[str, ...]
    message: str
    """The platform's account of the first waiting node (the scheduler's message, quoted)."""


@dataclass(frozen=True)
class Shrink:
    """Relaunch the elastic gang at the size the cluster could place (not a fault)."""

    nodes: tuple[str, ...]
    reason: str


def capacity(nodes: Mapping[str, NodeStatus], *, waited_s: float, wait_limit_s: float, shrink_after_s: float,
             nodes_min: int, nodes_max: int, nproc_per_node: int = 1, world_sizes: Iterable[int] = (),
             world_size_multiple_of: int = 1) -> "CapacityWait | Shrink | Stop | None":
    """What to do about a gang the cluster cannot place (``NodeStatus.waiting`` is
    :data:`WAIT_CAPACITY` for some node), ``waited_s`` after it first could not: None when every
    node is placed; wait; past ``shrink_after_s``, an elastic job (``nodes_min < nodes_max``)
    relaunches at the largest size among the nodes that were placed (in launch order) whose world
    size the job accepts; past ``wait_limit_s`` the job stops (STOPPED_NO_CAPACITY), quoting why."""
    waiting = tuple(n for n, st in nodes.items() if st.state == NodeState.RUNNING and st.waiting == WAIT_CAPACITY)
    if not waiting:
        return None
    placed = tuple(n for n, st in nodes.items() if n not in waiting and st.state == NodeState.RUNNING)
    first = nodes[waiting[0]]
    message = first.detail or first.reason or "the cluster cannot place it"
    if waited_s >= wait_limit_s:
        return Stop(JobPhase.STOPPED_NO_CAPACITY,
                    f"the cluster could not place {len(waiting)} of {len(nodes)} pods in {wait_limit_s:g} s "
                    f"(restart.capacity_wait_s): {message}"[:1000])
    if nodes_min < nodes_max and waited_s >= shrink_after_s:
        size = gang_size(len(placed), nodes_min, nodes_max, nproc_per_node, world_sizes, world_size_multiple_of)
        if size is not None and size < len(nodes):
            return Shrink(placed[:size], f"{len(waiting)} of {len(nodes)} pods could not be placed in "
                                         f"{shrink_after_s:g} s (restart.shrink_after_s): {message}"[:1000])
    return CapacityWait(waiting, placed, message)


def grow(current: Iterable[str], returned: Iterable[str], *, excluded: Iterable[str] = (), nodes_min: int,
         nodes_max: int, nproc_per_node: int = 1, world_sizes: Iterable[int] = (),
         world_size_multiple_of: int = 1) -> tuple[str, ...] | None:
    """The larger gang to relaunch as when slots the cluster could not place earlier have room
    again (``returned``): the running nodes first, then the returned ones, at the largest size
    the job accepts; None when that is no larger than the running gang."""
    now = list(current)
    bad = set(excluded)
    pool = now + [s for s in returned if s not in now and s not in bad]
    size = gang_size(len(pool), nodes_min, nodes_max, nproc_per_node, world_sizes, world_size_multiple_of)
    if size is None or size <= len(now):
        return None
    return tuple(pool[:size])


def requeued(nodes: Mapping[str, NodeStatus]) -> NodeStatus | None:
    """The node whose platform says the cluster's gang admission took the gang back
    (``NodeStatus.requeued``: a queue's preemption), if any, first by name: the gang is then
    relaunched to wait for readmission, not recovered from a fault (no restart counted)."""
    return next((n for _, n in sorted(nodes.items()) if n.requeued and n.state != NodeState.RUNNING), None)


ACTION_ABORT, ACTION_KILL_NODE, ACTION_TEAR_DOWN = "abort_ranks", "kill_node", "tear_down"


@dataclass(frozen=True)
class Rung:
    """One rung of the escalation ladder, as the controller carries it out (its ``action`` event)."""

    action: str
    """:data:`ACTION_ABORT` (an abort order to each rank), :data:`ACTION_KILL_NODE` (the
    platform kills each node), :data:`ACTION_TEAR_DOWN` (the whole gang)."""
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    wait_s: float = 0.0
    """How long the nodes get to exit after the action. When they do, the cheaper rung worked:
    the rungs left before the teardown are skipped (:func:`rung_worked`)."""


def rung_worked(rung: Rung, nodes: Mapping[str, NodeStatus], rank_pids: Mapping[int, int]) -> bool:
    """Whether ``rung``'s action took: every node it acted on is no longer running, or, where
    the platform sees rank processes end (``NodeStatus.exited_pids``), every rank it aborted has
    ended (its agent's own exit follows ~1 s later, and the teardown ends it anyway)."""
    if all(nodes.get(n) is None or nodes[n].state != NodeState.RUNNING for n in rung.nodes):
        return True
    pids = {rank_pids.get(r) for r in rung.ranks}
    ended = {pid for st in nodes.values() for pid in st.exited_pids}
    return bool(rung.ranks) and None not in pids and pids <= ended


def ladder(fault: Fault, *, abort_grace_s: float) -> tuple[Rung, ...]:
    """The escalation ladder of a fault that is not restarted in place, from the fault's own rung.

    Rung 1 orders the culprits to abort (the SDK dumps their stacks and kills the rank) and gives
    their nodes ``abort_grace_s`` to exit; rung 2 kills the culprits' nodes (a silent rank cannot
    obey an order, and a rank that did not die on its abort is not trusted to); rung 3 tears the
    gang down, always last: a gang that lost a rank cannot go on. A fault of rung 0 (the agents
    have begun restarting in place, but the controller declined that path) goes to the teardown
    at once: its culprits' processes have already ended.
    """
    steps: list[Rung] = []
    if fault.rung == RUNG_ABORT:
        steps.append(Rung(ACTION_ABORT, ranks=fault.ranks, nodes=fault.nodes, wait_s=abort_grace_s))
    if fault.rung in (RUNG_ABORT, RUNG_KILL_NODE) and fault.nodes:
        steps.append(Rung(ACTION_KILL_NODE, nodes=fault.nodes))
    steps.append(Rung(ACTION_TEAR_DOWN))
    return tuple(steps)


def evidence_awaited(fault: Fault, asked: Mapping[int, tuple[str, float]], *, now: float,
                     fresh_s: float) -> frozenset[int]:
    """The ranks whose stack dumps the evidence waits for, out of those asked for one
    (``asked``: each rank's last phase and when it was last heard from).

    Not a rank that cannot answer: the fault's culprits unless the fault starts at rung 1 (at
    rung 0 their processes ended under their agents; at rungs 2 and 3 they are silent, killed or
    exited, or their node is lost), a rank that has ended (its
    last phase ``done`` or ``failed``), or one not heard from within ``fresh_s`` (its heartbeats
    stopped: a frozen or dying process). A stuck culprit of rung 1 is waited for: its stacks are
    the evidence that matters most. The wait is still capped by the caller: an answer lost on
    the way costs that cap, never the evidence.
    """
    gone = set(fault.ranks) if fault.rung != RUNG_ABORT else set()
    return frozenset(r for r, (phase, heard) in asked.items()
                     if r not in gone and phase not in (PHASE_DONE, PHASE_FAILED) and now - heard <= fresh_s)


def restarted_in_place(
    nodes: Mapping[str, NodeStatus],
    *,
    now: float,
    rank_pids: Mapping[int, int],
    rank_nodes: Mapping[int, str],
    ahead_attempt: int | None = None,
    done_ranks: frozenset[int] | set[int] = frozenset(),
    failed_ranks: Mapping[int, bool] | None = None,
    failed_errors: Mapping[int, str] | None = None,
    nonfinite_ranks: Iterable[int] = (),
    rank_steps: Mapping[int, int] | None = None,
) -> Fault | None:
    """The fault when node agents have begun to restart this attempt's ranks in place: a rank
    process of a running agent ended (``NodeStatus.exited_pids``, matched to ranks by the pid
    their heartbeats carry), or ranks of a later attempt already report in (``ahead_attempt``;
    a platform that cannot see processes). None when neither.

    The culprit is a rank that ended on its own (not one that only lost a peer); it is named
    from what it said (its error, a non-finite loss), else as a rank that exited. A rank that
    said it was done (``done_ranks``) and then exited has simply finished."""
    failed = failed_ranks or {}
    errors = failed_errors or {}
    steps = rank_steps or {}
    by_pid = {pid: r for r, pid in rank_pids.items() if pid}
    exited = sorted({by_pid[pid] for n in nodes.values() if n.state == NodeState.RUNNING
                     for pid in n.exited_pids if pid in by_pid} - set(done_ranks))
    if not exited and ahead_attempt is None:
        return None
    own = [r for r in exited if not failed.get(r, False)] or exited or \
        sorted(r for r, peer in failed.items() if not peer)
    culprits = tuple(own)
    where = tuple(sorted({rank_nodes[r] for r in culprits if r in rank_nodes}))
    how = "its node's agent restarts the gang in place" if exited else \
        f"the agents restarted the gang in place (ranks of attempt {ahead_attempt} report in)"
    bad = sorted(set(nonfinite_ranks))
    step = next((steps[r] for r in culprits if r in steps), None)
    at = f" at step {step}" if step is not None else ""
    if bad:
        r = bad[0]
        return Fault("nonfinite", (r,), (rank_nodes.get(r, ""),), f"rank {r}: non-finite loss{at}; {how}",
                     RUNG_IN_PLACE, False, now, step=steps.get(r))
    said = [r for r in culprits if errors.get(r) and not failed.get(r, False)]
    if said:
        r = said[0]
        return Fault("rank_error", culprits, where, f"rank {r} crashed{at}: {errors[r]}; {how}"[:600],
                     RUNG_IN_PLACE, False, now, step=step)
    who = f"rank {', '.join(map(str, culprits))}" if culprits else "a rank"
    return Fault("rank_exit", culprits, where, f"{who} exited{at}; {how}", RUNG_IN_PLACE, False, now, step=step)


def in_place_ok(
    *,
    fault: Fault,
    decision: "Relaunch | Stop",
    nodes: Mapping[str, NodeStatus],
    previous_nodes: Iterable[str],
    allowed: int,
    used: int,
    skip_steps: Iterable[int],
    last_failed: bool = False,
    kills_ranks: bool = False,
) -> str:
    """Why the ranks may *not* be restarted in place for ``fault`` ("" when they may).

    ``decision`` is what a full restart would do (:func:`plan_next` on a copy of the history):
    in place means the same nodes, so it is only taken when that decision keeps every node, excludes
    none and skips no new batch. ``allowed``: restarts in place the agents allow per launch
    (their ``--max-restarts``); ``used``: taken since this launch; ``last_failed``: the last one
    did not come back in time (the gang is torn down this time); ``kills_ranks``: the platform
    can kill one rank process and leave its agent running, so a silent rank (a stopped or wedged
    process, its node's agent healthy) can be killed and restarted in place too."""
    if allowed <= 0:
        return "restarts in place are off (restart.in_place_restarts: 0)"
    if used >= allowed:
        return f"the agents' {allowed} restarts in place of this launch are spent"
    if last_failed:
        return "the last restart in place did not come back in time"
    if fault.rung == RUNG_KILL_NODE and not kills_ranks:
        return "a silent rank cannot be restarted in place here (the platform cannot kill one rank process)"
    if fault.node_failure or fault.kind not in IN_PLACE_KINDS:
        return f"a {fault.kind} fault{' (a node failure)' if fault.node_failure else ''} needs a new gang"
    if not isinstance(decision, Relaunch):
        return f"the job stops: {decision.reason}"
    bad = sorted(n for n, st in nodes.items() if st.state != NodeState.RUNNING or st.stopped)
    if bad or not nodes:
        return f"node agents not running: {', '.join(bad) or 'none known'}"
    if tuple(decision.nodes) != tuple(previous_nodes):
        return f"the next gang differs ({', '.join(decision.nodes)})"
    if decision.newly_excluded:
        return f"nodes excluded: {', '.join(decision.newly_excluded)}"
    if tuple(decision.skip_steps) != tuple(skip_steps):
        return "a batch is to be skipped (the ranks learn it only at a new launch)"
    return ""


@dataclass(frozen=True)
class Relaunch:
    nodes: tuple[str, ...]
    restore_from: str | None
    exclude_checkpoints: tuple[str, ...]
    newly_excluded: tuple[str, ...] = ()
    require_checkpoint: bool = False
    """The ranks must restore a checkpoint (the job has had one): none that verifies is an
    error on the ranks, never a silent fresh start."""
    skip_steps: tuple[int, ...] = ()
    """Steps whose batch the ranks skip (a non-finite loss there twice, skipping allowed)."""


@dataclass(frozen=True)
class Stop:
    phase: JobPhase
    reason: str


@dataclass(frozen=True)
class History:
    """What the progress guard, node exclusion and checkpoint choice remember across the
    attempts of one run (a new run after a finished one starts a new history). A value: the
    decisions return a new one (lists given are kept as tuples, mappings as copies)."""

    restarts: int = 0
    attempts_without_progress: int = 0
    node_failures: Mapping[str, int] = field(default_factory=dict)
    excluded: tuple[str, ...] = ()
    suspects: tuple[str, ...] = ()
    suspect_why: Mapping[str, str] = field(default_factory=dict)
    no_step_after: Mapping[str, int] = field(default_factory=dict)
    """Per checkpoint: attempts that restored it and then completed no step (ranks' reports)."""
    had_checkpoint: bool = False
    """A complete checkpoint existed in this run: training from scratch would lose progress."""
    nonfinite_steps: tuple[int, ...] = ()
    """Steps at which a rank reported a non-finite loss, one entry per attempt it happened in."""
    skip_steps: tuple[int, ...] = ()
    startup_failure: str = ""
    """The last attempt's failure if it came before any step (else ""): the same one twice stops."""
    oom_at: tuple[str, ...] = ()
    """``RANK@STEP`` of every out-of-memory kill: the same rank at the same step again stops."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
            elif isinstance(v, dict):
                object.__setattr__(self, f.name, dict(v))


class _Draft:
    """:func:`plan_next`'s working copy of a :class:`History` (lists and dicts it may change),
    frozen again into the history it returns."""

    def __init__(self, h: History) -> None:
        for f in fields(h):
            v = getattr(h, f.name)
            setattr(self, f.name, list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping) else v)

    def freeze(self) -> History:
        return History(**{f.name: getattr(self, f.name) for f in fields(History)})


@dataclass(frozen=True)
class RestoreReport:
    """What the ranks of one attempt said about their restore (from their heartbeats)."""

    state: str = ""
    """``restored``, ``fresh``, ``failed`` (some rank), or "" when no rank has said yet."""
    restored: str | None = None
    refused: tuple[tuple[str, str], ...] = ()
    """(checkpoint, reason) the ranks refused while verifying or loading, newest first."""
    stepped: bool = False
    """Some rank completed a step after its restore (the SDK says so the moment it happens)."""
    ranks_reported: int = 0
    root: str = ""
    roots: tuple[str, ...] = ()
    """Every checkpoint root the ranks reported (more than one is a misconfiguration)."""


def parse_skipped(refused: Any) -> list[tuple[str, str]]:
    """The ``(name, reason)`` pairs of a heartbeat's ``restore_refused`` (an older SDK's string too)."""
    return list(decode_refused(refused))


def restore_report(heartbeats: Iterable[Any]) -> RestoreReport:
    """Fold the ranks' latest heartbeats (``restore_state``, ``restored``, ``restore_refused``,
    ``steps_done``, ``ckpt_root``) into one report. Checkpoints excluded by the supervisor's
    own order are not refusals (the ranks do not list them)."""
    states, restored, refused, roots = set(), set(), {}, set()
    stepped, n = False, 0
    for hb in heartbeats:
        if hb.ckpt_root:
            roots.add(hb.ckpt_root)
        if hb.steps_done > 0:
            stepped = True
        if not hb.restore_state:
            continue
        n += 1
        states.add(hb.restore_state)
        if hb.restored:
            restored.add(hb.restored)
        for name, why in parse_skipped(hb.restore_refused):
            refused.setdefault(name, why)
    state = RESTORE_FAILED if RESTORE_FAILED in states else RESTORE_RESTORED if RESTORE_RESTORED in states else \
        RESTORE_FRESH if RESTORE_FRESH in states else ""
    return RestoreReport(
        state=state, restored=max(restored) if restored else None,  # every rank loads the same one
        refused=tuple(sorted(refused.items(), reverse=True)), stepped=stepped, ranks_reported=n,
        root=next(iter(roots)) if len(roots) == 1 else "", roots=tuple(sorted(roots)),
    )


def note_refusals(history: History, report: RestoreReport) -> tuple[History, list[tuple[str, str]]]:
    """Checkpoints the ranks refused become suspect now: the history after that, and the newly
    suspect ones."""
    newly = [(name, f"the ranks refused it: {why}") for name, why in dict(report.refused).items()
             if name not in history.suspects]
    if not newly:
        return history, []
    return replace(history, suspects=(*history.suspects, *(n for n, _ in newly)),
                   suspect_why={**history.suspect_why, **dict(newly)}), newly


def root_verdict(watched: str, report: RestoreReport) -> tuple[str, str]:
    """Whether the supervisor watches the checkpoint root the ranks write.

    ``("ok", "")``; ``("adopt", root)`` when every rank reported the same other root (the
    ranks are the ones writing: progress is judged there); ``("conflict", why)`` when ranks
    report different roots. Ranks that never reported one (no checkpointing) say nothing.
    """
    if not report.roots or report.roots == (watched,):
        return "ok", ""
    if len(report.roots) == 1:
        return "adopt", report.roots[0]
    return "conflict", f"the ranks save checkpoints to different roots: {', '.join(report.roots)}"


def next_attempt(attempt: int, launch_attempt: int, in_place_allowed: int) -> int:
    """The attempt number of the next launch: every message and process of the next gang carries
    it, above this attempt's and above any the running agents (launched as ``launch_attempt``,
    allowed ``in_place_allowed`` restarts in place) could still give a rank they restart."""
    return max(attempt + 1, launch_attempt + in_place_allowed + 1)


RELAY_MIN_FLUSH_S = 0.05


def relay_flush_s(interval_s: float, timeout_s: float) -> float | None:
    """How often a node's relay sends its ranks' heartbeats up (None: no relay). A heartbeat waits
    in the relay up to this long, so the controller can see a live rank silent for an interval plus
    this: once an interval while that leaves half the timeout's slack past the interval, sooner
    where the timeout is tighter (at 2 x the interval, the least the config allows: half an
    interval), never more often than every :data:`RELAY_MIN_FLUSH_S`: where the timeout leaves no
    room for that, every rank sends its own heartbeats."""
    flush = min(interval_s, (timeout_s - interval_s) / 2)
    return round(flush, 3) if flush >= RELAY_MIN_FLUSH_S else None


SCALE_RANKS = 16_384
"""Up to this many ranks the reads over every rank run at their base cadence; beyond, their
period grows with the gang (their cost grows with it, what they are for does not)."""
PROGRESS_EVERY_RANKS = 131_072
"""A gang this large reads its slowest rank's step, its oldest save and its losses once a second."""
METRICS_EVERY_RANKS = 32_768
"""A gang this large has its ``/metrics`` rendered at most once a second (:func:`metrics_every_s`)."""
METRICS_CPU_SHARE = 0.02
"""A large gang's ``/metrics`` renderings take at most this share of a core (:func:`metrics_every_s`)."""
METRICS_MAX_AGE_S = 15.0
"""No rendering is served older than this (a common Prometheus scrape interval), whatever it cost."""
CALIBRATION_RANKS = 4_096
"""The step-time median that calibrates the phase timeouts is taken over the step times of about
this many ranks at most (a systematic sample of a larger gang: every k-th rank)."""


def calibration_every_s(base_s: float, world_size: int) -> float:
    """How often the step-time statistics (the phase timeouts, the straggler scores) are
    recomputed: every ``base_s`` up to :data:`SCALE_RANKS` ranks, then in proportion to the gang
    (16 s at 131,072 ranks and a 2 s base: the scores sort every rank's work times)."""
    return max(base_s, base_s * world_size / SCALE_RANKS)


def progress_every_s(world_size: int) -> float:
    """How often the gang-wide progress reads run (the slowest rank's step for the step rate and a
    release's probation, every rank's newest save, every rank's loss): on every look of a gang of
    up to ~26,000 ranks (under the 0.2 s tick), then in proportion (1 s at 131,072)."""
    return world_size / PROGRESS_EVERY_RANKS


def metrics_every_s(world_size: int, render_cpu_s: float = 0.0) -> float:
    """How long a ``/metrics`` rendering serves the scrapes that follow while the job's phase and
    attempt stay the same: its per-rank aggregates read every rank (~0.1-0.15 s of CPU at 131,072
    ranks, the records scattered in memory). 0 (every scrape renders) up to 16,384 ranks; beyond,
    in proportion to the gang (4 s at 131,072) and at least long enough that renderings costing
    ``render_cpu_s`` each take no more than :data:`METRICS_CPU_SHARE` of a core (7 s for 0.14 s),
    at most :data:`METRICS_MAX_AGE_S`."""
    if world_size <= SCALE_RANKS:
        return 0.0
    return min(METRICS_MAX_AGE_S, max(world_size / METRICS_EVERY_RANKS, render_cpu_s / METRICS_CPU_SHARE))


def calibration_stride(ranks: int) -> int:
    """Every how many ranks, by rank number, the calibration reads step times (1: all). Odd, so that
    the sample goes through every local rank of nodes of 2, 4, 8, ... ranks (an even stride would
    read the same one on every node: if it were systematically faster, the timeouts would be
    too short)."""
    stride = -(-ranks // CALIBRATION_RANKS)
    return stride | 1 if stride > 1 else 1


def rendezvous_backend(configured: str, nodes: int, *, static_from: int, in_place_restarts: int = 0) -> str:
    """How the agents of a launch of ``nodes`` nodes form the gang: ``c10d`` or ``static``.

    ``auto`` takes the static rendezvous from ``static_from`` nodes up: the controller already chose
    the nodes and their order, so it hands out the node ranks and no agent has to win a join
    (c10d's joins are compare-and-set rounds on one store: they contend, and the store saturates
    from a few thousand agents, docs/restart-at-scale.md). Below that c10d, the path every
    platform has run longest, stays; so it does for a job that restarts in place, which needs
    every agent to re-form the gang (torch's static rendezvous never does: the config refuses
    ``static`` with in-place restarts)."""
    if configured == "auto":
        return "static" if nodes >= static_from and not in_place_restarts else "c10d"
    return configured


def gang_size(available: int, nodes_min: int, nodes_max: int, nproc_per_node: int,
              world_sizes: Iterable[int] = (), multiple_of: int = 1) -> int | None:
    """The largest node count in [nodes_min, min(nodes_max, available)] whose world size the job
    accepts (in ``world_sizes`` when given, a multiple of ``multiple_of``); None if none does."""
    accepted = set(world_sizes)
    for n in range(min(nodes_max, available), nodes_min - 1, -1):
        world = n * nproc_per_node
        if world % multiple_of == 0 and (not accepted or world in accepted):
            return n
    return None


def pick_checkpoint(checkpoints: list[str], history: History, allow_fresh_start: bool) -> str | None | Stop:
    """The checkpoint to resume from: the newest of ``checkpoints`` (those that verify, newest
    first) that is not suspect; None for a fresh start, allowed only for a job that never had a
    checkpoint (or when the operator allowed it); else a Stop in ``STOPPED_NO_CHECKPOINT``. Any
    checkpoint given means the job has had one (the caller's history says so from then on)."""
    pick = next((c for c in checkpoints if c not in history.suspects), None)
    if pick is None and (history.had_checkpoint or checkpoints) and not allow_fresh_start:
        why = ("; ".join(f"{n}: {history.suspect_why.get(n, 'suspect')}" for n in history.suspects)
               or "none is left that verifies")
        return Stop(JobPhase.STOPPED_NO_CHECKPOINT,
                    f"no usable checkpoint is left ({why}); refusing to train from scratch. Inspect them with "
                    "`supervisor checkpoints verify --full`, then run again (a new run starts a new history) or "
                    "allow a fresh start explicitly (restart.allow_fresh_start / --allow-fresh-start)")
    return pick


def made_progress(*, latest_step: int | None, step_at_start: int, had_checkpoint: bool,
                  steps_without_sdk: int) -> bool:
    """Whether an attempt that just failed made progress (the progress guard's question): a newer
    complete checkpoint than at its start; or, for a script without the worker SDK whose job never
    had a checkpoint of ours (it saves and resumes by itself, if at all), steps taken: it is then
    restarted as torchrun would restart it, up to ``restart.max_restarts``."""
    if latest_step is not None and latest_step > step_at_start:
        return True
    return not had_checkpoint and steps_without_sdk > 0


def plan_next(
    *,
    history: History,
    fault: Fault,
    made_progress: bool,
    report: RestoreReport,
    slots: list[str],
    previous_nodes: Iterable[str],
    nodes_min: int,
    nodes_max: int,
    max_restarts: int,
    guard_attempts: int,
    exclude_after: int,
    checkpoints: list[str],
    allow_fresh_start: bool = False,
    nproc_per_node: int = 1,
    world_sizes: Iterable[int] = (),
    world_size_multiple_of: int = 1,
    nonfinite_window: int = 0,
    skip_batches: int = 0,
    straggler_nodes: Iterable[str] = (),
    hosts: Mapping[str, str] | None = None,
    release_rejected: bool = False,
) -> tuple[Relaunch | Stop, History]:
    """Decide the next attempt after a failed one, and the run's history after it.

    * a checkpoint the ranks refused (verification or load failed) is suspect; so is one that
      two attempts restored without completing a step after it (the ranks' own reports, not
      sampled heartbeats: a crash one step after a good restore says nothing against it);
    * machines with ``exclude_after`` node-level failures (and persistent stragglers, if asked)
      are excluded: a failed node counts against its machine (``hosts``: node slot -> the
      machine it ran on, where the two differ, e.g. a pod and its Kubernetes node);
    * the progress guard stops the job after ``guard_attempts`` failed attempts in a row
      with no new complete checkpoint, or after ``max_restarts``;
    * the next gang is the largest healthy one in [min, max] whose world size the job accepts
      (``world_sizes``, ``world_size_multiple_of``), keeping the nodes that were fine and
      adding spares in slot order;
    * it resumes from the newest of ``checkpoints`` (those that verify, newest first) that
      is not suspect; with none left, a job that has had a checkpoint stops
      (``STOPPED_NO_CHECKPOINT``) unless ``allow_fresh_start``;
    * a non-finite loss is first taken as transient (restart from the newest verified
      checkpoint); the same again within ``nonfinite_window`` steps of an earlier one skips
      that step's batch while fewer than ``skip_batches`` have been skipped, and otherwise
      stops the job (``STOPPED_NONFINITE``) instead of looping;
    * a rank-level failure (a crash, an error) before any rank took a step, identical in two
      attempts in a row, is a job that cannot start: it stops at once with that error
      (``STOPPED_STARTUP_FAILURE``) instead of spending the restart budget on it;
    * ``release_rejected``: the fault rejected the release that caused it
      (:mod:`~supervisor.controller.releases`), which goes back to an earlier version: the fault
      says nothing of the job (no stop at once, no startup-failure signature, no non-finite or
      out-of-memory step, no attempt without progress), and ``checkpoints`` already leave out
      what the rejected release wrote.
    """
    history = _Draft(note_refusals(history, report)[0])
    if checkpoints:
        history.had_checkpoint = True
    if fault.kind in STOP_AT_ONCE and not release_rejected:
        return Stop(JobPhase.STOPPED_STARTUP_FAILURE, f"the job cannot start: {fault.detail}"), history.freeze()
    # only a failure the restored state could have caused speaks against it: a lost or killed
    # node, a preemption, a silent rank or a non-finite loss (its step ran: the load worked) do not
    if (report.state == "restored" and report.restored and not report.stepped
            and fault.kind in _LOAD_IMPLICATING):
        name = report.restored
        history.no_step_after[name] = history.no_step_after.get(name, 0) + 1
        if history.no_step_after[name] >= 2 and name not in history.suspects:
            history.suspects.append(name)
            history.suspect_why[name] = (f"{history.no_step_after[name]} attempts restored it and none "
                                         "completed a step after it")
    newly: list[str] = []
    hosts = hosts or {}
    if fault.node_failure:
        for node in dict.fromkeys(hosts.get(n, n) for n in fault.nodes):
            history.node_failures[node] = history.node_failures.get(node, 0) + 1
            if (history.node_failures[node] >= exclude_after or fault.exclude_now) and node not in history.excluded:
                history.excluded.append(node)
                newly.append(node)
    for node in dict.fromkeys(hosts.get(n, n) for n in straggler_nodes):
        if node not in history.excluded:
            history.excluded.append(node)
            newly.append(node)
    if not release_rejected:
        history.attempts_without_progress = 0 if made_progress else history.attempts_without_progress + 1
    history.restarts += 1
    before_first_step = not report.stepped and fault.kind in _STARTUP_KINDS and not release_rejected
    # which rank shows it first is chance: the same error from another rank is the same failure
    signature = re.sub(r"\branks? [\d, ]+", "rank N", f"{fault.kind}: {fault.detail}") if before_first_step else ""
    if signature and signature == history.startup_failure:
        return Stop(JobPhase.STOPPED_STARTUP_FAILURE,
                    f"the job fails the same way before its first step in two attempts in a row: {fault.detail}"), \
            history.freeze()
    history.startup_failure = signature
    if fault.kind == "oom" and fault.step is not None and not release_rejected:
        key = f"{fault.ranks[0] if fault.ranks else -1}@{fault.step}"
        if key in history.oom_at:
            return Stop(JobPhase.STOPPED_OUT_OF_MEMORY,
                        f"{fault.detail}: the same rank ran out of memory at the same step after a restart from a "
                        "verified checkpoint: a restart does not fix a memory bug (lower the batch or the model's "
                        "memory, or raise the container's memory limit), stopping instead of looping"), \
                history.freeze()
        history.oom_at.append(key)
    if fault.kind == "nonfinite" and fault.step is not None and not release_rejected:
        again = [s for s in history.nonfinite_steps if abs(s - fault.step) <= nonfinite_window]
        history.nonfinite_steps.append(fault.step)
        if again:
            if len(history.skip_steps) < skip_batches:
                history.skip_steps.append(fault.step)
            else:
                return Stop(JobPhase.STOPPED_NONFINITE,
                            f"non-finite loss at step {fault.step} again after a restart from a verified checkpoint "
                            f"(earlier at step {again[-1]}; window {nonfinite_window} steps"
                            + (f", {len(history.skip_steps)} batches skipped already" if skip_batches else
                               "; nonfinite.skip_batches is 0") + "): not transient, stopping instead of looping"), \
                    history.freeze()
    if history.restarts > max_restarts:
        return Stop(JobPhase.STOPPED_MAX_RESTARTS,
                    f"{history.restarts - 1} restarts reached restart.max_restarts={max_restarts}"), history.freeze()
    if history.attempts_without_progress >= guard_attempts:
        return Stop(JobPhase.STOPPED_NO_PROGRESS,
                    f"{history.attempts_without_progress} attempts in a row without a new complete checkpoint "
                    f"(last fault: {fault.kind}: {fault.detail[:300]})"), history.freeze()
    healthy = [s for s in slots if s not in history.excluded]
    if len(healthy) < nodes_min:
        return Stop(JobPhase.STOPPED_NO_CAPACITY,
                    f"{len(healthy)} healthy node slots left, nodes.min is {nodes_min} (excluded: {history.excluded})"), \
            history.freeze()
    pick = pick_checkpoint(checkpoints, history.freeze(), allow_fresh_start)
    if isinstance(pick, Stop):
        return pick, history.freeze()
    size = gang_size(len(healthy), nodes_min, nodes_max, nproc_per_node, world_sizes, world_size_multiple_of)
    if size is None:
        return Stop(JobPhase.STOPPED_NO_CAPACITY,
                    f"{len(healthy)} healthy node slots left and no node count in [{nodes_min}, {nodes_max}] gives a "
                    f"world size the job accepts (world_sizes={list(world_sizes)}, multiple of "
                    f"{world_size_multiple_of}, {nproc_per_node} per node)"), history.freeze()
    keep = [n for n in previous_nodes if n in healthy]
    spares = [s for s in healthy if s not in keep]
    chosen = (keep + spares)[:size]
    return Relaunch(tuple(chosen), pick, tuple(history.suspects), tuple(newly),
                    require_checkpoint=history.had_checkpoint and not allow_fresh_start,
                    skip_steps=tuple(history.skip_steps)), history.freeze()


_MARKS = ("fault_at", "detected_at", "torn_down_at", "scheduled_at", "rendezvous_at", "restored_at", "first_step_at")


@dataclass
class RestartTimer:
    """One restart's phase times (controller clock): fault -> detected -> torn down ->
    scheduled -> rendezvous -> restored -> first step."""

    attempt_from: int
    reason: str
    fault_at: float
    detected_at: float
    torn_down_at: float | None = None
    scheduled_at: float | None = None
    rendezvous_at: float | None = None
    restored_at: float | None = None
    first_step_at: float | None = None

    PHASES = RESTART_PHASES  # one mark per phase below, in this order (supervisor.protocol)

    def durations(self) -> dict[str, float]:
        marks = [self.fault_at, self.detected_at, self.torn_down_at, self.scheduled_at, self.rendezvous_at,
                 self.restored_at, self.first_step_at]
        out = {}
        for name, a, b in zip(self.PHASES, marks, marks[1:]):
            if a is not None and b is not None:
                out[name] = max(0.0, b - a)
        return out

    @property
    def done(self) -> bool:
        return self.first_step_at is not None

    def total(self, now: float) -> float:
        return (self.first_step_at if self.first_step_at is not None else now) - self.fault_at

    def budget_remaining(self, budget_s: float, now: float) -> float:
        return budget_s - self.total(now)

    def to_saved(self, to_unix) -> dict:
        """The marks as wall-clock times (``to_unix``): a replacement controller keeps the timer."""
        return {"attempt_from": self.attempt_from, "reason": self.reason} | {
            name: None if getattr(self, name) is None else to_unix(getattr(self, name)) for name in _MARKS}

    @classmethod
    def from_saved(cls, raw: dict, from_unix) -> "RestartTimer":
        """:meth:`to_saved`'s value on this controller's clock (``from_unix``); ValueError if it is not one."""
        try:
            marks = {name: None if raw.get(name) is None else from_unix(float(raw[name])) for name in _MARKS}
            if marks["fault_at"] is None or marks["detected_at"] is None:
                raise ValueError("fault_at and detected_at are required")
            return cls(int(raw["attempt_from"]), str(raw["reason"]), **marks)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"restart_timer: {exc!r:.200}") from None

    def to_dict(self, now: float, budget_s: float) -> dict:
        return {"attempt_from": self.attempt_from, "reason": self.reason, "phases": self.durations(),
                "total_s": round(self.total(now), 3), "done": self.done,
                "within_budget": self.total(now) <= budget_s}
