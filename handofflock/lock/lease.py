"""The lease this lock holds: what it knows of its hold, in one small value replaced whole.

The record and generation last written or read, the fencing token, until when
the hold is safe (monotonic), when the next renewal, waiter check and release
retry fall due, how many renewals failed in a row, and why the hold was lost.
A new hold starts from a new :class:`Lease`, and a forked child's lock gets an
empty one, so a reset is one assignment instead of ten fields cleared one by
one (filelock's context dataclass). Mutated in place only by the lock's
transitions, under its I/O mutex.

It is a seam because *how long a lease is safe* is a rule of its own
(:func:`lease_until`), measured from the write that made it, and it is what a
planted bug in the simulation changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.record import LockRecord
from ..core.timing import Timing

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
    assert record.expires_at is not None
    length = record.ttl or timing.ttl
    return mono + (record.expires_at - wall) - length * (1 - timing.renew_deadline / timing.ttl)


@dataclass
class Lease:
    """One hold's state. The defaults are "holds nothing": nothing is due, nothing is valid."""

    record: LockRecord | None = None
    generation: int = 0
    token: int | None = None
    valid_until: float = -_INF  # monotonic
    next_renew: float = _INF
    next_check: float = _INF
    next_release_try: float = _INF
    renew_failures: int = 0
    lost_reason: str | None = None
    lost_error: BaseException | None = None
    thread: int | None = None  # the thread that acquired this hold (named by a second acquire's error)

    def set(self, record: LockRecord, generation: int, mono: float, wall: float, timing: Timing) -> None:
        """A write of ours made ``record`` (or we were handed it): the lease runs from its stamp."""
        self.record, self.generation = record, generation
        self.valid_until = lease_until(record, mono, wall, timing)
        # Renew when what is left of the validity falls to renew_deadline - renew_interval.
        self.next_renew = self.valid_until - (timing.renew_deadline - timing.renew_interval)
        self.renew_failures = 0

    def seen(self, record: LockRecord | None, generation: int) -> None:
        """A read showed ``record`` at ``generation``: the lease is unchanged, the record we write on is this."""
        self.record, self.generation = record, generation
