"""What a lock reports: its state, release requests and their reasons, status snapshots, owner ids.

Plain values, apart from :class:`~handofflock.lock.handoff.HandoffLock`, so that code
reading them (the CLI, the runner, the async lock, receivers) need not read the lock.
"""

from __future__ import annotations

import enum
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any

from ..core.protocol import suspect_lease
from ..core.record import Forward, Holder, Label, LockRecord, Waiter
from ..core.timefmt import who
from ..core.timing import Timing


def default_owner_id() -> str:
    """``host:pid:random``: unique per lock instance, readable in ``status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class State(str, enum.Enum):
    """Where a lock instance is in its life. A ``str`` (``State.HELD == "held"``): ``repr(lock)`` and logs show it.

    ``IDLE`` holds nothing, acquires nothing. ``WAITING``: an ``acquire()`` runs (reading, waiting
    as the single waiter). ``HELD``: renewed and checked in the background. ``RELEASING``: a release
    whose write failed transiently, retried in the background (and by ``release()``) until it lands
    or the lease runs out; not renewed, not held for the user. ``LOST``: the hold was lost;
    ``release()`` or ``acquire()`` ends it. ``FORKED``: inherited across ``fork()``, it holds nothing
    and does nothing in the child.
    """

    IDLE = "idle"
    WAITING = "waiting"
    HELD = "held"
    RELEASING = "releasing"
    LOST = "lost"
    FORKED = "forked"


class RequestReason(str, enum.Enum):
    """Why the lock is wanted. A ``str``: ``RequestReason.WAITER == "waiter"``."""

    #: Another party registered as the waiter; ``requester`` is its owner id.
    WAITER = "waiter"
    #: An OS signal (SIGTERM, SIGUSR1, ...) through :func:`~handofflock.install_signal_handlers`.
    SIGNAL = "signal"
    #: A preemption notice from :class:`~handofflock.PreemptionWatcher`.
    PREEMPTION = "preemption"
    #: Code or a person called :meth:`HandoffLock.request_release` (formerly ``"manual"``).
    OPERATOR = "operator"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ReleaseRequest:
    """Someone wants the lock: who, why, and by when.

    ``reason`` is a :class:`RequestReason`; ``requester`` is the waiter's owner
    id, or the signal/notice/operator that asked; ``deadline`` is the Unix time
    by which the lock should be released, or None; ``requested_at`` is the Unix
    time the request was noted here; ``label`` is the waiter's label as its
    record says it (what ``handofflock status`` shows), or None.
    """

    reason: RequestReason
    requester: str
    deadline: float | None
    requested_at: float
    label: str | None = None

    @property
    def who(self) -> str:
        """The requester as people know it: ``label (id)``, or the requester alone without a label."""
        return who(self.requester, self.label)


@dataclass(frozen=True)
class LockStatus:
    """A fresh snapshot of the lock object, as read by :meth:`HandoffLock.status`: the record, and when it was read.

    The named attributes read the record (None or False while the lock object is absent);
    ``owner_live`` and ``waiter_live`` are judged at ``read_at``.
    """

    url: str
    generation: int = 0
    record: LockRecord | None = None
    read_at: float = 0.0
    #: ``expiresAt`` lies further ahead than the record's ttl plus the skew allowance: not trusted.
    #: Contenders count the lease as ending ttl after they first read this version of the record.
    lease_suspect: bool = False

    @classmethod
    def of(
        cls, url: str, record: LockRecord | None, generation: int, now: float, timing: Timing | None = None
    ) -> LockStatus:
        """What a read of ``url`` that found ``record`` at ``generation`` says, judged at wall time ``now``.

        ``timing`` (the reader's ttl and skew allowance; default :meth:`Timing.build`'s) judges a suspect lease.
        """
        if record is None:
            return cls(url, read_at=now)
        return cls(url, generation, record, now, suspect_lease(record, now, timing or Timing.build()))

    @property
    def exists(self) -> bool:
        return self.record is not None

    _owner = Forward[Holder | None]("record.owner", None)
    _waiter = Forward[Waiter | None]("record.waiter", None)
    owner_id = Forward[str | None]("record.owner.id", None)
    expires_at = Forward[float | None]("record.owner.expires_at", None)
    owner_label = Forward[Label | None]("record.owner.label", None)
    owner_instance = Forward[str | None]("record.owner.instance", None)
    """The owner's lock object (:attr:`HandoffLock.instance`): with ``owner_id``, which party holds it."""
    waiter_id = Forward[str | None]("record.waiter.id", None)
    waiter_expires_at = Forward[float | None]("record.waiter.expires_at", None)
    waiter_label = Forward[Label | None]("record.waiter.label", None)
    waiter_instance = Forward[str | None]("record.waiter.instance", None)
    """The waiter's lock object: with ``waiter_id``, which party waits."""
    waiter_asks = Forward[bool]("record.waiter.request.asks", True)
    """False for a patient waiter: it waits without asking the holder to leave."""
    waiter_priority = Forward[int]("record.waiter.request.priority", 0)
    """The waiter's priority for the single slot (0 unless it said)."""
    token = Forward[int]("record.token", 0)
    ttl = Forward[float | None]("record.ttl", None)
    declined = Forward[bool]("record.declined", False)
    """The holder saw the waiter's request and declined it (it does not yield: ``run --no-yield``)."""

    @property
    def held_since(self) -> float | None:
        """When the current hold began (wall clock), or None if the record does not say."""
        return None if self.record is None or self._owner is None else self.record.held_since

    @property
    def min_hold(self) -> float | None:
        """The holder's minimum hold (seconds), or None if the record does not say (an older writer, or 0)."""
        return None if self.record is None or self._owner is None else self.record.min_hold

    @property
    def min_hold_ends(self) -> float | None:
        """When the holder's minimum hold ends (wall clock): a waiter's request is acted on from then on."""
        since, hold = self.held_since, self.min_hold
        return None if since is None or hold is None else since + hold

    @property
    def owner_live(self) -> bool:
        return self._owner is not None and self._owner.live(self.read_at)

    @property
    def waiter_live(self) -> bool:
        return self._waiter is not None and self._waiter.live(self.read_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "exists": self.exists,
            "generation": self.generation,
            "ownerId": self.owner_id,
            "expiresAt": self.expires_at,
            "heldSince": self.held_since,
            "minHold": self.min_hold,
            "minHoldEndsAt": self.min_hold_ends,
            "waitingOwnerId": self.waiter_id,
            "waiterExpiresAt": self.waiter_expires_at,
            "token": self.token,
            "ttl": self.ttl,
            "readAt": self.read_at,
            "ownerLive": self.owner_live,
            "waiterLive": self.waiter_live,
            "ownerLabel": None if self.owner_label is None else self.owner_label.text,
            "waiterLabel": None if self.waiter_label is None else self.waiter_label.text,
            "ownerGrace": None if self.owner_label is None else self.owner_label.grace,
            "waiterAsks": self.waiter_asks,
            "waiterPriority": self.waiter_priority,
            "releaseDeclined": self.declined,
            "leaseSuspect": self.lease_suspect,
        }
