"""An exhaustive check of the pure protocol (:mod:`handofflock.core.protocol`), in the spirit of TLC.

No lock, no threads, no clock: an abstract store (one record and its
generation), a clock that ticks in whole seconds, and 2 or 3 parties (the
third a twin sharing the first one's owner id), each a small state machine
whose every step is one read or one conditional write decided by the real
``decide_*`` functions. Breadth-first over every interleaving of their steps
and the clock's ticks up to a depth, with visited states hashed, so the first
violation found has a shortest counterexample. Invariants (as the
simulation's): an owner that counts its lease valid is named by the record
(its instance and token) and its lease has not ended, a twin's lease as
anyone's (a twin is another party, never an exception); tokens strictly rise
whenever the owner changes; a handoff goes only to a live waiter slot.

What it leaves out: lost replies and retries, clock skew (ticks are shared),
latency inside a step. The simulation covers those.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, replace

from ...core import protocol as p
from ...core.record import LockRecord
from ...core.timing import Timing
from .bugs import planted

TTL, RENEW_DEADLINE, HORIZON = 3.0, 2.0, 8.0
TIMING = Timing.build(ttl=TTL, waiter_ttl=TTL, max_clock_skew=0.0)
NONCE = "n"


@dataclass(frozen=True)
class Party:
    me: p.Me
    phase: str = "idle"  # idle, acquire, give_up, held, release
    view: tuple[LockRecord | None, int] | None = None  # last read, awaiting its decision
    waiting: bool = False
    token: int = 0
    valid_until: float = -1.0
    known: tuple[LockRecord | None, int] | None = None  # the owner's record and generation
    starts: int = 0


@dataclass(frozen=True)
class State:
    record: LockRecord | None
    generation: int
    now: float
    parties: tuple[Party, ...]


class Broken(Exception):
    pass


def _write(s: State, w: p.Write, i: int) -> tuple[State, bool]:
    if w.if_generation_match not in (s.generation, -1):
        return s, False
    prev, new = s.record, w.record
    if prev is not None and new.token < prev.token:
        raise Broken(f"{w.kind.value} by {s.parties[i].me.instance} lowered the token to {new.token}")
    if new.owner is not None and prev is not None and _owner(prev) != _owner(new) and new.token <= prev.token:
        raise Broken(f"{w.kind.value} moved the lock to {new.owner.instance} keeping token {new.token}")
    if w.kind is p.Kind.HANDOFF and prev is not None and not prev.waiter_live(s.now):
        ended = prev.waiter and prev.waiter.expires_at
        raise Broken(f"handoff to {_owner(new)[1]}, whose slot ended at {ended}")
    return replace(s, record=new, generation=s.generation + 1), True


def _owner(r: LockRecord | None) -> tuple[str | None, str | None]:
    """The owner id and instance ``r`` names."""
    return (None, None) if r is None or r.owner is None else (r.owner.id, r.owner.instance)


def _held(party: Party, rec: LockRecord, gen: int, valid_until: float) -> Party:
    return replace(party, phase="held", view=None, waiting=False, token=rec.token, valid_until=valid_until,
                   known=(rec, gen))  # fmt: skip


def steps(s: State, max_starts: int) -> list[tuple[str, State]]:
    out: list[tuple[str, State]] = []

    def step(i: int, what: str, party: Party, state: State = s) -> None:
        """``what`` happens: the store is ``state``, and party ``i`` becomes ``party``."""
        parties = (*state.parties[:i], party, *state.parties[i + 1 :])
        out.append((f"{party.me.instance} {what}", replace(state, parties=parties)))

    if s.now < HORIZON:
        out.append(("tick", replace(s, now=s.now + 1)))
    for i, party in enumerate(s.parties):
        me, t = party.me, s.now
        if party.phase == "idle" and party.starts < max_starts:
            step(i, "starts acquire", replace(party, phase="acquire", starts=party.starts + 1))
        elif party.phase in ("acquire", "give_up") and party.view is None:
            step(i, "reads", replace(party, view=(s.record, s.generation)))
            if party.phase == "acquire" and party.waiting:
                step(i, "gives up", replace(party, phase="give_up"))
        elif party.phase == "acquire" and party.view is not None:
            rec, gen = party.view
            d = p.decide_acquire(rec, gen, me=me, now=t, timing=TIMING, nonce=NONCE, waiting=party.waiting)
            if isinstance(d, p.Owned):
                assert d.record.owner is not None
                valid_until = d.record.owner.expires_at - (TTL - RENEW_DEADLINE)
                step(i, "finds the lock handed to it", _held(party, d.record, d.generation, valid_until))
            elif isinstance(d, p.Write):
                s2, ok = _write(s, d, i)
                if not ok:
                    step(i, f"{d.kind.value}: 412", replace(party, view=None))
                elif d.kind in (p.Kind.CREATE, p.Kind.TAKE, p.Kind.RETAKE):
                    held = _held(party, d.record, s2.generation, t + RENEW_DEADLINE)
                    step(i, f"{d.kind.value}s token {d.record.token}", held, s2)
                else:
                    step(i, d.kind.value, replace(party, view=None, waiting=True), s2)
            elif isinstance(d, p.Contended):
                step(i, "contended", replace(party, phase="idle", view=None, waiting=False))
            else:
                step(i, "waits", replace(party, view=None))
        elif party.phase == "give_up" and party.view is not None:
            rec, gen = party.view
            d = p.decide_give_up_wait(rec, gen, me=me, now=t, timing=TIMING, nonce=NONCE)
            if isinstance(d, p.Owned):  # a cancel that was handed the lock releases it
                release = replace(_held(party, d.record, d.generation, -1.0), phase="release")
                step(i, "was handed the lock; releases it", release)
            elif isinstance(d, p.Write):
                s2, ok = _write(s, d, i)
                after = replace(party, view=None) if not ok else replace(party, phase="idle", view=None, waiting=False)
                step(i, d.kind.value + ("" if ok else ": 412"), after, s2)
            else:
                step(i, "gave up", replace(party, phase="idle", view=None, waiting=False))
        elif party.phase in ("held", "release") and party.known is not None:
            rec, gen = party.known
            if party.phase == "held":
                step(i, "releases", replace(party, phase="release"))
                seen = p.observe_as_owner(s.record, me=me, token=party.token, now=t)
                if isinstance(seen, p.Lost):
                    step(i, "checks: lost", replace(party, phase="idle", known=None, valid_until=-1.0))
                else:
                    step(i, "checks", replace(party, known=(s.record, s.generation)))
                d = p.decide_renew(rec, gen, me=me, token=party.token, now=t, timing=TIMING, nonce=NONCE)
            else:
                d = p.decide_release(rec, gen, me=me, token=party.token, now=t, timing=TIMING, nonce=NONCE)
            what = "renews" if party.phase == "held" else "releases"
            if isinstance(d, p.Write):
                s2, ok = _write(s, d, i)
                if not ok:
                    step(i, f"{what}: 412, reads", replace(party, known=(s.record, s.generation)))
                elif party.phase == "held":
                    step(i, "renews", _held(party, d.record, s2.generation, t + RENEW_DEADLINE), s2)
                else:
                    step(i, d.kind.value, Party(me, starts=party.starts), s2)
            else:
                step(i, f"{what}: {type(d).__name__}", Party(me, starts=party.starts))
    return out


def violation(s: State) -> str | None:
    r = s.record
    for party in s.parties:
        if party.phase != "held" or s.now >= party.valid_until:
            continue
        name = party.me.instance
        if r is not None and r.owner is not None and r.owner.instance == name and r.token == party.token:
            if s.now > r.owner.expires_at:
                return f"{name} counts its lease valid after expiresAt"
            continue
        return f"{name} counts its lease valid (token {party.token}) but the record names {_owner(r)[1]}"
    return None


def explore(parties: int, depth: int, max_starts: int = 2) -> tuple[int, list[str] | None, int]:
    """Breadth-first to ``depth``: (states, shortest counterexample or None, depth reached)."""
    me = [p.Me("a", "a1"), p.Me("b", "b1"), p.Me("a", "a2")][:parties]
    start = State(None, 0, 0.0, tuple(Party(m) for m in me))
    parent: dict[State, tuple[State, str] | None] = {start: None}
    frontier, reached = deque([(start, 0)]), 0

    def path(s: State) -> list[str]:
        out = []
        while (link := parent[s]) is not None:
            s, what = link
            out.append(f"t={s.now:.0f} {what}")
        return out[::-1]

    while frontier:
        s, d = frontier.popleft()
        reached = max(reached, d)
        if d >= depth:
            continue
        try:
            nexts = steps(s, max_starts)
        except Broken as exc:
            return len(parent), [*path(s), f"-> {exc}"], d
        for what, s2 in nexts:
            if s2 in parent:
                continue
            parent[s2] = (s, what)
            why = violation(s2)
            if why is not None:
                return len(parent), [*path(s2), f"-> {why}"], d + 1
            frontier.append((s2, d + 1))
    return len(parent), None, reached


def check_all(*, bug: str | None = None, long: bool = False) -> int:
    """Both configurations; one line each. With ``bug`` planted, it must be found (exit 1, the counterexample)."""
    # 3 parties to depth 12: a twin's take after its predecessor's lease ended needs 12 steps.
    configs = [(2, 18 if long else 14), (3, 13 if long else 12)]
    failed, total, deepest = False, 0, 0
    for parties, depth in configs:
        started = time.monotonic()
        with planted(bug) if bug else contextlib.nullcontext():
            states, example, reached = explore(parties, depth)
        took = time.monotonic() - started
        label = f"{parties} parties" + (f", bug {bug!r} planted" if bug else "")
        if example is not None:
            failed = True
            print(f"model check ({label}): counterexample of {len(example) - 1} steps:")
            print("  " + "\n  ".join(example))
            print(f"model check: {states} states, depth {reached}, 1 violations ({took:.1f} s)")
            if bug:
                return 1
        else:
            print(f"model check ({label}): {states} states, depth {reached}, 0 violations ({took:.1f} s)")
        total, deepest = total + states, max(deepest, reached)
    if not failed:
        print(f"model check: {total} states, depth {deepest}, 0 violations")
    return 1 if failed else 0
