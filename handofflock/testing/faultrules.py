"""The fault proxy's rules and answers: what it may inject, into which requests, and what it says.

Owns the fault kinds (:data:`FAULT_KINDS`), one request as the proxy saw it
(:class:`Exchange`), a scheduled fault and what it matches (:class:`Rule`), the
chaos settings and the counters, and the replies the proxy gives itself (429,
503, 403, 409, a retention refusal), worded as GCS or as S3 words them. None of
it touches a socket: the relay loop that applies them is
:class:`~handofflock.testing.faultproxy.FaultProxy`. Test tooling, not part of
the runtime.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from ..storage import s3_format
from ._http11 import multipart_data

#: Every fault the proxy can inject.
FAULT_KINDS = (
    "refuse",
    "delay",
    "reset",
    "drop_reply",
    "429",
    "503",
    "403",
    "409",
    "retention",
    "trickle",
    "trickle_head",
    "strip_conditions",
)
#: The faults that act on one request (``refuse`` acts on connections).
REQUEST_FAULTS = FAULT_KINDS[1:]
#: The faults the proxy answers itself, without forwarding the request.
_ANSWERED = ("429", "503", "403", "409", "retention")
#: The request headers ``strip_conditions`` removes.
_CONDITIONS = (b"if-match", b"if-none-match")
#: The faults that send the reply slowly, one byte at a time.
_TRICKLES = ("trickle", "trickle_head")

_ANSWERS = {
    "429": (
        429,
        "Too Many Requests",
        "rateLimitExceeded",
        "The object exceeded the rate limit for object mutation operations (injected by FaultProxy).",
    ),
    "503": (503, "Service Unavailable", "backendError", "Backend Error (injected by FaultProxy)."),
    "403": (
        403,
        "Forbidden",
        "forbidden",
        "injected@faultproxy does not have storage.objects.create access (injected by FaultProxy).",
    ),
    # Worded as GCS documents reason "conflict" (cloud.google.com/storage/docs/json_api/v1/status-codes).
    "409": (
        409,
        "Conflict",
        "conflict",
        "The change failed to commit due to a conflicting concurrent change to the same resource "
        "(injected by FaultProxy).",
    ),
    # As GCS words it (seen in the wild: reason "retentionPolicyNotMet", or "forbidden" in older replies).
    "retention": (
        403,
        "Forbidden",
        "retentionPolicyNotMet",
        "Object 'bucket/locks/job.json' is subject to bucket's retention policy or object retention and cannot be "
        "deleted or overwritten until 2031-09-20T12:18:15.93713-07:00 (injected by FaultProxy)",
    ),
}

# The same faults worded as S3 words them (docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html).
_S3_ANSWERS = {
    "429": (429, "Too Many Requests", "TooManyRequests", "Please reduce your request rate (injected by FaultProxy)."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate. (injected by FaultProxy)"),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied (injected by FaultProxy)"),
    "retention": (
        403,
        "Forbidden",
        "AccessDenied",
        "Access Denied because object protected by object lock. (injected by FaultProxy)",
    ),
    "409": (
        409,
        "Conflict",
        "ConditionalRequestConflict",
        "A conflicting operation occurred. If using PutObject you can retry the request. (injected by FaultProxy)",
    ),
}
_DIALECTS = ("gcs", "s3")


@dataclass
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
    headers: dict[str, str] = field(default_factory=dict)  # the request's, names in lowercase

    def upload_data(self) -> bytes | None:
        """The object's bytes: of a multipart upload (GCS, the second part), or of an S3
        ``PutObject`` of a live object in the S3 backend's envelope. Else None."""
        if self.method == "PUT":
            header = s3_format.parse_header(self.body[: s3_format.MAX_HEADER], len(self.body))
            return None if header is None or header.deleted else self.body[header.offset :]
        return multipart_data(self.body, self.content_type)


@dataclass
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
        if self.fired >= self.times:
            return False
        if not self.probes and s3_format.PROBE_MARK in ex.path:
            return False
        if self.method is not None and ex.method != self.method.upper():
            return False
        if self.path is not None and self.path not in ex.path:
            return False
        if self.body is not None and self.body not in ex.body:
            return False
        return self.when is None or bool(self.when(ex))

    @property
    def spent(self) -> bool:
        return self.fired >= self.times


@dataclass
class _Chaos:
    rng: random.Random
    rates: dict[str, float]
    method: str | None
    path: str | None
    delay: tuple[float, float]
    retry_after: tuple[float, float]
    refuse_rate: float
    refuse_window: tuple[float, float]


@dataclass
class _Stats:
    connections: int = 0
    requests: int = 0
    forwarded: int = 0
    answered: int = 0  # answered by the proxy itself (429/503/403)
    faults: dict[str, int] = field(default_factory=lambda: {k: 0 for k in FAULT_KINDS})
    refused_seconds: float = 0.0


def _choose(rules: list[Rule], chaos: _Chaos | None, ex: Exchange) -> Rule | None:
    """Set ``ex.fault``: from the first of ``rules`` that matches (counted as fired; returned), else
    from a draw of ``chaos`` (None returned). Probes are left alone by chaos."""
    for rule in rules:
        if rule.matches(ex):
            rule.fired += 1
            ex.fault = rule.kind
            return rule
    if (
        ex.fault is None
        and chaos is not None
        and s3_format.PROBE_MARK not in ex.path
        and (chaos.method is None or ex.method == chaos.method)
        and (chaos.path is None or chaos.path in ex.path)
    ):
        draw = chaos.rng.random()
        for kind, p in chaos.rates.items():
            if draw < p:
                ex.fault = kind
                break
            draw -= p
    return None


def _exchange(method: str, target: str, headers: dict[str, str], body: bytes) -> Exchange:
    parts = urlsplit(target)
    return Exchange(
        method=method,
        path=parts.path,
        query=dict(parse_qsl(parts.query, keep_blank_values=True)),
        body=body,
        content_type=headers.get("content-type", ""),
        started=time.time(),
        headers=dict(headers),
    )


def _error_reply(kind: str, retry_after: float | None, close: bool, dialect: str = "gcs") -> bytes:
    if dialect == "s3":
        status, reason, code, message = _S3_ANSWERS[kind]
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            "<RequestId>faultproxy</RequestId></Error>"
        ).encode()
        content_type = "application/xml"
    else:
        status, reason, why, message = _ANSWERS[kind]
        body = json.dumps(
            {
                "error": {
                    "code": status,
                    "message": message,
                    "errors": [{"message": message, "domain": "global", "reason": why}],
                }
            }
        ).encode()
        content_type = "application/json; charset=UTF-8"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if retry_after is not None and kind in ("429", "503"):
        lines.append(f"Retry-After: {retry_after:g}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _without_headers(head: bytes, names: tuple[bytes, ...]) -> bytes:
    """A request head without the header lines called ``names`` (lowercase)."""
    lines = head.split(b"\r\n")
    kept = [line for line in lines if line.split(b":", 1)[0].strip().lower() not in names]
    return b"\r\n".join(kept)
