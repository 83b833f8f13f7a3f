"""GCS's own 429 never costs an owner its lease (issue 25, item 1).

GCS answers 429 when one object is written faster than about once a second.
The write gate then widens the spacing of writes to the object (2 s, 4, 8);
a renewal that waited that out at the shortest ttl (5 s on GCS: 1.5 s between
a renewal and its deadline) was lost. Now a renewal honours the widened spacing
only while it has room (``Timing.backoff_until``) and then goes at the store's
own spacing, so ``Timing``'s promise (after a failed renewal one more write
still lands in time) holds for a 429 as for a 503.

The memory store runs with ``min_write_interval=1``, GCS's default spacing, on
simulated time; one test goes through the fault proxy to fake-gcs-server.
"""

from __future__ import annotations

import time
import uuid

import pytest
from simworld import KEY

from handofflock import HandoffLock, LockLost, TransientStorageError, signals
from handofflock.storage.gcs import GCSStorage
from handofflock.testing.faultproxy import FaultProxy

GCS_SPACING = 1.0


def _429() -> TransientStorageError:
    return TransientStorageError("429: the object exceeded the rate limit for mutations", status=429, ambiguous=False)


def _503() -> TransientStorageError:
    return TransientStorageError("503: backend error", status=503, ambiguous=True)  # as GCS's 503 maps


FAULTS = {"429": _429, "503": _503}


def why_lost(lock: HandoffLock) -> str:
    """Why ``check()`` says the lock is lost (``LockLost.reason``), or "" while it is healthy."""
    try:
        lock.check()
    except LockLost as lost:
        return lost.reason
    return ""


def owner_meets(world, ttl: float, answers: list[str]) -> tuple[HandoffLock, list[float]]:
    """An owner at GCS's spacing whose next renewals are answered ``answers``, then 30 s on; and the times
    of its write calls."""
    write_times = world.timed_writes()
    a = world.lock("A", ttl=ttl, min_write_interval=GCS_SPACING)
    assert a.acquire()
    world.clock.run_for(3 * a.renew_interval + 0.1)  # steady renewals first
    for answer in answers:
        world.store.faults.fail_next("write", key=KEY, exc=FAULTS[answer])
    world.clock.run_for(30.0)
    return a, write_times


@pytest.mark.parametrize("ttl", [5.0, 6.0])
def test_one_429_on_a_renewal_costs_no_lease_at_the_shortest_ttls(world, ttl):
    a, write_times = owner_meets(world, ttl, ["429"])
    assert a.healthy and a.is_held, f"lost at ttl {ttl}: {why_lost(a)}"
    gaps = [later - earlier for earlier, later in zip(write_times, write_times[1:], strict=False)]
    assert max(gaps) < 2.0, f"a retry waited out the widened spacing: {gaps}"


@pytest.mark.parametrize("answers", [["429", "429"], ["429", "503"]], ids="-then-".join)
@pytest.mark.parametrize("ttl", [7.0, 8.0, 10.0])
def test_two_failures_in_a_row_starting_with_a_429_cost_no_lease_from_ttl_7(world, ttl, answers):
    a, _ = owner_meets(world, ttl, answers)
    assert a.healthy and a.is_held, f"lost at ttl {ttl} after {answers}: {why_lost(a)}"


def test_a_renewal_with_room_still_waits_out_the_backoff_gcs_asked_for(world):
    """At ttl 60 a renewal has 22.5 s to spare: after a 429 its retry waits the widened 2 s."""
    a, write_times = owner_meets(world, 60.0, ["429"])
    assert a.healthy
    refused = next(i for i, t in enumerate(write_times) if i > 0 and t - write_times[i - 1] < 7.4)
    assert write_times[refused] - write_times[refused - 1] >= 2.0 - 1e-9, write_times


def test_the_shortest_ttl_on_gcs_is_still_5_s(world):
    a = world.lock("A", ttl=5.0, min_write_interval=GCS_SPACING)
    assert a.timing.backoff_until(100.0) == 100.0 - 1.5


@pytest.mark.gcs
def test_one_429_from_gcs_on_a_renewal_costs_no_lease_at_ttl_6(gcs_emulator):
    """Through the fault proxy to fake-gcs-server, on the real clock, at GCS's default pacing.

    ttl 6: a renewal every second, 2 s between a renewal and its deadline. Before, the retry
    waited out the 2 s spacing and the owner called itself lost; now it goes a second after
    the 429'd send, with a second to spare (room for a loaded machine)."""
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(bucket)
    lost: list[dict] = []
    with FaultProxy(gcs_emulator.url, lifetime=120) as proxy:
        with proxy.env():
            store = GCSStorage(bucket, timeout=(1.0, 2.0))
        lock = HandoffLock(f"gs://{bucket}/{KEY}", storage=store, key=KEY, ttl=6.0)
        assert lock.min_write_interval == GCS_SPACING, "GCS's default spacing"

        def on_lost(sender, **kw):
            lost.append(kw)

        with signals.lost.connected_to(on_lost, sender=lock):
            assert lock.acquire(timeout=10)
            try:
                time.sleep(2.2)
                rule = proxy.inject("429", method="POST")
                deadline = time.monotonic() + 5
                while not rule.fired and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert rule.fired, "no renewal was sent"
                time.sleep(4.0)
                assert lock.healthy and not lost, f"lost after one 429: {lost}"
                posts = [ex for ex in proxy.exchanges("POST")]
                i = next(i for i, ex in enumerate(posts) if ex.fault == "429")
                assert posts[i + 1].status == 200
                assert posts[i + 1].started - posts[i].started < 2.0, "the retry waited the widened spacing"
            finally:
                lock.release()
