"""The older GenAI form: messages on ``gen_ai.content.prompt`` / ``gen_ai.content.completion`` span events.

The span is shaped exactly as semantic-conventions ``docs/gen-ai/llm-spans.md`` describes it (span name, kind
CLIENT, the request/response attributes with the spec's example values, and the two events whose ``gen_ai.prompt`` /
``gen_ai.completion`` values are the spec's examples verbatim), made by the OpenTelemetry SDK and sent with the
stock OTLP exporter to a real store server.
"""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.adapter.check import check_store
from agentlightning.conventions import CONVENTION, MISSING, ORIGINAL_PREFIX, OTEL_GENAI, apply_conventions
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import AttributeValue, Span, SpanEvent
from tests.core.conventions.conftest import export_to, new_attempt

# llm-spans.md, "LLM Request attributes": each attribute's example value.
SPEC_ATTRIBUTES: dict[str, AttributeValue] = {
    "gen_ai.request.model": "gpt-4",
    "gen_ai.system": "openai",
    "gen_ai.operation.name": "chat.completions",
    "gen_ai.request.max_tokens": 100,
    "gen_ai.request.temperature": 0.0,
    "gen_ai.request.top_p": 1.0,
    "gen_ai.response.finish_reasons": ["stop"],
    "gen_ai.response.id": "chatcmpl-123",
    "gen_ai.response.model": "gpt-4-0613",
    "gen_ai.usage.completion_tokens": 180,
    "gen_ai.usage.prompt_tokens": 100,
}
# llm-spans.md, "Events": the examples of gen_ai.prompt and gen_ai.completion, verbatim (Python literals).
SPEC_PROMPT = "[{'role': 'user', 'content': 'What is the capital of France?'}]"
SPEC_COMPLETION = "[{'role': 'assistant', 'content': 'The capital of France is Paris.'}]"


async def test_spec_shaped_span_with_content_events_becomes_one_call(
    store: InMemoryLightningStore, server: StoreServer
) -> None:
    attempt = await new_attempt(store)
    provider = TracerProvider()
    export_to(provider, server, *attempt)
    tracer = provider.get_tracer("legacy-genai-instrumentation")
    with tracer.start_as_current_span("agent") as parent:
        # "the span name SHOULD be ... `ChatCompletions gpt-4`"; "Span kind: MUST always be CLIENT".
        with tracer.start_as_current_span(
            "ChatCompletions gpt-4", kind=SpanKind.CLIENT, attributes=SPEC_ATTRIBUTES
        ) as span:
            span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": SPEC_PROMPT})
            span.add_event("gen_ai.content.completion", {"gen_ai.completion": SPEC_COMPLETION})
        parent_id = f"{parent.get_span_context().span_id:016x}"
    provider.shutdown()

    spans = await store.query_spans(*attempt)
    assert len(spans) == 2
    stored = next(s for s in spans if s.name == "ChatCompletions gpt-4")
    assert [e.name for e in stored.events] == ["gen_ai.content.prompt", "gen_ai.content.completion"]
    assert semconv.GEN_AI_INPUT_MESSAGES not in stored.attributes  # stored as sent, folded on read
    (call,) = find_llm_calls(spans)
    assert json.loads(call.input_messages or "") == [{"role": "user", "content": "What is the capital of France?"}]
    assert json.loads(call.output_messages or "") == [
        {"role": "assistant", "content": "The capital of France is Paris.", "finish_reason": "stop"}
    ]
    assert (call.input_tokens, call.output_tokens, call.response_id) == (100, 180, "chatcmpl-123")
    assert not call.has_token_ids
    (mapped,) = [s for s in apply_conventions(spans) if s.span_id == stored.span_id]
    assert mapped.parent_id == parent_id and mapped.attributes[CONVENTION] == OTEL_GENAI
    assert mapped.attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_CHAT
    assert mapped.attributes[ORIGINAL_PREFIX + semconv.GEN_AI_OPERATION_NAME] == "chat.completions"
    assert mapped.attributes[semconv.GEN_AI_PROVIDER_NAME] == "openai"
    assert mapped.attributes[semconv.GEN_AI_REQUEST_MODEL] == "gpt-4"
    report = await check_store(store)
    assert report.rollouts[0].calls_found == 1


def _span(*events: SpanEvent, **attributes: AttributeValue) -> Span:
    return Span(
        rollout_id="ro", attempt_id="at", trace_id="1" * 32, span_id="2" * 16, name="ChatCompletions gpt-4",
        start_time=1, end_time=2, attributes={**SPEC_ATTRIBUTES, **attributes}, events=list(events),
    )  # fmt: skip


def test_json_values_read_and_bad_values_flag_the_span_without_crashing() -> None:
    prompt = SpanEvent(
        name="gen_ai.content.prompt", timestamp=1, attributes={"gen_ai.prompt": '[{"role": "user", "content": "hi"}]'}
    )
    (call,) = find_llm_calls([_span(prompt)])
    assert json.loads(call.input_messages or "") == [{"role": "user", "content": "hi"}] and call.output_messages is None
    for bad in ("{not json", "[1, 2]", "__import__('os')"):
        event = SpanEvent(name="gen_ai.content.prompt", timestamp=1, attributes={"gen_ai.prompt": bad})
        (mapped,) = apply_conventions([_span(event)])
        missing = mapped.attributes[MISSING]
        assert isinstance(missing, list) and str(missing[0]).startswith("well-formed gen_ai.content.* events"), bad
        assert not find_llm_calls([_span(event)])  # flagged, not a call: agl check reports it
    no_prompt = SpanEvent(
        name="gen_ai.content.completion", timestamp=1, attributes={"gen_ai.completion": SPEC_COMPLETION}
    )
    (mapped,) = apply_conventions([_span(no_prompt)])
    assert mapped.attributes[MISSING] == ["gen_ai.prompt on a gen_ai.content.prompt event"]
    native = _span(prompt, **{semconv.SPAN_SOURCE: semconv.SOURCE_HOOK})
    assert apply_conventions([native]) == [native]  # our own spans are never mapped
