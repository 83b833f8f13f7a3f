"""Fencing at the resource: an object that refuses writes from a replaced lock holder.

A lease cannot stop a paused process: it wakes up believing it still holds the
lock while a newer holder works. What can stop it is the resource refusing its
writes. A :class:`FencedObject` is a JSON document in the lock's store that
remembers the highest fencing token it accepted and refuses any write with a
lower one (:class:`StaleToken`). Every check-then-write is
one generation-matched write, so two writers cannot both pass the check.

Document (version 1)::

    {"handofflockFence": 1, "highestToken": 17, "writerId": "host:pid:ab12",
     "writtenAt": 1700000000.0, "recentNonces": ["9f2c..."], "payload": ...}

``payload`` is the caller's JSON value (a list for a journal built with
:meth:`FencedObject.append`). Unknown fields are kept. Anything else off raises
:class:`FencedObjectCorrupt`; such an object is never
overwritten. See ``docs/fencing.md``. The document's strict decoder sits
beside the one class that writes it, so what is accepted and what is written
cannot drift.
"""

from __future__ import annotations

import math
import os
import posixpath
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from .core.clock import Clock
from .core.errors import ConfigurationError, HandoffLockError, PreconditionFailed
from .core.record import MAX_TOKEN, id_problem, new_nonce
from .core.timing import seconds
from .storage import Storage, validate_key
from .storage.records import default_write_interval, gate_for, read_retrying, write_resolving

if TYPE_CHECKING:
    from .lock.handoff import HandoffLock


class StaleToken(HandoffLockError):
    """A fenced write carried a token lower than one the resource already accepted.

    Also raised for a token equal to the highest accepted one when it comes from
    a different writer: one token names one acquisition, which has one owner.
    Stop: a newer holder of the lock has written since this one was replaced.
    """

    def __init__(
        self, key: str, token: int, highest: int, *, writer_id: str | None = None, holder_id: str | None = None
    ) -> None:
        if token == highest:
            message = (
                f"write to {key!r} refused: token {token} was already used by writer {holder_id!r}, "
                f"not {writer_id!r}; one token belongs to one lock holder"
            )
        else:
            message = f"write to {key!r} refused: token {token} is stale, the resource already accepted token {highest}"
        super().__init__(message)
        self.key, self.token, self.highest, self.writer_id, self.holder_id = key, token, highest, writer_id, holder_id


class FencedObjectCorrupt(HandoffLockError, ValueError):
    """A fenced object exists but is not a valid fence document (see ``docs/fencing.md``).

    Never overwritten on its own: it may be someone's data, and rewriting it would
    also forget the highest token it accepted. Inspect it, then repair it by hand.
    """

    def __init__(self, key: str, reason: str, *, generation: int | None = None, url: str | None = None) -> None:
        where = f"{url}/{key}" if url else key
        super().__init__(
            f"fenced object {where!r} is corrupt: {reason}. Nothing was overwritten; inspect it, then repair "
            "it by hand keeping highestToken at least as high as any token in use (see docs/fencing.md)"
        )
        self.key, self.url, self.reason, self.generation = key, url, reason, generation


class FencedObjectFull(HandoffLockError):
    """A fenced write would make the object larger than its ``max_bytes``; nothing was written."""

    _says = (
        "fenced object {key!r} would grow to {size} bytes, over its limit of {max_bytes}; "
        "nothing was written: start a new object (a new journal key) or raise max_bytes"
    )

    def __init__(self, key: str, size: int, max_bytes: int) -> None:
        super().__init__(self._says.format(key=key, size=size, max_bytes=max_bytes))
        self.key, self.size, self.max_bytes = key, size, max_bytes


class FencedObjectTooLarge(FencedObjectFull):
    """A fenced object is larger than this reader's ``max_bytes``. It is not corrupt: raise ``max_bytes``."""

    _says = (
        "fenced object {key!r} holds more than {max_bytes} bytes, this instance's max_bytes: it is not "
        "corrupt, only larger than this reader accepts. Nothing was written; pass a larger max_bytes"
    )


#: The document format version this release reads and writes.
FENCE_VERSION = 1
#: Default size limit of a fenced object. Each write rewrites the whole object.
DEFAULT_MAX_BYTES = 1024 * 1024
#: Nonces of the last writes kept in the document, so a writer whose reply was
#: lost can tell that its write landed even if a few others wrote after it.
RECENT_NONCES = 16

#: Every live fenced object, so that a forked child can give each a new mutex.
_FENCES: weakref.WeakSet[FencedObject] = weakref.WeakSet()

