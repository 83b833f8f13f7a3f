"""The lock object is untrusted input: bad records are reported, typed, and never overwritten."""

from __future__ import annotations

import json

import orjson
import pytest
from conftest import BACKENDS, make_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handofflock import HandoffLock, LockLost, LockRecord, LockRecordCorrupt, Scheduler, force_release, signals
from handofflock.testing.clock import FakeClock
from handofflock.core.errors import PreconditionFailed
from handofflock.core.protocol import next_token
from handofflock.core.record import MAX_EXTRA_BYTES, MAX_TIMESTAMP, MAX_TOKEN, MAX_TTL, Holder, Waiter
from handofflock.storage import MAX_RECORD_BYTES, MemoryStorage

KEY = "locks/job.json"
DROP = object()

VALID = {
    "version": 1,
    "ownerId": "host:1:ab12",
    "expiresAt": 1_700_000_060.0,
    "waitingOwnerId": None,
    "waiterExpiresAt": None,
    "ttl": 60.0,
    "token": 1_700_000_000_000,
    "nonce": "9f" * 16,
}


def doc(**changes: object) -> bytes:
    """The valid record with fields changed (or removed with DROP), as JSON bytes."""
    d = {**VALID, **changes}
    return orjson.dumps({k: v for k, v in d.items() if v is not DROP})


def raw(text: str) -> bytes:
    """A record written by hand, for what orjson would not produce (NaN, duplicates)."""
    return text.encode()


FOUR = '"ownerId": "A", "waitingOwnerId": null, "waiterExpiresAt": null'

