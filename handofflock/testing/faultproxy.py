"""A fault-injecting HTTP/1.1 proxy for 127.0.0.1, to put between a GCS client and an emulator.

A lock is only as good as its behaviour when the network misbehaves, and the
interesting failures are the ones a mock cannot produce: a write that reached
the server and was applied while its reply was lost. :class:`FaultProxy` sits
between google-cloud-storage (or anything else speaking HTTP/1.1) and
fake-gcs-server, forwards requests one by one (keep-alive aware), and on
request injects one of these faults:

==============  ==============================================================
``refuse``      connections are refused for a while (the listener is closed):
                the client knows nothing was sent
``delay``       the request is held back before it is forwarded
``reset``       the request is read, then the connection is reset; nothing is
                forwarded (the client cannot tell it was not applied)
``drop_reply``  the request is forwarded and applied, the reply is read from
                upstream and thrown away, and the connection is reset
``429``         answered by the proxy: too many requests, with ``Retry-After``
``503``         answered by the proxy: service unavailable (not forwarded)
``403``         answered by the proxy: permission denied (a permanent error)
``retention``   answered by the proxy: 403, worded as GCS refuses to overwrite an
                object under a bucket retention policy (S3: object lock)
``409``         answered by the proxy: conflict, as GCS answers a change that
                lost to a concurrent one (not forwarded, so not applied)
``trickle``     the request is forwarded and applied; the reply's head is sent
                at once, then its body one byte every ``delay`` seconds
``trickle_head`` as ``trickle``, but the reply is trickled from its first byte
                (a server slow to send even its status line and headers)
``strip_conditions`` the request is forwarded with its ``If-Match`` and
                ``If-None-Match`` headers removed, as by an S3-compatible
                store that ignores them (and applied unconditionally)
==============  ==============================================================

Faults are scheduled programmatically: :meth:`FaultProxy.inject` for the next
N requests that match a method, a path substring, a body substring or a
predicate; :meth:`FaultProxy.chaos` for random faults drawn from a seeded RNG;
:meth:`FaultProxy.refuse_connections` for a refusal window. Everything is
counted (:meth:`FaultProxy.stats`) and the recent exchanges are kept
(:attr:`FaultProxy.history`).

>>> from handofflock.testing import FakeGCSServer, FaultProxy
>>> with FakeGCSServer() as gcs, FaultProxy(gcs.url) as proxy, proxy.env():
...     gcs.create_bucket("locks")
...     proxy.inject("drop_reply", method="POST")      # the next write lands, its reply is lost
...     lock = HandoffLock("gs://locks/a.json")          # talks to the emulator through the proxy

The proxy only listens on 127.0.0.1, runs as daemon threads of the calling
process, and stops itself after ``lifetime`` seconds.

HTTP parsing is in :mod:`._http11`. Test tooling, not part of the runtime.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import http
import json
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ..storage.base import MAX_HEADER, S3_MAGIC, S3_PROBE_MARK, parse_header
from ._http11 import Buffer, Closed, edit_head, multipart_data, parse_reply_head, parse_request_head

__all__ = ["FAULT_KINDS", "Exchange", "FaultProxy", "Rule", "multipart_data"]

#: The faults the proxy answers itself, without forwarding the request.
_ANSWERED = ("429", "503", "403", "409", "retention")
#: The faults that send the reply slowly, one byte at a time.
_TRICKLES = ("trickle", "trickle_head")
#: The faults that act on one request (``refuse`` acts on connections).
REQUEST_FAULTS = ("delay", "reset", "drop_reply", *_ANSWERED, *_TRICKLES, "strip_conditions")
#: Every fault the proxy can inject.
FAULT_KINDS = ("refuse", *REQUEST_FAULTS)
#: The request headers ``strip_conditions`` removes.
_CONDITIONS = (b"if-match", b"if-none-match")

#: The replies the proxy gives itself, by dialect and fault: (status, error code, message). GCS's are worded as
#: its JSON API words them (cloud.google.com/storage/docs/json_api/v1/status-codes; a retention policy's refusal
#: as seen in the wild), S3's as docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html words them.
_ANSWERS = {
    ("gcs", "429"): (429, "rateLimitExceeded", "The object exceeded the rate limit for object mutation operations."),
    ("gcs", "503"): (503, "backendError", "Backend Error."),
    ("gcs", "403"): (403, "forbidden", "injected@faultproxy does not have storage.objects.create access."),
    ("gcs", "409"): (
        409,
        "conflict",
        "The change failed to commit due to a conflicting concurrent change to the same resource.",
    ),
    ("gcs", "retention"): (
        403,
        "retentionPolicyNotMet",
        "Object 'bucket/locks/job.json' is subject to bucket's retention policy or object retention and cannot be "
        "deleted or overwritten until 2031-09-20T12:18:15.93713-07:00",
    ),
    ("s3", "429"): (429, "TooManyRequests", "Please reduce your request rate."),
    ("s3", "503"): (503, "SlowDown", "Please reduce your request rate."),
    ("s3", "403"): (403, "AccessDenied", "Access Denied"),
    ("s3", "retention"): (403, "AccessDenied", "Access Denied because object protected by object lock."),
    ("s3", "409"): (
        409,
        "ConditionalRequestConflict",
        "A conflicting operation occurred. If using PutObject you can retry the request.",
    ),
}
_DIALECTS = ("gcs", "s3")


@dataclasses.dataclass
class Exchange:
    """One request as the proxy saw it, and what became of it."""

    method: str
    path: str
    query: dict[str, str]
    body: bytes
    content_type: str
    started: float
    fault: str | None = None
    status: int | None = None  # the status the client got; None if it got no reply
    headers: dict[str, str] = dataclasses.field(default_factory=dict)  # the request's, names in lowercase

    def upload_data(self) -> bytes | None:
        """The object's bytes: of a multipart upload (GCS, the second part), or of an S3
        ``PutObject`` of a live object in the S3 backend's envelope. Else None."""
        if self.method == "PUT":
            header = parse_header(S3_MAGIC, self.body[:MAX_HEADER], len(self.body))
            return None if header is None or header.deleted else self.body[header.offset :]
        return multipart_data(self.body, self.content_type)

    def aimed_at(self, method: str | None, path: str | None, *, probes: bool) -> bool:
        """Whether this request has ``method`` (any if None) and ``path`` in its path; a probe only if ``probes``."""
        return (
            (probes or S3_PROBE_MARK not in self.path)
            and (method is None or self.method == method.upper())
            and (path is None or path in self.path)
        )


