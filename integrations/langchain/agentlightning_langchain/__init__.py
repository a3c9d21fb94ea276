"""Agent Lightning integration for LangChain/LangGraph: one callback handler records LLM, tool and agent runs as spans.

One line: ``graph.invoke(x, config={"callbacks": [LightningCallbackHandler()]})``.
Zero lines: call :func:`instrument` once; every run inside a rollout is recorded until :func:`uninstrument`.
"""

from agentlightning_langchain._handler import LightningCallbackHandler
from agentlightning_langchain._instrument import instrument, uninstrument

__all__ = ["LightningCallbackHandler", "instrument", "uninstrument"]
