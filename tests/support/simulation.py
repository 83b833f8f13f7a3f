"""A deterministic simulation of the lock: real HandoffLocks, one seed, every interleaving reproducible.

In the spirit of FoundationDB's simulator and TigerBeetle's VOPR. A *world*
is made from one seed: a shared in-memory store, and parties (each a process:
its own ``HandoffLock``, scheduler, clock offset and store connection) that
acquire (blocking, non-blocking, timed), cancel, release, crash, pause past
their lease, restart with the same or a new owner id, write a fenced object,
and sometimes take their time in an ``on_release_requested`` receiver.

Everything runs on one OS thread as greenlets. Each party's threads (its
caller, its scheduler, its notifier) are greenlets; they give way only where a
real thread could be overtaken: a clock wait or sleep, a storage request (sent,
applied at one instant, answered later), a contended mutex. A seeded hub picks
which runnable greenlet goes next and moves the simulated clock to the next
deadline when none is runnable. So a seed replays exactly.

The store injects faults: requests that fail (503, 429), writes applied whose
reply is lost, replies that arrive late (a read that shows an old state by the
time it arrives), and each party's wall clock is off by up to half the skew
allowance. After every step the invariants are checked (see
:class:`Checker`); a violation stops the run with the seed and a trace.

What it cannot explore: real network timing, real threads' preemption inside
a mutex-free region, the real GCS client. The cross-process and emulator
suites cover those.

The lock is built from the world's own parts, passed in where the real ones
plug in: its clock (:class:`SimClock`), its store (:class:`SimStore`), its
scheduler (run by hand) and its primitives (:func:`_primitives`: a mutex and
an event that give way to the hub, a thread start that spawns a greenlet).
Nothing is patched into a lock after it is made; what the checker reads of
a lock's internals goes through the few read-only helpers after
:func:`_primitives`.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import greenlet

from handofflock import (
    AcquireCancelled,
    HandoffLock,
    HandoffLockError,
    LockContended,
    LockLost,
    LockNotHeld,
    LockRecord,
    LockTimeout,
    Scheduler,
    StaleToken,
    TransientStorageError,
    signals,
)
from handofflock.core import protocol
from handofflock.core.clock import Clock
from handofflock.fencing import FencedObject, decode_fence
from handofflock.lock import lease as lease_module
from handofflock.lock.handoff import HandoffLock as _Lock
from handofflock.lock.lease import Lease
from handofflock.lock.primitives import Primitives
from handofflock.storage import MemoryStorage

KEY = "locks/sim.json"
FENCE_KEY = "locks/fenced.json"
MONO0, WALL0 = 1000.0, 1_700_000_000.0

# --------------------------------------------------------------------------- the hub


class Violation(AssertionError):
    """An invariant did not hold."""


@dataclass(eq=False)
class Task:
    name: str
    party: "Party | None"
    glet: greenlet.greenlet
    deadline: float = 0.0
    event: threading.Event | None = None
    done: bool = False


class Hub:
    """Runs greenlets one at a time on simulated time, choosing among the runnable ones by seed."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = MONO0
        self.tasks: list[Task] = []
        self.current: Task | None = None
        self.main = greenlet.getcurrent()
        self.steps = 0
        self.trace: list[str] = []
        self.on_step: Callable[[], None] = lambda: None

    def spawn(self, name: str, fn: Callable[[], Any], party: "Party | None" = None) -> Task:
        task = Task(name, party, None, deadline=self.now)  # type: ignore[arg-type]

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
        return task

    died: tuple[str, BaseException] | None = None

    def park(self, deadline: float, event: threading.Event | None = None) -> None:
        """Give way until ``deadline`` (simulated) or until ``event`` is set."""
        task = self.current
        assert task is not None, "park() outside a task"
        task.deadline, task.event = deadline, event
        self.main.switch()

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now - MONO0:9.3f} {text}")
        if len(self.trace) > 400:
            del self.trace[:100]

    def _runnable(self, task: Task) -> bool:
        if task.done or (task.party is not None and (task.party.crashed or self.now < task.party.paused_until)):
            return False
        return task.deadline <= self.now or (task.event is not None and task.event.is_set())

    def run(self, until: float) -> None:
        while True:
            self.tasks = [t for t in self.tasks if not t.done and not (t.party is not None and t.party.crashed)]
            ready = [t for t in self.tasks if self._runnable(t)]
            if ready:
                task = self.rng.choice(ready)
                self.current = task
                task.glet.switch()
                self.current = None
                self.steps += 1
                if self.died is not None:
                    name, exc = self.died
                    if isinstance(exc, Violation):  # an invariant checked inside a party's thread
                        raise exc
                    raise Violation(f"thread {name} died: {exc!r}") from exc
                self.on_step()
                continue
            wakes = []
            for t in self.tasks:
                if t.party is not None and self.now < t.party.paused_until:
                    wakes.append(max(t.deadline, t.party.paused_until))
                else:
                    wakes.append(t.deadline)
            nxt = min(wakes, default=math.inf)
            if nxt > until:
                self.now = max(self.now, until)
                return
            self.now = max(self.now, nxt)


