"""Just enough HTTP/1.1 for :mod:`handofflock.testing.faultproxy`: message heads, framed bodies, multipart.

Reads one message at a time from a socket (head up to the blank line, body by
``Content-Length``, chunked framing kept as it came, or to the end of the
connection), so a proxy can act per request on a kept-alive connection.
"""

from __future__ import annotations

import socket

MAX_HEAD = 64 * 1024


class Closed(Exception):
    """The peer closed the connection (cleanly, between messages)."""


class Buffer:
    """Buffered reads from a socket: a message head, then a body by its framing."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(256 * 1024)
        self.buf += chunk
        return bool(chunk)

    def _take(self, n: int) -> bytes:
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_to(self, end: bytes) -> bytes:
        """Everything up to and including ``end`` (a head's blank line, a chunk's line end)."""
        while (at := self.buf.find(end)) < 0:
            if len(self.buf) > MAX_HEAD:
                raise ValueError("message head too large")
            if not self._fill():
                if self.buf:
                    raise ValueError("connection closed in the middle of a message")
                raise Closed()
        return self._take(at + len(end))

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ValueError("connection closed in the middle of a body")
        return self._take(n)

    def read_chunked(self) -> bytes:
        """The raw chunked body (framing kept, so it is relayed as it came)."""
        out = []
        while True:
            line = self.read_to(b"\r\n")
            out.append(line)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                trailer = b""
                while trailer != b"\r\n":  # trailers, up to the empty line
                    trailer = self.read_to(b"\r\n")
                    out.append(trailer)
                return b"".join(out)
            out.append(self.read_exact(size + 2))

    def read_body(self, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self.read_chunked()
        return self.read_exact(int(headers.get("content-length", 0)))

    def read_reply_body(self, headers: dict[str, str], status: int, method: str) -> tuple[bytes, bool]:
        """The reply body, and whether the upstream connection is finished (read to its end)."""
        if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
            return b"", False
        if "chunked" in headers.get("transfer-encoding", "").lower() or "content-length" in headers:
            return self.read_body(headers), False
        while self._fill():  # no framing: the body runs to the end of the connection
            pass
        return self._take(len(self.buf)), True


def _parse_head(head: bytes, split: int) -> tuple[list[str], dict[str, str]]:
    """A head's start line, split at its first ``split`` spaces, and its headers (names in lowercase)."""
    first, *lines = head[:-4].split(b"\r\n")
    headers: dict[str, str] = {}
    for line in filter(None, lines):
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ValueError(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    return first.decode("latin-1").split(" ", split), headers


def parse_request_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """The method (in capitals), the target and the headers of a request head."""
    parts, headers = _parse_head(head, -1)
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x request line: {' '.join(parts)!r}")
    return parts[0].upper(), parts[1], headers


def parse_reply_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the headers of a reply head."""
    parts, headers = _parse_head(head, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {' '.join(parts)!r}")
    return int(parts[1]), headers


def edit_head(head: bytes, drop: tuple[bytes, ...], add: bytes | None = None) -> bytes:
    """``head`` without its header lines named in ``drop`` (lowercase), and with ``add`` last if given."""
    lines = [line for line in head[:-4].split(b"\r\n") if line.split(b":", 1)[0].strip().lower() not in drop]
    return b"\r\n".join([*lines, add] if add else lines) + b"\r\n\r\n"


def multipart_data(body: bytes, content_type: str) -> bytes | None:
    """The last part of a ``multipart/related`` body (an upload's object bytes), or None."""
    marker = "boundary="
    if "multipart/" not in content_type or marker not in content_type:
        return None
    boundary = content_type.split(marker, 1)[1].split(";", 1)[0].strip().strip('"').encode()
    data_parts = [p for p in body.split(b"--" + boundary)[1:] if not p.startswith(b"--")]
    if not data_parts:
        return None
    _, sep, payload = data_parts[-1].partition(b"\r\n\r\n")
    if not sep:
        return None
    return payload[:-2] if payload.endswith(b"\r\n") else payload
