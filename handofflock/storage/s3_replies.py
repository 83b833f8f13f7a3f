"""S3's replies, read: what an error reply means to the lock, and what a reply says.

Owns the mapping of an S3 error reply to a handofflock error (which answers are
transient, which may have been applied, which are permanent, and what each
message tells the user to do), the error for a request cut off at
``request_timeout``, and reading a reply's status, code, message,
``Retry-After``, ETag and object size; also the request hook that drops
``Expect: 100-continue``. It imports no SDK: botocore's exceptions are caught in
:mod:`.s3`, the one module that imports ``boto3`` or ``botocore``, and handed
here.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import StorageError, TransientStorageError

#: Said of a write or delete whose reply never came.
MAY_HAVE_APPLIED = "; the request may have been applied"


def past_deadline(op: str, key: str | None, *, url: str, request_timeout: float) -> TransientStorageError:
    """A request cut off at ``request_timeout``: ambiguous for a write or a delete."""
    where = f"{op} {key!r} in {url}" if key else f"{op} in {url}"
    mutation = op in ("write", "delete")
    return TransientStorageError(
        f"{where}: no complete reply within request_timeout ({request_timeout:g}s); "
        + ("the request may have been applied" if mutation else "nothing was changed"),
        url=url,
        key=key,
        ambiguous=mutation,
    )


def client_error(exc: Any, where: str, key: str | None, mutation: bool, *, url: str, bucket: str) -> StorageError:
    """The error an S3 error reply (botocore's ``ClientError``, ``exc``) maps to: transient or not, ambiguous or not."""
    status, code = _status(exc), _code(exc)
    message = _message(exc)
    retry_after = _retry_after(exc)
    if status == 404 and code == "NoSuchBucket":
        return StorageError(
            f"S3 bucket {bucket!r} does not exist (404 NoSuchBucket); create it "
            f"(`aws s3 mb s3://{bucket}`) or check the bucket name in the lock URL "
            "and the endpoint (AWS_ENDPOINT_URL_S3)",
            url=url,
            key=key,
        )
    if status == 409:
        # ConditionalRequestConflict: "A conflicting operation occurred. If using PutObject you
        # can retry the request" (S3 API reference, error codes). It was not applied, and our
        # retry carries the same If-Match, so it can never replace a change made meanwhile.
        return TransientStorageError(
            f"{where}: S3 answered 409 {code} ({message})",
            url=url,
            key=key,
            status=status,
            ambiguous=False,
            retry_after=retry_after,
        )
    if (status == 503 and code == "SlowDown") or status == 429:
        # Throttled: refused before anything was applied.
        return TransientStorageError(
            f"{where}: S3 asked to slow down ({status} {code}: {message})",
            url=url,
            key=key,
            status=status,
            ambiguous=False,
            retry_after=retry_after,
        )
    if status >= 500 or status == 408 or code in ("RequestTimeout", "InternalError"):
        # RequestTimeout (400): the request body did not arrive in time; not applied.
        ambiguous = mutation and status >= 500
        return TransientStorageError(
            f"{where}: S3 answered {status} {code} ({message})",
            url=url,
            key=key,
            status=status,
            ambiguous=ambiguous,
            retry_after=retry_after,
        )
    if status == 403 or status == 401:
        hint = (
            "; a read of a key that does not exist yet also gets 403, not 404, without s3:ListBucket"
            if where.startswith("read")
            else ""
        )
        return StorageError(
            f"{where}: permission denied on bucket {bucket!r} ({status} {code}: {message}); check which "
            "identity the credentials belong to (`aws sts get-caller-identity`) and that it may "
            f"s3:GetObject and s3:PutObject on the lock's key, and s3:ListBucket on the bucket{hint}",
            url=url,
            key=key,
        )
    return StorageError(f"{where}: S3 answered {status} {code} ({message})", url=url, key=key)


def condition_refused(exc: Any) -> bool:
    """Whether an S3 error reply (a ``ClientError``) refused a write for its condition (see :mod:`.s3_probe`)."""
    status, code = _status(exc), _code(exc)
    return status == 412 or (status == 404 and code == "NoSuchKey") or code == "ConditionalRequestConflict"


def _status(exc: Any) -> int:
    try:
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    except (TypeError, ValueError):
        return 0


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def _message(exc: Any) -> str:
    return " ".join(str(exc.response.get("Error", {}).get("Message") or "no explanation").split())[:300]


def _retry_after(exc: Any) -> float | None:
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders") or {}
    try:
        value = float(headers.get("retry-after", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def _bare(etag: str) -> str:
    return etag.strip().removeprefix("W/").strip('"')


def _object_size(reply: dict[str, Any], received: int) -> int:
    """The whole object's size: from Content-Range for a ranged read, else Content-Length."""
    content_range = reply.get("ContentRange") or ""
    total = content_range.rpartition("/")[2]
    if total.isdigit():
        return int(total)
    length = reply.get("ContentLength")
    return int(length) if isinstance(length, int) else received


def _no_expect_continue(request: Any, **_: Any) -> None:
    """Send a PUT's body with its head: botocore asks for ``Expect: 100-continue`` on every PutObject.

    That costs a round trip per write (the body waits for the server's ``100
    Continue``) to spare a large upload a refusal, and a record is under 64 KiB.
    The header is not signed. Returns None: a value would replace the request's reply.
    """
    request.headers.pop("Expect", None)
