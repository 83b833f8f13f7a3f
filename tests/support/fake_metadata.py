"""Metadata server stand-ins on 127.0.0.1: GCE's ``instance/preempted``, AWS's spot notices, Azure's Scheduled Events.

Each behaves as the real one does where the watcher cares. GCE's
(:class:`FakeMetadataServer`) answers only
requests carrying ``Metadata-Flavor: Google`` (403 otherwise), stamps replies
with the same header and an ``ETag``, and holds ``wait_for_change=true``
requests until the value changes from ``last_etag`` or ``timeout_sec`` passes.
``hang=True`` makes it accept connections and never answer (a slow server).
AWS's and Azure's: see :class:`FakeAwsMetadataServer`, :class:`FakeAzureMetadataServer`.
"""

from __future__ import annotations

import json
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PATH = "/computeMetadata/v1/instance/preempted"


class FakeMetadataServer:
    def __init__(self, *, hang: bool = False, flavor_header: bool = True) -> None:
        self.hang = hang
        self.flavor_header = flavor_header
        self.value = "FALSE"
        self.etag = 1
        self.requests: list[tuple[str, str | None]] = []  # (path, Metadata-Flavor header sent)
        self.refused = 0
        self._cond = threading.Condition()
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                flavor = self.headers.get("Metadata-Flavor")
                with server._cond:
                    server.requests.append((self.path, flavor))
                if server.hang:
                    server._closing.wait(30)
                    return
                if flavor != "Google":
                    with server._cond:
                        server.refused += 1
                    self._reply(403, "Missing Metadata-Flavor:Google header.")
                    return
                parts = urlsplit(self.path)
                if parts.path != PATH:
                    self._reply(404, "not found")
                    return
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                if query.get("wait_for_change") == "true":
                    last = query.get("last_etag", str(server.etag))
                    deadline = time.monotonic() + float(query.get("timeout_sec", "300"))
                    with server._cond:
                        while str(server.etag) == last and not server._closing.is_set():
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            server._cond.wait(min(left, 0.05))
                self._reply(200, server.value)

            def _reply(self, status, body):
                data = body.encode()
                self.send_response(status)
                if server.flavor_header:
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("ETag", str(server.etag))
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def preempt(self) -> None:
        """Flip ``instance/preempted`` to TRUE, as GCE does ~30 s before stopping the VM."""
        with self._cond:
            self.value = "TRUE"
            self.etag += 1
            self._cond.notify_all()

    @property
    def waits(self) -> int:
        return sum("wait_for_change=true" in path for path, _ in self.requests)

    def __enter__(self) -> "FakeMetadataServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()


class _FakeCloud:
    """What the AWS and Azure stand-ins share: a threaded server on 127.0.0.1, a log, ``hang``.

    Every request is logged as ``(method, path, headers)`` before it is answered;
    ``hang=True`` accepts requests and never answers (a slow server).
    """

    def __init__(self, *, hang: bool = False) -> None:
        self.hang = hang
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._cond = threading.Condition()
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                with server._cond:
                    server.requests.append((self.command, self.path, dict(self.headers)))
                if server.hang:
                    server._closing.wait(30)
                    return
                with server._cond:
                    status, headers, text = server.answer(self.command, self.path, self.headers, body)
                data = text.encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = _any

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def answer(self, method: str, path: str, headers, body: str) -> tuple[int, dict[str, str], str]:
        raise NotImplementedError

    def count(self, method: str, path: str) -> int:
        with self._cond:
            return sum(m == method and p.startswith(path) for m, p, _ in self.requests)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()


