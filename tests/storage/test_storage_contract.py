"""The storage contract, run unchanged against every backend (see conftest.BACKENDS).

A backend that lacks part of the contract declares it in :data:`LACKS`; a test
of that part says so with ``@needs(...)`` and is then expected to fail on that
backend (a strict xfail: the declaration is checked too, never a silent skip).
"""

from __future__ import annotations

import math
import threading

import pytest
from conftest import EXTERNAL

from handofflock.core.errors import InvalidKey, NotFound, PreconditionFailed
from handofflock.storage import MAX_RECORD_BYTES, MemoryStorage
from handofflock.storage.gcs import GCSStorage
from handofflock.storage.local import LocalStorage

RACERS = 16

#: What each backend lacks of the contract, and why.
LACKS: dict[str, dict[str, str]] = {
    "memory": {},
    "local": {},
    "gcs": {}
    if EXTERNAL
    else {
        "conditional_delete": "fake-gcs-server ignores ifGenerationMatch on DELETE (pinned in test_gcs_backend.py); "
        "real GCS refuses with 412. The lock never relies on a conditional delete."
    },
    "s3": {},
}

def needs(*capabilities):
    """Mark a test as one of the parts of the contract named (keys of :data:`LACKS`' entries)."""

    def mark(test):
        test.needs = capabilities
        return test

    return mark


@pytest.fixture(autouse=True)
def _declared_capabilities(request):
    """A test that ``needs`` a capability is a strict xfail on a backend that declares it lacks it."""
    backend = request.node.callspec.params["store"]
    for capability in getattr(request.function, "needs", ()):
        if capability in LACKS[backend]:
            request.applymarker(pytest.mark.xfail(strict=True, reason=LACKS[backend][capability]))


def reopen(store):
    """A second handle on the same objects, as another process (or a restarted one) would open it."""
    if isinstance(store, MemoryStorage):
        return MemoryStorage.named(store.name)
    if isinstance(store, LocalStorage):
        return LocalStorage(store.root)
    if isinstance(store, GCSStorage):
        return GCSStorage(store.bucket)
    from handofflock.storage.s3 import S3Storage

    return S3Storage(store.bucket)


def test_reading_an_absent_object_returns_none(store):
    assert store.read("locks/absent.json") is None


def test_create_with_generation_zero_then_read_back(store):
    gen = store.write("locks/a.json", b'{"x": 1}', if_generation_match=0)
    assert isinstance(gen, int) and gen > 0
    assert store.read("locks/a.json") == (b'{"x": 1}', gen)


def test_create_is_refused_when_the_object_exists(store):
    gen = store.write("a.json", b"1", if_generation_match=0)
    with pytest.raises(PreconditionFailed) as info:
        store.write("a.json", b"2", if_generation_match=0)
    assert info.value.key == "a.json" and info.value.expected_generation == 0
    assert store.read("a.json") == (b"1", gen)


def test_a_stale_generation_write_is_refused_and_changes_nothing(store):
    g1 = store.write("a.json", b"1", if_generation_match=0)
    g2 = store.write("a.json", b"2", if_generation_match=g1)
    with pytest.raises(PreconditionFailed) as info:
        store.write("a.json", b"3", if_generation_match=g1)
    assert info.value.key == "a.json" and info.value.expected_generation == g1
    assert info.value.url == store.url
    assert store.read("a.json") == (b"2", g2)


def test_the_same_bytes_written_again_get_a_new_generation_and_a_stale_writer_is_refused(store):
    """The ABA case: A reads X at g1; B writes Y, then X again. A's write at g1 must fail, though
    the object holds the bytes A read (on S3 the generation is in the envelope, so the ETag of
    (X, g3) differs from that of (X, g1))."""
    a, b = reopen(store), store
    g1 = b.write("k.json", b"X", if_generation_match=0)
    assert a.read("k.json") == (b"X", g1)  # A remembers g1 (on S3, its ETag)
    g2 = b.write("k.json", b"Y", if_generation_match=g1)
    g3 = b.write("k.json", b"X", if_generation_match=g2)
    assert g1 < g2 < g3
    with pytest.raises(PreconditionFailed):
        a.write("k.json", b"stale", if_generation_match=g1)
    assert b.read("k.json") == (b"X", g3)


def test_writing_a_generation_to_an_absent_object_is_refused(store):
    with pytest.raises(PreconditionFailed):
        store.write("a.json", b"1", if_generation_match=12345)
    assert store.read("a.json") is None


