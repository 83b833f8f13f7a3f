"""A lock held again after its release was retried is still checked for a waiter, beside a neighbour still releasing.

A waiter check is due only while a lock is held (``Duties.next_check_at`` is inf otherwise). Two locks
under one prefix whose releases failed (a store outage) are scheduled as a group while neither is held:
the group's beat starts at inf. When one of them is held again, its waiter must still be checked on time,
not only once the other has stopped retrying its release (up to its whole lease later).
"""

from __future__ import annotations

import uuid

import pytest

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.core.errors import TransientStorageError
from handofflock.storage import MemoryStorage

CHECK = 2.0


def test_a_lock_held_again_beside_a_neighbour_still_releasing_is_checked_for_waiters():
    name = f"group-inf-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(step=0.5)
    sched = Scheduler(clock, autostart=False)
    timing = dict(ttl=600.0, renew_deadline=20.0, renew_interval=5.0, waiter_check_interval=CHECK)
    a, b = (
        HandoffLock(f"memory://{name}/locks/{n}.json", clock=clock, scheduler=sched, **timing)
        for n in ("a", "b")
    )
    looked: list[str | None] = []
    try:
        assert a.acquire() and b.acquire()
        store.faults.fail_next("write", count=10**6)
        for lock in (a, b):
            with pytest.raises(TransientStorageError):
                lock.release()  # both retried in the background: a group of two, neither held
        sched.run_pending()
        store.faults.clear()
        store.faults.fail_next("write", count=10**6, key="locks/b.json")  # b's outage goes on
        clock.advance(1.0)
        sched.run_pending()  # a's release lands; b's is retried again
        assert not a.is_held and not b.is_held
        assert a.acquire()  # a is held again; b is still releasing
        store.faults.before("list", lambda op, key: looked.append(key))
        store.faults.before("read", lambda op, key: looked.append(key), key="locks/a.json")
        for _ in range(4):
            clock.advance(CHECK)
            sched.run_pending()
        assert looked, f"no waiter check of a in {4 * CHECK} s (interval {CHECK} s) while b was releasing"
    finally:
        store.faults.clear()
        for lock in (a, b):
            if lock.is_held:
                lock.release()
        MemoryStorage.forget(name)
