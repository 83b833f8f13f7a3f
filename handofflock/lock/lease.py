"""The lease this lock holds: what it knows of its hold, in one small value replaced whole.

The record and generation last written or read, the fencing token, until when
the hold is safe (monotonic), when the next renewal, waiter check and release
retry fall due, how many renewals failed in a row, and why the hold was lost.
A new hold starts from a new :class:`Lease`, and a forked child's lock gets an
empty one, so a reset is one assignment instead of ten fields cleared one by
one (filelock's context dataclass). Mutated in place only by the lock's
transitions, under its I/O mutex. *How long a lease is safe* is a rule of its
own (:func:`lease_until`), measured from the write that made it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import buggify
from ..core.clock import Clock
from ..core.record import LockRecord
from ..core.timing import RETRY, Timing

_INF = float("inf")


def lease_until(record: LockRecord, mono: float, wall: float, timing: Timing) -> float:
    """Monotonic time until which ``record``'s lease is safe for us, ``mono``/``wall`` read together.

    The lease runs to ``expiresAt``; we stop calling it safe the usual
    margin (``ttl - renew_deadline``, in proportion for a lease of another
    length) before that. For a lease we wrote, stamped at its send, this is
    exactly ``send + renew_deadline``: counted from the write that made it.
    Others take the lock only ``max_clock_skew`` after ``expiresAt`` by
    their clocks, which is where the skew allowance is.
    """
    assert record.owner is not None
    left = record.owner.expires_at - wall
    if buggify.on(buggify.LEASE_PAST_ITS_MARGIN):
        return mono + left + timing.max_clock_skew
    length = record.ttl or timing.ttl
    return mono + left - length * (1 - timing.renew_deadline / timing.ttl)


@dataclass
class Lease:
    """One hold's state. The defaults are "holds nothing": nothing is due, nothing is valid."""

    record: LockRecord | None = None
    generation: int = 0
    token: int | None = None
    valid_until: float = -_INF  # monotonic
    boot_until: float = -_INF  # the same instant by Clock.boottime(), which counts a host suspend
    wall_until: float = -_INF  # wall clock: the cached expiresAt less the margin
    next_renew: float = _INF
    next_check: float = _INF
    next_release_try: float = _INF
    renew_failures: int = 0
    lost_reason: str | None = None
    lost_error: BaseException | None = None
    thread: int | None = None  # the thread that acquired this hold (named by a second acquire's error)

    def set(self, record: LockRecord, generation: int, mono: float, wall: float, timing: Timing, clock: Clock) -> None:
        """A write of ours made ``record`` (or we were handed it): the lease runs from its stamp."""
        self.record, self.generation = record, generation
        self.valid_until = lease_until(record, mono, wall, timing)
        # The same instant on the suspend-counting clock: one offset between the two, read now
        # (each comparison later is boot time with boot time, never boot with monotonic).
        self.boot_until = self.valid_until + (clock.boottime() - clock.monotonic())
        self.wall_until = wall + (self.valid_until - mono)
        # Renew when what is left of the validity falls to renew_deadline - renew_interval.
        self.next_renew = self.valid_until - (timing.renew_deadline - timing.renew_interval)
        self.renew_failures = 0

    def known(self, listed: int | None) -> tuple[LockRecord | None, int] | None:
        """The record and generation we know, if a listing that showed the object at generation ``listed``
        (0: not listed) needs no read to settle what the object holds; else None.

        Generations only grow, so a listed generation equal to the one we know
        means the object holds exactly our record: deciding on that is
        deciding on what a read would return. A listed generation below ours
        means the listing is older than our own last write or read of the
        object (a renewal while the group was being listed), which already
        showed it: no read either. A higher one (someone else wrote), or 0
        (not listed), is settled by a read, never by the listing alone.
        """
        if listed is not None and 0 < listed <= self.generation and self.record is not None:
            return self.record, self.generation
        return None

    def renewal_failed(self, now: float, renew_interval: float) -> float:
        """A renewal failed transiently at monotonic ``now``: the next one is due after a backoff (returned),
        at most ``renew_interval`` and never past the end of validity (the renew deadline decides then)."""
        self.renew_failures += 1
        delay = min(renew_interval, RETRY.delay(self.renew_failures))
        self.next_renew = min(now + delay, self.valid_until)
        return delay

    def lose(self, why: str, error: BaseException) -> None:
        """The hold is lost, for ``why``: nothing about it is valid any more; ``error`` is what to raise."""
        self.valid_until = -_INF
        self.lost_reason, self.lost_error = why, error

    def within(self, clock: Clock) -> bool:
        """Still safe by the clocks that count time passing: monotonic, and boot time (a suspend counts)."""
        return clock.monotonic() < self.valid_until and clock.boottime() < self.boot_until

    def healthy(self, clock: Clock) -> bool:
        """:meth:`within`, and the wall clock agrees: it has not passed the cached ``expiresAt`` less the margin.

        The wall clock is a second opinion, for a host whose boot time misses a
        suspend (not Linux) or a wall clock set forward: either way ``check()``
        fails until the next renewal, written from the wall clock as it now is,
        moves ``expiresAt`` on. A wall clock set back never makes a lease look
        unhealthy (it only moves further from ``expiresAt``); the monotonic and
        boot clocks still end it on time.
        """
        return self.within(clock) and clock.time() < self.wall_until

    def seen(self, record: LockRecord | None, generation: int) -> None:
        """A read showed ``record`` at ``generation``: the lease is unchanged, the record we write on is this."""
        self.record, self.generation = record, generation
