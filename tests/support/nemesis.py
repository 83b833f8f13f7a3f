"""The phase nemesis's parts: a world staged so that B's next request is of one write kind, the hooks that
interrupt it at a phase, and the check that nothing of B's is left (tests/storage/test_phase_nemesis.py;
the interpreter-exit cases run them in a child, tests/support/procs/exitphase.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simworld import KEY, World

from handofflock import HandoffLock, LockLost, signals

KINDS = ["create", "take", "retake", "become_waiter", "refresh_waiter", "handoff"]
PHASES = ["sent", "applied", "seen"]
TTL = 10.0  # waiter_ttl too: the slot is refreshed 5 s after it was written


@dataclass
class Nemesis:
    """Where the interruption comes: the ``nth`` request of ``op`` B makes (1-based), at ``phase``."""

    world: World
    b: HandoffLock
    op: str  # "write", or "read" (a handoff: the waiter's read that reveals it)
    nth: int
    phase: str
    act: Callable[[str], None]  # called at the point with "sent", "applied" or "seen"; may raise
    before_op: Callable[[], None] | None = None  # runs ahead of the nth request (the holder's handoff)
    seen: list[str] = field(default_factory=list)  # the phases reached, for the test's own check
    count: int = 0
    armed_seen: bool = False
    busy: bool = False  # the holder's handoff runs: its requests are not B's

    def install(self) -> None:
        faults = self.world.store.faults
        faults.before(self.op, self._before, key=KEY)
        faults.after(self.op, self._after, key=KEY)
        self.world.clock.on_wait.append(self._on_wait)
        signals.acquired.connect(self._on_signal, sender=self.b, weak=False)
        signals.waiting.connect(self._on_signal, sender=self.b, weak=False)

    def uninstall(self) -> None:
        self.world.store.faults.clear()
        if self._on_wait in self.world.clock.on_wait:
            self.world.clock.on_wait.remove(self._on_wait)
        signals.acquired.disconnect(self._on_signal, sender=self.b)
        signals.waiting.disconnect(self._on_signal, sender=self.b)

    def _mine(self) -> bool:
        """Whether this request is B's (the hooks run on the caller's thread; only B runs in it then)."""
        return not self.busy and self.b._state.value == "waiting"

    def _before(self, op: str, key: str | None) -> None:
        if not self._mine() or self.count >= self.nth:
            return
        self.count += 1
        if self.count != self.nth:
            return
        if self.before_op is not None:
            self.busy = True
            try:
                self.before_op()
            finally:
                self.busy = False
        if self.phase == "sent":
            self._fire("sent")

    def _after(self, op: str, key: str | None, result: object) -> None:
        if self.count != self.nth or self.seen or not self._mine():
            return
        if self.phase == "applied":
            self._fire("applied")
        elif self.phase == "seen":
            self.armed_seen = True

    def _on_wait(self, timeout: float | None) -> None:
        if self.armed_seen and not self.seen:
            self._fire("seen")

    def _on_signal(self, sender: Any, **kwargs: Any) -> None:
        if self.armed_seen and not self.seen:
            self._fire("seen")

    def _fire(self, phase: str) -> None:
        self.seen.append(phase)
        self.world.store.faults.clear()  # what the lock does next (its give-back) goes through
        self.act(phase)


@dataclass
class Stage:
    world: World
    b: HandoffLock
    holder: HandoffLock | None  # the other party holding the lock (None: nobody)
    op: str = "write"
    nth: int = 1
    before_op: Callable[[], None] | None = None


def stage(world: World, kind: str, **options: Any) -> Stage:
    """The world before B's acquire, set so that B's ``nth`` request of ``op`` is the one of ``kind``;
    ``options`` for every lock of it."""
    b = world.lock("B", ttl=TTL, min_hold=0, **options)
    if kind == "create":
        return Stage(world, b, None)
    if kind == "take":
        a = world.lock("A", ttl=TTL, **options)
        a.acquire()
        a.release()
        return Stage(world, b, None)
    if kind == "retake":
        twin = world.lock("B", ttl=TTL, frozen=True, **options)  # an earlier instance of B's stable id
        twin.acquire()
        return Stage(world, b, twin)
    a = world.lock("A", ttl=TTL, min_hold=0, frozen=True, **options)
    a.acquire()
    if kind == "become_waiter":
        return Stage(world, b, a)
    if kind == "refresh_waiter":
        return Stage(world, b, a, nth=2)
    assert kind == "handoff"
    # B's first poll after its registration: the holder's handoff lands just before it.
    return Stage(world, b, a, op="read", nth=2, before_op=a.release)


@dataclass
class Outcome:
    returned: object = None
    raised: BaseException | None = None


def check_nothing_left(world: World, st: Stage, outcome: Outcome) -> None:
    """A returned hold is held and on record; anything else left nothing of B's behind."""
    b, record = st.b, world.record()
    if outcome.raised is None and outcome.returned:
        assert b.is_held, "acquire() returned a hold the lock no longer has"
        assert record is not None and record.owner is not None and record.owner.instance == b.instance
        b.release()
        record = world.record()
    else:
        assert not b.is_held, f"acquire() ended with {outcome} and the lock still holds"
    assert record is None or record.owner is None or record.owner.instance != b.instance, (
        f"the acquire ended ({outcome}) and the record names B's instance as owner: {record}"
    )
    assert record is None or record.waiter is None or record.waiter.instance != b.instance, (
        f"the acquire ended ({outcome}) and the record names B's instance as waiter: {record}"
    )
    if st.holder is not None and st.holder.is_held:
        try:
            st.holder.release()  # a slot B left behind would be handed the lock here
        except LockLost:
            pass  # the twin fenced by B's retake
    c = world.lock("C", ttl=TTL)
    assert c.acquire(blocking=False), f"a third party could not take the lock at once: {world.record()}"
    c.release()
