"""A world made from one seed: parties contending for one lock on one simulated store, and the chaos around them.

From its seed a world draws its shape (:class:`Config`): 2 to 4 parties, a
GCS-like timing (ttl 5 s, the store's 1 s write spacing, 429s at GCS's rate,
slow reads of seconds) or a fast one, clock skew, and faults; in some, parties
of two ttls (an heir's slot asks for its own lease). A *gentle*
GCS-like world has only the faults an owner must survive (429s, slow reads
shorter than the timeouts), so an owner that loses its lock there is a
violation. Each party keeps doing something at random (acquire in every
mode, cancel, release from another thread, fenced writes, pauses, crashes);
a chaos thread pauses waiters, suspends hosts (the monotonic clock stands, the
wall clock jumps), kills parties at any moment, and starts twins (a second
process under a live party's stable owner id, in gentle worlds too: a twin is
another party, which waits for the lease and never takes it from the living). In some worlds every party has
a second lock under the same prefix in the same scheduler, so its waiter
checks are grouped into listings. In some the first party drives the async
lock from an event loop (:class:`~.hub.SimLoop`). A director aims at two moments:
an heir stopped as it is handed the lock, and an owner's job that ends over
an expired waiter slot. Every party runs the real scheduler loop.

Swarm testing (:class:`Swarm`, from dice of the seed's own): each world turns
fault classes on and off (503s, 429s at random or by GCS's real one-write-a-second
rule, lost replies, late commits, slow reads, slow writes that may be cut at
their timeout and land later) and lets each party draw settings of its own:
ttl, waiter ttl, write spacing, priority, patience, a clock offset at the edge
of the skew, a clock that drifts or is stepped, a host with ``CLOCK_BOOTTIME``
(which counts a suspend). Some worlds start with a record an older version
wrote (no version, no instance, no token).

Aims (:attr:`World.aims`, dice of their own): some blocking acquires may not wait for the slot
(``wait_for_slot=False``, no timeout: they take the lock, register, or are told the lock is
contended at once), one in ten of the asking ones (half, in a third of the worlds); in gentle worlds whose
reads do not stall, the holder's next two writes on the lock now and then meet a 429 each; elsewhere one
release in twenty meets 429s past its deadline (it raises, and is retried in the background); and an async
party asks at the priority the swarm drew for it.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from ...aio import AsyncHandoffLock
from ...core.errors import (
    AcquireCancelled,
    AlreadyAcquired,
    ConfigurationError,
    HandoffLockError,
    LockLost,
    LockTimeout,
    TransientStorageError,
)
from ...core.timing import Timing
from ...fencing import FencedObject, StaleToken
from ...lock import events as signals
from ...lock.handoff import Acquired, HandoffLock
from ...lock.scheduler import Scheduler
from ...storage import MemoryStorage
from .checker import EXPECTED, FENCE_KEY, KEY, Checker, Event, Rules, Seen, Try
from .faults import GCS_WRITES_PER_SECOND, Faults, Net, SimStore
from .hub import MONO0, WALL0, Hub, Proc, SimClock, SimLoop, SimThreads, Violation, sim_primitives
from .parties import Party


@dataclass(frozen=True)
class Swarm:
    """What a seed varies beyond its world's shape: per-party settings (each party draws its own where a field
    is on) and clock faults. The fault classes it turns on and off are in the world's :class:`Faults`."""

    ttls: bool = False  # each party's ttl is 1, 1.5 or 2 times the world's
    waiter_ttls: bool = False  # each party's waiter ttl is half, once or 1.5 times its ttl
    pacing: bool = False  # each party's write spacing is its own
    priorities: bool = False  # each party asks at a priority of its own (or a random one each time)
    patience: bool = False  # each party always asks the holder, never asks, or asks now and then
    offsets: bool = False  # clock offsets at the edges of the skew, not spread within it
    drift: float = 0.0  # each party's clock runs fast or slow by up to this rate
    steps: bool = False  # wall clocks stepped (an NTP step) to another offset within the skew
    boottime: float = 0.0  # the share of parties whose host has CLOCK_BOOTTIME (a suspend counts there)
    old_record: str | None = None  # a record an older version wrote, in the store at the start (see OLD_RECORDS)


#: Records written by older versions, read by the lock as they are: the original four fields (no version,
#: no token), and a version 1 record without instances. ``{ttl}`` is the world's ttl; times are from the start.
OLD_RECORDS: dict[str, dict[str, Any]] = {
    "free": {"ownerId": None, "expiresAt": None, "waitingOwnerId": None, "waiterExpiresAt": None},
    "expired": {"ownerId": "old-host", "expiresAt": -60.0, "waitingOwnerId": None, "waiterExpiresAt": None},
    "live": {"ownerId": "old-host", "expiresAt": "ttl", "waitingOwnerId": None, "waiterExpiresAt": None},
    "ours": {"ownerId": "p1", "expiresAt": "ttl", "waitingOwnerId": None, "waiterExpiresAt": None},
    "waiter": {"ownerId": "old-host", "expiresAt": -1.0, "waitingOwnerId": "p2", "waiterExpiresAt": "ttl"},
    "no-instance": {
        "version": 1, "ownerId": "old-host", "expiresAt": "ttl", "waitingOwnerId": "old-waiter",
        "waiterExpiresAt": "ttl", "ttl": "ttl", "token": 7,
    },
}  # fmt: skip


