"""The lock on a real moto S3 server, through the fault proxy: GCS fault scenarios, run on S3.

Each actor talks to moto through its own :class:`FaultProxy` (``dialect="s3"``:
the errors the proxy answers itself are S3's XML errors, ``SlowDown``,
``ConditionalRequestConflict``, ``AccessDenied``). The scenarios are the very
functions of ``test_faults_gcs.py``, those that cover S3's two conditional PUTs
(``ON_S3``); on S3 every write is a ``PUT`` (the proxy here maps the scenarios'
``POST`` to it) and the record is read out of the S3 backend's envelope
(``Exchange.upload_data``). The invariants are the same:
a write whose reply was lost is recognised by the nonce read-back, never sent
again, never reported as a loss.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
import test_faults_gcs as gcs_faults
from lockutil import FAST, raw_read, stepped_until
from test_faults_gcs import KEY, SCENARIOS, Actor, fake_time

from handofflock import HandoffLock, LockLost, StorageError, TransientStorageError, signals
from handofflock.core.timing import Timing
from handofflock.storage import records as cas
from handofflock.storage.s3 import S3Storage
from handofflock.testing.faultproxy import FaultProxy

pytestmark = pytest.mark.s3


class S3FaultProxy(FaultProxy):
    """A FaultProxy in front of moto that takes the GCS scenarios' ``POST`` (an upload) to mean ``PUT``."""

    def inject(self, kind: str, *, method: str | None = None, **kwargs: Any):  # type: ignore[override]
        return super().inject(kind, method="PUT" if method == "POST" else method, **kwargs)

    def exchanges(self, method: str | None = None, path: str | None = None):  # type: ignore[override]
        return super().exchanges("PUT" if method == "POST" else method, path)


@pytest.fixture
def bucket(s3_server, monkeypatch):
    name = f"f-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    # The scenarios read the record behind the lock's back through ``url(bucket)``: on S3 here.
    monkeypatch.setattr(gcs_faults, "url", lambda b: f"s3://{b}/{KEY}")
    return name


def actors(s3_server, bucket, on_clock: dict[str, Any]):
    """``make(name, ...)``, then the teardown of what it made; every lock made with ``on_clock`` ({}: real time)."""
    made: list[Actor] = []

    def make(name: str, *, key: str = KEY, bucket_name: str | None = None, **overrides: Any) -> Actor:
        proxy = S3FaultProxy(s3_server.url, lifetime=120, dialect="s3").start()
        store = S3Storage(bucket_name or bucket, endpoint_url=proxy.url, timeout=(1.0, 2.0))
        # Ready before the scenario: a cold store's first use makes its SDK client (0.2 s, up to 1.8 s
        # on a loaded 2-core machine) and probes the store's conditions (four requests, once per
        # store), and the scenarios time acquires in tenths of a second (give_up_wait: 0.4 s). The
        # read that does it is taken out of the proxy's history; the probe never shows in exchanges().
        with contextlib.suppress(StorageError):  # a store that refuses (a missing bucket) says so in the test
            store.read(key)
        proxy.history.clear()
        lock = HandoffLock(f"s3://{bucket_name or bucket}/{key}", storage=store, key=key, owner_id=name, **{**FAST, **ALONE, **on_clock, **overrides})
        a = Actor(name, lock, proxy)
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
def actor(s3_server, bucket):
    """Actors whose locks keep real time."""
    yield from actors(s3_server, bucket, {})


@pytest.fixture
def fake_actor(s3_server, bucket):
    """Actors whose locks share one :func:`test_faults_gcs.fake_time` clock."""
    yield from actors(s3_server, bucket, fake_time())


def s3_url(bucket: str) -> str:
    return f"s3://{bucket}/{KEY}"


