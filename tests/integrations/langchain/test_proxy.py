"""Through the LLM proxy: the hook's spans and the proxy's spans of each call join into one call with token ids."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_openai import ChatOpenAI

from agentlightning import semconv
from agentlightning.adapter import find_llm_calls
from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, FakeReply, FakeRequest, FakeToolCall
from agentlightning.tracing import StoreSpanSink, init_tracing, rollout_context, shutdown_tracing
from agentlightning.types.spans import Span
from agentlightning_langchain import LightningCallbackHandler
from tests.integrations.langchain.fakes import build_react_agent, make_add_tool, team_input


def _add_then_answer(request: FakeRequest) -> FakeReply:
    """A tool loop: call add(2, 3) first, answer once the tool result is in the conversation."""
    if request.has_tool_results:
        return FakeReply(text="The sum is 5.")
    return FakeReply(tool_calls=[FakeToolCall("add", '{"a":2,"b":3}', id="call_add")])


class _Rig:
    """Store, fake upstream and proxy on loopback; hook spans go to the same store through the tracing pipeline."""

    def __init__(self, store: InMemoryLightningStore, proxy: ProxyServer) -> None:
        self.store = store
        self.proxy = proxy
        self.tracer = init_tracing(StoreSpanSink(store))

    def new_attempt(self) -> tuple[str, str]:
        async def claim() -> tuple[str, str]:
            await self.store.enqueue_rollout({"task": "add"})
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
    with FakeOpenAI(reply=_add_then_answer).serve() as upstream, ProxyServer(store, upstream.base_url) as proxy:
        try:
            yield _Rig(store, proxy)
        finally:
            shutdown_tracing()


# langchain-openai 1.7 drops the ``chat.completion.chunk`` id when it streams Chat Completions (it never reads
# ``chunk["id"]``; the merged message keeps LangChain's own ``lc_run--`` id), so no callback can learn the response
# id of a streamed Chat Completions call. The Responses API keeps it (``response_metadata["id"]``) in both modes.


@pytest.mark.parametrize(
    ("mode", "api"),
    [
        ("invoke", "chat"),
        ("invoke", "responses"),
        ("stream", "responses"),
        ("astream", "responses"),
        ("stream", "chat"),
        ("astream", "chat"),
    ],
)
def test_hook_and_proxy_spans_join(mode: str, api: str, rig: _Rig) -> None:
    """A prebuilt agent on ChatOpenAI via the proxy: every LLM call has a hook twin and a proxy twin, joined."""
    rollout_id, attempt_id = rig.new_attempt()
    model: Any = ChatOpenAI(
        model="policy",
        base_url=rig.proxy.url_for(rollout_id, attempt_id),
        api_key="k",  # pyright: ignore[reportArgumentType]  # langchain-openai types it as SecretStr
        streaming=mode != "invoke",
        use_responses_api=api == "responses",
    )
    graph = build_react_agent(model, [make_add_tool()])
    config: Any = {"callbacks": [LightningCallbackHandler()]}
    with rollout_context(rollout_id, attempt_id):
        if mode == "invoke":
            result = graph.invoke(team_input(), config)
            assert result["messages"][-1].text == "The sum is 5."
        elif mode == "stream":
            assert list(graph.stream(team_input(), config, stream_mode="messages"))
        else:

            async def consume() -> int:
                return len([item async for item in graph.astream(team_input(), config, stream_mode="messages")])

            assert asyncio.run(consume()) > 0

    spans = rig.spans(rollout_id)
    hook = [s for s in spans if s.attributes.get(semconv.SPAN_SOURCE) == "hook" and s.name.startswith("chat")]
    proxy = [s for s in spans if s.attributes.get(semconv.SPAN_SOURCE) == "proxy"]
    assert len(hook) == len(proxy) == 2
    if not (api == "chat" and mode != "invoke"):
        hook_ids = sorted(str(s.attributes.get(semconv.GEN_AI_RESPONSE_ID)) for s in hook)
        assert hook_ids == sorted(str(s.attributes.get(semconv.GEN_AI_RESPONSE_ID)) for s in proxy)
        assert all(hook_ids)
    # else: langchain-openai discards the streamed chat.completion id, so the hook span has none; the adapter
    # joins it with the proxy span recorded inside its time window instead.

    calls = find_llm_calls(spans)
    assert len(calls) == 2
    for call in calls:
        assert sorted(call.sources) == ["hook", "proxy"]
        assert call.has_token_ids
        assert call.agent_name == "agent"
