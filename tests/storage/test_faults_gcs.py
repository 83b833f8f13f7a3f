"""The lock on the GCS emulator, through a fault-injecting proxy: lost replies, throttling, refusals.

Every actor (a HandoffLock with a stable owner id) talks to fake-gcs-server
through its own :class:`FaultProxy`, so a fault can be aimed at one actor's
next write, and everything an actor wrote is in its proxy's history.

The central fault is "forward, then drop the reply": the write is applied, the
client hears a connection reset. A lock that retries blindly then fails its
own precondition (412) against its own write. handofflock reads the object
back and looks for the write's nonce instead. The invariant checked after each
such fault, for every transition:

* the write that landed is the one the lock goes on from (same token, same
  record), and the lock never sent it again (a blind retry re-sends the same
  bytes, nonce included, and fails its precondition against itself);
* no false LockLost, no double handoff, no lost waiter.

Without the read-back (``handofflock.storage.records._landed`` answering "not landed")
every one of these tests fails on the first point at least; the docstrings say
what else would break. ``test_..._catches_a_lock_without_the_read_back`` runs
the scenarios on such a lock to prove it.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from lockutil import FAST, eventually, moved_on, raw_read, raw_write, stepped_until

from handofflock import (
    FakeClock,
    HandoffLock,
    LockLost,
    LockTimeout,
    Scheduler,
    StorageError,
    TransientStorageError,
    signals,
)
from handofflock.core.record import Holder, LockRecord
from handofflock.storage import records as cas
from handofflock.storage.gcs import GCSStorage
from handofflock.testing.faultproxy import Exchange, FaultProxy

KEY = "locks/a.json"


@dataclass
class Actor:
    """One lock instance with its own proxy and a log of its signals."""

    name: str
    lock: HandoffLock
    proxy: FaultProxy
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    receivers: list[Any] = field(default_factory=list)
    #: On a fake clock, its time as each write of the store was sent, in order.
    sent_at: list[float] = field(default_factory=list)

    def writes(self) -> list[tuple[LockRecord, Exchange]]:
        """Every lock record this actor sent, with what became of it."""
        out = []
        for ex in self.proxy.exchanges("POST"):
            data = ex.upload_data()
            if data is not None:
                out.append((LockRecord.decode(data), ex))
        return out

    def landed(self) -> list[LockRecord]:
        """Records this actor wrote that the store applied (answered 200, or applied and the reply dropped)."""
        return [rec for rec, ex in self.writes() if ex.status == 200 or ex.fault == "drop_reply"]

    def resent(self) -> list[LockRecord]:
        """Writes retried after one that had landed: each is the 412 that follows a dropped reply.

        A retry is stamped anew (new nonce and lease), so it is not the same bytes; what gives a
        lock that lost track of its landed write away is that its next write fails against it.
        """
        ws = self.writes()
        return [rec for i, (rec, ex) in enumerate(ws) if ex.status == 412 and i > 0 and ws[i - 1][1].fault == "drop_reply"]

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for name, kw in self.events if name == event]


@pytest.fixture
def bucket(gcs_emulator):
    name = f"f-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(name)
    return name


def fake_time() -> dict[str, Any]:
    """A clock and scheduler for every lock of a test: the clock moves as a lock waits, a step at a time,
    and each step runs the locks' due renewals and waiter checks in the thread that waits. The store stays
    real, in real time; only the locks' waits are simulated."""
    clock = FakeClock(start=time.time(), step=0.05)
    scheduler = Scheduler(clock, autostart=False)
    clock.on_tick.append(scheduler.run_pending)
    return {"clock": clock, "scheduler": scheduler}


def stamped(write, clock: FakeClock, sent_at: list[float]):
    """``write``, noting ``clock``'s time in ``sent_at`` as each call begins."""

    def write_at(*args: Any, **kwargs: Any) -> Any:
        sent_at.append(clock.monotonic())
        return write(*args, **kwargs)

    return write_at


