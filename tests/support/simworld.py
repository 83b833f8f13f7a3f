"""A simulated world for lock tests on the memory store: one object, a SimClock, and schedulers.

The ``world`` fixture (tests/conftest.py) gives each test a fresh one. Locks made with
``world.lock(owner)`` run their background duties on every tick of the simulated clock;
``frozen=True`` makes a process that never gets to run them (paused, or starved).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from simclock import SimClock

from handofflock import HandoffLock, LockRecord, Scheduler
from handofflock.storage import MemoryStorage

KEY = "locks/job.json"
_names = itertools.count()


# --------------------------------------------------------------------------- the world


@dataclass
class World:
    store: MemoryStorage
    clock: SimClock
    sched: Scheduler  # the live processes' scheduler, run on every tick
    frozen: Scheduler  # the scheduler of processes that never get to run their duties

    def lock(self, owner: str, *, frozen: bool = False, **kwargs) -> HandoffLock:
        return HandoffLock(
            "memory://unused", storage=self.store, key=KEY, owner_id=owner, clock=self.clock,
            scheduler=self.frozen if frozen else self.sched, **kwargs,
        )

    def record(self) -> LockRecord | None:
        found = self.store.read(KEY)
        return None if found is None else LockRecord.decode(found[0], key=KEY)

    def generation(self) -> int:
        found = self.store.read(KEY)
        return 0 if found is None else found[1]

    @property
    def writes(self) -> int:
        return self.store.calls["write"]


def new_world() -> World:
    clock = SimClock()
    sched = Scheduler(clock, autostart=False)
    clock.on_tick.append(sched.run_pending)
    return World(MemoryStorage(f"faults-{next(_names)}"), clock, sched, Scheduler(clock, autostart=False))



class TimedStore(MemoryStorage):
    """Remembers the (simulated) time of every write call."""

    def __init__(self, name: str, clock: SimClock) -> None:
        super().__init__(name)
        self.clock = clock
        self.write_times: list[float] = []

    def write(self, key, data, **kw):
        self.write_times.append(self.clock.monotonic())
        return super().write(key, data, **kw)
