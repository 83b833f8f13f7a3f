"""How often to retry, and how often one object may be written.

GCS sustains about one write per second to a single object; faster writes
earn 429s. Every lock instance in this process that writes the same object
(on the same clock) shares one :class:`WriteGate`, which keeps writes to one
per ``min_interval`` on average, lets a release through at once, and widens
the spacing after a 429 (shrinking it back after successes). How long a retry waits
is :mod:`handofflock.core.backoff`'s business.

A 429 asks for backoff, but the lease comes first. The widened spacing holds
back the writes that can wait (a waiter's registration or refresh), and an
urgent write (a renewal) for as long as it has room to wait: a writer passes
``by``, the latest time it can be held to and still keep its promise. Past
that, an urgent write waits only the store's own spacing (``min_interval``
since the last write sent to the object), never the widening: a 429 answered
to a write applies nothing, so sending one more write at GCS's documented rate
costs at most another 429, while waiting out a doubled spacing past the
renew deadline costs the lock (issue 25).
"""

from __future__ import annotations

import os
import threading
import weakref

# Gates live as long as their store: keyed by the store object itself (weakly),
# not by id(), which a new store can reuse after the old one is collected and so
# inherit its spacing and its booked slots.
_GATES: weakref.WeakKeyDictionary[object, dict[tuple[str, object], WriteGate]] = weakref.WeakKeyDictionary()
_UNWEAKABLE: dict[int, tuple[object, dict[tuple[str, object], WriteGate]]] = {}
_GATES_LOCK = threading.Lock()

#: Longest spacing a run of 429s can push writes to one object to.
MAX_PENALTY_INTERVAL = 8.0
#: Writes the bucket of a gate holds: an urgent write may follow an ordinary one at once.
BURST = 2
#: A wait this short is no wait: a write may go (float dust in the bucket arithmetic).
_TOLERANCE = 1e-9


