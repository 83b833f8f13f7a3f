"""The GCS backend: what it sends, how it maps errors, and what the emulator it is tested on does.

The contract suite (test_storage_contract.py) already runs on the emulator. This
file pins what is specific to GCS: one HTTP request per operation, the headers
stored with a write, the error mapping, and the emulator's known limits (so an
emulator upgrade that changes them is noticed).

Statuses the emulator never produces (401, 403, 429, 5xx, a GCS-worded 404)
come from ``CannedServer``: a loopback HTTP server that answers every request
with one fixed reply. It checks the mapping table, not GCS behaviour.
"""

from __future__ import annotations

import ast
import email.utils
import http.server
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import quote

import google.auth.exceptions
import pytest
from sources import parse
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as google_storage

from handofflock import HandoffLock
from handofflock.core.errors import (
    ConfigurationError,
    InvalidLockURL,
    NotFound,
    PreconditionFailed,
    StorageError,
    StorageTimeout,
    TransientStorageError,
)
from handofflock.storage import deadline, open_url
from handofflock.storage.gcs import GCSStorage
from handofflock.testing.faultproxy import FaultProxy

PACKAGE = Path(__file__).resolve().parents[2] / "handofflock"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def bucket(gcs_emulator):
    name = f"b-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(name)
    return name


@pytest.fixture
def gcs(bucket):
    store = GCSStorage(bucket)
    yield store
    store.close()


class RequestLog(list):
    """Every HTTP request a store sends, recorded at its session's ``request``."""

    def __init__(self, store: GCSStorage) -> None:
        super().__init__()
        # private (google-cloud-storage's): the client's HTTP session is the one place that sees every request it sends
        session = store.client._http
        original = session.request

        def recording(method, url, **kwargs):
            self.append((method, url, kwargs))
            return original(method, url, **kwargs)

        session.request = recording


