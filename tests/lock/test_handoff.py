"""The handoff: release() with a live waiter writes the heir into the record in one write, and the heir holds a healthy lease."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from lockparts import heir_reads_its_handoff_late, held, lock_for, waiter_is
from lockutil import eventually, make_lock, raw_read
from simworld import KEY

from handofflock import (
    FakeClock,
    HandoffLock,
    Scheduler,
    signals,
)
from handofflock.cli import status_text
from handofflock.core import protocol
from handofflock.core.protocol import Kind, Me, Write
from handofflock.core.record import Label, LockRecord, WaiterRequest
from handofflock.core.timing import Timing
from handofflock.lock import Acquired
from handofflock.storage import MemoryStorage

TTL = 10.0


@pytest.fixture
def url():
    name = f"labels-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/train.json"
    MemoryStorage.forget(name)


NOW = 1_700_000_000.0

DECIDING = Timing.build(ttl=60.0, waiter_ttl=30.0, max_clock_skew=2.0)

GEN = 42

PATIENT = WaiterRequest(asks=False)


def test_a_deadline_check_that_waited_for_the_settling_renewal_does_not_mark_the_lock_lost():
    name = f"settle-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock()
    url = f"memory://{name}/lock.json"
    owner = HandoffLock(url, ttl=TTL, owner_id="owner", clock=clock,
                        scheduler=Scheduler(clock, autostart=False))  # fmt: skip
    sched = Scheduler(clock, autostart=False)
    heir = HandoffLock(url, ttl=TTL, owner_id="heir", waiter_poll_interval=1.0,
                       clock=clock, scheduler=sched)  # fmt: skip
    got: list[object] = []
    duty: list[threading.Thread] = []
    try:
        assert owner.acquire()
        waiting = threading.Thread(target=lambda: got.append(heir.acquire(timeout=60)))
        waiting.start()
        deadline = time.monotonic() + 5
        while owner.status().waiter_id != "heir" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.release() == "heir"

        def deadline_check_meanwhile(op, key):
            # The heir is renewing its handed lease, under its I/O mutex: the scheduler, which saw the
            # lease past its window, runs its duty now and waits for that mutex.
            store.faults.clear()
            duty.append(threading.Thread(target=sched.run_pending))
            duty[0].start()
            time.sleep(0.2)

        store.faults.before("write", deadline_check_meanwhile)
        clock.advance(TTL * 0.8)  # the heir's next poll finds the handoff with 2 s of 10 left
        waiting.join(10)
        assert duty, "the heir never renewed its handed lease"
        duty[0].join(10)
        assert got and got[0], got
        assert heir.is_held and heir.healthy, "a lease renewed a moment ago was declared lost"
        assert store.read("lock.json") is not None and heir.status().owner_id == "heir"
    finally:
        store.faults.clear()
        if heir.is_held:
            heir.release()
        MemoryStorage.forget(name)


def test_a_take_whose_lost_reply_is_confirmed_late_returns_a_healthy_lease():
    """Found by the simulation (seed 1803 of 2,000): a take's reply was lost, and the read that showed it
    had landed came late (retries, a slow store). The lease counts from the take's send, so acquire()
    returned a lock already past its renew deadline: lost at the next look, its lease left in the store."""
    name = f"late-take-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(step=0.05)
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=2.0, clock=clock,
                       scheduler=Scheduler(clock, autostart=False))  # fmt: skip
    slow = []

    def slow_read_after_the_lost_reply(op, key):
        if not slow:
            slow.append(True)
            clock.advance(1.5)  # the read that settles the lost reply takes 1.5 s of the lease's 2

    try:
        store.faults.lose_reply_next("write")
        store.faults.before("write", lambda op, key: store.faults.before("read", slow_read_after_the_lost_reply))
        assert lock.acquire(timeout=10)
        assert slow, "the lost reply was never settled by a read"
        assert lock.is_held and lock.healthy, "acquire() returned a lease already past its renew deadline"
    finally:
        store.faults.clear()
        if lock.is_held:
            lock.release()
        MemoryStorage.forget(name)


def test_a_take_confirmed_late_is_never_returned_lost_when_the_scheduler_runs_first():
    """The same late take, with the scheduler's deadline check running before the settling renewal (it runs
    while the ``acquired`` receivers do, in acquire()'s thread): acquire() must raise LockLost, never return
    a lock that is already lost as if it had got it."""
    from handofflock.core.errors import LockLost
    from handofflock.lock import events as signals

    name = f"late-take-first-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(step=0.05)
    sched = Scheduler(clock, autostart=False)
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=2.0, clock=clock, scheduler=sched)
    slow: list[bool] = []

    def slow_read_after_the_lost_reply(op, key):
        if not slow:
            slow.append(True)
            clock.advance(1.7)  # past the lease's renew deadline before acquire() has it

    def scheduler_meanwhile(sender, **kw):
        sched.run_pending()  # the scheduler thread, running beside the receivers

    signals.acquired.connect(scheduler_meanwhile, sender=lock)
    try:
        store.faults.lose_reply_next("write")
        store.faults.before("write", lambda op, key: store.faults.before("read", slow_read_after_the_lost_reply))
        try:
            got = lock.acquire(timeout=10)
        except LockLost:
            got = None
        assert slow, "the lost reply was never settled by a read"
        assert got is None or (lock.is_held and lock.healthy), f"acquire() returned {got!r} with the lock {lock!r}"
    finally:
        signals.acquired.disconnect(scheduler_meanwhile, sender=lock)
        store.faults.clear()
        if lock.is_held:
            lock.release()
        MemoryStorage.forget(name)


def _the_heir_returns_a_healthy_lock_or_none(name: str, clock: FakeClock, late: float, fault) -> None:
    """The heir that reads its handoff ``late`` s late, with ``fault`` set on the store as it does, either gets a
    lock ``healthy`` calls safe or raises LockLost: never a lock it calls unsafe."""
    from handofflock.core.errors import LockLost

    heir, seen = heir_reads_its_handoff_late(name, clock, late, fault)
    try:
        try:
            got = heir.acquire(timeout=30)
        except LockLost:
            got = None
        assert seen == ["handed", "read late"], seen
        assert got is None or heir.healthy, f"acquire() returned {got!r} with a lock that is not healthy"
    finally:
        MemoryStorage.named(name).faults.clear()
        if heir.is_held:
            heir.release()
        MemoryStorage.forget(name)


def test_a_handed_lease_the_wall_clock_ran_out_is_never_returned_when_its_renewal_fails():
    """The heir reads its handoff late, with less than a renew interval of the lease left; the renewal that
    settles it fails at once, and meanwhile the wall clock has passed the lease's margin where the monotonic
    clock has not (an NTP step; a monotonic clock that runs slow does the same, at seeds 63168 and 98546 of
    the simulation's long mode). ``healthy`` counts the wall clock too: acquire() must not return a lock
    it calls unsafe, as the caller would start work on it."""
    from handofflock.core.errors import StorageError

    name = f"wall-settle-{uuid.uuid4().hex[:8]}"
    clock = FakeClock(step=0.05)

    def the_renewal_fails_as_the_wall_clock_steps(store):
        def fail(op, key):
            store.faults.clear()
            clock.jump_wall(1.0)  # past the lease's margin by the wall clock alone
            raise StorageError("injected: the settling renewal is refused")

        store.faults.before("write", fail)

    _the_heir_returns_a_healthy_lock_or_none(name, clock, 1.75, the_renewal_fails_as_the_wall_clock_steps)


def test_a_handed_lease_whose_renewal_is_confirmed_past_its_own_deadline_is_never_returned_unhealthy():
    """The heir reads its handoff after the lease's margin has passed and renews it at once; that renewal's
    reply is lost, and the read that shows it landed comes back past the renewal's own renew deadline
    (seed 98546 of the simulation's long mode). Counted from its send, the renewed lease is as short as
    the one it replaced: renewed again while the settling lasts, else the hold is lost, never returned."""
    name = f"late-settle-{uuid.uuid4().hex[:8]}"
    clock = FakeClock(step=0.05)

    def the_renewal_is_confirmed_late(store):
        slow: list[bool] = []

        def slow_read(op, key):
            if not slow:
                slow.append(True)
                clock.advance(2.05)  # past the renewal's renew deadline (2 s from its send)

        store.faults.lose_reply_next("write")
        store.faults.before("write", lambda op, key: store.faults.before("read", slow_read))

    _the_heir_returns_a_healthy_lock_or_none(name, clock, 2.1, the_renewal_is_confirmed_late)


def test_a_handoff_between_two_locks_moves_the_waiters_label_to_the_owners_place(url):
    a = make_lock(url, owner_id="a", label="job A")
    b = make_lock(url, owner_id="b", label=Label("job B", grace=12.0))
    a.acquire()
    try:
        t = threading.Thread(target=lambda: b.acquire(timeout=20), daemon=True)
        t.start()
        eventually(lambda: (raw_read(url)[0] or LockRecord()).waiter_label == Label("job B", 12.0), what="b waits, labelled")
        st = a.status()
        assert (st.owner_label, st.waiter_label) == (Label("job A"), Label("job B", 12.0))
        assert a.release() == "b"
        t.join(20)
        assert b.is_held
        record = raw_read(url)[0]
        assert (record.owner_id, record.owner_label, record.waiter_label) == ("b", Label("job B", 12.0), None)
        b.release()
        record = raw_read(url)[0]
        assert record.owner_label is None
    finally:
        for lock in (a, b):
            lock.cancel()
            lock._unschedule()  # private: stop its renewals without releasing


def test_an_heir_with_a_longer_ttl_than_its_predecessor_is_healthy_on_arrival_and_stays_held(world):
    owner = world.lock("O", ttl=4.0, min_hold=0)
    heir = world.lock("H", ttl=20.0, min_hold=0)
    assert owner.acquire()

    def hand_over(sender, **kw):
        sender.release()

    with signals.on_release_requested.connected_to(hand_over, sender=owner):
        assert heir.acquire(timeout=30)
    assert heir.healthy, "the heir was lost on arrival"
    record = world.record()
    assert record.ttl == 20.0, "the handoff wrote the heir's own ttl"
    for _ in range(40):  # 40 renew intervals of the heir
        world.clock.advance(heir.renew_interval / 2)
        world.sched.run_pending()
        assert heir.healthy
    assert world.record().owner_id == "H" and world.record().expires_at > record.expires_at


def test_an_heir_is_asked_at_once_for_a_waiter_that_registered_during_the_handoff(world):
    """The owner hands over to H; before H's next poll reads the handoff, C registers as the
    waiter. The record H takes already names C, and H's renewals, which write against that very
    generation, would never meet C: before, H heard of C only at its first waiter check, a full
    check interval later (30 s here). Now that check runs at once, after acquire() has returned
    (receivers never run inside acquire(): the caller has not loaded its state yet)."""
    owner = world.lock("O", ttl=10.0, min_hold=0)
    heir = world.lock("H", ttl=10.0, waiter_check_interval=30.0, min_hold=0)
    asked: list[str] = []
    assert owner.acquire()

    def hand_over(sender, **kw):
        sender.release()
        record = world.record()
        assert record.owner_id == "H"  # handed over; H has not read it yet
        world.store.write(KEY, record.replace(nonce="c", waiting_owner_id="C", waiter_expires_at=world.clock.time() + 5).encode(),
                          if_generation_match=world.generation())

    heir_asked = lambda sender, waiter_id=None, **kw: asked.append(waiter_id)  # noqa: E731
    with signals.on_release_requested.connected_to(hand_over, sender=owner), \
            signals.on_release_requested.connected_to(heir_asked, sender=heir):
        assert heir.acquire(timeout=30)
        assert asked == [], "a receiver ran inside acquire()"
        world.sched.run_pending()  # the scheduler's next pass, no time passing
        assert heir.release_requested and asked == ["C"], "the heir did not hear of the waiter in the record it took"


def test_a_patient_waiter_is_never_announced_and_still_gets_the_lock_at_release(sim):
    a, b = lock_for(sim, "a"), lock_for(sim, "b")
    heard = []
    hold = lambda sender, **kw: heard.append(kw)  # noqa: E731
    signals.on_release_requested.connect(hold, sender=a)
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(request_release=False, timeout=60))
    sim.run_until(waiter_is(sim, "b"), what="b registered")
    assert sim.record().request.asks is False
    sim.run_for(1.0)  # five waiter checks
    assert not a.release_requested and heard == []
    assert "waits for the holder to finish" in status_text(sim.call(a.status))
    assert sim.call(a.release) == "b"
    sim.run_until(lambda: box.done)
    assert isinstance(box.result, Acquired) and b.is_held


def test_the_release_hands_the_lock_to_a_patient_waiter():
    d = protocol.decide_release(held(PATIENT), GEN, me=Me("a", "ia"), token=7, now=NOW, timing=DECIDING, nonce="n")
    assert isinstance(d, Write) and d.kind is Kind.HANDOFF and d.record.owner_id == "w"
    assert d.record.waiter_request is None and not d.record.declined
