"""Structured fields on the package's log records: which lock, which owner, which token.

Every record a lock logs carries these attributes (as if passed with ``extra=``),
for a JSON formatter or a log pipeline to index:

| attribute | value |
|---|---|
| ``lock_url`` | the lock's URL (``gs://bucket/key.json``, a path, ...) |
| ``owner_id`` | the owner id of the instance that logged |
| ``token`` | its fencing token while it holds the lock, else None |

A lock logs through a :class:`LockLog` per logger, a :class:`logging.LoggerAdapter`
that adds them, so the call sites keep plain ``%`` formatting. Fields passed with
``extra=`` are kept as they are.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

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


class Described(Protocol):
    """What the fields are read from: a :class:`~handofflock.HandoffLock`."""

    @property
    def url(self) -> str: ...

    @property
    def owner_id(self) -> str: ...

    @property
    def token(self) -> int | None: ...


D = TypeVar("D")

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter


def weakly(obj: D) -> Callable[[], D | None]:
    """``obj`` reached through a weak reference, or a strong one where it takes none: how a lock's parts
    (its loggers, its request book) reach it, so that none of them keeps it alive."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class LockLog(_Adapter):
    """The logger ``name``, speaking for ``lock``: each record carries :data:`FIELDS`, read as it is logged.

    It reaches the lock weakly (a lock's loggers never keep it alive); once the lock is gone its
    records carry the URL and owner id it had, and no token.
    """

    def __init__(self, name: str, lock: Described) -> None:
        super().__init__(logging.getLogger(name), {})
        self._lock = weakly(lock)
        self._gone = {"lock_url": lock.url, "owner_id": lock.owner_id, "token": None}

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        lock = self._lock()
        fields = self._gone if lock is None else {"lock_url": lock.url, "owner_id": lock.owner_id, "token": lock.token}
        kwargs["extra"] = {**fields, **(kwargs.get("extra") or {})}
        return msg, kwargs
