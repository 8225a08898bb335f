"""A fake Kubernetes API server (aiohttp) that keeps the contract the Kubernetes platform uses.

No kube-apiserver can run on these machines, and the fakes on PyPI fall short (kmock: no PUT,
no conflicts, no selectors; mockernetes: no real watch). This server speaks the real wire
protocol, so the official ``kubernetes`` client talks to it unchanged and raises the same
``ApiException`` (status, reason, a ``Status`` body) as against a cluster. What it keeps, as
kube-apiserver does:

- namespaced pods, services, configmaps, secrets, events and coordination.k8s.io/v1 leases;
  cluster-scoped nodes; ``/status`` for pods, services and nodes; ``pods/binding``;
- one global resourceVersion, bumped by every write (a no-op update writes nothing);
  409 AlreadyExists on create, 409 Conflict on PUT/PATCH/DELETE with a stale resourceVersion
  or uid precondition;
- label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``) and field
  selectors (``metadata.name``, ``metadata.namespace`` and each type's own labels, e.g.
  ``status.phase``, ``spec.nodeName``), unknown field labels refused with 400;
- list (with ``limit``/``continue``) and watch from a resourceVersion: ADDED / MODIFIED /
  DELETED (an object that stops or starts matching the selector arrives as DELETED / ADDED,
  as the watch cache sends it), BOOKMARK when ``allowWatchBookmarks=true``, and for a
  resourceVersion older than the retained window (``history_size`` events, or ``compact()``)
  the real answer: HTTP 200 and one ERROR event holding a 410 ``Expired`` Status;
- merge patch; strategic merge patch treated as merge patch (lists are replaced, not merged by
  key: patch a whole list); JSON patch; server-side apply is refused (415);
- the status subresource: PUT/PATCH of the object keeps the stored status, of ``/status``
  changes only the status; pod spec updates limited to the fields the real API lets change;
- graceful deletion: a scheduled, unfinished pod gets ``deletionTimestamp`` and
  ``deletionGracePeriodSeconds`` and stays until the kubelet finishes it
  (:meth:`FakeKubeAPIServer.finish_deletion`) or a delete with ``gracePeriodSeconds=0``;
  an object with finalizers stays until an update removes the last one.

Not kept (a real cluster has them): authentication and RBAC, admission and schema validation,
namespaces as objects (every namespace exists), garbage collection by owner references,
consistent snapshots across list pages, server-side apply, protobuf and CBOR.

For tests: a request counter per verb and resource, also per User-Agent (``request_counts``,
e.g. what one client alone asked for, to check its RBAC), faults injected by
verb, resource, name or User-Agent with a status and/or a delay (``inject_fault``), the open
watches (``watch_count``), bookmarks and watch closes on demand.

Usage (the server runs on its own event loop in a thread, so synchronous client calls and
``asyncio.to_thread`` both work)::

    with FakeKubeAPIServer() as api:
        v1 = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(api.configuration()))
        v1.create_namespaced_pod("default", {...})
        api.finish_deletion("pods", "default", "p0")      # the kubelet confirms a graceful delete
        api.request_count(verb="list", resource="pods")
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import json
import random
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from aiohttp import web

JSON = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    status_subresource: bool = False
    graceful: bool = False
    """Deletion waits for the kubelet (pods)."""
    return_deleted: bool = False
    """DELETE answers with the object (pods, services); other types answer with a Status."""
    fields: tuple[str, ...] = ()
    """Field-selector labels beyond metadata.name and metadata.namespace."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The resource as error messages name it: ``pods``, ``leases.coordination.k8s.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: dict[str, ResourceType] = {rt.plural: rt for rt in (
    ResourceType("pods", "Pod", status_subresource=True, graceful=True, return_deleted=True,
                 fields=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                         "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                         "status.podIP", "status.nominatedNodeName")),
    ResourceType("services", "Service", status_subresource=True, return_deleted=True,
                 fields=("spec.clusterIP", "spec.type")),
    ResourceType("configmaps", "ConfigMap"),
    ResourceType("secrets", "Secret", fields=("type",)),
    ResourceType("events", "Event",
                 fields=("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                         "involvedObject.uid", "involvedObject.apiVersion",
                         "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                         "reportingComponent", "source", "type")),
    ResourceType("leases", "Lease", group="coordination.k8s.io"),
    ResourceType("nodes", "Node", namespaced=False, status_subresource=True,
                 fields=("spec.unschedulable",)),
)}

_BOOL_FIELDS = {"spec.hostNetwork", "spec.unschedulable"}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"   # generateName suffixes, as the apiserver picks them
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
            405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
            422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


class ApiError(Exception):
    """An error the server answers with a ``Status`` object, as kube-apiserver does."""

    def __init__(self, code: int, message: str, *, reason: str | None = None,
                 details: JSON | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.message = message
        self.details = details

    def status(self) -> JSON:
        body: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str) -> JSON:
    details: JSON = {"name": name, "kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    return details


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, f'{rt.qualified} "{name}" not found', details=_details(rt, name))


def _conflict(rt: ResourceType, name: str, message: str) -> ApiError:
    return ApiError(409, f'Operation cannot be fulfilled on {rt.qualified} "{name}": {message}',
                    details=_details(rt, name))


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _timestamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- selectors ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Requirement:
    key: str
    op: str            # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values      # "!=" and "notin"


_TOKEN = re.compile(r"\s*(==|!=|=|\(|\)|,|!|[A-Za-z0-9_.\-/]+)")


def parse_label_selector(text: str) -> list[Requirement]:
    """Kubernetes label-selector syntax; raises ``ApiError(400)`` on bad input."""
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ApiError(400, f"unable to parse requirement: unexpected {text[pos:]!r} in {text!r}")
        tokens.append(m.group(1))
        pos = m.end()
    reqs: list[Requirement] = []
    i = 0

    def bad(why: str) -> ApiError:
        return ApiError(400, f"unable to parse requirement: {why} in label selector {text!r}")

    def is_word(tok: str) -> bool:
        return tok not in ("==", "!=", "=", "(", ")", ",", "!")

    while i < len(tokens):
        if tokens[i] == "!":
            if i + 1 >= len(tokens) or not is_word(tokens[i + 1]):
                raise bad("'!' needs a key")
            reqs.append(Requirement(tokens[i + 1], "!exists"))
            i += 2
        elif is_word(tokens[i]):
            key = tokens[i]
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ","
            if nxt == ",":
                reqs.append(Requirement(key, "exists"))
                i += 1
            elif nxt in ("=", "==", "!="):
                value = tokens[i + 2] if i + 2 < len(tokens) and is_word(tokens[i + 2]) else ""
                reqs.append(Requirement(key, "!=" if nxt == "!=" else "=", (value,)))
                i += 3 if value else 2
            elif nxt in ("in", "notin"):
                if i + 2 >= len(tokens) or tokens[i + 2] != "(":
                    raise bad(f"'{nxt}' needs a parenthesised set")
                j = i + 3
                values: list[str] = []
                while j < len(tokens) and tokens[j] != ")":
                    if tokens[j] != ",":
                        if not is_word(tokens[j]):
                            raise bad(f"unexpected {tokens[j]!r} in a set")
                        values.append(tokens[j])
                    j += 1
                if j >= len(tokens):
                    raise bad("unclosed set")
                if not values:
                    raise bad("an empty set")
                reqs.append(Requirement(key, nxt, tuple(values)))
                i = j + 1
            else:
                raise bad(f"unexpected {nxt!r} after key {key!r}")
        else:
            raise bad(f"unexpected {tokens[i]!r}")
        if i < len(tokens):
            if tokens[i] != ",":
                raise bad(f"expected ',' before {tokens[i]!r}")
            i += 1
            if i == len(tokens):
                raise bad("trailing ','")
    return reqs


def _field_value(obj: JSON, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if path in _BOOL_FIELDS:
        return "true" if node else "false"
    if node is None:
        return ""
    return node if isinstance(node, str) else json.dumps(node)


def parse_field_selector(text: str, rt: ResourceType) -> list[tuple[str, bool, str]]:
    """``[(field, equal, value)]``; raises ``ApiError(400)`` for a label the type lacks."""
    terms: list[tuple[str, bool, str]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"([^!=]+?)\s*(==|!=|=)\s*(.*)", term)
        if not m:
            raise ApiError(400, f"invalid selector: {text!r}; can't understand {term!r}")
        name, op, value = m.groups()
        if name not in ("metadata.name", "metadata.namespace") and name not in rt.fields:
            raise ApiError(400, f'field label not supported: {name}')
        terms.append((name, op != "!=", value))
    return terms


@dataclass
class Selector:
    labels: list[Requirement] = field(default_factory=list)
    fields: list[tuple[str, bool, str]] = field(default_factory=list)

    def matches(self, obj: JSON) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        return all((_field_value(obj, f) == v) == eq for f, eq, v in self.fields)


# --- patches -------------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: JSON, ops: list[JSON]) -> JSON:
    """RFC 6902 (add, remove, replace, move, copy, test)."""
    doc = copy.deepcopy(doc)

    def parent(parts: list[str]) -> tuple[Any, str]:
        if not parts:
            raise ApiError(422, "a JSON patch cannot replace the whole object")
        node: Any = doc
        for part in parts[:-1]:
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError):
                raise ApiError(422, f"path /{'/'.join(parts)} does not exist") from None
        return node, parts[-1]

    def get(parts: list[str]) -> Any:
        node, last = parent(parts)
        try:
            return node[int(last)] if isinstance(node, list) else node[last]
        except (KeyError, IndexError, ValueError):
            raise ApiError(422, f"path /{'/'.join(parts)} does not exist") from None

    def remove(parts: list[str]) -> None:
        get(parts)
        node, last = parent(parts)
        del node[int(last) if isinstance(node, list) else last]

    def add(parts: list[str], value: Any) -> None:
        node, last = parent(parts)
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), value)
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ApiError(422, f"cannot add at /{'/'.join(parts)}")

    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind == "test":
            if get(parts) != op.get("value"):
                raise ApiError(422, f"testing value /{'/'.join(parts)} failed")
        elif kind == "remove":
            remove(parts)
        elif kind == "add":
            add(parts, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            remove(parts)
            add(parts, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(get(source))
            if kind == "move":
                remove(source)
            add(parts, value)
        else:
            raise ApiError(400, f"unknown JSON patch operation {kind!r}")
    return doc


# --- per-type rules -----------------------------------------------------------------------------

_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "schedulingGates")


def _pod_spec_defaults(spec: JSON) -> JSON:
    spec = copy.deepcopy(spec)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("restartPolicy", "Always")
    return spec


def _check_pod_spec_update(name: str, old: JSON, new: JSON) -> None:
    """Only a container's image, activeDeadlineSeconds, tolerations and scheduling gates change."""
    old_spec, new_spec = _pod_spec_defaults(old.get("spec") or {}), _pod_spec_defaults(new.get("spec") or {})
    probe = copy.deepcopy(old_spec)
    for key in _POD_MUTABLE:
        if key in new_spec:
            probe[key] = new_spec[key]
        else:
            probe.pop(key, None)
    for key in ("containers", "initContainers"):
        olds, news = probe.get(key) or [], new_spec.get(key) or []
        if len(olds) == len(news):
            for o, n in zip(olds, news):
                if "image" in n:
                    o["image"] = n["image"]
    if probe != new_spec:
        raise ApiError(422, f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change '
                            "fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, "
                            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to "
                            "existing tolerations) or `spec.schedulingGates`",
                       reason="Invalid", details=_details(RESOURCES["pods"], name))


def _fold_string_data(obj: JSON) -> None:
    """A Secret's ``stringData`` is write-only: stored base64-encoded into ``data``."""
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        data = obj.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _prepare_for_create(rt: ResourceType, obj: JSON) -> None:
    if rt.plural == "pods":
        obj["spec"] = _pod_spec_defaults(obj.get("spec") or {})
        obj["status"] = {"phase": "Pending"}
    elif rt.plural == "services":
        obj["status"] = {"loadBalancer": {}}
    elif rt.plural == "secrets":
        _fold_string_data(obj)
        obj.setdefault("type", "Opaque")
    # nodes keep the status they are created with (the kubelet registers a Ready node)


# --- watches ------------------------------------------------------------------------------------

@dataclass
class _Change:
    rv: int
    plural: str
    namespace: str
    type: str          # ADDED, MODIFIED, DELETED
    obj: JSON
    old: JSON | None = None


class _Watcher:
    def __init__(self, rt: ResourceType, namespace: str | None, selector: Selector) -> None:
        self.rt = rt
        self.namespace = namespace
        self.selector = selector
        self.bookmarks = False
        self.queue: asyncio.Queue[tuple[str, JSON] | None] = asyncio.Queue()

    def translate(self, change: _Change) -> tuple[str, JSON] | None:
        """What this watch sees of a change, as the watch cache filters it."""
        if change.plural != self.rt.plural:
            return None
        if self.namespace is not None and change.namespace != self.namespace:
            return None
        now = self.selector.matches(change.obj)
        if change.type != "MODIFIED" or change.old is None:
            return (change.type, change.obj) if now else None
        before = self.selector.matches(change.old)
        if now:
            return ("MODIFIED" if before else "ADDED", change.obj)
        if before:   # left the selection: the previous content at the new resourceVersion
            gone = copy.deepcopy(change.old)
            gone["metadata"]["resourceVersion"] = str(change.rv)
            return ("DELETED", gone)
        return None


@dataclass
class Fault:
    """Requests that match fail with ``status`` (after ``delay_s``), or only wait ``delay_s``.

    ``times`` limits how many requests it hits (None: until removed); ``hits`` counts them.
    """
    status: int | None = 503
    verb: str | None = None
    resource: str | None = None
    name: str | None = None
    user_agent: str | None = None
    delay_s: float = 0.0
    times: int | None = None
    message: str = "injected by the test"
    hits: int = 0

    def matches(self, verb: str, resource: str, name: str | None, user_agent: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return ((self.verb is None or self.verb == verb)
                and (self.resource is None or self.resource == resource)
                and (self.name is None or self.name == name)
                and (self.user_agent is None or self.user_agent in user_agent))


def _is_true(value: str | None) -> bool:
    return value in ("true", "True", "1")


class FakeKubeAPIServer:
    """See the module docstring. Start with ``with FakeKubeAPIServer() as api:`` or ``start()``."""

    def __init__(self, *, history_size: int = 1000, bookmark_interval_s: float = 1.0,
                 host: str = "127.0.0.1", port: int = 0, first_resource_version: int = 100) -> None:
        self.history_size = history_size
        self.bookmark_interval_s = bookmark_interval_s
        self._host, self._port = host, port
        self._objects: dict[tuple[str, str, str], JSON] = {}
        self._rv = first_resource_version
        self._compacted_rv = first_resource_version
        self._history: collections.deque[_Change] = collections.deque()
        self._watchers: set[_Watcher] = set()
        self._faults: list[Fault] = []
        self._lock = threading.Lock()   # counters and faults: read and written from test threads
        self._requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self._requests_by_agent: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._responses: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.log_source: Callable[[str, str], str | None] | None = None
        """``(namespace, pod) -> text`` for ``pods/NAME/log`` (the fake kubelet keeps the output);
        None from it: the container has not started."""

    # --- lifecycle ---

    def start(self) -> "FakeKubeAPIServer":
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="fake-kube-apiserver", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), loop).result(timeout=30)
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up ends its watch at once
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0,
                                     access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self._host}:{port}"

    def stop(self) -> None:
        if self._loop is None:
            return
        loop, thread = self._loop, self._thread

        async def shutdown() -> None:
            self._close_watches()
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=30)
            loop.close()
            self._loop = None

    def __enter__(self) -> "FakeKubeAPIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def configuration(self):
        """A ``kubernetes.client.Configuration`` pointed at this server."""
        from kubernetes import client

        return client.Configuration(host=self.url)

    # --- test helpers (callable from any thread) ---

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        if self._loop is None:
            return fn()
        if threading.current_thread() is self._thread:
            return fn()

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=30)

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion the server has handed out."""
        return str(self._rv)

    def get(self, plural: str, namespace: str | None, name: str) -> JSON | None:
        """A copy of the stored object, or None."""
        obj = self._on_loop(lambda: self._objects.get((plural, namespace or "", name)))
        return copy.deepcopy(obj)

    def objects(self, plural: str, namespace: str | None = None) -> list[JSON]:
        """Copies of the stored objects of one type (one namespace, or all)."""
        def pick() -> list[JSON]:
            return [o for (p, ns, _), o in sorted(self._objects.items())
                    if p == plural and (namespace is None or ns == namespace)]
        return copy.deepcopy(self._on_loop(pick))

    def finish_deletion(self, plural: str, namespace: str | None, name: str) -> None:
        """The kubelet's last word on a terminating object: its grace period is over.

        The object goes at once unless finalizers hold it. Raises ``LookupError`` when it
        does not exist or is not being deleted.
        """
        def finish() -> None:
            rt = RESOURCES[plural]
            key = (plural, namespace or "", name)
            old = self._objects.get(key)
            if old is None or not old["metadata"].get("deletionTimestamp"):
                raise LookupError(f"{plural} {namespace}/{name} is not terminating")
            new = copy.deepcopy(old)
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if not self._finalize_if_done(rt, key, new):
                self._write(rt, key, new, "MODIFIED", old)
        self._on_loop(finish)

    def compact(self) -> None:
        """Forget every past change (as etcd compaction does): older watches get 410."""
        def compact() -> None:
            self._history.clear()
            self._compacted_rv = self._rv
        self._on_loop(compact)

    def send_bookmarks(self) -> None:
        """Every watch that asked for bookmarks gets one now, at the current resourceVersion."""
        def send() -> None:
            for w in self._watchers:
                if w.bookmarks:
                    w.queue.put_nowait(("BOOKMARK", self._bookmark(w.rt)))
        self._on_loop(send)

    def close_watches(self) -> None:
        """End every open watch stream (as an apiserver restart or a watch timeout does)."""
        self._on_loop(self._close_watches)

    def watch_count(self, plural: str | None = None) -> int:
        return self._on_loop(lambda: sum(1 for w in self._watchers if plural in (None, w.rt.plural)))

    def inject_fault(self, status: int | None = 503, **match: Any) -> Fault:
        """Make matching requests fail (see :class:`Fault`); returns the fault to remove later."""
        fault = Fault(status=status, **match)
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults = [f for f in self._faults if f is not fault]

    def clear_faults(self) -> None:
        with self._lock:
            self._faults = []

    def request_counts(self, user_agent: str | None = None) -> collections.Counter[tuple[str, str]]:
        """Requests so far by (verb, resource), e.g. ``("list", "pods")``, ``("patch", "pods/status")``;
        with ``user_agent``, only those whose User-Agent header contains it (as :class:`Fault` matches)."""
        with self._lock:
            if user_agent is None:
                return collections.Counter(self._requests)
            out: collections.Counter[tuple[str, str]] = collections.Counter()
            for (agent, verb, resource), n in self._requests_by_agent.items():
                if user_agent in agent:
                    out[(verb, resource)] += n
            return out

    def request_count(self, verb: str | None = None, resource: str | None = None,
                      code: int | None = None) -> int:
        """Requests so far that match; with ``code``, those answered with that HTTP status."""
        with self._lock:
            if code is None:
                return sum(n for (v, r), n in self._requests.items()
                           if verb in (None, v) and resource in (None, r))
            return sum(n for (v, r, c), n in self._responses.items()
                       if verb in (None, v) and resource in (None, r) and c == code)

    # --- HTTP ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        route = self._route(request.path)
        if route is None:
            if request.path == "/version":
                return web.json_response({"major": "1", "minor": "37", "gitVersion": "v1.37.0-fake"})
            return self._error(ApiError(404, "the server could not find the requested resource"))
        rt, namespace, name, sub = route
        q = request.query
        method = request.method
        if method == "GET":
            verb = "get" if name else ("watch" if _is_true(q.get("watch")) else "list")
        elif method == "POST":
            verb = "create"
        elif method == "PUT":
            verb = "update"
        elif method == "PATCH":
            verb = "patch"
        elif method == "DELETE":
            verb = "delete" if name else "deletecollection"
        else:
            return self._error(ApiError(405, f"method {method} is not supported"))
        resource = f"{rt.plural}/{sub}" if sub else rt.plural
        agent = request.headers.get("User-Agent", "")
        with self._lock:
            self._requests[(verb, resource)] += 1
            self._requests_by_agent[(agent, verb, resource)] += 1
            fault = next((f for f in self._faults if f.matches(verb, resource, name, agent)), None)
            if fault is not None:
                fault.hits += 1
        try:
            if fault is not None:
                if fault.delay_s:
                    await asyncio.sleep(fault.delay_s)
                if fault.status is not None:
                    raise ApiError(fault.status, fault.message)
            response = await self._dispatch(request, verb, rt, namespace, name, sub)
        except ApiError as err:
            response = self._error(err)
        with self._lock:
            self._responses[(verb, resource, response.status)] += 1
        return response

    @staticmethod
    def _route(path: str) -> tuple[ResourceType, str | None, str | None, str | None] | None:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not 1 <= len(rest) <= 3:
            return None
        rt = RESOURCES.get(rest[0])
        if rt is None or rt.group != group or rt.version != version:
            return None
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if namespace is not None and not rt.namespaced:
            return None
        if namespace is None and rt.namespaced and name is not None:
            return None
        if sub is not None and not (sub == "status" and rt.status_subresource
                                    or sub in ("binding", "log") and rt.plural == "pods"):
            return None
        return rt, namespace, name, sub

    @staticmethod
    def _error(err: ApiError) -> web.Response:
        return web.json_response(err.status(), status=err.code)

    async def _dispatch(self, request: web.Request, verb: str, rt: ResourceType,
                        namespace: str | None, name: str | None, sub: str | None) -> web.StreamResponse:
        q = request.query
        if "dryRun" in q:
            raise ApiError(400, "dryRun is not supported by the fake API server")
        if verb == "watch":
            return await self._watch(request, rt, namespace)
        if verb == "list":
            return web.json_response(self._list(rt, namespace, q))
        if verb == "get" and sub == "log":
            return self._log(namespace, name, q)
        if verb == "get":
            return web.json_response(self._get(rt, namespace, name))
        body = await self._body(request)
        if verb == "create" and sub == "binding":
            return web.json_response(self._bind(rt, namespace, name, body), status=201)
        if verb == "create":
            if name is not None:
                raise ApiError(405, "POST is for a collection")
            return web.json_response(self._create(rt, namespace, body), status=201)
        if verb == "update":
            return web.json_response(self._update(rt, namespace, name, body, sub))
        if verb == "patch":
            ctype = request.content_type
            return web.json_response(self._patch(rt, namespace, name, body, ctype, sub))
        options = body if isinstance(body, dict) else {}
        if "gracePeriodSeconds" in q:
            options = {**options, "gracePeriodSeconds": int(q["gracePeriodSeconds"])}
        if verb == "delete":
            return web.json_response(self._delete(rt, namespace, name, options))
        return web.json_response(self._delete_collection(rt, namespace, q, options))

    def _log(self, namespace: str | None, name: str | None, q: Any) -> web.Response:
        """``pods/NAME/log``: the container's output as the kubelet keeps it (``log_source``),
        ``tailLines`` honoured; 400 while the container has not started, as kube-apiserver says."""
        self._stored(RESOURCES["pods"], namespace, name or "")  # 404 for a pod that does not exist
        text = self.log_source(namespace or "", name or "") if self.log_source is not None else None
        if text is None:
            raise ApiError(400, f'container "agent" in pod "{name}" is waiting to start: ContainerCreating')
        if "tailLines" in q:
            try:
                n = int(q["tailLines"])
            except ValueError:
                raise ApiError(400, f"tailLines: {q['tailLines']!r} is not an integer") from None
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-n:]) if n > 0 else ""
        return web.Response(text=text, content_type="text/plain")

    @staticmethod
    async def _body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        ctype = request.content_type
        if "yaml" in ctype or "cbor" in ctype or "protobuf" in ctype:
            raise ApiError(415, f"the body of the request was in an unknown format - accepted media "
                                f"types include: application/json (got {ctype})")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not JSON: {exc}") from None

    # --- storage ---

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str, str]:
        return (rt.plural, namespace or "", name)

    def _stored(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self._objects.get(self._key(rt, namespace, name))
        if obj is None:
            raise _not_found(rt, name)
        return obj

    def _write(self, rt: ResourceType, key: tuple[str, str, str], obj: JSON, kind: str,
               old: JSON | None) -> JSON:
        """Store ``obj`` (a fresh dict never mutated afterwards) at a new resourceVersion."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self._record(_Change(self._rv, rt.plural, key[1], kind, obj, old))
        return obj

    def _remove(self, rt: ResourceType, key: tuple[str, str, str], obj: JSON) -> JSON:
        self._rv += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        del self._objects[key]
        self._record(_Change(self._rv, rt.plural, key[1], "DELETED", gone))
        return gone

    def _record(self, change: _Change) -> None:
        self._history.append(change)
        while len(self._history) > self.history_size:
            self._compacted_rv = self._history.popleft().rv
        for w in self._watchers:
            seen = w.translate(change)
            if seen is not None:
                w.queue.put_nowait(seen)

    def _finalize_if_done(self, rt: ResourceType, key: tuple[str, str, str], obj: JSON) -> bool:
        """Remove a terminating object whose grace period is over and finalizers are gone."""
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return False
        if rt.graceful and meta.get("deletionGracePeriodSeconds", 0) > 0:
            return False
        self._remove(rt, key, obj)
        return True

    # --- verbs ---

    def _get(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        return self._stored(rt, namespace, name)

    def _selector(self, rt: ResourceType, q: Any) -> Selector:
        return Selector(parse_label_selector(q.get("labelSelector", "")),
                        parse_field_selector(q.get("fieldSelector", ""), rt))

    def _selected(self, rt: ResourceType, namespace: str | None, selector: Selector) -> list[JSON]:
        return [obj for (plural, ns, _), obj in sorted(self._objects.items())
                if plural == rt.plural and (namespace is None or ns == namespace)
                and selector.matches(obj)]

    def _list(self, rt: ResourceType, namespace: str | None, q: Any) -> JSON:
        items = self._selected(rt, namespace, self._selector(rt, q))
        list_rv = self._rv
        if q.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(q["continue"]))
                list_rv, after = int(token["rv"]), tuple(token["after"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "continue key is not valid") from None
            if list_rv < self._compacted_rv:
                raise ApiError(410, "The provided continue parameter is too old to display a consistent "
                                    "list result. You can start a new list without the continue parameter.")
            items = [o for o in items
                     if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
        meta: JSON = {"resourceVersion": str(list_rv)}
        limit = int(q.get("limit", 0) or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": list_rv, "after": [last.get("namespace", ""), last["name"]]}).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        # list items carry no kind/apiVersion, as the real server sends them
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta,
                "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]}

    def _create(self, rt: ResourceType, namespace: str | None, body: Any) -> JSON:
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be an object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise ApiError(400, "the namespace of the provided object does not match the namespace "
                                "sent on the request")
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(random.choice(_NAME_CHARS) for _ in range(5))
        if not name:
            raise ApiError(422, f'{rt.kind} "" is invalid: metadata.name: Required value: name or '
                                "generateName is required", details={"kind": rt.kind})
        key = self._key(rt, namespace, name)
        if key in self._objects:
            raise ApiError(409, f'{rt.qualified} "{name}" already exists', reason="AlreadyExists",
                           details=_details(rt, name))
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _timestamp(_now())
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(transient, None)
        _prepare_for_create(rt, obj)
        return self._write(rt, key, obj, "ADDED", None)

    def _check_preconditions(self, rt: ResourceType, name: str, old: JSON,
                             rv: str | None, uid: str | None) -> None:
        meta = old["metadata"]
        if uid and uid != meta["uid"]:
            raise _conflict(rt, name, f"Precondition failed: UID in precondition: {uid}, "
                                      f"UID in object meta: {meta['uid']}")
        if rv and rv != meta["resourceVersion"]:
            raise _conflict(rt, name, STALE)

    def _update(self, rt: ResourceType, namespace: str | None, name: str, body: Any,
                sub: str | None) -> JSON:
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be an object")
        key = self._key(rt, namespace, name)
        old = self._stored(rt, namespace, name)
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match the name "
                                f"on the URL ({name})")
        if rt.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise ApiError(400, "the namespace of the provided object does not match the namespace "
                                "sent on the request")
        self._check_preconditions(rt, name, old, meta.get("resourceVersion"), meta.get("uid"))
        new = self._next_version(rt, old, body, sub)
        if new == old:
            return old       # a no-op update writes nothing and keeps the resourceVersion
        self._write(rt, key, new, "MODIFIED", old)
        self._finalize_if_done(rt, key, new)
        return new

    def _next_version(self, rt: ResourceType, old: JSON, body: JSON, sub: str | None) -> JSON:
        """The object an update of ``old`` to ``body`` stores (before its new resourceVersion)."""
        if sub == "status":
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
            return new
        new = copy.deepcopy(body)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        for kept in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                     "deletionGracePeriodSeconds", "resourceVersion"):
            if kept in old["metadata"]:
                meta[kept] = old["metadata"][kept]
            else:
                meta.pop(kept, None)
        if old["metadata"].get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
            if added:
                raise ApiError(422, f'{rt.kind} "{meta["name"]}" is invalid: metadata.finalizers: '
                                    f"Forbidden: no new finalizers can be added if the object is being "
                                    f"deleted, found new finalizers {sorted(added)}")
        if rt.status_subresource:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        if rt.plural == "pods":
            new["spec"] = _pod_spec_defaults(new.get("spec") or {})
            _check_pod_spec_update(meta["name"], old, new)
        if rt.plural == "secrets":
            _fold_string_data(new)
            new.setdefault("type", old.get("type", "Opaque"))
        return new

    def _patch(self, rt: ResourceType, namespace: str | None, name: str, body: Any, ctype: str,
               sub: str | None) -> JSON:
        old = self._stored(rt, namespace, name)
        if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, "a merge patch must be a JSON object")
            patched = merge_patch(old, body)
            rv = (body.get("metadata") or {}).get("resourceVersion")
            uid = (body.get("metadata") or {}).get("uid")
        elif ctype == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "a JSON patch must be a list of operations")
            patched = json_patch(old, body)
            rv, uid = patched["metadata"].get("resourceVersion"), patched["metadata"].get("uid")
            if rv == old["metadata"]["resourceVersion"]:
                rv = None
        else:
            raise ApiError(415, f"the server does not support patch type {ctype!r} (server-side apply "
                                "is not part of the fake)")
        self._check_preconditions(rt, name, old, rv, uid)
        patched.setdefault("metadata", {})["name"] = name
        return self._update(rt, namespace, name, {**patched, "metadata": {
            **patched["metadata"], "resourceVersion": old["metadata"]["resourceVersion"],
            "uid": old["metadata"]["uid"]}}, sub)

    def _bind(self, rt: ResourceType, namespace: str | None, name: str, body: Any) -> JSON:
        old = self._stored(rt, namespace, name)
        node = ((body or {}).get("target") or {}).get("name")
        if not node:
            raise ApiError(422, f'Binding "{name}" is invalid: target.name: Required value')
        if (old.get("spec") or {}).get("nodeName"):
            raise _conflict(rt, name, f'pod {name} is already assigned to node "{old["spec"]["nodeName"]}"')
        new = copy.deepcopy(old)
        new["spec"]["nodeName"] = node
        self._write(rt, self._key(rt, namespace, name), new, "MODIFIED", old)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _grace_period(self, rt: ResourceType, obj: JSON, options: JSON) -> int:
        if not rt.graceful:
            return 0
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        # an unscheduled or finished pod has no kubelet to wait for
        if not (obj.get("spec") or {}).get("nodeName"):
            grace = 0
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            grace = 0
        return max(0, int(grace))

    def _delete(self, rt: ResourceType, namespace: str | None, name: str, options: JSON) -> JSON:
        key = self._key(rt, namespace, name)
        old = self._stored(rt, namespace, name)
        pre = options.get("preconditions") or {}
        self._check_preconditions(rt, name, old, pre.get("resourceVersion"), pre.get("uid"))
        grace = self._grace_period(rt, old, options)
        meta = old["metadata"]
        if grace == 0 and not meta.get("finalizers"):
            gone = self._remove(rt, key, old)
            return gone if rt.return_deleted else self._success(rt, gone)
        current = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and current is not None and grace >= current:
            return old      # a delete may shorten a grace period, never lengthen it
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = _timestamp(_now() + timedelta(seconds=grace))
        new["metadata"]["deletionGracePeriodSeconds"] = grace
        self._write(rt, key, new, "MODIFIED", old)
        if self._finalize_if_done(rt, key, new):
            return new if rt.return_deleted else self._success(rt, new)
        return new

    @staticmethod
    def _success(rt: ResourceType, obj: JSON) -> JSON:
        details = _details(rt, obj["metadata"]["name"])
        details["uid"] = obj["metadata"]["uid"]
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": details}

    def _delete_collection(self, rt: ResourceType, namespace: str | None, q: Any,
                           options: JSON) -> JSON:
        deleted = []
        for obj in self._selected(rt, namespace, self._selector(rt, q)):
            meta = obj["metadata"]
            result = self._delete(rt, meta.get("namespace"), meta["name"], options)
            if result.get("kind") != "Status":
                deleted.append({k: v for k, v in result.items() if k not in ("kind", "apiVersion")})
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self._rv)}, "items": deleted}

    # --- watch ---

    def _bookmark(self, rt: ResourceType) -> JSON:
        return {"kind": rt.kind, "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self._rv)}}

    def _close_watches(self) -> None:
        for w in self._watchers:
            w.queue.put_nowait(None)

    async def _watch(self, request: web.Request, rt: ResourceType,
                     namespace: str | None) -> web.StreamResponse:
        q = request.query
        watcher = _Watcher(rt, namespace, self._selector(rt, q))
        watcher.bookmarks = _is_true(q.get("allowWatchBookmarks"))
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        since = q.get("resourceVersion", "")
        expired: ApiError | None = None
        # from here to registering the watcher nothing awaits: no change can slip between
        if since in ("", "0"):
            for obj in self._selected(rt, namespace, watcher.selector):
                watcher.queue.put_nowait(("ADDED", obj))
        else:
            try:
                start = int(since)
            except ValueError:
                raise ApiError(400, f"invalid resource version {since!r}") from None
            if start < self._compacted_rv:
                expired = ApiError(410, f"too old resource version: {start} ({self._compacted_rv})",
                                   reason="Expired")
            else:
                for change in self._history:
                    if change.rv > start:
                        seen = watcher.translate(change)
                        if seen is not None:
                            watcher.queue.put_nowait(seen)
        if expired is None:
            self._watchers.add(watcher)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        loop = asyncio.get_running_loop()
        try:
            await response.prepare(request)
            if expired is not None:
                await self._send(response, "ERROR", expired.status())
                return response
            deadline = loop.time() + timeout if timeout else None
            next_bookmark = loop.time() + self.bookmark_interval_s
            while True:
                wake = [t for t in (deadline, next_bookmark if watcher.bookmarks else None) if t]
                wait = max(0.0, min(wake) - loop.time()) if wake else None
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except asyncio.TimeoutError:
                    if deadline is not None and loop.time() >= deadline:
                        break
                    # the queue is empty: every change up to now is delivered or filtered
                    item = ("BOOKMARK", self._bookmark(rt))
                if item is None:
                    break
                if item[0] == "BOOKMARK":
                    next_bookmark = loop.time() + self.bookmark_interval_s
                await self._send(response, *item)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self._watchers.discard(watcher)
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: JSON) -> None:
        await response.write(json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n")
