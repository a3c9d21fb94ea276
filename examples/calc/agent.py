"""The calc agent: a plain AutoGen ``AssistantAgent`` that solves two-step word problems with a calculator tool.

It knows nothing of Agent Lightning: it calls any OpenAI-compatible model with tool calling through
``OpenAIChatCompletionClient(base_url=...)``. ``train.py`` trains it without changing this file.

The model does not compute: it calls the ``calculator`` tool once per step of the story with the operation that
step needs (``plus``, ``minus``, ``times``, ``divided``). The calculator keeps a running total: its first call
combines the problem's first two numbers, each later call combines the total with the next number. AutoGen runs the
tool and sends its result back to the model, which makes the next call (``max_tool_iterations=2``); the last
result is the answer (``reflect_on_tool_use=False``). Two model calls per problem, the second prompt extending the
first with the model's call and the tool's result: one multi-turn trajectory.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Sequence
from typing import Final

import certifi
import openai
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelInfo
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

from examples.calc.problems import OPERATIONS, apply

SYSTEM_MESSAGE: Final = "Call the calculator once for each step of the problem, in order."
STEPS: Final = 2
"""Calculator calls per problem (AutoGen's ``max_tool_iterations``)."""

# One TLS context for every HTTP client: building one per client loads the CA bundle each time (~20-60 ms of CPU),
# which would dominate the cost of a problem when every problem talks to a new base URL.
_TLS: Final = ssl.create_default_context(cafile=certifi.where())
_TOOL_MODEL: Final[ModelInfo] = {
    "vision": False, "function_calling": True, "json_output": False, "structured_output": False, "family": "unknown",
}  # fmt: skip
_SYNONYMS: Final = {"+": "plus", "add": "plus", "-": "minus", "subtract": "minus", "*": "times", "x": "times",
                    "multiply": "times", "/": "divided", "divide": "divided", "over": "divided"}  # fmt: skip
_WORD_RE: Final = re.compile(r"[a-z]+|[+\-*/]")


def operation_of(text: str) -> str:
    """The operation a calculator input names (``plus``, ``minus``, ``times``, ``divided``; symbols and synonyms
    too), read leniently as a calculator reads a scribble: the first one found counts."""
    for word in _WORD_RE.findall(text.lower()):
        word = _SYNONYMS.get(word, word)
        if word in OPERATIONS:
            return word
    raise ValueError(f"no operation in {text!r}; write plus, minus, times or divided")


class Calculator:
    """A running total over one problem's numbers: each call applies an operation to the total and the next number."""

    def __init__(self, numbers: Sequence[float]) -> None:
        """Start before the problem's first number."""
        self.numbers = list(numbers)
        self.total: float | None = None
        self.used = 0

    def step(self, operation: str) -> float:
        """Apply ``operation``; the first call combines the first two numbers."""
        if self.total is None:
            if len(self.numbers) < 2:
                raise ValueError(f"the problem has {len(self.numbers)} numbers; a calculation needs two")
            self.total, self.used = float(self.numbers[0]), 1
        if self.used >= len(self.numbers):
            raise ValueError(f"every number of the problem is used ({self.used}); the total is {self.total:g}")
        self.total = apply(operation_of(operation), self.total, float(self.numbers[self.used]))
        self.used += 1
        return self.total

    def tool(self) -> FunctionTool:
        """The AutoGen tool over this running total."""

        async def calculator(operation: str) -> str:
            """Apply plus, minus, times or divided to the running total and the problem's next number (the first
            call: to its first two numbers)."""
            try:
                result = self.step(operation)
            except ValueError as exc:
                return f"error: {exc}"
            return str(int(result)) if result == int(result) else f"{result:.4g}"

        return FunctionTool(calculator, name="calculator", description="One step of the problem's arithmetic.")


def problem_numbers(problem: str) -> list[float]:
    """The numbers of a word problem, in the order it states them."""
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", problem)]


async def solve(
    problem: str,
    *,
    base_url: str,
    model: str,
    api_key: str = "unused",
    temperature: float = 0.0,
    max_tokens: int = 64,
) -> str:
    """Solve ``problem`` with the model at ``base_url``; returns the calculator's answer (or its error)."""
    # Own HTTP client, closed with the model client: the OpenAI SDK would otherwise build a fresh one (with its
    # own TLS context) for every new base URL.
    async with openai.DefaultAsyncHttpxClient(verify=_TLS) as http:
        client = OpenAIChatCompletionClient(
            model=model,
            base_url=base_url,
            api_key=api_key,
            temperature=temperature,
            max_tokens=max_tokens,
            max_retries=0,
            http_client=http,  # type: ignore[typeddict-unknown-key]  # passed on to openai.AsyncOpenAI
            model_info=_TOOL_MODEL,
            parallel_tool_calls=False,  # one step per call: the running total depends on the order
        )
        solver = AssistantAgent(
            "solver",
            model_client=client,
            tools=[Calculator(problem_numbers(problem)).tool()],
            system_message=SYSTEM_MESSAGE,
            max_tool_iterations=STEPS,
            reflect_on_tool_use=False,  # the calculator's last result is the answer
        )
        try:
            result = await solver.run(task=problem)
        finally:
            await client.close()
    return result.messages[-1].to_text()
