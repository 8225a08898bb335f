"""Leader election over a ``coordination.k8s.io/v1`` Lease, on asyncio.

Only the holder of the Lease may act (launch, kill, write job state) and report ready; a
controller that loses it stops acting and kills nothing. Why our own elector: the client's
``kubernetes.leaderelection`` runs a sleeping thread, calls ``sys.exit()`` when its retry
period is under a second, and never releases the Lease on shutdown
(kubernetes-client/python#1669), so a clean handover waits a whole lease duration.

How it keeps *at most one leader at any moment*:

- **Compare-and-swap.** Every acquisition and renewal is ``replace_namespaced_lease`` with the
  resourceVersion it read; a 409 means someone else wrote first and this try is lost (it
  reads again, it never overwrites).
- **No wall clocks compared across hosts.** A candidate takes an expired Lease only after it
  has seen the Lease's record (holder, times, transitions, duration) stay unchanged for the
  record's ``leaseDurationSeconds``, counted on its *own* monotonic clock from when it first
  saw that record (as client-go does). ``renewTime`` is written for humans and ``kubectl``.
- **The leader gives up first.** Its renew deadline is counted from the moment it *sent* its
  last successful renewal, which is before the write landed and so before any candidate could
  see it. When ``renew_deadline_s`` (< ``lease_duration_s``) passes without another, it stops
  leading, even while an API call still hangs; the gap between the two is the margin for
  scheduling delay. A leader that reads another holder stops at once.
- **Stop acting before letting go.** On a clean :meth:`LeaseElector.stop`, ``is_leader``
  turns false and ``on_stopped_leading`` runs *before* the Lease is released (holder emptied),
  so the next leader, which may take a released Lease at once, never overlaps.

API failures: transient ones (5xx, 429, timeouts, refused connections) are retried with
tenacity within the round's bound (a leader: until its renew deadline; a candidate:
``renew_deadline_s``), each call with its own request timeout. Permanent ones (400, 401, 403, 422: missing
RBAC, a bad name) end :meth:`LeaseElector.run` with :class:`PlatformError` after stepping
down. Nothing here exits the process.

Usage::

    elector = LeaseElector(CoordinationV1Api(api_client),
                           LeaseConfig(namespace="ml", name="job-7-controller", identity=default_identity()),
                           on_stopped_leading=controller.stop_acting)
    elector.start()                      # a named task
    await elector.wait_leading()
    ...                                  # act while elector.is_leader
    await elector.stop()                 # steps down, then releases the Lease
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_random_exponential

from supervisor.platforms.base import PlatformError

log = logging.getLogger("supervisor.platform.kube.lease")

TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})


def default_identity() -> str:
    """``<hostname>_<random>``: unique per process, so a restarted controller is a new candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseConfig:
    """Where the Lease lives, who we are, and the election's timing."""

    namespace: str
    """Namespace of the Lease (the controller's own)."""
    name: str
    """Name of the Lease, one per training job."""
    identity: str
    """This candidate's holder identity; unique per process (see :func:`default_identity`)."""
    lease_duration_s: int = 15
    """How long a candidate waits, after it last saw the record change, before taking over.
    Whole seconds: the Lease stores ``leaseDurationSeconds`` as an integer."""
    renew_deadline_s: float = 10.0
    """A leader that has not renewed for this long stops leading. Must be under
    ``lease_duration_s``: the difference is the safety margin."""
    retry_period_s: float = 2.0
    """Time between tries, for the leader (renewals) and for candidates."""
    request_timeout_s: float = 5.0
    """Each API call's own timeout (connect + read); at most ``renew_deadline_s``."""

    def __post_init__(self) -> None:
        for key in ("namespace", "name", "identity"):
            if not getattr(self, key):
                raise ValueError(f"lease.{key}: must not be empty")
        if not isinstance(self.lease_duration_s, int) or self.lease_duration_s < 1:
            raise ValueError(f"lease.lease_duration_s: must be a whole number of seconds >= 1, "
                             f"got {self.lease_duration_s!r}")
        if not 0 < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(f"lease.renew_deadline_s: must be above 0 and under lease_duration_s "
                             f"({self.lease_duration_s}), got {self.renew_deadline_s}")
        if not 0 < self.retry_period_s < self.renew_deadline_s:
            raise ValueError(f"lease.retry_period_s: must be above 0 and under renew_deadline_s "
                             f"({self.renew_deadline_s}), got {self.retry_period_s}")
        if not 0 < self.request_timeout_s <= self.renew_deadline_s:
            raise ValueError(f"lease.request_timeout_s: must be above 0 and at most renew_deadline_s "
                             f"({self.renew_deadline_s}), got {self.request_timeout_s}")


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says about its holder; equal records mean nobody renewed in between."""

    holder: str
    duration_s: int | None
    acquire_time: Any
    renew_time: Any
    transitions: int

    @classmethod
    def of(cls, lease: client.V1Lease) -> "LeaseRecord":
        spec = lease.spec or client.V1LeaseSpec()
        return cls(spec.holder_identity or "", spec.lease_duration_seconds, spec.acquire_time,
                   spec.renew_time, spec.lease_transitions or 0)


class Verdict(str, enum.Enum):
    RENEW = "renew"        # the Lease names us: write a renewal
    ACQUIRE = "acquire"    # released, or unchanged for its whole duration: take it
    FOLLOW = "follow"      # someone else holds it and has renewed recently enough


def lease_verdict(record: LeaseRecord, identity: str, observed_at: float, now: float,
                  default_duration_s: int) -> Verdict:
    """What a candidate may do with a Lease whose ``record`` it first saw at ``observed_at``.

    Both times are this process's monotonic clock, never the Lease's own timestamps.
    """
    if record.holder == identity:
        return Verdict.RENEW
    if not record.holder:
        return Verdict.ACQUIRE
    duration = record.duration_s if record.duration_s and record.duration_s > 0 else default_duration_s
    if now - observed_at >= duration:
        return Verdict.ACQUIRE
    return Verdict.FOLLOW


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the API server is busy, restarting or unreachable."""
    if isinstance(exc, ApiException):
        return exc.status is None or exc.status in TRANSIENT_STATUSES
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


