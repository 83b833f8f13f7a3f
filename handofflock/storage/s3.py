"""``s3://bucket/key``: Amazon S3 and S3-compatible stores, through conditional PUTs.

With :mod:`.s3_credentials` (the credentials, loaded and refreshed beside the
requests), the only module of handofflock that imports ``boto3`` or ``botocore``
(an optional extra: ``pip install handofflock[s3]``). Every error the SDK or
the transport can raise is mapped here, at the boundary, into
:mod:`handofflock.core.errors`; every request ends within its deadline
(:mod:`.deadline`).

How the contract is met (see ``docs/storage.md``, "S3"):

* Every object is stored in the envelope of :mod:`.base` (magic
  ``#handofflock/s3``): one header line with the generation, then the data.
  S3 names a version by its ETag, for a plain ``PutObject`` the MD5 of its
  bytes: the same bytes written twice get the same ETag, and an ``If-Match``
  prepared for the first write would match the second (the ABA problem). The
  ETag covers the header, so an ETag names one generation and ``If-Match``
  cannot match a later version. Anything that is not exactly what we write is
  foreign: read raw, at a generation from its LastModified time and ETag
  (:func:`.base.foreign_header`).
* Every transition is one conditional ``PutObject``: ``If-None-Match: *`` to
  create, ``If-Match: <etag>`` to replace. The ETag for a generation comes from
  the read that saw it (remembered per key), or from one read before the write.
* A delete writes a tombstone with ``If-Match``: a real ``DeleteObject`` would
  forget the generation, and the next create could reuse a number.
* Nothing here retries (botocore's retries are off): the lock's loop in
  :mod:`.records` owns retries and the read-back of ambiguous writes.
* A store that ignores ``If-Match`` or ``If-None-Match`` applies every PUT, so
  every racing writer would "win" and two owners would hold the lock at once,
  with no error anywhere. So before its first request a store is probed once,
  on a scratch key beside the lock's (``<key>.handofflock-probe-<random>``): a
  PUT with an ``If-Match`` that cannot match must be refused while the key is
  missing (412, or 404 ``NoSuchKey``); of two creates with ``If-None-Match: *``
  the second must be refused (412, or 409 ``ConditionalRequestConflict``); and
  the same wrong ``If-Match`` must be refused again once the object exists (a
  store can refuse it on a missing key only because there is nothing to
  replace, and still replace an existing object whatever its ETag: every
  racing writer would then replace the same generation). A store that applies
  any of them is refused with :class:`~handofflock.core.errors.LockingUnsupported`
  (docs/storage.md, "S3-compatible stores").
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import re
import secrets
import threading
import time
from typing import Any, NamedTuple

import botocore.config
import botocore.exceptions
from botocore.awsrequest import AWSHTTPConnection, AWSHTTPConnectionPool, AWSHTTPSConnection, AWSHTTPSConnectionPool

from ..core.errors import (
    HandoffLockError,
    LockingUnsupported,
    NotFound,
    PreconditionFailed,
    StorageError,
    TransientStorageError,
)
from . import base, deadline, s3_credentials
from .base import checked_delete, checked_read, checked_write, validate_key, validate_prefix, validate_timeout

#: How many keys' last-seen versions a store remembers.
_SEEN_LIMIT = 4096

#: An ETag no object has (S3 ETags are MD5 hex digests of the content, or of the parts plus a count).
_IMPOSSIBLE_ETAG = '"00000000000000000000000000000000-0"'


class _Version(NamedTuple):
    """What this process last saw of a key: its generation, ETag, and whether it is a tombstone."""

    generation: int
    etag: str
    deleted: bool


class _Refused(Exception):
    """A conditional PUT was refused (:func:`_refused`)."""


class S3Storage(deadline.HTTPStore[Any]):
    """The objects of one S3 bucket, with generation-matched writes and deletes.

    No I/O happens in the constructor: the boto3 client is created on first
    use, with the standard credential chain (environment, shared config and
    credentials files, ``AWS_PROFILE`` or ``profile``, SSO, instance roles)
    and endpoint settings (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, or
    ``endpoint_url`` for MinIO, R2 and other S3-compatible stores). Pass
    ``client`` to use your own boto3 S3 client (it is then yours to close, and
    its retry settings are yours too: ours are off).

    ``timeout`` and ``request_timeout`` as for :class:`~handofflock.storage.deadline.HTTPStore`:
    past the latter the connection is shut down and the request fails with a
    :class:`~handofflock.core.errors.TransientStorageError`. It is enforced on
    the client this store creates; a ``client`` you pass keeps its connection
    pools, and only its own timeouts bound it. Each request is sent once
    (botocore's retries are off).

    >>> store = S3Storage("my-bucket")
    >>> generation = store.write("locks/train.json", b"{}", if_generation_match=0)
    >>> store.read("locks/train.json")
    (b'{}', generation)
    """

    scheme, bucket_rule = "s3", "S3 bucket name (3-63 lowercase letters, digits, '.' or '-')"
    #: Starting and ending with a letter or digit.
    bucket_re = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    replies = (botocore.exceptions.ClientError,)
    shared_env = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID")
    #: S3 has no one-write-per-second limit per object (GCS has): writes are not spaced by default.
    min_write_interval = 0.0

    def __init__(
        self,
        bucket: str,
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
        timeout: tuple[float, float] = (5.0, 15.0),
        request_timeout: float | None = None,
    ) -> None:
        super().__init__(bucket, client=client, timeout=timeout, request_timeout=request_timeout)
        self._endpoint_url, self._profile, self._region = endpoint_url, profile, region
        # What each key was last seen at: hints for the next PUT's If-Match, each get, set or pop one
        # atomic dict operation. A stale or dropped hint costs a refused PUT or one more read, never a write.
        self._seen: dict[str, _Version] = {}
        self._probed = False  # the store honours If-Match and If-None-Match, once known
        self._probe_lock = threading.Lock()

    # -- the contract ---------------------------------------------------------

    def read(self, key: str, *, max_bytes: int | None = None, timeout: float | None = None) -> tuple[bytes, int] | None:
        checked_read(key, max_bytes, timeout)
        with self.mapped("read", key):
            self._check_conditions(key, timeout)
            found = self._get(key, None if max_bytes is None else base.MAX_HEADER + max_bytes, timeout)
        if found is None or found[1].deleted:
            return None
        data, version = found
        return (data if max_bytes is None else data[: max_bytes + 1]), version.generation

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        data = checked_write(key, data, if_generation_match, timeout)
        expected = if_generation_match
        with self.mapped("write", key):
            self._check_conditions(key, timeout)
            seen = self._seen.get(key)
            if expected == 0 and (seen is None or not seen.deleted):
                try:
                    return self._put(key, data, timeout, previous=0, etag=None)
                except _Refused:  # something is there: a tombstone may still be replaced
                    seen = None
            for attempt in range(2):
                if seen is None or (seen.generation != expected and not (expected == 0 and seen.deleted)):
                    seen = self._current(key, timeout)
                if seen is None and expected == 0:  # gone since: a create may go again
                    try:
                        return self._put(key, data, timeout, previous=0, etag=None)
                    except _Refused:
                        raise PreconditionFailed(key, expected, url=self.url) from None
                if seen is None or seen.deleted != (expected == 0) or (expected and seen.generation != expected):
                    raise PreconditionFailed(key, expected, url=self.url)
                try:
                    return self._put(key, data, timeout, previous=seen.generation, etag=seen.etag)
                except _Refused:
                    if expected != 0 or attempt:
                        raise PreconditionFailed(key, expected, url=self.url) from None
                    seen = None  # the tombstone we remembered was replaced: look once more
            raise AssertionError("unreachable")  # pragma: no cover

    def delete(self, key: str, *, if_generation_match: int, timeout: float | None = None) -> None:
        checked_delete(key, if_generation_match, timeout)
        expected = if_generation_match
        with self.mapped("delete", key):
            self._check_conditions(key, timeout)
            for attempt in range(2):
                seen = self._seen.get(key) if attempt == 0 else None
                if seen is None or seen.generation != expected or seen.deleted:
                    seen = self._current(key, timeout)
                if seen is None or seen.deleted:
                    raise NotFound(key, url=self.url)
                if seen.generation != expected:
                    raise PreconditionFailed(key, expected, url=self.url)
                try:
                    self._put(key, b"", timeout, previous=seen.generation, etag=seen.etag, deleted=True)
                    return
                except _Refused:
                    continue  # what we remembered was stale: look once more, to say which error
            raise PreconditionFailed(key, expected, url=self.url)

    def list(self, prefix: str, *, timeout: float | None = None) -> dict[str, int]:
        """``{key: generation}`` under ``prefix``: one ListObjectsV2 per 1000 keys, plus one
        ranged read of the header of each object whose ETag this store has not seen yet."""
        validate_prefix(prefix)
        validate_timeout(timeout)
        found: dict[str, int] = {}
        with self.mapped("list", None):
            token: str | None = None
            while True:
                params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
                if token:
                    params["ContinuationToken"] = token
                with self.bounded("list", None, timeout):
                    page = self.client.list_objects_v2(**params)
                for item in page.get("Contents") or ():
                    key = item["Key"]
                    seen, etag = self._seen.get(key), normalize_etag(item.get("ETag", ""))
                    if seen is None or normalize_etag(seen.etag) != etag:
                        try:
                            validate_key(key)
                        except HandoffLockError:
                            continue  # not a name any store of ours could have written
                        seen = self._current(key, timeout)
                    if seen is not None and not seen.deleted:
                        found[key] = seen.generation
                token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
                if not token:
                    return found

    # -- requests -------------------------------------------------------------

    def _get(self, key: str, limit: int | None, timeout: float | None) -> tuple[bytes, _Version] | None:
        """GET the object (its first ``limit + 1`` bytes at most); None if absent.

        Returns the data (of a foreign object: all its bytes) and the version they are.
        """
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if limit is not None:
            params["Range"] = f"bytes=0-{limit}"
        try:
            with self.bounded("read", key, timeout):
                reply = self.client.get_object(**params)
                with contextlib.closing(reply["Body"]):
                    body = reply["Body"].read()
        except botocore.exceptions.ClientError as exc:
            status, code = _status(exc), _code(exc)
            if status == 404 and code != "NoSuchBucket":
                self._seen.pop(key, None)
                return None
            if status == 416 and limit is not None:  # a Range on an empty (so foreign) object
                return self._get(key, None, timeout)
            raise
        etag = reply.get("ETag") or ""
        size = _object_size(reply, len(body))
        if limit is None and size != len(body):
            raise self.transient("read", key, f"the reply ended after {len(body)} of its {size} bytes", ambiguous=False)
        header = base.parse_header(base.S3_MAGIC, body[: base.MAX_HEADER], size)
        if header is None:
            modified = reply.get("LastModified")
            stamp = int(modified.timestamp() * 1_000_000) if isinstance(modified, _dt.datetime) else 0
            header = base.foreign_header(stamp, etag)
        version = _Version(header.generation, etag, header.deleted)
        self._remember(key, version)
        return body[header.offset :], version

    def _current(self, key: str, timeout: float | None) -> _Version | None:
        """The key's current version, from a read of its first bytes (None if absent)."""
        found = self._get(key, base.MAX_HEADER, timeout)
        return None if found is None else found[1]

    def _put(
        self, key: str, data: bytes, timeout: float | None, *, previous: int, etag: str | None, deleted: bool = False
    ) -> int:
        """One conditional PUT over the version with ``etag`` (``None``: the key must be absent)."""
        generation = base.next_generation(previous, time.time_ns() // 1000)
        if generation is None:
            raise StorageError(
                f"generation of {key!r} in {self.url} would pass 2**63-1: the object was written by something "
                "else; inspect it, then delete it by hand (for example `aws s3 rm`)",
                url=self.url,
                key=key,
            )
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": normalize_etag(etag)}
        try:
            with self.bounded("write", key, timeout):
                reply = self.client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=base.encode(base.S3_MAGIC, generation, data, deleted=deleted),
                    ContentType="application/octet-stream",
                    CacheControl="no-store",
                    **condition,
                )
        except botocore.exceptions.ClientError as exc:
            if not _refused(exc):
                raise
            self._seen.pop(key, None)
            raise _Refused() from exc
        new_etag = reply.get("ETag")
        if new_etag:
            self._remember(key, _Version(generation, new_etag, deleted))
        else:
            self._seen.pop(key, None)
        return generation

    def _check_conditions(self, key: str, timeout: float | None) -> None:
        """Before this store's first request: refuse a store that ignores If-Match (see the module docstring).

        Before the first read, not the first write: a write's lease is stamped
        before it is sent, and the probe's requests must not come in between.
        The scratch key is deleted afterwards (a failed delete leaves a few bytes
        behind, which is all). An error other than a refusal is raised as it
        came, for the caller to map; the probe then counts as not done.
        """
        if self._probed:
            return
        with self._probe_lock:
            if self._probed:
                return
            scratch = f"{key}{base.S3_PROBE_MARK}{secrets.token_hex(4)}"

            def applied(**condition: str) -> bool:
                try:
                    with self.bounded("write", key, timeout):
                        self.client.put_object(
                            Bucket=self.bucket,
                            Key=scratch,
                            Body=b"handofflock probe",
                            CacheControl="no-store",
                            **condition,
                        )
                except botocore.exceptions.ClientError as exc:
                    if _refused(exc) or _code(exc) == "ConditionalRequestConflict":
                        return False
                    raise
                return True

            ignored, created = None, True
            try:
                if applied(IfMatch=_IMPOSSIBLE_ETAG):
                    ignored = "If-Match on PUT"
                elif not applied(IfNoneMatch="*"):
                    created = False  # a fresh key not created (a conflict): no verdict yet, probe again next time
                elif applied(IfNoneMatch="*"):
                    ignored = "If-None-Match on PUT"
                elif applied(IfMatch=_IMPOSSIBLE_ETAG):  # the scratch object exists now
                    ignored = "If-Match on a PUT over an existing object"
            finally:
                with contextlib.suppress(Exception), self.bounded("write", key, timeout):
                    self.client.delete_object(Bucket=self.bucket, Key=scratch)
            if ignored is not None:
                raise LockingUnsupported(
                    f"{self.url} ignores {ignored}: a conditional write to {scratch!r} that had to be refused "
                    "was applied, so two writers could both take the lock. handofflock needs a store that honours "
                    "If-Match and If-None-Match on PutObject (AWS S3, Cloudflare R2, MinIO since 2024-05); "
                    "for GCS use gs://, not its S3 (XML) API. See docs/storage.md, 'S3-compatible stores'",
                    url=self.url,
                    key=key,
                )
            self._probed = created

    def _remember(self, key: str, version: _Version) -> None:
        if len(self._seen) >= _SEEN_LIMIT and key not in self._seen:
            self._seen.clear()
        self._seen[key] = version

    def _make_client(self) -> Any:
        config = botocore.config.Config(
            # The deadline cannot cut a connection that is still being made: never wait longer for one.
            connect_timeout=min(self._timeout[0], self._request_timeout),
            read_timeout=self._timeout[1],
            # One attempt per operation: a silently retried conditional PUT can fail against its
            # own first attempt; the lock's loop (storage/records.py) retries and reads back instead.
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=32,
            user_agent_extra="handofflock",
        )
        try:
            # credentials loaded and refreshed beside the requests, within their deadlines
            session = s3_credentials.boto3_session(self.url, profile=self._profile, region=self._region)
            client = session.client("s3", endpoint_url=self._endpoint_url, config=config)
        except botocore.exceptions.ProfileNotFound as exc:
            raise StorageError(f"{self.url}: {exc}; check AWS_PROFILE and ~/.aws/config", url=self.url) from exc
        except Exception as exc:  # a malformed config file or endpoint
            raise StorageError(f"could not create an S3 client for {self.url}: {exc}", url=self.url) from exc
        client.meta.events.register("before-send.s3.PutObject", _no_expect_continue)
        _watch_connections(client)
        return client

    # -- errors ---------------------------------------------------------------

    def _error(self, exc: Exception, op: str, key: str | None) -> StorageError | None:
        """The handofflock error an SDK or transport error maps to."""
        if isinstance(exc, botocore.exceptions.ClientError):
            return self._client_error(exc, op, key)
        if isinstance(exc, (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.EndpointConnectionError)):
            # EndpointConnectionError is raised when no connection could be made (refused,
            # unreachable, DNS); ConnectTimeoutError is one of them: nothing was sent.
            return self.transient(op, key, f"could not connect ({exc}); nothing was sent", ambiguous=False)
        if isinstance(exc, botocore.exceptions.ReadTimeoutError):
            return self.unanswered(op, key, f"no reply within {self._timeout[1]}s")
        if isinstance(
            exc,
            (
                botocore.exceptions.NoCredentialsError,
                botocore.exceptions.PartialCredentialsError,
                botocore.exceptions.CredentialRetrievalError,
                botocore.exceptions.TokenRetrievalError,
                botocore.exceptions.SSOError,
            ),
        ):
            return self.permanent(
                op,
                key,
                f"no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE, or run `aws sso login`",
            )
        if isinstance(exc, (botocore.exceptions.ParamValidationError, botocore.exceptions.NoRegionError)):
            return self.permanent(op, key, str(exc))
        if isinstance(exc, (botocore.exceptions.BotoCoreError, OSError)):
            # What is left is the connection failing after the request went out (closed, reset,
            # a cut reply): conservative, since a write may have been applied.
            return self.unanswered(op, key, f"the connection failed ({exc!r})")
        return None

    def _client_error(self, exc: Any, op: str, key: str | None) -> StorageError:
        """The error an S3 error reply (botocore's ``ClientError``) maps to: transient or not, ambiguous or not."""
        status, code, message, bucket = _status(exc), _code(exc), _message(exc), self.bucket
        headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders") or {}

        def transient(what: str, ambiguous: bool) -> TransientStorageError:
            retry_after = deadline.retry_after_seconds(headers.get("retry-after"))
            return self.transient(op, key, what, ambiguous=ambiguous, status=status, retry_after=retry_after)

        if status == 404 and code == "NoSuchBucket":
            return StorageError(
                f"S3 bucket {bucket!r} does not exist (404 NoSuchBucket); create it "
                f"(`aws s3 mb s3://{bucket}`) or check the bucket name in the lock URL "
                "and the endpoint (AWS_ENDPOINT_URL_S3)",
                url=self.url,
                key=key,
            )
        if status == 409:
            # ConditionalRequestConflict: "A conflicting operation occurred. If using PutObject you
            # can retry the request" (S3 API reference, error codes). It was not applied, and our
            # retry carries the same If-Match, so it can never replace a change made meanwhile.
            return transient(f"S3 answered 409 {code} ({message})", False)
        if (status == 503 and code == "SlowDown") or status == 429:
            # Throttled: refused before anything was applied.
            return transient(f"S3 asked to slow down ({status} {code}: {message})", False)
        if status >= 500 or status == 408 or code in ("RequestTimeout", "InternalError"):
            # RequestTimeout (400): the request body did not arrive in time; not applied.
            return transient(f"S3 answered {status} {code} ({message})", op in ("write", "delete") and status >= 500)
        if status == 403 or status == 401:
            hint = "; a read of a key that does not exist yet also gets 403, not 404, without s3:ListBucket"
            return self.permanent(
                op,
                key,
                f"permission denied on bucket {bucket!r} ({status} {code}: {message}); check which "
                "identity the credentials belong to (`aws sts get-caller-identity`) and that it may "
                f"s3:GetObject and s3:PutObject on the lock's key, and s3:ListBucket on the bucket"
                + (hint if op == "read" else ""),
            )
        return self.permanent(op, key, f"S3 answered {status} {code} ({message})")


# --------------------------------------------------------------------------- replies and connections


def _status(exc: Any) -> int:
    try:
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    except (TypeError, ValueError):
        return 0


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def _message(exc: Any) -> str:
    return " ".join(str(exc.response.get("Error", {}).get("Message") or "no explanation").split())[:300]


def _refused(exc: Any) -> bool:
    """Whether an error reply refuses a conditional PUT: 412, or 404 for an ``If-Match`` on a missing object."""
    return _status(exc) == 412 or (_status(exc) == 404 and _code(exc) == "NoSuchKey")


def _object_size(reply: dict[str, Any], received: int) -> int:
    """The whole object's size: from Content-Range for a ranged read, else Content-Length."""
    content_range = reply.get("ContentRange") or ""
    total = content_range.rpartition("/")[2]
    if total.isdigit():
        return int(total)
    length = reply.get("ContentLength")
    return int(length) if isinstance(length, int) else received


def normalize_etag(etag: str) -> str:
    """An ETag as sent in ``If-Match``: quoted (S3 and moto quote theirs; some stores do not)."""
    etag = etag.strip().removeprefix("W/")
    return etag if len(etag) >= 2 and etag[0] == etag[-1] == '"' else f'"{etag}"'


def _no_expect_continue(request: Any, **_: Any) -> None:
    """Send a PUT's body with its head: botocore asks for ``Expect: 100-continue`` on every PutObject.

    That costs a round trip per write (the body waits for the server's ``100
    Continue``) to spare a large upload a refusal, and a record is under 64 KiB.
    The header is not signed. Returns None: a value would replace the request's reply.
    """
    request.headers.pop("Expect", None)


_WATCHED_POOLS = {
    "http": deadline.watched(AWSHTTPConnectionPool, AWSHTTPConnection),
    "https": deadline.watched(AWSHTTPSConnectionPool, AWSHTTPSConnection),
}


def _watch_connections(client: Any) -> bool:
    """Give the client's connection pools the deadline hooks of :mod:`.deadline`.

    botocore keeps its pool classes on its HTTP session (``_pool_classes_by_scheme``,
    copied to each pool manager it makes); these are private names, so if a botocore
    release moves them this returns False and only ``timeout`` bounds the requests.
    """
    try:  # private (botocore's): as the docstring says; there is no public hook for the pool class
        session = client._endpoint.http_session
        session._pool_classes_by_scheme = _WATCHED_POOLS
        session._manager.pool_classes_by_scheme = _WATCHED_POOLS
        for manager in session._proxy_managers.values():
            manager.pool_classes_by_scheme = _WATCHED_POOLS
    except AttributeError:  # pragma: no cover - a botocore that keeps its pools elsewhere
        return False
    return True
