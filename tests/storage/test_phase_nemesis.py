"""A nemesis by phase: every write an acquire makes, interrupted at each phase of it, leaves nothing held.

The rule it checks: whenever a write of ``acquire()`` may have been applied and the caller leaves
without the state it would give, the lock reads and undoes it (frees the lock, gives the slot back)
before returning or raising; a result is returned only for a hold the lock still has.

Write kinds: CREATE (no object), TAKE (a free lock), RETAKE (our stable owner id held by an earlier
instance), BECOME_WAITER, REFRESH_WAITER, and the acceptance of a handoff (the holder's write, which
the waiter's read reveals). Phases of that write (of the read revealing it, for a handoff):

* ``sent``: the request left and was not applied when the interruption came (the caller cannot tell);
* ``applied``: the store applied it and the reply is lost (the interruption comes in its place);
* ``seen``: the lock has the reply, and has not returned yet (its next wait, or its ``acquired`` or
  ``waiting`` signal).

Interruptions: a SIGINT (KeyboardInterrupt raised in the acquiring thread at the point),
:meth:`~handofflock.HandoffLock.cancel` (the request's reply then never comes), a ``timeout`` that
runs out there (the request cut off at the deadline), the cancellation of an
:class:`~handofflock.AsyncHandoffLock`'s task, and interpreter exit (a child process whose acquire,
in a daemon thread, is at that point as the main thread returns).

The phases are placed with the memory store's hooks on a fake clock (deterministic, milliseconds);
the async cases run a real event loop over it, the exit cases a child process each. The end of the
module runs the two phases a real server is needed for (a reply dropped after the write applied, a
request held back) on the GCS emulator through the fault proxy.

Afterwards, whatever the acquire returned or raised: a returned hold is held and on record; else
``is_held`` is False, the record names this instance neither as owner nor as waiter, and a third
party takes the lock at once (after the holder, if any, releases: a slot left behind would get it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from simworld import KEY, World, new_world

from handofflock import AsyncHandoffLock, HandoffLock, LockLost, signals
from handofflock.core.errors import StorageTimeout, TransientStorageError

KINDS = ["create", "take", "retake", "become_waiter", "refresh_waiter", "handoff"]
PHASES = ["sent", "applied", "seen"]
TTL = 10.0  # waiter_ttl too: the slot is refreshed 5 s after it was written
TIMEOUT = 8.0  # an acquire(timeout=...) that the nemesis runs out at the phase

pytestmark = [
    pytest.mark.timeout(60),
    # A cut-off at the deadline is a store that did not answer: said once per lock, expected here.
    pytest.mark.filterwarnings("ignore::handofflock.core.errors.StoreUnreachableWarning"),
]


class Interrupt(Exception):
    """Raised by a phase hook in place of the reply: a reset (ambiguous), or a cut-off at the deadline."""


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


def stage(world: World, kind: str) -> Stage:
    """The world before B's acquire, set so that B's ``nth`` request of ``op`` is the one of ``kind``."""
    b = world.lock("B", ttl=TTL, min_hold=0)
    if kind == "create":
        return Stage(world, b, None)
    if kind == "take":
        a = world.lock("A", ttl=TTL)
        a.acquire()
        a.release()
        return Stage(world, b, None)
    if kind == "retake":
        twin = world.lock("B", ttl=TTL, frozen=True)  # an earlier instance of B's stable id
        twin.acquire()
        return Stage(world, b, twin)
    a = world.lock("A", ttl=TTL, min_hold=0, frozen=True)
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


def sync_acts(world: World, b: HandoffLock, how: str, deadline: list[float]) -> Callable[[str], None]:
    """What each interruption does at the point; ``deadline[0]``: the acquire's timeout, monotonic."""

    def act(phase: str) -> None:
        if how == "sigint":
            raise KeyboardInterrupt
        if how == "cancel":
            b.cancel()
            if phase != "seen":
                raise TransientStorageError("nemesis: connection reset, no reply", ambiguous=True)
            return
        assert how == "timeout"
        world.clock.advance(max(0.0, deadline[0] - world.clock.monotonic()) + 0.5)
        if phase != "seen":
            raise StorageTimeout("nemesis: cut off at the deadline", ambiguous=True)

    return act


def run_sync(world: World, st: Stage, how: str, phase: str) -> tuple[Outcome, list[str]]:
    deadline = [0.0]
    nemesis = Nemesis(world, st.b, st.op, st.nth, phase, sync_acts(world, st.b, how, deadline), st.before_op)
    nemesis.install()
    outcome = Outcome()
    try:
        timeout = TIMEOUT if how == "timeout" else 60.0
        deadline[0] = world.clock.monotonic() + timeout
        outcome.returned = st.b.acquire(timeout=timeout)
    except (Exception, KeyboardInterrupt) as exc:
        outcome.raised = exc
    finally:
        nemesis.uninstall()
    return outcome, nemesis.seen


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("how", ["sigint", "cancel", "timeout"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_acquire_interrupted_at_any_phase_of_its_write_leaves_nothing_held(kind, how, phase):
    world = new_world()
    st = stage(world, kind)
    outcome, seen = run_sync(world, st, how, phase)
    assert seen == [phase], f"the nemesis never reached {phase!r} ({outcome})"
    check_nothing_left(world, st, outcome)


# --------------------------------------------------------------------------- the async lock's task cancelled


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("kind", KINDS)
def test_an_async_acquire_whose_task_is_cancelled_at_any_phase_leaves_nothing_held(kind, phase):
    world = new_world()
    st = stage(world, kind)
    alock = AsyncHandoffLock(lock=st.b)
    reached, cancelled = threading.Event(), threading.Event()

    def act(point: str) -> None:
        # In the worker thread: the task is cancelled now; the reply never comes (or, seen, the lock goes on).
        reached.set()
        assert cancelled.wait(10), "the task was not cancelled"
        if point != "seen":
            end = time.monotonic() + 10
            while not st.b._cancel.is_set() and time.monotonic() < end:  # the cancel() the task sends
                time.sleep(0.001)
            raise TransientStorageError("nemesis: connection reset, no reply", ambiguous=True)

    nemesis = Nemesis(world, st.b, st.op, st.nth, phase, act, st.before_op)
    nemesis.install()
    outcome = Outcome()

    async def main() -> None:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_reached() -> None:
                    await anyio.to_thread.run_sync(reached.wait, 10.0)
                    scope.cancel()
                    cancelled.set()

                tg.start_soon(cancel_when_reached)
                try:
                    outcome.returned = await alock.acquire()
                except BaseException as exc:
                    outcome.raised = exc
                    raise
        if not scope.cancelled_caught and outcome.raised is None:
            raise AssertionError(f"the task was never cancelled: {outcome}")

    try:
        anyio.run(main)
    finally:
        nemesis.uninstall()
    assert nemesis.seen == [phase], f"the nemesis never reached {phase!r} ({outcome})"
    check_nothing_left(world, st, outcome)
