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
        if not chunk:
            return False
        self.buf += chunk
        return True

    def read_head(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head, self.buf = self.buf[: end + 4], self.buf[end + 4 :]
                return head
            if len(self.buf) > MAX_HEAD:
                raise ValueError("message head too large")
            if not self._fill():
                if self.buf:
                    raise ValueError("connection closed in the middle of a message head")
                raise Closed()

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ValueError("connection closed in the middle of a body")
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line, self.buf = self.buf[: end + 2], self.buf[end + 2 :]
                return line
            if len(self.buf) > MAX_HEAD or not self._fill():
                raise ValueError("bad chunked framing")

    def read_chunked(self) -> bytes:
        """The raw chunked body (framing kept, so it is relayed as it came)."""
        out = []
        while True:
            line = self.read_line()
            out.append(line)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = self.read_line()
                    out.append(trailer)
                    if trailer == b"\r\n":
                        return b"".join(out)
            out.append(self.read_exact(size + 2))

    def read_body(self, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self.read_chunked()
        length = headers.get("content-length")
        if length is not None:
            return self.read_exact(int(length))
        return b""

    def read_reply_body(self, headers: dict[str, str], status: int, method: str) -> tuple[bytes, bool]:
        """The reply body, and whether the upstream connection is finished (read to its end)."""
        if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
            return b"", False
        if "chunked" in headers.get("transfer-encoding", "").lower() or "content-length" in headers:
            return self.read_body(headers), False
        while self._fill():  # no framing: the body runs to the end of the connection
            pass
        data, self.buf = self.buf, b""
        return data, True


def parse_headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ValueError(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def parse_request_head(head: bytes) -> tuple[str, str, dict[str, str], bytes]:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x request line: {lines[0]!r}")
    return parts[0].upper(), parts[1], parse_headers(lines[1:]), head


def parse_reply_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {lines[0]!r}")
    return int(parts[1]), parse_headers(lines[1:])


def with_connection_close(head: bytes) -> bytes:
    lines = [line for line in head[:-4].split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def multipart_data(body: bytes, content_type: str) -> bytes | None:
    """The last part of a ``multipart/related`` body (an upload's object bytes), or None."""
    marker = "boundary="
    if "multipart/" not in content_type or marker not in content_type:
        return None
    boundary = content_type.split(marker, 1)[1].split(";", 1)[0].strip().strip('"').encode()
    parts = body.split(b"--" + boundary)
    data_parts = [p for p in parts[1:] if not p.startswith(b"--")]
    if not data_parts:
        return None
    last = data_parts[-1]
    _, sep, payload = last.partition(b"\r\n\r\n")
    if not sep:
        return None
    return payload[:-2] if payload.endswith(b"\r\n") else payload
