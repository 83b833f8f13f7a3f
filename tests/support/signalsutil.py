"""Fixtures and helpers shared by the tests that send this process real signals."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from handofflock import FakeClock, HandoffLock, Scheduler, os_signals
from handofflock.storage import MemoryStorage

#: Every signal a signal test may install a handler for.
TOUCHED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


@pytest.fixture
def restore_signals():
    """Put every handler this test may touch back as it was."""
    saved = {s: signal.getsignal(s) for s in TOUCHED}
    yield
    for s, h in saved.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)


@pytest.fixture
def store_name():
    name = f"sig-{uuid.uuid4().hex[:8]}"
    yield name
    MemoryStorage.forget(name)


def new_lock(store_name, owner="owner", **kw):
    """A lock whose background duties run only when the test says so."""
    clock = FakeClock()
    return HandoffLock(f"memory://{store_name}/lock.json", ttl=60.0, owner_id=owner, clock=clock,
                       scheduler=Scheduler(clock, autostart=False), **kw)  # fmt: skip


def held_lock(store_name, owner="owner"):
    """:func:`new_lock`, held."""
    lock = new_lock(store_name, owner)
    lock.acquire()
    return lock


def kills(monkeypatch) -> list:
    """What the library's "now" asks ``os.kill`` to send, recorded instead of sent: the signal, when it is sent
    to this process (as it must be), else ``(pid, signal)``."""
    killed: list = []

    def kill(pid: int, sig: int) -> None:
        killed.append(sig if pid == os.getpid() else (pid, sig))

    monkeypatch.setattr(os_signals.os, "kill", kill)
    return killed


def signal_as_release_goes_out(monkeypatch, lock, signum) -> None:
    """``signum`` lands in ``lock.release()`` before its write goes out (the store has not answered yet)."""
    release = lock.release

    def release_meanwhile():
        signal.raise_signal(signum)
        return release()

    monkeypatch.setattr(lock, "release", release_meanwhile)
