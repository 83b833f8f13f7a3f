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
from ..core.record import Holder, Label, LockRecord, Waiter
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
    time the request was noted here.
    """

    reason: RequestReason
    requester: str
    deadline: float | None
    requested_at: float


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

    @property
    def _owner(self) -> Holder | None:
        return None if self.record is None else self.record.owner

    @property
    def _waiter(self) -> Waiter | None:
        return None if self.record is None else self.record.waiter

    @property
    def owner_id(self) -> str | None:
        return None if self._owner is None else self._owner.id

    @property
    def expires_at(self) -> float | None:
        return None if self._owner is None else self._owner.expires_at

    @property
    def owner_label(self) -> Label | None:
        return None if self._owner is None else self._owner.label

    @property
    def held_since(self) -> float | None:
        """When the current hold began (wall clock), or None if the record does not say."""
        return None if self.record is None or self._owner is None else self.record.held_since

    @property
    def owner_live(self) -> bool:
        return self._owner is not None and self._owner.live(self.read_at)

    @property
    def waiter_id(self) -> str | None:
        return None if self._waiter is None else self._waiter.id

    @property
    def waiter_expires_at(self) -> float | None:
        return None if self._waiter is None else self._waiter.expires_at

    @property
    def waiter_label(self) -> Label | None:
        return None if self._waiter is None else self._waiter.label

    @property
    def waiter_live(self) -> bool:
        return self._waiter is not None and self._waiter.live(self.read_at)

    @property
    def waiter_asks(self) -> bool:
        """False for a patient waiter: it waits without asking the holder to leave."""
        return self._waiter is None or self._waiter.request.asks

    @property
    def waiter_priority(self) -> int:
        """The waiter's priority for the single slot (0 unless it said)."""
        return 0 if self._waiter is None else self._waiter.request.priority

    @property
    def token(self) -> int:
        return 0 if self.record is None else self.record.token

    @property
    def ttl(self) -> float | None:
        return None if self.record is None else self.record.ttl

    @property
    def declined(self) -> bool:
        """The holder saw the waiter's request and declined it (it does not yield: ``run --no-yield``)."""
        return self.record is not None and self.record.declined

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "exists": self.exists,
            "generation": self.generation,
            "ownerId": self.owner_id,
            "expiresAt": self.expires_at,
            "heldSince": self.held_since,
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
