"""Fencing at the resource: a replaced lock holder's writes are refused by the object itself."""

from __future__ import annotations

import math
import random
import threading
import time

import orjson
import pytest
from conftest import BACKENDS, make_store

from handofflock import (
    ConfigurationError,
    FencedObject,
    FencedObjectCorrupt,
    FencedObjectFull,
    FencedObjectTooLarge,
    HandoffLock,
    InvalidKey,
    LockLost,
    Scheduler,
    StaleToken,
    StorageError,
    TransientStorageError,
    fencing,
)
from handofflock.testing.clock import FakeClock
from handofflock.fencing import RECENT_NONCES
from handofflock.storage import MemoryStorage

KEY = "jobs/latest.json"


@pytest.fixture
def store(request):
    name = f"fence-{request.node.name}"
    yield MemoryStorage.named(name)
    MemoryStorage.forget(name)


def fence(store, writer="w", **kwargs):
    kwargs.setdefault("clock", FakeClock(step=0.25))
    return FencedObject(store, KEY, writer_id=writer, **kwargs)


def stored(store):
    data, generation = store.read(KEY)
    return orjson.loads(data), generation


# --------------------------------------------------------------------------- the token rule


def test_a_first_write_creates_the_object_with_the_token_payload_and_writer(store):
    written = fence(store, "A").write({"path": "ckpt/1.pt"}, token=7)
    doc, generation = stored(store)
    assert doc["handofflockFence"] == 1 and doc["highestToken"] == 7 and doc["writerId"] == "A"
    assert doc["payload"] == {"path": "ckpt/1.pt"} and isinstance(doc["writtenAt"], float)
    assert written.generation == generation and written.highest_token == 7
    assert fence(store, "B").read() == written


def test_reading_a_missing_object_says_so_without_writing(store):
    value = fence(store).read()
    assert not value.exists and value.payload is None and value.highest_token == 0
    assert store.read(KEY) is None


def test_a_higher_token_is_accepted_and_replaces_the_payload(store):
    fence(store, "A").write("a", token=7)
    fence(store, "B").write("b", token=8)
    value = fence(store).read()
    assert (value.payload, value.highest_token, value.writer_id) == ("b", 8, "B")


def test_a_lower_token_is_refused_with_stale_token_and_nothing_changes(store):
    fence(store, "B").write("b", token=8)
    before = store.read(KEY)
    writes = store.calls["write"]
    with pytest.raises(StaleToken) as info:
        fence(store, "A").write("a", token=7)
    assert (info.value.key, info.value.token, info.value.highest) == (KEY, 7, 8)
    assert "stale" in str(info.value)
    assert store.read(KEY) == before and store.calls["write"] == writes


@pytest.mark.parametrize("operation", ["write", "append", "claim"])
def test_every_operation_refuses_a_lower_token(store, operation):
    fence(store, "B").append("b", token=8)
    before = store.read(KEY)
    op = getattr(fence(store, "A"), operation)
    with pytest.raises(StaleToken):
        op(token=7) if operation == "claim" else op("a", token=7)
    assert store.read(KEY) == before


def test_the_same_writer_may_write_again_with_an_equal_token(store):
    f = fence(store, "A")
    f.write("first", token=7)
    f.write("second", token=7)
    FencedObject(store, KEY, writer_id="A").write("third", token=7)  # another instance, same writer
    assert fence(store).read().payload == "third"


def test_an_equal_token_from_a_different_writer_is_refused(store):
    # One token names one acquisition, held by one owner: a second writer with the
    # same token is a collision or a mistake, and letting both through would let two
    # writers interleave under one token, which is what the fence exists to stop.
    fence(store, "A").write("a", token=7)
    before = store.read(KEY)
    with pytest.raises(StaleToken) as info:
        fence(store, "B").write("b", token=7)
    assert info.value.holder_id == "A" and info.value.writer_id == "B"
    assert "already used by writer 'A'" in str(info.value)
    assert store.read(KEY) == before


