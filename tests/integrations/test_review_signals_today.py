"""Review repros for the "now" that waits for its release (os_signals.CaughtSignals._handle)."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock import os_signals
from handofflock.os_signals import install_signal_handlers
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield
    for s, h in saved.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)


@pytest.fixture
def store_name():
    name = f"sig-{uuid.uuid4().hex[:8]}"
    yield name
    MemoryStorage.forget(name)


def held_lock(store_name, owner="owner"):
    clock = FakeClock()
    lock = HandoffLock(f"memory://{store_name}/lock.json", ttl=60.0, owner_id=owner, clock=clock,
                       scheduler=Scheduler(clock, autostart=False))
    lock.acquire()
    return lock


def test_handlers_installed_again_after_a_now_still_let_ctrl_c_act(store_name, restore_signals):
    """A notebook's next run: Ctrl-C twice ended the first run (released, KeyboardInterrupt); the same handlers
    are installed again for the next hold (install() is documented as callable again). Ctrl-C must still be
    able to interrupt: the "now" under way ended with the first run."""
    lock = held_lock(store_name)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    handlers = install_signal_handlers(lock)
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert lock.status().owner_id is None
    lock.acquire()  # the next run
    handlers.install()
    with pytest.raises(KeyboardInterrupt):  # at the latest on the second press
        for _ in range(2):
            signal.raise_signal(signal.SIGINT)
    assert lock.status().owner_id is None, "the lock was let go before the interrupt"
