"""PreemptionWatcher against a metadata server played by http.server on 127.0.0.1."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
import uuid

import pytest
from fake_metadata import FakeMetadataServer, let_run

from handofflock import ConfigurationError, FakeClock, HandoffLock, Scheduler, signals
from handofflock.preemption import DEFAULT_METADATA_HOST, METADATA_IP, PreemptionWatcher
from handofflock.storage import MemoryStorage

FAST = dict(backoff_initial=0.05, backoff_max=0.2, request_timeout=0.5, poll_timeout=5)


@pytest.fixture
def lock():
    name = f"pre-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=60.0, clock=clock, scheduler=Scheduler(clock, autostart=False))
    lock.acquire()
    yield lock
    MemoryStorage.forget(name)


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_notice_arriving_mid_run_becomes_a_preemption_request(lock):
    with FakeMetadataServer() as server:
        watcher = PreemptionWatcher(lock, host=server.host, notice_grace=30.0, **FAST).start()
        assert wait_until(lambda: server.waits >= 1), "the watcher long-polls after its first read"
        time.sleep(0.3)
        assert not lock.release_requested
        server.preempt()
        assert watcher.wait(5)
        request = lock.release_request
        assert (request.reason, request.requester) == ("preemption", "preemption")
        assert request.deadline == pytest.approx(watcher.noticed_at + 30.0)
        assert watcher.preempted and lock.release_requested and lock.is_held
        assert wait_until(lambda: not watcher.running)
        assert len(server.requests) <= 4, f"long polls, not a flood: {server.requests}"
        watcher.stop()


def test_a_notice_already_there_at_start_is_seen_at_once(lock):
    with FakeMetadataServer() as server:
        server.preempt()
        with PreemptionWatcher(lock, host=server.host, **FAST) as watcher:
            assert watcher.wait(5)
        assert lock.release_request.reason == "preemption"


def test_every_request_carries_the_metadata_flavor_header_the_server_insists_on(lock):
    with FakeMetadataServer() as server:
        req = urllib.request.Request(f"http://{server.host}/computeMetadata/v1/instance/preempted")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=5)
        assert info.value.code == 403 and server.refused == 1, "the stand-in checks the header"
        with PreemptionWatcher(lock, host=server.host, **FAST) as watcher:
            assert wait_until(lambda: server.waits >= 1)
            server.preempt()
            assert watcher.wait(5)
        assert server.refused == 1, "no request of the watcher was refused"
        assert all(flavor == "Google" for _, flavor in server.requests[1:])


def test_a_reply_without_the_metadata_flavor_header_is_not_believed(lock):
    with FakeMetadataServer(flavor_header=False) as server:
        server.preempt()
        with PreemptionWatcher(lock, host=server.host, **FAST) as watcher:
            assert wait_until(lambda: watcher.attempts >= 2)
            assert not watcher.wait(0.2)
        assert not lock.release_requested
        assert "Metadata-Flavor" in str(watcher.last_error)


def test_no_server_means_backing_off_not_a_flood_of_requests(lock):
    port = free_port()  # nothing listens there: connection refused
    clock = FakeClock()
    watcher = PreemptionWatcher(lock, host=f"127.0.0.1:{port}", backoff_initial=0.05, backoff_max=0.2, clock=clock)
    watcher.start()
    let_run(clock, 1.0)
    watcher.stop()
    assert not watcher.running
    # Without backoff this would be thousands. With 0.05 s doubling to a 0.2 s cap and full jitter (a draw
    # in [0, ceiling]) the mean is about 10 a second; 40 would take 37 draws averaging under 0.027 s.
    assert 2 <= watcher.attempts <= 40, watcher.attempts
    assert isinstance(watcher.last_error, ConnectionRefusedError)
    assert not lock.release_requested


def test_a_server_that_never_answers_costs_bounded_timeouts(lock):
    with FakeMetadataServer(hang=True) as server:
        # Backoffs pass at once on the fake clock, so only the requests' own timeouts (5 fit in the sleep) space them.
        clock = FakeClock(step=0.01)
        watcher = PreemptionWatcher(
            lock, host=server.host, request_timeout=0.06, backoff_initial=0.05, backoff_max=0.1, clock=clock
        ).start()
        time.sleep(0.3)
        assert 2 <= watcher.attempts <= 6, watcher.attempts
        assert isinstance(watcher.last_error, (socket.timeout, TimeoutError))
        started = time.monotonic()
        watcher.stop()
        assert time.monotonic() - started < 3.0 and not watcher.running  # not a whole poll; a bound a loaded machine meets
    assert not lock.release_requested


def test_stop_interrupts_a_long_poll_in_flight(lock):
    with FakeMetadataServer() as server:
        watcher = PreemptionWatcher(lock, host=server.host, **dict(FAST, poll_timeout=60)).start()
        assert wait_until(lambda: server.waits >= 1)
        time.sleep(0.1)
        started = time.monotonic()
        watcher.stop()
        assert time.monotonic() - started < 3.0 and not watcher.running  # not a whole poll; a bound a loaded machine meets


def test_gce_metadata_host_names_the_server(monkeypatch, lock):
    monkeypatch.setenv("GCE_METADATA_HOST", "10.1.2.3:8080")
    watcher = PreemptionWatcher(lock)
    assert (watcher.host, watcher.provider) == ("10.1.2.3:8080", "gce"), "google-auth's variable says GCE, and where"
    monkeypatch.delenv("GCE_METADATA_HOST")
    assert PreemptionWatcher(lock, provider="gce").host == DEFAULT_METADATA_HOST
    watcher = PreemptionWatcher(lock)
    assert (watcher.host, watcher.provider) == (METADATA_IP, None), "auto: every cloud's address, found by probing"
    with pytest.raises(ConfigurationError):
        PreemptionWatcher(lock, poll_timeout=0)
    with pytest.raises(ConfigurationError):
        PreemptionWatcher(lock, notice_grace=-1)


def test_a_preemption_is_announced_as_a_release_request_never_as_a_renewal_error():
    name = f"pre-{uuid.uuid4().hex[:8]}"
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=10.0)  # the real scheduler sends the signals
    requested, errors = [], []
    on_request = lambda sender, **kw: requested.append(kw)  # noqa: E731
    on_error = lambda sender, **kw: errors.append(kw)  # noqa: E731
    signals.on_release_requested.connect(on_request, sender=lock)
    signals.on_renewal_error.connect(on_error, sender=lock)
    try:
        with lock, FakeMetadataServer() as server:
            server.preempt()
            with PreemptionWatcher(lock, host=server.host, **FAST) as watcher:
                assert watcher.wait(5)
            assert wait_until(lambda: requested)
            assert requested[0]["reason"] == "preemption" and requested[0]["waiter_id"] == "preemption"
            assert lock.healthy
        assert errors == []
    finally:
        signals.on_release_requested.disconnect(on_request, sender=lock)
        signals.on_renewal_error.disconnect(on_error, sender=lock)
        MemoryStorage.forget(name)