def test_claim_raises_the_fence_and_keeps_the_payload(store):
    fence(store, "A").write({"path": "a.pt"}, token=7)
    claimed = fence(store, "B").claim(token=9)
    assert claimed.payload == {"path": "a.pt"} and claimed.highest_token == 9
    with pytest.raises(StaleToken):
        fence(store, "A").write({"path": "a2.pt"}, token=7)


def test_claiming_a_token_already_claimed_by_the_same_writer_writes_nothing(store):
    f = fence(store, "A")
    f.claim(token=9)
    writes = store.calls["write"]
    assert f.claim(token=9).highest_token == 9
    assert store.calls["write"] == writes


@pytest.mark.parametrize("token", [0, -1, True, 1.5, "7", None, 2**63])
def test_a_token_must_be_a_positive_int(store, token):
    with pytest.raises(ConfigurationError):
        fence(store).write("x", token=token)
    assert store.calls["write"] == store.calls["read"] == 0


@pytest.mark.parametrize("writer", ["", "a\nb", "x" * 513, 5])
def test_a_writer_id_its_own_decoder_would_refuse_is_refused_up_front(store, writer):
    with pytest.raises(ConfigurationError, match="writer_id"):
        fence(store, writer=writer)
    assert store.calls["write"] == store.calls["read"] == 0


@pytest.mark.parametrize("interval", [math.nan, math.inf, -1.0, "1", True])
def test_a_write_spacing_that_is_no_number_of_seconds_is_refused_up_front(store, interval):
    with pytest.raises(ConfigurationError, match="min_write_interval must be a finite number of seconds >= 0"):
        FencedObject(store, KEY, min_write_interval=interval)
    assert store.calls["write"] == store.calls["read"] == 0


@pytest.mark.parametrize("payload", [math.nan, math.inf, -math.inf, {"loss": [0.5, math.nan]}, ("ok", {"lr": math.inf})])
@pytest.mark.parametrize("operation", ["write", "append"])
def test_nan_and_infinities_are_refused_before_anything_is_written(store, payload, operation):
    """JSON has no NaN or infinity: before, they were stored as null while write() returned the
    NaN payload, so the caller and the object disagreed."""
    with pytest.raises(ConfigurationError, match="non-finite"):
        getattr(fence(store), operation)(payload, token=1)
    assert store.calls["write"] == 0 and store.read(KEY) is None


def test_a_claim_overtaken_by_a_higher_token_raises_even_when_this_instance_claimed_it_before(store):
    """The second claim(9) must not answer from this instance's cached view (highest 9, ours) and
    report success although the fence has moved on to 10."""
    mine = fence(store, "A")
    mine.claim(token=9)
    fence(store, "B").claim(token=10)
    with pytest.raises(StaleToken):
        mine.claim(token=9)
    assert stored(store)[0]["highestToken"] == 10


def test_payloads_must_be_json(store):
    with pytest.raises(TypeError, match="JSON-serialisable"):
        fence(store).write({"when": object()}, token=1)
    assert store.read(KEY) is None


# --------------------------------------------------------------------------- journals


def test_append_builds_a_list_with_one_write_per_entry_and_no_extra_reads(store):
    journal = fence(store, "A")
    for i in range(20):
        journal.append({"i": i}, token=3)
    assert fence(store).read().payload == [{"i": i} for i in range(20)]
    assert store.calls["write"] == 20
    assert store.calls["read"] == 2  # the first append's look, and the read above


def test_appending_after_another_writer_re_reads_and_keeps_both_entries(store):
    a, b = fence(store, "A"), fence(store, "B")
    a.append("a1", token=3)
    b.append("b1", token=4)
    with pytest.raises(StaleToken):  # a's cached view was stale; the write failed its generation, a re-read
        a.append("a2", token=3)
    b.append("b2", token=4)
    assert fence(store).read().payload == ["a1", "b1", "b2"]


