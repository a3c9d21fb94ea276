"""``crewai.LLM("openai/…")`` against the fake upstream, directly and through the LLM proxy; the adapter on top."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from crewai import LLM

import agentlightning_crewai
from agentlightning import semconv as sc
from agentlightning.adapter import TraceAdapter, find_llm_calls
from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, FakeReply, FakeRequest, FakeToolCall
from agentlightning.tracing import LightningTracer, StoreSpanSink, init_tracing, rollout_context, shutdown_tracing
from agentlightning.types import Rollout
from agentlightning.types.spans import Span
from tests.integrations.conformance import assert_span_tree, shape
from tests.integrations.crewai.fakes import SEQUENTIAL_SHAPE, build_crew

ROLES = ("planner", "specialist", "critic")


def crew_reply(request: FakeRequest) -> FakeReply:
    """Planner and critic answer at once; the specialist calls add(2, 3) (native tool call), then answers."""
    system = next((str(m.get("content", "")) for m in request.messages if m.get("role") == "system"), "")
    if "You are specialist" in system and not request.has_tool_results:
        return FakeReply(tool_calls=[FakeToolCall("add", '{"a": 2, "b": 3}', id="call_add")])
    if "You are specialist" in system:
        return FakeReply(text="5")
    return FakeReply(text="add 2 and 3" if "You are planner" in system else "correct")


@contextlib.contextmanager
def openai_llms(base_url: str, *, stream: bool = False) -> Iterator[dict[str, Any]]:
    """One ``crewai.LLM`` per agent on an OpenAI-compatible endpoint (CrewAI's native OpenAI provider)."""
    llms = {
        role: LLM(model="openai/policy", base_url=base_url, api_key="k", max_retries=0, stream=stream) for role in ROLES
    }
    try:
        yield llms
    finally:
        for llm in llms.values():
            # CrewAI's LLM has no close(); an httpx client left to the garbage collector warns (ResourceWarning)
            # in whichever later test it happens to be collected.
            client = getattr(llm, "_client", None)
            if client is not None:
                client.close()


class _Rig:
    """Store, fake upstream and proxy on loopback; hook spans reach the same store through the tracing pipeline."""

    def __init__(
        self, store: InMemoryLightningStore, upstream_url: str, proxy: ProxyServer, tracer: LightningTracer
    ) -> None:
        self.store = store
        self.upstream_url = upstream_url
        self.proxy = proxy
        self.tracer = tracer

    def new_attempt(self) -> tuple[Rollout, str]:
        async def claim() -> tuple[Rollout, str]:
            await self.store.enqueue_rollout({"task": "add"})
            claimed = await self.store.claim_rollout("worker")
            assert claimed is not None
            return claimed.rollout, claimed.attempt.attempt_id

        return asyncio.run(claim())

    def spans(self, rollout_id: str) -> list[Span]:
        assert agentlightning_crewai.flush()
        self.tracer.flush()
        self.proxy.flush()
        return asyncio.run(self.store.query_spans(rollout_id))


@pytest.fixture
def rig() -> Iterator[_Rig]:
    store = InMemoryLightningStore()
    with FakeOpenAI(reply=crew_reply).serve() as upstream, ProxyServer(store, upstream.base_url) as proxy:
        try:
            yield _Rig(store, upstream.base_url, proxy, init_tracing(StoreSpanSink(store)))
        finally:
            shutdown_tracing()


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_crew_through_proxy_joins_and_selects_the_specialist(rig: _Rig, stream: bool) -> None:
    """Every call has a hook twin (agent name) and a proxy twin (token ids), joined; selecting one agent works."""
    agentlightning_crewai.instrument()
    rollout, attempt_id = rig.new_attempt()
    with (
        openai_llms(rig.proxy.url_for(rollout.rollout_id, attempt_id), stream=stream) as llms,
        rollout_context(rollout.rollout_id, attempt_id),
    ):
        result = build_crew(llms=llms).kickoff()
    assert str(result) == "correct"

    spans = rig.spans(rollout.rollout_id)
    hook = [s for s in spans if s.attributes.get(sc.SPAN_SOURCE) == sc.SOURCE_HOOK and s.name.startswith("chat")]
    proxy = [s for s in spans if s.attributes.get(sc.SPAN_SOURCE) == sc.SOURCE_PROXY]
    assert len(hook) == len(proxy) == 4
    hook_ids = sorted(str(s.attributes.get(sc.GEN_AI_RESPONSE_ID)) for s in hook)
    assert hook_ids == sorted(str(s.attributes.get(sc.GEN_AI_RESPONSE_ID)) for s in proxy)
    assert all(hook_ids)

    tool = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_EXECUTE_TOOL]
    assert len(tool) == 1
    assert tool[0].attributes[sc.GEN_AI_TOOL_NAME] == "add"
    assert tool[0].attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "5"

    calls = find_llm_calls(spans)
    assert sorted(call.agent_name or "" for call in calls) == ["critic", "planner", "specialist", "specialist"]
    for call in calls:
        assert sorted(call.sources) == ["hook", "proxy"]
        assert call.has_token_ids

    transitions = TraceAdapter(agents="specialist").adapt(rollout, spans, final_reward=1.0)
    assert len(transitions) == 2
    assert {row.agent_name for row in transitions} == {"specialist"}
    specialist = [s for s in hook if s.attributes[sc.GEN_AI_AGENT_NAME] == "specialist"]
    assert len(specialist) == 2
    for row in transitions:
        assert row.response_token_ids and row.prompt_token_ids


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_crew_on_the_upstream_directly(rig: _Rig, stream: bool) -> None:
    """Without the proxy, the hook alone records each call with its messages, usage and response id."""
    agentlightning_crewai.instrument()
    rollout, attempt_id = rig.new_attempt()
    with openai_llms(rig.upstream_url, stream=stream) as llms, rollout_context(rollout.rollout_id, attempt_id):
        build_crew(llms=llms).kickoff()
    spans = rig.spans(rollout.rollout_id)
    assert shape(spans) == [(name.replace("chat scripted", "chat policy"), parent) for name, parent in SEQUENTIAL_SHAPE]
    assert_span_tree(spans)
    chats = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_CHAT]
    assert len(chats) == 4
    assert all(s.attributes.get(sc.SPAN_SOURCE) == sc.SOURCE_HOOK for s in chats)
    for span in chats:
        assert span.attributes[sc.GEN_AI_PROVIDER_NAME] == "openai"
        assert span.attributes[sc.GEN_AI_INPUT_MESSAGES]
        assert span.attributes[sc.GEN_AI_OUTPUT_MESSAGES]
        assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS]
        assert str(span.attributes[sc.GEN_AI_RESPONSE_ID]).startswith("chatcmpl")
    (native_call,) = [s for s in chats if "tool_calls" in str(s.attributes[sc.GEN_AI_OUTPUT_MESSAGES])]
    (message,) = json.loads(str(native_call.attributes[sc.GEN_AI_OUTPUT_MESSAGES]))
    assert message["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
