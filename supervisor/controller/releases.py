"""Releases: which version of the job the ranks run, and what its record says of it.

A *version* is what the ranks run, identified exactly (:class:`Version`: the command, the
environment the job sets, the code's content hash and the Python it runs on, or on Kubernetes
the worker image and pod template; :mod:`supervisor.controller.release_store` computes it). A
change of version in a job is a *release*. A released version is on probation until it has
trained ``probation_steps`` steps past its restore with no fault of its own and a finite loss;
it is then the job's *known-good* version. One on probation that fails before its first step,
faults twice at the same step or trips the non-finite guard is *rejected*, and the job goes
back to the newest known-good version (or the operator's named baseline) from the newest
verified checkpoint no rejected version wrote.

Plain data in, a ledger and what to tell out: no I/O, no clock (times are given), no platform.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

PROBATION = "probation"
KNOWN_GOOD = "known_good"
REJECTED = "rejected"
STATES = (PROBATION, KNOWN_GOOD, REJECTED)
BASELINE = "baseline"
"""The id of the operator's named baseline (``release.baseline``): never on probation, never rejected."""

ID_HEX = 12
VERSION_ID = re.compile(rf"[0-9a-f]{{{ID_HEX}}}|{BASELINE}")
"""A version's id (a content hash's first hex digits, or the baseline): also a folder's name
under ``LOG_DIR/releases``, so nothing else is taken from a ledger."""

ROLLBACK_REASONS = ("startup_failure", "repeated_fault", "nonfinite")
"""Why a release is rejected (the label values of ``supervisor_release_rollbacks_total``)."""
MAX_RELEASES = 256
"""Versions a ledger keeps (the oldest that are neither known-good nor current go first)."""
MAX_TEXT = 2000
MAX_ARGS = 4096

# Faults that are not the version's own doing: the machine or the cluster failed, or the
# operator stopped it. A release is judged only on the others.
NOT_ITS_OWN = frozenset({"node_lost", "preempted", "node_rejected", "node_failure", "capacity", "stopped_early"})
# Failures before the first step that say the version cannot start.
_STARTUP = frozenset({"rank_error", "rank_exit", "crash", "cannot_start", "preflight_failed", "startup_stall",
                      "import_error"})


class LedgerError(ValueError):
    """A saved ledger that is not one (names the field)."""


@dataclass(frozen=True)
class Version:
    """What the ranks run. ``id`` is a hash of ``parts`` (what identifies it), short enough to
    read; ``command``/``env`` are what a launch of it runs; ``entry`` (an index into
    ``command``, -1: none) is the script a snapshot replaces; ``image`` its worker image on
    Kubernetes ("" elsewhere)."""

    id: str
    parts: Mapping[str, str]
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    entry: int = -1
    image: str = ""
    code_dir: str = ""

    @staticmethod
    def identify(parts: Mapping[str, str]) -> str:
        blob = json.dumps(dict(sorted(parts.items())), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:ID_HEX]

    def summary(self) -> str:
        """One line: what it runs."""
        what = self.image or " ".join(self.command)
        return what if len(what) <= 120 else what[:117] + "..."


@dataclass(frozen=True)
class Release:
    """One version's record in the job."""

    version: Version
    state: str = PROBATION
    released_unix: float = 0.0
    state_unix: float = 0.0
    """When it entered its state."""
    why: str = ""
    """Why it was rejected (its fault), or how it became known-good."""
    steps: int = 0
    """Steps it has trained past its restore (the most in one attempt)."""
    fault_steps: tuple[int, ...] = ()
    """Steps at which faults of its own hit it while on probation (the same one twice rejects it)."""
    checkpoints: tuple[str, ...] = ()
    """Checkpoints it wrote (the newest last; at most 64 kept)."""
    allowed: bool = False
    """The operator allowed it again after a rejection (``supervisor release allow``)."""
    digest: str = ""
    """Its image by digest, as the cluster ran it (``repo@sha256:...``; Kubernetes): a rollback
    runs exactly that image, wherever its tag has moved since."""


