"""``gs://bucket/key``: Google Cloud Storage, spoken to through its JSON API.

The only module of handofflock that imports ``google.cloud.storage`` or
``google.auth``. Every error the SDK or the transport can raise is mapped
here, at the boundary, into :mod:`handofflock.core.errors`. Every request ends
within its deadline: when ``request_timeout`` (or the call's shorter
``timeout``) passes, its connection is shut down and it fails as a
:class:`~handofflock.core.errors.TransientStorageError`, ambiguous for a write
(:class:`.deadline.HTTPStore`, shared with S3). Nothing here retries or paces:
:mod:`.records` does, above every backend, and reads back a write whose reply
was lost.

The ``google.cloud.storage.Client`` provides credentials, the endpoint (it
honours ``STORAGE_EMULATOR_HOST``) and its authorized HTTP session; the requests
themselves are built here, one per operation, because the SDK's helpers do not
fit a lock:

* they retry on their own, and a silently retried conditional upload can fail
  against its own first attempt; the lock layer owns retries and must hear
  when a write was ambiguous, so nothing here retries (not the SDK, not
  urllib3, which requests configures with zero retries);
* some cost an extra request (``Blob.delete()`` probes the bucket first);
* a read must return the generation of exactly the bytes it returned, which the
  media download's ``x-goog-generation`` header gives in the same response.

So: a read is one ``GET .../o/KEY?alt=media``, a write one multipart upload
with ``ifGenerationMatch``, a delete one ``DELETE`` with ``ifGenerationMatch``,
and a listing one request per page of up to 1000 objects. The class holds the
four operations, the mapping of transport and auth errors and the client's
life (creation, fork, mTLS base URL); the functions below it read the wire
(reply bodies, checksums, and what an error reply means).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import ssl
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import google.auth.exceptions
import orjson
import requests
import urllib3.exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from .._version import __version__
from ..core.errors import (
    ConfigurationError,
    NotFound,
    PreconditionFailed,
    StorageError,
    TransientStorageError,
)
from . import deadline
from .base import checked_delete, checked_read, checked_write, validate_prefix, validate_timeout

try:  # a dependency of google-cloud-storage; without it reads are simply not checksummed
    import google_crc32c
except ImportError:  # pragma: no cover
    google_crc32c = None  # type: ignore[assignment]

_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
#: The project used with an emulator, which needs one for nothing we do.
_EMULATOR_PROJECT = "handofflock-emulator"
_LIST_FIELDS = "items(name,generation),nextPageToken"


class GCSStorage(deadline.HTTPStore[gcs.Client]):
    """The objects of one GCS bucket, with generation-matched writes and deletes.

    No I/O happens in the constructor: the ``google.cloud.storage.Client`` is
    created on first use, with the default credentials, or anonymously against
    an emulator when ``STORAGE_EMULATOR_HOST`` is set. Pass ``client`` to use
    your own (it is then yours to close). ``timeout`` and ``request_timeout``
    as for :class:`~handofflock.storage.deadline.HTTPStore`: past the latter a
    request is cut off and fails with a
    :class:`~handofflock.core.errors.TransientStorageError`. It is enforced by
    shutting the connection down, on the HTTP session of a client this store
    creates; a ``client`` you pass keeps its session as it is, and only
    ``timeout`` bounds its requests. ``user_project`` names the project billed
    for the requests, as a requester-pays bucket requires (sent as
    ``userProject`` with every request).

    >>> store = GCSStorage("my-bucket")
    >>> generation = store.write("locks/train.json", b"{}", if_generation_match=0)
    >>> store.read("locks/train.json")
    (b'{}', generation)
    """

    scheme, bucket_rule = "gs", "GCS bucket name (3-63 lowercase letters, digits, '-', '_' or '.')"
    shared_env = (_EMULATOR_ENV,)
    # 3-63 characters (up to 222 with dots), starting and ending with a letter or digit.
    bucket_re = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
    #: Objects per listing page (the JSON API's maximum).
    _LIST_PAGE_SIZE = 1000
    #: Seconds between writes to one object from this process, unless a lock or fence is told
    #: otherwise: GCS sustains about one write per second per object and answers 429 beyond.
    min_write_interval = 1.0

    def __init__(
        self,
        bucket: str,
        *,
        client: gcs.Client | None = None,
        timeout: tuple[float, float] = (5.0, 15.0),
        request_timeout: float | None = None,
        user_project: str | None = None,
    ) -> None:
        super().__init__(bucket, client=client, timeout=timeout, request_timeout=request_timeout)
        if user_project is not None and (not isinstance(user_project, str) or not _PROJECT_RE.match(user_project)):
            raise ConfigurationError(
                f"user_project must be a Google Cloud project ID or number (the project billed for requests "
                f"to a requester-pays bucket), got {user_project!r}"
            )
        self.user_project = user_project
        # Read now, not at first use, so shared() hands out the store for the emulator it was keyed by.
        self._emulator_host = os.environ.get(_EMULATOR_ENV) or None
        #: The path of the bucket's objects in the JSON API, under its base URL.
        self._objects = f"/storage/v1/b/{quote(bucket, safe='')}/o"

    # -- the contract ---------------------------------------------------------

    def read(self, key: str, *, max_bytes: int | None = None, timeout: float | None = None) -> tuple[bytes, int] | None:
        checked_read(key, max_bytes, timeout)
        limit = None if max_bytes is None else max_bytes + 1
        return self._download(key, limit, timeout, ranged=limit is not None)

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        data = checked_write(key, data, if_generation_match, timeout)
        body, headers = _multipart_upload(key, data)
        params = {"uploadType": "multipart", "ifGenerationMatch": str(if_generation_match), "fields": "generation"}
        with self._request(
            "write", key, "POST", "/upload" + self._objects, params, timeout, headers=headers, data=body
        ) as response:
            self._check(response, "write", key, if_generation_match)
            try:
                return _parse_generation(_reply_json(response).get("generation"), "the upload's reply")
            except StorageError as exc:  # accepted, so almost surely applied: let the caller read back
                what = f"the upload was accepted ({response.status_code}) but its reply cannot be read ({exc})"
                raise self.transient(
                    "write", key, f"{what}; it has probably been applied", ambiguous=True, status=response.status_code
                ) from exc

    def delete(self, key: str, *, if_generation_match: int, timeout: float | None = None) -> None:
        checked_delete(key, if_generation_match, timeout)
        params = {"ifGenerationMatch": str(if_generation_match)}
        with self._request(
            "delete", key, "DELETE", f"{self._objects}/{quote(key, safe='')}", params, timeout
        ) as response:
            if not self._check(response, "delete", key, if_generation_match):
                raise NotFound(key, url=self.url)

    def list(self, prefix: str, *, timeout: float | None = None) -> dict[str, int]:
        validate_prefix(prefix)
        validate_timeout(timeout)
        found: dict[str, int] = {}
        page_token: str | None = None
        while True:
            params = {"prefix": prefix, "fields": _LIST_FIELDS, "maxResults": str(self._LIST_PAGE_SIZE)}
            if page_token:
                params["pageToken"] = page_token
            with self._request("list", None, "GET", self._objects, params, timeout) as response:
                self._check(response, "list", None)
                page = _reply_json(response)
            for item in page.get("items") or ():
                name = item.get("name") if isinstance(item, dict) else None
                if not isinstance(name, str):
                    raise StorageError(f"list in {self.url}: GCS listed an item without a name: {item!r}")
                found[name] = _parse_generation(item.get("generation"), f"the listing of {name!r}")
            page_token = page.get("nextPageToken")
            if not page_token:
                return found

    # -- requests -------------------------------------------------------------

    def _download(
        self, key: str, limit: int | None, timeout: float | None, *, ranged: bool
    ) -> tuple[bytes, int] | None:
        """One media download, of at most ``limit`` bytes; with ``ranged``, only they travel."""
        # Never let the server or requests transform the bytes: a Range then
        # counts stored bytes and the checksum covers what we return.
        headers = {"Accept-Encoding": "identity"}
        if ranged and limit is not None:
            # At most max_bytes + 1 bytes travel, so the caller can tell
            # "too big" from "fits" without reading a huge object.
            headers["Range"] = f"bytes=0-{limit - 1}"
        with self._request(
            "read",
            key,
            "GET",
            f"/download{self._objects}/{quote(key, safe='')}",
            {"alt": "media"},
            timeout,
            headers=headers,
            stream=True,  # read no more than `limit` bytes, then drop the connection
        ) as response:
            stated = response.headers.get("x-goog-generation")
            if response.status_code != 416 or not ranged:
                if not self._check(response, "read", key):
                    return None
                generation = _parse_generation(stated, "the x-goog-generation header")
                data, complete = _read_body(response, limit)
                problem = _cut_or_corrupted(response, data) if complete else None
                if problem:
                    raise self.transient("read", key, problem, ambiguous=False)
                return data, generation
            if stated is not None:  # a Range on an empty object
                return b"", _parse_generation(stated, "the x-goog-generation header")
        # A 416 for a Range on an empty object that did not say which generation it saw (the
        # emulator does say; GCS may not): ask once more without a Range. Only an empty object,
        # never a lock record, costs this second request.
        return self._download(key, limit, timeout, ranged=False)

    @contextlib.contextmanager
    def _request(
        self,
        op: str,
        key: str | None,
        method: str,
        path: str,
        params: dict[str, str],
        timeout: float | None,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        stream: bool = False,
    ) -> Iterator[requests.Response]:
        """One request to ``path`` under the API's base URL, its reply read and closed inside the block.

        Within the request's deadline (``request_timeout``, or the call's
        ``timeout`` if shorter), every error raised inside mapped (:meth:`_error`).
        """
        with self.mapped(op, key), self.bounded(op, key, timeout) as bound:
            client = self.client
            # private (google-cloud-storage's): the API base URL and user agent live on _connection, the session
            # on _http; we send our own requests (one per operation, no SDK retries), so we need both
            connection = client._connection
            all_headers = {
                **getattr(connection, "extra_headers", {}),
                "User-Agent": f"handofflock/{__version__} {connection.user_agent}".strip(),
                "x-goog-api-client": connection.user_agent,
                **(headers or {}),
            }
            if self.user_project is not None:
                params = {**params, "userProject": self.user_project}
            getter = getattr(connection, "get_api_base_url_for_mtls", None)
            base = str(getter() if getter else connection.API_BASE_URL).rstrip("/")
            if "://" not in base:  # STORAGE_EMULATOR_HOST=localhost:4443, as the Go client accepts
                base = "http://" + base
            response: requests.Response = client._http.request(  # private: as above
                method,
                base + path,
                params=params,
                headers=all_headers,
                data=data,
                # The deadline cannot cut a connection that is still being made: never wait longer for one.
                timeout=(min(self._timeout[0], bound.seconds), self._timeout[1]),
                stream=stream,
                allow_redirects=False,  # one request per operation, always
            )
            with contextlib.closing(response):
                yield response

    def _make_client(self) -> gcs.Client:
        """A client whose own HTTP session enforces request_timeout (made under the store's client lock)."""
        try:
            if self._emulator_host:
                client = gcs.Client(
                    project=_EMULATOR_PROJECT,
                    credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                    client_options={"api_endpoint": self._emulator_host},
                )
            else:  # project=None: objects need no project, and looking one up may cost I/O.
                client = gcs.Client(project=None)
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise StorageError(
                f"no Google credentials found for {self.url}: run `gcloud auth application-default login`, "
                "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, "
                f"or set {_EMULATOR_ENV} to use an emulator ({exc})",
                url=self.url,
            ) from exc
        except Exception as exc:  # e.g. a malformed credentials file or client option
            raise StorageError(f"could not create a GCS client for {self.url}: {exc}", url=self.url) from exc
        # The SDK makes its HTTP session lazily and without a lock: make it here, under the client lock,
        # or two threads' first requests could each make one and leak the other. Give it the
        # connection pools that enforce request_timeout.
        # private (google-cloud-storage's): _http is the client's one HTTP session; it has no public name
        deadline.install(client._http)
        # google-auth refreshes credentials through a session of its own, inside our request: watched
        # too, a slow token endpoint (metadata server, STS) cannot hold a request past request_timeout.
        # (A private attribute; without it, unbounded.)
        refresh_session = getattr(client._http, "_auth_request_session", None)
        if refresh_session is not None:
            deadline.install(refresh_session)
        return client

    # -- errors ---------------------------------------------------------------

    def _error(self, exc: Exception, op: str, key: str | None) -> StorageError | None:
        """The handofflock error a transport or auth error maps to."""
        applied = "the request may have been applied"

        def transient(what: str, ambiguous: bool) -> TransientStorageError:
            return self.transient(op, key, what, ambiguous=ambiguous)

        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return transient(f"could not connect within {self._timeout[0]}s; nothing was sent", False)
        if isinstance(exc, requests.exceptions.ReadTimeout):
            return self.unanswered(op, key, f"no reply within {self._timeout[1]}s")
        if isinstance(exc, requests.exceptions.SSLError):
            if _caused_by(exc, ssl.SSLCertVerificationError):
                return self.permanent(
                    op,
                    key,
                    f"the server's TLS certificate was not accepted ({_exc_reason(exc)}); check the CA "
                    "bundle (REQUESTS_CA_BUNDLE, SSL_CERT_FILE) and any TLS-intercepting proxy (HTTPS_PROXY)",
                )
            return transient(f"the TLS connection failed ({_exc_reason(exc)}); {applied}", not _never_connected(exc))
        if isinstance(exc, requests.exceptions.ConnectionError):
            if _never_connected(exc):
                return transient(f"could not connect ({_exc_reason(exc)}); nothing was sent", False)
            return transient(
                f"the connection failed after the request was sent ({_exc_reason(exc)}); it may have been applied", True
            )
        if isinstance(exc, (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)):
            return transient(f"the reply was cut off or garbled ({exc}); {applied}", True)
        if isinstance(exc, google.auth.exceptions.RefreshError):
            # Credentials are refreshed before the request is sent: nothing was applied.
            if getattr(exc, "retryable", False):
                return transient(f"refreshing the Google credentials failed ({exc}); nothing was sent", False)
            return self.permanent(
                op,
                key,
                f"the Google credentials could not be refreshed ({exc}); run "
                "`gcloud auth application-default login` or check GOOGLE_APPLICATION_CREDENTIALS",
            )
        if isinstance(exc, google.auth.exceptions.TransportError):
            return transient(f"could not reach the credentials server ({exc}); nothing was sent", False)
        if isinstance(exc, (requests.exceptions.RequestException, google.auth.exceptions.GoogleAuthError)):
            # What is left is configuration: an invalid URL or header, a bad credentials file.
            return self.permanent(op, key, str(exc))
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):  # leaked past requests: be conservative
            return transient(f"transport error ({exc!r}); {applied}", True)
        return None

    def _check(self, response: requests.Response, op: str, key: str | None, expected: int | None = None) -> bool:
        """True if the response is a success, False if the object is missing; raise the mapped error otherwise."""
        status, bucket = response.status_code, self.bucket
        if 200 <= status < 300:
            return True
        if status == 404:
            # An upload creates the object and a listing has none to miss: only the bucket can be
            # missing. The emulator cannot tell a missing bucket from a missing object; GCS says so
            # in the message. A missing bucket read as "no lock" is still caught: the create that
            # follows fails with 404.
            if op in ("write", "list") or _says_bucket_missing(response):
                raise StorageError(
                    f"GCS bucket {bucket!r} does not exist (404: {_error_reply(response)[0]}); create it "
                    f"(`gcloud storage buckets create gs://{bucket}`) or check the bucket name in the lock URL",
                    url=self.url,
                    key=key,
                )
            return False
        if status == 412 and key is not None and expected is not None:
            raise PreconditionFailed(key, expected, url=self.url)
        message = _error_reply(response)[0]

        def transient(what: str, ambiguous: bool) -> TransientStorageError:
            retry_after = deadline.retry_after_seconds(response.headers.get("Retry-After"))
            return self.transient(op, key, what, ambiguous=ambiguous, status=status, retry_after=retry_after)

        if status == 409 and key is not None and expected is not None:
            # GCS documents 409 (reason "conflict") as a change that "failed to commit ... due to a
            # conflicting concurrent change to the same resource. The request can be retried, though
            # care should be taken to consider the new state of the resource to avoid blind
            # replacement of another agent's changes" (cloud.google.com/storage/docs/json_api/v1/
            # status-codes, 409 Conflict). Our writes and deletes always carry ifGenerationMatch, so
            # a retry can never replace a change made meanwhile: it fails with 412 instead. Not
            # applied ("failed to commit"), so not ambiguous: the retry needs no read-back.
            raise transient(f"GCS answered 409, a conflicting concurrent change ({message})", False)
        if status in (408, 429) or status >= 500:
            raise transient(f"GCS answered {status} ({message})", status != 429)  # 429: refused, not applied
        if status == 401:
            hint = (
                f"GCS rejected the credentials (401: {message}); check that they are valid and "
                "not expired (`gcloud auth application-default login`, or GOOGLE_APPLICATION_CREDENTIALS)"
            )
        elif status == 403 and says_retained(response):
            hint = (
                f"GCS keeps this object under a retention policy (403: {message}). The lock rewrites "
                f"its object on every renewal, which a retention policy, object retention or a hold forbids until "
                f"the retention period has passed; no IAM role changes that. Put lock objects in a bucket "
                f"without a retention policy (`gcloud storage buckets describe gs://{bucket} "
                f"--format='default(retention_policy)'` shows it), or remove the hold"
            )
        elif status == 403:
            hint = (
                f"permission denied on bucket {bucket!r} (403: {message}); check which account "
                "the credentials belong to and that it has a role such as roles/storage.objectUser on the bucket"
            )
        else:
            hint = f"GCS answered {status} ({message})"
        raise self.permanent(op, key, hint)