def test_a_full_journal_refuses_the_append_and_keeps_what_it_has(store):
    journal = fence(store, "A", max_bytes=2048)
    with pytest.raises(FencedObjectFull) as info:
        for i in range(1000):
            journal.append(["worker-%d" % i, 3, 1_700_000_000.0 + i, 1_700_000_001.0 + i], token=3)
    assert info.value.max_bytes == 2048 and info.value.size > 2048
    payload = fence(store, max_bytes=2048).read().payload
    assert len(payload) == i and payload[-1][0] == f"worker-{i - 1}"
    assert len(store.read(KEY)[0]) <= 2048


def test_appending_to_an_object_that_holds_no_list_is_refused(store):
    fence(store, "A").write({"path": "a.pt"}, token=3)
    before = store.read(KEY)
    with pytest.raises(FencedObjectCorrupt, match="append needs a list payload"):
        fence(store, "A").append("entry", token=3)
    assert store.read(KEY) == before


# --------------------------------------------------------------------------- untrusted content

SOMEONES_DATA = b'{"path": "ckpt/7.pt", "step": 7000}'
BAD_FENCES = [
    pytest.param(b"{not json", "invalid JSON", id="invalid-json"),
    pytest.param(b"\xff\xfe\x00", "not valid UTF-8", id="not-utf8"),
    pytest.param(b"[1, 2]", "expected a JSON object", id="array"),
    pytest.param(SOMEONES_DATA, "not a fence document", id="someone-elses-json"),
    pytest.param(b'{"handofflockFence": 2, "highestToken": 1}', "unsupported fence version 2", id="future-version"),
    pytest.param(b'{"handofflockFence": true, "highestToken": 1}', "unsupported fence version", id="boolean-version"),
    pytest.param(b'{"handofflockFence": 1, "highestToken": "9"}', "'highestToken' must be an integer", id="token-string"),
    pytest.param(b'{"handofflockFence": 1, "highestToken": -1}', "'highestToken' must be an integer", id="token-negative"),
    pytest.param(b'{"handofflockFence": 1}', "'highestToken' must be an integer", id="token-missing"),
    pytest.param(b'{"handofflockFence": 1, "highestToken": 1, "writerId": 5}', "'writerId'", id="writer-number"),
    pytest.param(b'{"handofflockFence": 1, "highestToken": 1, "writerId": "a\\u0000b"}', "'writerId' contains control", id="writer-control-char"),
    pytest.param(b'{"handofflockFence": 1, "highestToken": 1, "writtenAt": "now"}', "'writtenAt'", id="written-at-string"),
    pytest.param(b'{"handofflockFence": 1, "highestToken": 1, "recentNonces": "x"}', "'recentNonces'", id="nonces-not-a-list"),
]


@pytest.mark.parametrize("operation", ["read", "write", "append", "claim"])
@pytest.mark.parametrize("data, reason", BAD_FENCES)
def test_a_corrupt_fenced_object_is_reported_and_never_overwritten(store, data, reason, operation):
    generation = store.write(KEY, data, if_generation_match=0)
    f = fence(store, "A")
    call = {"read": f.read, "write": lambda: f.write("x", token=99), "append": lambda: f.append("x", token=99),
            "claim": lambda: f.claim(token=99)}[operation]
    with pytest.raises(FencedObjectCorrupt) as info:
        call()
    assert reason in info.value.reason and info.value.key == KEY and info.value.generation == generation
    assert store.read(KEY) == (data, generation)


def test_an_oversized_fenced_object_is_reported_after_reading_at_most_one_byte_too_many(store):
    big = orjson.dumps({"handofflockFence": 1, "highestToken": 1, "payload": "x" * 10_000})
    store.write(KEY, big, if_generation_match=0)
    with pytest.raises(FencedObjectTooLarge, match="not corrupt"):
        fence(store, max_bytes=4096).write("x", token=2)
    assert store.read(KEY)[0] == big


