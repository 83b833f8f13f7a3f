"""Spot and preemptible VMs: hear the cloud's notice and turn it into a release request.

Each cloud tells a VM it is about to go through its metadata server, which
only the VM itself can reach (at ``169.254.169.254``):

* **GCE** flips ``instance/preempted`` to ``TRUE`` about 30 s before the stop.
  It is long-polled (``wait_for_change``); the deadline passed on is the
  notice plus ``notice_grace`` (GCE names no time).
* **AWS** (IMDSv2) shows ``spot/instance-action``, ``{"action": "terminate" |
  "stop" | "hibernate", "time": ...}``, two minutes before ``time``; 404
  until then. It is polled every ``poll_interval`` seconds with a session
  token (``PUT /latest/api/token``); the deadline is ``time``. The earlier,
  softer rebalance recommendation is heard only with ``aws_rebalance=True``.
* **Azure** lists an event of type ``Preempt`` (spot eviction, at least 30 s
  ahead) or ``Terminate`` in Scheduled Events, naming this VM; polled every
  ``poll_interval`` seconds; the deadline is its ``NotBefore``. The watcher
  never acknowledges an event: that would let Azure stop the VM at once.

:class:`PreemptionWatcher` watches one of them from a daemon thread, chosen by
``provider`` or found by probing one host (bounded by ``request_timeout``,
retried with backoff, so a job off the cloud pays one failed probe a minute
and never waits on it). On a notice it calls ``target.request_release(
"preemption", requester="preemption", deadline=...)``: the training loop sees
``release_requested`` at its next step, exactly as for a waiter. The target is
anything with that method: a :class:`~handofflock.HandoffLock`, or a
:class:`~handofflock.integrations.RankLock` on any rank, which turns it into
a yield every rank agrees on.

A preemption is not a failure: the watcher never touches the lock's renewal,
never sends ``on_renewal_error``, and its own trouble (no metadata server,
timeouts) is logged and retried with backoff, nothing more. Requests go
direct (never through a proxy), and only replies in the cloud's own dialect
are believed.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import quote

from .core.clock import Clock
from .core.errors import ConfigurationError
from .core.threads import quiet
from .core.timing import Backoff, seconds

_log = logging.getLogger("handofflock.preemption")

#: Where every cloud's metadata server answers from inside the VM.
METADATA_IP = "169.254.169.254"
DEFAULT_METADATA_HOST = "metadata.google.internal"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
#: Seconds from the notice to the deadline where the cloud names no time and none is given (GCE gives about 30 s).
DEFAULT_NOTICE_GRACE = 30.0
PROVIDERS = ("gce", "aws", "azure")
#: The token's life asked of AWS; it is fetched again a minute before it ends.
_AWS_TOKEN_TTL = 21600


class ReleaseTarget(Protocol):
    """What a notice is delivered to: a :class:`~handofflock.HandoffLock`, a ``RankLock``, or your own."""

    def request_release(self, reason: str, *, requester: str | None = None, deadline: float | None = None) -> None:
        """Ask for the lock to be released by ``deadline`` (Unix time). Called from the watcher's thread."""


@dataclass(frozen=True)
class PreemptionNotice:
    """What the cloud said: ``provider`` ("gce", "aws", "azure"), ``kind`` (GCE: "preempted"; AWS: its
    action, or "rebalance"; Azure: the EventType), and ``at``, the Unix time it named for the stop, if any."""

    provider: str
    kind: str
    at: float | None = None


class _NotMetadata(Exception):
    """A reply we do not believe (wrong status, or not from this cloud's metadata server)."""


@dataclass(frozen=True)
class _Reply:
    status: int
    headers: http.client.HTTPMessage
    body: str


# -- the clouds -----------------------------------------------------------------


