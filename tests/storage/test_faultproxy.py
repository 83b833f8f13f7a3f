"""FaultProxy: each fault does what it says, checked against the emulator's real state.

The proxy is test infrastructure the lock's fault tests rely on, so it is
tested like product code: a fault that claims "applied, reply lost" must have
reached the emulator, and "reset before forwarding" must not have.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
import uuid

import pytest
import requests

from handofflock.core.errors import StorageError, TransientStorageError
from handofflock.storage.gcs import GCSStorage
from handofflock.testing.faultproxy import FaultProxy, multipart_data


@pytest.fixture
def bucket(gcs_emulator):
    name = f"p-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(name)
    return name


@pytest.fixture
def proxy(gcs_emulator):
    with FaultProxy(gcs_emulator.url, seed=7, lifetime=120) as p:
        yield p


@pytest.fixture
def via(proxy, bucket):
    """A store that talks to the emulator through the proxy."""
    with proxy.env():
        store = GCSStorage(bucket, timeout=(1.0, 2.0))
    yield store
    store.close()


@pytest.fixture
def direct(bucket):
    """A store that talks to the emulator directly: the ground truth."""
    store = GCSStorage(bucket)
    yield store
    store.close()


def test_it_forwards_every_operation_over_one_kept_alive_connection(proxy, via, direct):
    generation = via.write("k/a.json", b'{"n":1}', if_generation_match=0)
    assert via.read("k/a.json") == (b'{"n":1}', generation) == direct.read("k/a.json")
    assert via.list("k/") == {"k/a.json": generation}
    via.delete("k/a.json", if_generation_match=generation)
    assert direct.read("k/a.json") is None
    stats = proxy.stats()
    assert stats["requests"] == stats["forwarded"] == 4
    assert stats["connections"] == 1
    assert sum(stats["faults"].values()) == 0
    assert [e.status for e in proxy.history] == [200, 200, 200, 200]


def ok_server(served: list[str], idle_timeout: float | None = None) -> http.server.ThreadingHTTPServer:
    """A keep-alive HTTP/1.1 server on loopback, serving "ok" to every GET and noting its path in ``served``;
    with ``idle_timeout`` it closes a connection that sat idle that long. Started; the caller shuts it down."""

    class Ok(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = idle_timeout

        def do_GET(self):
            served.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_request_after_the_server_closed_the_idle_connection_goes_on_a_new_one():
    """A server that closes a kept-alive connection once it has sat idle (gunicorn, which serves
    storage-testbench, does after 2 s) must still get the client's next request: the proxy opens
    a new connection for it rather than dropping it unsent."""
    served: list[str] = []
    server = ok_server(served, idle_timeout=0.2)  # the idle connection is closed after 0.2 s
    try:
        with FaultProxy(f"http://127.0.0.1:{server.server_address[1]}", lifetime=30) as p, requests.Session() as client:
            assert client.get(p.url + "/first", timeout=5).text == "ok"
            time.sleep(0.6)  # the server has closed its side of the proxy's connection
            assert client.get(p.url + "/second", timeout=5).text == "ok"
            assert served == ["/first", "/second"]
            assert [e.status for e in p.history] == [200, 200]
    finally:
        server.shutdown()
        server.server_close()


def test_a_kept_alive_connection_is_reused_in_a_process_with_more_than_1024_files_open():
    """The proxy's look at an idle upstream connection works for any descriptor: select() refuses one past
    FD_SETSIZE (1024), and every request after the first on a kept-alive connection was dropped unsent."""
    import os
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"needs more than 1024 open files (limit {soft})")
    served: list[str] = []
    ballast = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the sockets opened next are past 1024
    server = ok_server(served)
    try:
        with FaultProxy(f"http://127.0.0.1:{server.server_address[1]}", lifetime=30) as p, requests.Session() as client:
            assert client.get(p.url + "/first", timeout=5).text == "ok"
            assert client.get(p.url + "/second", timeout=5).text == "ok"
            assert served == ["/first", "/second"]
    finally:
        server.shutdown()
        server.server_close()
        for fd in ballast:
            os.close(fd)


def test_drop_reply_applies_the_write_and_the_client_hears_an_ambiguous_failure(proxy, via, direct):
    proxy.inject("drop_reply", method="POST")
    with pytest.raises(TransientStorageError) as info:
        via.write("a.json", b'{"landed":true}', if_generation_match=0)
    assert info.value.ambiguous is True
    assert direct.read("a.json")[0] == b'{"landed":true}'  # applied upstream
    assert proxy.stats()["faults"]["drop_reply"] == 1
    assert proxy.stats()["forwarded"] == 1
    assert via.read("a.json")[0] == b'{"landed":true}'  # the next request gets a new connection


def test_reset_before_forwarding_never_reaches_the_server(proxy, via, direct):
    proxy.inject("reset", method="POST")
    with pytest.raises(TransientStorageError) as info:
        via.write("a.json", b"{}", if_generation_match=0)
    assert info.value.ambiguous is True  # the client cannot know it was not applied
    assert direct.read("a.json") is None
    assert proxy.stats()["forwarded"] == 0 and proxy.stats()["faults"]["reset"] == 1


@pytest.mark.parametrize("kind, error, ambiguous", [("429", TransientStorageError, False), ("503", TransientStorageError, True)])
def test_429_and_503_are_answered_by_the_proxy_with_retry_after(proxy, via, direct, kind, error, ambiguous):
    proxy.inject(kind, method="POST", retry_after=3)
    with pytest.raises(error) as info:
        via.write("a.json", b"{}", if_generation_match=0)
    assert info.value.status == int(kind) and info.value.ambiguous is ambiguous
    assert info.value.retry_after == 3.0
    assert direct.read("a.json") is None
    assert proxy.stats()["answered"] == 1 and proxy.stats()["forwarded"] == 0
    via.write("a.json", b"{}", if_generation_match=0)  # the connection stays usable
    assert proxy.stats()["connections"] == 1


def test_409_is_answered_by_the_proxy_as_gcs_words_a_conflict_and_is_not_forwarded(proxy, via, direct):
    proxy.inject("409", method="POST")
    with pytest.raises(TransientStorageError) as info:
        via.write("a.json", b"{}", if_generation_match=0)
    assert info.value.status == 409 and info.value.ambiguous is False
    assert "conflicting concurrent change" in str(info.value)
    assert direct.read("a.json") is None
    assert proxy.stats()["answered"] == 1 and proxy.stats()["forwarded"] == 0


# 5 ms per byte of the 7-byte body is well above a local round trip; the whole reply at 1 ms too.
@pytest.mark.parametrize("kind, head_at_once, pause", [("trickle", True, 0.005), ("trickle_head", False, 0.001)])
def test_a_trickled_reply_arrives_whole_one_byte_per_pause(proxy, bucket, direct, kind, head_at_once, pause):
    """The reply is forwarded unchanged, only slowly: the head at once (trickle) or not (trickle_head),
    then one byte per `delay`. Read with a raw socket to see when each byte comes."""
    generation = direct.write("a.json", b'{"n":1}', if_generation_match=0)
    proxy.inject(kind, method="GET", delay=pause)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(
            f"GET /download/storage/v1/b/{bucket}/o/a.json?alt=media HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        )
        first = sock.recv(65536)
        chunks = [first]
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        elapsed = time.monotonic() - started
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") and body == b'{"n":1}'
    assert f"x-goog-generation: {generation}".lower().encode() in head.lower()
    if head_at_once:  # the first read has the whole head (and maybe a byte or two of the body)
        assert first.startswith(head + b"\r\n\r\n")
    else:
        assert len(first) < len(head) // 2
    trickled = len(body) if head_at_once else len(reply)
    assert elapsed >= (trickled - 1) * pause * 0.9
    assert proxy.stats()["faults"][kind] == 1 and proxy.stats()["forwarded"] == 1


def test_a_trickle_needs_a_pause(proxy):
    with pytest.raises(ValueError, match="delay > 0"):
        proxy.inject("trickle")


def test_403_is_a_permanent_storage_error(proxy, via, direct):
    proxy.inject("403", method="POST")
    with pytest.raises(StorageError) as info:
        via.write("a.json", b"{}", if_generation_match=0)
    assert type(info.value) is StorageError and "roles/storage.objectUser" in str(info.value)
    assert direct.read("a.json") is None


def test_refused_connections_are_known_not_to_be_sent_and_the_port_comes_back(proxy, via, direct):
    via.write("a.json", b"{}", if_generation_match=0)  # a kept-alive connection exists
    port = proxy.port
    proxy.refuse_connections(0.6)
    started = time.monotonic()
    with pytest.raises(TransientStorageError) as info:
        via.write("b.json", b"{}", if_generation_match=0)
    assert info.value.ambiguous is False
    assert isinstance(info.value.__cause__, requests.exceptions.ConnectionError)
    assert direct.read("b.json") is None
    while time.monotonic() - started < 0.6:
        time.sleep(0.05)
    time.sleep(0.3)  # the accept loop notices the window is over within 0.2 s
    via.write("b.json", b"{}", if_generation_match=0)
    assert proxy.port == port and proxy.stats()["faults"]["refuse"] == 1


def test_a_delay_longer_than_the_read_timeout_is_an_ambiguous_timeout_that_was_applied(proxy, bucket, direct):
    with proxy.env():
        impatient = GCSStorage(bucket, timeout=(1.0, 0.2))
    proxy.inject("delay", method="POST", delay=0.4)
    with pytest.raises(TransientStorageError) as info:
        impatient.write("a.json", b"{}", if_generation_match=0)
    assert info.value.ambiguous is True
    assert isinstance(info.value.__cause__, requests.exceptions.ReadTimeout)
    deadline = time.monotonic() + 5
    while direct.read("a.json") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert direct.read("a.json") is not None  # forwarded once the delay was over


def test_a_short_delay_only_slows_the_request(proxy, via):
    proxy.inject("delay", method="GET", delay=0.3)
    started = time.monotonic()
    assert via.read("missing.json") is None
    assert time.monotonic() - started >= 0.3


def test_rules_match_method_path_body_and_predicate_and_fire_the_given_number_of_times(proxy, via, direct):
    skipped = proxy.inject("503", method="GET")  # never matches a POST
    by_body = proxy.inject("reset", method="POST", body=b'"target"', times=2)
    by_when = proxy.inject("429", when=lambda ex: ex.query.get("ifGenerationMatch") == "0" and "x.json" in ex.body.decode())
    via.write("a.json", b'{"other":1}', if_generation_match=0)
    for _ in range(2):
        with pytest.raises(TransientStorageError):
            via.write("b.json", b'{"target":1}', if_generation_match=0)
    via.write("b.json", b'{"target":1}', if_generation_match=0)  # the rule is spent
    with pytest.raises(TransientStorageError) as info:
        via.write("x.json", b"{}", if_generation_match=0)
    assert info.value.status == 429
    assert (skipped.fired, by_body.fired, by_when.fired) == (0, 2, 1)
    assert direct.read("b.json")[0] == b'{"target":1}'


def test_an_upload_s_object_bytes_can_be_read_from_the_exchange(proxy, via):
    via.write("a.json", b'{"ownerId":"me"}', if_generation_match=0)
    (upload,) = proxy.exchanges("POST")
    assert upload.upload_data() == b'{"ownerId":"me"}'
    assert upload.query["ifGenerationMatch"] == "0"
    assert multipart_data(b"not multipart", "application/json") is None


def test_chaos_draws_reproducibly_from_its_seed(gcs_emulator, bucket):
    def run(seed):
        with FaultProxy(gcs_emulator.url, lifetime=60) as p:
            p.chaos({"503": 0.2, "429": 0.1, "reset": 0.1}, seed=seed)
            with p.env():
                store = GCSStorage(bucket, timeout=(1.0, 2.0))
            outcome = []
            for _ in range(60):
                try:
                    store.read("nothing.json")
                    outcome.append("ok")
                except TransientStorageError as exc:
                    outcome.append(str(exc.status))
            store.close()
            return outcome, p.stats()["faults"]

    first, faults = run(11)
    assert first == run(11)[0]
    assert first != run(12)[0]
    assert faults["503"] > 0 and faults["429"] > 0 and faults["reset"] > 0
    assert first.count("ok") == 60 - faults["503"] - faults["429"] - faults["reset"]


def test_it_listens_on_loopback_only_and_stops_itself_after_its_lifetime(gcs_emulator):
    proxy = FaultProxy(gcs_emulator.url, lifetime=0.5).start()
    started = time.monotonic()
    try:
        assert proxy.url.startswith("http://127.0.0.1:")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=1):
            pass
        while time.monotonic() - started < 1.0:  # gone by then; looked for meanwhile, not slept through
            try:
                socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.02)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=1)
    finally:
        proxy.stop()
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("http://10.0.0.1:4443")
