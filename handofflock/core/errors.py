"""Every error handofflock raises, under one root: :class:`HandoffLockError`.

Storage errors describe what the store said; lock errors describe what that
means for the lock. Builtins are subclassed where one fits, so
``except TimeoutError`` catches :class:`LockTimeout` and ``except ValueError``
catches configuration mistakes. Causes are always chained (``raise ... from``).
"""

from __future__ import annotations

import time
from typing import Any

from .timefmt import who


class HandoffLockError(Exception):
    """Root of every error raised by handofflock.

    Every one pickles (a worker of a ``ProcessPoolExecutor`` may raise it):
    it is rebuilt from its message and attributes, whatever its constructor takes.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__.copy()))


def _rebuild(cls: type[HandoffLockError], args: tuple[Any, ...], state: dict[str, Any]) -> HandoffLockError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


# --------------------------------------------------------------------------- storage


class StorageError(HandoffLockError):
    """The store refused or failed an operation in a way retrying will not fix.

    Examples: permission denied, a missing bucket, bad credentials. The message
    names the store and says what to check. Its subclasses narrow the case.
    """

    #: Whether an attempt of the failed write got no answer at all (cut off at its timeout, a reset): the
    #: store may still apply it later, whatever the last attempt's answer said. Set by the record layer.
    may_land_late: bool = False

    def __init__(self, message: str, *, url: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.url, self.key = url, key


class PreconditionFailed(StorageError):
    """A conditional write or delete found a different generation than expected.

    This is the normal outcome of losing a race; the lock reads again and decides.
    """

    def __init__(self, key: str, expected_generation: int, *, url: str | None = None) -> None:
        what = "absent" if expected_generation == 0 else f"at generation {expected_generation}"
        super().__init__(
            f"precondition failed for {key!r}: expected the object {what}, it was not",
            url=url,
            key=key,
        )
        self.expected_generation = expected_generation


class LockingUnsupported(StorageError):
    """The store cannot serialize writes: it refuses, or would ignore, what makes them exclusive.

    A local store whose filesystem refuses file locks (``ENOLCK``: typically
    NFS whose lock manager cannot be reached, ``rpc.statd`` / ``lockd`` not
    running); or an S3-compatible store that ignores ``If-Match`` or
    ``If-None-Match`` on ``PutObject`` (found by a probe before its first write).
    Retrying does not help, so it is raised at once. Put the lock on a local
    filesystem, or use ``gs://`` (or a store that honours the conditions) for
    more than one host. (An NFS mount with ``nolock`` or ``local_lock=flock|all``
    does not fail at all: its locks exclude only this host's processes, which
    the local store warns about; see docs/local-backend.md.)
    """


class NotFound(StorageError):
    """The object does not exist (for operations that need it to)."""

    def __init__(self, key: str, *, url: str | None = None) -> None:
        super().__init__(f"object {key!r} does not exist", url=url, key=key)


class TransientStorageError(StorageError):
    """A failure that may succeed if retried: 408, 429, 5xx, timeouts, resets.

    ``ambiguous`` is True when the request may have been applied even though no
    reply arrived (a timeout or reset after the request was sent): a retry of a
    conditional write may then fail against the write's own result.
    ``retry_after`` carries a server's hint in seconds, when it gave one.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        key: str | None = None,
        status: int | None = None,
        ambiguous: bool = True,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, url=url, key=key)
        self.status, self.ambiguous, self.retry_after = status, ambiguous, retry_after


class StorageTimeout(TransientStorageError, TimeoutError):
    """No complete reply came within the time given: a request's own bound, or what was left of the
    caller's deadline (then nothing more is tried; ``acquire(timeout=...)`` says :class:`LockTimeout`).

    Also raised, with nothing sent, when the store's write spacing or the deadline itself leaves
    no time for a request. ``ambiguous`` as for every transient error: a write cut off may have been applied.
    """


class StoreUnreachableWarning(RuntimeWarning):
    """A lock's store has not answered for longer than one request may take; the lock keeps retrying.

    Warned once per lock (:func:`warnings.warn`: shown on stderr without any logging set up;
    ``-W ignore::handofflock.core.errors.StoreUnreachableWarning`` silences it).
    """


class RenewalsBehindWarning(RuntimeWarning):
    """The process's scheduler starts renewals late: past half their margin, before any lease is lost.

    More locks are held in the process than its I/O workers can renew at the store's latency
    (docs/benchmarks.md has the capacity per ttl). Warned once per episode (:func:`warnings.warn`,
    shown on stderr without any logging set up), and logged on ``handofflock.lock.scheduler``.
    ``Scheduler.lateness`` and the ``handofflock.renewal.lateness`` metric say how late.
    """


class StoppedWithoutCheckpointWarning(RuntimeWarning):
    """A rank of a multi-rank job was told to stop now (a second Ctrl-C): it left without a checkpoint.

    The agreed stop was abandoned on that rank: no meeting of the ranks, no checkpoint, and on the
    holder rank the lock let go at once. Warned through :func:`warnings.warn` (shown on stderr
    without any logging set up) as well as logged on ``handofflock.ranks``.
    """


