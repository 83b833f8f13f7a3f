"""The way out of an acquire at its edges: the record of the instance's own last hold, applied late, given on and
not named as a live holder; an heir whose settling of a handed lease ends in LockLost, the lease given on."""

from __future__ import annotations

import uuid

import pytest
from lockparts import heir_reads_its_handoff_late
from simworld import KEY  # the world fixture is in conftest.py

from handofflock import AcquireCancelled, FakeClock, LockTimeout
from handofflock.core.errors import LockLost, StorageTimeout, TransientStorageError
from handofflock.core.record import LockRecord, Waiter
from handofflock.storage import MemoryStorage


def _own_lost_hold_lands_late_then_times_out(world, monkeypatch, *, waiter: bool):
    """A's hold is lost, its last renewal lands late (the record names A's instance, with the lost hold's
    token); A's next acquire retakes, the retake is cut off, and the acquire times out. Returns (A, the
    LockTimeout, the lost token)."""
    a = world.lock("A", ttl=4.0)
    assert a.acquire(timeout=5)
    lost_token = a.token
    real = MemoryStorage.write
    cut: list[tuple] = []
    landed: list[int] = []

    def write(self, key, data, *, if_generation_match, timeout=None):
        record = LockRecord.decode(data, key=key)
        ours = record.owner_id == "A" and record.owner_instance == a.instance
        if ours and (not landed or record.token != lost_token):
            cut.append((key, data, if_generation_match))
            raise StorageTimeout("injected: cut off at the request timeout, no answer", ambiguous=True)
        return real(self, key, data, if_generation_match=if_generation_match, timeout=timeout)

    monkeypatch.setattr(MemoryStorage, "write", write)
    world.clock.run_for(a.renew_deadline + 1.0)
    assert not a.is_held and a.token == lost_token
    key, data, generation = cut[-1]
    landed.append(real(world.store, key, data, if_generation_match=generation))
    if waiter:
        slot = Waiter("B", world.clock.time() + 10.0, ttl=4.0, instance="b1", since=world.clock.time())
        world.store.write(KEY, world.record().replace(waiter=slot).encode(), if_generation_match=world.generation())
    with pytest.raises(LockTimeout) as info:
        a.acquire(timeout=1.0)
    return a, info.value, lost_token


@pytest.mark.parametrize("waiter", [True, False], ids=["handed-on", "freed"])
def test_a_timeout_that_gave_its_own_last_hold_on_does_not_name_itself_the_live_holder(world, monkeypatch, waiter):
    """The way out found the record of A's own last hold and gave it on (handed to B, or freed). The
    LockTimeout then tells A's caller who holds the lock: it must not name A itself, "a live lease its
    holder renews while it runs", when A has just let that very record go."""
    a, exc, lost_token = _own_lost_hold_lands_late_then_times_out(world, monkeypatch, waiter=waiter)
    record = world.record()
    assert record.owner_id == ("B" if waiter else None) and not a.is_held
    assert exc.owner_id != "A", f"the LockTimeout names A, which just gave the lock on, as its holder: {exc}"
    assert "held by A," not in str(exc), str(exc)