class SimEvent(threading.Event):
    """A ``threading.Event`` whose ``wait`` gives way to the hub instead of blocking the thread."""

    def __init__(self, hub: Hub) -> None:
        super().__init__()
        self.hub = hub

    def wait(self, timeout: float | None = None) -> bool:
        if self.is_set():
            return True
        self.hub.park(math.inf if timeout is None else self.hub.now + timeout, self)
        return self.is_set()


class CoLock:
    """A mutex for greenlets: a contender gives way until it is free."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.held = False
        self._free = threading.Event()
        self._free.set()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        while self.held:
            if not blocking:
                return False
            self.hub.park(math.inf, self._free)
        self.held = True
        self._free.clear()
        return True

    def release(self) -> None:
        self.held = False
        self._free.set()

    def locked(self) -> bool:
        return self.held

    __enter__ = acquire

    def __exit__(self, *exc: Any) -> None:
        self.release()


class SimClock(Clock):
    """The hub's time; wall time off by ``offset`` (clock skew)."""

    def __init__(self, hub: Hub, offset: float) -> None:
        super().__init__(offset)
        self.hub = hub

    def time(self) -> float:
        return WALL0 + (self.hub.now - MONO0) + self.offset

    def monotonic(self) -> float:
        return self.hub.now

    @property
    def timebase(self) -> object:
        return self.hub

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        self.hub.park(math.inf if timeout is None else self.hub.now + timeout, event)
        return event.is_set()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.hub.park(self.hub.now + seconds)


# --------------------------------------------------------------------------- the store


@dataclass
class Faults:
    fail: float = 0.0  # a request refused (503), nothing applied
    throttle: float = 0.0  # a 429 with Retry-After
    lost_reply: float = 0.0  # a write applied, its reply lost
    max_latency: float = 0.05


