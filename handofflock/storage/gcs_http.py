"""The GCS JSON API on the wire: checked options, upload bodies, replies, and what an error reply means.

Pure functions over ``requests`` replies, apart from :class:`~handofflock.storage.gcs.GCSStorage`
so that the store reads as its operations. Nothing here keeps state.
"""

from __future__ import annotations

import base64
import email.utils
import math
import re
import time
import uuid
from typing import Any

import orjson
import requests
import urllib3.exceptions

from ..core.errors import ConfigurationError, PreconditionFailed, StorageError, TransientStorageError

try:  # a dependency of google-cloud-storage; without it reads are simply not checksummed
    import google_crc32c
except ImportError:  # pragma: no cover
    google_crc32c = None  # type: ignore[assignment]

#: At most this much of an error reply is read to explain it.
ERROR_BODY_BYTES = 4096


# Project IDs (lowercase letters, digits, hyphens; "domain.com:id" for old domain-scoped ones) or numbers.
_PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9.:-]{0,126}[a-z0-9]$")


def checked_user_project(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _PROJECT_RE.match(value):
        raise ConfigurationError(
            f"user_project must be a Google Cloud project ID or number (the project billed for requests "
            f"to a requester-pays bucket), got {value!r}"
        )
    return value


def multipart_upload(key: str, data: bytes) -> tuple[bytes, str]:
    """A ``multipart/related`` upload body: the object's metadata, then its bytes."""
    metadata = orjson.dumps({"name": key, "contentType": "application/json", "cacheControl": "no-store"})
    while True:
        boundary = f"handofflock-{uuid.uuid4().hex}"
        if boundary.encode() not in data:
            break
    delimiter = b"--" + boundary.encode()
    body = b"".join(
        [
            delimiter,
            b"\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n",
            metadata,
            b"\r\n",
            delimiter,
            b"\r\nContent-Type: application/json\r\n\r\n",
            data,
            b"\r\n",
            delimiter,
            b"--\r\n",
        ]
    )
    return body, f'multipart/related; boundary="{boundary}"'


def read_body(response: requests.Response, limit: int | None) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes of a streamed body; say whether it was read to its end."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(chunk_size=64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if limit is not None and size >= limit:
            data = b"".join(chunks)[:limit]
            # At the limit we cannot know whether more was coming, so we do
            # not claim completeness; closing the response drops the rest.
            return data, False
    return b"".join(chunks), True


def check_length(response: requests.Response, data: bytes, key: str, url: str) -> None:
    """A body that ended before its Content-Length is a cut reply, not a short object.

    urllib3 2 raises on its own (IncompleteRead); urllib3 1.26, which the SDK
    still allows, hands the short body over as if complete, and the CRC32C
    check does not cover a ranged read.
    """
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) != len(data):
        raise TransientStorageError(
            f"read {key!r} in {url}: the reply ended after {len(data)} of its {declared} bytes",
            url=url,
            key=key,
            ambiguous=False,
        )


def verify_crc32c(response: requests.Response, data: bytes, key: str, url: str) -> None:
    """Check a whole-object read against the server's CRC32C, when it sent one for these bytes.

    Skipped for partial reads (the hash covers the whole object) and for objects
    stored with a content encoding (the hash covers the stored bytes).
    """
    if google_crc32c is None:  # pragma: no cover
        return
    if response.headers.get("x-goog-stored-content-encoding", "identity") != "identity":
        return
    if response.status_code == 206:
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if total != str(len(data)):
            return
    expected = None
    for part in response.headers.get("x-goog-hash", "").split(","):
        name, _, value = part.strip().partition("=")
        if name == "crc32c":
            expected = value
    if not expected:
        return
    actual = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()  # type: ignore[no-untyped-call]
    if actual != expected:
        raise TransientStorageError(
            f"read {key!r} in {url}: the bytes received do not match the object's CRC32C "
            f"({actual} != {expected}); the transfer was corrupted",
            url=url,
            key=key,
            ambiguous=False,
        )


def reply_json(response: requests.Response) -> dict[str, Any]:
    try:
        value = orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise StorageError(f"GCS sent a reply that is not JSON: {response.content[:200]!r}") from exc
    if not isinstance(value, dict):
        raise StorageError(f"GCS sent an unexpected reply: {response.content[:200]!r}")
    return value


def parse_generation(value: object, where: str) -> int:
    try:
        generation = int(str(value), 10)
    except ValueError:
        generation = 0
    if generation <= 0:
        raise StorageError(f"GCS sent no valid generation in {where} (got {value!r})")
    return generation


def error_body(response: requests.Response) -> bytes:
    """At most the first few KiB of an error reply (it may be a streamed download's); read once, then kept."""
    cached = getattr(response, "_handofflock_body", None)
    if cached is not None:
        return bytes(cached)
    try:
        body = next(response.iter_content(ERROR_BODY_BYTES), b"")[:ERROR_BODY_BYTES]
    except Exception:  # a reply cut off while explaining an error still has a status to go by
        body = b""
    # our own name on requests' Response: read once, the body is gone, and both callers need it
    response._handofflock_body = body  # type: ignore[attr-defined]
    return body


def error_message(response: requests.Response) -> str:
    """The server's explanation of an error: the JSON API's message, or the start of the body."""
    cached = getattr(response, "_handofflock_message", None)
    if cached is not None:
        return str(cached)
    body = error_body(response)
    message = ""
    try:
        error = orjson.loads(body).get("error", {})
        message = str(error.get("message") or "")
    except (orjson.JSONDecodeError, AttributeError):
        message = body.decode("utf-8", "replace").strip()
    message = " ".join(message.split())[:300] or (response.reason or "no explanation")
    # our own name on requests' Response, as above
    response._handofflock_message = message  # type: ignore[attr-defined]
    return message