# (id, bytes, a fragment of the reason)
CORRUPT = [
    ("empty", b"", "empty"),
    ("only-whitespace", b" \n\t ", "empty"),
    ("truncated-json", doc()[:-9], "invalid JSON"),
    ("trailing-garbage", doc() + b" x", "invalid JSON"),
    ("json-array", b"[1, 2]", "expected a JSON object, got an array"),
    ("json-string", b'"ownerId"', "expected a JSON object, got a string"),
    ("json-null", b"null", "expected a JSON object, got null"),
    ("json-number", b"17", "expected a JSON object"),
    ("not-utf8", b"\xff\xfe" + doc(), "not valid UTF-8"),
    ("not-utf8-inside-a-string", doc(ownerId="AB").replace(b"AB", b"\xc3\x28"), "not valid UTF-8"),
    ("utf16", doc().decode().encode("utf-16"), "not valid UTF-8"),
    ("lone-surrogate-escape", raw('{"ownerId": "\\ud800", "expiresAt": 1, "waitingOwnerId": null, "waiterExpiresAt": null}'), "invalid JSON"),
    ("nan-literal", raw('{' + FOUR + ', "expiresAt": NaN}'), "invalid JSON"),
    ("infinity-literal", raw('{' + FOUR + ', "expiresAt": Infinity}'), "invalid JSON"),
    ("minus-infinity-literal", raw('{' + FOUR + ', "expiresAt": -Infinity}'), "invalid JSON"),
    ("overflows-to-infinity", raw('{' + FOUR + ', "expiresAt": 1e999}'), "invalid JSON"),
    ("nested-too-deep", b"[" * 5000 + b"]" * 5000, "invalid JSON"),
    ("missing-ownerId", doc(ownerId=DROP), "missing field(s) ownerId"),
    ("missing-all-four", b"{}", "missing field(s) ownerId, expiresAt, waitingOwnerId, waiterExpiresAt"),
    ("ownerId-number", doc(ownerId=7), "'ownerId' must be a string or null, got the integer 7"),
    ("ownerId-list", doc(ownerId=["A"]), "'ownerId' must be a string or null, got an array"),
    ("ownerId-empty", doc(ownerId=""), "'ownerId' must be 1-512 characters"),
    ("ownerId-too-long", doc(ownerId="x" * 513), "'ownerId' must be 1-512 characters"),
    ("ownerId-control-character", doc(ownerId="A\nB"), "'ownerId' contains control characters"),
    ("ownerId-duplicate-key", raw('{"ownerId": "A", "ownerId": 5, "expiresAt": 1, "waitingOwnerId": null, "waiterExpiresAt": null}'), "duplicate key 'ownerId'"),
    ("expiresAt-string", doc(expiresAt="2023-11-14T22:14:20Z"), "'expiresAt' must be a number or null, got a string"),
    ("expiresAt-boolean", doc(expiresAt=True), "'expiresAt' must be a number or null, got a boolean"),
    ("expiresAt-negative", doc(expiresAt=-1.0), "'expiresAt' must be a Unix time between 0 and year 3000"),
    ("expiresAt-absurd", doc(expiresAt=MAX_TIMESTAMP * 10), "'expiresAt' must be a Unix time between 0 and year 3000"),
    ("expiresAt-huge-integer", raw('{' + FOUR + ', "expiresAt": 18446744073709551616}'), "between 0 and year 3000"),
    ("owner-without-expiry", doc(expiresAt=None), "'ownerId' is set but 'expiresAt' is null"),
    ("waiter-without-expiry", doc(waitingOwnerId="B"), "'waitingOwnerId' is set but 'waiterExpiresAt' is null"),
    ("waiterExpiresAt-string", doc(waitingOwnerId="B", waiterExpiresAt="soon"), "'waiterExpiresAt' must be a number or null"),
    ("waiterExpiresAt-absurd", doc(waitingOwnerId="B", waiterExpiresAt=1e300), "'waiterExpiresAt' must be a Unix time"),
    ("waitingOwnerId-object", doc(waitingOwnerId={"id": "B"}, waiterExpiresAt=1.0), "'waitingOwnerId' must be a string or null, got an object"),
    ("ttl-negative", doc(ttl=-60.0), "'ttl' must be in (0, 604800] seconds"),
    ("ttl-zero", doc(ttl=0), "'ttl' must be in (0, 604800] seconds"),
    ("ttl-absurd", doc(ttl=MAX_TTL + 1), "'ttl' must be in (0, 604800] seconds"),
    ("ttl-string", doc(ttl="60"), "'ttl' must be a finite number, got a string"),
    ("ttl-boolean", doc(ttl=True), "'ttl' must be a finite number, got a boolean"),
    ("ttl-nan-literal", raw('{' + FOUR + ', "expiresAt": 1, "ttl": NaN}'), "invalid JSON"),
    ("token-negative", doc(token=-1), "'token' must be in [0, 2**63-1]"),
    ("token-over-int64", doc(token=MAX_TOKEN + 1), "'token' must be in [0, 2**63-1]"),
    ("token-over-uint64", raw('{' + FOUR + ', "expiresAt": 1, "token": 18446744073709551616}'), "'token' must be in [0, 2**63-1]"),
    ("token-fraction", doc(token=1.5), "'token' must be an integer, got the number 1.5"),
    ("token-string", doc(token="17"), "'token' must be an integer, got a string"),
    ("token-boolean", doc(token=True), "'token' must be an integer, got a boolean"),
    ("version-future", doc(version=2), "unsupported format version 2"),
    ("version-zero", doc(version=0), "unsupported format version 0"),
    ("version-string", doc(version="1"), "'version' must be an integer, got a string"),
    ("version-float", doc(version=1.0), "'version' must be an integer, got the number 1.0"),
    ("version-null", doc(version=None), "'version' must be an integer, got null"),
    ("nonce-empty", doc(nonce=""), "'nonce' must be a string of 1-128 characters"),
    ("nonce-number", doc(nonce=12), "'nonce' must be a string of 1-128 characters"),
    ("nonce-too-long", doc(nonce="n" * 129), "'nonce' must be a string of 1-128 characters"),
    ("over-the-cap", doc() + b" " * MAX_RECORD_BYTES, "larger than the 64 KiB limit"),
    ("unknown-fields-leave-no-room", doc(notes="x" * (MAX_EXTRA_BYTES + 10)), "unknown fields take"),
    ("unknown-field-too-deep-to-write-back", raw('{' + FOUR + ', "expiresAt": 1, "x": ' + "[" * 300 + "]" * 300 + "}"), "cannot be written back"),
]

