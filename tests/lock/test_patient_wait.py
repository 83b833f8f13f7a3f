"""A patient wait, a holder that declines, and what ``timeout=`` promises.

On simulated time (the ``sim`` fixture): each lock is a process of its own, its waits and its
duties running as the simulation's threads, at GCS's and S3's write pacing (one write a second
to the object). The locks of one test share one store, and so one write gate: ttl 16 renews
every 2 s, which leaves the gate room for the waiters' own writes.
"""

from __future__ import annotations

import pytest

from handofflock import (
    AcquireCancelled,
    ConfigurationError,
    HandoffLock,
    LockContended,
    LockTimeout,
    signals,
)
from handofflock.cli import status_text
from handofflock.storage import MemoryStorage

TIMING = dict(
    ttl=16.0, waiter_check_interval=0.2, waiter_poll_interval=0.1, max_clock_skew=0.5, min_write_interval=1.0
)


def lock_for(sim, owner, **kw):
    return sim.lock(owner, **{**TIMING, **kw})


def waiter_is(sim, who):
    return lambda: (sim.record() and sim.record().waiting_owner_id == who)


def test_a_patient_waiter_is_never_announced_and_still_gets_the_lock_at_release(sim):
    a, b = lock_for(sim, "a"), lock_for(sim, "b")
    heard = []
    hold = lambda sender, **kw: heard.append(kw)  # noqa: E731
    signals.on_release_requested.connect(hold, sender=a)
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(request_release=False, timeout=60))
    sim.run_until(waiter_is(sim, "b"), what="b registered")
    assert sim.record().request.asks is False
    sim.run_for(1.0)  # five waiter checks
    assert not a.release_requested and heard == []
    assert "waits for the holder to finish" in status_text(sim.call(a.status))
    assert sim.call(a.release) == "b"
    sim.run_until(lambda: box.done)
    assert box.result == True and b.is_held  # noqa: E712  (an Acquired, == True)


def test_an_asking_request_takes_the_slot_from_a_patient_one_which_waits_on(sim):
    a, p, q = lock_for(sim, "a"), lock_for(sim, "p"), lock_for(sim, "q")
    assert sim.call(a.acquire)
    bp = sim.start(lambda: p.acquire(request_release=False, timeout=60))
    sim.run_until(waiter_is(sim, "p"), what="p registered")
    bq = sim.start(lambda: q.acquire(timeout=60))
    sim.run_until(lambda: waiter_is(sim, "q")() or bq, what="q took the slot")
    assert not bq, bq
    sim.run_until(lambda: a.release_requested, what="the holder was asked by q")
    assert a.release_request.requester == "q"
    assert sim.call(a.release) == "q"
    sim.run_until(lambda: bq.done)
    assert bq.result == True  # noqa: E712
    sim.run_until(waiter_is(sim, "p"), what="p waits again, now for q")
    assert not q.release_requested  # p is patient with q too
    sim.call(q.release)
    sim.run_until(lambda: bp.done)
    assert bp.result == True, bp  # noqa: E712


def test_a_holder_that_does_not_yield_declines_in_the_record_and_is_not_asked(sim):
    a, b = lock_for(sim, "a", yield_to_requests=False), lock_for(sim, "b")
    heard = []
    hold = lambda sender, **kw: heard.append(kw)  # noqa: E731
    signals.on_release_requested.connect(hold, sender=a)
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(timeout=60))
    sim.run_until(lambda: sim.record().declined, limit=15, what="the decline written at a renewal")
    assert not a.release_requested and heard == []
    text = status_text(sim.call(a.status))
    assert "asked by " in text and "(b), declined" in text, text
    assert sim.call(a.release) == "b"  # it still hands the lock on when it is done
    sim.run_until(lambda: box.done)
    assert box.result == True  # noqa: E712