def test_generations_strictly_increase_across_writes_and_recreation(store):
    seen = []
    gen = store.write("a.json", b"0", if_generation_match=0)
    seen.append(gen)
    for i in range(5):
        gen = store.write("a.json", str(i).encode(), if_generation_match=gen)
        seen.append(gen)
    store.delete("a.json", if_generation_match=gen)
    assert store.read("a.json") is None
    seen.append(store.write("a.json", b"again", if_generation_match=0))
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_generations_strictly_increase_across_delete_and_recreate_and_survive_a_restart(store):
    first = store
    seen = [first.write("g.json", b"1", if_generation_match=0)]
    seen.append(first.write("g.json", b"2", if_generation_match=seen[-1]))
    first.delete("g.json", if_generation_match=seen[-1])
    assert first.read("g.json") is None and first.list("") == {}

    restarted = reopen(store)  # a new process would see exactly this
    with pytest.raises(NotFound):
        restarted.delete("g.json", if_generation_match=seen[-1])
    with pytest.raises(PreconditionFailed):
        restarted.write("g.json", b"stale", if_generation_match=seen[-1])
    seen.append(restarted.write("g.json", b"3", if_generation_match=0))
    assert reopen(store).read("g.json") == (b"3", seen[-1])
    assert seen == sorted(set(seen))


def test_delete_with_the_current_generation_removes_the_object(store):
    gen = store.write("a.json", b"1", if_generation_match=0)
    store.delete("a.json", if_generation_match=gen)
    assert store.read("a.json") is None


@needs("conditional_delete")
def test_a_delete_with_a_stale_generation_is_refused_and_changes_nothing(store):
    g1 = store.write("a.json", b"1", if_generation_match=0)
    g2 = store.write("a.json", b"2", if_generation_match=g1)
    with pytest.raises(PreconditionFailed) as info:
        store.delete("a.json", if_generation_match=g1)
    assert info.value.key == "a.json" and info.value.expected_generation == g1
    assert store.read("a.json") == (b"2", g2)


def test_deleting_an_absent_object_raises_not_found(store):
    with pytest.raises(NotFound):
        store.delete("nothing.json", if_generation_match=1)


def test_list_returns_keys_under_the_prefix_with_generations(store):
    ga = store.write("locks/a.json", b"a", if_generation_match=0)
    gb = store.write("locks/b.json", b"b", if_generation_match=0)
    store.write("other/c.json", b"c", if_generation_match=0)
    assert store.list("locks/") == {"locks/a.json": ga, "locks/b.json": gb}
    assert store.list("nope/") == {}


def test_list_filters_by_a_name_prefix_and_skips_deleted_objects(store):
    g1 = store.write("locks/train.json", b"1", if_generation_match=0)
    g2 = store.write("locks/trace/x.json", b"2", if_generation_match=0)
    g3 = store.write("locks/eval.json", b"3", if_generation_match=0)
    store.delete("locks/eval.json", if_generation_match=g3)
    store.write("lockstep.json", b"4", if_generation_match=0)
    assert store.list("locks/tra") == {"locks/train.json": g1, "locks/trace/x.json": g2}
    assert store.list("locks/") == {"locks/train.json": g1, "locks/trace/x.json": g2}
    assert set(store.list("lock")) == {"locks/train.json", "locks/trace/x.json", "lockstep.json"}


def test_keys_that_need_escaping_round_trip(store):
    key = "locks/a b#c?d%e+f&g=ü.json"
    gen = store.write(key, b"{}", if_generation_match=0)
    assert store.read(key) == (b"{}", gen)
    assert store.list("locks/") == {key: gen}
    assert store.list("locks/a b#c?d%e+") == {key: gen}
    assert store.list("locks/a+b") == {}
    store.delete(key, if_generation_match=gen)
    assert store.read(key) is None


def test_a_closed_store_is_used_again_on_its_next_call(store):
    gen = store.write("a.json", b"{}", if_generation_match=0)
    store.close()
    assert store.read("a.json") == (b"{}", gen)


def test_read_with_max_bytes_reads_at_most_one_byte_over_the_cap(store):
    big = b"x" * (MAX_RECORD_BYTES + 5000)
    store.write("big.json", big, if_generation_match=0)
    data, gen = store.read("big.json", max_bytes=MAX_RECORD_BYTES)
    assert len(data) == MAX_RECORD_BYTES + 1 and gen > 0
    small, _ = store.read("big.json", max_bytes=len(big) + 10)
    assert small == big


