"""A GCE metadata server stand-in on 127.0.0.1, just enough for ``instance/preempted``.

It behaves as the real one does where the watcher cares: it answers only
requests carrying ``Metadata-Flavor: Google`` (403 otherwise), stamps replies
with the same header and an ``ETag``, and holds ``wait_for_change=true``
requests until the value changes from ``last_etag`` or ``timeout_sec`` passes.
``hang=True`` makes it accept connections and never answer (a slow server).
"""

from __future__ import annotations

import threading
import time
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
