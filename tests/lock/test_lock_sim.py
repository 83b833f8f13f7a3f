"""The handoff lock under races, expiry and loss, on simulated time (the ``sim`` fixture's processes).

The same operations on every backend, in real time: test_lock.py.
"""

from __future__ import annotations

import threading

import pytest
from lockutil import FAST
from simworld import KEY

from handofflock import LockContended, LockLost, LockTimeout, signals
from handofflock.core.record import LockRecord


def race(sim, fns):
    """Start every call at the same simulated instant; the seed picks who runs first. Results or exceptions."""
    calls = [sim.start(fn) for fn in fns]
    sim.run_until(lambda: all(calls), limit=30)
    return [c.error if c.error is not None else c.result for c in calls]


def test_two_would_be_waiters_get_one_slot_and_each_waits_for_it_up_to_its_timeout(sim):
    # A timeout promises a wait up to it, for the slot too (an acquire without
    # one is refused at once: tests/lock/test_patient_wait.py).
    owner = sim.lock("owner", **FAST)
    assert sim.call(owner.acquire)
    b, c = sim.lock("b", **FAST), sim.lock("c", **FAST)
    results = race(sim, [lambda: b.acquire(timeout=1.0), lambda: c.acquire(timeout=1.0)])
    assert all(isinstance(r, LockTimeout) for r in results), results
    assert all(r.owner_id == owner.owner_id and owner.owner_id in str(r) for r in results)
    # The waiter that timed out gave its slot back.
    record, _ = sim.read()
    assert record.owner_id == owner.owner_id and record.waiting_owner_id is None


def test_a_stale_release_after_the_lease_expired_and_was_taken_writes_nothing(sim):
    stale = sim.lock("stale", paused=True, **FAST)
    assert sim.call(stale.acquire)
    sim.run_for(FAST["ttl"] + FAST["max_clock_skew"] + 0.2)
    assert not stale.healthy
    usurper = sim.lock("usurper", **FAST)
    assert sim.call(lambda: usurper.acquire(blocking=False))
    before = sim.read()
    with pytest.raises(LockLost):
        sim.call(stale.release)
    assert sim.read() == before
    assert before[0].owner_id == usurper.owner_id and usurper.token > stale.token


@pytest.mark.parametrize("how", ["stolen", "deleted"])
def test_renewal_catches_a_stolen_or_deleted_record_and_never_rewrites_it(sim, how):
    owner = sim.lock("owner", **FAST)
    errors, lost = [], threading.Event()
    signals.on_renewal_error.connect(lambda s, error: errors.append(error), sender=owner, weak=False)
    signals.lost.connect(lambda s, **kw: lost.set(), sender=owner, weak=False)
    assert sim.call(owner.acquire)
    record, gen = sim.read()
    if how == "stolen":
        thief = record.replace(owner_id="thief", token=record.token + 1, expires_at=sim.time() + 60)
        sim.store.write(KEY, thief.encode(), if_generation_match=gen)
    else:
        sim.store.delete(KEY, if_generation_match=gen)
    sim.run_until(lost.is_set, limit=5, what="the owner noticing")
    assert not owner.healthy and not owner.is_held
    with pytest.raises(LockLost):
        owner.check()
    assert len(errors) == 1 and isinstance(errors[0], LockLost)
    sim.run_for(3 * FAST["renew_interval"])
    after, _ = sim.read()
    if how == "stolen":
        assert after.owner_id == "thief"
    else:
        assert after is None


def test_two_contenders_reclaiming_an_expired_lease_exactly_one_wins(sim):
    dead = sim.lock("dead", paused=True, **FAST)
    assert sim.call(dead.acquire)
    sim.run_for(FAST["ttl"] + FAST["max_clock_skew"] + 0.2)
    b, c = sim.lock("b", **FAST), sim.lock("c", **FAST)
    results = race(sim, [lambda: b.acquire(blocking=False), lambda: c.acquire(blocking=False)])
    assert sorted(results) == [False, True], results
    winner = b if results[0] else c
    record, _ = sim.read()
    assert record.owner_id == winner.owner_id and winner.token > dead.token


def test_a_third_process_never_takes_the_lock_from_a_live_waiter(sim):
    now = sim.time()
    seeded = LockRecord("dead-owner", now - 100, "live-waiter", now + 30, ttl=1.5, token=5, nonce="seed")
    gen = sim.store.write(KEY, seeded.encode(), if_generation_match=0)
    third = sim.lock("third", **FAST)
    assert sim.call(lambda: third.acquire(blocking=False)) is False
    with pytest.raises(LockContended) as info:
        sim.call(lambda: third.acquire(timeout=0.3))
    assert info.value.waiter_id == "live-waiter"
    patient = sim.lock("patient", wait_for_slot=True, **FAST)
    with pytest.raises(LockTimeout):
        sim.call(lambda: patient.acquire(timeout=0.5))
    assert sim.read() == (seeded, gen)


def test_a_waiter_that_gives_up_frees_the_slot_for_the_next(sim):
    owner = sim.lock("owner", **FAST)
    assert sim.call(owner.acquire)
    quitter = sim.lock("quitter", **FAST)
    with pytest.raises(LockTimeout) as info:
        sim.call(lambda: quitter.acquire(timeout=0.5))
    assert isinstance(info.value, TimeoutError)
    record, _ = sim.read()
    assert record.owner_id == owner.owner_id and record.waiting_owner_id is None
    nxt = sim.lock("next", **FAST)
    t = sim.start(lambda: nxt.acquire(timeout=5))
    sim.run_until(lambda: sim.record().waiting_owner_id == nxt.owner_id, what="the next waiter registering")
    sim.call(owner.release)
    sim.run_until(lambda: t.done, limit=5)
    assert nxt.is_held


@pytest.mark.parametrize("paced", [False, True], ids=["unpaced", "gcs-pacing"])
def test_renewal_keeps_a_lock_held_for_many_ttls(sim, paced):
    # At GCS's write spacing (1 s) the shortest ttl it serves is 5 s; unpaced, a 1 s renew deadline.
    if paced:
        timing = dict(ttl=5.0, min_write_interval=1.0, max_clock_skew=FAST["max_clock_skew"])
    else:
        timing = dict(FAST, ttl=2.0, renew_interval=0.25, renew_deadline=1.0, waiter_ttl=1.5)
    owner = sim.lock("owner", **timing)
    assert sim.call(owner.acquire)
    ttl = timing["ttl"]
    contender = sim.lock("contender", **timing)
    start = sim.time()
    rounds = 4 if paced else 5
    for _ in range(rounds):
        sim.run_for(ttl)
        assert owner.healthy
        assert sim.call(lambda: contender.acquire(blocking=False)) is False
    record, _ = sim.read()
    assert record.owner_id == owner.owner_id
    assert record.expires_at > start + (rounds - 1) * ttl