class _Cloud:
    """One cloud's dialect: ``poll`` asks once for a notice, ``pace`` says when to ask again."""

    name: str

    def reset(self) -> None:
        """Forget what a failed request may have spoiled (a token, a long poll's ETag)."""

    def poll(self, ch: PreemptionWatcher) -> PreemptionNotice | None:
        raise NotImplementedError

    def pace(self, ch: PreemptionWatcher) -> float:
        """Seconds from the start of one poll to the next."""
        return ch.poll_interval


class _Gce(_Cloud):
    name = "gce"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.etag: str | None = None
        self.wait = False  # start with a plain read: the notice may already be there, or we missed the change
        self.held = False  # the last request was a long poll

    def poll(self, ch: PreemptionWatcher) -> PreemptionNotice | None:
        path, hold = PREEMPTED_PATH, 0.0
        if self.wait:
            path += f"?wait_for_change=true&timeout_sec={ch.poll_timeout}"
            if self.etag:
                path += f"&last_etag={quote(self.etag, safe='')}"
            hold = ch.poll_timeout
        reply = ch._request("GET", path, {"Metadata-Flavor": "Google"}, hold=hold, limit=1024)
        if reply.status != 200:
            raise _NotMetadata(f"HTTP {reply.status}")
        if reply.headers.get("Metadata-Flavor") != "Google":
            raise _NotMetadata("the reply lacks 'Metadata-Flavor: Google'; not a metadata server")
        self.etag = reply.headers.get("ETag") or self.etag
        self.held, self.wait = self.wait, True
        return PreemptionNotice("gce", "preempted") if reply.body.strip().upper() == "TRUE" else None

    def pace(self, ch: PreemptionWatcher) -> float:
        # After the plain read, long-poll at once; a long poll that came back at once is never repeated faster.
        return ch.backoff_initial if self.held else 0.0


class _Aws(_Cloud):
    name = "aws"

    def __init__(self, *, rebalance: bool) -> None:
        self.rebalance = rebalance
        self.reset()

    def reset(self) -> None:
        self.token: str | None = None
        self.token_until = 0.0

    def poll(self, ch: PreemptionWatcher) -> PreemptionNotice | None:
        if self.token is None or ch.clock.monotonic() >= self.token_until:
            ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(_AWS_TOKEN_TTL)}
            reply = ch._request("PUT", AWS_TOKEN_PATH, ttl, limit=1024)
            if reply.status != 200 or not reply.body.strip():
                raise _NotMetadata(f"no IMDSv2 token (HTTP {reply.status})")
            self.token, self.token_until = reply.body.strip(), ch.clock.monotonic() + _AWS_TOKEN_TTL - 60
        notice = self._get(ch, AWS_ACTION_PATH, "action", "time")
        if notice is None and self.rebalance:
            notice = self._get(ch, AWS_REBALANCE_PATH, "noticeTime", None)
        return notice

    def _get(self, ch: PreemptionWatcher, path: str, key: str, time_key: str | None) -> PreemptionNotice | None:
        reply = ch._request("GET", path, {"X-aws-ec2-metadata-token": self.token or ""}, limit=4096)
        if reply.status == 404:
            return None  # no notice (yet)
        if reply.status == 401:
            self.token = None  # expired or revoked: the next poll fetches a new one
        if reply.status != 200:
            raise _NotMetadata(f"HTTP {reply.status} from {path}")
        doc = _json_object(reply.body, key)
        if time_key is None:
            return PreemptionNotice("aws", "rebalance")
        return PreemptionNotice("aws", str(doc[key]), _iso_time(doc.get(time_key)))


