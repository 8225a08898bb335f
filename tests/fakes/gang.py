"""Fake gang admission for the fake cluster: Kueue's plain-pod integration, and a gang scheduler
for Volcano's and scheduler-plugins' PodGroups. Pairs with :mod:`fakes.kube_apiserver` and
:mod:`fakes.kubelet`; talks to the API server through the official client (reads from its store).

:class:`FakeKueue` (Kueue's pod webhook and pod-group controller, ``kueue.x-k8s.io/v1beta1``):

- the webhook (a mutating webhook of the fake API server, dry runs included): a pod of the
  namespace labelled ``kueue.x-k8s.io/queue-name`` gets the scheduling gate
  ``kueue.x-k8s.io/admission`` and the label ``kueue.x-k8s.io/managed: "true"``; a pod with
  ``kueue.x-k8s.io/pod-group-name`` and no positive ``kueue.x-k8s.io/pod-group-total-count``
  annotation is refused (422, as the webhook's validation);
- a Workload per pod group (named after the group; a pod without a group: ``pod-<name>``), made
  once every pod the group's total count declares exists: ``spec.queueName``, one podSet of
  ``count`` pods, ``spec.priority`` from the pods' ``spec.priority``;
- admission by quota: the LocalQueue's ClusterQueue (``spec.resourceGroups[].flavors[]
  .resources[].nominalQuota``, summed over flavors), against what the admitted workloads whose
  pods have not all terminated use (the pods' requests; a limit without a request counts as
  one). A workload that fits gets ``status.admission``, ``QuotaReserved`` and ``Admitted`` True
  and its pods' gate removed, all at once; one that does not stays gated with ``QuotaReserved``
  False, reason ``Pending``, ``couldn't assign flavors to pod set main: insufficient unused quota
  for nvidia.com/gpu in flavor default, 2 more needed`` (or ``resource X unavailable in
  ClusterQueue``); higher ``spec.priority`` first, then the older;
- preemption (the ClusterQueue's ``spec.preemption.withinClusterQueue: LowerPriority``): admitted
  workloads of lower priority, lowest and newest first, until the pending one would fit: each
  gets ``Evicted`` True, reason ``Preempted``, ``Preempted to accommodate a workload (UID: <uid>)
  due to prioritization in the ClusterQueue``, and its pods are stopped as Kueue's pod controller
  stops them: the condition ``TerminationTarget`` True, reason ``WorkloadEvictedDueToPreempted``,
  the same message, then a graceful delete. Their quota is held until the pods have terminated;
- a workload whose pods all succeeded gets ``Finished``, and so does one with no pod active whose
  group is not retriable (a pod of it carried ``kueue.x-k8s.io/retriable-in-group: "false"``):
  its quota is released. A retriable group whose pods all ended (failed, or deleted) keeps its
  admission and the quota of its whole pod set, as Kueue keeps it for replacement pods (the
  real pods would also stay Terminating under Kueue's finalizer, which is not modelled). A
  finished or unadmitted workload whose pods are all gone is deleted.

Not modelled: the finalizer Kueue puts on pods, flavors' node labels and taints, cohorts and
borrowing, fair sharing, admission checks, waitForPodsReady, partial admission, replacement pods.

:class:`FakeGangScheduler`: the scheduler named ``scheduler_name`` (``volcano``, or
scheduler-plugins' ``scheduler-plugins-scheduler``), which the fake kubelet leaves alone. For
each PodGroup of its API (``scheduling.volcano.sh/v1beta1``: pods name it in the annotation
``scheduling.k8s.io/group-name``; ``scheduling.x-k8s.io/v1alpha1``: the label
``scheduling.x-k8s.io/pod-group``) it binds the group's pending pods only when at least
``spec.minMember`` pods exist and all of them fit the nodes together (the default scheduler's
filters and the nodes' allocatable, as the fake kubelet's scheduler counts them). Otherwise
each pod is ``PodScheduled`` False ``Unschedulable`` with the gang's message and the PodGroup's
status phase ``Pending`` with an ``Unschedulable`` condition; bound: phase ``Running``. A pod
whose group does not exist waits likewise. Higher-priority groups are tried first; a
higher-priority group that cannot fit preempts running groups of lower priority (their pods get
``DisruptionTarget`` True, reason ``PreemptionByScheduler``, and a graceful delete).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from fractions import Fraction
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fakes.kube_apiserver import ApiError, parse_quantity
from fakes.kubelet import FakeKubelet, _set_condition, pod_requests

JSON = dict[str, Any]
KUEUE = ("kueue.x-k8s.io", "v1beta1")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
GATE = "kueue.x-k8s.io/admission"
TERMINAL = ("Succeeded", "Failed")


def _fmt(q: Fraction) -> str:
    return str(int(q)) if q.denominator == 1 else str(float(q))


class _Loop:
    """A polling thread, with a client of its own."""

    agent = "fake"

    def __init__(self, api: Any, namespace: str, poll_s: float) -> None:
        self.api, self.namespace, self.poll_s = api, namespace, poll_s
        api_client = client.ApiClient(api.configuration())
        api_client.user_agent = self.agent
        self.v1 = client.CoreV1Api(api_client)
        self.crd = client.CustomObjectsApi(api_client)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.stopped: dict[str, JSON] = {}
        self.errors: list[str] = []

    def start(self):
        self._thread = threading.Thread(target=self._run, name=f"{self.agent}-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.v1.api_client.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - an API hiccup (a conflict): the next pass tries again
                self.errors.append(repr(exc))
            self._stopping.wait(self.poll_s)

    def tick(self) -> None:
        raise NotImplementedError

    def _pod_status(self, name: str, uid: str, mutate: Callable[[JSON], None]) -> None:
        for _ in range(20):
            try:
                raw = json.loads(self.v1.read_namespaced_pod(name, self.namespace, _preload_content=False).data)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if raw["metadata"]["uid"] != uid:
                return
            raw["status"] = raw.get("status") or {}
            mutate(raw["status"])
            try:
                self.v1.replace_namespaced_pod_status(name, self.namespace, raw, _preload_content=False)
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise

    def _stop_pod(self, pod: JSON, type_: str, reason: str, message: str) -> None:
        """A condition on the pod, then its graceful delete (its own terminationGracePeriodSeconds).
        Each stop is kept in ``stopped`` (name -> the condition written): a pod with a short grace
        may be gone before a test reads it back."""
        meta = pod["metadata"]
        self.stopped[meta["name"]] = {"type": type_, "status": "True", "reason": reason, "message": message}
        self._pod_status(meta["name"], meta["uid"], lambda status: _set_condition(
            status.setdefault("conditions", []), type_, "True", reason, message))
        try:
            self.v1.delete_namespaced_pod(meta["name"], self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise


class FakeKueue(_Loop):
    """See the module docstring. ``with FakeKueue(api, "ml"):``; create the ResourceFlavor,
    ClusterQueue and LocalQueue objects in the test."""

    agent = "kueue-controller-manager/fake"

    def __init__(self, api: Any, namespace: str, poll_s: float = 0.1) -> None:
        super().__init__(api, namespace, poll_s)
        self.admitted: list[str] = []
        """Workload names in the order they were admitted (a workload admitted again is listed again)."""
        self.evicted: list[str] = []
        self._not_retriable: set[str] = set()
        """Groups one of whose pods carried ``kueue.x-k8s.io/retriable-in-group: "false"`` (Kueue's
        webhook forbids removing it): with no pod active, such a group is finished."""

    def start(self):
        self.api.pod_webhooks.append(self.webhook)
        return super().start()

    def stop(self) -> None:
        if self.webhook in self.api.pod_webhooks:
            self.api.pod_webhooks.remove(self.webhook)
        super().stop()

    def webhook(self, namespace: str, pod: JSON) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        if namespace != self.namespace or not labels.get(QUEUE_LABEL):
            return
        if labels.get(GROUP_LABEL):
            count = (meta.get("annotations") or {}).get(COUNT_ANNOTATION, "")
            if not count.isdigit() or int(count) < 1:
                raise ApiError(422, f'admission webhook "vpod.kb.io" denied the request: metadata.annotations'
                                    f'[{COUNT_ANNOTATION}]: Required value: a positive integer is required for a '
                                    'pod group')
        meta.setdefault("labels", {})[MANAGED_LABEL] = "true"
        gates = pod["spec"].setdefault("schedulingGates", [])
        if not any(g.get("name") == GATE for g in gates):
            gates.append({"name": GATE})

    # --- the controller ---

    def _groups(self) -> dict[str, list[JSON]]:
        groups: dict[str, list[JSON]] = {}
        for pod in self.api.objects("pods", self.namespace):
            labels = pod["metadata"].get("labels") or {}
            if labels.get(MANAGED_LABEL) != "true":
                continue
            key = labels.get(GROUP_LABEL) or f"pod-{pod['metadata']['name']}"
            groups.setdefault(key, []).append(pod)
            if (pod["metadata"].get("annotations") or {}).get(RETRIABLE_ANNOTATION) == "false":
                self._not_retriable.add(key)
        return groups

    @staticmethod
    def _total(pods: list[JSON]) -> int:
        meta = pods[0]["metadata"]
        return int((meta.get("annotations") or {}).get(COUNT_ANNOTATION, "1")) \
            if (meta.get("labels") or {}).get(GROUP_LABEL) else 1

    def _quota(self, cq: JSON) -> dict[str, tuple[Fraction, str]]:
        out: dict[str, tuple[Fraction, str]] = {}
        for rg in (cq.get("spec") or {}).get("resourceGroups") or []:
            for flavor in rg.get("flavors") or []:
                for r in flavor.get("resources") or []:
                    have, name = out.get(r["name"], (Fraction(0), flavor["name"]))
                    out[r["name"]] = (have + parse_quantity(str(r["nominalQuota"])), name)
        return out

    @staticmethod
    def _cond(w: JSON, type_: str) -> JSON | None:
        return next((c for c in (w.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)

    def _is(self, w: JSON, type_: str) -> bool:
        c = self._cond(w, type_)
        return c is not None and c["status"] == "True"

    def _write_status(self, name: str, conditions: list[tuple[str, str, str, str]], admission: Any = ...) -> None:
        w = self.api.get("workloads", self.namespace, name)
        if w is None:
            return
        status = copy.deepcopy(w.get("status") or {})
        for type_, value, reason, message in conditions:
            _set_condition(status.setdefault("conditions", []), type_, value, reason, message)
        if admission is not ...:
            status["admission"] = admission
        if status != (w.get("status") or {}):
            self.crd.patch_namespaced_custom_object_status(*KUEUE, self.namespace, "workloads", name,
                                                           {"status": status})

    def tick(self) -> None:
        groups = self._groups()
        workloads = {w["metadata"]["name"]: w for w in self.api.objects("workloads", self.namespace)}
        for name, pods in groups.items():
            if name not in workloads and len(pods) >= self._total(pods) and \
                    not any(p["metadata"].get("deletionTimestamp") for p in pods):
                spec = pods[0]["spec"]
                body = {"apiVersion": "/".join(KUEUE), "kind": "Workload",
                        "metadata": {"name": name, "labels": {QUEUE_LABEL: pods[0]["metadata"]["labels"][QUEUE_LABEL]}},
                        "spec": {"queueName": pods[0]["metadata"]["labels"][QUEUE_LABEL],
                                 "priority": int(spec.get("priority") or 0),
                                 "podSets": [{"name": "main", "count": self._total(pods),
                                              "template": {"spec": {"containers": [
                                                  {"name": c["name"], **({"resources": c["resources"]}
                                                                         if c.get("resources") else {})}
                                                  for c in spec.get("containers") or []]}}}]}}
                workloads[name] = self.crd.create_namespaced_custom_object(*KUEUE, self.namespace, "workloads", body)
        # what each ClusterQueue's admitted workloads hold: their pods until every one has terminated
        local = {q["metadata"]["name"]: q for q in self.api.objects("localqueues", self.namespace)}
        cqs = {q["metadata"]["name"]: q for q in self.api.objects("clusterqueues")}
        used: dict[str, dict[str, Fraction]] = {}
        holding: dict[str, list[str]] = {}
        for name, w in sorted(workloads.items()):
            pods = groups.get(name, [])
            live = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL]
            retriable = name not in self._not_retriable
            if not live and not self._is(w, "Finished"):
                if pods and all((p.get("status") or {}).get("phase") == "Succeeded" for p in pods):
                    self._write_status(name, [("Finished", "True", "Succeeded",
                                               f"Pods succeeded: {len(pods)}/{len(pods)}.")])
                    w = self.api.get("workloads", self.namespace, name) or w
                elif not retriable:  # no pod active and the group not retriable: Kueue finishes it
                    self._write_status(name, [("Finished", "True", "Failed", "Pods failed or were deleted, "
                                               "and the group is not retriable")], admission=None)
                    w = self.api.get("workloads", self.namespace, name) or w
            if not pods and (self._is(w, "Finished") or not (w.get("status") or {}).get("admission")):
                self.crd.delete_namespaced_custom_object(*KUEUE, self.namespace, "workloads", name)
                self._not_retriable.discard(name)
                continue
            if (w.get("status") or {}).get("admission") and not live and retriable and not self._is(w, "Evicted") \
                    and not self._is(w, "Finished"):
                # a retriable group whose pods ended: Kueue keeps its quota for the replacement pods
                cq = w["status"]["admission"]["clusterQueue"]
                holding.setdefault(cq, []).append(name)
                podset = w["spec"]["podSets"][0]
                for res, q in pod_requests({"spec": podset["template"]["spec"]}).items():
                    used.setdefault(cq, {})[res] = used.setdefault(cq, {}).get(res, Fraction(0)) + q * podset["count"]
                continue
            if (w.get("status") or {}).get("admission") and live:
                cq = w["status"]["admission"]["clusterQueue"]
                holding.setdefault(cq, []).append(name)
                for p in live:
                    for res, q in pod_requests(p).items():
                        used.setdefault(cq, {})[res] = used.setdefault(cq, {}).get(res, Fraction(0)) + q
            elif (w.get("status") or {}).get("admission") and self._is(w, "Evicted"):
                # its pods have terminated: the quota is released and the workload requeued
                self._write_status(name, [("QuotaReserved", "False", "Pending", "evicted; its pods have terminated"),
                                          ("Admitted", "False", "NoReservation", "The workload has no reservation"),
                                          ("Requeued", "True", "Preempted", "requeued after eviction")], admission=None)
        pending = [w for n, w in workloads.items() if n in groups and not (w.get("status") or {}).get("admission")
                   and not self._is(w, "Finished") and not self._is(w, "Evicted")]
        pending.sort(key=lambda w: (-int(w["spec"].get("priority") or 0), w["metadata"]["creationTimestamp"],
                                    w["metadata"]["name"]))
        for w in pending:
            name = w["metadata"]["name"]
            lq = local.get(w["spec"]["queueName"])
            cq = cqs.get((lq or {}).get("spec", {}).get("clusterQueue", ""))
            if lq is None or cq is None:
                self._write_status(name, [("QuotaReserved", "False", "Inadmissible",
                                           f"LocalQueue {w['spec']['queueName']} doesn't exist" if lq is None else
                                           f"ClusterQueue {lq['spec']['clusterQueue']} doesn't exist")])
                continue
            cq_name = cq["metadata"]["name"]
            quota = self._quota(cq)
            need: dict[str, Fraction] = {}
            for p in groups[name]:
                for res, q in pod_requests(p).items():
                    need[res] = need.get(res, Fraction(0)) + q
            missing = sorted(set(need) - set(quota))
            if missing:
                self._write_status(name, [("QuotaReserved", "False", "Inadmissible",
                                           f"couldn't assign flavors to pod set main: resource {missing[0]} "
                                           f"unavailable in ClusterQueue")])
                continue
            have = used.get(cq_name, {})
            short = {res: have.get(res, Fraction(0)) + q - quota[res][0] for res, q in need.items()
                     if have.get(res, Fraction(0)) + q > quota[res][0]}
            if not short:
                self._admit(name, groups[name], cq_name, quota, need)
                for res, q in need.items():
                    used.setdefault(cq_name, {})[res] = have.get(res, Fraction(0)) + q
                continue
            res = sorted(short)[0]
            self._write_status(name, [("QuotaReserved", "False", "Pending",
                                       f"couldn't assign flavors to pod set main: insufficient unused quota for {res} "
                                       f"in flavor {quota[res][1]}, {_fmt(short[res])} more needed")])
            if ((cq.get("spec") or {}).get("preemption") or {}).get("withinClusterQueue") == "LowerPriority":
                self._preempt(w, groups, workloads, holding.get(cq_name, []), short)

    def _admit(self, name: str, pods: list[JSON], cq: str, quota: dict, need: dict) -> None:
        admission = {"clusterQueue": cq, "podSetAssignments": [{
            "name": "main", "count": len(pods), "flavors": {res: quota[res][1] for res in need},
            "resourceUsage": {res: _fmt(q) for res, q in need.items()}}]}
        self._write_status(name, [("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cq}"),
                                  ("Admitted", "True", "Admitted", "The workload is admitted"),
                                  ("Evicted", "False", "Admitted", "")], admission=admission)
        self.admitted.append(name)
        for pod in pods:   # Kueue's pod controller: every pod of the group ungated
            meta = pod["metadata"]
            gates = [g for g in pod["spec"].get("schedulingGates") or [] if g.get("name") != GATE]
            try:
                self.v1.patch_namespaced_pod(meta["name"], self.namespace, [
                    {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
                    {"op": "replace", "path": "/spec/schedulingGates", "value": gates}])
            except ApiException as exc:
                if exc.status not in (404, 422):
                    raise

    def _preempt(self, w: JSON, groups: dict, workloads: dict, admitted: list[str], short: dict) -> None:
        prio = int(w["spec"].get("priority") or 0)
        victims = sorted((workloads[n] for n in admitted if int(workloads[n]["spec"].get("priority") or 0) < prio
                          and not self._is(workloads[n], "Evicted")),
                         key=lambda v: (int(v["spec"].get("priority") or 0), v["metadata"]["creationTimestamp"]),
                         reverse=False)
        victims.sort(key=lambda v: int(v["spec"].get("priority") or 0))
        freed: dict[str, Fraction] = {}
        chosen = []
        for v in victims:
            if all(freed.get(res, Fraction(0)) >= q for res, q in short.items()):
                break
            chosen.append(v)
            for p in groups.get(v["metadata"]["name"], []):
                for res, q in pod_requests(p).items():
                    freed[res] = freed.get(res, Fraction(0)) + q
        if not chosen or not all(freed.get(res, Fraction(0)) >= q for res, q in short.items()):
            return
        message = (f"Preempted to accommodate a workload (UID: {w['metadata']['uid']}) due to prioritization in the "
                   "ClusterQueue")
        for v in chosen:
            name = v["metadata"]["name"]
            self._write_status(name, [("Evicted", "True", "Preempted", message),
                                      ("Preempted", "True", "InClusterQueue", message)])
            self.evicted.append(name)
            for pod in groups.get(name, []):
                if not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in TERMINAL:
                    self._stop_pod(pod, "TerminationTarget", "WorkloadEvictedDueToPreempted", message)


class FakeGangScheduler(_Loop):
    """See the module docstring. ``kubelet``: the fake kubelet whose nodes and pods it places on."""

    def __init__(self, api: Any, kubelet: FakeKubelet, namespace: str, *, mode: str = "volcano",
                 scheduler_name: str | None = None, poll_s: float = 0.1) -> None:
        if mode not in ("volcano", "coscheduling"):
            raise ValueError(mode)
        self.agent = f"{mode}-scheduler/fake"
        super().__init__(api, namespace, poll_s)
        self.kubelet, self.mode = kubelet, mode
        self.scheduler_name = scheduler_name or ("volcano" if mode == "volcano" else "scheduler-plugins-scheduler")
        self.plural = "podgroups.scheduling.volcano.sh" if mode == "volcano" else "podgroups.scheduling.x-k8s.io"
        self.group_api = ("scheduling.volcano.sh", "v1beta1") if mode == "volcano" else ("scheduling.x-k8s.io",
                                                                                          "v1alpha1")
        self.bound: list[str] = []
        """Pod groups in the order they were bound."""

    def _group_of(self, pod: JSON) -> str:
        meta = pod["metadata"]
        if self.mode == "volcano":
            return (meta.get("annotations") or {}).get("scheduling.k8s.io/group-name", "")
        return (meta.get("labels") or {}).get("scheduling.x-k8s.io/pod-group", "")

    def _group_status(self, name: str, phase: str, message: str = "") -> None:
        pg = self.api.get(self.plural, self.namespace, name)
        if pg is None:
            return
        status = copy.deepcopy(pg.get("status") or {})
        status["phase"] = phase
        if message:
            _set_condition(status.setdefault("conditions", []), "Unschedulable", "True", "NotEnoughResources", message)
        if status != (pg.get("status") or {}):
            self.crd.patch_namespaced_custom_object_status(*self.group_api, self.namespace, "podgroups", name,
                                                           {"status": status})

    def _unschedulable(self, pod: JSON, message: str) -> None:
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"), None)
        if cond and (cond["status"], cond.get("reason"), cond.get("message")) == ("False", "Unschedulable", message):
            return
        self._pod_status(pod["metadata"]["name"], pod["metadata"]["uid"], lambda status: _set_condition(
            status.setdefault("conditions", []), "PodScheduled", "False", "Unschedulable", message))

    def _place(self, pods: list[JSON], nodes: list[JSON], usage: dict) -> dict[str, str] | None:
        """Where each of ``pods`` goes, all together, or None (``usage`` is updated when they fit)."""
        trial = {n: (c, dict(u)) for n, (c, u) in usage.items()}
        where = {}
        for pod in pods:
            requests = pod_requests(pod)
            fits = [n for n in nodes if not FakeKubelet._filter(pod, requests, n, trial[n["metadata"]["name"]])[0]]
            if not fits:
                return None
            node = min(fits, key=lambda n: (trial[n["metadata"]["name"]][0], n["metadata"]["name"]))["metadata"]["name"]
            count, used = trial[node]
            for res, q in requests.items():
                used[res] = used.get(res, Fraction(0)) + q
            trial[node] = (count + 1, used)
            where[pod["metadata"]["name"]] = node
        usage.update(trial)
        return where

    def tick(self) -> None:
        pods = [p for p in self.api.objects("pods", self.namespace)
                if (p.get("spec") or {}).get("schedulerName") == self.scheduler_name]
        groups = {g["metadata"]["name"]: g for g in self.api.objects(self.plural, self.namespace)}
        by_group: dict[str, list[JSON]] = {}
        for p in pods:
            if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") not in TERMINAL:
                by_group.setdefault(self._group_of(p), []).append(p)
        nodes = [n for n in self.api.objects("nodes") if n["metadata"]["name"] in self.kubelet.nodes]
        usage = self.kubelet._node_usage()  # noqa: SLF001 - the fake scheduler shares the fake kubelet's count
        order = sorted(by_group, key=lambda g: (-max(int(p["spec"].get("priority") or 0) for p in by_group[g]), g))
        for name in order:
            members = by_group[name]
            pending = [p for p in members if not p["spec"].get("nodeName")]
            if not pending:
                self._group_status(name, "Running")
                continue
            pg = groups.get(name)
            if pg is None:
                for p in pending:
                    self._unschedulable(p, f"pod group {name!r} not found")
                continue
            need = int((pg.get("spec") or {}).get("minMember") or 1)
            where = self._place(pending, nodes, usage) if len(members) >= need else None
            if where is None and len(members) >= need:
                where = self._preempt(name, members, pending, by_group, nodes)
            if where is None:
                message = (f"{len(pending)}/{len(members)} tasks in gang unschedulable: pod group is not ready, "
                           f"{len(members)} Pending, {need} minAvailable")
                for p in pending:
                    self._unschedulable(p, message)
                self._group_status(name, "Pending", message)
                continue
            for p in pending:
                body = client.V1Binding(metadata=client.V1ObjectMeta(name=p["metadata"]["name"], uid=p["metadata"]["uid"]),
                                        target=client.V1ObjectReference(kind="Node", name=where[p["metadata"]["name"]]))
                try:
                    self.v1.create_namespaced_pod_binding(p["metadata"]["name"], self.namespace, body,
                                                          _preload_content=False)
                except ApiException as exc:
                    if exc.status not in (404, 409):
                        raise
            self.bound.append(name)
            self._group_status(name, "Running")

    def _preempt(self, name: str, members: list[JSON], pending: list[JSON], by_group: dict,
                 nodes: list[JSON]) -> None:
        """Evict running groups of lower priority when that lets this one fit; binds nothing now
        (the victims' pods must terminate first)."""
        prio = max(int(p["spec"].get("priority") or 0) for p in members)
        victims = sorted((g for g, ps in by_group.items() if g != name and any(p["spec"].get("nodeName") for p in ps)
                          and max(int(p["spec"].get("priority") or 0) for p in ps) < prio),
                         key=lambda g: max(int(p["spec"].get("priority") or 0) for p in by_group[g]))
        usage = self.kubelet._node_usage()  # noqa: SLF001
        chosen = []
        for g in victims:
            chosen.append(g)
            for p in by_group[g]:
                node = p["spec"].get("nodeName")
                if node in usage:
                    count, used = usage[node]
                    used = dict(used)
                    for res, q in pod_requests(p).items():
                        used[res] = used.get(res, Fraction(0)) - q
                    usage[node] = (count - 1, used)
            if self._place(pending, nodes, dict(usage)) is not None:
                break
        else:
            return None
        for g in chosen:
            for p in by_group[g]:
                self._stop_pod(p, "DisruptionTarget", "PreemptionByScheduler",
                               f"{self.scheduler_name}: preempting to accommodate a higher priority pod group {name}")
        return None


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.05)


__all__ = ["FakeKueue", "FakeGangScheduler", "wait_for"]
