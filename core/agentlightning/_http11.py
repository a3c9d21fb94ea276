"""A small keep-alive HTTP/1.1 client over asyncio streams, for the store client's plain-HTTP requests.

Why not httpx here: per request, httpx + httpcore + anyio cost the store client more CPU than the store server
spent answering (bench/store_http.py: ~0.9 ms of client CPU per request on 2 shared cores) — URL and header models,
auth flow, a scan of every pooled connection, and separate socket writes for head and body. The store client only
sends small JSON requests with a Content-Length to one server and reads answers with a Content-Length (or chunked),
so this module does just that: the request head and body in one write, the answer read with ``readuntil`` and
``readexactly``, idle connections kept per client for reuse. TLS and custom transports stay on httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

_MAX_HEAD_BYTES: Final = 64 * 1024


class TransportFailure(ConnectionError):
    """The request could not be sent or its answer not read (connection refused, reset, closed, timed out)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, headers (lower-case names) and the whole body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        # An idle connection the server closed (keep-alive timeout) shows EOF once the loop has seen the FIN.
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class Http11Pool:
    """Keep-alive connections to one ``host:port`` on one event loop; at most ``max_connections`` at a time."""

    def __init__(self, host: str, port: int, *, max_connections: int) -> None:
        self.host = host
        self.port = port
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address goes in brackets
        self._host_header = f"host: {netloc}\r\n".encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
        *,
        replayable: bool | None = None,
    ) -> Answer:
        """Send one request and read its answer; TransportFailure when the exchange fails.

        ``replayable``: whether the request may be re-sent on a fresh connection when a pooled one ends without an
        answer (it may have reached the server); default: idempotent methods and requests with an Idempotency-Key.
        """
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), self._host_header]
        head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
        payload = body or b""
        head.append(b"content-length: %d\r\n\r\n" % len(payload))
        message = b"".join(head) + payload
        if replayable is None:
            replayable = method in _REPLAYABLE_METHODS or any(name.lower() == "idempotency-key" for name in headers)
        waited = True
        try:
            # The wait for a free connection counts against the timeout too: a full pool must not block forever.
            async with asyncio.timeout(timeout_s):
                async with self._slots:
                    waited = False
                    return await self._exchange(method, message, replayable)
        except TimeoutError as exc:
            what = "free connection" if waited else "answer"
            raise TransportFailure(f"no {what} from {self.host}:{self.port} within {timeout_s:.1f} s") from exc

    async def _exchange(self, method: str, message: bytes, replayable: bool) -> Answer:
        while self._idle:
            connection = self._idle.pop()
            if not connection.usable():
                connection.close()
                continue
            try:
                return await self._send(connection, method, message)
            except _StaleConnection as exc:
                # Most often the server closed this idle connection (keep-alive timeout) before reading the request,
                # but a server that read it and died looks the same: only a request that acts once anyway is re-sent.
                if not replayable:
                    raise TransportFailure(
                        f"{self.host}:{self.port} closed the connection after the {method} was sent; not re-sent, "
                        "since it may have acted and carries no Idempotency-Key"
                    ) from exc
                continue
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=_MAX_HEAD_BYTES)
        except OSError as exc:
            raise TransportFailure(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        try:
            return await self._send(_Connection(reader, writer), method, message)
        except _StaleConnection as exc:
            raise TransportFailure(f"{self.host}:{self.port} closed the connection without answering") from exc

    async def _send(self, connection: _Connection, method: str, message: bytes) -> Answer:
        answered = False
        try:
            connection.writer.write(message)
            await connection.writer.drain()
            head = await connection.reader.readuntil(b"\r\n\r\n")
            answered = True
            answer, keep = await _read_answer(connection.reader, head, method)
            while 100 <= answer.status_code < 200 and answer.status_code != 101:
                # Interim answers (100 Continue, 103 Early Hints) precede the final one on the same connection.
                head = await connection.reader.readuntil(b"\r\n\r\n")
                answer, keep = await _read_answer(connection.reader, head, method)
        except BaseException as exc:
            connection.close()
            if isinstance(exc, asyncio.IncompleteReadError | ConnectionError) and not answered:
                raise _StaleConnection from exc
            if isinstance(exc, OSError | asyncio.IncompleteReadError | asyncio.LimitOverrunError | ValueError):
                raise TransportFailure(f"exchange with {self.host}:{self.port} failed: {exc!r}") from exc
            raise
        if keep and not self._closed:
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    async def aclose(self) -> None:
        """Close every idle connection; busy ones close when their request ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for connection in idle:
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()


# Methods whose repetition acts once (RFC 9110 idempotent methods); others are re-sent only with an Idempotency-Key.
_REPLAYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


class _StaleConnection(Exception):
    """The connection ended before any byte of the answer arrived."""


async def _read_answer(reader: asyncio.StreamReader, head: bytes, method: str) -> tuple[Answer, bool]:
    """The answer whose head (status line and headers) was read; and whether the connection can be reused."""
    lines = head[:-4].split(b"\r\n")
    status_line = lines[0]
    if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    status = int(status_line[9:12])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    keep = status_line.startswith(b"HTTP/1.1") and headers.get("connection", "").lower() != "close"
    length = headers.get("content-length")
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        content = b""
    elif length is not None:
        content = await reader.readexactly(int(length))
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        content = await _read_chunked(reader)
    else:  # the body runs to the end of the connection
        content = await reader.read()
        keep = False
    return Answer(status, headers, content), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the CRLF after each chunk