class _Azure(_Cloud):
    name = "azure"

    def __init__(self, events: Sequence[str]) -> None:
        self.events = frozenset(events)
        self.vm_name: str | None = None

    def poll(self, ch: PreemptionWatcher) -> PreemptionNotice | None:
        headers = {"Metadata": "true"}
        reply = ch._request("GET", AZURE_EVENTS_PATH, headers, limit=1 << 20)
        if reply.status != 200:
            raise _NotMetadata(f"HTTP {reply.status} from scheduledevents")
        doc = _json_object(reply.body, "Events")
        events = [e for e in doc["Events"] if isinstance(e, dict) and e.get("EventType") in self.events]
        events = [e for e in events if e.get("EventStatus", "Scheduled") in ("Scheduled", "Started")]
        if not events:
            return None
        if self.vm_name is None:
            # Events of a scale set or availability set reach every VM in it; each names the VMs it is for.
            name = ch._request("GET", AZURE_NAME_PATH, headers, limit=1024)
            if name.status != 200 or not name.body.strip():
                raise _NotMetadata(f"HTTP {name.status} for this VM's name")
            self.vm_name = name.body.strip()
        for event in events:
            resources = event.get("Resources") or []
            if resources and self.vm_name not in resources:
                continue
            at = ch.clock.time() if event.get("EventStatus") == "Started" else _http_time(event.get("NotBefore"))
            return PreemptionNotice("azure", str(event["EventType"]), at)
        return None


