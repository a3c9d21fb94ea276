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


async def test_interim_1xx_answers_are_skipped_for_the_final_one(
    serve: Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]],
) -> None:
    async def interim_then_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n")
        await _ok(reader, writer)

    state, pool = await serve(interim_then_ok)
    first = await pool.request("POST", "/x", {}, b"{}", 5.0)
    assert (first.status_code, first.content) == (200, b"{}")
    second = await pool.request("POST", "/x", {}, b"{}", 5.0)  # the connection stayed in step
    assert (second.status_code, state.connections) == (200, 1)


async def test_the_wait_for_a_free_connection_is_bounded(
    serve: Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]],
) -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        await _ok(reader, writer)

    _, pool = await serve(slow)  # max_connections=4
    busy = [asyncio.create_task(pool.request("GET", "/x", {}, None, 30.0)) for _ in range(4)]
    await asyncio.sleep(0.1)
    with pytest.raises(TransportFailure, match="no free connection"):
        await pool.request("GET", "/x", {}, None, 0.3)
    release.set()
    assert [answer.status_code for answer in await asyncio.gather(*busy)] == [200] * 4


async def test_a_post_that_may_have_acted_is_not_re_sent_without_a_key(
    serve: Callable[[Respond], Awaitable[tuple[_Server, Http11Pool]]],
) -> None:
    answers = 0

    async def drop_the_second_and_fourth(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # These two requests are read (they may have acted) and their connection dropped without an answer.
        nonlocal answers
        answers += 1
        if answers in (2, 4):
            writer.close()
        else:
            await _ok(reader, writer)

    state, pool = await serve(drop_the_second_and_fourth)
    assert (await pool.request("POST", "/x", {}, b"{}", 5.0)).status_code == 200
    with pytest.raises(TransportFailure, match="not re-sent"):
        await pool.request("POST", "/x", {}, b"{}", 5.0)
    assert len(state.requests) == 2  # sent once, not twice

    # With an Idempotency-Key (or an idempotent method) the same loss is re-sent on a fresh connection.
    assert (await pool.request("POST", "/x", {}, b"{}", 5.0)).status_code == 200
    keyed = await pool.request("POST", "/x", {"Idempotency-Key": "k1"}, b"{}", 5.0)
    assert keyed.status_code == 200 and len(state.requests) == 5
