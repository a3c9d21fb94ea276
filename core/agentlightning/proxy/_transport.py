"""A lean HTTP/1.1 keep-alive transport for plain-``http://`` upstreams (vLLM, our policy server on the cluster).

Why: on a loaded machine httpx's default transport (httpcore over anyio) cost ~3 ms per loopback call in our
benchmark, against ~0.3 ms for one asyncio stream write and read; the proxy sits on every LLM call. This transport
keeps the ``httpx.AsyncClient`` interface (the proxy code is the same for both) and handles only what OpenAI-
compatible servers send: ``content-length`` or ``chunked`` bodies, or a body that ends when the connection closes.
``https://`` upstreams go through httpx's own transport.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx

_CRLF = b"\r\n"
# Methods whose repetition acts once (RFC 9110 idempotent methods); others are re-sent only with an Idempotency-Key.
_REPLAYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
REPLAYABLE_EXTENSION = "agentlightning.replayable"
"""Request extension a caller sets True for a request that acts once however often it is sent (any method)."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    """The response body; the connection goes back to the pool once the body has been read to its end."""

    def __init__(
        self,
        transport: LeanHTTPTransport,
        key: tuple[str, int],
        conn: _Connection,
        framing: int | str | None,
        *,
        reusable: bool,
        timeout: float | None,
    ) -> None:
        self._transport, self._key, self._conn = transport, key, conn
        self._framing = framing
        self._reusable = reusable and framing is not None  # a close-delimited body uses the connection up
        self._timeout = timeout
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        try:
            if isinstance(self._framing, int):
                remaining = self._framing
                while remaining > 0:
                    chunk = await self._read(reader.read(min(remaining, 65536)))
                    if not chunk:
                        raise httpx.RemoteProtocolError("the upstream closed the connection mid-body")
                    remaining -= len(chunk)
                    yield chunk
            elif self._framing == "chunked":
                while True:
                    size_line = await self._read(reader.readline())
                    if not size_line:
                        raise httpx.RemoteProtocolError("the upstream closed the connection mid-body")
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        while (await self._read(reader.readline())) not in (_CRLF, b"\n", b""):
                            pass  # trailers
                        break
                    chunk = await self._read(reader.readexactly(size + 2))
                    yield chunk[:-2]
            else:  # no framing: the body ends when the upstream closes the connection
                while chunk := await self._read(reader.read(65536)):
                    yield chunk
            self._done = True
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            raise httpx.ReadTimeout("the upstream did not answer in time") from exc
        except (asyncio.IncompleteReadError, OSError) as exc:
            raise httpx.ReadError(f"reading the upstream's answer failed: {exc!r}") from exc

    async def _read(self, read: Any) -> Any:
        if self._timeout is None:
            return await read
        return await asyncio.wait_for(read, self._timeout)

    async def aclose(self) -> None:
        """Return the connection to the pool when the body was read in full, else close it."""
        if self._done and self._reusable:
            self._transport.release(self._key, self._conn)
        else:
            self._conn.close()
        self._done = self._reusable = False


class LeanHTTPTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over pooled asyncio streams: one write per request, TCP_NODELAY, keep-alive."""

    def __init__(self, max_idle_per_host: int = 512) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle_per_host

    def release(self, key: tuple[str, int], conn: _Connection) -> None:
        """Put a connection whose last answer was read in full back in the pool."""
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._max_idle and not conn.reader.at_eof():
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, host: str, port: int, connect_s: float | None) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 20), connect_s)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request; the response body streams from the connection."""
        url = request.url
        key = (url.host, url.port or 80)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()
        lines = [f"{request.method} {url.raw_path.decode()} HTTP/1.1".encode()]
        lines += [name + b": " + value for name, value in request.headers.raw if name.lower() != b"transfer-encoding"]
        if b"content-length" not in (name.lower() for name, _ in request.headers.raw):
            lines.append(b"content-length: " + str(len(body)).encode())
        payload = _CRLF.join(lines) + _CRLF + _CRLF + body
        idle = self._idle.get(key)
        while idle and (idle[-1].reader.at_eof() or idle[-1].writer.is_closing()):
            idle.pop().close()  # the upstream closed it while idle (keep-alive timeout): never send on it
        # A pooled connection can still be closed under a request in flight; the request may then have reached the
        # upstream, so only one that acts once when repeated is re-sent on a fresh connection.
        replayable = (
            request.method in _REPLAYABLE_METHODS
            or "idempotency-key" in request.headers
            or request.extensions.get(REPLAYABLE_EXTENSION) is True
        )
        for reused in (True, False):
            conn = idle.pop() if reused and idle else await self._connect(key[0], key[1], timeouts.get("connect"))
            try:
                conn.writer.write(payload)
                status_line = await asyncio.wait_for(conn.reader.readline(), timeouts.get("read"))
                if not status_line:
                    raise ConnectionResetError("connection closed before the status line")
            except TimeoutError as exc:  # before OSError: TimeoutError is one
                conn.close()
                raise httpx.ReadTimeout(f"the upstream {key[0]}:{key[1]} did not answer in time") from exc
            except OSError as exc:
                conn.close()
                if reused and idle is not None and replayable:
                    continue
                raise httpx.ReadError(f"the upstream {key[0]}:{key[1]} dropped the request: {exc!r}") from exc
            except BaseException:
                # Cancelled (the agent hung up, the proxy's deadline passed): the upstream may still answer on this
                # socket, so it can never serve another request; closing it also tells the upstream to stop.
                conn.close()
                raise
            return await self._response(request, key, conn, status_line, timeouts.get("read"))
        raise AssertionError("unreachable: the second try raises or returns")

    async def _response(
        self,
        request: httpx.Request,
        key: tuple[str, int],
        conn: _Connection,
        status_line: bytes,
        read_s: float | None,
    ) -> httpx.Response:
        try:
            while True:
                parts = status_line.split(b" ", 2)
                status = int(parts[1])
                headers: list[tuple[bytes, bytes]] = []
                framing: int | str | None = None
                keep_alive = True
                # Each header line within the read timeout: an upstream that stalls mid-head is not waited on forever.
                while (line := await asyncio.wait_for(conn.reader.readline(), read_s)) not in (_CRLF, b"\n", b""):
                    name, _, value = line.partition(b":")
                    name, value = name.strip(), value.strip()
                    headers.append((name, value))
                    lowered = name.lower()
                    if lowered == b"content-length":
                        framing = int(value)
                    elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
                        framing = "chunked"
                    elif lowered == b"connection" and value.lower() == b"close":
                        keep_alive = False
                if not (100 <= status < 200 and status != 101):
                    break
                # An interim answer (100 Continue, 103 Early Hints): the final one follows on the same connection.
                status_line = await asyncio.wait_for(conn.reader.readline(), read_s)
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            conn.close()
            raise httpx.ReadTimeout(
                f"the upstream {key[0]}:{key[1]} stalled in the middle of its answer's head"
            ) from exc
        except (ValueError, IndexError, OSError) as exc:
            conn.close()
            raise httpx.RemoteProtocolError(f"the upstream sent a malformed answer: {status_line!r}") from exc
        except BaseException:  # cancelled mid-headers: the rest of the answer would desynchronise the connection
            conn.close()
            raise
        if request.method == "HEAD" or status in (204, 304):
            framing = 0
        stream = _Body(self, key, conn, framing, reusable=keep_alive, timeout=read_s)
        return httpx.Response(status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        """Close every pooled connection."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
