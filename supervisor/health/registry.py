"""The latest heartbeat of every rank of the current attempt, and an index of when each could
next make a finding (so that a look at a healthy gang does not visit every rank)."""

from __future__ import annotations

import array
import heapq
import math
import operator
from typing import TYPE_CHECKING, Any, Sequence

import msgspec

from supervisor.protocol import OUTCOME_STOPPED, PHASE_DONE, PHASE_FAILED, PHASES, Heartbeat

if TYPE_CHECKING:
    from supervisor.health.detect import Timeouts

_STEP = operator.attrgetter("hb.step")
_RECEIVED = operator.attrgetter("received")
SLOT_S = 1 / 16
"""The index keeps when waits began to this (rounded down: deadlines come early by less than
this, never late): ranks that began within the same slot share one entry."""
BRIEF_S = 1.0
"""A wait (a phase, a collective) that had lasted no longer than this when its heartbeat came is
not indexed on its own: it ends no earlier than the oldest receipt plus the shortest timeout, less
this, which the index reads instead. Healthy ranks change phase every step: no index work for them."""
_NOT_HELD = (0.0,)
_UNHEARD = (1 << 63) - 1
"""What the step columns hold for a rank not heard from: above any step, so that a minimum skips it."""
_SLACK = 1e-9
"""Relative margin by which the index's deadlines come early besides, so that float rounding
never makes one later than what detect()'s own arithmetic finds."""


class RankRecord(msgspec.Struct, gc=False):
    """A rank's latest heartbeat, when it was received (sent, for one a relay held) and where
    from, and where the rank is in its registry's index. Never tracked by the garbage collector
    (``gc=False``: nothing it refers to can refer back to it: a heartbeat, floats, an address
    tuple of a host and a port), so that a full collection does not walk 131,072 of them. One
    object per rank, read and written by each heartbeat: the controller's hot path touches the
    memory of one record, not of a record and an index entry."""

    hb: Heartbeat
    received: float
    addr: Any = None
    """The address the rank's latest recorded heartbeat came from (its own socket, or its node
    relay's): where its control frames go. Only an accepted heartbeat moves it."""
    slot_heard: float | None = None
    """The index's (the registry's own): the slot the rank is filed as heard in, lazily (see
    :meth:`Registry.observe_many`); None: not indexed (done, or not yet)."""
    slot_coll: float | None = None
    """The index's: since when the rank waits in a collective (None: not indexed)."""
    slot_phase: str = ""
    """The index's: the rank's phase, where ``slot_since`` is set."""
    slot_since: float | None = None
    """The index's: since when the rank is in its phase (None: not indexed)."""