def raw(method: str, url: str, body: bytes | None = None, headers: dict | None = None):
    """One plain HTTP request (no SDK, no handofflock): ``(status, headers, body)``."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _DIRECT.open(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def raw_multipart_upload(emulator, bucket: str, key: str, data: bytes, if_generation_match: int):
    body = (
        b"--BB\r\nContent-Type: application/json\r\n\r\n"
        + json.dumps({"name": key}).encode()
        + b"\r\n--BB\r\nContent-Type: application/json\r\n\r\n"
        + data
        + b"\r\n--BB--\r\n"
    )
    return raw(
        "POST",
        f"{emulator.url}/upload/storage/v1/b/{bucket}/o?uploadType=multipart&ifGenerationMatch={if_generation_match}",
        body,
        {"Content-Type": "multipart/related; boundary=BB"},
    )


def metadata(emulator, bucket: str, key: str) -> dict:
    status, _, body = raw("GET", f"{emulator.url}/storage/v1/b/{bucket}/o/{quote(key, safe='')}")
    assert status == 200, body
    return json.loads(body)


class CannedServer:
    """A loopback HTTP server giving every request one canned reply, and counting requests.

    ``reply(handler)`` returns ``(status, headers, body)``, or ``None`` to close
    the connection without answering (after reading the whole request).
    """

    def __init__(self, reply) -> None:
        self.requests: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                outer.requests.append((self.command, self.path, dict(self.headers)))
                answer = reply(self)
                if answer is None:
                    self.close_connection = True
                    return
                status, headers, body = answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in headers:  # a test may declare more than it sends: a cut reply
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if int(headers.get("Content-Length", len(body))) > len(body):
                    # a cut reply ends with its connection, as one cut in transit does (kept open,
                    # the client would only time out waiting for the rest)
                    self.close_connection = True

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

            def log_message(self, *args):  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def canned(monkeypatch):
    """``canned(reply)`` -> (server, store): a GCSStorage whose endpoint is a CannedServer."""
    servers = []

    def make(reply, timeout=(2.0, 2.0)):
        server = CannedServer(reply)
        servers.append(server)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
        return server, GCSStorage("canned-bucket", timeout=timeout)

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def proxy(gcs_emulator):
    """A FaultProxy in front of the emulator: it can trickle replies, and it records every request."""
    with FaultProxy(gcs_emulator.url, lifetime=120) as p:
        yield p


def through(proxy: FaultProxy, bucket: str, **options) -> GCSStorage:
    """A store that talks to the emulator through ``proxy``."""
    with proxy.env():
        return GCSStorage(bucket, **options)


def finishes_within(limit: float, fn) -> tuple[float, BaseException | None]:
    """Run ``fn`` in a thread: (seconds it took, what it raised). Fails if it is still running after ``limit``,
    so a request that is never cut off fails the test instead of hanging it."""
    box: dict = {}

    def run():
        started = time.monotonic()
        try:
            fn()
        except BaseException as exc:  # handed to the test
            box["error"] = exc
        box["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert "elapsed" in box, f"still running after {limit} s"
    return box["elapsed"], box.get("error")


def json_error(status: int, message: str) -> tuple[int, dict, bytes]:
    body = json.dumps({"error": {"code": status, "message": message, "errors": [{"message": message}]}})
    return status, {"Content-Type": "application/json"}, body.encode()


# --------------------------------------------------------------------------- one request per operation


# Each operation gets (store, generation of "a.json"); the store also holds
# "empty.json" (zero bytes) and "dir/b.json".
OPERATIONS = [
    pytest.param(lambda s, g: s.read("absent.json"), None, "GET", id="read-absent"),
    pytest.param(lambda s, g: s.read("a.json"), None, "GET", id="read-present"),
    pytest.param(lambda s, g: s.read("a.json", max_bytes=3), None, "GET", id="read-present-capped"),
    # One request only where the emulator sends the generation with its 416 (fake-gcs-server does; the
    # testbench does not, and the read then asks again without a range).
    pytest.param(lambda s, g: s.read("empty.json", max_bytes=3), None, "GET", id="read-empty-capped",
                 marks=pytest.mark.fake_gcs_quirk),
    pytest.param(lambda s, g: s.write("new.json", b"{}", if_generation_match=0), None, "POST", id="write-create"),
    pytest.param(lambda s, g: s.write("a.json", b"{}", if_generation_match=g), None, "POST", id="write-overwrite"),
    pytest.param(
        lambda s, g: s.write("a.json", b"{}", if_generation_match=0), PreconditionFailed, "POST", id="write-412"
    ),
    pytest.param(lambda s, g: s.delete("a.json", if_generation_match=g), None, "DELETE", id="delete"),
    pytest.param(lambda s, g: s.delete("absent.json", if_generation_match=1), NotFound, "DELETE", id="delete-absent"),
    pytest.param(lambda s, g: s.list(""), None, "GET", id="list-a-few"),
]


@pytest.mark.parametrize("operation, raises, method", OPERATIONS)
def test_each_operation_is_exactly_one_http_request(gcs, operation, raises, method):
    log = RequestLog(gcs)
    generation = gcs.write("a.json", b'{"x": 1}', if_generation_match=0)
    gcs.write("empty.json", b"", if_generation_match=0)
    gcs.write("dir/b.json", b"{}", if_generation_match=0)
    log.clear()
    if raises:
        with pytest.raises(raises):
            operation(gcs, generation)
    else:
        operation(gcs, generation)
    assert [m for m, _, _ in log] == [method]


def test_the_first_operation_of_a_new_store_is_one_request(bucket):
    store = GCSStorage(bucket)
    log = RequestLog(store)  # creates the client; no I/O yet
    assert log == []
    assert store.read("absent.json") is None
    assert len(log) == 1 and "/download/storage/v1/" in log[0][1]


@pytest.mark.emulator_pages
def test_listing_costs_one_request_per_page_and_asks_only_for_names_and_generations(gcs):
    written = {f"p/{i}.json": gcs.write(f"p/{i}.json", b"{}", if_generation_match=0) for i in range(5)}
    gcs.write("q/other.json", b"{}", if_generation_match=0)
    gcs._LIST_PAGE_SIZE = 2
    log = RequestLog(gcs)
    assert gcs.list("p/") == written
    assert len(log) == 3
    params = log[0][2]["params"]
    assert params["fields"] == "items(name,generation),nextPageToken" and params["maxResults"] == "2"
    assert "pageToken" in log[1][2]["params"]


def test_every_request_carries_the_timeout_and_no_redirects(gcs):
    log = RequestLog(gcs)
    gen = gcs.write("a.json", b"{}", if_generation_match=0)
    gcs.read("a.json", max_bytes=10)
    gcs.list("")
    gcs.delete("a.json", if_generation_match=gen)
    assert len(log) == 4
    for _, _, kwargs in log:
        assert kwargs["timeout"] == (5.0, 15.0)
        assert kwargs["allow_redirects"] is False


# --------------------------------------------------------------------------- what is sent and stored


def test_a_write_stores_json_that_no_cache_may_keep(gcs, gcs_emulator, bucket):
    gcs.write("locks/a.json", b'{"owner": "me"}', if_generation_match=0)
    meta = metadata(gcs_emulator, bucket, "locks/a.json")
    assert meta["contentType"] == "application/json"
    assert meta["cacheControl"] == "no-store"


def test_a_write_is_one_multipart_upload_with_the_generation_precondition(gcs):
    log = RequestLog(gcs)
    gcs.write("a.json", b"{}", if_generation_match=0)
    method, url, kwargs = log[0]
    assert method == "POST" and url.endswith(f"/upload/storage/v1/b/{gcs.bucket}/o")
    assert kwargs["params"]["uploadType"] == "multipart"
    assert kwargs["params"]["ifGenerationMatch"] == "0"
    assert kwargs["headers"]["Content-Type"].startswith("multipart/related; boundary=")


def test_a_capped_read_asks_for_at_most_one_byte_over_the_cap(gcs):
    gcs.write("a.json", b"0123456789", if_generation_match=0)
    log = RequestLog(gcs)
    data, _ = gcs.read("a.json", max_bytes=3)
    assert data == b"0123"
    assert log[0][2]["headers"]["Range"] == "bytes=0-3"


def test_an_emulator_host_without_a_scheme_is_taken_as_http(gcs_emulator, bucket, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host_port)
    store = GCSStorage(bucket)
    gen = store.write("a.json", b"{}", if_generation_match=0)
    assert store.read("a.json") == (b"{}", gen)
    store.close()


# --------------------------------------------------------------------------- construction and URLs


def test_the_constructor_does_no_io(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: any connection would be refused
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{sock.getsockname()[1]}")
        store = GCSStorage("some-bucket")
        # private: no client made yet (no I/O in constructors); the public client property would make one
        assert store.url == "gs://some-bucket" and not store.has_client


@pytest.mark.parametrize("bad", ["", "ab", "Upper", "-dash.start", "a/b", None])
def test_an_invalid_bucket_name_is_refused_by_the_constructor(bad):
    with pytest.raises(ConfigurationError):
        GCSStorage(bad)


@pytest.mark.parametrize("bad", [0, -1, (1.0,), (1.0, 0), (float("inf"), 1.0), "5", True])
def test_an_invalid_timeout_is_refused_by_the_constructor(bad):
    with pytest.raises(ConfigurationError):
        GCSStorage("some-bucket", timeout=bad)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5", True, (1.0, 2.0)])
def test_an_invalid_request_timeout_is_refused_by_the_constructor(bad):
    with pytest.raises(ConfigurationError, match="request_timeout"):
        GCSStorage("some-bucket", request_timeout=bad)


@pytest.mark.parametrize("bad", ["", "My Project", "UPPER-case", "-leading", "trailing-", "a" * 200, "a&b=c", 12345])
def test_an_invalid_user_project_is_refused_by_the_constructor(bad):
    with pytest.raises(ConfigurationError, match="user_project"):
        GCSStorage("some-bucket", user_project=bad)


def test_shared_returns_one_store_per_bucket_and_emulator(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    a = GCSStorage.shared("shared-bucket")
    assert GCSStorage.shared("shared-bucket") is a
    assert GCSStorage.shared("other-bucket") is not a
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:2")
    assert GCSStorage.shared("shared-bucket") is not a


def test_a_gs_url_opens_the_shared_store_for_its_bucket(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    store, key = open_url("gs://my-bucket/locks/train.json")
    assert isinstance(store, GCSStorage) and store.url == "gs://my-bucket" and key == "locks/train.json"
    assert store is GCSStorage.shared("my-bucket")
    assert store.user_project is None


def test_a_gs_url_names_the_project_billed_for_a_requester_pays_bucket_with_user_project(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    store, key = open_url("gs://my-bucket/locks/train.json?userProject=billing-123")
    assert store.user_project == "billing-123" and key == "locks/train.json"
    assert store is GCSStorage.shared("my-bucket", user_project="billing-123")
    assert store is not open_url("gs://my-bucket/locks/train.json")[0]  # one store per billed project


@pytest.mark.parametrize(
    "url",
    [
        "gs://my-bucket/a.json?userProject=",
        "gs://my-bucket/a.json?userProject=Not%20A%20Project",
        "gs://my-bucket/a.json?userProject=a-proj&userProject=b-proj",
        "gs://my-bucket/a.json?userProject=a-proj&x=1",
        "gs://my-bucket/a.json?userproject=a-proj",
        "gs://my-bucket/a.json?userProject=a-proj#frag",
        "memory://store/a.json?userProject=a-proj",
        "file:///tmp/a.json?userProject=a-proj",
    ],
)
def test_a_lock_url_with_an_option_it_cannot_take_gets_invalid_lock_url(url):
    with pytest.raises(InvalidLockURL):
        open_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "gs://",
        "gs:///a.json",
        "gs://Bad_Bucket/a.json",
        "gs://ab/a.json",
        "gs://-bucket/a.json",
        "gs://bucket",
        "gs://bucket/",
        "gs://bucket/dir/",
        "gs://bucket/a/../b.json",
        "gs://bucket/a.json?x=1",
    ],
)
def test_a_malformed_gs_url_gets_invalid_lock_url(url):
    with pytest.raises(InvalidLockURL):
        open_url(url)


# --------------------------------------------------------------------------- a total deadline per request


# A lock record of 60 bytes: its body alone, one byte a second, takes a minute to arrive.
RECORD = b'{"ownerId": "host:1:abc", "expiresAt": 1.0, "token": 7, "n": 1}'

#: The bound each trickled request is given (the call's ``timeout``, under the store's request_timeout).
CUT = 0.25

TRICKLED = [
    pytest.param("trickle", lambda s, g: s.read("a.json", timeout=CUT), False, id="read-body"),
    pytest.param("trickle_head", lambda s, g: s.read("a.json", timeout=CUT), False, id="read-head"),
    pytest.param("trickle", lambda s, g: s.read("a.json", max_bytes=1000, timeout=CUT), False, id="read-capped-body"),
    pytest.param("trickle", lambda s, g: s.list("", timeout=CUT), False, id="list-body"),
    pytest.param("trickle", lambda s, g: s.write("a.json", b"{}", if_generation_match=g, timeout=CUT), True, id="write-reply"),
    pytest.param("trickle_head", lambda s, g: s.delete("a.json", if_generation_match=g, timeout=CUT), True, id="delete-reply"),
]


@pytest.mark.parametrize("kind, operation, mutation", TRICKLED)
def test_a_reply_trickled_byte_by_byte_is_cut_off_at_the_request_deadline(proxy, bucket, kind, operation, mutation):
    """A byte every quarter second never lets a read wait its 2 s read timeout, so only the request's
    own deadline (CUT, a quarter second: the call's bound, shorter than the store's request_timeout)
    ends it; without one each of these takes the whole reply's bytes (a read of an 8-byte object took
    8 s at a byte a second, a write's reply over 25 s before request_timeout existed). Slack for a
    loaded machine: 2 s. A write or delete cut off this way was applied, so the error says it may
    have been."""
    store = through(proxy, bucket, timeout=(2.0, 2.0), request_timeout=1.0)
    generation = store.write("a.json", RECORD, if_generation_match=0)
    proxy.inject(kind, delay=CUT)
    elapsed, error = finishes_within(15, lambda: operation(store, generation))
    assert isinstance(error, StorageTimeout), error
    assert f"no complete reply within {CUT:g} s" in str(error) and error.ambiguous is mutation
    assert CUT - 0.1 <= elapsed < CUT + 2.0, f"cut off after {elapsed:.2f} s"
    assert proxy.stats()["faults"][kind] == 1
    if mutation:  # the request reached the store and was applied: why a write says "ambiguous"
        direct = GCSStorage(bucket)
        assert direct.read("a.json") != (RECORD, generation)
        direct.close()
    proxy.clear()
    store.list("")  # the store goes on, on a new connection
    store.close()


def test_the_stores_request_timeout_bounds_a_call_that_names_no_timeout(proxy, bucket):
    """The cases above pass the call's own bound; a call without one is cut at the store's."""
    writer = through(proxy, bucket, request_timeout=2.0)
    writer.write("a.json", RECORD, if_generation_match=0)
    writer.close()
    store = through(proxy, bucket, timeout=(2.0, 2.0), request_timeout=CUT)
    proxy.inject("trickle", method="GET", delay=CUT)
    elapsed, error = finishes_within(15, lambda: store.read("a.json"))
    assert isinstance(error, StorageTimeout) and f"no complete reply within {CUT:g} s" in str(error), error
    assert CUT - 0.1 <= elapsed < CUT + 2.0, f"cut off after {elapsed:.2f} s"
    store.close()


def test_by_default_a_request_may_take_its_connect_and_read_timeouts_together(proxy, bucket):
    store = through(proxy, bucket, timeout=(0.25, 0.5))
    store.write("a.json", RECORD, if_generation_match=0)
    proxy.inject("trickle_head", method="GET", delay=0.2)  # never the read timeout, a pause at a time
    elapsed, error = finishes_within(15, lambda: store.read("a.json"))
    assert isinstance(error, StorageTimeout) and "no complete reply within 0.75 s" in str(error)
    assert 0.75 - 0.1 <= elapsed < 0.75 + 2.0
    store.close()


def test_a_deadline_that_passes_after_its_request_ended_cuts_nothing(proxy, bucket):
    """Each request's deadline lets go of its connection before the connection goes back to the
    pool: the next request reuses it, though the first one's deadline passed in between."""
    store = through(proxy, bucket, request_timeout=0.3)
    generation = store.write("a.json", RECORD, if_generation_match=0)
    time.sleep(0.6)
    assert store.read("a.json") == (RECORD, generation)
    time.sleep(0.6)
    assert store.list("") == {"a.json": generation}
    assert proxy.stats()["connections"] == 1
    store.close()


