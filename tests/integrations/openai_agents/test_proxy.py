"""Through the LLM proxy: each LLM call has a hook span and a proxy span sharing ``gen_ai.response.id``, joined."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI

from agentlightning import semconv as sc
from agentlightning.adapter import find_llm_calls
from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI
from agentlightning.tracing import LightningTracer, StoreSpanSink, init_tracing, rollout_context, shutdown_tracing
from agentlightning.types.spans import Span
from agentlightning_openai_agents import instrument
from tests.integrations.openai_agents.fakes import ANSWERS, Api, reply, upstream_models
from tests.integrations.openai_agents.test_team import run_team


class _Rig:
    """Store, fake upstream and proxy on loopback; hook spans reach the same store through the tracing pipeline."""

    def __init__(self, store: InMemoryLightningStore, proxy: ProxyServer, tracer: LightningTracer) -> None:
        self.store = store
        self.proxy = proxy
        self.tracer = tracer

    def new_attempt(self) -> tuple[str, str]:
        async def claim() -> tuple[str, str]:
            await self.store.enqueue_rollout({"task": "weather"})
            claimed = await self.store.claim_rollout("worker")
            assert claimed is not None
            return claimed.rollout.rollout_id, claimed.attempt.attempt_id

        return asyncio.run(claim())

    def spans(self, rollout_id: str) -> list[Span]:
        self.tracer.flush()
        self.proxy.flush()
        return asyncio.run(self.store.query_spans(rollout_id))


@pytest.fixture
def rig() -> Iterator[_Rig]:
    store = InMemoryLightningStore()
    with FakeOpenAI(reply=reply).serve() as upstream, ProxyServer(store, upstream.base_url) as proxy:
        try:
            yield _Rig(store, proxy, init_tracing(StoreSpanSink(store)))
        finally:
            shutdown_tracing()


@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_hook_and_proxy_spans_join(rig: _Rig, api: Api, stream: bool) -> None:
    """The team via the proxy: three calls, each a hook twin (agent name) joined to a proxy twin (token ids)."""
    instrument()
    rollout_id, attempt_id = rig.new_attempt()

    async def run() -> str:
        async with AsyncOpenAI(base_url=rig.proxy.url_for(rollout_id, attempt_id), api_key="k") as client:
            with rollout_context(rollout_id, attempt_id):
                return await run_team(upstream_models(client, api), "weather", stream=stream)

    assert asyncio.run(run()) == ANSWERS["weather"]
    spans = rig.spans(rollout_id)
    hook = [s for s in spans if s.attributes.get(sc.SPAN_SOURCE) == sc.SOURCE_HOOK and s.name.startswith("chat")]
    proxy = [s for s in spans if s.attributes.get(sc.SPAN_SOURCE) == sc.SOURCE_PROXY]
    assert len(hook) == len(proxy) == 3
    hook_ids = sorted(str(s.attributes.get(sc.GEN_AI_RESPONSE_ID)) for s in hook)
    assert hook_ids == sorted(str(s.attributes.get(sc.GEN_AI_RESPONSE_ID)) for s in proxy)

    calls = find_llm_calls(spans)
    assert [call.agent_name for call in calls] == ["triage", "weather", "weather"]
    for call in calls:
        assert sorted(call.sources) == ["hook", "proxy"]
        assert call.has_token_ids
