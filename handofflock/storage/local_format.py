"""The local backend's on-disk format: pure functions, no I/O.

An object file is one header line, then the exact data bytes::

    #handofflock/local 1 live <generation> <length>\\n<data>
    #handofflock/local 1 deleted <generation> 0\\n          (a tombstone)

The header carries the generation, so data and generation change together in
one rename. Parsing is strict: anything that is not exactly what we write
(hand edits, truncation, trailing bytes, a future version) is *foreign*, never
half-trusted. See ``docs/local-backend.md``.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

MAGIC = b"#handofflock/local"
FORMAT_VERSION = 1

#: Longest header we accept (ours are ~60 bytes); read this much to parse one.
MAX_HEADER = 128

#: Generations stay within int64, like GCS's.
MAX_GENERATION = 2**63 - 1

#: File names starting with this are the backend's own (lock and temp files).
#: Keys with such a segment are refused, so an object never collides with one.
RESERVED_PREFIX = ".handofflock."


class Header(NamedTuple):
    deleted: bool
    generation: int
    offset: int  # where the data starts


def encode_header(generation: int, length: int, *, deleted: bool = False) -> bytes:
    state = b"deleted" if deleted else b"live"
    return b"%s %d %s %d %d\n" % (MAGIC, FORMAT_VERSION, state, generation, length)


def parse_header(head: bytes, file_size: int) -> Header | None:
    """The header of a complete, well-formed file of ours, or None if the file is foreign.

    ``head`` is the file's first :data:`MAX_HEADER` bytes (or all of it);
    ``file_size`` must equal header plus declared length exactly.
    """
    end = head.find(b"\n")
    fields = head[:end].split(b" ") if end >= 0 else []
    if len(fields) != 5 or fields[0] != MAGIC or fields[1] != b"%d" % FORMAT_VERSION:
        return None
    state, gen_s, len_s = fields[2:]
    canonical = gen_s.isdigit() and len_s.isdigit() and gen_s[:1] != b"0" and (len_s == b"0" or len_s[:1] != b"0")
    if not canonical or state not in (b"live", b"deleted"):
        return None
    generation, length = int(gen_s), int(len_s)
    if generation > MAX_GENERATION or file_size != end + 1 + length or (state == b"deleted" and length):
        return None
    return Header(state == b"deleted", generation, end + 1)


def foreign_generation(mtime_ns: int) -> int:
    """The generation of a file without our header: its mtime in microseconds.

    On the same scale as our own generations (wall-clock microseconds), so the
    sequence keeps increasing when a matched write replaces the file, and it
    changes whenever the file is rewritten, at the filesystem's timestamp
    granularity.
    """
    return max(1, min(mtime_ns // 1000, MAX_GENERATION))


def sidecar_name(name: str, suffix: str) -> str:
    """The name of an object's lock (``"lock"``) or temp (``"tmp"``) file, beside it.

    Hashed so it stays short whatever the object's name (NAME_MAX is 255 bytes).
    Two names that collide would only share a lock, which is still safe.
    """
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f"{RESERVED_PREFIX}{digest}.{suffix}"
