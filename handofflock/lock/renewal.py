"""The renewal's writes: ask the protocol, write urgently, and on a 412 read, note what changed, and send again.

What a renewal writes is :func:`handofflock.core.protocol.decide_renew`'s;
how it reaches the store is :mod:`.record_io`'s; the lease it extends is the
:class:`~.lease.Lease` it is given, set from the send of the write that made
it. The lock (:meth:`.HandoffLock._renew`) calls these under its I/O mutex and
keeps every state change that a result means (lost, the failure counted, the
signals and metrics); an owner's read after a 412 is noted through ``saw``,
the lock's own bound method, which may mark the lock lost.

Why a background renewal never waits for the write gate: a renewal the
store's write spacing would delay is deferred to when the gate opens (the
lease is valid well past it), so the I/O mutex is never held through a wait
and a release or a waiter check never queues behind one. Why it is sent again
at once after a 412: renewals are urgent writes for the gate (they keep the
lock), and a few waiter writes in a row (it registered, refreshed, left) must
not run an owner at the shortest ttl past its renew deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from ..core import protocol
from ..core.clock import Clock
from ..core.errors import LockRecordCorrupt, PreconditionFailed, StorageError, TransientStorageError
from ..core.protocol import Lost, Me, Write
from ..core.record import LockRecord, new_nonce
from ..core.timing import Timing
from . import metrics
from .lease import Lease
from .record_io import RecordIO

_log = logging.getLogger("handofflock.renew")


class Renewer(TypedDict):
    """Who renews, by which clock and rules: the keywords every function here takes besides the I/O and lease."""

    me: Me
    clock: Clock
    policy: Timing
    timing: Timing


@dataclass(frozen=True)
class Renewed:
    """A renewal landed: the lease now ends at ``expires_at`` (wall); ``took`` seconds from its send to now."""

    expires_at: float | None
    took: float


def decide(lease: Lease, *, me: Me, clock: Clock, policy: Timing) -> protocol.Decision:
    """What renewing ``lease`` writes now (or that the record we know says it is lost)."""
    token, now = lease.token or 0, clock.time()
    return protocol.decide_renew(
        lease.record, lease.generation, me=me, token=token, now=now, timing=policy, nonce=new_nonce()
    )


def renew(
    io: RecordIO,
    lease: Lease,
    *,
    me: Me,
    clock: Clock,
    policy: Timing,
    timing: Timing,
    held: Callable[[], bool],
    saw: Callable[[LockRecord | None, int], bool],
) -> Renewed | Lost | None:
    """A background renewal: up to three attempts, none waiting for the gate or sleeping (see the module).

    Returns :class:`Renewed`; the protocol's :class:`Lost`; or None when
    nothing was renewed and nothing is to be done (deferred: ``next_renew``
    is when the gate opens; no longer ``held``; ``saw`` found the lock lost
    after a 412; or three writes in a row met a 412). Storage errors are raised.
    """
    for _ in range(3):
        if not held():
            return None
        now = clock.monotonic()
        # A 429's widened spacing holds the renewal back only while it has room to (issue 25).
        by = timing.backoff_until(lease.valid_until)
        wait = io.gate().ready_in(now, urgent=True, by=by)
        if wait > 0:
            lease.next_renew = now + wait
            return None
        decision = decide(lease, me=me, clock=clock, policy=policy)
        if isinstance(decision, Lost):
            return decision
        assert isinstance(decision, Write)
        try:
            written, generation, mono, wall = io.write_lease(
                decision, lease.valid_until, retry=False, urgent=True, send_by=by
            )
        except PreconditionFailed:
            # A waiter registered, refreshed or left (or we lost it): read, note, renew again.
            if not saw(*io.read(lease.valid_until, retry=False)):
                return None
            lease.next_renew = clock.monotonic()
            continue
        lease.set(written.record, generation, mono, wall, timing, clock)
        return Renewed(written.record.expires_at, clock.monotonic() - mono)
    return None


def renew_handed(
    io: RecordIO, lease: Lease, *, me: Me, clock: Clock, policy: Timing, timing: Timing, deadline: float | None
) -> None:
    """Renew a lease just handed to us, waiting for the gate and retrying until ``deadline`` (or ``renew_deadline``).

    Anything but a write (the record says the lease is not ours to renew) is a
    :class:`PreconditionFailed`, as is a write whose precondition failed; the
    lock decides what a failure means while the handed lease is still valid.
    """
    decision = decide(lease, me=me, clock=clock, policy=policy)
    if not isinstance(decision, Write):
        raise PreconditionFailed(io.key, lease.generation, url=io.url)
    end = clock.monotonic() + timing.renew_deadline
    written, generation, mono, wall = io.write_lease(
        decision, end if deadline is None else max(min(deadline, end), lease.valid_until), urgent=True
    )
    lease.set(written.record, generation, mono, wall, timing, clock)


def renew_or_fail(
    measured: metrics.Measured,
    io: RecordIO,
    lease: Lease,
    *,
    me: Me,
    clock: Clock,
    policy: Timing,
    timing: Timing,
    held: Callable[[], bool],
    saw: Callable[[LockRecord | None, int], bool],
) -> tuple[str, BaseException | None] | None:
    """:func:`renew` for the scheduler, and what its outcome means: the loss to mark (why, error), or None.

    A transient error is counted on the lease (retried in the background until ``renew_deadline``,
    when :meth:`.HandoffLock._deadline_passed` marks the loss); any other storage error, or the
    protocol's :class:`Lost`, is a loss now. Logs and measures (``measured``: the lock) either way.
    """
    try:
        renewed = renew(io, lease, me=me, clock=clock, policy=policy, timing=timing, held=held, saw=saw)
    except TransientStorageError as exc:
        metrics.renewal_failed(measured, exc)
        delay = lease.renewal_failed(clock.monotonic(), timing.renew_interval)
        _log.warning(
            "renewal of %s failed (%s); retrying in %.2f s, giving up at the renew deadline", io.url, exc, delay
        )
        return None
    except (StorageError, LockRecordCorrupt) as exc:
        metrics.renewal_failed(measured, exc)
        return f"renewal failed: {exc}", exc
    if isinstance(renewed, Lost):
        return renewed.why, None
    if renewed is not None:
        metrics.renewed(measured, renewed.took)
        _log.debug("%s renewed %s until %.3f", me.owner_id, io.url, renewed.expires_at)
    return None