def test_a_request_that_beats_its_deadline_is_untouched(proxy, bucket):
    store = through(proxy, bucket, timeout=(5.0, 5.0), request_timeout=4.0)
    store.write("a.json", RECORD, if_generation_match=0)
    # 63 bytes in 0.13 s idle, well within the deadline: over a second on a loaded 2-core machine (load 27),
    # where a deadline of 1 s cut it (a pause of 2 ms is then a scheduler's slice).
    proxy.inject("trickle", method="GET", delay=0.002)
    assert store.read("a.json")[0] == RECORD
    store.close()


def test_the_store_s_own_session_gets_the_deadline_pools_and_a_client_you_pass_is_left_alone(bucket):
    own = GCSStorage(bucket)
    # private (google-cloud-storage's): the client's HTTP session, where the deadline pools are mounted
    assert all(isinstance(own.client._http.adapters[p], deadline.DeadlineAdapter) for p in ("http://", "https://"))
    own.close()
    client = google_storage.Client(
        project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]}
    )
    passed = GCSStorage(bucket, client=client)
    passed.write("a.json", b"{}", if_generation_match=0)
    # private (google-cloud-storage's): as above
    assert type(client._http.adapters["http://"]) is requests.adapters.HTTPAdapter
    client.close()


def test_installing_the_deadline_pools_keeps_the_pool_settings_and_leaves_special_adapters_alone():
    class MutualTLS(requests.adapters.HTTPAdapter):
        pass

    session = requests.Session()
    special = MutualTLS()
    session.mount("https://", special)
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=32, pool_connections=3))
    assert deadline.install(session) is False
    assert session.adapters["https://"] is special
    plain = session.adapters["http://"]
    assert isinstance(plain, deadline.DeadlineAdapter)
    # private (requests'): an adapter's pool settings have no public getter
    assert (plain._pool_maxsize, plain._pool_connections) == (32, 3)
    assert deadline.install(requests.Session()) is True


