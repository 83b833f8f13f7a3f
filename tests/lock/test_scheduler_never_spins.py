"""The scheduler sleeps between duties: no plan of it asks to run again at once, again and again.

Each case here was a busy loop found by the simulation (issue 26) once the
real scheduler loop ran in it: simulated time stands still between steps, so a
loop that plans a wait of 0 (or of float dust) without doing anything never
lets time move, and the hub reports a livelock. On a real host time moves, and
the same loop burns a core (a group's slow listing, a release being retried)
or spins for one tick (dust).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.core.errors import TransientStorageError
from handofflock.storage import MemoryStorage
from handofflock.storage.records import WriteGate

CHECK = 2.0


def test_a_group_beat_slower_than_its_interval_does_not_set_the_loop_spinning():
    name = f"spin-group-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, name="spin-group")
    locks = [HandoffLock(f"memory://{name}/locks/l{i}.json", ttl=60.0, waiter_check_interval=CHECK,
                         clock=clock, scheduler=sched) for i in range(2)]  # fmt: skip
    listing, gate = threading.Event(), threading.Event()

    def stall(op, key):
        listing.set()
        gate.wait(10)

    try:
        for lock in locks:
            assert lock.acquire()
        store.faults.before("list", stall)
        clock.advance(CHECK)  # the group's beat falls due: its listing stalls
        assert listing.wait(5), "the group's beat never started"
        clock.advance(3 * CHECK)  # the beat is now overdue, and still running
        time.sleep(0.2)
        before = clock.waits.count(0.0)
        time.sleep(0.5)
        spun = clock.waits.count(0.0) - before
        assert spun <= 2, f"the loop planned {spun} waits of 0 s in 0.5 s while the beat ran"
    finally:
        gate.set()
        store.faults.clear()
        for lock in locks:
            if lock.is_held:
                lock.release()
        sched.stop()
        MemoryStorage.forget(name)


def test_a_lock_whose_release_is_being_retried_asks_for_no_waiter_check():
    name = f"spin-release-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(step=0.5)
    sched = Scheduler(clock, autostart=False)
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=30.0, clock=clock, scheduler=sched)
    try:
        assert lock.acquire()
        store.faults.fail_next("write", count=10**6)
        with pytest.raises(TransientStorageError):
            lock.release()  # retried until its deadline, long past the waiter check that was due
        # Releasing: the retry is due in a second; a waiter check would do nothing, so none is started.
        assert sched.run_pending() == 0
        store.faults.clear()
        clock.advance(1.0)
        assert sched.run_pending() == 1  # the retry, which lands
        assert not lock.is_held
    finally:
        store.faults.clear()
        MemoryStorage.forget(name)


def test_a_write_gate_never_asks_for_a_wait_that_take_would_not_honour():
    gate = WriteGate(1.0)
    assert gate.take(100.0) and gate.take(100.0, urgent=True)  # the burst: the bucket is empty now
    almost = 101.0 - 1e-13  # one write refilled, short by float dust only
    assert gate.ready_in(almost, urgent=True) == 0.0
    assert gate.take(almost, urgent=True)
