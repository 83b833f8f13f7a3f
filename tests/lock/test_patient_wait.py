"""A patient wait, a holder that declines, and what ``timeout=`` promises (issue 24, items 1, 7 and 11).

On every backend, at the store's own write pacing (1 s on GCS and S3). The locks of one
test share one process, and so one write gate per object: ttl 16 renews every 2 s, which
leaves the gate room for the waiters' own writes (at ttl 6 the owner's renewal each
second would keep a second waiter's registration out, as it would in one process of a user's).
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from lockutil import eventually, raw_read, url_for

from handofflock import (
    AcquireCancelled,
    ConfigurationError,
    HandoffLock,
    HandoffLockError,
    LockContended,
    LockTimeout,
    signals,
)
from handofflock.cli import status_text
from handofflock.storage import MemoryStorage
from handofflock.lock import Acquired

pytestmark = pytest.mark.timeout(90)

TIMING = dict(ttl=16.0, waiter_check_interval=0.2, waiter_poll_interval=0.1, max_clock_skew=0.5)


@pytest.fixture(params=["memory", "local", "gcs", "s3"])
def url(request, tmp_path):
    u = url_for(request.param, request, tmp_path)
    yield u
    if u.startswith("memory://"):
        MemoryStorage.forget(u.split("/")[2])


@pytest.fixture
def made():
    locks: list[HandoffLock] = []
    yield locks
    for lock in locks:
        lock.cancel()
        if lock.is_held:
            with contextlib.suppress(HandoffLockError):
                lock.release()
        lock._unschedule()  # private: stop its renewals without releasing


def lock_for(url, made, owner, **kw):
    lock = HandoffLock(url, owner_id=owner, **{**TIMING, **kw})
    made.append(lock)
    return lock


def in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def waiter_is(url, who):
    return lambda: (raw_read(url)[0] and raw_read(url)[0].waiting_owner_id == who)


def test_a_patient_waiter_is_never_announced_and_still_gets_the_lock_at_release(url, made):
    a, b = lock_for(url, made, "a"), lock_for(url, made, "b")
    heard = []
    hold = lambda sender, **kw: heard.append(kw)  # noqa: E731
    signals.on_release_requested.connect(hold, sender=a)
    assert a.acquire()
    t, box = in_thread(lambda: b.acquire(request_release=False, timeout=60))
    eventually(waiter_is(url, "b"), what="b registered")
    assert raw_read(url)[0].request.asks is False
    time.sleep(1.0)  # five waiter checks
    assert not a.release_requested and heard == []
    assert "waits for the holder to finish" in status_text(a.status())
    assert a.release() == "b"
    t.join(10)
    assert isinstance(box.get("result"), Acquired) and b.is_held


def test_an_asking_request_takes_the_slot_from_a_patient_one_which_waits_on(url, made):
    a, p, q = lock_for(url, made, "a"), lock_for(url, made, "p"), lock_for(url, made, "q")
    assert a.acquire()
    tp, bp = in_thread(lambda: p.acquire(request_release=False, timeout=60))
    eventually(waiter_is(url, "p"), what="p registered")
    tq, bq = in_thread(lambda: q.acquire(timeout=60))
    eventually(lambda: waiter_is(url, "q")() or bq, what="q took the slot")
    assert not bq, bq
    eventually(lambda: a.release_requested, what="the holder was asked by q")
    assert a.release_request.requester == "q"
    assert a.release() == "q"
    tq.join(10)
    assert isinstance(bq.get("result"), Acquired)
    eventually(waiter_is(url, "p"), what="p waits again, now for q")
    assert not q.release_requested  # p is patient with q too
    q.release()
    tp.join(10)
    assert isinstance(bp.get("result"), Acquired), bp


def test_a_holder_that_does_not_yield_declines_in_the_record_and_is_not_asked(url, made):
    a, b = lock_for(url, made, "a", yield_to_requests=False), lock_for(url, made, "b")
    heard = []
    hold = lambda sender, **kw: heard.append(kw)  # noqa: E731
    signals.on_release_requested.connect(hold, sender=a)
    assert a.acquire()
    t, box = in_thread(lambda: b.acquire(timeout=60))
    eventually(lambda: raw_read(url)[0].declined, timeout=15, what="the decline written at a renewal")
    assert not a.release_requested and heard == []
    text = status_text(a.status())
    assert "asked by " in text and "(b), declined" in text, text
    assert a.release() == "b"  # it still hands the lock on when it is done
    t.join(10)
    assert isinstance(box.get("result"), Acquired)


def test_with_a_timeout_an_acquire_waits_for_the_slot_and_without_one_says_how_to(url, made):
    a, w, c = lock_for(url, made, "a"), lock_for(url, made, "w"), lock_for(url, made, "c")
    assert a.acquire()
    t, _ = in_thread(lambda: w.acquire(timeout=60))
    eventually(waiter_is(url, "w"), what="w registered")
    started = time.monotonic()
    with pytest.raises(LockContended) as now:
        c.acquire()
    assert not isinstance(now.value, LockTimeout) and time.monotonic() - started < 3
    message = str(now.value)
    assert "wait_for_slot=True" in message and "--wait-for-slot" in message and "timeout" in message
    assert "(+" not in message and "until" not in message, message  # no expiry of a lease that is renewed
    started = time.monotonic()
    with pytest.raises(LockTimeout) as late:
        c.acquire(timeout=1.5)
    assert time.monotonic() - started >= 1.5, "a timeout is a promise to wait up to it"
    # Parties are named by label with the id in brackets, as status names them (issue 24, item 11).
    text = str(late.value)
    assert "(c)" not in text and f"slot is {w.label.text} (w)'s" in text, text
    w.cancel()
    t.join(10)


def test_a_timed_out_waiter_is_not_named_as_someone_else_waiting(url, made):
    a, b = lock_for(url, made, "a"), lock_for(url, made, "b")
    assert a.acquire()
    with pytest.raises(LockTimeout) as info:
        b.acquire(timeout=1.0)
    message = str(info.value)
    # Before: "...; waiter 'b'", the caller itself. Now it says the slot was ours (or, where the store's
    # pacing kept our registration from landing within the second, that nobody else waits).
    assert "(b)" not in message, message  # named by label, with the id in brackets
    assert "we held the waiter slot" in message or "nobody else waits" in message, message


def test_a_stray_cancel_does_not_spoil_the_next_acquire(url, made):
    a = lock_for(url, made, "a")
    a.cancel()
    assert a.acquire(timeout=5)
    a.release()
    a.cancel()  # while nothing runs, again
    assert a.acquire()


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


def test_a_cancel_still_stops_a_running_acquire(made):
    url = "memory://cancel-running/x.json"
    a, b = lock_for(url, made, "a"), lock_for(url, made, "b")
    assert a.acquire()
    t, box = in_thread(lambda: b.acquire(request_release=False))
    eventually(waiter_is(url, "b"), what="b registered")
    b.cancel()
    t.join(10)
    assert isinstance(box.get("error"), AcquireCancelled)
    assert raw_read(url)[0].waiting_owner_id is None
    MemoryStorage.forget("cancel-running")


def test_a_waiter_displaced_by_a_higher_priority_waits_for_the_slot_again_without_a_timeout(url, made):
    # design.md: "The displaced waiter sees the slot taken at its next poll and waits for it again".
    # A plain acquire() (asking, no timeout) that had registered must not turn the displacement into
    # LockContended halfway through its wait.
    o, w1, w2 = lock_for(url, made, "o"), lock_for(url, made, "w1"), lock_for(url, made, "w2")
    assert o.acquire()
    t1, b1 = in_thread(lambda: w1.acquire())
    eventually(waiter_is(url, "w1"), what="w1 registered")
    t2, b2 = in_thread(lambda: w2.acquire(priority=5, timeout=60))
    eventually(lambda: waiter_is(url, "w2")() or b2, what="w2 took the slot")
    assert not b2, b2
    time.sleep(1.0)  # several of w1's polls with the slot taken
    assert not b1, f"the displaced waiter gave up: {b1}"
    assert o.release() == "w2"
    t2.join(10)
    assert isinstance(b2.get("result"), Acquired)
    eventually(lambda: waiter_is(url, "w1")() or b1, what="w1 waits again, now for w2")
    assert not b1, b1
    w2.release()
    t1.join(10)
    assert isinstance(b1.get("result"), Acquired) and w1.is_held, b1
