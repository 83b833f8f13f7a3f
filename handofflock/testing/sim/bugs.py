"""The planted bugs the simulation must find: :mod:`handofflock.core.buggify`'s switches, named and explained."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ...core import buggify
from ...core.buggify import (
    CANCELLED_KEEPS_HANDED_LOCK,
    EXPIRED_HANDOFF_ACCEPTED,
    GIVE_UP_WITHOUT_MATCH,
    GROUP_SKIPS_FIRST_LOCK,
    HANDOFF_TO_EXPIRED_SLOT,
    HEIR_GETS_OWNER_TTL,
    HEIR_KEEPS_OLD_TOKEN,
    HEIR_LEASE_FROM_ITS_READ,
    KEEP_SLOT_ON_TIMEOUT,
    LEASE_PAST_ITS_MARGIN,
    NO_WALL_SECOND_OPINION,
    OWNER_MISSES_TAKE,
    RENEWAL_DROPS_WAITER,
    STILL_MINE_BY_ID,
    TRUST_A_READ,
    UNCONDITIONAL_HANDOFF,
    UNCONDITIONAL_RENEWAL,
)

__all__ = ["BUGS", "PROTOCOL_BUGS", "planted"]

#: Every planted bug: name -> what goes wrong, and where the switch is read.
BUGS: dict[str, str] = {
    TRUST_A_READ: "an owner never notices it lost the lock: any record is still ours (protocol._check_still_mine)",
    STILL_MINE_BY_ID: "'still mine' by owner id alone, token and instance unchecked (protocol._check_still_mine)",
    KEEP_SLOT_ON_TIMEOUT: "a waiter that gives up leaves its slot in the record (HandoffLock._leave_slot)",
    UNCONDITIONAL_HANDOFF: "the handoff and release write skips the generation match (protocol.decide_release)",
    UNCONDITIONAL_RENEWAL: "a renewal overwrites whatever is there (protocol.decide_renew)",
    GIVE_UP_WITHOUT_MATCH: "a waiter's give-up is written without a generation match (protocol.decide_give_up_wait)",
    LEASE_PAST_ITS_MARGIN: "the owner counts itself safe until expiresAt + skew, no margin (handoff.lease_until)",
    HEIR_KEEPS_OLD_TOKEN: "a handoff gives the heir the old owner's token (protocol.decide_release)",
    HEIR_LEASE_FROM_ITS_READ: "the heir counts its lease from its own read of the handoff (HandoffLock._became_owner)",
    CANCELLED_KEEPS_HANDED_LOCK: (
        "a cancelled acquire keeps a lock handed to it meanwhile (HandoffLock._leave_slot, and _acquire's way out)"
    ),
    HANDOFF_TO_EXPIRED_SLOT: "the owner hands off to a waiter whose slot has expired (protocol.decide_release)",
    GROUP_SKIPS_FIRST_LOCK: "a scheduler's grouped waiter check never checks its first lock (Scheduler._check_group)",
    NO_WALL_SECOND_OPINION: (
        "a lease is not checked against the wall clock, so a host suspend goes unseen (handoff.Lease.set)"
    ),
    OWNER_MISSES_TAKE: "an owner's waiter check that reads its lease taken is not a loss (protocol.observe_as_owner)",
    EXPIRED_HANDOFF_ACCEPTED: "a waiter accepts a handoff whose lease has run out (protocol.decide_acquire)",
    HEIR_GETS_OWNER_TTL: "a handoff gives the heir the owner's ttl, not the one it asked for (protocol.decide_release)",
    RENEWAL_DROPS_WAITER: "a renewal writes the record without its waiter slot (protocol.decide_renew)",
}

#: Bugs whose switch sits in the pure protocol: the model check can find these.
PROTOCOL_BUGS = (
    TRUST_A_READ,
    STILL_MINE_BY_ID,
    UNCONDITIONAL_HANDOFF,
    UNCONDITIONAL_RENEWAL,
    GIVE_UP_WITHOUT_MATCH,
    HEIR_KEEPS_OLD_TOKEN,
    HANDOFF_TO_EXPIRED_SLOT,
    RENEWAL_DROPS_WAITER,
)


@contextmanager
def planted(*names: str) -> Iterator[None]:
    """Plant the named bugs (:func:`handofflock.core.buggify.planted`), each of them one of :data:`BUGS`."""
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise ValueError(f"unknown planted bug(s) {unknown}; known: {sorted(BUGS)}")
    with buggify.planted(*names):
        yield
