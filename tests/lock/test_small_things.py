"""Issue 17's small things, one test each (the runner's "passing SIGINT on to" is in tests/runner/test_cli.py,
the far-future expiry in tests/lock/test_labels.py)."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from lockutil import make_lock

from handofflock import HandoffLock, LockTimeout
from handofflock.core.errors import ConfigurationError
from handofflock.core.timefmt import age, iso, when


@pytest.fixture
def url():
    return f"memory://small-{uuid.uuid4().hex[:8]}/l.json"


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, float("-inf")])
def test_acquire_refuses_a_timeout_that_is_not_a_number_of_seconds(url, timeout):
    lock = HandoffLock(url)
    with pytest.raises(ConfigurationError, match="timeout must be >= 0"):
        lock.acquire(timeout=timeout)
    assert not lock.is_held


def test_a_short_ttl_is_refused_with_an_error_about_ttl_not_waiter_ttl(url):
    with pytest.raises(ConfigurationError) as info:
        HandoffLock(url, ttl=0.1)
    message = str(info.value)
    assert message.startswith("ttl=0.1 is too short") and "at least 2 s" in message
    assert "waiter_ttl =" not in message and "waiter_ttl (default" not in message
    with pytest.raises(ConfigurationError, match=r"^waiter_ttl = 0.1 must be"):  # set by the user: named as such
        HandoffLock(url, ttl=5.0, waiter_ttl=0.1)


def test_lock_timeout_prints_an_iso_time_with_its_age_not_an_epoch(url):
    holder = make_lock(url, owner_id="holder", ttl=30.0, renew_interval=3.0, renew_deadline=15.0)
    holder.acquire()
    try:
        with pytest.raises(LockTimeout) as info:
            make_lock(url, owner_id="late", ttl=30.0, renew_interval=3.0, renew_deadline=15.0).acquire(timeout=0.2)
        message = str(info.value)
        # A live lease is renewed while its holder lives: its expiry says nothing of when the lock frees.
        assert "a live lease its holder keeps renewing" in message, message
        assert not re.search(r"\d{10}\.\d", message), "no raw epoch"
    finally:
        holder.release()


def test_times_for_people():
    assert iso(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso(None) is None and iso(float("inf")) is None
    assert when(None, 0.0) == "never"
    assert when(100.0, 40.0) == "1970-01-01T00:01:40.000Z (in 1 min 0 s)"
    assert when(40.0, 100.0).endswith("(1 min 0 s ago)")
    assert age(3 * 86400) == "3 days" and age(7200) == "2 h 0 min"
    assert when(32_000_000_000.0, time.time()).startswith("2984-")
