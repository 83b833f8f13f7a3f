"""An exhaustive check of the pure protocol (:mod:`handofflock.core.protocol`), in the spirit of TLC.

No lock, no threads: an abstract store (one record and its generation), true time that passes
in jumps (below), and 2 or 3 parties, each with a clock of its own (an offset within the skew), a
ttl of its own and a waiter request of its own (asking or patient, a priority). Each party is a
small state machine whose steps are the lock's: read and decide (the real ``decide_*`` functions,
at the party's clock); send the decided write at once or later, restamped at the send
(:func:`~handofflock.core.protocol.restamp`), or dropped there once its decision no longer holds;
and learn the outcome: the reply seen, the reply lost (the write applied or refused), or the
request cut off while the store applies it later (a late commit). A reply that never came is
resolved as the lock resolves it: a read for the write's nonce; a release passes the write as
``attempted``, a give-up the generation a write of its may still land on (``pending``). A party
counts its lease valid as the lock does (:func:`~handofflock.lock.handoff.lease_until`).

Breadth-first over every interleaving of the parties' steps, the late writes' landing and the
passing of time, with visited states hashed: the first violation found has a shortest
counterexample. Depth counts protocol steps: time passes in one step to the next moment at which
some rule's comparison flips (a lease's end, with or without the skew, a slot's, ...), so an
expiry costs one step, not one per second. Faults (a write sent later than decided, a lost reply,
a late commit) are bounded per path (``FAULTS``), as a nemesis's budget.

Invariants, on every state and on every write the store applies:

* a party that counts its lease valid is the one the record names, with its token: so there is
  at most one live owner, twins included, and an owner fences only with a token the store issued
  to it (a party takes up a token only from a record that names it with it);
* tokens never fall, and rise whenever the owner changes;
* a handoff goes only to a slot live by the releaser's clock as it sends;
* a waiter slot live by the writer's clock is never dropped by another's write: the write keeps
  it, hands the lock to its waiter, or is a request that outranks it taking the slot.

What it leaves out: the write gate, retries of one write, the scheduler, the library's threads
and I/O (the simulation covers those), and more than one unanswered write per party at a time.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Any, TypeVar

from ...core import protocol as p
from ...core.record import ASKING, Holder, LockRecord, Waiter, WaiterRequest
from ...core.timing import Timing
from ...lock.handoff import lease_until
from .bugs import planted

TTL, SKEW, HORIZON, MAX_STARTS, FAULTS = 3.0, 1.0, 9.0, 2, 1


@dataclass(frozen=True)
class Role:
    """A party as configured: who it is, its clock's offset from true time, its ttl, its request."""

    me: p.Me
    offset: float = 0.0
    ttl: float = TTL
    request: WaiterRequest = ASKING

    @cached_property
    def timing(self) -> Timing:
        return Timing.build(
            ttl=self.ttl, renew_deadline=self.ttl * 2 / 3, waiter_ttl=TTL, max_clock_skew=SKEW, min_hold=0.0
        )


#: The configurations checked: two parties whose clocks are a full skew apart and whose ttls
#: differ; two instances of one owner id (a restarted job and its predecessor); and (``long``)
#: three distinct parties, the third patient but of a higher priority.
CONFIGS: dict[str, tuple[Role, ...]] = {
    "2 parties": (Role(p.Me("a", "a1"), -0.5), Role(p.Me("b", "b1"), 0.5, ttl=4.0)),
    "twins": (Role(p.Me("a", "a1"), -0.5), Role(p.Me("a", "a2"), 0.5)),
    "3 parties": (
        Role(p.Me("a", "a1"), -0.5),
        Role(p.Me("b", "b1"), 0.5),
        Role(p.Me("c", "c1"), 0.0, request=WaiterRequest(asks=False, priority=1)),
    ),
}
DEPTHS = {"2 parties": 8, "twins": 8}
LONG_DEPTHS = {"2 parties": 11, "twins": 11, "3 parties": 8}


@dataclass(frozen=True)
class Party:
    phase: str = "idle"  # idle, acquire, give_up, held, release
    pending: p.Write | None = None  # decided, not yet sent
    unanswered: p.Write | None = None  # sent, and its reply never came: resolved by a read
    maybe: int | None = None  # the generation an unanswered write of this acquire may still land on
    waiting: bool = False
    since: float | None = None  # when this acquire began, by the party's clock
    token: int = 0
    valid_until: float = -1.0  # true time
    known: tuple[LockRecord | None, int] | None = None  # the holder's last view of the record
    starts: int = 0

    def __hash__(self) -> int:  # a party is hashed in every state that shares it
        return _hash_once(self, _PARTY_FIELDS)