# (id, bytes, what the decoded record must say)
ACCEPTED = [
    ("current-format", doc(), dict(owner=Holder("host:1:ab12", 1_700_000_060.0), token=1_700_000_000_000, ttl=60.0, legacy=False)),
    ("four-original-fields", raw('{"ownerId": "A", "expiresAt": 1700000060, "waitingOwnerId": "B", "waiterExpiresAt": 1700000030.5}'),
     dict(owner=Holder("A", 1_700_000_060.0), waiter=Waiter("B", 1_700_000_030.5), token=0, ttl=None, nonce=None, legacy=True)),
    ("four-original-fields-free", raw('{"ownerId": null, "expiresAt": null, "waitingOwnerId": null, "waiterExpiresAt": null}'),
     dict(owner=None, waiter=None, token=0, legacy=True)),
    ("token-null-reads-as-zero", doc(token=None), dict(token=0)),
    ("integer-timestamps", doc(expiresAt=1_700_000_060), dict(owner=Holder("host:1:ab12", 1_700_000_060.0))),
    ("stale-waiter-expiry-without-waiter", doc(waiterExpiresAt=1.0), dict(waiter=None, extra={"waiterExpiresAt": 1.0})),
    ("non-ascii-ids", doc(ownerId="läufer:1:ß", waitingOwnerId="走者", waiterExpiresAt=2.0), dict(owner=Holder("läufer:1:ß", 1_700_000_060.0), waiter=Waiter("走者", 2.0))),
    ("largest-token", doc(token=MAX_TOKEN), dict(token=MAX_TOKEN)),
    ("unknown-fields", doc(team="ml", limits={"gpus": [0, 1]}), dict(extra={"team": "ml", "limits": {"gpus": [0, 1]}})),
]


@pytest.mark.parametrize("data, reason", [pytest.param(d, r, id=i) for i, d, r in CORRUPT])
def test_decode_reports_a_corrupt_record_naming_the_object_and_the_reason(data, reason):
    with pytest.raises(LockRecordCorrupt) as info:
        LockRecord.decode(data, key=KEY, generation=42, url="memory://t/locks/job.json")
    err = info.value
    assert reason in err.reason
    assert err.key == KEY and err.generation == 42
    assert "memory://t/locks/job.json" in str(err) and reason in str(err)


@pytest.mark.parametrize("data, expected", [pytest.param(d, e, id=i) for i, d, e in ACCEPTED])
def test_decode_accepts_valid_records(data, expected):
    record = LockRecord.decode(data, key=KEY)
    for name, value in expected.items():
        assert getattr(record, name) == value, name


def test_there_are_at_least_thirty_bad_inputs():
    assert len(CORRUPT) >= 30


def test_decode_refuses_what_is_not_bytes():
    with pytest.raises(LockRecordCorrupt, match="expected bytes, got str"):
        LockRecord.decode(doc().decode(), key=KEY)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- properties

ids = st.one_of(st.none(), st.text(min_size=0, max_size=20), st.text(alphabet="ab:\n", max_size=3), st.integers(), st.booleans())
numbers = st.one_of(
    st.none(), st.floats(), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 1.5, -1, 60.0, MAX_TTL, MAX_TIMESTAMP, 1e300, 2**63 - 1, 2**63]), st.booleans(), st.text(max_size=3),
)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
# (the leaves stay in what orjson writes: records() below builds LockRecords from them)
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=8)
FIELDS = {
    "version": st.one_of(st.just(1), numbers),
    "ownerId": ids,
    "expiresAt": numbers,
    "waitingOwnerId": ids,
    "waiterExpiresAt": numbers,
    "ttl": numbers,
    "token": numbers,
    "nonce": ids,
}


# Each strategy is built once, here, not on every draw: building one costs more than drawing from it.
left_out = st.integers(0, 9)
field_values = {name: st.one_of(st.just(VALID[name]), values) for name, values in FIELDS.items()}
unknown_keys = st.text(max_size=6).filter(lambda k: k not in FIELDS)
unknown_fields = st.dictionaries(unknown_keys, json_value, max_size=2)