# --------------------------------------------------------------------------- requester pays


def test_every_request_names_the_user_project_when_one_is_given(proxy, bucket):
    store = through(proxy, bucket, user_project="billing-123")
    generation = store.write("a.json", RECORD, if_generation_match=0)
    store.read("a.json")
    store.read("a.json", max_bytes=10)
    store.list("")
    generation = store.write("a.json", b"{}", if_generation_match=generation)
    store.delete("a.json", if_generation_match=generation)
    sent = proxy.exchanges()
    assert [e.method for e in sent] == ["POST", "GET", "GET", "GET", "POST", "DELETE"]
    assert [e.query.get("userProject") for e in sent] == ["billing-123"] * 6
    store.close()

    plain = through(proxy, bucket)
    plain.read("a.json")
    assert "userProject" not in proxy.exchanges()[-1].query
    plain.close()


def test_a_lock_on_a_gs_url_with_user_project_names_it_in_every_request(proxy, bucket):
    with proxy.env():
        # No pacing: the subject is the query parameter of each request, not their spacing.
        lock = HandoffLock(f"gs://{bucket}/locks/a.json?userProject=billing-123", ttl=5.0, min_write_interval=0)
        with lock:
            pass
    sent = proxy.exchanges()
    assert len(sent) >= 2 and {e.query.get("userProject") for e in sent} == {"billing-123"}