def actors(gcs_emulator, bucket, on_clock: dict[str, Any]):
    """``make(name, ...)``, then the teardown of what it made; every lock made with ``on_clock`` ({}: real time)."""
    made: list[Actor] = []

    def make(
        name: str, *, key: str = KEY, bucket_name: str | None = None, store: dict[str, Any] | None = None, **overrides: Any
    ) -> Actor:
        proxy = FaultProxy(gcs_emulator.url, lifetime=120).start()
        with proxy.env():
            store = GCSStorage(bucket_name or bucket, **{"timeout": (1.0, 2.0), **(store or {})})
        lock = HandoffLock(
            f"gs://{bucket_name or bucket}/{key}", storage=store, key=key, owner_id=name, **{**FAST, **on_clock, **overrides}
        )
        a = Actor(name, lock, proxy)
        if on_clock:
            store.write = stamped(store.write, on_clock["clock"], a.sent_at)
        for sig in (signals.waiting, signals.acquired, signals.released, signals.lost):
            def receiver(sender, _name=sig.name, **kw):
                a.events.append((_name, kw))
            sig.connect(receiver, sender=lock, weak=False)
            a.receivers.append((sig, receiver))
        made.append(a)
        return a

    yield make
    for a in made:
        a.lock.cancel()
        if a.lock.is_held:
            try:
                a.lock.release()
            except Exception:
                pass
        a.lock._unschedule()  # private: stop its renewals without releasing
        for sig, receiver in a.receivers:
            sig.disconnect(receiver)
        a.proxy.stop()


@pytest.fixture
def actor(gcs_emulator, bucket):
    """Actors whose locks keep real time."""
    yield from actors(gcs_emulator, bucket, {})


@pytest.fixture
def fake_actor(gcs_emulator, bucket):
    """Actors whose locks share one :func:`fake_time` clock."""
    yield from actors(gcs_emulator, bucket, fake_time())


def url(bucket: str) -> str:
    return f"gs://{bucket}/{KEY}"


def in_thread(fn) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test to assert on
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def until(cond, what: str):
    """A proxy ``when`` that holds the request it matches until ``cond()`` holds (at most 10 s): a race
    ordered by the event it waits for, not by a delay guessed long enough for it. The proxy decides no
    other request meanwhile, so ``cond`` must not wait on one through the same proxy."""

    def hold(ex: Exchange) -> bool:
        eventually(cond, timeout=10, what=what)
        return True

    return hold


def owner_written_is(name: str | None):
    """A proxy predicate: the upload writes a record whose owner is ``name``."""
    def check(ex: Exchange) -> bool:
        data = ex.upload_data()
        return data is not None and LockRecord.decode(data).owner_id == name
    return check


def waiter_written_is(name: str | None):
    def check(ex: Exchange) -> bool:
        data = ex.upload_data()
        return data is not None and LockRecord.decode(data).waiting_owner_id == name
    return check


def assert_carried_on(*actors: Actor) -> None:
    for a in actors:
        assert a.resent() == [], f"{a.name} lost track of a write that landed and sent it again"
        assert a.named("lost") == [], f"{a.name} reported a false LockLost: {a.named('lost')}"


def dropped(a: Actor) -> LockRecord:
    """The one record of ``a`` whose reply the proxy dropped."""
    hits = [rec for rec, ex in a.writes() if ex.fault == "drop_reply"]
    assert len(hits) == 1, f"expected one dropped write from {a.name}, got {len(hits)}"
    return hits[0]


# --------------------------------------------------------------------------- one lost reply per transition


def scenario_create(actor, bucket) -> None:
    """Create, reply lost. Without the read-back the retry gets 412, the lock re-reads, sees its own
    id and retakes the lock with a second token: two writes for one acquire, and a token that does not
    match the record it first wrote."""
    a = actor("A")
    a.proxy.inject("drop_reply", method="POST")
    assert a.lock.acquire(timeout=5)
    created = dropped(a)
    assert created.owner_id == "A" and a.lock.token == created.token
    assert len(a.writes()) == 1, "one create, nothing else"
    stepped_until(a.lock.clock, lambda: len(a.landed()) >= 3, within=5, what="two renewals from the generation that write created")
    assert a.lock.healthy
    assert raw_read(url(bucket))[0].token == created.token
    assert_carried_on(a)


def scenario_take(actor, bucket) -> None:
    """Take over an expired lock, reply lost. Without the read-back: 412, then a retake with a new token."""
    raw_write(url(bucket), LockRecord(Holder("X", time.time() - 60), ttl=1.0, token=5, nonce="x"), 0)
    a = actor("A")
    a.proxy.inject("drop_reply", method="POST")
    assert a.lock.acquire(timeout=5)
    taken = dropped(a)
    assert taken.owner_id == "A" and taken.token > 5 and a.lock.token == taken.token
    assert len(a.writes()) == 1
    stepped_until(a.lock.clock, lambda: len(a.landed()) >= 3, within=5, what="two renewals from the generation the take created")
    assert a.lock.healthy and raw_read(url(bucket))[0].token == taken.token
    assert_carried_on(a)


#: The waiter's slot life where a scenario drops one of the waiter's writes: it refreshes the slot at
#: half of it, so its next write after the dropped one comes 1.5 s of the clock later, long after the
#: owner's release (a refresh racing the release gets a 412 that would look like a resend). The
#: waiter's thread steps the clock as it waits, a step per poll, far faster than real time.
SLOW_REFRESH = 3.0


