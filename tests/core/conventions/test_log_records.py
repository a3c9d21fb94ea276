"""GenAI log records folded into their span: malformed records, records without content, lone records, both forms."""

from __future__ import annotations

import json

import openai
import pytest
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.adapter.check import check_store
from agentlightning.adapter.tree import build_call_tree
from agentlightning.conventions import (
    CONVENTION,
    LOG_BODY,
    LOG_EVENT_NAME,
    LOG_RECORDS,
    LOG_SOURCE,
    MISSING,
    ORIGINAL_PREFIX,
    OTEL_GENAI,
)
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import Attributes, Span
from tests.core.conventions.conftest import log_exporter, new_attempt, run_instrumented
from tests.core.conventions.instrumented import LATEST, genai_mode, llm_spans, messages

TRACE = "5b8efff798038103d269b633813fc60c"
LLM_ID = "eee19b7ec3c1b174"
# An openai-v2 chat span of the default (event) form: no messages on the span itself.
LLM_ATTRIBUTES: Attributes = {
    semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
    semconv.GEN_AI_REQUEST_MODEL: "m",
    semconv.GEN_AI_RESPONSE_ID: "chatcmpl-1",
    "gen_ai.system": "openai",
    semconv.SPAN_SOURCE: semconv.SOURCE_OTLP,
}


def _span(span_id: str, name: str, attributes: Attributes, parent_id: str | None = None, at: int = 10) -> Span:
    return Span(
        rollout_id="ro",
        attempt_id="at",
        trace_id=TRACE,
        span_id=span_id,
        parent_id=parent_id,
        name=name,
        start_time=at,
        end_time=at + 5,
        attributes=attributes,
    )


def _record(index: int, event: str, body: str | None, parent_id: str = LLM_ID, **extra: str) -> Span:
    attributes: Attributes = {semconv.SPAN_SOURCE: LOG_SOURCE, LOG_EVENT_NAME: event, **extra}
    if body is not None:
        attributes[LOG_BODY] = body
    return _span(f"{index:016x}", event, attributes, parent_id=parent_id, at=10 + index)


@pytest.mark.parametrize(
    ("records", "error"),
    [
        ([_record(1, "gen_ai.user.message", '"just text"')], "TypeError: gen_ai.user.message body is str"),
        ([_record(1, "gen_ai.user.message", "{not json")], "JSONDecodeError"),
        ([_record(1, "gen_ai.assistant.message", '{"tool_calls": "abc"}')], "TypeError: a tool call is str"),
        ([_record(1, "gen_ai.choice", '{"message": {"tool_calls": [3]}}')], "TypeError: a tool call is int"),
        (
            [
                _record(
                    1,
                    "gen_ai.client.inference.operation.details",
                    None,
                    **{semconv.GEN_AI_INPUT_MESSAGES: '[{"role": "user", "parts": 3}]'},
                )
            ],
            "TypeError",
        ),
    ],
)
def test_malformed_records_flag_their_span_and_never_crash_the_adapter(records: list[Span], error: str) -> None:
    spans = [_span(LLM_ID, "chat m", dict(LLM_ATTRIBUTES)), *records]
    (llm,) = llm_spans(spans)
    missing = llm.attributes[MISSING]
    assert isinstance(missing, list) and len(missing) == 1
    assert str(missing[0]).startswith("well-formed ") and error in str(missing[0])
    assert llm.attributes[CONVENTION] == OTEL_GENAI and semconv.GEN_AI_INPUT_MESSAGES not in llm.attributes
    (call,) = find_llm_calls(spans)
    assert call.response_id == "chatcmpl-1" and call.input_messages is None


def test_records_fold_in_emission_order_and_lone_records_stay_out_of_the_tree() -> None:
    records = [
        _record(3, "gen_ai.choice", '{"index": 0, "finish_reason": "stop", "message": {"content": "hi"}}'),
        _record(1, "gen_ai.system.message", '{"content": "be brief"}'),
        _record(2, "gen_ai.user.message", '{"content": "hello"}'),
        _record(4, "gen_ai.user.message", '{"content": "lost"}', parent_id="00000000000000ff"),  # span never came
        _record(5, "app.audit", '"unrelated"'),
    ]
    spans = [*records, _span(LLM_ID, "chat m", dict(LLM_ATTRIBUTES))]
    tree = build_call_tree(spans)
    assert list(tree.spans) == [LLM_ID]  # log records are data of their span, not spans of the tree
    llm = tree.spans[LLM_ID]
    assert llm.attributes[LOG_RECORDS] == 4 and MISSING not in llm.attributes
    assert messages(llm) == (
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        [{"role": "assistant", "content": "hi", "finish_reason": "stop"}],
    )
    assert llm.attributes[semconv.GEN_AI_PROVIDER_NAME] == "openai"
    assert semconv.GEN_AI_INPUT_MESSAGES not in spans[-1].attributes  # the stored span is never changed


async def test_records_without_content_are_flagged_and_reported(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    attempt = await new_attempt(store)
    logs = LoggerProvider()
    logs.add_log_record_processor(SimpleLogRecordProcessor(log_exporter(server, *attempt)))
    with genai_mode(None, "false"):
        await run_instrumented(store, server, client, OpenAIInstrumentor(), attempt=attempt, logger_provider=logs)
    logs.shutdown()
    spans = await store.query_spans(*attempt)
    llm = llm_spans(spans)
    assert len(llm) == 2
    for span in llm:
        assert span.attributes[MISSING] == [
            "content in gen_ai.*.message records (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)"
        ]
    report = await check_store(store)
    (line,) = [p for p in report.rollouts[0].problems if "foreign-convention" in p]
    assert "otel-genai without content in gen_ai.*.message records" in line


async def test_span_and_event_mode_keeps_the_span_messages_and_one_call(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    attempt = await new_attempt(store)
    logs = LoggerProvider()
    logs.add_log_record_processor(SimpleLogRecordProcessor(log_exporter(server, *attempt)))
    with genai_mode(LATEST, "SPAN_AND_EVENT"):
        _, responses = await run_instrumented(
            store, server, client, OpenAIInstrumentor(), attempt=attempt, logger_provider=logs
        )
    logs.shutdown()
    spans = await store.query_spans(*attempt)
    details = [s for s in spans if s.attributes.get(semconv.SPAN_SOURCE) == LOG_SOURCE]
    # The details records repeat the call's operation name and response id; they must not count as calls.
    assert len(details) == 2 and all(d.attributes[semconv.GEN_AI_RESPONSE_ID] for d in details)
    calls = find_llm_calls(spans)
    assert [c.response_id for c in calls] == [r.id for r in responses]
    for span in llm_spans(spans):
        stored = next(s for s in spans if s.span_id == span.span_id)
        # The span carried the messages itself (mapped at ingest); they, not the records', are the call's.
        assert json.loads(str(stored.attributes[ORIGINAL_PREFIX + semconv.GEN_AI_INPUT_MESSAGES]))[0]["parts"]
        assert span.attributes[semconv.GEN_AI_INPUT_MESSAGES] == stored.attributes[semconv.GEN_AI_INPUT_MESSAGES]
        assert span.attributes[LOG_RECORDS] == 1 and MISSING not in span.attributes
