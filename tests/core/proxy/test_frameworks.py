"""Unmodified agents of two frameworks work through the proxy with only the base URL changed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentlightning import semconv as sc
from agentlightning.testing import FakeOpenAI, FakeReply, FakeRequest, FakeToolCall
from tests.core.proxy.conftest import ProxyRig


def _add_then_answer(request: FakeRequest) -> FakeReply:
    """A tool loop: call add(1, 2) first, answer once the tool result is in the conversation."""
    if request.has_tool_results:
        return FakeReply(text="the answer is 3")
    return FakeReply(tool_calls=[FakeToolCall("add", '{"a":1,"b":2}')])


@pytest.fixture
def fake() -> FakeOpenAI:
    return FakeOpenAI(reply=_add_then_answer)


def test_langchain_chat_openai(rig: ProxyRig) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    rollout_id, attempt_id = rig.new_attempt()

    def run(base_url: str, stream: bool) -> list[Any]:
        llm = ChatOpenAI(model="m", base_url=base_url, api_key="k", streaming=stream).bind_tools([add])  # pyright: ignore[reportArgumentType]
        messages: list[Any] = [HumanMessage("what is 1 + 2?")]
        first = llm.invoke(messages)
        [call] = first.tool_calls
        messages += [first, ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"])]
        return [first, llm.invoke(messages)]

    for stream in (False, True):
        direct = run(rig.upstream_url, stream)
        proxied = run(rig.proxy.url_for(rollout_id, attempt_id), stream)
        assert [m.content for m in proxied] == [m.content for m in direct] == ["", "the answer is 3"]
        assert proxied[0].tool_calls == direct[0].tool_calls
    spans = rig.spans(rollout_id)
    assert len(spans) == 4
    for span in spans:
        assert span.attributes[sc.PROMPT_TOKEN_IDS] and span.attributes[sc.RESPONSE_TOKEN_IDS]
        assert json.loads(str(span.attributes[sc.GEN_AI_TOOL_DEFINITIONS]))[0]["function"]["name"] == "add"
    final = json.loads(str(spans[-1].attributes[sc.GEN_AI_OUTPUT_MESSAGES]))
    assert final[0]["content"] == "the answer is 3"


def test_openai_agents_sdk_default_agent(rig: ProxyRig) -> None:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    rollout_id, attempt_id = rig.new_attempt()
    agent = Agent(name="calculator", instructions="Use the add tool.", model="m", tools=[add])

    async def run(base_url: str, stream: bool) -> str:
        async with AsyncOpenAI(base_url=base_url, api_key="k") as client:
            config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
            if not stream:
                return str((await Runner.run(agent, "what is 1 + 2?", run_config=config)).final_output)
            result = Runner.run_streamed(agent, "what is 1 + 2?", run_config=config)
            async for _ in result.stream_events():
                pass
            return str(result.final_output)

    for stream in (False, True):
        direct = asyncio.run(run(rig.upstream_url, stream))
        proxied = asyncio.run(run(rig.proxy.url_for(rollout_id, attempt_id), stream))
        assert proxied == direct == "the answer is 3"
    assert all("input" in body for body in rig.fake.requests)  # the SDK's default model API is Responses
    spans = rig.spans(rollout_id)
    assert len(spans) == 4
    for span in spans:
        assert span.status.code == "OK"
        assert span.attributes[sc.PROMPT_TOKEN_IDS] and span.attributes[sc.RESPONSE_TOKEN_IDS]
        assert json.loads(str(span.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS])) == "Use the add tool."
    assert spans[0].attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]
    second_input = json.loads(str(spans[1].attributes[sc.GEN_AI_INPUT_MESSAGES]))
    assert second_input[-1] == {"role": "tool", "tool_call_id": second_input[-2]["tool_calls"][0]["id"], "content": "3"}