@dataclasses.dataclass
class Rule:
    """Inject ``kind`` into the next ``times`` requests that match (see :meth:`FaultProxy.inject`)."""

    kind: str
    method: str | None = None
    path: str | None = None
    body: bytes | None = None
    when: Callable[[Exchange], bool] | None = None
    times: int = 1
    delay: float = 0.0
    retry_after: float | None = None
    probes: bool = False
    fired: int = 0

    def matches(self, ex: Exchange) -> bool:
        return (
            not self.spent
            and ex.aimed_at(self.method, self.path, probes=self.probes)
            and (self.body is None or self.body in ex.body)
            and (self.when is None or bool(self.when(ex)))
        )

    @property
    def spent(self) -> bool:
        return self.fired >= self.times


@dataclasses.dataclass
class _Chaos:
    rng: random.Random
    rates: dict[str, float]
    method: str | None
    path: str | None
    delay: tuple[float, float]
    retry_after: tuple[float, float]
    refuse_rate: float
    refuse_window: tuple[float, float]

    def draw(self, ex: Exchange) -> Rule | None:
        """A fault for ``ex`` drawn from the rates (probes are left alone), with its pause or its Retry-After."""
        if not ex.aimed_at(self.method, self.path, probes=False):
            return None
        draw = self.rng.random()
        for kind, p in self.rates.items():
            if draw < p:
                delay = self.rng.uniform(*self.delay) if kind in ("delay", *_TRICKLES) else 0.0
                retry_after = round(self.rng.uniform(*self.retry_after), 1) if kind in ("429", "503") else None
                return Rule(kind, delay=delay, retry_after=retry_after)
            draw -= p
        return None