def test_a_read_with_max_bytes_returns_at_most_one_byte_past_the_cap(store):
    store.write("big.json", b"x" * (3 * MAX_RECORD_BYTES), if_generation_match=0)
    data, _ = store.read("big.json", max_bytes=MAX_RECORD_BYTES)
    assert len(data) == MAX_RECORD_BYTES + 1
    small, _ = store.read("big.json", max_bytes=10)
    assert small == b"x" * 11


def test_capped_reads_at_the_edges_return_the_right_bytes_and_generation(store):
    g_empty = store.write("empty.json", b"", if_generation_match=0)
    g_one = store.write("one.json", b"x", if_generation_match=0)
    assert store.read("empty.json", max_bytes=0) == (b"", g_empty)
    assert store.read("empty.json") == (b"", g_empty)
    assert store.read("one.json", max_bytes=0) == (b"x", g_one)
    assert store.read("one.json", max_bytes=1) == (b"x", g_one)
    with pytest.raises(ValueError):
        store.read("one.json", max_bytes=-1)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "64"])
def test_a_nonsense_size_cap_is_refused_before_anything_is_read(store, bad):
    store.write("capped.json", b"{}", if_generation_match=0)
    with pytest.raises(ValueError, match="max_bytes"):
        store.read("capped.json", max_bytes=bad)


@pytest.mark.parametrize(
    "key", ["", "/abs.json", "a/../b.json", "../escape.json", "a//b.json", "./a.json", "a\\b.json", "a\x00b", "x" * 1025]
)
def test_malformed_keys_get_a_clear_error(store, key):
    with pytest.raises(InvalidKey):
        store.write(key, b"1", if_generation_match=0)
    with pytest.raises(InvalidKey):
        store.read(key)


def test_every_call_takes_a_bound_on_its_requests(store):
    gen = store.write("t.json", b"1", if_generation_match=0, timeout=5.0)
    assert store.read("t.json", timeout=5.0) == (b"1", gen)
    assert store.read("t.json", max_bytes=0, timeout=5) == (b"1", gen)
    assert store.list("t", timeout=5.0) == {"t.json": gen}
    store.delete("t.json", if_generation_match=gen, timeout=5.0)
    assert store.read("t.json") is None


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "5"])
def test_a_nonsense_request_bound_is_refused_before_anything_is_sent(store, bad):
    gen = store.write("t.json", b"1", if_generation_match=0)
    for call in (
        lambda: store.read("t.json", timeout=bad),
        lambda: store.write("t.json", b"2", if_generation_match=gen, timeout=bad),
        lambda: store.delete("t.json", if_generation_match=gen, timeout=bad),
        lambda: store.list("", timeout=bad),
    ):
        with pytest.raises(ValueError, match="timeout"):
            call()
    assert store.read("t.json") == (b"1", gen)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3", None])
def test_malformed_generations_are_refused(store, bad):
    with pytest.raises((TypeError, ValueError)):
        store.write("a.json", b"1", if_generation_match=bad)


def _race(n, fn):
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = ("ok", fn(i))
        except PreconditionFailed:
            results[i] = ("lost", None)
        except Exception as exc:  # any other outcome is a bug and shows in the assertion
            results[i] = ("error", repr(exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


#: Races per test: each may show a lost update the one before did not. Rounds of one test on one store
#: (fresh keys): a test per round proved nothing more, and made a store (a bucket, an SDK client) per round.
ROUNDS = 10


def test_sixteen_threads_racing_a_create_get_exactly_one_winner(store):
    for round_ in range(ROUNDS):
        key = f"race/create-{round_}.json"
        results = _race(RACERS, lambda i, key=key: store.write(key, str(i).encode(), if_generation_match=0))
        winners = [i for i, r in enumerate(results) if r[0] == "ok"]
        assert [r for r in results if r[0] == "error"] == [], f"round {round_}"
        assert len(winners) == 1, f"round {round_}: {results}"
        data, gen = store.read(key)
        assert data == str(winners[0]).encode() and gen == results[winners[0]][1], f"round {round_}"


def test_sixteen_threads_racing_an_overwrite_of_one_generation_get_exactly_one_winner(store):
    for round_ in range(ROUNDS):
        key = f"race/overwrite-{round_}.json"
        base = store.write(key, b"base", if_generation_match=0)

        def write(i: int, key: str = key, base: int = base) -> int:
            return store.write(key, str(i).encode(), if_generation_match=base)

        results = _race(RACERS, write)
        winners = [i for i, r in enumerate(results) if r[0] == "ok"]
        assert [r for r in results if r[0] == "error"] == [], f"round {round_}"
        assert len(winners) == 1, f"round {round_}: {results}"
        assert store.read(key) == (str(winners[0]).encode(), results[winners[0]][1]), f"round {round_}"
