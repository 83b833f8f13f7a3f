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
:meth:`~handofflock.HandoffLock.cancel` (the request's reply then never comes), a ``release()``
from a signal handler in the acquiring thread (the same), a ``timeout`` that runs out there (the
request cut off at the deadline), the cancellation of an :class:`~handofflock.AsyncHandoffLock`'s
task, and interpreter exit (a child process whose acquire, in a daemon thread, is at that point as
the main thread returns).

The phases are placed with the memory store's hooks on a fake clock (deterministic, milliseconds);
the async cases run a real event loop over it, the exit cases a child per phase. The phase a real
server adds to, a write applied while its reply never reaches the client, runs last on the GCS
emulator through the fault proxy (the reply held back a byte a second, its read-back refused), with
a real signal in the blocked request.

Afterwards, whatever the acquire returned or raised: a returned hold is held and on record; else
``is_held`` is False, the record names this instance neither as owner nor as waiter, and a third
party takes the lock at once (after the holder, if any, releases: a slot left behind would get it).
An acquire that raised says what stopped it: KeyboardInterrupt, AcquireCancelled or LockTimeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from nemesis import KINDS, PHASES, Nemesis, Outcome, Stage, check_nothing_left, stage
from simworld import World, new_world

from handofflock import AcquireCancelled, AsyncHandoffLock, HandoffLock, LockRecord, LockTimeout
from handofflock.core.errors import StorageTimeout, TransientStorageError
from handofflock.storage.gcs import GCSStorage
from handofflock.testing.faultproxy import FaultProxy, emulator_env

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
        if how in ("cancel", "release"):
            b.cancel() if how == "cancel" else b.release()  # release(): a signal handler's, in this thread
            if phase != "seen":
                raise TransientStorageError("nemesis: connection reset, no reply", ambiguous=True)
            return
        assert how == "timeout"
        world.clock.advance(max(0.0, deadline[0] - world.clock.monotonic()) + 0.5)
        if phase != "seen":
            raise StorageTimeout("nemesis: cut off at the deadline", ambiguous=True)

    return act


#: What each interruption is reported as, when the acquire does not return a hold.
SAID = {"sigint": KeyboardInterrupt, "cancel": AcquireCancelled, "release": AcquireCancelled, "timeout": LockTimeout}


def said(outcome: Outcome, how: str) -> None:
    """The acquire returned a hold, or raised what the interruption is (a cancel is no timeout)."""
    if outcome.raised is not None:
        assert isinstance(outcome.raised, SAID[how]), f"{how} was reported as {outcome.raised!r}"


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
@pytest.mark.parametrize("how", ["sigint", "cancel", "release", "timeout"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_acquire_interrupted_at_any_phase_of_its_write_leaves_nothing_held(kind, how, phase):
    world = new_world()
    st = stage(world, kind)
    outcome, seen = run_sync(world, st, how, phase)
    assert seen == [phase], f"the nemesis never reached {phase!r} ({outcome})"
    said(outcome, how)
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


# ------------------------------------------------------------------- on the GCS emulator, through the fault proxy

#: Real time, short: each request is cut off at request_timeout, (2 - 0.5) / 2 = 0.75 s.
#: No pacing: a 4 s ttl keeps each case seconds long, and GCS's one-second spacing serves 5 s and up;
#: the subject is a reply lost at each phase, not spacing (tests/processes/test_xproc_gcs.py paces).
GCS_TIMING = dict(
    ttl=4.0, renew_interval=0.5, renew_deadline=2.0, waiter_check_interval=0.2, waiter_poll_interval=0.1,
    max_clock_skew=0.2, min_write_interval=0.0, min_hold=0,
)  # fmt: skip
GCS_KEY = "locks/nemesis.json"


class GCSWorld:
    """B talks to the emulator through its own fault proxy; every other party, and the test, directly."""

    def __init__(self, emulator: Any) -> None:
        self.bucket = f"n-{uuid.uuid4().hex[:16]}"
        emulator.create_bucket(self.bucket)
        self.emulator = emulator
        self.proxy = FaultProxy(emulator.url, lifetime=120).start()
        self.locks: list[HandoffLock] = []

    def lock(self, owner: str, *, proxied: bool = False) -> HandoffLock:
        with self.proxy.env() if proxied else emulator_env(self.emulator.url):
            store = GCSStorage(self.bucket, timeout=(1.0, 2.0))
        lock = HandoffLock(f"gs://{self.bucket}/{GCS_KEY}", storage=store, key=GCS_KEY, owner_id=owner, **GCS_TIMING)
        self.locks.append(lock)
        return lock

    def record(self) -> LockRecord | None:
        with emulator_env(self.emulator.url):
            found = GCSStorage(self.bucket).read(GCS_KEY)
        return None if found is None else LockRecord.decode(found[0], key=GCS_KEY)

    def close(self) -> None:
        for lock in self.locks:
            lock.cancel()
            if lock.is_held:
                lock.release()
            lock._unschedule()  # private: stop its renewals without releasing
        self.proxy.stop()


@pytest.fixture
def gcs(gcs_emulator):
    world = GCSWorld(gcs_emulator)
    yield world
    world.close()


class Interrupted(KeyboardInterrupt):
    """What the test's SIGUSR1 handler raises: a SIGINT's KeyboardInterrupt, in a signal pytest leaves alone."""


@pytest.mark.parametrize("how", ["sigint", "cancel", "timeout"])
@pytest.mark.parametrize("kind", ["create", "take", "become_waiter"])
def test_on_gcs_an_acquire_interrupted_after_its_write_applied_with_its_reply_unseen_leaves_nothing_held(
    gcs, kind, how
):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a signal handler runs in the main thread only")
    holder = None
    if kind != "create":
        holder = gcs.lock("A")
        holder.acquire()
        if kind == "take":
            holder.release()
            holder = None
    b = gcs.lock("B", proxied=True)
    # B's write is forwarded and applied; its reply comes a byte a second (cut off at request_timeout).
    gcs.proxy.inject("trickle_head", method="POST", delay=1.0)
    main, applied = threading.get_ident(), threading.Event()

    def nemesis() -> None:
        end = time.monotonic() + 20
        while time.monotonic() < end:
            record = gcs.record()
            if record is not None and b.instance in (getattr(record.owner, "instance", None),
                                                     getattr(record.waiter, "instance", None)):  # fmt: skip
                break
            time.sleep(0.01)
        else:
            return
        applied.set()
        gcs.proxy.inject("503", method="GET")  # the read-back of the write fails too: the lock cannot tell
        if how == "sigint":
            signal.pthread_kill(main, signal.SIGUSR1)
        elif how == "cancel":
            b.cancel()

    def raise_interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    thread = threading.Thread(target=nemesis, daemon=True)
    outcome = Outcome()
    try:
        thread.start()
        outcome.returned = b.acquire(timeout=0.5 if how == "timeout" else 30)
    except (Exception, KeyboardInterrupt) as exc:
        outcome.raised = exc
    finally:
        thread.join(30)
        signal.signal(signal.SIGUSR1, previous)
    assert applied.is_set(), f"B's write was never applied ({outcome})"
    said(outcome, how)
    record = gcs.record()
    if outcome.raised is None and outcome.returned:
        assert b.is_held and record is not None and record.owner is not None and record.owner.instance == b.instance
        b.release()
        record = gcs.record()
    else:
        assert not b.is_held, f"acquire() ended with {outcome} and the lock still holds"
    assert record is None or b.instance not in (getattr(record.owner, "instance", None),
                                                getattr(record.waiter, "instance", None)), (
        f"the acquire ended ({outcome}) and the record still names B's instance: {record}"
    )  # fmt: skip
    if holder is not None:
        holder.release()  # a slot B left behind would be handed the lock here
    c = gcs.lock("C")
    assert c.acquire(blocking=False), f"a third party could not take the lock at once: {gcs.record()}"
    c.release()