#: The lease timing a user gets with ttl=6 on S3 (Timing.build's defaults; each request may take
#: (renew_deadline - renew_interval) / 2 = 1.125 s), for the scenario with a waiter. Its actors share
#: moto, which answers one request at a time, each actor behind its own fault proxy: at FAST's lease
#: (ttl 1.5: a 0.6 s window from a renewal's send to its deadline, 0.3 s per request) a loaded 2-core
#: machine misses renewal deadlines and cuts read-backs. The waiter's intervals stay FAST's: the
#: scenarios time waits in tenths of a second.
_USERS_LEASE = Timing.build(ttl=6.0)
LEASE = dict(ttl=_USERS_LEASE.ttl, renew_interval=_USERS_LEASE.renew_interval, renew_deadline=_USERS_LEASE.renew_deadline)
WITH_A_WAITER = {"handoff"}
#: Every actor's lease unless a test says otherwise: FAST's intervals (renewals 0.2 s apart), with
#: 1 s per request and a 2.2 s renew deadline. At FAST's 0.3 s and 0.8 s, owners alone on the lock
#: lost their lease in full runs on three xdist workers (create's; after a reset PUT's, with a CPU
#: hog beside): moto answers every worker's S3 tests one request at a time.
ALONE = dict(ttl=4.0, renew_deadline=2.2)


#: The scenarios run on S3: its two conditional PUTs (If-None-Match for a create, If-Match for an overwrite),
#: by an owner alone and with a waiter. The other transitions are the same lock logic over the same PUTs,
#: run on the memory store under every fault (test_faults_memory.py) and on the GCS emulator (test_faults_gcs.py).
ON_S3 = ["create", "handoff", "free"]


@pytest.mark.parametrize("transition", ON_S3)
def test_a_put_applied_whose_reply_was_lost_is_recognised_and_the_lock_carries_on(transition, fake_actor, bucket):
    actor = fake_actor
    if transition in WITH_A_WAITER:
        fast_waiters = actor
        actor = lambda name, **overrides: fast_waiters(name, **{**LEASE, **overrides})  # noqa: E731
    SCENARIOS[transition](actor, bucket)


@pytest.mark.parametrize("transition", ON_S3)
def test_on_s3_the_scenarios_catch_a_lock_without_the_read_back(transition, fake_actor, bucket, monkeypatch):
    """Not vacuous on S3 either: without the read-back the same scenarios fail."""
    monkeypatch.setattr(cas, "_landed", lambda storage, key, expected, is_ours, max_bytes, timeout: None)
    with pytest.raises(AssertionError):
        SCENARIOS[transition](fake_actor, bucket)


def test_slow_down_replies_are_retried_with_backoff_and_the_acquire_lands(fake_actor, bucket):
    """Three 503 SlowDown answers to the create, then moto answers: acquire() succeeds after
    retries spaced by jittered backoff; the SlowDown was refused before it was applied, so no
    read-back is needed and the create lands once."""
    a = fake_actor("A")
    rule = a.proxy.inject("503", method="PUT", times=3)
    assert a.lock.acquire(timeout=10)
    assert rule.fired == 3
    assert len([w for w in a.lock.clock.waits if w > 0]) >= 3, "the retries were not spaced"
    statuses = [ex.status for _, ex in a.writes()]
    assert statuses[:4] == [503, 503, 503, 200]
    assert statuses.count(412) == 0
    assert raw_read(s3_url(bucket))[0].token == a.lock.token


def test_a_put_refused_with_409_conditional_request_conflict_is_retried_and_lands(fake_actor, bucket):
    """S3 answers 409 ConditionalRequestConflict when a conditional PUT races another change and says
    to retry it. Not applied, so no read-back: the same create goes again at once and lands, once."""
    a = fake_actor("A")
    rule = a.proxy.inject("409", method="PUT")
    started = a.lock.clock.monotonic()
    assert a.lock.acquire(timeout=5)
    assert a.lock.clock.monotonic() - started < 2.0  # on the lock's clock, which its retry waits on
    assert rule.fired == 1
    assert [ex.status for _, ex in a.writes()][:2] == [409, 200]
    assert [ex.method for ex in a.proxy.exchanges()][:3] == ["GET", "PUT", "PUT"], "retried without a read-back"
    assert raw_read(s3_url(bucket))[0].token == a.lock.token


