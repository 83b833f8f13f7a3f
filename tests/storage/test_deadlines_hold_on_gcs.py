"""On GCS, through the fault proxy: what is left of a caller's timeout bounds every request it makes.

A lock at the default ttl (60 s) allows each request 11.25 s (``Timing.request_timeout``). An
``acquire(timeout=T)`` whose read or registration stalls must still end within ``T`` plus its
give-up budget, raising :class:`LockTimeout`; ``status(timeout=T)`` within ``T``. And a deadline
reached because this process's write spacing (GCS: one write a second per object, one gate per
process) would hold a write past it is a :class:`LockTimeout` too, not a storage error; a forked
child's gate is its own.

The locks keep a fake clock where the store allows it (their waits take no time); the stalls are
real, and so is the time measured around them.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from lockutil import FAST, raw_read
from test_faults_gcs import actors, fake_time

from handofflock import HandoffLock, LockTimeout, TransientStorageError
from handofflock.core.errors import StorageTimeout
from handofflock.storage import records

pytestmark = pytest.mark.gcs

#: Every FAST setting back at its default: the timing a user gets (ttl 60, 11.25 s a request, GCS's spacing).
DEFAULTS = dict.fromkeys(FAST)
#: GCSStorage's own timeouts, as a user gets them: (5, 15) s, 20 s a request.
USERS_STORE = {"timeout": (5.0, 15.0)}
#: What a loaded 2-core machine may add to a bound measured in real time.
SLACK = 0.5


@pytest.fixture
def bucket(gcs_emulator):
    name = f"d-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(name)
    return name


@pytest.fixture
def fake_actor(gcs_emulator, bucket):
    yield from actors(gcs_emulator, bucket, fake_time())


def test_an_acquire_whose_registration_stalls_times_out_within_its_timeout_and_give_up_budget(fake_actor, bucket):
    owner = fake_actor("A", **DEFAULTS, store=USERS_STORE)
    assert owner.lock.acquire()
    b = fake_actor("B", **DEFAULTS, store=USERS_STORE)
    assert b.lock.timing.request_timeout == 11.25
    b.lock.status()  # B's client made, outside what is timed
    stall = b.proxy.inject("delay", method="POST", delay=8.0)  # the registration is held for 8 s
    started = time.monotonic()
    with pytest.raises(LockTimeout) as info:
        b.lock.acquire(timeout=1.5)
    elapsed = time.monotonic() - started
    assert stall.fired == 1
    assert elapsed <= 1.5 + b.lock.give_up_budget, f"acquire(timeout=1.5) took {elapsed:.1f} s"
    assert isinstance(info.value.__cause__, StorageTimeout) and "within 1.5 s" in str(info.value.__cause__)
    assert info.value.owner_id == "A" and not b.lock.is_held


def test_an_acquire_whose_read_stalls_times_out_within_its_timeout(fake_actor, bucket):
    b = fake_actor("B", **DEFAULTS, store=USERS_STORE)
    b.lock.status()  # B's client made, outside what is timed
    b.proxy.inject("delay", method="GET", delay=9.0)
    started = time.monotonic()
    with pytest.raises(LockTimeout) as info:
        b.lock.acquire(timeout=1.0)
    assert "no complete reply within 1 s; nothing was changed" in str(info.value.__cause__)
    elapsed = time.monotonic() - started
    assert elapsed <= 1.0 + SLACK, f"acquire(timeout=1.0) took {elapsed:.1f} s"
    assert not b.lock.is_held and raw_read(f"gs://{bucket}/{b.lock.key}")[0] is None


def test_status_whose_read_stalls_fails_within_its_timeout(fake_actor, bucket):
    b = fake_actor("B", **DEFAULTS, store=USERS_STORE)
    b.lock.status()
    b.proxy.inject("delay", method="GET", delay=9.0, times=10)
    started = time.monotonic()
    with pytest.raises(StorageTimeout) as info:
        b.lock.status(timeout=1.0)
    elapsed = time.monotonic() - started
    assert elapsed <= 1.0 + SLACK, f"status(timeout=1.0) took {elapsed:.1f} s"
    assert isinstance(info.value, TransientStorageError) and "request_timeout" not in str(info.value)


def test_a_short_timeout_still_makes_its_one_try(fake_actor, bucket):
    b = fake_actor("B", **DEFAULTS, store=USERS_STORE)
    assert b.lock.acquire(timeout=0)
    assert raw_read(f"gs://{bucket}/{b.lock.key}")[0].owner_id == "B"


def test_a_second_instance_in_the_process_times_out_on_the_shared_write_spacing_with_lock_timeout(gcs_emulator, bucket):
    """Two locks on one URL in one process share the store and its write gate: right after the first
    took and released the lock (two writes: the gate is empty), the second's take would wait out the
    spacing past its deadline. That is a timeout (LockTimeout), not a storage error; given time, it waits."""
    url, time_ = f"gs://{bucket}/locks/shared.json", fake_time()
    a = HandoffLock(url, owner_id="A", **time_)
    b = HandoffLock(url, owner_id="B", **time_)
    assert a.acquire()
    a.release()
    with pytest.raises(LockTimeout) as info:
        b.acquire(timeout=0.5)
    assert isinstance(info.value.__cause__, StorageTimeout) and "write spacing" in str(info.value.__cause__)
    assert b.acquire(timeout=5)  # the same gate, waited out
    b.release()


def test_a_forked_child_has_a_write_gate_of_its_own(gcs_emulator, bucket):
    """The parent wrote the object and saw a 429 (its gate widened to 8 s, nothing left in it); a child
    forked then takes the free lock at once: the parent's spacing is not the child's."""
    url = f"gs://{bucket}/locks/forked.json"
    a = HandoffLock(url, owner_id="A")
    assert a.acquire()
    a.release()
    gate = records.gate_for(a.storage, a.key, a.timing.min_write_interval, a.clock)
    gate.throttled(retry_after=8.0)
    assert gate.ready_in(a.clock.monotonic()) > 5.0
    pid = os.fork()
    if pid == 0:  # the child: exit with what it got, never back into pytest
        code = 4
        try:
            child = HandoffLock(url, owner_id="C")
            code = 0 if child.acquire(timeout=0.5) else 2
            child.release()
        except LockTimeout:
            code = 3
        except BaseException:
            code = 5
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not finish in 60 s")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0, "the child did not take the free lock at once (3: LockTimeout)"
    assert gate.ready_in(a.clock.monotonic()) > 5.0, "the parent's own gate is unchanged"