def _heir_loses_its_settling(name: str, *, lands_at_the_give_on: bool):
    """The heir reads its handoff late; its settling renewal lands but is confirmed past its renew deadline, the
    renewal after it is cut off at every try (no answer), and the acquire raises LockLost. ``lands_at_the_give_on``:
    the store applies that cut-off renewal just before the way out's give-on write arrives. Returns (clock, store,
    the store's own write, the cut-off writes, the landed ones); the test undoes nothing but the store's name."""
    clock = FakeClock(step=0.05)
    store = MemoryStorage.named(name)
    cut: list[tuple] = []
    landed: list[int] = []
    real = MemoryStorage.write

    def writes(self, key, data, *, if_generation_match, timeout=None):
        record = LockRecord.decode(data, key=key)
        if "renewed once" in seen and record.owner_id == "H":
            cut.append((key, data, if_generation_match))
            raise StorageTimeout("injected: cut off at the request timeout, no answer", ambiguous=True)
        if seen == ["handed", "read late"] and record.owner_id == "H":
            seen.append("renewed once")  # this one lands; its reply is lost
        if lands_at_the_give_on and cut and not landed and record.owner_id != "H":  # the give-on
            k, d, g = cut[-1]
            landed.append(real(self, k, d, if_generation_match=g))
        return real(self, key, data, if_generation_match=if_generation_match, timeout=timeout)

    def slow_read(op, key):
        if seen == ["handed", "read late", "renewed once"]:
            seen.append("confirmed late")
            clock.advance(2.05)  # past the renewal's renew deadline (2 s from its send)

    def its_reply_lost_then_confirmed_late(store):
        store.faults.lose_reply_next("write")
        store.faults.before("read", slow_read)

    mp = pytest.MonkeyPatch()
    try:
        heir, seen = heir_reads_its_handoff_late(name, clock, 2.1, its_reply_lost_then_confirmed_late)
        mp.setattr(MemoryStorage, "write", writes)
        try:
            got = heir.acquire(timeout=30)
        except LockLost:
            got = None
    finally:
        mp.undo()
        store.faults.clear()
    assert seen == ["handed", "read late", "renewed once", "confirmed late"], seen
    assert got is None, "the settling kept the hold: this world no longer shows the loss it is about"
    return clock, store, real, cut, landed


def test_an_heir_that_raises_lock_lost_from_its_settling_leaves_no_renewal_to_land_after_it():
    """The heir reads its handoff late and settles the lease: the first renewal lands but is confirmed past
    its own renew deadline (a lost reply, a slow read), so it is renewed again; that second renewal is cut
    off at every try (no answer), and the settling ends with LockLost. The second renewal can still be
    applied: the object stays at the generation it was conditioned on, which the heir knows is its own.
    Every other way out of an acquire fences such a write (the record written again, or given on); this one
    leaves it, and once it lands the lock names an instance that holds nothing, with a fresh lease: blocked
    for a whole ttl (plus the skew) for every other party."""
    name = f"settle-lost-{uuid.uuid4().hex[:8]}"
    try:
        clock, store, real, cut, _ = _heir_loses_its_settling(name, lands_at_the_give_on=False)
        assert cut, "the second renewal was never sent"
        key, data, generation = cut[-1]
        try:  # the store applies the cut-off renewal late, if the object still stands where it was sent
            real(store, key, data, if_generation_match=generation)
        except Exception:
            pass
        record = LockRecord.decode(store.read(key)[0], key=key)
        assert not (record.owner_id == "H" and record.expires_at > clock.time() + 3.0), (
            f"after LockLost the record names H with a fresh lease, to {record.expires_at - clock.time():.2f} s "
            "from now, and nobody renews or releases it"
        )
    finally:
        MemoryStorage.forget(name)


def test_an_heirs_cut_off_renewal_that_lands_as_it_gives_the_lease_on_is_given_on_too():
    """As above, the heir's settling ends with LockLost and its second renewal unanswered; the way out reads the
    record (still the heir's, at the renewal's generation) and gives the lease on. The store applies the cut-off
    renewal just before that give-on write arrives: the write finds the object moved (412), and the record names
    the heir with a fresh lease. The way out must read again and give that on too, not leave it for a ttl."""
    name = f"settle-lost-late-{uuid.uuid4().hex[:8]}"
    try:
        clock, store, real, cut, landed = _heir_loses_its_settling(name, lands_at_the_give_on=True)
        assert landed, "the give-on never wrote (nothing was given on)"
        record = LockRecord.decode(store.read(cut[-1][0])[0], key=cut[-1][0])
        assert not (record.owner_id == "H" and record.expires_at > clock.time()), (
            f"the late renewal landed as the heir gave the lease on, and the record names H with a lease to "
            f"{record.expires_at - clock.time():.2f} s from now: nobody renews or releases it"
        )
    finally:
        MemoryStorage.forget(name)


