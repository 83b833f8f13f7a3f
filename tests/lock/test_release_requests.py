"""Release requests: receivers get them, and they belong to the hold and the waiter that made them.

A request that can go away (issue 17, part 2): a waiter that leaves or expires withdraws its
request; a hold that was lost does not pass its requests on to the next.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import pytest
from lockutil import eventually, make_lock, raw_read, raw_update, url_for

from handofflock import (
    AcquireCancelled,
    HandoffLock,
    HandoffLockError,
    LockLost,
    LockTimeout,
    ReleaseRequest,
    RequestReason,
    signals,
)
from handofflock.repair import force_release
from handofflock.storage import MemoryStorage
from simworld import KEY

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "local", "gcs"])
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


class Heard:
    """What one lock's request signals said, in order."""

    def __init__(self, lock: HandoffLock) -> None:
        self.events: list[tuple[str, object]] = []
        self._hold = (self._requested, self._withdrawn)  # blinker keeps weak references
        signals.on_release_requested.connect(self._requested, sender=lock)
        signals.on_release_withdrawn.connect(self._withdrawn, sender=lock)

    def _requested(self, sender, request, **kw):
        self.events.append(("requested", request))

    def _withdrawn(self, sender, request, requester, reason, **kw):
        assert (requester, reason) == (request.requester, "waiter")
        self.events.append(("withdrawn", request))

    def kinds(self) -> list[tuple[str, str]]:
        return [(kind, req.requester) for kind, req in self.events]


def owner_and_waiter(url, made, **waiter_kw):
    a = make_lock(url, owner_id="a")
    b = make_lock(url, owner_id="b", **waiter_kw)
    made += [a, b]
    a.acquire()
    return a, b, Heard(a)


def wait_in_thread(lock: HandoffLock, timeout: float = 30.0) -> threading.Thread:
    def go():
        try:
            lock.acquire(timeout=timeout)
        except (AcquireCancelled, LockTimeout):
            pass

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_a_waiter_that_leaves_withdraws_its_request_and_the_holder_keeps_the_lock(url, made):
    a, b, heard = owner_and_waiter(url, made)
    t = wait_in_thread(b)
    eventually(lambda: a.release_requested, what="the holder was asked")
    request = a.release_request
    assert request.reason == "waiter" and request.requester == "b"
    b.cancel()
    t.join(10)
    eventually(lambda: not a.release_requested, what="the request was withdrawn")
    eventually(lambda: heard.kinds() == [("requested", "b"), ("withdrawn", "b")], what="both signals, in order")
    assert heard.events[1][1] is request, "on_release_withdrawn carries the very ReleaseRequest"
    assert a.release_request is None and a.is_held and a.healthy
    assert a.release() is None, "nobody to hand it to"


def test_a_waiter_whose_slot_expires_withdraws_its_request(url, made):
    a, _, heard = owner_and_waiter(url, made)
    # A waiter that registers and then dies: its slot runs out by itself.
    raw_update(url, waiting_owner_id="dead", waiter_expires_at=time.time() + 0.6, waiter_instance="d1")
    eventually(lambda: a.release_requested, what="the holder was asked")
    eventually(lambda: not a.release_requested, timeout=10, what="withdrawn once the slot expired")
    eventually(lambda: heard.kinds() == [("requested", "dead"), ("withdrawn", "dead")])
    assert a.is_held


def test_a_signal_request_stays_when_the_waiter_leaves(url, made):
    a, b, heard = owner_and_waiter(url, made)
    t = wait_in_thread(b)
    eventually(lambda: a.release_requested and a.release_request.reason == "waiter")
    a.request_release("signal", requester="SIGTERM", deadline=time.time() + 3600)  # later than the waiter's slot
    b.cancel()
    t.join(10)
    eventually(lambda: ("withdrawn", "b") in heard.kinds(), what="the waiter's request withdrawn")
    assert a.release_requested, "the signal still asks"
    assert a.release_request.reason == "signal" and a.release_request.requester == "SIGTERM"


def test_a_waiter_that_comes_back_asks_again(url, made):
    a, b, heard = owner_and_waiter(url, made)
    t = wait_in_thread(b)
    eventually(lambda: a.release_requested)
    b.cancel()
    t.join(10)
    eventually(lambda: not a.release_requested)
    t = wait_in_thread(b)  # the same instance registers again
    eventually(lambda: a.release_requested, what="asked again")
    eventually(lambda: heard.kinds() == [("requested", "b"), ("withdrawn", "b"), ("requested", "b")])
    assert a.release() == "b"
    t.join(10)
    assert b.is_held


def test_a_new_waiter_replacing_one_that_expired_is_announced_after_the_withdrawal(url, made):
    a, _, heard = owner_and_waiter(url, made)
    raw_update(url, waiting_owner_id="w1", waiter_expires_at=time.time() + 30, waiter_instance="i1")
    eventually(lambda: a.release_requested and a.release_request.requester == "w1")
    # w1 is replaced before the holder looks again (its slot ran out and w2 took it).
    raw_update(url, waiting_owner_id="w2", waiter_expires_at=time.time() + 30, waiter_instance="i2")
    eventually(lambda: a.release_request.requester == "w2", what="w2's request stands")
    assert a.release_requested
    eventually(lambda: heard.kinds() == [("requested", "w1"), ("withdrawn", "w1"), ("requested", "w2")])