class SimStore:
    """One party's connection to the shared store: requests take time and may fail."""

    def __init__(self, world: "World", party: "Party") -> None:
        self.world, self.party = world, party
        self.backend = world.backend
        self.url = "memory://sim"
        self.min_write_interval = world.spacing

    def _latency(self) -> float:
        return self.world.rng.random() * self.world.faults.max_latency

    def _fault(self, p: float) -> bool:
        hit = self.world.chaos and self.world.rng.random() < p
        if hit:
            self.party.faults_seen += 1
        return hit

    def _request(self, op: str, apply: Callable[[], Any], *, mutation: bool) -> Any:
        hub, f = self.world.hub, self.world.faults
        hub.park(hub.now + self._latency())
        if self._fault(f.fail):
            raise TransientStorageError(f"sim: 503 on {op}", status=503, ambiguous=False)
        if mutation and self._fault(f.throttle):
            raise TransientStorageError(f"sim: 429 on {op}", status=429, ambiguous=False, retry_after=1.0)
        result = apply()  # the store applies it at this instant
        hub.park(hub.now + self._latency())
        if mutation and self._fault(f.lost_reply):
            raise TransientStorageError(f"sim: reply to {op} lost", ambiguous=True)
        return result

    def read(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, int] | None:
        return self._request("read", lambda: self.backend.read(key, max_bytes=max_bytes), mutation=False)

    def write(self, key: str, data: bytes, *, if_generation_match: int) -> int:
        def apply() -> int:
            match = if_generation_match
            if match == -1:  # only a planted bug writes unconditionally
                found = self.backend.read(key)
                match = 0 if found is None else found[1]
            generation = self.backend.write(key, data, if_generation_match=match)
            self.world.applied(self.party, key, data, generation)
            return generation
        return self._request("write", apply, mutation=True)

    def delete(self, key: str, *, if_generation_match: int) -> None:
        return self._request("delete", lambda: self.backend.delete(key, if_generation_match=if_generation_match), mutation=True)

    def list(self, prefix: str) -> dict[str, int]:
        return self._request("list", lambda: self.backend.list(prefix), mutation=False)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- parties


@dataclass(eq=False)
class Party:
    """One process: a lock instance, its scheduler, its own clock offset and connection."""

    name: str
    owner_id: str
    lock: HandoffLock
    fence: FencedObject
    crashed: bool = False
    paused_until: float = -math.inf
    faults_seen: int = 0
    left_wait_at: float = -math.inf  # when its last acquire ended (for the waiter-slot invariant)
    slow_receiver: float = 0.0
    ops: int = 0


def _primitives(hub: Hub, party: "Party") -> Primitives:
    """The lock's primitives, cooperative: its mutexes and events give way to the hub, its threads are greenlets.

    Passed to ``HandoffLock(primitives=...)`` where the real (``threading``) ones plug in.
    Thread-locals stay ``threading.local``: every greenlet of the world shares one OS
    thread, as before this seam existed (see the report of issue 22).
    """
    def start_thread(target: Callable[[], None], name: str) -> None:
        hub.spawn(name, target, party)

    return Primitives(mutex=lambda: CoLock(hub), event=lambda: SimEvent(hub), start_thread=start_thread)


# Read-only views of lock internals for the checker and the trace (no public API exposes them).
# The simulation never writes a private member of the lock; planted bugs patch methods (BUGS).


def _state(lock: HandoffLock) -> str:
    return lock._state.value


def _instance(lock: HandoffLock) -> str:
    return lock._me.instance or ""


def _lease(lock: HandoffLock) -> Lease:
    return lock._lease


def _wall(lock: HandoffLock) -> float:
    return lock._clock.time()


# --------------------------------------------------------------------------- the world


@dataclass
class Config:
    seconds: float = 60.0
    parties: int = 3
    ttl: float = 2.0
    spacing: float = 0.0
    skew: float = 0.5
    faults: Faults = field(default_factory=Faults)


