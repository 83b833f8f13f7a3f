"""A credentials refresh is held to request_timeout like the request it comes before (issue 25).

google-auth's AuthorizedSession refreshes an expired token through a session of
its own, inside our request; a token endpoint (metadata server, STS, workload
identity) that trickles its reply kept a renewal waiting as long as it liked
(9.3 s measured with request_timeout=1). Here a token endpoint on 127.0.0.1
sends its reply one byte every 0.2 s (about 15 s in all).
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import google.auth
import pytest
from google.oauth2.credentials import Credentials

from handofflock import TransientStorageError
from handofflock.storage.gcs import GCSStorage

TOKEN = json.dumps({"access_token": "ya29.slow", "expires_in": 3600, "token_type": "Bearer"}).encode()


class Trickling(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(TOKEN)))
        self.end_headers()
        try:
            for i in range(len(TOKEN)):
                self.wfile.write(TOKEN[i : i + 1])
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass  # the client gave up: that is the point

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def token_endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickling)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)  # a quick shutdown()
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()
    server.server_close()


def test_a_token_endpoint_that_trickles_cannot_hold_a_request_past_request_timeout(token_endpoint, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    credentials = Credentials(
        token=None, refresh_token="r", client_id="c", client_secret="s", token_uri=token_endpoint
    )
    monkeypatch.setattr(google.auth, "default", lambda *a, **kw: (credentials, "project"))
    store = GCSStorage("handofflock-test", timeout=(1.0, 1.0), request_timeout=0.25)
    started = time.monotonic()
    with pytest.raises(TransientStorageError):
        store.read("locks/job.json")
    elapsed = time.monotonic() - started
    assert elapsed < 0.25 + 1.5, f"the refresh held the read {elapsed:.1f} s"
