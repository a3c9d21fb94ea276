"""instrument() / uninstrument(): exact inverses, idempotent, keeping the user's processors and the SDK's exporter."""

from __future__ import annotations

from typing import Any

from agents import OpenAIChatCompletionsModel, add_trace_processor, set_trace_processors
from agents.tracing import Span as SdkSpan, Trace, TracingProcessor
from agents.tracing.processors import default_processor

import agentlightning_openai_agents
from agentlightning.tracing import rollout_context
from agentlightning_openai_agents import LightningRunHooks, LightningTracingProcessor, instrument, uninstrument
from agentlightning_openai_agents._instrument import instrumented_processor, registered_processors
from tests.integrations.conformance import SpanCapture
from tests.integrations.openai_agents.fakes import scripted_models
from tests.integrations.openai_agents.test_team import run_team


class UserProcessor(TracingProcessor):
    """A processor of the user's own: it must keep receiving every span."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def on_trace_start(self, trace: Trace) -> None:
        """Nothing to do."""

    def on_trace_end(self, trace: Trace) -> None:
        """Nothing to do."""

    def on_span_start(self, span: SdkSpan[Any]) -> None:
        """Nothing to do."""

    def on_span_end(self, span: SdkSpan[Any]) -> None:
        """Remember the span type."""
        self.ended.append(span.span_data.type)

    def shutdown(self) -> None:
        """Nothing to do."""

    def force_flush(self) -> None:
        """Nothing to do."""


def _lightning() -> list[TracingProcessor]:
    return [p for p in registered_processors() or [] if isinstance(p, LightningTracingProcessor)]


def test_public_surface() -> None:
    """The package exports the processor, the hooks and the two functions, nothing else."""
    assert sorted(agentlightning_openai_agents.__all__) == [
        "LightningRunHooks",
        "LightningTracingProcessor",
        "instrument",
        "uninstrument",
    ]


def test_instrument_twice_is_once_and_uninstrument_restores_exactly() -> None:
    """The processor list and the Chat Completions model are back to what they were, exporter at its place."""
    user = UserProcessor()
    exporter = default_processor()
    set_trace_processors([user, exporter])
    fetch = OpenAIChatCompletionsModel.__dict__["_fetch_response"]

    instrument()
    instrument()
    processors = registered_processors()
    assert processors is not None and processors[0] is user and exporter not in processors
    assert len(_lightning()) == 1 and _lightning()[0] is instrumented_processor()
    assert OpenAIChatCompletionsModel.__dict__["_fetch_response"] is not fetch

    uninstrument()
    uninstrument()
    assert registered_processors() == [user, exporter]
    assert OpenAIChatCompletionsModel.__dict__["_fetch_response"] is fetch
    assert instrumented_processor() is None


def test_keep_default_exporter_when_asked() -> None:
    """drop_default_exporter=False leaves the SDK's exporter registered next to ours."""
    exporter = default_processor()
    set_trace_processors([exporter])
    instrument(drop_default_exporter=False)
    processors = registered_processors()
    assert processors is not None and processors[0] is exporter and len(_lightning()) == 1
    uninstrument()
    assert registered_processors() == [exporter]


async def test_user_processor_still_sees_every_span(capture: SpanCapture) -> None:
    """Our processor is added next to the user's, which keeps receiving the run's spans."""
    user = UserProcessor()
    add_trace_processor(user)
    instrument()
    with rollout_context("ro-user", "at-user"):
        await run_team(scripted_models("math"), "math", stream=False, hooks=LightningRunHooks())
    assert "agent" in user.ended and "function" in user.ended
    assert capture.spans()


async def test_uninstrumented_processor_is_inert(capture: SpanCapture) -> None:
    """A processor left registered by someone else after uninstrument() records nothing (the SDK cannot remove)."""
    instrument()
    processor = instrumented_processor()
    assert processor is not None
    uninstrument()
    add_trace_processor(processor)
    with rollout_context("ro-inert", "at-inert"):
        await run_team(scripted_models("math"), "math", stream=False, hooks=LightningRunHooks(processor=processor))
    assert capture.spans() == []


async def test_explicit_processor_without_instrument(capture: SpanCapture) -> None:
    """Registered by hand, the processor records agents and tools; hooks given it add a custom model's calls."""
    processor = LightningTracingProcessor()
    add_trace_processor(processor)
    with rollout_context("ro-manual", "at-without-hooks"):
        await run_team(scripted_models("weather"), "weather", stream=False)
    with rollout_context("ro-manual", "at-with-hooks"):
        hooks = LightningRunHooks(processor=processor)
        await run_team(scripted_models("weather"), "weather", stream=False, hooks=hooks)
    spans = capture.spans()
    without = sorted(span.name for span in spans if span.attempt_id == "at-without-hooks")
    assert without == ["Agent workflow", "execute_tool lookup_weather", "invoke_agent triage", "invoke_agent weather"]
    assert sum(span.name == "chat" for span in spans if span.attempt_id == "at-with-hooks") == 3
    assert processor.open_spans == 0