# --------------------------------------------------------------------------- error mapping, on the emulator


def test_a_missing_bucket_fails_writes_and_listings_with_a_message_naming_it(gcs_emulator):
    store = GCSStorage("handofflock-no-such-bucket")
    for attempt in (lambda: store.write("a.json", b"{}", if_generation_match=0), lambda: store.list("")):
        with pytest.raises(StorageError) as info:
            attempt()
        assert type(info.value) is StorageError
        assert "'handofflock-no-such-bucket' does not exist" in str(info.value)
        assert "create it" in str(info.value)


@pytest.mark.fake_gcs_quirk
def test_on_the_emulator_a_read_from_a_missing_bucket_looks_like_an_absent_object(gcs_emulator):
    """fake-gcs-server's 404s do not say what is missing; the create that follows fails (previous test)."""
    store = GCSStorage("handofflock-no-such-bucket")
    assert store.read("a.json") is None
    with pytest.raises(NotFound):
        store.delete("a.json", if_generation_match=1)


def test_a_server_that_is_not_listening_is_transient_and_certainly_not_applied(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{sock.getsockname()[1]}")
        store = GCSStorage("some-bucket", timeout=(1.0, 1.0))
        for attempt in (lambda: store.read("a.json"), lambda: store.write("a.json", b"{}", if_generation_match=0)):
            with pytest.raises(TransientStorageError) as info:
                attempt()
            assert info.value.ambiguous is False and info.value.status is None
            assert isinstance(info.value.__cause__, requests.exceptions.ConnectionError)


def test_a_server_that_never_answers_is_a_transient_ambiguous_timeout(monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_say_nothing():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept_and_say_nothing, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{listener.getsockname()[1]}")
        store = GCSStorage("some-bucket", timeout=(1.0, 0.3))
        started = time.monotonic()
        with pytest.raises(TransientStorageError) as info:
            store.write("a.json", b"{}", if_generation_match=0)
        assert time.monotonic() - started < 3
        assert info.value.ambiguous is True
        assert isinstance(info.value.__cause__, requests.exceptions.ReadTimeout)
    finally:
        stop.set()
        thread.join(2)
        for conn in accepted:
            conn.close()
        listener.close()


def _self_signed_cert(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no CA vouches for (cryptography comes with google-auth)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def test_a_tls_certificate_nobody_vouches_for_is_a_permanent_error_that_says_what_to_check(monkeypatch, tmp_path):
    """Not retried as if the network hiccuped: a wrong CA bundle or an intercepting proxy stays wrong."""
    import ssl

    cert, key = _self_signed_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn = listener.accept()[0]
            except OSError:
                continue
            try:
                context.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"https://127.0.0.1:{listener.getsockname()[1]}")
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
        store = GCSStorage("some-bucket", timeout=(2.0, 2.0))
        with pytest.raises(StorageError) as info:
            store.read("a.json")
        assert not isinstance(info.value, TransientStorageError)
        assert "REQUESTS_CA_BUNDLE" in str(info.value) and "certificate" in str(info.value)
        assert isinstance(info.value.__cause__, requests.exceptions.SSLError)
    finally:
        stop.set()
        thread.join(2)
        listener.close()


def test_missing_default_credentials_say_how_to_provide_them(monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    store = GCSStorage("some-bucket")
    with pytest.raises(StorageError) as info:
        store.read("a.json")
    message = str(info.value)
    assert "gcloud auth application-default login" in message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message and "STORAGE_EMULATOR_HOST" in message
    assert isinstance(info.value.__cause__, google.auth.exceptions.DefaultCredentialsError)


# --------------------------------------------------------------------------- error mapping, canned replies


@pytest.mark.parametrize(
    "reply, kind, ambiguous, retry_after",
    [
        pytest.param((429, {"Retry-After": "7"}, b"slow down"), TransientStorageError, False, 7.0, id="429"),
        pytest.param(json_error(500, "backend error"), TransientStorageError, True, None, id="500"),
        pytest.param(json_error(503, "unavailable"), TransientStorageError, True, None, id="503"),
        pytest.param(json_error(408, "request timeout"), TransientStorageError, True, None, id="408"),
    ],
)
def test_throttling_timeouts_and_server_errors_are_transient(canned, reply, kind, ambiguous, retry_after):
    server, store = canned(lambda handler: reply)
    with pytest.raises(kind) as info:
        store.write("a.json", b"{}", if_generation_match=0)
    assert info.value.status == reply[0]
    assert info.value.ambiguous is ambiguous
    assert info.value.retry_after == retry_after
    assert len(server.requests) == 1  # nothing retried behind the lock's back


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(lambda s: s.write("a.json", b"{}", if_generation_match=0), id="write"),
        pytest.param(lambda s: s.delete("a.json", if_generation_match=5), id="delete"),
    ],
)
def test_a_conflict_on_a_conditional_write_or_delete_is_transient_and_was_not_applied(canned, operation):
    """GCS documents 409 as a change that failed to commit against a concurrent one, to be retried;
    a generation-matched retry cannot overwrite what the other change did."""
    message = "A request to change a resource failed to commit due to a conflicting concurrent change."
    server, store = canned(lambda handler: json_error(409, message))
    with pytest.raises(TransientStorageError) as info:
        operation(store)
    assert info.value.status == 409 and info.value.ambiguous is False
    assert "conflicting concurrent change" in str(info.value)
    assert len(server.requests) == 1


def test_a_retry_after_date_is_turned_into_seconds(canned):
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server, store = canned(lambda handler: (503, {"Retry-After": when}, b""))
    with pytest.raises(TransientStorageError) as info:
        store.read("a.json")
    assert 25 <= info.value.retry_after <= 31


def test_permission_denied_names_the_bucket_and_the_role_to_grant(canned):
    server, store = canned(lambda handler: json_error(403, "caller does not have storage.objects.create access"))
    with pytest.raises(StorageError) as info:
        store.write("a.json", b"{}", if_generation_match=0)
    assert type(info.value) is StorageError
    assert "'canned-bucket'" in str(info.value) and "roles/storage.objectUser" in str(info.value)
    assert "storage.objects.create" in str(info.value)


def test_rejected_credentials_say_what_to_check(canned):
    server, store = canned(lambda handler: json_error(401, "Invalid Credentials"))
    with pytest.raises(StorageError) as info:
        store.read("a.json")
    assert type(info.value) is StorageError and "credentials" in str(info.value)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(json_error(400, "Invalid argument"), id="400"),
        pytest.param((302, {"Location": "http://127.0.0.1:1/elsewhere"}, b""), id="redirect-not-followed"),
    ],
)
def test_other_statuses_are_storage_errors_carrying_the_servers_message(canned, reply):
    server, store = canned(lambda handler: reply)
    with pytest.raises(StorageError) as info:
        store.read("a.json")
    assert type(info.value) is StorageError and str(reply[0]) in str(info.value)
    assert len(server.requests) == 1