@dataclass(frozen=True)
class Ledger:
    releases: Mapping[str, Release] = field(default_factory=dict)
    """By version id, in the order they were released."""
    current: str = ""
    """The version the ranks run now."""
    rollbacks: int = 0
    rollback_reasons: Mapping[str, int] = field(default_factory=dict)
    """Rollbacks by reason (``startup_failure``, ``repeated_fault``, ``nonfinite``)."""
    last_rollback: Mapping[str, Any] | None = None
    """The newest rollback: ``unix``, ``from``, ``to``, ``reason`` (the page reads it: unlike a
    counter, a rollback a new controller makes before its first scrape still shows)."""
    pending: "Reject | None" = None
    """A fault being recovered from rejected the running version: the plan that follows the
    torn-down gang rolls back (kept here, so that a replacement controller finishing the
    recovery does too)."""

    def get(self, vid: str) -> Release | None:
        return self.releases.get(vid)

    @property
    def known_good(self) -> Release | None:
        """The newest known-good version (by the time it became so)."""
        good = [r for r in self.releases.values() if r.state == KNOWN_GOOD]
        return max(good, key=lambda r: r.state_unix) if good else None

    def rejected_ids(self) -> set[str]:
        return {vid for vid, r in self.releases.items() if r.state == REJECTED}

    def to_saved(self) -> dict[str, Any]:
        return {"format": 1, "current": self.current, "rollbacks": self.rollbacks,
                "rollback_reasons": dict(self.rollback_reasons),
                "last_rollback": None if self.last_rollback is None else dict(self.last_rollback),
                "pending": None if self.pending is None else
                {"version": self.pending.version, "reason": self.pending.reason, "why": self.pending.why,
                 "to": self.pending.to},
                "releases": [_release_saved(r) for r in self.releases.values()]}

    @classmethod
    def from_saved(cls, raw: Any) -> "Ledger":
        """The ledger a :meth:`to_saved` wrote; :class:`LedgerError` naming the field otherwise."""
        if not isinstance(raw, dict) or raw.get("format") != 1:
            raise LedgerError("not a release ledger of format 1")
        rels = raw.get("releases")
        if not isinstance(rels, list) or len(rels) > MAX_RELEASES:
            raise LedgerError(f"releases: a list of at most {MAX_RELEASES} is expected")
        out: dict[str, Release] = {}
        for i, r in enumerate(rels):
            rel = _release_from(r, f"releases[{i}]")
            out[rel.version.id] = rel
        current = _text(raw.get("current", ""), "current", 64)
        if current and current not in out:
            raise LedgerError(f"current: {current!r} is not a release of the ledger")
        reasons = raw.get("rollback_reasons", {})
        if not isinstance(reasons, dict) or len(reasons) > 16:
            raise LedgerError("rollback_reasons: a mapping is expected")
        last = raw.get("last_rollback")
        if last is not None:
            if not isinstance(last, dict):
                raise LedgerError("last_rollback: a mapping is expected")
            last = {"unix": _time(last.get("unix"), "last_rollback.unix"),
                    **{k: _text(last.get(k), f"last_rollback.{k}", 64) for k in ("from", "to", "reason")}}
        pending = raw.get("pending")
        if pending is not None:
            if not isinstance(pending, dict):
                raise LedgerError("pending: a mapping is expected")
            pending = Reject(_text(pending.get("version"), "pending.version", 64),
                             _text(pending.get("reason"), "pending.reason", 64),
                             _text(pending.get("why"), "pending.why", MAX_TEXT),
                             _text(pending.get("to", ""), "pending.to", 64))
            if pending.version not in out:
                raise LedgerError(f"pending: {pending.version!r} is not a release of the ledger")
        return cls(out, current, _whole(raw.get("rollbacks", 0), "rollbacks"),
                   {_text(k, "rollback_reasons", 64): _whole(v, "rollback_reasons") for k, v in reasons.items()},
                   last, pending)


# ---------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class Policy:
    rollback: bool = True
    """``release.rollback``: false keeps today's behaviour (a version that cannot train ends the job)."""
    probation_steps: int = 20
    baseline: Version | None = None
    """``release.baseline``: what serves when no version is known-good yet."""


@dataclass(frozen=True)
class Told:
    event: str
    fields: dict[str, Any]