_KNOWN = ("handofflockFence", "highestToken", "writerId", "writtenAt", "recentNonces", "payload")


@dataclass(frozen=True)
class FencedValue:
    """A fenced object as read (or as just written).

    ``generation`` is 0 and ``highest_token`` 0 when the object does not exist.
    """

    key: str
    payload: Any
    highest_token: int
    writer_id: str | None
    written_at: float | None
    generation: int

    @property
    def exists(self) -> bool:
        return self.generation != 0


@dataclass(frozen=True)
class _Doc:
    highest: int = 0
    writer_id: str | None = None
    written_at: float | None = None
    recent: tuple[str, ...] = ()
    payload: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "handofflockFence": FENCE_VERSION,
            "highestToken": self.highest,
            "writerId": self.writer_id,
            "writtenAt": self.written_at,
            "recentNonces": list(self.recent),
            "payload": self.payload,
        }
        for k, v in self.extra.items():
            doc.setdefault(k, v)
        return orjson.dumps(doc)


class FencedObject:
    """A JSON object in a lock's store that refuses writes carrying a stale fencing token.

    >>> lock = HandoffLock("gs://bucket/jobs/train.lock")
    >>> latest = FencedObject.beside(lock, "latest-checkpoint.json")
    >>> with lock:
    ...     latest.claim()                       # from now on, older holders are refused
    ...     path = f"ckpt/step-{step}-token-{lock.token}.pt"
    ...     save(path)                           # a name no other holder can use
    ...     latest.write({"path": path})         # raises StaleToken if we were replaced

    ``write(payload, token)`` accepts ``token`` if it is higher than every token
    accepted so far, or equal to the highest one *and* from the same
    ``writer_id`` (the same holder writing again). A lower token, or the same
    token from another writer, raises :class:`StaleToken` and changes nothing.

    ``writer_id`` identifies the writer for that equality rule; objects made with
    :meth:`beside` use the lock's owner id, others default to a fresh
    ``host:pid:random`` per instance. Transient storage errors are retried with
    backoff for up to ``timeout`` seconds; a lost reply is resolved by reading
    back the write's nonce. The object is limited to ``max_bytes``
    (:class:`FencedObjectFull` beyond). Thread-safe; no I/O in the constructor.
    """

    def __init__(
        self,
        storage: Storage,
        key: str,
        *,
        writer_id: str | None = None,
        clock: Clock | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float = 30.0,
        min_write_interval: float | None = None,
        _lock: HandoffLock | None = None,
    ) -> None:
        self._storage = storage
        self.key = validate_key(key)
        if writer_id is None:
            from .lock.types import default_owner_id

            writer_id = default_owner_id()
        if (problem := id_problem(writer_id, "writer_id")) is not None:
            raise ConfigurationError(problem)
        self.writer_id = writer_id
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
            raise ConfigurationError(f"max_bytes must be an int of at least 1024, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.timeout = seconds("timeout", timeout)
        if min_write_interval is None:
            min_write_interval = default_write_interval(storage)
        self.min_write_interval = seconds("min_write_interval", min_write_interval)
        self._clock = clock or Clock()
        self._lock = _lock
        self._mutex = threading.Lock()
        self._cached: tuple[int, _Doc] | None = None  # (generation, document) as last seen or written
        _FENCES.add(self)

    @classmethod
    def beside(cls, lock: HandoffLock, name: str, **kwargs: Any) -> FencedObject:
        """The fenced object ``name`` in the lock's store, next to the lock object.

        ``name`` is relative to the directory of the lock's key (``locks/a.json``
        and ``"latest.json"`` give ``locks/latest.json``). Writes default to the
        lock's token and check the lock's health first; the writer id is the
        lock's owner id.
        """
        key = posixpath.join(posixpath.dirname(lock.key), name) if isinstance(name, str) else name
        if key == lock.key:  # a key that is not valid is refused by the constructor
            raise ConfigurationError(f"a fenced object cannot be the lock object itself ({key!r})")
        kwargs.setdefault("clock", lock.clock)
        kwargs.setdefault("writer_id", lock.owner_id)
        kwargs.setdefault("min_write_interval", lock.min_write_interval)
        return cls(lock.storage, key, _lock=lock, **kwargs)

    @property
    def url(self) -> str:
        return f"{self._storage.url}/{self.key}"

    # ------------------------------------------------------------------ public operations

    def read(self) -> FencedValue:
        """Read the object now: payload, highest accepted token, last writer."""
        with self._mutex:
            self._cached = self._read(self._clock.monotonic() + self.timeout)
            generation, doc = self._cached
            return self._value(doc, generation)

    def write(self, payload: Any, token: int | None = None) -> FencedValue:
        """Replace the payload, if ``token`` is not stale. Returns the object as written.

        Raises :class:`StaleToken` (nothing written) if a higher token was
        accepted, or the same token from another writer.
        """
        _encodable(payload, "payload")
        return self._update(token, lambda doc: payload)

    def append(self, entry: Any, token: int | None = None) -> FencedValue:
        """Append ``entry`` to the payload list (created empty), if ``token`` is not stale.

        One write per call (and no read while this instance's view is current).
        Raises :class:`FencedObjectFull` when the object would pass ``max_bytes``.
        """
        _encodable(entry, "entry")

        def appended(doc: _Doc) -> list[Any]:
            if doc.payload is None:
                return [entry]
            if not isinstance(doc.payload, list):
                raise FencedObjectCorrupt(
                    self.key,
                    f"append needs a list payload, the object holds {type(doc.payload).__name__}",
                    url=self._storage.url,
                )
            return [*doc.payload, entry]

        return self._update(token, appended)

    def claim(self, token: int | None = None) -> FencedValue:
        """Raise the object's highest token to ``token`` without changing the payload.

        Call it right after acquiring the lock: from then on, writes from any
        earlier holder are refused, even before this holder writes anything.
        A claim is a decision, so it always reads the object (it never trusts
        this instance's view of it): a claim that returns is in force, and one
        that a higher token has overtaken raises :class:`StaleToken`.
        """
        return self._update(token, None)

    # ------------------------------------------------------------------ the check-then-write

    def _update(self, token: int | None, change: Callable[[_Doc], Any] | None) -> FencedValue:
        token = self._token(token)
        with self._mutex:
            deadline = self._clock.monotonic() + self.timeout
            gate = gate_for(self._storage, self.key, self.min_write_interval)
            if change is None:
                self._cached = None  # a claim decides on what the store holds now
            while True:
                if self._cached is None:
                    self._cached = self._read(deadline)
                generation, doc = self._cached
                if token < doc.highest or (token == doc.highest and doc.writer_id not in (None, self.writer_id)):
                    raise StaleToken(self.key, token, doc.highest, writer_id=self.writer_id, holder_id=doc.writer_id)
                if change is None and doc.highest == token and doc.writer_id == self.writer_id:
                    return self._value(doc, generation)  # claiming what we already hold: nothing to write
                nonce = new_nonce()
                new = _Doc(
                    highest=token,
                    writer_id=self.writer_id,
                    written_at=self._clock.time(),
                    recent=(*doc.recent, nonce)[-RECENT_NONCES:],
                    payload=doc.payload if change is None else change(doc),
                    extra=doc.extra,
                )
                try:
                    data = new.encode()
                except orjson.JSONEncodeError as exc:  # only the stored part can fail: ours was checked
                    raise FencedObjectCorrupt(
                        self.key, f"its content cannot be written back ({exc})", url=self._storage.url
                    ) from exc
                if len(data) > self.max_bytes:
                    raise FencedObjectFull(self.key, len(data), self.max_bytes)
                try:
                    new_generation, read_back = write_resolving(
                        self._storage,
                        self.key,
                        data,
                        if_generation_match=generation,
                        is_ours=lambda raw, nonce=nonce, doc=doc: _shows(raw, nonce, doc.recent),  # type: ignore[misc]
                        clock=self._clock,
                        deadline=deadline,
                        max_bytes=self.max_bytes,
                        gate=gate,
                    )
                except PreconditionFailed:
                    self._cached = None  # someone wrote since we looked: read, check again
                    continue
                except BaseException:
                    self._cached = None
                    raise
                if read_back is None or read_back == data:
                    self._cached = (new_generation, new)
                else:
                    self._cached = None  # ours landed, and others wrote after it
                return self._value(new, new_generation)

    def _token(self, token: int | None) -> int:
        if token is None:
            if self._lock is None:
                raise ConfigurationError("pass the fencing token (the lock's token) to write to a FencedObject")
            self._lock.check()  # a lock that knows it is lost or stale stops here, before any I/O
            token = self._lock.token
        if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= MAX_TOKEN:
            raise ConfigurationError(f"a fencing token is an int in [1, 2**63-1], got {token!r}")
        return token

    # ------------------------------------------------------------------ I/O

    def _read(self, deadline: float) -> tuple[int, _Doc]:
        found = read_retrying(self._storage, self.key, clock=self._clock, deadline=deadline, max_bytes=self.max_bytes)
        if found is None:
            return 0, _Doc()
        data, generation = found
        return generation, decode_fence(
            data, key=self.key, generation=generation, url=self._storage.url, max_bytes=self.max_bytes
        )

    def _value(self, doc: _Doc, generation: int) -> FencedValue:
        return FencedValue(self.key, doc.payload, doc.highest, doc.writer_id, doc.written_at, generation)

    def __repr__(self) -> str:
        return f"<FencedObject {self.url!r} writer_id={self.writer_id!r}>"


def decode_fence(
    data: bytes,
    *,
    key: str = "<fenced>",
    generation: int | None = None,
    url: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> _Doc:
    """Parse and validate a fence document; raise :class:`FencedObjectCorrupt` on anything off."""

    def corrupt(reason: str) -> FencedObjectCorrupt:
        return FencedObjectCorrupt(key, reason, generation=generation, url=url)

    if len(data) > max_bytes:  # the reader's limit, not a property of the object
        raise FencedObjectTooLarge(key, len(data), max_bytes)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise corrupt("object is not valid UTF-8") from exc
        raise corrupt(f"invalid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise corrupt("expected a JSON object")
    version = doc.get("handofflockFence")
    if version is None:
        raise corrupt(
            "not a fence document (no 'handofflockFence' field): refusing to overwrite what may be someone's data"
        )
    if version != FENCE_VERSION or type(version) is not int:  # JSON's true equals 1
        raise corrupt(f"unsupported fence version {version!r} (this handofflock reads {FENCE_VERSION}); upgrade first")
    highest = doc.get("highestToken")
    if type(highest) is not int or not 0 <= highest <= MAX_TOKEN:
        raise corrupt("'highestToken' must be an integer in [0, 2**63-1]")
    writer = doc.get("writerId")
    if writer is not None and (problem := id_problem(writer, "writerId")) is not None:
        raise corrupt(problem)
    written_at = doc.get("writtenAt")
    if written_at is not None and (type(written_at) not in (int, float) or not math.isfinite(written_at)):
        raise corrupt("'writtenAt' must be null or a finite number")
    recent = doc.get("recentNonces", [])
    if (
        not isinstance(recent, list)
        or len(recent) > 4 * RECENT_NONCES
        or not all(isinstance(n, str) and 0 < len(n) <= 128 for n in recent)
    ):
        raise corrupt("'recentNonces' must be a short list of nonce strings")
    extra = {k: v for k, v in doc.items() if k not in _KNOWN}
    return _Doc(
        highest, writer, None if written_at is None else float(written_at), tuple(recent), doc.get("payload"), extra
    )


def _shows(data: bytes, nonce: str, before: tuple[str, ...]) -> bool | None:
    """Whether ``data`` shows the write with ``nonce``, made over a document whose nonces were ``before``.

    True if the nonce is there. Every write keeps the nonces before it, the
    newest :data:`RECENT_NONCES` of them, so the nonces form a suffix of the
    object's history: if the last nonce of ``before`` is still there, every
    write since is in view and ours is proven absent (False). If it has dropped
    out, or ``before`` had none and the list is full, ours may have dropped out
    with it: None, the bytes cannot tell. Bytes that are no fence document
    raise :class:`FencedObjectCorrupt` (not ours; the next read reports them).
    """
    recent = decode_fence(data, max_bytes=len(data)).recent
    if nonce in recent:
        return True
    if before:
        return False if before[-1] in recent else None
    return False if len(recent) < RECENT_NONCES else None


def _encodable(value: Any, what: str) -> None:
    """Refuse what cannot be stored as given: unserialisable values, and NaN or infinities.

    JSON has no NaN or infinity; orjson would store them as ``null``, and the
    write would return a payload the object does not hold.
    """
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"the {what} of a fenced write must be JSON-serialisable: {exc}") from exc
    if (where := _non_finite(value, "")) is not None:
        raise ConfigurationError(
            f"the {what} of a fenced write holds a non-finite number at {where or 'its top'}; JSON cannot "
            "store NaN or infinity (it would be read back as null), so nothing was written"
        )


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity in ``value``, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        if (found := _non_finite(v, f"{path}[{k!r}]")) is not None:
            return found
    return None


def _reset_after_fork() -> None:
    """In a forked child: new mutexes (a parent thread may have been inside a write), no cached view."""
    for fence in list(_FENCES):
        fence._mutex = threading.Lock()
        fence._cached = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