class World:
    def __init__(self, seed: int, config: Config | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        random.seed(seed)  # the library's backoff jitter draws from the module's generator
        self.config = config or self._draw_config()
        self.hub = Hub(self.rng)
        self.backend = MemoryStorage(f"sim-{seed}")
        self.faults = self.config.faults
        self.spacing = self.config.spacing
        self.chaos = True
        self.parties: list[Party] = []
        self.checker = Checker(self)
        self.hub.on_step = self.checker.check
        self._ids = 0

    def _draw_config(self) -> Config:
        r = self.rng
        gcs_like = r.random() < 0.3
        return Config(
            seconds=r.choice([20.0, 40.0, 60.0]),
            parties=r.choice([2, 3, 3, 4]),
            ttl=5.0 if gcs_like else r.choice([1.5, 2.0, 3.0]),
            spacing=1.0 if gcs_like else 0.0,
            skew=r.choice([0.0, 0.2, 0.5]),
            faults=Faults(
                fail=r.choice([0.0, 0.02, 0.08]),
                throttle=r.choice([0.0, 0.0, 0.01]),
                lost_reply=r.choice([0.0, 0.02, 0.08]),
                max_latency=r.choice([0.005, 0.05, 0.2]),
            ),
        )

    # -- parties -------------------------------------------------------------

    def new_party(self, owner_id: str | None = None) -> Party:
        self._ids += 1
        name = f"p{self._ids}"
        owner_id = owner_id or name
        c = self.config
        offset = self.rng.uniform(-c.skew / 2, c.skew / 2)
        clock = SimClock(self.hub, offset)
        placeholder = Party(name, owner_id, None, None)  # type: ignore[arg-type]
        store = SimStore(self, placeholder)
        sched = Scheduler(clock, autostart=False, name=name)
        sched.notify_inline = False
        ttl = c.ttl
        lock = HandoffLock(
            "memory://sim", storage=store, key=KEY, owner_id=owner_id, clock=clock, scheduler=sched,
            ttl=ttl, waiter_check_interval=ttl / 5, waiter_poll_interval=ttl / 10, max_clock_skew=c.skew,
            primitives=_primitives(self.hub, placeholder),
        )
        placeholder.lock = lock
        placeholder.fence = FencedObject(store, FENCE_KEY, writer_id=owner_id, clock=clock, timeout=ttl)
        placeholder.fence._mutex = CoLock(self.hub)  # type: ignore[assignment]
        placeholder.slow_receiver = self.rng.choice([0.0, 0.0, 0.0, ttl])
        party = placeholder
        self.parties.append(party)
        signals.acquired.connect(self.checker.on_acquired, sender=lock, weak=False)
        if party.slow_receiver:
            signals.on_release_requested.connect(
                lambda sender, **kw: clock.sleep(party.slow_receiver), sender=lock, weak=False
            )
        self.hub.spawn(f"{name}-scheduler", lambda: self._scheduler_loop(party, sched), party)
        self.hub.spawn(f"{name}-main", lambda: self._actor(party), party)
        return party

    def _scheduler_loop(self, party: Party, sched: Scheduler) -> None:
        lock = party.lock
        while not party.crashed:
            sched.run_pending()
            due = lock._duties.next_due()  # private: the real scheduler's loop asks the same (Scheduled.next_due)
            self.hub.park(min(max(due, self.hub.now + 0.001), self.hub.now + 0.2))

    def _actor(self, party: Party) -> None:
        r, hub, lock = self.rng, self.hub, party.lock
        ttl = self.config.ttl
        while self.chaos and not party.crashed:
            party.ops += 1
            choice = r.random()
            if _state(lock) in ("held", "lost"):
                if choice < 0.03:
                    self.crash(party)
                    return
                if choice < 0.06:
                    party.paused_until = hub.now + r.uniform(0.5, 2.5) * ttl  # a GC pause, a SIGSTOP
                    hub.note(f"{party.name} pauses until {party.paused_until - MONO0:.2f}")
                    hub.park(party.paused_until)
                    continue
                if choice < 0.5 and lock.healthy:
                    self.fenced_write(party)
                if lock.release_requested or choice > 0.85:
                    self.timed(party, "release", self._release)
                hub.park(hub.now + r.uniform(0.0, ttl / 4))
            else:
                if choice < 0.02:
                    self.crash(party)
                    return
                mode = r.random()
                if mode < 0.2:
                    self.timed(party, "acquire", lambda p: p.lock.acquire(blocking=False), bound=ttl + 5)
                elif mode < 0.35:
                    hub.spawn(f"{party.name}-canceller", lambda: self._cancel_later(party), party)
                    timeout = r.uniform(0.5, 4.0) * ttl
                    self.timed(party, "acquire", lambda p, t=timeout: p.lock.acquire(timeout=t), bound=timeout)
                elif mode < 0.45:
                    hub.spawn(f"{party.name}-releaser", lambda: self._release_later(party), party)
                    timeout = r.uniform(0.5, 4.0) * ttl
                    self.timed(party, "acquire", lambda p, t=timeout: p.lock.acquire(timeout=t), bound=timeout)
                else:
                    timeout = r.uniform(0.2, 4.0) * ttl
                    self.timed(party, "acquire", lambda p, t=timeout: p.lock.acquire(timeout=t), bound=timeout)
                party.left_wait_at = hub.now
                self.checker.after_acquire(party)
                if not self.checker.slot_names(party):
                    # A slot an acquire could not give back for faults may outlive it (it expires by
                    # itself): the faults excuse it until it is gone, even if the next acquire was
                    # cancelled before it read the record, and so never learnt of it.
                    party.faults_seen = 0
                hub.park(hub.now + r.uniform(0.0, ttl / 2))

    def _cancel_later(self, party: Party) -> None:
        self.hub.park(self.hub.now + self.rng.uniform(0.0, 2.0) * self.config.ttl)
        if not party.crashed:
            party.lock.cancel()

    def _release_later(self, party: Party) -> None:
        self.hub.park(self.hub.now + self.rng.uniform(0.0, 2.0) * self.config.ttl)
        if not party.crashed:
            self.timed(party, "release", self._release)

    @staticmethod
    def _release(party: Party) -> Any:
        return party.lock.release()

    def timed(self, party: Party, what: str, op: Callable[[Party], Any], bound: float = 0.0) -> Any:
        """Run ``op``; expected errors are outcomes, anything else is a violation. Checks the op's time bound."""
        lock, hub = party.lock, self.hub
        started, paused_before = hub.now, party.paused_until
        try:
            result = op(party)
            hub.note(f"{party.name} {what} -> {result!r}")
        except (LockContended, AcquireCancelled, TransientStorageError, LockLost, LockNotHeld) as exc:
            hub.note(f"{party.name} {what} raised {type(exc).__name__}")
            result = exc
            if isinstance(exc, TransientStorageError) and "could not give back the waiter slot" in str(exc):
                # The documented way out when every give-back write met a newer generation for the
                # whole give-up budget (an owner renewing faster than a read and a write take):
                # the error says so, and the slot expires by itself within waiter_ttl.
                party.faults_seen += 1
        except HandoffLockError as exc:
            if "already" in str(exc):  # a concurrent acquire/release of the same instance: the API says no
                return exc
            raise Violation(f"{party.name} {what} raised {exc!r}") from exc
        elapsed = hub.now - started
        if party.paused_until > started or party.paused_until != paused_before:
            return result  # a pause stretches any operation
        limit = bound + lock.give_up_budget + lock.renew_deadline + max(lock.renew_deadline, 5.0) + 2.0
        if elapsed > limit:
            raise Violation(f"{party.name} {what} took {elapsed:.2f} s (bound {limit:.2f} s)")
        return result

    def fenced_write(self, party: Party) -> None:
        lock = party.lock
        try:
            party.fence.write({"by": party.name, "at": self.hub.now}, token=lock.token)
        except (StaleToken, TransientStorageError):
            pass

    def crash(self, party: Party) -> None:
        self.hub.note(f"{party.name} crashes ({_state(party.lock)})")
        party.crashed = True
        if self.rng.random() < 0.5 and self.chaos:  # a restart, sometimes under the same stable id
            self.new_party(party.owner_id if self.rng.random() < 0.5 else None)

    def applied(self, party: Party, key: str, data: bytes, generation: int) -> None:
        self.checker.on_applied(party, key, data, generation)

    # -- running ---------------------------------------------------------------

    def run(self) -> None:
        for _ in range(self.config.parties):
            self.new_party()
        self.hub.run(MONO0 + self.config.seconds)
        self.settle()

    def settle(self) -> None:
        """Liveness: chaos stops; the holder is gone; a newcomer must get the lock within ttl + skew (+ slack)."""
        self.chaos = False
        for p in self.parties:
            p.crashed = True
        self.hub.run(self.hub.now + 0.5)
        probe = self.new_party()
        probe.lock.wait_for_slot = True  # a crashed waiter's slot may still be live: wait it out
        c = self.config
        bound = c.ttl + c.skew + c.ttl + 2 * c.skew + 5.0  # a lease, a waiter slot (waiter_ttl = ttl), slack
        box: dict[str, Any] = {}

        def acquire() -> None:
            try:
                box["ok"] = probe.lock.acquire(timeout=bound)
            except HandoffLockError as exc:
                box["ok"] = exc

        self.hub.tasks = [t for t in self.hub.tasks if t.party is probe and t.name.endswith("scheduler")]
        self.hub.spawn("probe", acquire, probe)
        self.hub.run(self.hub.now + bound + 10)
        if box.get("ok") is not True:
            raise Violation(f"the lock was not free within {bound:.1f} s of its holder going: {box.get('ok')!r}")


class Checker:
    """The invariants, checked after every step of the hub."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.highest_token = 0
        self.fence_highest = 0

    def on_acquired(self, sender: HandoffLock, token: int, handoff: bool) -> None:
        w = self.world
        lease = _lease(sender)
        r = lease.record
        w.hub.note(f"{sender.owner_id} acquired token {token} handoff={handoff} expiresAt={r.expires_at - WALL0:.3f} "
                   f"(its wall clock {_wall(sender) - WALL0:.3f}) valid until {lease.valid_until - MONO0:.3f}")
        if token <= self.highest_token:
            raise Violation(f"{sender.owner_id} acquired with token {token}, not above {self.highest_token}")
        self.highest_token = token

    def on_applied(self, party: Party, key: str, data: bytes, generation: int) -> None:
        if key != FENCE_KEY:
            return
        doc = decode_fence(data, key=key, generation=generation, url=None, max_bytes=1 << 20)
        if doc.highest < self.fence_highest:
            raise Violation(f"the fence took token {doc.highest} after {self.fence_highest}")
        self.fence_highest = doc.highest

    def slot_names(self, party: Party) -> bool:
        """Whether the record's waiter slot is this party's instance (live or not)."""
        found = self.world.backend.read(KEY)
        return found is not None and LockRecord.decode(found[0]).waiter_instance == _instance(party.lock)

    def after_acquire(self, party: Party) -> None:
        """An acquire that ended without the lock, with no fault on its requests, left no slot behind."""
        if party.crashed or party.faults_seen or _state(party.lock) in ("held", "releasing") \
                or party.paused_until > party.left_wait_at - 10 * self.world.config.ttl:
            return
        found = self.world.backend.read(KEY)
        if found is None:
            return
        record = LockRecord.decode(found[0])
        if record.waiter_instance == _instance(party.lock) and record.owner_instance != _instance(party.lock):
            raise Violation(f"{party.name} left acquire ({_state(party.lock)}) and its waiter slot is still in the record")

    def check(self) -> None:
        w = self.world
        holders = [p for p in w.parties if not p.crashed and p.lock.healthy]
        if len(holders) > 1:
            raise Violation("two parties hold valid leases at once: " + ", ".join(
                f"{p.name} (token {p.lock.token}, valid until {_lease(p.lock).valid_until - MONO0:.3f})" for p in holders))
        found = w.backend.read(KEY)
        if found is None:
            return
        record = LockRecord.decode(found[0])
        if record.waiting_owner_id is None or not record.waiter_live(w.hub.now - MONO0 + WALL0 - w.config.skew):
            return
        for p in w.parties:
            if p.crashed or _instance(p.lock) != record.waiter_instance:
                continue
            grace = p.lock.give_up_budget + 2 * w.faults.max_latency + 0.5
            if _state(p.lock) != "waiting" and p.faults_seen == 0 and w.hub.now - p.left_wait_at > grace \
                    and w.hub.now >= p.paused_until:
                raise Violation(f"the waiter slot names {p.name}, which left its acquire "
                                f"{w.hub.now - p.left_wait_at:.2f} s ago (state {_state(p.lock)})")


# --------------------------------------------------------------------------- planted bugs


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _bug_trust_a_read() -> contextlib.AbstractContextManager[None]:
    """The owner never notices it lost the lock: whatever it reads, it is still ours."""
    return _patched(protocol, "_check_still_mine", lambda *a, **k: None)


def _bug_keep_the_slot() -> contextlib.AbstractContextManager[None]:
    """A waiter that gives up (timeout, cancel, error) leaves its slot in the record."""
    return _patched(_Lock, "_leave_slot", lambda self, waiting, last, *, keep: False)


def _bug_unconditional_handoff() -> contextlib.AbstractContextManager[None]:
    """The handoff and release write skips the generation match."""
    original = protocol.decide_release

    def decide(*args: Any, **kwargs: Any) -> Any:
        d = original(*args, **kwargs)
        if isinstance(d, protocol.Write):
            return protocol.Write(d.kind, d.record, -1)
        return d
    return _patched(protocol, "decide_release", decide)


def _bug_unconditional_renewal() -> contextlib.AbstractContextManager[None]:
    """A renewal overwrites whatever is there: an owner that lost the lock takes it back from the new one."""
    original = protocol.decide_renew

    def decide(record: Any, generation: int, **kwargs: Any) -> Any:
        d = original(record, generation, **kwargs)
        return protocol.Write(d.kind, d.record, -1) if isinstance(d, protocol.Write) else d
    return _patched(protocol, "decide_renew", decide)


def _bug_lease_from_the_record_alone() -> contextlib.AbstractContextManager[None]:
    """The owner counts itself safe until expiresAt itself, leaving no margin for a pause."""
    def lease_until(record: LockRecord, mono: float, wall: float, timing: Any) -> float:
        return mono + (record.expires_at - wall) + timing.max_clock_skew
    return _patched(lease_module, "lease_until", lease_until)


BUGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "trust-a-read": _bug_trust_a_read,
    "keep-slot-on-timeout": _bug_keep_the_slot,
    "unconditional-handoff": _bug_unconditional_handoff,
    "unconditional-renewal": _bug_unconditional_renewal,
    "lease-past-its-margin": _bug_lease_from_the_record_alone,
}


# --------------------------------------------------------------------------- running seeds


@dataclass
class Outcome:
    seed: int
    violation: str | None
    trace: list[str]
    steps: int
    config: Config | None = None


def run_seed(seed: int, *, bug: str | None = None) -> Outcome:
    """Run one seed (with a planted bug if named); return what it found."""
    with BUGS[bug]() if bug else contextlib.nullcontext():
        world = World(seed)
        try:
            world.run()
            return Outcome(seed, None, [], world.hub.steps, world.config)
        except Violation as exc:
            return Outcome(seed, str(exc), list(world.hub.trace[-40:]), world.hub.steps, world.config)
        finally:
            for p in world.parties:
                for sig in (signals.acquired, signals.on_release_requested):
                    for receiver in list(sig.receivers_for(p.lock)):
                        sig.disconnect(receiver, sender=p.lock)
            MemoryStorage.forget(world.backend.name)


def run_seeds(seeds: range | list[int], *, bug: str | None = None, stop_at_first: bool = False) -> list[Outcome]:
    found = []
    for seed in seeds:
        outcome = run_seed(seed, bug=bug)
        if outcome.violation:
            found.append(outcome)
            if stop_at_first:
                break
    return found