@dataclasses.dataclass
class _Stats:
    connections: int = 0
    requests: int = 0
    forwarded: int = 0
    answered: int = 0  # answered by the proxy itself (429/503/403)
    faults: dict[str, int] = dataclasses.field(default_factory=lambda: {k: 0 for k in FAULT_KINDS})
    refused_seconds: float = 0.0


def _error_reply(dialect: str, rule: Rule, *, close: bool) -> bytes:
    status, code, message = _ANSWERS[dialect, rule.kind]
    message += " (injected by FaultProxy)"
    if dialect == "s3":
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            "<RequestId>faultproxy</RequestId></Error>"
        ).encode()
        content_type = "application/xml"
    else:
        errors = [{"message": message, "domain": "global", "reason": code}]
        body = json.dumps({"error": {"code": status, "message": message, "errors": errors}}).encode()
        content_type = "application/json; charset=UTF-8"
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if rule.retry_after is not None and rule.kind in ("429", "503"):
        lines.append(f"Retry-After: {rule.retry_after:g}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


HOST = "127.0.0.1"  # never anything else: the emulators and the proxy have no authentication


@contextlib.contextmanager
def environ(**values: str | None) -> Iterator[None]:
    """Set (or, for None, unset) environment variables inside the block, then restore them."""

    def put(settings: dict[str, str | None]) -> None:
        for name, value in settings.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    previous = {name: os.environ.get(name) for name in values}
    put(values)
    try:
        yield
    finally:
        put(previous)


def emulator_env(url: str) -> contextlib.AbstractContextManager[None]:
    """Set ``STORAGE_EMULATOR_HOST`` to ``url`` inside the block, then restore it."""
    return environ(STORAGE_EMULATOR_HOST=url)


_IO_TIMEOUT = 60.0  # no read from a peer blocks longer than this


class FaultProxy:
    """A fault-injecting HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream``.

    ``upstream`` is ``http://127.0.0.1:PORT`` (or ``127.0.0.1:PORT``). ``seed``
    seeds the RNG used by :meth:`chaos`. The proxy stops itself after
    ``lifetime`` seconds; ``history`` exchanges are kept for inspection.
    Thread-safe. No sockets are opened until :meth:`start`.
    """

    def __init__(
        self,
        upstream: str,
        *,
        seed: int | None = None,
        lifetime: float = 3600.0,
        history: int = 10_000,
        dialect: str = "gcs",
    ) -> None:
        parts = urlsplit(upstream if "://" in upstream else f"http://{upstream}")
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"upstream must be http://HOST:PORT, got {upstream!r}")
        if parts.hostname not in (HOST, "localhost"):
            raise ValueError(f"the proxy only forwards to loopback, not {parts.hostname!r}")
        if not lifetime > 0:
            raise ValueError(f"lifetime must be > 0, got {lifetime}")
        if dialect not in _DIALECTS:
            raise ValueError(f"dialect must be one of {sorted(_DIALECTS)}, got {dialect!r}")
        self.upstream = (HOST, parts.port)
        #: How the proxy words the errors it answers itself: "gcs" (JSON API) or "s3" (S3's XML).
        self.dialect = dialect
        self.lifetime = float(lifetime)
        self.port: int | None = None
        self._seed = seed
        self.history: collections.deque[Exchange] = collections.deque(maxlen=history)
        self._rules: list[Rule] = []
        self._chaos: _Chaos | None = None
        self._stats = _Stats()
        self._mutex = threading.Lock()
        self._listener: socket.socket | None = None
        self._placeholder = False  # the listener is a bound, non-listening socket (refusing)
        self._listener_changed = threading.Condition(self._mutex)
        self._refused_until = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: dict[int, tuple[socket.socket, list[bool]]] = {}  # id -> (socket, [idle])

    # -- addresses ------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the value for ``STORAGE_EMULATOR_HOST``."""
        if self.port is None:
            raise RuntimeError("the fault proxy is not running; call start() first")
        return f"http://{HOST}:{self.port}"

    @contextlib.contextmanager
    def env(self) -> Iterator[FaultProxy]:
        """Point ``STORAGE_EMULATOR_HOST`` at the proxy inside the block, then restore it.

        A ``GCSStorage`` remembers the emulator host it was created under, so
        stores made inside the block keep talking through the proxy after it.
        """
        with emulator_env(self.url):
            yield self

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> FaultProxy:
        if self._listener is not None or self._stop.is_set():
            raise RuntimeError("a FaultProxy can be started once")
        listener = _listening_socket(0)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept_loop, "accept")
        self._spawn(self._lifetime_watch, "lifetime")
        return self

    def stop(self) -> None:
        """Close the listener and every connection. Idempotent."""
        self._stop.set()
        with self._mutex:
            listener, self._listener = self._listener, None
            conns = [s for s, _ in self._conns.values()]
            self._listener_changed.notify_all()
        if listener is not None:
            with contextlib.suppress(OSError):  # wakes the accept loop now, not at its next 0.2 s timeout
                listener.shutdown(socket.SHUT_RD)
            listener.close()
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(2.0)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- scheduling faults ----------------------------------------------------

    def inject(
        self,
        kind: str,
        *,
        method: str | None = None,
        path: str | None = None,
        body: bytes | str | None = None,
        when: Callable[[Exchange], bool] | None = None,
        times: int = 1,
        delay: float = 0.0,
        retry_after: float | None = None,
        probes: bool = False,
    ) -> Rule:
        """Inject ``kind`` into the next ``times`` requests matching every criterion given.

        ``method`` is compared exactly, ``path`` and ``body`` as substrings,
        ``when`` is called with the :class:`Exchange`. ``delay`` is the pause of
        a ``delay`` fault, and the pause before each byte of a trickled reply;
        ``retry_after`` the header of a ``429`` or ``503``. The S3 backend's
        probe of a store's conditions (a scratch key beside the lock's, once per
        store) is left alone unless ``probes`` is true, and by :meth:`chaos`
        always: a fault meant for the lock's first write must reach it.
        Rules are tried in the order they were added; the first that matches fires.
        Returns the rule: ``rule.fired`` counts its firings.
        """
        if kind not in REQUEST_FAULTS:
            raise ValueError(
                f"unknown request fault {kind!r}; choose from {REQUEST_FAULTS} (refuse: refuse_connections())"
            )
        if kind in ("delay", *_TRICKLES) and not delay > 0:
            raise ValueError(f"a {kind} fault needs delay > 0")
        body = body.encode() if isinstance(body, str) else body
        rule = Rule(kind, method, path, body, when, times=times, delay=delay, retry_after=retry_after, probes=probes)
        with self._mutex:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Drop every scheduled rule and stop chaos."""
        with self._mutex:
            self._rules.clear()
            self._chaos = None

    def chaos(
        self,
        rates: dict[str, float],
        *,
        seed: int | None = None,
        method: str | None = None,
        path: str | None = None,
        delay: tuple[float, float] = (0.05, 1.0),
        retry_after: tuple[float, float] = (0.0, 1.0),
        refuse_window: tuple[float, float] = (0.05, 0.5),
    ) -> None:
        """Inject random faults: ``rates`` maps a fault kind to its probability per request.

        ``refuse`` is a rate per second instead: refusal windows of
        ``refuse_window`` seconds start at random. ``method``/``path`` restrict
        which requests may be hit. The RNG is seeded with ``seed`` (or the
        proxy's seed), so the sequence of draws is reproducible; which request
        gets which draw depends on the order requests arrive in.
        """
        unknown = set(rates) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; choose from {FAULT_KINDS}")
        per_request = {k: float(v) for k, v in rates.items() if k != "refuse" and v > 0}
        if sum(per_request.values()) > 1:
            raise ValueError("the per-request fault probabilities add up to more than 1")
        rng, refuse_rate = random.Random(self._seed if seed is None else seed), float(rates.get("refuse", 0.0))
        chaos = _Chaos(rng, per_request, method, path, delay, retry_after, refuse_rate, refuse_window)
        with self._mutex:
            self._chaos = chaos
        if chaos.refuse_rate > 0:
            self._spawn(lambda: self._refusal_loop(chaos), "refusals")

    def refuse_connections(self, seconds: float) -> None:
        """Refuse new connections for ``seconds`` (the listener is closed), starting now.

        Idle keep-alive connections are closed, and replies sent during the
        window carry ``Connection: close``, so a client's next request needs a
        new connection and is refused. Requests on connections already busy
        are served.
        """
        if not seconds > 0:
            raise ValueError("seconds must be > 0")
        with self._mutex:
            if self._listener is None:
                return
            now = time.monotonic()
            self._stats.faults["refuse"] += 1
            self._stats.refused_seconds += max(0.0, now + seconds - max(now, self._refused_until))
            self._refused_until = max(self._refused_until, now + seconds)
            self._close_listener_locked()
            idle = [s for s, state in self._conns.values() if state[0]]
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- what happened ----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counts so far: connections, requests, forwarded, answered, faults by kind."""
        with self._mutex:
            counts = dataclasses.asdict(self._stats)
        counts["refused_seconds"] = round(counts["refused_seconds"], 3)
        return counts

    def exchanges(self, method: str | None = None, path: str | None = None, *, probes: bool = False) -> list[Exchange]:
        """The kept exchanges, optionally only those with ``method`` and ``path`` in their path.

        The S3 backend's probe of the store's conditions (once per store, see
        :meth:`inject`) is left out unless ``probes``; :attr:`history` has everything.
        """
        with self._mutex:
            return [e for e in self.history if e.aimed_at(method, path, probes=probes)]

    def __repr__(self) -> str:
        where = self.url if self.port is not None and not self._stop.is_set() else "stopped"
        return f"FaultProxy({where} -> {self.upstream[0]}:{self.upstream[1]})"

    # -- internals: listening ---------------------------------------------------

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"faultproxy-{name}", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _lifetime_watch(self) -> None:
        if not self._stop.wait(self.lifetime):
            self.stop()

    def _close_listener_locked(self) -> None:
        """Swap the listener for a bound, non-listening placeholder: connections get refused."""
        if self._listener is None or self._placeholder:
            return
        assert self.port is not None
        placeholder = _bound_socket(self.port)  # keeps the port ours while nobody listens
        old, self._listener, self._placeholder = self._listener, placeholder, True
        # shutdown() stops a Linux listener at once and wakes a thread blocked in
        # accept(); close() alone would leave it listening until that thread returns.
        with contextlib.suppress(OSError):
            old.shutdown(socket.SHUT_RD)
        old.close()
        self._listener_changed.notify_all()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            with self._mutex:
                listener = self._listener
                if listener is None:
                    return
                if self._placeholder:
                    left = self._refused_until - time.monotonic()
                    if left > 0:
                        self._listener_changed.wait(min(left, 0.2))
                        continue
                    assert self.port is not None
                    fresh = _listening_socket(self.port)
                    self._listener, self._placeholder = fresh, False
                    listener.close()
                    listener = fresh
            try:
                listener.settimeout(0.2)
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(_IO_TIMEOUT)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._mutex:
                self._stats.connections += 1
            self._spawn(functools.partial(self._serve, conn), "conn")

    def _refusal_loop(self, chaos: _Chaos) -> None:
        while not self._stop.is_set():
            with self._mutex:
                if self._chaos is not chaos:
                    return
                gap = chaos.rng.expovariate(chaos.refuse_rate)
                window = chaos.rng.uniform(*chaos.refuse_window)
            if self._stop.wait(gap):
                return
            with self._mutex:
                if self._chaos is not chaos:
                    return
            self.refuse_connections(window)

    # -- internals: one client connection ----------------------------------------

    def _serve(self, client: socket.socket) -> None:
        state = [True]  # idle between requests
        with self._mutex:
            self._conns[id(client)] = (client, state)
        upstream: socket.socket | None = None
        cbuf = Buffer(client)
        try:
            while not self._stop.is_set():
                with self._mutex:  # atomic with refuse_connections() collecting idle connections
                    if self._refusing():
                        return
                    state[0] = True
                try:
                    request_head = cbuf.read_to(b"\r\n\r\n")
                except Closed:
                    return
                state[0] = False
                method, target, headers = parse_request_head(request_head)
                body = cbuf.read_body(headers)
                url = urlsplit(target)
                query = dict(parse_qsl(url.query, keep_blank_values=True))
                ex = Exchange(
                    method, url.path, query, body, headers.get("content-type", ""), time.time(), headers=headers
                )
                rule = self._decide(ex)
                kind, pause = (rule.kind, rule.delay) if rule is not None else (None, 0.0)
                keep_alive = headers.get("connection", "").lower() != "close"

                if rule is not None and kind in _ANSWERED:
                    ex.status = _ANSWERS[self.dialect, rule.kind][0]
                    close = self._replying(state, close=not keep_alive)
                    client.sendall(_error_reply(self.dialect, rule, close=close))
                    if close:
                        return
                    continue
                if kind == "reset":
                    _reset(client)
                    return
                if kind == "delay" and self._stop.wait(pause):
                    return
                if upstream is not None and _closed_while_idle(upstream):
                    upstream.close()
                    upstream = None
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=_IO_TIMEOUT)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    ubuf = Buffer(upstream)
                if kind == "strip_conditions":
                    request_head = edit_head(request_head, _CONDITIONS)
                upstream.sendall(request_head + body)
                reply_head = ubuf.read_to(b"\r\n\r\n")
                status, reply_headers = parse_reply_head(reply_head)
                reply_body, upstream_done = ubuf.read_reply_body(reply_headers, status, method)
                with self._mutex:
                    self._stats.forwarded += 1
                if upstream_done or reply_headers.get("connection", "").lower() == "close":
                    upstream.close()
                    upstream = None
                if kind == "drop_reply":
                    _reset(client)  # applied upstream; the client never hears of it
                    return
                ex.status = status
                close = self._replying(state, close=not keep_alive or upstream_done)
                if close:
                    reply_head = edit_head(reply_head, (b"connection",), b"Connection: close")
                reply = reply_head + reply_body
                # A trickle sends the head at once (trickle_head: not even that), then a byte per pause.
                sent = {"trickle": len(reply_head), "trickle_head": 0}.get(kind or "", len(reply))
                client.sendall(reply[:sent])
                for i in range(sent, len(reply)):
                    if self._stop.wait(pause):
                        return
                    client.sendall(reply[i : i + 1])
                if close:
                    return
        except (OSError, Closed, ValueError):
            return  # a peer went away or spoke garbage: drop the connection
        finally:
            with self._mutex:
                self._conns.pop(id(client), None)
            with contextlib.suppress(OSError):
                client.close()
            if upstream is not None:
                with contextlib.suppress(OSError):
                    upstream.close()

    def _decide(self, ex: Exchange) -> Rule | None:
        """The first rule that matches ``ex`` (it fires), else a draw of chaos; kept as ``ex.fault``, counted.

        A fault the proxy answers itself counts as answered here, before its reply is sent."""
        with self._mutex:
            self._stats.requests += 1
            rule = next((r for r in self._rules if r.matches(ex)), None)
            if rule is not None:
                rule.fired += 1
            elif self._chaos is not None:
                rule = self._chaos.draw(ex)
            self._rules = [r for r in self._rules if not r.spent]
            if rule is not None:
                ex.fault = rule.kind
                self._stats.faults[rule.kind] += 1
                self._stats.answered += rule.kind in _ANSWERED
            self.history.append(ex)
            return rule

    def _replying(self, state: list[bool], *, close: bool) -> bool:
        """About to send a reply: whether to close after it; else the connection counts as idle.

        Idle from before the reply is sent, not after: a client may send its next
        request the moment it has the reply, and a refusal window starting then
        must already find this connection idle and close it.
        """
        with self._mutex:
            close = close or self._refusing()
            state[0] = not close
            return close

    def _refusing(self) -> bool:
        return time.monotonic() < self._refused_until


def _closed_while_idle(sock: socket.socket) -> bool:
    """Whether the server closed a kept-alive connection while it sat idle (gunicorn, which serves
    storage-testbench, does after 2 s): the next request then goes on a new one, as a client's would,
    rather than being lost unsent."""
    poller = select.poll()  # not select(), which refuses a descriptor past FD_SETSIZE (1024)
    poller.register(sock, select.POLLIN)
    try:
        return bool(poller.poll(0)) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), the way a dropped connection looks to a client."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _bound_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # SO_REUSEPORT lets the placeholder and the next listener hold the port in
    # turn, so nothing else can take it during a refusal window.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((HOST, port))
    return sock


def _listening_socket(port: int) -> socket.socket:
    sock = _bound_socket(port)
    sock.listen(128)
    return sock
