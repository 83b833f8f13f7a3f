"""When an acquire first saw the owner's lease it decides on: client-go's ``observedTime``.

A contender trusts an owner's ``expiresAt`` only as far as a lease can
reach: ttl (plus the skew allowance) ahead of when the contender first read
that lease (see :func:`handofflock.core.protocol.lease_end`). This part
keeps that first reading for one ``acquire()``, per lease: the owner, its
token and its ``expiresAt``, so a renewal starts a new observation while a
waiter's own writes to its slot do not. It says so, once per lease, when a
lease is suspect: a record whose
``expiresAt`` lies years ahead would otherwise block the lock until someone
ran ``release --force``.

A seam because the protocol is pure (it is given ``observed_at``) and the
warning is the lock's to log.
"""

from __future__ import annotations

import logging

from ..core import protocol
from ..core.record import LockRecord
from ..core.timefmt import when
from ..core.timing import Timing

_log = logging.getLogger("handofflock.acquire")


class Observation:
    """The wall time this acquire first read the owner's current lease."""

    __slots__ = ("first", "lease", "policy", "url")

    def __init__(self, url: str, policy: Timing) -> None:
        self.url, self.policy = url, policy
        self.lease: tuple[object, ...] | None = None
        self.first = 0.0

    def at(self, record: LockRecord | None, now: float) -> float:
        """``observed_at`` for :func:`~handofflock.core.protocol.decide_acquire`, reading ``record`` at ``now``."""
        lease = None if record is None else (record.owner_id, record.owner_instance, record.token, record.expires_at)
        if lease != self.lease or self.lease is None:
            self.lease, self.first = lease, now
            if record is not None and protocol.suspect_lease(record, now, self.policy):
                end = protocol.lease_end(record, now, self.policy)
                _log.warning(
                    "lock %s: the lease of %s claims to run until %s, further ahead than its ttl (%s s) allows; "
                    "not trusted: it ends %s unless its owner renews it",
                    self.url,
                    record.owner_id,
                    when(record.expires_at, now),
                    record.ttl or self.policy.ttl,
                    when(end, now),
                )
        return self.first