# --------------------------------------------------------------------------- the wire

#: At most this much of an error reply is read to explain it.
_ERROR_BODY_BYTES = 4096


# Project IDs (lowercase letters, digits, hyphens; "domain.com:id" for old domain-scoped ones) or numbers.
_PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9.:-]{0,126}[a-z0-9]$")


def _multipart_upload(key: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    """A ``multipart/related`` upload body: the object's metadata, then its bytes."""
    metadata = orjson.dumps({"name": key, "contentType": "application/json", "cacheControl": "no-store"})
    while True:
        boundary = f"handofflock-{uuid.uuid4().hex}".encode()
        if boundary not in data:
            break
    body = (
        b"--%s\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n%s\r\n"
        b"--%s\r\nContent-Type: application/json\r\n\r\n%s\r\n--%s--\r\n"
    ) % (boundary, metadata, boundary, data, boundary)
    return body, {"Content-Type": f'multipart/related; boundary="{boundary.decode()}"'}


def _read_body(response: requests.Response, limit: int | None) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes of a streamed body; say whether it was read to its end."""
    data = bytearray()
    for chunk in response.iter_content(chunk_size=64 * 1024):
        data += chunk
        if limit is not None and len(data) >= limit:
            # At the limit we cannot know whether more was coming, so we do
            # not claim completeness; closing the response drops the rest.
            return bytes(data[:limit]), False
    return bytes(data), True


def _cut_or_corrupted(response: requests.Response, data: bytes) -> str | None:
    """What is wrong with the body of a whole read (None: nothing): cut short, or not the object's bytes.

    A body that ended before its Content-Length is a cut reply, not a short
    object: urllib3 2 raises on its own (IncompleteRead); urllib3 1.26, which
    the SDK still allows, hands the short body over as if complete, and the
    CRC32C check does not cover a ranged read. The server's CRC32C is checked
    when it sent one for these bytes: not for partial reads (the hash covers
    the whole object) nor for objects stored with a content encoding (the hash
    covers the stored bytes).
    """
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) != len(data):
        return f"the reply ended after {len(data)} of its {declared} bytes"
    if google_crc32c is None:  # pragma: no cover
        return None
    if response.headers.get("x-goog-stored-content-encoding", "identity") != "identity":
        return None
    if response.status_code == 206:
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if total != str(len(data)):
            return None
    expected = None
    for part in response.headers.get("x-goog-hash", "").split(","):
        name, _, value = part.strip().partition("=")
        if name == "crc32c":
            expected = value
    if not expected:
        return None
    actual = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()  # type: ignore[no-untyped-call]
    if actual == expected:
        return None
    return f"the bytes received do not match the object's CRC32C ({actual} != {expected}); the transfer was corrupted"


def _reply_json(response: requests.Response) -> dict[str, Any]:
    try:
        value = orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise StorageError(f"GCS sent a reply that is not JSON: {response.content[:200]!r}") from exc
    if not isinstance(value, dict):
        raise StorageError(f"GCS sent an unexpected reply: {response.content[:200]!r}")
    return value


def _parse_generation(value: object, where: str) -> int:
    try:
        generation = int(str(value), 10)
    except ValueError:
        generation = 0
    if generation <= 0:
        raise StorageError(f"GCS sent no valid generation in {where} (got {value!r})")
    return generation


def _error_reply(response: requests.Response) -> tuple[str, tuple[str, ...]]:
    """The server's explanation of an error reply (the JSON API's message, or the start of the body) and its
    ``errors[].reason`` values ("retentionPolicyNotMet", ...).

    At most the first few KiB of the reply are read (it may be a streamed download's), once: the
    answer is kept on the response, since the body is gone and every explanation needs it.
    """
    explained: tuple[str, tuple[str, ...]] | None = getattr(response, "_handofflock_error", None)
    if explained is not None:
        return explained
    try:
        body = next(response.iter_content(_ERROR_BODY_BYTES), b"")[:_ERROR_BODY_BYTES]
    except Exception:  # a reply cut off while explaining an error still has a status to go by
        body = b""
    try:
        error = orjson.loads(body).get("error", {})
        message = str(error.get("message") or "")
    except (orjson.JSONDecodeError, AttributeError):
        error, message = {}, body.decode("utf-8", "replace").strip()
    errors = error.get("errors")
    reasons = (
        tuple(str(e["reason"]) for e in errors if isinstance(e, dict) and e.get("reason"))
        if isinstance(errors, list)
        else ()
    )
    explained = (" ".join(message.split())[:300] or (response.reason or "no explanation"), reasons)
    response._handofflock_error = explained  # type: ignore[attr-defined]  # our own name on requests' Response
    return explained


#: Reasons GCS gives for refusing to change an object it must keep (a retention policy, object
#: retention, a hold), and the words its message uses for them (older replies say only "forbidden").
RETENTION_REASONS = ("retentionPolicyNotMet", "objectUnderActiveHold")
RETENTION_WORDS = ("retention policy", "object retention", "hold")


def says_retained(response: requests.Response) -> bool:
    """Whether a 403 is GCS refusing to overwrite an object it must retain, not a missing permission."""
    if any(reason in RETENTION_REASONS for reason in _error_reply(response)[1]):
        return True
    message = _error_reply(response)[0].lower()
    return any(word in message for word in RETENTION_WORDS) and "cannot be" in message


def _says_bucket_missing(response: requests.Response) -> bool:
    """Whether a 404 is about the bucket rather than the object.

    GCS says "The specified bucket does not exist." for a missing bucket and
    "No such object: BUCKET/KEY" for a missing object, with the same status and
    reason ("notFound"); only the message tells them apart. fake-gcs-server says
    "Not Found" for both. When unsure this answers False: reading a missing
    bucket as "no object" is caught by the create that follows, which fails
    with 404 on the bucket.
    """
    return "bucket does not exist" in _error_reply(response)[0].lower()


def _never_connected(exc: requests.exceptions.ConnectionError) -> bool:
    """Whether a connection error happened before any byte of the request was sent."""
    reason = exc.args[0] if exc.args else None
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    # NewConnectionError (refused, unreachable, DNS failure) is a ConnectTimeoutError.
    return isinstance(reason, urllib3.exceptions.ConnectTimeoutError)


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
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


def _exc_reason(exc: BaseException) -> str:
    reason = exc.args[0] if exc.args else exc
    if isinstance(reason, urllib3.exceptions.MaxRetryError) and reason.reason is not None:
        reason = reason.reason
    return str(reason) or type(reason).__name__