def test_a_404_saying_the_bucket_does_not_exist_is_told_apart_from_a_missing_object(canned):
    """Real GCS words the two 404s differently; only the message tells them apart."""
    server, store = canned(lambda handler: json_error(404, "The specified bucket does not exist."))
    for attempt in (lambda: store.read("a.json"), lambda: store.delete("a.json", if_generation_match=1)):
        with pytest.raises(StorageError) as info:
            attempt()
        assert type(info.value) is StorageError and "'canned-bucket' does not exist" in str(info.value)

    server, store = canned(lambda handler: json_error(404, "No such object: canned-bucket/a.json"))
    assert store.read("a.json") is None
    with pytest.raises(NotFound):
        store.delete("a.json", if_generation_match=1)


def test_a_connection_closed_after_the_upload_was_sent_is_ambiguous_and_not_retried(canned):
    server, store = canned(lambda handler: None)
    with pytest.raises(TransientStorageError) as info:
        store.write("a.json", b"{}", if_generation_match=0)
    assert info.value.ambiguous is True
    assert isinstance(info.value.__cause__, requests.exceptions.ConnectionError)
    assert len(server.requests) == 1


def test_a_416_without_a_generation_costs_one_more_read_without_a_range(canned):
    def reply(handler):
        if "Range" in handler.headers:
            return 416, {"Content-Range": "bytes */0"}, b""
        return 200, {"x-goog-generation": "42"}, b""

    server, store = canned(reply)
    assert store.read("empty.json", max_bytes=100) == (b"", 42)
    assert [("Range" in headers) for _, _, headers in server.requests] == [True, False]