def test_a_reader_with_a_smaller_max_bytes_calls_a_healthy_object_too_large_not_corrupt(store):
    """A 3 kB object written by a writer with the default limit is not "corrupt" to a reader whose
    max_bytes is 2 kB: that would send its user to repair a healthy object by hand."""
    fence(store, "A").write("x" * 3000, token=5)
    with pytest.raises(FencedObjectTooLarge) as info:
        fence(store, "B", max_bytes=2048).read()
    assert not isinstance(info.value, FencedObjectCorrupt) and info.value.max_bytes == 2048
    assert fence(store, "C").read().payload == "x" * 3000


def test_unknown_fields_of_a_fenced_object_are_kept(store):
    store.write(KEY, b'{"handofflockFence": 1, "highestToken": 1, "payload": null, "owner": "team-ml"}', if_generation_match=0)
    fence(store, "A").write("x", token=2)
    doc, _ = stored(store)
    assert doc["owner"] == "team-ml" and doc["payload"] == "x"


# --------------------------------------------------------------------------- racing writers


class StartTogether:
    """A store whose every thread's first read of the object waits until all threads have read it."""

    def __init__(self, store, parties: int) -> None:
        self._store = store
        self.barrier = threading.Barrier(parties)
        self._seen: set[int] = set()
        self.armed = True

    def read(self, key, **kw):
        found = self._store.read(key, **kw)
        me = threading.get_ident()
        if self.armed and me not in self._seen:
            self._seen.add(me)
            self.barrier.wait(timeout=30)
        return found

    def __getattr__(self, name):
        return getattr(self._store, name)


@pytest.fixture(params=BACKENDS)
def any_store(request, tmp_path):
    """One empty store per backend (conftest.BACKENDS), for what must hold on all of them."""
    s = make_store(request.param, request, tmp_path)
    yield s
    s.close()


#: Five orders of the racing tokens on the memory store, one on each other backend: the fencing logic is
#: the same on all of them, and each backend's conditional writes under a race are the storage contract's
#: (tests/storage/test_storage_contract.py, sixteen threads racing a create and an overwrite).
RACES = [("memory", seed) for seed in range(5)] + [(backend, 0) for backend in BACKENDS if backend != "memory"]


