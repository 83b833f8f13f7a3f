"""AsyncHandoffLock under asyncio and trio (anyio's pytest plugin runs each test on both).

Most tests use the memory or local backend with the store's default pacing
(none there) and lockutil's short intervals; the cross-process handoffs on the
GCS emulator are in test_aio_processes.py.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import warnings
from typing import Any

import anyio
import greenlet
import pytest
from lockutil import FAST, make_lock, raw_read, raw_write, url_for

from handofflock import (
    AsyncHandoffLock,
    ConfigurationError,
    HandoffLock,
    InvalidLockURL,
    LockContended,
    LockLost,
    LockTimeout,
    TransientStorageError,
    signals,
)

#: lockutil's short intervals with the store's default write pacing (0 on memory and local).
QUICK = {k: v for k, v in FAST.items() if k != "min_write_interval"}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


async def until(cond, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``cond`` (without blocking the loop) until it is true."""
    with anyio.fail_after(timeout):
        while not (value := cond()):
            await anyio.sleep(0.01)
    return value


def waiter_of(url: str) -> str | None:
    record, _ = raw_read(url)
    return None if record is None else record.waiting_owner_id


def owner_of(url: str) -> str | None:
    record, _ = raw_read(url)
    return None if record is None else record.owner_id


# --------------------------------------------------------------------------- handoff, signals, steps


async def test_an_async_owner_hands_off_to_an_async_waiter_that_asked(anyio_backend, request, tmp_path):
    url = url_for("local", request, tmp_path)
    owner, waiter = AsyncHandoffLock(url, **QUICK), AsyncHandoffLock(url, **QUICK)
    got: list[int] = []

    async def wait_for_it() -> None:
        async with waiter:
            got.append(waiter.token)

    async with owner:
        first = owner.token
        assert owner.is_held and owner.healthy and not owner.release_requested
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_it)
            with anyio.fail_after(10):
                request_ = await owner.wait_release_requested()
            assert request_.reason == "waiter" and request_.requester == waiter.owner_id
            assert owner.release_requested and owner.release_request == request_
            assert owner.release_requests == (request_,)
            heir = await owner.release()
    assert heir == waiter.owner_id
    assert got and got[0] > first
    assert owner_of(url) is None and not owner.is_held  # the waiter released on leaving its block


async def test_async_receivers_are_awaited_on_the_loop_and_sync_ones_called_where_the_sync_lock_sends(anyio_backend, request, tmp_path):
    url = url_for("memory", request, tmp_path)
    lock = AsyncHandoffLock(url, **QUICK)
    loop = threading.get_ident()
    calls: list[tuple[str, bool, bool]] = []

    async def mine_async(sender, token, handoff, **kw):
        await anyio.sleep(0)  # a real await, on the loop
        calls.append(("async, sender=lock", sender is lock, threading.get_ident() == loop))

    def mine_sync(sender, token, **kw):
        calls.append(("sync, sender=lock", sender is lock, threading.get_ident() == loop))

    async def anyone_async(sender, **kw):
        if sender is lock.sync:  # connected for any sender: other tests' locks may send too
            calls.append(("async, any sender", True, threading.get_ident() == loop))

    signals.acquired.connect(mine_async, sender=lock)
    signals.acquired.connect(mine_sync, sender=lock)
    signals.acquired.connect(anyone_async)
    try:
        await lock.acquire()
        await lock.release()
    finally:
        signals.acquired.disconnect(anyone_async)
    assert sorted(calls) == [
        ("async, any sender", True, True),
        ("async, sender=lock", True, True),
        ("sync, sender=lock", True, False),  # in the worker thread that ran acquire(), as for the sync lock
    ]


def test_an_async_receiver_of_a_plain_sync_lock_is_skipped_with_a_warning_not_left_unawaited(request, tmp_path, caplog):
    lock = make_lock(url_for("memory", request, tmp_path))

    async def receiver(sender, **kw):  # pragma: no cover - must not run
        raise AssertionError("called")

    signals.acquired.connect(receiver, sender=lock)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be a RuntimeWarning
        lock.acquire()
        lock.release()
    assert "only an AsyncHandoffLock awaits async receivers" in caplog.text