def error_reasons(response: requests.Response) -> tuple[str, ...]:
    """The JSON API's ``errors[].reason`` values of an error reply ("retentionPolicyNotMet", ...), if any."""
    try:
        errors = orjson.loads(error_body(response)).get("error", {}).get("errors", [])
        return tuple(str(e.get("reason")) for e in errors if isinstance(e, dict) and e.get("reason"))
    except (orjson.JSONDecodeError, AttributeError):
        return ()


#: Reasons GCS gives for refusing to change an object it must keep (a retention policy, object
#: retention, a hold), and the words its message uses for them (older replies say only "forbidden").
RETENTION_REASONS = ("retentionPolicyNotMet", "objectUnderActiveHold")
RETENTION_WORDS = ("retention policy", "object retention", "hold")


def says_retained(response: requests.Response) -> bool:
    """Whether a 403 is GCS refusing to overwrite an object it must retain, not a missing permission."""
    if any(reason in RETENTION_REASONS for reason in error_reasons(response)):
        return True
    message = error_message(response).lower()
    return any(word in message for word in RETENTION_WORDS) and "cannot be" in message


def says_bucket_missing(response: requests.Response) -> bool:
    """Whether a 404 is about the bucket rather than the object.

    GCS says "The specified bucket does not exist." for a missing bucket and
    "No such object: BUCKET/KEY" for a missing object, with the same status and
    reason ("notFound"); only the message tells them apart. fake-gcs-server says
    "Not Found" for both. When unsure this answers False: reading a missing
    bucket as "no object" is caught by the create that follows, which fails
    with 404 on the bucket.
    """
    return "bucket does not exist" in error_message(response).lower()


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def never_connected(exc: requests.exceptions.ConnectionError) -> bool:
    """Whether a connection error happened before any byte of the request was sent."""
    reason = exc.args[0] if exc.args else None
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    # NewConnectionError (refused, unreachable, DNS failure) is a ConnectTimeoutError.
    return isinstance(reason, urllib3.exceptions.ConnectTimeoutError)


def caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``kind`` is anywhere in ``exc``'s chain: causes, contexts, wrapped reasons and args."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, kind):
            return True
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
    return False


def exc_reason(exc: BaseException) -> str:
    reason = exc.args[0] if exc.args else exc
    if isinstance(reason, urllib3.exceptions.MaxRetryError) and reason.reason is not None:
        reason = reason.reason
    return str(reason) or type(reason).__name__


def check(
    response: requests.Response, op: str, key: str | None, expected: int | None = None, *, url: str, bucket: str
) -> None:
    """Return if the response is a success; raise the mapped error otherwise."""
    status = response.status_code
    if 200 <= status < 300:
        return
    where = f"{op} {key!r} in {url}" if key else f"{op} in {url}"
    if status == 412 and key is not None and expected is not None:
        raise PreconditionFailed(key, expected, url=url)
    message = error_message(response)
    if status == 409 and key is not None and expected is not None:
        # GCS documents 409 (reason "conflict") as a change that "failed to commit ... due to a
        # conflicting concurrent change to the same resource. The request can be retried, though
        # care should be taken to consider the new state of the resource to avoid blind
        # replacement of another agent's changes" (cloud.google.com/storage/docs/json_api/v1/
        # status-codes, 409 Conflict). Our writes and deletes always carry ifGenerationMatch, so
        # a retry can never replace a change made meanwhile: it fails with 412 instead. Not
        # applied ("failed to commit"), so not ambiguous: the retry needs no read-back.
        raise TransientStorageError(
            f"{where}: GCS answered 409, a conflicting concurrent change ({message})",
            url=url,
            key=key,
            status=status,
            ambiguous=False,
            retry_after=retry_after_seconds(response.headers.get("Retry-After")),
        )
    if status in (408, 429) or status >= 500:
        raise TransientStorageError(
            f"{where}: GCS answered {status} ({message})",
            url=url,
            key=key,
            status=status,
            ambiguous=status != 429,  # 429: refused before it was applied
            retry_after=retry_after_seconds(response.headers.get("Retry-After")),
        )
    if status == 401:
        raise StorageError(
            f"{where}: GCS rejected the credentials (401: {message}); check that they are valid and "
            "not expired (`gcloud auth application-default login`, or GOOGLE_APPLICATION_CREDENTIALS)",
            url=url,
            key=key,
        )
    if status == 403 and says_retained(response):
        raise StorageError(
            f"{where}: GCS keeps this object under a retention policy (403: {message}). The lock rewrites "
            f"its object on every renewal, which a retention policy, object retention or a hold forbids until "
            f"the retention period has passed; no IAM role changes that. Put lock objects in a bucket "
            f"without a retention policy (`gcloud storage buckets describe gs://{bucket} "
            f"--format='default(retention_policy)'` shows it), or remove the hold",
            url=url,
            key=key,
        )
    if status == 403:
        raise StorageError(
            f"{where}: permission denied on bucket {bucket!r} (403: {message}); check which account "
            "the credentials belong to and that it has a role such as roles/storage.objectUser on the bucket",
            url=url,
            key=key,
        )
    raise StorageError(f"{where}: GCS answered {status} ({message})", url=url, key=key)


def bucket_missing(key: str | None, response: requests.Response, *, url: str, bucket: str) -> StorageError:
    """The error for a 404 that says the bucket is missing: which bucket, and how to create it."""
    return StorageError(
        f"GCS bucket {bucket!r} does not exist (404: {error_message(response)}); create it "
        f"(`gcloud storage buckets create gs://{bucket}`) or check the bucket name in the lock URL",
        url=url,
        key=key,
    )
