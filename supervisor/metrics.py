"""Prometheus metrics, read from the controller's state at scrape time.

A ``Collector`` (no global registry, no counters updated in hot paths): each scrape asks the
controller for its current state. Names follow Prometheus conventions (``_seconds``,
``_total``, base units) and pass ``promtool check metrics``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from supervisor.controller.decide import TERMINAL, JobPhase, RestartTimer
from supervisor.protocol import PHASES, REJECT_REASONS

if TYPE_CHECKING:
    from supervisor.controller.daemon import Controller

RESTART_PHASE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800)


class ControllerCollector:
    def __init__(self, controller: "Controller") -> None:
        self.c = controller

    def collect(self) -> Iterator[Metric]:
        c = self.c
        job = c.cfg.job
        now = c.clock()
        phase = GaugeMetricFamily("supervisor_job_phase", "1 for the job's current phase, 0 for the others",
                                  labels=["job", "phase"])
        for p in JobPhase:
            phase.add_metric([job, p.value], 1.0 if c.phase == p else 0.0)
        yield phase
        yield _gauge("supervisor_attempt", "Current attempt number (every relaunch increments it)", job, c.attempt)
        yield _gauge("supervisor_world_size", "Ranks in the current attempt", job, c.registry.world_size)
        yield _gauge("supervisor_alive_ranks", "Ranks heard from within the heartbeat timeout", job, c.alive_ranks(now))
        age = GaugeMetricFamily("supervisor_rank_heartbeat_age_seconds", "Seconds since each rank's last heartbeat",
                                labels=["job", "rank", "node"])
        step = GaugeMetricFamily("supervisor_rank_step", "Each rank's last reported step", labels=["job", "rank", "node"])
        straggler = GaugeMetricFamily("supervisor_straggler_score",
                                      "Rank's exposed work time over its peers' median (1 is typical)",
                                      labels=["job", "rank", "node"])
        rank_phase = GaugeMetricFamily("supervisor_rank_phase",
                                       "1 for each rank's phase in its last heartbeat, 0 for the others",
                                       labels=["job", "rank", "node", "phase"])
        for r, rec in sorted(c.registry.ranks.items()):
            labels = [job, str(r), rec.hb.node]
            age.add_metric(labels, max(0.0, now - rec.received))
            step.add_metric(labels, rec.hb.step)
            for p in PHASES:
                rank_phase.add_metric(labels + [p], 1.0 if rec.hb.phase == p else 0.0)
            if r in c.stragglers:
                straggler.add_metric(labels, c.stragglers[r])
        yield age
        yield step
        yield rank_phase
        yield straggler
        hang = GaugeMetricFamily("supervisor_hang_detected",
                                 "1 while a detected fault is being handled, labelled with its kind and culprit",
                                 labels=["job", "kind", "rank", "node"])
        fault = c.active_hang
        if fault is not None:
            for r in fault.ranks or (-1,):
                node = c.registry.ranks[r].hb.node if r in c.registry.ranks else ",".join(fault.nodes)
                hang.add_metric([job, fault.kind, str(r), node], 1.0)
        yield hang
        last = GaugeMetricFamily("supervisor_last_fault_info",
                                 "1 for each culprit of the most recent fault, kept after it was handled",
                                 labels=["job", "kind", "rank", "node", "attempt"])
        when = GaugeMetricFamily("supervisor_last_fault_timestamp_seconds",
                                 "Unix time the most recent fault was detected", labels=["job"])
        if c.last_fault is not None:
            for r, node in c.last_fault_culprits:
                last.add_metric([job, c.last_fault.kind, str(r), node, str(c.last_fault_attempt)], 1.0)
            when.add_metric([job], c.last_fault_unix)
        yield last
        yield when
        t = c.current_timer
        yield _gauge("supervisor_restart_in_progress",
                     "1 from a fault's detection to the relaunched gang's first step", job,
                     1.0 if t is not None and not t.done and c.phase not in TERMINAL else 0.0)
        restarts = CounterMetricFamily("supervisor_restarts", "Restarts by the fault that caused them",
                                       labels=["job", "reason"])
        for reason, n in sorted(c.restarts_by_reason.items()):
            restarts.add_metric([job, reason], n)
        yield restarts
        yield _restart_histogram(job, c.timers)
        yield _gauge("supervisor_restart_budget_seconds", "The restart budget", job, c.cfg.restart.budget_s)
        yield _gauge("supervisor_restart_budget_remaining_seconds",
                     "Budget left for the restart in progress (the full budget when none is)", job, c.budget_remaining(now))
        yield _gauge("supervisor_restart_budget_exceeded", "1 if the last restart took longer than its budget", job,
                     1.0 if c.budget_exceeded else 0.0)
        ck = c.latest_ckpt
        yield _gauge("supervisor_last_checkpoint_step", "Global step of the newest complete checkpoint (-1: none)", job,
                     ck["step"] if ck else -1)
        ts = GaugeMetricFamily("supervisor_last_checkpoint_timestamp_seconds",
                               "Unix time the newest complete checkpoint was published", labels=["job"])
        if ck:
            ts.add_metric([job], ck["created_unix"])
        yield ts
        agegauge = GaugeMetricFamily("supervisor_last_checkpoint_age_seconds",
                                     "Seconds since the newest complete checkpoint was published", labels=["job"])
        if ck:
            agegauge.add_metric([job], max(0.0, time.time() - ck["created_unix"]))
        yield agegauge
        save = GaugeMetricFamily("supervisor_checkpoint_save_seconds",
                                 "How long the last checkpoint save blocked the training loop (max over ranks)", labels=["job"])
        blocked = [rec.hb.ckpt_s for rec in c.registry.ranks.values() if rec.hb.ckpt_s > 0]
        if blocked:
            save.add_metric([job], max(blocked))
        yield save
        rejected = CounterMetricFamily("supervisor_heartbeats_rejected", "Heartbeats refused, by reason",
                                       labels=["job", "reason"])
        for reason in REJECT_REASONS:
            rejected.add_metric([job, reason], c.rejected.get(reason, 0))
        yield rejected
        received = CounterMetricFamily("supervisor_heartbeats_received", "Heartbeats accepted", labels=["job"])
        received.add_metric([job], c.received)
        yield received
        yield _gauge("supervisor_excluded_nodes", "Nodes excluded from future attempts", job, len(c.history.excluded))


def _gauge(name: str, doc: str, job: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["job"])
    g.add_metric([job], float(value))
    return g


def _restart_histogram(job: str, timers: list[RestartTimer]) -> HistogramMetricFamily:
    h = HistogramMetricFamily("supervisor_restart_phase_seconds", "Duration of each phase of completed restarts",
                              labels=["job", "phase"])
    for phase in RestartTimer.PHASES:
        values = [t.durations()[phase] for t in timers if phase in t.durations()]
        buckets = []
        for bound in RESTART_PHASE_BUCKETS:
            buckets.append((_fmt(bound), sum(1 for v in values if v <= bound)))
        buckets.append(("+Inf", len(values)))
        h.add_metric([job, phase], buckets, sum(values))
    return h


def _fmt(x: float) -> str:
    return str(float(x))


def make_registry(controller: "Controller") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(controller))
    return registry