async def test_async_steps_run_until_a_release_is_requested_over_sync_and_async_iterables(anyio_backend, request, tmp_path):
    lock = AsyncHandoffLock(url_for("memory", request, tmp_path), **QUICK)

    async def numbers():
        for i in range(3):
            await anyio.sleep(0)
            yield i

    async with lock:
        steps = lock.steps(numbers())
        assert [step async for step in steps] == [0, 1, 2]
        assert steps.last == 2 and steps.count == 3 and not steps.stopped

        steps = lock.steps(range(1000))
        async for step in steps:
            if step == 5:
                lock.request_release("operator", requester="test")
        assert steps.stopped and steps.last == 5 and steps.count == 6
        assert steps.request is not None and steps.request.requester == "test"
    with pytest.raises(LockLost):  # released: no step starts without the lock
        async for _ in lock.steps(range(3)):
            pass


async def test_wait_release_requested_raises_lock_lost_when_the_lock_is_taken_away(anyio_backend, request, tmp_path):
    url = url_for("memory", request, tmp_path)
    lock = AsyncHandoffLock(url, **QUICK)
    await lock.acquire()
    outcome: list[BaseException] = []

    async def wait() -> None:
        try:
            await lock.wait_release_requested()
        except LockLost as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.1)
        record, generation = raw_read(url)
        raw_write(url, record.replace(owner=dataclasses.replace(record.owner, id="thief"), token=record.token + 1), generation)
        with anyio.fail_after(10):
            await until(lambda: outcome)
    assert isinstance(outcome[0], LockLost) and not lock.healthy
    with pytest.raises(LockLost):
        await lock.check()
    with pytest.raises(LockLost):
        await lock.release()  # writes nothing
    assert owner_of(url) == "thief"


# --------------------------------------------------------------------------- cancellation


async def test_cancelling_a_task_waiting_in_acquire_gives_the_waiter_slot_back(anyio_backend, request, tmp_path):
    url = url_for("memory", request, tmp_path)
    holder = make_lock(url)
    holder.acquire()
    lock = AsyncHandoffLock(url, **QUICK)
    outcome: list[Any] = []

    async def wait() -> None:
        try:
            await lock.acquire()
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise
        except BaseException as exc:  # pragma: no cover - reported by the assertion below
            outcome.append(exc)
            raise

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await until(lambda: waiter_of(url) == lock.owner_id, what="the async lock registered as waiter")
        tg.cancel_scope.cancel()
    assert outcome == ["cancelled"]
    # Given back before the cancellation went on: no waiting for waiter_ttl.
    assert waiter_of(url) is None and owner_of(url) == holder.owner_id and not lock.is_held
    # Cancelled before its worker thread even started: it never starts, and nothing hangs.
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lock.acquire)
            tg.cancel_scope.cancel()
    await anyio.sleep(0.2)
    assert waiter_of(url) is None and not lock.is_held
    # No cancel is left over to spoil the next acquire of this instance.
    holder.release()
    assert await lock.acquire(timeout=5)
    await lock.release()


async def test_a_handoff_that_lands_as_the_acquire_is_cancelled_is_passed_on_not_kept(anyio_backend, request, tmp_path):
    url = url_for("memory", request, tmp_path)
    holder = make_lock(url)
    holder.acquire()
    lock = AsyncHandoffLock(url, **QUICK)
    outcome: list[str] = []
    scope = anyio.CancelScope()

    def cancel_as_it_lands(sender, token, handoff, **kw):
        # In the worker thread, inside acquire(), once the lock is ours: the task is cancelled
        # before it can see acquire() return True.
        anyio.from_thread.run_sync(scope.cancel)

    signals.acquired.connect(cancel_as_it_lands, sender=lock)

    async def wait() -> None:
        with scope:
            try:
                await lock.acquire()
            except anyio.get_cancelled_exc_class():
                outcome.append("cancelled")
                raise

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await until(lambda: waiter_of(url) == lock.owner_id)
        token = holder.token
        assert holder.release() == lock.owner_id  # handed to the async lock ...
    assert outcome == ["cancelled"] and scope.cancelled_caught
    record, _ = raw_read(url)
    assert record.owner_id is None and record.token > token  # ... which took it and released it at once
    assert not lock.is_held
    assert await lock.acquire(blocking=False)  # and no cancel is left over
    await lock.release()


