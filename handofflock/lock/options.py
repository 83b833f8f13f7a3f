"""The constructor's options: the timing (keywords or one :class:`Timing`), the owner id, the label, the store.

What each keyword means is written once, at :class:`LockOptions`, for both
the lock and the async lock.

No I/O happens in a lock's constructor, but everything it was given is
validated there, once, with a message that says what to change. Kept apart
from the lock so that its constructor reads as what the lock is made of, and
so that the async lock, which takes the same keywords, is checked by the same
code (it builds a :class:`~handofflock.lock.handoff.HandoffLock`). The timing
keywords are read back as :class:`TimingViews` (``lock.ttl`` is
``lock.timing.ttl``): one value, never copied into fields.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

from ..core.clock import Clock
from ..core.errors import ConfigurationError
from ..core.identity import detect_label
from ..core.record import Label, id_problem, label_problem
from ..core.timing import Timing
from ..storage import Storage, open_url
from ..storage.pacing import default_write_interval
from .primitives import Primitives
from .types import default_owner_id


class LockOptions(TypedDict, total=False):
    """HandoffLock's keywords, as one type: ``AsyncHandoffLock(url, **options: Unpack[LockOptions])``.

    Kept equal to :class:`~handofflock.lock.handoff.HandoffLock`'s keyword
    parameters (a test compares them), and described here, once, for both locks.

    Timing (seconds): ``ttl`` is the lease; the owner renews every
    ``renew_interval`` (default ttl/8) and gives the lock up as unhealthy if no
    renewal succeeded for ``renew_deadline`` (default ttl/2). The owner reads
    the record every ``waiter_check_interval`` to notice a waiter; a waiter
    reads it every ``waiter_poll_interval`` and holds its slot for
    ``waiter_ttl`` (default ttl), refreshing it at half-life. A lease counts
    as expired for others only ``max_clock_skew`` after its ``expiresAt``.
    ``min_write_interval`` spaces writes to the object from this process
    (default 1.0 on GCS, whose per-object write rate is about 1/s; 0 elsewhere).
    Or pass them all as one ``timing=``, a :class:`~handofflock.Timing`.
    With ``wait_for_slot=True`` a blocking acquire that finds another live
    waiter keeps polling for the slot instead of raising :class:`LockContended`
    (an acquire with a ``timeout``, or a patient one, always does).
    With ``yield_to_requests=False`` the holder must not be cut short: a
    waiter's request is declined (written to the record, shown by ``status``
    as "declined"), ``release_requested`` stays False for it and no
    ``on_release_requested`` is sent; requests of this process's own (a
    signal, a preemption notice, :meth:`request_release`) still stand.
    ``owner_id`` defaults to a fresh ``host:pid:random``; pass a stable one to
    let a restarted process retake its own lock at once. ``label`` says who
    this is for people (``status`` shows it beside the owner or waiter id): a
    string, a :class:`~handofflock.core.record.Label`, or by default what
    :func:`~handofflock.core.identity.detect_label` finds (host, pid, pod,
    Slurm job, torchrun rank).

    What the lock is built from can be passed in, for tests and simulations:
    ``clock`` (wall and monotonic time, waits), ``scheduler`` (what runs the
    renewals and waiter checks; by default one per process), ``storage`` and
    ``key`` (instead of a URL), and ``primitives``, a
    :class:`~handofflock.lock.primitives.Primitives` whose factories make
    every mutex, event, thread-local and thread the lock and its parts use
    (default: :mod:`threading`).
    """

    ttl: float
    renew_interval: float | None
    renew_deadline: float | None
    waiter_ttl: float | None
    waiter_check_interval: float
    waiter_poll_interval: float
    max_clock_skew: float
    min_write_interval: float | None
    wait_for_slot: bool
    yield_to_requests: bool
    owner_id: str | None
    label: str | Label | None
    clock: Clock | None
    scheduler: Any
    storage: Storage | None
    key: str | None
    timing: Timing | None
    primitives: Primitives | None
    release_at_exit: bool | None


#: The timing keywords of HandoffLock and their defaults (None: derived from ttl, or from the store).
TIMING_DEFAULTS: dict[str, float | None] = {
    "ttl": 60.0,
    "renew_interval": None,
    "renew_deadline": None,
    "waiter_ttl": None,
    "waiter_check_interval": 2.0,
    "waiter_poll_interval": 1.0,
    "max_clock_skew": 2.0,
    "min_write_interval": None,
}


class TimingViews:
    """The timing keywords, read back from ``self.timing`` (read-only: a lock's timing is one value).

    A base of :class:`~handofflock.lock.handoff.HandoffLock`, so that
    ``lock.ttl`` and friends stay what they always were.
    """

    timing: Timing

    @property
    def ttl(self) -> float:
        """The lease, in seconds. ``timing.ttl``."""
        return self.timing.ttl

    @property
    def renew_interval(self) -> float:
        """Seconds between renewals. ``timing.renew_interval``."""
        return self.timing.renew_interval

    @property
    def renew_deadline(self) -> float:
        """No successful renewal for this long, and the hold is no longer safe. ``timing.renew_deadline``."""
        return self.timing.renew_deadline

    @property
    def waiter_ttl(self) -> float:
        """How long a waiter's slot lasts unrefreshed. ``timing.waiter_ttl``."""
        return self.timing.waiter_ttl

    @property
    def waiter_check_interval(self) -> float:
        """Seconds between the owner's waiter checks. ``timing.waiter_check_interval``."""
        return self.timing.waiter_check_interval

    @property
    def waiter_poll_interval(self) -> float:
        """Seconds between a waiter's polls. ``timing.waiter_poll_interval``."""
        return self.timing.waiter_poll_interval

    @property
    def max_clock_skew(self) -> float:
        """How far the clocks of the processes sharing the lock may disagree. ``timing.max_clock_skew``."""
        return self.timing.max_clock_skew

    @property
    def min_write_interval(self) -> float:
        """Spacing of this process's writes to the object (the store's pacing). ``timing.min_write_interval``."""
        return self.timing.min_write_interval


def timing_of(storage: Storage, timing: Timing | None, keywords: dict[str, float | None]) -> Timing:
    """The lock's timing: ``timing`` as given, or built from the ``keywords`` (validated once, in Timing)."""
    if timing is not None:
        given = [name for name, value in keywords.items() if value != TIMING_DEFAULTS[name]]
        if not isinstance(timing, Timing):
            raise ConfigurationError(f"timing must be a handofflock.Timing, got {type(timing).__name__}")
        if given:
            raise ConfigurationError(f"pass timing= or the timing keywords, not both (got {', '.join(given)})")
    else:
        kw = dict(keywords)
        if kw["min_write_interval"] is None:
            kw["min_write_interval"] = default_write_interval(storage)
        timing = Timing.build(**kw)  # type: ignore[arg-type]
    explicit = getattr(storage, "explicit_request_timeout", None)
    timing.check_request_timeout(explicit, getattr(storage, "url", "the store"))
    return timing


def store_of(url: str | os.PathLike[str], storage: Storage | None, key: str | None) -> tuple[Storage, str, str]:
    """``(storage, key, url)``: the store and key given (both, or neither), or those the URL names (no I/O)."""
    if storage is not None:
        if key is None:
            raise ConfigurationError("pass key= together with storage=")
        return storage, key, f"{getattr(storage, 'url', storage)}/{key}"
    storage, key = open_url(url)
    return storage, key, os.fspath(url)


def owner_id_of(owner_id: str | None) -> str:
    """``owner_id`` checked (it is written into the lock object), or a fresh ``host:pid:random``."""
    if owner_id is not None and (problem := id_problem(owner_id, "owner_id")) is not None:
        raise ConfigurationError(f"{problem}: it is written into the lock object")
    return owner_id or default_owner_id()


def label_of(label: str | Label | None) -> Label:
    """``label`` as a checked :class:`Label`; by default what :func:`detect_label` finds."""
    if label is None:
        label = Label(detect_label())
    elif isinstance(label, str):
        label = Label(label)
    problem = label_problem(label.text, "label") if isinstance(label, Label) else "label must be a string"
    if problem is not None:
        raise ConfigurationError(f"{problem}: it is written into the lock object")
    return label