@dataclass(frozen=True)
class State:
    record: LockRecord | None
    generation: int
    now: float
    parties: tuple[Party, ...]
    late: tuple[tuple[int, p.Write, float], ...] = field(default=())  # cut off (party, write, sent at by its clock)
    faults: int = 0  # how many more writes may be sent late, lose their reply or be cut off

    def __hash__(self) -> int:  # the search hashes each state several times
        return _hash_once(self, _STATE_FIELDS)


_V = TypeVar("_V", Party, State)
_PARTY_FIELDS, _STATE_FIELDS = attrgetter(*Party.__dataclass_fields__), attrgetter(*State.__dataclass_fields__)


def _hash_once(value: Party | State, fields: attrgetter[tuple[Any, ...]]) -> int:
    """The dataclass's own hash (of its ``fields``, in order), kept on the value once computed."""
    cached: int | None = value.__dict__.get("_hash")
    if cached is None:
        cached = hash(fields(value))
        object.__setattr__(value, "_hash", cached)
    return cached


def _with(value: _V, **changes: Any) -> _V:
    """``dataclasses.replace`` for a party or a state, at a fraction of its cost (the search makes hundreds
    of thousands): the fields copied, ``changes`` set; the kept hash is not carried over."""
    new = object.__new__(type(value))
    fields = new.__dict__
    fields.update(value.__dict__)
    fields.pop("_hash", None)
    fields.update(changes)
    assert len(fields) == len(value.__dataclass_fields__), f"no such field: {changes}"
    return new


class Broken(Exception):
    """A write that breaks an invariant; ``step`` says who made it, and how."""

    step = ""


def _same(a: Holder | Waiter | None, b: Holder | Waiter | None) -> bool:
    """Whether two places (owner or waiter) name one party: id and instance."""
    return a is not None and b is not None and (a.id, a.instance) == (b.id, b.instance)


def _apply(s: State, w: p.Write, i: int, roles: tuple[Role, ...], sent: float) -> tuple[State, bool]:
    """The store applies ``w``, sent by party ``i`` at ``sent`` by its clock, if its precondition holds; a write
    that breaks an invariant raises. What the writer may write is judged by its clock as it sent the write:
    a request cut off may land later, on the record it was decided on (the precondition) but not at its time."""
    if w.if_generation_match not in (s.generation, -1):
        return s, False
    prev, new, who, local = s.record, w.record, roles[i].me.instance, sent
    if prev is not None:
        if new.token < prev.token:
            raise Broken(f"{w.kind.value} by {who} lowered the token to {new.token}")
        if new.owner is not None and not _same(prev.owner, new.owner) and new.token <= prev.token:
            raise Broken(f"{w.kind.value} by {who} moved the lock to {new.owner.instance} keeping token {new.token}")
        slot = prev.waiter
        if w.kind is p.Kind.HANDOFF and (slot is None or local >= slot.expires_at):
            raise Broken(f"{who} handed the lock to a slot that had ended by its clock (at {slot and slot.expires_at})")
        if (
            slot is not None
            and slot.live(local)
            and slot.instance != who
            and not _same(new.waiter, slot)
            and not _same(new.owner, slot)
            and not (w.kind is p.Kind.BECOME_WAITER and new.waiter is not None and _outranks(new.waiter, slot))
        ):
            raise Broken(f"{w.kind.value} by {who} dropped {slot.instance}'s live waiter slot")
    return _with(s, record=new, generation=s.generation + 1), True


def _outranks(new: Waiter, old: Waiter) -> bool:
    """Whether the request that wrote ``new`` may take the slot from ``old``'s (the protocol's own rule)."""
    return p._takes_slot(new.request, new.since, old)


def _lease_end(r: LockRecord | None) -> float:
    return -1.0 if r is None or r.owner is None else r.owner.expires_at


def _held(party: Party, rec: LockRecord, gen: int, valid_until: float, phase: str = "held") -> Party:
    return _with(
        party, phase=phase, pending=None, unanswered=None, maybe=None, waiting=False, token=rec.token,
        valid_until=valid_until, known=(rec, gen),
    )  # fmt: skip