def arrive(ledger: Ledger, version: Version, *, now_unix: float, policy: Policy) -> tuple[Ledger, Told | None]:
    """A controller starts (or takes over) the job with ``version``, its config's: the ledger
    with the version the ranks are to run as ``current``, and what to tell.

    A version the ledger does not know is a release (on probation; the first version of a job
    too). A known one goes on where it was. One rejected earlier (and not allowed again since)
    is not tried again: the known-good version (or the baseline) runs instead, said as such."""
    rels = dict(ledger.releases)
    previous = ledger.current
    rec = rels.get(version.id)
    ledger = _pending_for(ledger, version.id)
    if rec is None:
        rels[version.id] = Release(version, PROBATION, now_unix, now_unix)
        rels = _bounded(rels, keep={version.id, previous})
        told = Told("release_started", {"version": version.id, "previous": previous or None,
                                        "state": PROBATION, "probation_steps": policy.probation_steps,
                                        "runs": version.summary(),
                                        "detail": "a new version of the job: on probation until it has trained "
                                                  f"{policy.probation_steps} steps with no fault of its own"})
        return replace(ledger, releases=rels, current=version.id), told
    if rec.version != version:  # the same identity, newer details (a snapshot's place): keep the newest
        rels[version.id] = rec = replace(rec, version=version)
    if rec.state == REJECTED and policy.rollback:
        target = rollback_target(replace(ledger, releases=rels), version.id, policy)
        if target is not None:
            if target.id not in rels:
                rels[target.id] = Release(target, KNOWN_GOOD, now_unix, now_unix, why="the operator's baseline")
            return replace(_pending_for(ledger, target.id), releases=rels, current=target.id), Told(
                "release_still_rejected", {"version": version.id, "runs_instead": target.id, "why": rec.why,
                                           "detail": "this version was rejected earlier and is not tried again: "
                                                     f"`supervisor release allow {version.id}` lets it run, or "
                                                     "release a different one"})
    return replace(ledger, releases=rels, current=version.id), None


def _pending_for(ledger: Ledger, current: str) -> Ledger:
    """A pending rejection outlives a controller (saved before the teardown it waits on) only
    for the version that goes on running: one of any other version is stale, dropped."""
    if ledger.pending is None or ledger.pending.version == current:
        return ledger
    return replace(ledger, pending=None)


def allow(ledger: Ledger, vid: str, *, now_unix: float) -> Ledger:
    """The operator allows a rejected version again: it is on probation once more."""
    rec = ledger.releases.get(vid)
    if rec is None or rec.state != REJECTED:
        return ledger
    rels = dict(ledger.releases)
    rels[vid] = replace(rec, state=PROBATION, state_unix=now_unix, allowed=True, fault_steps=(), steps=0,
                        why=f"allowed again by the operator (rejected earlier: {rec.why})"[:MAX_TEXT])
    return replace(ledger, releases=rels)


def trained(ledger: Ledger, steps_past_restore: int, *, finite: bool, now_unix: float,
            policy: Policy) -> tuple[Ledger, Told | None]:
    """The running version has trained ``steps_past_restore`` steps in this attempt (the
    slowest rank's), every loss finite so far: past ``probation_steps`` it is known-good."""
    rec = ledger.releases.get(ledger.current)
    if rec is None or steps_past_restore <= rec.steps:
        return ledger, None
    rec = replace(rec, steps=steps_past_restore)
    told = None
    if rec.state == PROBATION and finite and steps_past_restore >= policy.probation_steps:
        rec = replace(rec, state=KNOWN_GOOD, state_unix=now_unix,
                      why=f"trained {steps_past_restore} steps past its restore with no fault of its own")
        told = Told("release_known_good", {"version": rec.version.id, "steps": steps_past_restore,
                                           "detail": rec.why})
    return replace(ledger, releases={**ledger.releases, rec.version.id: rec}), told


def pinned(ledger: Ledger, image_ids: Iterable[str]) -> Ledger:
    """The running version's pods all run one image digest (their runtime's ``imageID``): it is
    the version's from now on (the first one seen is kept)."""
    rec = ledger.releases.get(ledger.current)
    ids = set(image_ids) - {""}
    if rec is None or rec.digest or not rec.version.image or len(ids) != 1:
        return ledger
    return replace(ledger, releases={**ledger.releases, rec.version.id: replace(rec, digest=ids.pop())})


def image_of(rec: Release) -> str:
    """The image a launch of ``rec`` runs: its digest once known, else its reference."""
    return rec.digest or rec.version.image


def wrote(ledger: Ledger, writer: str, checkpoint: str) -> Ledger:
    """A checkpoint appeared that ``writer`` (its manifest's release) wrote."""
    rec = ledger.releases.get(writer)
    if rec is None or checkpoint in rec.checkpoints:
        return ledger
    rec = replace(rec, checkpoints=(rec.checkpoints + (checkpoint,))[-64:])
    return replace(ledger, releases={**ledger.releases, writer: rec})


@dataclass(frozen=True)
class Reject:
    """The running version is rejected: ``reason`` (a short label) and ``why`` (one line);
    ``to``: the version it goes back to ("": none, so it is not rejected and the job's own
    verdict stands)."""

    version: str
    reason: str
    why: str
    to: str = ""


