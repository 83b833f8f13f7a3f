"""Planted bugs: named switches the simulation flips to prove its checker can fail (FoundationDB's BUGGIFY).

A checker that never fails proves nothing. Each name below is one known
mistake, read at the exact line of protocol.py or the lock where that mistake
would be made, as ``if buggify.on(buggify.HEIR_KEEPS_OLD_TOKEN)``. All are off
by default; nothing in the library turns one on. Off, a spot costs one
membership test of an empty frozenset. The simulation
(:mod:`handofflock.testing.sim`) and its model check turn one on with
:func:`planted` and must then report a violation; what each one breaks is
listed in :data:`handofflock.testing.sim.bugs.BUGS`.

The spots are few and one line each; ``grep -n buggify handofflock`` lists them.
A write "without a generation match" is a write whose precondition is
:data:`NO_MATCH`: the simulated store reads it as unconditional (the storage
API has no unconditional write at all, so a real store refuses it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: A generation precondition that the simulated store treats as "none" (a planted bug only).
NO_MATCH = -1

TRUST_A_READ = "trust-a-read"
STILL_MINE_BY_ID = "still-mine-by-id"
KEEP_SLOT_ON_TIMEOUT = "keep-slot-on-timeout"
UNCONDITIONAL_HANDOFF = "unconditional-handoff"
UNCONDITIONAL_RENEWAL = "unconditional-renewal"
GIVE_UP_WITHOUT_MATCH = "give-up-without-match"
LEASE_PAST_ITS_MARGIN = "lease-past-its-margin"
HEIR_KEEPS_OLD_TOKEN = "heir-keeps-old-token"
HEIR_LEASE_FROM_ITS_READ = "heir-lease-from-its-read"
CANCELLED_KEEPS_HANDED_LOCK = "cancelled-keeps-handed-lock"
HANDOFF_TO_EXPIRED_SLOT = "handoff-to-expired-slot"
GROUP_SKIPS_FIRST_LOCK = "group-skips-first-lock"
NO_WALL_SECOND_OPINION = "no-wall-second-opinion"
OWNER_MISSES_TAKE = "owner-misses-take"
EXPIRED_HANDOFF_ACCEPTED = "expired-handoff-accepted"
HEIR_GETS_OWNER_TTL = "heir-gets-owner-ttl"
RENEWAL_DROPS_WAITER = "renewal-drops-waiter"

_active: frozenset[str] = frozenset()


def on(name: str) -> bool:
    """Whether the bug ``name`` is planted (always False outside a simulation)."""
    return name in _active


def match(name: str, generation: int) -> int:
    """The precondition to write with: ``generation``, or :data:`NO_MATCH` while the bug ``name`` is planted."""
    return NO_MATCH if name in _active else generation


@contextmanager
def planted(*names: str) -> Iterator[None]:
    """Plant the named bugs for the duration of the block (the simulation runs one seed inside it).

    :func:`handofflock.testing.sim.bugs.planted` checks the names against the catalogue first.
    """
    with _only(_active | frozenset(names)):
        yield


@contextmanager
def lifted() -> Iterator[None]:
    """No bug planted for the duration of the block: the simulation's checker runs the protocol as its
    specification inside it, whatever the seed planted in the library."""
    with _only(frozenset()):
        yield


@contextmanager
def _only(names: frozenset[str]) -> Iterator[None]:
    global _active
    before, _active = _active, names
    try:
        yield
    finally:
        _active = before
