"""A party: one simulated process with its own lock, clock, store connection and scheduler."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...fencing import FencedObject
from ...lock.handoff import HandoffLock
from ...lock.scheduler import Scheduler
from .faults import SimStore
from .hub import Proc, SimClock, SimLoop


@dataclass(eq=False, slots=True)
class Party:
    """One process: a lock instance on the shared key (and maybe a side lock beside it in one scheduler)."""

    proc: Proc
    owner_id: str
    clock: SimClock
    store: SimStore
    scheduler: Scheduler
    lock: HandoffLock
    fence: FencedObject
    side: HandoffLock | None = None  # another lock under the same prefix, in the same scheduler
    twin_of: str | None = None  # the party whose stable owner id it shares, alive at the same time
    slow_receiver: float = 0.0
    in_acquire: bool = False
    left_wait_at: float = -math.inf
    #: Until when (true wall time) a slot or lease its last acquire left behind may stand: that acquire ended
    #: in an error the lock documents as leaving it (the store failed past the give-up budget, a handed
    #: lease too short to renew), and what it left expires by itself within its ttl.
    left_behind_until: float = -math.inf
    busy_until: float = -math.inf  # a long job: no release of its own accord before this
    finish: bool = False  # the job ends: release at the next look
    letting_go_at: float = math.inf  # asked to release: when its checkpoint is done
    loop: SimLoop | None = None  # an async party's event loop
    notes: list[str] = field(default_factory=list)
    releasing: int = 0  # releases of this party under way, in any of its threads
    idle: bool = False  # its last operation was a release() that returned, none other under way: the lock is idle
    release_failed_at: float = math.inf  # when its last release() raised a store error (retried in the background)
    asks: float | None = None  # the swarm's: how often its acquires ask the holder (None: as the actor draws)
    priority: int | None = None  # the swarm's: the priority it asks at (None: as the actor draws)

    @property
    def name(self) -> str:
        return self.proc.name

    @property
    def alive(self) -> bool:
        return not self.proc.crashed
