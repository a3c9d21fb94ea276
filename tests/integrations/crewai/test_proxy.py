"""``crewai.LLM("openai/…")`` against the fake upstream, directly and through the LLM proxy; the adapter on top."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from crewai import LLM

import agentlightning_crewai
from agentlightning import semconv as sc
from agentlightning.adapter import TraceAdapter
from agentlightning.testing import FakeReply, FakeRequest, FakeToolCall
from agentlightning.tracing import rollout_context
from tests.integrations.conformance import assert_span_tree, shape
from tests.integrations.crewai.fakes import SEQUENTIAL_SHAPE, build_crew
from tests.integrations.proxy_rig import ProxyRig, assert_joined, hook_and_proxy_chats, serve_proxy_rig

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


@pytest.fixture
def rig() -> Iterator[ProxyRig]:
    """Store, fake upstream (the crew's replies) and proxy on loopback; the listener's buffered spans are flushed."""
    with serve_proxy_rig(crew_reply, flush_hook=agentlightning_crewai.flush) as rig:
        yield rig


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_crew_through_proxy_joins_and_selects_the_specialist(rig: ProxyRig, stream: bool) -> None:
    """Every call has a hook twin (agent name) and a proxy twin (token ids), joined; selecting one agent works."""
    agentlightning_crewai.instrument()
    rollout, attempt_id = rig.claim()
    with (
        openai_llms(rig.proxy.url_for(rollout.rollout_id, attempt_id), stream=stream) as llms,
        rollout_context(rollout.rollout_id, attempt_id),
    ):
        result = build_crew(llms=llms).kickoff()
    assert str(result) == "correct"

    spans = rig.spans(rollout.rollout_id)
    calls = assert_joined(spans, 4)
    assert sorted(call.agent_name or "" for call in calls) == ["critic", "planner", "specialist", "specialist"]

    tool = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_EXECUTE_TOOL]
    assert len(tool) == 1
    assert tool[0].attributes[sc.GEN_AI_TOOL_NAME] == "add"
    assert tool[0].attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "5"

    transitions = TraceAdapter(agents="specialist").adapt(rollout, spans, final_reward=1.0)
    assert len(transitions) == 2
    assert {row.agent_name for row in transitions} == {"specialist"}
    hook, _ = hook_and_proxy_chats(spans)
    specialist = [s for s in hook if s.attributes[sc.GEN_AI_AGENT_NAME] == "specialist"]
    assert len(specialist) == 2
    for row in transitions:
        assert row.response_token_ids and row.prompt_token_ids


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_crew_on_the_upstream_directly(rig: ProxyRig, stream: bool) -> None:
    """Without the proxy, the hook alone records each call with its messages, usage and response id."""
    agentlightning_crewai.instrument()
    rollout, attempt_id = rig.claim()
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
    # the tool span names the call it answers (CrewAI's tool events carry no id: the listener takes the LLM's)
    (tool,) = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_EXECUTE_TOOL]
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_ID] == message["tool_calls"][0]["id"] == "call_add"
