"""install_signal_handlers() given the async lock (AsyncHandoffLock): it drives the lock the async one wraps."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from handofflock.aio import AsyncHandoffLock
from handofflock.os_signals import install_signal_handlers
from handofflock.storage import MemoryStorage
from signalsutil import kills, restore_signals  # noqa: F401

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


def test_sigterm_twice_on_an_async_lock_releases_it_then_ends_the_process(restore_signals, monkeypatch):
    """An asyncio job passes its AsyncHandoffLock to install_signal_handlers(): the first SIGTERM asks, the second
    lets the lock go and then ends the process (its default action), as for the sync lock. Its ``release()`` is
    a coroutine a handler cannot await: the handlers release the sync lock it drives."""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    name = f"sig-aio-{uuid.uuid4().hex[:8]}"

    async def job() -> tuple[bool, bool]:
        lock = AsyncHandoffLock(f"memory://{name}/lock.json", ttl=60.0, owner_id="o")
        handlers = install_signal_handlers(lock, [signal.SIGTERM])
        await lock.acquire()
        try:
            signal.raise_signal(signal.SIGTERM)  # asks
            asked = lock.release_requested and lock.is_held
            signal.raise_signal(signal.SIGTERM)  # now
            return asked, lock.is_held
        finally:
            handlers.uninstall()
            if lock.is_held:
                await lock.release()

    try:
        asked, held_after = asyncio.run(job())
        owner = (MemoryStorage.named(name).read("lock.json") or (b"",))[0]
    finally:
        MemoryStorage.forget(name)
    assert asked, "the first SIGTERM did not ask"
    assert not held_after and b'"ownerId":"o"' not in owner, "the second SIGTERM did not let the lock go"
    assert killed == [signal.SIGTERM], "the second SIGTERM did not act once the lock was let go"
