"""The write gate after a 429: backoff while the writer has room, the store's own spacing after (issue 25).

GCS answers 429 when one object is written faster than about once a second,
and the gate then widens the spacing (2 s, 4, 8). An urgent write that says
how long it can wait (``by``) honours the widening while it fits, and past
that waits only ``min_interval`` after the previous write sent to the object.
"""

from __future__ import annotations

import pytest

from handofflock import FakeClock
from handofflock.core.errors import TransientStorageError
from handofflock.core.timing import RETRY_SPACINGS, Timing
from handofflock.storage import MemoryStorage
from handofflock.storage.records import WriteGate, write_resolving

GCS_SPACING = 1.0


def throttled_after_a_send(at: float = 100.0) -> WriteGate:
    gate = WriteGate(GCS_SPACING)
    assert gate.take(at, urgent=True)  # the renewal GCS answered with a 429
    gate.throttled()  # the spacing doubles to 2 s and the bucket empties
    return gate


def test_an_urgent_write_with_no_room_left_waits_the_stores_spacing_not_the_widened_one():
    gate = throttled_after_a_send()
    assert gate.interval == 2.0
    # The lease needs the retry sent by 100.5: two seconds of backoff would lose it.
    assert gate.ready_in(100.1, urgent=True, by=100.5) == pytest.approx(0.9)
    assert not gate.take(100.5, urgent=True, by=100.5)
    assert gate.take(101.0, urgent=True, by=100.5), "one spacing after the 429'd send, the renewal goes"


def test_an_urgent_write_with_room_waits_out_the_backoff_gcs_asked_for():
    gate = throttled_after_a_send()
    assert gate.ready_in(100.1, urgent=True, by=110.0) == pytest.approx(1.9)
    assert not gate.take(101.0, urgent=True, by=110.0)
    assert gate.take(102.0, urgent=True, by=110.0)


def test_ordinary_writes_and_writers_that_name_no_limit_keep_the_whole_backoff():
    gate = throttled_after_a_send()
    assert gate.ready_in(101.0, urgent=True) == pytest.approx(1.0)
    assert gate.ready_in(101.0, by=100.5) == pytest.approx(1.0), "a waiter's registration can wait"


def test_two_429s_in_a_row_still_leave_the_next_try_one_spacing_after_the_last():
    gate = throttled_after_a_send()
    assert gate.take(101.0, urgent=True, by=100.0)
    gate.throttled()  # the retry got a 429 too: the spacing is 4 s
    assert gate.interval == 4.0
    assert gate.ready_in(101.2, urgent=True, by=100.0) == pytest.approx(0.8)


def test_the_store_spacing_floor_counts_from_the_last_write_of_any_kind():
    gate = throttled_after_a_send()
    gate._tokens = 1.0  # (a refill) an ordinary write goes at 102
    assert gate.take(102.0)
    assert gate.ready_in(102.5, urgent=True, by=100.0) == pytest.approx(0.5)


def test_write_resolving_sends_a_renewal_with_no_room_at_the_stores_spacing():
    """Through the retry loop: the 429'd renewal's retry goes one spacing after it, not two."""

    clock = FakeClock(step=0.05)
    store = MemoryStorage("gate-lease-first")
    gate = WriteGate(GCS_SPACING)
    store.faults.fail_next("write", exc=lambda: TransientStorageError("429", status=429, ambiguous=False))
    start = clock.monotonic()
    deadline = start + 1.5  # ttl 5 on GCS: renew_deadline - renew_interval
    generation, _ = write_resolving(store, "k", b"x", if_generation_match=0, is_ours=lambda d: False, clock=clock,
                                    deadline=deadline, max_bytes=64, gate=gate, urgent=True,
                                    send_by=deadline - RETRY_SPACINGS * GCS_SPACING)
    assert generation > 0 and clock.monotonic() - start == pytest.approx(1.0, abs=0.06)


@pytest.mark.parametrize("ttl", [5.0, 6.0, 10.0, 60.0])
def test_backoff_until_leaves_room_for_one_more_write_at_the_stores_spacing(ttl):
    t = Timing.build(ttl=ttl, min_write_interval=GCS_SPACING)
    assert t.backoff_until(1000.0) == 1000.0 - RETRY_SPACINGS * GCS_SPACING
    assert Timing.build(ttl=ttl).backoff_until(1000.0) == 1000.0, "a store with no spacing: up to the deadline"
