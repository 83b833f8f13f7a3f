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

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from nemesis import KINDS, PHASES, Nemesis, Outcome, Stage, check_nothing_left, stage
from simworld import World, new_world

from handofflock import AsyncHandoffLock, HandoffLock
from handofflock.core.errors import StorageTimeout, TransientStorageError

PROCS = Path(__file__).resolve().parents[1] / "support" / "procs"
TIMEOUT = 8.0  # an acquire(timeout=...) that the nemesis runs out at the phase

pytestmark = [
    pytest.mark.timeout(60),
    # A cut-off at the deadline is a store that did not answer: said once per lock, expected here.
    pytest.mark.filterwarnings("ignore::handofflock.core.errors.StoreUnreachableWarning"),
]


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


# --------------------------------------------------------------------------- interpreter exit


@pytest.mark.parametrize("kind", KINDS)
def test_an_acquire_in_a_daemon_thread_at_interpreter_exit_at_any_phase_leaves_nothing_held(kind):
    # A child per phase, at once (most of a child's time is its imports): its main thread returns when its
    # acquire reaches the phase; its last exit hook (after the lock's own) prints "ok" or what it found.
    children = {
        phase: subprocess.Popen(
            [sys.executable, str(PROCS / "exitphase.py"), kind, phase],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        for phase in PHASES
    }
    found = {phase: child.communicate(timeout=50) for phase, child in children.items()}
    left = {phase: (out, err[-2000:]) for phase, (out, err) in found.items() if not out.strip().endswith("ok")}
    assert not left, "\n".join(f"--- exit at {phase!r}:\n{out}{err}" for phase, (out, err) in left.items())
    assert all(child.returncode == 0 for child in children.values())
