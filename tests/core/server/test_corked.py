"""Corked writes: what one loop turn writes leaves in one write; close and write_eof flush first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.server import StoreServer
from agentlightning.server._corked import CorkedTransport
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