@pytest.mark.parametrize("backend, seed", RACES, ids=[f"{backend}-{seed}" for backend, seed in RACES])
def test_racing_writers_that_all_passed_the_check_cannot_all_write(backend, seed, request, tmp_path):
    any_store = make_store(backend, request, tmp_path)
    request.addfinalizer(any_store.close)
    tokens = list(range(1, 9))
    random.Random(seed).shuffle(tokens)
    store = StartTogether(any_store, len(tokens))
    accepted: list[tuple[int, int]] = []  # (generation, token)
    refused: list[StaleToken] = []
    results_lock = threading.Lock()

    def writer(token: int) -> None:
        # No pacing: the writers stand for separate processes, whose writes no gate spaces; one
        # gate in this process would queue them a second apart on GCS, and there would be no race.
        f = FencedObject(store, KEY, writer_id=f"w{token}", min_write_interval=0.0)
        try:
            written = f.append(token, token=token)
        except StaleToken as exc:
            with results_lock:
                refused.append(exc)
        else:
            with results_lock:
                accepted.append((written.generation, token))

    threads = [threading.Thread(target=writer, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    store.armed = False
    assert len(accepted) + len(refused) == len(tokens)
    # Every writer saw highest=0 and passed the first check; only generation-matched
    # writes and the re-check after losing one keep the accepted tokens increasing.
    in_order = [token for _, token in sorted(accepted)]
    assert in_order == sorted(in_order) and len(set(in_order)) == len(in_order)
    assert fence(any_store).read().payload == in_order
    assert in_order[-1] == max(tokens)
    assert all(exc.highest > exc.token for exc in refused)


def test_on_every_backend_a_stale_token_changes_nothing_and_a_corrupt_object_is_kept(any_store):
    # No pacing: what is tested is what is refused and kept, not when writes go out.
    fence(any_store, "B", min_write_interval=0.0).write("b", token=8)
    before = any_store.read(KEY)
    for writer, token in (("A", 7), ("A", 8)):  # lower, and equal from another writer
        with pytest.raises(StaleToken):
            fence(any_store, writer).write("a", token=token)
    assert any_store.read(KEY) == before
    any_store.write("jobs/other.json", SOMEONES_DATA, if_generation_match=0)
    other = FencedObject(any_store, "jobs/other.json", writer_id="A", clock=FakeClock(step=0.25))
    with pytest.raises(FencedObjectCorrupt, match="not a fence document"):
        other.write("x", token=99)
    assert any_store.read("jobs/other.json")[0] == SOMEONES_DATA


# --------------------------------------------------------------------------- the paused owner


def two_holders(store):
    """A holds the lock and writes through the fence, then freezes past its lease; B takes over."""
    clock = FakeClock(step=0.25)
    frozen = Scheduler(clock, autostart=False)  # A's renewals never run: the process is paused
    live = Scheduler(clock, autostart=False)
    a = HandoffLock("memory://unused", storage=store, key="jobs/train.lock", owner_id="A", clock=clock, scheduler=frozen)
    b = HandoffLock("memory://unused", storage=store, key="jobs/train.lock", owner_id="B", clock=clock, scheduler=live)
    a.acquire()
    fa = FencedObject.beside(a, "latest.json")
    fa.write({"path": f"ckpt/step-100-token-{a.token}.pt"})
    clock.advance(a.ttl + a.max_clock_skew + 1)  # A's lease expires while it is paused
    assert b.acquire(blocking=False)
    assert b.token > a.token
    return a, b, fa, FencedObject.beside(b, "latest.json")


def test_a_paused_and_replaced_owners_late_write_is_refused_by_the_fence(store):
    a, b, fa, fb = two_holders(store)
    fb.write({"path": f"ckpt/step-100-token-{b.token}.pt"})
    before = store.read(fb.key)
    # A wakes up and carries on as if nothing happened. Its lock object knows better
    # (renew_deadline passed), but even a writer that skips that check is refused:
    with pytest.raises(LockLost):
        fa.write({"path": "ckpt/step-101-late.pt"})
    with pytest.raises(StaleToken) as info:
        fa.write({"path": "ckpt/step-101-late.pt"}, token=a.token)
    assert (info.value.token, info.value.highest) == (a.token, b.token)
    assert store.read(fb.key) == before
    assert fb.read().payload == {"path": f"ckpt/step-100-token-{b.token}.pt"}


def test_a_new_holder_that_claims_the_fence_shuts_out_the_old_one_before_writing_anything(store):
    a, b, fa, fb = two_holders(store)
    # Until the new holder touches the fence, it cannot know about it: A would get through.
    assert fa.read().highest_token == a.token
    fb.claim()
    with pytest.raises(StaleToken):
        fa.write({"path": "ckpt/step-101-late.pt"}, token=a.token)
    assert fb.read().payload == {"path": f"ckpt/step-100-token-{a.token}.pt"}  # A's last accepted write stands


def test_beside_places_the_object_next_to_the_lock_and_uses_its_identity(store):
    lock = HandoffLock("memory://unused", storage=store, key="jobs/train.lock", owner_id="A", clock=FakeClock(step=0.25),
                       scheduler=Scheduler(FakeClock(step=0.25), autostart=False))
    f = FencedObject.beside(lock, "latest.json")
    assert f.key == "jobs/latest.json" and f.writer_id == "A"
    assert FencedObject.beside(lock, "fence/journal.json").key == "jobs/fence/journal.json"
    with pytest.raises(ConfigurationError):
        FencedObject.beside(lock, "train.lock")
    with pytest.raises(InvalidKey):
        FencedObject.beside(lock, "../elsewhere.json")
    with pytest.raises(LockLost):  # a lock never acquired has no token to write with
        f.write("x")
    with pytest.raises(ConfigurationError):
        FencedObject(store, KEY).write("x")  # no lock, no token
    assert store.calls["write"] == 0


# --------------------------------------------------------------------------- faults


def test_a_write_whose_reply_was_lost_is_recognised_and_not_applied_twice(store):
    journal = fence(store, "A")
    journal.append("first", token=3)
    store.faults.lose_reply_next("write", key=KEY)
    written = journal.append("second", token=3)
    assert fence(store).read().payload == ["first", "second"]
    assert written.generation == store.read(KEY)[1]
    assert store.calls["write"] == 2


def test_without_the_nonce_a_lost_reply_would_be_appended_twice(store, monkeypatch):
    # The same scenario with the nonce check knocked out: the retry passes the token
    # check (same writer, same token) and the entry lands twice. The test above would fail.
    monkeypatch.setattr(fencing, "_shows", lambda data, nonce, before: False)
    journal = fence(store, "A")
    journal.append("first", token=3)
    store.faults.lose_reply_next("write", key=KEY)
    journal.append("second", token=3)
    assert fence(store).read().payload == ["first", "second", "second"]


def test_a_lost_reply_followed_by_another_writer_is_still_recognised(store):
    a, b = fence(store, "A"), fence(store, "B")
    a.append("a1", token=3)

    def reply_lost_and_b_writes():
        b.append("b1", token=4)  # lands between A's write and A's look at the result
        return TransientStorageError("reply lost", ambiguous=True)

    store.faults.lose_reply_next("write", key=KEY, exc=reply_lost_and_b_writes)
    a.append("a2", token=3)  # landed before b1: not stale, not repeated
    assert fence(store).read().payload == ["a1", "a2", "b1"]
    with pytest.raises(StaleToken):
        a.append("a3", token=3)


@pytest.mark.parametrize("others_write_during", ["the lost reply", "a failed read-back"])
def test_a_lost_reply_whose_nonce_others_pushed_out_of_view_is_reported_as_unknown_never_as_stale(
    store, others_write_during
):
    # The S3 torture run's "w0-18 s was reported refused but is in the journal": A's append
    # landed and its reply was lost; A, paused or backing off (its read-back failed too, then
    # its retry met its own write: 412), read back only after a newer holder B had claimed and
    # written RECENT_NONCES times. A's nonce had dropped out of the object, which no longer
    # shows whether A's write landed: StaleToken ("nothing written") would be a lie.
    a, b = fence(store, "A"), fence(store, "B")
    a.append("a1", token=3)

    def b_writes_a_lot(error):
        def meanwhile():
            for i in range(RECENT_NONCES):  # B's claim and appends, while A cannot see the object
                b.append(f"b{i}", token=4)
            return error

        return meanwhile

    lost = TransientStorageError("reply lost", ambiguous=True)
    if others_write_during == "the lost reply":
        store.faults.lose_reply_next("write", key=KEY, exc=b_writes_a_lot(lost))
    else:
        store.faults.lose_reply_next("write", key=KEY, exc=lambda: lost)
        store.faults.fail_next("read", key=KEY, exc=b_writes_a_lot(TransientStorageError("reset", ambiguous=False)))
    with pytest.raises(TransientStorageError, match="may have landed") as info:
        a.append("a2", token=3)
    assert info.value.ambiguous
    assert fence(store).read().payload == ["a1", "a2", *(f"b{i}" for i in range(RECENT_NONCES))]
    with pytest.raises(StaleToken):  # what A learns by trying again: it was replaced
        a.append("a3", token=3)
    a_writes = 3 if others_write_during == "a failed read-back" else 2  # there, a retry met A's own write: 412
    assert store.calls["write"] == a_writes + RECENT_NONCES


def test_a_write_that_did_not_land_is_still_refused_as_stale_when_the_object_shows_it(store):
    # The other side of the test above: after an ambiguous failure that did not land, a newer
    # holder's few writes keep the object's last nonce before A's write in view, so the object
    # proves A's write is not there, and A is told StaleToken as before.
    a, b = fence(store, "A"), fence(store, "B")
    a.append("a1", token=3)

    def lost_and_b_writes():
        for i in range(RECENT_NONCES - 1):
            b.append(f"b{i}", token=4)
        return TransientStorageError("connection reset", ambiguous=True)

    store.faults.fail_next("write", key=KEY, exc=lost_and_b_writes)
    with pytest.raises(StaleToken) as info:
        a.append("a2", token=3)
    assert (info.value.token, info.value.highest) == (3, 4)
    assert fence(store).read().payload == ["a1", *(f"b{i}" for i in range(RECENT_NONCES - 1))]


def test_the_nonces_kept_are_bounded(store):
    journal = fence(store, "A")
    for i in range(RECENT_NONCES + 5):
        journal.append(i, token=1)
    assert len(stored(store)[0]["recentNonces"]) == RECENT_NONCES


@pytest.mark.parametrize("ambiguous", [False, True])
def test_a_failed_write_is_retried_and_applied_once(store, ambiguous):
    journal = fence(store, "A")
    journal.append("first", token=3)
    store.faults.fail_next("write", count=3, exc=lambda: TransientStorageError("boom", status=503, ambiguous=ambiguous))
    journal.append("second", token=3)
    assert fence(store).read().payload == ["first", "second"]
    assert store.calls["write"] == 5


def test_transient_read_errors_are_retried_and_a_permanent_error_is_not(store):
    store.faults.fail_next("read", count=2)
    fence(store, "A").write("x", token=1)
    assert store.calls["read"] == 3
    store.faults.fail_next("write", exc=lambda: StorageError("permission denied"))
    with pytest.raises(StorageError, match="permission denied"):
        fence(store, "A").write("y", token=1)
    assert store.calls["write"] == 2 and fence(store).read().payload == "x"


def test_transient_errors_give_up_at_the_timeout(store):
    clock = FakeClock(step=0.25)
    store.faults.fail_next("write", count=10_000)
    with pytest.raises(TransientStorageError):
        fence(store, "A", clock=clock, timeout=5.0).write("x", token=1)
    assert 3 < store.calls["write"] < 10_000 and clock.monotonic() - 1000.0 <= 5.0
    assert store.read(KEY) is None


# --------------------------------------------------------------------------- what the torture harness does


def test_workers_appending_under_a_real_lock_leave_a_journal_of_disjoint_increasing_tenures():
    store = MemoryStorage.named("fence-workers")
    scheduler = Scheduler(name="fence-workers")
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        lock = HandoffLock("memory://fence-workers/jobs/train.lock", ttl=5.0, waiter_poll_interval=0.01,
                           waiter_check_interval=0.01, wait_for_slot=True, scheduler=scheduler, owner_id=f"worker-{n}")
        journal = FencedObject.beside(lock, "journal.json")
        try:
            for _ in range(3):
                with lock:
                    start = time.time()
                    time.sleep(0.005)
                    journal.append([lock.owner_id, lock.token, start, time.time()])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        entries = FencedObject(store, "jobs/journal.json").read().payload
        assert len(entries) == 9
        tokens = [e[1] for e in entries]
        assert tokens == sorted(tokens) and len(set(tokens)) == 9
        for earlier, later in zip(entries, entries[1:]):
            assert earlier[3] <= later[2]  # tenures never overlap
    finally:
        scheduler.stop()
        MemoryStorage.forget("fence-workers")
