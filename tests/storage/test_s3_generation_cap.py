"""S3 generations never stay at the int64 cap: a write past it is refused (it would repeat bytes, and ETags).

``base.next_generation`` clamps at ``MAX_GENERATION`` and ``parse_header``
accepts a header at exactly that value, so once an object carries it (written
by another tool, a bug, a restore), every matched write "succeeds" at the same
generation. The contract (storage/base.py) says a write returns a generation
strictly greater than any the key had; and since the bytes then repeat, the
ETag repeats too: a second process with a stale cached ETag overwrites a write
it never saw (a lost update: two owners).
"""

from __future__ import annotations

import uuid

import boto3
import pytest

from handofflock.core.errors import StorageError
from handofflock.storage.base import MAX_GENERATION, S3_MAGIC, encode
from handofflock.storage.s3 import S3Storage

pytestmark = pytest.mark.s3

MAX = MAX_GENERATION


@pytest.fixture(scope="module")
def raw(s3_server):
    """A plain boto3 client on moto, for the module: the other tool that wrote the object."""
    return boto3.client("s3", endpoint_url=s3_server.url)


@pytest.fixture
def bucket(s3_server):
    name = f"b-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    return name


def test_a_write_past_the_largest_generation_is_refused_and_changes_nothing(raw, bucket):
    raw.put_object(
        Bucket=bucket, Key="lock.json", Body=encode(S3_MAGIC, MAX, b"x")
    )
    store = S3Storage(bucket)
    assert store.read("lock.json") == (b"x", MAX)
    with pytest.raises(StorageError, match=r"2\*\*63-1"):
        store.write("lock.json", b"y", if_generation_match=MAX)
    assert store.read("lock.json") == (b"x", MAX)


def test_at_the_cap_a_stale_etag_can_never_match_again(raw, bucket):
    """Before the cap was refused, writes stayed at MAX, the bytes (and so the ETag) could repeat,
    and a second process's stale ETag overwrote a write it never saw: a lost update."""
    raw.put_object(
        Bucket=bucket, Key="lock.json", Body=encode(S3_MAGIC, MAX, b"x")
    )
    a, b = S3Storage(bucket), S3Storage(bucket)  # two processes
    assert a.read("lock.json") == (b"x", MAX)
    assert b.read("lock.json") == (b"x", MAX)
    with pytest.raises(StorageError):
        a.write("lock.json", b"owner-a", if_generation_match=MAX)
    with pytest.raises(StorageError):
        b.write("lock.json", b"owner-b", if_generation_match=MAX)
    assert a.read("lock.json") == (b"x", MAX)  # neither write landed
