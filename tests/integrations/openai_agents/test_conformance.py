"""The shared integration invariants, for the OpenAI Agents SDK with the zero-line ``instrument()``.

Two harnesses: the SDK's scripted model (a custom ``Model`` that traces nothing, recorded through
``LightningRunHooks``), and the real ``OpenAIResponsesModel`` against the fake
OpenAI upstream (async runs are streamed with ``Runner.run_streamed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from agents import Agent, Runner
from openai import AsyncOpenAI

import agentlightning_openai_agents
from agentlightning.testing import FakeOpenAI
from agentlightning_openai_agents import LightningRunHooks, LightningTracingProcessor, _instrument
from tests.integrations.conformance import IntegrationConformance, IntegrationHarness, broken_tracer
from tests.integrations.openai_agents.fakes import (
    QUESTIONS,
    ToolFailure,
    build_team,
    reply,
    scripted_models,
    upstream_models,
)


def _blocking(call: Callable[[], None]) -> None:
    """Run a blocking SDK call; inside a running event loop (async tests), on a thread with this context.

    ``Runner.run_sync`` refuses to run inside a running loop, unlike the blocking calls of other frameworks.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        call()
        return
    raised: list[BaseException] = []
    context = contextvars.copy_context()

    def target() -> None:
        try:
            context.run(call)
        except BaseException as error:  # re-raised on the caller's thread below
            raised.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


class _AgentsHarness(IntegrationHarness):
    """What both harnesses share: instrument(), counting registered processors, breaking the tracer."""

    def instrument(self) -> None:
        """The zero-line hook."""
        agentlightning_openai_agents.instrument()

    def uninstrument(self) -> None:
        """Its inverse."""
        agentlightning_openai_agents.uninstrument()

    def attached_hooks(self) -> int:
        """Lightning processors the SDK would call for a run started now."""
        processors = _instrument.registered_processors() or []
        return sum(isinstance(processor, LightningTracingProcessor) for processor in processors)

    def broken_hook(self) -> AbstractContextManager[None]:
        """Every span start inside the processor raises (it resolves the process tracer per SDK trace)."""
        return broken_tracer()

    def user_error(self, raised: BaseException) -> BaseException:
        """The SDK wraps a failing tool's exception in ``UserError``; the user's is its cause."""
        return raised.__cause__ if raised.__cause__ is not None else raised


class ScriptedHarness(_AgentsHarness):
    """Triage → weather specialist → tool → answer, on the SDK's ScriptedModel, recorded via LightningRunHooks."""

    def _agent(self, fail_with: BaseException | None) -> Agent[Any]:
        return build_team(scripted_models("weather"), ToolFailure(fail_with))

    def run(self, *, fail_with: BaseException | None = None) -> None:
        """Run to completion on a fresh event loop (``Runner.run_sync`` would leave one open per thread)."""
        agent = self._agent(fail_with)
        _blocking(lambda: asyncio.run(self._run(agent)))

    async def _run(self, agent: Agent[Any]) -> None:
        await Runner.run(agent, QUESTIONS["weather"], hooks=LightningRunHooks())

    async def arun(self, *, fail_with: BaseException | None = None) -> None:
        """Run with ``Runner.run`` on the running loop."""
        await self._run(self._agent(fail_with))


class UpstreamHarness(_AgentsHarness):
    """The same team on the real OpenAIResponsesModel against the fake upstream; async runs are streamed."""

    def __init__(self, base_url: str) -> None:
        self._base_url = base_url

    async def _run(self, fail_with: BaseException | None, *, stream: bool) -> None:
        async with AsyncOpenAI(base_url=self._base_url, api_key="k", max_retries=0) as client:
            agent = build_team(upstream_models(client, "responses"), ToolFailure(fail_with))
            if not stream:
                await Runner.run(agent, QUESTIONS["weather"])
                return
            result = Runner.run_streamed(agent, QUESTIONS["weather"])
            async for _ in result.stream_events():
                pass

    def run(self, *, fail_with: BaseException | None = None) -> None:
        """Run to completion on a fresh event loop."""
        _blocking(lambda: asyncio.run(self._run(fail_with, stream=False)))

    async def arun(self, *, fail_with: BaseException | None = None) -> None:
        """Run streamed on the running loop."""
        await self._run(fail_with, stream=True)


class TestScriptedModelConformance(IntegrationConformance):
    """A custom Model recorded through LightningRunHooks, against the shared invariants."""

    def make_harness(self) -> IntegrationHarness:
        """A harness on the scripted model."""
        return ScriptedHarness()


class TestResponsesModelConformance(IntegrationConformance):
    """The SDK's default model API (Responses) on the fake upstream, against the shared invariants."""

    _server: contextlib.ExitStack | None = None

    @classmethod
    def setup_class(cls) -> None:
        """One fake upstream for the class (its answers depend on the request only)."""
        cls._server = contextlib.ExitStack()
        cls._url = cls._server.enter_context(FakeOpenAI(reply=reply).serve()).base_url

    @classmethod
    def teardown_class(cls) -> None:
        """Stop the fake upstream."""
        if cls._server is not None:
            cls._server.close()

    def make_harness(self) -> IntegrationHarness:
        """A harness on the Responses model."""
        return UpstreamHarness(self._url)