def _after(s: State, i: int, role: Role, party: Party, w: p.Write, landed: bool, record: LockRecord | None) -> Party:
    """Party ``i`` once it knows whether its write ``w`` landed (``record``: the store's record then)."""
    local, gen = s.now + role.offset, s.generation
    holder = party.phase in ("held", "release")
    if not landed:
        if holder:  # a renewal or a release refused: read, and decide from what is there
            return _with(party, known=(record, gen))
        return party
    kind = w.kind
    if kind in (p.Kind.CREATE, p.Kind.TAKE, p.Kind.RETAKE):
        assert record is not None
        return _held(party, record, gen, lease_until(record, s.now, local, role.timing))
    if kind in (p.Kind.BECOME_WAITER, p.Kind.REFRESH_WAITER):
        return _with(party, waiting=True, maybe=None)
    if kind is p.Kind.RENEW:
        assert record is not None
        return _held(party, record, gen, lease_until(record, s.now, local, role.timing))
    return Party(starts=party.starts)  # a give-up, a handoff or a free: done


def _next_time(s: State, roles: tuple[Role, ...]) -> float | None:
    """The next true time at which some decision or count can change (None: none before ``HORIZON``).

    Every rule compares a party's clock with a time in the record or in the party (a lease's end,
    with or without the skew; a slot's end, its refresh point; a decision's ``until``; the end of
    a party's valid lease): the moment that comparison flips, and a quarter second past it (for
    the strict ones), by each party's clock. Time jumps to the earliest of them, so an expiry
    costs one step of depth, not one per second; no decision or count differs between two such moments.
    """
    marks: set[float] = set()
    r = s.record
    if r is not None and r.owner is not None:
        marks |= {r.owner.expires_at, r.owner.expires_at + SKEW}
    if r is not None and r.waiter is not None:
        marks |= {r.waiter.expires_at, r.waiter.expires_at + SKEW, r.waiter.expires_at - TTL / 2}
    for party in s.parties:
        if party.pending is not None and party.pending.until is not None:
            marks.add(party.pending.until)
    times = {m - role.offset + nudge for m in marks for role in roles for nudge in (0.0, 0.25)}
    times |= {party.valid_until for party in s.parties}
    ahead = [t for t in times if s.now < t <= HORIZON]
    return min(ahead) if ahead else None


