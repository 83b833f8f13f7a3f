"""The invariants, checked from outside the code under test.

The checker never runs inside the lock: it is not a signal receiver (a
receiver's exception is logged and swallowed by design) and it calls nothing
private. It sees what an observer of the system can see: every write the store
applies (with its generation and who sent it), the results of public API calls
(``acquire``, ``release``, ``check``), public read-only state (``healthy``,
``is_held``, ``token``, ``instance``) and the true time. The hub calls
:meth:`Checker.check` between steps, and the world reports API results as they
return; a broken invariant raises :class:`~.hub.Violation` in the hub's own
loop, which ends the run with the seed and the trace.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ...core.errors import AcquireCancelled, LockContended, LockLost, LockNotHeld, TransientStorageError
from ...core.record import LockRecord
from ...fencing import decode_fence
from ...lock.handoff import Acquired
from .hub import MONO0, WALL0, Hub, Violation
from .parties import Party

#: What an operation may end with, by the lock's documentation: outcomes, never violations.
EXPECTED = (LockContended, AcquireCancelled, TransientStorageError, LockLost, LockNotHeld)

KEY = "locks/sim.json"
FENCE_KEY = "locks/fenced.json"


@dataclass(frozen=True)
class Rules:
    """What the lock promises in this world, from its timing: the bounds the checker holds it to."""

    ttl: float
    skew: float
    waiter_check_interval: float
    handoff_slack: float  # how long a handoff decision may take to land
    gentle: bool  # only survivable faults: an owner that is not paused must keep its lock


@dataclass
class Checker:
    hub: Hub
    rules: Rules
    parties: list[Party]
    counts: Counter[str] = field(default_factory=Counter)  # what the run explored: the coverage
    record: LockRecord | None = None  # the lock object as last applied
    highest_store_token: int = 0
    issued: set[tuple[str, int]] = field(default_factory=set)  # (instance, token) the store made owner
    fence_highest: int = 0
    #: Parties whose acquire ended without the lock while the record names it its live owner, and when:
    #: the lock must give it back (a release retried in the background) or the checker calls it a leak.
    left_owning: dict[Party, float] = field(default_factory=dict)
    strict_suspend: bool = False  # True once the suspend fix is merged: a late check() after a suspend fails

    def true_wall(self) -> float:
        return WALL0 + (self.hub.now - MONO0)

    # ------------------------------------------------------------------ the store's history

    def on_applied(self, party: Party, key: str, data: bytes, generation: int) -> None:
        if key == FENCE_KEY:
            doc = decode_fence(data, key=key, generation=generation, url=None, max_bytes=1 << 20)
            if doc.highest < self.fence_highest:
                raise Violation(f"the fence took token {doc.highest} after {self.fence_highest}")
            self.fence_highest = doc.highest
            return
        if key != KEY:
            return
        new, prev = LockRecord.decode(data, key=key), self.record
        self.record = new
        if new.token < self.highest_store_token:
            raise Violation(
                f"{party.name} wrote token {new.token} after {self.highest_store_token} (generation {generation})"
            )
        owner, before = new.owner, None if prev is None else prev.owner
        moved = owner is not None and (before is None or (owner.id, owner.instance) != (before.id, before.instance))
        if owner is not None and moved and prev is not None and new.token <= prev.token:
            raise Violation(f"{party.name} moved the lock to {owner.id} keeping token {new.token}")
        self.highest_store_token = max(self.highest_store_token, new.token)
        if owner is not None and owner.instance:
            self.issued.add((owner.instance, new.token))
        if not moved or owner is None or prev is None or before is None:
            return
        slot = prev.waiter
        if before.instance == party.lock.instance and owner.instance == (slot.instance if slot else None):
            self.counts["handoffs"] += 1
            wall = party.clock.time()
            if slot is None or wall > slot.expires_at + self.rules.handoff_slack:
                raise Violation(
                    f"{party.name} handed the lock to {owner.id}, whose slot had ended "
                    f"{wall - (slot.expires_at if slot else 0):.2f} s before by its own clock"
                )

    # ------------------------------------------------------------------ public API results

    def acquire_ended(self, party: Party, result: object) -> None:
        lock = party.lock
        if isinstance(result, Acquired) or result is True:  # acquire() returns an Acquired (== True)
            token = lock.token or 0
            if (lock.instance, token) not in self.issued:
                raise Violation(f"{party.name} acquired with token {token}, which no write gave this instance")
            # acquire() returns a lease counted from the write that made it, renewed at once if little is
            # left: healthy, unless the process stood still since its last request on the lock went out.
            sent = party.store.sent_at.get(KEY, MONO0)
            if lock.is_held and not lock.healthy and party.proc.frozen_until() <= sent:
                raise Violation(
                    f"{party.name}'s acquire returned a lock that is not healthy (token {token}); "
                    f"its last request went out {self.hub.now - sent:.2f} s before, and it has not stood still since"
                )
            return
        if lock.is_held:
            raise Violation(f"{party.name}'s acquire ended without the lock ({result!r}) and it holds the lock")
        r = self.record
        owner = None if r is None else r.owner
        mine = owner is not None and owner.instance == lock.instance and owner.live(self.true_wall(), self.rules.skew)
        if mine and owner is not None and not self.left_behind(party, owner.expires_at):
            # Its way out may give the lock back in the background (a release after a cancelled
            # acquire, refused by a 429, is retried there): watched from here (see :meth:`check`).
            self.left_owning[party] = self.hub.now

    def left_behind(self, party: Party, expires_at: float) -> bool:
        """Whether a slot or lease naming ``party``, live until ``expires_at``, is one its last acquire may leave
        (documented: it expires by itself) and no write of ours has extended since: any other is a leak."""
        return expires_at <= party.left_behind_until

    def lost_while_gentle(self, party: Party, why: str) -> None:
        if self.rules.gentle and party.proc.frozen_until() < MONO0:
            raise Violation(f"{party.name} lost its lock under survivable faults only: {why}")

    def slot_left(self, party: Party) -> None:
        """An acquire that ended without the lock left no slot behind (but one it documents it may leave)."""
        r = self.record
        if party.proc.crashed or party.lock.is_held or r is None or r.waiter is None:
            return
        if self.left_behind(party, r.waiter.expires_at):
            return
        if not r.waiter.live(self.true_wall() - self.rules.skew):
            return  # not a bug: a slot that has ended (by every clock) holds nobody back, though it still names us
        if party.proc.frozen_until() > party.left_wait_at - 10 * self.rules.ttl:
            return
        instances = (r.waiter and r.waiter.instance, r.owner and r.owner.instance)
        if instances[0] == party.lock.instance and instances[1] != party.lock.instance:
            raise Violation(f"{party.name} left acquire and its waiter slot is still in the record")

    # ------------------------------------------------------------------ between steps

    def check(self) -> None:
        """No party counts itself healthy unsoundly, and a live waiter slot names no party that left its acquire."""
        now, r = self.hub.now, self.record
        healthy = [p for p in self.parties if p.alive and now >= p.proc.suspended_until and p.lock.healthy]
        for p in healthy:
            why = self._unsound(p)
            if why is None:
                continue
            if p.proc.suspended_for and not self.strict_suspend:
                # After a host suspend check() must raise; until the suspend fix is merged it may
                # not: counted, the party retired, and the run goes on (see docs/reliability.md).
                self.counts["suspend_awaiting_fix"] += 1
                self.hub.note(f"{p.name} after a suspend (awaiting the fix): {why}")
                p.proc.crashed = True
                continue
            raise Violation(why)
        self._left_owning()
        if r is None or r.waiter is None or not r.waiter.live(self.true_wall() - self.rules.skew):
            return
        for p in self.parties:
            if not p.alive or p.lock.instance != r.waiter.instance or p.in_acquire:
                continue
            if self.left_behind(p, r.waiter.expires_at):
                continue
            grace = p.lock.give_up_budget + 1.0
            if now - p.left_wait_at > grace and now >= p.proc.frozen_until():
                raise Violation(
                    f"the waiter slot names {p.name}, which left its acquire {now - p.left_wait_at:.2f} s ago"
                )

    def _left_owning(self) -> None:
        """A party whose acquire ended while the record names it its live owner writes again (gives it back)
        within the give-up budget, or the lock is leaked: held on record by an instance that thinks it is idle."""
        r = self.record
        owner = None if r is None else r.owner
        for p, ended in list(self.left_owning.items()):
            named = owner is not None and owner.instance == p.lock.instance and owner.live(self.true_wall())
            if not named or not p.alive or p.lock.is_held or p.store.wrote_at.get(KEY, MONO0) > ended:
                del self.left_owning[p]
            elif self.hub.now - ended > p.lock.give_up_budget + 1.0 and self.hub.now >= p.proc.frozen_until():
                raise Violation(
                    f"{p.name}'s acquire ended {self.hub.now - ended:.2f} s ago without the lock, and the object "
                    f"still names it as a live owner (token {r.token if r else None})"
                )

    def _unsound(self, p: Party) -> str | None:
        """Why ``p`` must not count itself healthy now, or None."""
        r = self.record
        me = p.lock.instance
        if r is not None and r.owner is not None and r.owner.instance == me and r.token == p.lock.token:
            late = self.true_wall() - (r.owner.expires_at + self.rules.skew / 2)
            if late > 0:
                return (
                    f"{p.name} counts itself healthy {late:.3f} s after another party may take the lock "
                    f"(token {r.token})"
                )
            return None
        # No exemption for a twin (our owner id, another instance): it is another party, and waits for our lease.
        who = "nobody" if r is None else f"{r.owner and r.owner.id} (token {r.token})"
        return f"{p.name} counts itself healthy with token {p.lock.token}, but the object names {who}"
