"""The edge between the Kubernetes platform and the ``kubernetes`` client: every API call goes
through :class:`KubeApi` (a timeout per request, transient failures retried with tenacity for a
bounded time, then :class:`PlatformError`), and every object the platform watches is kept by a
:class:`Watcher` (list, then watch from that resourceVersion; relist on 410 Gone; reconnect on
any error, forever, without ever stopping the job).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from typing import Any, Callable

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_random_exponential

from supervisor.platforms.base import PlatformError
from supervisor.platforms.kube.lease import is_transient

log = logging.getLogger("supervisor.platform.kube")

USER_AGENT = "elastic-supervisor-controller"
DELETED_KEPT = 4096
"""Gone objects a :class:`Watcher` remembers at most (their last state, for the platform to read
why a pod went away): two whole gangs of 2,048 pods (16,384 ranks at 8 a pod) torn down before
the platform reads them; the oldest beyond it is dropped."""
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def api_client(kubeconfig: str = "", context: str = "") -> client.ApiClient:
    """An ApiClient for the configured cluster: a kubeconfig file, else the in-cluster service
    account, else ``~/.kube/config``. urllib3's own retries are off: tenacity is the one retry layer."""
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, context=context or None, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(context=context or None, client_configuration=cfg)
    except (config.ConfigException, OSError, ValueError) as exc:
        raise PlatformError(f"cannot load the Kubernetes client configuration "
                            f"({kubeconfig or 'in-cluster, then ~/.kube/config'}): {exc}") from None
    cfg.retries = False
    api = client.ApiClient(cfg)
    api.user_agent = USER_AGENT  # the API server's audit log and metrics tell our calls apart
    return api


def own_namespace(default: str = "default") -> str:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or default
    except OSError:
        return default


def describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        message = ""
        try:
            import json

            message = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            pass
        return f"HTTP {exc.status} {exc.reason}" + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"[:300]