def test_the_same_waiter_id_from_a_new_instance_is_a_new_request(url, made):
    a, _, heard = owner_and_waiter(url, made)
    raw_update(url, waiting_owner_id="job-7", waiter_expires_at=time.time() + 30, waiter_instance="old")
    eventually(lambda: a.release_requested)
    first = a.release_request
    # A restart of the waiter, with the same stable id.
    raw_update(url, waiter_instance="new", waiter_expires_at=time.time() + 30)
    eventually(lambda: len(heard.events) == 3, what="withdrawn and asked again")
    assert heard.kinds() == [("requested", "job-7"), ("withdrawn", "job-7"), ("requested", "job-7")]
    assert heard.events[1][1] is first and a.release_request is heard.events[2][1] and a.release_requested


def _race_once(made, i: int) -> str:
    """One race of the holder's release against the waiter's leaving; returns who won ("handed"/"freed")."""
    url = f"memory://race-{uuid.uuid4().hex[:8]}/l.json"
    a = make_lock(url, owner_id="a")
    b = make_lock(url, owner_id="b")
    made += [a, b]
    a.acquire()
    t = wait_in_thread(b)
    eventually(lambda: a.release_requested)
    barrier = threading.Barrier(2)
    result: dict[str, object] = {}
    first_leave = i % 2 == 0  # either side a little ahead of the other, and sometimes neither

    def release():
        barrier.wait()
        time.sleep(0.0005 * (i % 3) if first_leave else 0)
        result["heir"] = a.release()

    def leave():
        barrier.wait()
        time.sleep(0 if first_leave else 0.0005 * (i % 3))
        b.cancel()

    threads = [threading.Thread(target=release), threading.Thread(target=leave)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    t.join(20)
    record, _ = raw_read(url)
    if result["heir"] == "b":
        assert b.is_held or record.owner_id is None, "handed to b: b holds it (or released it on its cancel)"
        outcome = "handed"
    else:
        assert result["heir"] is None and not b.is_held
        outcome = "freed"
    assert record.owner_id in (None, "b") and record.waiting_owner_id is None
    assert not (a.is_held and b.is_held)
    if b.is_held:
        b.release()
    MemoryStorage.forget(url.split("/")[2])
    return outcome


@pytest.mark.timeout(120)
def test_a_release_racing_a_withdrawal_hands_the_lock_to_exactly_one_or_frees_it(made):
    """The holder releases as the waiter gives up: the conditional writes let exactly one of them win."""
    outcomes = [_race_once(made, i) for i in range(12)]
    print("outcomes", {k: outcomes.count(k) for k in ("handed", "freed")})
    assert len(outcomes) == 12  # which side wins each time is up to the scheduler: both are correct


def test_release_request_receivers_get_the_request(world):
    a = world.lock("A")
    assert a.acquire()
    got: list[dict] = []
    with signals.on_release_requested.connected_to(lambda s, **kw: got.append(kw), sender=a):
        a.request_release(RequestReason.OPERATOR, requester="ops")
        world.sched.run_pending()
    assert isinstance(got[0]["request"], ReleaseRequest) and got[0]["request"].requester == "ops"
    a.release()


def test_a_release_request_does_not_outlive_a_hold_that_was_lost(world):
    a = world.lock("A")
    assert a.acquire()
    a.request_release("operator")
    record = world.record()
    world.store.write(KEY, record.replace(owner_id="thief", token=record.token + 1, nonce="t").encode(),
                      if_generation_match=world.generation())
    world.clock.advance(a.renew_interval)
    world.sched.run_pending()  # the renewal finds the lock taken: lost
    assert not a.is_held
    with pytest.raises(LockLost):
        a.release()
    assert a.release_requested is False and a.release_request is None
    # The next hold starts un-asked: steps() yields.
    world.store.write(KEY, world.record().replace(owner_id=None, expires_at=None, nonce="f").encode(),
                      if_generation_match=world.generation())
    assert a.acquire(timeout=5)
    assert list(a.steps(range(3))) == [0, 1, 2]
    a.release()


def test_a_lost_hold_does_not_pass_its_waiters_request_on_to_the_next_hold():
    """A lock that was lost keeps its hold's requests (``_end_hold`` runs only from ``release()``),
    and ``acquire()`` is allowed from LOST. The next hold starts with ``release_requested`` True,
    naming a waiter of the previous hold who is long gone (here: it became the owner and left):
    a ``steps()`` loop stops before its first step and hands the lock to nobody. (The new
    withdrawal mechanism clears it at the first waiter check, an interval later; a signal's or
    a preemption notice's request from the previous hold is never withdrawn.)"""
    name = f"edge-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}/locks/l.json"
    owner, waiter = make_lock(url), make_lock(url)
    got: dict[str, object] = {}
    try:
        assert owner.acquire()
        t = threading.Thread(target=lambda: got.setdefault("w", waiter.acquire(timeout=20)), daemon=True)
        t.start()
        eventually(lambda: owner.release_requested, what="the owner hears of the waiter")
        force_release(url)  # an operator clears the lock: the waiter takes it, the owner finds out
        t.join(20)
        assert bool(got.get("w")) and waiter.is_held
        # private: "lost" has no public flag of its own (is_held is False after a release too)
        eventually(lambda: owner._state == "lost", what="the owner notices its loss")
        waiter.release()
        assert owner.acquire(blocking=False)  # the same instance takes the lock again (no release() between)
        stale = owner.release_request
        assert not owner.release_requested, (
            f"the new hold starts with the previous hold's request standing: {stale}"
        )
    finally:
        for lk in (owner, waiter):
            lk.cancel()
            if lk.is_held:
                try:
                    lk.release()
                except HandoffLockError:
                    pass
            lk._unschedule()  # private: stop its renewals without releasing
        MemoryStorage.forget(name)
