"""The async lock in the simulation: an event loop on simulated time, and the threads it reaches through its seam.

An async party drives an :class:`~handofflock.aio.AsyncHandoffLock` (which
wraps the party's ``HandoffLock``) from a task on :class:`SimLoop`, an asyncio
event loop whose clock is the party's monotonic clock and whose ``select``
parks the loop's greenlet until its next timer or a call from another thread.
anyio runs on it as on any asyncio loop. :class:`SimThreads` is the lock's
:class:`~handofflock.aio_threads.Threads`: a worker thread is a greenlet of the
party's process, and a call back to the loop is a callback scheduled on it,
waited for by parking. So the async lock's own code (its worker calls, the
cancellation that asks the sync acquire to stop and waits for it, the release
of a lock handed over as the task was cancelled) runs as it does for real, at
the moments the seed picks.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import anyio
import greenlet
from anyio.lowlevel import EventLoopToken

from ...aio import AsyncHandoffLock
from ...aio_threads import Threads
from ...core.errors import AcquireCancelled, AlreadyAcquired
from .checker import EXPECTED, Checker
from .faults import Net
from .hub import Hub, Proc, SimClock, SimEvent, Violation, sim_primitives
from .parties import Party

T = TypeVar("T")

#: ``select(0)`` calls in a row after which a loop that never parks is a livelock.
_MAX_SPINS = 100_000


class _SimSelector:
    """What asyncio's loop waits in: parks until the loop's next timer (``timeout``) or a threadsafe call."""

    def __init__(self, loop: SimLoop) -> None:
        self.loop = loop
        self.spins = 0

    def select(self, timeout: float | None = None) -> list[Any]:
        loop = self.loop
        if loop.wake.is_set() or timeout == 0:
            self.spins += 1
            if self.spins > _MAX_SPINS:
                raise Violation(f"livelock: the event loop of {loop.proc.name} ran {_MAX_SPINS} rounds without waiting")
        else:
            self.spins = 0
            loop.clock.wait(loop.wake, timeout)
        loop.wake.clear()
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """An asyncio event loop on one simulated process's monotonic clock."""

    def __init__(self, hub: Hub, proc: Proc, clock: SimClock) -> None:
        super().__init__()
        self.hub, self.proc, self.clock = hub, proc, clock
        self.wake = SimEvent(hub)
        self._selector = _SimSelector(self)

    def time(self) -> float:
        return self.clock.monotonic()

    def _write_to_self(self) -> None:  # call_soon_threadsafe's wake-up
        self.wake.set()

    def _process_events(self, event_list: list[Any]) -> None:
        pass


class SimThreads(Threads):
    """The async lock's threads in one simulated process: greenlets, and calls to the loop that park."""

    def __init__(self, hub: Hub, proc: Proc) -> None:
        super().__init__(sim_primitives(hub, proc))
        self.hub, self.proc = hub, proc
        self._awaiting: set[asyncio.Future[None]] = set()

    def ident(self) -> int:
        return id(greenlet.getcurrent())

    async def run_sync(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, error: BaseException | None) -> None:
            if done.done():  # the awaiting task was cancelled: the call is abandoned
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)  # type: ignore[arg-type]

        def work() -> None:
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting task
                loop.call_soon_threadsafe(settle, None, exc)
            else:
                loop.call_soon_threadsafe(settle, result, None)

        self.start(work, f"{self.proc.name}-aio-worker")
        return await done

    def start(self, fn: Callable[[], None], name: str) -> None:
        self.hub.spawn(name, fn, self.proc)

    def _on_loop(self, token: EventLoopToken, run: Callable[[Callable[[], None]], None]) -> None:
        loop = token.native_token
        assert isinstance(loop, SimLoop)
        ended, box = SimEvent(self.hub), {}

        def finished(error: BaseException | None = None) -> None:
            box["error"] = error
            ended.set()

        if loop.is_closed():
            raise RuntimeError("Event loop is closed")
        loop.call_soon_threadsafe(run, finished)
        ended.wait()
        if box.get("error") is not None:
            raise box["error"]  # type: ignore[misc]

    def call_on_loop(self, token: EventLoopToken, fn: Callable[..., Any], *args: Any) -> None:
        def run(finished: Callable[..., None]) -> None:
            try:
                fn(*args)
            except BaseException as exc:
                finished(exc)
            else:
                finished()

        self._on_loop(token, run)

    def await_on_loop(self, token: EventLoopToken, fn: Callable[[], Awaitable[Any]]) -> None:
        def run(finished: Callable[..., None]) -> None:
            async def main() -> None:
                try:
                    await fn()
                except BaseException as exc:
                    finished(exc)
                else:
                    finished()

            task = asyncio.ensure_future(main())
            self._awaiting.add(task)  # a task nobody references may be collected before it ends
            task.add_done_callback(self._awaiting.discard)

        self._on_loop(token, run)


class Stage(Protocol):
    """What an async party needs of its world (:class:`~.world.World`)."""

    rng: random.Random
    hub: Hub
    checker: Checker
    net: Net

    @property
    def ttl(self) -> float: ...

    def acquire_ended(self, party: Party, result: object) -> None: ...


def run_async_party(world: Stage, party: Party) -> None:
    """The party's main thread: an event loop running :func:`async_actor` until the chaos stops (or it dies)."""
    loop = SimLoop(world.hub, party.proc, party.clock)
    party.loop = loop
    alock = AsyncHandoffLock(lock=party.lock, threads=SimThreads(world.hub, party.proc))
    try:
        loop.run_until_complete(async_actor(world, party, alock))
    finally:
        if not loop.is_running():
            loop.close()


async def async_actor(world: Stage, party: Party, alock: AsyncHandoffLock) -> None:
    """Acquire (some acquires cancelled by a deadline on the task), hold a while, release; as an async program does."""
    r, hub, checker, ttl = world.rng, world.hub, world.checker, world.ttl
    while world.net.chaos and party.alive:
        if alock.is_held:
            await anyio.sleep(r.uniform(0.0, ttl / 4))
            if alock.release_requested or r.random() < 0.3:
                party.notes.append("released")
                try:
                    hub.note(f"{party.name} async release -> {await alock.release()!r}")
                except (*EXPECTED, AlreadyAcquired) as exc:
                    hub.note(f"{party.name} async release raised {type(exc).__name__}")
            elif not alock.is_held:
                checker.lost_while_gentle(party, "the async lock was lost while held")
            continue
        cancel_after = r.uniform(0.05, 2.0) * ttl if r.random() < 0.5 else math.inf
        timeout = r.uniform(0.5, 4.0) * ttl
        result: object = None
        party.in_acquire = True
        try:
            with anyio.move_on_after(cancel_after) as scope:
                got = await alock.acquire(timeout=timeout, request_release=r.random() < 0.8)
                result = bool(got)
            if scope.cancelled_caught:
                result = AcquireCancelled("the task was cancelled")
                checker.count("async_cancels")
        except AlreadyAcquired:  # still releasing (a release being retried): the API says no
            await anyio.sleep(r.uniform(0.0, ttl / 2))
            continue
        except EXPECTED as exc:
            result = exc
        finally:
            party.in_acquire = False
            party.left_wait_at = hub.now
        checker.count("async")
        hub.note(f"{party.name} async acquire -> {result!r}")
        world.acquire_ended(party, result)
        await anyio.sleep(r.uniform(0.0, ttl / 2))
