"""A Hypothesis rule-based machine over real locks: the moves read as rules, Hypothesis finds the order.

Three parties, each a real :class:`HandoffLock` with a scheduler of its own,
share one memory store and one :class:`FakeClock` with ``step`` (waiting is the passage of
simulated time, and every party's duties run on each tick unless the party is
paused); each party's wall clock is off by up to half the lock's
``max_clock_skew``. The rules are what a process can do: try to acquire, wait for the lock
for a while, release, pause (its duties stop; a GC pause, SIGSTOP), resume,
crash and restart under the same owner id, and let time pass; what an operator
can do: force a release; and what the store can do: fail the next write, or apply it and lose its reply. Some
parties hand the lock over as soon as they are asked (their
``on_release_requested`` receiver releases), as a trainer does.

After every rule: at most one party holds a valid lease, the one that does is
the owner the record names (by instance), tokens never go back, and the
waiter slot names nobody (no acquire is running between rules) unless an
injected fault kept the acquire from giving it back. When a rule sequence
fails, Hypothesis shrinks it to a short story; the seeded random walk of
handofflock/testing/sim explores longer ones, with threads interleaved inside
operations, which rules cannot do. Four of the simulation's five planted bugs
are checked to be found here too.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from handofflock import HandoffLock, HandoffLockError, signals
from handofflock.core.errors import TransientStorageError
from handofflock.core.record import LockRecord
from handofflock.lock.scheduler import Scheduler
from handofflock.repair import force_release
from handofflock.storage import MemoryStorage
from handofflock.testing.clock import FakeClock
from handofflock.testing.sim.bugs import planted

KEY = "locks/stateful.json"
#: Fast timing at the memory store's own pacing (none; a ttl of 3 s, which GCS's one write per second
#: could not serve): the rules explore the protocol's states; the simulation runs a third of its seeds
#: at GCS pacing.
TIMING = dict(ttl=3.0, renew_interval=0.5, renew_deadline=1.5, waiter_ttl=2.0, waiter_check_interval=0.3,
              waiter_poll_interval=0.2, max_clock_skew=0.2)
PARTIES = 3
#: Wall clocks differ by up to this (the lock's ``max_clock_skew``): each party's is off by up to half.
SKEW = TIMING["max_clock_skew"]
_names = itertools.count()

party = st.integers(0, PARTIES - 1)


class Store(MemoryStorage):
    """The memory store, where a planted bug's "no generation match" (-1) means: whatever is there."""

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        if if_generation_match == -1:
            found = self.read(key)
            if_generation_match = 0 if found is None else found[1]
        return super().write(key, data, if_generation_match=if_generation_match, timeout=timeout)


class Party:
    def __init__(self, machine: LockMachine, index: int, yields: bool, skew: float) -> None:
        self.index = index
        self.clock = machine.clock.skewed(skew)
        self.yields = yields
        self.paused = False
        self.machine = machine
        self.start()

    def start(self) -> None:
        """A new process under the same owner id: a new instance with a scheduler of its own."""
        m = self.machine
        self.crashed = False
        self.scheduler = Scheduler(self.clock, autostart=False)
        self.lock = HandoffLock("memory://unused", storage=m.store, key=KEY, owner_id=f"p{self.index}",
                                clock=self.clock, scheduler=self.scheduler, **TIMING)
        if self.yields:
            signals.on_release_requested.connect(self._hand_over, sender=self.lock, weak=False)

    def _hand_over(self, sender: HandoffLock, **kw: object) -> None:
        if sender.is_held and not self.paused:
            try:
                sender.release()
            except HandoffLockError:
                pass  # lost, or the release write failed (retried in the background)

    def tick(self) -> None:
        if not self.paused and not self.crashed:
            self.scheduler.run_pending()


class LockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(step=0.1)
        self.store = Store(f"stateful-{next(_names)}")
        self.parties: list[Party] = []
        self.highest_token = 0
        #: Instances whose waiter slot may outlive their acquire: a fault kept it from being given back.
        self.excused: set[str] = set()
        #: Owners whose record an operator freed; left out of the lease checks until they notice.
        #: (Instances are read as ``lock.instance``: the record names a party by it.)
        self.evicted: set[str] = set()

    def _holders(self) -> list[Party]:
        """Parties with a valid lease, less those evicted by a forced release that have not noticed yet."""
        return [p for p in self.parties if p.lock.healthy and p.lock.instance not in self.evicted]

    def _acting(self, p: Party, action) -> object:
        """Run one party's action; if it consumed an injected fault, its slot is excused."""
        # private: the faults not yet spent; FaultHooks has no public view of them, and one spent here
        # (by this action) is what excuses the party
        pending = [(f.kind, f.count) for f in self.store.faults._faults]
        try:
            return action()
        finally:
            if [(f.kind, f.count) for f in self.store.faults._faults] != pending:  # private: as above
                self.excused.add(p.lock.instance)

    @initialize(yields=st.lists(st.booleans(), min_size=PARTIES, max_size=PARTIES),
                skews=st.lists(st.floats(-SKEW / 2, SKEW / 2), min_size=PARTIES, max_size=PARTIES))
    def setup(self, yields: list[bool], skews: list[float]) -> None:
        for i in range(PARTIES):
            p = Party(self, i, yields[i], skews[i])
            self.parties.append(p)
            self.clock.on_tick.append(p.tick)

    def teardown(self) -> None:
        for p in self.parties:
            signals.on_release_requested.disconnect(p._hand_over, sender=p.lock)

    def _note_acquired(self, p: Party) -> None:
        token = p.lock.token
        assert token is not None and token > self.highest_token, f"p{p.index} acquired token {token}, not above {self.highest_token}"
        self.highest_token = token
        self.evicted.discard(p.lock.instance)

    # -- what a process does --------------------------------------------------

    @rule(i=party)
    def try_acquire(self, i: int) -> None:
        p = self.parties[i]
        if p.paused or p.lock.is_held:
            return
        try:
            got = self._acting(p, lambda: p.lock.acquire(blocking=False))
        except (HandoffLockError, TransientStorageError):
            return
        if got:
            self._note_acquired(p)

    @rule(i=party, timeout=st.floats(0.0, 4.0))
    def wait_for_lock(self, i: int, timeout: float) -> None:
        p = self.parties[i]
        if p.paused or p.lock.is_held:
            return
        try:
            got = self._acting(p, lambda: p.lock.acquire(timeout=timeout))
        except HandoffLockError:
            return  # timed out, contended, a storage error: every way out gives the slot back
        if got:
            self._note_acquired(p)

    @rule(i=party)
    def release(self, i: int) -> None:
        p = self.parties[i]
        # private: "lost" has no public flag (is_held is False, check() raises as for "idle")
        if p.paused or not (p.lock.is_held or p.lock._state == "lost"):
            return
        try:
            p.lock.release()
        except HandoffLockError:
            pass

    @precondition(lambda self: not any(p.paused for p in self.parties))
    @rule(i=party)
    def pause(self, i: int) -> None:
        self.parties[i].paused = True

    @precondition(lambda self: any(p.paused for p in self.parties))
    @rule()
    def resume(self) -> None:
        for p in self.parties:
            p.paused = False

    @rule(i=party)
    def crash_and_restart(self, i: int) -> None:
        p = self.parties[i]
        p.crashed = True  # the old instance's duties never run again
        signals.on_release_requested.disconnect(p._hand_over, sender=p.lock)
        p.start()
        p.paused = False

    @rule(seconds=st.floats(0.05, 4.0))
    def let_time_pass(self, seconds: float) -> None:
        self.clock.run_for(seconds)

    # -- what the store does --------------------------------------------------

    @rule()
    def operator_forces_a_release(self) -> None:
        """``handofflock release --force``: the record is freed under its owner, who holds on (and
        may be healthy) until its next renewal or check reads the change. Mutual exclusion with it
        is then fencing's job, so that owner is left out of the lease checks until it notices."""
        operator = HandoffLock("memory://unused", storage=self.store, key=KEY, owner_id="operator",
                               clock=self.clock, scheduler=Scheduler(self.clock, autostart=False), **TIMING)
        found = self.store.read(KEY)
        owner = None if found is None else LockRecord.decode(found[0], key=KEY).owner_instance
        try:
            force_release(operator, clock=self.clock, timeout=5.0)
        except HandoffLockError:
            return
        if owner is not None:
            self.evicted.add(owner)

    @rule()
    def fail_next_write(self) -> None:
        self.store.faults.fail_next("write", key=KEY)

    @rule()
    def lose_next_reply(self) -> None:
        self.store.faults.lose_reply_next(
            "write", key=KEY, exc=lambda: TransientStorageError("stateful: reply lost", ambiguous=True))

    # -- what must always be true ---------------------------------------------

    @invariant()
    def one_valid_lease_and_it_is_the_records(self) -> None:
        holders = self._holders()
        assert len(holders) <= 1, "two valid leases: " + ", ".join(f"p{p.index} (token {p.lock.token})" for p in holders)
        if holders:
            found = self.store.read(KEY)
            assert found is not None
            record = LockRecord.decode(found[0], key=KEY)
            h = holders[0]
            # private: instances, as for evicted above (the record names its owner by instance)
            assert record.owner_instance == h.lock.instance, f"p{h.index} holds a valid lease the record does not give it"
            assert record.token == h.lock.token

    @invariant()
    def the_slot_names_nobody_unless_a_fault_kept_it(self) -> None:
        found = self.store.read(KEY)
        if found is None:
            return
        record = LockRecord.decode(found[0], key=KEY)
        if record.waiter_instance is None or not record.waiter_live(self.clock.time() - TIMING["max_clock_skew"]):
            self.excused.clear()
            return
        assert record.waiter_instance in self.excused, (
            f"the waiter slot names {record.waiting_owner_id}, which is not acquiring and met no fault")

    @invariant()
    def tokens_never_go_back(self) -> None:
        for p in self._holders():
            if p.lock.healthy:
                assert p.lock.token == self.highest_token, f"p{p.index} holds token {p.lock.token}, not the latest {self.highest_token}"


