"""AsyncHandoffLock: what gives the lock up runs to its end in a cancelled task, then the cancellation goes on.

Regression tests from an adversarial review: ``try: ... finally: await
lock.release()`` in a task cancelled through an anyio/trio cancel scope never
released (every await in a cancelled scope raises at once, and the thread job
was dropped before it started): the lock stayed held, and renewed by the
scheduler thread, for as long as the process lived. Also here: the signals an
async lock sends again as itself include ``on_release_withdrawn``.
"""

from __future__ import annotations

import asyncio
import uuid

import anyio
import pytest
from blinker import Signal
from lockutil import FAST, make_lock, raw_read

from handofflock import AsyncHandoffLock, signals
from handofflock import aio as aio_module
from handofflock.lock import events
from handofflock.storage import MemoryStorage

QUICK = {k: v for k, v in FAST.items() if k != "min_write_interval"}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.fixture
def url():
    name = f"aio-cancel-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/l.json"
    MemoryStorage.forget(name)


def cleanup(*locks) -> None:
    for lock in locks:
        sync = getattr(lock, "sync", lock)
        if sync.is_held:
            sync.release()
        sync._unschedule()  # private: stop its renewals without releasing


async def test_release_in_the_finally_of_a_task_cancelled_by_its_scope_releases_then_the_cancel_goes_on(url):
    lock = AsyncHandoffLock(url, **QUICK)
    after_release: list[str] = []

    async def job(task_status=anyio.TASK_STATUS_IGNORED):
        await lock.acquire()
        try:
            task_status.started()
            await anyio.sleep_forever()
        finally:
            try:
                await lock.release()
                after_release.append("returned")
            except anyio.get_cancelled_exc_class():
                after_release.append("cancelled")
                raise

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(job)
            assert lock.is_held
            tg.cancel_scope.cancel()
        record, _ = raw_read(url)
        assert not lock.is_held and record.owner_id is None, (
            f"release() in the cancelled task's finally never ran: is_held={lock.is_held}, owner={record.owner_id!r}"
        )
        assert after_release == ["cancelled"], "the cancellation is raised after the release"
    finally:
        cleanup(lock)


async def test_a_cancelled_release_still_hands_off_to_the_waiter(url):
    lock = AsyncHandoffLock(url, **QUICK)
    waiter = make_lock(url)
    try:
        await lock.acquire()
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, lambda: waiter.acquire(timeout=20))
            with anyio.fail_after(20):
                while not lock.release_requested:
                    await anyio.sleep(0.02)
            with anyio.CancelScope() as scope:
                scope.cancel()
                await lock.release()  # in a cancelled scope: runs anyway
            assert scope.cancelled_caught
        assert waiter.is_held and not lock.is_held
        assert raw_read(url)[0].owner_id == waiter.owner_id
    finally:
        cleanup(lock, waiter)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_second_asyncio_task_cancel_during_release_does_not_drop_it(anyio_backend, url):
    """asyncio's task.cancel() reaches into shielded scopes: a second one, as the release in a ``finally``
    begins, must not make anyio drop the thread job before a worker took it."""
    lock = AsyncHandoffLock(url, **QUICK)
    held = asyncio.Event()

    async def job():
        await lock.acquire()
        held.set()
        try:
            await asyncio.sleep(3600)
        finally:
            await lock.release()

    try:
        for _ in range(5):  # the window is a few event loop turns: try it more than once
            task = asyncio.get_running_loop().create_task(job())
            await held.wait()
            held.clear()
            task.cancel()
            await asyncio.sleep(0)  # the task wakes and enters release()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record, _ = raw_read(url)
            assert not lock.is_held and record.owner_id is None, "a second task.cancel() dropped the release"
    finally:
        cleanup(lock)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_second_asyncio_task_cancel_during_async_with_exit_does_not_drop_the_release(anyio_backend, url):
    lock = AsyncHandoffLock(url, **QUICK)
    held = asyncio.Event()

    async def job():
        async with lock:
            held.set()
            await asyncio.sleep(3600)

    try:
        for _ in range(5):
            task = asyncio.get_running_loop().create_task(job())
            await held.wait()
            held.clear()
            task.cancel()
            await asyncio.sleep(0)  # the task wakes and enters __aexit__
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record, _ = raw_read(url)
            assert not lock.is_held and record.owner_id is None, "a second task.cancel() dropped __aexit__'s release"
    finally:
        cleanup(lock)


def test_the_async_lock_sends_again_every_signal_of_the_sync_lock():
    every = {value for value in vars(events).values() if isinstance(value, Signal)}
    assert every, "no signals found in handofflock.lock.events"
    missing = sorted(s.name for s in every - set(aio_module._SIGNALS))
    assert not missing, f"signals an AsyncHandoffLock does not send again as itself: {missing}"


def test_receivers_of_the_async_lock_hear_a_release_request_withdrawn(sim):
    lock, waiter = sim.aio("async-owner", **QUICK), sim.lock("waiter", **QUICK)
    heard: list[tuple[str, object]] = []

    def requested(sender, **kw):
        heard.append(("requested", sender))

    def withdrawn(sender, **kw):
        heard.append(("withdrawn", sender))

    signals.on_release_requested.connect(requested, sender=lock)
    signals.on_release_withdrawn.connect(withdrawn, sender=lock)

    async def main() -> None:
        await lock.acquire()
        with anyio.fail_after(20):
            # the waiter registers, is noticed, then gives up (its timeout)
            giving_up = sim.start(lambda: waiter.acquire(timeout=1.0))
            while not giving_up or ("withdrawn", lock) not in heard:
                await anyio.sleep(0.02)
        assert isinstance(giving_up.error, TimeoutError)
        assert heard == [("requested", lock), ("withdrawn", lock)]
        assert not lock.release_requested and lock.release_request is None

    sim.run_async(main, on=lock)
