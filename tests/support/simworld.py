"""Simulated worlds for lock tests on the memory store: time is simulated, nothing sleeps.

``world`` (the fixture, :func:`new_world`): one :class:`FakeClock` that advances itself while
the test's own thread waits, and two hand-run schedulers. Locks made with ``world.lock(owner)``
run their background duties on every tick; ``frozen=True`` makes a process that never gets to
run them (paused, or starved). For a test that drives one lock at a time from its own thread.

``sim`` (the fixture, :class:`Sim`): several processes, each with its own threads, on the
simulation's hub (:mod:`handofflock.testing.sim.hub`): every thread is a greenlet, run one at a
time on simulated time, chosen by seed. For a test where parties wait at once (an owner and two
waiters, each in its ``acquire()``).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handofflock import AsyncHandoffLock, FakeClock, HandoffLock, LockRecord, Scheduler
from handofflock.storage import MemoryStorage
from handofflock.testing.sim.hub import MONO0, WALL0, Hub, Proc, SimClock, SimLoop, SimThreads, sim_primitives

KEY = "locks/job.json"
_names = itertools.count()


# --------------------------------------------------------------------------- one thread: the world


@dataclass
class World:
    store: MemoryStorage
    clock: FakeClock
    sched: Scheduler  # the live processes' scheduler, run on every tick
    frozen: Scheduler  # the scheduler of processes that never get to run their duties

    def lock(self, owner: str, *, frozen: bool = False, **kwargs) -> HandoffLock:
        return HandoffLock(
            "memory://unused", storage=self.store, key=KEY, owner_id=owner, clock=self.clock,
            scheduler=self.frozen if frozen else self.sched, **kwargs,
        )  # fmt: skip

    def record(self) -> LockRecord | None:
        found = self.store.read(KEY)
        return None if found is None else LockRecord.decode(found[0], key=KEY)

    def generation(self) -> int:
        found = self.store.read(KEY)
        return 0 if found is None else found[1]

    @property
    def writes(self) -> int:
        return self.store.calls["write"]

    def timed_writes(self) -> list[float]:
        """From now on, the (simulated) monotonic time of every write call, in order."""
        times: list[float] = []
        self.store.faults.before("write", lambda op, key: times.append(self.clock.monotonic()))
        return times


def new_world() -> World:
    clock = FakeClock(step=0.25)
    sched = Scheduler(clock, autostart=False)
    clock.on_tick.append(sched.run_pending)
    return World(MemoryStorage(f"faults-{next(_names)}"), clock, sched, Scheduler(clock, autostart=False))


# --------------------------------------------------------------------------- many threads: the sim


@dataclass
class Call:
    """A call running in a simulated thread of its own: its result or its exception once ``done``."""

    done: bool = False
    result: Any = None
    error: BaseException | None = None

    def __bool__(self) -> bool:
        """Whether the call has ended (returned or raised)."""
        return self.done


@dataclass
class Sim:
    """Processes on one simulated time: each lock made by :meth:`lock` is a process of its own, with its
    own clock, scheduler thread and notifier, all greenlets on the hub. The test's own code runs between
    hub runs (nothing of the world moves meanwhile); calls that wait go through :meth:`start` or :meth:`call`.
    """

    seed: int = 0
    store: MemoryStorage = field(default_factory=lambda: MemoryStorage(f"sim-{next(_names)}"))

    def __post_init__(self) -> None:
        self.hub = Hub(random.Random(self.seed))
        random.seed(self.seed)  # the library's backoff jitter draws from the module's generator
        self.locks: list[HandoffLock] = []
        self._processes: dict[int, tuple[Proc, SimClock, Any, Scheduler]] = {}

    def lock(self, owner: str, *, key: str = KEY, paused: bool = False, beside: HandoffLock | None = None, **kwargs):
        """A lock in a process of its own, or in the process of the lock ``beside`` (its clock, threads and
        scheduler). ``paused``: a process whose threads never run (its duties never happen) while the
        test's calls to it still do (a stopped process, as a test sees it)."""
        if beside is not None:
            proc, clock, prims, sched = self._processes[id(beside)]
        else:
            proc = Proc(f"{owner}-{len(self.locks)}")
            clock = SimClock(self.hub, proc, 0.0)
            prims = sim_primitives(self.hub, proc)
            sched = Scheduler(clock, name=owner, primitives=prims)
        if paused:
            proc.paused_until = math.inf
        lock = HandoffLock(
            "memory://sim", storage=self.store, key=key, owner_id=owner, clock=clock, scheduler=sched,
            primitives=prims, **kwargs,
        )  # fmt: skip
        self.locks.append(lock)
        self._processes[id(lock)] = (proc, clock, prims, sched)
        return lock

    def aio(self, owner: str, *, beside: AsyncHandoffLock | None = None, **kwargs) -> AsyncHandoffLock:
        """An async lock in a process of its own (or in the process of ``beside``), its worker threads
        greenlets of that process; run the coroutines that use it with :meth:`run_async`."""
        lock = self.lock(owner, beside=None if beside is None else beside.sync, **kwargs)
        return AsyncHandoffLock(lock=lock, threads=SimThreads(self.hub, self._processes[id(lock)][0]))

    def run_async(self, main: Callable[[], Any], on: AsyncHandoffLock, limit: float = 120.0) -> Any:
        """Run ``await main()`` on an asyncio event loop on simulated time, the main thread of ``on``'s process,
        until it returns (its result) or raises (raised here). A blocking call in it (:meth:`sleep`) blocks the loop."""
        proc, clock, _, _ = self._processes[id(on.sync)]
        loop = SimLoop(self.hub, proc, clock)
        call = Call()

        def run() -> None:
            try:
                call.result = loop.run_until_complete(main())
            except Exception as exc:
                call.error = exc
            finally:
                call.done = True
                loop.close()

        self.hub.spawn(f"{proc.name}-loop", run, proc)
        self.run_until(lambda: call.done, limit, what="the event loop's main to return")
        if call.error is not None:
            raise call.error
        return call.result

    def time(self) -> float:
        """Wall time, as a process without skew reads it."""
        return WALL0 + (self.hub.now - MONO0)

    def monotonic(self) -> float:
        return self.hub.now

    def start(self, fn: Callable[[], Any], name: str = "call") -> Call:
        """Run ``fn`` in a new simulated thread (it starts at the next hub run)."""
        call = Call()

        def run() -> None:
            try:
                call.result = fn()
            except Exception as exc:
                call.error = exc
            finally:
                call.done = True

        self.hub.spawn(name, run)
        return call

    def call(self, fn: Callable[[], Any], limit: float = 120.0) -> Any:
        """Run ``fn`` in a simulated thread until it returns (its result) or raises (raised here)."""
        call = self.start(fn)
        self.run_until(lambda: call.done, limit, what="the call to return")
        if call.error is not None:
            raise call.error
        return call.result

    def run_for(self, seconds: float) -> None:
        self.hub.run(self.hub.now + seconds)

    def run_until(self, cond: Callable[[], Any], limit: float = 60.0, what: str = "condition", step: float = 0.01):
        """Let simulated time pass, ``step`` at a time, until ``cond()`` is true; at most ``limit`` seconds."""
        end = self.hub.now + limit
        while True:
            value = cond()
            if value:
                return value
            if self.hub.now >= end:
                raise AssertionError(f"{what} did not become true within {limit} simulated seconds")
            self.hub.run(min(self.hub.now + step, end))

    def record(self, key: str = KEY) -> LockRecord | None:
        return self.read(key)[0]

    def read(self, key: str = KEY) -> tuple[LockRecord | None, int]:
        """The record and its generation (``(None, 0)`` when there is no object)."""
        found = self.store.read(key)
        return (None, 0) if found is None else (LockRecord.decode(found[0], key=key), found[1])

    def update(self, key: str = KEY, **changes: Any) -> int:
        """Change fields of the record behind the locks' backs, as another process would (one conditional
        write, between two hub runs: nothing else writes meanwhile). Returns the new generation."""
        found = self.store.read(key)
        assert found is not None, f"no record at {key}"
        record = LockRecord.decode(found[0], key=key).replace(**changes)
        return self.store.write(key, record.encode(), if_generation_match=found[1])

    def sleep(self, seconds: float) -> None:
        """In a simulated thread: let ``seconds`` of simulated time pass (others run meanwhile)."""
        self.hub.park(self.hub.now + seconds)

    def end(self) -> None:
        """Stop every lock's waits and give back what is held (nothing is left for exit), then unwind every thread."""
        for lock in self.locks:
            lock.cancel()
            if lock.is_held:
                self.start(lock.release)
        self.run_for(1.0)
        self.hub.end()