class WriteGate:
    """Spacing of writes to one object from this process: a token bucket on one clock.

    The bucket holds at most :data:`BURST` writes and refills one write per
    ``interval`` (``min_interval``, widened after a 429). An ordinary write
    (a renewal, a waiter's registration) needs the bucket full and leaves one
    write in it; an ``urgent`` one (a release or handoff, giving a waiter slot
    back) needs just one. So writes average at most one per ``interval``, and
    a release never waits behind the renewal that went out a moment before it.

    Nothing is booked ahead: :meth:`ready_in` says how long until a write of
    its class could go, and :meth:`take` spends a write only at the moment it
    is sent. A writer that gives up costs the others nothing.

    A gate belongs to one clock: times passed to it are that clock's
    ``monotonic()`` readings (see :func:`gate_for`).
    """

    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self.interval = min_interval
        self._tokens = float(BURST)
        self._stamp = float("-inf")  # when _tokens was last brought up to date
        self._sent = float("-inf")  # when the last write was let through
        self._lock = threading.Lock()

    def _capacity(self) -> float:
        # While a 429's penalty lasts there is no burst: every write waits its full spacing.
        return float(BURST) if self.interval <= self.min_interval else 1.0

    def _refill(self, now: float) -> float:
        """Bring the bucket up to ``now``; return what a write of the asking class needs."""
        cap = self._capacity()
        if self.interval <= 0:
            self._tokens = cap
        elif now > self._stamp:
            gained = (now - self._stamp) / self.interval if self._stamp != float("-inf") else cap
            self._tokens = min(cap, self._tokens + gained)
        self._tokens = min(cap, self._tokens)
        self._stamp = max(self._stamp, now)
        return cap

    def _wait(self, now: float, urgent: bool, by: float | None) -> float:
        """Seconds until a write of this class may go (call with ``_lock`` held)."""
        need = 1.0 if urgent else self._refill(now)
        if urgent:
            self._refill(now)
        wait = 0.0 if self.interval <= 0 else max(0.0, (need - self._tokens) * self.interval)
        if urgent and wait > 0 and self.interval > self.min_interval and by is not None and now + wait > by:
            # A 429's widening would hold this write past the last moment it can wait: it goes
            # at the store's own spacing instead (the lease comes first; see the module docstring).
            wait = min(wait, max(0.0, self._sent + self.min_interval - now))
        return wait

    def ready_in(self, now: float, *, urgent: bool = False, by: float | None = None) -> float:
        """Seconds until a write of this class could be sent; nothing is booked.

        ``by`` (urgent writes only): the latest time this write may be held
        back by the spacing a 429 widened. If the widened spacing would pass
        it, the write waits only ``min_interval`` after the previous write sent
        to the object. Without ``by`` the widened spacing holds urgent writes too.

        A read whose result decides a write should come after this wait, not
        before, or the write may go out on a stale generation.
        """
        with self._lock:
            wait = self._wait(now, urgent, by)
        # Below the tolerance take() allows, a write may go now. Float dust (1e-13 s) left as a wait
        # would put the next try at ``now + wait == now``: a renewal deferred to the instant it was
        # deferred at, again and again, wherever time does not move between tries (the simulation).
        return 0.0 if wait <= _TOLERANCE else wait

    def take(self, now: float, *, urgent: bool = False, by: float | None = None) -> bool:
        """Spend one write now if its class may go (``by`` as for :meth:`ready_in`); False (nothing spent) if not."""
        with self._lock:
            if self._wait(now, urgent, by) > _TOLERANCE:
                return False
            self._tokens = max(0.0, self._tokens - 1.0)
            self._sent = max(self._sent, now)
            return True

    def refund(self, now: float) -> None:
        """A write was refused on its precondition (412): it changed nothing, so it costs nothing.

        GCS's rate limit is on updates of the object; a refused write is none. An
        owner whose renewal lost the race with a waiter's write retries at once.
        """
        with self._lock:
            cap = self._refill(now)
            self._tokens = min(cap, self._tokens + 1.0)

    def throttled(self, retry_after: float | None = None) -> None:
        """The store answered 429: empty the bucket and refill it more slowly."""
        with self._lock:
            widened = max(self.interval * 2, self.min_interval, 1.0)
            if retry_after:
                widened = max(widened, retry_after)
            self.interval = min(widened, MAX_PENALTY_INTERVAL)
            self._tokens = 0.0

    def succeeded(self) -> None:
        """A write went through: let the spacing relax back toward the minimum."""
        with self._lock:
            if self.interval > self.min_interval:
                relaxed = self.interval * 0.75
                # Close enough to the minimum is the minimum (0.75**n never reaches 0).
                self.interval = self.min_interval if relaxed < self.min_interval + 0.05 else relaxed


def default_write_interval(storage: object) -> float:
    """The write spacing a store asks for (``min_write_interval``: 1 s on GCS), else 0."""
    return float(getattr(storage, "min_write_interval", 0.0))


def gate_for(storage: object, key: str, min_interval: float, clock: object = None) -> WriteGate:
    """The process-wide gate for ``key`` in ``storage`` on ``clock`` (the strictest minimum wins).

    Writers on different clocks get different gates: a gate compares times of
    one clock only. (A fake clock's monotonic time has nothing to do with the
    real one; mixing them once made a real-clock lock wait out the difference.)
    """
    with _GATES_LOCK:
        try:
            gates = _GATES.setdefault(storage, {})
        except TypeError:  # not weak-referenceable or unhashable: keep it alive with its gates
            gates = _UNWEAKABLE.setdefault(id(storage), (storage, {}))[1]
        slot = (key, getattr(clock, "timebase", clock))
        gate = gates.get(slot)
        if gate is None:
            gate = gates[slot] = WriteGate(min_interval)
        elif min_interval > gate.min_interval:
            gate.min_interval = min_interval
            gate.interval = max(gate.interval, min_interval)
        return gate


def _reset_after_fork() -> None:
    """In a forked child: new mutexes for the gates (a parent thread may have held one at the fork)."""
    global _GATES_LOCK
    _GATES_LOCK = threading.Lock()
    for gates in [*_GATES.values(), *(held for _, held in _UNWEAKABLE.values())]:
        for gate in gates.values():
            gate._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
