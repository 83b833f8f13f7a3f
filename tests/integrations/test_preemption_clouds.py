"""PreemptionWatcher on AWS (IMDSv2 spot notices) and Azure (Scheduled Events), and finding the cloud it runs on.

Each cloud's metadata server is played by http.server on 127.0.0.1 (tests/fake_metadata.py).
"""

from __future__ import annotations

import socket
import time
import uuid

import pytest
from fake_metadata import FakeAwsMetadataServer, FakeAzureMetadataServer, FakeMetadataServer, let_run

from handofflock import ConfigurationError, FakeClock, HandoffLock, Scheduler
from handofflock.preemption import PreemptionWatcher
from handofflock.storage import MemoryStorage

FAST = dict(backoff_initial=0.05, backoff_max=0.2, request_timeout=0.5, poll_timeout=5, poll_interval=0.05)
SERVERS = {"gce": FakeMetadataServer, "aws": FakeAwsMetadataServer, "azure": FakeAzureMetadataServer}


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


def notify(server, at: float | None = None) -> None:
    """The cloud's notice, in its own words."""
    if isinstance(server, FakeAwsMetadataServer):
        server.notice("terminate", at=at)
    elif isinstance(server, FakeAzureMetadataServer):
        server.schedule("Preempt", not_before=at)
    else:
        server.preempt()


# -- AWS ------------------------------------------------------------------------


def test_aws_a_spot_notice_after_404s_becomes_a_request_due_at_the_time_aws_names(lock):
    with FakeAwsMetadataServer() as server:
        watcher = PreemptionWatcher(lock, provider="aws", host=server.host, **FAST).start()
        assert wait_until(lambda: server.count("GET", server.ACTION) >= 3), "404 (no notice) and polling on"
        assert not lock.release_requested and watcher.running
        stop_at = int(time.time()) + 120  # AWS names the second
        server.notice("terminate", at=stop_at)
        assert watcher.wait(5)
        request = lock.release_request
        assert (request.reason, request.requester) == ("preemption", "preemption")
        assert request.deadline == watcher.deadline == stop_at
        assert (watcher.notice.provider, watcher.notice.kind) == ("aws", "terminate")
        watcher.stop()
    puts = [h for m, _, h in server.requests if m == "PUT"]
    assert len(puts) == 1 and puts[0]["X-aws-ec2-metadata-token-ttl-seconds"] == "21600", "one token, reused"
    gets = [h for m, _, h in server.requests if m == "GET"]
    assert gets and all(h.get("X-aws-ec2-metadata-token") in server.tokens for h in gets)


def test_aws_an_expired_token_is_fetched_again_and_the_notice_still_heard(lock):
    with FakeAwsMetadataServer() as server:
        with PreemptionWatcher(lock, provider="aws", host=server.host, **FAST) as watcher:
            assert wait_until(lambda: server.count("GET", server.ACTION) >= 2)
            server.expire_tokens()
            assert wait_until(lambda: server.count("PUT", "/latest/api/token") >= 2), "a 401 brings a new token"
            server.notice("stop")
            assert watcher.wait(5)
        assert watcher.notice.kind == "stop" and lock.release_requested


def test_aws_a_rebalance_recommendation_counts_only_when_asked_for(lock):
    with FakeAwsMetadataServer() as server:
        server.recommend_rebalance()
        with PreemptionWatcher(lock, provider="aws", host=server.host, **FAST) as watcher:
            assert wait_until(lambda: server.count("GET", server.ACTION) >= 3)
            assert not watcher.wait(0.1) and server.count("GET", server.REBALANCE) == 0
        with PreemptionWatcher(lock, provider="aws", host=server.host, aws_rebalance=True, **FAST) as watcher:
            assert watcher.wait(5)
        assert watcher.notice.kind == "rebalance"
        assert watcher.deadline == pytest.approx(watcher.noticed_at + 30.0), "AWS names no time: notice_grace"


def test_a_notice_grace_given_brings_a_later_cloud_deadline_forward(lock):
    with FakeAwsMetadataServer() as server:
        server.notice("terminate", at=time.time() + 120)
        with PreemptionWatcher(lock, provider="aws", host=server.host, notice_grace=20.0, **FAST) as watcher:
            assert watcher.wait(5)
        assert lock.release_request.deadline == pytest.approx(watcher.noticed_at + 20.0)


def test_aws_hibernation_names_no_time_to_spare_and_the_deadline_is_now(lock):
    with FakeAwsMetadataServer() as server:
        server.notice("hibernate", at=time.time() - 1)  # hibernation starts at once: the time is already past
        with PreemptionWatcher(lock, provider="aws", host=server.host, **FAST) as watcher:
            assert watcher.wait(5)
        assert watcher.deadline == watcher.noticed_at and watcher.notice.kind == "hibernate"


# -- Azure ----------------------------------------------------------------------


def test_azure_a_preempt_event_becomes_a_request_due_at_its_not_before_and_is_never_acknowledged(lock):
    with FakeAzureMetadataServer() as server:
        watcher = PreemptionWatcher(lock, provider="azure", host=server.host, **FAST).start()
        assert wait_until(lambda: server.count("GET", "/metadata/scheduledevents") >= 3), "no events: polling on"
        assert not lock.release_requested
        not_before = int(time.time()) + 30  # Azure names the second
        server.schedule("Preempt", not_before=not_before)
        assert watcher.wait(5)
        assert lock.release_request.deadline == watcher.deadline == not_before
        assert (watcher.notice.provider, watcher.notice.kind) == ("azure", "Preempt")
        watcher.stop()
    assert server.acks == [] and all(m == "GET" for m, _, _ in server.requests), "acknowledging would stop the VM now"
    assert all(h.get("Metadata") == "true" for _, _, h in server.requests)