def test_with_a_timeout_an_acquire_waits_for_the_slot_and_without_one_says_how_to(sim):
    a, w, c = lock_for(sim, "a"), lock_for(sim, "w"), lock_for(sim, "c")
    assert sim.call(a.acquire)
    w_call = sim.start(lambda: w.acquire(timeout=60))
    sim.run_until(waiter_is(sim, "w"), what="w registered")
    started = sim.monotonic()
    with pytest.raises(LockContended) as now:
        sim.call(c.acquire)
    assert not isinstance(now.value, LockTimeout) and sim.monotonic() - started < 3
    message = str(now.value)
    assert "wait_for_slot=True" in message and "--wait-for-slot" in message and "timeout" in message
    assert "(+" not in message and "until" not in message, message  # no expiry of a lease that is renewed
    started = sim.monotonic()
    with pytest.raises(LockTimeout) as late:
        sim.call(lambda: c.acquire(timeout=1.5))
    assert sim.monotonic() - started >= 1.5, "a timeout is a promise to wait up to it"
    # Parties are named by label with the id in brackets, as status names them.
    text = str(late.value)
    assert "(c)" not in text and f"slot is {w.label.text} (w)'s" in text, text
    w.cancel()
    sim.run_until(lambda: w_call.done)


def test_a_timed_out_waiter_is_not_named_as_someone_else_waiting(sim):
    a, b = lock_for(sim, "a"), lock_for(sim, "b")
    assert sim.call(a.acquire)
    with pytest.raises(LockTimeout) as info:
        sim.call(lambda: b.acquire(timeout=1.0))
    message = str(info.value)
    # Before: "...; waiter 'b'", the caller itself. Now it says the slot was ours (or, where the store's
    # pacing kept our registration from landing within the second, that nobody else waits).
    assert "(b)" not in message, message  # named by label, with the id in brackets
    assert "we held the waiter slot" in message or "nobody else waits" in message, message


def test_a_stray_cancel_does_not_spoil_the_next_acquire(sim):
    a = lock_for(sim, "a")
    a.cancel()
    assert sim.call(lambda: a.acquire(timeout=5))
    sim.call(a.release)
    a.cancel()  # while nothing runs, again
    assert sim.call(a.acquire)


@pytest.mark.parametrize(
    "kwargs,says",
    [
        (dict(timeout="1"), "timeout must be a number"),
        (dict(timeout=True), "timeout must be a number"),
        (dict(blocking=False, timeout=5), "blocking=False never waits"),
        (dict(request_release="no"), "request_release must be True or False"),
        (dict(priority=1.5), "priority must be an integer"),
    ],
)
def test_acquire_refuses_arguments_it_cannot_honour_before_any_io(kwargs, says):
    lock = HandoffLock("memory://never-read/x.json", **TIMING)
    with pytest.raises(ConfigurationError, match=says):
        lock.acquire(**kwargs)
    assert MemoryStorage.named("never-read").read("x.json") is None


def test_a_cancel_still_stops_a_running_acquire(sim):
    a, b = lock_for(sim, "a"), lock_for(sim, "b")
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(request_release=False))
    sim.run_until(waiter_is(sim, "b"), what="b registered")
    b.cancel()
    sim.run_until(lambda: box.done)
    assert isinstance(box.error, AcquireCancelled)
    assert sim.record().waiting_owner_id is None


def test_a_waiter_displaced_by_a_higher_priority_waits_for_the_slot_again_without_a_timeout(sim):
    # design.md: "The displaced waiter sees the slot taken at its next poll and waits for it again".
    # A plain acquire() (asking, no timeout) that had registered must not turn the displacement into
    # LockContended halfway through its wait.
    o, w1, w2 = lock_for(sim, "o"), lock_for(sim, "w1"), lock_for(sim, "w2")
    assert sim.call(o.acquire)
    b1 = sim.start(w1.acquire)
    sim.run_until(waiter_is(sim, "w1"), what="w1 registered")
    b2 = sim.start(lambda: w2.acquire(priority=5, timeout=60))
    sim.run_until(lambda: waiter_is(sim, "w2")() or b2, what="w2 took the slot")
    assert not b2, b2
    sim.run_for(1.0)  # several of w1's polls with the slot taken
    assert not b1, f"the displaced waiter gave up: {b1}"
    assert sim.call(o.release) == "w2"
    sim.run_until(lambda: b2.done)
    assert b2.result == True  # noqa: E712 (an Acquired, equal to True)
    sim.run_until(lambda: waiter_is(sim, "w1")() or b1, what="w1 waits again, now for w2")
    assert not b1, b1
    sim.call(w2.release)
    sim.run_until(lambda: b1.done)
    assert b1.result == True and w1.is_held, b1  # noqa: E712 (an Acquired, equal to True)
