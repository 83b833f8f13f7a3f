"""No read, check or listing holds back a renewal, and every request fits the window.

The owner's waiter check reads the record in the background. A read that
stalls (6 s here, well under GCS's 15 s read timeout) must not hold the I/O
mutex, nor keep the scheduler from starting a renewal that falls due: at ttl
10 the renew deadline is 5 s, and before the fix the owner called itself lost
after 5 s although every write would have succeeded. Real clock, real
scheduler, the memory store's ``before`` hook stalling the read on simulated
time (the ``sim`` fixture); through the fault proxy, fake-gcs-server stalling it
in real time.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from handofflock import ConfigurationError, HandoffLock, Timing, signals
from handofflock.storage.gcs import GCSStorage
from handofflock.testing.faultproxy import FaultProxy
from simworld import KEY

STALL = 6.0


def _held_through_a_stalled_read(lock: HandoffLock, arm_stall) -> list[dict]:
    """Hold ``lock``, stall its next background read for STALL seconds, and return the losses seen."""
    lost: list[dict] = []

    def on_lost(sender, **kw):
        lost.append(kw)

    with signals.lost.connected_to(on_lost, sender=lock):
        assert lock.acquire(timeout=10)
        try:
            started = arm_stall()
            assert started.wait(lock.waiter_check_interval + 3), "no waiter check read the record"
            time.sleep(STALL + 1.0)
            assert lock.healthy and not lost, f"a stalled waiter-check read cost the lease: {lost}"
        finally:
            lock.release()
    return lost


def _sim_held_through_a_stalled_read(sim, lock: HandoffLock, arm_stall) -> None:
    """:func:`_held_through_a_stalled_read` on simulated time: the stall is a simulated thread asleep."""
    lost: list[dict] = []

    def on_lost(sender, **kw):
        lost.append(kw)

    with signals.lost.connected_to(on_lost, sender=lock):
        assert sim.call(lambda: lock.acquire(timeout=10))
        started = arm_stall()
        sim.run_until(started.is_set, limit=lock.waiter_check_interval + 3, what="a waiter check reading the record")
        sim.run_for(STALL + 1.0)
        assert lock.healthy and not lost, f"a stalled waiter-check read cost the lease: {lost}"
        sim.call(lock.release)


def _stall_once(sim, started: threading.Event):
    def stall(op, key):
        if not started.is_set():
            started.set()
            sim.sleep(STALL)

    return stall


def test_a_waiter_check_read_that_stalls_6_s_never_holds_back_a_renewal(sim):
    lock = sim.lock("A", key=KEY, ttl=10.0)
    assert lock.min_write_interval == 0.0 and lock.renew_deadline == 5.0  # default pacing
    writes: list[float] = []
    sim.store.faults.after("write", lambda op, key, result: writes.append(sim.monotonic()))

    def arm() -> threading.Event:
        started = threading.Event()
        sim.store.faults.before("read", _stall_once(sim, started))
        return started

    _sim_held_through_a_stalled_read(sim, lock, arm)
    gaps = [b - a for a, b in zip(writes, writes[1:])]
    assert max(gaps) < lock.renew_deadline - 1.0, f"renewals stopped during the stall: {gaps}"


def test_a_grouped_waiter_check_whose_read_stalls_never_holds_back_a_renewal(sim):
    """Two locks in one "directory" (one process) are checked by one listing; a lock the listing does not
    show is read, and that read stalls. Its renewals go on meanwhile."""
    other = sim.lock("B", key="locks/b.json", ttl=10.0)
    lock = sim.lock("A", key=KEY, ttl=10.0, beside=other)

    def arm() -> threading.Event:
        started = threading.Event()
        # The listing leaves the lock out, so its check reads it: that read stalls.
        sim.store.faults.after("list", lambda op, key, found: found.pop(KEY, None))
        sim.store.faults.before("read", _stall_once(sim, started), key=KEY)
        return started

    assert sim.call(lambda: other.acquire(timeout=10))
    _sim_held_through_a_stalled_read(sim, lock, arm)
    assert other.healthy
    sim.call(other.release)


def test_a_store_request_timeout_longer_than_the_renewal_window_is_refused():
    timing = Timing.build(ttl=10.0, min_write_interval=1.0)
    assert timing.request_timeout == (timing.renew_deadline - timing.renew_interval) / 2 == 1.875
    store = GCSStorage("some-bucket", request_timeout=20.0)
    with pytest.raises(ConfigurationError, match=r"request_timeout=20 s .* at most .* = 1.875 s"):
        HandoffLock("gs://some-bucket/locks/a.json", storage=store, key=KEY, ttl=10.0)
    with pytest.raises(ConfigurationError, match="request_timeout=20 s"):
        HandoffLock("gs://some-bucket/locks/a.json", storage=store, key=KEY, timing=timing)
    # Left at its default (20 s on GCS), the store is fine: the lock bounds its own requests.
    HandoffLock("gs://some-bucket/locks/a.json", storage=GCSStorage("some-bucket"), key=KEY, ttl=10.0)
    HandoffLock("gs://some-bucket/locks/a.json", storage=GCSStorage("some-bucket", request_timeout=1.5), key=KEY, ttl=10.0)


@pytest.mark.gcs
def test_a_waiter_check_read_that_gcs_stalls_6_s_never_holds_back_a_renewal(gcs_emulator):
    """Through the fault proxy to fake-gcs-server, at GCS's default timeouts (5 s, 15 s) and pacing:
    the proxy holds the owner's next read 6 s before forwarding it."""
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(bucket)
    with FaultProxy(gcs_emulator.url, lifetime=120) as proxy:
        with proxy.env():
            store = GCSStorage(bucket)
        lock = HandoffLock(f"gs://{bucket}/{KEY}", storage=store, key=KEY, ttl=10.0)
        assert lock.min_write_interval == 1.0 and lock.renew_deadline == 5.0

        def arm() -> threading.Event:
            started = threading.Event()
            proxy.inject("delay", method="GET", delay=STALL, when=lambda ex: bool(started.set()) or True)
            return started

        _held_through_a_stalled_read(lock, arm)
        posts = [ex.started for ex in proxy.exchanges("POST")]
        gaps = [b - a for a, b in zip(posts, posts[1:])]
        assert max(gaps) < lock.renew_deadline - 1.0, f"renewals stopped during the stall: {gaps}"
