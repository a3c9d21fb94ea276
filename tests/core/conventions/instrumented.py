"""The instrumentations under test, each in the content mode it is run in, and how to read their calls back."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import openai
import pytest
from openinference.instrumentation.openai import OpenAIInstrumentor as OpenInferenceInstrumentor
from opentelemetry.instrumentation._semconv import _OpenTelemetrySemanticConventionStability  # pyright: ignore[reportPrivateUsage] -- the only switch to re-read the opt-in
from opentelemetry.instrumentation.openai import OpenAIInstrumentor as TraceloopOpenAIInstrumentor
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as OpenAIV2Instrumentor
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

from agentlightning import semconv
from agentlightning.adapter.tree import build_call_tree
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import Span
from tests.core.conventions.conftest import log_exporter, new_attempt, run_instrumented


class TraceloopInstrumentor(TraceloopOpenAIInstrumentor):
    """Traceloop's OpenAI instrumentor with an uninstrument that removes its wrappers.

    0.62.4 calls ``unwrap("openai.resources.chat.completions", "Completions.create")``, which
    opentelemetry-instrumentation 0.66b2 reads as ``getattr(module, "Completions.create")``: nothing is unwrapped,
    and the next test's spans nest under spans of a provider that was shut down.
    """

    def _uninstrument(self, **kwargs: Any) -> None:
        super()._uninstrument(**kwargs)  # pyright: ignore[reportUnknownMemberType]  # untyped package
        for module_name, owners in _TRACELOOP_WRAPPED.items():
            module = importlib.import_module(module_name)
            for owner, methods in owners.items():
                for method in methods:
                    unwrap(getattr(module, owner), method)


_TRACELOOP_WRAPPED: dict[str, dict[str, tuple[str, ...]]] = {
    "openai.resources.chat.completions": {"Completions": ("create",), "AsyncCompletions": ("create",)},
    "openai.resources.completions": {"Completions": ("create",), "AsyncCompletions": ("create",)},
    "openai.resources.embeddings": {"Embeddings": ("create",), "AsyncEmbeddings": ("create",)},
    "openai.resources.responses": {
        "Responses": ("create", "retrieve", "parse", "cancel"),
        "AsyncResponses": ("create", "retrieve", "parse", "cancel"),
    },
}

LATEST = "gen_ai_latest_experimental"
# The three ways openai-v2 can carry message content: span attributes (latest opt-in), one details log event per
# call (latest opt-in, EVENT_ONLY), or one log event per message and choice (the default, pre-opt-in form).
MODES: dict[str, tuple[str | None, str]] = {
    "span-attributes": (LATEST, "SPAN_ONLY"),
    "details-event": (LATEST, "EVENT_ONLY"),
    "message-events": (None, "true"),
}
LOG_MODES = frozenset({"details-event", "message-events"})

INSTRUMENTATIONS: dict[str, tuple[Callable[..., Any], str | None]] = {
    "openinference": (OpenInferenceInstrumentor, None),
    "traceloop": (TraceloopInstrumentor, None),
    "openai-v2-span-attributes": (OpenAIV2Instrumentor, "span-attributes"),
    "openai-v2-details-event": (OpenAIV2Instrumentor, "details-event"),
    "openai-v2-message-events": (OpenAIV2Instrumentor, "message-events"),
}
"""Name -> (instrumentor class, openai-v2 content mode or None)."""


@contextmanager
def genai_mode(opt_in: str | None, capture: str) -> Iterator[None]:
    """The GenAI stability opt-in and content capture mode for one block, restored afterwards."""

    def reread() -> None:
        # The stability opt-in is read once per process; force a re-read so no other test sees this one's mode.
        _OpenTelemetrySemanticConventionStability._initialized = False  # pyright: ignore[reportPrivateUsage]
        _OpenTelemetrySemanticConventionStability._initialize()  # pyright: ignore[reportPrivateUsage]

    with pytest.MonkeyPatch.context() as patch:
        if opt_in is None:
            patch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
        else:
            patch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
        patch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", capture)
        reread()
        try:
            yield
        finally:
            patch.undo()
            reread()


async def run_convention(
    store: InMemoryLightningStore,
    server: StoreServer,
    client: openai.OpenAI,
    name: str,
    turns: Callable[[openai.OpenAI], list[Any]],
    *,
    attempt: tuple[str, str] | None = None,
) -> tuple[list[Span], list[Any]]:
    """``turns`` instrumented by ``INSTRUMENTATIONS[name]`` in ``attempt`` (default: a fresh one), log records (if
    any) exported to ``/v1/logs`` as they are emitted; returns the attempt's stored spans and the responses."""
    factory, mode = INSTRUMENTATIONS[name]
    attempt = attempt or await new_attempt(store)
    logs = LoggerProvider()
    logs.add_log_record_processor(SimpleLogRecordProcessor(log_exporter(server, *attempt)))
    with genai_mode(*MODES[mode or "span-attributes"]):
        _, responses = await run_instrumented(
            store,
            server,
            client,
            factory(),
            attempt=attempt,
            logger_provider=logs if mode in LOG_MODES else None,
            turns=turns,
        )
    logs.shutdown()
    return await store.query_spans(*attempt), responses


def llm_spans(spans: list[Span]) -> list[Span]:
    """The LLM spans as the adapter reads them (conventions mapped, log records folded), in start order."""
    tree = build_call_tree(spans)
    chat = [s for s in tree.spans.values() if s.attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_CHAT]
    return sorted(chat, key=lambda s: s.start_time)


def messages(span: Span) -> tuple[Any, Any]:
    """(input, output) messages of a span, tool-call arguments parsed (the forms differ in JSON spacing only)."""

    def parsed(key: str) -> Any:
        value = json.loads(str(span.attributes[key]))
        for message in value:
            for call in message.get("tool_calls", []):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        return value

    return parsed(semconv.GEN_AI_INPUT_MESSAGES), parsed(semconv.GEN_AI_OUTPUT_MESSAGES)


def with_tool_definitions(spans: list[Span]) -> list[Span]:
    """``spans`` given the weather tool's definition where the instrumentation records none (openai-v2 2.4b0)."""
    for span in spans:
        span.attributes.setdefault(
            semconv.GEN_AI_TOOL_DEFINITIONS,
            '[{"type": "function", "function": {"name": "get_weather", "parameters": {"required": ["city"]}}}]',
        )
    return spans