# --------------------------------------------------------------------------- configuration


class ConfigurationError(HandoffLockError, ValueError):
    """A parameter or URL is invalid. Raised before any I/O happens."""


class InvalidLockURL(ConfigurationError):
    """A lock URL could not be understood (scheme, bucket or object name)."""


class InvalidKey(ConfigurationError):
    """An object key is empty, too long, escapes its root, or has forbidden characters."""


# --------------------------------------------------------------------------- the record


class LockRecordCorrupt(HandoffLockError, ValueError):
    """The lock object exists but is not a valid lock record.

    The lock never overwrites such an object on its own: somebody wrote it,
    and it might matter to them. Inspect it, then clear it explicitly with
    ``handofflock release URL --force`` (a generation-matched write, so a
    concurrent repair is never clobbered).
    """

    def __init__(self, key: str, reason: str, *, generation: int | None = None, url: str | None = None) -> None:
        where = url or key
        super().__init__(
            f"lock record {where!r} is corrupt: {reason}. Nothing was overwritten; "
            f"inspect the object, then clear it with `handofflock release {where} --force`"
        )
        self.key, self.url, self.reason, self.generation = key, url, reason, generation


# --------------------------------------------------------------------------- the lock


class TokensExhausted(HandoffLockError):
    """The lock's fencing token is at its maximum (2**63 - 1): no higher one can be issued.

    A new owner must get a token strictly greater than every earlier one, or
    fencing cannot tell them apart; so taking the lock fails instead. Only a
    hand-written (or hostile) record gets here: tokens start at the creator's
    clock in milliseconds (about 1.7e12).
    """


class LockContended(HandoffLockError):
    """The lock is held and the single waiter slot is taken by someone else.

    Names who holds the lock, who waits, and until when, so the caller can
    decide whether to try later.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        url: str | None = None,
        owner_id: str | None = None,
        owner_expires_at: float | None = None,
        waiter_id: str | None = None,
        waiter_expires_at: float | None = None,
        owner_label: str | None = None,
        waiter_label: str | None = None,
    ) -> None:
        if message is None:
            # No "until T": the holder renews its lease while it lives, so its expiry says nothing of when
            # the lock comes free; the waiter's slot is refreshed the same way.
            live = owner_expires_at is not None and owner_expires_at >= time.time()
            held = f"held by {who(owner_id, owner_label)}" + (" (a live lease, renewed by its holder)" if live else "")
            message = (
                f"lock {url!r} is {held} and {who(waiter_id, waiter_label)} is already waiting; handofflock allows "
                "one waiter at a time: to wait for the slot, pass a timeout (acquire(timeout=...), run --timeout) "
                "or wait_for_slot=True (run --wait-for-slot), or try again later"
            )
        super().__init__(message)
        self.url, self.owner_id, self.owner_expires_at = url, owner_id, owner_expires_at
        self.waiter_id, self.waiter_expires_at = waiter_id, waiter_expires_at
        #: Who the owner and the waiter are, for people (their labels' text), as ``status`` shows them.
        self.owner_label, self.waiter_label = owner_label, waiter_label


class LockTimeout(LockContended, TimeoutError):
    """``acquire(timeout=...)`` ran out of time. Carries the last state seen."""


class AcquireCancelled(HandoffLockError):
    """A blocking ``acquire()`` was cancelled (``lock.cancel()`` or a release request)."""


class LockLost(HandoffLockError):
    """The lock is no longer safely held: stolen, deleted, expired, or unrenewable.

    Stop the protected work; anything written after this point must be
    fenced with the lock's token to be safe.
    """

    def __init__(self, message: str, *, url: str | None = None, reason: str = "lost", cause: Any = None) -> None:
        super().__init__(message)
        self.url, self.reason, self.cause = url, reason, cause


class AlreadyAcquired(HandoffLockError, RuntimeError):
    """``acquire()`` on an instance that already holds the lock, or is acquiring it in another thread.

    A :class:`~handofflock.HandoffLock` is one party of the protocol (one
    owner id, at most one waiter slot): it is not reentrant (as
    python-redis-lock's ``AlreadyAcquired``: a nested ``with lock:`` would
    hand the lock over at its end, in the middle of the outer block), and
    threads do not queue on it. Give each thread its own instance: the second
    then waits as the waiter and the holder is asked to hand over.
    """


class LockNotHeld(HandoffLockError, RuntimeError):
    """An operation that needs the lock held (release, renew) was called without it."""


class InheritedAcrossFork(HandoffLockError, RuntimeError):
    """A HandoffLock used in a process forked from the one that created it.

    The lock, its lease and its renewals belong to the parent. In the child an
    inherited instance holds nothing: ``is_held`` and ``healthy`` are False,
    ``check()`` raises :class:`LockLost`, and acquire, release and status raise
    this. Create a new HandoffLock in the child.
    """


class AgreementFailed(HandoffLockError, RuntimeError):
    """The collective by which the ranks of one job agree to go on, yield or stop failed.

    Another rank died, hung past the process group's timeout, or the network
    between ranks broke. This rank stops rather than wait: it can no longer
    learn what the others decided. The framework's own error is chained.
    """
