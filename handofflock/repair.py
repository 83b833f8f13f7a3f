"""Breaking a lock on purpose: replace the lock object, corrupt or not, with a free record.

The lock never overwrites an object it cannot read (it might be someone's data),
and never takes a live lease. :func:`force_release` is the explicit way out for
an operator who has looked: one generation-matched write, so a concurrent repair
or a lock that moved on is never clobbered. What it replaced is returned.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from .core.clock import Clock
from .core.errors import LockRecordCorrupt, PreconditionFailed
from .core.protocol import next_token
from .core.record import MAX_TOKEN, LockRecord, new_nonce
from .storage import MAX_RECORD_BYTES, open_url
from .storage.records import read_retrying, write_resolving

if TYPE_CHECKING:
    from .lock.handoff import HandoffLock

_log = logging.getLogger("handofflock.repair")


@dataclass(frozen=True)
class ForcedRelease:
    """What :func:`force_release` replaced, and with what.

    ``data`` is the old object's bytes (at most 64 KiB + 1: ``truncated`` says
    whether it was longer). ``record`` is the old record when it was readable,
    else ``error`` says why it was not. ``token`` is the token of the free record
    written in its place: the next lock holder's token will be higher still.
    """

    url: str
    key: str
    generation: int
    data: bytes
    truncated: bool
    record: LockRecord | None
    error: LockRecordCorrupt | None
    new_generation: int
    token: int


def force_release(
    url_or_lock: str | os.PathLike[str] | HandoffLock,
    *,
    expected_generation: int | None = None,
    clock: Clock | None = None,
    timeout: float = 30.0,
) -> ForcedRelease | None:
    """Replace the lock object with a free record, whatever it holds. Returns what it replaced.

    With ``expected_generation`` (say from :attr:`LockRecordCorrupt.generation`
    or ``status()``), the object must still be at that generation: if it changed
    since you looked, :class:`PreconditionFailed` is raised and nothing is
    written. Without it, the generation just read is the precondition, so a
    write racing ours still wins and ours is refused.

    A readable record continues its token sequence (owner and waiter cleared,
    unknown fields kept), so the evicted owner's fenced writes are refused once
    the next holder writes. An unreadable one is replaced by a fresh record
    whose token is the current time in milliseconds, as for a new lock, or one
    more than the token the broken record still shows, if that is higher.
    Returns None if there was no object (a missing lock is already free).

    >>> force_release("gs://bucket/locks/train.json", expected_generation=err.generation)
    """
    if isinstance(url_or_lock, (str, os.PathLike)):
        storage, key = open_url(url_or_lock)
        url = os.fspath(url_or_lock)
    else:
        storage, key, url = url_or_lock.storage, url_or_lock.key, url_or_lock.url
    clock = clock or Clock()
    deadline = clock.monotonic() + timeout

    found = read_retrying(storage, key, clock=clock, deadline=deadline, max_bytes=MAX_RECORD_BYTES)
    if found is None:
        if expected_generation not in (None, 0):
            raise PreconditionFailed(key, expected_generation, url=url)
        return None
    data, generation = found
    if expected_generation is not None and generation != expected_generation:
        raise PreconditionFailed(key, expected_generation, url=url)

    now = clock.time()
    nonce = new_nonce()
    old: LockRecord | None
    error: LockRecordCorrupt | None = None
    try:
        old = LockRecord.decode(data, key=key, generation=generation, url=url)
    except LockRecordCorrupt as exc:
        old, error = None, exc
    if old is not None:
        free = old.replace(owner=None, waiter=None, declined=False, token=next_token(old, now), nonce=nonce)
    else:  # continue past whatever token the broken record still shows, if any
        free = LockRecord(token=next_token(LockRecord(token=_salvage_token(data)), now), nonce=nonce)
    new_generation, _ = write_resolving(
        storage,
        key,
        free.encode(),
        if_generation_match=generation,
        is_ours=lambda raw: LockRecord.decode(raw, key=key).nonce == nonce,  # a lost reply's write was ours
        clock=clock,
        deadline=deadline,
        max_bytes=MAX_RECORD_BYTES,
    )
    _log.warning(
        "force-released %s (generation %d, %s): now free with token %d",
        url,
        generation,
        f"owner {old.owner and old.owner.id!r}" if old is not None else f"corrupt: {error.reason if error else ''}",
        free.token,
    )
    return ForcedRelease(
        url=url,
        key=key,
        generation=generation,
        data=data[:MAX_RECORD_BYTES],
        truncated=len(data) > MAX_RECORD_BYTES,
        record=old,
        error=error,
        new_generation=new_generation,
        token=free.token,
    )


def _salvage_token(data: bytes) -> int:
    """The ``token`` of a record too broken to decode, if its JSON still has a plausible one; else 0."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return 0
    token = value.get("token") if isinstance(value, dict) else None
    if isinstance(token, int) and not isinstance(token, bool) and 0 <= token < MAX_TOKEN:
        return token
    return 0
