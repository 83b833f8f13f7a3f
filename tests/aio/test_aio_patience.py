"""The async lock's patient wait mirrors the sync lock's, and a stray cancel spoils nothing."""

from __future__ import annotations

import anyio
import pytest
from lockutil import FAST, url_for

from handofflock import AsyncHandoffLock

# The local store's own pacing is none (min_write_interval 0 is its default), so FAST without it.
QUICK = {k: v for k, v in FAST.items() if k != "min_write_interval"}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


def test_an_async_patient_waiter_is_never_announced_and_gets_the_lock_at_release(sim):
    owner = sim.aio("async-owner", **QUICK)
    waiter = sim.aio("async-waiter", beside=owner, **QUICK)
    got: list[bool] = []

    async def wait_patiently() -> None:
        got.append(await waiter.acquire(request_release=False, timeout=30))

    async def main() -> None:
        async with owner:
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_patiently)
                with anyio.fail_after(10):
                    while (sim.record().waiting_owner_id or "") != waiter.owner_id:
                        await anyio.sleep(0.01)
                await anyio.sleep(0.5)  # five waiter checks
                assert not owner.release_requested
                assert await owner.release() == waiter.owner_id
        assert [bool(g) for g in got] == [True] and waiter.is_held
        await waiter.release()

    sim.run_async(main, on=owner)


async def test_cancelling_an_async_acquire_at_once_still_stops_it(anyio_backend, request, tmp_path):
    # A cancel that came before the worker thread's acquire began is repeated until it lands.
    url = url_for("local", request, tmp_path)
    owner, waiter = AsyncHandoffLock(url, **QUICK), AsyncHandoffLock(url, **QUICK)
    async with owner:
        for _ in range(5):
            with anyio.move_on_after(0):
                await waiter.acquire()
        assert not waiter.is_held
    assert await waiter.acquire(timeout=5)  # and nothing was left set to cancel this one
    await waiter.release()
