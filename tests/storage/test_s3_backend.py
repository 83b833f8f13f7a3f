"""The S3 backend against a real moto server process: what moto honours, and what S3Storage adds.

First the server is proven able to serve a lock (conditional PUTs race with
exactly one winner), then the backend's own mapping is checked: the generation
in the envelope the ETag covers (no ABA), tombstone deletes, one request per
operation, the error mapping and the URL.

Where moto differs from S3 the test says so (``moto_quirk``).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid

import boto3
import botocore.config
import botocore.exceptions
import pytest
from sources import parse

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
from handofflock.storage import open_url
from handofflock.storage.base import S3_MAGIC, parse_header
from handofflock.storage.records import default_write_interval
from handofflock.storage.s3 import S3Storage, normalize_etag
from handofflock.testing.faultproxy import FaultProxy

pytestmark = pytest.mark.s3

RACERS = 16


@pytest.fixture
def bucket(s3_server):
    name = f"b-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture(scope="module")
def raw(s3_server):
    """A plain boto3 client on the moto server: what any other tool would see (one for the module: a
    client costs a tenth of a second to make, and holds no state a test could leave behind)."""
    client = boto3.client(
        "s3", endpoint_url=s3_server.url, config=botocore.config.Config(retries={"total_max_attempts": 1}, max_pool_connections=RACERS)
    )
    yield client
    client.close()


@pytest.fixture
def proxy(s3_server):
    p = FaultProxy(s3_server.url, lifetime=120, dialect="s3").start()
    yield p
    p.stop()


def _race(fn) -> list[str]:
    barrier = threading.Barrier(RACERS)
    results = [""] * RACERS

    def run(i: int) -> None:
        barrier.wait()
        try:
            fn(i)
            results[i] = "won"
        except botocore.exceptions.ClientError as exc:
            results[i] = str(exc.response["ResponseMetadata"]["HTTPStatusCode"])
        except Exception as exc:  # shows in the assertion
            results[i] = repr(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


# --------------------------------------------------------------------------- what moto honours


def test_moto_is_a_version_that_honours_conditional_puts():
    from importlib.metadata import version  # the server's moto, not imported here (it hooks every botocore client)

    installed = version("moto")
    major, minor = (int(part) for part in installed.split(".")[:2])
    assert (major, minor) >= (5, 1), f"moto {installed} ignores If-Match / If-None-Match on PutObject"


#: Races per test, on one bucket (fresh keys): each may show a lost update the one before did not.
ROUNDS = 3


def test_moto_lets_exactly_one_of_sixteen_racing_creates_with_if_none_match_win(raw, bucket):
    for round_ in range(ROUNDS):
        key = f"race/create-{round_}"

        def create(i: int, key: str = key) -> object:
            return raw.put_object(Bucket=bucket, Key=key, Body=str(i).encode(), IfNoneMatch="*")

        results = _race(create)
        assert sorted(results) == ["412"] * (RACERS - 1) + ["won"], f"round {round_}"
        winner = results.index("won")
        assert raw.get_object(Bucket=bucket, Key=key)["Body"].read() == str(winner).encode(), f"round {round_}"


def test_moto_lets_exactly_one_of_sixteen_racing_replaces_with_if_match_win(raw, bucket):
    for round_ in range(ROUNDS):
        key = f"race/replace-{round_}"
        etag = raw.put_object(Bucket=bucket, Key=key, Body=b"base")["ETag"]

        def replace(i: int, key: str = key, etag: str = etag) -> object:
            return raw.put_object(Bucket=bucket, Key=key, Body=str(i).encode(), IfMatch=etag)

        results = _race(replace)
        assert sorted(results) == ["412"] * (RACERS - 1) + ["won"], f"round {round_}"
        winner = results.index("won")
        assert raw.get_object(Bucket=bucket, Key=key)["Body"].read() == str(winner).encode(), f"round {round_}"


def test_an_etag_names_the_bytes_not_the_write_which_is_why_the_generation_is_in_the_bytes(raw, bucket):
    """The ABA hazard, on the raw API: the same bytes written again get the same ETag, so an If-Match
    prepared for the first version matches a later one. (S3 does the same for plain PUTs: the ETag
    is the MD5 of the bytes.)"""
    first = raw.put_object(Bucket=bucket, Key="k", Body=b"same")["ETag"]
    raw.put_object(Bucket=bucket, Key="k", Body=b"other", IfMatch=first)
    again = raw.put_object(Bucket=bucket, Key="k", Body=b"same")["ETag"]
    assert again == first
    raw.put_object(Bucket=bucket, Key="k", Body=b"stale writer wins", IfMatch=first)  # not refused: ABA


@pytest.mark.moto_quirk
def test_moto_honours_if_match_on_delete_object_which_the_backend_does_not_use(raw, bucket):
    """Pinned for the docs: moto refuses a DeleteObject whose If-Match does not hold. The backend
    deletes by writing a tombstone anyway (a real delete would forget the generation)."""
    raw.put_object(Bucket=bucket, Key="k", Body=b"1")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        raw.delete_object(Bucket=bucket, Key="k", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


@pytest.mark.moto_quirk
def test_moto_accepts_an_unquoted_etag_in_if_match_and_the_backend_quotes_it_anyway(raw, bucket):
    etag = raw.put_object(Bucket=bucket, Key="k", Body=b"1")["ETag"]
    assert etag.startswith('"') and etag.endswith('"')
    raw.put_object(Bucket=bucket, Key="k", Body=b"2", IfMatch=etag.strip('"'))
    assert normalize_etag(etag.strip('"')) == normalize_etag(etag) == normalize_etag(f"W/{etag}")


# --------------------------------------------------------------------------- the mapping


def test_the_object_is_the_data_behind_one_header_line_with_the_generation(bucket, raw):
    store = S3Storage(bucket)
    gen = store.write("locks/a.json", b'{"x": 1}', if_generation_match=0)
    stored = raw.get_object(Bucket=bucket, Key="locks/a.json")["Body"].read()
    assert stored == b"#handofflock/s3 1 live %d 8\n{\"x\": 1}" % gen


def test_a_delete_writes_a_tombstone_that_keeps_the_generation_counting(bucket, raw):
    store = S3Storage(bucket)
    gen = store.write("a.json", b"1", if_generation_match=0)
    store.delete("a.json", if_generation_match=gen)
    stored = raw.get_object(Bucket=bucket, Key="a.json")["Body"].read()
    header = parse_header(S3_MAGIC, stored, len(stored))
    assert header is not None and header.deleted and header.generation > gen
    assert store.read("a.json") is None and store.list("") == {}
    with pytest.raises(NotFound):
        store.delete("a.json", if_generation_match=header.generation)
    with pytest.raises(PreconditionFailed):
        store.write("a.json", b"2", if_generation_match=header.generation)
    again = S3Storage(bucket).write("a.json", b"2", if_generation_match=0)  # a store that never saw it
    assert again > header.generation


def test_an_object_put_there_by_another_tool_reads_as_its_raw_bytes_and_a_matched_write_replaces_it(bucket, raw):
    raw.put_object(Bucket=bucket, Key="foreign.json", Body=b'{"not": "ours"}')
    store = S3Storage(bucket)
    data, gen = store.read("foreign.json")
    assert data == b'{"not": "ours"}' and gen > 0
    assert S3Storage(bucket).read("foreign.json")[1] == gen, "the same generation seen from anywhere"
    with pytest.raises(PreconditionFailed):
        store.write("foreign.json", b"mine", if_generation_match=0)
    new = store.write("foreign.json", b"mine", if_generation_match=gen)
    assert new > gen and store.read("foreign.json") == (b"mine", new)


def test_a_store_that_never_saw_the_object_learns_its_etag_with_one_read_then_writes(bucket, proxy):
    """Every transition is one conditional PUT; the ETag for a generation comes from the read that
    saw it. A write whose generation this store has not read costs one GET first."""
    S3Storage(bucket).write("a.json", b"1", if_generation_match=0)
    store = S3Storage(bucket, endpoint_url=proxy.url)
    _, gen = store.read("a.json")
    gen = store.write("a.json", b"2", if_generation_match=gen)
    store.write("a.json", b"3", if_generation_match=gen)
    assert [(ex.method, ex.status) for ex in proxy.exchanges()] == [("GET", 200), ("PUT", 200), ("PUT", 200)]
    latest = store.read("a.json")[1]
    cold = S3Storage(bucket, endpoint_url=proxy.url)
    before = len(proxy.exchanges())
    cold.write("a.json", b"4", if_generation_match=latest)
    assert [ex.method for ex in proxy.exchanges()][before:] == ["GET", "PUT"]


def test_a_create_is_one_conditional_put_and_a_lock_acquire_two_requests(bucket, proxy):
    store = S3Storage(bucket, endpoint_url=proxy.url)
    store.write("a.json", b"1", if_generation_match=0)
    assert [(ex.method, ex.status) for ex in proxy.exchanges()] == [("PUT", 200)]
    lock = HandoffLock(f"s3://{bucket}/b.json", storage=store, key="b.json")
    before = len(proxy.exchanges())
    assert lock.acquire(blocking=False)
    assert [ex.method for ex in proxy.exchanges()][before:] == ["GET", "PUT"]
    lock.release()


def test_writes_to_s3_are_not_spaced_by_default():
    assert S3Storage.min_write_interval == 0.0 and default_write_interval(S3Storage("some-bucket")) == 0.0


# --------------------------------------------------------------------------- errors


def test_a_conflict_409_is_transient_and_not_applied(bucket, proxy):
    store = S3Storage(bucket, endpoint_url=proxy.url)
    proxy.inject("409", method="PUT")
    with pytest.raises(TransientStorageError) as info:
        store.write("a.json", b"1", if_generation_match=0)
    assert info.value.status == 409 and info.value.ambiguous is False and "ConditionalRequestConflict" in str(info.value)
    assert store.read("a.json") is None


def test_slow_down_is_transient_and_not_applied(bucket, proxy):
    store = S3Storage(bucket, endpoint_url=proxy.url)
    proxy.inject("503", method="PUT", retry_after=2)
    with pytest.raises(TransientStorageError) as info:
        store.write("a.json", b"1", if_generation_match=0)
    assert info.value.status == 503 and info.value.ambiguous is False and info.value.retry_after == 2


def test_a_reply_lost_after_the_put_was_sent_is_ambiguous(bucket, proxy):
    store = S3Storage(bucket, endpoint_url=proxy.url)
    proxy.inject("drop_reply", method="PUT")
    with pytest.raises(TransientStorageError) as info:
        store.write("a.json", b"1", if_generation_match=0)
    assert info.value.ambiguous is True
    assert store.read("a.json")[0] == b"1", "it was applied"


def test_permission_denied_is_permanent_and_names_the_actions_to_allow(bucket, proxy):
    store = S3Storage(bucket, endpoint_url=proxy.url)
    proxy.inject("403", method="GET")
    with pytest.raises(StorageError) as info:
        store.read("a.json")
    assert not isinstance(info.value, TransientStorageError)
    assert "s3:GetObject" in str(info.value) and bucket in str(info.value)
    assert "403, not 404, without s3:ListBucket" in str(info.value), "S3's answer for a missing key without ListBucket"


def test_a_missing_bucket_is_a_permanent_error_that_says_to_create_it(s3_server):
    store = S3Storage("handofflock-no-such-bucket")
    for op in (lambda: store.read("a.json"), lambda: store.write("a.json", b"1", if_generation_match=0), lambda: store.list("")):
        with pytest.raises(StorageError) as info:
            op()
        assert not isinstance(info.value, TransientStorageError) and "aws s3 mb" in str(info.value)


def test_a_server_that_is_not_listening_is_transient_and_certainly_not_applied(s3_server):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3Storage("bkt", endpoint_url=f"http://127.0.0.1:{port}", timeout=(1.0, 1.0))
    with pytest.raises(TransientStorageError) as info:
        store.write("a.json", b"1", if_generation_match=0)
    assert info.value.ambiguous is False


def test_a_server_that_never_answers_a_put_is_an_ambiguous_timeout_within_the_timeouts(s3_server):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        store = S3Storage("bkt", endpoint_url=f"http://127.0.0.1:{port}", timeout=(1.0, 1.0))
        store.client  # made first: a cold SDK client (imports, credentials) took 4 s in a fresh venv under load
        started = time.monotonic()
        with pytest.raises(TransientStorageError) as info:
            store.write("a.json", b"1", if_generation_match=0)
        assert info.value.ambiguous is True
        assert time.monotonic() - started < 5.0, "sent once: botocore's retries are off"


def test_missing_credentials_say_how_to_provide_them(s3_server, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    with pytest.raises(StorageError) as info:
        S3Storage("bkt").read("a.json")
    assert not isinstance(info.value, TransientStorageError) and "AWS_ACCESS_KEY_ID" in str(info.value)


# --------------------------------------------------------------------------- construction and URLs


def test_the_constructor_does_no_io_and_checks_its_arguments():
    store = S3Storage("some-bucket")
    # private: no boto3 client made yet (no I/O in constructors); the public client property would make one
    assert not store.has_client
    with pytest.raises(ConfigurationError):
        S3Storage("Bad_Bucket")
    with pytest.raises(ConfigurationError):
        S3Storage("ok-bucket", timeout=(0, 1))


def test_an_s3_url_opens_the_shared_store_for_its_bucket_and_endpoint(s3_server, monkeypatch):
    store, key = open_url("s3://my-bucket/locks/train.json")
    assert isinstance(store, S3Storage) and store.bucket == "my-bucket" and key == "locks/train.json"
    assert open_url("s3://my-bucket/other.json")[0] is store
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
    assert open_url("s3://my-bucket/other.json")[0] is not store, "another endpoint, another store"


def test_the_generic_endpoint_setting_is_honoured_too(s3_server, bucket, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.url)
    store, key = open_url(f"s3://{bucket}/a.json")
    assert store.write(key, b"1", if_generation_match=0) > 0


@pytest.mark.parametrize(
    "url", ["s3://", "s3:///a.json", "s3://Bad_Bucket/a.json", "s3://bucket", "s3://bucket/", "s3://bucket/a/../b.json", "s3://bucket/a.json?x=1"]
)
def test_a_malformed_s3_url_gets_invalid_lock_url(url):
    with pytest.raises(InvalidLockURL):
        open_url(url)


def test_a_lock_on_s3_has_no_write_spacing_by_default(bucket):
    lock = HandoffLock(f"s3://{bucket}/a.json")
    assert lock.min_write_interval == 0.0


def test_only_the_s3_backend_imports_boto3_and_the_core_install_does_not_need_it():
    """s3.py and s3_credentials.py (the client's credentials) alone import boto3 or botocore, and
    nothing imports them at import time of the package: the core install (google-cloud-storage,
    orjson, blinker) stays without boto3."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    package = Path(__import__("handofflock").__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path in (package / "storage" / "s3.py", package / "storage" / "s3_credentials.py"):
            continue
        if "boto" not in path.read_text():  # no import can name it: no need to parse
            continue
        for node in ast.walk(parse(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("boto3", "botocore")]
    assert offenders == []
    code = "import sys, handofflock, handofflock.cli, handofflock.storage; print('boto3' in sys.modules, 'botocore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.parametrize(
    "kind, method, ambiguous",
    [("trickle_head", "PUT", True), ("trickle", "GET", False), ("trickle_head", "GET", False)],
)
def test_a_reply_trickled_byte_by_byte_is_cut_off_at_the_request_deadline(bucket, proxy, kind, method, ambiguous):
    """A reply that keeps coming one byte every quarter second never trips the read timeout (2 s);
    the request deadline (a quarter second: the call's bound, shorter than the store's
    request_timeout) shuts its connection down. Before, a trickled read took 21 s at a byte every
    half second."""
    store = S3Storage(bucket, endpoint_url=proxy.url, timeout=(2.0, 2.0), request_timeout=1.0)
    gen = store.write("a.json", b"x" * 200, if_generation_match=0)
    proxy.inject(kind, method=method, delay=0.25)
    started = time.monotonic()
    with pytest.raises(TransientStorageError) as info:
        if method == "PUT":
            store.write("a.json", b"y", if_generation_match=gen, timeout=0.25)
        else:
            store.read("a.json", timeout=0.25)
    assert time.monotonic() - started < 0.25 + 1.5
    assert info.value.ambiguous is ambiguous and "no complete reply within 0.25 s" in str(info.value)
    assert isinstance(info.value, StorageTimeout)


def test_the_stores_request_timeout_bounds_a_call_that_names_no_timeout(bucket, proxy):
    """The cases above pass the call's own bound; a call without one is cut at the store's (1 s here:
    the store's first request, its probe of conditional writes, must fit in it on a loaded machine)."""
    store = S3Storage(bucket, endpoint_url=proxy.url, timeout=(2.0, 2.0), request_timeout=1.0)
    store.write("a.json", b"x" * 200, if_generation_match=0)
    proxy.inject("trickle", method="GET", delay=0.5)
    started = time.monotonic()
    with pytest.raises(TransientStorageError) as info:
        store.read("a.json")
    assert time.monotonic() - started < 1.0 + 1.5
    assert info.value.ambiguous is False and "no complete reply within 1 s" in str(info.value)
    assert isinstance(info.value, StorageTimeout)


def test_a_lock_whose_create_reply_trickles_is_cut_off_and_resolved_by_the_read_back(bucket, proxy):
    """The create is applied, its reply's head comes a byte a second: request_timeout cuts it
    (ambiguous), the read-back finds the lock's nonce, and the lock holds the lock it created."""
    from lockutil import raw_read

    store = S3Storage(bucket, endpoint_url=proxy.url, timeout=(2.0, 4.0), request_timeout=1.0)
    lock = HandoffLock(f"s3://{bucket}/a.json", storage=store, key="a.json", ttl=6.0, renew_interval=0.2, renew_deadline=3.0)
    proxy.inject("trickle_head", method="PUT", delay=1.0)
    started = time.monotonic()
    try:
        assert lock.acquire(timeout=5)
        assert time.monotonic() - started < 1.0 + 3.0  # cut at request_timeout (a byte a second never ends); 3.5 s seen under load
        assert raw_read(f"s3://{bucket}/a.json")[0].token == lock.token
        assert [ex.status for ex in proxy.exchanges("PUT")].count(412) == 0, "the create was sent again"
    finally:
        lock.release()


def test_a_constructor_refuses_a_nonsense_request_timeout():
    with pytest.raises(ConfigurationError):
        S3Storage("ok-bucket", request_timeout=0)


def test_making_the_client_is_not_counted_against_the_first_request_deadline(bucket, monkeypatch):
    """botocore takes its time to make a client (it parses the S3 model: 0.2 s idle, up to 1.8 s on
    a loaded 2-core machine, measured), longer than a lock's requests may take at small ttls (0.3 s
    at lockutil.FAST). That is the SDK's own work, no I/O: a cold store's first request gets its
    whole deadline after it (before: cut by the deadline, with nothing stalled). Here the SDK is made
    3 s slower to make its client, as a loaded machine does; each request keeps a 2 s bound, which the
    suite's moto server (busy with every test before this one) meets, and the client alone would pass."""
    from handofflock.storage import s3_credentials

    made = s3_credentials.boto3_session

    def slow_to_make_clients(*args, **kwargs):
        session = made(*args, **kwargs)
        session.events.register("creating-client-class.s3", lambda **_: time.sleep(3.0))
        return session

    monkeypatch.setattr(s3_credentials, "boto3_session", slow_to_make_clients)
    store = S3Storage(bucket)
    started = time.monotonic()
    assert store.read("a.json", timeout=2.0) is None  # the client, the one-time probe's requests, the read
    assert time.monotonic() - started >= 3.0, "the client was made slowly"
