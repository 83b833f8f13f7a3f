"""Issue 25, item 4: a host suspend is not invisible to ``healthy`` and ``check()``.

``time.monotonic()`` stops while a Linux host sleeps; the wall clock (and
``CLOCK_BOOTTIME``) jumps on at resume. After 300 s asleep another host has
legitimately taken the lease, and the old owner must not pass ``check()``.
The lease is counted on a clock that includes a suspend, and the wall clock is
a second opinion. A wall clock set back (NTP) never makes a healthy lock
unhealthy. FakeClock's ``suspend()`` and ``jump_wall()`` play the host.
"""

from __future__ import annotations

import time

import pytest

from handofflock import LockLost
from handofflock.core.clock import Clock, FakeClock

from simworld import KEY  # noqa: F401  (the world fixture is in conftest.py)


def test_a_wall_clock_that_jumps_while_monotonic_time_stands_still_fails_check(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.jump_wall(300.0)  # resumed from a suspend the monotonic clock did not see
    assert not a.healthy
    with pytest.raises(LockLost, match="suspended"):
        a.check()


def test_a_suspend_longer_than_the_renew_deadline_ends_the_hold(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    mono = world.clock.monotonic()
    world.clock.suspend(300.0)
    assert world.clock.monotonic() == mono, "monotonic time stands still in a suspend"
    assert not a.healthy
    with pytest.raises(LockLost):
        a.check()
    world.clock.run_for(0.5)  # the scheduler's next look, on resume: the boot clock says it ran out
    assert a._state.value == "lost"
    with pytest.raises(LockLost, match="renew"):
        a.check()


def test_a_short_suspend_costs_nothing(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.suspend(1.0)
    assert a.healthy
    world.clock.run_for(30.0)
    assert a.healthy
    a.release()


def test_a_wall_clock_set_back_never_makes_a_healthy_lock_unhealthy(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.jump_wall(-300.0)
    assert a.healthy
    world.clock.run_for(30.0)  # renewals go on from the wall clock as it is now
    assert a.healthy
    a.check()
    a.release()


def test_a_wall_clock_set_forward_fails_check_only_until_the_next_renewal(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.jump_wall(60.0)
    assert not a.healthy
    world.clock.run_for(a.renew_interval + 0.5)
    assert a.healthy, "a renewal written from the new wall clock makes the lease good again"
    a.release()


def test_the_boot_clock_is_one_time_base_of_its_own():
    real = Clock()
    b1 = real.boottime()
    time.sleep(0.01)
    assert real.boottime() > b1
    fake = FakeClock()
    boot, mono = fake.boottime(), fake.monotonic()
    fake.suspend(5.0)
    assert fake.boottime() == boot + 5.0 and fake.monotonic() == mono
    fake.advance(1.0)
    assert fake.boottime() == boot + 6.0 and fake.skewed(3.0).boottime() == boot + 6.0
