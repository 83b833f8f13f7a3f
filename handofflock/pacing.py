"""How often to retry, and how often one object may be written.

GCS sustains about one write per second to a single object; faster writes
earn 429s. Every lock instance in this process that writes the same object
shares one :class:`WriteGate`, which spaces writes by at least
``min_interval`` and widens the spacing after a 429 (shrinking it back after
successes). Retries use capped exponential backoff with full jitter, bounded
by the caller's deadline.
"""

from __future__ import annotations

import random
import threading
import weakref
from typing import Iterator

# Gates live as long as their store: keyed by the store object itself (weakly),
# not by id(), which a new store can reuse after the old one is collected and so
# inherit its spacing and its booked slots.
_GATES: "weakref.WeakKeyDictionary[object, dict[str, WriteGate]]" = weakref.WeakKeyDictionary()
_UNWEAKABLE: dict[int, tuple[object, dict[str, "WriteGate"]]] = {}
_GATES_LOCK = threading.Lock()

#: Longest spacing a run of 429s can push writes to one object to.
MAX_PENALTY_INTERVAL = 8.0


def backoff(base: float = 0.1, cap: float = 4.0, rng: random.Random | None = None) -> Iterator[float]:
    """Delays for successive retries: full jitter over ``min(cap, base * 2**n)``."""
    draw = (rng or random).random
    attempt = 0
    while True:
        yield draw() * min(cap, base * (2**attempt))
        attempt = min(attempt + 1, 30)


class WriteGate:
    """Spacing of writes to one object from this process.

    ``reserve(now)`` returns how long to wait before writing and books the slot,
    so two threads of one process never write the same object within
    ``interval`` of each other.
    """

    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self.interval = min_interval
        self._next_free = float("-inf")
        self._last_start = float("-inf")
        self._lock = threading.Lock()

    def reserve(self, now: float) -> float:
        with self._lock:
            start = max(now, self._next_free)
            self._last_start = start
            self._next_free = start + self.interval
            return start - now

    def ready_in(self, now: float) -> float:
        """Seconds until a write could start, without booking it.

        A read whose result decides a write should come after this wait, not
        before, or the write may go out on a stale generation.
        """
        with self._lock:
            return max(0.0, self._next_free - now)

    def throttled(self, retry_after: float | None = None) -> None:
        """The store answered 429: space later writes further apart, starting with the retry."""
        with self._lock:
            widened = max(self.interval * 2, self.min_interval, 1.0)
            if retry_after:
                widened = max(widened, retry_after)
            self.interval = min(widened, MAX_PENALTY_INTERVAL)
            # The slot booked for the refused write was sized by the old spacing.
            self._next_free = max(self._next_free, self._last_start + self.interval)

    def succeeded(self) -> None:
        """A write went through: let the spacing relax back toward the minimum."""
        with self._lock:
            if self.interval > self.min_interval:
                self.interval = max(self.min_interval, self.interval * 0.75)


def default_write_interval(storage: object) -> float:
    """The write spacing a store asks for (``min_write_interval``: 1 s on GCS), else 0."""
    return float(getattr(storage, "min_write_interval", 0.0))


def gate_for(storage: object, key: str, min_interval: float) -> WriteGate:
    """The process-wide gate for ``key`` in ``storage`` (the strictest minimum wins)."""
    with _GATES_LOCK:
        try:
            gates = _GATES.setdefault(storage, {})
        except TypeError:  # not weak-referenceable or unhashable: keep it alive with its gates
            gates = _UNWEAKABLE.setdefault(id(storage), (storage, {}))[1]
        gate = gates.get(key)
        if gate is None:
            gate = gates[key] = WriteGate(min_interval)
        elif min_interval > gate.min_interval:
            gate.min_interval = min_interval
            gate.interval = max(gate.interval, min_interval)
        return gate
