"""Signals and events: typed release requests, receivers kept as promised, and receivers run off the renewal path."""

from __future__ import annotations

import contextlib
import gc
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
import warnings
import weakref

import pytest
from childpipes import next_line
from lockutil import FAST, eventually, make_lock, raw_read

from handofflock import (
    AcquireCancelled,
    ConfigurationError,
    HandoffLock,
    LockTimeout,
    ReleaseRequest,
    RequestReason,
    install_signal_handlers,
    os_signals,
    signals,
)
from handofflock.storage import MemoryStorage


def _requests_heard(world, lock, ask):
    got: list[dict] = []
    with signals.on_release_requested.connected_to(lambda s, **kw: got.append(kw), sender=lock):
        ask()
        world.clock.advance(0.01)
        world.sched.run_pending()
        lock._notifier.flush(lock)  # private: send what is queued now, in this thread
    return got


def _blocked_in_child() -> set[int]:
    out = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True, check=True).stdout
    mask = int(next(line for line in out.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def _closure_receiver(heard: list):
    state = {"step": 7}

    def receiver(sender, **kw):
        heard.append(("closure", state["step"]))

    return receiver


@pytest.mark.parametrize(
    "reason, requester",
    [(RequestReason.SIGNAL, "SIGTERM"), (RequestReason.PREEMPTION, "preemption"), ("operator", "ops")],
)
def test_each_kind_of_request_arrives_typed_with_who_why_and_by_when(world, reason, requester):
    a = world.lock("A")
    assert a.acquire()
    got = _requests_heard(world, a, lambda: a.request_release(reason, requester=requester, deadline=1234.5))
    request = got[0]["request"]
    assert isinstance(request, ReleaseRequest) and isinstance(request.reason, RequestReason)
    assert (request.reason, request.requester, request.deadline) == (RequestReason(reason), requester, 1234.5)
    assert got[0]["requester"] == requester and got[0]["reason"] is request.reason
    assert request.reason == RequestReason(reason).value  # still compares equal to its string
    a.release()


def test_a_waiter_request_names_the_waiter(world):
    owner, waiter = world.lock("O", min_hold=0), world.lock("W")
    assert owner.acquire()
    got: list[dict] = []
    with signals.on_release_requested.connected_to(lambda s, **kw: got.append(kw), sender=owner):
        with pytest.raises(LockTimeout):
            waiter.acquire(timeout=2.0)  # registers as the waiter; the owner's check notices; gives up
        owner._notifier.flush(owner)  # private: as above
    assert got and got[0]["request"].reason is RequestReason.WAITER and got[0]["request"].requester == "W"
    owner.release()


def test_every_request_that_stands_is_listed_until_the_hold_ends(world):
    """``request_release`` returns the request it noted; ``release_requests`` lists each that stands, the less
    urgent too, and none once the hold is over (released). One made between holds stands for the next hold."""
    a = world.lock("A")
    assert a.acquire()
    late = a.request_release("signal", requester="SIGTERM", deadline=2000.0)
    urgent = a.request_release("operator", requester="ops", deadline=1000.0)
    assert a.release_request is urgent
    assert a.release_requests == (late, urgent) and a.release_requests[0] is late
    a.release()
    assert a.release_requests == () and not a.release_requested
    between = a.request_release("signal", requester="SIGUSR1")
    assert a.acquire()
    assert a.release_requests == (between,) and a.release_request is between
    a.release()


def test_manual_is_the_deprecated_name_of_operator(world):
    a = world.lock("A")
    assert a.acquire()
    with pytest.warns(DeprecationWarning, match="operator"):
        a.request_release("manual")
    assert a.release_request.reason is RequestReason.OPERATOR
    a.release()


@pytest.mark.parametrize(
    "kwargs",
    [dict(reason="whim"), dict(reason=""), dict(deadline=float("nan")), dict(deadline="soon"), dict(deadline=True)],
)
def test_a_request_with_an_unknown_reason_or_a_bad_deadline_is_refused(world, kwargs):
    a = world.lock("A")
    assert a.acquire()
    with warnings.catch_warnings(), pytest.raises(ConfigurationError):
        a.request_release(**kwargs)
    assert not a.release_requested  # nothing half-recorded
    a.release()


def test_a_release_requested_receiver_starts_processes_that_sigterm_can_stop():
    name = f"edge-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}/locks/l.json"
    owner, waiter = make_lock(url), make_lock(url)
    seen: dict[str, object] = {}
    done = threading.Event()

    def receiver(sender, **kw):
        seen["thread"] = threading.current_thread().name
        seen["thread_mask"] = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        seen["child_mask"] = _blocked_in_child()
        done.set()

    signals.on_release_requested.connect(receiver, sender=owner)
    try:
        assert owner.acquire()
        def wait() -> None:
            with contextlib.suppress(AcquireCancelled):  # the test ends by cancelling it
                waiter.acquire(timeout=20)

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        assert done.wait(20), "on_release_requested never came"
        assert signal.SIGTERM not in seen["thread_mask"], (
            f"receiver runs in {seen['thread']} with {len(seen['thread_mask'])} signals blocked (SIGTERM among them)"
        )
        assert signal.SIGTERM not in seen["child_mask"], "a process started by the receiver has SIGTERM blocked"
    finally:
        signals.on_release_requested.disconnect(receiver, sender=owner)
        waiter.cancel()
        if owner.is_held:
            owner.release()
        t.join(10)
        owner._unschedule()  # private: stop its renewals without releasing
        waiter._unschedule()  # private: stop its renewals without releasing
        MemoryStorage.forget(name)


def test_release_request_receivers_get_the_request(world):
    a = world.lock("A")
    assert a.acquire()
    got: list[dict] = []
    with signals.on_release_requested.connected_to(lambda s, **kw: got.append(kw), sender=a):
        a.request_release(RequestReason.OPERATOR, requester="ops")
        world.sched.run_pending()
    assert isinstance(got[0]["request"], ReleaseRequest) and got[0]["request"].requester == "ops"
    a.release()


def test_a_lambda_and_a_closure_connected_with_sender_are_still_called_after_a_collection(world):
    owner = world.lock("O")
    heard: list = []
    signals.acquired.connect(lambda s, **kw: heard.append("lambda"), sender=owner)
    signals.acquired.connect(_closure_receiver(heard), sender=owner)
    gc.collect()
    try:
        assert owner.acquire()
        assert sorted(heard, key=str) == [("closure", 7), "lambda"]  # blinker does not promise an order
        owner.release()
    finally:
        for receiver in list(signals.acquired.receivers_for(owner)):
            signals.acquired.disconnect(receiver, sender=owner)


def test_a_receiver_for_any_sender_stays_too_and_weak_true_still_means_weak(world):
    owner = world.lock("O")
    heard: list = []
    strong = lambda s, **kw: heard.append("strong")  # noqa: E731
    signals.released.connect(strong)
    signals.released.connect(lambda s, **kw: heard.append("weak"), weak=True)
    gc.collect()
    try:
        assert owner.acquire()
        owner.release()
        assert heard == ["strong"]
    finally:
        signals.released.disconnect(strong)


def test_a_strong_receiver_for_one_lock_does_not_keep_that_lock_alive(world):
    owner = world.lock("O")
    signals.lost.connect(lambda s, **kw: None, sender=owner)
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


def test_a_request_noted_while_the_waiter_withdraws_is_the_request_that_stands():
    """A signal's request is noted in the main thread while the scheduler thread withdraws the waiter's
    (it left). Whatever instruction of ``request()`` the withdrawal lands after, the request that
    stands afterwards is the signal's, never the withdrawn waiter's (a rank would vote to yield
    instead of to exit, and ``Steps.request`` would name a party that left)."""
    import sys

    from handofflock.core.clock import Clock
    from handofflock.lock.requests import RequestBook

    lock = type("Lock", (), {"owner_id": "A", "url": "memory://x/l.json"})()
    code = RequestBook.request.__code__
    for nth in range(1, 80):  # the withdrawal after the nth bytecode instruction of request() past the append
        book = RequestBook(lock, Clock(), lambda *a, **k: None, yields=True)
        waiter = book.request(RequestReason.WAITER, "B", deadline=100.0)
        seen = {"n": 0, "done": False}

        def local(frame, event, arg, book=book, waiter=waiter, seen=seen):
            frame.f_trace_opcodes = True
            mine = frame.f_locals.get("request")
            if event == "opcode" and not seen["done"] and mine is not None and mine in book._requests:
                seen["n"] += 1
                if seen["n"] == nth:
                    seen["done"] = True
                    book.withdraw(waiter)  # tracing is off inside a trace function: runs whole
            return local

        def tracer(frame, event, arg):
            return local if frame.f_code is code else None

        sys.settrace(tracer)
        try:
            signal_request = book.request(RequestReason.SIGNAL, "SIGTERM", deadline=None)
        finally:
            sys.settrace(None)
        if not seen["done"]:
            break  # past the end of request(): every point was tried
        assert book.release_request is signal_request, f"withdrawn after instruction {nth}"
        assert book.release_requested
    assert nth > 3, "the withdrawal never landed inside request()"


# -- release on SIGTERM and SIGHUP where their action is the default one --------------------------------


@pytest.fixture
def default_actions():
    """SIGTERM and SIGHUP at their default action (SIG_DFL) for the test, and as they were after it."""
    found = {sig: signal.getsignal(sig) for sig in os_signals.RELEASE_SIGNALS}
    for sig in found:
        signal.signal(sig, signal.SIG_DFL)
    yield
    for sig, handler in found.items():
        signal.signal(sig, handler)


class _ReadHook(MemoryStorage):
    """A memory store that runs ``hook`` once, at the start of the next read (the lock's own operation)."""

    hook = None

    def read(self, key, **kwargs):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return super().read(key, **kwargs)


def test_a_hold_handles_only_the_signals_left_at_their_default_and_gives_them_back(default_actions):
    mine = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGHUP, mine)  # the program's own, before the lock is held
    lock = make_lock(f"memory://sig-{uuid.uuid4().hex[:8]}/l.json")
    assert lock.acquire()
    assert signal.getsignal(signal.SIGTERM) is os_signals._release_and_reraise
    assert signal.getsignal(signal.SIGHUP) is mine
    lock.release()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # no lock held: the default action again
    assert signal.getsignal(signal.SIGHUP) is mine


def test_with_release_on_signal_false_no_handler_is_installed(default_actions):
    lock = make_lock(f"memory://sig-{uuid.uuid4().hex[:8]}/l.json", release_on_signal=False)
    assert lock.acquire()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    lock.release()


def test_a_signal_in_the_middle_of_the_locks_own_call_releases_as_it_returns_then_acts(default_actions, monkeypatch):
    acted: list = []
    monkeypatch.setattr(os_signals, "act_as_before", lambda sig, frame, previous: acted.append((sig, previous)))
    store = _ReadHook(f"sig-{uuid.uuid4().hex[:8]}")
    lock = make_lock("memory://x", storage=store, key="l.json")
    other = make_lock("memory://x", storage=store, key="other.json")
    assert lock.acquire() and other.acquire()
    inside: list = []

    def sigterm_now() -> None:  # the handler, as Python runs it: between two bytecodes of this thread
        os_signals._release_and_reraise(signal.SIGTERM, None)
        inside.append((lock.is_held, other.is_held, list(acted)))

    store.hook = sigterm_now
    lock.status()  # the signal lands in its read
    assert inside == [(True, False, [])]  # deferred: nothing acted while the call was in progress
    assert not lock.is_held and acted == [(signal.SIGTERM, signal.SIG_DFL)]  # released, then the signal acted
    assert store.read("l.json") is not None and not lock.status().owner_id
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_chained_to_ours_decides_alone(default_actions):
    """install_signal_handlers() over a held lock: the first SIGTERM is a request (ours, chained to as the
    previous handler, does nothing while another is installed); the lock stays held."""
    lock = make_lock(f"memory://sig-{uuid.uuid4().hex[:8]}/l.json")
    assert lock.acquire()
    handlers = install_signal_handlers(lock, [signal.SIGTERM], grace=5)
    try:
        signal.raise_signal(signal.SIGTERM)
        assert lock.is_held and lock.release_requested
        assert lock.release_request.requester == "SIGTERM"
    finally:
        handlers.uninstall()
    assert signal.getsignal(signal.SIGTERM) is os_signals._release_and_reraise  # put back: the lock is held
    lock.release()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("opt_out", [False, True])
def test_an_async_lock_on_a_loop_in_the_main_thread_takes_the_same_keyword(default_actions, opt_out):
    import anyio

    from handofflock.aio import AsyncHandoffLock

    async def main():
        url = f"memory://sig-{uuid.uuid4().hex[:8]}/l.json"
        lock = AsyncHandoffLock(url, **FAST, **({"release_on_signal": False} if opt_out else {}))
        assert await lock.acquire()
        during = signal.getsignal(signal.SIGTERM)
        await lock.release()
        return during, signal.getsignal(signal.SIGTERM)

    during, after = anyio.run(main)
    assert during is (signal.SIG_DFL if opt_out else os_signals._release_and_reraise)
    assert after is signal.SIG_DFL


@pytest.mark.timeout(60)
def test_install_signal_handlers_after_the_hold_began_keeps_its_meaning_in_a_real_process(tmp_path):
    """First SIGTERM: a request; second: released at once and the process ends with SIGTERM."""
    url = str(tmp_path / "l.json")
    script = textwrap.dedent(f"""
        import time
        from handofflock import HandoffLock, install_signal_handlers
        with HandoffLock({url!r}, ttl=60.0) as lock:
            install_signal_handlers(lock, grace=25)
            print("held", flush=True)
            while not lock.release_requested:
                time.sleep(0.02)
            print("asked", lock.is_held, flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert next_line(proc) == "held\n"
        proc.send_signal(signal.SIGTERM)
        assert next_line(proc) == "asked True\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
        assert HandoffLock(url, ttl=60.0).acquire(blocking=False)  # released before the signal acted
    finally:
        proc.kill()
        proc.communicate()


# -- a release from a signal handler while acquire() takes the lock -------------------------------------


@pytest.mark.parametrize("found", ["absent", "free"])  # acquire() sends a CREATE, or a TAKE
def test_a_release_from_a_signal_handler_at_any_point_of_acquire_never_leaves_a_true_acquired(found):
    """The handler's ``release()`` lands after each bytecode instruction of acquire() in turn (of its
    loop, of the write it sends, of becoming the owner): deferred to acquire()'s end, it releases the
    hold acquire() just got, and acquire() then raises AcquireCancelled, as an acquire that a release
    stopped while waiting does. It never returns a true Acquired for a hold the lock no longer has."""
    from handofflock.lock.handoff import HandoffLock as Lock
    from handofflock.storage.records import RecordStore

    codes = {Lock._acquire.__code__, Lock._became_owner.__code__, RecordStore.write.__code__}
    nth = 0
    while True:
        nth += 1
        url = f"memory://deferred-{uuid.uuid4().hex[:8]}/l.json"
        if found == "free":
            prior = make_lock(url)
            assert prior.acquire()
            prior.release()
        lock = make_lock(url, release_on_signal=False)
        seen = {"n": 0, "done": False}

        def local(frame, event, arg, lock=lock, seen=seen):
            frame.f_trace_opcodes = True
            if event == "opcode" and not seen["done"]:
                seen["n"] += 1
                if seen["n"] == nth:
                    seen["done"] = True
                    lock.release()  # as a signal handler would: in this thread, inside acquire()
            return local

        def tracer(frame, event, arg):
            return local if frame.f_code in codes else None

        got: object = None
        sys.settrace(tracer)
        try:
            got = lock.acquire()
        except AcquireCancelled:
            pass
        finally:
            sys.settrace(None)
        if not seen["done"]:
            break  # past the end of acquire(): every point was tried
        assert not got, f"acquire() returned a hold released after instruction {nth}"
        assert not lock.is_held
        record, _ = raw_read(url)
        assert record is None or record.owner_id is None, f"left held after instruction {nth}"
        MemoryStorage.forget(url.split("/")[2])
    assert nth > 50, "the release never landed inside acquire()"


def test_a_release_from_a_signal_handler_as_acquire_accepts_a_handoff_ends_that_acquire_too():
    """The handler lands as the waiter's acquire() takes the handed-over lock (a receiver of ``acquired``
    runs at that very point, in acquire()'s thread): acquire() raises AcquireCancelled, and the lock is
    free for others, never returned to a caller that no longer holds it."""
    url = f"memory://deferred-{uuid.uuid4().hex[:8]}/l.json"
    owner, waiter = make_lock(url), make_lock(url, release_on_signal=False)
    assert owner.acquire()
    outcome: dict = {}

    def as_a_signal_handler(sender, handoff, **kw):
        outcome["handoff"] = handoff
        waiter.release()  # in acquire()'s thread, inside acquire(): deferred to its end

    def wait() -> None:
        try:
            outcome["got"] = waiter.acquire(timeout=20)
        except AcquireCancelled as exc:
            outcome["error"] = exc

    signals.acquired.connect(as_a_signal_handler, sender=waiter)
    t = threading.Thread(target=wait)
    t.start()
    try:
        eventually(lambda: owner.release_requested, what="the waiter's request")
        assert owner.release() == waiter.owner_id  # handed to the waiter
        t.join(20)
        assert outcome.get("handoff") is True and "got" not in outcome, outcome
        assert isinstance(outcome.get("error"), AcquireCancelled)
        assert not waiter.is_held and raw_read(url)[0].owner_id is None
    finally:
        signals.acquired.disconnect(as_a_signal_handler, sender=waiter)
        waiter.cancel()
        t.join(10)
