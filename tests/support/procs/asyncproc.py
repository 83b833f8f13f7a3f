"""An async lock user in its own OS process (AsyncHandoffLock): the async twin of lockproc.py.

    python asyncproc.py owner URL LOOP     acquire, wait for a release request, release (hand off)
    python asyncproc.py waiter URL LOOP    acquire as the waiter, report, release

``LOOP`` is ``asyncio`` or ``trio``. Same timing as lockproc.py (ttl 10 s, check 0.5 s,
poll 0.2 s, the store's default write pacing), so either may play either role. Prints
one JSON event per line; ``loop_thread`` says whether a receiver ran on the event loop.
"""

from __future__ import annotations

import sys
import threading
import time

import anyio
import orjson

from handofflock import AsyncHandoffLock, signals


def emit(event: str, **fields) -> None:
    sys.stdout.write(orjson.dumps({"event": event, "t": time.time(), **fields}).decode() + "\n")
    sys.stdout.flush()


async def main(role: str, url: str) -> int:
    lock = AsyncHandoffLock(url, ttl=10.0, waiter_check_interval=0.5, waiter_poll_interval=0.2, max_clock_skew=0.5,
                             min_hold=0)  # handoff mechanics: asked at once
    loop_thread = threading.get_ident()
    if role == "owner":
        async def noticed(sender, request, **kw):  # awaited on the loop
            emit("noticed_async", waiter=request.requester, reason=request.reason.value, loop_thread=threading.get_ident() == loop_thread,
                 sender_is_lock=sender is lock)

        signals.on_release_requested.connect(noticed, sender=lock)
        async with lock:
            emit("acquired", token=lock.token, owner=lock.owner_id)
            with anyio.fail_after(60):
                request = await lock.wait_release_requested()
            emit("noticed", waiter=request.requester, deadline=request.deadline, reason=request.reason)
            await anyio.sleep(0.2)  # "checkpoint"
            heir = await lock.release()
            emit("released", heir=heir, token=lock.token)
        return 0

    async def registered(sender, owner_id, **kw):
        emit("waiting", holder=owner_id, me=lock.owner_id, loop_thread=threading.get_ident() == loop_thread)

    signals.waiting.connect(registered, sender=lock)
    await lock.acquire(timeout=60)
    emit("acquired", token=lock.token, owner=lock.owner_id)
    await lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1], sys.argv[2], backend=sys.argv[3]))
