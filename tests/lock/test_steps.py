"""steps(): a training loop that hands the lock over between steps when asked."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from handofflock import FakeClock, HandoffLock, LockLost, Scheduler


@pytest.fixture
def url():
    return f"memory://training-{uuid.uuid4().hex[:8]}/lock.json"


def quiet_lock(url, **kw):
    """A lock whose background duties run only when the test says so."""
    clock = kw.pop("clock", None) or FakeClock()
    return HandoffLock(url, ttl=60.0, clock=clock, scheduler=Scheduler(clock, autostart=False), **kw)


def test_steps_hand_out_every_item_when_nobody_asks(url):
    lock = quiet_lock(url)
    with lock:
        steps = lock.steps(range(5))
        assert list(steps) == [0, 1, 2, 3, 4]
    assert (steps.last, steps.count, steps.stopped, steps.request) == (4, 5, False, None)


def test_a_request_during_a_step_ends_the_loop_after_that_step(url):
    lock = quiet_lock(url)
    done = []
    with lock:
        steps = lock.steps(range(100, 200))
        for step in steps:
            done.append(step)
            if step == 103:
                lock.request_release("operator", requester="test", deadline=123.0)
        assert steps.stopped and steps.last == 103 and steps.count == 4
        assert steps.request.reason == "operator" and steps.request.requester == "test"
        assert steps.request.deadline == 123.0
    assert done == [100, 101, 102, 103]


def test_a_request_made_before_the_loop_runs_no_step(url):
    lock = quiet_lock(url)
    with lock:
        lock.request_release("signal", requester="SIGTERM")
        steps = lock.steps(itertools.count())
        assert list(steps) == []
        assert steps.stopped and steps.last is None and steps.count == 0


def test_steps_refuse_to_start_a_step_once_the_lock_is_no_longer_safely_held(url):
    clock = FakeClock()
    lock = quiet_lock(url, clock=clock)
    lock.acquire()
    steps = lock.steps(itertools.count())
    assert next(steps) == 0
    clock.advance(lock.renew_deadline + 0.1)  # no renewal ran: the process was "paused"
    with pytest.raises(LockLost):
        next(steps)
    assert steps.last == 0


def test_steps_without_the_lock_raise_lock_lost(url):
    lock = quiet_lock(url)
    with pytest.raises(LockLost, match="not held"):
        next(iter(lock.steps(range(3))))


def test_a_waiter_stops_the_loop_within_the_check_interval_and_gets_a_higher_token(url):
    a = HandoffLock(url, ttl=10.0, waiter_check_interval=0.1, owner_id="trainer-A", min_hold=0)
    b = HandoffLock(url, ttl=10.0, waiter_poll_interval=0.05, owner_id="trainer-B")
    a.acquire()
    token_a = a.token
    got_b = threading.Event()
    waiter = threading.Thread(target=lambda: (b.acquire(timeout=10), got_b.set()), daemon=True)
    steps = a.steps(itertools.count())
    asked_at = None
    for step in steps:
        time.sleep(0.01)
        if step == 5:
            waiter.start()
            asked_at = time.monotonic()
    told_after = time.monotonic() - asked_at
    assert steps.stopped and steps.request.reason == "waiter"
    assert steps.request.requester == "trainer-B"
    assert steps.request.deadline is not None and steps.request.deadline > time.time()
    assert told_after < 2.0, told_after
    assert a.release() == "trainer-B"
    assert got_b.wait(5) and b.is_held and b.token > token_a
    b.release()


def test_the_measurement_script_runs_and_prints_its_numbers_with_their_conditions():
    """A benchmark, not a timed test: what it costs is measured there (docs/benchmarks.md), never asserted
    here. A bound of 1 µs for the flag failed on a loaded CI machine at 2.5 µs (68 ns idle)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "measure_yield_check.py"
    out = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=60, check=True).stdout
    for pattern in (r"lock.release_requested\s+([0-9.]+) ns/call", r"lock.check\(\)\s+([0-9.]+) ns/call",
                    r"lock.steps\(\) per item\s+(-?[0-9.]+) ns"):
        assert re.search(pattern, out), (pattern, out)
    assert re.search(r"measured on: Python [0-9.]+, \d+ CPUs .*load average", out), out
