"""A lease that comes to acquire() late is renewed before it returns, and stays held.

An heir that reads its handoff late renews it at once; the scheduler's deadline check must not undo that.
A take whose reply was lost and confirmed late is renewed the same way.

Found by the simulation (issue 26, an async heir paused as it was handed the
lock): the heir's acquire renewed the short handed lease under the I/O mutex
while the scheduler, which had seen the lease past its window a moment before,
waited for that mutex to declare the hold lost. It got the mutex after the
renewal had landed and marked the lock lost anyway: acquire() returned a lock
that was already lost, and the store named it the live owner for a whole ttl,
held by nobody.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.storage import MemoryStorage

TTL = 10.0


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