def scenario_become_waiter(actor, bucket) -> None:
    """Become the waiter, reply lost. Without the read-back: 412, and the waiter never learns it
    registered, so it never says so (no ``waiting`` signal) and, when the lock is handed to it, it
    retakes it with yet another token instead of accepting the handoff."""
    a, b = actor("A"), actor("B", waiter_ttl=SLOW_REFRESH)
    assert a.lock.acquire()
    b.proxy.inject("drop_reply", method="POST")
    t, box = in_thread(lambda: b.lock.acquire(timeout=10))
    eventually(lambda: a.lock.release_requested, what="A noticed the waiter")
    registered = dropped(b)
    assert registered.waiting_owner_id == "B" and registered.owner_id == "A"
    # A can read B's registration before B's read-back has told B it landed (a round trip or two).
    eventually(lambda: b.named("waiting"), timeout=2, what="B said it is waiting")
    assert len(b.named("waiting")) == 1
    assert a.lock.release() == "B"
    t.join(10)
    assert bool(box.get("value")), box
    handed = [rec for rec in a.landed() if rec.owner_id == "B"]
    assert len(handed) == 1 and b.lock.token == handed[0].token
    assert b.named("acquired") == [{"token": handed[0].token, "handoff": True}]
    assert [rec for rec, _ in b.writes() if rec.owner_id == "B" and rec.token != handed[0].token] == []
    assert_carried_on(a, b)


def scenario_refresh_waiter(actor, bucket) -> None:
    """Refresh the waiter slot, reply lost. Without the read-back: a second write that fails with 412
    against the refresh that landed (harmless here only because the lock then re-reads)."""
    a, b = actor("A"), actor("B", waiter_ttl=SLOW_REFRESH)
    assert a.lock.acquire()
    t, box = in_thread(lambda: b.lock.acquire(timeout=10))
    eventually(lambda: b.named("waiting"), what="B is the waiter")
    rule = b.proxy.inject("drop_reply", method="POST")  # B's only writes while waiting are refreshes
    eventually(lambda: rule.fired, timeout=15, what="B refreshed its slot")
    refreshed = dropped(b)
    assert refreshed.waiting_owner_id == "B"
    moved_on(b.lock.clock, 0.3)  # B's wait goes on after it
    assert t.is_alive(), f"B stopped waiting: {box}"
    assert a.lock.release() == "B"
    t.join(10)
    assert bool(box.get("value")) and b.lock.is_held
    assert_carried_on(a, b)


def scenario_renew(actor, bucket) -> None:
    """Renew, reply lost. Without the read-back the renewal counts as failed, and the next one is sent
    with a stale generation and gets 412 (a lock with a tighter deadline would go unhealthy). The
    waiter check, which would refresh the generation as a side effect, is slowed right down."""
    a = actor("A", waiter_check_interval=30.0)
    assert a.lock.acquire()
    rule = a.proxy.inject("drop_reply", method="POST")
    stepped_until(a.lock.clock, lambda: rule.fired, within=5, what="a renewal")
    renewed = dropped(a)
    assert renewed.owner_id == "A" and renewed.token == a.lock.token
    a.lock.clock.run_for(0.6)  # three more renewals
    assert a.lock.healthy and a.lock.is_held
    assert raw_read(url(bucket))[0].expires_at > renewed.expires_at
    # A is alone, so a 412 could only come from A's own renewal that landed.
    assert [ex for _, ex in a.writes() if ex.status == 412] == [], "a renewal was sent with a stale generation"
    assert_carried_on(a)


def scenario_handoff(actor, bucket) -> None:
    """Hand off, reply lost. Without the read-back the retry gets 412; worse, a lock that took the 412
    at face value would report LockLost for a release that worked. There must be exactly one handoff."""
    a, b = actor("A"), actor("B")
    assert a.lock.acquire()
    t, box = in_thread(lambda: b.lock.acquire(timeout=10))
    eventually(lambda: a.lock.release_requested, what="A noticed the waiter")
    a.proxy.inject("drop_reply", method="POST", when=owner_written_is("B"))
    assert a.lock.release() == "B"
    t.join(10)
    handoff = dropped(a)
    assert bool(box.get("value")) and b.lock.token == handoff.token
    assert len([rec for rec, _ in a.writes() if rec.owner_id == "B" and rec.nonce == handoff.nonce]) == 1, "the handoff sent once"
    assert [rec for rec in a.landed() if rec.owner_id == "B"] == [handoff], "exactly one handoff landed"
    assert a.named("released") == [{"handed_off_to": "B", "token": a.lock.token}]
    b.lock.clock.run_for(0.3)
    assert b.lock.healthy
    assert_carried_on(a, b)


