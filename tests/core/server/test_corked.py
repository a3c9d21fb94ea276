"""Corked writes: what one loop turn writes leaves in one write; close and write_eof flush first."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from agentlightning.client import LightningStoreClient
from agentlightning.server import StoreServer, create_app
from agentlightning.server._corked import CorkedHttpProtocol, CorkedTransport
from agentlightning.server._run import _uvicorn_config  # pyright: ignore[reportPrivateUsage] -- what serve_store runs
from agentlightning.store import InMemoryLightningStore, NotFoundError


class _RecordingTransport(asyncio.Transport):
    """Records what reaches the socket layer."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


async def test_one_turns_writes_leave_together() -> None:
    inner = _RecordingTransport()
    corked = CorkedTransport(inner)
    corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    corked.writelines([b"{", b"}"])
    assert inner.writes == [] and corked.get_write_buffer_size() == 21
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    corked.write(b"next")
    corked.close()  # flushes before closing, and nothing is written after
    assert inner.writes[-1] == b"next" and inner.closed
    await asyncio.sleep(0)
    assert len(inner.writes) == 2


async def test_served_answers_are_whole() -> None:
    with StoreServer(InMemoryLightningStore()) as server:
        client = LightningStoreClient(server.url)
        try:
            rollout = await client.enqueue_rollout({"x": 1})
            assert (await client.get_rollout(rollout.rollout_id)).input == {"x": 1}
            with pytest.raises(NotFoundError, match="ro-missing"):
                await client.get_rollout("ro-missing")
        finally:
            await client.close()


# Pipelined on one keep-alive connection: small JSON answers, errors, a large body, a HEAD, a 405, then close.
_REQUESTS = (
    b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n"
    b"GET /v1/statistics HTTP/1.1\r\nhost: t\r\n\r\n"
    b"GET /v1/rollouts/ro-missing HTTP/1.1\r\nhost: t\r\n\r\n"
    b"POST /v1/rollouts HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\n{oops"
    b"GET /openapi.json HTTP/1.1\r\nhost: t\r\n\r\n"
    b"HEAD /health HTTP/1.1\r\nhost: t\r\n\r\n"
    b"PUT /v1/resources HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n"
    b"GET /health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
)


async def _raw_exchange(http: Any) -> bytes:
    """Serve a fresh store with uvicorn's ``http`` protocol and return the bytes of the pipelined answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until uvicorn accepts them
    port = sock.getsockname()[1]
    config = _uvicorn_config(create_app(InMemoryLightningStore()), "127.0.0.1", port, "warning")
    config.http = http
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_REQUESTS)
        answer = await asyncio.wait_for(reader.read(), 10)  # until the server closes after the last request
        writer.close()
        return answer
    finally:
        server.should_exit = True
        await serving
        sock.close()


def _without_dates(raw: bytes) -> bytes:
    return b"\r\n".join(line for line in raw.split(b"\r\n") if not line.lower().startswith(b"date:"))


async def test_corked_protocol_answers_byte_for_byte_like_uvicorns_own() -> None:
    """The same pipelined requests through CorkedHttpProtocol and uvicorn's httptools protocol: the same bytes.

    A new uvicorn release that changes what the protocol writes, or when, fails here rather than for a user.
    """
    corked = await _raw_exchange(CorkedHttpProtocol)
    plain = await _raw_exchange("httptools")
    assert corked.count(b"HTTP/1.1 ") == 8, corked[:2000]
    assert _without_dates(corked) == _without_dates(plain)
