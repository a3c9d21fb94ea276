"""The real OpenAIChatCompletionClient against the fake upstream, directly and through the LLM proxy.

Through the proxy every model call is recorded twice, by our hook and by the proxy (with token ids); the two must
share ``gen_ai.response.id`` so the adapter joins them into one call of the right agent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import ChatAgent, TaskResult, Team
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agentlightning import semconv
from agentlightning.adapter import find_llm_calls
from agentlightning.testing import FakeOpenAI
from agentlightning.tracing import rollout_context
from tests.integrations.autogen.fakes import MODEL_INFO, make_add_tool, run_task
from tests.integrations.conformance import SpanCapture, assert_span_tree, shape
from tests.integrations.proxy_rig import ProxyRig, add_then_answer, assert_joined, serve_proxy_rig

pytestmark = pytest.mark.usefixtures("instrumented")


def _client(base_url: str) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(
        model="policy", base_url=base_url, api_key="k", model_info=MODEL_INFO, max_retries=0
    )


async def _run_calculator(base_url: str, *, stream: bool) -> TaskResult:
    client = _client(base_url)
    agent = AssistantAgent(
        "calculator", client, tools=[make_add_tool()], reflect_on_tool_use=True, model_client_stream=stream
    )
    try:
        return await run_task(agent, stream=stream)
    finally:
        await client.close()


@pytest.fixture
def upstream() -> Iterator[str]:
    """The base URL of a fake upstream that answers with a tool loop."""
    with FakeOpenAI(reply=add_then_answer).serve() as server:
        yield server.base_url


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_client_llm_spans(capture: SpanCapture, upstream: str, stream: bool) -> None:
    """LLM spans of the OpenAI client carry provider, request/response model, response id, usage, tool calls."""
    rollout_id = f"ro-{uuid.uuid4().hex}"
    with rollout_context(rollout_id, f"at-{uuid.uuid4().hex}"):
        result = await _run_calculator(upstream, stream=stream)
    assert result.messages[-1].to_text() == "The sum is 5."
    spans = capture.spans(rollout_id)
    assert_span_tree(spans)
    assert shape(spans) == [
        ("chat policy", "invoke_agent calculator"),
        ("chat policy", "invoke_agent calculator"),
        ("execute_tool add", "invoke_agent calculator"),
        ("invoke_agent calculator", None),
    ]
    calls = sorted((s for s in spans if s.name == "chat policy"), key=lambda s: s.start_time)
    for span in calls:
        assert span.attributes[semconv.GEN_AI_PROVIDER_NAME] == "openai"
        assert span.attributes[semconv.GEN_AI_REQUEST_MODEL] == "policy"
        assert span.attributes[semconv.GEN_AI_RESPONSE_MODEL] == "policy"
        assert str(span.attributes[semconv.GEN_AI_RESPONSE_ID]).startswith("chatcmpl-")
        assert span.attributes[semconv.GEN_AI_AGENT_NAME] == "calculator"
    assert calls[0].attributes[semconv.GEN_AI_RESPONSE_ID] != calls[1].attributes[semconv.GEN_AI_RESPONSE_ID]
    output = json.loads(str(calls[0].attributes[semconv.GEN_AI_OUTPUT_MESSAGES]))
    assert output[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a":2,"b":3}'}
    if not stream:  # AutoGen asks for streamed usage only with include_usage
        assert int(str(calls[0].attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS])) > 0


@pytest.fixture
def rig() -> Iterator[ProxyRig]:
    """Store, fake upstream (a tool loop) and proxy on loopback."""
    with serve_proxy_rig(add_then_answer) as rig:
        yield rig


@pytest.mark.parametrize("stream", [False, True])
async def test_hook_and_proxy_spans_join(rig: ProxyRig, stream: bool) -> None:
    """Single agent via the proxy: every LLM call has a hook twin and a proxy twin with the same response id."""
    rollout_id, attempt_id = await rig.anew_attempt()
    with rollout_context(rollout_id, attempt_id):
        await _run_calculator(rig.proxy.url_for(rollout_id, attempt_id), stream=stream)
    calls = assert_joined(await rig.aspans(rollout_id), 2)
    assert all(call.agent_name == "calculator" for call in calls)


async def test_team_through_proxy_names_each_agent(rig: ProxyRig) -> None:
    """A 3-agent team on the proxy: each joined call is named for the agent that made it, so one can be trained."""
    rollout_id, attempt_id = await rig.anew_attempt()
    url = rig.proxy.url_for(rollout_id, attempt_id)
    clients = [_client(url) for _ in range(3)]
    members: list[ChatAgent | Team] = [
        AssistantAgent(name, client, description=name)
        for name, client in zip(("planner", "solver", "critic"), clients, strict=True)
    ]
    team = RoundRobinGroupChat(members, termination_condition=MaxMessageTermination(4))
    try:
        with rollout_context(rollout_id, attempt_id):
            await run_task(team, stream=True)
    finally:
        for client in clients:
            await client.close()
    calls = find_llm_calls(await rig.aspans(rollout_id))
    assert [call.agent_name for call in calls] == ["planner", "solver", "critic"]
    assert all(sorted(call.sources) == ["hook", "proxy"] and call.has_token_ids for call in calls)
