"""One conditional write that survives lost replies and transient errors.

Every conditional write of the library goes through here: the lock's own
(:mod:`handofflock.lock.record_io`) and those of the modules beside it (``fencing.py``,
``repair.py``). A write whose reply is lost (a timeout or
reset after the request went out) may or may not have been applied, and a retry
would fail its precondition against its own result. So every write carries a
nonce the caller can recognise in the stored bytes, and after an ambiguous
failure the object is read back:

* it carries our nonce: the write landed; carry on as if the reply had arrived;
* its generation is still the one we matched: it did not land; retry;
* someone else wrote, and the bytes show ours is not among the writes since:
  raise :class:`PreconditionFailed` so the caller reads again and decides again;
* someone else wrote, and the bytes cannot show it either way (a fenced object
  keeps only its last writes' nonces, and ours may have dropped out): raise
  :class:`TransientStorageError` (ambiguous), never PreconditionFailed, whose
  caller would take it for "nothing written".
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.backoff import RETRY, Backoff
from ..core.clock import Clock
from ..core.errors import PreconditionFailed, TransientStorageError
from . import outages
from .base import Storage
from .pacing import WriteGate


class Retries:
    """The retries of one operation: :data:`~handofflock.core.backoff.RETRY` delays bounded by a deadline.

    The deadline is monotonic, or None for none. The policy is
    :meth:`Backoff.delay_within <handofflock.core.backoff.Backoff.delay_within>`:
    the last try goes just before the deadline, never past it.
    """

    def __init__(self, clock: Clock, deadline: float | None, policy: Backoff = RETRY) -> None:
        self._clock = clock
        self._deadline = deadline
        self._policy = policy
        self._attempt = 0

    def next_delay(self) -> float | None:
        """Seconds to wait before the next try, or None when there is none."""
        delay = self._policy.delay_within(self._attempt, now=self._clock.monotonic(), deadline=self._deadline)
        self._attempt += 1
        return delay


def read_retrying(
    storage: Storage,
    key: str,
    *,
    clock: Clock,
    deadline: float | None,
    max_bytes: int,
    retry: bool = True,
    sleep: Callable[[float], bool] | None = None,
    timeout: float | None = None,
) -> tuple[bytes, int] | None:
    """One read, its transient errors retried with backoff until ``deadline`` (monotonic).

    ``retry``, ``sleep`` and ``timeout`` as for :func:`write_resolving`. Every read that
    decides a write goes through here (the lock's, the fence's, a force-release's).
    """
    retries = Retries(clock, deadline)
    while True:
        try:
            found = storage.read(key, max_bytes=max_bytes, timeout=timeout)
        except TransientStorageError as exc:
            delay = retries.next_delay()
            if not retry or delay is None:
                raise
            outages.failed(storage, exc)  # said once per outage: a long wait is never silent
            if sleep is None:
                clock.sleep(delay)
            elif not sleep(delay):
                raise
        else:
            outages.answered(storage)
            return found


def write_resolving(
    storage: Storage,
    key: str,
    data: bytes | Callable[[], bytes],
    *,
    if_generation_match: int,
    is_ours: Callable[[bytes], bool | None],
    clock: Clock,
    deadline: float | None,
    max_bytes: int,
    gate: WriteGate | None = None,
    urgent: bool = False,
    send_by: float | None = None,
    retry: bool = True,
    sleep: Callable[[float], bool] | None = None,
    timeout: float | None = None,
) -> tuple[int, bytes | None]:
    """Write ``data`` if the object is at ``if_generation_match``; return ``(generation, read_back)``.

    ``data`` may be a function called just before each attempt is sent (after
    any wait for the write gate), so what it stamps (a lease's ``expiresAt``)
    dates from the send; ``is_ours`` must then recognise every attempt's bytes.
    ``gate`` spaces the writes; ``urgent`` as for :meth:`WriteGate.take`, and
    ``send_by`` is its ``by``: the latest time (monotonic) a 429's widened
    spacing may hold this urgent write back (a renewal passes
    :meth:`Timing.backoff_until <handofflock.core.timing.Timing.backoff_until>`).

    ``is_ours(bytes)`` says whether stored bytes show our write: True, False
    (they prove it is not among the writes they reflect), or None (they cannot
    tell). After a write that may have landed, bytes at a later generation for
    which it says None end the write with an ambiguous
    :class:`TransientStorageError`: the outcome is lost, and no retry can find it.

    ``read_back`` is None when the store answered the write, else the bytes read
    back that proved it landed (they may be a later write that kept our nonce in
    view: compare them with ``data`` before trusting ``generation`` as ours).
    Transient errors are retried with backoff until ``deadline`` (monotonic);
    the last one is raised after it. With ``retry=False`` the first transient
    error is raised (after one read-back if the write may have landed).
    ``sleep(seconds)`` waits between retries and returns False to stop early
    (a cancelled acquire); the default just sleeps. ``timeout`` bounds each
    request (the store's ``timeout``; None: the store's own). Raises
    :class:`PreconditionFailed` when the object moved on, and any permanent
    :class:`StorageError` at once.
    """
    retries = Retries(clock, deadline)
    maybe_landed = False
    failed: TransientStorageError | None = None

    def pause() -> bool:
        """Sleep before the next try; False when there is no next try."""
        delay = retries.next_delay()
        if not retry or delay is None:
            return False
        if sleep is None:
            clock.sleep(delay)
            return True
        return sleep(delay)

    while True:
        while gate is not None and not gate.take(clock.monotonic(), urgent=urgent, by=send_by):
            wait = gate.ready_in(clock.monotonic(), urgent=urgent, by=send_by)
            if deadline is not None and clock.monotonic() + wait >= deadline:
                # The spacing (widened by 429s) would carry the write past the deadline:
                # give up now rather than sleep there. Nothing was booked, so giving up
                # costs the other writers of the object nothing.
                raise failed or TransientStorageError(
                    f"the write spacing for {key!r} ({wait:.1f} s) would pass the operation's deadline",
                    url=getattr(storage, "url", None),
                    key=key,
                    ambiguous=False,
                )
            clock.sleep(max(wait, 0.001))
        body = data() if callable(data) else data
        try:
            generation = storage.write(key, body, if_generation_match=if_generation_match, timeout=timeout)
        except PreconditionFailed:
            if gate is not None:
                gate.refund(clock.monotonic())
            if maybe_landed:  # our own earlier attempt may be what moved the generation
                while True:  # only a read can tell; a failed one is no answer, so read again
                    try:
                        landed = _landed(storage, key, if_generation_match, is_ours, max_bytes, timeout)
                        break
                    except TransientStorageError:
                        if not pause():
                            raise
                    except _OutcomeLost:
                        raise _outcome_lost(storage, key, if_generation_match) from None
                if landed is not None:
                    return landed
            raise
        except TransientStorageError as exc:
            failed = exc
            if exc.status == 429 and gate is not None:
                gate.throttled(exc.retry_after)
            if exc.ambiguous:
                maybe_landed = True
                try:
                    landed = _landed(storage, key, if_generation_match, is_ours, max_bytes, timeout)
                except TransientStorageError:
                    landed = None  # cannot tell yet; the retry's precondition will
                except _OutcomeLost:
                    raise _outcome_lost(storage, key, if_generation_match) from exc
                if landed is not None:
                    return landed
            if not pause():
                raise
            outages.failed(storage, exc)  # after the pause: a write's last failure is the caller's to report
        else:
            if gate is not None:
                gate.succeeded()
            outages.answered(storage)
            return generation, None


def _landed(
    storage: Storage,
    key: str,
    expected: int,
    is_ours: Callable[[bytes], bool | None],
    max_bytes: int,
    timeout: float | None,
) -> tuple[int, bytes] | None:
    """After a write that may have landed: ``(generation, bytes)`` if it did, None if it did not yet.

    Raises :class:`PreconditionFailed` if someone else wrote and ours is proven
    absent, and :class:`_OutcomeLost` if someone else wrote and the bytes cannot
    tell. Not a :class:`TransientStorageError`: the callers retry those.
    """
    found = storage.read(key, max_bytes=max_bytes, timeout=timeout)
    if found is None:
        if expected != 0:
            raise PreconditionFailed(key, expected, url=getattr(storage, "url", None))
        return None
    data, generation = found
    try:
        ours = is_ours(data)
    except Exception:  # unreadable bytes are not ours; the caller's own read will report them
        ours = False
    if ours:
        return generation, data
    if generation == expected:
        return None
    if ours is None:
        raise _OutcomeLost()
    raise PreconditionFailed(key, expected, url=getattr(storage, "url", None))


class _OutcomeLost(Exception):
    """Raised by :func:`_landed`: the object moved on, and its bytes no longer show whether our write landed."""


def _outcome_lost(storage: Storage, key: str, expected: int) -> TransientStorageError:
    return TransientStorageError(
        f"write to {key!r} in {getattr(storage, 'url', storage)}: no reply came, and others have written since "
        f"generation {expected} so often that the object no longer shows whether this write is among theirs: "
        "it may have landed (read the object to see where things stand)",
        url=getattr(storage, "url", None),
        key=key,
        ambiguous=True,
    )
