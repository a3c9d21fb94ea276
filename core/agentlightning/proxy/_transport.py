"""The proxy's transport for plain-``http://`` upstreams (vLLM, our policy server): httpx's interface over
:mod:`agentlightning._http11`, the project's one HTTP/1.1 client, with the answer's body streamed.

The proxy code is the same for this transport and httpx's own (``https://`` upstreams). Errors come back as httpx's
exception types, so the proxy handles both alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from contextlib import contextmanager

import httpx

from agentlightning._http11 import (
    REPLAYABLE_METHODS,
    ConnectFailure,
    Connection,
    Framing,
    Http11Pool,
    ProtocolFailure,
    TimeoutFailure,
    TransportFailure,
    iter_body,
)

__all__ = ["REPLAYABLE_EXTENSION", "LeanHTTPTransport"]

REPLAYABLE_EXTENSION = "agentlightning.replayable"
"""Request extension a caller sets True for a request that acts once however often it is sent (any method)."""
_CRLF = b"\r\n"


@contextmanager
def _as_httpx(where: str) -> Generator[None]:
    """The shared client's failures as httpx's exceptions."""
    try:
        yield
    except ConnectFailure as exc:
        raise (httpx.ConnectTimeout if exc.timed_out else httpx.ConnectError)(str(exc)) from exc
    except TimeoutFailure as exc:
        raise httpx.ReadTimeout(f"the upstream {exc}") from exc
    except ProtocolFailure as exc:
        raise httpx.RemoteProtocolError(f"the upstream {where} sent a malformed answer: {exc}") from exc
    except (TransportFailure, asyncio.IncompleteReadError, OSError) as exc:
        raise httpx.ReadError(f"the upstream {where} dropped the request: {exc!r}") from exc
    except ValueError as exc:  # a bad chunk size line
        raise httpx.RemoteProtocolError(f"the upstream {where} sent a malformed body: {exc}") from exc


class _Body(httpx.AsyncByteStream):
    """The response body; the connection goes back to the pool once the body has been read to its end."""

    def __init__(
        self, pool: Http11Pool, conn: Connection, framing: Framing, *, keep: bool, read_s: float | None
    ) -> None:
        self._pool, self._conn = pool, conn
        self._framing: Framing = framing
        self._keep = keep and framing is not None  # a close-delimited body uses the connection up
        self._read_s = read_s
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx(self._pool.where):
            try:
                async for chunk in iter_body(self._conn.reader, self._framing, self._read_s):
                    yield chunk
            except TimeoutError as exc:
                raise TimeoutFailure("did not send its answer's body in time") from exc
        self._done = True

    async def aclose(self) -> None:
        """Return the connection to the pool when the body was read in full, else close it."""
        if self._done:
            self._pool.release(self._conn, keep=self._keep)
        else:
            self._conn.close()
        self._done = self._keep = False


class LeanHTTPTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over pooled asyncio streams, one pool per upstream ``host:port``."""

    def __init__(self, max_idle_per_host: int = 512) -> None:
        """Keep at most ``max_idle_per_host`` idle connections per upstream."""
        self._pools: dict[tuple[str, int], Http11Pool] = {}
        self._max_idle = max_idle_per_host

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request; the response body streams from the connection."""
        url = request.url
        key = (url.host, url.port or 80)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = Http11Pool(key[0], key[1], max_idle=self._max_idle)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()
        lines = [f"{request.method} {url.raw_path.decode()} HTTP/1.1".encode()]
        lines += [name + b": " + value for name, value in request.headers.raw if name.lower() != b"transfer-encoding"]
        if b"content-length" not in (name.lower() for name, _ in request.headers.raw):
            lines.append(b"content-length: " + str(len(body)).encode())
        message = _CRLF.join(lines) + _CRLF + _CRLF + body
        replayable = (
            request.method in REPLAYABLE_METHODS
            or "idempotency-key" in request.headers
            or request.extensions.get(REPLAYABLE_EXTENSION) is True
        )
        read_s = timeouts.get("read")
        with _as_httpx(pool.where):
            conn, head = await pool.open(
                request.method, message, replayable=replayable, connect_s=timeouts.get("connect"), read_s=read_s
            )
        stream = _Body(pool, conn, head.framing, keep=head.keep_alive, read_s=read_s)
        return httpx.Response(
            head.status, headers=head.raw_headers, stream=stream, extensions={"http_version": b"HTTP/1.1"}
        )

    async def aclose(self) -> None:
        """Close every pooled connection."""
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            await pool.aclose()
