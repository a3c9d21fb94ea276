"""The mapping on hand-written attributes: legacy OpenLLMetry, Traceloop entities, spans lacking what they claim."""

from __future__ import annotations

import json

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.adapter.check import check_store
from agentlightning.conventions import (
    CONVENTION,
    MISSING,
    OPENINFERENCE,
    OPENLLMETRY,
    detect_convention,
    map_convention,
)
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import Attributes
from tests.core.conventions.conftest import new_attempt

# The indexed form of Traceloop releases before 0.5x (opentelemetry-semantic-conventions-ai LLM_PROMPTS/COMPLETIONS).
LEGACY_OPENLLMETRY: Attributes = {
    "llm.request.type": "chat",
    "gen_ai.system": "OpenAI",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.prompt.0.role": "user",
    "gen_ai.prompt.0.content": "weather?",
    "gen_ai.completion.0.role": "assistant",
    "gen_ai.completion.0.finish_reason": "tool_calls",
    "gen_ai.completion.0.tool_calls.0.id": "call_1",
    "gen_ai.completion.0.tool_calls.0.name": "get_weather",
    "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Paris"}',
    "llm.request.functions.0.name": "get_weather",
    "llm.request.functions.0.parameters": '{"type": "object"}',
    "gen_ai.usage.prompt_tokens": 7,
    "gen_ai.usage.completion_tokens": 3,
}


def test_legacy_openllmetry_indexed_attributes() -> None:
    mapped = map_convention(LEGACY_OPENLLMETRY)
    assert mapped[CONVENTION] == OPENLLMETRY and MISSING not in mapped
    assert json.loads(str(mapped[semconv.GEN_AI_INPUT_MESSAGES])) == [{"role": "user", "content": "weather?"}]
    (out,) = json.loads(str(mapped[semconv.GEN_AI_OUTPUT_MESSAGES]))
    assert out["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    tools = json.loads(str(mapped[semconv.GEN_AI_TOOL_DEFINITIONS]))
    assert tools == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert (mapped[semconv.GEN_AI_USAGE_INPUT_TOKENS], mapped[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]) == (7, 3)
    assert {k: mapped[k] for k in LEGACY_OPENLLMETRY} == LEGACY_OPENLLMETRY
    assert map_convention(mapped) == mapped


def test_traceloop_agent_and_tool_entities() -> None:
    agent = map_convention({"traceloop.span.kind": "agent", "traceloop.entity.name": "planner"})
    assert agent[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_INVOKE_AGENT
    assert agent[semconv.GEN_AI_AGENT_NAME] == "planner"
    tool = map_convention(
        {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "search",
            "traceloop.entity.input": '{"args": ["q"]}',
            "traceloop.entity.output": '"found"',
        }
    )
    assert tool[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_EXECUTE_TOOL
    assert (tool[semconv.GEN_AI_TOOL_NAME], tool[semconv.GEN_AI_TOOL_CALL_RESULT]) == ("search", '"found"')


def test_claims_without_required_attributes_are_flagged_not_mapped() -> None:
    cases: list[tuple[Attributes, str]] = [
        ({"openinference.span.kind": "LLM", "llm.model_name": "m"}, "llm.input_messages.0.message.role"),
        ({"openinference.span.kind": "TOOL"}, "tool.name"),
        ({"llm.request.type": "chat", "gen_ai.request.model": "m"}, "gen_ai.prompt.0.role"),
        ({"traceloop.span.kind": "agent"}, "traceloop.entity.name"),
    ]
    for attributes, missing in cases:
        mapped = map_convention(attributes)
        assert mapped[MISSING] == [missing]
        assert semconv.GEN_AI_OPERATION_NAME not in mapped
        assert {k: mapped[k] for k in attributes} == attributes


def test_malformed_values_are_flagged_not_raised() -> None:
    bad_parts = '[{"role": "user", "parts": 3}]'
    mapped = map_convention({"gen_ai.operation.name": "chat", "gen_ai.input.messages": bad_parts})
    missing = mapped[MISSING]
    assert isinstance(missing, list) and str(missing[0]).startswith("well-formed attributes (TypeError")
    assert mapped[semconv.GEN_AI_INPUT_MESSAGES] == bad_parts
    assert detect_convention({semconv.SPAN_SOURCE: semconv.SOURCE_PROXY, "openinference.span.kind": "LLM"}) is None


async def test_bad_spans_are_stored_flagged_and_adapter_skips_them(
    store: InMemoryLightningStore, server: StoreServer
) -> None:
    rollout_id, attempt_id = await new_attempt(store)
    provider = TracerProvider()
    exporter = OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces",
        headers={semconv.HEADER_ROLLOUT_ID: rollout_id, semconv.HEADER_ATTEMPT_ID: attempt_id},
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bad")
    with tracer.start_as_current_span("ChatCompletion", attributes={"openinference.span.kind": "LLM"}):
        pass
    with tracer.start_as_current_span(
        "ChatCompletion",
        attributes={
            "openinference.span.kind": "LLM",
            "llm.input_messages.0.message.role": "user",
            "llm.tools.0.tool.json_schema": "{not json",
            "llm.invocation_parameters": "[1, 2]",
        },
    ):
        pass
    provider.shutdown()
    spans = await store.query_spans(rollout_id, attempt_id)
    assert len(spans) == 2
    assert all(s.attributes[CONVENTION] == OPENINFERENCE for s in spans)
    flagged = [s for s in spans if MISSING in s.attributes]
    assert [s.attributes[MISSING] for s in flagged] == [["llm.input_messages.0.message.role"]]
    (call,) = find_llm_calls(spans)
    assert json.loads(str(call.input_messages)) == [{"role": "user"}]

    # agl check names the flagged span, its convention and what it lacks.
    report = await check_store(store)
    (line,) = [p for p in report.rollouts[0].problems if "foreign-convention" in p]
    assert line.startswith("foreign-convention spans without what an LLM or tool call needs: 1 (")
    assert "openinference without llm.input_messages.0.message.role" in line