def test_azure_events_for_other_vms_and_other_types_are_not_a_notice(lock):
    with FakeAzureMetadataServer(vm_name="train-vm-0") as server:
        server.schedule("Preempt", resources=["train-vm-7"])  # a scale set's events reach every VM in it
        server.schedule("Reboot")  # maintenance, not preemption, unless asked for
        server.schedule("Preempt", status="Completed")
        with PreemptionWatcher(lock, provider="azure", host=server.host, **FAST) as watcher:
            assert wait_until(lambda: server.count("GET", "/metadata/scheduledevents") >= 3)
            assert not watcher.wait(0.1)
            server.schedule("Terminate")
            assert watcher.wait(5)
        assert watcher.notice.kind == "Terminate" and lock.release_requested
        with PreemptionWatcher(lock, provider="azure", host=server.host, azure_events=("Reboot",), **FAST) as watcher:
            assert watcher.wait(5) and watcher.notice.kind == "Reboot"


def test_azure_an_event_already_started_is_due_now(lock):
    with FakeAzureMetadataServer() as server:
        server.schedule("Preempt", not_before=time.time() - 5, status="Started")
        with PreemptionWatcher(lock, provider="azure", host=server.host, **FAST) as watcher:
            assert watcher.wait(5)
        assert watcher.deadline == pytest.approx(watcher.noticed_at, abs=1.0)


# -- every cloud: down, slow, found -----------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "azure"])
def test_a_server_that_is_down_means_backing_off_not_a_flood_and_no_request(lock, provider):
    clock = FakeClock()
    watcher = PreemptionWatcher(lock, provider=provider, host=f"127.0.0.1:{free_port()}", clock=clock, **FAST).start()
    let_run(clock, 1.0)
    watcher.stop()
    assert not watcher.running
    assert 2 <= watcher.attempts <= 40, watcher.attempts  # see test_preemption's GCE twin for the arithmetic
    assert isinstance(watcher.last_error, ConnectionRefusedError)
    assert not lock.release_requested


@pytest.mark.parametrize("provider", ["aws", "azure", "auto"])
def test_a_server_that_never_answers_costs_bounded_timeouts(lock, provider):
    with SERVERS.get(provider, FakeAwsMetadataServer)(hang=True) as server:
        # Backoffs pass at once on the fake clock, so only the requests' own timeouts (5 fit in the sleep) space them.
        watcher = PreemptionWatcher(
            lock,
            provider=provider,
            host=server.host,
            request_timeout=0.06,
            backoff_initial=0.05,
            backoff_max=0.1,
            clock=FakeClock(step=0.01),
        ).start()
        time.sleep(0.3)
        assert 2 <= watcher.attempts <= 6, watcher.attempts  # "auto": a timeout ends the round, no three probes
        assert isinstance(watcher.last_error, (socket.timeout, TimeoutError))
        started = time.monotonic()
        watcher.stop()
        assert time.monotonic() - started < 3.0 and not watcher.running  # not a whole poll; a bound a loaded machine meets
    assert not lock.release_requested


@pytest.mark.parametrize("cloud", ["gce", "aws", "azure"])
def test_auto_finds_the_cloud_it_runs_on_and_hears_its_notice(lock, cloud):
    with SERVERS[cloud]() as server:
        watcher = PreemptionWatcher(lock, host=server.host, **FAST)
        assert watcher.provider is None  # "auto" knows no cloud before its first probe (a started one may be done)
        with watcher:
            assert wait_until(lambda: watcher.provider == cloud)
            time.sleep(0.2)
            assert not lock.release_requested
            notify(server)
            assert watcher.wait(5)
    assert watcher.notice.provider == cloud and lock.release_request.reason == "preemption"


@pytest.mark.parametrize("cloud", ["gce", "aws", "azure"])
def test_auto_hears_a_notice_already_there_at_start(lock, cloud):
    with SERVERS[cloud]() as server:
        notify(server, at=time.time() + 60)
        with PreemptionWatcher(lock, host=server.host, **FAST) as watcher:
            assert watcher.wait(5)
        assert watcher.provider == cloud


def test_auto_off_the_cloud_finds_nothing_backs_off_and_stops_at_once(lock):
    clock = FakeClock()
    watcher = PreemptionWatcher(lock, host=f"127.0.0.1:{free_port()}", clock=clock, **FAST).start()
    let_run(clock, 1.0)
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 3.0 and not watcher.running  # a bound a loaded machine meets
    assert watcher.provider is None and isinstance(watcher.last_error, ConnectionRefusedError)
    assert 2 <= watcher.attempts <= 40, "one probe a round: nothing listening is not three dialects' business"


def test_auto_against_a_web_server_that_is_no_metadata_server_finds_none(lock):
    with FakeAzureMetadataServer() as server:
        server.answer = lambda *request: (404, {}, "not found")  # any web server: no cloud's dialect
        with PreemptionWatcher(lock, host=server.host, **FAST) as watcher:
            assert wait_until(lambda: watcher.attempts >= 6)
            assert watcher.provider is None and not watcher.wait(0)
        assert "no GCE, AWS or Azure metadata server" in str(watcher.last_error)


def test_configuration_is_checked_in_the_constructor(lock):
    with pytest.raises(ConfigurationError, match="provider"):
        PreemptionWatcher(lock, provider="oracle")
    with pytest.raises(ConfigurationError, match="poll_interval"):
        PreemptionWatcher(lock, poll_interval=0)
    with pytest.raises(ConfigurationError, match="request_release"):
        PreemptionWatcher(object())
    with pytest.raises(ConfigurationError, match="azure_events"):
        PreemptionWatcher(lock, azure_events="Preempt")