def test_a_body_that_does_not_match_its_crc32c_is_a_transient_error(canned):
    # crc32c of b"{}" is "iPq5Bg=="; this body claims the crc32c of b"".
    server, store = canned(lambda handler: (200, {"x-goog-generation": "5", "x-goog-hash": "crc32c=AAAAAA=="}, b"{}"))
    with pytest.raises(TransientStorageError) as info:
        store.read("a.json")
    assert info.value.ambiguous is False and "CRC32C" in str(info.value)


@pytest.mark.parametrize("body", [b"<html>proxy says hi</html>", b"{}", b'{"generation": "soon"}'])
def test_an_accepted_upload_whose_reply_cannot_be_read_is_ambiguous_not_a_failure(canned, body):
    """The 200 says it was applied: reporting a permanent failure would leave a record naming us
    that we never act on. Ambiguous makes the caller read back and find its nonce."""
    server, store = canned(lambda handler: (200, {"Content-Type": "application/json"}, body))
    with pytest.raises(TransientStorageError) as info:
        store.write("a.json", b"{}", if_generation_match=0)
    assert info.value.ambiguous is True and "probably been applied" in str(info.value)


def test_a_reply_cut_short_of_its_content_length_is_a_transient_error_not_a_short_object(canned):
    # urllib3 2 notices by itself; 1.26 (still allowed by the SDK) would hand b'{"own' over as the object.
    server, store = canned(lambda handler: (200, {"x-goog-generation": "5", "Content-Length": "40"}, b'{"own'))
    with pytest.raises(TransientStorageError):
        store.read("a.json", max_bytes=1000)


def test_a_reply_without_a_generation_is_refused(canned):
    server, store = canned(lambda handler: (200, {}, b"{}"))
    with pytest.raises(StorageError, match="x-goog-generation"):
        store.read("a.json")


# --------------------------------------------------------------------------- know the emulator


def test_the_emulator_honours_if_generation_match_on_multipart_uploads(gcs_emulator, bucket):
    status, _, body = raw_multipart_upload(gcs_emulator, bucket, "a.json", b"1", 0)
    assert status == 200
    generation = int(json.loads(body)["generation"])
    assert raw_multipart_upload(gcs_emulator, bucket, "a.json", b"2", 0)[0] == 412
    assert raw_multipart_upload(gcs_emulator, bucket, "a.json", b"2", generation + 1)[0] == 412
    assert raw_multipart_upload(gcs_emulator, bucket, "absent.json", b"2", 12345)[0] == 412
    assert raw_multipart_upload(gcs_emulator, bucket, "a.json", b"2", generation)[0] == 200