def steps(
    s: State, roles: tuple[Role, ...], stamped: dict[tuple[p.Write, float, str], p.Write | None]
) -> list[tuple[str, State, int]]:
    """Every next state: (what happens, the state, its cost in depth). ``stamped``: restamped writes by what
    they were restamped from (``restamp`` is pure, and the search restamps one write at one time ten times over)."""
    out: list[tuple[str, State, int]] = []

    def step(i: int, what: str, party: Party, state: State = s) -> None:
        parties = (*state.parties[:i], party, *state.parties[i + 1 :])
        out.append((f"{roles[i].me.instance} {what}", _with(state, parties=parties), 1))

    def send(i: int, party: Party, what: str = "") -> None:
        """Party ``i`` sends its decided write now: the reply seen, the reply lost, or cut off to land later."""
        assert party.pending is not None
        role = roles[i]
        # The nonce tells this write from every other that could be in the record: the party's, on this generation.
        nonce = f"{i}.{party.pending.if_generation_match}.{party.pending.kind.value}"
        key = (party.pending, s.now, nonce)  # the nonce names the party, so its clock and timing
        if key in stamped:
            w = stamped[key]
        else:
            w = stamped[key] = p.restamp(party.pending, now=s.now + role.offset, nonce=nonce, timing=role.timing)
        sent = _with(party, pending=None)
        if w is None:
            step(i, f"{what}drops its {party.pending.kind.value}: the decision no longer holds", sent)
            return
        local = s.now + role.offset
        try:
            s2, ok = _apply(s, w, i, roles, local)
        except Broken as exc:
            exc.step = f"{role.me.instance} {what}{w.kind.value}s"
            raise
        verb = f"{what}{w.kind.value}s" + ("" if ok else ": 412")
        step(i, verb, _after(s2, i, role, sent, w, ok, s2.record), s2)
        if s.faults:
            step(i, f"{verb}, the reply lost", _with(sent, unanswered=w), _with(s2, faults=s.faults - 1))
            cut = _with(s, late=(*s.late, (i, w, local)), faults=s.faults - 1)
            step(i, f"{what}{w.kind.value}: cut off", _with(sent, unanswered=w), cut)

    def decided(i: int, what: str, party: Party, d: p.Write) -> None:
        """Party ``i`` decided ``d``: it sends it at once, or (a fault) later, after others' steps and time's."""
        if s.faults:
            later = _with(s, faults=s.faults - 1)
            step(i, f"{what}, decides {d.kind.value} (sent later)", _with(party, pending=d), later)
        send(i, _with(party, pending=d), f"{what}, ")

    later = _next_time(s, roles)
    if later is not None:
        out.append((f"time passes to {later:g}", _with(s, now=later), 1))
    for k, (j, w, sent) in enumerate(s.late):
        rest = _with(s, late=s.late[:k] + s.late[k + 1 :])
        try:
            s2, ok = _apply(rest, w, j, roles, sent)
        except Broken as exc:
            exc.step = f"{roles[j].me.instance}'s cut-off {w.kind.value} lands"
            raise
        out.append((f"{roles[j].me.instance}'s cut-off {w.kind.value} {'lands' if ok else 'fails: 412'}", s2, 1))
    for i, (role, party) in enumerate(zip(roles, s.parties, strict=True)):
        me, local, timing = role.me, s.now + role.offset, role.timing
        if party.pending is not None:
            send(i, party)
            continue
        rec, gen = s.record, s.generation
        if party.unanswered is not None:  # read back: did it land?
            w = party.unanswered
            landed = rec is not None and rec.nonce == w.record.nonce
            cleared = _with(party, unanswered=None)
            if landed:
                step(i, f"reads its {w.kind.value} back: landed", _after(s, i, role, cleared, w, True, rec))
            elif w.kind in (p.Kind.HANDOFF, p.Kind.FREE):
                within = s.now < party.valid_until
                d = p.decide_release(
                    rec, gen, me=me, token=party.token, now=local, timing=timing, nonce="-", attempted=w,
                    within_lease=within,
                )  # fmt: skip
                what = f"reads its {w.kind.value} back"
                if isinstance(d, p.Write):
                    decided(i, what, _with(cleared, known=(rec, gen)), d)
                else:
                    step(i, f"{what}: {type(d).__name__}", Party(starts=party.starts))
            elif party.phase in ("held", "release"):
                step(i, f"reads its {w.kind.value} back: not there", _with(cleared, known=(rec, gen)))
            else:  # an acquire's write: it may land yet, on the generation it was conditioned on
                step(i, f"reads its {w.kind.value} back: not there", _with(cleared, maybe=w.if_generation_match))
            continue
        done = Party(starts=party.starts)
        if party.phase == "idle" and party.starts < MAX_STARTS:  # starts an acquire: its first read
            started = _with(party, phase="acquire", starts=party.starts + 1, since=local)
            _acquire_step(step, decided, i, role, started, s, "starts acquire, reads")
        elif party.phase == "acquire":
            _acquire_step(step, decided, i, role, party, s, "reads")
            if party.waiting or party.maybe is not None:
                step(i, "gives up", _with(party, phase="give_up"))
        elif party.phase == "give_up":
            d = p.decide_give_up_wait(rec, gen, me=me, now=local, timing=timing, nonce="-", pending=party.maybe)
            if isinstance(d, p.Owned):  # handed the lock as it left: it releases it
                release = _held(party, d.record, gen, lease_until(d.record, s.now, local, timing), phase="release")
                step(i, "was handed the lock; releases it", release)
            elif isinstance(d, p.Write):
                decided(i, "reads", party, d)
            else:
                step(i, f"gives up: {type(d).__name__}", done)
        elif party.known is not None:
            known, known_gen = party.known
            releasing = _with(party, phase="release")
            d = p.decide_release(known, known_gen, me=me, token=party.token, now=local, timing=timing, nonce="-")
            if isinstance(d, p.Write):
                decided(i, "releases", releasing, d)
            else:
                step(i, f"releases: {type(d).__name__}", done)
            if party.phase == "held":
                seen = p.observe_as_owner(rec, me=me, token=party.token, now=local)
                if isinstance(seen, p.Lost):
                    step(i, "checks: lost", done)
                elif (rec, gen) != party.known:
                    step(i, "checks", _with(party, known=(rec, gen)))
                d = p.decide_renew(known, known_gen, me=me, token=party.token, now=local, timing=timing, nonce="-")
                # A renewal that would not move the lease on (none is due since the last) is no new step.
                if isinstance(d, p.Write) and _lease_end(d.record) <= _lease_end(known):
                    continue
                if isinstance(d, p.Write):
                    decided(i, "renews", party, d)
                else:
                    step(i, f"renews: {type(d).__name__}", done)
    return out


