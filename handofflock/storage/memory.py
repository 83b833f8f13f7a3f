"""``memory://name``: an in-process, thread-safe store.

A real backend (the lock runs on it exactly as on GCS), shared by name within
a process, with fault hooks so tests can make the next call fail, or apply a
write and then raise as if the reply had been lost. It sends no requests, so
a call's ``timeout`` is checked and bounds nothing.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..core.errors import NotFound, PreconditionFailed, TransientStorageError
from .base import checked_delete, checked_read, checked_write, validate_prefix, validate_timeout

_REGISTRY: dict[str, MemoryStorage] = {}
_REGISTRY_LOCK = threading.Lock()
_H = TypeVar("_H")


@dataclass
class _Fault:
    op: str  # "read", "write", "delete", "list" or "*"
    kind: str  # "fail" (raise before applying) or "lose_reply" (apply, then raise)
    exc_factory: Callable[[], BaseException]
    count: int = 1
    key: str | None = None


@dataclass
class FaultHooks:
    """Faults to inject into a :class:`MemoryStorage`. Thread-safe.

    >>> store.faults.fail_next("write")                  # next write raises, nothing applied
    >>> store.faults.lose_reply_next("write")            # next write applies, then raises
    >>> store.faults.fail_next("read", exc=lambda: PermissionError())
    >>> store.faults.before("read", lambda op, key: time.sleep(1))   # every read waits a second first
    >>> store.faults.after("read", lambda op, key, result: other.release())  # another party acts between

    ``before`` and ``after`` hooks stay until :meth:`clear`. A ``before`` hook runs ahead of each
    matching request and may raise (the request then fails, nothing applied), wait, or act on the
    store itself; an ``after`` hook runs once the request applied, before its caller hears back,
    and is given what the caller will get. Hooks run on the caller's thread, outside the store's mutex.
    """

    _faults: list[_Fault] = field(default_factory=list)
    _before: list[tuple[str, str | None, Callable[[str, str | None], object]]] = field(default_factory=list)
    _after: list[tuple[str, str | None, Callable[[str, str | None, object], object]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_next(
        self,
        op: str = "*",
        *,
        count: int = 1,
        key: str | None = None,
        exc: Callable[[], BaseException] | None = None,
    ) -> None:
        """Make the next ``count`` matching calls raise without touching the store."""
        factory = exc or (lambda: TransientStorageError("injected fault: request failed", status=503, ambiguous=False))
        with self._lock:
            self._faults.append(_Fault(op, "fail", factory, count, key))

    def lose_reply_next(
        self,
        op: str = "write",
        *,
        count: int = 1,
        key: str | None = None,
        exc: Callable[[], BaseException] | None = None,
    ) -> None:
        """Make the next ``count`` matching mutations apply, then raise as if the reply was lost."""
        factory = exc or (
            lambda: TransientStorageError("injected fault: reply lost after the write applied", ambiguous=True)
        )
        with self._lock:
            self._faults.append(_Fault(op, "lose_reply", factory, count, key))

    def before(self, op: str, hook: Callable[[str, str | None], object], *, key: str | None = None) -> None:
        """Call ``hook(op, key)`` before each matching request (``op`` as in :meth:`fail_next`)."""
        with self._lock:
            self._before.append((op, key, hook))

    def after(self, op: str, hook: Callable[[str, str | None, object], object], *, key: str | None = None) -> None:
        """Call ``hook(op, key, result)`` after each matching request applied, before its caller hears back."""
        with self._lock:
            self._after.append((op, key, hook))

    def clear(self) -> None:
        """Remove every fault and hook."""
        with self._lock:
            self._faults.clear()
            self._before.clear()
            self._after.clear()

    def _hooks(self, hooks: list[tuple[str, str | None, _H]], op: str, key: str | None) -> list[_H]:
        with self._lock:
            return [hook for o, k, hook in hooks if o in (op, "*") and (k is None or k == key)]

    def enter(self, op: str, key: str | None) -> _Fault | None:
        """Before a request: run its ``before`` hooks, then raise a ``fail`` fault or return a ``lose_reply`` one."""
        for hook in self._hooks(self._before, op, key):
            hook(op, key)
        fault = None
        with self._lock:
            for candidate in self._faults:
                if candidate.op in (op, "*") and (candidate.key is None or candidate.key == key):
                    candidate.count -= 1
                    if candidate.count <= 0:
                        self._faults.remove(candidate)
                    fault = candidate
                    break
        if fault is not None and fault.kind == "fail":
            raise fault.exc_factory()
        return fault

    def leave(self, fault: _Fault | None, op: str, key: str | None, result: object) -> None:
        """After a request applied: run its ``after`` hooks, then raise the ``lose_reply`` fault ``enter`` gave."""
        for hook in self._hooks(self._after, op, key):
            hook(op, key, result)
        if fault is not None:  # "lose_reply": the operation applied, the caller hears a failure
            raise fault.exc_factory()


class MemoryStorage:
    """An in-process store. Use :func:`MemoryStorage.named` to share one by name.

    Generations come from one counter per store, so they strictly increase for a
    key even across delete and recreate. ``calls`` counts operations by name.
    """

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self.url = f"memory://{name}"
        self.faults = FaultHooks()
        self.calls: Counter[str] = Counter()
        self._objects: dict[str, tuple[bytes, int]] = {}
        self._counter = 0
        self._lock = threading.Lock()

    @classmethod
    def named(cls, name: str) -> MemoryStorage:
        """Return the process-wide store called ``name``, creating it on first use."""
        with _REGISTRY_LOCK:
            store = _REGISTRY.get(name)
            if store is None:
                store = _REGISTRY[name] = cls(name)
            return store

    @classmethod
    def forget(cls, name: str) -> None:
        """Drop the named store from the registry (its data goes with it)."""
        with _REGISTRY_LOCK:
            _REGISTRY.pop(name, None)

    # -- the contract ---------------------------------------------------------

    def read(self, key: str, *, max_bytes: int | None = None, timeout: float | None = None) -> tuple[bytes, int] | None:
        checked_read(key, max_bytes, timeout)
        fault = self._before("read", key)
        with self._lock:
            found = self._objects.get(key)
        if found is not None and max_bytes is not None:
            found = found[0][: max_bytes + 1], found[1]
        self.faults.leave(fault, "read", key, found)
        return found

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        data = checked_write(key, data, if_generation_match, timeout)
        fault = self._before("write", key)
        with self._lock:
            current = self._objects.get(key)
            current_generation = current[1] if current else 0
            if current_generation != if_generation_match:
                raise PreconditionFailed(key, if_generation_match, url=self.url)
            self._counter += 1
            self._objects[key] = (data, self._counter)
            generation = self._counter
        self.faults.leave(fault, "write", key, generation)
        return generation

    def delete(self, key: str, *, if_generation_match: int, timeout: float | None = None) -> None:
        checked_delete(key, if_generation_match, timeout)
        fault = self._before("delete", key)
        with self._lock:
            current = self._objects.get(key)
            if current is None:
                raise NotFound(key, url=self.url)
            if current[1] != if_generation_match:
                raise PreconditionFailed(key, if_generation_match, url=self.url)
            del self._objects[key]
        self.faults.leave(fault, "delete", key, None)

    def list(self, prefix: str, *, timeout: float | None = None) -> dict[str, int]:
        validate_prefix(prefix)
        validate_timeout(timeout)
        fault = self._before("list", None)
        with self._lock:
            found = {k: g for k, (_, g) in self._objects.items() if k.startswith(prefix)}
        self.faults.leave(fault, "list", None, found)
        return found

    def close(self) -> None:
        """Nothing to release; the data lives as long as the store object."""

    # -- fault hooks ----------------------------------------------------------

    def _before(self, op: str, key: str | None) -> _Fault | None:
        with self._lock:  # ``+=`` on a Counter is a read and a write: concurrent calls would lose counts
            self.calls[op] += 1
        return self.faults.enter(op, key)

    def __repr__(self) -> str:
        return f"MemoryStorage({self.name!r})"


def _reset_after_fork() -> None:
    """In a forked child: new mutexes (a parent thread may have held one at the fork).

    The child's stores are copies: nothing it writes reaches the parent's.
    """
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for store in _REGISTRY.values():
        store._lock = threading.Lock()
        store.faults._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
