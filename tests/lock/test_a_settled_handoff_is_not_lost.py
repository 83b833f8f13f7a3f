"""An heir that reads its handoff late renews it at once; the scheduler's deadline check must not undo that.

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

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.storage import MemoryStorage

TTL = 10.0


def test_a_deadline_check_that_waited_for_the_settling_renewal_does_not_mark_the_lock_lost():
    name = f"settle-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock()
    url = f"memory://{name}/lock.json"
    owner = HandoffLock(url, ttl=TTL, owner_id="owner", min_write_interval=0.0, clock=clock,
                        scheduler=Scheduler(clock, autostart=False))  # fmt: skip
    sched = Scheduler(clock, autostart=False)
    heir = HandoffLock(url, ttl=TTL, owner_id="heir", min_write_interval=0.0, waiter_poll_interval=1.0,
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
