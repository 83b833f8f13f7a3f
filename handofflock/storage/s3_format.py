"""The S3 backend's object format: pure functions, no I/O.

S3 names a version of an object by its ETag, which for a plain ``PutObject`` is
the MD5 of the bytes: write the same bytes twice and the ETag comes back the
same, so an ``If-Match`` prepared for the first write also matches the second
(the ABA problem). The contract needs integer generations that strictly
increase across writes and deletes. Both are met by keeping the generation in
the object's bytes, in one header line before the data::

    #handofflock/s3 1 live <generation> <length>\\n<data>
    #handofflock/s3 1 deleted <generation> 0\\n          (a tombstone)

The ETag then covers the generation: no two versions of a key ever have the
same bytes, so an ETag names exactly one generation and ``If-Match`` cannot
match a later version. A delete writes a tombstone, which keeps the counter.

Parsing is strict (the same rules as the local format): anything that is not
exactly what we write is *foreign*, and reads return its raw bytes at a
generation derived from its LastModified time and ETag.
"""

from __future__ import annotations

from typing import NamedTuple

MAGIC = b"#handofflock/s3"
FORMAT_VERSION = 1

#: Longest header we accept (ours are ~50 bytes); read this much to parse one.
MAX_HEADER = 128

#: Generations stay within int64, like GCS's.
MAX_GENERATION = 2**63 - 1


class Header(NamedTuple):
    deleted: bool
    generation: int
    offset: int  # where the data starts


#: In the name of the scratch key the S3 backend probes a store's conditions on (storage/s3_probe.py).
PROBE_MARK = ".handofflock-probe-"


def encode(generation: int, data: bytes, *, deleted: bool = False) -> bytes:
    """The bytes stored for ``data`` at ``generation`` (a tombstone when ``deleted``)."""
    state = b"deleted" if deleted else b"live"
    return b"%s %d %s %d %d\n" % (MAGIC, FORMAT_VERSION, state, generation, len(data)) + data


def parse_header(head: bytes, object_size: int) -> Header | None:
    """The header of a complete, well-formed object of ours, or None if it is foreign.

    ``head`` is the object's first bytes (at least :data:`MAX_HEADER`, or all of
    it); ``object_size`` must equal header plus declared length exactly.
    """
    end = head.find(b"\n", 0, MAX_HEADER)
    fields = head[:end].split(b" ") if end >= 0 else []
    if len(fields) != 5 or fields[0] != MAGIC or fields[1] != b"%d" % FORMAT_VERSION:
        return None
    state, gen_s, len_s = fields[2:]
    canonical = gen_s.isdigit() and len_s.isdigit() and gen_s[:1] != b"0" and (len_s == b"0" or len_s[:1] != b"0")
    if not canonical or state not in (b"live", b"deleted"):
        return None
    generation, length = int(gen_s), int(len_s)
    if generation > MAX_GENERATION or object_size != end + 1 + length or (state == b"deleted" and length):
        return None
    return Header(state == b"deleted", generation, end + 1)


def foreign_generation(last_modified_us: int, etag: str) -> int:
    """The generation of an object without our header (one put there by other tools).

    Its LastModified time in microseconds (S3 keeps whole seconds) plus a
    number below a second drawn from its ETag: on the scale of our own
    generations, so a matched write that replaces it keeps the sequence
    increasing, and two different foreign objects written in the same second
    almost surely differ.
    """
    digits = "".join(ch for ch in etag if ch in "0123456789abcdefABCDEF")[:12] or "0"
    return max(1, min(last_modified_us + int(digits, 16) % 1_000_000, MAX_GENERATION))


def next_generation(previous: int, now_us: int) -> int | None:
    """The generation a write after ``previous`` gets: ``max(previous + 1, now in microseconds)``.

    None past :data:`MAX_GENERATION`: the key has no higher generation to give, and a write at
    the same one again would let an old ETag match again (the caller refuses the write).
    """
    generation = max(previous + 1, now_us)
    return generation if generation <= MAX_GENERATION else None


def normalize_etag(etag: str) -> str:
    """An ETag as sent in ``If-Match``: quoted (S3 and moto quote theirs; some stores do not)."""
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    if not (len(etag) >= 2 and etag[0] == etag[-1] == '"'):
        etag = f'"{etag}"'
    return etag