class Registry:
    """Heartbeats of one attempt, by rank. Older attempts are fenced off by the caller.

    Beside the records, :meth:`observe` keeps in O(1) an index of when each rank's last heartbeat
    could next make a finding, timeouts left out: when each rank was last heard, since when each
    waits inside a collective and since when each is in its phase (to :data:`SLOT_S`; a wait
    shorter than :data:`BRIEF_S` is left out), and the ranks with a non-finite loss. Receipts may
    come in any order (a node's relay dates its ranks' heartbeats back to when they were sent).
    When a healthy rank was heard is indexed lazily: its entry may be older than its latest
    receipt (never newer), and is moved on only when a read reaches that entry's deadline
    (``_catch_up``): about once per heartbeat timeout per rank, not once per heartbeat.
    :meth:`due` reads it in O(1) amortised with the timeouts the caller holds, so a recalibration
    costs nothing here. The index follows :meth:`observe` and :meth:`reset`: a ``ranks`` dict
    replaced or resized by hand is indexed again at the next read; a record edited in place, or
    put back under its rank in the same dict, is not seen (the records are the registry's own:
    replace the dict, never one of its values).
    """

    def __init__(self, attempt: int = 0, world_size: int = 0) -> None:
        self.attempt = attempt
        self.world_size = world_size
        self.ranks: dict[int, RankRecord] = {}
        self._clear_index()

    def reset(self, attempt: int, world_size: int) -> None:
        self.attempt = attempt
        self.world_size = world_size
        self.ranks = {}
        self._clear_index()

    def snapshot(self) -> Registry:
        """A registry of the same records in a dict of its own (a copy in C, O(n)), for a reader on
        another thread while this one takes heartbeats: a record's heartbeat is replaced whole."""
        other = Registry(self.attempt, self.world_size)
        other.ranks = dict(self.ranks)
        return other

    def observe(self, hb: Heartbeat, now: float, addr: Any = None) -> bool:
        """Record ``hb``, received at ``now`` from ``addr``; False when it is older than what is
        held (reordered or replayed)."""
        return bool(self.observe_many((hb,), now, _NOT_HELD, addr))

    def observe_many(self, beats: Sequence[Heartbeat], now: float, held: Sequence[float], addr: Any = None) -> int:
        """Record each of ``beats``, received from ``addr`` ``held`` (its own, finite: a frame's
        are bounded) seconds before ``now`` (a node's relay dates its ranks' heartbeats back to
        when they were sent): how many were recorded, those older than what is held left out
        (reordered or replayed). The controller's hot path: a node frame's heartbeats in one
        call, a healthy rank's in a few operations on its one record."""
        if self.ranks is not self._indexed or len(self.ranks) != self._count:
            self._rebuild()
        ranks = self.ranks
        latest = self._latest
        steps, saves = self._steps, self._saves
        width = len(steps)
        finite = now - now == 0.0  # (a clock that is not a finite time: each heartbeat goes through _index)
        quiet = finite and not self._nonfinite and not self._done_nonfinite and not self._failed and not self._stopped
        recorded = 0
        for hb, h in zip(beats, held):
            at = now - h
            rank = hb.rank
            rec = ranks.get(rank)
            if rec is None:
                rec = ranks[rank] = RankRecord(hb, at, addr)
                self._count += 1
                if 0 <= rank < self._world:
                    self._in_world += 1
                self._column(hb)
            else:
                last = rec.hb
                if hb.seq <= last.seq and hb.pid == last.pid:
                    continue  # reordered or replayed datagram: keep the newer state
                rec.hb = hb
                rec.received = at
                rec.addr = addr
                if 0 <= rank < width:  # what _column does, inline (a call per heartbeat costs more)
                    try:
                        steps[rank] = hb.step
                        saves[rank] = hb.ckpt_step
                    except (OverflowError, TypeError):  # (a heartbeat made by hand: the wire's are bounded)
                        self._columns = False
                else:
                    self._columns = False
                heard = rec.slot_heard
                if (quiet and heard is not None and rec.slot_coll is None and rec.slot_since is None
                        and hb.phase_s <= BRIEF_S and (not hb.coll_inside or hb.coll_s <= BRIEF_S) and hb.loss_ok
                        and hb.phase != PHASE_DONE and hb.phase != PHASE_FAILED and not hb.outcome):
                    # what _index does for a healthy rank (no wait indexed before or now): only that
                    # it was heard, and lazily: the slot it is indexed in may stay older than this
                    # receipt (its deadlines come early; _catch_up moves it on when that slot comes
                    # due), never newer
                    if at > latest:
                        latest = at
                    if at < heard:  # dated back before the slot it is indexed in
                        rec.slot_heard = at // SLOT_S * SLOT_S
                        self._heard.move(rank, heard, rec.slot_heard)
                    recorded += 1
                    continue
            self._latest = latest
            self._index(rec)
            latest = self._latest
            quiet = finite and not self._nonfinite and not self._done_nonfinite and not self._failed and not self._stopped
            recorded += 1
        self._latest = latest
        return recorded

    def addresses(self) -> dict[int, Any]:
        """Each rank's reply address (where its latest recorded heartbeat came from), for the
        ranks heard from with one."""
        return {rank: rec.addr for rank, rec in self.ranks.items() if rec.addr is not None}

    def address(self, rank: int) -> Any:
        """Rank ``rank``'s reply address (None: not heard from, or heard with none)."""
        rec = self.ranks.get(rank)
        return None if rec is None else rec.addr

    def floor(self) -> tuple[int, int]:
        """The slowest rank's step and the oldest of the ranks' newest saved steps ((0, -1) without
        ranks): off two arrays the heartbeats keep, by rank (a pass in C over contiguous memory,
        ~2 ms at 131,072 ranks where a pass over the records, scattered in memory, took ~40), or
        in one pass over the ranks where a rank is outside them."""
        self._check()
        if not self.ranks:
            return 0, -1
        if self._columns:
            return min(self._steps), min(self._saves)
        step = ckpt = math.inf
        for rec in self.ranks.values():
            hb = rec.hb
            if hb.step < step:
                step = hb.step
            if hb.ckpt_step < ckpt:
                ckpt = hb.ckpt_step
        return int(step), int(ckpt)

    def nonfinite(self) -> list[int]:
        """The ranks whose last heartbeat reported a non-finite loss, done or not, in rank order
        (off the index: O(those ranks), as the three below)."""
        self._check()
        return sorted(self._nonfinite | self._done_nonfinite)

    def done(self) -> frozenset[int]:
        """The ranks whose last heartbeat is in phase ``done``."""
        self._check()
        return frozenset(self._done)

    def stopped(self) -> list[int]:
        """The ranks whose outcome is ``stopped`` (a non-finite loss, a stop request: said just before
        their phase ``done``), in rank order."""
        self._check()
        return sorted(self._stopped)

    def failed(self) -> list[int]:
        """The ranks whose last heartbeat is in phase ``failed`` (they are ending on an exception), in rank order."""
        self._check()
        return sorted(self._failed)

    def all_finite(self) -> bool:
        """Every rank's last heartbeat reported a finite loss (O(1): the index keeps who did not)."""
        self._check()
        return not self._nonfinite and not self._done_nonfinite

    def max_step(self) -> int:
        return max(map(_STEP, self.ranks.values()), default=0)

    def min_step(self) -> int:
        return min(map(_STEP, self.ranks.values()), default=0)

    def loop_step_time(self) -> float:
        """The training loop's wall time per step, its saves left out: the median over the ranks
        of what each says (``loop_step_s``); 0 when none says it (an older SDK, or before each
        has taken two steps)."""
        said = sorted(t for t in (rec.hb.loop_step_s for rec in self.ranks.values()) if t > 0)
        return said[len(said) // 2] if said else 0.0

    # ------------------------------------------------------------------ deadlines
    def next_deadline(self, timeouts: Timeouts, now: float | None = None) -> float:
        """The earliest clock reading at which :func:`~supervisor.health.detect.detect` could find
        a rank dead, waiting in a collective past ``timeouts.collective_s``, past its phase's
        timeout or with a non-finite loss (-inf: already; inf: never), early rather than late (by
        less than :data:`SLOT_S`; :data:`BRIEF_S` for a wait too brief to be indexed). It holds for
        a clock at or past the latest receipt (a rank whose heartbeat already says it is past a
        timeout has its deadline before that receipt).

        With ``now``, it is that exact only where it is at or before ``now`` (or the latest
        receipt): a later one may come out earlier still (a rank heard since its slot was indexed
        is moved on only when that slot's deadline comes: O(1) per heartbeat, a move per rank
        and timeout instead of per heartbeat)."""
        self._check()
        at = math.inf if now is None else max(now, self._latest)
        self._catch_up(at - min(timeouts.heartbeat_s, _brief_limit(timeouts)) + SLOT_S)
        oldest = self._heard.first()
        if oldest == math.inf:
            return -math.inf if self._nonfinite else math.inf
        return min(_early(oldest, timeouts.heartbeat_s), self._other_deadline(oldest, timeouts))

    def due(self, now: float, timeouts: Timeouts) -> bool:
        """Whether some rank's deadline (:meth:`next_deadline`) has come at ``now``: when not,
        detect() finds no rank dead, waiting, past its phase's timeout or with a non-finite loss.
        A clock read before the latest receipt counts as that receipt (a heartbeat that arrived
        after the caller read its clock: detect() takes its silence as 0)."""
        first = self.next_deadline(timeouts, now)
        return first == -math.inf or first <= max(now, self._latest)

    def due_besides_silence(self, now: float, timeouts: Timeouts) -> bool:
        """Whether some rank still heard at ``now`` (silent no longer than ``timeouts.heartbeat_s``)
        could be waiting in a collective past its timeout, past its phase's timeout, or has a
        non-finite loss: when not, detect()'s findings at ``now`` are the silent ranks (and those
        never heard) alone. A silent rank's last wait and loss do not count (detect() does not
        judge them): the index's entries whose deadline came are read for a rank still heard,
        O(1) amortised while none has come (the silent ranks' entries stay until the gang is torn
        down: a few per look)."""
        self._check()
        heartbeat_s, ranks = timeouts.heartbeat_s, self.ranks
        at = max(now, self._latest)
        self._catch_up(at - min(heartbeat_s, _brief_limit(timeouts)) + SLOT_S)
        if -math.inf in self._heard.count:
            return True  # a receipt that is not a finite time: the full pass judges it
        if any(now - ranks[r].received <= heartbeat_s for r in self._nonfinite):
            return True
        # the ranks heard since now - heartbeat_s, to the slot (a few silent ones may come along:
        # earlier, never later)
        live = self._heard.first_above(now - heartbeat_s - SLOT_S)
        if live == math.inf:
            return False
        if _early(live, _brief_limit(timeouts)) <= at:
            return True  # a wait too brief to be indexed may have run out
        waits = [(self._coll, timeouts.collective_s)] + [
            (starts, timeouts.for_phase(phase)) for phase, starts in self._phase.items()]
        for starts, limit in waits:
            if limit is None or not starts.count or _early(starts.first(), limit) > at:
                continue
            for slot in [s for s in starts.count if _early(s, limit) <= at]:
                if any(now - ranks[r].received <= heartbeat_s for r in starts.count[slot]):
                    return True
        return False

    def _other_deadline(self, oldest: float, timeouts: Timeouts) -> float:
        """The earliest deadline but silence, the waits too brief to index read from ``oldest``
        (the slot of the oldest receipt among the ranks that matter)."""
        if self._nonfinite:
            return -math.inf
        first = _early(oldest, _brief_limit(timeouts))
        if self._coll.count:
            first = min(first, _early(self._coll.first(), timeouts.collective_s))
        for phase, starts in self._phase.items():
            limit = timeouts.for_phase(phase)
            if limit is not None and starts.count:
                first = min(first, _early(starts.first(), limit))
        return first

    def silent(self, now: float, heartbeat_s: float) -> list[int]:
        """The ranks (not done) silent for longer than ``heartbeat_s`` at ``now``, in rank order:
        the index's oldest slots are read, not every rank."""
        self._check()
        self._catch_up(now - heartbeat_s + SLOT_S)
        ranks = self.ranks
        return sorted(r for r in self._heard.members_to(now - heartbeat_s)
                      if now - ranks[r].received > heartbeat_s)

    def _catch_up(self, upto: float) -> None:
        """The ranks indexed as heard in a slot up to ``upto`` that were heard since (observe()
        leaves a healthy rank where it was indexed): moved to the slot of their latest receipt.
        O(1) while no slot is that old; then O(slots) and O(1) per rank moved, the moves into
        each slot made at once (each rank about once per deadline, not once per heartbeat). The
        ranks left in those slots are silent since."""
        heard = self._heard
        if heard.first() > upto:
            return
        count, ranks = heard.count, self.ranks
        inf = math.inf
        for slot in sorted(s for s in count if s <= upto):
            if slot == -inf:
                continue  # receipts that are not finite times: the full pass judges them (due_besides_silence)
            members = count[slot]
            later = slot + SLOT_S
            into: dict[float, list[int]] = {}
            # the records, then their receipts, each read in one pass in C (the records are cold:
            # a tight loop has several of them on the way at once, a Python loop one at a time)
            order = list(members)
            recs = list(map(ranks.__getitem__, order))
            for rank, rec, received in zip(order, recs, list(map(_RECEIVED, recs))):
                if later <= received < inf:
                    new = received // SLOT_S * SLOT_S
                    rec.slot_heard = new
                    moved = into.get(new)
                    if moved is None:
                        into[new] = [rank]
                    else:
                        moved.append(rank)
            if not into:
                continue
            for new, moved in into.items():
                heard.join(new, moved)
            left = members.difference(*into.values())
            if left:
                count[slot] = left
            else:
                del count[slot]

    def all_heard(self) -> bool:
        """Every rank of ``range(world_size)`` has been heard from (O(1))."""
        self._check()
        if self._world != self.world_size:
            self._world = self.world_size
            self._in_world = sum(1 for r in self.ranks if 0 <= r < self._world)
        return self._in_world >= self._world

    def _clear_index(self) -> None:
        self._indexed = self.ranks  # the dict the index describes, and how many ranks it held
        self._count = 0
        self._heard = _Members()  # when each rank (not done) was last heard, and who
        self._coll = _Members()  # since when each rank inside a collective waits there, and who
        self._phase: dict[str, _Members] = {}  # since when each rank is in its phase, by phase
        self._nonfinite: set[int] = set()  # ranks (not done) whose last heartbeat reported a non-finite loss
        self._done_nonfinite: set[int] = set()  # ranks done whose last heartbeat did
        self._done: set[int] = set()  # ranks whose last heartbeat is in phase done
        self._stopped: set[int] = set()  # ranks whose outcome is stopped (early), done or on their way
        self._failed: set[int] = set()  # ranks whose last heartbeat is in phase failed
        self._latest = -math.inf  # the latest receipt
        self._world = self.world_size
        self._in_world = 0  # ranks of range(self._world) heard
        # each rank's step and newest saved step, by rank (range(world_size)): floor() in C
        self._steps = array.array("q", [_UNHEARD]) * max(0, self.world_size)
        self._saves = array.array("q", [_UNHEARD]) * max(0, self.world_size)
        self._columns = True  # False: a rank outside them was heard (floor() reads the records)

    def _check(self) -> None:
        if self.ranks is not self._indexed or len(self.ranks) != self._count:
            self._rebuild()

    def _rebuild(self) -> None:
        """The index anew from the records (after a hand edit): O(n). Each record is replaced by
        a copy of its own, not yet indexed: a record may be shared with another registry's dict
        (:meth:`snapshot`, a dict assembled by hand), whose index it must not move."""
        latest = self._latest
        self._clear_index()
        ranks = self.ranks
        self._count = len(ranks)
        self._in_world = sum(1 for r in ranks if 0 <= r < self._world)
        for rank, rec in list(ranks.items()):
            rec = ranks[rank] = RankRecord(rec.hb, rec.received, rec.addr)
            self._index(rec)
            self._column(rec.hb)
        self._latest = max(latest, self._latest)

    def _column(self, hb: Heartbeat) -> None:
        """``hb``'s step and newest saved step into the columns (by its rank)."""
        rank = hb.rank
        if 0 <= rank < len(self._steps):
            try:
                self._steps[rank] = hb.step
                self._saves[rank] = hb.ckpt_step
                return
            except (OverflowError, TypeError):
                pass
        self._columns = False

    def _index(self, rec: RankRecord) -> None:
        """File ``rec`` (its rank's record, its heartbeat just recorded) in the index."""
        hb, now = rec.hb, rec.received
        rank = hb.rank
        if now > self._latest:
            self._latest = now
        old_heard = rec.slot_heard  # None: not indexed
        if hb.phase == PHASE_FAILED:
            self._failed.add(rank)
        elif self._failed:
            self._failed.discard(rank)
        if hb.outcome == OUTCOME_STOPPED:
            self._stopped.add(rank)
        elif self._stopped:
            self._stopped.discard(rank)
        if hb.phase == PHASE_DONE:  # no deadline
            self._done.add(rank)
            self._nonfinite.discard(rank)
            if hb.loss_ok:
                self._done_nonfinite.discard(rank)
            else:
                self._done_nonfinite.add(rank)
            if old_heard is not None:
                self._heard.move(rank, old_heard, None)
                self._coll.move(rank, rec.slot_coll, None)
                if rec.slot_since is not None:
                    self._phase[rec.slot_phase].move(rank, rec.slot_since, None)
                rec.slot_heard = rec.slot_coll = rec.slot_since = None
            return
        if self._done:
            self._done.discard(rank)
        if self._done_nonfinite:
            self._done_nonfinite.discard(rank)
        if not hb.loss_ok:
            self._nonfinite.add(rank)
        elif self._nonfinite:
            self._nonfinite.discard(rank)
        heard = now // SLOT_S * SLOT_S if now - now == 0.0 else -math.inf  # (exact: SLOT_S is a power of 2)
        coll = _slot(now, hb.coll_s) if hb.coll_inside and hb.coll_s > BRIEF_S else None
        phase = hb.phase
        since = _slot(now, hb.phase_s) if hb.phase_s > BRIEF_S else None
        if old_heard is None:
            rec.slot_heard, rec.slot_coll, rec.slot_phase, rec.slot_since = heard, coll, phase, since
            self._heard.move(rank, None, heard)
            if coll is not None:
                self._coll.move(rank, None, coll)
            if since is not None:
                self._starts(phase).move(rank, None, since)
            return
        if old_heard != heard:
            self._heard.move(rank, old_heard, heard)
            rec.slot_heard = heard
        if rec.slot_coll != coll:
            self._coll.move(rank, rec.slot_coll, coll)
            rec.slot_coll = coll
        if rec.slot_since != since or (since is not None and rec.slot_phase != phase):  # (no phase slot: its phase is moot)
            if rec.slot_phase == phase:
                self._starts(phase).move(rank, rec.slot_since, since)
            else:
                if rec.slot_since is not None:
                    self._phase[rec.slot_phase].move(rank, rec.slot_since, None)
                if since is not None:
                    self._starts(phase).move(rank, None, since)
                rec.slot_phase = phase
            rec.slot_since = since

    def _starts(self, phase: str) -> _Members:
        starts = self._phase.get(phase)
        if starts is None:
            starts = self._phase[phase] = _Members()
        return starts


class _Starts:
    """When the waits of some ranks began, by :data:`SLOT_S` slot: how many ranks in each slot,
    and a min-heap of the slots (emptied ones dropped when they reach the top)."""

    __slots__ = ("count", "heap")

    def __init__(self) -> None:
        self.count: dict[float, Any] = {}  # slot -> how many ranks (a _Members: which ranks)
        self.heap: list[float] = []

    def move(self, old: float | None, new: float | None) -> None:
        """One rank's wait moves from slot ``old`` to slot ``new`` (None: none indexed)."""
        count = self.count
        if old is not None:
            n = count[old]
            if n == 1:
                del count[old]
            else:
                count[old] = n - 1
        if new is not None:
            n = count.get(new)
            if n is not None:
                count[new] = n + 1
                return
            count[new] = 1
            heapq.heappush(self.heap, new)
            if len(self.heap) > 2 * len(count) + 64:  # emptied slots below the top: O(slots), rarely
                self.heap = list(count)
                heapq.heapify(self.heap)

    def first(self) -> float:
        """The earliest slot a rank is in (inf: none)."""
        heap, count = self.heap, self.count
        while heap and heap[0] not in count:
            heapq.heappop(heap)
        return heap[0] if heap else math.inf


class _Members(_Starts):
    """Like :class:`_Starts`, with the ranks themselves in each slot (``count`` maps a slot to
    the set of them)."""

    __slots__ = ()

    def move(self, rank: int, old: float | None, new: float | None) -> None:  # type: ignore[override]
        """Rank ``rank`` moves from slot ``old`` to slot ``new`` (None: none indexed)."""
        count = self.count
        if old is not None:
            members = count[old]
            if len(members) == 1:
                del count[old]
            else:
                members.discard(rank)
        if new is not None:
            members = count.get(new)
            if members is not None:
                members.add(rank)
                return
            count[new] = {rank}
            heapq.heappush(self.heap, new)
            if len(self.heap) > 2 * len(count) + 64:  # emptied slots below the top: O(slots), rarely
                self.heap = list(count)
                heapq.heapify(self.heap)

    def join(self, slot: float, ranks: list[int]) -> None:
        """Ranks (indexed nowhere here, or about to leave their slot: the caller's part) join ``slot``."""
        members = self.count.get(slot)
        if members is not None:
            members.update(ranks)
            return
        self.count[slot] = set(ranks)
        heapq.heappush(self.heap, slot)
        if len(self.heap) > 2 * len(self.count) + 64:  # emptied slots below the top: O(slots), rarely
            self.heap = list(self.count)
            heapq.heapify(self.heap)

    def first_above(self, floor: float) -> float:
        """The earliest slot above ``floor`` a rank is in (inf: none): O(slots)."""
        return min((slot for slot in self.count if slot > floor), default=math.inf)

    def members_to(self, last: float):
        """The ranks in the slots up to ``last``: O(slots) and the ranks yielded."""
        for slot in [s for s in self.count if s <= last]:
            yield from self.count[slot]


def _slot(received: float, elapsed: float) -> float:
    """The slot of the moment a wait began that had lasted ``elapsed`` at ``received``: rounded
    down, a hair early besides (see _SLACK); -inf where that is not a finite number."""
    since = received - elapsed - _SLACK * (abs(received) + abs(elapsed) + 1.0)
    if not math.isfinite(since):
        return -math.inf
    return since // SLOT_S * SLOT_S


def _brief_limit(timeouts: Timeouts) -> float:
    """The waits not indexed (they had lasted :data:`BRIEF_S` at most when heard): none ends
    before its rank's receipt plus this (the shortest timeout, less BRIEF_S)."""
    shortest = min((limit for limit in map(timeouts.for_phase, PHASES) if limit is not None), default=math.inf)
    return min(shortest, timeouts.collective_s) - BRIEF_S


def _early(since: float, limit: float) -> float:
    """``since + limit``, a hair early (see _SLACK); -inf where it is not a number."""
    at = since + limit
    if not math.isfinite(at):
        return -math.inf if at != at else at
    return at - _SLACK * (abs(since) + abs(limit) + 1.0)