def scenario_free(actor, bucket) -> None:
    """Release with no waiter, reply lost. Without the read-back: a retry that gets 412."""
    a = actor("A")
    assert a.lock.acquire()
    a.proxy.inject("drop_reply", method="POST", when=owner_written_is(None))
    assert a.lock.release() is None
    freed = dropped(a)
    stored = raw_read(url(bucket))[0]
    assert stored.owner_id is None and stored.nonce == freed.nonce
    assert not a.lock.is_held
    assert_carried_on(a)


def scenario_give_up_wait(actor, bucket) -> None:
    """Give up the wait on timeout, reply lost. Without the read-back: a retry that gets 412. A lock
    that gave up without clearing its slot would block a third party until the slot expired, and be
    handed a lock nobody uses."""
    a, b, c = actor("A"), actor("B"), actor("C")
    assert a.lock.acquire()
    b.proxy.inject("drop_reply", method="POST", when=waiter_written_is(None))
    with pytest.raises(LockTimeout):
        b.lock.acquire(timeout=0.4)
    gave_up = dropped(b)
    assert gave_up.waiting_owner_id is None and gave_up.owner_id == "A"
    assert raw_read(url(bucket))[0].waiting_owner_id is None
    t, box = in_thread(lambda: c.lock.acquire(timeout=10))
    eventually(lambda: c.named("waiting"), timeout=2, what="C became the waiter at once")
    assert a.lock.release() == "C"
    t.join(10)
    assert bool(box.get("value"))
    assert_carried_on(a, b, c)


SCENARIOS = {
    "create": scenario_create,
    "take": scenario_take,
    "become_waiter": scenario_become_waiter,
    "refresh_waiter": scenario_refresh_waiter,
    "renew": scenario_renew,
    "handoff": scenario_handoff,
    "free": scenario_free,
    "give_up_wait": scenario_give_up_wait,
}


@pytest.mark.gcs
@pytest.mark.parametrize("transition", list(SCENARIOS))
def test_a_write_applied_whose_reply_was_lost_is_recognised_and_the_lock_carries_on(transition, fake_actor, bucket):
    SCENARIOS[transition](fake_actor, bucket)


@pytest.mark.gcs
@pytest.mark.parametrize("transition", list(SCENARIOS))
def test_each_scenario_catches_a_lock_without_the_read_back(transition, fake_actor, bucket, monkeypatch):
    """The scenarios above are not vacuous: on a lock that never reads back a write whose reply was
    lost, each of them fails."""
    monkeypatch.setattr(cas, "_landed", lambda storage, key, expected, is_ours, max_bytes, timeout: None)
    with pytest.raises(AssertionError) as info:
        SCENARIOS[transition](fake_actor, bucket)
    print(f"[{transition}] without the read-back: {str(info.value).splitlines()[0]}")


# --------------------------------------------------------------------------- the record moved on before the read-back


@pytest.mark.gcs
def test_a_handoff_whose_reply_was_lost_is_not_reported_lost_when_the_heir_renewed_before_the_read_back(actor, bucket):
    """A hands off; the reply is lost; B renews before A reads back, so A finds B's nonce, not its own.
    A must still see that its handoff landed (the record names B with the token A gave it): reporting
    LockLost for a successful release would make a caller throw away good work."""
    a, b = actor("A"), actor("B")
    assert a.lock.acquire()
    t, box = in_thread(lambda: b.lock.acquire(timeout=10))
    eventually(lambda: a.lock.release_requested, what="A noticed the waiter")
    drop = a.proxy.inject("drop_reply", method="POST", when=owner_written_is("B"))
    heir_renewed = until(lambda: any(rec.owner_id == "B" for rec in b.landed()), "B renewed the lock handed to it")
    a.proxy.inject("delay", method="GET", delay=0.001, when=lambda ex: drop.fired and heir_renewed(ex))
    assert a.lock.release() == "B"
    t.join(10)
    assert bool(box.get("value"))
    handoff = dropped(a)
    stored = raw_read(url(bucket))[0]
    assert stored.owner_id == "B" and stored.token == handoff.token and stored.nonce != handoff.nonce
    assert a.named("lost") == [] and b.named("lost") == []


