"""The S3 store's object envelope (:mod:`.base`'s, under S3's magic): pure, no SDK; the fault proxy reads it too.

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

Anything that is not exactly what we write is *foreign*, and reads return its
raw bytes at a generation derived from its LastModified time and ETag
(:func:`.base.foreign_header`).
"""

from __future__ import annotations

from .base import MAX_GENERATION as MAX_GENERATION
from .base import MAX_HEADER as MAX_HEADER
from .base import Header, encode_header
from .base import next_generation as next_generation
from .base import parse_header as _parse_header

MAGIC = b"#handofflock/s3"

#: In the name of the scratch key the S3 store probes a store's conditions on.
PROBE_MARK = ".handofflock-probe-"


def encode(generation: int, data: bytes, *, deleted: bool = False) -> bytes:
    """The bytes stored for ``data`` at ``generation`` (a tombstone when ``deleted``)."""
    return encode_header(MAGIC, generation, len(data), deleted=deleted) + data


def parse_header(head: bytes, object_size: int) -> Header | None:
    """The header of a complete, well-formed object of ours (its first bytes), or None if it is foreign."""
    return _parse_header(MAGIC, head, object_size)


def normalize_etag(etag: str) -> str:
    """An ETag as sent in ``If-Match``: quoted (S3 and moto quote theirs; some stores do not)."""
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    if not (len(etag) >= 2 and etag[0] == etag[-1] == '"'):
        etag = f'"{etag}"'
    return etag
