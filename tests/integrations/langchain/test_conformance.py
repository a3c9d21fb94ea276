"""The shared integration invariants, for LangChain/LangGraph with the zero-line hook."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from langchain_core.callbacks import CallbackManager

import agentlightning_langchain
from agentlightning_langchain import LightningCallbackHandler
from tests.integrations.conformance import IntegrationConformance, IntegrationHarness, broken_tracer
from tests.integrations.langchain.fakes import (
    ToolFailure,
    build_react_agent,
    make_add_tool,
    react_answers,
    scripted_model,
    team_input,
)


class LangChainHarness(IntegrationHarness):
    """Runs LangGraph's prebuilt ReAct agent (one tool call, two LLM calls) with ``instrument()``."""

    def _agent(self, fail_with: BaseException | None) -> Any:
        return build_react_agent(scripted_model(*react_answers()), [make_add_tool(ToolFailure(fail_with))])

    def run(self, *, fail_with: BaseException | None = None) -> None:
        """Invoke the agent synchronously."""
        self._agent(fail_with).invoke(team_input())

    async def arun(self, *, fail_with: BaseException | None = None) -> None:
        """Invoke the agent asynchronously."""
        await self._agent(fail_with).ainvoke(team_input())

    def instrument(self) -> None:
        """The zero-line hook."""
        agentlightning_langchain.instrument()

    def uninstrument(self) -> None:
        """Its inverse."""
        agentlightning_langchain.uninstrument()

    def attached_hooks(self) -> int:
        """Handlers LangChain would attach to a run configured now."""
        manager = CallbackManager.configure()
        return sum(isinstance(handler, LightningCallbackHandler) for handler in manager.handlers)

    def broken_hook(self) -> AbstractContextManager[None]:
        """Every span start inside the handler raises (it resolves the process tracer per run tree)."""
        return broken_tracer()


class TestLangChainConformance(IntegrationConformance):
    """LangChain/LangGraph against the shared invariants."""

    def make_harness(self) -> IntegrationHarness:
        """A harness for the prebuilt agent."""
        return LangChainHarness()
