"""How the async lock reaches threads: its seam, as ``clock=`` and ``primitives=`` are the sync lock's.

:class:`~handofflock.aio.AsyncHandoffLock` never does the lock's work on the
event loop: each blocking call runs in a worker thread, a cancelled call's
cleanup may need a thread of its own, and the lock's own threads come back to
the loop (to wake a waiting task, to await an ``async def`` receiver) through
the loop's token. Every one of those crossings goes through one
:class:`Threads` value, whose default is anyio's worker threads and loop
tokens with :mod:`threading`'s idents. A deterministic simulation passes its
own (workers that are greenlets on simulated time, an event loop that parks
instead of blocking in ``select``) exactly where these plug in, instead of
patching anyio, as FoundationDB's simulator implements the network interface.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio import from_thread, to_thread
from anyio.lowlevel import EventLoopToken, current_token

from .lock.primitives import THREADING, Primitives

T = TypeVar("T")


class Threads:
    """The threads the async lock uses, and how it crosses between them and the event loop.

    ``primitives`` make the mutexes and events shared between a worker thread
    and the loop (a call's claim and its end).
    """

    def __init__(self, primitives: Primitives = THREADING) -> None:
        self.primitives = primitives

    def ident(self) -> int:
        """Which thread this is (compared with the loop's own, to never wait on the loop from the loop)."""
        return threading.get_ident()

    def token(self) -> EventLoopToken:
        """The running event loop's token, for coming back to it from other threads."""
        return current_token()

    async def run_sync(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a worker thread of its own; a cancellation of the awaiting task abandons it at once."""
        return await to_thread.run_sync(fn, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1))

    def start(self, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` in a new daemon thread (a call whose worker anyio gave up before it began)."""
        threading.Thread(target=fn, name=name, daemon=True).start()

    def call_on_loop(self, token: EventLoopToken, fn: Callable[..., Any], *args: Any) -> None:
        """From another thread: run ``fn(*args)`` on the loop and wait for it. RuntimeError if the loop is gone."""
        from_thread.run_sync(fn, *args, token=token)

    def await_on_loop(self, token: EventLoopToken, fn: Callable[[], Awaitable[Any]]) -> None:
        """From another thread: await ``fn()`` on the loop and wait for it. RuntimeError if the loop is gone."""
        from_thread.run(fn, token=token)  # type: ignore[arg-type]


#: The real ones: anyio's worker threads and tokens.
ANYIO_THREADS = Threads()
