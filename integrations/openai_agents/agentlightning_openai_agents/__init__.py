"""Agent Lightning integration for the OpenAI Agents SDK: a tracing processor records agent, LLM and tool spans.

Zero lines: call :func:`instrument` once; every run inside a rollout is recorded until :func:`uninstrument`.
Agents with a custom ``Model`` (which traces no LLM call) also pass ``hooks=LightningRunHooks()`` to ``Runner.run``.
"""

from agentlightning_openai_agents._hooks import LightningRunHooks
from agentlightning_openai_agents._instrument import instrument, uninstrument
from agentlightning_openai_agents._processor import LightningTracingProcessor

__all__ = ["LightningRunHooks", "LightningTracingProcessor", "instrument", "uninstrument"]