@pytest.mark.gcs
def test_a_waiter_whose_registration_reply_was_lost_is_still_the_waiter_when_the_owner_wrote_before_the_read_back(actor, bucket):
    """B registers as waiter; the reply is lost; A renews before B reads back, so B finds A's nonce.
    B is the waiter all the same (the record names it): it must behave as one, i.e. give its slot
    back when it times out, rather than leave A to hand the lock to a process that has left."""
    a, b = actor("A"), actor("B", **fake_time())  # B's waits on a clock of its own
    assert a.lock.acquire()
    drop = b.proxy.inject("drop_reply", method="POST")
    owner_wrote = until(lambda: any(rec.waiting_owner_id == "B" for rec in a.landed()), "A wrote over the registration")
    b.proxy.inject("delay", method="GET", delay=0.001, when=lambda ex: drop.fired and owner_wrote(ex))
    with pytest.raises(LockTimeout):
        b.lock.acquire(timeout=0.45)  # before B would refresh its slot (at half its 1 s life)
    registered = dropped(b)
    assert registered.waiting_owner_id == "B"
    assert raw_read(url(bucket))[0].waiting_owner_id is None, "B left without giving its slot back"
    assert a.lock.release() is None  # nobody to hand off to
    assert a.named("lost") == []


SLOW = dict(ttl=30.0, renew_interval=10.0, renew_deadline=20.0, waiter_ttl=10.0, waiter_check_interval=5.0)


@pytest.mark.gcs
def test_a_registration_the_store_applies_after_the_waiter_gave_up_never_lands(actor, bucket):
    """B's registration is held back 3 s on its way (a stalled request); B's acquire(timeout=1) cuts it off and
    leaves, and then the store gets it. Nobody else wrote meanwhile (A renews every 10 s), so it would land and
    name as waiter a process that left: A would be asked for the lock and hand it to nobody. B's give-up
    finds the object still at the generation its registration matched, and writes it again as it stands."""
    a, b = actor("A", **SLOW), actor("B", **SLOW)
    assert a.lock.acquire()
    late = b.proxy.inject("delay", method="POST", delay=3.0)
    started = time.monotonic()
    with pytest.raises(LockTimeout):
        b.lock.acquire(timeout=1.0)
    assert time.monotonic() - started < 3.0  # B left before its registration reached the store
    eventually(lambda: late.fired and b.proxy.exchanges("POST")[0].status is not None, timeout=10, what="the late write")
    registration = b.writes()[0]
    assert registration[0].waiting_owner_id == "B" and registration[1].status == 412, registration[1].status
    assert raw_read(url(bucket))[0].waiting_owner_id is None, "a registration landed after B left"
    assert not a.lock.release_requested and a.lock.release() is None


@pytest.mark.gcs
def test_a_waiter_whose_registration_reply_was_lost_accepts_the_handoff_when_the_owner_wrote_before_the_read_back(actor, bucket):
    """Same race, but A hands off: B must take the lock as handed (the token A wrote), and must have
    said it was waiting, not retake the lock with a token of its own."""
    a, b = actor("A"), actor("B")
    assert a.lock.acquire()
    drop = b.proxy.inject("drop_reply", method="POST")
    owner_wrote = until(lambda: any(rec.waiting_owner_id == "B" for rec in a.landed()), "A wrote over the registration")
    read_back = b.proxy.inject("delay", method="GET", delay=0.001, when=lambda ex: drop.fired and owner_wrote(ex))
    t, box = in_thread(lambda: b.lock.acquire(timeout=10))
    eventually(lambda: a.lock.release_requested, what="A noticed the waiter")
    eventually(lambda: read_back.fired, what="B read back")

    def polled_after_the_read_back() -> bool:
        gets = b.proxy.exchanges("GET")
        i = next(i for i, ex in enumerate(gets) if ex.fault == "delay")
        return len(gets) > i + 1 and gets[i + 1].status is not None

    # The read-back (A's renewal by then) and one more poll answered: B waits on as the waiter.
    eventually(polled_after_the_read_back, what="B polled once after its read-back")
    assert a.lock.release() == "B"
    t.join(10)
    assert bool(box.get("value"))
    handed = [rec for rec in a.landed() if rec.owner_id == "B"]
    assert len(handed) == 1 and b.lock.token == handed[0].token
    assert len(b.named("waiting")) == 1
    assert b.named("acquired") == [{"token": handed[0].token, "handoff": True}]


