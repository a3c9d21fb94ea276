"""The one HTTP/1.1 client of the project: keep-alive connections over asyncio streams, per ``host:port``.

Two callers use it: the store client (:class:`Http11Pool.request`: small JSON requests, whole answers) and the
proxy's upstream transport (:mod:`agentlightning.proxy._transport`, an httpx transport over :meth:`Http11Pool.open`
that streams the answer's body). Both get the same rules, tested once (``tests/core/server/test_http11.py``,
``tests/core/proxy/test_transport.py``):

- the request head and body go out in one write (TCP_NODELAY);
- interim answers (100 Continue, 103 Early Hints) are skipped for the final one;
- the wait for a free connection (when the pool is bounded) and the read of each answer's head are bounded in time;
- an idle connection the server closed is dropped before use; a request that may have reached the server (its
  pooled connection ended before any byte of the answer) is re-sent on a fresh connection only when it acts once
  when repeated: an idempotent method (RFC 9110), an ``Idempotency-Key``, or the caller's say-so.

Why not httpx: per request, httpx + httpcore + anyio cost the store client more CPU than the store server spent
answering (bench/store_http.py: ~0.9 ms of client CPU per request on 2 shared cores), and ~3 ms per loopback call
through the proxy on a loaded machine, against ~0.3 ms for one stream write and read. TLS stays on httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

__all__ = [
    "REPLAYABLE_METHODS",
    "Answer",
    "ConnectFailure",
    "Connection",
    "DroppedFailure",
    "Framing",
    "Head",
    "Http11Pool",
    "ProtocolFailure",
    "TimeoutFailure",
    "TransportFailure",
    "iter_body",
]

_STREAM_LIMIT: Final = 1 << 20  # also the longest answer head read
# Methods whose repetition acts once (RFC 9110 idempotent methods); others are re-sent only with an Idempotency-Key.
REPLAYABLE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})

Framing: TypeAlias = int | Literal["chunked"] | None
"""How the body ends: after this many bytes, at the last chunk, or (None) when the server closes the connection."""


class TransportFailure(ConnectionError):
    """The request could not be sent or its answer not read (connection refused, reset, closed, timed out)."""


class ConnectFailure(TransportFailure):
    """No connection could be opened (refused, unreachable, or the connect timed out: ``timed_out``)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class TimeoutFailure(TransportFailure):
    """The server did not answer (or finish a head or body) in time, or no pooled connection came free in time."""


class DroppedFailure(TransportFailure):
    """The connection ended under a request that may have reached the server, and it was not re-sent."""


class ProtocolFailure(TransportFailure):
    """The server's answer is not HTTP/1.x as this client reads it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, headers (lower-case names) and the whole body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True, slots=True)
class Head:
    """A final answer's head: status, header lines as sent, how the body ends, whether the connection stays open."""

    status: int
    raw_headers: list[tuple[bytes, bytes]]
    framing: Framing
    keep_alive: bool

    def headers(self) -> dict[str, str]:
        """Header names lower-cased (the last of repeated names wins)."""
        return {name.lower().decode("latin-1"): value.decode("latin-1") for name, value in self.raw_headers}


