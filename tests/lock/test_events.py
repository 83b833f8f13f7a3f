"""Typed events: on_release_requested carries a ReleaseRequest that says who asked, why, and by when."""

import warnings

import pytest

from handofflock import ConfigurationError, LockTimeout, ReleaseRequest, RequestReason, signals


def _requests_heard(world, lock, ask):
    got: list[dict] = []
    with signals.on_release_requested.connected_to(lambda s, **kw: got.append(kw), sender=lock):
        ask()
        world.clock.advance(0.01)
        world.sched.run_pending()
        lock._notifier.flush()  # private: send what is queued now, in this thread
    return got


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
    owner, waiter = world.lock("O"), world.lock("W")
    assert owner.acquire()
    got: list[dict] = []
    with signals.on_release_requested.connected_to(lambda s, **kw: got.append(kw), sender=owner):
        with pytest.raises(LockTimeout):
            waiter.acquire(timeout=2.0)  # registers as the waiter; the owner's check notices; gives up
        owner._notifier.flush()  # private: as above
    assert got and got[0]["request"].reason is RequestReason.WAITER and got[0]["request"].requester == "W"
    owner.release()


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
