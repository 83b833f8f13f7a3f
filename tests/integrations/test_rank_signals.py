"""RankSignals: which signals a rank takes as one request to stop together, and which one means "now".

Real signals sent to this process; the time a handler runs at is set by the test (a rank blocked
in a collective runs its handlers only when the collective returns, so a copy of a signal sent
milliseconds after the first may be handled seconds after it).
"""

from __future__ import annotations

import os
import signal
import types
import uuid
import warnings

import pytest

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock import os_signals
from handofflock.core.errors import StoppedWithoutCheckpointWarning
from handofflock.integrations.ranks import REPEAT_WINDOW, RankLock, RankSignals, local_agree
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@pytest.fixture
def handled_at(monkeypatch):
    """The monotonic time the handlers see, set by the test: ``handled_at[0] = seconds``."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    now = [1000.0]
    monkeypatch.setattr(os_signals, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=os_signals.time.time))
    yield now
    for s, h in saved.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)


@pytest.fixture
def job():
    """A job of one rank, the holder, holding its lock; its background duties run only when the test says so."""
    name = f"ranksig-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=60.0, owner_id="job", clock=clock,
                       scheduler=Scheduler(clock, autostart=False))
    ranks = RankLock(lock, local_agree, rank=0, poll=0.01)
    ranks.acquire()
    yield ranks
    if lock.is_held:
        lock.release()
    MemoryStorage.forget(name)


def spy(seen, name):
    """A previous handler (Lightning's SIGTERM handler, say) that only notes it ran."""
    return lambda signum, frame: seen.append(name)


def stopped_together(ranks: RankLock) -> tuple[str, str, int]:
    """Run the agreed stop: the next agreement, then the release."""
    assert ranks.held and ranks.lock.is_held, "the hold was abandoned"
    assert ranks.should_stop()
    decision = ranks.decision
    ranks.release()
    return decision.action, decision.cause, decision.exit_status


def test_a_sigterm_copy_handled_long_after_the_first_is_the_same_request_and_the_ranks_stop_together(
    handled_at, job
):
    seen: list[str] = []
    signal.signal(signal.SIGTERM, spy(seen, "lightning's SIGTERM handler"))
    handlers = RankSignals(job).install()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        signal.raise_signal(signal.SIGTERM)  # the test's (or Slurm's) copy
        handled_at[0] += 5 * REPEAT_WINDOW  # the rank sat in a collective meanwhile
        signal.raise_signal(signal.SIGTERM)  # torchrun's copy, sent milliseconds later
        assert signal.getsignal(signal.SIGTERM) == handlers._handle, "still ours: the stop is ours to carry out"
        assert stopped_together(job) == ("exit", "SIGTERM", 143)
    assert seen == [], "the earlier SIGTERM handler ran inside ours"
    assert handlers.received == ["SIGTERM", "SIGTERM"]
    assert not [w for w in warned if issubclass(w.category, StoppedWithoutCheckpointWarning)]
    assert job.lock.status().owner_id is None, "released by the agreed stop"
    handlers.uninstall()


def test_slurms_sigterm_at_the_time_limit_after_its_sigusr1_lets_the_agreed_stop_go_on(handled_at, job):
    seen: list[str] = []
    signal.signal(signal.SIGUSR1, spy(seen, "lightning's requeue"))
    signal.signal(signal.SIGTERM, spy(seen, "lightning's SIGTERM handler"))
    handlers = RankSignals(job).install()
    signal.raise_signal(signal.SIGUSR1)  # --signal=USR1@N
    handled_at[0] += 60.0
    signal.raise_signal(signal.SIGTERM)  # the time limit
    assert stopped_together(job) == ("exit", "SIGUSR1", 128 + signal.SIGUSR1)
    assert seen == ["lightning's requeue"], "SIGUSR1's earlier handler chains; SIGTERM's must not run"
    handlers.uninstall()


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=["after_sigint", "after_sigterm"])
def test_a_second_sigint_past_the_window_stops_now_without_a_checkpoint_and_warns(handled_at, job, first):
    seen: list[str] = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, spy(seen, "lightning's SIGTERM handler"))
    handlers = RankSignals(job).install()
    signal.raise_signal(first)  # a request: no KeyboardInterrupt
    assert job.held and job.lock.is_held
    handled_at[0] += REPEAT_WINDOW
    with pytest.warns(StoppedWithoutCheckpointWarning, match="rank 0: a second signal .*without a checkpoint"):
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # Ctrl-C again
    assert not job.held and not job.lock.is_held
    assert job.lock.status().owner_id is None, "the holder let the lock go at once"
    assert seen == [], "a SIGINT's 'now' ran the earlier SIGTERM handler"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handlers found at install are back"
    assert handlers.received == [first.name, "SIGINT"]