@pytest.mark.fake_gcs_quirk
def test_the_emulator_ignores_if_generation_match_on_media_uploads(gcs_emulator, bucket):
    """So handofflock uploads multipart, never uploadType=media."""
    base = f"{gcs_emulator.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name=a.json"
    assert raw("POST", base + "&ifGenerationMatch=0", b"1")[0] == 200
    assert raw("POST", base + "&ifGenerationMatch=0", b"2")[0] == 200  # GCS: 412
    assert raw("POST", base + "&ifGenerationMatch=12345", b"3")[0] == 200  # GCS: 412


@pytest.mark.fake_gcs_quirk
def test_the_emulator_ignores_if_generation_match_on_delete(gcs_emulator, bucket):
    status, _, body = raw_multipart_upload(gcs_emulator, bucket, "a.json", b"1", 0)
    generation = int(json.loads(body)["generation"])
    url = f"{gcs_emulator.url}/storage/v1/b/{bucket}/o/a.json?ifGenerationMatch={generation + 1}"
    status, _, _ = raw("DELETE", url)
    assert status in (200, 204)  # GCS: 412
    assert raw("GET", f"{gcs_emulator.url}/storage/v1/b/{bucket}/o/a.json")[0] == 404


@pytest.mark.fake_gcs_quirk
def test_the_emulator_ignores_if_metageneration_match_on_patch(gcs_emulator, bucket):
    raw_multipart_upload(gcs_emulator, bucket, "a.json", b"1", 0)
    status, _, _ = raw(
        "PATCH",
        f"{gcs_emulator.url}/storage/v1/b/{bucket}/o/a.json?ifMetagenerationMatch=99",
        json.dumps({"metadata": {"k": "v"}}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200  # GCS: 412
    assert metadata(gcs_emulator, bucket, "a.json")["metadata"] == {"k": "v"}


@pytest.mark.fake_gcs_quirk
def test_the_emulator_ignores_if_generation_not_match_on_get(gcs_emulator, bucket):
    status, _, body = raw_multipart_upload(gcs_emulator, bucket, "a.json", b"1", 0)
    generation = int(json.loads(body)["generation"])
    url = f"{gcs_emulator.url}/download/storage/v1/b/{bucket}/o/a.json?alt=media&ifGenerationNotMatch={generation}"
    status, _, body = raw("GET", url)
    assert (status, body) == (200, b"1")  # GCS: 304 Not Modified


@pytest.mark.fake_gcs_quirk
def test_the_emulator_ignores_if_generation_match_on_get(gcs_emulator, bucket):
    raw_multipart_upload(gcs_emulator, bucket, "a.json", b"1", 0)
    url = f"{gcs_emulator.url}/download/storage/v1/b/{bucket}/o/a.json?alt=media&ifGenerationMatch=1"
    status, _, body = raw("GET", url)
    assert (status, body) == (200, b"1")  # GCS: 412


@pytest.mark.fake_gcs_quirk
def test_the_emulator_answers_the_same_bare_404_for_a_missing_bucket_and_a_missing_object(gcs_emulator, bucket):
    for path in ("/download/storage/v1/b/{b}/o/absent.json?alt=media", "/storage/v1/b/{b}/o/absent.json"):
        missing_object = raw("GET", gcs_emulator.url + path.format(b=bucket))
        missing_bucket = raw("GET", gcs_emulator.url + path.format(b="handofflock-no-such-bucket"))
        assert missing_object[0] == missing_bucket[0] == 404
        assert missing_object[2] == missing_bucket[2]
        assert b"bucket" not in missing_bucket[2].lower()


@pytest.mark.fake_gcs_quirk
def test_the_emulator_sends_the_generation_with_a_416_for_a_range_on_an_empty_object(gcs_emulator, bucket):
    """Why a capped read of an empty object costs one request here (GCS may need two)."""
    status, _, body = raw_multipart_upload(gcs_emulator, bucket, "empty.json", b"", 0)
    generation = json.loads(body)["generation"]
    url = f"{gcs_emulator.url}/download/storage/v1/b/{bucket}/o/empty.json?alt=media"
    status, headers, _ = raw("GET", url, headers={"Range": "bytes=0-9"})
    assert status == 416 and headers["x-goog-generation"] == generation


# --------------------------------------------------------------------------- the module boundary


def test_only_the_gcs_backend_imports_the_google_sdk_or_the_http_transport():
    """gcs.py alone imports the SDK; the request deadline shared with S3, deadline.py, imports only the HTTP stack."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "storage" / "gcs.py":
            continue
        wire = path.parent == PACKAGE / "storage" and path.name == "deadline.py"
        forbidden = ("google",) if wire else ("google", "requests", "urllib3")
        if not any(name in path.read_text() for name in forbidden):  # no import can name one: no need to parse
            continue
        for node in ast.walk(parse(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in forbidden]
    assert offenders == []
    assert "from google.cloud import storage" in (PACKAGE / "storage" / "gcs.py").read_text()