def test_fail_after_around_acquire_acts_like_timeout(sim):
    holder, lock = sim.lock("holder", **QUICK), sim.aio("async-waiter", **QUICK)
    sim.call(holder.acquire)
    registered: list[str] = []

    def on_waiting(sender, **kw):
        registered.append(sender.owner_id)

    signals.waiting.connect(on_waiting, sender=lock)

    async def main() -> None:
        started = sim.monotonic()
        with pytest.raises(TimeoutError):
            with anyio.fail_after(2.0):
                await lock.acquire()
        assert registered == [lock.owner_id]  # it was the waiter ...
        assert sim.record().waiting_owner_id is None  # ... and gave the slot back
        assert sim.monotonic() - started < 2.0 + lock.sync.give_up_budget + 1.0

        with pytest.raises(LockTimeout) as timed_out:  # timeout= does the same, with the sync lock's error
            await lock.acquire(timeout=0.5)
        assert isinstance(timed_out.value, TimeoutError) and timed_out.value.owner_id == holder.owner_id
        assert registered == [lock.owner_id] * 2 and sim.record().waiting_owner_id is None

    sim.run_async(main, on=lock)


def test_asyncio_timeout_and_task_cancel_around_acquire_give_the_slot_back(sim):
    import asyncio

    holder, lock = sim.lock("holder", **QUICK), sim.aio("async-waiter", **QUICK)
    sim.call(holder.acquire)
    registered: list[str] = []

    def on_waiting(sender, **kw):
        registered.append(sender.owner_id)

    signals.waiting.connect(on_waiting, sender=lock)

    async def main() -> None:
        task = asyncio.ensure_future(lock.acquire())
        await until(lambda: sim.record().waiting_owner_id == lock.owner_id)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sim.record().waiting_owner_id is None and not lock.is_held

        timeout = getattr(asyncio, "timeout", None)  # Python 3.11+; wait_for before
        with pytest.raises(TimeoutError):
            if timeout is not None:
                async with timeout(0.6):
                    await lock.acquire()
            else:  # pragma: no cover - Python 3.10
                await asyncio.wait_for(lock.acquire(), 0.6)
        assert registered == [lock.owner_id] * 2  # it was the waiter both times, and gave the slot back
        assert sim.record().waiting_owner_id is None and not lock.is_held

    sim.run_async(main, on=lock)