def test_a_second_sigint_within_the_window_is_the_same_ctrl_c(handled_at, job):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    handlers = RankSignals(job).install()
    signal.raise_signal(signal.SIGINT)  # the terminal's copy
    handled_at[0] += REPEAT_WINDOW / 2
    signal.raise_signal(signal.SIGINT)  # torchrun's
    assert stopped_together(job) == ("exit", "SIGINT", 130)
    handlers.uninstall()


def test_torchruns_sigterm_after_a_second_ctrl_c_stops_now_and_ends_the_process_by_it(handled_at, job, monkeypatch):
    """torchrun starts its workers in sessions of their own: a terminal's Ctrl-C reaches torchrun alone, which
    sends its workers SIGINT, and on a second Ctrl-C SIGTERM. That SIGTERM means "now"; it ends the process
    by its default action, never through the SIGTERM handler found at install (Lightning's)."""
    seen: list[str] = []
    killed: list[tuple[int, int]] = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, spy(seen, "lightning's SIGTERM handler"))
    handlers = RankSignals(job).install()
    signal.raise_signal(signal.SIGINT)  # Ctrl-C: torchrun's SIGINT
    assert job.held and job.lock.is_held
    handled_at[0] += REPEAT_WINDOW
    monkeypatch.setattr(os_signals.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    with pytest.warns(StoppedWithoutCheckpointWarning, match=r"SIGTERM, after SIGINT.*, the lock released"):
        signal.raise_signal(signal.SIGTERM)  # Ctrl-C again: torchrun's shutdown
    assert killed == [(os.getpid(), signal.SIGTERM)], "SIGTERM's default action: the process ends by it"
    assert seen == [], "the earlier SIGTERM handler ran"
    assert not job.held and job.lock.status().owner_id is None, "the holder let the lock go at once"
    assert handlers.received == ["SIGINT", "SIGTERM"]


def test_a_signal_while_now_lets_the_lock_go_does_not_end_the_process_before_the_release(handled_at, job, monkeypatch):
    """torchrun's SIGTERM "now" (after a Ctrl-C), and another SIGTERM (a launcher's, or the kubelet's) while the
    holder's release is on its way to the store: the process must not end, nor run the earlier SIGTERM handler,
    with the lock still held; it ends by SIGTERM once the lock is let go."""
    seen: list[str] = []
    killed: list[tuple[int, int]] = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, spy(seen, "lightning's SIGTERM handler"))
    handlers = RankSignals(job).install()
    signal.raise_signal(signal.SIGINT)
    handled_at[0] += REPEAT_WINDOW
    monkeypatch.setattr(os_signals.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    release, held_then = job.lock.release, []

    def release_meanwhile_signalled():
        signal.raise_signal(signal.SIGTERM)  # the store has not answered yet
        held_then.append(job.lock.is_held)
        return release()

    monkeypatch.setattr(job.lock, "release", release_meanwhile_signalled)
    with pytest.warns(StoppedWithoutCheckpointWarning, match=r"SIGTERM, after SIGINT.*, the lock released"):
        signal.raise_signal(signal.SIGTERM)
    assert held_then == [True] and seen == [], "a signal during the release ran the earlier handler"
    assert killed == [(os.getpid(), signal.SIGTERM)], "the process ends by SIGTERM once, after the release"
    assert job.lock.status().owner_id is None
    assert handlers.received == ["SIGINT", "SIGTERM", "SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) is not handlers._handle, "the handlers found at install are back"


def test_after_start_over_the_first_ctrl_c_of_the_next_run_asks_again(handled_at, job):
    """Handlers installed by hand (not by rank_lock, so start_over() does not replace them): Ctrl-C stops the
    first run together; start_over() forgets that SIGINT exit, and the next run takes the lock. A Ctrl-C in it,
    minutes later, is the first of that run: the ranks stop together again, with a checkpoint. Taking it as
    the second Ctrl-C would drop the checkpoint and the other ranks."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    handlers = RankSignals(job).install()
    signal.raise_signal(signal.SIGINT)
    assert stopped_together(job) == ("exit", "SIGINT", 130)
    job.start_over()
    job.acquire()
    handled_at[0] += 600.0
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            signal.raise_signal(signal.SIGINT)  # the next run's first Ctrl-C
        except KeyboardInterrupt:
            pytest.fail("the next run's first Ctrl-C was taken as a second one: stopped now, without a checkpoint")
    assert not [w for w in warned if issubclass(w.category, StoppedWithoutCheckpointWarning)]
    assert stopped_together(job) == ("exit", "SIGINT", 130)
    assert handlers.received == ["SIGINT", "SIGINT"]
    handlers.uninstall()
