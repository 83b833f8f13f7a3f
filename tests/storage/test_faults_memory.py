"""Lost replies, failed writes and retries, injected with the memory backend's fault hooks.

Every write the lock makes carries a fresh nonce. When a write fails ambiguously
(the reply was lost: it may or may not have been applied), the lock reads the
record back: its nonce there means the write landed, and the lock carries on as
if the reply had arrived; the generation unchanged means it did not, and the
write is retried. Each transition is driven through three faults:

* ``lost-reply``        the write is applied, then the caller hears a timeout;
* ``failed-ambiguous``  the caller hears the same timeout, but nothing was applied;
* ``failed-503``        a clean, retryable refusal.

Two knock-out tests per transition show the checks bite: with the nonce
recognition removed (a lost reply is simply retried) the ``lost-reply`` run
fails, and with the opposite mistake (an ambiguous write is trusted to have
landed) the ``failed-ambiguous`` run fails.

Everything runs in the test's thread on a :class:`FakeClock` with ``step``: waiting advances
simulated time and runs the scheduler, so the interleavings are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
from simworld import KEY, World  # noqa: F401  (the world fixture is in conftest.py)

from handofflock import (
    HandoffLock,
    HandoffLockError,
    LockTimeout,
    StorageError,
    TransientStorageError,
    signals,
)
from handofflock.core.record import new_nonce
from handofflock.storage import MemoryStorage
from handofflock.storage import records as cas
from handofflock.storage import records as pacing


@dataclass(frozen=True)
class Fault:
    name: str
    arm: Callable[[MemoryStorage], None]
    applied: bool  # whether the faulted write takes effect
    attempts: int  # write calls the transition takes: the faulted one, and its retry if it did not land

    def __repr__(self) -> str:
        return self.name


def _timeout() -> TransientStorageError:
    return TransientStorageError("injected: timed out waiting for the reply", ambiguous=True)


LOST_REPLY = Fault("lost-reply", lambda s: s.faults.lose_reply_next("write", key=KEY, exc=_timeout), True, 1)
FAILED_AMBIGUOUS = Fault("failed-ambiguous", lambda s: s.faults.fail_next("write", key=KEY, exc=_timeout), False, 2)
FAILED_503 = Fault("failed-503", lambda s: s.faults.fail_next("write", key=KEY), False, 2)
FAULTS = [LOST_REPLY, FAILED_AMBIGUOUS, FAILED_503]


# --------------------------------------------------------------------------- the transitions


def create(w: World, fault: Fault) -> None:
    """The lock object is absent: the first acquire creates it, exactly once."""
    a = w.lock("A")
    fault.arm(w.store)
    before = w.writes
    assert a.acquire(timeout=10)
    record = w.record()
    assert record is not None and record.owner_id == "A" and record.token == a.token
    assert w.writes - before == fault.attempts  # no retake after a create that had landed


def take_over(w: World, fault: Fault) -> None:
    """The owner's lease expired (it stopped renewing): the next acquire takes the lock, exactly once."""
    b = w.lock("B", frozen=True)
    b.acquire()
    w.clock.advance(b.ttl + b.max_clock_skew + 1)
    a = w.lock("A")
    fault.arm(w.store)
    before = w.writes
    assert a.acquire(timeout=10)
    record = w.record()
    assert record.owner_id == "A" and record.token == a.token > b.token
    assert w.writes - before == fault.attempts


def become_waiter(w: World, fault: Fault) -> None:
    """The lock is held: the acquire registers as the waiter at once, and is handed the lock as the waiter."""
    b = w.lock("B", frozen=True, ttl=600.0)  # a live lease for the whole scene; it releases when told
    a = w.lock("A")
    b.acquire()
    started_wall = w.clock.time()
    fault.arm(w.store)
    registered: dict[str, object] = {}

    def release_b() -> None:
        registered["record"], registered["writes"] = w.record(), w.writes
        b.release()
        registered["handoff_generation"] = w.generation()

    before = w.writes
    w.clock.at(w.clock.monotonic() + 5.0, release_b)
    assert a.acquire(timeout=30)
    slot = registered["record"]
    assert slot.waiting_owner_id == "A"
    # Registered within its first poll, not a poll later after trusting a write that never landed:
    assert slot.waiter_expires_at - started_wall < a.waiter_ttl + a.waiter_poll_interval / 2
    assert registered["writes"] - before == fault.attempts
    # It knew it was the waiter, so it took the handoff as is instead of retaking the lock:
    assert w.generation() == registered["handoff_generation"]
    assert a.token == w.record().token and w.record().owner_id == "A"


