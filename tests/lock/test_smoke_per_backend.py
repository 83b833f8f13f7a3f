"""The handoff lock on every backend, in real time: a smoke test of its operations per backend.

The same operations under races, expiry and loss run on simulated time, in the file of each
operation (test_acquire.py, test_release.py, test_renew.py, ...).
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import BACKENDS
from lockutil import eventually, make_lock, raw_read, url_for

from handofflock import (
    HandoffLock,
    signals,
)


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path):
    return url_for(request.param, request, tmp_path)


@pytest.fixture
def locks():
    """Locks made by a test; released (if held) and unscheduled afterwards."""
    made: list[HandoffLock] = []

    def make(url, **kw):
        lock = make_lock(url, **kw)
        made.append(lock)
        return lock

    yield make
    for lock in made:
        lock.cancel()
        if lock.is_held:
            try:
                lock.release()
            except Exception:
                pass
        lock._unschedule()  # private: stop its renewals without releasing


def race(fns):
    barrier = threading.Barrier(len(fns))
    out = [None] * len(fns)

    def run(i):
        barrier.wait()
        try:
            out[i] = fns[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # An exception or a call still running is neither an owner nor a refusal: say so rather than count it as either.
    assert not any(t.is_alive() for t in threads), "a racing call did not return within 30 s"
    assert not [r for r in out if isinstance(r, BaseException)], out
    return out


def test_two_acquirers_of_an_absent_lock_get_exactly_one_owner(url, locks):
    for round_ in range(3):
        u = f"{url[:-5]}-{round_}.json"
        a, b = locks(u), locks(u)
        results = race([lambda: a.acquire(blocking=False), lambda: b.acquire(blocking=False)])
        assert sorted(bool(r) for r in results) == [False, True], results
        winner = a if results[0] else b
        record, _ = raw_read(u)
        assert record.owner_id == winner.owner_id and record.token == winner.token
        assert record.waiting_owner_id is None  # a non-blocking loser never registers as waiter


def test_a_full_handoff_in_one_process_notifies_the_owner_and_raises_the_token(url, locks):
    owner, waiter = locks(url), locks(url)
    assert owner.acquire()
    asked = []
    signals.on_release_requested.connect(lambda s, **kw: asked.append(kw), sender=owner, weak=False)
    t = threading.Thread(target=lambda: waiter.acquire(timeout=10))
    t.start()
    eventually(lambda: owner.release_requested, what="the owner noticing the waiter")
    eventually(lambda: asked, what="on_release_requested")
    assert asked[0]["waiter_id"] == waiter.owner_id and asked[0]["reason"] == "waiter"
    assert asked[0]["deadline"] > time.time()
    assert owner.release_request.requester == waiter.owner_id
    assert owner.release() == waiter.owner_id
    t.join(5)
    assert waiter.is_held and waiter.token > owner.token
    record, _ = raw_read(url)
    assert record.owner_id == waiter.owner_id and record.waiting_owner_id is None


def test_release_without_a_waiter_keeps_the_object_so_the_token_sequence_continues(url, locks):
    a = locks(url)
    assert a.acquire()
    assert a.release() is None
    record, gen = raw_read(url)
    assert gen > 0 and record.owner_id is None and record.token == a.token
    b = locks(url)
    assert b.acquire(blocking=False)
    assert b.token > a.token


def test_release_of_a_lock_never_held_does_nothing_as_filelock_does(url, locks):
    lock = locks(url)
    assert lock.release() is None
    assert lock.acquire()
    lock.release()
    assert lock.release() is None  # already released (by a signal handler, say): nothing more to do


def test_a_stable_owner_id_takes_a_released_lock_at_once_with_a_new_token(url, locks):
    old = locks(url, owner_id="trainer-7")
    assert old.acquire()
    token = old.token
    old.release()  # as a job does at exit, and on SIGTERM
    restarted = locks(url, owner_id="trainer-7")
    assert restarted.acquire(blocking=False)
    assert restarted.token > token


def test_the_context_manager_acquires_and_releases(url, locks):
    lock = locks(url)
    with lock as held:
        assert held is lock and lock.is_held and lock.healthy
        lock.check()
    assert not lock.is_held
    assert raw_read(url)[0].owner_id is None
