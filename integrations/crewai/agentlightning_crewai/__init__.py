"""Agent Lightning integration for CrewAI: one event-bus listener records crews, tasks, agents, LLM and tool calls.

Zero lines: call :func:`instrument` once; every crew kicked off inside a rollout is recorded until
:func:`uninstrument`. Call :func:`flush` before the rollout's spans are read (CrewAI handles events later, on its
own thread pool).
"""

from agentlightning_crewai._instrument import flush, instrument, uninstrument
from agentlightning_crewai._listener import LightningEventListener

__all__ = ["LightningEventListener", "flush", "instrument", "uninstrument"]