class Connection:
    """One keep-alive connection."""

    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Wrap an open stream pair."""
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        """False once the server closed it (an idle keep-alive timeout shows as EOF when the loop saw the FIN)."""
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        """Close it (idempotent)."""
        self.writer.close()


class _StaleConnection(Exception):
    """The connection ended before any byte of the answer arrived."""


class Http11Pool:
    """Keep-alive connections to one ``host:port`` on one event loop; at most ``max_connections`` busy at a time."""

    def __init__(self, host: str, port: int, *, max_connections: int | None = None, max_idle: int = 512) -> None:
        """A pool for ``host:port``; ``max_connections=None``: unbounded."""
        self.host = host
        self.port = port
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address goes in brackets
        self._host_header = f"host: {netloc}\r\n".encode("latin-1")
        self._idle: list[Connection] = []
        self._max_idle = max_idle
        self._slots = asyncio.Semaphore(max_connections) if max_connections is not None else None
        self._closed = False

    @property
    def where(self) -> str:
        """``host:port``, for messages."""
        return f"{self.host}:{self.port}"

    def message(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
        """The request as one buffer: request line, Host, the headers, Content-Length, body."""
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), self._host_header]
        head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
        payload = body or b""
        head.append(b"content-length: %d\r\n\r\n" % len(payload))
        return b"".join(head) + payload

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
        """Send one request and read its whole answer within ``timeout_s``; TransportFailure when the exchange fails.

        ``replayable``: whether the request may be re-sent on a fresh connection when a pooled one ends without an
        answer (it may have reached the server); default: idempotent methods and requests with an Idempotency-Key.
        """
        message = self.message(method, target, headers, body)
        if replayable is None:
            replayable = method in REPLAYABLE_METHODS or any(name.lower() == "idempotency-key" for name in headers)
        waited = True
        try:
            # The wait for a free connection counts against the timeout too: a full pool must not block forever.
            async with asyncio.timeout(timeout_s):
                async with self._slot():
                    waited = False
                    connection, head = await self.open(method, message, replayable=replayable)
                    try:
                        content = await _read_whole(connection.reader, head.framing)
                    except BaseException as exc:
                        connection.close()
                        if isinstance(exc, OSError | asyncio.IncompleteReadError | asyncio.LimitOverrunError):
                            raise TransportFailure(f"exchange with {self.where} failed: {exc!r}") from exc
                        raise
                    self.release(connection, keep=head.keep_alive and head.framing is not None)
                    return Answer(head.status, head.headers(), content)
        except TimeoutError as exc:
            what = "free connection" if waited else "answer"
            raise TimeoutFailure(f"no {what} from {self.where} within {timeout_s:.1f} s") from exc

    def _slot(self) -> contextlib.AbstractAsyncContextManager[object]:
        return self._slots if self._slots is not None else contextlib.nullcontext()

    async def open(
        self,
        method: str,
        message: bytes,
        *,
        replayable: bool,
        connect_s: float | None = None,
        read_s: float | None = None,
    ) -> tuple[Connection, Head]:
        """Send ``message`` on a pooled (or new) connection and read the final answer's head.

        The caller reads the body (:func:`iter_body`) and then hands the connection to :meth:`release`, or closes
        it. ``connect_s`` bounds a new connection's connect, ``read_s`` the wait for each answer head.
        """
        while self._idle:
            connection = self._idle.pop()
            if not connection.usable():
                connection.close()  # the server closed it while idle (keep-alive timeout): never send on it
                continue
            try:
                return connection, await self._send(connection, method, message, read_s)
            except _StaleConnection as exc:
                # Most often the server closed this idle connection (keep-alive timeout) before reading the request,
                # but a server that read it and died looks the same: only a request that acts once anyway is re-sent.
                if not replayable:
                    raise DroppedFailure(
                        f"{self.where} closed the connection after the {method} was sent; not re-sent, "
                        "since it may have acted and carries no Idempotency-Key"
                    ) from exc
        connection = await self._connect(connect_s)
        try:
            return connection, await self._send(connection, method, message, read_s)
        except _StaleConnection as exc:
            raise DroppedFailure(f"{self.where} closed the connection without answering") from exc

    async def _connect(self, connect_s: float | None) -> Connection:
        try:
            async with asyncio.timeout(connect_s):
                reader, writer = await asyncio.open_connection(self.host, self.port, limit=_STREAM_LIMIT)
        except TimeoutError as exc:
            raise ConnectFailure(f"connecting to {self.where} timed out", timed_out=True) from exc
        except OSError as exc:
            raise ConnectFailure(f"cannot connect to {self.where}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Connection(reader, writer)

    async def _send(self, connection: Connection, method: str, message: bytes, read_s: float | None) -> Head:
        answered = False
        try:
            connection.writer.write(message)
            await connection.writer.drain()
            while True:
                async with asyncio.timeout(read_s):
                    raw = await connection.reader.readuntil(b"\r\n\r\n")
                answered = True
                head = _parse_head(raw, method)
                # Interim answers (100 Continue, 103 Early Hints) precede the final one on the same connection.
                if not (100 <= head.status < 200 and head.status != 101):
                    return head
        except BaseException as exc:
            # Cancelled too (the caller hung up): the server may still answer on this socket, so it can never serve
            # another request; closing it also tells the server to stop.
            connection.close()
            if isinstance(exc, asyncio.IncompleteReadError | ConnectionError) and not answered:
                raise _StaleConnection from exc
            if isinstance(exc, TimeoutError):
                what = "the rest of its answer's head" if answered else "an answer"
                raise TimeoutFailure(f"{self.where} did not send {what} in time") from exc
            if isinstance(exc, ValueError | asyncio.LimitOverrunError):
                raise ProtocolFailure(f"{self.where} sent a malformed answer: {exc}") from exc
            if isinstance(exc, OSError | asyncio.IncompleteReadError):
                raise TransportFailure(f"exchange with {self.where} failed: {exc!r}") from exc
            raise

    def release(self, connection: Connection, *, keep: bool) -> None:
        """Give back a connection whose answer was read in full (``keep``: the server allows reuse)."""
        if keep and not self._closed and len(self._idle) < self._max_idle and connection.usable():
            self._idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        """Close every idle connection; busy ones close when their request ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for connection in idle:
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()


def _parse_head(raw: bytes, method: str) -> Head:
    """The answer head (status line and header lines, ending in a blank line) as read."""
    lines = raw[:-4].split(b"\r\n")
    status_line = lines[0]
    if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    status = int(status_line[9:12])
    raw_headers: list[tuple[bytes, bytes]] = []
    framing: Framing = None
    keep_alive = status_line.startswith(b"HTTP/1.1")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip(), value.strip()
        raw_headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length":
            framing = int(value)
        elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
            framing = "chunked"
        elif lowered == b"connection" and value.lower() == b"close":
            keep_alive = False
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        framing = 0
    return Head(status, raw_headers, framing, keep_alive)


async def _read_whole(reader: asyncio.StreamReader, framing: Framing) -> bytes:
    if isinstance(framing, int):
        return await reader.readexactly(framing)
    parts = [chunk async for chunk in iter_body(reader, framing, None)]
    return b"".join(parts)


async def iter_body(reader: asyncio.StreamReader, framing: Framing, read_s: float | None) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive, each read within ``read_s``; IncompleteReadError if the server hangs up."""
    if isinstance(framing, int):
        remaining = framing
        while remaining > 0:
            async with asyncio.timeout(read_s):
                chunk = await reader.read(min(remaining, 65536))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(chunk)
            yield chunk
    elif framing == "chunked":
        while True:
            async with asyncio.timeout(read_s):
                size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                async with asyncio.timeout(read_s):
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                        pass
                return
            async with asyncio.timeout(read_s):
                chunk = await reader.readexactly(size + 2)  # the chunk and its CRLF
            yield chunk[:-2]
    else:  # no framing: the body ends when the server closes the connection
        while True:
            async with asyncio.timeout(read_s):
                chunk = await reader.read(65536)
            if not chunk:
                return
            yield chunk
