"""Fixtures for the LLM proxy tests: a real in-memory store, the fake upstream, and the proxy on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, FakeOpenAIServer
from agentlightning.types import Span


@dataclass
class ProxyRig:
    """Store + fake upstream + proxy, with helpers the tests share; clients it makes are closed at teardown."""

    store: InMemoryLightningStore
    fake: FakeOpenAI
    upstream: FakeOpenAIServer | None
    proxy: ProxyServer
    stack: ExitStack = field(repr=False)

    @property
    def upstream_url(self) -> str:
        assert self.upstream is not None, "this rig has no upstream on purpose"
        return self.upstream.base_url

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

    def client(self, base_url: str, **options: Any) -> openai.OpenAI:
        """A sync openai client closed at teardown."""
        return self.stack.enter_context(openai.OpenAI(base_url=base_url, api_key="k", **options))


@pytest.fixture
def make_rig() -> Iterator[Callable[..., ProxyRig]]:
    """Builds rigs: ``make_rig(fake)`` or ``make_rig(fake, upstream_url=...)`` for an upstream that is not the fake."""
    with ExitStack() as stack:

        def make(fake: FakeOpenAI, upstream_url: str | None = None) -> ProxyRig:
            store = InMemoryLightningStore()
            upstream = None if upstream_url is not None else stack.enter_context(fake.serve())
            url = upstream.base_url if upstream is not None else str(upstream_url)
            proxy = stack.enter_context(ProxyServer(store, url))
            return ProxyRig(store, fake, upstream, proxy, stack)

        yield make


@pytest.fixture
def fake() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture
def rig(fake: FakeOpenAI, make_rig: Callable[..., ProxyRig]) -> ProxyRig:
    return make_rig(fake)
