"""``async with await lock.acquire(timeout=5):`` releases at the end of the block, as ``with lock.acquire():`` does."""

import anyio
import pytest
from lockutil import raw_read, url_for

from handofflock import AsyncHandoffLock


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.anyio
async def test_async_with_await_acquire_releases_at_the_end_of_the_block(anyio_backend, request, tmp_path):
    url = url_for("local", request, tmp_path)
    lock = AsyncHandoffLock(url)
    with anyio.fail_after(10):
        got = await lock.acquire(timeout=5)
        assert got and bool(got) is True and got.lock is lock
        async with got as held:
            assert held is lock and lock.is_held
            assert raw_read(url)[0].owner_id == lock.owner_id
    assert not lock.is_held and raw_read(url)[0].owner_id is None
    again = AsyncHandoffLock(url)
    assert await again.acquire(blocking=False)  # free again
    await again.release()
