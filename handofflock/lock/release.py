"""The write loops of letting go: the owner's release, and the waiter's slot given back.

Each asks :mod:`handofflock.core.protocol` what to write, writes it through
:mod:`.record_io`, and on a 412 reads and asks again, until the write lands,
the hold turns out lost, or there is nothing left to write. Each returns what
happened; every state change around it (releasing, lost, idle, becoming the
owner of a lock handed over meanwhile, the signals) stays with the lock
(:mod:`.handoff`), which decides what the outcome means.

A 412 is not the end of a release: a waiter registered, refreshed or left
since our last read, and the protocol decides again from the record read
back, knowing which write it ``attempted``: if the record shows that write's
effect, it landed (see ``decide_release``). A record that has become
unreadable was overwritten by someone: the hold is lost, and the record is
never rewritten by us.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..core import protocol
from ..core.clock import Clock
from ..core.errors import LockLost, LockRecordCorrupt, PreconditionFailed
from ..core.protocol import Kind, Lost, Me, Owned, Released, Write
from ..core.record import new_nonce
from ..core.timing import Timing
from .lease import Lease
from .record_io import RecordIO


@dataclass(frozen=True)
class Loss:
    """The hold turned out lost at release: ``why`` and ``cause`` to record it, ``error`` for ``release()`` to raise."""

    why: str
    cause: BaseException | None
    error: LockLost


def write_release(
    io: RecordIO, lease: Lease, *, me: Me, clock: Clock, policy: Timing, deadline: float
) -> tuple[str | None, Loss | None]:
    """The release write of ``lease`` (retried, re-read on 412): ``(heir, None)``, or ``(None, why it was lost)``.

    Call with ``io.mutex`` held. Transient storage errors (and a 412 the retry
    could not resolve) are raised: the lock keeps trying in the background.
    """
    attempted: Write | None = None
    record, generation = lease.record, lease.generation
    while True:
        decision = protocol.decide_release(
            record,
            generation,
            me=me,
            token=lease.token or 0,
            now=clock.time(),
            timing=policy,
            nonce=new_nonce(),
            attempted=attempted,
            within_lease=lease.within(clock),
        )
        if isinstance(decision, Released):
            return decision.handed_off_to, None
        if isinstance(decision, Lost):
            why = f"lock {io.url!r} was lost before release: {decision.why}; nothing was written"
            return None, Loss(decision.why, None, LockLost(why, url=io.url, reason=decision.why))
        assert isinstance(decision, Write)
        try:
            written, _, _, _ = io.write_lease(decision, deadline, urgent=True)
        except PreconditionFailed:
            attempted = decision
            try:
                record, generation = io.read(deadline)
            except LockRecordCorrupt as exc:  # overwritten by someone: lost, and never rewritten
                lost = LockLost(
                    f"lock {io.url!r} was lost before release: {exc}", url=io.url, reason="corrupt", cause=exc
                )
                lost.__cause__ = exc
                return None, Loss(f"the lock object became unreadable: {exc.reason}", exc, lost)
            continue
        return (written.record.owner_id if written.kind is Kind.HANDOFF else None), None


def give_back_slot(
    io: RecordIO, *, me: Me, clock: Clock, policy: Timing, deadline: float
) -> tuple[Owned, float, float] | Literal[False] | None:
    """Clear our waiter slot with a conditional write (re-read on 412), by ``deadline``.

    Returns False when the slot is clear (given back, or no longer ours);
    ``(owned, mono, wall)`` when the owner handed us the lock meanwhile (the
    clocks read when the record showed it: the lease counts from there), and
    the lock decides whether to keep it; None when ``deadline`` passed first.
    Each read waits for our write slot first, as an urgent write.
    """
    while clock.monotonic() < deadline:
        record, generation = io.read_to_write(deadline, urgent=True)
        mono, wall = clock.monotonic(), clock.time()
        decision = protocol.decide_give_up_wait(record, generation, me=me, now=wall, timing=policy, nonce=new_nonce())
        if isinstance(decision, Owned):
            return decision, mono, wall
        if not isinstance(decision, Write):
            return False
        try:
            with io.mutex:
                io.write(decision, deadline, urgent=True)
            return False
        except PreconditionFailed:
            continue
    return None
