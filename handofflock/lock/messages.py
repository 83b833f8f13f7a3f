"""What the lock says when it refuses or fails: its errors, built from a record or from its state.

Errors tell the user what to do: who holds the lock and until when, why a hold
was lost, what to create instead. Nothing here decides anything: :mod:`.handoff`
says which error, these functions say it.
"""

from __future__ import annotations

import threading

from ..core.errors import AlreadyAcquired, LockContended, LockLost
from ..core.protocol import Me
from ..core.record import Holder, LockRecord, Waiter
from ..core.timefmt import when, who
from .types import State


def contended(
    cls: type[LockContended], url: str, record: LockRecord | None, now: float, *, timed_out: Me | None = None
) -> LockContended:
    """:class:`LockContended` naming who holds ``record`` and who waits; or, ``timed_out`` (for us, ``me``),
    :class:`LockTimeout` saying also whether the slot we gave back was ours."""
    r = record or LockRecord()
    owner, waiter = r.owner, r.waiter
    return cls(
        None if timed_out is None else timeout_message(url, r, timed_out, now),
        url=url,
        owner_id=owner.id if owner else None,
        owner_expires_at=owner.expires_at if owner else None,
        waiter_id=waiter.id if waiter else None,
        waiter_expires_at=waiter.expires_at if waiter else None,
        owner_label=_label_text(owner),
        waiter_label=_label_text(waiter),
    )


def _label_text(place: Holder | Waiter | None) -> str | None:
    return None if place is None or place.label is None else place.label.text


def timeout_message(url: str, record: LockRecord, me: Me, now: float) -> str:
    """What a timed-out acquire says: who holds it, and who has the slot (we, or someone else).

    Never "until T" for a live lease: its holder renews it, so its expiry says
    nothing of when the lock comes free.
    """
    owner, waiter = record.owner, record.waiter
    if owner is None:
        held = "it was free, but the waiter slot was taken"
    elif owner.live(now):
        held = f"held by {who(owner.id, _label_text(owner))}, a live lease its holder keeps renewing"
    else:
        ran_out = when(owner.expires_at, now)
        held = f"held by {who(owner.id, _label_text(owner))}, whose lease ran out {ran_out}"
    if waiter is None or not waiter.live(now):
        slot = "; nobody else waits"
    elif waiter.id == me.owner_id and waiter.instance in (None, me.instance):
        slot = "; we held the waiter slot, and gave it back"
    else:
        slot = f"; the waiter slot is {who(waiter.id, _label_text(waiter))}'s"
    return f"timed out acquiring {url!r}: {held}{slot}"


def not_healthy(url: str, state: State, lost_reason: str | None, renew_deadline: float, pid: int) -> LockLost:
    """Why :meth:`HandoffLock.check` refuses a lock in ``state`` that is not held and healthy."""
    if state is State.HELD:
        return LockLost(
            f"lock {url!r} was not renewed within renew_deadline ({renew_deadline:.1f} s); "
            "treat it as lost (was the process paused, or the host suspended?)",
            url=url,
            reason="renew deadline passed",
        )
    if state is State.LOST:
        return LockLost(f"lock {url!r} was lost: {lost_reason}", url=url, reason=lost_reason or "lost")
    if state is State.FORKED:
        return LockLost(
            f"lock {url!r} belongs to process {pid}; this is a child forked from it",
            url=url,
            reason="inherited across fork",
        )
    return LockLost(f"lock {url!r} is not held by this instance", url=url, reason="not held")


def already_acquired(state: State, url: str, holder: int | None, *, nested: bool) -> AlreadyAcquired:
    """The error of an ``acquire()`` on an instance that holds, acquires or releases already.

    One instance is one party (one owner id, one waiter slot): it is not
    reentrant, and threads do not queue on it (see :class:`AlreadyAcquired`).
    """
    per_thread = (
        "threads do not queue on one instance (it is one party: one owner id, one waiter slot); give each "
        "thread its own HandoffLock, and the second then waits as the waiter and asks the holder to hand over"
    )
    if state is State.HELD and (holder == threading.get_ident() or nested):
        return AlreadyAcquired(
            f"this HandoffLock instance already holds {url!r}, acquired in this very thread: it is not "
            "reentrant (the end of a nested block would hand the lock over in the middle of the outer one); "
            "use the hold you have"
        )
    if state is State.HELD:
        return AlreadyAcquired(f"this HandoffLock instance already holds {url!r} (in another thread); {per_thread}")
    if state is State.WAITING and nested:
        return AlreadyAcquired(
            f"acquire() of {url!r} called from inside this instance's own acquire() (a signal handler or a "
            "receiver): it is not reentrant"
        )
    if state is State.WAITING:
        return AlreadyAcquired(
            f"this HandoffLock instance is already acquiring {url!r} in another thread: {per_thread}"
        )
    return AlreadyAcquired(f"this HandoffLock instance is still releasing {url!r}; call acquire() once it has ended")
