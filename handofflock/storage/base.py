"""The storage contract every backend implements, and what all backends share.

The lock talks to storage only through :class:`Storage`. Every mutation carries
a generation precondition; there is deliberately no unconditional write, so
none can slip in. Generation ``0`` in ``if_generation_match`` means "the object
must not exist".

Every call takes ``timeout``: seconds within which each request it sends must
end (None: the store's own ``request_timeout``; the shorter wins). A store's
``request_timeout`` is shared by every lock on its bucket, while a lock needs
its requests to end in time for one more try before its renew deadline
(:attr:`~handofflock.core.timing.Timing.request_timeout`), so it passes its
own with each call. Stores without requests to bound (memory, local files)
check it and need it for nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol, TypeGuard, runtime_checkable

from ..core.errors import InvalidKey
from ..core.record import MAX_RECORD_BYTES as MAX_RECORD_BYTES  # the record's limit, enforced by every store

#: GCS's own limit on object names, in UTF-8 bytes.
MAX_KEY_BYTES = 1024


@runtime_checkable
class Storage(Protocol):
    """A store of small objects with generation-matched mutations.

    Implementations: :class:`~handofflock.storage.memory.MemoryStorage`,
    :class:`~handofflock.storage.local.LocalStorage`,
    :class:`~handofflock.storage.gcs.GCSStorage`,
    :class:`~handofflock.storage.s3.S3Storage`.

    All methods may raise :class:`~handofflock.core.errors.TransientStorageError`
    (retry may help) or :class:`~handofflock.core.errors.StorageError` (it will not).
    """

    #: A URL naming the store (for messages and logs).
    url: str

    def read(self, key: str, *, max_bytes: int | None = None, timeout: float | None = None) -> tuple[bytes, int] | None:
        """Return ``(data, generation)``, or ``None`` if the object does not exist.

        With ``max_bytes``, at most ``max_bytes + 1`` bytes are read, so a caller can
        tell an oversized object from one that fits without reading all of it.
        """
        ...

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        """Write ``data`` if the object's generation is ``if_generation_match``.

        ``0`` means the object must not exist. Returns the new generation, which
        is strictly greater than any generation the key had before, even across
        a delete. Raises :class:`~handofflock.core.errors.PreconditionFailed` otherwise.
        """
        ...

    def delete(self, key: str, *, if_generation_match: int, timeout: float | None = None) -> None:
        """Delete the object if its generation is ``if_generation_match``.

        Raises :class:`~handofflock.core.errors.PreconditionFailed` on a mismatch and
        :class:`~handofflock.core.errors.NotFound` if it does not exist. (The GCS
        emulator ignores the precondition on DELETE; the lock never relies on it.)
        """
        ...

    def list(self, prefix: str, *, timeout: float | None = None) -> dict[str, int]:
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


def validate_generation(generation: object) -> int:
    """Check a generation precondition: a non-negative int (not a bool)."""
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise TypeError(f"if_generation_match must be an int, got {type(generation).__name__}")
    if generation < 0:
        raise ValueError(f"if_generation_match must be >= 0, got {generation}")
    return generation


def is_seconds(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a finite number of seconds > 0 (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def validate_timeout(timeout: object) -> float | None:
    """Check a call's ``timeout``: None (the store's own) or a finite number of seconds > 0."""
    if timeout is not None and not is_seconds(timeout):
        raise ValueError(f"timeout must be a finite number of seconds > 0 or None, got {timeout!r}")
    return timeout


def checked_read(key: object, max_bytes: object, timeout: object) -> None:
    """Check the arguments of :meth:`Storage.read`: ``max_bytes`` is None (no cap) or a non-negative int."""
    validate_key(key)
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
        raise ValueError(f"max_bytes must be a non-negative int or None, got {max_bytes!r}")
    validate_timeout(timeout)


def checked_write(key: object, data: object, if_generation_match: object, timeout: object) -> bytes:
    """Check the arguments of :meth:`Storage.write`; return ``data`` as bytes."""
    checked_delete(key, if_generation_match, timeout)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    return bytes(data)


def checked_delete(key: object, if_generation_match: object, timeout: object) -> None:
    """Check the arguments of :meth:`Storage.delete`."""
    validate_key(key)
    validate_generation(if_generation_match)
    validate_timeout(timeout)


# --------------------------------------------------------------------------- the envelope of the file and S3 stores

#: Generations stay within int64, like GCS's.
MAX_GENERATION = 2**63 - 1

#: Longest envelope header accepted (ours are ~60 bytes); read this much to parse one.
MAX_HEADER = 128

#: The S3 store's envelope magic, and the mark in the name of the scratch key it probes a store's
#: conditions on (here, not in :mod:`.s3`: the fault proxy reads both without importing boto3).
S3_MAGIC = b"#handofflock/s3"
S3_PROBE_MARK = ".handofflock-probe-"


class Header(NamedTuple):
    """An envelope's header: a tombstone or not, the generation, and where the data starts."""

    deleted: bool
    generation: int
    offset: int


