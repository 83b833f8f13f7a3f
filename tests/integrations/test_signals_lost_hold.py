"""A signal and a hold that was lost (not released): the loss is the store's doing, not an answer to the request."""

from __future__ import annotations

import signal

import pytest

from handofflock import LockLost
from handofflock.os_signals import install_signal_handlers
from handofflock.repair import force_release
from signalsutil import kills, new_lock, restore_signals, store_name  # noqa: F401


def lose(lock) -> None:
    """The hold is lost: the record is taken from under it, and the next renewal finds that."""
    force_release(lock.url)
    lock._clock.advance(lock.renew_interval)
    lock._scheduler.run_pending()  # the renewal
    assert not lock.is_held
    with pytest.raises(LockLost):
        lock.check()


def test_a_sigterm_after_the_loss_asks_the_next_hold(store_name, restore_signals, monkeypatch):
    """The hold is lost (a store outage); the pod's one SIGTERM comes before the loop has let the lost hold go, and
    the loop acquires again. The hold the SIGTERM could ask is the next one (jobs.md: "a signal between holds asks
    the next one, as one during acquire() does"): it must stand there, or the next hold trains on until SIGKILL,
    with no checkpoint (Kubernetes and Slurm send SIGTERM once)."""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = new_lock(store_name)
    handlers = install_signal_handlers(lock, [signal.SIGTERM])
    lock.acquire()
    lose(lock)
    signal.raise_signal(signal.SIGTERM)  # the process is going away; the lost hold is not let go yet
    assert killed == []
    lock.acquire()  # the loop's retry: the lost hold is let go here
    assert lock.release_requested, "the SIGTERM was dropped with the lost hold: the next hold is never asked"
    assert list(lock.steps(range(3))) == []
    handlers.uninstall()


def test_a_second_sigterm_after_the_asked_hold_was_lost_is_now(store_name, restore_signals, monkeypatch):
    """SIGTERM asks; before the loop reaches a step the hold is lost (the request was never answered by a
    checkpoint and a release), and the ``with`` block's exit lets the lost hold go (release() raises LockLost).
    The launcher's second SIGTERM is the user's "stop now": taking it as a first signal again only records a
    request for a hold that may never come, and the process does not stop."""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = new_lock(store_name)
    handlers = install_signal_handlers(lock, [signal.SIGTERM])
    lock.acquire()
    signal.raise_signal(signal.SIGTERM)  # asks
    lose(lock)
    with pytest.raises(LockLost):
        lock.release()  # the with block's exit
    signal.raise_signal(signal.SIGTERM)  # again
    assert killed == [signal.SIGTERM], "a second SIGTERM after an unanswered request did not stop the process"
    handlers.uninstall()