@dataclass
class Config:
    seconds: float = 60.0
    parties: int = 3
    ttl: float = 2.0
    spacing: float = 0.0
    skew: float = 0.5
    gentle: bool = False
    grouped: bool = False
    suspends: bool = False
    asynchronous: bool = False  # the first party drives an AsyncHandoffLock from an event loop
    min_hold: float = 0.0  # every party's: a waiter's request waits for it (0: handoffs at once)
    #: Each party's ttl is ``ttl`` or ``ttl * ttl_spread``, drawn as it starts (its waiter slot asks for its own).
    ttl_spread: float = 1.0
    faults: Faults = field(default_factory=Faults)
    swarm: Swarm = field(default_factory=Swarm)


def draw_config(r: random.Random) -> Config:
    gcs_like = r.random() < 0.35
    gentle = gcs_like and r.random() < 0.4
    # A gentle world uses a ttl design.md says survives two 429s in a row and a 3 s stalled read (ttl 8 once
    # the lease-first pacing of branch limits is in; ttl 10 before it).
    ttl = 10.0 if gentle else 5.0 if gcs_like else r.choice([1.5, 2.0, 3.0])
    if gentle:
        faults = Faults(gcs_rate=0.5, slow_read=0.1, slow_read_max=2.0, max_latency=r.choice([0.005, 0.05, 0.2]))
    else:
        faults = Faults(
            fail=r.choice([0.0, 0.02, 0.08]),
            throttle=r.choice([0.0, 0.0, 0.01]),
            gcs_rate=0.3 if gcs_like else 0.0,
            lost_reply=r.choice([0.0, 0.02, 0.08]),
            slow_read=0.05 if gcs_like else 0.0,
            slow_read_max=2.0,
            max_latency=r.choice([0.005, 0.05, 0.2]),
        )
    return Config(
        seconds=r.choice([20.0, 40.0, 60.0]),
        parties=r.choice([2, 3, 3, 4]),
        ttl=ttl,
        spacing=1.0 if gcs_like else 0.0,
        skew=r.choice([0.0, 0.2, 0.5]),
        gentle=gentle,
        grouped=r.random() < 0.4,
        suspends=not gentle and r.random() < 0.3,
        asynchronous=r.random() < 0.3,
        faults=faults,
        min_hold=r.choice([0.0, 0.0, ttl / 2, 2 * ttl]),  # drawn last: the draws above replay as before
    )


def with_late_commits(config: Config, seed: int) -> Config:
    """Late commits in half the worlds that are not gentle (an owner need not survive a write that lands
    seconds after its request was cut off), drawn from dice of their own: the rest of a world as before."""
    r = random.Random(f"late-config-{seed}")
    if config.gentle or r.random() < 0.5:
        return config
    return replace(config, faults=replace(config.faults, late_commit=r.choice([0.01, 0.03])))


def with_ttl_spread(config: Config, seed: int) -> Config:
    """Parties of two ttls in half the worlds that are not gentle (an heir must be handed the lease its slot
    asked for, not its owner's), drawn from dice of their own: the rest of a world as before."""
    r = random.Random(f"ttl-config-{seed}")
    if config.gentle or r.random() < 0.5:
        return config
    return replace(config, ttl_spread=r.choice([1.5, 2.0]))


def old_record(kind: str, ttl: float) -> bytes:
    """The record of :data:`OLD_RECORDS` named ``kind``, its times made absolute (``"ttl"``: ttl from the start)."""
    doc: dict[str, Any] = {}
    for key, value in OLD_RECORDS[kind].items():
        if key in ("expiresAt", "waiterExpiresAt") and value is not None:
            value = WALL0 + (ttl if value == "ttl" else value)
        doc[key] = ttl if value == "ttl" else value
    return json.dumps(doc).encode()


def with_swarm(config: Config, seed: int) -> Config:
    """Swarm testing, from dice of their own: each fault class on or off, and which settings each party
    draws for itself. A gentle world keeps only the faults an owner must survive, and its parties the
    ttl and write spacing design.md promises survival with."""
    r = random.Random(f"swarm-{seed}")

    def on() -> bool:
        return r.random() < 0.5

    f, c = config.faults, config
    if c.gentle:
        faults = replace(f, gcs_rate=f.gcs_rate if on() else 0.0, slow_read=f.slow_read if on() else 0.0)
    else:
        faults = replace(
            f,
            fail=r.choice([0.02, 0.08]) if on() else 0.0,
            throttle=0.01 if on() else 0.0,
            lost_reply=r.choice([0.02, 0.08]) if on() else 0.0,
            late_commit=r.choice([0.01, 0.03]) if on() else 0.0,
            slow_read=0.05 if on() else 0.0,
            slow_write=r.choice([0.02, 0.08]) if on() else 0.0,
            # GCS's real rule: every write within a second of the object's last one may meet a 429.
            burst_window=1.0 / GCS_WRITES_PER_SECOND if f.gcs_rate and on() else f.burst_window,
        )
    # A slow read is cut off at its request's timeout, as a real client's is (slow reads of seconds come to
    # fast worlds too, whose requests may take a third of a second).
    faults = replace(faults, cut_reads=True, slow_read_max=2.0 if faults.slow_read else faults.slow_read_max)
    skewed = c.skew > 0
    swarm = Swarm(
        ttls=not c.gentle and on(),
        waiter_ttls=on(),
        pacing=not c.gentle and on(),
        priorities=on(),
        patience=on(),
        offsets=skewed and on(),
        drift=r.choice([1e-4, 1e-3]) if skewed and on() else 0.0,
        steps=skewed and on(),
        boottime=r.choice([0.5, 1.0]) if on() else 0.0,
        old_record=r.choice(sorted(OLD_RECORDS)) if r.random() < 0.3 else None,
    )
    if c.gentle and faults.gcs_rate and on():  # drawn last: the draws above stay as they were
        # GCS's real rule in a gentle world too: an owner there must survive it (two 429s in a row).
        faults = replace(faults, burst_window=1.0 / GCS_WRITES_PER_SECOND)
    return replace(c, faults=faults, swarm=swarm, ttl_spread=2.0 if swarm.ttls else c.ttl_spread)


