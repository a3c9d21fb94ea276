"""The example agent: an ordinary OpenAI-SDK tool picker. Only its base URL points at Agent Lightning."""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from agentlightning.agent import rollout
from agentlightning.types import LLM
from agentlightning_trainer import tool_choice

# One connection pool for every rollout; each rollout only changes the base URL (its own proxy route).
_CLIENT = OpenAI(base_url="http://127.0.0.1:1/v1", api_key="agent-lightning", timeout=120.0, max_retries=0)


@rollout
def tool_choice_agent(task: dict[str, Any], llm: LLM) -> float:
    """Ask the model which tool serves the request; reward 1 when it names the right one first."""
    client = _CLIENT.with_options(base_url=llm.base_url)
    reply = client.chat.completions.create(
        model=llm.model,
        messages=tool_choice.messages(task),  # type: ignore[arg-type]  # plain dicts in the OpenAI chat shape
        temperature=llm.sampling.get("temperature", 1.0),
        max_tokens=llm.sampling.get("max_tokens", 8),
    )
    return tool_choice.score(task, reply.choices[0].message.content or "")


@rollout
def tool_calling_agent(task: dict[str, Any], llm: LLM) -> float:
    """An ordinary tool-calling agent: send the tools, dispatch the call the model makes; reward the right tool."""
    client = _CLIENT.with_options(base_url=llm.base_url)
    reply = client.chat.completions.create(
        model=llm.model,
        messages=tool_choice.tool_messages(task),  # type: ignore[arg-type]  # plain dicts in the OpenAI chat shape
        tools=tool_choice.TOOL_DEFINITIONS,  # type: ignore[arg-type]  # plain dicts in the OpenAI tool shape
        tool_choice="required",
        temperature=llm.sampling.get("temperature", 1.0),
        max_tokens=llm.sampling.get("max_tokens", 16),
    )
    calls = reply.choices[0].message.tool_calls or []
    function = getattr(calls[0], "function", None) if calls else None
    return tool_choice.score_call(task, function.name if function is not None else None)