SETTINGS = settings(
    max_examples=300, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
LockMachine.TestCase.settings = SETTINGS
TestLockMachine = pytest.mark.timeout(300)(LockMachine.TestCase)


#: The simulation's planted bugs this machine's search finds. lease-past-its-margin needs a pause that
#: ends within the skew of the lease's end, finer than rules reach: the simulation finds it.
#: trust-a-read is left to the model check (5 steps) and the simulation (its seed in
#: test_simulation.py), which find it deterministically: this search's rule choice shifts with the
#: memory layout (see below), and within 1,000 examples it finds trust-a-read in some layouts only.
FOUND_HERE = ["keep-slot-on-timeout", "unconditional-handoff", "unconditional-renewal"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bug", FOUND_HERE)
def test_the_machine_finds_each_planted_bug(bug):
    """The invariants can fail: with each planted bug, some rule sequence breaks one."""
    # Up to 1000 examples (the search stops at the first failure): Hypothesis labels the rule
    # choice by hash(Rule), which hashes the rule's function by address, so the derandomized walk
    # shifts with any change to what is loaded before it. At 300, trust-a-read was found in one
    # memory layout (example ~100) and missed in another (issue 17's record.py), while the
    # counterexample found in the first still fails the invariants in the second.
    with planted(bug), pytest.raises(AssertionError):
        run_state_machine_as_test(LockMachine, settings=settings(SETTINGS, max_examples=1000, phases=[Phase.generate], print_blob=False))
