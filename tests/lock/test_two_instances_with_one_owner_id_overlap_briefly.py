"""Issue 25: two live instances with one stable ``owner_id`` overlap, for at most one check interval.

A second instance with the same id retakes the lock at once (a restarted job
must not wait out its own lease), with a new token. The first instance learns
of it at its next renewal or waiter check, whichever comes first, and from then
on fails ``check()``; until then both pass it. So with a stable id (``--owner-id``)
work on shared state must be fenced (``lock.token``). docs/design.md says so.
"""

from __future__ import annotations

import pytest

from handofflock import LockLost

from simworld import KEY  # noqa: F401  (the world fixture is in conftest.py)


def test_the_first_check_after_a_same_id_retake_ends_the_old_instance(world):
    first = world.lock("job-7", ttl=60.0)
    assert first.acquire(timeout=5)
    second = world.lock("job-7", ttl=60.0)
    assert second.acquire(timeout=5)
    assert second.token > first.token, "the retake fences the old instance"
    first.check()  # the overlap: both pass check() until the first instance next reads or writes
    world.clock.run_for(first.waiter_check_interval + 0.25)  # its first check since the retake
    with pytest.raises(LockLost, match="retaken under our id|another instance with our id"):
        first.check()
    second.check()
    second.release()
