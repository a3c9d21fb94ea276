"""The lean upstream transport against hand-written HTTP/1.1 servers: framings, keep-alive, stale connections."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

import httpx
import pytest

from agentlightning.proxy._transport import REPLAYABLE_EXTENSION, LeanHTTPTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x"


async def _post(
    transport: LeanHTTPTransport, url: str, body: bytes, extensions: Mapping[str, object] | None = None
) -> httpx.Response:
    request = httpx.Request("POST", url, content=body, extensions=dict(extensions or {}))
    response = await transport.handle_async_request(request)
    await response.aread()
    await response.aclose()
    return response


async def test_chunked_and_close_delimited_bodies() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await _read_request(reader)
        if body == b"chunked":
            writer.write(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\n"
            )
            await writer.drain()
            await _read_request(reader)  # the same connection serves the next call
            writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    transport = LeanHTTPTransport()
    async with server:
        chunked = await _post(transport, url, b"chunked")
        assert (chunked.status_code, chunked.content) == (200, b"abcde")
        reused = await _post(transport, url, b"again")
        assert (reused.status_code, reused.content) == (201, b"ok")
        # The server closed the connection after "again": only a request marked replayable is re-sent on a new one.
        closed = await _post(transport, url, b"close", {REPLAYABLE_EXTENSION: True})
        assert closed.content == b"until the end"
        await transport.aclose()


async def test_stale_pooled_connection_is_retried_once_on_a_fresh_one_when_replayable() -> None:
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await _read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
        await writer.drain()
        writer.close()  # keep-alive promised, connection dropped anyway (an idle timeout upstream)

    server, url = await _serve(handler)
    transport = LeanHTTPTransport()
    replayable = {REPLAYABLE_EXTENSION: True}
    async with server:
        for _ in range(3):
            assert (await _post(transport, url, b"x", replayable)).content == b"hi"
        await transport.aclose()
    assert received == [b"x"] * 3  # each ran once: the dropped connection never read the re-sent request


async def test_a_post_that_may_have_reached_the_upstream_is_not_re_sent() -> None:
    calls = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            calls += 1
            if calls == 2:  # read (it may have acted), then the connection drops without an answer
                break
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
            await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    transport = LeanHTTPTransport()
    async with server:
        assert (await _post(transport, url, b"x")).content == b"hi"
        with pytest.raises(httpx.ReadError, match="dropped the request"):
            await _post(transport, url, b"x")
        assert calls == 2
        await transport.aclose()


async def test_interim_answers_are_skipped_and_a_stalled_head_times_out() -> None:
    finished = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (body := await _read_request(reader)) == b"interim":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
            await writer.drain()
        assert body == b"stall"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")  # and then nothing
        await writer.drain()
        await reader.read()  # until the transport gives up and closes the connection
        writer.close()
        finished.set()

    server, url = await _serve(handler)
    transport = LeanHTTPTransport()
    timeout = {"timeout": {"connect": 1.0, "read": 0.3}}
    async with server:
        answer = await _post(transport, url, b"interim", timeout)
        assert (answer.status_code, answer.content) == (200, b"hi")
        with pytest.raises(httpx.ReadTimeout, match="did not send an answer in time"):
            await _post(transport, url, b"stall", timeout)
        await transport.aclose()
        await asyncio.wait_for(finished.wait(), 5)  # the server saw the stalled connection closed


async def test_unreachable_and_malformed_upstreams_raise_httpx_errors() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"garbage\r\n\r\n")
        await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    transport = LeanHTTPTransport()
    async with server:
        with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
            await _post(transport, url, b"x")
    with pytest.raises(httpx.ConnectError):
        await _post(transport, url, b"x")  # the server is gone
    await transport.aclose()
