#!/usr/bin/env python3
"""The network test bed's fenced resource: an HTTP server that accepts a write only with a token at
least as high as the highest it has accepted, and appends every decision to a history file.

Started by ``scripts/netbed.py`` inside a network namespace of its own (not meant to be run by hand):

    POST /write  {"writer": "p0", "token": 7, "op": "p0-3-c"}
        200 {"accepted": true}  or  409 {"accepted": false, "highest": 9}
    GET /health  200

Each decision is one JSON line ``{"seq", "t", "writer", "token", "op", "accepted"}``
appended (``O_APPEND``, one ``write`` per line) to ``--history`` before the reply
is sent, so an acknowledged write is always in the history. Decisions are
serialised by one mutex: the file's order is the order they were made.

``--bug accept-stale`` plants a broken fence (it accepts every token) so a test
can show the offline checker catches it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Fence:
    def __init__(self, history: str, bug: str | None) -> None:
        self.fd = os.open(history, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.bug = bug
        self.mutex = threading.Lock()
        self.highest: int | None = None
        self.seq = 0

    def decide(self, writer: str, token: int, op: str) -> tuple[bool, int | None]:
        with self.mutex:
            accepted = self.highest is None or token >= self.highest or self.bug == "accept-stale"
            if accepted and (self.highest is None or token > self.highest):
                self.highest = token
            self.seq += 1
            line = {"seq": self.seq, "t": time.time(), "writer": writer, "token": token, "op": op, "accepted": accepted}
            os.write(self.fd, json.dumps(line).encode() + b"\n")
            return accepted, self.highest


def handler(fence: Fence) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self.reply(200 if self.path == "/health" else 404, {"ok": self.path == "/health"})

        def do_POST(self) -> None:
            if self.path != "/write":
                self.reply(404, {})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                writer, token, op = str(body["writer"]), body["token"], str(body["op"])
                if not isinstance(token, int) or isinstance(token, bool):
                    raise TypeError("token must be an int")
            except (ValueError, KeyError, TypeError) as exc:
                self.reply(400, {"error": str(exc)})
                return
            accepted, highest = fence.decide(writer, token, op)
            self.reply(200 if accepted else 409, {"accepted": accepted, "highest": highest})

    return Handler


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--bug", choices=["accept-stale"])
    a = p.parse_args(argv)
    server = ThreadingHTTPServer(("0.0.0.0", a.port), handler(Fence(a.history, a.bug)))
    server.daemon_threads = True
    parent = os.getppid()

    def orphan_watch() -> None:  # never outlive the bed
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=orphan_watch, daemon=True).start()
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