class ApiError(PlatformError):
    """A request the API server answered with an error (``status``: its HTTP status), or that got
    no answer (``status`` None), after the retries."""

    def __init__(self, message: str, status: int | None = None, said: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.said = said
        """What the API server said (``HTTP 403 Forbidden: ...``), without the call's name."""


class KubeApi:
    """Calls the client in a worker thread, each request with ``timeout_s``; transient failures
    (5xx, 429, refused, timed out) are retried for ``retry_s`` with jittered backoff."""

    def __init__(self, api: client.ApiClient, *, timeout_s: float = 10.0, retry_s: float = 60.0) -> None:
        self.api_client = api
        self.core = client.CoreV1Api(api)
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.calls = 0

    async def call(self, fn: Callable[..., Any], *args: Any, ok: tuple[int, ...] = (), retry_s: float | None = None,
                   **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; an ApiException whose status is in ``ok`` returns None (e.g. 404
        on a delete); any other failure, after retries, is a :class:`PlatformError`."""
        what = getattr(fn, "__name__", "call")
        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception(is_transient), reraise=True,
                    wait=wait_random_exponential(multiplier=0.2, max=5.0),
                    stop=stop_after_delay(self.retry_s if retry_s is None else retry_s)):
                with attempt:
                    self.calls += 1
                    try:
                        return await asyncio.to_thread(fn, *args, _request_timeout=self.timeout_s, **kwargs)
                    except ApiException as exc:
                        if exc.status in ok:
                            return None
                        raise
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            said = describe(exc)
            raise ApiError(f"Kubernetes API {what} failed: {said}", exc.status if isinstance(exc, ApiException)
                           else None, said) from None
        except (ValueError, TypeError) as exc:  # the client's own validation of a request (pydantic)
            raise PlatformError(f"Kubernetes API {what}: the client refused the request: "
                                f"{' '.join(str(exc).split())[:600]}") from None
        raise AssertionError("unreachable: tenacity reraises the last error")


class Watcher:
    """Keeps every object of one kind that matches a label selector, current: a list, then a
    watch from its resourceVersion (with bookmarks); a 410 Gone relists; any error reconnects
    after a backoff. Runs in a daemon thread; readers take :meth:`snapshot`. ``deleted`` keeps
    the last state of objects that went away (by name), until :meth:`forget`, and at most the
    last ``deleted_kept`` of them (:data:`DELETED_KEPT` by default; the oldest is dropped first):
    a long job that relaunches its gang many times, or a selector that sees churn it never
    forgets, does not grow the controller's memory. A gone object no longer kept reads as gone
    without a last state (:meth:`gone` returns None)."""

    def __init__(self, name: str, list_fn: Callable[..., Any], *, label_selector: str = "",
                 field_selector: str = "", timeout_s: float = 10.0, on_change: Callable[[], None] | None = None,
                 deleted_kept: int = 0, **list_kwargs: Any) -> None:
        self.name = name
        self.list_fn = list_fn
        self.selector = {"label_selector": label_selector} if label_selector else {}
        if field_selector:
            self.selector["field_selector"] = field_selector
        self.list_kwargs = list_kwargs
        self.timeout_s = timeout_s
        self.on_change = on_change
        self.objects: dict[str, Any] = {}
        self.deleted: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.deleted_kept = deleted_kept or DELETED_KEPT
        self.synced = threading.Event()
        self.last_error = ""
        self.relists = 0
        self.resource_version = ""
        """The last resourceVersion the watch saw (an object's or a bookmark's): where it resumes."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"kube-watch-{name}", daemon=True)

    def start(self, wait_s: float) -> "Watcher":
        self._thread.start()
        if not self.synced.wait(wait_s):
            raise PlatformError(f"cannot list {self.name} from the Kubernetes API within {wait_s:g}s: "
                                f"{self.last_error or 'no answer'}")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self.objects)

    def gone(self, name: str) -> Any:
        with self._lock:
            return self.deleted.get(name)

    def forget(self, names) -> None:
        with self._lock:
            for n in names:
                self.deleted.pop(n, None)

    def _gone(self, name: str, obj: Any) -> None:
        """Keep ``obj`` as the last state of ``name``, gone (the lock is held): the newest
        ``deleted_kept`` at most."""
        self.deleted[name] = obj
        self.deleted.move_to_end(name)
        while len(self.deleted) > self.deleted_kept:
            self.deleted.popitem(last=False)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                listed = self.list_fn(**self.list_kwargs, **self.selector, _request_timeout=self.timeout_s)
                with self._lock:
                    fresh = {o.metadata.name: o for o in listed.items}
                    for name, obj in self.objects.items():
                        if name not in fresh:
                            self._gone(name, obj)
                    self.objects = fresh
                self.relists += 1
                self.synced.set()
                self._changed()
                rv = listed.metadata.resource_version
                backoff = 0.2
                while not self._stop.is_set() and rv is not None:
                    rv = self._stream(rv)  # None: relist (410 Gone, or an error event)
            except ApiException as exc:
                self._failed(exc)
            except Exception as exc:  # noqa: BLE001 - the watch must never die: log, back off, list again
                self._failed(exc)
            if self._stop.is_set():
                return
            self._stop.wait(backoff)
            backoff = min(5.0, backoff * 2)

    def _failed(self, exc: BaseException) -> None:
        if self._stop.is_set():  # our own stop() closed the watch
            return
        if isinstance(exc, ApiException) and exc.status == 410:
            # expired (the server compacted past our resourceVersion): the normal reason to list again
            log.debug("event=kube_watch_expired kind=%s (listing again)", self.name)
            return
        text = describe(exc)
        if text != self.last_error:
            log.warning("event=kube_watch_error kind=%s error=%s (reconnecting)", self.name, text)
        self.last_error = text

    def _stream(self, rv: str) -> str | None:
        """Watch from ``rv`` until the server ends the watch; returns the last resourceVersion seen
        (to watch on from), or None when the caller must list again (410 Gone, an error event)."""
        w = watch.Watch()
        self._watch = w
        for ev in w.stream(self.list_fn, **self.list_kwargs, **self.selector, resource_version=rv,
                           allow_watch_bookmarks=True, timeout_seconds=60, _request_timeout=75):
            if self._stop.is_set():
                break
            kind, obj = ev["type"], ev["object"]
            if kind == "ERROR":
                raw = ev.get("raw_object") or {}
                if raw.get("code") != 410:  # 410: too old, the normal reason to list again
                    self.last_error = str(raw)[:300]
                return None
            if kind == "BOOKMARK":
                # the client leaves a bookmark undeserialized (a dict: it may be incomplete)
                meta = obj.get("metadata") if isinstance(obj, dict) else getattr(obj, "metadata", None)
                fresh = meta.get("resourceVersion") if isinstance(meta, dict) else getattr(meta, "resource_version", None)
                rv = fresh or rv
                self.resource_version = rv
                continue
            name = obj.metadata.name
            with self._lock:
                if kind == "DELETED":
                    self.objects.pop(name, None)
                    self._gone(name, obj)
                else:
                    self.objects[name] = obj
            rv = obj.metadata.resource_version or rv
            self.resource_version = rv
            self.last_error = ""
            self._changed()
        return rv
