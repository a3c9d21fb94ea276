"""The shared integration invariants, for CrewAI with ``instrument()`` on the 3-agent crew."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from crewai.events.event_bus import crewai_event_bus
from crewai.events.types.llm_events import LLMCallStartedEvent

import agentlightning_crewai
from tests.integrations.conformance import IntegrationConformance, IntegrationHarness, broken_tracer
from tests.integrations.crewai.fakes import build_crew


def our_handlers(event_class: type[Any] = LLMCallStartedEvent) -> int:
    """Handlers of ours on CrewAI's bus for one event class (the bus keeps no public list, hence its private map)."""
    by_class = crewai_event_bus._sync_handlers  # pyright: ignore[reportPrivateUsage]  # no public list exists
    handlers = by_class.get(event_class, frozenset())
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

    def broken_hook(self) -> AbstractContextManager[None]:
        """Every span start inside the listener raises (it resolves the process tracer per trace)."""
        return broken_tracer()


class TestCrewAIConformance(IntegrationConformance):
    """CrewAI against the shared invariants."""

    def make_harness(self) -> IntegrationHarness:
        """A harness for the 3-agent crew."""
        return CrewAIHarness()
