"""A release request belongs to its hold: a hold that was lost does not pass its requests on to the next."""

from __future__ import annotations

import threading
import uuid

import pytest
from lockutil import eventually, make_lock

from handofflock import HandoffLockError, LockLost
from handofflock.repair import force_release
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.timeout(60)


def test_a_lost_hold_does_not_pass_its_waiters_request_on_to_the_next_hold():
    """A lock that was lost keeps its hold's requests (``_end_hold`` runs only from ``release()``),
    and ``acquire()`` is allowed from LOST. The next hold starts with ``release_requested`` True,
    naming a waiter of the previous hold who is long gone (here: it became the owner and left):
    a ``steps()`` loop stops before its first step and hands the lock to nobody. (The new
    withdrawal mechanism clears it at the first waiter check, an interval later; a signal's or
    a preemption notice's request from the previous hold is never withdrawn.)"""
    name = f"edge-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}/locks/l.json"
    owner, waiter = make_lock(url), make_lock(url)
    got: dict[str, object] = {}
    try:
        assert owner.acquire()
        t = threading.Thread(target=lambda: got.setdefault("w", waiter.acquire(timeout=20)), daemon=True)
        t.start()
        eventually(lambda: owner.release_requested, what="the owner hears of the waiter")
        force_release(url)  # an operator clears the lock: the waiter takes it, the owner finds out
        t.join(20)
        assert got.get("w") is True and waiter.is_held
        # private: "lost" has no public flag of its own (is_held is False after a release too)
        eventually(lambda: owner._state == "lost", what="the owner notices its loss")
        waiter.release()
        assert owner.acquire(blocking=False)  # the same instance takes the lock again (no release() between)
        stale = owner.release_request
        assert not owner.release_requested, (
            f"the new hold starts with the previous hold's request standing: {stale}"
        )
    finally:
        for lk in (owner, waiter):
            lk.cancel()
            if lk.is_held:
                try:
                    lk.release()
                except HandoffLockError:
                    pass
            lk._unschedule()  # private: stop its renewals without releasing
        MemoryStorage.forget(name)
