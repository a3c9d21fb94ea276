"""The tool-choice task: 12 kinds of request, each best served by one of 4 tools; reward 1 for the right tool.

Two ways to ask: in text (the tiny GPT names a tool) or with real tool definitions (:data:`TOOL_DEFINITIONS`, an
agent that sends them with ``tool_choice="required"`` and dispatches the call it gets back).
"""

from __future__ import annotations

import re
from typing import Any, Final

TOOLS: Final[tuple[str, ...]] = ("calculator", "search", "weather", "calendar")

TOOL_DESCRIPTIONS: Final[dict[str, str]] = {
    "calculator": "Evaluate arithmetic",
    "search": "Search the web",
    "weather": "Get a weather forecast",
    "calendar": "Manage the user's calendar",
}

TOOL_DEFINITIONS: Final[list[dict[str, Any]]] = [
    {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": {"type": "object", "properties": {}}},
    }
    for name, description in TOOL_DESCRIPTIONS.items()
]
"""The tools as OpenAI function definitions; they take no arguments (the agent hands the request on itself)."""

TOOL_AGENT_PROMPT: Final = "Call the one tool that serves the user's request."

SYSTEM_PROMPT: Final = "Pick one tool for the request: calculator, search, weather or calendar. Reply with its name."

# (request, correct tool): three kinds per tool.
REQUESTS: Final[tuple[tuple[str, str], ...]] = (
    ("what is 17 times 23", "calculator"),
    ("add 45 and 98", "calculator"),
    ("divide 144 by 12", "calculator"),
    ("who wrote hamlet", "search"),
    ("find the capital of peru", "search"),
    ("look up the tallest mountain", "search"),
    ("will it rain in oslo tomorrow", "weather"),
    ("how hot is cairo today", "weather"),
    ("is it windy in lima", "weather"),
    ("book a meeting on friday", "calendar"),
    ("what is on my schedule monday", "calendar"),
    ("remind me of the dentist on tuesday", "calendar"),
)


def tasks() -> list[dict[str, str]]:
    """The 12 tasks as JSON-serialisable rollout inputs (``request`` and the ``tool`` that serves it)."""
    return [{"request": request, "tool": tool} for request, tool in REQUESTS]


def messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The OpenAI chat messages an agent sends for ``task``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(task["request"])}]


def tool_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages a tool-calling agent sends for ``task`` (with :data:`TOOL_DEFINITIONS` as its tools)."""
    return [{"role": "system", "content": TOOL_AGENT_PROMPT}, {"role": "user", "content": str(task["request"])}]


def score_call(task: dict[str, Any], tool_name: str | None) -> float:
    """1.0 when the agent's first tool call went to the task's tool, else 0.0 (no call scores 0)."""
    if "tool" not in task:
        raise ValueError(f"tool-choice task needs a 'tool' key naming the right tool; got keys {sorted(task)}")
    return 1.0 if tool_name == task["tool"] else 0.0


def chosen_tool(reply: str) -> str | None:
    """The first tool named in ``reply`` (what a tool-calling agent would dispatch to), or None."""
    found = [(m.start(), tool) for tool in TOOLS for m in [re.search(re.escape(tool), reply.lower())] if m]
    return min(found)[1] if found else None


def score(task: dict[str, Any], reply: str) -> float:
    """1.0 when the first tool named in ``reply`` is the task's tool, else 0.0."""
    if "tool" not in task:
        raise ValueError(f"tool-choice task needs a 'tool' key naming the right tool; got keys {sorted(task)}")
    return 1.0 if chosen_tool(reply) == task["tool"] else 0.0


def vocabulary() -> tuple[str, ...]:
    """Whole-word tokens for the tiny GPT's tokenizer: the tools and every word of the prompts (shorter prompts)."""
    words: dict[str, None] = dict.fromkeys(TOOLS)
    for text in [SYSTEM_PROMPT, *(request for request, _ in REQUESTS)]:
        for word in re.findall(r"[A-Za-z]+", text):
            if len(word) > 1:
                words.setdefault(" " + word)
                words.setdefault(word)
    return tuple(words)