def judge(ledger: Ledger, *, kind: str, detail: str, step: int | None, stepped: bool,
          node_failure: bool, policy: Policy) -> tuple[Ledger, Reject | None]:
    """A fault hit the running attempt: whether it rejects the running version (on probation,
    the fault its own): it failed before its first step, it tripped the non-finite guard, or it
    faulted at a step where a fault of its own hit it before. Other faults of its own are
    remembered by step. A rejection is kept as the ledger's ``pending`` until
    :func:`roll_back` (or :func:`settle`) takes it; one with nothing to go back to (no
    known-good version, no baseline) is said (``to`` empty) but changes nothing."""
    rec = ledger.releases.get(ledger.current)
    if (not policy.rollback or rec is None or rec.state != PROBATION or node_failure or kind in NOT_ITS_OWN
            or rec.version.id == BASELINE):
        return ledger, None
    reason = why = ""
    if kind == "nonfinite":
        reason, why = "nonfinite", f"its loss went non-finite{'' if step is None else f' at step {step}'}: {detail}"
    elif not stepped and kind in _STARTUP:
        reason, why = "startup_failure", f"it failed before its first step: {kind}: {detail}"
    elif step is not None and step in rec.fault_steps:
        reason, why = "repeated_fault", f"it faulted twice at step {step}: {kind}: {detail}"
    if not reason:
        if step is not None:
            rec = replace(rec, fault_steps=(rec.fault_steps + (step,))[-64:])
            ledger = replace(ledger, releases={**ledger.releases, rec.version.id: rec})
        return ledger, None
    target = rollback_target(ledger, rec.version.id, policy)
    verdict = Reject(rec.version.id, reason, why[:MAX_TEXT], target.id if target is not None else "")
    # with nothing to go back to, the version is not rejected: the job's own verdict stands
    return (ledger if target is None else replace(ledger, pending=verdict)), verdict


def settle(ledger: Ledger) -> Ledger:
    """A pending rejection with nothing to roll back to: the version stays on probation (the
    job's own verdict, its named stop, stands)."""
    return replace(ledger, pending=None)


def rollback_target(ledger: Ledger, rejected: str, policy: Policy) -> Version | None:
    """What a rejected version goes back to: the newest known-good version other than it, else
    the baseline, else nothing (the job's named stop stands)."""
    good = [r for r in ledger.releases.values() if r.state == KNOWN_GOOD and r.version.id != rejected]
    if good:
        return max(good, key=lambda r: r.state_unix).version
    return policy.baseline


def roll_back(ledger: Ledger, reject: Reject, target: Version, *, now_unix: float) -> tuple[Ledger, Told]:
    """The ledger with ``reject``'s version rejected and ``target`` running, and the event."""
    rels = dict(ledger.releases)
    rec = rels[reject.version]
    rels[reject.version] = replace(rec, state=REJECTED, state_unix=now_unix, why=reject.why, allowed=False)
    if target.id not in rels:
        rels[target.id] = Release(target, KNOWN_GOOD, now_unix, now_unix, why="the operator's baseline")
    reasons = dict(ledger.rollback_reasons)
    reasons[reject.reason] = reasons.get(reject.reason, 0) + 1
    told = Told("release_rolled_back", {"from": reject.version, "to": target.id, "reason": reject.reason,
                                        "why": reject.why, "runs": target.summary()})
    last = {"unix": now_unix, "from": reject.version, "to": target.id, "reason": reject.reason}
    return replace(ledger, releases=rels, current=target.id, rollbacks=ledger.rollbacks + 1,
                   rollback_reasons=reasons, last_rollback=last, pending=None), told


def restorable(checkpoints: Iterable[str], writers: Mapping[str, str], ledger: Ledger) -> list[str]:
    """``checkpoints`` (newest first) less those a rejected version wrote (their manifests
    say which; a checkpoint that names no release, or one the ledger does not know, stays)."""
    rejected = ledger.rejected_ids()
    return [c for c in checkpoints if writers.get(c, "") not in rejected]


def summary(ledger: Ledger, policy: Policy) -> dict[str, Any]:
    """The running release as ``/status``, ``/metrics`` and ``supervisor status`` show it."""
    rec = ledger.releases.get(ledger.current)
    good = ledger.known_good
    out: dict[str, Any] = {"version": ledger.current or None, "state": rec.state if rec else None,
                           "steps": rec.steps if rec else 0, "probation_steps": policy.probation_steps,
                           "known_good": good.version.id if good else None, "rollback": policy.rollback,
                           "rollbacks": ledger.rollbacks, "rollback_reasons": dict(ledger.rollback_reasons),
                           "rejected": sorted(ledger.rejected_ids()),
                           "last_rollback": None if ledger.last_rollback is None else dict(ledger.last_rollback)}
    if rec is not None:
        out["runs"] = rec.version.summary()
    return out


