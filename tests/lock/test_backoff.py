"""The one retry policy (handofflock.core.timing): full jitter, a cap, and a deadline kept."""

import random

import pytest

from handofflock import ConfigurationError
from handofflock.core.timing import LAST_TRY_MARGIN, RETRY, Backoff
from handofflock.storage.records import Retries
from handofflock.testing.clock import FakeClock


def test_draws_cover_zero_to_the_doubling_ceiling_and_stop_growing_at_the_cap():
    policy = Backoff(base=0.1, cap=1.0)
    rng = random.Random(7)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (50, 1.0), (10**6, 1.0)]:
        draws = [policy.delay(attempt, rng) for _ in range(2000)]
        assert 0 <= min(draws) < ceiling * 0.05  # full jitter: down to (nearly) nothing
        assert ceiling * 0.95 < max(draws) <= ceiling


def test_the_policy_keeps_no_state_between_calls():
    a, b = random.Random(3), random.Random(3)
    assert [RETRY.delay(2, a) for _ in range(5)] == [RETRY.delay(2, b) for _ in range(5)]
    assert RETRY.ceiling(2) == RETRY.ceiling(2) == pytest.approx(0.4)


def test_a_draw_past_the_deadline_becomes_one_last_try_just_before_it_then_none():
    policy = Backoff(base=10.0, cap=10.0)  # every draw (up to 10 s) overshoots a 1 s deadline, most by far
    clock = FakeClock()
    start = clock.monotonic()
    retries = Retries(clock, deadline=start + 1.0, policy=policy)
    waits = []
    while (delay := retries.next_delay()) is not None:
        waits.append(delay)
        clock.advance(delay)
    assert sum(waits) == pytest.approx(1.0 - LAST_TRY_MARGIN, abs=1e-9)  # tried on until just before the deadline
    assert clock.monotonic() - start <= 1.0 - LAST_TRY_MARGIN + 1e-9  # and never slept past it
    assert len(waits) <= 2


def test_no_deadline_means_the_plain_draw():
    assert 0 <= RETRY.delay_within(3, now=5.0, deadline=None) <= RETRY.ceiling(3)


def test_a_deadline_already_gone_allows_no_retry():
    assert RETRY.delay_within(0, now=10.0, deadline=10.0) is None
    assert RETRY.delay_within(0, now=10.0, deadline=10.0 + LAST_TRY_MARGIN) is None  # no room, not a 0 s spin


@pytest.mark.parametrize(
    "kwargs",
    [dict(base=0), dict(base=-1), dict(base=float("nan")), dict(cap=float("inf")), dict(base=True), dict(base=2, cap=1)],
)
def test_a_bad_policy_is_refused(kwargs):
    with pytest.raises(ConfigurationError):
        Backoff(**kwargs)
