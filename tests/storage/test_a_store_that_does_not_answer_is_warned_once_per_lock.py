"""A lock whose store does not answer says so once, where a user sees it without setting logging up.

The retry loops ride out transient failures quietly; the ``handofflock.storage`` log says when
an outage starts, but the library's loggers have a ``NullHandler``, so without logging set up
nothing showed. Now each lock warns once (``warnings.warn``, a ``StoreUnreachableWarning``) when
failures have lasted longer than one request may take (``Timing.request_timeout``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

from handofflock.core.errors import StoreUnreachableWarning

#: ttl 10: a request may take (renew_deadline - renew_interval) / 2 = (5 - 1.25) / 2 = 1.875 s.
TTL = 10.0


def warned(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [w for w in seen if issubclass(w.category, StoreUnreachableWarning)]


def test_a_blip_shorter_than_a_request_is_not_warned(world):
    lock = world.lock("A", ttl=TTL)
    world.store.faults.fail_next("read", count=1)  # one 503, retried after at most 0.1 s
    assert warned(lambda: lock.status(timeout=30)) == []


def test_an_outage_longer_than_a_request_is_warned_once_per_lock(world):
    a, b = world.lock("A", ttl=TTL), world.lock("B", ttl=TTL)
    assert a.timing.request_timeout == 1.875
    world.store.faults.fail_next("read", count=40)  # about 40 s of retries at up to 2 s apart
    first = warned(lambda: a.status(timeout=120))
    assert len(first) == 1, first
    message = str(first[0].message)
    assert a.url in message and "injected fault" in message and "still trying" in message
    world.store.faults.fail_next("read", count=40)
    assert warned(lambda: a.status(timeout=120)) == [], "warned twice for one lock"
    world.store.faults.fail_next("read", count=40)
    assert len(warned(lambda: b.status(timeout=120))) == 1, "another lock is another warning"


def test_the_warning_shows_on_stderr_without_logging_set_up():
    script = textwrap.dedent(
        f"""
        from handofflock import HandoffLock
        from handofflock.storage import MemoryStorage
        from handofflock.testing.clock import FakeClock

        store = MemoryStorage("unreachable")
        store.faults.fail_next("read", count=40)
        lock = HandoffLock("memory://unreachable/k.json", storage=store, key="k.json", clock=FakeClock(step=0.05),
                           ttl={TTL})
        lock.status(timeout=120)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("StoreUnreachableWarning") == 1, done.stderr
    assert "the store of lock memory://unreachable/k.json has not answered for over 1.875 s" in done.stderr
