"""install_signal_handlers() given the async lock (AsyncHandoffLock): it must work or say no at install."""

from __future__ import annotations

import asyncio
import signal
import uuid

from handofflock import ConfigurationError
from handofflock.aio import AsyncHandoffLock
from handofflock.os_signals import install_signal_handlers
from handofflock.storage import MemoryStorage
from signalsutil import kills, restore_signals  # noqa: F401


def test_sigterm_twice_on_an_async_lock_releases_it_then_ends_the_process(restore_signals, monkeypatch):
    """An asyncio job passes its AsyncHandoffLock (the lock it has) to install_signal_handlers(): the install is
    accepted and the first SIGTERM asks. The second must let the lock go and then end the process, as for the
    sync lock; or the install must refuse the async lock (pass ``lock.sync``). It does neither: the "now" calls
    ``release()``, an un-awaited coroutine (nothing released), then raises AttributeError out of the handler
    into the loop, and the process lives on, holding the lock."""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    name = f"sig-aio-{uuid.uuid4().hex[:8]}"

    async def job() -> tuple[bool, str | None]:
        lock = AsyncHandoffLock(f"memory://{name}/lock.json", ttl=60.0, owner_id="o")
        try:
            handlers = install_signal_handlers(lock, [signal.SIGTERM])  # type: ignore[arg-type]
        except ConfigurationError:
            return True, None  # refused at install: fine
        await lock.acquire()
        try:
            signal.raise_signal(signal.SIGTERM)
            assert lock.release_requested
            try:
                signal.raise_signal(signal.SIGTERM)
            except AttributeError as exc:
                return False, f"the second SIGTERM raised {exc!r}"
            return False, None
        finally:
            handlers.uninstall()
            if lock.is_held:
                await lock.release()

    try:
        refused, failed = asyncio.run(job())
    finally:
        MemoryStorage.forget(name)
    assert failed is None, failed
    assert refused or killed == [signal.SIGTERM]