class World:
    def __init__(
        self,
        seed: int,
        config: Config | None = None,
        *,
        late_commits: bool = True,
        ttl_spread: bool = True,
        swarm: bool = True,
        aims: bool = True,
        by_protocol: bool = True,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        random.seed(seed)  # the library's backoff jitter draws from the module's generator
        self.config = c = config or draw_config(self.rng)
        if config is None and late_commits:
            self.config = c = with_late_commits(c, seed)
        if config is None and late_commits and ttl_spread:
            self.config = c = with_ttl_spread(c, seed)
        if config is None and late_commits and ttl_spread and swarm:
            self.config = c = with_swarm(c, seed)
        self.ttls = random.Random(f"ttl-{seed}")  # each party's ttl: dice of their own
        self.swarm = random.Random(f"swarm-party-{seed}")  # each party's swarm settings: dice of their own
        self.slot_dice = random.Random(f"slot-{seed}")  # which acquires may not wait for the slot, and their cancels
        # What a world aims at (once the swarm's choices are made; off, a seed replays its world as before):
        # the share of asking acquires that may not wait for the slot, and 429s aimed at a gentle world's holder.
        self.aims = config is None and late_commits and ttl_spread and swarm and aims
        self.no_slot_wait = self.slot_dice.choice((0.1, 0.1, 0.5)) if self.aims else 0.0
        self.aim = random.Random(f"aim-{seed}")  # when a gentle world's holder meets two 429s in a row
        self.release_aim = random.Random(f"release-aim-{seed}")  # which releases meet 429s past their deadline
        self.hub = Hub(self.rng)
        self.parties: list[Party] = []
        f = c.faults
        wci = c.ttl / 5
        rules = Rules(
            ttl=c.ttl * c.ttl_spread,
            skew=c.skew,
            waiter_check_interval=wci,
            gentle=c.gentle,
            spacing=c.spacing,
        )
        self.checker = Checker(self.hub, rules, self.parties, by_protocol=by_protocol)
        self.backend = MemoryStorage(f"sim-{seed}")
        self.net = Net(self.hub, self.rng, f, self.backend, self.checker.note, self.checker.counts)
        self.net.late.seed(f"late-{seed}")
        self.hub.on_step = self.checker.check
        self._ids = 0

    # ------------------------------------------------------------------ parties

    def new_party(self, owner_id: str | None = None, twin_of: str | None = None) -> Party:
        self._ids += 1
        c, hub = self.config, self.hub
        proc = Proc(f"p{self._ids}")
        clock = SimClock(hub, proc, self.rng.uniform(-c.skew / 2, c.skew / 2))
        owner = owner_id or proc.name
        ttl = c.ttl * self.ttls.choice((1.0, c.ttl_spread)) if c.ttl_spread != 1.0 else c.ttl
        timing: dict[str, Any] = dict(
            ttl=ttl, waiter_check_interval=c.ttl / 5, waiter_poll_interval=c.ttl / 10, max_clock_skew=c.skew,
            min_hold=c.min_hold, min_write_interval=c.spacing,
        )  # fmt: skip
        settings = self._swarm_party(clock, timing)
        store = SimStore(self.net, None, min_write_interval=timing.pop("min_write_interval"))
        prims = sim_primitives(hub, proc)
        # The real scheduler: its loop and its I/O pool are greenlets of this process, started as it adds a lock.
        sched = Scheduler(clock, name=proc.name, primitives=prims)

        def make(key: str) -> HandoffLock:
            return HandoffLock(
                "memory://sim", storage=store, key=key, owner_id=owner, clock=clock, scheduler=sched,
                primitives=prims, **timing,
            )  # fmt: skip

        lock = make(KEY)
        fence = FencedObject(store, FENCE_KEY, writer_id=owner, clock=clock, timeout=c.ttl)
        side = make(f"locks/side-{proc.name}.json") if c.grouped else None
        party = Party(proc, owner, clock, store, sched, lock, fence, side=side, twin_of=twin_of)
        store.party = party
        party.slow_receiver = self.rng.choice([0.0, 0.0, 0.0, c.ttl])
        party.asks, party.priority = settings
        self.parties.append(party)

        def checkpoint(sender: object, **kw: object) -> None:  # a slow receiver: a checkpoint before letting go
            party.clock.sleep(party.slow_receiver)

        if party.slow_receiver:
            signals.on_release_requested.connect(checkpoint, sender=lock, weak=False)
        if c.asynchronous and self._ids == 1:
            hub.spawn(f"{proc.name}-main", lambda: self._async_main(party), proc)
        else:
            hub.spawn(f"{proc.name}-main", lambda: self._actor(party), proc)
        if side is not None:
            hub.spawn(f"{proc.name}-side", lambda: self._side_actor(party), proc)
        drawn = f" ({clock.describe()}, {timing}, asks {party.asks}, priority {party.priority})"
        hub.note(
            f"{proc.name} starts as {owner}" + (f", twin of {twin_of}" if twin_of else "")
            + (drawn if c.swarm != Swarm() else "")
        )  # fmt: skip
        return party

    def _swarm_party(self, clock: SimClock, timing: dict[str, Any]) -> tuple[float | None, int | None]:
        """Draw the settings of the party's own that the world's :class:`Swarm` turns on: its timing (into
        ``timing``), its clock's faults; returns how often it asks the holder and at what priority (None:
        as the actor draws)."""
        s, r, c = self.config.swarm, self.swarm, self.config
        if s.ttls:
            timing["ttl"] = c.ttl * r.choice((1.0, 1.5, 2.0))
        if s.waiter_ttls:
            timing["waiter_ttl"] = timing["ttl"] * r.choice((0.5, 1.0, 1.5))
        if s.pacing:
            spacing = r.choice((0.0, 0.5, 1.0))
            try:  # a spacing the party's ttl allows (see Timing), else the world's
                Timing.build(**{**timing, "min_write_interval": spacing})
                timing["min_write_interval"] = spacing
            except ConfigurationError:
                pass
        if s.offsets:
            clock.offset = r.choice((-1.0, 1.0)) * c.skew / 2
        if s.drift:
            clock.drift(r.uniform(-s.drift, s.drift), c.skew)
            self.checker.counts["drifting_clocks"] += 1
        if s.steps:
            for _ in range(r.choice((1, 2, 3))):
                clock.step_at(self.hub.now + r.uniform(0.0, c.seconds), r.uniform(-c.skew / 2, c.skew / 2))
            self.checker.counts["clock_steps"] += len(clock.steps)
        clock.boottime_runs = r.random() < s.boottime
        asks = r.choice((0.0, 0.7, 1.0)) if s.patience else None
        priority = r.choice((-1, 0, 1, 5, None)) if s.priorities else None
        return asks, priority

    def _side_actor(self, party: Party) -> None:
        """A second lock under the same prefix: held on and off, so the scheduler's waiter checks form a group."""
        side, r = party.side, self.rng
        assert side is not None
        while party.alive and self.net.chaos:
            self.hub.park(self.hub.now + r.uniform(0.5, 3.0) * self.config.ttl)
            try:
                if side.is_held:
                    side.release()
                else:
                    side.acquire(blocking=False)
            except (*EXPECTED, AlreadyAcquired):  # AlreadyAcquired: still releasing, the API says no
                pass
            except HandoffLockError as exc:
                if "already" not in str(exc):
                    raise Violation(f"{party.name}'s side lock raised {exc!r}") from exc

    def _actor(self, party: Party) -> None:
        r, hub, lock, c = self.rng, self.hub, party.lock, self.config
        ttl = c.ttl
        while self.net.chaos and party.alive:
            choice = r.random()
            if lock.is_held:
                if choice < 0.03 and not c.gentle:
                    self.crash(party)
                    return
                if choice < 0.06 and not c.gentle:
                    party.proc.paused_until = hub.now + r.uniform(0.5, 2.5) * ttl  # a GC pause, a SIGSTOP
                    self.checker.counts["holder_pauses"] += 1
                    hub.note(f"{party.name} pauses until {party.proc.paused_until - MONO0:.2f}")
                    hub.park(party.proc.paused_until)
                    continue
                if choice < 0.5 and lock.healthy:  # a fenced write
                    try:
                        party.fence.write({"by": party.name, "at": hub.now}, token=lock.token)
                    except StaleToken:
                        self.checker.counts["stale_writes_refused"] += 1
                    except TransientStorageError:
                        pass
                if not lock.release_requested:
                    party.letting_go_at = math.inf
                elif party.letting_go_at == math.inf:  # asked: sometimes a checkpoint first, while the waiter may die
                    party.letting_go_at = hub.now + (r.uniform(0.5, 2.0) * ttl if r.random() < 0.3 else 0.0)
                if hub.now >= party.letting_go_at or party.finish or (choice > 0.85 and hub.now >= party.busy_until):
                    party.finish, party.letting_go_at = False, math.inf
                    self.timed(party, "release", lambda: lock.release())
                hub.park(hub.now + r.uniform(0.0, ttl / 4))
                # A release under way in another of its threads (the releaser) ends the hold by our hand too.
                if not lock.is_held and party.notes[-1:] != ["released"] and not party.releasing:
                    self.lost(party, "the lock was lost while held")
                party.notes[:] = []
                continue
            if choice < 0.02:
                self.crash(party)
                return
            self.acquire_once(party)
            # Now and then a party has other work for a while: with fewer contenders a stale slot
            # is not taken over at once, and an owner may come to hand off over one that expired.
            rest = r.uniform(1.0, 4.0) * ttl if r.random() < 0.25 else r.uniform(0.0, ttl / 2)
            hub.park(hub.now + rest)

    def _async_main(self, party: Party) -> None:
        """An async party's main thread: an event loop running :meth:`_async_actor` until the chaos stops."""
        loop = party.loop = SimLoop(self.hub, party.proc, party.clock)
        alock = AsyncHandoffLock(lock=party.lock, threads=SimThreads(self.hub, party.proc))
        try:
            loop.run_until_complete(self._async_actor(party, alock))
        finally:
            if not loop.is_running():
                loop.close()

    async def _async_actor(self, party: Party, alock: AsyncHandoffLock) -> None:
        """Acquire (some acquires cancelled by a deadline on the task), hold a while, release: an async program."""
        r, hub, checker, ttl = self.rng, self.hub, self.checker, self.config.ttl
        while self.net.chaos and party.alive:
            if alock.is_held:
                await anyio.sleep(r.uniform(0.0, ttl / 4))
                if alock.release_requested or r.random() < 0.3:
                    party.notes.append("released")
                    try:
                        hub.note(f"{party.name} async release -> {await alock.release()!r}")
                    except (*EXPECTED, AlreadyAcquired) as exc:
                        hub.note(f"{party.name} async release raised {type(exc).__name__}")
                elif not alock.is_held:
                    self.lost(party, "the async lock was lost while held")
                continue
            cancel_after = r.uniform(0.05, 2.0) * ttl if r.random() < 0.5 else math.inf
            timeout = r.uniform(0.5, 4.0) * ttl
            result: object = None
            party.in_acquire = True
            try:
                with anyio.move_on_after(cancel_after) as scope:
                    asks = r.random() < 0.8 if party.asks is None else self.swarm.random() < party.asks
                    # The swarm's, drawn as the party began (an aim: off, a seed replays its world as before).
                    rank = 0 if party.priority is None or not self.aims else party.priority
                    checker.note(Event(hub.now, party, "begin", KEY, result=Try(rank, asks, True, party.clock.time())))
                    got = await alock.acquire(timeout=timeout, request_release=asks, priority=rank)
                    result = bool(got)
                if scope.cancelled_caught:
                    result = AcquireCancelled("the task was cancelled")
                    checker.counts["async_cancels"] += 1
            except AlreadyAcquired:  # still releasing (a release being retried): the API says no
                checker.note(Event(hub.now, party, "void", KEY))
                await anyio.sleep(r.uniform(0.0, ttl / 2))
                continue
            except EXPECTED as exc:
                result = exc
            finally:
                party.in_acquire = False
                party.left_wait_at = hub.now
            checker.counts["async"] += 1
            hub.note(f"{party.name} async acquire -> {result!r}")
            self.acquire_ended(party, result)
            await anyio.sleep(r.uniform(0.0, ttl / 2))

    def acquire_once(self, party: Party) -> None:
        r, hub, lock, ttl = self.rng, self.hub, party.lock, self.config.ttl
        mode = r.random()
        timeout = r.uniform(0.5, 4.0) * ttl
        if mode < 0.2:
            op, bound = (lambda: lock.acquire(blocking=False)), None  # at once: its requests' deadline
        else:
            # A patient request never asks the holder (it finishes on its own time), so its slot may
            # outlive a waiter that stopped or died while the owner is about to hand off.
            asks, rank = r.random() < 0.7, r.choice([0, 0, 0, 1])
            if party.asks is not None:  # the swarm's: how often this party asks, and at what priority
                asks = self.swarm.random() < party.asks
            if party.priority is not None:
                rank = party.priority
            elif self.config.swarm.priorities:
                rank = self.swarm.choice((-1, 0, 1, 2))
            op = lambda: lock.acquire(timeout=timeout, request_release=asks, priority=rank)  # noqa: E731
            bound = timeout
            tried = Try(rank, asks, slot_wait=True, since=party.clock.time())
            if asks and self.slot_dice.random() < self.no_slot_wait:
                # A try that may not wait for the slot (wait_for_slot=False, no timeout): it takes the lock,
                # registers, or is told the lock is contended at once; cancelled, again and again, if it waits.
                op, bound = (lambda: lock.acquire(request_release=True, priority=rank)), 2.5 * ttl
                tried = replace(tried, slot_wait=False)
                lock.wait_for_slot = False
                hub.spawn(f"{party.name}-canceller", lambda: self._cancel_until_done(party), party.proc)
            elif mode < 0.35:
                hub.spawn(f"{party.name}-canceller", lambda: self._later(party, lambda: lock.cancel()), party.proc)
            elif mode < 0.45:
                release = lambda: self.timed(party, "release", lambda: lock.release())  # noqa: E731
                hub.spawn(f"{party.name}-releaser", lambda: self._later(party, release), party.proc)
            # Judged while it runs: within its bound (as timed() judges it as it returns), and once another
            # thread cancels it, within what an operation that does not wait may take.
            limit, cancelled = self.op_limit(lock, bound), self.op_limit(lock, 0.0)
            tried = replace(tried, began=hub.now, frozen=party.proc.frozen_until(), bound=limit, cancel_bound=cancelled)
            self.checker.note(Event(hub.now, party, "begin", KEY, result=tried))
        party.in_acquire = True
        try:
            result = self.timed(party, "acquire", op, bound=bound)
        finally:
            party.in_acquire = False
            party.left_wait_at = hub.now
            lock.wait_for_slot = None
        if lock.is_held and r.random() < 0.3:  # a long job: it lets go on its own only after a while
            party.busy_until = hub.now + r.uniform(1.0, 4.0) * ttl
        if isinstance(result, HandoffLockError) and not isinstance(result, EXPECTED):
            self.checker.note(Event(hub.now, party, "void", KEY))
            return  # refused at once ("already releasing"): this acquire never ran
        self.acquire_ended(party, result)

    def _cancel_until_done(self, party: Party) -> None:
        """Cancel the party's acquire after a while, again until it ends (a cancel before it runs does nothing)."""
        self.hub.park(self.hub.now + self.slot_dice.uniform(0.5, 2.0) * self.config.ttl)
        while party.alive and party.in_acquire:
            self.checker.note(Event(self.hub.now, party, "interrupt", KEY))
            party.lock.cancel()
            self.hub.park(self.hub.now + self.config.ttl / 10)

    def acquire_ended(self, party: Party, result: object) -> None:
        """An acquire (sync or async) ended with ``result``: into the history, with what the party shows now."""
        gave_up = result.__cause__ if isinstance(result, LockTimeout) else result
        if isinstance(gave_up, LockLost) or (isinstance(gave_up, TransientStorageError) and self.store_failed(party)):
            # Documented: a store failing past the deadline (the error itself, or the cause of the LockTimeout
            # when the time ran out in the store, as ``timed`` says for a sync acquire), or a handed lease too
            # short to renew, may leave the slot or the handed lease behind; they expire by themselves.
            self.left_behind(party)
        self.checker.note(Event(self.hub.now, party, "acquire", KEY, result=result, seen=Seen.of(party)))

    def lost(self, party: Party, why: str) -> None:
        """``party`` found its lock gone while it held it (not by its own release)."""
        self.checker.note(Event(self.hub.now, party, "lost", KEY, why, seen=Seen.of(party)))

    def store_failed(self, party: Party) -> bool:
        """Whether the store failed ``party``'s last request on the lock: refused it, cut it off, or has not answered
        it. An operation that gives up with a store error after its last request was answered gave up on its own
        (a wait for its write spacing, say): what the store did not do is no excuse for what it leaves."""
        for e in reversed(self.checker.history):
            if e.party is party and e.key == KEY and e.what in ("request", "reply"):
                return e.what == "request" or not e.detail.endswith(": ok")
        return True

    def left_behind(self, party: Party) -> None:
        """``party``'s acquire ended as the lock documents may leave its slot or a handed lease behind: each
        was written (or its late commit sent) by now, so it ends within its ttl and the skew from now."""
        t = party.lock.timing
        until = self.checker.true_wall() + max(t.ttl, t.waiter_ttl) + t.max_clock_skew
        party.left_behind_until = max(party.left_behind_until, until)

    def _later(self, party: Party, fn: Callable[[], object]) -> None:
        self.hub.park(self.hub.now + self.rng.uniform(0.0, 2.0) * self.config.ttl)
        if party.alive:
            if party.in_acquire:  # perhaps a later acquire than the one it was meant for
                self.checker.note(Event(self.hub.now, party, "interrupt", KEY))
            fn()

    def timed(self, party: Party, what: str, op: Callable[[], Any], bound: float | None = 0.0) -> Any:
        """Run ``op``; documented errors are outcomes, anything else is a violation. Checks the op's time bound
        (``None``: one that never waits, as ``acquire(blocking=False)``: ``renew_deadline`` and the give-up
        budget, well below a waiting operation's bound; a non-blocking acquire that polls until its requests'
        deadline still fits in it)."""
        lock, hub = party.lock, self.hub
        started, frozen_before = hub.now, party.proc.frozen_until()
        idle, party.idle = party.idle, False
        if what == "release":
            party.notes.append("released")  # however it ends, the hold ended by our hand
            party.releasing += 1
            if self.aims and not self.config.gentle and lock.is_held and self.release_aim.random() < 0.05:
                # Its writes on the lock meet 429s past the release's deadline: it raises, and is retried in the
                # background until it lands (or the lease runs out).
                self.net.refuse[party] = max(self.net.refuse[party], self.release_aim.choice((4, 6, 8)))
                self.checker.counts["aimed_release_429s"] += 1
        try:
            result = op()
            if what == "release":
                # Said again as it returns: a release from another thread may wait for the I/O mutex
                # while the actor clears its notes, and end the hold only after (not a loss: ours).
                party.notes.append("released")
                # Returned, not raised, with no acquire or other release of this instance under way: the hold
                # is over and nothing is retried in the background, so the next acquire runs.
                party.idle = party.releasing == 1 and not party.in_acquire and not lock.is_held
            if what == "release" or (what == "acquire" and result):
                party.release_failed_at = math.inf
            hub.note(f"{party.name} {what} -> {result!r}")
        except EXPECTED as exc:
            hub.note(f"{party.name} {what} raised {type(exc).__name__}")
            result = exc
            gave_up = exc.__cause__ if isinstance(exc, LockTimeout) else exc
            if isinstance(gave_up, TransientStorageError) and (what != "acquire" or self.store_failed(party)):
                # Documented: a store failing as the slot is given back (the error itself, or the cause of
                # the LockTimeout when the time ran out in the store) leaves it; it ends within waiter_ttl.
                self.left_behind(party)
            if what == "release" and isinstance(exc, TransientStorageError):
                party.release_failed_at = min(party.release_failed_at, hub.now)
        except AlreadyAcquired as exc:  # a concurrent acquire/release of the same instance: the API says no
            if idle and what == "acquire":
                raise Violation(f"{party.name}'s acquire after its release() returned was refused: {exc}") from exc
            self._still_releasing(party, what, exc)
            return exc
        except HandoffLockError as exc:
            if "already" in str(exc):  # as above, from the releases that say so in words
                if idle and what == "acquire":
                    raise Violation(f"{party.name}'s acquire after its release() returned was refused: {exc}") from exc
                self._still_releasing(party, what, exc)
                return exc
            raise Violation(f"{party.name} {what} raised {exc!r}") from exc
        finally:
            if what == "release":
                party.releasing -= 1
        if party.proc.frozen_until() > started or party.proc.frozen_until() != frozen_before:
            return result  # a pause stretches any operation
        limit = self.op_limit(lock, bound)
        if hub.now - started > limit:
            raise Violation(f"{party.name} {what} took {hub.now - started:.2f} s (bound {limit:.2f} s)")
        return result

    def _still_releasing(self, party: Party, what: str, exc: Exception) -> None:
        """An acquire refused as still releasing, long after a release of the party's raised a store error: that
        release is retried in the background only until the lease has run out (``ttl`` from its last renewal, a
        retry's own time and slack on top), then the lock is idle. Not judged if the process stood still since,
        or a release of its is under way."""
        t, since = party.lock.timing, party.release_failed_at
        late = self.hub.now - since - (t.ttl + t.max_clock_skew + t.renew_deadline + 5.0)
        if what == "acquire" and late > 0 and not party.releasing and party.proc.frozen_until() < since:
            raise Violation(
                f"{party.name}'s acquire was refused ({exc}) {self.hub.now - since:.2f} s after its release raised a "
                "store error: the release is retried only until the lease runs out"
            )

    def op_limit(self, lock: HandoffLock, bound: float | None) -> float:
        """How long an operation of ``lock`` may take (see :meth:`timed`)."""
        if bound is None:
            limit = lock.renew_deadline + lock.give_up_budget
        else:
            limit = bound + lock.give_up_budget + lock.renew_deadline + max(lock.renew_deadline, 5.0) + 2.0
        if self.config.faults.slow_read and (bound is not None or not self.config.faults.cut_reads):
            limit += 2 * self.config.faults.slow_read_max
        return limit

    def crash(self, party: Party) -> None:
        self.hub.note(f"{party.name} crashes (held={party.lock.is_held})")
        party.proc.crashed = True
        if self.rng.random() < 0.5 and self.net.chaos:  # a restart, sometimes under the same stable id
            self.new_party(party.owner_id if self.rng.random() < 0.5 else None)

    # ------------------------------------------------------------------ chaos from outside the parties

    def _chaos(self) -> None:
        r, hub, c = self.rng, self.hub, self.config
        while self.net.chaos:
            hub.park(hub.now + r.uniform(0.5, 2.0) * c.ttl)
            live = [p for p in self.parties if p.alive and hub.now >= p.proc.frozen_until()]
            if not live:
                continue
            p, what = r.choice(live), r.random()
            record = self.checker.record
            slot = record.waiter.instance if record is not None and record.waiter is not None else None
            named = [q for q in live if q.in_acquire and q.lock.instance == slot]
            if named and r.random() < 0.3:
                # Aim at the registered waiter: stopped, it is an heir that reads its handoff late, or a
                # slot that expires while a long job's owner is about to hand off; killed, a slot left behind.
                p, what = named[0], r.choice([0.0, 0.65])
            if what < 0.35 and p.in_acquire:
                p.proc.paused_until = hub.now + r.uniform(0.3, 2.0) * c.ttl
                self.checker.counts["waiter_pauses"] += 1
                hub.note(f"{p.name} pauses while waiting, until {p.proc.paused_until - MONO0:.2f}")
            elif what < 0.5 and c.suspends and p.lock.is_held:
                span = r.uniform(0.5, 3.0) * c.ttl
                p.proc.suspended_until, p.proc.suspended_for = hub.now + span, p.proc.suspended_for + span
                self.checker.counts["suspends"] += 1
                self.checker.counts["boottime_suspends"] += p.clock.boottime_runs
                hub.note(f"{p.name} is suspended for {span:.2f} s (its monotonic clock stands)")
            elif what < 0.6 and p.twin_of is None and len(self.parties) < 12:
                self.checker.counts["twins"] += 1
                self.new_party(p.owner_id, twin_of=p.name)
            elif what < 0.7 and not (c.gentle and p.lock.is_held):
                self.crash(p)

    def _director(self) -> None:
        """Aims at two dangerous moments. When the owner has been asked and is about to let go, the waiter
        stops (an heir that reads its handoff late must count its lease from the handoff's write). When
        the record names a waiter whose slot has ended (it stopped or died), the owner's job ends now (an
        owner about to hand off over an expired slot must free the lock instead)."""
        hub, c, seen, aimed = self.hub, self.config, None, None
        while self.net.chaos:
            hub.park(hub.now + c.ttl / 10)
            if c.gentle and not c.faults.slow_read and self.aims and self.aim.random() < 0.1:
                self._two_429s()
            rec = self.checker.record
            if rec is None or rec.waiter is None or rec is seen:
                continue
            waiter = rec.waiter
            if self.checker.true_wall() < waiter.expires_at + c.skew + 2 * c.faults.max_latency + c.spacing + 0.5:
                if rec is not aimed and any(q.alive and q.letting_go_at < math.inf for q in self.parties):
                    aimed = rec
                    heir = [q for q in self.parties if q.alive and q.in_acquire and q.lock.instance == waiter.instance]
                    if heir and hub.now >= heir[0].proc.frozen_until() and self.rng.random() < 0.5:
                        heir[0].proc.paused_until = hub.now + self.rng.uniform(0.6, 2.0) * c.ttl
                        self.checker.counts["waiter_pauses"] += 1
                        hub.note(f"{heir[0].name} pauses as it is about to be handed the lock")
                continue
            seen = rec
            if self.rng.random() < 0.5:
                continue
            for q in self.parties:
                if q.alive and rec.owner is not None and q.lock.instance == rec.owner.instance and q.lock.is_held:
                    q.finish = True
                    self.checker.counts["stale_slot_releases"] += 1
                    hub.note(f"{q.name}'s job ends over the expired slot of {waiter.id}")

    def _two_429s(self) -> None:
        """The holder's next two writes on the lock (its renewal as it falls due, and that renewal's retry) meet
        a 429 each: the most a gentle world's owner is promised to survive (design.md), in a world whose reads
        do not stall (a stalled read is promised apart, not on top of two 429s), and only once the spacing earlier
        429s widened has relaxed back to the store's own (the promise is made from there)."""
        held = [
            q for q in self.parties if q.alive and q.lock.is_held and not self.net.refuse[q] and self._gate_relaxed(q)
        ]
        if held:
            self.net.refuse[held[0]] = 2
            self.checker.counts["aimed_429s"] += 1
            self.hub.note(f"{held[0].name}'s next two writes on the lock will meet a 429")

    @staticmethod
    def _gate_relaxed(party: Party) -> bool:
        gate = party.lock._io.gate()
        return gate.interval <= gate.min_interval

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        if self.config.swarm.old_record is not None:
            data = old_record(self.config.swarm.old_record, self.config.ttl)
            self.backend.write(KEY, data, if_generation_match=0)
            self.checker.start_with(data)
            self.checker.counts["old_records"] += 1
            self.hub.note(f"the store holds an old record: {data.decode()}")
        for _ in range(self.config.parties):
            self.new_party()
        self.hub.spawn("chaos", self._chaos)
        self.hub.spawn("director", self._director)
        self.hub.run(MONO0 + self.config.seconds)
        self.settle()
        self.checker.check()  # the history's last entries, judged at the end

    def settle(self) -> None:
        """Liveness: chaos stops; the holder is gone; a newcomer must get the lock within ttl + skew (+ slack)."""
        self.net.chaos = False
        for p in self.parties:
            p.proc.crashed = True
        self.hub.run(self.hub.now + 0.5)
        probe = self.new_party()
        probe.lock.wait_for_slot = True  # a crashed waiter's slot may still be live: wait it out
        probe.in_acquire = True
        c = self.config
        longest = c.ttl * c.ttl_spread
        slot = max([longest] + [p.lock.timing.waiter_ttl for p in self.parties])
        bound = longest + c.skew + slot + 2 * c.skew + 5.0  # a lease, a waiter slot, slack
        box: dict[str, object] = {}

        def acquire() -> None:
            try:
                box["ok"] = probe.lock.acquire(timeout=bound)
            except HandoffLockError as exc:
                box["ok"] = exc
            finally:
                probe.in_acquire = False  # a holder from here on, judged as one

        self.hub.tasks = [t for t in self.hub.tasks if t.proc is probe.proc]  # its scheduler, if it has started
        self.hub.spawn("probe", acquire, probe.proc)
        self.hub.run(self.hub.now + bound + 10)
        if not isinstance(box.get("ok"), Acquired):  # acquire() returns an Acquired (== True)
            raise Violation(f"the lock was not free within {bound:.1f} s of its holder going: {box.get('ok')!r}")

    def close(self) -> None:
        self.hub.end()
        for p in self.parties:
            if p.loop is not None and not p.loop.is_closed() and not p.loop.is_running():
                p.loop.close()
            for sig in (signals.acquired, signals.on_release_requested):
                for receiver in list(sig.receivers_for(p.lock)):
                    sig.disconnect(receiver, sender=p.lock)
        MemoryStorage.forget(self.backend.name)
