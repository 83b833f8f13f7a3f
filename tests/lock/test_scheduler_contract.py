"""The Scheduled protocol is the scheduler's whole contract: anything of that shape gets scheduled.

If the scheduler reached past the protocol into a lock's private members, these
plain objects (which have none) would break it.
"""

import math
import threading

from handofflock import FakeClock, Scheduler
from handofflock.lock.scheduler import Scheduled
from handofflock.storage import MemoryStorage


class Ticker:
    """Due every ``every`` seconds; counts its runs and its checks."""

    def __init__(self, clock, store, key, every=1.0, check=math.inf):
        self.clock, self._store, self._key = clock, store, key
        self.every, self.check = every, check
        self.next_at = clock.monotonic() + every
        self.next_check = clock.monotonic() + check
        self.runs, self.checked = 0, []
        self.ran = threading.Event()

    check_interval = property(lambda self: self.check)
    store = property(lambda self: self._store)
    key = property(lambda self: self._key)
    request_timeout = 5.0

    def next_due(self):
        return min(self.next_at, self.next_check)

    def next_due_besides_check(self):
        return self.next_at

    def next_check_at(self):
        return self.next_check

    def run_due(self):
        now = self.clock.monotonic()
        if now >= self.next_at:
            self.runs += 1
            self.next_at = now + self.every
            self.ran.set()
        if now >= self.next_check:
            self.checked.append(None)
            self.next_check = now + self.check

    def check_against(self, generation):
        self.checked.append(generation)
        self.next_check = self.clock.monotonic() + self.check


def test_a_plain_object_of_the_scheduled_shape_is_run_when_due():
    clock = FakeClock()
    sched = Scheduler(clock, autostart=False)
    ticker: Scheduled = Ticker(clock, MemoryStorage("contract"), "root.json", every=1.0)
    sched.add(ticker)
    sched.run_pending()
    assert ticker.runs == 0  # not due yet
    for _ in range(3):
        clock.advance(1.0)
        sched.run_pending()
    assert ticker.runs == 3
    sched.discard(ticker)
    clock.advance(5.0)
    sched.run_pending()
    assert ticker.runs == 3  # discarded: never run again


def test_objects_under_one_prefix_are_checked_against_one_listing():
    clock = FakeClock()
    store = MemoryStorage("contract-group")
    generation = store.write("jobs/a.json", b"{}", if_generation_match=0)
    sched = Scheduler(clock, autostart=False)
    a = Ticker(clock, store, "jobs/a.json", every=100.0, check=1.0)
    b = Ticker(clock, store, "jobs/b.json", every=100.0, check=1.0)
    sched.add(a)
    sched.add(b)
    clock.advance(1.0)
    sched.run_pending()
    assert a.checked == [generation] and b.checked == [0]  # b's object is not listed
    assert store.calls["list"] == 1