def refresh_waiter(w: World, fault: Fault) -> None:
    """A waiter whose slot is half used up refreshes it when due, exactly once."""
    b = w.lock("B", frozen=True, ttl=600.0)
    a = w.lock("A")
    b.acquire()
    seen: dict[str, object] = {}

    def arm_after_registering() -> None:  # only A writes from here on: the next write is the refresh
        seen["registered"], seen["writes"] = w.record(), w.writes
        fault.arm(w.store)

    def release_b() -> None:
        seen["refreshed"], seen["refresh_writes"] = w.record(), w.writes - seen["writes"]
        b.release()
        seen["handoff_generation"] = w.generation()

    now = w.clock.monotonic()
    w.clock.at(now + 0.5, arm_after_registering)
    w.clock.at(now + a.waiter_ttl / 2 + 5.0, release_b)
    assert a.acquire(timeout=60)
    registered, refreshed = seen["registered"], seen["refreshed"]
    assert registered.waiting_owner_id == refreshed.waiting_owner_id == "A"
    extended = refreshed.waiter_expires_at - registered.waiter_expires_at
    # Refreshed at half-life (the write retried at once if it failed), not a poll later:
    assert a.waiter_ttl / 2 <= extended < a.waiter_ttl / 2 + a.waiter_poll_interval / 2
    assert seen["refresh_writes"] == fault.attempts
    assert w.generation() == seen["handoff_generation"] and w.record().owner_id == "A"


def renew(w: World, fault: Fault) -> None:
    """The owner renews its lease; the lock's safety window grows only when a renewal landed."""
    a = w.lock("A")
    lost: list[object] = []
    a.acquire()
    acquired = w.clock.monotonic()
    w.clock.advance(a.renew_interval)
    renew_wall = w.clock.time()
    fault.arm(w.store)
    before = w.writes
    with signals.lost.connected_to(lambda sender, **kw: lost.append(kw), sender=a):
        w.sched.run_pending()
        if not fault.applied:  # the failed renewal is retried soon, well within the deadline
            w.clock.advance(0.25)
            w.sched.run_pending()
    record = w.record()
    assert record.owner_id == "A" and record.expires_at >= renew_wall + a.ttl
    assert w.writes - before == fault.attempts
    # Past the first window, with no duty run since: healthy only if the renewal was counted.
    w.clock.advance(acquired + a.renew_deadline + 1 - w.clock.monotonic())
    assert a.healthy and a.is_held and not lost