class FakeAwsMetadataServer(_FakeCloud):
    """EC2's instance metadata service as IMDSv2 runs it, for spot notices.

    ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``
    (1 to 21600) hands out a token; every GET must carry a live one in
    ``X-aws-ec2-metadata-token`` (401 otherwise). ``spot/instance-action`` and
    ``events/recommendations/rebalance`` are 404 until :meth:`notice` and
    :meth:`recommend_rebalance`.
    """

    ACTION = "/latest/meta-data/spot/instance-action"
    REBALANCE = "/latest/meta-data/events/recommendations/rebalance"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.tokens: set[str] = set()
        self.action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None

    def notice(self, action: str = "terminate", at: float | None = None) -> None:
        """Post the spot interruption notice: ``action`` at ``at`` (Unix time; default in two minutes)."""
        at = time.time() + 120 if at is None else at
        with self._cond:
            self.action = {"action": action, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))}

    def recommend_rebalance(self) -> None:
        with self._cond:
            self.rebalance = {"noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def expire_tokens(self) -> None:
        with self._cond:
            self.tokens.clear()

    def answer(self, method, path, headers, body):
        plain = {"Content-Type": "text/plain", "Server": "EC2ws"}
        if method == "PUT" and path == "/latest/api/token":
            ttl = headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return 400, plain, "Bad Request"
            token = f"token-{len(self.tokens)}-{time.monotonic_ns()}"
            self.tokens.add(token)
            return 200, dict(plain, **{"X-aws-ec2-metadata-token-ttl-seconds": ttl}), token
        if method != "GET":
            return 405, plain, "Method Not Allowed"
        if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return 401, plain, "Unauthorized"
        doc = {self.ACTION: self.action, self.REBALANCE: self.rebalance}.get(path)
        if doc is None:
            return 404, dict(plain, **{"Content-Type": "text/html"}), "<html>404 - Not Found</html>"
        return 200, plain, json.dumps(doc)


class FakeAzureMetadataServer(_FakeCloud):
    """Azure's instance metadata service, for Scheduled Events.

    Every request must carry ``Metadata: true`` and an ``api-version`` (400
    otherwise). ``GET /metadata/scheduledevents`` lists what :meth:`schedule`
    added; a POST to it (an acknowledgement, ``StartRequests``) is recorded in
    ``acks``. ``/metadata/instance/compute/name`` answers ``vm_name``.
    """

    def __init__(self, *, vm_name: str = "train-vm-0", **kw) -> None:
        super().__init__(**kw)
        self.vm_name = vm_name
        self.incarnation = 1
        self.events: list[dict] = []
        self.acks: list[str] = []

    def schedule(self, event_type: str = "Preempt", not_before: float | None = None, resources=None,
                 status: str = "Scheduled") -> dict:
        """Add an event (for this VM unless ``resources`` says otherwise), ``not_before`` in Unix time."""
        not_before = time.time() + 30 if not_before is None else not_before
        event = {
            "EventId": f"event-{len(self.events) + 1}",
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": [self.vm_name] if resources is None else list(resources),
            "EventStatus": status,
            "NotBefore": formatdate(not_before, usegmt=True),
            "Description": "",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
        with self._cond:
            self.events.append(event)
            self.incarnation += 1
        return event

    def answer(self, method, path, headers, body):
        parts = urlsplit(path)
        query = parse_qs(parts.query)
        as_json = {"Content-Type": "application/json; charset=utf-8"}
        if headers.get("Metadata") != "true":
            return 400, as_json, json.dumps({"error": "Bad request. Required metadata header not specified"})
        if "api-version" not in query:
            return 400, as_json, json.dumps({"error": "Bad request. api-version was not specified in the request"})
        if parts.path == "/metadata/scheduledevents":
            if method == "POST":
                self.acks.append(body)
                return 200, as_json, ""
            return 200, as_json, json.dumps({"DocumentIncarnation": self.incarnation, "Events": self.events})
        if parts.path == "/metadata/instance/compute/name" and method == "GET":
            return 200, {"Content-Type": "text/plain; charset=utf-8"}, self.vm_name
        return 404, as_json, json.dumps({"error": "Not found"})


def let_run(clock, seconds: float) -> None:
    """Let the one thread waiting on ``clock`` (a fresh FakeClock) live ``seconds`` of its time, then leave it parked.

    Each wait it begins passes at once, so only its own waits make time go by (a connection refused takes none).
    """
    passed, begun = 0.0, 0
    while passed < seconds:
        begun += 1
        clock.wait_for_waits(begun)
        passed += clock.waits[begun - 1]
        clock.advance(clock.waits[begun - 1])
    clock.wait_for_waits(begun + 1)
