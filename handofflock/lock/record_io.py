"""Record I/O: the lock object read, decoded strictly, and written conditionally, stamped at each send.

Everything the lock says to its store goes through :class:`RecordIO`; it
knows the store, the key, the URL (for errors), the clock, the protocol's
:class:`~handofflock.core.timing.Timing` (to restamp a write at its send),
the store's write gate, the retry policy of :mod:`handofflock.storage.cas`,
and one callback that says whether a retry's wait was interrupted (a
``cancel()``, a deferred release). It holds the lock's I/O mutex, which
serialises this lock's storage operations, but keeps no state of the hold:
it never decides what to write (:mod:`handofflock.core.protocol` does) nor
what a result means for the lock (:mod:`.handoff` does). That is why it is a
seam: "how does the lock talk to its store" is answered here, and only here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core import protocol
from ..core.clock import Clock
from ..core.protocol import Write
from ..core.record import LockRecord, new_nonce
from ..core.timing import Timing
from ..storage import MAX_RECORD_BYTES, Storage
from ..storage.cas import read_retrying, write_resolving
from ..storage.pacing import WriteGate, gate_for
from .primitives import Mutex

_log_acquire = logging.getLogger("handofflock.acquire")


class RecordIO:
    """Reads and conditional writes of one lock object (see the module docstring).

    ``interrupted(delay)`` waits up to ``delay`` seconds and says whether an
    interruptible retry must give up (it returned early, or something asks
    the operation to stop).
    """

    def __init__(
        self,
        storage: Storage,
        key: str,
        *,
        url: str,
        clock: Clock,
        policy: Timing,
        min_write_interval: float,
        mutex: Mutex,
        interrupted: Callable[[float], bool],
        who: str,
        request_timeout: float | None = None,
    ) -> None:
        self.storage, self.key, self.url = storage, key, url
        #: Serialises this lock's storage operations (and the transitions that make them).
        self.mutex = mutex
        self._clock, self._policy, self._min_write_interval = clock, policy, min_write_interval
        self._interrupted, self._who = interrupted, who
        #: Each request to the store ends within this (the lock's Timing.request_timeout).
        self.request_timeout = request_timeout
        self._gate: WriteGate | None = None

    def gate(self) -> WriteGate:
        """The store's write gate for this object (shared with every lock of this process on it)."""
        if self._gate is None:
            self._gate = gate_for(self.storage, self.key, self._min_write_interval, self._clock)
        return self._gate

    def read(
        self, deadline: float | None, *, retry: bool = True, interruptible: bool = False
    ) -> tuple[LockRecord | None, int]:
        """One read (retried on transient errors until ``deadline``), decoded strictly.

        Needs no mutex: a read changes nothing. Each request ends within :attr:`request_timeout`.
        """
        found = read_retrying(
            self.storage,
            self.key,
            clock=self._clock,
            deadline=deadline,
            max_bytes=MAX_RECORD_BYTES,
            retry=retry,
            sleep=lambda delay: self.sleep_before_retry(delay, interruptible),
            timeout=self.request_timeout,
        )
        if found is None:
            return None, 0
        data, generation = found
        return LockRecord.decode(data, key=self.key, generation=generation, url=self.url), generation

    def read_locked(self, deadline: float | None) -> tuple[LockRecord | None, int]:
        """An acquire's poll: one interruptible read under the I/O mutex."""
        with self.mutex:
            return self.read(deadline, interruptible=True)

    def write_locked(self, write: Write, deadline: float | None) -> tuple[Write, int, float, float]:
        """An acquire's write: :meth:`write_lease` under the I/O mutex, its retries interruptible."""
        with self.mutex:
            return self.write_lease(write, deadline, interruptible=True)

    def read_to_write(
        self, deadline: float | None, *, urgent: bool = False, interruptible: bool = False
    ) -> tuple[LockRecord | None, int]:
        """Read for a decision that will likely be written: wait for our write slot first (mutex not held).

        Reading and then waiting out the per-object write spacing would send the
        write on a generation that has had a second to go stale; against a busy
        object that can lose every time.
        """
        wait = self.gate().ready_in(self._clock.monotonic(), urgent=urgent)
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - self._clock.monotonic()))
        if wait > 0:
            if interruptible:
                self.sleep_before_retry(wait, True)
            else:
                self._clock.sleep(wait)
        with self.mutex:
            return self.read(deadline, interruptible=interruptible)

    def write_lease(
        self,
        write: Write,
        deadline: float | None,
        *,
        retry: bool = True,
        urgent: bool = False,
        send_by: float | None = None,
        interruptible: bool = False,
    ) -> tuple[Write, int, float, float]:
        """Make ``write``, its lease or slot stamped at the send of each attempt. Call with the mutex held.

        Returns ``(the attempt that landed, new generation, monotonic and wall
        time of its send)``: a lease is counted from the send of the write that
        made it, never from when the operation began (a wait for the write
        gate, or retries after a 503 or a 429, come before the stamp).
        ``send_by`` (monotonic): past it, a 429's widened spacing no longer holds
        an urgent write back (see :meth:`~handofflock.core.timing.Timing.backoff_until`).
        Raises PreconditionFailed when the record moved on (the caller reads and decides again).
        """
        attempts: dict[str, tuple[Write, float, float]] = {}
        sent: list[str] = []

        def stamp() -> bytes:
            mono, wall = self._clock.monotonic(), self._clock.time()
            attempt = protocol.restamp(write, now=wall, nonce=new_nonce(), timing=self._policy)
            assert attempt.record.nonce is not None
            attempts[attempt.record.nonce] = (attempt, mono, wall)
            sent.append(attempt.record.nonce)
            return attempt.record.encode()

        def is_ours(data: bytes) -> bool:
            return LockRecord.decode(data, key=self.key, url=self.url).nonce in attempts

        generation, read_back = write_resolving(
            self.storage,
            self.key,
            stamp,
            if_generation_match=write.if_generation_match,
            is_ours=is_ours,
            clock=self._clock,
            deadline=deadline,
            max_bytes=MAX_RECORD_BYTES,
            gate=self.gate(),
            urgent=urgent,
            send_by=send_by,
            retry=retry,
            sleep=lambda delay: self.sleep_before_retry(delay, interruptible),
            timeout=self.request_timeout,
        )
        landed = attempts[sent[-1]]
        if read_back is not None:
            landed = attempts.get(LockRecord.decode(read_back, key=self.key, url=self.url).nonce or "", landed)
            _log_acquire.info("%s: a write whose reply was lost had landed (%s)", self._who, write.kind.value)
        attempt, mono, wall = landed
        return attempt, generation, mono, wall

    def write(self, write: Write, deadline: float | None, *, urgent: bool = False) -> int:
        """Make one conditional write (stamped at its send); return the new generation. Mutex held."""
        return self.write_lease(write, deadline, urgent=urgent)[1]

    def sleep_before_retry(self, delay: float, interruptible: bool) -> bool:
        """Sleep ``delay`` before a retry (the caller has checked its deadline); False to give up.

        ``interruptible`` retries (an acquire's polling, ``status()``) give up
        on ``cancel()`` or a deferred release. The others (a release, giving
        the waiter slot back) carry on to their deadline whatever arrives: they
        are what a cancel or a signal wants done.
        """
        if not interruptible:
            self._clock.sleep(delay)
            return True
        return not self._interrupted(delay)