def hand_off(w: World, fault: Fault) -> None:
    """Releasing with a live waiter hands the lock over in one write, and says so."""
    b = w.lock("B", min_hold=0)  # the handoff's write is the subject: asked at once
    a = w.lock("A")
    b.acquire()
    outcome: dict[str, object] = {}

    def release_when_asked(sender: HandoffLock, **kw: object) -> None:
        fault.arm(w.store)
        before = w.writes
        try:
            outcome["heir"] = sender.release()
        except HandoffLockError as exc:  # receivers' errors are only logged: keep it for the test
            outcome["error"] = exc
        outcome["writes"], outcome["record"], outcome["generation"] = w.writes - before, w.record(), w.generation()

    with signals.on_release_requested.connected_to(release_when_asked, sender=b):
        assert a.acquire(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["heir"] == "A" and not b.is_held
    assert outcome["record"].owner_id == "A" and outcome["record"].token == a.token
    assert outcome["writes"] == fault.attempts
    assert w.generation() == outcome["generation"]  # A took it as handed over


def free(w: World, fault: Fault) -> None:
    """Releasing with no waiter marks the lock free in one write, and reports no loss."""
    a = w.lock("A")
    released: list[dict] = []
    a.acquire()
    fault.arm(w.store)
    before = w.writes
    with signals.released.connected_to(lambda sender, **kw: released.append(kw), sender=a):
        assert a.release() is None
    record = w.record()
    assert record.owner_id is None and record.token == a.token
    assert w.writes - before == fault.attempts
    assert released == [{"handed_off_to": None, "token": a.token}] and not a.is_held


def give_up_wait(w: World, fault: Fault) -> None:
    """A waiter that times out gives its slot back, exactly once."""
    b = w.lock("B", frozen=True, ttl=600.0)
    a = w.lock("A")
    b.acquire()
    counted: dict[str, int] = {}

    def arm_after_registering() -> None:
        counted["writes"] = w.writes
        fault.arm(w.store)

    w.clock.at(w.clock.monotonic() + 0.5, arm_after_registering)
    with pytest.raises(LockTimeout):
        a.acquire(timeout=3)
    record = w.record()
    assert record.owner_id == "B" and record.waiting_owner_id is None
    assert w.writes - counted["writes"] == fault.attempts


TRANSITIONS = [create, take_over, become_waiter, refresh_waiter, renew, hand_off, free, give_up_wait]


@pytest.mark.parametrize("fault", FAULTS, ids=repr)
@pytest.mark.parametrize("transition", TRANSITIONS, ids=lambda t: t.__name__)
def test_every_transition_survives_a_lost_reply_or_a_failed_write(world, transition, fault):
    transition(world, fault)


def _retry_blindly(storage, key, expected, is_ours, max_bytes, timeout):
    """``cas._landed`` with the nonce check removed: never recognises its own write."""
    return None


def _trust_blindly(storage, key, expected, is_ours, max_bytes, timeout):
    """The opposite mistake: an ambiguous write is assumed to have landed."""
    found = storage.read(key)
    return (found[1], found[0]) if found else (1, b"")


@pytest.mark.parametrize("transition", TRANSITIONS, ids=lambda t: t.__name__)
def test_without_the_nonce_check_a_lost_reply_breaks_every_transition(world, transition, monkeypatch):
    monkeypatch.setattr(cas, "_landed", _retry_blindly)
    with pytest.raises((AssertionError, HandoffLockError)):
        transition(world, LOST_REPLY)


@pytest.mark.parametrize("transition", TRANSITIONS, ids=lambda t: t.__name__)
def test_trusting_an_ambiguous_write_breaks_every_transition(world, transition, monkeypatch):
    monkeypatch.setattr(cas, "_landed", _trust_blindly)
    with pytest.raises((AssertionError, HandoffLockError)):
        transition(world, FAILED_AMBIGUOUS)


# --------------------------------------------------------------------------- harder interleavings


def test_a_waiter_whose_registration_reply_was_lost_after_the_record_moved_on_still_gives_its_slot_back(world):
    b = world.lock("B")
    a = world.lock("A")
    b.acquire()

    def reply_lost_and_b_renews() -> TransientStorageError:
        world.clock.advance(b.renew_interval)  # B's renewal lands before A can look at its own write
        world.sched.run_pending()
        return _timeout()

    world.store.faults.lose_reply_next("write", key=KEY, exc=reply_lost_and_b_renews)
    with pytest.raises(LockTimeout):
        a.acquire(timeout=1.5)
    record = world.record()
    assert record.owner_id == "B" and record.waiting_owner_id is None  # B will not hand off to a waiter that left


def test_a_release_whose_reply_was_lost_after_the_heir_renewed_still_counts_as_handed_off(world):
    b = world.lock("B", min_hold=0)  # the handoff's write is the subject: asked at once
    a = world.lock("A")
    b.acquire()
    outcome: dict[str, object] = {}

    def reply_lost_and_the_heir_renews() -> TransientStorageError:
        record = world.record()  # what the heir's first renewal writes: same token, new nonce and lease
        world.store.write(KEY, record.replace(expires_at=record.expires_at + 7.5, nonce=new_nonce()).encode(),
                          if_generation_match=world.generation())
        return _timeout()

    def release_when_asked(sender: HandoffLock, **kw: object) -> None:
        world.store.faults.lose_reply_next("write", key=KEY, exc=reply_lost_and_the_heir_renews)
        try:
            outcome["heir"] = sender.release()
        except HandoffLockError as exc:
            outcome["error"] = exc

    with signals.on_release_requested.connected_to(release_when_asked, sender=b):
        assert a.acquire(timeout=30)
    assert outcome == {"heir": "A"}  # not LockLost: the record shows our handoff's heir and token


# --------------------------------------------------------------------------- retries


def test_transient_read_errors_during_acquire_are_retried_with_backoff(world):
    world.store.faults.fail_next("read", count=3)
    a = world.lock("A")
    assert a.acquire(timeout=10)
    assert world.store.calls["read"] == 4
    backoffs = world.clock.waits
    assert len(backoffs) == 3 and all(0 <= d <= min(2.0, 0.1 * 2**n) for n, d in enumerate(backoffs))


def test_transient_read_errors_give_up_when_the_acquire_timeout_would_pass(world):
    world.store.faults.fail_next("read", count=10_000)
    a = world.lock("A")
    with pytest.raises(TransientStorageError):
        a.acquire(timeout=5)
    assert 3 < world.store.calls["read"] < 100
    assert world.clock.monotonic() - 1000.0 <= 5.0
    assert not a.is_held and world.writes == 0


def test_a_non_blocking_acquire_does_not_retry_a_failing_store_forever(world):
    world.store.faults.fail_next("read", count=10**9)
    a = world.lock("A")
    with pytest.raises(TransientStorageError):
        a.acquire(blocking=False)
    assert world.clock.monotonic() - 1000.0 <= a.renew_deadline


@pytest.mark.parametrize("op", ["read", "write"])
def test_a_permanent_storage_error_is_not_retried(world, op):
    world.store.faults.fail_next(op, exc=lambda: StorageError("403: permission denied on the bucket"))
    a = world.lock("A")
    with pytest.raises(StorageError, match="permission denied"):
        a.acquire(timeout=10)
    assert world.store.calls[op] == 1
    assert not a.is_held and world.record() is None
    assert a.acquire(timeout=10)  # and the instance is usable again


@pytest.mark.parametrize("retry_after, spacing", [(None, 1.0), (3.0, 3.0)])
def test_a_429_widens_the_spacing_of_writes_to_that_object_from_the_retry_on(world, retry_after, spacing):
    store, write_times = world.store, world.timed_writes()
    store.faults.fail_next("write", key=KEY, exc=lambda: TransientStorageError(
        "429: rate limit on this object", status=429, ambiguous=False, retry_after=retry_after))
    a = world.lock("A")
    c = world.lock("C")  # another instance in this process, writing the same object
    assert a.acquire(timeout=30)
    a.release()
    assert c.acquire(timeout=30)
    refused, created, freed, taken = write_times
    assert created - refused >= spacing  # the retry waited the widened spacing (or the server's Retry-After)
    # No burst while the penalty lasts, not even for the (urgent) release; successes relax it gradually.
    assert freed - created >= 0.75 * spacing
    assert taken - freed >= 0.75 * 0.75 * spacing  # C waits its turn too
    assert pacing.gate_for(store, "locks/other.json", 0.0, world.clock).ready_in(world.clock.monotonic()) == 0.0  # other objects are not slowed


def test_a_renewal_that_the_widened_spacing_would_carry_past_its_deadline_goes_at_the_stores_own(world):
    """After 429s widened the spacing to 8 s, a renewal with 3 s left must neither sleep 8 s holding the
    lock's I/O mutex nor wait the 8 s out and lose the lease: it goes at the store's own spacing (0
    here), at once, without sleeping (issue 25)."""
    # The memory store's own spacing, 0, to start from: the 429s below are what widen it, to 8 s.
    a = world.lock("A", ttl=6.0, renew_interval=0.75, renew_deadline=3.0, frozen=True)
    assert a.acquire(timeout=10)
    gate = pacing.gate_for(world.store, KEY, 0.0, world.clock)
    gate.throttled(retry_after=8.0)  # the next write may go 8 s from now
    world.clock.advance(0.75)  # the renewal is due
    started, writes, expires_at = world.clock.monotonic(), world.writes, world.record().expires_at
    a._duties.run_due()  # private: the scheduler's duty, run here
    assert world.clock.monotonic() == started, "the renewal slept out the spacing"
    assert world.writes == writes + 1 and world.record().expires_at > expires_at, "the renewal waited for the 8 s"
    assert a.healthy


def test_the_spacing_relaxes_again_after_successful_writes(world):
    gate = pacing.gate_for(world.store, KEY, 0.0)
    gate.throttled()
    widened = gate.interval
    for _ in range(10):
        gate.succeeded()
    assert widened >= 1.0 and gate.interval < widened / 4


def test_a_new_store_does_not_inherit_the_write_spacing_of_a_collected_one():
    # Short-lived stores, one after another: CPython hands a freed object's id to the
    # next one almost every time, so gates keyed by id() would be passed along.
    for n in range(200):
        store = MemoryStorage(f"faults-gate-{n}")
        gate = pacing.gate_for(store, KEY, 0.0)
        assert gate.ready_in(1000.0) == 0.0, f"store {n} inherited a throttled gate"
        gate.throttled()
        assert gate.ready_in(1000.0) > 0  # now the next write must wait
        del store, gate
