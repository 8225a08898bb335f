"""A fake Kubernetes API server (aiohttp) that keeps the contract the Kubernetes platform uses.

No kube-apiserver can run on these machines, and the fakes on PyPI fall short (kmock: no PUT,
no conflicts, no selectors; mockernetes: no real watch). This server speaks the real wire
protocol, so the official ``kubernetes`` client talks to it unchanged and raises the same
``ApiException`` (status, reason, a ``Status`` body) as against a cluster. What it keeps, as
kube-apiserver does:

- namespaced pods, services, configmaps, secrets, events, resourcequotas,
  coordination.k8s.io/v1 leases and policy/v1 poddisruptionbudgets; cluster-scoped nodes,
  namespaces and scheduling.k8s.io/v1 priorityclasses; ``/status`` for pods, services, nodes,
  namespaces, resourcequotas and poddisruptionbudgets; ``pods/binding``, ``pods/eviction``;
- custom resources, stored by group and plural (two groups may share one): Volcano's
  ``scheduling.volcano.sh/v1beta1`` and scheduler-plugins' ``scheduling.x-k8s.io/v1alpha1``
  podgroups, Kueue's ``kueue.x-k8s.io/v1beta1`` workloads and localqueues (namespaced),
  clusterqueues and resourceflavors (cluster-scoped); through ``CustomObjectsApi`` they list,
  watch, select (``metadata.name``/``namespace`` fields only) and keep a ``/status`` subresource
  (resourceflavors have none) and ``metadata.generation`` (bumped by changes outside status),
  as their CRDs declare; their schemas are not checked, but a body must carry its kind and
  apiVersion (400 ``Object 'Kind' is missing in '...'``, 422 ``kind: Invalid value: "X": must be
  PodGroup``) and their list items keep both (built-in list items carry neither). For every type
  a body naming another group/version is the handlers' 400 ``the API version in the data (a/v1)
  does not match the expected API version (b/v1)``;
- ``dryRun=All`` (query or DeleteOptions) on create, update, patch, delete and eviction: decoded,
  defaulted, validated and admitted as a real write, then nothing stored, no resourceVersion
  spent, no watch event, no controller run; the answer is the dry-run storage's: a create
  without a resourceVersion (uid and creationTimestamp set), an update with the old one, a
  graceful delete with its deletionTimestamp. Any other value: 422 ``CreateOptions.meta.k8s.io
  "" is invalid: dryRun: Unsupported value: []string{"x"}: supported values: "All"`` (Update-,
  Patch-, DeleteOptions as the verb is);
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
  an object with finalizers stays until an update removes the last one;
- decoding as a 1.30 server does it (``validate=True``): every create, update and patch result
  is checked against the Kubernetes 1.30 OpenAPI schema (``kubernetes-validate``, strict; a
  validator cached per kind; kinds it has no schema for, custom resources, are not checked).
  An unknown field is, per the request's ``fieldValidation`` (the constructor's
  ``field_validation`` when it names none; default Strict, where the real server's default is
  Warn): Strict a 400 ``Pod in version "v1" cannot be handled as a Pod: strict decoding error:
  unknown field "spec.x"``, Warn dropped with a ``Warning: 299 - "unknown field ..."`` header,
  Ignore dropped. A wrong JSON type or a malformed quantity: 400 (``json: cannot unmarshal``,
  ``quantities must match the regular expression ...``). (The ``kubernetes`` client 37 itself
  refuses unknown fields and wrong types in a body before sending it.);
- validation (pkg/apis/core/validation, the messages verbatim): metadata.name (DNS-1123
  subdomain; a Service's a DNS-1035 label), namespace, label keys and values, annotation keys
  and total size, ownerReferences, finalizers; pods: containers required and named as DNS
  labels without duplicates, image required and not padded, imagePullPolicy, env names and
  sources, resources (quantities, requests <= limits, extended resources integers with
  requests equal to limits), volume mounts naming a volume, restartPolicy, dnsPolicy,
  hostname and subdomain (DNS labels), serviceAccountName, nodeName, nodeSelector, node
  affinity terms, tolerations, scheduling gates (qualified, unique; not with nodeName at
  create; an update may only remove them); services (type, ports, port names, selector);
  secrets and configmaps (keys, base64, 1 MiB; a Secret's type immutable); leases; events
  (involvedObject.namespace). A failure is the real 422 ``Invalid`` Status: ``Pod "x" is
  invalid: <field>: <error>`` (several in ``[...]``), ``details.causes`` with each field's
  ``reason`` (FieldValueInvalid, FieldValueRequired, ...), ``message`` and ``field``;
- pod defaults and admission at create: ``imagePullPolicy`` (Always for ``:latest``/no tag),
  ``terminationMessagePath``/``Policy``, ``dnsPolicy``, ``schedulerName``, ``securityContext``,
  ``enableServiceLinks``, ``serviceAccountName: default``, the DefaultTolerationSeconds
  tolerations (not-ready/unreachable, NoExecute, 300 s), ``status.qosClass``;
- the Priority plugin backed by PriorityClass objects (system-cluster-critical and
  system-node-critical built in, plus the constructor's ``priority_classes``): ``priority`` and
  ``preemptionPolicy`` from ``priorityClassName``, or from the ``globalDefault`` class (whose name
  the pod then carries); 403 ``no PriorityClass with name x was found``; one globalDefault only
  (403), user values up to 1000000000 and ``system-`` names reserved (422), value and
  preemptionPolicy immutable, the system classes undeletable (403);
- namespaces as objects: ``default``, ``kube-system``, ``kube-public`` and ``kube-node-lease``
  exist from the start; each gets ``spec.finalizers: [kubernetes]``, ``status.phase: Active`` and
  the ``kubernetes.io/metadata.name`` label; default, kube-system and kube-public may not be
  deleted (403); a delete answers the namespace Terminating, then
  everything in it and the namespace itself are gone. A namespace never created still exists
  implicitly for namespaced objects (and has no labels);
- PodSecurity admission (pod create, dry run included, and a pod update that changes an image):
  the namespace's ``pod-security.kubernetes.io/enforce`` (privileged|baseline|restricted) and
  ``enforce-version`` (``latest``, ``v1.N``) refuse with 403 ``pods "x" is forbidden: violates
  PodSecurity "restricted:latest": <reason> (<detail>), ...`` in the policy registry's check
  order, the messages of k8s.io/pod-security-admission; ``warn`` (defaulting to a stricter
  enforce) adds ``Warning: would violate PodSecurity ...``. Checks kept: baseline host
  namespaces, privileged, non-default capabilities, hostPath volumes, host ports, probe and
  lifecycle hosts (1.34+), procMount, AppArmor, SELinux options, seccomp Unconfined, sysctls
  (the safe set of each version), Windows hostProcess; restricted allowPrivilegeEscalation, capabilities drop ALL, procMount (1.35+),
  volume types, runAsNonRoot, runAsUser=0, seccompProfile RuntimeDefault/Localhost (Windows
  pods and ``hostUsers: false`` relaxed as the policy versions say). Bad labels on a namespace: 422; a
  stricter enforce label on an existing namespace warns ``existing pods in namespace ... violate
  the new PodSecurity enforce level`` and names the pods, as the admission does;
- ResourceQuota admission (any namespaced create, dry run included) and the quota controller:
  ``status.hard``/``status.used`` kept at once (quantities printed canonically, ``4096Mi`` as
  ``4Gi``) for pods, count/pods, cpu, memory, requests.*/limits.* of cpu, memory and
  ephemeral-storage, hugepages, extended resources (only as ``requests.nvidia.com/gpu``: a bare
  ``nvidia.com/gpu`` is a valid name that limits nothing), ``count/<resource>.<group>`` and the
  legacy configmaps/secrets/services counts; single-segment names must be standard quota
  resources (422). Finished pods stop counting except in count/pods. 403 ``exceeded quota: q,
  requested: requests.cpu=1, used: requests.cpu=1500m, limited: requests.cpu=2`` and ``failed
  quota: q: must specify requests.cpu for: agent; requests.memory for: agent`` (cpu/memory
  quotas need every container to say them); ``scopes`` and ``scopeSelector`` (Terminating,
  NotTerminating, BestEffort, NotBestEffort, PriorityClass, CrossNamespacePodAffinity) limit a
  quota to the pods they match, in admission and in ``status.used``;
- the disruption controller: each PodDisruptionBudget's status (``expectedPods``,
  ``currentHealthy`` from Ready, undeleted matching pods, ``desiredHealthy``,
  ``disruptionsAllowed``, ``observedGeneration``, the DisruptionAllowed condition
  SufficientPods/InsufficientPods) rewritten after every pod or budget write; an integer
  ``minAvailable`` counts the matching pods, while ``maxUnavailable`` or a percentage needs the
  pods' controllers' scale: unmanaged pods are skipped (so no disruption is allowed) and a pod
  with a controller is the real SyncFailed ``found no controllers for pod "x"`` (the fake keeps
  no Deployment/ReplicaSet/StatefulSet). The eviction subresource decides as EvictionREST does:
  a Pending, finished or terminating pod is deleted outright, else its one budget must allow a
  disruption or the answer is 429 ``Cannot evict pod as it would violate the pod's disruption
  budget.`` with a ``DisruptionBudget`` cause (``needs 2 healthy pods and has 2 currently``),
  two budgets a 500; an allowed eviction is a graceful delete and answers 201 Success;
- ``sendInitialEvents=true`` watches (with ``resourceVersionMatch=NotOlderThan`` and
  bookmarks, else 422): the current objects, then a BOOKMARK annotated
  ``k8s.io/initial-events-end: "true"``; other bookmarks carry only ``metadata.resourceVersion``.

Not kept (a real cluster has them): authentication and RBAC, the admission plugins not named
above (LimitRanger, NamespaceLifecycle's 404 for a namespace never created, webhooks, Kueue's
and Volcano's own webhooks and controllers), a limit without a request stored as the request
(only counted so: the stored spec keeps what the client sent), quantities stored canonically
(only quota status prints them so), the validation of status updates beyond the schema, custom
resources' OpenAPI schemas, PodSecurity's seccomp annotation check of versions before 1.19,
its audit annotations and exemptions,
quota on pod updates, the quota status lag (admission never meets "status unknown"), PDB
``disruptedPods`` and ``unhealthyPodEvictionPolicy``, a terminating namespace that waits for
its pods' grace periods, garbage collection by owner references, consistent snapshots across
list pages, server-side apply, protobuf and CBOR.

For tests: a request counter per verb and resource, also per User-Agent (``request_counts``,
e.g. what one client alone asked for, to check its RBAC), faults injected by
verb, resource, name or User-Agent with a status and/or a delay (``inject_fault``), the open
watches (``watch_count``), bookmarks and watch closes on demand. ``get``, ``objects`` and
``finish_deletion`` take a plural or, where two groups share it, the qualified resource
(``podgroups.scheduling.volcano.sh``); request counts name a resource by its plural, or
qualified where the plural is shared.

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
import contextvars
import copy
import hashlib
import json
import random
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from fractions import Fraction
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
    custom: bool = False
    """A custom resource (its CRD's schema is not checked)."""
    generation: bool = False
    """``metadata.generation`` kept (1 at create, +1 for each change outside ``status``); every
    custom resource keeps it too."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The resource as error messages name it: ``pods``, ``leases.coordination.k8s.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCE_TYPES: tuple[ResourceType, ...] = (
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
    ResourceType("namespaces", "Namespace", namespaced=False, status_subresource=True,
                 return_deleted=True, fields=("status.phase",)),
    ResourceType("resourcequotas", "ResourceQuota", status_subresource=True, return_deleted=True),
    ResourceType("priorityclasses", "PriorityClass", group="scheduling.k8s.io", namespaced=False),
    ResourceType("poddisruptionbudgets", "PodDisruptionBudget", group="policy",
                 status_subresource=True, generation=True),
    # custom resources (no schema: their CRDs' OpenAPI is not checked), as their CRDs declare them
    ResourceType("podgroups", "PodGroup", group="scheduling.volcano.sh", version="v1beta1",
                 status_subresource=True, custom=True),
    ResourceType("podgroups", "PodGroup", group="scheduling.x-k8s.io", version="v1alpha1",
                 status_subresource=True, custom=True),
    ResourceType("workloads", "Workload", group="kueue.x-k8s.io", version="v1beta1",
                 status_subresource=True, custom=True),
    ResourceType("localqueues", "LocalQueue", group="kueue.x-k8s.io", version="v1beta1",
                 status_subresource=True, custom=True),
    ResourceType("clusterqueues", "ClusterQueue", group="kueue.x-k8s.io", version="v1beta1",
                 namespaced=False, status_subresource=True, custom=True),
    ResourceType("resourceflavors", "ResourceFlavor", group="kueue.x-k8s.io", version="v1beta1",
                 namespaced=False, custom=True),
)
RESOURCES: dict[str, ResourceType] = {rt.qualified: rt for rt in RESOURCE_TYPES}
"""Every type by its qualified resource (``pods``, ``podgroups.scheduling.volcano.sh``) and, where
no two groups share it, by its plural alone (``leases``, ``workloads``)."""
RESOURCES.update({rt.plural: rt for rt in RESOURCE_TYPES
                  if sum(o.plural == rt.plural for o in RESOURCE_TYPES) == 1})
_BY_GROUP: dict[tuple[str, str], ResourceType] = {(rt.group, rt.plural): rt for rt in RESOURCE_TYPES}



def _resource(name: str) -> ResourceType:
    """A type by its plural or qualified resource name (``RESOURCES``); ``KeyError`` names both."""
    try:
        return RESOURCES[name]
    except KeyError:
        raise KeyError(f"no resource {name!r} (a plural two groups share needs its group: "
                       f"{sorted(k for k in RESOURCES if '.' in k)})") from None


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
        self.reason = _REASONS.get(code, "Unknown") if reason is None else reason
        self.message = message
        self.details = details

    def status(self) -> JSON:
        body: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": self.message, "code": self.code}
        if self.reason:       # a Status a handler builds itself may name none
            body["reason"] = self.reason
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


def _forbidden(rt: ResourceType, name: str, message: str) -> ApiError:
    """apierrors.NewForbidden, as admission plugins answer: ``pods "x" is forbidden: <why>``."""
    return ApiError(403, f'{rt.qualified} "{name}" is forbidden: {message}', details=_details(rt, name))


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


# --- quantities -----------------------------------------------------------------------------------

QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_QUANTITY_BODY = re.compile(QUANTITY_PATTERN[1:-1])
_BINARY_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL_SUFFIXES = {"n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000), "": Fraction(1),
                     "k": Fraction(10 ** 3), "M": Fraction(10 ** 6), "G": Fraction(10 ** 9),
                     "T": Fraction(10 ** 12), "P": Fraction(10 ** 15), "E": Fraction(10 ** 18)}


class QuantityError(ValueError):
    """Not a Kubernetes quantity; the message is resource.ParseQuantity's."""


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes quantity (``"500m"``, ``"1Gi"``, ``"2e3"``, ``8``) as an exact number of base
    units (cores, bytes, devices). Raises :class:`QuantityError` with the API's own messages."""
    if isinstance(value, bool):
        raise QuantityError("quantities must be strings or numbers")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError("quantities must be strings or numbers")
    m = _QUANTITY_BODY.fullmatch(value)
    if not m:
        raise QuantityError(f"quantities must match the regular expression '{QUANTITY_PATTERN}'")
    number, suffix = m.groups()
    try:
        amount = Fraction(Decimal(number))
    except (InvalidOperation, ValueError):
        raise QuantityError("unable to parse numeric part of quantity") from None
    if suffix in _BINARY_SUFFIXES:
        return amount * _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return amount * _DECIMAL_SUFFIXES[suffix]
    e = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
    if e:
        return amount * Fraction(10) ** int(e.group(1))
    raise QuantityError("unable to parse quantity's suffix")


# --- the API's name and label rules (k8s.io/apimachinery/pkg/util/validation) --------------------

def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    return msg + " (e.g. " + " or ".join(f"'{e}', " for e in examples) + f"regex used for validation is '{fmt}')"


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _QNAME_FMT + ")?"
_ENV_VAR_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"
_CONFIG_KEY_FMT = "[-._a-zA-Z0-9]+"


def _full(fmt: str) -> re.Pattern:
    return re.compile("^(?:" + fmt + ")$")


_RX = {fmt: _full(fmt) for fmt in (_DNS1123_LABEL_FMT, _DNS1123_SUBDOMAIN_FMT, _DNS1035_LABEL_FMT, _QNAME_FMT,
                                   _LABEL_VALUE_FMT, _ENV_VAR_FMT, _CONFIG_KEY_FMT)}


def is_dns1123_label(value: str) -> list[str]:
    errs = [_max_len(63)] if len(value) > 63 else []
    if not _RX[_DNS1123_LABEL_FMT].match(value):
        if _RX[_DNS1123_SUBDOMAIN_FMT].match(value):
            errs.append("must not contain dots")
        else:
            errs.append(_regex_error("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                                     "or '-', and must start and end with an alphanumeric character",
                                     _DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = [_max_len(253)] if len(value) > 253 else []
    if not _RX[_DNS1123_SUBDOMAIN_FMT].match(value):
        errs.append(_regex_error("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                                 "characters, '-' or '.', and must start and end with an alphanumeric character",
                                 _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errs


def is_dns1035_label(value: str) -> list[str]:
    errs = [_max_len(63)] if len(value) > 63 else []
    if not _RX[_DNS1035_LABEL_FMT].match(value):
        errs.append(_regex_error("a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                                 "start with an alphabetic character, and end with an alphanumeric character",
                                 _DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return errs


def is_qualified_name(value: str) -> list[str]:
    """A label key (``[prefix/]name``), as IsQualifiedName says it."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs += ["prefix part " + m for m in is_dns1123_subdomain(prefix)]
    else:
        return ["a qualified name " + _regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character", _QNAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _max_len(63))
    if not _RX[_QNAME_FMT].match(name):
        errs.append("name part " + _regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character", _QNAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def is_label_value(value: str) -> list[str]:
    errs = [_max_len(63)] if len(value) > 63 else []
    if not _RX[_LABEL_VALUE_FMT].match(value):
        errs.append(_regex_error("a valid label must be an empty string or consist of alphanumeric characters, '-', "
                                 "'_' or '.', and must start and end with an alphanumeric character",
                                 _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def _chdir_prefix(value: str) -> list[str]:
    if value == ".":
        return ["must not be '.'"]
    if value == "..":
        return ["must not be '..'"]
    if value.startswith(".."):
        return ["must not start with '..'"]
    return []


def is_env_var_name(value: str) -> list[str]:
    errs = [] if _RX[_ENV_VAR_FMT].match(value) else [_regex_error(
        "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and "
        "must not start with a digit", _ENV_VAR_FMT, "my.env-name", "MY_ENV.NAME", "MyEnvName1")]
    return errs + _chdir_prefix(value)


def is_config_map_key(value: str) -> list[str]:
    errs = [_max_len(253)] if len(value) > 253 else []
    if not _RX[_CONFIG_KEY_FMT].match(value):
        errs.append(_regex_error("a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                                 _CONFIG_KEY_FMT, "key.name", "KEY_NAME", "key-name"))
    return errs + _chdir_prefix(value)


def is_valid_port_name(value: str) -> list[str]:
    errs = [_max_len(15)] if len(value) > 15 else []
    if not re.fullmatch(r"[-a-z0-9]+", value):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search(r"[a-z]", value):
        errs.append("must contain at least one letter (a-z)")
    if "--" in value:
        errs.append("must not contain consecutive hyphens")
    if value and (value[0] == "-" or value[-1] == "-"):
        errs.append("must not begin or end with a hyphen")
    return errs


# --- field errors, as field.Error and apierrors.NewInvalid write them ---------------------------

_ERROR_TYPES = {"Required": ("FieldValueRequired", "Required value"),
                "Invalid": ("FieldValueInvalid", "Invalid value"),
                "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
                "Forbidden": ("FieldValueForbidden", "Forbidden"),
                "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
                "NotFound": ("FieldValueNotFound", "Not found"),
                "TooLong": ("FieldValueTooLong", "Too long")}
_NO_VALUE = object()


class _GoValue(str):
    """A bad value already printed as Go's ``%#v`` prints it (``[]string{"x"}``)."""


@dataclass(frozen=True)
class FieldError:
    type: str           # a key of _ERROR_TYPES
    field: str          # "metadata.labels", "spec.containers[0].name"
    value: Any = _NO_VALUE
    detail: str = ""

    def body(self) -> str:
        text = _ERROR_TYPES[self.type][1]
        if self.type not in ("Required", "Forbidden", "TooLong") and self.value is not _NO_VALUE:
            v = self.value
            if v is None:
                text += ": null"
            elif isinstance(v, bool):
                text += f": {'true' if v else 'false'}"
            elif isinstance(v, (int, float)):
                text += f": {v}"
            elif isinstance(v, _GoValue):
                text += f": {v}"
            elif isinstance(v, str):
                text += ": " + json.dumps(v, ensure_ascii=False)
            else:
                text += ": " + json.dumps(v, ensure_ascii=False, separators=(",", ":"))
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def _not_supported(path: str, value: Any, valid: list[str]) -> FieldError:
    return FieldError("NotSupported", path, value, "supported values: " + ", ".join(json.dumps(v) for v in valid))


def invalid_error(rt: "ResourceType", name: str, errs: list[FieldError]) -> ApiError:
    """The 422 ``Invalid`` Status of apierrors.NewInvalid: ``Pod "x" is invalid: <errors>``."""
    unique: list[FieldError] = []
    seen: set[str] = set()
    for err in errs:
        if str(err) not in seen:
            seen.add(str(err))
            unique.append(err)
    aggregate = str(unique[0]) if len(unique) == 1 else "[" + ", ".join(map(str, unique)) + "]"
    qualified = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    details: JSON = {"name": name, "kind": rt.kind,
                     "causes": [{"reason": _ERROR_TYPES[e.type][0], "message": e.body(), "field": e.field}
                                for e in unique]}
    if rt.group:
        details["group"] = rt.group
    return ApiError(422, f'{qualified} "{name}" is invalid: {aggregate}', reason="Invalid", details=details)


# --- the OpenAPI schema (kubernetes-validate, strict), as the API server's decoder enforces it -----

SCHEMA_VERSION = "1.30"
"""The Kubernetes version whose OpenAPI schema objects are checked against (the chart's kubeVersion)."""

_SCHEMAS: dict[tuple[str, str, str], Any] = {}
_SCHEMA_LOCK = threading.Lock()


def _schema_validator(kind: str, api_version: str, version: str = SCHEMA_VERSION) -> Any:
    """A cached (jsonschema validator, definitions) for one kind (None: kubernetes-validate has no
    schema for it: a custom resource, whose objects are then not checked)."""
    key = (kind, api_version, version)
    with _SCHEMA_LOCK:
        if key in _SCHEMAS:
            return _SCHEMAS[key]
        try:
            import jsonschema
            from kubernetes_validate import utils as kv
            from referencing import Registry, Resource
        except ImportError:      # the package is not installed: no schema checks
            _SCHEMAS[key] = None
            return None
        schema_dir = f"v{[v for v in kv.all_versions() if kv.major_minor(v) <= version][-1]}-local-strict"
        group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        try:
            schema = kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json",
                                        version)
        except (FileNotFoundError, OSError):
            _SCHEMAS[key] = None
            return None
        defs_key = ("_defs", schema_dir, "")
        if defs_key not in _SCHEMAS:
            _SCHEMAS[defs_key] = kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", version)
        defs = _SCHEMAS[defs_key]
        registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
        # with the definitions, for the decoder's messages (Go type names)
        _SCHEMAS[key] = (jsonschema.validators.Draft202012Validator(schema, registry=registry), defs["$defs"])
        return _SCHEMAS[key]


def _json_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _go_field(validator: Any, defs: JSON, kind: str, path: list) -> tuple[str, str]:
    """(Go struct, Go type) of the field at ``path``, for ``json: cannot unmarshal`` messages."""
    node: Any = validator.schema
    struct = kind

    def resolve(n: Any) -> Any:
        nonlocal struct
        while isinstance(n, dict) and "$ref" in n:
            name = n["$ref"].rsplit("/", 1)[1]
            struct = name.rsplit(".", 1)[1]
            n = defs.get(name, {})
        return n
    for part in path:
        node = resolve(node)
        if isinstance(part, int):
            node = node.get("items", {})
        else:
            node = (node.get("properties") or {}).get(part, node.get("additionalProperties", {}))
    owner = struct
    target: Any = node if isinstance(node, dict) else {}
    if "$ref" in target:
        go_type = "v1." + target["$ref"].rsplit(".", 1)[1]
    else:
        raw = target.get("type") or []
        types = [t for t in ([raw] if isinstance(raw, str) else raw) if t != "null"]
        fmt = target.get("format")
        go_type = {"string": "string", "boolean": "bool", "number": "float64",
                   "integer": fmt or "int64", "array": "[]interface {}",
                   "object": "map[string]string"}.get(types[0] if types else "", "interface {}")
        if types and types[0] == "array":
            items = target.get("items", {})
            if "$ref" in items:
                go_type = "[]v1." + items["$ref"].rsplit(".", 1)[1]
            elif items.get("type"):
                item_types = [items["type"]] if isinstance(items["type"], str) else items["type"]
                go_type = "[]" + [t for t in item_types if t != "null"][0]
    return owner, go_type


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _unknown_fields(err: Any) -> list[str]:
    props = set((err.schema.get("properties") or {}))
    instance = err.instance if isinstance(err.instance, dict) else {}
    base = list(err.absolute_path)
    return [_json_path(base + [key]) for key in instance if key not in props]


def _prune(obj: Any, path: str) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    node = obj
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node.get(part)
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def decode_check(rt: "ResourceType", obj: JSON, mode: str = "Strict") -> tuple[list[str], list[FieldError]]:
    """What kube-apiserver's decoder says of ``obj`` (the request body with apiVersion and kind).

    Unknown fields: with ``mode`` Strict a 400 ``strict decoding error``; with Warn they are
    dropped from ``obj`` and returned as warnings; with Ignore dropped silently. A value of the
    wrong JSON type is a 400 (``json: cannot unmarshal``). A missing required field is returned
    as a field error: the semantic validation's 422 (as the real server answers) says it.
    Returns (warnings, missing required fields).
    """
    cached = _schema_validator(rt.kind, rt.api_version)
    if cached is None:
        return [], []
    validator, defs = cached
    unknown: list[str] = []
    type_errors: list[str] = []
    required: list[FieldError] = []
    for err in validator.iter_errors(obj):
        path = list(err.absolute_path)
        if err.validator == "required":
            instance = err.instance if isinstance(err.instance, dict) else {}
            required += [FieldError("Required", _json_path(path + [r])) for r in err.validator_value
                         if instance.get(r) in (None, "")]
        elif err.validator == "additionalProperties":
            unknown += _unknown_fields(err)
        elif err.validator in ("type", "oneOf", "enum"):
            if err.validator == "enum" and path in (["apiVersion"], ["kind"]):
                continue
            if err.validator == "oneOf" and isinstance(err.instance, str):
                continue       # a quantity string: its format is checked where it is parsed
            owner, go_type = _go_field(validator, defs, rt.kind, path)
            field_path = ".".join(str(p) for p in path if not isinstance(p, int))
            type_errors.append(f"json: cannot unmarshal {_json_type(err.instance)} into Go struct field "
                               f"{owner}.{field_path} of type {go_type}")
    prefix = f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
    if type_errors:
        raise ApiError(400, prefix + type_errors[0])
    if not unknown:
        return [], required
    if mode == "Strict":
        raise ApiError(400, prefix + "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
    for path in unknown:
        _prune(obj, path)
    return ([f'unknown field "{u}"' for u in unknown] if mode == "Warn" else []), required


# --- semantic validation: what pkg/apis/core/validation checks beyond the schema ------------------

_STANDARD_FINALIZERS = {"kubernetes", "orphan", "foregroundDeletion"}
_NAME_RULES: dict[str, Callable[[str], list[str]]] = {"services": is_dns1035_label, "namespaces": is_dns1123_label}
"""metadata.name rules by resource; every other kind here: DNS-1123 subdomain."""
_RESTART_POLICIES = ["Always", "Never", "OnFailure"]
_PULL_POLICIES = ["Always", "IfNotPresent", "Never"]
_DNS_POLICIES = ["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"]
_FIELD_REF_PATHS = ["metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                    "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"]
_STANDARD_CONTAINER_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
_SERVICE_TYPES = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]
MAX_SECRET_SIZE = 1024 * 1024
TOTAL_ANNOTATION_SIZE = 256 * 1024


def is_native_resource(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def is_extended_resource(name: str) -> bool:
    """Extended resources (``nvidia.com/gpu``): integers, requests equal to limits, not overcommitted."""
    return not is_native_resource(name) and not name.startswith("requests.")


def _labels(labels: Any, path: str, errs: list[FieldError]) -> None:
    for key, value in (labels or {}).items():
        errs += [FieldError("Invalid", path, key, m) for m in is_qualified_name(key)]
        errs += [FieldError("Invalid", path, value, m) for m in is_label_value(str(value))]


def _object_meta(rt: "ResourceType", meta: JSON, errs: list[FieldError]) -> None:
    rule = _NAME_RULES.get(rt.plural, is_dns1123_subdomain)
    name = meta.get("name") or ""
    if name:
        errs += [FieldError("Invalid", "metadata.name", name, m) for m in rule(name)]
    elif not meta.get("generateName"):
        errs.append(FieldError("Required", "metadata.name", detail="name or generateName is required"))
    if rt.namespaced and meta.get("namespace"):
        errs += [FieldError("Invalid", "metadata.namespace", meta["namespace"], m)
                 for m in is_dns1123_label(meta["namespace"])]
    _labels(meta.get("labels"), "metadata.labels", errs)
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errs += [FieldError("Invalid", "metadata.annotations", key, m) for m in is_qualified_name(key.lower())]
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > TOTAL_ANNOTATION_SIZE:
        errs.append(FieldError("TooLong", "metadata.annotations", detail=f"must have at most {TOTAL_ANNOTATION_SIZE} bytes"))
    for ref in meta.get("ownerReferences") or []:
        api_version = ref.get("apiVersion") or ""
        if not api_version.rsplit("/", 1)[-1]:
            errs.append(FieldError("Invalid", "metadata.ownerReferences.apiVersion", api_version,
                                   "version must not be empty"))
        for key, what in (("kind", "kind"), ("name", "name"), ("uid", "uid")):
            if not ref.get(key):
                errs.append(FieldError("Invalid", f"metadata.ownerReferences.{key}", ref.get(key) or "",
                                       f"{what} must not be empty"))
    for i, finalizer in enumerate(meta.get("finalizers") or []):
        path = f"metadata.finalizers[{i}]"
        msgs = is_qualified_name(finalizer)
        errs += [FieldError("Invalid", path, finalizer, m) for m in msgs]
        if not msgs and "/" not in finalizer and finalizer not in _STANDARD_FINALIZERS:
            errs.append(FieldError("Invalid", path, finalizer,
                                   "name is neither a standard finalizer name nor is it fully qualified"))


def _resources(res: JSON, path: str, errs: list[FieldError]) -> None:
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    parsed: dict[tuple[str, str], Fraction] = {}
    for section, values in (("limits", limits), ("requests", requests)):
        for name, raw in values.items():
            key_path = f"{path}.{section}[{name}]"
            if "/" not in name and name not in _STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-"):
                errs.append(FieldError("Invalid", key_path, name, "must be a standard resource for containers"))
                continue
            if "/" in name:
                errs += [FieldError("Invalid", key_path, name, m) for m in is_qualified_name(name)]
            try:
                q = parse_quantity(raw)
            except QuantityError as exc:    # the decoder refuses it first on a real server
                raise ApiError(400, f'Pod in version "v1" cannot be handled as a Pod: {exc}') from None
            parsed[(section, name)] = q
            if q < 0:
                errs.append(FieldError("Invalid", key_path, str(raw), "must be greater than or equal to 0"))
            if (is_extended_resource(name) or name.startswith("hugepages-")) and q.denominator != 1:
                errs.append(FieldError("Invalid", key_path, str(raw), "must be an integer"))
    for name, raw in requests.items():
        if ("requests", name) not in parsed:
            continue
        q = parsed[("requests", name)]
        overcommit = is_native_resource(name) and not name.startswith("hugepages-")
        if name in limits and ("limits", name) in parsed:
            limit = parsed[("limits", name)]
            if not overcommit and q != limit:
                errs.append(FieldError("Invalid", f"{path}.requests", str(raw),
                                       f"must be equal to {name} limit of {limits[name]}"))
            elif q > limit:
                errs.append(FieldError("Invalid", f"{path}.requests", str(raw),
                                       f"must be less than or equal to {name} limit of {limits[name]}"))
        elif not overcommit:
            errs.append(FieldError("Required", f"{path}.limits",
                                   detail="Limit must be set for non overcommitable resources"))


def _env(env: list, path: str, errs: list[FieldError]) -> None:
    for i, var in enumerate(env or []):
        p = f"{path}[{i}]"
        name = var.get("name") or ""
        if not name:
            errs.append(FieldError("Required", f"{p}.name"))
        else:
            errs += [FieldError("Invalid", f"{p}.name", name, m) for m in is_env_var_name(name)]
        source = var.get("valueFrom")
        if source is None:
            continue
        if var.get("value"):
            errs.append(FieldError("Invalid", f"{p}.valueFrom", "", "may not be specified when `value` is not empty"))
        kinds = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef") if source.get(k)]
        if len(kinds) != 1:
            errs.append(FieldError("Invalid", f"{p}.valueFrom", "",
                                   "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or "
                                   "`secretKeyRef`" if not kinds else "may not have more than one field specified at a time"))
            continue
        ref, rp = source[kinds[0]], f"{p}.valueFrom.{kinds[0]}"
        if kinds[0] in ("secretKeyRef", "configMapKeyRef"):
            if not ref.get("name"):
                errs.append(FieldError("Required", f"{rp}.name"))
            key = ref.get("key") or ""
            if not key:
                errs.append(FieldError("Required", f"{rp}.key"))
            else:
                errs += [FieldError("Invalid", f"{rp}.key", key, m) for m in is_config_map_key(key)]
        elif kinds[0] == "fieldRef":
            fp = ref.get("fieldPath") or ""
            if not fp:
                errs.append(FieldError("Required", f"{rp}.fieldPath"))
            elif not re.fullmatch(r"metadata\.(labels|annotations)\['[^']+'\]", fp) and fp not in _FIELD_REF_PATHS:
                errs.append(_not_supported(f"{rp}.fieldPath", fp, _FIELD_REF_PATHS))


def _container(c: JSON, path: str, volumes: set[str], names: set[str], errs: list[FieldError]) -> None:
    name = c.get("name") or ""
    if not name:
        errs.append(FieldError("Required", f"{path}.name"))
    else:
        errs += [FieldError("Invalid", f"{path}.name", name, m) for m in is_dns1123_label(name)]
        if name in names:
            errs.append(FieldError("Duplicate", f"{path}.name", name))
        names.add(name)
    image = c.get("image") or ""
    if not image:
        errs.append(FieldError("Required", f"{path}.image"))
    elif image != image.strip():
        errs.append(FieldError("Invalid", f"{path}.image", image, "must not have leading or trailing whitespace"))
    policy = c.get("imagePullPolicy")
    if policy is not None and policy not in _PULL_POLICIES:
        errs.append(_not_supported(f"{path}.imagePullPolicy", policy, _PULL_POLICIES))
    _env(c.get("env") or [], f"{path}.env", errs)
    _resources(c.get("resources") or {}, f"{path}.resources", errs)
    for i, port in enumerate(c.get("ports") or []):
        n = port.get("containerPort")
        if isinstance(n, int) and not 1 <= n <= 65535:
            errs.append(FieldError("Invalid", f"{path}.ports[{i}].containerPort", n, "must be between 1 and 65535, inclusive"))
        if port.get("name"):
            errs += [FieldError("Invalid", f"{path}.ports[{i}].name", port["name"], m)
                     for m in is_valid_port_name(port["name"])]
    mount_paths: set[str] = set()
    for i, mount in enumerate(c.get("volumeMounts") or []):
        mp = f"{path}.volumeMounts[{i}]"
        if not mount.get("name"):
            errs.append(FieldError("Required", f"{mp}.name"))
        elif mount["name"] not in volumes:
            errs.append(FieldError("NotFound", f"{mp}.name", mount["name"]))
        if not mount.get("mountPath"):
            errs.append(FieldError("Required", f"{mp}.mountPath"))
        elif mount["mountPath"] in mount_paths:
            errs.append(FieldError("Invalid", f"{mp}.mountPath", mount["mountPath"], "must be unique"))
        mount_paths.add(mount.get("mountPath") or "")


def _node_selector_terms(required: JSON, path: str, errs: list[FieldError]) -> None:
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        errs.append(FieldError("Required", f"{path}.nodeSelectorTerms", detail="must have at least one node selector term"))
    for t, term in enumerate(terms):
        for kind in ("matchExpressions", "matchFields"):
            for e, expr in enumerate(term.get(kind) or []):
                p = f"{path}.nodeSelectorTerms[{t}].{kind}[{e}]"
                op, values = expr.get("operator"), expr.get("values") or []
                if op in ("In", "NotIn"):
                    if not values:
                        errs.append(FieldError("Required", f"{p}.values",
                                               detail="must be specified when `operator` is 'In' or 'NotIn'"))
                elif op in ("Exists", "DoesNotExist"):
                    if values:
                        errs.append(FieldError("Forbidden", f"{p}.values",
                                               detail="may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
                elif op in ("Gt", "Lt"):
                    if len(values) != 1:
                        errs.append(FieldError("Required", f"{p}.values",
                                               detail="must be specified single value when `operator` is 'Lt' or 'Gt'"))
                else:
                    errs.append(FieldError("Invalid", f"{p}.operator", op, "not a valid selector operator"))
                if kind == "matchExpressions":
                    errs += [FieldError("Invalid", f"{p}.key", expr.get("key") or "", m)
                             for m in is_qualified_name(expr.get("key") or "")]


def _tolerations(tolerations: list, path: str, errs: list[FieldError]) -> None:
    for i, tol in enumerate(tolerations or []):
        p = f"{path}[{i}]"
        key, op, effect = tol.get("key") or "", tol.get("operator") or "Equal", tol.get("effect") or ""
        if key:
            errs += [FieldError("Invalid", f"{p}.key", key, m) for m in is_qualified_name(key)]
        elif op != "Exists":
            errs.append(FieldError("Invalid", f"{p}.operator", op,
                                   'operator must be Exists when `key` is empty, which means "match all values and all keys"'))
        if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
            errs.append(FieldError("Invalid", f"{p}.effect", effect,
                                   "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if op == "Exists" and tol.get("value"):
            errs.append(FieldError("Invalid", f"{p}.operator", tol["value"],
                                   "value must be empty when `operator` is 'Exists'"))
        elif op not in ("Equal", "Exists"):
            errs.append(_not_supported(f"{p}.operator", op, ["Equal", "Exists"]))
        if effect and effect not in ("NoExecute", "NoSchedule", "PreferNoSchedule"):
            errs.append(_not_supported(f"{p}.effect", effect, ["NoExecute", "NoSchedule", "PreferNoSchedule"]))


def _pod_spec(spec: JSON, errs: list[FieldError], *, create: bool) -> None:
    volumes: set[str] = set()
    for i, vol in enumerate(spec.get("volumes") or []):
        vname = vol.get("name") or ""
        if not vname:
            errs.append(FieldError("Required", f"spec.volumes[{i}].name"))
        else:
            errs += [FieldError("Invalid", f"spec.volumes[{i}].name", vname, m) for m in is_dns1123_label(vname)]
            if vname in volumes:
                errs.append(FieldError("Duplicate", f"spec.volumes[{i}].name", vname))
        volumes.add(vname)
    containers = spec.get("containers") or []
    if not containers:
        errs.append(FieldError("Required", "spec.containers"))
    names: set[str] = set()
    for i, c in enumerate(spec.get("initContainers") or []):
        _container(c, f"spec.initContainers[{i}]", volumes, names, errs)
    for i, c in enumerate(containers):
        _container(c, f"spec.containers[{i}]", volumes, names, errs)
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in _RESTART_POLICIES:
        errs.append(_not_supported("spec.restartPolicy", policy, _RESTART_POLICIES))
    dns = spec.get("dnsPolicy")
    if dns is not None and dns not in _DNS_POLICIES:
        errs.append(_not_supported("spec.dnsPolicy", dns, _DNS_POLICIES))
    for key in ("hostname", "subdomain"):
        if spec.get(key):
            errs += [FieldError("Invalid", f"spec.{key}", spec[key], m) for m in is_dns1123_label(spec[key])]
    for key in ("serviceAccountName", "priorityClassName"):
        if spec.get(key):
            errs += [FieldError("Invalid", f"spec.{key}", spec[key], m) for m in is_dns1123_subdomain(spec[key])]
    if spec.get("nodeName"):
        errs += [FieldError("Invalid", "spec.nodeName", spec["nodeName"], m) for m in is_dns1123_subdomain(spec["nodeName"])]
    _labels(spec.get("nodeSelector"), "spec.nodeSelector", errs)
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None:
        _node_selector_terms(required, "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", errs)
    _tolerations(spec.get("tolerations") or [], "spec.tolerations", errs)
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline <= 0:
        errs.append(FieldError("Invalid", "spec.activeDeadlineSeconds", deadline, "must be between 1 and 2147483647, inclusive"))
    gates: set[str] = set()
    for i, gate in enumerate(spec.get("schedulingGates") or []):
        gname = gate.get("name") or ""
        errs += [FieldError("Invalid", f"spec.schedulingGates[{i}]", gname, m) for m in is_qualified_name(gname)]
        if gname in gates:
            errs.append(FieldError("Duplicate", f"spec.schedulingGates[{i}]", gname))
        gates.add(gname)
    if create and gates and spec.get("nodeName"):
        errs.append(FieldError("Forbidden", "spec.nodeName", detail="cannot be set until all schedulingGates have been cleared"))


def _service(obj: JSON, errs: list[FieldError]) -> None:
    spec = obj.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    if kind not in _SERVICE_TYPES:
        errs.append(_not_supported("spec.type", kind, _SERVICE_TYPES))
    ports = spec.get("ports") or []
    if not ports and spec.get("clusterIP") != "None" and kind != "ExternalName":
        errs.append(FieldError("Required", "spec.ports"))
    seen: set[str] = set()
    for i, port in enumerate(ports):
        p = f"spec.ports[{i}]"
        name = port.get("name") or ""
        if not name and len(ports) > 1:
            errs.append(FieldError("Required", f"{p}.name"))
        elif name:
            errs += [FieldError("Invalid", f"{p}.name", name, m) for m in is_dns1123_label(name)]
            if name in seen:
                errs.append(FieldError("Duplicate", f"{p}.name", name))
            seen.add(name)
        n = port.get("port")
        if not isinstance(n, int) or not 1 <= n <= 65535:
            errs.append(FieldError("Invalid", f"{p}.port", n if n is not None else 0, "must be between 1 and 65535, inclusive"))
    _labels(spec.get("selector"), "spec.selector", errs)


def _base64_error(value: str) -> int | None:
    """Where Go's decoder would stop on ``value`` (None: it is valid base64)."""
    try:
        base64.b64decode(value, validate=True)
        return None
    except ValueError:
        bad = next((i for i, ch in enumerate(value) if ch not in
                    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="), None)
        return bad if bad is not None else len(value)


def _data_keys(obj: JSON, kind: str, errs: list[FieldError]) -> None:
    total = 0
    keys: set[str] = set()
    for section in ("data", "binaryData") if kind == "ConfigMap" else ("data",):
        for key, value in (obj.get(section) or {}).items():
            errs += [FieldError("Invalid", f"{section}[{key}]", key, m) for m in is_config_map_key(key)]
            if key in keys:
                errs.append(FieldError("Invalid", f"{section}[{key}]", key, "duplicate of key present in data"))
            keys.add(key)
            value = value or ""
            if kind == "Secret" or section == "binaryData":
                at = _base64_error(value)
                if at is not None:
                    raise ApiError(400, f'{kind} in version "v1" cannot be handled as a {kind}: illegal base64 '
                                        f"data at input byte {at}")
                total += len(base64.b64decode(value))
            else:
                total += len(value)
    if total > MAX_SECRET_SIZE:
        errs.append(FieldError("TooLong", "data" if kind == "Secret" else "", detail=f"must have at most {MAX_SECRET_SIZE} bytes"))


def semantic_errors(rt: "ResourceType", obj: JSON, old: JSON | None = None) -> list[FieldError]:
    """The validation kube-apiserver runs after decoding and defaulting (create: ``old`` None)."""
    errs: list[FieldError] = []
    _object_meta(rt, obj.get("metadata") or {}, errs)
    if rt.plural == "pods":
        _pod_spec(obj.get("spec") or {}, errs, create=old is None)
        if old is not None:
            old_gates = {g.get("name") for g in (old.get("spec") or {}).get("schedulingGates") or []}
            for i, gate in enumerate((obj.get("spec") or {}).get("schedulingGates") or []):
                if gate.get("name") not in old_gates:
                    errs.append(FieldError("Forbidden", f"spec.schedulingGates[{i}].name",
                                           detail=f"only deletion is allowed, but found new scheduling gate "
                                                  f"'{gate.get('name')}'"))
    elif rt.plural == "services":
        _service(obj, errs)
    elif rt.plural in ("secrets", "configmaps"):
        _data_keys(obj, rt.kind, errs)
        if rt.plural == "secrets" and old is not None and obj.get("type") != old.get("type"):
            errs.append(FieldError("Invalid", "type", obj.get("type"), "field is immutable"))
    elif rt.plural == "leases":
        spec = obj.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and duration <= 0:
            errs.append(FieldError("Invalid", "spec.leaseDurationSeconds", duration, "must be greater than 0"))
        transitions = spec.get("leaseTransitions")
        if transitions is not None and transitions < 0:
            errs.append(FieldError("Invalid", "spec.leaseTransitions", transitions, "must be greater than or equal to 0"))
    elif rt.plural == "priorityclasses":
        _priority_class(obj, old, errs)
    elif rt.plural == "resourcequotas":
        for res, raw in ((obj.get("spec") or {}).get("hard") or {}).items():
            try:
                q = parse_quantity(raw)
            except QuantityError as exc:
                raise ApiError(400, f'ResourceQuota in version "v1" cannot be handled as a ResourceQuota: {exc}') from None
            path = f"spec.hard[{res}]"
            msgs = is_qualified_name(res)
            errs += [FieldError("Invalid", path, res, m) for m in msgs]
            if not msgs and "/" not in res and res not in _QUOTA_STANDARD and not res.startswith(
                    ("hugepages-", "requests.hugepages-")):
                errs.append(FieldError("Invalid", path, res, "must be a standard resource for quota"))
            if q < 0:
                errs.append(FieldError("Invalid", path, str(raw), "must be greater than or equal to 0"))
            elif (res in _QUOTA_INTEGER or is_extended_resource(res)) and q.denominator != 1:
                errs.append(FieldError("Invalid", path, str(raw), "must be an integer"))
    elif rt.plural == "poddisruptionbudgets":
        # ValidatePodDisruptionBudgetSpec: an IntOrString printed as Go's %#v prints the struct
        spec = obj.get("spec") or {}
        if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
            errs.append(FieldError("Invalid", "spec", _GoValue("policy.PodDisruptionBudgetSpec{...}"),
                                   "minAvailable and maxUnavailable cannot be both set"))
        for key in ("minAvailable", "maxUnavailable"):
            value = spec.get(key)
            if isinstance(value, int) and value < 0:
                errs.append(FieldError("Invalid", f"spec.{key}", value, "must be greater than or equal to 0"))
            elif isinstance(value, str):
                go = _GoValue(f"intstr.IntOrString{{Type:1, IntVal:0, StrVal:{json.dumps(value)}}}")
                m = re.fullmatch(r"([0-9]+)%", value)
                if not m:
                    errs.append(FieldError("Invalid", f"spec.{key}", go, _regex_error(
                        "a valid percent string must be a numeric string followed by an ending '%'", "[0-9]+%",
                        "1%", "93%")))
                elif int(m.group(1)) > 100:
                    errs.append(FieldError("Invalid", f"spec.{key}", go, "must not be greater than 100%"))
    elif rt.plural == "events":
        involved = obj.get("involvedObject") or {}
        ns = (obj.get("metadata") or {}).get("namespace") or ""
        inv_ns = involved.get("namespace") or ""
        if not obj.get("eventTime") and (inv_ns != ns if inv_ns else ns not in ("", "default")):
            errs.append(FieldError("Invalid", "involvedObject.namespace", inv_ns, "does not match event.namespace"))
    return errs


_QUOTA_INTEGER = {"pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
                  "persistentvolumeclaims", "services.nodeports", "services.loadbalancers"}
_QUOTA_STANDARD = _QUOTA_INTEGER | {"cpu", "memory", "ephemeral-storage", "requests.cpu", "requests.memory",
                                    "requests.storage", "requests.ephemeral-storage", "limits.cpu", "limits.memory",
                                    "limits.ephemeral-storage"}
"""helper.IsIntegerResourceName's and IsStandardQuotaResourceName's sets (single-segment names)."""


def _priority_class(obj: JSON, old: JSON | None, errs: list[FieldError]) -> None:
    """ValidatePriorityClass and ValidatePriorityClassUpdate."""
    name = (obj.get("metadata") or {}).get("name") or ""
    value = obj.get("value", 0)
    if name.startswith("system-"):
        known = SYSTEM_PRIORITY_CLASSES.get(name)
        why = (f"{name} is not a known system priority class" if known is None
               else f"value of {name} PriorityClass must be {known}" if value != known
               else f"globalDefault of {name} PriorityClass must be false" if obj.get("globalDefault") else "")
        if why:
            errs.append(FieldError("Forbidden", "metadata.name", detail="priority class names with 'system-' prefix "
                                                                        f"are reserved for system use only. error: {why}"))
    elif isinstance(value, int) and value > HIGHEST_USER_DEFINABLE_PRIORITY:
        errs.append(FieldError("Forbidden", "value", detail="maximum allowed value of a user defined priority is "
                                                            f"{HIGHEST_USER_DEFINABLE_PRIORITY}"))
    if old is not None:
        if value != old.get("value", 0):
            errs.append(FieldError("Forbidden", "value", detail="may not be changed in an update."))
        if obj.get("preemptionPolicy") != old.get("preemptionPolicy"):
            errs.append(FieldError("Invalid", "preemptionPolicy", obj.get("preemptionPolicy"), "field is immutable"))


# --- per-type rules -----------------------------------------------------------------------------

_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "schedulingGates")


def default_pull_policy(image: str) -> str:
    """The API's default ``imagePullPolicy``: Always for ``:latest`` or no tag, else IfNotPresent."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if "@" in image:
        return "IfNotPresent"
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _pod_spec_defaults(spec: JSON) -> JSON:
    """SetDefaults_PodSpec and SetDefaults_Container (the fields a 1.30 server fills in)."""
    spec = copy.deepcopy(spec)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                c.setdefault("imagePullPolicy", default_pull_policy(str(c.get("image") or "")))
                c.setdefault("terminationMessagePath", "/dev/termination-log")
                c.setdefault("terminationMessagePolicy", "File")
    return spec


def effective_requests(container: JSON) -> dict[str, str]:
    """A container's requests as the API defaults them: a limit without a request is the request."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def qos_class(spec: JSON) -> str:
    """``status.qosClass``: Guaranteed, Burstable or BestEffort (only cpu and memory count)."""
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    any_set, guaranteed = False, True
    for c in containers:
        limits = (c.get("resources") or {}).get("limits") or {}
        requests = effective_requests(c)
        for res in ("cpu", "memory"):
            if res in requests or res in limits:
                any_set = True
            if res not in limits or parse_quantity(requests.get(res, limits[res])) != parse_quantity(limits[res]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


DEFAULT_TOLERATION_SECONDS = 300
"""What the DefaultTolerationSeconds admission plugin gives every pod for a NotReady/unreachable node."""


def _default_tolerations(spec: JSON) -> None:
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any((t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"))
                   and t.get("effect") in (None, "", "NoExecute") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS})


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


def _check_type(rt: ResourceType, body: JSON, name: str) -> None:
    """The body's apiVersion and kind, as the create and update handlers and the decoder check them:
    another group/version is a 400; a custom resource (decoded unstructured) must name both, and
    its own kind (the CR validator's 422)."""
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if api_version and api_version != rt.api_version:
        raise ApiError(400, f"the API version in the data ({api_version}) does not match the expected API "
                            f"version ({rt.api_version})")
    if not rt.custom:
        return
    raw = json.dumps(body, separators=(",", ":"))
    if not kind:
        raise ApiError(400, f"Object 'Kind' is missing in '{raw}'")
    if not api_version:
        raise ApiError(400, f"Object 'apiVersion' is missing in '{raw}'")
    if kind != rt.kind:
        raise invalid_error(rt, name or "", [FieldError("Invalid", "kind", kind, f"must be {rt.kind}")])


def _prepare_for_create(rt: ResourceType, obj: JSON) -> None:
    if rt.plural == "pods":
        spec = obj["spec"] = _pod_spec_defaults(obj.get("spec") or {})
        # the ServiceAccount and DefaultTolerationSeconds admission plugins
        if not spec.get("serviceAccountName"):
            spec["serviceAccountName"] = spec.get("serviceAccount") or "default"
        spec["serviceAccount"] = spec["serviceAccountName"]
        _default_tolerations(spec)
        try:
            qos = qos_class(spec)
        except QuantityError:
            qos = "BestEffort"     # refused by the validation that follows
        obj["status"] = {"phase": "Pending", "qosClass": qos}
    elif rt.plural == "services":
        obj["status"] = {"loadBalancer": {}}
    elif rt.plural == "secrets":
        _fold_string_data(obj)
        obj.setdefault("type", "Opaque")
    elif rt.plural == "namespaces":
        obj["status"] = {"phase": "Active"}
        _namespace_defaults(obj)
    elif rt.custom and rt.status_subresource:
        obj.pop("status", None)       # the status subresource alone writes it
    elif rt.plural == "resourcequotas":
        obj["status"] = {}        # the quota controller fills it in
    elif rt.plural == "poddisruptionbudgets":
        obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
    elif rt.plural == "priorityclasses":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    # nodes keep the status they are created with (the kubelet registers a Ready node)


def _namespace_defaults(obj: JSON) -> None:
    """A namespace's spec.finalizers and phase, and the NamespaceDefaultLabelName label (1.21+)."""
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    obj["status"] = {**(obj.get("status") or {}), "phase": (obj.get("status") or {}).get("phase") or "Active"}
    name = obj["metadata"].get("name")
    if name:
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name


# --- quantities as the API prints them (resource.Quantity.String) -------------------------------

def _quantity_format(value: Any) -> str:
    """A quantity's format as resource.ParseQuantity records it: BinarySI, DecimalSI or DecimalExponent."""
    text = str(value)
    if re.search(r"[KMGTPE]i$", text):
        return "BinarySI"
    if re.search(r"[eE][-+]?[0-9]+$", text):
        return "DecimalExponent"
    return "DecimalSI"


def format_quantity(value: Fraction, fmt: str = "DecimalSI") -> str:
    """``value`` in its canonical form (``1536Mi``, ``1500m``, ``2``), as Quantity.String writes it."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if fmt == "BinarySI" and value >= 1024 and value.denominator == 1:
        n, exp = int(value), 0
        while n % 1024 == 0 and exp < 6:
            n, exp = n // 1024, exp + 1
        return f"{sign}{n}{['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'][exp]}"
    nanos = -((-value * 10 ** 9) // 1)            # rounded up to a nano, as the API rounds
    n, exp = int(nanos), -9
    while n % 1000 == 0 and exp < 18:
        n, exp = n // 1000, exp + 3
    if fmt == "DecimalExponent":
        return f"{sign}{n}" + (f"e{exp}" if exp else "")
    return f"{sign}{n}" + {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}[exp]


def _q(value: Any) -> tuple[Fraction, str]:
    """(amount, format) of a quantity string or number, or of an (amount, format) pair."""
    if isinstance(value, tuple):
        return value
    return parse_quantity(value), _quantity_format(value)


class _Usage:
    """A ResourceList being summed: exact amounts, each with the format of its first non-zero term."""

    def __init__(self) -> None:
        self.amounts: dict[str, Fraction] = {}
        self.formats: dict[str, str] = {}

    def add(self, name: str, value: Any) -> None:
        amount, fmt = _q(value)
        if not self.amounts.get(name):
            self.formats[name] = fmt
        self.amounts[name] = self.amounts.get(name, Fraction(0)) + amount

    def merge(self, other: "_Usage") -> None:
        for name, amount in other.amounts.items():
            self.add(name, (amount, other.formats.get(name, "DecimalSI")))

    def text(self, name: str) -> str:
        return format_quantity(self.amounts.get(name, Fraction(0)), self.formats.get(name, "DecimalSI"))


# --- ResourceQuota (plugin/pkg/admission/resourcequota, pkg/quota/v1/evaluator/core/pods.go) -----

_QUOTA_VALIDATION_SET = {"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"}
_POD_QUOTA_RESOURCES = {"pods", "count/pods", "cpu", "memory", "ephemeral-storage", "requests.cpu",
                        "requests.memory", "requests.ephemeral-storage", "limits.cpu", "limits.memory",
                        "limits.ephemeral-storage"}


def _quota_tracks(name: str) -> bool:
    """What the pod evaluator's MatchingResources keeps of a quota's resource names."""
    return (name in _POD_QUOTA_RESOURCES or name.startswith(("hugepages-", "requests.hugepages-"))
            or (name.startswith("requests.") and is_extended_resource(name[len("requests."):])))


def _compute_usage(requests: dict[str, Any], limits: dict[str, Any]) -> _Usage:
    """podComputeUsageHelper: the quota names a set of requests and limits count against."""
    usage = _Usage()
    usage.add("pods", 1)
    for res in ("cpu", "memory", "ephemeral-storage"):
        if res in requests:
            usage.add(res, requests[res])
            usage.add(f"requests.{res}", requests[res])
        if res in limits:
            usage.add(f"limits.{res}", limits[res])
    for res, value in requests.items():
        if res.startswith("hugepages-"):
            usage.add(res, value)
            usage.add(f"requests.{res}", value)
        elif is_extended_resource(res):
            usage.add(f"requests.{res}", value)
    return usage


def _pod_totals(spec: JSON, which: str) -> dict[str, tuple[Fraction, str]]:
    """resourcehelper.PodRequests/PodLimits: the containers' sum, or the largest init container's."""
    def values(c: JSON) -> dict[str, Any]:
        return effective_requests(c) if which == "requests" else (c.get("resources") or {}).get("limits") or {}
    total: dict[str, tuple[Fraction, str]] = {}
    for c in spec.get("containers") or []:
        for res, value in values(c).items():
            amount, fmt = _q(value)
            old = total.get(res)
            total[res] = (old[0] + amount, old[1] if old and old[0] else fmt) if old else (amount, fmt)
    for c in spec.get("initContainers") or []:
        for res, value in values(c).items():
            amount, fmt = _q(value)
            if amount > total.get(res, (Fraction(0), ""))[0]:
                total[res] = (amount, fmt)
    return total


def pod_quota_usage(pod: JSON) -> _Usage:
    """PodUsageFunc: ``count/pods`` for every stored pod; the rest only for a pod that is not terminal."""
    usage = _Usage()
    usage.add("count/pods", 1)
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return usage
    spec = pod.get("spec") or {}
    usage.merge(_compute_usage(_pod_totals(spec, "requests"), _pod_totals(spec, "limits")))
    return usage


def quota_scope_matches(quota: JSON, pod: JSON) -> bool:
    """generic.Matches' scope half: every scope (``spec.scopes``, ``spec.scopeSelector``) the pod
    matches, as podMatchesScopeFunc decides (no scopes: every pod)."""
    spec = quota.get("spec") or {}
    selectors = [{"scopeName": s, "operator": "Exists"} for s in spec.get("scopes") or []]
    selectors += (spec.get("scopeSelector") or {}).get("matchExpressions") or []
    pod_spec = pod.get("spec") or {}
    for sel in selectors:
        name, op, values = sel.get("scopeName"), sel.get("operator"), sel.get("values") or []
        deadline = pod_spec.get("activeDeadlineSeconds")
        terminating = deadline is not None and deadline >= 0
        if name == "Terminating":
            match = terminating
        elif name == "NotTerminating":
            match = not terminating
        elif name in ("BestEffort", "NotBestEffort"):
            try:
                best_effort = qos_class(pod_spec) == "BestEffort"
            except QuantityError:
                best_effort = False
            match = best_effort if name == "BestEffort" else not best_effort
        elif name == "PriorityClass":
            pc = pod_spec.get("priorityClassName") or ""
            match = {"Exists": bool(pc), "DoesNotExist": not pc, "In": bool(pc) and pc in values,
                     "NotIn": not pc or pc not in values}.get(op, False)
        elif name == "CrossNamespacePodAffinity":
            affinity = pod_spec.get("affinity") or {}
            terms = []
            for kind in ("podAffinity", "podAntiAffinity"):
                a = affinity.get(kind) or {}
                terms += a.get("requiredDuringSchedulingIgnoredDuringExecution") or []
                terms += [w.get("podAffinityTerm") or {} for w in a.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
            match = any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms)
        else:
            match = False
        if not match:
            return False
    return True


def _quota_must_specify(spec: JSON, required: set[str]) -> str | None:
    """The pod evaluator's Constraints: each container names every cpu/memory resource a quota limits."""
    required = required & _QUOTA_VALIDATION_SET
    missing: dict[str, set[str]] = {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        have = set(_compute_usage(effective_requests(c), (c.get("resources") or {}).get("limits") or {}).amounts)
        for res in required - have:
            missing.setdefault(res, set()).add(c.get("name") or "")
    if not missing:
        return None
    return "must specify " + "; ".join(f"{res} for: {','.join(sorted(missing[res]))}" for res in sorted(missing))


# --- PodSecurity (k8s.io/pod-security-admission/policy) ----------------------------------------

PSA_LEVELS = ("privileged", "baseline", "restricted")
PSA_PREFIX = "pod-security.kubernetes.io/"
_BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                          "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
_RESTRICTED_VOLUME_OK = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                         "persistentVolumeClaim", "projected", "secret")
_RESTRICTED_VOLUME_TYPES = ("hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs", "iscsi",
                            "glusterfs", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "fc", "azureFile",
                            "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "portworxVolume",
                            "scaleIO", "storageos")


def _join_quote(items: list[str]) -> str:
    return '"' + '", "'.join(items) + '"' if items else ""


def _plural(singular: str, plural: str, n: int) -> str:
    return singular if n == 1 else plural


def _containers(spec: JSON) -> list[JSON]:
    """visitContainers: init containers, containers, ephemeral containers, in that order."""
    return [c for key in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(key) or [] if isinstance(c, dict)]


def _sc(c: JSON) -> JSON:
    return c.get("securityContext") or {}


def _psa_windows(spec: JSON) -> bool:
    return ((spec.get("os") or {}).get("name")) == "windows"


def _psa_user_namespace(spec: JSON, minor: int) -> bool:
    return minor >= 35 and spec.get("hostUsers") is False


def _check_capabilities_baseline(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    bad, caps = [], set()
    for c in _containers(spec):
        added = [a for a in ((_sc(c).get("capabilities") or {}).get("add") or []) if a not in _BASELINE_CAPABILITIES]
        if added:
            bad.append(c.get("name", ""))
            caps.update(added)
    if bad:
        return "non-default capabilities", (f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must "
                                            f"not include {_join_quote(sorted(caps))} in securityContext.capabilities.add")
    return None


def _check_host_namespaces(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    found = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    return ("host namespaces", ", ".join(found)) if found else None


def _check_host_path_volumes(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    return ("hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_join_quote(bad)}") if bad else None


def _check_host_ports(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    bad, ports = [], set()
    for c in _containers(spec):
        used = [str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(c.get("name", ""))
            ports.update(used)
    if bad:
        return "hostPort", (f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} "
                            f"{_plural('uses', 'use', len(bad))} {_plural('hostPort', 'hostPorts', len(ports))} "
                            f"{', '.join(sorted(ports))}")
    return None


def _check_app_armor(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    setters, values = [], set()
    profile = (spec.get("securityContext") or {}).get("appArmorProfile")
    if profile is not None and profile.get("type") not in ("RuntimeDefault", "Localhost"):
        setters.append("pod")
        values.add(profile.get("type", ""))
    bad = []
    for c in _containers(spec):
        profile = _sc(c).get("appArmorProfile")
        if profile is not None and profile.get("type") not in ("RuntimeDefault", "Localhost"):
            bad.append(c.get("name", ""))
            values.add(profile.get("type", ""))
    if bad:
        setters.append(f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)}")
    value_list = sorted(values)
    annotations = sorted(f"{k}={json.dumps(v)}" for k, v in (meta.get("annotations") or {}).items()
                         if k.startswith("container.apparmor.security.beta.kubernetes.io/")
                         and not (v == "" or v == "runtime/default" or v.startswith("localhost/")))
    if annotations:
        value_list += annotations
        setters.append(_plural("annotation", "annotations", len(annotations)))
    if setters:
        return (_plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(value_list)),
                f"{' and '.join(setters)} must not set AppArmor profile type to {_join_quote(value_list)}")
    return None


def _check_se_linux(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    allowed = {"", "container_t", "container_init_t", "container_kvm_t"} | ({"container_engine_t"} if minor >= 31 else set())
    bad_types: set[str] = set()
    flags = {"user": False, "role": False}

    def valid(opts: JSON) -> bool:
        ok = True
        if opts.get("type", "") not in allowed:
            ok = False
            bad_types.add(opts.get("type", ""))
        for key in ("user", "role"):
            if opts.get(key):
                ok, flags[key] = False, True
        return ok
    setters = []
    opts = (spec.get("securityContext") or {}).get("seLinuxOptions")
    if opts is not None and not valid(opts):
        setters.append("pod")
    bad = [c.get("name", "") for c in _containers(spec)
           if _sc(c).get("seLinuxOptions") is not None and not valid(_sc(c)["seLinuxOptions"])]
    if bad:
        setters.append(f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)}")
    if not setters:
        return None
    data = [f"{_plural('type', 'types', len(bad_types))} {_join_quote(sorted(bad_types))}"] if bad_types else []
    data += [f"{key} may not be set" for key in ("user", "role") if flags[key]]
    return "seLinuxOptions", f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}"


def _check_windows_host_process(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    setters = ["pod"] if ((spec.get("securityContext") or {}).get("windowsOptions") or {}).get("hostProcess") else []
    bad = [c.get("name", "") for c in _containers(spec) if (_sc(c).get("windowsOptions") or {}).get("hostProcess")]
    if bad:
        setters.append(f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)}")
    if setters:
        return "hostProcess", f"{' and '.join(setters)} must not set securityContext.windowsOptions.hostProcess=true"
    return None


def _check_host_probes(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    if minor < 34:
        return None
    bad, hosts = set(), set()
    for c in _containers(spec):
        handlers = [c.get(k) for k in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(c.get("lifecycle") or {}).get(k) for k in ("postStart", "preStop")]
        for h in filter(None, handlers):
            for kind in ("httpGet", "tcpSocket"):
                if (h.get(kind) or {}).get("host"):
                    bad.add(c.get("name", ""))
                    hosts.add(h[kind]["host"])
    if bad:
        return "probe or lifecycle host", (
            f"{_plural('container', 'containers', len(bad))} {_join_quote(sorted(bad))} "
            f"{_plural('uses', 'use', len(bad))} "
            f"{_plural('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} {_join_quote(sorted(hosts))}")
    return None


def _proc_mount(spec: JSON) -> tuple[str, str] | None:
    bad, types = [], set()
    for c in _containers(spec):
        mount = _sc(c).get("procMount")
        if mount is not None and mount != "Default":
            bad.append(c.get("name", ""))
            types.add(mount)
    if bad:
        return "procMount", (f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must not set "
                             f"securityContext.procMount to {_join_quote(sorted(types))}")
    return None


def _check_proc_mount_baseline(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    return None if _psa_user_namespace(spec, minor) else _proc_mount(spec)


def _check_proc_mount_restricted(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    return _proc_mount(spec) if minor >= 35 else None


_SYSCTLS_SAFE = ((0, {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                      "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"}),
                 (27, {"net.ipv4.ip_local_reserved_ports"}),
                 (29, {"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                       "net.ipv4.tcp_keepalive_probes"}),
                 (32, {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}),
                 (37, {"net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}))


def _check_sysctls(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    allowed = set().union(*(names for since, names in _SYSCTLS_SAFE if minor >= since))
    bad = [s.get("name", "") for s in (spec.get("securityContext") or {}).get("sysctls") or []
           if s.get("name") not in allowed]
    return ("forbidden sysctls", ", ".join(bad)) if bad else None


def _check_privileged(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("privileged")]
    if bad:
        return "privileged", (f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must not set "
                              "securityContext.privileged=true")
    return None


def _seccomp_setters(spec: JSON, valid: Callable[[str], bool]) -> tuple[list[str], set[str], bool, list[str]]:
    """(bad setters, bad values, pod-level profile valid, containers with no profile)."""
    setters, values, implicit = [], set(), []
    pod_profile = (spec.get("securityContext") or {}).get("seccompProfile")
    pod_ok = False
    if pod_profile is not None:
        if not valid(pod_profile.get("type", "")):
            setters.append("pod")
            values.add(pod_profile.get("type", ""))
        else:
            pod_ok = True
    explicit = []
    for c in _containers(spec):
        profile = _sc(c).get("seccompProfile")
        if profile is not None:
            if not valid(profile.get("type", "")):
                explicit.append(c.get("name", ""))
                values.add(profile.get("type", ""))
        elif not pod_ok:
            implicit.append(c.get("name", ""))
    if explicit:
        setters.append(f"{_plural('container', 'containers', len(explicit))} {_join_quote(explicit)}")
    return setters, values, pod_ok, implicit


def _check_seccomp_baseline(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    setters, values, _, _ = _seccomp_setters(spec, lambda t: t != "Unconfined")
    if setters:
        return "seccompProfile", (f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to "
                                  f"{_join_quote(sorted(values))}")
    return None


def _check_allow_privilege_escalation(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    if _psa_windows(spec):
        return None
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    if bad:
        return "allowPrivilegeEscalation != false", (
            f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must set "
            "securityContext.allowPrivilegeEscalation=false")
    return None


def _check_capabilities_restricted(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    if _psa_windows(spec):
        return None
    no_drop, adding, caps = [], [], set()
    for c in _containers(spec):
        capabilities = _sc(c).get("capabilities")
        if capabilities is None:
            no_drop.append(c.get("name", ""))
            continue
        if "ALL" not in (capabilities.get("drop") or []):
            no_drop.append(c.get("name", ""))
        added = [a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
        if added:
            adding.append(c.get("name", ""))
            caps.update(added)
    details = []
    if no_drop:
        details.append(f"{_plural('container', 'containers', len(no_drop))} {_join_quote(no_drop)} must set "
                       'securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_plural('container', 'containers', len(adding))} {_join_quote(adding)} must not include "
                       f"{_join_quote(sorted(caps))} in securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _check_restricted_volumes(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    bad, types = [], set()
    for v in spec.get("volumes") or []:
        if any(v.get(k) is not None for k in _RESTRICTED_VOLUME_OK):
            continue
        bad.append(v.get("name", ""))
        types.add(next((k for k in _RESTRICTED_VOLUME_TYPES if v.get(k) is not None), "unknown"))
    if bad:
        return "restricted volume types", (
            f"{_plural('volume', 'volumes', len(bad))} {_join_quote(bad)} {_plural('uses', 'use', len(bad))} "
            f"{_plural('restricted volume type', 'restricted volume types', len(types))} {_join_quote(sorted(types))}")
    return None


def _check_run_as_non_root(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    if _psa_user_namespace(spec, minor):
        return None
    setters = []
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    if pod_value is False:
        setters.append("pod")
    explicit, implicit = [], []
    for c in _containers(spec):
        value = _sc(c).get("runAsNonRoot")
        if value is not None:
            if not value:
                explicit.append(c.get("name", ""))
        elif pod_value is not True:
            implicit.append(c.get("name", ""))
    if explicit:
        setters.append(f"{_plural('container', 'containers', len(explicit))} {_join_quote(explicit)}")
    if setters:
        return "runAsNonRoot != true", f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false"
    if implicit:
        return "runAsNonRoot != true", (f"pod or {_plural('container', 'containers', len(implicit))} "
                                        f"{_join_quote(implicit)} must set securityContext.runAsNonRoot=true")
    return None


def _check_run_as_user(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    if _psa_user_namespace(spec, minor):
        return None
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    explicit = [c.get("name", "") for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if explicit:
        setters.append(f"{_plural('container', 'containers', len(explicit))} {_join_quote(explicit)}")
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


def _check_seccomp_restricted(meta: JSON, spec: JSON, minor: int) -> tuple[str, str] | None:
    if _psa_windows(spec):
        return None
    setters, values, _, implicit = _seccomp_setters(spec, lambda t: t in ("RuntimeDefault", "Localhost"))
    if setters:
        return "seccompProfile", (f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to "
                                  f"{_join_quote(sorted(values))}")
    if implicit:
        return "seccompProfile", (f"pod or {_plural('container', 'containers', len(implicit))} "
                                  f"{_join_quote(implicit)} must set securityContext.seccompProfile.type to "
                                  '"RuntimeDefault" or "Localhost"')
    return None


# In the registry's order: baseline checks by ID, then restricted ones (which override some baseline ones).
_PSA_BASELINE = (("appArmorProfile", _check_app_armor),
                 ("capabilities_baseline", _check_capabilities_baseline), ("hostNamespaces", _check_host_namespaces),
                 ("hostPathVolumes", _check_host_path_volumes), ("hostPorts", _check_host_ports),
                 ("hostProbesAndHostLifecycle", _check_host_probes), ("privileged", _check_privileged),
                 ("procMount", _check_proc_mount_baseline), ("seLinuxOptions", _check_se_linux),
                 ("seccompProfile_baseline", _check_seccomp_baseline), ("sysctls", _check_sysctls),
                 ("windowsHostProcess", _check_windows_host_process))
_PSA_RESTRICTED = (("allowPrivilegeEscalation", _check_allow_privilege_escalation),
                   ("capabilities_restricted", _check_capabilities_restricted),
                   ("procMount_restricted", _check_proc_mount_restricted),
                   ("restrictedVolumes", _check_restricted_volumes), ("runAsNonRoot", _check_run_as_non_root),
                   ("runAsUser", _check_run_as_user), ("seccompProfile_restricted", _check_seccomp_restricted))
_PSA_OVERRIDDEN = {"capabilities_baseline", "hostPathVolumes", "seccompProfile_baseline"}
"""Baseline checks a restricted check replaces (procMount from 1.35: see pod_security_results)."""


def pod_security_results(level: str, version: str, pod: JSON) -> list[tuple[str, str]]:
    """The (reason, detail) of each check the PodSecurity ``level`` at ``version`` fails for ``pod``."""
    if level == "privileged":
        return []
    minor = 10 ** 6 if version == "latest" else int(version.split(".")[1])
    checks = list(_PSA_BASELINE)
    if level == "restricted":
        overridden = _PSA_OVERRIDDEN | ({"procMount"} if minor >= 35 else set())
        checks = [c for c in checks if c[0] not in overridden] + list(_PSA_RESTRICTED)
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return [r for r in (check(meta, spec, minor) for _, check in checks) if r]


def pod_security_violations(level: str, version: str, pod: JSON) -> str | None:
    """What the PodSecurity ``level`` at ``version`` (``latest``, ``v1.30``) says of ``pod``:
    ``reason (detail), ...`` as AggregateCheckResult.ForbiddenDetail writes it, or None."""
    found = pod_security_results(level, version, pod)
    if not found:
        return None
    return ", ".join(f"{reason} ({detail})" if detail else reason for reason, detail in found)


def _images(pod: JSON) -> list[list[str]]:
    spec = pod.get("spec") or {}
    return [[str(c.get("image")) for c in spec.get(key) or []] for key in ("containers", "initContainers")]


def pod_security_policy(labels: dict[str, str]) -> tuple[dict[str, tuple[str, str]], list[FieldError]]:
    """api.PolicyToEvaluate: {mode: (level, version)} for enforce, audit and warn, and label errors."""
    errs: list[FieldError] = []
    policy = {mode: ("privileged", "latest") for mode in ("enforce", "audit", "warn")}
    for mode in policy:
        level, version = policy[mode]
        key = f"{PSA_PREFIX}{mode}"
        if key in labels:
            level = labels[key]
            if level not in PSA_LEVELS:
                errs.append(FieldError("Invalid", f"metadata.labels[{key}]", level,
                                       "must be one of " + ", ".join(PSA_LEVELS)))
                level = "restricted" if mode == "enforce" else "privileged"
        if f"{key}-version" in labels:
            version = labels[f"{key}-version"]
            if version != "latest" and not re.fullmatch(r"v1\.(0|[1-9][0-9]*)", version):
                errs.append(FieldError("Invalid", f"metadata.labels[{key}-version]", version,
                                       'must be "latest" or "v1.x"'))
                version = "latest"
        policy[mode] = (level, version)
    enforce_key, warn_key = f"{PSA_PREFIX}enforce", f"{PSA_PREFIX}warn"
    if (warn_key not in labels and labels.get(enforce_key) in PSA_LEVELS
            and PSA_LEVELS.index(policy["enforce"][0]) > PSA_LEVELS.index(policy["warn"][0])):
        policy["warn"] = (policy["enforce"][0], policy["enforce"][1] if f"{warn_key}-version" not in labels
                          else policy["warn"][1])
    return policy, errs


# --- PodDisruptionBudget (pkg/controller/disruption) ---------------------------------------------

def _pod_ready(pod: JSON) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _selector_matches(selector: JSON | None, labels: dict[str, str], empty_matches_all: bool) -> bool:
    """metav1.LabelSelectorAsSelector: a nil selector matches nothing; an empty one everything for
    the disruption controller (policy/v1), nothing for the eviction handler."""
    if selector is None:
        return False
    if not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return empty_matches_all
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _scaled(value: Any, total: int, round_up: bool) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, int):
        return value
    pct = int(str(value).rstrip("%"))
    amount = Fraction(pct * total, 100)
    return int(-(-amount // 1)) if round_up else int(amount // 1)


# --- watches ------------------------------------------------------------------------------------

@dataclass
class _Change:
    rv: int
    plural: str        # the qualified resource: "pods", "podgroups.scheduling.volcano.sh"
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
        if change.plural != self.rt.qualified:
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


FIELD_VALIDATION_MODES = ("Ignore", "Warn", "Strict")
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}
SYSTEM_PRIORITY_CLASS_DESCRIPTIONS = {
    "system-cluster-critical": "Used for system critical pods that must run in the cluster, but can be moved "
                               "to another node if necessary.",
    "system-node-critical": "Used for system critical pods that must not be moved from their current node."}
HIGHEST_USER_DEFINABLE_PRIORITY = 1000000000
_FIELD_VALIDATION: contextvars.ContextVar[str] = contextvars.ContextVar("field_validation", default="Strict")
_WARNINGS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("warnings", default=None)
_DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("dry_run", default=False)
_OPTIONS_KIND = {"create": "CreateOptions", "update": "UpdateOptions", "patch": "PatchOptions",
                 "delete": "DeleteOptions", "deletecollection": "DeleteOptions"}


def _dry_run(verb: str, values: list[str]) -> bool:
    """``dryRun`` as metav1 validation checks it: only ``All``, else the options' 422 Invalid."""
    if any(v != "All" for v in values):
        kind = _OPTIONS_KIND[verb]
        go = "[]string{" + ", ".join(json.dumps(v) for v in values) + "}"
        raise invalid_error(ResourceType(kind.lower(), kind, group="meta.k8s.io"), "",
                            [FieldError("NotSupported", "dryRun", _GoValue(go), 'supported values: "All"')])
    return bool(values)


class FakeKubeAPIServer:
    """See the module docstring. Start with ``with FakeKubeAPIServer() as api:`` or ``start()``."""

    def __init__(self, *, history_size: int = 1000, bookmark_interval_s: float = 1.0,
                 host: str = "127.0.0.1", port: int = 0, first_resource_version: int = 100,
                 validate: bool = True, field_validation: str = "Strict",
                 priority_classes: dict[str, int] | None = None) -> None:
        if field_validation not in FIELD_VALIDATION_MODES:
            raise ValueError(f"field_validation must be one of {FIELD_VALIDATION_MODES}")
        self.validate = validate
        """Check every create/update/patch against the 1.30 schema and the API's own rules."""
        self.field_validation = field_validation
        """The mode for a request that names none (the real server's default is Warn)."""
        self.history_size = history_size
        self.bookmark_interval_s = bookmark_interval_s
        self._host, self._port = host, port
        self._objects: dict[tuple[str, str, str], JSON] = {}
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        """How many objects of a type one namespace holds (whether a quota or a budget is there)."""
        self._pdb_members: dict[tuple[str, str], tuple[str, dict[str, tuple[bool, bool]]]] = {}
        """(namespace, budget) -> (the budget's uid and selector, its pods: name -> (healthy, has a
        controller)), kept pod by pod: a pod write re-reads that pod only, not the namespace."""
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
        self.pod_webhooks: list[Callable[[str, JSON], None]] = []
        """Mutating admission webhooks on pod create (dry runs included), ``(namespace, pod) ->
        None``, changing the pod in place or raising :class:`ApiError` to refuse it: what a
        component such as Kueue (``fakes.gang.FakeKueue``) registers; run on the server's loop. A
        webhook whose ``side_effects`` attribute is not ``None``/``NoneOnDryRun`` (the
        registration's ``sideEffects``) makes a dry run fail with 400 ``admission webhook "NAME"
        does not support dry run`` (``webhook_name``), as kube-apiserver answers."""
        self.log_source: Callable[[str, str], str | None] | None = None
        """``(namespace, pod) -> text`` for ``pods/NAME/log`` (the fake kubelet keeps the output);
        None from it: the container has not started."""
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._seed("namespaces", {"metadata": {"name": ns}})
        for name, value in SYSTEM_PRIORITY_CLASSES.items():
            self._seed("priorityclasses", {"metadata": {"name": name}, "value": value,
                                           "description": SYSTEM_PRIORITY_CLASS_DESCRIPTIONS[name]})
        for name, value in (priority_classes or {}).items():
            self._seed("priorityclasses", {"metadata": {"name": name}, "value": value})

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

    def _seed(self, plural: str, obj: JSON) -> None:
        """An object the cluster starts with: at the first resourceVersion, before any watch's window."""
        rt = RESOURCES[plural]
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_timestamp(_now()), resourceVersion=str(self._rv))
        _prepare_for_create(rt, obj)
        key = self._key(rt, meta.get("namespace"), meta["name"])
        self._objects[key] = obj
        self._counts[key[:2]] += 1

    @property
    def priority_classes(self) -> dict[str, int]:
        """PriorityClass name -> value, from the stored PriorityClass objects."""
        return {o["metadata"]["name"]: o.get("value", 0) for o in self.objects("priorityclasses")}

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
        qualified = _resource(plural).qualified
        obj = self._on_loop(lambda: self._objects.get((qualified, namespace or "", name)))
        return copy.deepcopy(obj)

    def objects(self, plural: str, namespace: str | None = None) -> list[JSON]:
        """Copies of the stored objects of one type (one namespace, or all)."""
        qualified = _resource(plural).qualified

        def pick() -> list[JSON]:
            return [o for (p, ns, _), o in sorted(self._objects.items())
                    if p == qualified and (namespace is None or ns == namespace)]
        return copy.deepcopy(self._on_loop(pick))

    def finish_deletion(self, plural: str, namespace: str | None, name: str) -> None:
        """The kubelet's last word on a terminating object: its grace period is over.

        The object goes at once unless finalizers hold it. Raises ``LookupError`` when it
        does not exist or is not being deleted.
        """
        def finish() -> None:
            rt = _resource(plural)
            key = self._key(rt, namespace, name)
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
        return self._on_loop(lambda: sum(1 for w in self._watchers if plural in (None, w.rt.plural, w.rt.qualified)))

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
        plural = rt.plural if RESOURCES.get(rt.plural) is rt else rt.qualified
        resource = f"{plural}/{sub}" if sub else plural
        agent = request.headers.get("User-Agent", "")
        with self._lock:
            self._requests[(verb, resource)] += 1
            self._requests_by_agent[(agent, verb, resource)] += 1
            fault = next((f for f in self._faults if f.matches(verb, resource, name, agent)), None)
            if fault is not None:
                fault.hits += 1
        warnings: list[str] = []
        _WARNINGS.set(warnings)
        try:
            if fault is not None:
                if fault.delay_s:
                    await asyncio.sleep(fault.delay_s)
                if fault.status is not None:
                    raise ApiError(fault.status, fault.message)
            mode = q.get("fieldValidation", "") or self.field_validation
            if mode not in FIELD_VALIDATION_MODES:
                raise ApiError(400, f'fieldValidation: Unsupported value: "{mode}": supported values: "", '
                                    '"Ignore", "Strict", "Warn"')
            _FIELD_VALIDATION.set(mode)
            response = await self._dispatch(request, verb, rt, namespace, name, sub)
        except ApiError as err:
            response = self._error(err)
        for text in warnings:
            response.headers.add("Warning", '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
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
        if len(rest) >= 3 and rest[0] == "namespaces" and (group, rest[2]) in _BY_GROUP:
            namespace, rest = rest[1], rest[2:]
        if not 1 <= len(rest) <= 3:
            return None
        rt = _BY_GROUP.get((group, rest[0]))
        if rt is None or rt.version != version:
            return None
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if namespace is not None and not rt.namespaced:
            return None
        if namespace is None and rt.namespaced and name is not None:
            return None
        if sub is not None and not (sub == "status" and rt.status_subresource
                                    or sub in ("binding", "log", "eviction") and rt.plural == "pods"):
            return None
        return rt, namespace, name, sub

    @staticmethod
    def _error(err: ApiError) -> web.Response:
        response = web.json_response(err.status(), status=err.code)
        retry = (err.details or {}).get("retryAfterSeconds")
        if retry:     # responsewriters.ErrorNegotiated: a Status that says when to retry says it in a header too
            response.headers["Retry-After"] = str(retry)
        return response

    async def _dispatch(self, request: web.Request, verb: str, rt: ResourceType,
                        namespace: str | None, name: str | None, sub: str | None) -> web.StreamResponse:
        q = request.query
        if verb in _OPTIONS_KIND:
            _DRY_RUN.set(_dry_run(verb, q.getall("dryRun", [])))
        if verb == "watch":
            return await self._watch(request, rt, namespace)
        if verb == "list":
            return web.json_response(self._list(rt, namespace, q))
        if verb == "get" and sub == "log":
            return self._log(namespace, name, q)
        if verb == "get":
            return web.json_response(self._get(rt, namespace, name))
        body = await self._body(request)
        if verb == "create" and sub == "eviction":
            return web.json_response(self._evict(rt, namespace, name or "", body), status=201)
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
        if options.get("dryRun") and not _DRY_RUN.get():
            _DRY_RUN.set(_dry_run(verb, options["dryRun"]))
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
        return (rt.qualified, namespace or "", name)

    def _stored(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self._objects.get(self._key(rt, namespace, name))
        if obj is None:
            raise _not_found(rt, name)
        return obj

    def _write(self, rt: ResourceType, key: tuple[str, str, str], obj: JSON, kind: str,
               old: JSON | None) -> JSON:
        """Store ``obj`` (a fresh dict never mutated afterwards) at a new resourceVersion.

        Under ``dryRun=All`` nothing is stored: ``obj`` comes back as the real server's dry-run
        storage answers it (a create without a resourceVersion, an update with the old one)."""
        if _DRY_RUN.get():
            if old is None:
                obj["metadata"].pop("resourceVersion", None)
            return obj
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if key not in self._objects:
            self._counts[key[:2]] += 1
        self._objects[key] = obj
        self._record(_Change(self._rv, rt.qualified, key[1], kind, obj, old))
        self._controllers(rt, key[1], key[2])
        return obj

    def _remove(self, rt: ResourceType, key: tuple[str, str, str], obj: JSON) -> JSON:
        if _DRY_RUN.get():
            return copy.deepcopy(obj)
        self._rv += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        del self._objects[key]
        self._counts[key[:2]] -= 1
        self._record(_Change(self._rv, rt.qualified, key[1], "DELETED", gone))
        self._controllers(rt, key[1], key[2])
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
                if plural == rt.qualified and (namespace is None or ns == namespace)
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
        # built-in list items carry no kind/apiVersion, as the real server sends them; custom
        # resources' (unstructured) items keep theirs
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta,
                "items": [o if rt.custom else {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                          for o in items]}

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
        _check_type(rt, obj, name)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        required = self._decode(rt, obj)
        meta = obj.setdefault("metadata", {})
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _timestamp(_now())
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(transient, None)
        if rt.generation or rt.custom:
            meta["generation"] = 1
        _prepare_for_create(rt, obj)
        if rt.plural == "pods":
            self._admit_priority(name, obj["spec"])
            for webhook in self.pod_webhooks:   # mutating admission webhooks: after defaulting, before validation
                side_effects = getattr(webhook, "side_effects", "None")
                if _DRY_RUN.get() and side_effects not in ("None", "NoneOnDryRun"):
                    # the API server does not call a webhook that may have side effects on a dry run
                    raise ApiError(400, f'admission webhook "{getattr(webhook, "webhook_name", "webhook")}" does '
                                        "not support dry run")
                webhook(namespace or "", obj)
        self._validate(rt, name, obj, None, required)
        self._admit(rt, namespace, name, obj, None)
        key = self._key(rt, namespace, name)
        if key in self._objects:
            raise ApiError(409, f'{rt.qualified} "{name}" already exists', reason="AlreadyExists",
                           details=_details(rt, name))
        return self._write(rt, key, obj, "ADDED", None)

    def _decode(self, rt: ResourceType, obj: JSON) -> list[FieldError]:
        """The decoder's checks (400s, unknown fields per fieldValidation); the missing required fields."""
        if not self.validate:
            return []
        warnings, required = decode_check(rt, obj, _FIELD_VALIDATION.get())
        collected = _WARNINGS.get()
        if collected is not None:
            collected.extend(warnings)
        return required

    def _validate(self, rt: ResourceType, name: str, obj: JSON, old: JSON | None,
                  required: list[FieldError], status_only: bool = False) -> None:
        if not self.validate:
            return
        if status_only:
            errs: list[FieldError] = []
            _object_meta(rt, obj.get("metadata") or {}, errs)
        else:
            errs = semantic_errors(rt, obj, old)
        errs = required + errs
        if errs:
            raise invalid_error(rt, name, errs)

    def _admit_priority(self, name: str, spec: JSON) -> None:
        """The Priority admission plugin: ``spec.priority`` (and ``preemptionPolicy``) from the
        PriorityClass ``spec.priorityClassName`` names, or from the globalDefault class when none."""
        rt = RESOURCES["pods"]
        classes = {o["metadata"]["name"]: o for o in self._selected(RESOURCES["priorityclasses"], None, Selector())}
        class_name = spec.get("priorityClassName")
        if class_name:
            pc = classes.get(class_name)
            if pc is None:
                raise _forbidden(rt, name, f"no PriorityClass with name {class_name} was found")
        else:
            # getDefaultPriorityClass: of several globalDefault classes, the lowest value
            defaults = sorted((o.get("value", 0), n) for n, o in classes.items() if o.get("globalDefault"))
            pc = classes[defaults[0][1]] if defaults else None
            if pc is not None:
                spec["priorityClassName"] = pc["metadata"]["name"]
        value = pc.get("value", 0) if pc is not None else 0
        if spec.get("priority") is not None and spec["priority"] != value:
            raise _forbidden(rt, name, f"the integer value of priority ({spec['priority']}) must not be provided in "
                                       f"pod spec; priority admission controller computed {value} from the given "
                                       "PriorityClass name")
        spec["priority"] = value
        policy = pc.get("preemptionPolicy") if pc is not None else None
        if policy:
            if spec.get("preemptionPolicy") not in (None, policy):
                raise _forbidden(rt, name, f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) must "
                                           f"not be provided in pod spec; priority admission controller computed "
                                           f"{policy} from the given PriorityClass name")
            spec["preemptionPolicy"] = policy
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")

    # --- validating admission and the controllers the fake stands in for ---

    def _admit(self, rt: ResourceType, namespace: str | None, name: str, obj: JSON, old: JSON | None) -> None:
        """The validating admission plugins, after the object's own validation (create and update;
        a dry run too): PodSecurity, the Priority plugin's one-default rule, ResourceQuota last."""
        if rt.plural == "namespaces":
            self._admit_namespace(name, obj, old)
        if rt.plural == "priorityclasses" and obj.get("globalDefault"):
            for other in self._selected(rt, None, Selector()):
                if other.get("globalDefault") and other["metadata"]["name"] != name:
                    raise _forbidden(rt, name, f"PriorityClass {other['metadata']['name']} is already marked as "
                                               "default. Only one default can exist")
        if old is not None:
            # isSignificantPodUpdate: a pod update that changes an image is checked again
            if rt.plural == "pods" and _images(obj) != _images(old):
                self._admit_pod_security(namespace or "", name, obj)
            return
        if rt.plural == "pods":
            self._admit_pod_security(namespace or "", name, obj)
        if rt.namespaced:
            self._admit_quota(rt, namespace or "", name, obj)

    def _admit_namespace(self, name: str, obj: JSON, old: JSON | None) -> None:
        """PodSecurity on a namespace: its labels must parse (on update, unless they were already
        wrong the same way); a stricter enforce level warns about the pods already there."""
        policy, errs = pod_security_policy((obj.get("metadata") or {}).get("labels") or {})
        old_policy, old_errs = pod_security_policy(((old or {}).get("metadata") or {}).get("labels") or {})
        if errs and (old is None or not old_errs or errs != old_errs):
            raise invalid_error(RESOURCES["namespaces"], name, errs)
        level, version = policy["enforce"]
        old_level, old_version = old_policy["enforce"]
        if (old is None or (level, version) == (old_level, old_version) or level == "privileged"
                or (version == old_version and PSA_LEVELS.index(level) <= PSA_LEVELS.index(old_level))):
            return
        first: dict[str, tuple[str, int]] = {}        # ForbiddenReason -> (first pod by name, count)
        for pod in self._selected(RESOURCES["pods"], name, Selector()):
            found = pod_security_results(level, version, pod)
            if found:
                reason = ", ".join(r for r, _ in found)
                pod_name = pod["metadata"]["name"]
                seen = first.get(reason)
                first[reason] = (min(pod_name, seen[0]) if seen else pod_name, (seen[1] if seen else 0) + 1)
        warnings = _WARNINGS.get()
        if not first or warnings is None:
            return
        warnings.append(f'existing pods in namespace "{name}" violate the new PodSecurity enforce level '
                        f'"{level}:{version}"')
        decorated = []
        for reason, (pod_name, count) in first.items():
            others = "" if count == 1 else " (and 1 other pod)" if count == 2 else f" (and {count - 1} other pods)"
            decorated.append(f"{pod_name}{others}: {reason}")
        warnings.extend(sorted(decorated))

    def _admit_pod_security(self, namespace: str, name: str, pod: JSON) -> None:
        """PodSecurity: the namespace's enforce level refuses the pod (403); its warn level adds a
        ``Warning`` header to a pod it lets in. A namespace never created has no labels (privileged)."""
        ns = self._objects.get(self._key(RESOURCES["namespaces"], None, namespace))
        policy, _ = pod_security_policy(((ns or {}).get("metadata") or {}).get("labels") or {})
        level, version = policy["enforce"]
        found = pod_security_violations(level, version, pod)
        if found:
            raise _forbidden(RESOURCES["pods"], name, f'violates PodSecurity "{level}:{version}": {found}')
        level, version = policy["warn"]
        found = pod_security_violations(level, version, pod)
        warnings = _WARNINGS.get()
        if found and warnings is not None:
            warnings.append(f'would violate PodSecurity "{level}:{version}": {found}')

    def _quota_delta(self, rt: ResourceType, obj: JSON) -> _Usage:
        """What one new object counts against a quota (the evaluators' Usage)."""
        if rt.plural == "pods":
            return pod_quota_usage(obj)
        usage = _Usage()
        usage.add(f"count/{rt.qualified}", 1)
        if rt.plural in ("configmaps", "secrets", "services", "resourcequotas"):
            usage.add(rt.plural, 1)
        return usage

    def _quota_matches(self, rt: ResourceType, resource: str) -> bool:
        if rt.plural == "pods":
            return _quota_tracks(resource)
        return resource in (f"count/{rt.qualified}", rt.plural) and (
            resource.startswith("count/") or rt.plural in ("configmaps", "secrets", "services", "resourcequotas"))

    def _admit_quota(self, rt: ResourceType, namespace: str, name: str, obj: JSON) -> None:
        """ResourceQuota: every quota in the namespace that limits what the object uses must have room."""
        quotas = self._selected(RESOURCES["resourcequotas"], namespace, Selector())
        interesting = []
        for quota in quotas:
            status = quota.get("status") or {}
            hard = status.get("hard") or {}
            restricted = {r for r in hard if self._quota_matches(rt, r)}
            if not restricted or (rt.plural == "pods" and not quota_scope_matches(quota, obj)):
                continue
            qname = quota["metadata"]["name"]
            if rt.plural == "pods":
                missing = _quota_must_specify(obj.get("spec") or {}, restricted)
                if missing:
                    raise _forbidden(rt, name, f"failed quota: {qname}: {missing}")
            unknown = sorted(restricted - set(status.get("used") or {}))
            if unknown:
                raise _forbidden(rt, name, f"status unknown for quota: {qname}, resources: {','.join(unknown)}")
            interesting.append(quota)
        if not interesting:
            return
        delta = self._quota_delta(rt, obj)
        for quota in interesting:
            hard, used = quota["status"]["hard"], quota["status"]["used"]
            requested = [r for r in sorted(hard) if r in delta.amounts]
            exceeded = [r for r in requested
                        if parse_quantity(used.get(r, "0")) + delta.amounts[r] > parse_quantity(hard[r])]
            if exceeded:
                raise _forbidden(rt, name, f"exceeded quota: {quota['metadata']['name']}, "
                                           f"requested: {','.join(f'{r}={delta.text(r)}' for r in exceeded)}, "
                                           f"used: {','.join(f'{r}={used.get(r, chr(48))}' for r in exceeded)}, "
                                           f"limited: {','.join(f'{r}={hard[r]}' for r in exceeded)}")

    def _controllers(self, rt: ResourceType, namespace: str, name: str = "") -> None:
        """What kube-controller-manager does at once after a write of ``name``: the quota
        controller keeps ``status.hard``/``used``, the disruption controller each
        PodDisruptionBudget's status."""
        if rt.namespaced and self._counts[("resourcequotas", namespace)]:
            self._sync_quotas(namespace)
        if rt.plural in ("pods", "poddisruptionbudgets") and self._counts[("poddisruptionbudgets.policy", namespace)]:
            self._sync_pdbs(namespace, pod=name if rt.plural == "pods" else "")

    def _quota_used(self, namespace: str, quota: JSON, names: list[str]) -> dict[str, str]:
        usage = _Usage()
        known: set[str] = set()
        if any(_quota_tracks(n) for n in names):
            for pod in self._selected(RESOURCES["pods"], namespace, Selector()):
                if quota_scope_matches(quota, pod):
                    usage.merge(pod_quota_usage(pod))
            known |= {n for n in names if _quota_tracks(n)}
        for n in names:
            # count/<resource>.<group> (the core group bare), or a legacy object-count name
            counted = RESOURCES.get(n[len("count/"):]) if n.startswith("count/") else (
                RESOURCES[n] if n in ("configmaps", "secrets", "services", "resourcequotas") else None)
            if counted is not None and n.startswith("count/") and counted.qualified != n[len("count/"):]:
                counted = None
            if counted is not None and counted.namespaced and not (counted.plural == "pods" and n in known):
                usage.add(n, len(self._selected(counted, namespace, Selector())))
                known.add(n)
        return {n: usage.text(n) for n in sorted(known)}

    def _sync_quotas(self, namespace: str) -> None:
        rt = RESOURCES["resourcequotas"]
        for quota in self._selected(rt, namespace, Selector()):
            hard = (quota.get("spec") or {}).get("hard") or {}
            try:
                status = {"hard": {n: format_quantity(*_q(v)) for n, v in hard.items()},
                          "used": self._quota_used(namespace, quota, list(hard))}
            except QuantityError:
                continue
            status = {k: v for k, v in status.items() if v}        # empty ResourceLists are omitted
            if quota.get("status") != status:
                new = copy.deepcopy(quota)
                new["status"] = status
                self._write(rt, self._key(rt, namespace, quota["metadata"]["name"]), new, "MODIFIED", quota)

    def _pdb_status(self, pdb: JSON, members: dict[str, tuple[bool, bool]]) -> JSON:
        """The disruption controller's trySync (or its failSafe) for one budget; ``members``: the
        pods its selector selects, name -> (healthy: Ready and not deleting, has a controller)."""
        spec, old = pdb.get("spec") or {}, pdb.get("status") or {}
        generation = pdb["metadata"].get("generation", 1)
        error, expected, desired = None, 0, 0
        max_unavailable, min_available = spec.get("maxUnavailable"), spec.get("minAvailable")
        if max_unavailable is not None or isinstance(min_available, str):
            # getExpectedScale: a pod's controller's scale; unmanaged pods are skipped, and the
            # fake keeps no Deployment, ReplicaSet or StatefulSet to find a controller among
            owned = sorted(name for name, (_, controlled) in members.items() if controlled)
            if owned:
                error = f'found no controllers for pod "{owned[0]}"'
            elif max_unavailable is not None:
                desired = max(0, expected - _scaled(max_unavailable, expected, True))
            else:
                desired = _scaled(min_available, expected, True)
        elif min_available is not None:
            desired, expected = int(min_available), len(members)
        conditions = [c for c in old.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
        previous = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)

        def condition(status: str, reason: str, message: str, observed: int | None) -> JSON:
            since = previous["lastTransitionTime"] if previous and previous.get("status") == status else _timestamp(_now())
            cond = {"type": "DisruptionAllowed", "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": since}
            if observed:
                cond["observedGeneration"] = observed
            return cond
        if error is not None:
            status = {**old, "disruptionsAllowed": 0}
            status["conditions"] = conditions + [condition("False", "SyncFailed", error, old.get("observedGeneration"))]
            return status
        healthy = sum(1 for ready, _ in members.values() if ready)
        allowed = healthy - desired
        if expected <= 0 or allowed <= 0:
            allowed = 0
        status = {"observedGeneration": generation, "disruptionsAllowed": allowed, "currentHealthy": healthy,
                  "desiredHealthy": desired, "expectedPods": expected}
        status["conditions"] = conditions + [
            condition("True", "SufficientPods", "", generation) if allowed > 0
            else condition("False", "InsufficientPods", "", generation)]
        return status

    @staticmethod
    def _pdb_member(pod: JSON) -> tuple[bool, bool]:
        """What a budget counts of one of its pods: (healthy, has a controller)."""
        meta = pod["metadata"]
        return (not meta.get("deletionTimestamp") and _pod_ready(pod),
                any(r.get("controller") for r in meta.get("ownerReferences") or []))

    def _members(self, namespace: str, pdb: JSON, pod: str) -> dict[str, tuple[bool, bool]]:
        """The pods ``pdb`` selects, kept up to date by the pod just written (``pod``; empty: a
        budget was written). A budget new here, or whose selector changed, reads them all again."""
        selector = (pdb.get("spec") or {}).get("selector")
        ident = f"{pdb['metadata'].get('uid', '')} {json.dumps(selector, sort_keys=True)}"
        key = (namespace, pdb["metadata"]["name"])
        known = self._pdb_members.get(key)
        if known is None or known[0] != ident:
            members = {obj["metadata"]["name"]: self._pdb_member(obj)
                       for (plural, ns, _), obj in self._objects.items()
                       if plural == "pods" and ns == namespace
                       and _selector_matches(selector, obj["metadata"].get("labels") or {}, True)}
            self._pdb_members[key] = (ident, members)
            return members
        members = known[1]
        if not pod:
            return members
        obj = self._objects.get(("pods", namespace, pod))
        if obj is not None and _selector_matches(selector, obj["metadata"].get("labels") or {}, True):
            members[pod] = self._pdb_member(obj)
        else:
            members.pop(pod, None)
        return members

    def _sync_pdbs(self, namespace: str, pod: str = "") -> None:
        """Each budget's status after a write of ``pod`` (empty: of a budget), as the disruption
        controller keeps it; a pod write costs one look at that pod per budget, not a pass over
        the namespace's pods (at 1,024 pods that pass made each pod write milliseconds slower)."""
        rt = RESOURCES["poddisruptionbudgets"]
        pdbs = sorted((obj for (plural, ns, _), obj in self._objects.items() if plural == rt.qualified and ns == namespace),
                      key=lambda obj: obj["metadata"]["name"])  # not _selected: it sorts every object stored
        names = {p["metadata"]["name"] for p in pdbs}
        for gone in [k for k in self._pdb_members if k[0] == namespace and k[1] not in names]:
            del self._pdb_members[gone]
        for pdb in pdbs:
            status = self._pdb_status(pdb, self._members(namespace, pdb, pod))
            if pdb.get("status") != status:
                new = copy.deepcopy(pdb)
                new["status"] = status
                self._write(rt, self._key(rt, namespace, pdb["metadata"]["name"]), new, "MODIFIED", pdb)

    def _evict(self, rt: ResourceType, namespace: str | None, name: str, body: Any) -> JSON:
        """``pods/NAME/eviction`` (policy/v1 Eviction), as EvictionREST.Create decides."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be an object")
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "name in URL does not match name in Eviction object")
        options = dict(body.get("deleteOptions") or {})
        if options.get("dryRun") and not _DRY_RUN.get():
            _DRY_RUN.set(_dry_run("create", options["dryRun"]))
        pod = self._stored(rt, namespace, name)
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        if ((pod.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Pending")
                or pod["metadata"].get("deletionTimestamp")):
            self._delete(rt, namespace, name, options)     # canIgnorePDB: no budget to ask
            return success
        labels = pod["metadata"].get("labels") or {}
        pdbs = [p for p in self._selected(RESOURCES["poddisruptionbudgets"], namespace, Selector())
                if _selector_matches((p.get("spec") or {}).get("selector"), labels, False)]
        if len(pdbs) > 1:
            raise ApiError(500, "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                                "does not support.", reason="")
        if pdbs:
            pdb = pdbs[0]
            pdb_name, status = pdb["metadata"]["name"], pdb.get("status") or {}
            healthy, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
            refused = "Cannot evict pod as it would violate the pod's disruption budget."
            if not (not _pod_ready(pod) and healthy >= desired and desired > 0):
                if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
                    raise ApiError(429, refused, details={"retryAfterSeconds": 10, "causes": [
                        {"reason": "DisruptionBudget",
                         "message": f"The disruption budget {pdb_name} is still being processed by the server."}]})
                if status.get("disruptionsAllowed", 0) < 0:
                    raise _forbidden(ResourceType("poddisruptionbudget", "PodDisruptionBudget", group="policy"),
                                     pdb_name, "pdb disruptions allowed is negative")
                if status.get("disruptionsAllowed", 0) == 0:
                    raise ApiError(429, refused, details={"causes": [
                        {"reason": "DisruptionBudget",
                         "message": f"The disruption budget {pdb_name} needs {desired} healthy pods and has "
                                    f"{healthy} currently"}]})
        self._delete(rt, namespace, name, options)
        return success

    def _delete_namespace(self, rt: ResourceType, key: tuple[str, str, str], old: JSON) -> JSON:
        """The namespace goes Terminating, the namespace controller deletes everything in it (at
        once here, no grace periods), then the namespace itself goes."""
        terminating = copy.deepcopy(old)
        if not terminating["metadata"].get("deletionTimestamp"):
            terminating["metadata"]["deletionTimestamp"] = _timestamp(_now())
            terminating["metadata"]["deletionGracePeriodSeconds"] = 0
        terminating.setdefault("status", {})["phase"] = "Terminating"
        if _DRY_RUN.get():
            return terminating
        answer = self._write(rt, key, terminating, "MODIFIED", old)
        name = key[2]
        for inner in [k for k in self._objects if k[1] == name and RESOURCES[k[0]].namespaced]:
            if inner in self._objects:
                self._remove(RESOURCES[inner[0]], inner, self._objects[inner])
        self._remove(rt, key, self._objects[key])
        return answer

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
        body = copy.deepcopy(body)
        _check_type(rt, body, name)
        body["apiVersion"], body["kind"] = rt.api_version, rt.kind
        required = self._decode(rt, body)
        new = self._next_version(rt, old, body, sub)
        self._validate(rt, name, new, old, required if sub != "status" else [], status_only=sub == "status")
        if sub != "status":
            self._admit(rt, namespace, name, new, old)
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
                     "deletionGracePeriodSeconds", "resourceVersion", "generation"):
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
        if rt.generation or rt.custom:
            skip = ("metadata", "apiVersion", "kind") + (("status",) if rt.status_subresource else ())

            def content(o: JSON) -> JSON:
                return {k: v for k, v in o.items() if k not in skip}
            generation = old["metadata"].get("generation", 1)
            meta["generation"] = generation + 1 if content(new) != content(old) else generation
        if rt.plural == "pods":
            new["spec"] = _pod_spec_defaults(new.get("spec") or {})
            _check_pod_spec_update(meta["name"], old, new)
        if rt.plural == "secrets":
            _fold_string_data(new)
            new.setdefault("type", old.get("type", "Opaque"))
        if rt.plural == "namespaces":
            _namespace_defaults(new)
        if rt.plural == "priorityclasses":
            new.setdefault("preemptionPolicy", "PreemptLowerPriority")
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
        if old["metadata"].get("deletionTimestamp"):
            raise _conflict(rt, name, f"pod {name} is being deleted, cannot be assigned to a host")
        if (old.get("spec") or {}).get("schedulingGates"):
            raise _conflict(rt, name, f"pod {name} has non-empty .spec.schedulingGates")
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
        if rt.plural == "priorityclasses" and name in SYSTEM_PRIORITY_CLASSES:
            raise _forbidden(rt, name, "this is a system priority class and cannot be deleted")
        if rt.plural == "namespaces":
            if name in ("default", "kube-system", "kube-public"):    # NamespaceLifecycle's immortal ones
                raise _forbidden(rt, name, "this namespace may not be deleted")
            return self._delete_namespace(rt, key, old)
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
                deleted.append(result if rt.custom else
                               {k: v for k, v in result.items() if k not in ("kind", "apiVersion")})
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self._rv)}, "items": deleted}

    # --- watch ---

    def _bookmark(self, rt: ResourceType, initial_events_end: bool = False) -> JSON:
        meta: JSON = {"resourceVersion": str(self._rv)}
        if initial_events_end:   # the end of a sendInitialEvents watch's initial state (1.27+)
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

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
        initial = _is_true(q.get("sendInitialEvents"))
        if initial:
            errs = []
            if q.get("resourceVersionMatch") != "NotOlderThan":
                errs.append(FieldError("Forbidden", "resourceVersionMatch",
                                       detail="sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
            if not watcher.bookmarks:
                errs.append(FieldError("Forbidden", "allowWatchBookmarks",
                                       detail="sendInitialEvents requires setting allowWatchBookmarks to true"))
            if errs:
                raise invalid_error(ResourceType("listoptions", "ListOptions", group="meta.k8s.io"), "", errs)
        # from here to registering the watcher nothing awaits: no change can slip between
        if initial:
            if since not in ("", "0") and int(since) > self._rv:
                raise ApiError(504, f"Timeout: Too large resource version: {since}, current: {self._rv}")
            for obj in self._selected(rt, namespace, watcher.selector):
                watcher.queue.put_nowait(("ADDED", obj))
            watcher.queue.put_nowait(("BOOKMARK", self._bookmark(rt, initial_events_end=True)))
        elif since in ("", "0"):
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
