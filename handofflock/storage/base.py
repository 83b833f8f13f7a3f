"""The storage contract every backend implements, and what all backends share.

The lock talks to storage only through :class:`Storage`. Every mutation carries
a generation precondition; there is deliberately no unconditional write, so
none can slip in. Generation ``0`` in ``if_generation_match`` means "the object
must not exist".
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from ..core.errors import ConfigurationError, InvalidKey
from ..core.record import MAX_RECORD_BYTES as MAX_RECORD_BYTES  # the record's limit, enforced by every store

#: GCS's own limit on object names, in UTF-8 bytes.
MAX_KEY_BYTES = 1024


@runtime_checkable
class Storage(Protocol):
    """A store of small objects with generation-matched mutations.

    Implementations: :class:`~handofflock.storage.memory.MemoryStorage`,
    :class:`~handofflock.storage.local.LocalStorage`,
    :class:`~handofflock.storage.gcs.GCSStorage`.

    All methods may raise :class:`~handofflock.core.errors.TransientStorageError`
    (retry may help) or :class:`~handofflock.core.errors.StorageError` (it will not).
    """

    #: A URL naming the store (for messages and logs).
    url: str

    def read(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, int] | None:
        """Return ``(data, generation)``, or ``None`` if the object does not exist.

        With ``max_bytes``, at most ``max_bytes + 1`` bytes are read, so a caller can
        tell an oversized object from one that fits without reading all of it.
        """
        ...

    def write(self, key: str, data: bytes, *, if_generation_match: int) -> int:
        """Write ``data`` if the object's generation is ``if_generation_match``.

        ``0`` means the object must not exist. Returns the new generation, which
        is strictly greater than any generation the key had before, even across
        a delete. Raises :class:`~handofflock.core.errors.PreconditionFailed` otherwise.
        """
        ...

    def delete(self, key: str, *, if_generation_match: int) -> None:
        """Delete the object if its generation is ``if_generation_match``.

        Raises :class:`~handofflock.core.errors.PreconditionFailed` on a mismatch and
        :class:`~handofflock.core.errors.NotFound` if it does not exist. (The GCS
        emulator ignores the precondition on DELETE; the lock never relies on it.)
        """
        ...

    def list(self, prefix: str) -> dict[str, int]:
        """Return ``{key: generation}`` for every object whose key starts with ``prefix``."""
        ...

    def close(self) -> None:
        """Release client resources. The store's data is unaffected."""
        ...


def validate_key(key: object) -> str:
    """Check an object key and return it, or raise :class:`InvalidKey` saying why.

    Keys are relative, ``/``-separated paths: no empty, ``.`` or ``..`` segments,
    no leading ``/``, no backslashes or control characters, at most 1024 UTF-8 bytes.
    The same rules hold on every backend, so a key valid in memory is valid on GCS.
    """
    if not isinstance(key, str):
        raise InvalidKey(f"object key must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidKey("object key is empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidKey(f"object key is longer than {MAX_KEY_BYTES} UTF-8 bytes")
    if key.startswith("/"):
        raise InvalidKey(f"object key {key!r} must be relative (no leading '/')")
    if "\\" in key:
        raise InvalidKey(f"object key {key!r} contains a backslash")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
        raise InvalidKey(f"object key {key!r} contains a control character")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKey(f"object key {key!r} is not valid UTF-8") from exc
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidKey(f"object key {key!r} has an empty, '.' or '..' segment")
    return key


def validate_prefix(prefix: object) -> str:
    """Check a listing prefix: the rules of a key, but it may be empty or end with ``/``."""
    if not isinstance(prefix, str):
        raise InvalidKey(f"prefix must be a str, got {type(prefix).__name__}")
    body = prefix[:-1] if prefix.endswith("/") else prefix
    if body:
        validate_key(body)
    elif prefix:
        raise InvalidKey("prefix '/' must be relative (no leading '/')")
    return prefix


def validate_generation(generation: object, *, allow_zero: bool = True) -> int:
    """Check a generation precondition: a non-negative int (not a bool)."""
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise TypeError(f"if_generation_match must be an int, got {type(generation).__name__}")
    if generation < 0 or (generation == 0 and not allow_zero):
        raise ValueError(f"if_generation_match must be {'>= 0' if allow_zero else '> 0'}, got {generation}")
    return generation


def validate_max_bytes(max_bytes: object) -> int | None:
    """Check a read's size cap: None (no cap) or a non-negative int (not a bool)."""
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
        raise ValueError(f"max_bytes must be a non-negative int or None, got {max_bytes!r}")
    return max_bytes


# --------------------------------------------------------------------------- options the HTTP stores share


def positive_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def checked_timeout(timeout: object) -> tuple[float, float]:
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = (timeout, timeout)
    if not isinstance(timeout, tuple) or len(timeout) != 2 or not all(positive_number(t) for t in timeout):
        raise ConfigurationError(f"timeout must be (connect_seconds, read_seconds), both > 0, got {timeout!r}")
    return (float(timeout[0]), float(timeout[1]))


def checked_request_timeout(value: object, timeout: tuple[float, float]) -> float:
    if value is None:
        # A reply that keeps coming, however slowly, never trips the read timeout; the
        # default allows what a request that uses both its timeouts in full could take.
        return timeout[0] + timeout[1]
    if not positive_number(value):
        raise ConfigurationError(f"request_timeout must be a finite number of seconds > 0, got {value!r}")
    return float(value)  # type: ignore[arg-type]


_REQUEST_BOUND: contextvars.ContextVar[float | None] = contextvars.ContextVar("handofflock_request_bound", default=None)


@contextlib.contextmanager
def requests_within(seconds: float | None) -> Iterator[None]:
    """Bound each request of the GCS and S3 stores sent inside the block (this thread) to ``seconds``.

    A store's own ``request_timeout`` (20 s by default on GCS) is the store's,
    shared by every lock on its bucket; a lock needs its requests to end in
    time for one more try before its renew deadline
    (:attr:`~handofflock.core.timing.Timing.request_timeout`), so it sends
    them inside this block. The shorter bound wins; None leaves the store's.
    Stores without a timeout of their own (memory, local files) ignore it.
    """
    token = _REQUEST_BOUND.set(seconds)
    try:
        yield
    finally:
        _REQUEST_BOUND.reset(token)


def request_limit(own: float) -> float:
    """The store's ``own`` request timeout, shortened to the bound of an enclosing :func:`requests_within`."""
    bound = _REQUEST_BOUND.get()
    return own if bound is None else min(own, bound)