def encode(magic: bytes, generation: int, data: bytes, *, deleted: bool = False) -> bytes:
    """The bytes stored for ``data`` at ``generation`` (a tombstone, with no data, when ``deleted``).

    Stores without generations of their own (local files, S3) keep each object as
    ``<magic> 1 live <generation> <length>\\n<data>``, or ``<magic> 1 deleted <generation> 0\\n``
    for a tombstone, which keeps the generation across a delete.
    """
    state = b"deleted" if deleted else b"live"
    return b"%s 1 %s %d %d\n%s" % (magic, state, generation, len(data), data)


def parse_header(magic: bytes, head: bytes, size: int) -> Header | None:
    """The header of a complete, well-formed object of ours, or None if it is foreign.

    ``head`` is the object's first :data:`MAX_HEADER` bytes (or all of it);
    ``size`` must equal header plus declared length exactly. Strict: anything
    that is not exactly what we write (hand edits, truncation, trailing bytes,
    a future version) is foreign, never half-trusted.
    """
    end = head.find(b"\n", 0, MAX_HEADER)
    fields = head[:end].split(b" ") if end >= 0 else []
    if len(fields) != 5 or fields[0] != magic or fields[1] != b"1":
        return None
    state, gen_s, len_s = fields[2:]
    canonical = gen_s.isdigit() and len_s.isdigit() and gen_s[:1] != b"0" and (len_s == b"0" or len_s[:1] != b"0")
    if not canonical or state not in (b"live", b"deleted"):
        return None
    generation, length = int(gen_s), int(len_s)
    if generation > MAX_GENERATION or size != end + 1 + length or (state == b"deleted" and length):
        return None
    return Header(state == b"deleted", generation, end + 1)


def foreign_header(stamp_us: int, etag: str = "") -> Header:
    """How an object without our header (hand edits, other tools) is read: live, whole, as data.

    Its generation is its modification time in microseconds (S3 keeps whole
    seconds), plus a number below a second drawn from its ``etag`` where the
    store has one: on the scale of our own generations, so a matched write that
    replaces it keeps the sequence increasing; it changes whenever the object is
    rewritten, and two different foreign objects written in the same second
    almost surely differ.
    """
    digits = "".join(ch for ch in etag if ch in "0123456789abcdefABCDEF")[:12] or "0"
    generation = max(1, min(stamp_us + int(digits, 16) % 1_000_000, MAX_GENERATION))
    return Header(deleted=False, generation=generation, offset=0)


def next_generation(previous: int, now_us: int) -> int | None:
    """The generation a write after ``previous`` gets: ``max(previous + 1, now in microseconds)``.

    None past :data:`MAX_GENERATION`: the key has no higher generation to give
    (the caller refuses the write).
    """
    generation = max(previous + 1, now_us)
    return generation if generation <= MAX_GENERATION else None
