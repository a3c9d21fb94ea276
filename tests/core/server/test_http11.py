"""The store client's lean HTTP/1.1 pool against raw loopback servers: reuse, stale connections, framing, failures."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agentlightning._http11 import Http11Pool, TransportFailure

Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


class _Server:
    """A loopback TCP server answering each request with ``respond``; counts connections."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while not reader.at_eof():
                try:
                    self.requests.append(await _read_request(reader))
                except asyncio.IncompleteReadError:
                    return
                await self.respond(reader, writer)
                if writer.is_closing():
                    return
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]]]:
    servers: list[asyncio.Server] = []
    pools: list[Http11Pool] = []

    async def start(respond: Respond) -> tuple[_Server, Http11Pool]:
        state = _Server(respond)
        server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        servers.append(server)
        pool = Http11Pool("127.0.0.1", server.sockets[0].getsockname()[1], max_connections=4)
        pools.append(pool)
        return state, pool

    yield start
    for pool in pools:
        await pool.aclose()
    for server in servers:
        server.close()
        await server.wait_closed()


async def _ok(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
    await writer.drain()


async def test_one_connection_serves_many_requests(
    serve: Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]],
) -> None:
    server, pool = await serve(_ok)
    for _ in range(5):
        answer = await pool.request("POST", "/v1/x?a=1", {"authorization": "Bearer t"}, b'{"k":1}', 5.0)
        assert (answer.status_code, answer.headers["content-type"], answer.content) == (200, "application/json", b"{}")
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % pool.port)
    assert b"authorization: Bearer t\r\n" in first
    assert first.endswith(b'content-length: 7\r\n\r\n{"k":1}')


async def test_connection_closed_by_the_server_is_replaced(
    serve: Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]],
) -> None:
    async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _ok(reader, writer)
        writer.close()  # as a keep-alive timeout would, without saying so in the answer

    server, pool = await serve(answer_then_close)
    for _ in range(3):
        assert (await pool.request("GET", "/", {}, None, 5.0)).status_code == 200
    assert server.connections == 3 and len(server.requests) == 3  # each request ran once


async def test_chunked_and_close_delimited_answers(
    serve: Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]],
) -> None:
    async def chunked(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
        )
        await writer.drain()

    _, pool = await serve(chunked)
    answer = await pool.request("GET", "/", {}, None, 5.0)
    assert (answer.status_code, answer.content) == (404, b"abcde")

    async def until_close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    _, pool = await serve(until_close)
    assert (await pool.request("GET", "/", {}, None, 5.0)).content == b"all of it"


async def test_refused_garbled_and_silent_servers_fail_as_transport_errors(
    serve: Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransportFailure, match="cannot connect"):
        await Http11Pool("127.0.0.1", port, max_connections=1).request("GET", "/", {}, None, 5.0)

    async def garbled(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()

    _, pool = await serve(garbled)
    with pytest.raises(TransportFailure, match="status line"):
        await pool.request("GET", "/", {}, None, 5.0)

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    _, pool = await serve(silent)
    with pytest.raises(TransportFailure, match=r"within 0\.2 s"):
        await pool.request("GET", "/", {}, None, 0.2)
