"""The shared integration invariants, for CrewAI with ``instrument()`` on the 3-agent crew."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from crewai.events.event_bus import crewai_event_bus
from crewai.events.types.llm_events import LLMCallStartedEvent
from opentelemetry.trace import NoOpTracer, Span

import agentlightning_crewai
from agentlightning import tracing
from tests.integrations.conformance import IntegrationConformance, IntegrationHarness
from tests.integrations.crewai.fakes import build_crew


class _BrokenTracer(NoOpTracer):
    """A tracer whose every span start fails: the fault inside our hook that a user can never cause."""

    def start_span(self, *args: Any, **kwargs: Any) -> Span:
        raise RuntimeError("tracer broken (conformance fault injection)")


def our_handlers(event_class: type[Any] = LLMCallStartedEvent) -> int:
    """Handlers of ours on CrewAI's bus for one event class (the bus keeps no public list, hence its private map)."""
    handlers = crewai_event_bus._sync_handlers.get(event_class, frozenset())  # pyright: ignore[reportPrivateUsage]
    return sum("LightningEventListener" in getattr(handler, "__qualname__", "") for handler in handlers)


class CrewAIHarness(IntegrationHarness):
    """Kicks off the planner → specialist → critic crew (scripted custom models, one tool call).

    With ``fail_with`` the specialist task's callback raises it: CrewAI catches a tool's exception and shows it to
    the model (recorded on the tool span, see test_crew.py), while a task callback's exception reaches the caller
    unchanged, recorded on the task span.
    """

    def run(self, *, fail_with: BaseException | None = None) -> None:
        """``Crew.kickoff``."""
        build_crew(callback_error=fail_with).kickoff()

    async def arun(self, *, fail_with: BaseException | None = None) -> None:
        """``Crew.akickoff``: CrewAI's native async path (models' ``acall``)."""
        await build_crew(callback_error=fail_with).akickoff()

    def instrument(self) -> None:
        """The zero-line hook."""
        agentlightning_crewai.instrument()

    def uninstrument(self) -> None:
        """Its inverse."""
        agentlightning_crewai.uninstrument()

    def attached_hooks(self) -> int:
        """Our handlers for LLMCallStartedEvent on the bus."""
        return our_handlers()

    def flush(self) -> None:
        """CrewAI hands events to handlers later, on its thread pool."""
        assert agentlightning_crewai.flush(timeout_s=30.0)

    @contextlib.contextmanager
    def broken_hook(self) -> Iterator[None]:
        """Every span start inside the listener raises (it resolves the process tracer per trace)."""
        original = tracing.get_tracer
        tracing.get_tracer = lambda name="agentlightning": _BrokenTracer()
        try:
            yield
        finally:
            tracing.get_tracer = original


class TestCrewAIConformance(IntegrationConformance):
    """CrewAI against the shared invariants."""

    def make_harness(self) -> IntegrationHarness:
        """A harness for the 3-agent crew."""
        return CrewAIHarness()
