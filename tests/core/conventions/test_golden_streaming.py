"""Golden tests: streamed chat completions and the Responses API, per instrumentation, read back as our calls."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.conventions import CONVENTION, MISSING
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from tests.core.conventions.conftest import assert_weather_calls, loads, responses_weather_turns, weather_turns
from tests.core.conventions.instrumented import (
    INSTRUMENTATIONS,
    llm_spans,
    messages,
    run_convention,
    with_tool_definitions,
)

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config` is deprecated")


def _sunny(arguments: str) -> str:
    return "sunny"


@pytest.mark.parametrize("name", list(INSTRUMENTATIONS))
async def test_streamed_chat_maps_like_the_plain_one(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI, name: str
) -> None:
    plain, _ = await run_convention(store, server, client, name, lambda c: weather_turns(c, _sunny))
    streamed, responses = await run_convention(
        store, server, client, name, lambda c: weather_turns(c, _sunny, stream=True)
    )
    llm = llm_spans(streamed)
    assert llm and all(CONVENTION in s.attributes and MISSING not in s.attributes for s in llm)
    assert_weather_calls(with_tool_definitions(llm), responses)
    # Same messages as the non-streamed calls (a streamed tool call's empty text reads as no content, too).
    assert [messages(s) for s in llm] == [messages(s) for s in llm_spans(plain)]
    calls = find_llm_calls(streamed)
    assert [c.response_id for c in calls] == [r.id for r in responses]
    assert all(c.agent_name == "weather" for c in calls)


# openai-v2 2.4b0 instruments chat completions and embeddings only (see the next test).
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("name", ["openinference", "traceloop"])
async def test_responses_api_calls(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI, name: str, stream: bool
) -> None:
    spans, responses = await run_convention(
        store, server, client, name, lambda c: responses_weather_turns(c, _sunny, stream=stream)
    )
    llm = llm_spans(spans)
    assert len(llm) == 2 and all(CONVENTION in s.attributes and MISSING not in s.attributes for s in llm)
    for span, response in zip(llm, responses, strict=True):
        attributes = span.attributes
        assert attributes[semconv.GEN_AI_RESPONSE_ID] == response.id
        assert attributes[semconv.GEN_AI_REQUEST_MODEL] == "fake-model"
        assert attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == response.usage.input_tokens
        assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == response.usage.output_tokens
        tools = loads(attributes[semconv.GEN_AI_TOOL_DEFINITIONS])
        assert [(t["type"], t["function"]["name"]) for t in tools] == [("function", "get_weather")]
    (call,) = [item for item in responses[0].output if item.type == "function_call"]
    first_in, first_out = messages(llm[0])
    assert first_in == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"}]
    (tool_call,) = first_out[0]["tool_calls"]
    assert (tool_call["function"]["name"], tool_call["function"]["arguments"]) == ("get_weather", {"city": "test"})
    # Traceloop 0.62.4 records the function_call item's id, not its call_id (which the tool result names).
    assert tool_call["id"] == (call.call_id if name == "openinference" else call.id)
    history, (answer,) = messages(llm[1])
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool"]
    assert history[3] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    assert (answer["role"], answer["content"]) == ("assistant", responses[1].output_text)
    calls = find_llm_calls(spans)
    assert [c.response_id for c in calls] == [r.id for r in responses]
    assert all(c.agent_name == "weather" and json.loads(str(c.input_messages)) for c in calls)


async def test_openai_v2_does_not_record_the_responses_api(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    spans, responses = await run_convention(
        store, server, client, "openai-v2-span-attributes", lambda c: responses_weather_turns(c, _sunny)
    )
    assert len(responses) == 2 and llm_spans(spans) == [] and find_llm_calls(spans) == []
    names: Any = sorted(s.name for s in spans)
    assert names == ["invoke_agent weather"]
