"""Structured fields on the package's log records: which lock, which owner, which token.

Every record from a ``handofflock`` logger emitted on behalf of a lock carries
these attributes (as if passed with ``extra=``), for a JSON formatter or a
log pipeline to index:

| attribute | value |
|---|---|
| ``lock_url`` | the lock's URL (``gs://bucket/key.json``, a path, ...) |
| ``owner_id`` | the owner id of the instance that logged |
| ``token`` | its fencing token while it holds the lock, else None |

One filter adds them at every call site, so the sites keep plain ``%``
formatting: it finds the lock the logging code works for (the ``self`` of a
method of :class:`~handofflock.HandoffLock`, the ``lock`` of a helper object, the ``sender`` of a signal
or function) in the calling frames. It runs only for records a logger
actually emits; fields passed with ``extra=`` are left as they are.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

#: Every logger of the package (docs/observability.md says what each logs, at which level).
LOGGERS = (
    "handofflock.acquire",
    "handofflock.renew",
    "handofflock.release",
    "handofflock.lock.scheduler",
    "handofflock.lock.events",
    "handofflock.lock.metrics",
    "handofflock.os_signals",
    "handofflock.preemption",
    "handofflock.repair",
    "handofflock.aio",
    "handofflock.ranks",
    "handofflock.storage",
)

#: The attributes added to each record.
FIELDS = ("lock_url", "owner_id", "token")

#: How many frames above the logging call are searched for the lock.
_DEPTH = 6


class LockFields(logging.Filter):
    """Add :data:`FIELDS` to a record logged on behalf of a lock; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "lock_url"):
            lock = _lock_of_caller(sys._getframe(1))
            if lock is not None:
                record.lock_url = lock.url
                record.owner_id = lock.owner_id
                record.token = lock.token
        return True


_FILTER = LockFields()


def install(names: tuple[str, ...] = LOGGERS) -> None:
    """Put the filter on each logger in ``names`` (idempotent). Done on ``import handofflock``."""
    for name in names:
        logging.getLogger(name).addFilter(_FILTER)


def _lock_of_caller(frame: FrameType | None) -> Any:
    from .handoff import HandoffLock

    logging_file = logging.__file__
    searched = 0
    while frame is not None and searched < _DEPTH:
        if frame.f_code.co_filename != logging_file:
            searched += 1
            local = frame.f_locals
            for candidate in (local.get("self"), local.get("lock"), local.get("sender")):
                if isinstance(candidate, HandoffLock):
                    return candidate
                try:  # a helper that holds a lock (PreemptionWatcher, SignalHandlers)
                    inner = getattr(candidate, "lock", None) if candidate is not None else None
                except Exception:  # a property that fails: not ours to report, and logging must go on
                    continue
                if isinstance(inner, HandoffLock):
                    return inner
        frame = frame.f_back
    return None
