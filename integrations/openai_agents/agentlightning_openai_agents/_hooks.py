"""Run hooks that record the LLM calls of custom ``Model``s, which produce no generation span of their own."""

from __future__ import annotations

import logging
from typing import Any

from agents import Agent, RunContextWrapper, RunHooks, Tool
from agents.items import ModelResponse, TResponseInputItem
from agents.tool_context import ToolContext

from agentlightning_openai_agents import _instrument
from agentlightning_openai_agents._processor import LightningTracingProcessor

logger = logging.getLogger("agentlightning_openai_agents")


class LightningRunHooks(RunHooks[Any]):
    """Pass as ``Runner.run(agent, input, hooks=LightningRunHooks())`` when an agent uses a custom ``Model``.

    The SDK's built-in models trace each call as a generation/response span, which
    :class:`LightningTracingProcessor` records; a custom ``Model`` traces nothing, so these hooks record its calls
    from ``on_llm_start`` / ``on_llm_end`` instead (under the agent's span, with its name, messages, output, usage
    and response id). With a built-in model they record no duplicate, and they still add the tool call id to tool
    spans. They work through ``processor``, by default the one :func:`agentlightning_openai_agents.instrument`
    registered.
    """

    def __init__(self, *, processor: LightningTracingProcessor | None = None) -> None:
        """Create the hooks; ``processor`` defaults to the instrumented processor (looked up on every call)."""
        self._processor = processor
        self._failures = 0

    def _resolve(self) -> LightningTracingProcessor | None:
        return self._processor or _instrument.instrumented_processor()

    def _failed(self, where: str, error: Exception) -> None:
        self._failures += 1
        log = logger.warning if self._failures == 1 else logger.debug
        log("agentlightning_openai_agents: LightningRunHooks.%s failed; the run continues", where, exc_info=error)

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        """Remember the call's start time, system prompt and input."""
        try:
            processor = self._resolve()
            if processor is not None:
                model = agent.model if isinstance(agent.model, str) else None
                processor.record_llm_start(model, system_prompt, list(input_items))
        except Exception as error:
            self._failed("on_llm_start", error)

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        """Record the call as an LLM span unless the model traced it itself."""
        try:
            processor = self._resolve()
            if processor is not None:
                processor.record_llm_end(response)
        except Exception as error:
            self._failed("on_llm_end", error)

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool) -> None:
        """Give the running function span its tool call id (function spans do not carry it)."""
        try:
            processor = self._resolve()
            if processor is not None and isinstance(context, ToolContext):
                processor.record_tool_call_id(context.tool_call_id)
        except Exception as error:
            self._failed("on_tool_start", error)