@pytest.mark.parametrize("with_waiter", [True, False], ids=["waiter", "no-waiter"])
async def test_cancelling_the_body_of_async_with_still_releases_or_hands_off(anyio_backend, with_waiter, request, tmp_path):
    url = url_for("local", request, tmp_path)
    lock = AsyncHandoffLock(url, **QUICK)
    heir = make_lock(url)
    entered = anyio.Event()
    outcome: list[str] = []

    async def body() -> None:
        try:
            async with lock:
                entered.set()
                await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise

    heir_thread = threading.Thread(target=lambda: heir.acquire(timeout=20), daemon=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await entered.wait()
        if with_waiter:
            heir_thread.start()
            with anyio.fail_after(10):
                await lock.wait_release_requested()
        tg.cancel_scope.cancel()
    assert outcome == ["cancelled"] and not lock.is_held
    if with_waiter:
        assert owner_of(url) == heir.owner_id  # handed off in the release write
        await anyio.to_thread.run_sync(heir_thread.join, 10)
        assert heir.is_held
        heir.release()
    else:
        assert owner_of(url) is None


async def test_waiters_blocked_in_acquire_never_starve_a_release_of_a_worker_thread(anyio_backend, request, tmp_path):
    # anyio's default thread limiter has 40 tokens; every call of ours brings its own.
    n = 42
    # 86 locks renewed by one scheduler thread: leases of 10 s, so a loaded machine's pauses cost none
    # (this test is about worker-thread tokens, not about timing).
    roomy = {**QUICK, "ttl": 10.0, "renew_interval": None, "renew_deadline": None, "waiter_ttl": 5.0}
    urls = [url_for("memory", request, tmp_path, name=f"l{i}.json") for i in range(n)]
    holders = [make_lock(u, **roomy) for u in urls]
    for h in holders:
        h.acquire()
    waiters = [AsyncHandoffLock(u, **roomy) for u in urls]
    mine = AsyncHandoffLock(url_for("memory", request, tmp_path), **roomy)
    await mine.acquire()
    async with anyio.create_task_group() as tg:
        for w in waiters:
            tg.start_soon(w.acquire)
        await until(lambda: all(waiter_of(u) == w.owner_id for u, w in zip(urls, waiters)), timeout=20)
        with anyio.fail_after(10):
            await mine.release()
        tg.cancel_scope.cancel()
    assert all(waiter_of(u) is None for u in urls)  # every cancelled waiter gave its slot back
    for h in holders:
        h.release()


# --------------------------------------------------------------------------- the loop is never needed, never blocked


def test_a_blocked_loop_does_not_cost_the_lease(sim):
    lock = sim.aio("async-owner", **QUICK)  # ttl 1.5 s, renew every 0.2 s, renew_deadline 0.8 s
    asker = sim.lock("asker", **QUICK)
    asking: list[Any] = []

    async def main() -> None:
        await lock.acquire()
        _, generation = sim.read()
        asking.append(sim.start(lambda: asker.acquire(timeout=20)))  # it registers as waiter while the loop is blocked
        blocked_at = sim.time()
        sim.sleep(2.5)  # the loop's thread is held for > 12 renew intervals, and longer than the ttl
        record, now_generation = sim.read()
        assert record.owner_id == lock.owner_id
        assert now_generation >= generation + 4, "renewals went on while the loop was blocked"
        assert record.expires_at > blocked_at + 2.5  # renewed during the block, and still valid
        assert lock.healthy
        await lock.check()
        assert record.waiting_owner_id == asker.owner_id
        # The notice arrived while the loop was blocked; it is delivered now that it runs again.
        with anyio.fail_after(5):
            request_ = await lock.wait_release_requested()
        assert request_.requester == asker.owner_id
        assert await lock.release() == asker.owner_id

    sim.run_async(main, on=lock)
    sim.run_until(lambda: asking[0], 10, what="the asker's acquire to return")
    assert asking[0].result and asker.is_held


def test_no_storage_call_ever_runs_on_the_event_loop_thread(sim):
    lock = sim.aio("async-owner", **QUICK)
    other = sim.aio("async-other", beside=lock, **QUICK)
    threads: list[int] = []  # the simulated threads (greenlets) that called the store
    loop: list[int] = []
    looking = False  # the test's own reads, on the loop, are not the lock's

    def note(op, key):
        if not looking:
            threads.append(id(greenlet.getcurrent()))

    def waiter() -> str | None:
        nonlocal looking
        looking = True
        try:
            return sim.record().waiting_owner_id
        finally:
            looking = False

    sim.store.faults.before("*", note)
    noticed: list[object] = []
    signals.on_release_requested.connect(lambda sender, request, **kw: noticed.append(request), sender=lock, weak=False)

    async def main() -> None:
        loop.append(id(greenlet.getcurrent()))
        async with lock:
            await lock.status()
            await anyio.sleep(0.5)  # renewals and waiter checks
            with anyio.move_on_after(0.5):
                await other.acquire()  # becomes the waiter, then is cancelled (its request is then withdrawn)
            await until(lambda: noticed)  # it was noticed
            async with anyio.create_task_group() as tg:
                tg.start_soon(other.acquire)
                await until(lambda: waiter() == other.owner_id)
                assert await lock.release() == other.owner_id
        assert other.is_held
        await other.release()

    sim.run_async(main, on=lock)
    assert len(threads) > 10 and loop[0] not in threads


# --------------------------------------------------------------------------- bad input: the sync lock's errors


async def test_bad_input_raises_the_sync_locks_typed_errors(anyio_backend, request, tmp_path):
    url = url_for("memory", request, tmp_path)
    for bad, kwargs in ((url, {"ttl": -1.0}), (url, {"ttl": math.nan}), ("ftp://bucket/k.json", {}), ("gs://", {})):
        with pytest.raises(ConfigurationError) as sync_error:
            HandoffLock(bad, **kwargs)
        with pytest.raises(type(sync_error.value)) as async_error:
            AsyncHandoffLock(bad, **kwargs)
        assert str(async_error.value) == str(sync_error.value)
    with pytest.raises(InvalidLockURL):
        AsyncHandoffLock("ftp://bucket/k.json")
    with pytest.raises(ConfigurationError):
        AsyncHandoffLock(url, lock=make_lock(url))
    with pytest.raises(ConfigurationError):
        AsyncHandoffLock()

    lock = AsyncHandoffLock(url, **QUICK)
    for timeout in (math.nan, -2.0):  # -1 is "no timeout", as the sync lock's
        with pytest.raises(ConfigurationError, match="timeout must be >= 0"):
            await lock.acquire(timeout=timeout)
    assert raw_read(url) == (None, 0)  # nothing was written
    assert await lock.release() is None  # not held: nothing to do, as the sync lock

    holder, third = make_lock(url), make_lock(url)
    holder.acquire()
    assert await lock.acquire(blocking=False) is False  # never registers as waiter
    assert waiter_of(url) is None
    third_thread = threading.Thread(target=lambda: third.acquire(timeout=10), daemon=True)
    third_thread.start()
    await until(lambda: waiter_of(url) == third.owner_id)
    with pytest.raises(LockContended) as contended:  # a blocking acquire waits its turn unless told not to
        await AsyncHandoffLock(url, wait_for_slot=False, **QUICK).acquire()
    assert contended.value.owner_id == holder.owner_id and contended.value.waiter_id == third.owner_id
    holder.release()
    await anyio.to_thread.run_sync(third_thread.join, 10)
    third.release()


def test_the_async_lock_takes_exactly_the_keywords_of_the_sync_lock():
    """``AsyncHandoffLock(url, **options)`` hands its keywords to HandoffLock, which checks them."""
    from handofflock import AsyncHandoffLock, ConfigurationError, HandoffLock

    lock = AsyncHandoffLock("memory://aio-keywords/l.json", ttl=12.0, owner_id="same")
    assert isinstance(lock.sync, HandoffLock) and lock.ttl == 12.0 and lock.owner_id == "same"
    with pytest.raises(TypeError, match="no_such_keyword"):
        AsyncHandoffLock("memory://aio-keywords/l.json", no_such_keyword=1)
    with pytest.raises(ConfigurationError):
        AsyncHandoffLock("memory://aio-keywords/l.json", ttl=-1.0)


@pytest.mark.parametrize("name", ["is_held", "token", "ttl", "healthy"])
def test_the_async_locks_views_of_the_sync_lock_are_read_only(name):
    lock = AsyncHandoffLock("memory://aio-views/l.json", owner_id="A", ttl=10.0)
    with pytest.raises(AttributeError, match="read-only"):
        setattr(lock, name, 5)
    assert getattr(lock, name) == getattr(lock.sync, name)


@pytest.mark.parametrize("how", ["scope", "task.cancel"])
def test_a_cancelled_acquire_whose_slot_the_store_will_not_take_back_says_so(sim, how):
    """The sync acquire raises TransientStorageError when its slot cannot be given back (it expires by itself
    within waiter_ttl). Cancelled by a cancel scope, whose cancellation comes again at the next await, the async
    acquire raises the same instead of a bare cancellation, so the caller knows the slot is left (simulation
    seed 5672: the cancellation alone hid it); cancelled by asyncio's task.cancel(), which comes once, the
    cancellation goes on with the refusal as its cause (see the next test: a retry would swallow it)."""
    import asyncio

    holder, lock = sim.lock("holder", **QUICK), sim.aio("async-waiter", **QUICK)
    sim.call(holder.acquire)
    scopes: list[anyio.CancelScope] = []

    async def scoped() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await lock.acquire()

    async def main() -> None:
        task = asyncio.ensure_future(scoped())
        await until(lambda: sim.record().waiting_owner_id == lock.owner_id)
        sim.store.faults.fail_next(
            "write", count=1000, exc=lambda: TransientStorageError("429", status=429, ambiguous=False)
        )
        scopes[0].cancel() if how == "scope" else task.cancel()
        expected, cause = (
            (TransientStorageError, asyncio.CancelledError)
            if how == "scope"
            else (asyncio.CancelledError, TransientStorageError)
        )
        with pytest.raises(expected) as raised:
            await task
        assert isinstance(raised.value.__cause__, cause)
        assert sim.record().waiting_owner_id == lock.owner_id and not lock.is_held  # left, and said so
        sim.store.faults.clear()

    sim.run_async(main, on=lock)


def test_a_task_cancelled_in_acquire_ends_though_it_retries_transient_store_errors(sim):
    """A worker that retries what the library calls transient, cancelled (task.cancel(): asyncio.run's
    shutdown, a supervisor) while the store refuses its slot's give-back, must still end: a cancellation
    replaced by a retryable error is swallowed by the retry, and the task waits for the lock again."""
    import asyncio

    holder, lock = sim.lock("holder", **QUICK), sim.aio("async-waiter", **QUICK)
    sim.call(holder.acquire)
    attempts: list[int] = []

    async def worker() -> None:
        while True:
            attempts.append(1)
            try:
                await lock.acquire()
                return
            except TransientStorageError:
                await asyncio.sleep(0.5)

    async def main() -> None:
        task = asyncio.ensure_future(worker())
        await until(lambda: sim.record().waiting_owner_id == lock.owner_id)
        sim.store.faults.fail_next(
            "write", count=1000, exc=lambda: TransientStorageError("429", status=429, ambiguous=False)
        )
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=60)
        sim.store.faults.clear()
        if not done:
            lock.sync.cancel()
            task.cancel()
            await asyncio.wait([task], timeout=60)
        assert done and task.cancelled(), f"the cancelled task was still retrying after {len(attempts)} acquires"

    sim.run_async(main, on=lock)
