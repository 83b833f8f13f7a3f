"""The invariants, checked from outside the code under test, over a history.

The checker never runs inside the lock. A lock catches and logs exceptions
where it must go on (its scheduler around renewals and release retries, the
async lock around a cancelled worker, a signal dispatcher), so an assertion
raised in a call the lock made would be swallowed there. Instead, the
simulated store and the parties append what an observer can see to
:attr:`Checker.history`: every request a party sends and its reply, every
write the store applies (with its generation and who sent it), and each
result of a public API call with the party's public state at that instant
(``is_held``, ``healthy``, ``token``). The hub calls :meth:`Checker.check`
between steps, in its own loop: it reads the history that has come in, then
judges the parties' public state at the true time. A broken invariant raises
:class:`~.hub.Violation` there, which ends the run with the seed and the trace.

Records are read with the checker's own strict reader (:func:`read_record`),
never the library's codec, so a fault of the codec cannot hide itself.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ...core import buggify
from ...core.errors import (
    AcquireCancelled,
    LockContended,
    LockLost,
    LockNotHeld,
    LockRecordCorrupt,
    TransientStorageError,
)
from ...core.protocol import Kind, Write, decide_acquire, decide_give_up_wait, decide_release, decide_renew, restamp
from ...core.record import ASKING, LockRecord
from ...fencing import decode_fence
from ...lock.handoff import Acquired
from .hub import MONO0, WALL0, Hub, Proc, Violation

#: A simulated party (:class:`.parties.Party`). Not imported, even for typing: parties import the
#: store, which records into this module's history, and the package's modules import in no circle.
Party = Any

#: What an operation may end with, by the lock's documentation: outcomes, never violations.
EXPECTED = (LockContended, AcquireCancelled, TransientStorageError, LockLost, LockNotHeld)

KEY = "locks/sim.json"
FENCE_KEY = "locks/fenced.json"

#: Float noise allowed where the checker recomputes a time a record was stamped with.
EPSILON = 1e-6

#: After a 429 a writer's spacing doubles, up to this (design.md, *Pacing*); each write that lands takes a
#: quarter of it back, and within 0.05 s of the store's own spacing it is the store's own.
WIDEST_SPACING = 8.0
#: A read that takes this long stalled (the simulated store's slow reads take a second or more).
STALLED = 1.0


@dataclass(frozen=True)
class Rules:
    """What the lock promises in this world, from its timing: the bounds the checker holds it to."""

    ttl: float
    skew: float
    waiter_check_interval: float
    gentle: bool  # only survivable faults: an owner that is not paused must keep its lock
    spacing: float = 1.0  # the store's write spacing (a gentle world's is GCS's)


# ---------------------------------------------------------------------- the checker's own record reader


@dataclass(frozen=True)
class Place:
    """The owner or the waiter named by a record."""

    id: str
    instance: str | None
    expires_at: float
    ttl: float | None = None  # a waiter's: the lease it asked for
    asks: bool = True  # a waiter's: whether it asks the holder to let go
    #: A waiter's rank for the slot (priority, asks) and when it began waiting (its clock): its request and
    #: ``waitingSince`` as the lock reads them, each only while it names this waiter (else none, and asking at 0).
    rank: tuple[int, bool] = (0, True)
    since: float | None = None

    def live(self, now: float, skew: float = 0.0) -> bool:
        return now <= self.expires_at + skew


@dataclass(frozen=True)
class Rec:
    """What the checker reads in a lock record: only the fields its rules need."""

    owner: Place | None
    waiter: Place | None
    token: int
    ttl: float | None
    held_since: float | None = None


def _field(doc: dict[str, Any], key: str, kinds: tuple[type, ...], *, nullable: bool = True) -> Any:
    value = doc.get(key)
    if value is None and nullable:
        return None
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise Violation(f"the store holds a record whose {key!r} is {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise Violation(f"the store holds a record whose {key!r} is {value!r}")
    return value


def read_record(data: bytes, *, legacy: bool = False) -> Rec:
    """The record in ``data``, read strictly: a write the store applied that this cannot read is a violation.
    ``legacy``: a record an older version wrote, which may have no ``version`` (the original four fields)."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise Violation(f"the store holds a record that is not JSON: {data[:80]!r}") from exc
    if not isinstance(doc, dict) or (doc.get("version") != 1 and not (legacy and "version" not in doc)):
        raise Violation(f"the store holds a record that is not a version 1 object: {data[:80]!r}")
    num = (int, float)
    owner = waiter = None
    if _field(doc, "ownerId", (str,)) is not None:
        owner = Place(
            doc["ownerId"], _field(doc, "ownerInstance", (str,)), float(_field(doc, "expiresAt", num, nullable=False))
        )
    if _field(doc, "waitingOwnerId", (str,)) is not None:
        request = _field(doc, "waiterRequest", (dict,)) or {}
        asks, priority = request.get("asks", True), request.get("priority", 0)
        if not isinstance(asks, bool):
            raise Violation(f"the store holds a record whose waiterRequest.asks is {asks!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise Violation(f"the store holds a record whose waiterRequest.priority is {priority!r}")
        place = (doc["waitingOwnerId"], _field(doc, "waiterInstance", (str,)))
        since = _field(doc, "waitingSince", (dict,))
        at = None if since is None or (since.get("id"), since.get("instance")) != place else since.get("at")
        if at is not None and (isinstance(at, bool) or not isinstance(at, num)):
            raise Violation(f"the store holds a record whose waitingSince.at is {at!r}")
        ours = (request.get("id"), request.get("instance")) == place
        waiter = Place(
            *place,
            float(_field(doc, "waiterExpiresAt", num, nullable=False)),
            ttl=_field(doc, "waiterTtl", num),
            asks=asks,
            rank=(priority, asks) if ours else (0, True),
            since=None if at is None else float(at),
        )
    token = _field(doc, "token", (int,)) or 0
    since = _field(doc, "heldSince", (dict,))
    held_since = None if since is None else since.get("at")
    if held_since is not None and (isinstance(held_since, bool) or not isinstance(held_since, num)):
        raise Violation(f"the store holds a record whose heldSince.at is {held_since!r}")
    return Rec(owner, waiter, token, _field(doc, "ttl", num), held_since)


# ---------------------------------------------------------------------- the history


@dataclass(frozen=True)
class Seen:
    """A party's public state at one instant, as an API result is returned."""

    held: bool
    healthy: bool
    token: int | None
    frozen_until: float
    crashed: bool
    left_behind_until: float
    left_wait_at: float

    @classmethod
    def of(cls, party: Party) -> Seen:
        lock = party.lock
        return cls(
            lock.is_held, lock.healthy, lock.token, party.proc.frozen_until(), party.proc.crashed,
            party.left_behind_until, party.left_wait_at,
        )  # fmt: skip


@dataclass(frozen=True)
class Event:
    """One entry of the history: ``what`` is ``request`` (a write's or a delete's: the generation it is conditioned
    on in ``result``), ``reply`` (a read's carries the bytes read),
    ``applied`` (the generation it matched in ``result``), ``begin`` (an acquire, its arguments in ``result``: a
    :class:`Try`), ``interrupt`` (another thread cancels it, or releases), ``acquire`` (its end), ``void`` (an
    acquire refused before it ran) or ``lost``."""

    at: float  # hub (true monotonic) time
    party: Party | None
    what: str
    key: str = ""
    detail: str = ""  # the request's operation, the reply's outcome, why a lock was lost
    data: bytes = b""
    generation: int = 0
    result: object = None
    seen: Seen | None = None
    sent: float = 0.0  # a reply's: when its request went out
    local: float = 0.0  # a request's or reply's: the party's wall clock as it happened


@dataclass
class Try:
    """A blocking acquire under way, as the party began it: what it asks for the slot, whether it may wait for
    the slot (``wait_for_slot=False`` without a timeout may not); and what the checker learnt of it since."""

    priority: int
    asks: bool
    slot_wait: bool
    since: float | None = None  # its clock as it began and at its first request: no earlier than ``waitingSince``
    requests: int = 0  # its requests on the lock so far
    wrote: bool = False  # it sent a write (or a delete) on the lock
    due: str | None = None  # what its last read showed, which its next request must answer with a write
    due_until: float = math.inf  # ... unless it goes out at or past this, by its clock (the write is stale then)
    polled: tuple[float, str] | None = None  # a read that went out where a write was due: when, and why
    #: Cancelled, released from another thread, or met a store error (which may end it): its way out reads the record.
    interrupted: bool = False
    #: When it began (hub time), and how long it may run: its timeout, its give-up budget and the slack the world
    #: allows an acquire as it returns; judged only while its process does not stand still (``frozen``: the end of
    #: the process's last pause or suspend as it began, which no pause since has moved).
    began: float = 0.0
    bound: float = math.inf
    frozen: float = math.inf
    #: When another thread first cancelled it (``cancel()``, or ``release()``), and how long it may run from then.
    cancelled_at: float | None = None
    cancel_bound: float = math.inf


@dataclass
class Checker:
    hub: Hub
    rules: Rules
    parties: list[Party]
    #: Whether each write is judged against the protocol (:meth:`_by_protocol`): a unit test of one rule feeds
    #: hand-made writes, from parties that are no locks, which no protocol decision would make.
    by_protocol: bool = True
    counts: Counter[str] = field(default_factory=Counter)  # what the run explored: the coverage
    history: list[Event] = field(default_factory=list)
    read_up_to: int = 0  # how much of the history has been judged
    record: Rec | None = None  # the lock object as last applied
    highest_store_token: int = 0
    issued: set[tuple[str, int]] = field(default_factory=set)  # (instance, token) the store made owner
    fence_highest: int = 0
    last_sent: dict[Party, float] = field(default_factory=dict)  # when a party's last request on the lock went out
    last_write_sent: dict[Party, float] = field(default_factory=dict)  # ... its last write or delete
    #: By party: its clock as its last write on the lock went out.
    write_sent_local: dict[Party, float] = field(default_factory=dict)
    #: By party: the generation its last write on the lock was conditioned on, and its clock as each attempt
    #: conditioned on it went out since it last wrote or was refused (the writer had read that record by the first).
    write_tries: dict[Party, tuple[object, list[float]]] = field(default_factory=dict)
    #: Parties whose acquire ended without the lock while the record names it its live owner, and when:
    #: the lock must give it back (a release retried in the background) or the checker calls it a leak.
    left_owning: dict[Party, float] = field(default_factory=dict)
    in_flight: Counter[Party] = field(default_factory=Counter)  # a party's requests on the lock not answered yet
    #: Holds taken from a party by another's write: (its token, when), and whether a read of its own that
    #: went out after that has come back (the lock must have seen its loss in it).
    taken: dict[Party, tuple[int, float]] = field(default_factory=dict)
    read_since_taken: set[Party] = field(default_factory=set)
    #: The request standing in the record (owner instance, token, asking waiter's instance), and since when.
    asking: tuple[str | None, int, str | None] | None = None
    asking_since: float = 0.0
    #: When each read of the lock, or listing of its prefix that settled a check without a read, went out that
    #: no write of the party's own on the lock overlapped (a waiter check leaves what its read found to a
    #: renewal that wrote meanwhile).
    looks: dict[Party, list[float]] = field(default_factory=dict)
    #: By party: the highest generation of the lock its own reads and writes came back with (what a listing
    #: is compared with: a listing past it shows something new, which only a read can tell).
    known_generation: dict[Party, int] = field(default_factory=dict)
    #: ``(when, the waiter slot's expiry from then on)``, each time it moved (a refresh of a live slot).
    slot_ends: list[tuple[float, float]] = field(default_factory=list)
    #: By party: the reply of its last look that may have been served before the slot's last refresh and came
    #: back once the slot as it was had ended: a holder that then withdraws the request judged rightly.
    stale_look: dict[Party, float] = field(default_factory=dict)
    #: The waiter slot of each generation of the lock that had one: what a party that last knew that generation
    #: knows of the slot.
    slot_at: dict[int, Place] = field(default_factory=dict)
    #: By party: when its last read of the lock, or listing of its prefix, went out.
    peeked: dict[Party, float] = field(default_factory=dict)
    #: By instance: the waiters a record it read or wrote showed asking since its last hold ended (the requests
    #: its next hold may hear); and the instances seen holding at the last check, whose hold has not ended since.
    asked: dict[str, set[str]] = field(default_factory=dict)
    holding: set[str] = field(default_factory=set)
    writes_open: Counter[Party] = field(default_factory=Counter)
    #: By party: the generation its last request on the lock, a read, came back with (None: its last request was
    #: another, or has not come back); and, for a party whose acquire ended so, without the lock, and which has sent
    #: no write on the lock since, that generation: its way out left the object there.
    last_read: dict[Party, int | None] = field(default_factory=dict)
    left_reading: dict[Party, int] = field(default_factory=dict)
    last_write_seen: dict[Party, float] = field(default_factory=dict)  # a write of the party's went out or came back
    held_from: dict[Party, float] = field(default_factory=dict)  # when a party's last acquire returned the lock
    #: By party: the tokens of the holds its instance had, as each of its acquires ended (a hold begins only in an
    #: acquire, which keeps it or gives it on before it ends): none may be returned by a later acquire.
    had: dict[Party, set[int]] = field(default_factory=dict)
    hold_began: dict[str, float] = field(default_factory=dict)  # by instance: when the record last made it owner
    #: Leases handed off, by token: the heir's instance, the lease's end, when the handoff landed; and, once
    #: the heir has read it, its own wall clock as that read came back (a lease it may keep only if live then).
    handed: dict[int, tuple[str | None, float, float]] = field(default_factory=dict)
    handed_read_at: dict[int, float] = field(default_factory=dict)
    handed_generation: dict[int, int] = field(default_factory=dict)  # by token: the handoff write's generation
    trying: dict[Party, Try] = field(default_factory=dict)  # blocking acquires under way
    judged_at: float = -math.inf  # the time of the last check
    #: The parties by process, as of so many parties (the list only grows).
    by_proc: tuple[int, dict[Proc, list[Party]]] = field(default_factory=lambda: (0, {}))
    spec_prev: LockRecord | None = None  # the lock object as last applied, as the protocol reads it
    #: Each record the store applied, as :func:`read_record` read it, by its bytes: a read returns bytes some
    #: write applied, so a reply's record is read once, where it was applied.
    applied: dict[bytes, Rec] = field(default_factory=dict)

    def true_wall(self, at: float | None = None) -> float:
        return WALL0 + ((self.hub.now if at is None else at) - MONO0)

    def start_with(self, data: bytes) -> None:
        """The record an older version left in the store as the run begins."""
        self.record = read_record(data, legacy=True)
        self.spec_prev = LockRecord.decode(data)
        self.highest_store_token = self.record.token

    def note(self, event: Event) -> None:
        """Append to the history (never judges: this may run inside the lock's call stack)."""
        self.history.append(event)

    # ------------------------------------------------------------------ reading the history

    def _read_history(self) -> None:
        while self.read_up_to < len(self.history):
            e = self.history[self.read_up_to]
            self.read_up_to += 1
            if e.what == "request" and e.key == KEY and e.party is not None:
                self._tried(e)
                self.last_sent[e.party] = e.at
                self.last_read[e.party] = None
                if e.detail == "read":
                    self.peeked[e.party] = e.at
                self.in_flight[e.party] += 1
                if e.detail in ("write", "delete"):
                    self.left_reading.pop(e.party, None)  # a write of its own since, which may be the one that lands
                    self.last_write_sent[e.party] = self.last_write_seen[e.party] = e.at
                    self.write_sent_local[e.party] = e.local
                    tries = self.write_tries.get(e.party)
                    if tries is None or tries[0] != e.result:
                        self.write_tries[e.party] = tries = (e.result, [])
                    tries[1].append(e.local)
                    self.writes_open[e.party] += 1
            elif e.what == "request" and e.party is not None and e.detail == "list" and KEY.startswith(e.key):
                self.peeked[e.party] = e.at
            elif e.what == "reply" and e.party is not None and e.detail == "list: ok" and KEY.startswith(e.key):
                # A listing settles a check only at a generation the holder has seen; past it the beat reads,
                # and that read (if it comes back) is the look.
                if 0 < e.generation <= self.known_generation.get(e.party, 0):
                    self._look(e)
            elif e.what == "reply" and e.key == KEY and e.party is not None:
                self.in_flight[e.party] -= 1
                if e.detail.startswith(("write", "delete")):
                    self.writes_open[e.party] -= 1
                    self.last_write_seen[e.party] = e.at
                    if e.detail.endswith(": ok") or "PreconditionFailed" in e.detail:
                        self.write_tries.pop(e.party, None)  # settled: its next write is decided anew
                if e.detail in ("read: ok", "write: ok"):
                    self.known_generation[e.party] = max(self.known_generation.get(e.party, 0), e.generation)
                if e.detail == "read: ok":
                    self.last_read[e.party] = e.generation if self.in_flight[e.party] == 0 else None
                    self._look(e)
                    self._write_due(e)
                    self._asked(e.party, self._read(e.data) if e.data else None)
                elif not e.detail.endswith(": ok") and "PreconditionFailed" not in e.detail and e.party in self.trying:
                    self.trying[e.party].interrupted = True  # a store error past its retries ends it; its way out reads
                taken, clear = self.taken.get(e.party), self._unoverlapped(e)
                if taken is not None and e.detail == "read: ok" and e.sent >= taken[1] and clear:
                    self.read_since_taken.add(e.party)
                if e.detail == "read: ok":
                    self._heir_read(e)
            elif e.what == "applied":
                self._applied(e)
                if e.key == KEY and self.by_protocol:  # after the rules, which name a known fault more exactly
                    self._by_protocol(e.party, e.data, e.result)
            elif e.what == "begin" and e.party is not None:
                assert isinstance(e.result, Try)
                self.trying[e.party] = e.result
            elif e.what == "interrupt" and e.party in self.trying:
                t = self.trying[e.party]
                t.interrupted, t.cancelled_at = True, e.at if t.cancelled_at is None else t.cancelled_at
            elif e.what == "void" and e.party is not None:
                self.trying.pop(e.party, None)
            elif e.what == "acquire":
                self.trying.pop(e.party, None)
                read = self.last_read.get(e.party)
                if read is not None and e.seen is not None and not e.seen.held:
                    self.left_reading[e.party] = read
                self._acquire_ended(e)
                self._slot_left(e)
                if e.seen is not None and e.seen.token is not None:  # the hold it made, or the last one before it
                    self.had.setdefault(e.party, set()).add(e.seen.token)
            elif e.what == "lost":
                self._lost_while_gentle(e)

    def _applied(self, e: Event) -> None:
        party = e.party
        assert party is not None
        if e.key == FENCE_KEY:
            doc = decode_fence(e.data, key=e.key, generation=e.generation, url=None, max_bytes=1 << 20)
            if doc.highest < self.fence_highest:
                raise Violation(f"the fence took token {doc.highest} after {self.fence_highest}")
            self.fence_highest = doc.highest
            return
        if e.key != KEY:
            return
        if self.left_reading and self.left_reading.get(party) == e.result and not self._gives_back_its_slot(party, e):
            # design.md: a write cut off at its timeout may be applied later, only at the generation it matched; an
            # acquire that leaves while the object is still there writes the record again, so it can no longer land.
            raise Violation(
                f"{party.name}'s write landed at generation {e.result} after its acquire ended, which read the "
                "object at that generation as it left and left it there"
            )
        new, prev = read_record(e.data), self.record
        self.record = self.applied[e.data] = new
        self._asked(party, new)
        if new.token < self.highest_store_token:
            raise Violation(
                f"{party.name} wrote token {new.token} after {self.highest_store_token} (generation {e.generation})"
            )
        owner, before = new.owner, None if prev is None else prev.owner
        moved = owner is not None and (before is None or (owner.id, owner.instance) != (before.id, before.instance))
        if owner is not None and moved and prev is not None and new.token <= prev.token:
            raise Violation(f"{party.name} moved the lock to {owner.id} keeping token {new.token}")
        self.highest_store_token = max(self.highest_store_token, new.token)
        if moved and owner is not None and owner.instance == party.lock.instance and before is not None:
            self._take_in_time(party, before, new)
        w = new.waiter
        asking = None if owner is None or w is None or not w.asks else (owner.instance, new.token, w.instance)
        lapsed = (
            prev is not None
            and prev.waiter is not None
            and not prev.waiter.live(self.true_wall(e.at) + self.rules.skew / 2)
        )
        if asking != self.asking or lapsed:  # a new request, or one whose slot had ended and is live again
            self.asking, self.asking_since = asking, e.at
        if w is not None and w.instance == party.lock.instance and w.ttl != party.lock.timing.ttl:
            raise Violation(  # a registration or refresh by this version names the lease its waiter wants
                f"{party.name} wrote its waiter slot asking for a lease of {w.ttl} s, not its ttl "
                f"{party.lock.timing.ttl:g} s"
            )
        if w is not None and w.instance == party.lock.instance and w.since is None:
            raise Violation(  # this version's slot says when its acquire began: at equal rank the older has it
                f"{party.name} wrote its waiter slot without when it began waiting (waitingSince)"
            )
        t = self.trying.get(party) if self.trying else None
        asked = None if t is None else (t.priority, t.asks)
        ours = asked is not None and w is not None and w.instance == party.lock.instance and w.rank != asked
        if ours and w is not None and w.expires_at > party.left_behind_until:
            # The request is the acquire's: its priority ranks it, asks says whether it asks (a slot that may be an
            # earlier acquire's, left behind and applied late, as documented, is not judged).
            raise Violation(
                f"{party.name} wrote its waiter slot with the request (priority, asks) {w.rank}, where its "
                f"acquire asked for {asked}"
            )
        if w is not None:
            self.slot_at[e.generation] = w
        if prev is not None and prev.waiter is not None and w is not None and w.expires_at != prev.waiter.expires_at:
            if not self.slot_ends:
                self.slot_ends.append((-math.inf, prev.waiter.expires_at))
            self.slot_ends.append((e.at, w.expires_at))
        if owner is not None and owner.instance:
            self.issued.add((owner.instance, new.token))
        if owner is not None and owner.instance and (moved or prev is None or new.token != prev.token):
            self.hold_began[owner.instance] = e.at
        if prev is not None:
            self._slot_kept(party, prev, new, e.at)
            self._taken(party, prev, new, e.at)
        if not moved or owner is None or prev is None or before is None:
            return
        slot = prev.waiter
        if before.instance == party.lock.instance and owner.instance == (slot.instance if slot else None):
            self._handoff(party, slot, new)
            self.handed_generation[new.token] = e.generation

    def _gives_back_its_slot(self, party: Party, e: Event) -> bool:
        """Whether the write landing late is the way out's own give-back of the party's waiter slot: the record it
        replaced (:attr:`spec_prev`, the last applied: the object was at the generation it matched), its slot cleared,
        as :func:`~handofflock.core.protocol.decide_give_up_wait` makes it (the spec, its planted bugs off). Without
        that record (writes not judged by the protocol, and no record to start with) nothing is excused.

        design.md promises that a write of the acquire's that may land late (a create, take, retake, registration or
        refresh) cannot land for a party that has gone: the way out writes the record again where it finds the object
        still at that write's generation. A give-back is no such write. It gives the party nothing, and landing at the
        generation it matched it leaves exactly what the way out meant to leave, the record less the party's slot;
        writing the record again to stop it would keep the slot instead. So a give-back cut off at its timeout as the
        give-up's budget ran out (its read-back found the object not yet moved) may land after the acquire ended.
        Only that write is excused, by what it replaced and what it wrote; a registration or a take landing there
        is still caught."""
        prev, lock = self.spec_prev, party.lock
        try:
            new = LockRecord.decode(e.data)
        except LockRecordCorrupt:  # no give-back; the rules after this one say what it is
            return False
        if prev is None or new.nonce is None or not isinstance(e.result, int):  # the lock's writes carry a nonce
            return False
        with buggify.lifted():  # without ``pending`` only a record naming the party as waiter makes a GIVE_UP_WAIT
            give_back = decide_give_up_wait(
                prev, e.result, me=lock._me, now=self.true_wall(e.at), timing=lock.timing, nonce=new.nonce
            )
        return isinstance(give_back, Write) and give_back.kind is Kind.GIVE_UP_WAIT and give_back.record == new

    def _take_in_time(self, party: Party, before: Place, new: Rec) -> None:
        """A party takes another's lease only once it has ended by the taker's clock, skew allowed: decided
        (its token, a new owner's, counts the taker's clock in ms; else its lease's stamp) after
        ``expiresAt + max_clock_skew``."""
        assert new.owner is not None
        stamped = new.owner.expires_at - (new.ttl or self.rules.ttl)
        decided = max(stamped, new.token / 1000 if abs(new.token / 1000 - stamped) < 60 else stamped)
        if decided <= before.expires_at + self.rules.skew - EPSILON:
            raise Violation(
                f"{party.name} took the lock from {before.id} at {decided - WALL0:.3f} s by its own clock, "
                f"{before.expires_at + self.rules.skew - decided:.3f} s before its lease ended plus the skew"
            )

    def _by_protocol(self, party: Party, data: bytes, match: object = None) -> None:
        """The write is one :mod:`~handofflock.core.protocol` (the specification, as imported here, its planted
        bugs off) makes from the record it replaced, for the writer's identity and timing, sent at the time its
        lease or slot is stamped with (or, unstamped, as it went out or as it lands): a conditional write was
        decided on exactly that record. Its token may be any the protocol allows up to then (the decision came
        first). A write retried after its first attempt failed was decided by the time that attempt went out
        (its record, at the generation ``match``ed, was read by then) and each attempt is restamped as it goes out
        (``restamp``), later in true time but, by a clock stepped back between, earlier by the writer's: decided as
        the first went out, it may be sent as any attempt conditioned on that generation went out, whatever the
        clock said then. So a take before ``expiresAt + skew`` by the writer's clock, an heir's lease other than its
        slot's (or the owner's ttl where the slot names none), a renewal that changes more than the lease, are each
        caught."""
        prev, lock = self.spec_prev, party.lock
        try:
            self.spec_prev = new = LockRecord.decode(data)
        except LockRecordCorrupt as exc:
            raise Violation(f"{party.name} wrote a record the lock cannot read: {exc}") from exc
        me, timing, landed = lock._me, lock.timing, party.clock.time()
        # When it may have been sent, by the writer's clock: as its last write went out, or as it landed (a clock
        # may be stepped between).
        sent = {landed, self.write_sent_local.get(party, landed)}
        if new.owner is not None and new.ttl is not None:
            sent.add(new.owner.expires_at - new.ttl)
        if new.waiter is not None:
            sent.add(new.waiter.expires_at - timing.waiter_ttl)
        floor, nonce = 0 if prev is None else prev.token, new.nonce or ""
        tries = self.write_tries.get(party)
        tried = tries[1] if tries is not None and tries[0] == match else []  # its attempts' sends, first to last
        # When it may have been decided: as it was sent, as its first attempt went out, or when its token says (a
        # new owner's is its clock's ms).
        by_token = {new.token / 1000} if abs(new.token / 1000 - landed) < 60 else set()
        decided = sorted(sent | by_token | set(tried[:1]))

        def sends(now: float) -> list[float]:
            """When a write decided at ``now`` may have been sent, by the writer's clock: at or after it, or (decided
            as its first attempt went out) as any attempt went out."""
            later = [at for at in sorted(sent) if at >= now - EPSILON]
            return later + [at for at in tried if at < now - EPSILON] if tried and now == tried[0] else later

        # The request it waits with: its slot's, in the record written or (a take, say) in the one replaced.
        slot = next((r.waiter for r in (new, prev) if r is not None and r.waiter_instance == me.instance), None)
        request = ASKING if slot is None else slot.request
        since = new.waiter.since if new.waiter is not None else None

        def decisions(now: float) -> Iterator[object]:  # lazily: most writes match one of the first
            yield decide_renew(prev, 0, me=me, token=floor, now=now, timing=timing, nonce=nonce)
            for waiting in (True, False):
                yield decide_acquire(prev, 0, me=me, now=now, timing=timing, nonce=nonce, waiting=waiting,
                                     request=request, since=since)  # fmt: skip
            yield decide_release(prev, 0, me=me, token=floor, now=now, timing=timing, nonce=nonce)
            for pending in (None, 0):
                yield decide_give_up_wait(prev, 0, me=me, now=now, timing=timing, nonce=nonce, pending=pending)

        with buggify.lifted():
            for now in decided:
                for d in decisions(now):
                    for at in sends(now) if isinstance(d, Write) else ():
                        assert isinstance(d, Write)
                        w = restamp(d, now=at, nonce=nonce, timing=timing)
                        if w is not None and self._same(w, new, floor, me.yields, prev):  # sent after it was decided
                            return
            said = sorted({getattr(d, "kind", type(d).__name__) for d in decisions(decided[0])})
        raise Violation(
            f"{party.name}'s write is none the protocol makes from the record it replaced (it says "
            f"{', '.join(said)} at {decided[0] - WALL0:.3f} s by the writer's clock): {prev} -> {new}"
        )

    @staticmethod
    def _same(w: Write, new: LockRecord, floor: int, yields: bool, prev: LockRecord | None) -> bool:
        """Whether the protocol's write ``w`` is the record ``new`` that landed, up to what depends on when it
        was decided."""
        r = w.record
        if r.token != floor and floor < new.token:
            r = r.replace(token=new.token)  # decided before it was sent: a token of then
        # Each replaced only where it differs (a copy equal to the record compares as the record does).
        if w.kind is Kind.RENEW and not yields and r.declined != new.declined:
            r = r.replace(declined=new.declined)  # a decline depends on when it was decided
        if w.kind is Kind.FREE and prev is not None and new.waiter in (None, prev.waiter) and r.waiter != new.waiter:
            r = r.replace(waiter=new.waiter)  # a slot live then (dropping a live one: _slot_kept)
        return r == new

    def _unoverlapped(self, e: Event) -> bool:
        """Whether no write of the party's own on the lock overlapped the request answered by ``e`` (a waiter
        check leaves what its read found to a renewal that wrote meanwhile, and that renewal decides)."""
        assert e.party is not None
        return self.writes_open[e.party] == 0 and self.last_write_seen.get(e.party, -math.inf) < e.sent

    def _look(self, e: Event) -> None:
        assert e.party is not None
        if self._unoverlapped(e):
            self.looks.setdefault(e.party, []).append(e.sent)
        # The slot as it stood when the look went out (the store may have served it then), if it moved since.
        before = [end for at, end in self.slot_ends if at <= e.sent]
        moved_since = bool(self.slot_ends) and self.slot_ends[-1][0] > e.sent
        if before and moved_since and e.party.clock.time() - (self.hub.now - e.at) >= before[-1]:
            self.stale_look[e.party] = e.at

    def _heir_read(self, e: Event) -> None:
        """The heir's first read that shows its handoff: one the store answered at the handoff's generation or
        later (sent before the handoff landed, a read the store served late, while its client was paused, shows
        it as well)."""
        assert e.party is not None
        for token, (heir, _, _landed) in self.handed.items():
            shows = e.generation >= self.handed_generation.get(token, math.inf)
            if heir == e.party.lock.instance and shows and token not in self.handed_read_at:
                self.handed_read_at[token] = e.party.clock.time() - (self.hub.now - e.at)

    def _tried(self, e: Event) -> None:
        """A request on the lock by a party in a blocking acquire: its first bounds the acquire's
        ``waitingSince`` from above; a read that goes out where a write was due (:meth:`_write_due`), before the
        decided write would be stale and with nothing cutting the acquire short, is a violation: at once for a
        try that may not wait for the slot (it has no timeout), else once it is clear the acquire goes on
        (:meth:`_polled`)."""
        t = self.trying.get(e.party)
        if t is None:
            return
        if t.requests == 0 and t.since is not None:
            t.since = max(t.since, e.local)  # the wall clock may be stepped back between the two
        t.requests += 1
        if e.detail in ("write", "delete"):
            t.wrote = True
        elif e.detail == "read" and t.due is not None and e.local >= t.due_until - EPSILON:
            t.wrote = True  # the write it decided was dropped as it was sent (stale): counted as sent all the same
        elif e.detail == "read" and t.due is not None and e.local < t.due_until - EPSILON and not t.interrupted:
            if not t.slot_wait:
                raise Violation(t.due)  # it has no timeout, and nothing cut it short: no way out reads here
            t.polled = t.polled or (e.at, t.due)
        t.due = None

    def _read(self, data: bytes) -> Rec:
        """The record in the bytes a read returned (that an older version may have written): as it was read
        where the store applied it, or (the record the run began with) read now."""
        rec = self.applied.get(data)
        return read_record(data, legacy=True) if rec is None else rec

    def _write_due(self, e: Event) -> None:
        """What a blocking acquire must do next on the record a read of it returned, where only a write will do
        (design.md, *Waiting your turn*); its next request on the lock must then be that write:

        * a try that may not wait for the slot (``wait_for_slot=False``, no timeout), before its first write:
          it takes the lock, registers as the waiter, or raises ``LockContended`` at once; it never polls;
        * any blocking acquire that reads a live owner and a live slot whose request is of its own rank and began
          waiting after it did: the older request takes the slot from the younger.

        Not judged where the protocol's decision depends on what the checker does not follow (a suspect lease),
        nor where the slot is its own instance's (left by an earlier acquire: it may wait in it, and a way out reads
        it first). A twin's slot (our owner id, another instance) is another party's: the try raises, or registers
        over it; a registration the write spacing held until the owner's lease ended is dropped unsent, and the
        read after it is the way out's (``due_until``), as for anyone's slot."""
        party, rec = e.party, self._read(e.data) if e.data else None
        t = self.trying.get(party)
        if t is None or party is None:
            return
        lock, at = party.lock, e.local
        skew, ident = lock.timing.max_clock_skew, (lock.owner_id, lock.instance)
        owner, slot = (None, None) if rec is None else (rec.owner, rec.waiter)
        if rec is not None and owner is not None and rec.ttl is not None and owner.expires_at > at + rec.ttl + skew:
            return  # a suspect lease: the lock bounds it by when it first saw it
        live = owner is not None and (owner.id, owner.instance) != ident and at <= owner.expires_at + skew
        until = owner.expires_at + skew if live and owner is not None else math.inf  # a registration's last moment
        if not t.slot_wait and not t.wrote and (slot is None or (slot.id, slot.instance) != ident):
            self.counts["no_slot_wait_reads"] += 1
            who = "nobody" if owner is None else f"{owner.id} ({'live' if live else 'ended'})"
            t.due, t.due_until = (
                f"{party.name}'s acquire that may not wait for the slot (wait_for_slot=False, no timeout) read the "
                f"lock held by {who}, slot {slot and slot.id}, and read it again: it must take the lock, register "
                "or raise LockContended at once",
                until,
            )
        elif (
            live
            and owner is not None
            and slot is not None
            and (slot.id, slot.instance) != ident
            and slot.since is not None
            and t.since is not None
            and at <= min(owner.expires_at, slot.expires_at) + skew - EPSILON
            and slot.rank == (t.priority, t.asks)
            and t.since < slot.since - EPSILON
        ):
            self.counts["older_waiter_reads"] += 1
            t.due, t.due_until = (
                f"{party.name} read the slot held by {slot.id}, whose request of the same rank began waiting "
                f"{slot.since - t.since:.3f} s after its own, and read again instead of taking the slot",
                until,
            )

    def _polled(self) -> None:
        """An acquire that read again where a write was due (:meth:`_tried`) and goes on. On its way out
        (cancelled, timed out, released from another thread) a read of its give-up may follow any read, and
        the acquire ends within its give-up budget (and two seconds); one that goes on past that polled."""
        for p, t in self.trying.items():
            if t.polled is None or not p.alive or p.proc.frozen_until() > t.polled[0]:
                continue
            if self.hub.now - t.polled[0] > p.lock.give_up_budget + 2.0:
                raise Violation(t.polled[1])

    def _overdue(self) -> None:
        """A blocking acquire ends within its bound (``timeout`` and ``give_up_budget``, with the world's slack), and
        one that another thread cancelled within ``give_up_budget`` of the cancel (with the slack the world allows
        an operation that does not wait): judged while it runs, so one that never returns is judged too. A pause
        stretches any operation: not judged once its process has stood still since it began (since the cancel)."""
        now = self.hub.now
        for p, t in self.trying.items():
            if now - t.began > t.bound and p.alive and p.proc.frozen_until() == t.frozen <= t.began:
                raise Violation(
                    f"{p.name}'s acquire has run {now - t.began:.2f} s and goes on, past its bound of {t.bound:.2f} s"
                )
            late = t.cancelled_at is not None and now - t.cancelled_at > t.cancel_bound
            if late and t.cancelled_at is not None and p.alive and p.proc.frozen_until() <= t.cancelled_at:
                raise Violation(
                    f"{p.name}'s acquire was cancelled from another thread {now - t.cancelled_at:.2f} s ago and goes "
                    f"on, past its bound of {t.cancel_bound:.2f} s"
                )

    def _handoff(self, party: Party, slot: Place | None, new: Rec) -> None:
        """A handoff is judged at the instant it was decided: the heir's lease is stamped with the owner's
        wall clock as the write was sent (its expiry less its ttl), and the slot must be live then, by that
        same clock. The heir's lease is the one its slot asked for."""
        self.counts["handoffs"] += 1
        assert new.owner is not None
        self.handed[new.token] = (new.owner.instance, new.owner.expires_at, self.hub.now)
        length = new.ttl or self.rules.ttl
        stamped = new.owner.expires_at - length
        if slot is None or stamped > slot.expires_at + EPSILON:
            raise Violation(
                f"{party.name} handed the lock to {new.owner.id} at {stamped - WALL0:.3f} by its own clock, "
                f"{stamped - (slot.expires_at if slot else 0):.3f} s after its slot had ended"
            )
        # A slot that names no ttl (an older version's) gets the owner's own, as the protocol documents;
        # that this version's slots always name their waiter's ttl is judged where they are written.
        asked = slot.ttl if slot.ttl is not None else party.lock.timing.ttl
        if abs(length - asked) > EPSILON:
            raise Violation(
                f"{party.name} handed the lock to {new.owner.id} with a lease of {length:g} s, "
                f"where its slot asked for {asked:g} s"
            )

    def _taken(self, party: Party, prev: Rec, new: Rec, at: float) -> None:
        """Note a hold that another party's write ended (the owner's own writes end it by its hand)."""
        before = prev.owner
        if before is None or party.lock.instance == before.instance:
            return
        if new.owner is not None and (new.owner.instance, new.token) == (before.instance, prev.token):
            return
        for p in self.parties:
            if p.lock.instance == before.instance and p.lock.token == prev.token:
                self.taken[p] = (prev.token, at)
                self.read_since_taken.discard(p)

    def _slot_kept(self, party: Party, prev: Rec, new: Rec, at: float) -> None:
        """A live waiter slot leaves the record only by its waiter's hand, by a handoff to it, or for another
        request: never silently (a renewal, a release or a take that drops it)."""
        slot = prev.waiter
        if slot is None or not slot.live(self.true_wall(at) + self.rules.skew):
            return  # ended by every clock: anyone may clear it
        if new.waiter is not None or party.lock.instance == slot.instance:
            return  # still named, or replaced by another request; or its own give-up
        if new.owner is not None and new.owner.instance == slot.instance:
            return  # handed to it, or taken by it
        raise Violation(
            f"{party.name}'s write dropped the live waiter slot of {slot.id} "
            f"({slot.expires_at - self.true_wall(at):.2f} s left)"
        )

    # ------------------------------------------------------------------ public API results

    def _acquire_ended(self, e: Event) -> None:
        party, seen, result = e.party, e.seen, e.result
        assert party is not None and seen is not None
        lock = party.lock
        if isinstance(result, Acquired) or result is True:  # acquire() returns an Acquired (== True)
            token = seen.token or 0
            self.held_from[party] = e.at
            if (lock.instance, token) not in self.issued:
                raise Violation(f"{party.name} acquired with token {token}, which no write gave this instance")
            if token in self.had.get(party, ()):
                # A hold declared lost or released is over: the record naming this instance again (a write of that
                # hold applied late) is taken back with a new token (design.md, row 3), never returned as it was,
                # since a writer left over from that hold still fences with its token.
                raise Violation(
                    f"{party.name}'s acquire returned token {token}, which a hold of its instance had before: "
                    "a hold it no longer counts on comes back only with a new token"
                )
            handed, read_at = self.handed.get(token), self.handed_read_at.get(token, -math.inf)
            if handed is not None and handed[0] == lock.instance and read_at >= handed[1]:
                # Handed a lease it first read once the lease had run out (it was paused): a hold that
                # lapsed; the lock takes it back with a new token, never keeps the old one.
                raise Violation(
                    f"{party.name} acquired with the token handed to it ({token}), whose lease had run out "
                    f"{read_at - handed[1]:.2f} s before it first read it, by its own clock"
                )
            # acquire() returns a lease counted from the write that made it, renewed at once if little is
            # left: healthy, unless the process stood still since its last request on the lock went out.
            sent = self.last_sent.get(party, MONO0)
            if seen.held and not seen.healthy and seen.frozen_until <= sent:
                raise Violation(
                    f"{party.name}'s acquire returned a lock that is not healthy (token {token}); "
                    f"its last request went out {e.at - sent:.2f} s before, and it has not stood still since"
                )
            return
        if seen.held:
            raise Violation(f"{party.name}'s acquire ended without the lock ({result!r}) and it holds the lock")
        r = self.record
        owner = None if r is None else r.owner
        live = owner is not None and owner.live(self.true_wall(e.at), self.rules.skew)
        if live and owner is not None and owner.instance == lock.instance and owner.expires_at > seen.left_behind_until:
            # Its way out may give the lock back in the background (a release after a cancelled
            # acquire, refused by a 429, is retried there): watched from here (see :meth:`check`).
            self.left_owning[party] = e.at

    def _lost_while_gentle(self, e: Event) -> None:
        assert e.party is not None and e.seen is not None
        if not self.rules.gentle or e.seen.frozen_until >= MONO0:
            return
        if self._past_the_promise(e.party, e.at):
            # design.md promises an owner at this ttl survives two 429s in a row, not more: past that a
            # loss is the documented risk of the 1 s rule (three writers may draw three in a row), or of
            # 429s met with a stalled read or a waiter's writes on top.
            self.counts["lost_past_two_429s"] += 1
            return
        raise Violation(f"{e.party.name} lost its lock under survivable faults only: {e.detail}")

    def _unhealthy_while_gentle(self, parties: list[Party]) -> None:
        """Under survivable faults only, a holder that never stood still renews in time: it counts itself healthy
        for as long as it holds the lock (before any loss, it is unhealthy from ``renew_deadline`` on: judged
        there, as a loss is by :meth:`_lost_while_gentle`, with the same failures allowed). A hold its acquire
        has not returned yet is judged by what the acquire returns (an heir that reads its handoff late is
        handed a lease it must renew at once)."""
        if not self.rules.gentle:
            return
        for p in parties:
            lock = p.lock
            if p.proc.crashed or not lock.is_held or lock.healthy or p.proc.frozen_until() >= MONO0 or p.in_acquire:
                continue
            if self._past_the_promise(p, self.hub.now):
                continue
            raise Violation(
                f"{p.name} holds the lock (token {lock.token}) and counts itself unhealthy under survivable faults only"
            )

    def _past_the_promise(self, party: Party, until: float) -> bool:
        """Whether ``party``'s hold met more failures in a row, up to ``until``, than design.md promises an owner
        at a gentle world's ttl survives: counted from its last write on the lock that landed in its hold (or the
        hold's start), two from a relaxed write spacing, one from a spacing that earlier 429s had widened (its
        renewal is then held back to ``Timing.backoff_until``, which leaves room for one more write, not two).

        A failure is a write refused with a 429, or a request on the lock that stalled (a read of a second or
        more, or one cut off at its timeout: a stalled read is promised alone, not on top of a 429). A write
        refused on its precondition (a waiter wrote) counts once one of those came before it, or from a widened
        spacing: from a relaxed one, before any failure, the renewal is sent again at once with its margin whole;
        after one, or held back by a widened spacing, it goes at the last moment that leaves room for only what
        is promised, and the read and write a 412 costs are more. Only the hold's own
        requests count (a waiter's refused refreshes say nothing of how its hold went), but every write of the
        party's widens or relaxes its spacing (one gate per process and object).

        A read of the hold's still unanswered at ``until`` that went out :data:`STALLED` or more before has stalled
        already: its reply, whenever it comes, is one of a second or more, or the cut at its timeout (a gentle
        world's store answers a read in two latencies or slowly, and refuses none). It counts from then, as its
        reply will, not only once the reply is in: a renewal waiting on it may meet its deadline first."""
        least, began = self.rules.spacing, self.hold_began.get(party.lock.instance, -math.inf)
        spacing, failures, hurt, widened, started = least, 0, False, False, False
        reading: Counter[float] = Counter()  # the hold's reads on the lock not answered yet, by when each went out
        for e in self.history:
            if e.at > until:
                break
            if not started and e.at >= began:
                started, widened = True, spacing > least
            if e.party is not party or e.key != KEY:
                continue
            if e.what == "request" and e.detail == "read" and started:
                reading[e.at] += 1
                continue
            if e.what != "reply":
                continue
            if e.detail.startswith("read:") and reading[e.sent] > 0:
                reading[e.sent] -= 1
            refused = e.detail.startswith("write:") and "429" in e.detail
            if e.detail == "write: ok":
                relaxed = spacing * 0.75
                spacing = least if relaxed < least + 0.05 else relaxed
                if started:
                    failures, hurt, widened = 0, False, spacing > least
                continue
            if refused:
                spacing = min(max(2 * spacing, least, 1.0), WIDEST_SPACING)
            if not started or e.sent < began:
                continue
            stalled = "cut off at its timeout" in e.detail or (e.detail == "read: ok" and e.at - e.sent >= STALLED)
            if refused or stalled:
                failures, hurt = failures + 1, True
            elif e.detail.startswith("write:") and "PreconditionFailed" in e.detail and (hurt or widened):
                failures += 1
        failures += sum(n for sent, n in reading.items() if until - sent >= STALLED)
        return failures > (1 if widened else 2)

    def _slot_left(self, e: Event) -> None:
        """An acquire that ended without the lock left no slot behind (but one it documents it may leave)."""
        party, seen, r = e.party, e.seen, self.record
        assert party is not None and seen is not None
        if seen.crashed or seen.held or r is None or r.waiter is None:
            return
        if r.waiter.expires_at <= seen.left_behind_until:
            return  # documented: it may stay, and ends by itself
        if not r.waiter.live(self.true_wall(e.at) - self.rules.skew):
            return  # not a bug: a slot that has ended (by every clock) holds nobody back, though it still names us
        if seen.frozen_until > seen.left_wait_at - 10 * self.rules.ttl:
            return
        instances = (r.waiter.instance, r.owner and r.owner.instance)
        if instances[0] == party.lock.instance and instances[1] != party.lock.instance:
            raise Violation(f"{party.name} left acquire and its waiter slot is still in the record")

    # ------------------------------------------------------------------ between steps

    def check(self) -> None:
        """Judge the history that came in; then: no party counts itself healthy unsoundly, and a live waiter
        slot names no party that left its acquire.

        A party is judged as it runs: a suspended one once it resumes (its first check is the first
        step after), since ``healthy`` must be false then if its lease ran out meanwhile.

        After a step of one process's threads at the instant of the last check, which added to the history only
        what its own parties did (no write applied: the record is as it was), only that process's parties can
        have changed: only they are judged again (what the others' rules read is as it was when they passed)."""
        now, ran, start = self.hub.now, self.hub.ran, self.read_up_to
        if start < len(self.history):
            self._read_history()
        same = now == self.judged_at and ran is not None and self._only_of(ran, start)
        self.judged_at, r = now, self.record
        parties = self._parties_of(ran) if same and ran is not None else self.parties
        wall = self.true_wall()
        for p in parties:
            proc = p.proc
            if not proc.crashed and now >= proc.suspended_until and p.lock.healthy and not self._sound(p, wall):
                raise Violation(self._unsound(p))
        if self.left_owning:
            self._left_owning()
        self._unhealthy_while_gentle(parties)
        if self.trying:
            self._polled()
            self._overdue()
        if self.read_since_taken:
            self._noticed_taken()
        self._request_heard(parties)
        self._heard_of_this_hold(parties)
        self._looks_while_holding(parties)
        if r is None or r.waiter is None or not r.waiter.live(wall - self.rules.skew):
            return
        for p in parties:
            if not p.alive or p.lock.instance != r.waiter.instance or p.in_acquire:
                continue
            if r.waiter.expires_at <= p.left_behind_until:
                continue
            grace = p.lock.give_up_budget + 1.0
            if now - p.left_wait_at > grace and now >= p.proc.frozen_until():
                raise Violation(
                    f"the waiter slot names {p.name}, which left its acquire {now - p.left_wait_at:.2f} s ago"
                )

    def _only_of(self, proc: Proc, start: int) -> bool:
        """Whether the history from ``start`` holds only what parties of ``proc`` did, and no write applied."""
        for i in range(start, self.read_up_to):
            e = self.history[i]
            if e.what == "applied" or e.party is None or e.party.proc is not proc:
                return False
        return True

    def _parties_of(self, proc: Proc) -> list[Party]:
        """The parties whose threads run in ``proc``."""
        if len(self.parties) != self.by_proc[0]:
            by_proc: dict[Proc, list[Party]] = {}
            for p in self.parties:
                by_proc.setdefault(p.proc, []).append(p)
            self.by_proc = (len(self.parties), by_proc)
        return self.by_proc[1].get(proc, [])

    def _asked(self, party: Party, rec: Rec | None) -> None:
        """``party`` knows ``rec`` (it read or wrote it): a waiter asking there it may hear, as it holds."""
        if rec is None or rec.waiter is None or not rec.waiter.asks or rec.waiter.instance == party.lock.instance:
            return
        self.asked.setdefault(party.lock.instance, set()).add(rec.waiter.id)

    def _looks_while_holding(self, parties: list[Party]) -> None:
        """A holder looks at the lock (reads it, or lists its prefix) every ``waiter_check_interval`` (design.md:
        the owner's check), give or take a read that stalls: judged from when its acquire returned, unless its
        process has stood still since its last look."""
        now = self.hub.now
        for p in parties:
            lock = p.lock
            if p.proc.crashed or not lock.is_held or p.in_acquire or p not in self.held_from:
                continue
            since = max(self.peeked.get(p, -math.inf), self.held_from[p])
            if now - since > 2 * lock.timing.waiter_check_interval + 5.0 and p.proc.frozen_until() < since:
                raise Violation(
                    f"{p.name} holds the lock (token {lock.token}) and has not looked at it for {now - since:.2f} s "
                    f"(its waiter check interval is {lock.timing.waiter_check_interval:g} s)"
                )

    def _heard_of_this_hold(self, parties: list[Party]) -> None:
        """A holder hears only the requests of its hold: a waiter's, once a record it read or wrote since its last
        hold ended showed that waiter asking (a request of an earlier hold, lost or released, goes with it)."""
        for p in parties:
            lock = p.lock
            if not lock.is_held:
                if lock.instance in self.holding:  # its hold ended: what it knew of waiters went with it
                    self.holding.discard(lock.instance)
                    self.asked.pop(lock.instance, None)
                continue
            self.holding.add(lock.instance)
            request = lock.release_request
            if p.proc.crashed or not lock.release_requested or request is None:
                continue
            if request.requester not in self.asked.get(lock.instance, ()):
                raise Violation(
                    f"{p.name} holds the lock (token {lock.token}) and hears a request from {request.requester}, "
                    "whom no record it read or wrote since its last hold ended showed asking"
                )

    def _request_heard(self, parties: list[Party]) -> None:
        """A live waiter's request is heard by its holder (``release_requested``) by the end of the second look
        at the lock (a read of it, or a listing of its prefix at a generation the holder has seen, that no write
        of its own overlapped) that went
        out after the request landed, its
        acquire returned and its minimum hold ended by its clock, once its other requests on the lock are
        answered. A look that may have been served before the slot's last refresh, and came back after the slot
        as it was had ended, shows the request gone: the holder then rightly withdraws it, and the count starts
        again from that look's reply. (One look may be a beat of grouped checks that leaves the lock to a renewal
        falling due, which need not read.)"""
        r = self.record
        if r is None or r.owner is None or r.waiter is None or self.asking is None:
            return
        if r.waiter.instance == r.owner.instance or not r.waiter.live(self.true_wall() - self.rules.skew):
            return
        for p in parties:
            lock = p.lock
            if lock.instance != r.owner.instance or not lock.is_held or p.proc.crashed or lock.token != r.token:
                continue
            if lock.release_requested or self.in_flight[p] != 0:
                continue  # heard; or not yet judged, a request of its own on the lock under way
            if p.in_acquire:
                continue  # its acquire has not returned (it holds as it settles the hold): looks count from then
            local = p.clock.time()
            if not r.waiter.live(local):
                continue  # ended by the holder's clock: a request it no longer stands for
            known = self.slot_at.get(self.known_generation.get(p, 0))
            if known is not None and known.instance == r.waiter.instance and not known.live(local):
                # The slot as the holder last knew it (a refresh since unread) has ended by its clock: it rightly
                # withdraws the request, and hears it again from a look that shows the refresh.
                self.stale_look[p] = self.hub.now
                continue
            held = r.held_since if r.held_since is not None else -math.inf
            ends = self.hub.now + (held + lock.timing.min_hold - local)  # the hold's end, hub time
            since = max(self.asking_since, ends, self.held_from.get(p, math.inf), self.stale_look.get(p, -math.inf))
            looks = sum(1 for sent in self.looks.get(p, ()) if sent >= since)
            if looks >= 2:
                raise Violation(
                    f"{p.name} holds the lock and has not heard {r.waiter.id}'s request, standing since "
                    f"{self.hub.now - since:.2f} s, after {looks} looks at the lock"
                )

    def _noticed_taken(self) -> None:
        """A holder whose lease another party took has counted it lost by the end of its first read that went
        out after the take (once its other requests on the lock are answered: a renewal holding the lock's
        mutex through its own write and read may be the one that says so)."""
        for p in list(self.read_since_taken):
            token, at = self.taken[p]
            if not p.alive or not p.lock.is_held or p.lock.token != token:
                self.read_since_taken.discard(p)
                del self.taken[p]
            elif self.in_flight[p] == 0:
                raise Violation(
                    f"{p.name} still holds the lock (token {token}) after reading it taken "
                    f"{self.hub.now - at:.2f} s after it was taken"
                )

    def _left_owning(self) -> None:
        """A party whose acquire ended while the record names it its live owner writes again (gives it back)
        within the give-up budget, or the lock is leaked: held on record by an instance that thinks it is idle."""
        r = self.record
        owner = None if r is None else r.owner
        for p, ended in list(self.left_owning.items()):
            named = owner is not None and owner.instance == p.lock.instance and owner.live(self.true_wall())
            if not named or not p.alive or p.lock.is_held or self.last_write_sent.get(p, MONO0) > ended:
                del self.left_owning[p]
            elif self.hub.now - ended > p.lock.give_up_budget + 1.0 and self.hub.now >= p.proc.frozen_until():
                raise Violation(
                    f"{p.name}'s acquire ended {self.hub.now - ended:.2f} s ago without the lock, and the object "
                    f"still names it as a live owner (token {r.token if r else None})"
                )

    def _sound(self, p: Party, wall: float) -> bool:
        """Whether ``p`` may count itself healthy at ``wall`` (true time): the record names it, with its token,
        as an owner whose lease no other party may take yet."""
        r = self.record
        if r is None or r.owner is None or r.owner.instance != p.lock.instance or r.token != p.lock.token:
            return False
        return wall - (r.owner.expires_at + self.rules.skew / 2) <= 0

    def _unsound(self, p: Party) -> str:
        """Why ``p`` must not count itself healthy now (where :meth:`_sound` says it may not)."""
        r = self.record
        me = p.lock.instance
        if r is not None and r.owner is not None and r.owner.instance == me and r.token == p.lock.token:
            late = self.true_wall() - (r.owner.expires_at + self.rules.skew / 2)
            after = " after a host suspend" if p.proc.suspended_for else ""
            return (
                f"{p.name} counts itself healthy{after} {late:.3f} s after another party may take the lock "
                f"(token {r.token})"
            )
        # No exemption for a twin (our owner id, another instance): it is another party, and waits for our lease.
        who = "nobody" if r is None else f"{r.owner and r.owner.id} (token {r.token})"
        after = " after a host suspend" if p.proc.suspended_for else ""
        return f"{p.name} counts itself healthy{after} with token {p.lock.token}, but the object names {who}"


class _Swallowed(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.caught: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.caught.append(f"{record.exc_info[1]!r} ({record.getMessage()[:120]})")


@contextmanager
def swallowed() -> Iterator[list[str]]:
    """The exceptions the library logs and goes on past while the block runs (its scheduler loop, a duty,
    a signal receiver): where it must not stop, it catches them, so no thread dies of them. In a
    simulated world none is expected (a fault reaches the lock as a typed error it handles), so each is
    a verdict of its own. Capturing never shows the log: a quiet logger stays quiet."""
    log, handler = logging.getLogger("handofflock"), _Swallowed()
    level, propagate = log.level, log.propagate
    if not log.isEnabledFor(logging.ERROR):
        log.setLevel(logging.ERROR)
        log.propagate = False
    log.addHandler(handler)
    try:
        yield handler.caught
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
