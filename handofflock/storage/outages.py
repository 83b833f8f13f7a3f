"""Say once per outage that a store cannot be reached, and once that it answers again.

The retry loops of :mod:`.cas` retry a store's transient errors silently until
their deadline, which for a blocking ``acquire()`` is none: a store that is
down (a wrong ``STORAGE_EMULATOR_HOST``, no network) would leave a waiting
process silent for as long as it waits, then end with a message about
something else. So the first retried failure of a store logs a WARNING on
``handofflock.storage`` with its cause, and the first success after it logs
at INFO. One store object is shared by every lock on its bucket, so a
process says it once, however many of its locks wait on that store.
"""

from __future__ import annotations

import logging
import threading
import weakref

from ..core.errors import TransientStorageError
from .base import Storage

log = logging.getLogger("handofflock.storage")

_down: weakref.WeakKeyDictionary[Storage, str] = weakref.WeakKeyDictionary()  # each store down, and why
_mutex = threading.Lock()


def failed(storage: Storage, exc: TransientStorageError) -> None:
    """A transient failure of ``storage`` that is about to be retried: say so if it starts an outage."""
    why = cause(exc)
    try:
        with _mutex:
            first = storage not in _down
            _down[storage] = why
    except TypeError:  # a store that cannot be referred to weakly: every failure is news
        first = True
    if first:
        log.warning("cannot reach the store %s: %s (retrying)", getattr(storage, "url", storage), why)


def answered(storage: Storage) -> None:
    """``storage`` answered: if it was down, say that it is back."""
    try:
        with _mutex:
            was_down = _down.pop(storage, None) is not None
    except TypeError:
        return
    if was_down:
        log.info("the store %s answers again", getattr(storage, "url", storage))


def down() -> dict[str, str]:
    """The stores of this process that cannot be reached now: ``{store url: why}``."""
    with _mutex:
        return {str(getattr(store, "url", store)): why for store, why in _down.items()}


def cause(exc: BaseException) -> str:
    """What went wrong, in a few words where the exception chain says it ("connection refused")."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain of a requests or botocore error is a few links long
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "connection refused" in text.lower():
        return f"connection refused ({text})"
    return text
