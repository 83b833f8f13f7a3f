"""The lock's timing, as one value validated once (client-go's ``LeaderElectionConfig`` check).

Every cross-field rule is checked when a :class:`Timing` is made, including the
store's write spacing: a configuration the store cannot serve is refused with a
:class:`~handofflock.core.errors.ConfigurationError` naming the minimum, never
accepted and then lost at run time.

The rules, with ``s`` the store's write spacing (``min_write_interval``: 1 s on
GCS, 0 elsewhere):

* every interval is a positive finite number of seconds, ``ttl`` at most a week;
* ``ttl > renew_deadline > renew_interval``;
* ``renew_interval >= s``: a renewal cannot be sent more often than the store
  takes writes;
* ``renew_deadline - renew_interval >= 1.5 * s``: after a renewal that fails,
  one retry (one spacing later, with half a spacing for the request itself)
  still lands before the owner must call itself lost. That holds for the
  failure GCS sends most, a 429, only because a renewal is not held back by
  the spacing a 429 widens (to 2 s, then 4, 8) once waiting it out would break
  this promise: :meth:`Timing.backoff_until` says until when it may be
  (see :mod:`handofflock.storage.records`). Two failures in a row need
  ``renew_deadline - renew_interval >= 2.5 * s`` (ttl 7 on GCS with the
  defaults); docs/design.md has the table of what each ttl survives;
* ``min_hold`` (how long a holder keeps the lock before a waiter's request
  is acted on) is 0 or more, at most a week;
* ``waiter_ttl >= 2 * waiter_poll_interval`` and ``waiter_ttl / 2 >= s``: a
  waiter refreshes its slot at half-life, by a poll and a write.
* every request the lock sends ends within :attr:`Timing.request_timeout`
  (and by the deadline of the operation that sends it: see :func:`requests_by`),
  ``(renew_deadline - renew_interval) / 2``: a renewal sent with that much of
  its window left that stalls (a read or write that hangs, a slow credentials
  refresh) is cut off with as long again left for one more try. A store's
  own ``request_timeout`` given longer than that is refused
  (:meth:`Timing.check_request_timeout`); left at its default, the lock
  bounds its own requests to it.

Defaults (:meth:`Timing.build`): ``renew_interval = max(ttl / 8, s)``,
``renew_deadline = ttl / 2``, ``waiter_ttl = ttl``, ``min_hold = 30``. On GCS that makes 5 s the shortest ttl.

Retries (storage reads and writes, renewals, the preemption watcher) wait as
one :class:`Backoff` says: exponential backoff with full jitter (a uniform
draw over ``[0, min(cap, base * 2**attempt)]``, which spreads parties that
failed together), bounded by a deadline. The policy keeps no state: the caller
keeps the attempt count, so one value (:data:`RETRY`) is shared by every
thread and lock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigurationError
from .record import MAX_TTL

#: A failed renewal must leave room for this many write spacings before the renew deadline.
RETRY_SPACINGS = 1.5
#: How long a new holder keeps the lock before a waiter's request is acted on (see docs/design.md,
#: *The minimum hold*): long enough for a trainer or a worker to do real work after the cost of
#: taking the lock, short enough that an asking waiter is not kept waiting for long.
DEFAULT_MIN_HOLD = 30.0


@dataclass(frozen=True)
class Timing:
    """Validated timing of one lock (seconds).

    :meth:`build` applies the defaults; ``Timing(...)`` with every field given
    is checked by the same rules, so no instance breaks them. Pass one to
    ``HandoffLock(url, timing=...)`` to share a configuration between locks.
    """

    ttl: float
    renew_interval: float
    renew_deadline: float
    waiter_ttl: float
    waiter_check_interval: float
    waiter_poll_interval: float
    max_clock_skew: float
    min_write_interval: float
    #: How long a holder keeps the lock before a waiter's request is acted on (0: at once).
    min_hold: float = 0.0

    def __post_init__(self) -> None:
        """Check every rule; raise :class:`ConfigurationError` naming what to change.

        A value equal to what :meth:`build` derives from ``ttl`` is taken for
        that default, and an error about it is phrased as one about ``ttl``.
        """
        for f in fields(self):  # seconds as floats, each checked for its kind
            object.__setattr__(self, f.name, seconds(f.name, getattr(self, f.name)))
        ttl, ri, rd, wttl = self.ttl, self.renew_interval, self.renew_deadline, self.waiter_ttl
        spacing, poll = self.min_write_interval, self.waiter_poll_interval
        for name, value in (("ttl", ttl), ("waiter_ttl", wttl), ("min_hold", self.min_hold)):
            if value > MAX_TTL:
                raise ConfigurationError(f"{name} must be at most {MAX_TTL:.0f} s (a week), got {value}")
        derived_ri, derived_rd = ri == max(ttl / 8, spacing), rd == ttl / 2
        floor = min_ttl(spacing)
        if not ttl > rd > ri:
            if derived_ri and derived_rd:
                raise ConfigurationError(
                    f"ttl={ttl} is too short for this store: its write spacing is {spacing} s, so ttl must be at least "
                    f"{floor:g} s (or pass renew_interval and renew_deadline yourself)"
                )
            raise ConfigurationError(
                f"need ttl > renew_deadline > renew_interval > 0, got ttl={ttl}, "
                f"renew_deadline={rd}, renew_interval={ri}"
            )
        if ri < spacing:
            raise ConfigurationError(
                f"renew_interval={ri} is shorter than the store's write spacing ({spacing} s): "
                f"renewals cannot be sent that often; use renew_interval >= {spacing}"
            )
        if rd - ri < RETRY_SPACINGS * spacing:
            what = "ttl" if derived_ri and derived_rd else "renew_deadline - renew_interval"
            need = f"at least {floor:g} s" if what == "ttl" else f"at least {RETRY_SPACINGS * spacing:g} s"
            raise ConfigurationError(
                f"{what} must be {need} on this store (write spacing {spacing} s): a failed renewal needs "
                f"time for one more write before renew_deadline; "
                f"got ttl={ttl}, renew_interval={ri}, renew_deadline={rd}"
            )
        if wttl == ttl and (wttl < 2 * poll or wttl / 2 < spacing):
            # waiter_ttl is ttl (its default): the rule is about ttl, say so.
            shortest = max(2 * poll, 2 * spacing)
            raise ConfigurationError(
                f"ttl={ttl} is too short: a waiter holds its slot for ttl (waiter_ttl defaults to it) and must be able "
                f"to refresh it, so ttl must be at least {shortest:g} s here (twice waiter_poll_interval={poll:g}"
                + (f" and twice the store's write spacing {spacing:g} s" if spacing else "")
                + "); use a longer ttl, or pass waiter_ttl and waiter_poll_interval yourself"
            )
        if wttl < 2 * poll:
            raise ConfigurationError(
                f"waiter_ttl = {wttl} must be at least twice waiter_poll_interval ({poll}) "
                "so the waiter can refresh its slot in time"
            )
        if wttl / 2 < spacing:
            raise ConfigurationError(
                f"waiter_ttl = {wttl} must be at least {2 * spacing:g} s on this store (write spacing {spacing} s): "
                "the waiter refreshes its slot at half-life with a write"
            )

    @classmethod
    def build(
        cls,
        *,
        ttl: float = 60.0,
        renew_interval: float | None = None,
        renew_deadline: float | None = None,
        waiter_ttl: float | None = None,
        waiter_check_interval: float = 2.0,
        waiter_poll_interval: float = 1.0,
        max_clock_skew: float = 2.0,
        min_write_interval: float = 0.0,
        min_hold: float = DEFAULT_MIN_HOLD,
    ) -> Timing:
        """A :class:`Timing` with the defaults applied to what is not given (None: derived from ``ttl``)."""
        ttl, spacing = seconds("ttl", ttl), seconds("min_write_interval", min_write_interval)
        return cls(
            ttl,
            max(ttl / 8, spacing) if renew_interval is None else renew_interval,
            ttl / 2 if renew_deadline is None else renew_deadline,
            ttl if waiter_ttl is None else waiter_ttl,
            waiter_check_interval,
            waiter_poll_interval,
            max_clock_skew,
            spacing,
            min_hold,
        )

    @property
    def margin(self) -> float:
        """How long before its lease runs out (for others) an owner stops calling itself healthy."""
        return self.ttl - self.renew_deadline

    @property
    def request_timeout(self) -> float:
        """The longest one request of the lock's may take: ``(renew_deadline - renew_interval) / 2``.

        A renewal goes out when ``renew_deadline - renew_interval`` of its
        validity is left. If it stalls, it is cut off here, which leaves as
        long again for one more request before the owner must call itself lost.
        """
        return (self.renew_deadline - self.renew_interval) / 2

    def check_request_timeout(self, seconds: float | None, where: str) -> None:
        """Refuse a store ``request_timeout`` (``seconds``; None: the store's default) the lease cannot wait out."""
        if seconds is not None and seconds > self.request_timeout:
            raise ConfigurationError(
                f"request_timeout={seconds:g} s on {where} is too long for this lock: a renewal that stalls must be "
                f"cut off with time left for one more try before renew_deadline, so a request may take at most "
                f"(renew_deadline - renew_interval) / 2 = {self.request_timeout:g} s here "
                f"(renew_deadline={self.renew_deadline:g}, renew_interval={self.renew_interval:g}); pass a shorter "
                "request_timeout, a longer ttl, or none (the lock then bounds its own requests to that)"
            )

    def backoff_until(self, valid_until: float) -> float:
        """The latest time a renewal of a lease valid until ``valid_until`` may wait out a 429's backoff.

        A 429 widens the store's write spacing (:class:`~handofflock.storage.records.WriteGate`).
        A renewal honours the widened spacing only while, after that wait, a failure
        would still leave room for one more write at the store's own spacing
        (:data:`RETRY_SPACINGS` spacings) before the lease must be called lost;
        later than this it goes at the store's own spacing. Same clock as
        ``valid_until`` (monotonic). Pass it as the gate's ``by``.
        """
        return valid_until - RETRY_SPACINGS * self.min_write_interval


def min_ttl(spacing: float) -> float:
    """The shortest ttl the defaults allow for a store with write spacing ``spacing``.

    ``ttl / 2 - max(ttl / 8, spacing) >= 1.5 * spacing``: with ``ttl/8 <= spacing``
    that is ``ttl >= 5 * spacing``.
    """
    return (1 + RETRY_SPACINGS) * 2 * spacing


def seconds(name: str, value: Any) -> float:
    """``value`` as float seconds, or a :class:`ConfigurationError` naming ``name``: a finite number above 0
    (or at 0: ``min_write_interval`` and ``max_clock_skew`` may be none at all)."""
    zero_ok = name in ("min_write_interval", "max_clock_skew", "min_hold")
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not number or not (value >= 0 if zero_ok else value > 0):
        kind = "a finite number of seconds >= 0" if zero_ok else "a positive finite number of seconds"
        raise ConfigurationError(f"{name} must be {kind}, got {value!r}")
    return float(value)


#: The least time an operation given a timeout allows its requests, from its start: a timeout shorter
#: than a round trip (``acquire(timeout=0)``, ``status(timeout=0)``) still makes its one try.
MIN_REQUEST_TIME = 1.0


def requests_by(now: float, deadline: float | None) -> float | None:
    """When the requests of an operation started at ``now`` with ``deadline`` must end: the deadline,
    or :data:`MIN_REQUEST_TIME` after the start if that is later (None: no deadline)."""
    return None if deadline is None else max(deadline, now + MIN_REQUEST_TIME)


#: A retry the draw would put past the deadline goes this long before it instead: one last try.
LAST_TRY_MARGIN = 0.05
#: Less room than this before the deadline is no room: stop rather than spin on slivers of time.
MIN_ROOM = 0.001


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: ``uniform(0, min(cap, base * 2**attempt))``."""

    base: float = 0.1
    cap: float = 2.0

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            seconds(f"backoff {name}", getattr(self, name))
        if self.cap < self.base:
            raise ConfigurationError(f"backoff cap ({self.cap}) must be at least its base ({self.base})")

    def ceiling(self, attempt: int) -> float:
        """The most the draw for retry ``attempt`` (0 for the first retry) can be."""
        return min(self.cap, self.base * 2.0 ** min(max(attempt, 0), 60))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry ``attempt`` (0 for the first), with no deadline."""
        return (rng or random).random() * self.ceiling(attempt)

    def delay_within(self, attempt: int, *, now: float, deadline: float | None) -> float | None:
        """Seconds to wait before retry ``attempt``, or None when no try fits before ``deadline``.

        A draw that would carry the next try past the deadline is cut short so
        that one last try goes :data:`LAST_TRY_MARGIN` before it. After that try
        there is no room left and the answer is None. So an operation keeps
        trying until its deadline instead of stopping early on an unlucky draw,
        and never sleeps past it. ``now`` and ``deadline`` are on one clock.
        """
        drawn = self.delay(attempt)
        if deadline is None:
            return drawn
        room = deadline - LAST_TRY_MARGIN - now
        if room < MIN_ROOM:
            return None
        return min(drawn, room)


#: The policy of storage retries and renewals: 0.1 s doubling to 2 s.
RETRY = Backoff(base=0.1, cap=2.0)
