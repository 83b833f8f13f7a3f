"""moto's S3 server with one request at a time: ``python -m handofflock.testing._moto_serial HOST PORT``.

moto's own server (``python -m moto.server``) is threaded, and its S3 backend
checks ``If-Match`` / ``If-None-Match`` and then stores the object in two steps
with no lock between them: two racing conditional PUTs can both win (seen in
1 of 2 runs of a 16-thread race under load). Real S3 makes a conditional write
atomic, and the lock's tests rest on that. This launcher serves the same moto
application, still threaded (so keep-alive connections do not queue behind one
another), but runs each request's whole application call, body included,
under one lock, so every request is atomic as on S3.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any


class OneAtATime:
    """A WSGI application that runs ``app`` for one request at a time, body included."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            result = self.app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


def main(argv: list[str]) -> None:
    host, port = argv[0], int(argv[1])
    os.environ.setdefault("MOTO_PORT", str(port))
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, OneAtATime(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1:])
