"""The simulated machine: greenlets run one at a time on simulated time, chosen by seed.

Every thread of every simulated process (its caller, its scheduler, its
notifier, a canceller) is a greenlet on one OS thread. They give way only where
a real thread could be overtaken by another process: a clock wait or sleep, a
storage request, a contended mutex. When none is runnable the hub moves time to
the next deadline. The parts a lock is built from are named after what they
replace: :class:`SimClock` (a :class:`~handofflock.core.clock.Clock`),
:class:`SimMutex` and :class:`SimEvent` (``threading``'s),
:func:`sim_primitives` (a :class:`~handofflock.lock.primitives.Primitives`),
:class:`SimLoop` (an asyncio event loop on a process's monotonic clock, whose
``select`` parks until its next timer or a call from another thread) and
:class:`SimThreads` (the async lock's :class:`~handofflock.aio.Threads`:
a worker thread is a greenlet of the process, and a call back to the loop is a
callback scheduled on it, waited for by parking). anyio runs on a SimLoop as
on any asyncio loop. greenlet is a test dependency, imported here only.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from asyncio import events as asyncio_events
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import greenlet
from anyio.lowlevel import EventLoopToken

from ...aio import Threads
from ...core.clock import Clock
from ...lock.primitives import Primitives

T = TypeVar("T")

MONO0, WALL0 = 1000.0, 1_700_000_000.0


class Violation(AssertionError):
    """An invariant did not hold."""


@dataclass(eq=False, slots=True)
class Proc:
    """A simulated process: while it is crashed, paused or suspended none of its threads run."""

    name: str
    crashed: bool = False
    paused_until: float = -math.inf
    suspended_until: float = -math.inf
    suspended_for: float = 0.0  # how long its monotonic clock stood still (host suspends)

    def frozen_until(self) -> float:
        return max(self.paused_until, self.suspended_until)


@dataclass(eq=False, slots=True)
class Task:
    name: str
    proc: Proc | None
    glet: Any = None
    deadline: float = 0.0
    event: threading.Event | None = None
    done: bool = False


@dataclass
class Hub:
    """Runs greenlets one at a time on simulated time, choosing among the runnable ones by seed."""

    rng: random.Random
    now: float = MONO0
    tasks: list[Task] = field(default_factory=list)
    current: Task | None = None
    ran: Proc | None = None  # while :attr:`on_step` runs: the process whose thread took the step (None: the hub's)
    steps: int = 0
    trace: list[str] = field(default_factory=list)
    keep_trace: int = 400
    on_step: Callable[[], None] = lambda: None
    died: tuple[str, BaseException] | None = None
    main: Any = field(default_factory=greenlet.getcurrent)
    #: Steps at one instant after which the run is a livelock (a loop that never lets time move on).
    max_steps_at_once: int = 20_000
    spawned: list[Task] = field(default_factory=list)  # every task, kept until :meth:`end` unwinds it
    ending: bool = False

    def spawn(self, name: str, fn: Callable[[], object], proc: Proc | None = None) -> Task:
        task = Task(name, proc, deadline=self.now)

        def run() -> None:
            try:
                fn()
            except greenlet.GreenletExit:
                pass
            except BaseException as exc:  # a thread that dies is reported, never silent
                self.died = (task.name, exc)
            finally:
                task.done = True

        task.glet = greenlet.greenlet(run, parent=self.main)
        self.tasks.append(task)
        self.spawned.append(task)
        return task

    def end(self) -> None:
        """Unwind every task still suspended, here and now, instead of whenever the garbage collector gets to
        it: a greenlet collected later would unwind in the middle of another run (an event loop's ``finally``
        clears the thread's running loop, whoever's it is by then)."""
        self.ending = True
        for task in self.spawned:
            if not task.glet.dead:
                task.glet.throw(greenlet.GreenletExit)
                asyncio_events._set_running_loop(None)
        self.spawned.clear()

    def park(self, deadline: float, event: threading.Event | None = None) -> None:
        """Give way until ``deadline`` (simulated) or until ``event`` is set."""
        task = self.current
        if self.ending:
            raise greenlet.GreenletExit
        if task is None:
            raise RuntimeError("park() outside a simulated thread")
        task.deadline, task.event = deadline, event
        # asyncio's running loop belongs to an OS thread, and every greenlet shares one: each simulated
        # thread keeps its own across the switch, as a real thread would (an async party runs a loop).
        loop = asyncio_events._get_running_loop()
        if loop is not None:
            asyncio_events._set_running_loop(None)
        try:
            self.main.switch()
        finally:
            if loop is not None:
                asyncio_events._set_running_loop(loop)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now - MONO0:9.3f} {text}")
        if len(self.trace) > self.keep_trace:
            del self.trace[: self.keep_trace // 4]

    def run(self, until: float) -> None:
        at_once: dict[str, int] = {}
        while True:
            # One pass: find the runnable tasks (not frozen; due, or woken by their event), in the tasks' order
            # (the seed's choice replays), and drop those that ended or whose process crashed.
            now, ready, nxt, gone = self.now, [], math.inf, False
            for t in self.tasks:
                proc, wake = t.proc, t.deadline
                if t.done or (proc is not None and proc.crashed):
                    gone = True
                    continue
                if proc is not None and (now < proc.paused_until or now < proc.suspended_until):
                    wake = max(wake, proc.paused_until, proc.suspended_until)
                # ``_flag``: what ``is_set()`` returns, for a threading.Event and a SimEvent alike.
                elif wake <= now or (t.event is not None and t.event._flag):  # type: ignore[attr-defined]
                    ready.append(t)
                if wake < nxt:
                    nxt = wake
            if gone:
                self.tasks = [t for t in self.tasks if not (t.done or (t.proc is not None and t.proc.crashed))]
            if ready:
                task = self.rng.choice(ready)
                self.current = task
                task.glet.switch()
                self.current = None
                self.steps += 1
                count = at_once[task.name] = at_once.get(task.name, 0) + 1
                if count > self.max_steps_at_once:
                    raise Violation(
                        f"livelock: {task.name} ran {count} times at {self.now - MONO0:.3f} s "
                        "without letting time move on (a loop whose wait is 0, again and again)"
                    )
                if self.died is not None:
                    name, exc = self.died
                    if isinstance(exc, Violation):
                        raise exc
                    raise Violation(f"thread {name} died: {exc!r}") from exc
                self.ran = task.proc
                self.on_step()
                self.ran = None
                continue
            if nxt > until:
                self.now = max(self.now, until)
                return
            if nxt > self.now:
                at_once.clear()
            self.now = max(self.now, nxt)


class SimEvent(threading.Event):
    """A ``threading.Event`` whose ``wait`` gives way to the hub instead of blocking the OS thread."""

    def __init__(self, hub: Hub) -> None:
        super().__init__()
        self.hub = hub

    # No OS thread ever waits on the condition inside: the flag alone, without its lock.
    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self.is_set():
            return True
        self.hub.park(math.inf if timeout is None else self.hub.now + timeout, self)
        return self.is_set()


class SimMutex:
    """A mutex for greenlets (``threading.Lock``'s shape): a contender gives way until it is free."""

    def __init__(self, hub: Hub) -> None:
        self._free = SimEvent(hub)
        self._free.set()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        while not self._free.is_set():
            if not blocking:
                return False
            self._free.wait()
        self._free.clear()
        return True

    def release(self) -> None:
        self._free.set()

    def locked(self) -> bool:
        return not self._free.is_set()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class SimClock(Clock):
    """The hub's time for one process: wall time off by ``offset`` (skew); monotonic time stands during a suspend.

    A swarm may give it clock faults: a ``rate`` (its oscillator runs fast or slow: every reading drifts,
    the wall clock only within ``bound`` of true time, as NTP keeps it), wall-clock steps (NTP setting it
    to another offset at a given time), and ``CLOCK_BOOTTIME`` (``boottime_runs``: boot time counts a
    suspend; without it ``boottime()`` is monotonic time, as on a host without that clock).
    """

    def __init__(self, hub: Hub, proc: Proc, offset: float) -> None:
        super().__init__(offset)
        self.hub, self.proc = hub, proc
        self.rate, self.bound = 0.0, math.inf
        self.steps: list[tuple[float, float]] = []  # (hub time, the wall offset from then on), in order
        self.boottime_runs = False

    def drift(self, rate: float, bound: float) -> None:
        """Run fast (``rate`` > 0) or slow, the wall clock staying within ``bound`` / 2 of true time."""
        self.rate, self.bound = rate, bound / 2

    def step_at(self, at: float, offset: float) -> None:
        """At hub time ``at``, the wall clock is set to ``offset`` from true time (an NTP step)."""
        self.steps = sorted([*self.steps, (at, offset)])

    def describe(self) -> str:
        steps = ", ".join(f"{o:+.3f} at {at - MONO0:.1f}" for at, o in self.steps)
        return (
            f"clock {self.offset:+.3f}" + (f" drifting {self.rate:+.1e}" if self.rate else "")
            + (f", stepped {steps}" if steps else "") + (", boottime" if self.boottime_runs else "")
        )  # fmt: skip

    def time(self) -> float:
        now = self.hub.now
        if not self.rate and not self.steps:
            return WALL0 + (now - MONO0) + self.offset
        offset, since = self.offset, MONO0
        for at, to in self.steps:
            if at > now:
                break
            offset, since = to, at
        offset = min(max(offset + self.rate * (now - since), -self.bound), self.bound)
        return WALL0 + (now - MONO0) + offset

    def _mono_at(self, now: float) -> float:
        if not self.rate:
            return now - self.proc.suspended_for
        return MONO0 + (now - MONO0 - self.proc.suspended_for) * (1 + self.rate)

    def monotonic(self) -> float:
        if not self.rate:  # _mono_at's first case, without the call: the clock read most often
            return self.hub.now - self.proc.suspended_for
        return self._mono_at(self.hub.now)

    def boottime(self) -> float:
        if not self.boottime_runs:
            return self.monotonic()
        return MONO0 + (self.hub.now - MONO0) * (1 + self.rate)

    @property
    def timebase(self) -> object:
        return self.proc

    def _until(self, seconds: float) -> float:
        """The hub time at which this clock's monotonic time has moved on by ``seconds`` (> 0).

        At least one representable step later: a wait shorter than the float spacing at ``now`` would
        otherwise end at the instant it began, and monotonic() would read the same (a real wait always
        lets some time pass).
        """
        target, until = self.monotonic() + seconds, self.hub.now + seconds / (1 + self.rate)
        while self._mono_at(until) < target or until <= self.hub.now:
            until = math.nextafter(until, math.inf)
        return until

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        self.hub.park(math.inf if timeout is None else self._until(timeout), event)
        return event.is_set()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.hub.park(self._until(seconds))


class SimPool:
    """The scheduler's I/O pool (``ThreadPoolExecutor``'s shape): up to ``workers`` greenlets, started as jobs
    need them, taking jobs in order. A job's exception is not kept in a future nobody reads: it ends the run."""

    def __init__(self, hub: Hub, proc: Proc, workers: int, name: str) -> None:
        self.hub, self.proc, self.workers, self.name = hub, proc, workers, name
        self.jobs: deque[Callable[[], None]] = deque()
        self.started = self.idle = 0
        self.ready = SimEvent(hub)
        self.closed = False

    def submit(self, fn: Callable[[], None], /) -> object:
        self.jobs.append(fn)
        self.ready.set()
        # As ThreadPoolExecutor: a new worker unless an idle one is left for this job (idle ones
        # woken by earlier submits have not taken theirs yet).
        if len(self.jobs) > self.idle and self.started < self.workers:
            self.started += 1
            self.hub.spawn(f"{self.name}_{self.started}", self._work, self.proc)
        return None

    def _work(self) -> None:
        while not self.closed:
            if not self.jobs:
                self.idle += 1
                self.ready.clear()
                self.ready.wait()
                self.idle -= 1
                continue
            self.jobs.popleft()()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.closed = True
        if cancel_futures:
            self.jobs.clear()
        self.ready.set()


def sim_primitives(hub: Hub, proc: Proc) -> Primitives:
    """The lock's primitives for one simulated process: mutexes and events give way to the hub, threads and
    the scheduler's pool workers are greenlets, signals are left alone (every greenlet is the main thread),
    and planning costs no time.

    Thread-locals stay ``threading.local``: every greenlet shares one OS thread.
    """

    def start_thread(target: Callable[[], None], name: str) -> None:
        hub.spawn(name, target, proc)

    return Primitives(
        mutex=lambda: SimMutex(hub),
        event=lambda: SimEvent(hub),
        start_thread=start_thread,
        pool=lambda workers, name: SimPool(hub, proc, workers, name),
        leave_signals=lambda: None,
        perf_counter=lambda: 0.0,
    )


#: ``select(0)`` calls in a row after which a loop that never parks is a livelock.
_MAX_SPINS = 100_000


class SimLoop(asyncio.BaseEventLoop):
    """An asyncio event loop on one simulated process's monotonic clock; it is its own selector."""

    def __init__(self, hub: Hub, proc: Proc, clock: SimClock) -> None:
        super().__init__()
        self.hub, self.proc, self.clock = hub, proc, clock
        self.wake = SimEvent(hub)
        self.spins = 0
        self._selector = self

    def select(self, timeout: float | None = None) -> list[Any]:
        """What the loop waits in: parks until its next timer (``timeout``) or a threadsafe call."""
        if self.wake.is_set() or timeout == 0:
            self.spins += 1
            if self.spins > _MAX_SPINS:
                raise Violation(f"livelock: the event loop of {self.proc.name} ran {_MAX_SPINS} rounds without waiting")
        else:
            self.spins = 0
            self.clock.wait(self.wake, timeout)
        self.wake.clear()
        return []

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
