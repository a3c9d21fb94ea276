"""The shared integration invariants, for AutoGen AgentChat with ``instrument()``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from autogen_ext.models.replay import ReplayChatCompletionClient

import agentlightning_autogen
from agentlightning_autogen import _processor, _wrappers
from tests.integrations.autogen.fakes import calculator_agent, run_sync, run_task
from tests.integrations.conformance import IntegrationConformance, IntegrationHarness


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("hook broken (conformance fault injection)")


class AutoGenHarness(IntegrationHarness):
    """Runs the calculator AssistantAgent (two LLM calls around one tool call) with ``instrument()``.

    AutoGen reports a tool's exception to the model as a tool result instead of raising it, so the user's code
    that fails here is the user's own model client (a replay client subclass), whose exception AutoGen passes on.
    """

    def run(self, *, fail_with: BaseException | None = None) -> None:
        """Run the agent to completion from sync code."""
        run_sync(lambda: run_task(calculator_agent(fail_with=fail_with), stream=False))

    async def arun(self, *, fail_with: BaseException | None = None) -> None:
        """Run the agent on the running loop."""
        await run_task(calculator_agent(fail_with=fail_with), stream=False)

    def instrument(self) -> None:
        """The zero-line hook."""
        agentlightning_autogen.instrument()

    def uninstrument(self) -> None:
        """Its inverse."""
        agentlightning_autogen.uninstrument()

    def attached_hooks(self) -> int:
        """How many of our wrappers a model call would go through now (0 when uninstrumented)."""
        depth = 0
        method: Any = ReplayChatCompletionClient.create
        while getattr(method, _wrappers.WRAPPED, False):
            depth += 1
            method = method.__wrapped__
        return depth if _processor.active_state() is not None else 0

    @contextlib.contextmanager
    def broken_hook(self) -> Iterator[None]:
        """LLM span start, tool arguments and span forwarding all raise."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_wrappers, "start_llm_span", _fail)
            patch.setattr(_wrappers, "tool_arguments_json", _fail)
            patch.setattr(_processor.AutogenSpanProcessor, "_on_start", _fail)
            yield


class TestAutoGenConformance(IntegrationConformance):
    """AutoGen AgentChat against the shared invariants."""

    def make_harness(self) -> IntegrationHarness:
        """A harness for the calculator agent."""
        return AutoGenHarness()
