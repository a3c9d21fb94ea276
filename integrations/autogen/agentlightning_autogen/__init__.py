"""Agent Lightning integration for AutoGen AgentChat: records agents, teams, model calls and tool calls as spans.

Zero lines in the agent: call :func:`instrument` once; every AutoGen run inside a rollout is recorded until
:func:`uninstrument`. AutoGen's own OpenTelemetry spans (``invoke_agent``, ``execute_tool``) are kept, with tool
arguments and results added; every model call becomes a ``chat`` span under the agent that made it, named for that
agent (``gen_ai.agent.name``), so one agent of a team can be trained. Runtime messaging spans are dropped unless
``instrument(keep_runtime_spans=True)``.
"""

from agentlightning_autogen._instrument import instrument, uninstrument

__all__ = ["instrument", "uninstrument"]
