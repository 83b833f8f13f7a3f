"""The handoff lock's behaviour under races, on every backend (memory, local files, the GCS emulator)."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import BACKENDS
from handofflock import (
    HandoffLock,
    LockContended,
    LockLost,
    LockNotHeld,
    LockTimeout,
    Scheduler,
    signals,
)
from handofflock.core.record import LockRecord
from lockutil import eventually, fast, make_lock, raw_read, raw_write, url_for


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


def paused(url, locks, **kw):
    """A lock whose background duties never run: it behaves like a stopped process."""
    return locks(url, scheduler=Scheduler(autostart=False), **kw)


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
    return out


def test_two_acquirers_of_an_absent_lock_get_exactly_one_owner(url, locks):
    for round_ in range(3):
        u = f"{url[:-5]}-{round_}.json"
        a, b = locks(u), locks(u)
        results = race([lambda: a.acquire(blocking=False), lambda: b.acquire(blocking=False)])
        assert sorted(map(bool, results)) == [False, True]
        winner = a if results[0] else b
        record, _ = raw_read(u)
        assert record.owner_id == winner.owner_id and record.token == winner.token
        assert record.waiting_owner_id is None  # a non-blocking loser never registers as waiter


def test_two_would_be_waiters_get_one_slot_and_each_waits_for_it_up_to_its_timeout(url, locks):
    # Issue 24, item 7: a timeout promises a wait up to it, for the slot too (an acquire without
    # one is refused at once: tests/lock/test_patient_wait.py).
    owner = locks(url)
    assert owner.acquire()
    b, c = locks(url), locks(url)
    results = race([lambda: b.acquire(timeout=1.0), lambda: c.acquire(timeout=1.0)])
    assert all(isinstance(r, LockTimeout) for r in results), results
    assert all(r.owner_id == owner.owner_id and owner.owner_id in str(r) for r in results)
    # The waiter that timed out gave its slot back.
    record, _ = raw_read(url)
    assert record.owner_id == owner.owner_id and record.waiting_owner_id is None


def test_a_stale_release_after_the_lease_expired_and_was_taken_writes_nothing(url, locks):
    stale = paused(url, locks)
    assert stale.acquire()
    time.sleep(fast(url)["ttl"] + fast(url)["max_clock_skew"] + 0.2)
    assert not stale.healthy
    usurper = locks(url)
    assert usurper.acquire(blocking=False)
    before = raw_read(url)
    with pytest.raises(LockLost):
        stale.release()
    assert raw_read(url) == before
    assert before[0].owner_id == usurper.owner_id and usurper.token > stale.token


@pytest.mark.parametrize("how", ["stolen", "deleted"])
def test_renewal_catches_a_stolen_or_deleted_record_and_never_rewrites_it(url, locks, how):
    owner = locks(url)
    errors, lost = [], threading.Event()
    signals.on_renewal_error.connect(lambda s, error: errors.append(error), sender=owner, weak=False)
    signals.lost.connect(lambda s, **kw: lost.set(), sender=owner, weak=False)
    assert owner.acquire()
    record, gen = raw_read(url)
    from handofflock.storage import open_url

    store, key = open_url(url)
    if how == "stolen":
        thief = record.replace(owner_id="thief", token=record.token + 1, expires_at=time.time() + 60)
        store.write(key, thief.encode(), if_generation_match=gen)
    else:
        store.delete(key, if_generation_match=gen)
    assert lost.wait(5), "the owner did not notice"
    assert not owner.healthy and not owner.is_held
    with pytest.raises(LockLost):
        owner.check()
    assert len(errors) == 1 and isinstance(errors[0], LockLost)
    time.sleep(3 * fast(url)["renew_interval"])
    after, _ = raw_read(url)
    if how == "stolen":
        assert after.owner_id == "thief"
    else:
        assert after is None


def test_two_contenders_reclaiming_an_expired_lease_exactly_one_wins(url, locks):
    dead = paused(url, locks)
    assert dead.acquire()
    time.sleep(fast(url)["ttl"] + fast(url)["max_clock_skew"] + 0.2)
    b, c = locks(url), locks(url)
    results = race([lambda: b.acquire(blocking=False), lambda: c.acquire(blocking=False)])
    assert sorted(map(bool, results)) == [False, True], results
    winner = b if results[0] else c
    record, _ = raw_read(url)
    assert record.owner_id == winner.owner_id and winner.token > dead.token


def test_a_third_process_never_takes_the_lock_from_a_live_waiter(url, locks):
    now = time.time()
    seeded = LockRecord("dead-owner", now - 100, "live-waiter", now + 30, ttl=1.5, token=5, nonce="seed")
    gen = raw_write(url, seeded, 0)
    third = locks(url)
    assert third.acquire(blocking=False) is False
    with pytest.raises(LockContended) as info:
        third.acquire(timeout=0.3)
    assert info.value.waiter_id == "live-waiter"
    patient = locks(url, wait_for_slot=True)
    with pytest.raises(LockTimeout):
        patient.acquire(timeout=0.5)
    assert raw_read(url) == (seeded, gen)


def test_a_waiter_that_gives_up_frees_the_slot_for_the_next(url, locks):
    owner = locks(url)
    assert owner.acquire()
    quitter = locks(url)
    with pytest.raises(LockTimeout) as info:
        quitter.acquire(timeout=0.5)
    assert isinstance(info.value, TimeoutError)
    record, _ = raw_read(url)
    assert record.owner_id == owner.owner_id and record.waiting_owner_id is None
    nxt = locks(url)
    t = threading.Thread(target=lambda: nxt.acquire(timeout=5))
    t.start()
    eventually(lambda: raw_read(url)[0].waiting_owner_id == nxt.owner_id, what="the next waiter registering")
    owner.release()
    t.join(5)
    assert nxt.is_held


def test_renewal_keeps_a_lock_held_for_many_ttls(url, locks):
    gcs = url.startswith("gs://")
    # On GCS the store's default write spacing (1 s) applies: the shortest ttl it serves is 5 s.
    # Elsewhere a 1 s renew deadline: a loaded 2-core machine answers a local moto or file request well within it.
    timing = dict(ttl=5.0, renew_interval=None, renew_deadline=None, waiter_ttl=None, min_write_interval=None) if gcs else dict(ttl=2.0, renew_interval=0.25, renew_deadline=1.0, waiter_ttl=1.5)
    owner = locks(url, **timing)
    assert owner.acquire()
    ttl = timing["ttl"]
    contender = locks(url, **timing)
    start = time.time()
    rounds = 4 if gcs else 5
    for _ in range(rounds):
        time.sleep(ttl)
        assert owner.healthy
        assert contender.acquire(blocking=False) is False
    record, _ = raw_read(url)
    assert record.owner_id == owner.owner_id
    assert record.expires_at > start + (rounds - 1) * ttl


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


def test_release_of_a_lock_never_held_is_a_typed_error(url, locks):
    with pytest.raises(LockNotHeld):
        locks(url).release()


def test_a_stable_owner_id_retakes_its_own_lock_at_once_with_a_new_token(url, locks):
    old = paused(url, locks, owner_id="trainer-7")
    assert old.acquire()
    restarted = locks(url, owner_id="trainer-7")
    assert restarted.acquire(blocking=False)
    assert restarted.token > old.token
    with pytest.raises(LockLost):
        old.release()  # the old incarnation's token no longer matches: it writes nothing
    assert raw_read(url)[0].token == restarted.token


def test_the_context_manager_acquires_and_releases(url, locks):
    lock = locks(url)
    with lock as held:
        assert held is lock and lock.is_held and lock.healthy
        lock.check()
    assert not lock.is_held
    assert raw_read(url)[0].owner_id is None