class _Lost(Exception):
    """Someone else wrote the Lease first (409), or it vanished under us (404)."""


def _micro_time() -> datetime:
    return datetime.now(timezone.utc)


class LeaseElector:
    """Campaigns for one Lease until stopped; see the module docstring for the guarantees.

    ``on_started_leading`` / ``on_stopped_leading`` are plain callables run on the event loop
    at each transition (keep them short: start or stop a task); :meth:`wait_leading` and
    :meth:`wait_not_leading` are the awaitable forms. An exception from a callback ends
    :meth:`run` with it, loudly.

    Give it an ``ApiClient`` whose ``configuration.retries`` is ``False``: then tenacity is the
    only retry layer (by default urllib3 also retries a timed-out GET or PUT, up to three
    times inside one call; still safe, since a repeated renewal meets a 409, but slower).
    """

    def __init__(self, api: client.CoordinationV1Api, config: LeaseConfig, *,
                 on_started_leading: Callable[[], None] | None = None,
                 on_stopped_leading: Callable[[], None] | None = None) -> None:
        self.api = api
        self.config = config
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._leading = asyncio.Event()
        self._not_leading = asyncio.Event()
        self._not_leading.set()
        self._stop = asyncio.Event()
        self._finished = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self._observed: tuple[LeaseRecord, float] | None = None
        self._deadline = 0.0         # loop time at which our leadership lapses

    # --- public face ---

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    @property
    def observed_holder(self) -> str | None:
        """The holder the Lease named when last read ("" when released; None before any read)."""
        return None if self._observed is None else self._observed[0].holder

    async def wait_leading(self) -> None:
        await self._leading.wait()

    async def wait_not_leading(self) -> None:
        await self._not_leading.wait()

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a named task and return it."""
        if self._task is None:
            cfg = self.config
            self._task = asyncio.create_task(self.run(), name=f"lease-elector:{cfg.namespace}/{cfg.name}")
        return self._task

    async def stop(self) -> None:
        """Stop campaigning: step down, release the Lease if it names us, and return when done.

        Re-raises what ended :meth:`run` (a :class:`PlatformError`), if anything did.
        """
        self._stop.set()
        if self._task is not None:
            await self._task
        elif self._running:
            await self._finished.wait()

    async def run(self) -> None:
        """Campaign and renew until :meth:`stop`. Cancellation steps down without releasing
        (as a crash would); a permanent API error raises :class:`PlatformError`."""
        loop = asyncio.get_running_loop()
        self._running = True
        try:
            try:
                while not self._stop.is_set():
                    await self._round(loop)
                    await self._pause(loop)
            except BaseException:
                self._step_down("elector ended")
                raise
            self._step_down("stopped")
            await self._release(loop)
        finally:
            self._finished.set()

    # --- one round ---

    async def _round(self, loop: asyncio.AbstractEventLoop) -> None:
        cfg = self.config
        if self.is_leader and loop.time() >= self._deadline:
            self._step_down(f"no renewal for {cfg.renew_deadline_s}s")
        # a leader's round ends at its deadline; a candidate's may take as long (it only leads
        # on an answer that came back before sent + renew_deadline_s, see _won)
        bound = self._deadline - loop.time() if self.is_leader else cfg.renew_deadline_s
        try:
            async with asyncio.timeout(bound):
                while True:
                    try:
                        await self._try_acquire_or_renew(loop, loop.time() + bound)
                        return
                    except _Lost:
                        # our read is stale: read again at once (with a little jitter)
                        await asyncio.sleep(random.uniform(0.0, min(0.05, cfg.retry_period_s / 4)))
        except TimeoutError:
            log.warning("event=lease_round_timed_out lease=%s/%s identity=%s leader=%s",
                        cfg.namespace, cfg.name, cfg.identity, self.is_leader)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            if not is_transient(exc):
                raise PlatformError(f"lease {cfg.namespace}/{cfg.name}: the API server refused "
                                    f"the election: {_describe(exc)}") from exc
            log.warning("event=lease_api_unavailable lease=%s/%s identity=%s error=%s",
                        cfg.namespace, cfg.name, cfg.identity, _describe(exc))
        if self.is_leader and loop.time() >= self._deadline:
            self._step_down(f"no renewal for {cfg.renew_deadline_s}s")

    async def _try_acquire_or_renew(self, loop: asyncio.AbstractEventLoop, until: float) -> None:
        cfg = self.config
        sent = loop.time()
        try:
            lease = await self._call(until, self.api.read_namespaced_lease, cfg.name, cfg.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease = None
        now = _micro_time()
        if lease is None:
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=cfg.name, namespace=cfg.namespace),
                spec=client.V1LeaseSpec(holder_identity=cfg.identity, lease_duration_seconds=cfg.lease_duration_s,
                                        acquire_time=now, renew_time=now, lease_transitions=0))
            sent = loop.time()
            written = await self._write(until, self.api.create_namespaced_lease, cfg.namespace, body)
            self._won(loop, written, sent)
            return
        record = LeaseRecord.of(lease)
        self._observe(record, loop.time())
        verdict = lease_verdict(record, cfg.identity, self._observed[1], loop.time(), cfg.lease_duration_s)
        if verdict is Verdict.FOLLOW:
            if self.is_leader:
                self._step_down(f"the lease names {record.holder}")
            return
        lease.spec = client.V1LeaseSpec(
            holder_identity=cfg.identity,
            lease_duration_seconds=cfg.lease_duration_s,
            acquire_time=record.acquire_time if verdict is Verdict.RENEW and record.acquire_time else now,
            renew_time=now,
            lease_transitions=record.transitions + (0 if verdict is Verdict.RENEW else 1))
        if verdict is Verdict.ACQUIRE:
            log.info("event=lease_takeover lease=%s/%s identity=%s previous=%s", cfg.namespace, cfg.name,
                     cfg.identity, record.holder or "(released)")
        written = await self._write(until, self.api.replace_namespaced_lease, cfg.name, cfg.namespace, lease)
        # a renewal counts from when it was sent (the read above, when it named us), an
        # acquisition from the read too: both are before our write landed
        self._won(loop, written, sent)

    def _won(self, loop: asyncio.AbstractEventLoop, written: client.V1Lease, sent: float) -> None:
        self._observe(LeaseRecord.of(written), loop.time())
        deadline = sent + self.config.renew_deadline_s
        if loop.time() >= deadline or self._stop.is_set():
            return     # the answer came too late to lead on, or we are on our way out (release)
        self._deadline = deadline
        if not self.is_leader:
            log.info("event=lease_leading lease=%s/%s identity=%s", self.config.namespace,
                     self.config.name, self.config.identity)
            self._not_leading.clear()
            self._leading.set()
            if self._on_started is not None:
                self._on_started()

    async def _write(self, until: float, fn: Callable[..., Any], *args: Any) -> client.V1Lease:
        try:
            return await self._call(until, fn, *args)
        except ApiException as exc:
            if exc.status in (404, 409):
                raise _Lost() from exc
            raise

    def _observe(self, record: LeaseRecord, now: float) -> None:
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, now)

    def _step_down(self, why: str) -> None:
        if not self.is_leader:
            return
        log.log(logging.INFO if why == "stopped" else logging.WARNING,
                "event=lease_stopped_leading lease=%s/%s identity=%s reason=%s",
                self.config.namespace, self.config.name, self.config.identity, why)
        self._leading.clear()
        self._not_leading.set()
        if self._on_stopped is not None:
            self._on_stopped()

    async def _pause(self, loop: asyncio.AbstractEventLoop) -> None:
        cfg = self.config
        if self.is_leader:
            wait = min(cfg.retry_period_s, max(0.0, self._deadline - loop.time()))
        else:   # candidates spread out so they do not poll in lockstep
            wait = cfg.retry_period_s * random.uniform(1.0, 1.2)
        try:
            await asyncio.wait_for(self._stop.wait(), wait)
        except TimeoutError:
            pass

    async def _call(self, until: float, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a worker thread with the request timeout; transient errors are
        retried until ``until`` (loop time)."""
        loop = asyncio.get_running_loop()
        async for attempt in AsyncRetrying(
                retry=retry_if_exception(is_transient),
                wait=wait_random_exponential(multiplier=0.05, max=self.config.retry_period_s / 2),
                stop=stop_after_delay(max(0.0, until - loop.time())),
                reraise=True):
            with attempt:
                return await asyncio.to_thread(fn, *args, _request_timeout=self.config.request_timeout_s)
        raise AssertionError("unreachable: tenacity reraises the last error")

    async def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        """Empty the holder if the Lease still names us, so a candidate may take it at once."""
        cfg = self.config
        if self.observed_holder != cfg.identity:
            return
        until = loop.time() + cfg.renew_deadline_s
        try:
            async with asyncio.timeout(cfg.renew_deadline_s):
                lease = await self._call(until, self.api.read_namespaced_lease, cfg.name, cfg.namespace)
                record = LeaseRecord.of(lease)
                if record.holder != cfg.identity:
                    return
                now = _micro_time()
                lease.spec = client.V1LeaseSpec(holder_identity="", lease_duration_seconds=1,
                                                acquire_time=now, renew_time=now,
                                                lease_transitions=record.transitions)
                written = await self._call(until, self.api.replace_namespaced_lease, cfg.name,
                                           cfg.namespace, lease)
                self._observe(LeaseRecord.of(written), loop.time())
                log.info("event=lease_released lease=%s/%s identity=%s", cfg.namespace, cfg.name,
                         cfg.identity)
        except (TimeoutError, ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            # not fatal: the Lease expires on its own after lease_duration_s
            log.warning("event=lease_release_failed lease=%s/%s identity=%s error=%s",
                        cfg.namespace, cfg.name, cfg.identity, _describe(exc))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"[:300]