@pytest.mark.gcs
def test_a_release_whose_reply_was_lost_is_not_reported_lost_when_another_process_took_the_lock_before_the_read_back(actor, bucket):
    """A frees the lock; the reply is lost; C takes the free lock before A reads back. A's lease was
    still live when it looked, so nobody but A could have freed it: the release worked and must not
    be reported as LockLost."""
    # A's lease must outlive the lost reply and the delayed read-back, on a loaded machine too.
    a, c = actor("A", ttl=6.0, renew_interval=0.2, renew_deadline=3.0), actor("C")
    assert a.lock.acquire()
    drop = a.proxy.inject("drop_reply", method="POST", when=owner_written_is(None))
    taken = until(lambda: c.lock.is_held, "C took the freed lock")
    a.proxy.inject("delay", method="GET", delay=0.001, when=lambda ex: drop.fired and taken(ex))
    stop = threading.Event()

    def grab():
        while not stop.is_set():
            if c.lock.acquire(blocking=False):
                return True
            time.sleep(0.02)
        return False

    t, box = in_thread(grab)
    try:
        assert a.lock.release() is None
    finally:
        stop.set()
        t.join(5)
    assert bool(box.get("value")), "C should have taken the freed lock"
    assert raw_read(url(bucket))[0].owner_id == "C"
    assert a.named("lost") == []


@pytest.mark.gcs
def test_a_lost_reply_whose_read_backs_fail_too_is_still_resolved_within_the_deadline(actor, bucket):
    """The create's reply is lost and the next two reads are reset: the retry of the create gets 412
    (against itself), and the read-back that would tell fails once more. That is still a transient
    failure with time left: the lock must read again, find its nonce and hold the lock, not give up
    with a TransientStorageError while its create sits in the store naming it."""
    a = actor("A")
    drop = a.proxy.inject("drop_reply", method="POST")
    a.proxy.inject("reset", method="GET", times=2, when=lambda ex: drop.fired)
    assert a.lock.acquire(timeout=5)
    created = dropped(a)
    # The lock it created, not a retake (a new token); a renewal may have replaced the nonce by now.
    assert a.lock.token == created.token and raw_read(url(bucket))[0].token == created.token
    statuses = [ex.status for _, ex in a.writes()]
    assert statuses[:2] == [None, 412]
    assert all(rec.owner_id == "A" and rec.token == created.token for rec, _ in a.writes()[2:]), "only renewals follow"
    assert a.named("lost") == []


@pytest.mark.gcs
def test_a_fenced_write_whose_reply_and_read_backs_are_lost_lands_once(actor, bucket):
    """The same for a FencedObject append (fencing's write_resolving): the entry is in the object
    exactly once and append() returns, instead of failing after ~0.1 s of its 30 s timeout with an
    outcome the caller cannot know."""
    from handofflock.fencing import FencedObject

    a = actor("A")
    assert a.lock.acquire()
    journal = FencedObject.beside(a.lock, "journal.json")
    journal.append({"n": 1})
    drop = a.proxy.inject("drop_reply", method="POST", path="/upload/", body=b'"n":2')
    a.proxy.inject("reset", method="GET", path="journal.json", times=2, when=lambda ex: drop.fired)
    journal.append({"n": 2})
    assert drop.fired == 1
    assert FencedObject(GCSStorage(bucket), "locks/journal.json").read().payload == [{"n": 1}, {"n": 2}]


# --------------------------------------------------------------------------- throttling and unavailability


@pytest.mark.gcs
def test_unavailable_writes_are_retried_with_jittered_exponential_backoff(fake_actor, bucket):
    """Four 503s in a row, then the store answers: acquire() succeeds, after retries spaced by
    full-jitter exponential backoff (base 0.1 s: the n-th wait is at most 0.1 * 2**n s). Without
    retries acquire() would raise; without backoff the gaps would all be ~0. (A 429 is spaced by the
    write gate instead: see the next tests.)"""
    a = fake_actor("A")
    rule = a.proxy.inject("503", method="POST", times=4)
    assert a.lock.acquire(timeout=10)
    assert rule.fired == 4
    assert len(a.sent_at) == len(a.writes())
    attempts = a.sent_at[:5]
    assert len(attempts) == 5
    gaps = [later - earlier for earlier, later in zip(attempts, attempts[1:])]
    for n, gap in enumerate(gaps):
        assert gap <= 0.1 * 2**n + 0.001, f"retry {n} waited {gap:.3f} s"  # on the lock's clock: the draw alone
    assert len({round(g, 4) for g in gaps}) == len(gaps), "identical gaps: no jitter"
    assert raw_read(url(bucket))[0].owner_id == "A"


@pytest.mark.gcs
def test_a_throttled_write_is_retried_after_retry_after_not_at_once(fake_actor, bucket):
    """A 429 with Retry-After: 1 on the create: the retry waits the second out (the write gate's
    widened spacing applies to the very next write), then lands. Retrying at once, as jittered backoff
    alone would (within 0.1 s), only earns another 429 from GCS."""
    a = fake_actor("A")
    a.proxy.inject("429", method="POST", retry_after=1)
    assert a.lock.acquire(timeout=5)
    assert len(a.sent_at) == len(a.writes())
    first, second = a.sent_at[:2]
    assert [ex.status for _, ex in a.writes()][:2] == [429, 200]
    assert second - first >= 1.0 - 0.02
    assert raw_read(url(bucket))[0].token == a.lock.token


