"""AsyncHandoffLock: the lock for asyncio and trio programs (built on anyio).

>>> async with AsyncHandoffLock("gs://bucket/locks/gpu-pool.json", ttl=60) as lock:
...     async for step in lock.steps(range(start, total)):
...         await train(step)
...     # leaving the block hands the lock to the waiter, if there is one

It wraps a real :class:`~handofflock.HandoffLock` and never does the lock's
work on the event loop:

* every call that may touch storage (``acquire``, ``release``, ``status``)
  runs in a worker thread of its own (``anyio.to_thread``, with a private
  capacity limiter per call, so a hundred waiters blocked in ``acquire`` never
  starve a ``release`` of a thread);
* renewals and waiter checks run where they run for the sync lock, on the
  process's scheduler thread, so a loop blocked for longer than the renew
  interval does not cost the lease;
* what needs the loop comes to it from those threads through the loop's token
  (``anyio.from_thread`` with the token of the loop the lock was acquired on):
  waking :meth:`wait_release_requested`, and awaiting ``async def`` receivers
  of the signals.

A thread cannot be killed, so cancellation goes through the sync lock's own
exits: a cancelled :meth:`acquire` calls ``HandoffLock.cancel()``, waits
(shielded) until the worker thread has given the waiter slot back, and then
re-raises the cancellation. See docs/design.md, *The async lock*.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

try:
    import anyio
    from anyio import from_thread, to_thread
    from anyio.lowlevel import EventLoopToken, current_token
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("handofflock.aio needs anyio >= 4.11: pip install 'handofflock[async]'") from exc

from . import os_signals
from .core.errors import ConfigurationError, LockLost, TransientStorageError
from .core.record import Forward
from .lock import events as signals
from .lock.handoff import Acquired, HandoffLock, Stepping
from .lock.primitives import THREADING, Primitives
from .lock.types import LockStatus, ReleaseRequest

if TYPE_CHECKING:
    from .core.timing import Timing

_log = logging.getLogger("handofflock.aio")

T = TypeVar("T")

#: The signals an AsyncHandoffLock sends again with itself as the sender.
_SIGNALS = (
    signals.on_release_requested,
    signals.on_release_withdrawn,
    signals.on_renewal_error,
    signals.waiting,
    signals.acquired,
    signals.released,
    signals.lost,
)
#: A sender nobody connects to: ``receivers_for(_NOBODY)`` yields the receivers connected for any sender.
_NOBODY = object()
#: How often a :meth:`AsyncHandoffLock.wait_release_requested` looks again without being woken (seconds),
#: at most: a belt to the wake-ups' braces (a loop that was not reachable when the signal came).
_RECHECK = 1.0
#: Cleanup after a cancellation polls for the worker thread's end this often (seconds).
_POLL = 0.005


class Threads:
    """The threads the async lock uses, and how it crosses between them and the event loop: its seam.

    Each blocking call runs in a worker thread, a cancelled call's cleanup may
    need a thread of its own, and the lock's own threads come back to the loop
    (to wake a waiting task, to await an ``async def`` receiver) through the
    loop's token. Every one of those crossings goes through one ``Threads``
    value, whose default is anyio's worker threads and loop tokens with
    :mod:`threading`'s idents. A deterministic simulation passes its own
    (workers that are greenlets on simulated time, an event loop that parks
    instead of blocking in ``select``) exactly where these plug in, instead of
    patching anyio, as FoundationDB's simulator implements the network
    interface. ``primitives`` make the mutexes and events shared between a
    worker thread and the loop (a call's claim and its end).
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


class _Loop:
    """The event loop a lock was acquired on, reachable from other threads."""

    __slots__ = ("__weakref__", "thread", "threads", "token")

    def __init__(self, threads: Threads) -> None:
        self.threads = threads
        self.token: EventLoopToken | None = None
        self.thread: int | None = None

    def bind(self) -> None:
        """Called on the loop: later calls from threads come back to this loop."""
        self.token = self.threads.token()
        self.thread = self.threads.ident()

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop and wait for it; from any thread but the loop's own."""
        token = self.token
        if token is None:
            return
        if self.threads.ident() == self.thread:
            fn(*args)  # already on the loop (nothing here sends signals from it, but never deadlock)
            return
        try:
            self.threads.call_on_loop(token, fn, *args)
        except RuntimeError as exc:  # the loop has finished (trio's RunFinishedError is one too)
            _log.debug("event loop gone; %r not run: %s", fn, exc)

    def await_receiver(self, receiver: Callable[..., Any], sender: Any, kwargs: dict[str, Any]) -> None:
        """Await ``receiver(sender, **kwargs)`` on the loop, from a thread; return when it is done."""
        token = self.token
        if token is None or self.threads.ident() == self.thread:
            _log.warning("async receiver %r not awaited: no event loop to await it on", receiver)
            return
        try:
            self.threads.await_on_loop(token, functools.partial(receiver, sender, **kwargs))
        except RuntimeError as exc:
            # asyncio: "Event loop is closed"; trio: RunFinishedError. A receiver's own error goes on.
            if type(exc).__name__ == "RunFinishedError" or "closed" in str(exc).lower():
                _log.debug("event loop gone; async receiver %r not awaited: %s", receiver, exc)
                return
            raise


class _Forward:
    """Sends one signal of the wrapped sync lock again with the AsyncHandoffLock as sender.

    Connected (weakly) to the sync lock; it reaches receivers connected to the
    async lock itself. Receivers connected for any sender already heard the
    sync lock's own send (their sender is ``lock.sync``) and are not called twice.
    """

    def __init__(self, owner: AsyncHandoffLock, signal: Any) -> None:
        self.owner = weakref.ref(owner)
        self.signal = signal

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        owner = self.owner()
        if owner is None:
            return
        owner._wake_waiters()
        anyone = list(self.signal.receivers_for(_NOBODY))
        mine = [receiver for receiver in self.signal.receivers_for(owner) if receiver not in anyone]
        signals.send_to(mine, self.signal, owner, kwargs)


class _Call(Generic[T]):
    """One blocking call of the sync lock, in a worker thread of its own, awaited from the loop."""

    __slots__ = ("_claim", "_claimed", "done", "error", "fn", "result", "threads")

    def __init__(self, fn: Callable[[], T], threads: Threads) -> None:
        self.fn, self.threads = fn, threads
        self.done = threads.primitives.event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self._claim = threads.primitives.mutex()
        self._claimed = False  # by the worker that runs it, or by its task dropping it: see _claim_first

    def _main(self) -> None:
        if self._claim_first():  # a call the task has given up before it started never starts
            self._run()

    def _run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the awaiting task
            self.error = exc
        finally:
            self.done.set()

    def _claim_first(self) -> bool:
        """True only for the first to claim the call, who decides what becomes of it: a thread that runs it
        (``_run``, now, and nobody else will), or its task after a cancellation, dropping it (it never
        started, and now never will)."""
        with self._claim:
            first, self._claimed = not self._claimed, True
            return first

    async def run(self, on_cancel: Callable[[], None] | None = None) -> T:
        """Run the call; if the awaiting task is cancelled, ``on_cancel()`` then wait for the thread, then re-raise.

        The thread is given up by anyio at once (``abandon_on_cancel``) so
        that the cancellation is seen while it still runs, and ``on_cancel``
        can ask it to stop; the task then waits for it, shielded, so nothing
        the call does outlives the task that made it.
        """
        try:
            await self.threads.run_sync(self._main)
        except BaseException:  # a cancellation (or KeyboardInterrupt): the thread may still run
            # anyio may give the job up before a worker thread took it (cancelled while waiting for
            # the limiter or the worker): then it never runs, and there is nothing to wait for.
            if self._claim_first():
                self.done.set()
            else:
                if on_cancel is not None and not self.done.is_set():
                    on_cancel()
                # Asked again while we wait: a cancel() that came before the thread's acquire had begun
                # is dropped (a stray cancel never spoils a later acquire), so it is repeated until it lands.
                await self.finish(on_cancel)
            raise
        return self.outcome()

    async def run_to_end(self) -> T:
        """Run the call to its end whatever cancellation arrives meanwhile; then re-raise that cancellation.

        For the calls that give the lock up (release, ``__aexit__``): one
        dropped because its task was cancelled would leave the lock held, and
        renewed in the background, by nobody. The call's own error, if it
        raised, goes out instead of the cancellation (as from ``__aexit__``).
        """
        interrupted: BaseException | None = None
        with anyio.CancelScope(shield=True):
            try:
                await self.threads.run_sync(self._main)
            except BaseException as exc:
                # asyncio's task.cancel() reaches into a shielded scope (so can a KeyboardInterrupt), and anyio
                # may then give the job up before a worker took it: the call runs in a thread of our own.
                interrupted = exc
                if self._claim_first():
                    self.threads.start(self._run, "handofflock-aio-call")
                await self.finish()
        result = self.outcome()
        if interrupted is not None:
            raise interrupted
        return result

    async def finish(self, again: Callable[[], None] | None = None) -> None:
        """Wait until the thread has ended, whatever cancellation arrives meanwhile (calling ``again`` each poll)."""
        with anyio.CancelScope(shield=True):
            while not self.done.is_set():
                if again is not None:
                    again()
                try:
                    await anyio.sleep(_POLL)
                except anyio.get_cancelled_exc_class():
                    # asyncio's task.cancel() (asyncio.timeout(), say) reaches into a shielded scope;
                    # the cancellation being handled is already on its way out: keep waiting.
                    continue

    def outcome(self) -> T:
        if self.error is not None:
            error, self.error = self.error, None  # no reference cycle through the traceback
            raise error
        return self.result  # type: ignore[return-value]


class _View(Forward[T]):
    """A read-only attribute of the async lock that is the sync lock's attribute of the same name."""

    def __init__(self) -> None:
        super().__init__("sync")

    def __set_name__(self, owner: type, name: str) -> None:
        super().__set_name__(owner, name)
        self.path = ["sync", name]

    def __set__(self, lock: object, value: object) -> None:
        raise AttributeError(f"{self.name} is read-only (it is the sync lock's)")


class AsyncHandoffLock:
    """The async twin of :class:`~handofflock.HandoffLock`: same protocol, storage and errors.

    >>> async with AsyncHandoffLock("gs://bucket/locks/train.json", ttl=60) as lock:
    ...     while not lock.release_requested:
    ...         await work_a_little()
    ...     await save_checkpoint(fence=lock.token)

    The keyword arguments are those of :class:`HandoffLock`, handed to it as
    they are, and so checked the same way in the constructor (no I/O there): a bad URL, a negative ttl
    or an impossible timing raise the same typed errors. Or wrap a lock you
    made: ``AsyncHandoffLock(lock=HandoffLock(...))``. ``threads`` is how it
    reaches worker threads and the loop (:class:`Threads`; a
    simulation passes its own).

    Works under asyncio and trio. Storage is only ever touched from worker
    threads and the library's scheduler thread, never on the event loop;
    renewals go on while the loop is blocked. Cancellation is an exit like any
    other: a cancelled :meth:`acquire` gives the waiter slot back, and a
    cancelled ``async with`` body still releases (or hands off).

    Signals (:mod:`handofflock.signals`) connected with ``sender=`` this lock
    receive it as sender; ``async def`` receivers are awaited on the event loop
    the lock was acquired on, others called in the thread that sends, as for the
    sync lock. Receivers connected for any sender receive :attr:`sync` as sender.
    """

    def __init__(
        self,
        url: Any = None,
        *,
        lock: HandoffLock | None = None,
        threads: Threads = ANYIO_THREADS,
        **options: Any,
    ) -> None:
        if lock is not None:
            if url is not None or options:
                raise ConfigurationError("pass either lock= or a URL and options, not both")
            if not isinstance(lock, HandoffLock):
                raise ConfigurationError(f"lock= must be a HandoffLock, got {type(lock).__name__}")
            self._sync = lock
        else:
            if url is None and "storage" not in options:
                raise ConfigurationError("AsyncHandoffLock needs a lock URL (or storage= and key=)")
            self._sync = HandoffLock(url, **options)
        self._threads = threads
        self._loop = _Loop(threads)
        self._waiters: set[anyio.Event] = set()
        self._forwarders = [_Forward(self, signal) for signal in _SIGNALS]
        for forward, signal in zip(self._forwarders, _SIGNALS, strict=True):
            signal.connect(forward, sender=self._sync, weak=True)
        signals.async_runners[self._sync] = signals.async_runners[self] = self._loop.await_receiver

    # ------------------------------------------------------------------ state (no I/O, no await)

    @property
    def sync(self) -> HandoffLock:
        """The :class:`HandoffLock` this lock drives (for its other attributes, and sync-only helpers)."""
        return self._sync

    # The sync lock's no-I/O views, read through: ``lock.ttl`` is ``lock.sync.ttl`` (see HandoffLock).
    url: _View[str] = _View()
    owner_id: _View[str] = _View()
    token: _View[int | None] = _View()
    timing: _View[Timing] = _View()
    ttl: _View[float] = _View()
    renew_interval: _View[float] = _View()
    min_hold: _View[float] = _View()
    is_held: _View[bool] = _View()
    healthy: _View[bool] = _View()
    release_requested: _View[bool] = _View()
    release_request: _View[ReleaseRequest | None] = _View()
    release_requests: _View[tuple[ReleaseRequest, ...]] = _View()
    #: Ask the holder to release, as a waiter would: :meth:`HandoffLock.request_release` (no I/O, not awaited).
    request_release: _View[Callable[..., ReleaseRequest]] = _View()

    # ------------------------------------------------------------------ acquire / release

    async def acquire(
        self, blocking: bool = True, timeout: float | None = None, *, request_release: bool = True, priority: int = 0
    ) -> AsyncAcquired | Literal[False]:
        """Take the lock, as :meth:`HandoffLock.acquire` does, without blocking the loop.

        ``request_release=False`` waits patiently (the holder is never asked);
        ``priority`` ranks requests for the single waiter slot.

        Returns a true :class:`AsyncAcquired` when held (else False): an async
        context manager that releases, so ``async with await lock.acquire(timeout=5):``
        works as filelock's idiom does (``async with lock:`` is the short form).

        Cancelling the awaiting task (a cancel scope, ``asyncio.timeout()``,
        ``anyio.fail_after()``, ``task.cancel()``) gives the waiter slot back
        before the cancellation goes on: the worker thread's acquire is
        cancelled through :meth:`HandoffLock.cancel` and awaited, shielded. If
        the lock was handed to us at that very moment, it is released (handed
        on) instead of being kept by a task that will never know it has it.
        If the store refuses that give-back (:class:`~handofflock.TransientStorageError`,
        or :class:`~handofflock.LockLost` for a handed lease), the slot or lease
        expires by itself. Cancelled by a cancel scope (trio, anyio's), that
        error is raised instead of the cancellation, as the sync acquire raises
        it (the scope cancels again at the next await); cancelled by asyncio's
        ``task.cancel()``, which comes only once, the cancellation goes on with
        the error as its ``__cause__`` (logged as a warning), so that no retry of
        a transient error swallows it.
        """
        self._loop.bind()
        sync = self._sync
        call: _Call[Acquired | Literal[False]] = _Call(
            functools.partial(sync.acquire, blocking, timeout, request_release=request_release, priority=priority),
            self._threads,
        )
        try:
            got = await call.run(on_cancel=sync.cancel)
        except BaseException as cancelled:
            if call.done.is_set() and call.error is None and call.result:  # got it as the task was cancelled
                try:
                    await _Call(sync.release, self._threads).run_to_end()  # hand it on, shielded
                except Exception as exc:
                    _log.warning("releasing %s after a cancelled acquire failed: %r", self.url, exc)
            error, call.error = call.error, None
            if isinstance(error, (TransientStorageError, LockLost)):
                # The store refused to take the slot (or a handed lease) back: it expires by itself. A cancel
                # scope's cancellation (trio, anyio) comes again at the task's next await: the caller hears the
                # refusal, as from the sync acquire. asyncio's task.cancel() comes once, and a retry of what is
                # transient would swallow it: the cancellation goes on, the refusal its cause, and said.
                if anyio.current_effective_deadline() == -math.inf:
                    raise error from cancelled
                _log.warning("cancelled acquire of %s: %s", self.url, error)
                raise cancelled from error
            raise
        if got and sync.release_on_signal:
            os_signals.arm(sync)  # the hold began in a worker thread; the loop's may be the main thread
        return AsyncAcquired(self) if got else False

    async def release(self) -> str | None:
        """Hand the lock to a live waiter, or mark it free (see :meth:`HandoffLock.release`).

        It runs to its end even if the task is cancelled, before or meanwhile
        (``finally: await lock.release()`` in a cancelled task releases); the
        cancellation is raised after it.
        """
        heir = await _Call(self._sync.release, self._threads).run_to_end()
        os_signals.settle()  # in the loop's thread: the release-on-signal handler goes if nothing is held
        await anyio.lowlevel.checkpoint_if_cancelled()
        return heir

    async def status(self) -> LockStatus:
        """Read the lock object now (one read, in a worker thread).

        A read changes nothing, so a cancelled ``status()`` returns at once and
        leaves the read to end in its thread.
        """
        return await self._threads.run_sync(self._sync.status)

    async def check(self) -> None:
        """Raise :class:`~handofflock.LockLost` unless the lock is held and healthy. No I/O."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._sync.check()

    async def wait_release_requested(self) -> ReleaseRequest:
        """Wait until someone asks for the lock; return the :class:`ReleaseRequest`.

        Raises :class:`~handofflock.LockLost` if the lock is lost (or released)
        meanwhile. Woken from the lock's notifier thread through the loop's
        token; the loop is never polled for it.
        """
        while True:
            request = self._sync.release_request
            # Read again after the flag: a request withdrawn (and another made) between two reads is not returned.
            if request is not None and self._sync.release_requested and self._sync.release_request is request:
                return request
            self._sync.check()
            event = anyio.Event()
            self._waiters.add(event)
            try:
                with anyio.move_on_after(min(_RECHECK, self._sync.renew_interval)):
                    await event.wait()
            finally:
                self._waiters.discard(event)

    def _wake_waiters(self) -> None:
        """From any thread: have every :meth:`wait_release_requested` look again."""
        if self._waiters:
            self._loop.call(self._set_waiters)

    def _set_waiters(self) -> None:
        for event in list(self._waiters):
            event.set()

    def steps(self, iterable: Iterable[T] | AsyncIterable[T]) -> AsyncSteps[T]:
        """``async for step in lock.steps(items)``: iterate until a release is requested.

        Mirrors :meth:`HandoffLock.steps`; ``items`` may be an iterable or an
        async iterable. No I/O per step.
        """
        return AsyncSteps(self, iterable)

    async def __aenter__(self) -> AsyncHandoffLock:
        await self.acquire()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Release (or hand off) however the block ends, a cancellation included: shielded."""
        await _Call(functools.partial(self._sync.__exit__, exc_type, exc, tb), self._threads).run_to_end()

    def __repr__(self) -> str:
        return f"<AsyncHandoffLock {self._sync!r}>"


class AsyncAcquired:
    """A successful :meth:`AsyncHandoffLock.acquire`: true, and an async context manager that releases:
    ``async with await lock.acquire(timeout=5):`` (see :class:`~handofflock.lock.handoff.Acquired`)."""

    __slots__ = ("lock",)

    def __init__(self, lock: AsyncHandoffLock) -> None:
        #: The lock that was acquired.
        self.lock = lock

    def __bool__(self) -> bool:
        return True

    async def __aenter__(self) -> AsyncHandoffLock:
        return self.lock

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.lock.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<AsyncAcquired {self.lock!r}>"


class AsyncSteps(Stepping[T]):
    """Iterate ``iterable`` while ``lock`` is held and nobody asked for it: ``async for`` over ``lock.steps()``.

    Before each item it calls ``check()`` (raises :class:`~handofflock.LockLost`
    when the lock is no longer safely held) and stops, without taking the item,
    once a release is requested. ``last``, ``count``, ``stopped`` and
    ``request`` mean what they mean on :class:`~handofflock.Steps`.
    """

    __slots__ = ("_async", "_items", "lock")

    def __init__(self, lock: AsyncHandoffLock, iterable: Iterable[T] | AsyncIterable[T]) -> None:
        super().__init__()
        self.lock = lock
        self._async = hasattr(iterable, "__aiter__")
        self._items: Iterator[T] | AsyncIterator[T] = (
            iterable.__aiter__() if self._async else iter(iterable)  # type: ignore[union-attr,arg-type]
        )

    def __aiter__(self) -> AsyncSteps[T]:
        return self

    async def __anext__(self) -> T:
        if self.stop_before_step(self.lock.sync):
            raise StopAsyncIteration
        if self._async:
            return self.took(await self._items.__anext__())  # type: ignore[union-attr]
        try:
            return self.took(next(self._items))  # type: ignore[arg-type]
        except StopIteration:
            raise StopAsyncIteration from None


__all__ = ["AsyncHandoffLock", "AsyncSteps"]
