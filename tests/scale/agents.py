"""Agents the scale tests run in runner processes and Ray actors (``tests.scale.agents:NAME``)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentlightning.agent import rollout
from agentlightning.emit import emit_message


@rollout
async def quick(task: dict[str, Any]) -> float:
    """Emit one message and return a reward: the cheapest realistic rollout (two spans)."""
    emit_message(f"task {task['i']}")
    await asyncio.sleep(0)
    return float(task["i"] % 5)


@rollout
async def slow(task: dict[str, Any]) -> float:
    """Emit one message, then work for ``task['sleep_s']`` seconds (long enough to kill or stall mid-rollout)."""
    emit_message(f"task {task['i']}")
    await asyncio.sleep(float(task.get("sleep_s", 1.0)))
    return 1.0