def _bounded(rels: dict[str, Release], *, keep: set[str]) -> dict[str, Release]:
    """At most :data:`MAX_RELEASES`: the oldest that are not known-good nor kept go first."""
    while len(rels) > MAX_RELEASES:
        victim = next((v for v, r in rels.items() if v not in keep and r.state != KNOWN_GOOD), None)
        if victim is None:
            victim = next(v for v in rels if v not in keep)
        del rels[victim]
    return rels


# ---------------------------------------------------------------------------- the saved form
def _release_saved(r: Release) -> dict[str, Any]:
    v = r.version
    return {"id": v.id, "parts": dict(v.parts), "command": list(v.command), "env": dict(v.env), "entry": v.entry,
            "image": v.image, "code_dir": v.code_dir, "state": r.state, "released_unix": r.released_unix,
            "state_unix": r.state_unix, "why": r.why, "steps": r.steps, "fault_steps": list(r.fault_steps),
            "checkpoints": list(r.checkpoints), "allowed": r.allowed, "digest": r.digest}


def _release_from(r: Any, where: str) -> Release:
    if not isinstance(r, dict):
        raise LedgerError(f"{where}: a mapping is expected")
    vid = _text(r.get("id"), f"{where}.id", 64)
    if not VERSION_ID.fullmatch(vid):
        raise LedgerError(f"{where}.id: a version id ({ID_HEX} hex digits, or {BASELINE!r}) is expected")
    parts = r.get("parts", {})
    if not isinstance(parts, dict) or len(parts) > 64:
        raise LedgerError(f"{where}.parts: a mapping is expected")
    command = r.get("command")
    if not isinstance(command, list) or not command or len(command) > MAX_ARGS:
        raise LedgerError(f"{where}.command: a non-empty list is expected")
    env = r.get("env", {})
    if not isinstance(env, dict) or len(env) > MAX_ARGS:
        raise LedgerError(f"{where}.env: a mapping is expected")
    entry = r.get("entry", -1)
    if not isinstance(entry, int) or isinstance(entry, bool) or not -1 <= entry < len(command):
        raise LedgerError(f"{where}.entry: an index into the command is expected")
    state = r.get("state")
    if state not in STATES:
        raise LedgerError(f"{where}.state: one of {STATES} is expected")
    steps = r.get("fault_steps", [])
    ckpts = r.get("checkpoints", [])
    if not isinstance(steps, list) or not isinstance(ckpts, list) or len(steps) > 64 or len(ckpts) > 64:
        raise LedgerError(f"{where}: fault_steps/checkpoints: lists of at most 64 are expected")
    allowed = r.get("allowed", False)
    if not isinstance(allowed, bool):
        raise LedgerError(f"{where}.allowed: true or false is expected")
    version = Version(vid, {_text(k, f"{where}.parts", 64): _text(v, f"{where}.parts", MAX_TEXT) for k, v in parts.items()},
                      tuple(_text(a, f"{where}.command", MAX_TEXT * 4) for a in command),
                      {_text(k, f"{where}.env", 256): _text(v, f"{where}.env", MAX_TEXT * 4) for k, v in env.items()},
                      entry, _text(r.get("image", ""), f"{where}.image", 1024),
                      _text(r.get("code_dir", ""), f"{where}.code_dir", 4096))
    return Release(version, state, _time(r.get("released_unix", 0.0), f"{where}.released_unix"),
                   _time(r.get("state_unix", 0.0), f"{where}.state_unix"), _text(r.get("why", ""), f"{where}.why",
                                                                                 MAX_TEXT),
                   _whole(r.get("steps", 0), f"{where}.steps"),
                   tuple(_whole(s, f"{where}.fault_steps") for s in steps),
                   tuple(_text(c, f"{where}.checkpoints", 256) for c in ckpts), allowed,
                   _text(r.get("digest", ""), f"{where}.digest", 1024))


def _text(v: Any, where: str, limit: int) -> str:
    if not isinstance(v, str) or len(v) > limit or "\0" in v:
        raise LedgerError(f"{where}: a string of at most {limit} characters is expected")
    return v


def _whole(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 62:
        raise LedgerError(f"{where}: a whole number is expected")
    return v


def _time(v: Any, where: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1e11:
        raise LedgerError(f"{where}: a time (seconds since the epoch) is expected")
    return float(v)
