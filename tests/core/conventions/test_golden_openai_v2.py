"""Golden tests: opentelemetry-instrumentation-openai-v2 (GenAI semconv), messages as span attributes or log events."""

from __future__ import annotations

from typing import Any, Literal

import openai
import pytest
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.conventions import CONVENTION, LOG_RECORDS, LOG_SOURCE, MISSING, OTEL_GENAI
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import Span
from tests.core.conventions.conftest import assert_weather_calls, log_exporter, new_attempt, run_instrumented
from tests.core.conventions.instrumented import MODES, genai_mode, llm_spans, messages, with_tool_definitions


async def run_mode(
    store: InMemoryLightningStore,
    server: StoreServer,
    client: openai.OpenAI,
    mode: str,
    order: Literal["logs-first", "spans-first"] = "logs-first",
) -> tuple[list[Span], list[Any]]:
    """The weather turns instrumented in ``mode``; log records reach the store before or after their spans."""
    attempt = await new_attempt(store)
    logs = LoggerProvider()
    held = InMemoryLogRecordExporter()
    logs.add_log_record_processor(
        SimpleLogRecordProcessor(held if order == "spans-first" else log_exporter(server, *attempt))
    )
    with genai_mode(*MODES[mode]):
        _, responses = await run_instrumented(
            store, server, client, OpenAIInstrumentor(), attempt=attempt, logger_provider=logs
        )
    logs.shutdown()
    if order == "spans-first":
        late = log_exporter(server, *attempt)
        late.export(list(held.get_finished_logs()))
        late.shutdown()
    return await store.query_spans(*attempt), responses


def assert_calls(spans: list[Span], responses: list[Any]) -> list[Span]:
    """The weather calls, their parent (the agent span) and agent name; returns the LLM spans."""
    llm = llm_spans(spans)
    assert all(s.attributes[CONVENTION] == OTEL_GENAI and MISSING not in s.attributes for s in llm)
    assert all(semconv.GEN_AI_TOOL_DEFINITIONS not in s.attributes for s in llm)  # this release records none
    assert_weather_calls(with_tool_definitions(llm), responses)
    (agent_span,) = [s for s in spans if s.name == "invoke_agent weather"]
    assert {s.parent_id for s in llm} == {agent_span.span_id}
    calls = find_llm_calls(spans)
    assert [c.response_id for c in calls] == [r.id for r in responses]
    assert all(c.agent_name == "weather" for c in calls)
    return llm


async def test_openai_v2_span_attribute_messages(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    spans, responses = await run_mode(store, server, client, "span-attributes")
    assert not [s for s in spans if s.attributes.get(semconv.SPAN_SOURCE) == LOG_SOURCE]
    assert_calls(spans, responses)


@pytest.mark.parametrize("order", ["logs-first", "spans-first"])
@pytest.mark.parametrize("mode", ["details-event", "message-events"])
async def test_openai_v2_log_event_messages(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI, mode: str, order: Any
) -> None:
    spans, responses = await run_mode(store, server, client, mode, order)
    records = [s for s in spans if s.attributes.get(semconv.SPAN_SOURCE) == LOG_SOURCE]
    stored_llm = [s for s in spans if s.name == "chat fake-model"]
    # The messages travel in log records only: the stored spans lack them, each record is stored under its span.
    assert records and all(semconv.GEN_AI_INPUT_MESSAGES not in s.attributes for s in stored_llm)
    assert {r.parent_id for r in records} == {s.span_id for s in stored_llm}
    first_is_record = spans[0].attributes.get(semconv.SPAN_SOURCE) == LOG_SOURCE
    assert first_is_record == (order == "logs-first")
    llm = assert_calls(spans, responses)
    expected = {"details-event": [1, 1], "message-events": [3, 5]}[mode]  # 2 + 1 choice, 4 + 1 choice
    assert [s.attributes[LOG_RECORDS] for s in llm] == expected


async def test_event_forms_map_like_the_attribute_form(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    mapped: dict[str, list[tuple[Any, Any]]] = {}
    for mode in MODES:
        spans, _ = await run_mode(store, server, client, mode)
        mapped[mode] = [messages(s) for s in llm_spans(spans)]
    assert mapped["details-event"] == mapped["span-attributes"]
    assert mapped["message-events"] == mapped["span-attributes"]