@pytest.mark.gcs
@pytest.mark.parametrize("status", ["429", "503"])
def test_a_store_that_keeps_refusing_fails_the_acquire_within_its_deadline(fake_actor, bucket, status, monkeypatch):
    """Retries stop at the operation's deadline: acquire(timeout=1) against a store that answers
    every write with 503 retries until the deadline (a backoff draw that would pass it is cut short
    to one last try just before it, so an unlucky draw never ends the acquire early) and raises a
    TransientStorageError. With 429s the spacing (Retry-After: 2) puts the next try past the
    deadline, so it gives up at once rather than sleep past it. Never: retry forever, or return
    after the deadline. Timed on the lock's clock, where the store's answers take no time: so no
    request is cut off at what the fake clock leaves of the deadline (the last try gets milliseconds
    of real time, which a loaded machine's proxy misses, and a try cut off without an answer is a
    different case: it may land late, and the give-up rewrites the record after it)."""
    for op in ("read", "write"):
        real = getattr(GCSStorage, op)
        monkeypatch.setattr(GCSStorage, op, lambda self, *args, _real=real, timeout=None, **kw: _real(self, *args, **kw))
    a = fake_actor("A")
    a.proxy.inject(status, method="POST", times=10_000, retry_after=2)
    clock = a.lock.clock
    started = clock.monotonic()
    with pytest.raises(TransientStorageError) as info:
        a.lock.acquire(timeout=1.0)
    elapsed = clock.monotonic() - started
    assert info.value.status == int(status)
    assert elapsed <= 1.0  # on the lock's clock, where a try under way takes no time
    if status == "503":
        assert elapsed > 1.0 - 0.05 - 0.02 and len(a.writes()) >= 3
    else:
        assert len(a.writes()) == 1
    assert not a.lock.is_held and raw_read(url(bucket))[0] is None


@pytest.mark.gcs
def test_a_429_widens_the_spacing_of_the_next_writes_to_the_object(fake_actor, bucket):
    """After a 429 with Retry-After: 1, the next write to the object waits at least a second, and the
    spacing relaxes back towards min_write_interval (0 here) as writes succeed. Without the WriteGate
    the renewal after the 429 would follow within renew_interval (0.2 s)."""
    a = fake_actor("A", ttl=6.0, renew_interval=0.2, renew_deadline=3.0)
    assert a.lock.acquire()
    rule = a.proxy.inject("429", method="POST", retry_after=1)
    stepped_until(a.lock.clock, lambda: rule.fired, within=5, what="a throttled renewal")
    a.lock.clock.run_for(3.0)
    writes = [ex for _, ex in a.writes()]
    assert len(a.sent_at) == len(writes)
    i = next(i for i, ex in enumerate(writes) if ex.fault == "429")
    after = a.sent_at[i:]
    gaps = [later - earlier for earlier, later in zip(after, after[1:])]
    assert gaps[0] >= 1.0 - 0.02, f"the write after the 429 came {gaps[0]:.3f} s later"
    assert len(gaps) >= 3 and gaps[-1] < gaps[0], f"the spacing never relaxed: {gaps}"
    assert a.lock.healthy and a.named("lost") == []


@pytest.mark.gcs
def test_refused_connections_delay_but_do_not_break_an_acquire(actor, bucket):
    """Connections refused for 0.2 s: nothing was sent, so the lock simply retries; the acquire
    completes after the window with exactly one write that landed."""
    a = actor("A")
    a.proxy.refuse_connections(0.2)
    started = time.monotonic()
    assert a.lock.acquire(timeout=5)
    assert time.monotonic() - started >= 0.18
    assert len([ex for _, ex in a.writes() if ex.status == 200]) >= 1
    assert raw_read(url(bucket))[0].token == a.lock.token
    assert_carried_on(a)


@pytest.mark.gcs
def test_a_request_reset_before_it_was_forwarded_is_retried_and_lands_once(actor, bucket):
    """The reset write never reached the store; the read-back finds the old generation and the lock
    writes again: one create in the store, the lock holding it."""
    a = actor("A")
    a.proxy.inject("reset", method="POST")
    assert a.lock.acquire(timeout=5)
    sent = a.writes()
    assert [ex.status for _, ex in sent][:2] == [None, 200]
    # Sent again, stamped anew (its lease counts from this send): right, since it never landed.
    assert sent[0][0].token == sent[1][0].token and sent[0][0].nonce != sent[1][0].nonce
    assert raw_read(url(bucket))[0].token == a.lock.token
    assert a.named("lost") == []