def _json_object(body: str, key: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise _NotMetadata("the reply is not JSON") from None
    if not isinstance(doc, dict) or key not in doc:
        raise _NotMetadata(f"the reply has no {key!r}")
    return doc


def _iso_time(value: object) -> float | None:
    """AWS's ``2017-09-18T08:22:00Z`` as Unix time; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.strip().replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
    except ValueError:
        return None


def _http_time(value: object) -> float | None:
    """Azure's ``Mon, 19 Sep 2016 18:29:47 GMT`` as Unix time; None when absent or unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


# -- the watcher ----------------------------------------------------------------


class PreemptionWatcher:
    """Watches the cloud's metadata server and asks ``target`` to release on a preemption notice.

    >>> watcher = PreemptionWatcher(lock).start()       # GCE, AWS or Azure: found by probing
    >>> for step in lock.steps(range(start, total)):   # stops on the notice
    ...     train(step)
    >>> watcher.stop()

    ``target``: anything with ``request_release(reason, requester=, deadline=)``
    (a :class:`~handofflock.HandoffLock`, or a ``RankLock`` on any rank of a
    job: see :class:`ReleaseTarget`).

    ``provider``: "gce", "aws", "azure" or "auto" (the default). "auto" is
    GCE at ``$GCE_METADATA_HOST`` when that is set, else it probes ``host``
    (default ``169.254.169.254``) in GCE's, then AWS's, then Azure's dialect,
    each probe bounded by ``request_timeout``; the first that answers in its
    own dialect is watched from then on. Nothing answering is an error like
    any other: logged once, retried with backoff. ``host``: ``host`` or
    ``host:port``; for "gce" it defaults to ``$GCE_METADATA_HOST`` or
    ``metadata.google.internal``, for the others to ``169.254.169.254``.

    ``notice_grace``: the most seconds from the notice to the deadline put
    in the request. The deadline is the time the cloud names (AWS ``time``,
    Azure ``NotBefore``), brought forward to at most ``notice_grace`` after
    the notice; where the cloud names none (GCE, an AWS rebalance
    recommendation) it is ``notice_grace`` after the notice. None (the
    default): the cloud's own time, and 30 s where it names none.

    ``poll_timeout``: how long GCE may hold one long poll (whole seconds).
    ``poll_interval``: seconds between polls of AWS and Azure, which have no
    long poll (AWS suggests 5). A request gives up ``request_timeout``
    seconds after it was due. When the server cannot be reached, retries back
    off from ``backoff_initial`` to ``backoff_max`` seconds (with jitter).
    ``aws_rebalance``: treat AWS's rebalance recommendation as a notice.
    ``azure_events``: the Azure EventTypes that count (add "Reboot" or
    "Redeploy" to yield before maintenance too). ``clock``: where the times
    and waits come from (tests pass a :class:`~handofflock.FakeClock`).

    After the notice: ``preempted`` is True, ``notice`` says what the cloud
    said, ``noticed_at`` is the Unix time, ``deadline`` what was passed on,
    :meth:`wait` returns True, and the thread ends. ``provider`` is the cloud
    watched (None while "auto" has found none), ``attempts`` counts requests.
    """

    def __init__(
        self,
        target: ReleaseTarget,
        *,
        provider: str = "auto",
        host: str | None = None,
        notice_grace: float | None = None,
        poll_timeout: int = 60,
        poll_interval: float = 5.0,
        request_timeout: float = 5.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        aws_rebalance: bool = False,
        azure_events: Sequence[str] = ("Preempt", "Terminate"),
        clock: Clock | None = None,
    ) -> None:
        if not callable(getattr(target, "request_release", None)):
            raise ConfigurationError(
                f"PreemptionWatcher needs a target with request_release(reason, requester=, deadline=), got {target!r}"
            )
        self.notice_grace = None if notice_grace is None else seconds("notice_grace", notice_grace)
        self.poll_interval = seconds("poll_interval", poll_interval)
        self.request_timeout = seconds("request_timeout", request_timeout)
        self.backoff_initial = seconds("backoff_initial", backoff_initial)
        self.backoff_max = seconds("backoff_max", backoff_max)
        if isinstance(poll_timeout, bool) or not isinstance(poll_timeout, int) or poll_timeout < 1:
            raise ConfigurationError(f"poll_timeout must be a whole number of seconds >= 1, got {poll_timeout!r}")
        if backoff_max < backoff_initial:
            raise ConfigurationError("backoff_max must be >= backoff_initial")
        if provider not in (*PROVIDERS, "auto"):
            raise ConfigurationError(f"provider must be one of 'auto', 'gce', 'aws', 'azure', got {provider!r}")
        if isinstance(azure_events, str) or not all(isinstance(e, str) for e in azure_events):
            raise ConfigurationError(f"azure_events must be a sequence of EventType names, got {azure_events!r}")
        gce_host = os.environ.get("GCE_METADATA_HOST")
        if provider == "auto" and gce_host and not host:
            provider = "gce"  # google-auth's own variable says where GCE's server is: nothing to find out
        if provider == "gce":
            host = host or gce_host or DEFAULT_METADATA_HOST
        self.host = host or METADATA_IP
        if "/" in self.host:
            raise ConfigurationError(f"metadata host must be host or host:port, got {self.host!r}")
        self.target = target
        self.clock = clock or Clock()
        self.poll_timeout = poll_timeout
        self._backoff = Backoff(self.backoff_initial, self.backoff_max)
        self._candidates: tuple[_Cloud, ...] = tuple(
            _Gce() if name == "gce" else _Aws(rebalance=aws_rebalance) if name == "aws" else _Azure(azure_events)
            for name in (PROVIDERS if provider == "auto" else (provider,))
        )
        self._cloud: _Cloud | None = self._candidates[0] if provider != "auto" else None
        self.preempted = False
        self.notice: PreemptionNotice | None = None
        self.noticed_at: float | None = None
        self.deadline: float | None = None
        self.attempts = 0
        self.last_error: BaseException | None = None
        self._notice = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._conn_lock = threading.Lock()

    @property
    def provider(self) -> str | None:
        """The cloud watched: "gce", "aws" or "azure"; None while "auto" has found none."""
        return self._cloud.name if self._cloud is not None else None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> PreemptionWatcher:
        """Start the watching thread (once). Returns self."""
        if self._thread is not None:
            raise RuntimeError("this PreemptionWatcher was already started")
        self._thread = threading.Thread(target=quiet(self._run), name="handofflock-preemption", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching, interrupting a request in flight. Safe to call twice."""
        self._stop.set()
        with self._conn_lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in recv()
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a notice arrives (True) or ``timeout`` passes (False)."""
        return self._notice.wait(timeout)

    def __enter__(self) -> PreemptionWatcher:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the loop -------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = self.clock.monotonic()
            cloud = self._cloud
            try:
                if cloud is None:
                    cloud, notice = self._detect()
                else:
                    notice = cloud.poll(self)
            except Exception as exc:  # OSError, timeouts, HTTP trouble, a reply we distrust
                if self._stop.is_set():
                    return
                if cloud is not None:
                    cloud.reset()
                failures += 1
                self.last_error = exc
                delay = self._backoff.delay(failures - 1)
                level = logging.INFO if failures == 1 else logging.DEBUG
                what = f"{cloud.name} metadata server at" if cloud is not None else "looking for a metadata server at"
                why = "timed out" if isinstance(exc, socket.timeout) else str(exc) or type(exc).__name__
                _log.log(level, "%s %s: %s; retrying in %.1f s", what, self.host, why, delay)
                self.clock.wait(self._stop, delay)
                continue
            if failures:
                _log.info("%s metadata server at %s answers again", cloud.name, self.host)
            failures = 0
            if notice is not None:
                self._noticed(notice)
                return
            self.clock.wait(self._stop, max(0.0, cloud.pace(self) - (self.clock.monotonic() - started)))

    def _detect(self) -> tuple[_Cloud, PreemptionNotice | None]:
        """Probe each cloud's dialect at ``host`` in turn; the first believable answer decides."""
        refused: list[str] = []
        for cloud in self._candidates:
            try:
                notice = cloud.poll(self)
            except _NotMetadata as exc:  # a server answered, in another dialect: try the next
                cloud.reset()
                refused.append(f"{cloud.name}: {exc}")
                continue
            # An OSError (nothing listens, no route, a timeout) is about the host, not the dialect: it ends the round.
            self._cloud = cloud
            _log.info("found the %s metadata server at %s", cloud.name, self.host)
            return cloud, notice
        raise _NotMetadata("no GCE, AWS or Azure metadata server there (" + "; ".join(refused) + ")")

    def _noticed(self, notice: PreemptionNotice) -> None:
        now = self.clock.time()
        latest = now + (DEFAULT_NOTICE_GRACE if self.notice_grace is None else self.notice_grace)
        if notice.at is None:
            deadline = latest
        else:  # a time already past (hibernation, skew): release now
            deadline = max(now, notice.at if self.notice_grace is None else min(notice.at, latest))
        self.preempted, self.notice, self.noticed_at, self.deadline = True, notice, now, deadline
        target = getattr(self.target, "url", None) or repr(self.target)
        _log.warning(
            "preemption notice (%s %s) from %s: asking %s to release within %.0f s",
            notice.provider,
            notice.kind,
            self.host,
            target,
            deadline - now,
        )
        try:
            self.target.request_release("preemption", requester="preemption", deadline=deadline)
        except Exception:  # the notice stands (preempted, wait()); the target's trouble is said, never lost
            _log.exception("could not deliver the preemption notice to %s", target)
        self._notice.set()

    def _request(
        self, method: str, path: str, headers: dict[str, str], *, hold: float = 0.0, limit: int = 65536
    ) -> _Reply:
        """One request to the metadata server, bounded by ``request_timeout`` (plus ``hold``) and stoppable."""
        conn = http.client.HTTPConnection(self.host, timeout=self.request_timeout)
        with self._conn_lock:
            self._conn = conn
        try:
            self.attempts += 1
            conn.connect()
            if self._stop.is_set():
                raise _NotMetadata("stopped")
            conn.sock.settimeout(self.request_timeout + hold)
            conn.request(method, path, headers=headers)
            reply = conn.getresponse()
            body = reply.read(limit).decode("utf-8", "replace")
            return _Reply(reply.status, reply.headers, body)
        finally:
            with self._conn_lock:
                self._conn = None
            conn.close()

    def __repr__(self) -> str:
        state = "preempted" if self.preempted else ("watching" if self.running else "stopped")
        return f"<PreemptionWatcher {self.provider or 'auto'} {self.host} {state} attempts={self.attempts}>"
