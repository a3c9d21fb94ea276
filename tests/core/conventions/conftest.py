"""Fixtures for golden tests: a real store server, an attempt, the fake OpenAI upstream and an exporting provider."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentlightning import semconv
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, call_offered_tools
from agentlightning.types import Span

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]

AGENT_ATTRIBUTES = {semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_AGENT, semconv.GEN_AI_AGENT_NAME: "weather"}
"""A GenAI-semconv agent span around the calls, so parent and agent name can be checked."""


@pytest.fixture
def store() -> InMemoryLightningStore:
    """An empty memory store."""
    return InMemoryLightningStore()


@pytest.fixture
def server(store: InMemoryLightningStore) -> Iterator[StoreServer]:
    """``store`` served on an ephemeral loopback port."""
    with StoreServer(store) as running:
        yield running


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    """An OpenAI client talking to the fake upstream, which calls the offered tool once and then answers in text."""
    with (
        FakeOpenAI(reply=call_offered_tools).serve() as upstream,
        openai.OpenAI(base_url=f"{upstream.url.rstrip('/')}/v1", api_key="fake", max_retries=0) as client,
    ):
        yield client


async def new_attempt(store: InMemoryLightningStore) -> tuple[str, str]:
    """A started attempt of a fresh rollout."""
    await store.enqueue_rollout({"task": "weather"})
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    await store.start_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def export_to(provider: TracerProvider, server: StoreServer, rollout_id: str, attempt_id: str) -> None:
    """Attach the stock OTLP/HTTP exporter, with the attempt in headers, to ``provider``."""
    exporter = OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces",
        headers={semconv.HEADER_ROLLOUT_ID: rollout_id, semconv.HEADER_ATTEMPT_ID: attempt_id},
        timeout=10,
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))


def log_exporter(server: StoreServer, rollout_id: str, attempt_id: str) -> OTLPLogExporter:
    """The stock OTLP/HTTP log exporter to ``server``'s ``/v1/logs``, with the attempt in headers."""
    return OTLPLogExporter(
        endpoint=f"{server.url}/v1/logs",
        headers={semconv.HEADER_ROLLOUT_ID: rollout_id, semconv.HEADER_ATTEMPT_ID: attempt_id},
        timeout=10,
    )


def weather_turns(client: openai.OpenAI, run_tool: Callable[[str], str], *, stream: bool = False) -> list[Any]:
    """Two chat calls: the model calls ``get_weather``, the tool answers, the model replies; returns both responses
    (streamed calls collected into the ChatCompletion the client saw)."""
    messages: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"}]
    first = _chat(client, stream, messages=messages, tools=TOOLS, temperature=0.5)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.arguments)})
    second = _chat(client, stream, messages=messages, tools=TOOLS)
    return [first, second]


def _chat(client: openai.OpenAI, stream: bool, **request: Any) -> Any:
    if not stream:
        return client.chat.completions.create(model="fake-model", **request)
    chunks = client.chat.completions.create(
        model="fake-model", stream=True, stream_options={"include_usage": True}, **request
    )
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    reply: dict[str, Any] = {"object": "chat.completion", "created": 0}
    finish_reason = None
    for chunk in chunks:
        reply.update(id=chunk.id, model=chunk.model, usage=chunk.usage.model_dump() if chunk.usage else None)
        for choice in chunk.choices:
            finish_reason = choice.finish_reason or finish_reason
            text.append(choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = delta.id or call.get("id")
                if delta.function is not None:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    reply["choices"] = [{"index": 0, "message": message, "finish_reason": finish_reason}]
    return ChatCompletion.model_validate(reply)


RESPONSES_TOOLS: Any = [{"type": "function", **TOOLS[0]["function"]}]
"""``TOOLS`` in the Responses API's flat shape."""


def responses_weather_turns(
    client: openai.OpenAI, run_tool: Callable[[str], str], *, stream: bool = False
) -> list[Any]:
    """The weather turns on the Responses API (a function call, then its output); returns both Response objects."""
    items: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    first = _respond(client, stream, instructions="be brief", input=items, tools=RESPONSES_TOOLS)
    (call,) = [item for item in first.output if item.type == "function_call"]
    items.append(call.model_dump(exclude_none=True))
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": run_tool(call.arguments)})
    second = _respond(client, stream, instructions="be brief", input=items, tools=RESPONSES_TOOLS)
    return [first, second]


def _respond(client: openai.OpenAI, stream: bool, **request: Any) -> Any:
    if not stream:
        return client.responses.create(model="fake-model", **request)
    final = None
    for event in client.responses.create(model="fake-model", stream=True, **request):
        if event.type == "response.completed":
            final = event.response
    assert final is not None, "the stream ended without response.completed"
    return final


def loads(value: object) -> Any:
    """A JSON attribute parsed (the test fails on anything but a string)."""
    assert isinstance(value, str), value
    return json.loads(value)


def assert_weather_calls(llm_spans: list[Any], responses: list[Any]) -> None:
    """The two mapped calls carry the messages, model, usage, tools and response ids the client saw."""
    assert len(llm_spans) == 2
    first, second = sorted(llm_spans, key=lambda s: s.start_time)
    for span, response in zip((first, second), responses, strict=True):
        attributes = span.attributes
        assert attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_CHAT
        assert attributes[semconv.GEN_AI_REQUEST_MODEL] == "fake-model"
        assert attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == response.usage.prompt_tokens
        assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == response.usage.completion_tokens
        assert attributes[semconv.GEN_AI_RESPONSE_ID] == response.id
        tools = loads(attributes[semconv.GEN_AI_TOOL_DEFINITIONS])
        assert [t["function"]["name"] for t in tools] == ["get_weather"]
        assert tools[0]["function"]["parameters"]["required"] == ["city"]
    call_id = responses[0].choices[0].message.tool_calls[0].id
    assert loads(first.attributes[semconv.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
    ]
    (out,) = loads(first.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert out["role"] == "assistant" and out["finish_reason"] == "tool_calls"
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out["tool_calls"]] == [
        (call_id, "get_weather", {"city": "test"})
    ]
    history = loads(second.attributes[semconv.GEN_AI_INPUT_MESSAGES])
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool"]
    assert history[2]["tool_calls"][0]["id"] == call_id
    assert history[3]["tool_call_id"] == call_id and history[3]["content"] == "sunny"
    (answer,) = loads(second.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert answer["content"] == responses[1].choices[0].message.content


async def run_instrumented(
    store: InMemoryLightningStore,
    server: StoreServer,
    client: openai.OpenAI,
    instrumentor: Any,
    *,
    attempt: tuple[str, str] | None = None,
    logger_provider: LoggerProvider | None = None,
    turns: Callable[[openai.OpenAI], list[Any]] | None = None,
) -> tuple[list[Span], list[Any]]:
    """``turns`` (default: the weather turns) under an agent span, with ``instrumentor`` on a fresh provider
    exporting to ``server`` (log records to ``logger_provider`` when given); returns the attempt's stored spans and
    the responses."""
    rollout_id, attempt_id = attempt or await new_attempt(store)
    provider = TracerProvider()
    export_to(provider, server, rollout_id, attempt_id)
    options: dict[str, Any] = {} if logger_provider is None else {"logger_provider": logger_provider}
    instrumentor.instrument(tracer_provider=provider, **options)
    try:
        with provider.get_tracer("agent").start_as_current_span("invoke_agent weather", attributes=AGENT_ATTRIBUTES):
            responses = turns(client) if turns else weather_turns(client, lambda arguments: "sunny")
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    return await store.query_spans(rollout_id, attempt_id), responses
