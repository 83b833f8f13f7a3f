"""Interpreter exit and a dropped lock: exit never waits for a receiver.

Release at exit across real processes is in tests/processes/test_exit_release.py.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time
import weakref

import pytest
from lockutil import FAST, eventually, make_lock, raw_read, stepped_until, url_for

from handofflock import HandoffLock, signals


@pytest.mark.timeout(60)
def test_exit_does_not_wait_for_a_receiver(tmp_path):
    script = textwrap.dedent(f"""
        import threading, time
        from handofflock import HandoffLock, signals
        lock = HandoffLock({str(tmp_path / 'lock.json')!r}, ttl=2.0, renew_interval=0.2, renew_deadline=1.0)
        lock.acquire()
        running = threading.Event()
        signals.on_release_requested.connect(lambda s, **kw: (running.set(), time.sleep(60)), sender=lock, weak=False)
        lock.request_release("manual")
        assert running.wait(30)  # the receiver is running
        print("exiting", flush=True)
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout
    assert time.monotonic() - started < 30, "interpreter exit waited for the receiver"


# -- a lock whose last reference goes: released at once, its receivers with it ------------------------


@pytest.fixture
def no_collector():
    """The cycle collector off: whatever is released or disconnected happens by reference counting alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_temporary_acquire_is_released_at_once_without_the_collector(request, tmp_path, no_collector):
    url = url_for("memory", request, tmp_path)
    make_lock(url).acquire()  # the proxy and the lock go at the end of this statement
    eventually(lambda: raw_read(url)[0].owner_id is None, timeout=5, what="the dropped lock released")
    assert make_lock(url).acquire(blocking=False)


def test_a_held_lock_whose_last_reference_goes_is_released_and_then_freed(request, tmp_path, no_collector):
    url = url_for("memory", request, tmp_path)
    lock = make_lock(url)
    assert lock.acquire()
    heard: list = []
    signals.released.connect(lambda sender, **kw: heard.append(kw["token"]), sender=lock)
    token, gone = lock.token, weakref.ref(lock)
    del lock
    eventually(lambda: gone() is None, timeout=5, what="the dropped lock freed")
    assert raw_read(url)[0].owner_id is None
    assert heard == [token]  # its receivers heard the release, then went with it


def test_short_lived_locks_leave_no_receivers_connected(no_collector):
    before = {s: len(s.receivers) for s in (signals.acquired, signals.on_release_requested)}
    for n in range(100):  # a receiver left behind by each lock would show after one; a hundred reuse ids too
        lock = HandoffLock(f"memory://drop-{n}/l.json", **FAST)
        signals.acquired.connect(lambda sender, **kw: None, sender=lock)
        signals.on_release_requested.connect(lambda sender, n=n, **kw: n, sender=lock)
    del lock
    assert {s: len(s.receivers) for s in before} == before


def _closing_over(lock):
    return lambda sender, **kw: lock.url


def test_a_receiver_that_closes_over_its_lock_goes_with_it_when_the_collector_runs(world, no_collector):
    """The lock keeps the receiver and the receiver the lock: a cycle, which only the collector frees.
    Then the lock is released, as any lock whose last reference went, and the receiver disconnected."""
    lock = world.lock("a", **FAST, release_at_exit=True)  # what a lock on the real clock does by default
    assert lock.acquire()
    signals.on_release_requested.connect(_closing_over(lock), sender=lock)
    before = len(signals.on_release_requested.receivers)
    gone = weakref.ref(lock)
    held_until = world.record().expires_at
    del lock
    renewed = lambda: world.record().expires_at > held_until  # noqa: E731
    stepped_until(world.clock, renewed, within=5, what="a renewal after the reference went")
    assert gone() is not None and world.record().owner_id is not None  # the cycle keeps it, held and renewed
    gc.collect()
    eventually(lambda: world.record().owner_id is None, timeout=5, what="the collected lock released")
    eventually(lambda: gone() is None, timeout=5, what="the collected lock freed")
    assert len(signals.on_release_requested.receivers) == before - 1
