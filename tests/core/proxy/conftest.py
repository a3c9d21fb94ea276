"""Fixtures for the LLM proxy tests: a real in-memory store, the fake upstream, and the proxy on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, FakeOpenAIServer
from agentlightning.types import Span


@dataclass
class ProxyRig:
    """Store + fake upstream + proxy, with helpers the tests share."""

    store: InMemoryLightningStore
    fake: FakeOpenAI
    upstream: FakeOpenAIServer
    proxy: ProxyServer

    def new_attempt(self) -> tuple[str, str]:
        """Enqueue and claim a rollout; (rollout_id, attempt_id)."""

        async def make() -> tuple[str, str]:
            await self.store.enqueue_rollout({"task": "t"})
            claimed = await self.store.claim_rollout("worker")
            assert claimed is not None
            return claimed.rollout.rollout_id, claimed.attempt.attempt_id

        return asyncio.run(make())

    def spans(self, rollout_id: str) -> list[Span]:
        """Spans of a rollout, after the proxy has written everything it recorded."""
        self.proxy.flush()
        return asyncio.run(self.store.query_spans(rollout_id))


@pytest.fixture
def fake() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture
def rig(fake: FakeOpenAI) -> Iterator[ProxyRig]:
    store = InMemoryLightningStore()
    with fake.serve() as upstream, ProxyServer(store, upstream.base_url) as proxy:
        yield ProxyRig(store, fake, upstream, proxy)