def test_an_acquire_cancelled_before_its_retake_leaves_no_renewal_of_the_lost_hold_to_land(world, monkeypatch):
    """A's renewals are cut off at their timeout (no answer) until its hold is lost; the last may still be applied.
    A acquires again: it reads its own lost hold's record, and its retake waits for a write spacing 429s widened;
    cancel() ends the acquire before the retake goes out. design.md: an acquire that leaves while the object is
    still where a write of ours was sent writes it again, so that write can no longer land. Found by the
    simulation's long mode (seed 17992): the way out wrote nothing, and the lost hold's renewal landed after it,
    naming A, which holds nothing, with a fresh lease."""
    a = world.lock("A", ttl=6.0, min_write_interval=1.0)
    assert a.acquire(timeout=5)
    real = MemoryStorage.write
    cut: list[tuple] = []

    def write(self, key, data, *, if_generation_match, timeout=None):
        if a.is_held:  # its renewals: cut off, no answer
            cut.append((key, data, if_generation_match))
            raise StorageTimeout("injected: cut off at the request timeout, no answer", ambiguous=True)
        return real(self, key, data, if_generation_match=if_generation_match, timeout=timeout)

    monkeypatch.setattr(MemoryStorage, "write", write)
    world.clock.run_for(a.renew_deadline + 1.0)
    assert not a.is_held and cut
    a._io.gate().throttled(retry_after=8.0)  # private: the store's write gate, widened as 429s do
    started = world.clock.monotonic()
    world.clock.on_tick.append(lambda: a.cancel() if world.clock.monotonic() > started + 1.0 else None)
    with pytest.raises(AcquireCancelled):
        a.acquire(timeout=30)
    key, data, generation = cut[-1]
    try:  # the store applies the cut-off renewal late, if the object still stands where it was sent
        real(world.store, key, data, if_generation_match=generation)
    except Exception:
        pass
    record = world.record()
    assert not (record.owner_id == "A" and record.expires_at > world.clock.time()), (
        f"after the cancelled acquire the record names A with a lease to {record.expires_at - world.clock.time():.2f} s "
        "from now, and A holds nothing"
    )


@pytest.mark.parametrize("blocking", [True, False], ids=["timeout", "non-blocking"])
def test_an_acquire_whose_retake_of_its_lost_hold_is_refused_gives_that_hold_on(world, monkeypatch, blocking):
    """A's hold is lost and its last renewal lands late: the record names A's instance with the lost hold's token,
    B waiting. A acquires again; its retake is refused (429s: nothing applied, so no registration or take of this
    acquire can land). The way out still reads the record, as the hold's own, and hands it to B: left naming A,
    the lock would be handed to nobody until A's fresh lease ran out."""
    a = world.lock("A", ttl=4.0)
    assert a.acquire(timeout=5)
    lost_token = a.token
    real = MemoryStorage.write
    cut: list[tuple] = []
    refuse: list[bool] = []

    def write(self, key, data, *, if_generation_match, timeout=None):
        record = LockRecord.decode(data, key=key)
        if record.owner_id == "A" and record.owner_instance == a.instance:
            if refuse:
                raise TransientStorageError("injected: 429", status=429, ambiguous=False)
            cut.append((key, data, if_generation_match))
            raise StorageTimeout("injected: cut off at the request timeout, no answer", ambiguous=True)
        return real(self, key, data, if_generation_match=if_generation_match, timeout=timeout)

    monkeypatch.setattr(MemoryStorage, "write", write)
    world.clock.run_for(a.renew_deadline + 1.0)
    assert not a.is_held and cut
    key, data, generation = cut[-1]
    real(world.store, key, data, if_generation_match=generation)  # the lost hold's renewal, applied late
    slot = Waiter("B", world.clock.time() + 10.0, ttl=4.0, instance="b1", since=world.clock.time())
    real(world.store, KEY, world.record().replace(waiter=slot).encode(), if_generation_match=world.generation())
    refuse.append(True)
    with pytest.raises((LockTimeout, TransientStorageError)):
        a.acquire(timeout=1.0) if blocking else a.acquire(blocking=False)
    record = world.record()
    assert record.owner_id == "B" and record.token > lost_token, f"the lost hold was not given on: {record}"
