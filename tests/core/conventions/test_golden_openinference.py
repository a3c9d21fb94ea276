"""Golden test: spans of openinference-instrumentation-openai, exported over OTLP, read back as our calls."""

from __future__ import annotations

from typing import Any

import openai
from openinference.instrumentation import TracerProvider as OpenInferenceTracerProvider
from openinference.instrumentation.openai import OpenAIInstrumentor

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.conventions import CONVENTION, CONVENTION_SCOPE, MISSING, OPENINFERENCE, apply_convention
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import Span
from tests.core.conventions.conftest import assert_weather_calls, export_to, new_attempt, weather_turns


async def test_openinference_openai_calls_tools_and_agent(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    rollout_id, attempt_id = await new_attempt(store)
    provider = OpenInferenceTracerProvider()
    export_to(provider, server, rollout_id, attempt_id)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        tracer = provider.get_tracer("weather")

        @tracer.tool(name="get_weather")
        def get_weather(arguments: str) -> str:
            return "sunny"

        @tracer.agent(name="weather_agent")
        def agent() -> list[Any]:
            return weather_turns(client, get_weather)

        responses = agent()
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    spans = await store.query_spans(rollout_id, attempt_id)
    assert all(s.attributes[CONVENTION] == OPENINFERENCE and MISSING not in s.attributes for s in spans)
    llm = [s for s in spans if s.attributes.get("openinference.span.kind") == "LLM"]
    assert all(str(s.attributes[CONVENTION_SCOPE]).startswith("openinference.instrumentation.openai ") for s in llm)
    assert_weather_calls(llm, responses)
    (agent_span,) = [s for s in spans if s.attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_INVOKE_AGENT]
    assert agent_span.attributes[semconv.GEN_AI_AGENT_NAME] == "weather_agent"
    (tool,) = [s for s in spans if s.attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_EXECUTE_TOOL]
    assert tool.attributes[semconv.GEN_AI_TOOL_NAME] == "get_weather"
    assert tool.attributes[semconv.GEN_AI_TOOL_CALL_RESULT] == "sunny"
    assert {s.parent_id for s in [*llm, tool]} == {agent_span.span_id}

    calls = find_llm_calls(spans)
    assert [c.response_id for c in calls] == [r.id for r in responses]
    assert all(c.agent_name == "weather_agent" and not c.has_token_ids for c in calls)

    # The adapter maps spans stored without the mapping (older ingest) the same way, and mapping twice changes nothing.
    raw = [_unmapped(s) for s in spans]
    assert [(c.response_id, c.agent_name, c.input_messages) for c in find_llm_calls(raw)] == [
        (c.response_id, c.agent_name, c.input_messages) for c in calls
    ]
    once = apply_convention(raw[0])
    assert apply_convention(once) is once and once.attributes[CONVENTION] == OPENINFERENCE
    assert CONVENTION not in raw[0].attributes  # the adapter maps copies: a store's own span objects stay as stored


def _unmapped(span: Span) -> Span:
    copy = span.model_copy(deep=True)
    copy.attributes = {
        k: v for k, v in span.attributes.items() if not k.startswith(("gen_ai.", "agentlightning.convention"))
    }
    return copy
