"""Agents the async-training tests run, in process and in `agl runner` subprocesses
(``tests.trainer.async_agents:NAME``)."""

from __future__ import annotations

import time
from typing import Any

from agentlightning.agent import rollout
from agentlightning.types import LLM
from agentlightning_trainer.quickstart.agent import tool_choice_agent


@rollout
def slow_tool_choice(task: dict[str, Any], llm: LLM) -> float:
    """The quickstart tool picker after 0.5 s of tool work, so a test can catch a runner in the middle of a rollout."""
    time.sleep(0.5)
    return float(tool_choice_agent(task, llm))
