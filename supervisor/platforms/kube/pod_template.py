"""``platform.kubernetes.worker.pod_template``: a fragment of a pod (``metadata: {labels,
annotations}``, ``spec: {...}``) merged over each worker pod the controller generates, what in it
the controller owns, and the Pod Security Standards ``restricted`` defaults. Pure data: no
kubernetes client (the config reads it; :mod:`.platform` builds pods with it).

**Merge**, as a strategic merge patch would: mappings are merged key by key; the named lists are
merged item by item on their key (``containers``, ``initContainers``, ``volumes``,
``imagePullSecrets``, ``resourceClaims`` by ``name``; a container's ``env`` by ``name``,
``volumeMounts`` by ``mountPath``, ``volumeDevices`` by ``devicePath``, ``ports`` by
``containerPort``; ``hostAliases`` by ``ip``), an item with a new key added after the generated
ones; ``tolerations`` are added to the generated ones; every other list and every scalar is
replaced, and ``null`` removes the key (refused where it would remove what the controller
generated: containers, volumes, affinity, the agent's env and mounts, the labels). The worker container is the one the controller names
``agent`` (it stays the pod's first container); a container of another name is added. A
required node affinity in the template is ANDed with the controller's (every one of the
template's terms gets the controller's expressions), so it narrows where a pod may go and never
undoes the pinning of a pod to its slot's node.

**Owned** by the controller (:func:`problems` names each one set; the config refuses them):
the pod's name, namespace and owner references; its labels ``app.kubernetes.io/managed-by``,
``name``, ``instance``, ``component`` and every ``elastic-supervisor/`` label and annotation;
``spec.restartPolicy`` (Never), ``nodeName``, ``hostname`` and ``subdomain`` (the rendezvous
names); the agent container's ``command``, ``args`` and ``image``, and the variables it sets
(``SUPERVISOR_*``, ``POD_IP``, torchrun's); the controller's volumes and their mount paths.
``terminationGracePeriodSeconds`` has its own setting (``termination_grace_s``).

**Restricted by default** (:func:`restrict`): what the template leaves unset is filled so that
the pod passes the ``restricted`` profile: ``runAsNonRoot`` and ``seccompProfile: RuntimeDefault``
for the pod, ``allowPrivilegeEscalation: false`` and ``capabilities.drop: [ALL]`` for every
container. A template that asks for more (``hostNetwork``, ``IPC_LOCK``, a ``hostPath``, a
root image: ``runAsNonRoot: false``) says so, and its namespace must allow it.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

AGENT = "agent"
"""The name of the worker container (the torchrun agent), the one a template addresses."""
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "volumes": "name", "imagePullSecrets": "name",
    "resourceClaims": "name", "env": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "ports": "containerPort", "hostAliases": "ip",
}
"""The lists merged item by item, and the key of their items."""
ADDED_LISTS = frozenset({"tolerations"})
"""Lists whose template items are added to the generated ones (those not there already)."""
OWNED_LABELS = frozenset({"app.kubernetes.io/managed-by", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                          "app.kubernetes.io/component"})
OWNED_PREFIX = "elastic-supervisor/"
"""Every label and annotation under it is the controller's (job, owner, attempt, slot, launch, role, rdzv)."""
OWNED_SPEC = {
    "restartPolicy": "owned by the controller (Never: a new pod per attempt)",
    "nodeName": "owned by the controller (a slot's pod is pinned by node affinity)",
    "hostname": "owned by the controller (the rendezvous name)",
    "subdomain": "owned by the controller (the rendezvous Service)",
    "terminationGracePeriodSeconds": "set platform.kubernetes.termination_grace_s (the chart's "
                                     "workers.terminationGracePeriodSeconds)",
    "ephemeralContainers": "cannot be set when a pod is created",
}
OWNED_AGENT = {
    "command": "owned by the controller (the torchrun agent)",
    "args": "owned by the controller (the torchrun agent)",
    "image": "set platform.kubernetes.worker.image (the chart's workers.image)",
}
OWNED_ENV = frozenset({"POD_IP", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"})
OWNED_ENV_PREFIX = "SUPERVISOR_"
RESERVED_VOLUMES = frozenset({"checkpoints", "logs", "dshm"})
"""The controller's volumes (persistence.*, workers.shmSize)."""
PLACEMENT_SPEC = ("affinity", "tolerations", "nodeSelector", "schedulerName", "priorityClassName",
                  "runtimeClassName", "topologySpreadConstraints", "securityContext", "imagePullSecrets",
                  "serviceAccountName")
"""What of a template's spec a capacity probe takes: where the worker lands and what admits it."""
PLACEMENT_CONTAINER = ("resources", "securityContext", "imagePullPolicy")


def owned_label(key: str) -> bool:
    return key in OWNED_LABELS or key.startswith(OWNED_PREFIX)


def owned_env(name: str) -> bool:
    return name in OWNED_ENV or name.startswith(OWNED_ENV_PREFIX)


def problems(template: Any, mount_paths: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(field, why)`` for each field of ``template`` that is malformed or owned by the
    controller, the field a dotted path from the template (``spec.restartPolicy``,
    ``spec.containers[0].command``). ``mount_paths``: where the controller mounts its volumes."""
    out: list[tuple[str, str]] = []
    if not isinstance(template, dict):
        return [("", "must be a mapping (metadata, spec)")]
    for key in template:
        if key not in ("metadata", "spec"):
            out.append((key, "unknown key (known: metadata, spec)"))
    meta = template.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            out.append(("metadata", "must be a mapping (labels, annotations)"))
        else:
            for key, value in meta.items():
                if key not in ("labels", "annotations"):
                    why = "owned by the controller" if key in ("name", "namespace", "generateName", "ownerReferences") \
                        else "only labels and annotations may be set"
                    out.append((f"metadata.{key}", why))
                elif not isinstance(value, dict):
                    out.append((f"metadata.{key}", "must be a mapping of strings"))
                else:
                    for k, v in (value or {}).items():
                        if not isinstance(v, str):
                            out.append((f"metadata.{key}.{k}", "must be a string"))
                        elif key == "labels" and owned_label(k) or key == "annotations" and k.startswith(OWNED_PREFIX):
                            out.append((f"metadata.{key}.{k}", "owned by the controller"))
    spec = template.get("spec")
    if spec is None:
        return out
    if not isinstance(spec, dict):
        return out + [("spec", "must be a mapping (a PodSpec)")]
    for key, why in OWNED_SPEC.items():
        if key in spec:
            out.append((f"spec.{key}", why))
    for key in ("containers", "volumes", "affinity"):
        if key in spec and spec[key] is None:
            out.append((f"spec.{key}", "null would remove the controller's"))
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        node = affinity.get("nodeAffinity")
        if "nodeAffinity" in affinity and node is None:
            out.append(("spec.affinity.nodeAffinity", "null would remove the controller's"))
        if isinstance(node, dict) and "requiredDuringSchedulingIgnoredDuringExecution" in node:
            required = node["requiredDuringSchedulingIgnoredDuringExecution"]
            if not isinstance(required, dict) or not required.get("nodeSelectorTerms"):
                out.append(("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
                            "must hold at least one nodeSelectorTerm"))
    for key, value in spec.items():
        if key in MERGE_KEYS or key in ADDED_LISTS:
            out += _list_problems(value, f"spec.{key}", MERGE_KEYS.get(key))
    for i, vol in enumerate(spec.get("volumes") or []):
        if isinstance(vol, dict) and vol.get("name") in RESERVED_VOLUMES:
            out.append((f"spec.volumes[{i}].name", f"{vol['name']!r} is owned by the controller"))
    mounts = set(mount_paths)
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            if not isinstance(c, dict):
                continue
            path = f"spec.{kind}[{i}]"
            for key in ("env", "volumeMounts", "volumeDevices", "ports"):
                if key in c:
                    out += _list_problems(c[key], f"{path}.{key}", MERGE_KEYS[key])
            for j, var in enumerate(c.get("env") or []):
                if isinstance(var, dict) and "value" in var and not isinstance(var["value"], str):
                    out.append((f"{path}.env[{j}].value", "must be a string"))
            if "restartPolicy" in c and (kind == "containers" or c["restartPolicy"] != "Always"):
                out.append((f"{path}.restartPolicy", "only Always, on an init container (a native sidecar)"))
            if c.get("name") == AGENT and kind != "containers":
                out.append((f"{path}.name", f"{AGENT!r} is the worker container's name"))
            if c.get("name") != AGENT or kind != "containers":
                continue
            for key, why in OWNED_AGENT.items():
                if key in c:
                    out.append((f"{path}.{key}", why))
            for key in ("env", "volumeMounts"):
                if key in c and c[key] is None:
                    out.append((f"{path}.{key}", "null would remove the controller's"))
            for j, var in enumerate(c.get("env") or []):
                if isinstance(var, dict) and isinstance(var.get("name"), str) and owned_env(var["name"]):
                    out.append((f"{path}.env[{j}].name", f"{var['name']} is owned by the controller"))
            for j, mount in enumerate(c.get("volumeMounts") or []):
                if isinstance(mount, dict) and mount.get("mountPath") in mounts:
                    out.append((f"{path}.volumeMounts[{j}].mountPath",
                                f"{mount['mountPath']} is owned by the controller"))
    return out


def _list_problems(value: Any, path: str, key: str | None) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        return [(path, "must be a list")]
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            out.append((f"{path}[{i}]", "must be a mapping"))
        elif key is not None and item.get(key) in (None, ""):
            out.append((f"{path}[{i}].{key}", f"required (the items are merged by {key})"))
    keys = [item.get(key) for item in value if isinstance(item, dict)] if key else []
    dup = next((k for i, k in enumerate(keys) if k is not None and k in keys[:i]), None)
    if dup is not None:
        out.append((path, f"{key} {dup!r} appears twice"))
    return out


def merge(base: Any, overlay: Any, key: str = "") -> Any:
    """``overlay`` merged over ``base`` (new objects; neither is changed), as the module says."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = copy.deepcopy(base)
        for k, v in overlay.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(overlay, list):
        if key in MERGE_KEYS:
            name = MERGE_KEYS[key]
            out = copy.deepcopy(base)
            index = {item.get(name): i for i, item in enumerate(out) if isinstance(item, dict)}
            for item in overlay:
                at = index.get(item.get(name)) if isinstance(item, dict) else None
                if at is None:
                    out.append(copy.deepcopy(item))
                else:
                    out[at] = merge(out[at], item)
            return out
        if key in ADDED_LISTS:
            return copy.deepcopy(base) + [copy.deepcopy(v) for v in overlay if v not in base]
    return copy.deepcopy(overlay)


def _required_terms(affinity: Any) -> list | None:
    node = (affinity or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return required.get("nodeSelectorTerms") or None


def apply(pod: dict, template: dict | None) -> dict:
    """``template`` merged over the generated ``pod`` (a new pod): the merge above, the required
    node affinities ANDed, then :func:`restrict`. With ``hostNetwork`` and no ``dnsPolicy`` the
    pod gets ``ClusterFirstWithHostNet``: it still resolves the rendezvous names."""
    template = template or {}
    out = {**pod, "metadata": merge(pod.get("metadata") or {}, template.get("metadata") or {})}
    spec_t = copy.deepcopy(template.get("spec") or {})
    ours = _required_terms(pod["spec"].get("affinity"))
    theirs = _required_terms(spec_t.get("affinity"))
    spec = merge(pod["spec"], spec_t)
    if ours:  # the controller's expressions in every term, whatever the merge made of them
        ours_exprs = [e for term in ours for e in term.get("matchExpressions") or []]
        terms = [dict(t, matchExpressions=list(t.get("matchExpressions") or []) + copy.deepcopy(ours_exprs))
                 for t in theirs or [{}]]
        node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        spec["affinity"] = {**(spec.get("affinity") or {}), "nodeAffinity": {
            **node, "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    if spec.get("hostNetwork") and "dnsPolicy" not in spec_t:
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    out["spec"] = quantities(restrict(spec))
    return out


def _text(value: Any) -> Any:
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def quantities(spec: dict) -> dict:
    """``spec`` (changed in place) with every quantity a string, as the API's types have them
    (YAML gives ``nvidia.com/gpu: 8`` as a number, which the client refuses): the containers'
    resources, ``overhead``, emptyDir ``sizeLimit`` and resourceFieldRef ``divisor``."""
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            for section in ("limits", "requests"):
                values = (c.get("resources") or {}).get(section)
                if isinstance(values, dict):
                    c["resources"][section] = {k: _text(v) for k, v in values.items()}
            for var in c.get("env") or []:
                ref = (var.get("valueFrom") or {}).get("resourceFieldRef")
                if isinstance(ref, dict) and "divisor" in ref:
                    ref["divisor"] = _text(ref["divisor"])
    if isinstance(spec.get("overhead"), dict):
        spec["overhead"] = {k: _text(v) for k, v in spec["overhead"].items()}
    for vol in spec.get("volumes") or []:
        if isinstance(vol.get("emptyDir"), dict) and "sizeLimit" in vol["emptyDir"]:
            vol["emptyDir"]["sizeLimit"] = _text(vol["emptyDir"]["sizeLimit"])
    return spec


def placement(template: dict | None, container: str) -> dict:
    """What a capacity probe (container ``container``) takes of a worker template: the labels
    (quotas and queues admit it as they admit a worker), the spec's placement and security fields
    (:data:`PLACEMENT_SPEC`), and the agent container's resources and security context."""
    template = template or {}
    spec = template.get("spec") or {}
    out_spec = {k: copy.deepcopy(spec[k]) for k in PLACEMENT_SPEC if k in spec}
    agent = next((c for c in spec.get("containers") or [] if isinstance(c, dict) and c.get("name") == AGENT), None)
    if agent is not None:
        out_spec["containers"] = [{"name": container} | {k: copy.deepcopy(agent[k])
                                                          for k in PLACEMENT_CONTAINER if k in agent}]
    labels = (template.get("metadata") or {}).get("labels")
    return {"metadata": {"labels": copy.deepcopy(labels)}, "spec": out_spec} if labels else {"spec": out_spec}


def restrict(spec: dict) -> dict:
    """``spec`` with what it leaves unset filled so that the pod passes the Pod Security Standards
    ``restricted`` profile: the pod's ``runAsNonRoot`` and ``seccompProfile``, each container's
    ``allowPrivilegeEscalation: false`` (not for a privileged one or one adding SYS_ADMIN, which
    the API refuses with it) and ``capabilities.drop: [ALL]``. A value set is kept."""
    spec = copy.deepcopy(spec)
    psc = spec.get("securityContext") or {}
    psc.setdefault("runAsNonRoot", True)
    psc.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    spec["securityContext"] = psc
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            sc = c.get("securityContext") or {}
            caps = sc.get("capabilities") or {}
            added = {str(a).upper().removeprefix("CAP_") for a in caps.get("add") or []}
            if "allowPrivilegeEscalation" not in sc and not sc.get("privileged") and "SYS_ADMIN" not in added:
                sc["allowPrivilegeEscalation"] = False
            if "drop" not in caps:
                caps["drop"] = ["ALL"]
            sc["capabilities"] = caps
            c["securityContext"] = sc
    return spec
