"""Dev mode of the RAG example against the fake upstream: rollouts succeed and the span tree shows every layer."""

from __future__ import annotations

import asyncio
import io

from rich.console import Console

import agentlightning_openai_agents
from examples.rag.train import dev_async


def test_dev_mode_prints_agent_tool_llm_and_reward_spans() -> None:
    out = io.StringIO()
    try:
        rows, trees = asyncio.run(dev_async(n_tasks=2, console=Console(file=out, width=200)))
    finally:
        agentlightning_openai_agents.uninstrument()
    assert [r.status for r in rows] == ["succeeded", "succeeded"]
    assert all(r.final_reward == 1.0 for r in rows)  # the scripted researcher follows each chain correctly
    # one transition per researcher reply, each with the engine's token ids from the proxy
    assert all(r.transitions == r.transitions_with_token_ids >= 3 for r in rows)
    printed = out.getvalue()
    assert len(trees) == 2
    for expected in (
        "multi-hop qa",
        "invoke_agent researcher",
        "chat fake agent=researcher",
        "execute_tool search tool=search",
        "prompt_tokens=",
        "(proxy)",
        "reward supporting=1.0",
        "reward f1=1.0",
    ):
        assert expected in printed, expected