@pytest.mark.gcs
def test_a_write_refused_with_409_is_retried_and_lands(actor, bucket):
    """GCS answers 409 to a change that lost to a concurrent one and says to retry it; the write is
    generation-matched, so the retry cannot overwrite that change. Not applied, so no read-back: the
    same write goes again and lands, once."""
    a = actor("A")
    rule = a.proxy.inject("409", method="POST")
    started = time.monotonic()
    assert a.lock.acquire(timeout=5)
    assert time.monotonic() - started < 2.5  # no retrying towards the timeout; a bound a loaded 2-core machine meets
    assert rule.fired == 1
    assert [ex.status for _, ex in a.writes()][:2] == [409, 200]
    assert [ex.method for ex in a.proxy.exchanges()][:3] == ["GET", "POST", "POST"], "retried without a read-back"
    assert raw_read(url(bucket))[0].token == a.lock.token
    assert_carried_on(a)


@pytest.mark.gcs
def test_a_write_whose_reply_trickles_is_cut_off_at_the_request_deadline_and_resolved_by_the_read_back(actor, bucket):
    """The create is applied, but its reply comes one byte a second (the read timeout, 2 s, never
    trips). request_timeout (1 s) cuts it off as an ambiguous failure; the read-back finds the write
    landed and the lock goes on from it. Without the deadline acquire(timeout=5) would sit in that one
    request for minutes. The lease counts from the create's send, a second before the read-back
    confirms it, so it is longer than FAST's (whose 0.8 s renew_deadline would be over by then)."""
    a = actor("A", ttl=6.0, renew_interval=0.2, renew_deadline=3.0, store={"request_timeout": 1.0})
    a.proxy.inject("trickle", method="POST", delay=1.0)
    started = time.monotonic()
    assert a.lock.acquire(timeout=5)
    assert time.monotonic() - started < 1.0 + 2.0
    record, ex = a.writes()[0]
    assert ex.fault == "trickle" and a.lock.token == record.token
    assert raw_read(url(bucket))[0].token == record.token
    assert [e.status for _, e in a.writes()].count(412) == 0, "the create was sent again"
    time.sleep(0.5)  # renewals go on from the generation that write created
    assert a.lock.healthy
    assert_carried_on(a)


# --------------------------------------------------------------------------- permanent errors


@pytest.mark.gcs
def test_permission_denied_is_not_retried_and_says_what_to_check(actor, bucket):
    """A 403 will not go away by retrying: acquire() raises a StorageError at once, after one write,
    naming the bucket and the role to grant."""
    a = actor("A")
    a.proxy.inject("403", method="POST", times=100)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        a.lock.acquire(timeout=10)
    assert not isinstance(info.value, TransientStorageError)
    assert time.monotonic() - started < 2.5  # no retrying towards the timeout; a bound a loaded 2-core machine meets
    assert len(a.writes()) == 1
    assert bucket in str(info.value) and "roles/storage.objectUser" in str(info.value)


@pytest.mark.gcs
def test_a_missing_bucket_is_not_retried_and_says_to_create_it(actor):
    a = actor("A", bucket_name="no-such-bucket-" + uuid.uuid4().hex[:8])
    with pytest.raises(StorageError) as info:
        a.lock.acquire(timeout=10)
    assert not isinstance(info.value, TransientStorageError)
    assert len(a.writes()) == 1
    assert "does not exist" in str(info.value) and "gcloud storage buckets create" in str(info.value)


@pytest.mark.gcs
def test_a_renewal_refused_with_403_loses_the_lock_at_once_with_the_reason(fake_actor, bucket):
    """Permission revoked while holding: the lock does not retry a 403 until its deadline; it reports
    LockLost (with the StorageError as cause) at the next renewal."""
    a = fake_actor("A", ttl=6.0, renew_interval=0.2, renew_deadline=3.0)
    assert a.lock.acquire()
    a.proxy.inject("403", method="POST", times=100)
    stepped_until(a.lock.clock, lambda: a.named("lost"), within=1.0, what="the lock to be reported lost")
    with pytest.raises(LockLost) as info:
        a.lock.check()
    assert "403" in str(info.value) or "permission" in str(info.value)
    (lost,) = a.named("lost")
    assert isinstance(lost["error"].cause, StorageError)
    assert len([ex for _, ex in a.writes() if ex.status == 403]) == 1