def _acquire_step(
    step: Callable[[int, str, Party], None],
    decided: Callable[[int, str, Party, p.Write], None],
    i: int,
    role: Role,
    party: Party,
    s: State,
    what: str,
) -> None:
    """Party ``i``, acquiring, reads the record and decides what its acquire does next."""
    rec, gen, local = s.record, s.generation, s.now + role.offset
    waiting = party.waiting or p.registered(rec, role.me)
    d = p.decide_acquire(
        rec, gen, me=role.me, now=local, timing=role.timing, nonce="-", waiting=waiting, request=role.request,
        since=party.since,
    )  # fmt: skip
    if isinstance(d, p.Owned):
        valid_until = lease_until(d.record, s.now, local, role.timing)
        step(i, f"{what}: the lock was handed to it", _held(party, d.record, gen, valid_until))
    elif isinstance(d, p.Write):
        decided(i, what, _with(party, waiting=waiting), d)
    elif isinstance(d, p.Contended):
        step(i, f"{what}: contended", Party(starts=party.starts))
    elif waiting != party.waiting or party.phase != "acquire" or what != "reads":
        step(i, f"{what}: waits", _with(party, waiting=waiting))


def violation(s: State, roles: tuple[Role, ...]) -> str | None:
    r = s.record
    for role, party in zip(roles, s.parties, strict=True):
        if party.phase != "held" or s.now >= party.valid_until:
            continue
        if r is None or r.owner is None or (r.owner.id, r.owner.instance) != (role.me.owner_id, role.me.instance):
            who = None if r is None or r.owner is None else r.owner.instance
            return f"{role.me.instance} counts its lease valid (token {party.token}) but the record names {who}"
        if r.token != party.token:
            return f"{role.me.instance} counts its lease valid with token {party.token}; the record's is {r.token}"
    return None


def explore(config: str, depth: int, faults: int = FAULTS) -> tuple[int, list[str] | None, int]:
    """Breadth-first to ``depth`` steps, with up to ``faults`` writes sent late, whose reply is lost or that
    are cut off: (states, shortest counterexample or None, depth reached)."""
    roles = CONFIGS[config]
    start = State(None, 0, 0.0, tuple(Party() for _ in roles), faults=faults)
    parent: dict[State, tuple[State, str] | None] = {start: None}
    cost = {start: 0}
    stamped: dict[tuple[p.Write, float, str], p.Write | None] = {}
    frontier, reached = deque([start]), 0

    def path(s: State) -> list[str]:
        out = []
        while (link := parent[s]) is not None:
            s, what = link
            out.append(f"t={s.now:g} {what}")
        return out[::-1]

    while frontier:
        s = frontier.popleft()
        d = cost[s]
        reached = max(reached, d)
        if d >= depth:
            continue
        try:
            nexts = steps(s, roles, stamped)
        except Broken as exc:
            return len(parent), [*path(s), f"t={s.now:g} {exc.step}", f"-> {exc}"], d + 1
        for what, s2, c in nexts:
            if s2 in parent:
                continue
            parent[s2], cost[s2] = (s, what), d + c
            why = violation(s2, roles)
            if why is not None:
                return len(parent), [*path(s2), f"-> {why}"], d + c
            frontier.append(s2)
    return len(parent), None, reached


def check_all(*, bug: str | None = None, long: bool = False) -> int:
    """Every configuration; one line each. With ``bug`` planted, it must be found (exit 1, the counterexample)."""
    failed, total = False, 0
    for config, depth in (LONG_DEPTHS if long else DEPTHS).items():
        started = time.monotonic()
        with planted(bug) if bug else contextlib.nullcontext():
            states, example, reached = explore(config, depth)
        took = time.monotonic() - started
        label = config + (f", bug {bug!r} planted" if bug else "")
        total += states
        if example is not None:
            failed = True
            print(f"model check ({label}): counterexample of {len(example) - 1} steps:")
            print("  " + "\n  ".join(example))
            print(f"model check ({label}): {states} states, depth {reached}, 1 violation ({took:.1f} s)")
            if bug:
                return 1
        else:
            print(f"model check ({label}): {states} states, depth {reached}, 0 violations ({took:.1f} s)")
    if not failed:
        print(f"model check: {total} states, 0 violations")
    return 1 if failed else 0