@st.composite
def documents(draw) -> dict:
    """JSON-ish objects mixing valid and invalid field values, fields sometimes missing."""
    d = {}
    for name, values in field_values.items():
        if draw(left_out) == 0:
            continue  # leave the field out
        d[name] = draw(values)
    d.update(draw(unknown_fields))
    return d


def _decodes_or_reports(data: bytes) -> None:
    try:
        record = LockRecord.decode(data, key=KEY)
    except LockRecordCorrupt as exc:
        assert exc.key == KEY and exc.reason
        return
    # Whatever decodes can be written back, fits, and reads back the same.
    again = record.encode()
    assert len(again) <= MAX_RECORD_BYTES
    assert LockRecord.decode(again, key=KEY) == record


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_lock_record_corrupt(data):
    _decodes_or_reports(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_arbitrary_documents_decode_or_raise_lock_record_corrupt(document):
    _decodes_or_reports(json.dumps(document).encode())  # stdlib: writes NaN, Infinity and huge integers


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a loaded machine
@given(documents(), st.integers(0, 40))
def test_damaged_documents_decode_or_raise_lock_record_corrupt(document, cut):
    data = json.dumps(document).encode()
    _decodes_or_reports(data[: len(data) - cut])


valid_ids = st.one_of(st.none(), st.text(min_size=1, max_size=40).filter(lambda s: not any(ord(c) < 0x20 or ord(c) == 0x7F for c in s)))


timestamps = st.floats(min_value=0, max_value=MAX_TIMESTAMP)
ttls = st.one_of(st.none(), st.floats(min_value=0.001, max_value=MAX_TTL))
tokens = st.integers(0, MAX_TOKEN)
nonces = st.one_of(st.none(), st.text(min_size=1, max_size=128))
extras = st.dictionaries(unknown_keys, json_value, max_size=3)


@st.composite
def records(draw) -> LockRecord:
    owner, waiter = draw(valid_ids), draw(valid_ids)
    expires = draw(timestamps)
    waiter_expires = draw(timestamps)
    return LockRecord(
        owner=Holder(owner, expires) if owner else None,
        waiter=Waiter(waiter, waiter_expires) if waiter else None,
        ttl=draw(ttls),
        token=draw(tokens),
        nonce=draw(nonces),
        extra=draw(extras),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a loaded machine
@given(records())
def test_valid_records_round_trip_through_encode_and_decode(record):
    decoded = LockRecord.decode(record.encode(), key=KEY)
    assert decoded == record
    assert decoded.extra == record.extra


def spy_store(name: str) -> MemoryStorage:
    """A memory store that remembers the size of every read it returns (``store.returned``)."""
    store = MemoryStorage(name)
    store.returned = []
    store.faults.after("read", lambda op, key, found: store.returned.append(len(found[0]) if found else -1))
    return store


# --------------------------------------------------------------------------- the lock on a corrupt record


@pytest.fixture
def sim():
    clock = FakeClock(step=0.25)
    sched = Scheduler(clock, autostart=False)
    clock.on_tick.append(sched.run_pending)
    return clock, sched


def make_lock(store, sim, owner_id, **kwargs):
    clock, sched = sim
    return HandoffLock("memory://unused", storage=store, key=KEY, clock=clock, scheduler=sched, owner_id=owner_id, **kwargs)


GARBAGE = b'{"ownerId": "A", "expiresAt": "soon"'


@pytest.mark.parametrize("blocking", [True, False])
def test_acquire_on_a_corrupt_record_raises_and_leaves_the_bytes_alone(sim, blocking):
    store = MemoryStorage("corrupt-acquire")
    gen = store.write(KEY, GARBAGE, if_generation_match=0)
    lock = make_lock(store, sim, "A")
    with pytest.raises(LockRecordCorrupt) as info:
        # blocking=False takes no timeout (its retries are bounded by renew_deadline; a timeout with it is refused)
        lock.acquire(blocking=blocking, timeout=5 if blocking else None)
    assert info.value.generation == gen and "invalid JSON" in info.value.reason
    assert store.read(KEY) == (GARBAGE, gen)
    assert store.calls["write"] == 1  # ours, above
    assert not lock.is_held


def test_status_on_a_corrupt_record_raises_lock_record_corrupt(sim):
    store = MemoryStorage("corrupt-status")
    store.write(KEY, b"[]", if_generation_match=0)
    with pytest.raises(LockRecordCorrupt, match="expected a JSON object"):
        make_lock(store, sim, "A").status()


def test_an_oversized_lock_object_is_refused_after_reading_only_cap_plus_one_bytes(sim):
    store = spy_store("corrupt-big")
    big = doc(padding="x" * (4 * MAX_RECORD_BYTES))
    gen = store.write(KEY, big, if_generation_match=0)
    with pytest.raises(LockRecordCorrupt, match="larger than the 64 KiB limit"):
        make_lock(store, sim, "A").acquire(blocking=False)
    assert store.returned and max(store.returned) == MAX_RECORD_BYTES + 1
    assert store.read(KEY) == (big, gen)


def test_the_lock_writes_unknown_fields_back_unchanged(sim):
    store = MemoryStorage("corrupt-extra")
    store.write(KEY, raw('{"ownerId": null, "expiresAt": null, "waitingOwnerId": null, "waiterExpiresAt": null,'
                         ' "team": "ml", "limits": {"gpus": [0, 1]}}'), if_generation_match=0)
    lock = make_lock(store, sim, "A")
    lock.acquire()
    held = orjson.loads(store.read(KEY)[0])
    assert held["ownerId"] == "A" and held["team"] == "ml" and held["limits"] == {"gpus": [0, 1]}
    lock.release()
    freed = orjson.loads(store.read(KEY)[0])
    assert freed["ownerId"] is None and freed["team"] == "ml" and freed["limits"] == {"gpus": [0, 1]}


def test_a_four_field_record_held_by_an_older_implementation_is_respected(sim):
    clock, _ = sim
    store = MemoryStorage("corrupt-legacy-held")
    legacy = orjson.dumps({"ownerId": "old-impl", "expiresAt": clock.time() + 60, "waitingOwnerId": None, "waiterExpiresAt": None})
    store.write(KEY, legacy, if_generation_match=0)
    lock = make_lock(store, sim, "A")
    assert lock.acquire(blocking=False) is False
    assert store.read(KEY)[0] == legacy


def test_a_free_four_field_record_is_taken_and_written_in_the_current_format(sim):
    store = MemoryStorage("corrupt-legacy-free")
    store.write(KEY, raw('{"ownerId": null, "expiresAt": null, "waitingOwnerId": null, "waiterExpiresAt": null}'), if_generation_match=0)
    lock = make_lock(store, sim, "A")
    assert lock.acquire(blocking=False)
    record = LockRecord.decode(store.read(KEY)[0])
    assert record.version == 1 and not record.legacy and record.owner.id == "A" and record.token == lock.token > 0


def _lose_to_garbage(sim, store, duty_after: float):
    """A holds the lock; someone overwrites it with garbage; A's next duty runs."""
    clock, sched = sim
    lock = make_lock(store, sim, "A")
    events = []
    lock.acquire()
    gen = store.read(KEY)[1]
    garbage_gen = store.write(KEY, GARBAGE, if_generation_match=gen)
    writes = store.calls["write"]
    with signals.lost.connected_to(lambda s, **kw: events.append(("lost", kw)), sender=lock), \
            signals.on_renewal_error.connected_to(lambda s, **kw: events.append(("renewal_error", kw)), sender=lock):
        clock.advance(duty_after)
        sched.run_pending()
    return lock, events, garbage_gen, writes


@pytest.mark.parametrize("duty, after", [("waiter check", 2.0), ("renewal", 7.5)])
def test_an_owner_whose_record_is_overwritten_with_garbage_loses_the_lock_and_never_rewrites_it(sim, duty, after):
    store = MemoryStorage(f"corrupt-owner-{duty}")
    lock, events, garbage_gen, writes = _lose_to_garbage(sim, store, after)
    kinds = [k for k, _ in events]
    assert kinds == ["renewal_error", "lost"]
    lost = dict(events)["lost"]
    assert isinstance(lost["error"].__cause__, LockRecordCorrupt) and "corrupt" in lost["reason"]
    assert not lock.is_held
    with pytest.raises(LockLost):
        lock.check()
    with pytest.raises(LockLost):
        lock.release()
    assert store.read(KEY) == (GARBAGE, garbage_gen)
    assert store.calls["write"] - writes <= 1  # at most the renewal's refused attempt; nothing landed


def test_releasing_over_a_garbage_record_reports_the_loss_and_writes_nothing(sim):
    store = MemoryStorage("corrupt-release")
    lock = make_lock(store, sim, "A")
    lock.acquire()
    garbage_gen = store.write(KEY, GARBAGE, if_generation_match=store.read(KEY)[1])
    lost = []
    with signals.lost.connected_to(lambda s, **kw: lost.append(kw), sender=lock):
        with pytest.raises(LockLost, match="corrupt") as info:
            lock.release()
    assert isinstance(info.value.__cause__, LockRecordCorrupt)
    assert not lock.is_held and len(lost) == 1
    assert store.read(KEY) == (GARBAGE, garbage_gen)
    with pytest.raises(LockRecordCorrupt):  # and a fresh acquire reports the record, too
        lock.acquire(blocking=False)


# --------------------------------------------------------------------------- force_release


def test_force_release_replaces_a_corrupt_record_with_a_free_one_and_returns_it(sim):
    clock, _ = sim
    store = MemoryStorage("force-corrupt")
    gen = store.write(KEY, GARBAGE, if_generation_match=0)
    lock = make_lock(store, sim, "A")
    with pytest.raises(LockRecordCorrupt) as info:
        lock.acquire(blocking=False)
    replaced = force_release(lock, expected_generation=info.value.generation, clock=clock)
    assert replaced is not None
    assert replaced.data == GARBAGE and replaced.generation == gen and replaced.record is None
    assert isinstance(replaced.error, LockRecordCorrupt) and not replaced.truncated
    assert replaced.token == next_token(None, clock.time())
    data, new_gen = store.read(KEY)
    assert new_gen == replaced.new_generation
    free = LockRecord.decode(data)
    assert free.owner is None and free.waiter is None and free.token == replaced.token
    assert lock.acquire(blocking=False) and lock.token > replaced.token


def test_force_release_of_a_corrupt_record_still_continues_past_the_token_it_shows(sim):
    """Tokens written by a host whose clock ran ahead can exceed the clock here: a fresh
    clock-based token would fall below them, and the old holder's fenced writes would pass."""
    clock, _ = sim
    store = MemoryStorage.named("force-corrupt-token")
    ahead = int(clock.time() * 1000) + 3_600_000  # an hour ahead of this host
    store.write(KEY, b'{"version": 99, "token": %d, "ownerId": "A"}' % ahead, if_generation_match=0)
    try:
        replaced = force_release(f"memory://force-corrupt-token/{KEY}", clock=clock)
    finally:
        MemoryStorage.forget("force-corrupt-token")
    assert replaced.record is None and replaced.error is not None
    assert replaced.token == ahead + 1


def test_force_release_of_a_held_lock_continues_the_token_sequence_and_evicts_the_owner(sim):
    clock, sched = sim
    store = MemoryStorage.named("force-held")
    try:
        store.write(KEY, doc(ownerId=None, expiresAt=None, team="ml"), if_generation_match=0)
        owner = make_lock(store, sim, "A")
        owner.acquire()
        clock.advance(0.5)  # the break happens later than the acquire, so the token must continue, not restart
        replaced = force_release(f"memory://force-held/{KEY}", clock=clock)
        assert replaced.record.owner.id == "A" and replaced.record.token == owner.token and replaced.error is None
        assert replaced.token == next_token(replaced.record, clock.time()) > owner.token
        free = LockRecord.decode(store.read(KEY)[0])
        assert free.owner is None and free.token == replaced.token and free.extra == {"team": "ml"}
        clock.advance(owner.renew_interval)
        sched.run_pending()  # the owner's renewal finds the lock gone and says so, writing nothing
        assert not owner.is_held
        assert LockRecord.decode(store.read(KEY)[0]) == free
    finally:
        MemoryStorage.forget("force-held")


def test_force_release_refuses_when_the_object_changed_since_it_was_read(sim):
    clock, _ = sim
    store = MemoryStorage("force-stale")
    old_gen = store.write(KEY, GARBAGE, if_generation_match=0)
    new_gen = store.write(KEY, b"still garbage", if_generation_match=old_gen)
    writes = store.calls["write"]
    with pytest.raises(PreconditionFailed):
        force_release(make_lock(store, sim, "A"), expected_generation=old_gen, clock=clock)
    assert store.read(KEY) == (b"still garbage", new_gen) and store.calls["write"] == writes


def test_force_release_loses_to_a_repair_that_lands_between_its_read_and_its_write(sim):
    clock, _ = sim

    store = MemoryStorage("force-race")

    def repaired_meanwhile(op, key, found):
        if found and found[0] == GARBAGE:  # someone repairs it right after we looked
            store.write(key, doc(ownerId="fixer"), if_generation_match=found[1])

    store.faults.after("read", repaired_meanwhile)
    store.write(KEY, GARBAGE, if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        force_release(make_lock(store, sim, "A"), clock=clock)
    assert LockRecord.decode(store.read(KEY)[0]).owner.id == "fixer"


def test_force_release_of_a_missing_object_writes_nothing(sim):
    clock, _ = sim
    store = MemoryStorage("force-missing")
    assert force_release(make_lock(store, sim, "A"), clock=clock) is None
    with pytest.raises(PreconditionFailed):
        force_release(make_lock(store, sim, "A"), expected_generation=5, clock=clock)
    assert store.read(KEY) is None and store.calls["write"] == 0


def test_force_release_whose_reply_is_lost_still_reports_what_it_replaced(sim):
    clock, _ = sim
    store = MemoryStorage("force-lost-reply")
    gen = store.write(KEY, GARBAGE, if_generation_match=0)
    store.faults.lose_reply_next("write")
    replaced = force_release(make_lock(store, sim, "A"), expected_generation=gen, clock=clock)
    assert replaced.generation == gen and store.read(KEY)[1] == replaced.new_generation
    assert store.calls["write"] == 2  # the garbage and the one forced write: no blind retry
    assert LockRecord.decode(store.read(KEY)[0]).token == replaced.token


def test_taking_over_a_record_whose_unknown_field_cannot_be_written_back_reports_it(sim):
    clock, _ = sim
    store = MemoryStorage("corrupt-deep-extra")
    deep = raw('{"ownerId": "gone", "expiresAt": 1, "waitingOwnerId": null, "waiterExpiresAt": null, "x": '
               + "[" * 300 + "]" * 300 + "}")
    gen = store.write(KEY, deep, if_generation_match=0)
    with pytest.raises(LockRecordCorrupt, match="cannot be written back"):  # not orjson's TypeError mid-write
        make_lock(store, sim, "A").acquire(blocking=False)
    assert store.read(KEY) == (deep, gen)


# --------------------------------------------------------------------------- on every backend


@pytest.fixture(params=BACKENDS)
def any_store(request, tmp_path):
    s = make_store(request.param, request, tmp_path)
    yield s
    s.close()


def test_on_every_backend_a_corrupt_record_is_reported_kept_and_can_be_force_released(any_store, sim):
    clock, _ = sim
    gen = any_store.write(KEY, GARBAGE, if_generation_match=0)
    # No pacing: the subject is what a corrupt record does on each backend, on a simulated clock;
    # GCS's spacing would only add simulated seconds between the writes (tests/processes/test_xproc_gcs.py paces).
    lock = make_lock(any_store, sim, "A", min_write_interval=0.0)
    with pytest.raises(LockRecordCorrupt) as info:
        lock.acquire(blocking=False)
    assert any_store.read(KEY) == (GARBAGE, gen)
    with pytest.raises(PreconditionFailed):
        force_release(lock, expected_generation=gen + 1, clock=clock)
    assert any_store.read(KEY) == (GARBAGE, gen)
    replaced = force_release(lock, expected_generation=info.value.generation, clock=clock)
    assert replaced.data == GARBAGE and any_store.read(KEY)[1] == replaced.new_generation
    assert lock.acquire(blocking=False) and lock.token > replaced.token