def test_a_store_that_keeps_slowing_down_fails_the_acquire_within_its_deadline(fake_actor, bucket):
    a = fake_actor("A")
    # The store's once-per-store probe of conditional writes (s3.py) runs at its first
    # request: made here, before the faults and the clock, so what is timed is the acquire's own
    # retries against its deadline, not a one-time cost of the store.
    assert a.lock.status().exists is False
    a.proxy.inject("503", method="PUT", times=10_000)
    started = a.lock.clock.monotonic()
    with pytest.raises(TransientStorageError) as info:
        a.lock.acquire(timeout=1.0)
    assert info.value.status == 503 and "slow down" in str(info.value)
    assert a.lock.clock.monotonic() - started <= 1.0  # on the lock's clock, where a try under way takes no time
    assert not a.lock.is_held and raw_read(s3_url(bucket))[0] is None


def test_a_put_reset_before_it_was_forwarded_is_retried_and_lands_once(fake_actor, bucket):
    a = fake_actor("A")
    a.proxy.inject("reset", method="PUT")
    assert a.lock.acquire(timeout=5)
    assert [ex.status for _, ex in a.writes()][:2] == [None, 200]
    assert raw_read(s3_url(bucket))[0].token == a.lock.token
    assert a.named("lost") == []


def test_refused_connections_delay_but_do_not_break_an_acquire_on_s3(actor, bucket):
    a = actor("A")
    a.proxy.refuse_connections(0.2)
    started = time.monotonic()
    assert a.lock.acquire(timeout=5)
    assert time.monotonic() - started >= 0.18
    assert raw_read(s3_url(bucket))[0].token == a.lock.token


def test_access_denied_is_not_retried_and_names_the_s3_permissions(actor, bucket):
    a = actor("A")
    a.proxy.inject("403", method="PUT", times=100)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        a.lock.acquire(timeout=10)
    assert not isinstance(info.value, TransientStorageError)
    assert time.monotonic() - started < 2.0
    assert len(a.writes()) == 1
    assert bucket in str(info.value) and "s3:PutObject" in str(info.value)


def test_a_renewal_refused_with_access_denied_loses_the_lock_at_once(fake_actor, bucket):
    a = fake_actor("A", ttl=6.0, renew_interval=0.2, renew_deadline=3.0)
    assert a.lock.acquire()
    a.proxy.inject("403", method="PUT", times=100)
    stepped_until(a.lock.clock, lambda: a.named("lost"), within=1.0, what="the lock to be reported lost")
    with pytest.raises(LockLost):
        a.lock.check()
    (lost,) = a.named("lost")
    assert isinstance(lost["error"].cause, StorageError)


def test_a_missing_bucket_is_not_retried_and_says_to_create_it(actor):
    a = actor("A", bucket_name="no-such-bucket-" + uuid.uuid4().hex[:8])
    with pytest.raises(StorageError) as info:
        a.lock.acquire(timeout=10)
    assert not isinstance(info.value, TransientStorageError)
    assert "does not exist" in str(info.value) and "aws s3 mb" in str(info.value)


def test_a_fenced_append_whose_reply_and_read_backs_are_lost_lands_once_on_s3(fake_actor, bucket):
    """FencedObject on S3: an append whose PUT reply is dropped and whose next two reads are reset
    is in the object exactly once."""
    from handofflock.fencing import FencedObject

    a = fake_actor("A")
    assert a.lock.acquire()
    journal = FencedObject.beside(a.lock, "journal.json")
    journal.append({"n": 1})
    drop = a.proxy.inject("drop_reply", method="PUT", path="journal.json", body=b'"n":2')
    a.proxy.inject("reset", method="GET", path="journal.json", times=2, when=lambda ex: drop.fired)
    journal.append({"n": 2})
    assert drop.fired == 1
    assert FencedObject(S3Storage(bucket), "locks/journal.json").read().payload == [{"n": 1}, {"n": 2}]
