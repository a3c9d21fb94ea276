"""The calc agent: a plain AutoGen ``AssistantAgent`` that solves word problems with a calculator tool.

It knows nothing of Agent Lightning: it calls any OpenAI-compatible model through
``OpenAIChatCompletionClient(base_url=...)``. ``train.py`` trains it without changing this file.

The model does not compute: it writes the calculation (``first minus second``, ``12 times 7``, ``second divided by
first``) and the agent's ``calculator`` tool evaluates it, with ``first`` and ``second`` standing for the problem's
numbers in order. Models served without native tool calling (a vLLM server without a tool parser, the tiny CPU policy)
use the tool through :class:`SingleToolTextClient`: the model's whole reply is the tool's input.
"""

from __future__ import annotations

import json
import re
import ssl
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Final

import certifi
import openai
from autogen_agentchat.agents import AssistantAgent
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    ModelCapabilities,  # pyright: ignore[reportDeprecated]  # still part of the abstract interface in 0.7
    ModelInfo,
    RequestUsage,
)
from autogen_core.tools import FunctionTool, Tool, ToolSchema
from autogen_ext.models.openai import OpenAIChatCompletionClient

SYSTEM_MESSAGE: Final = "Write the calculation for the problem with first and second for its numbers."

# One TLS context for every HTTP client: building one per client loads the CA bundle each time (~20-60 ms of CPU),
# which would dominate the cost of a problem when every problem talks to a new base URL.
_TLS: Final = ssl.create_default_context(cafile=certifi.where())
_TEXT_MODEL: Final[ModelInfo] = {
    "vision": False, "function_calling": False, "json_output": False, "structured_output": False, "family": "unknown",
}  # fmt: skip
_OPERATORS: Final = {
    "plus": "+", "+": "+", "minus": "-", "-": "-", "times": "*", "*": "*", "x": "*", "divided": "/", "over": "/",
    "/": "/",
}  # fmt: skip
_TOKEN_RE: Final = re.compile(r"first|second|plus|minus|times|divided|over|\d+(?:\.\d+)?|[+\-*/]|\bx\b")


def calculate(expression: str, numbers: Sequence[float]) -> float:
    """Evaluate ``X op Y``: numbers or ``first``/``second`` (the problem's numbers), op in words or symbols.

    Read leniently, as a calculator reads a scribble: the first operator counts, its left operand is the last
    number before it and its right operand the first after it; a missing operand is the problem's number the other
    one is not (first on the left, second on the right, by default).
    """
    tokens = _TOKEN_RE.findall(expression.lower())
    position = next((i for i, t in enumerate(tokens) if t in _OPERATORS), None)
    if position is None:
        raise ValueError(f"no operator in {expression!r}; write e.g. 'first plus second' or '12 * 7'")
    references = {"first": 0, "second": 1}

    def value(token: str) -> float:
        if token in references:
            if len(numbers) <= references[token]:
                raise ValueError(f"{expression!r} names the {token} number; the problem has {len(numbers)}")
            return float(numbers[references[token]])
        return float(token)

    left = next((t for t in reversed(tokens[:position]) if t not in _OPERATORS), None)
    right = next((t for t in tokens[position + 1 :] if t not in _OPERATORS), None)
    if left is None:
        left = "second" if right == "first" else "first"
    if right is None:
        right = "first" if left == "second" else "second"
    x, y = value(left), value(right)
    operator = _OPERATORS[tokens[position]]
    if operator == "/" and y == 0:
        raise ValueError(f"{expression!r} divides by zero")
    return {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else 0.0}[operator]


def make_calculator(numbers: Sequence[float]) -> FunctionTool:
    """The ``calculator`` tool of one problem: ``first`` and ``second`` in an expression are its numbers."""

    async def calculator(expression: str) -> str:
        """Evaluate a calculation such as 'first plus second', '12 times 7' or '84 / 7'."""
        try:
            result = calculate(expression, numbers)
        except ValueError as exc:
            return f"error: {exc}"
        return str(int(result)) if result == int(result) else f"{result:.4g}"

    return FunctionTool(calculator, name="calculator", description="Evaluate one arithmetic calculation.")


class SingleToolTextClient(ChatCompletionClient):
    """A model client that gives a text-only model one tool: its whole reply becomes the call of that tool.

    With exactly one tool offered (taking one string parameter) the wrapped client is asked for plain text, and
    its reply is returned as a call of the tool with the text as that parameter; otherwise calls pass through.
    """

    def __init__(self, client: ChatCompletionClient, *, model: str | None = None) -> None:
        """Wrap ``client`` (which needs no tool-calling support); ``model`` names its model for observers."""
        self._client = client
        self.model = model
        self._info: ModelInfo = {**client.model_info, "function_calling": True}

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],  # the abstract method's own signature
        tool_choice: Tool | Any = "auto",
        json_output: bool | type[Any] | None = None,
        extra_create_args: Mapping[str, Any] = {},  # the abstract method's own signature
        cancellation_token: CancellationToken | None = None,
    ) -> CreateResult:
        """Ask the wrapped model for text; with one tool offered, return the text as that tool's call."""
        target = _single_text_parameter(tools) if tool_choice != "none" else None
        result = await self._client.create(
            messages,
            tools=[] if target else tools,
            json_output=json_output,
            extra_create_args=extra_create_args,
            cancellation_token=cancellation_token,
        )
        if target is None or not isinstance(result.content, str):
            return result
        name, parameter = target
        call = FunctionCall(
            id=f"call_{uuid.uuid4().hex[:12]}", name=name, arguments=json.dumps({parameter: result.content.strip()})
        )
        return result.model_copy(update={"content": [call], "finish_reason": "function_calls"})

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],  # the abstract method's own signature
        tool_choice: Tool | Any = "auto",
        json_output: bool | type[Any] | None = None,
        extra_create_args: Mapping[str, Any] = {},  # the abstract method's own signature
        cancellation_token: CancellationToken | None = None,
    ) -> AsyncGenerator[str | CreateResult, None]:
        """The result of :meth:`create` as a one-item stream (a tool call cannot be read before the text ends)."""
        yield await self.create(
            messages,
            tools=tools,
            tool_choice=tool_choice,
            json_output=json_output,
            extra_create_args=extra_create_args,
            cancellation_token=cancellation_token,
        )

    async def close(self) -> None:
        """Close the wrapped client."""
        await self._client.close()

    def actual_usage(self) -> RequestUsage:
        """The wrapped client's usage."""
        return self._client.actual_usage()

    def total_usage(self) -> RequestUsage:
        """The wrapped client's total usage."""
        return self._client.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        """Tokens of ``messages`` as the wrapped client counts them (tools are not sent)."""
        return self._client.count_tokens(messages)

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        """Tokens left in the wrapped model's context after ``messages``."""
        return self._client.remaining_tokens(messages)

    @property
    def capabilities(self) -> ModelCapabilities:  # pyright: ignore[reportDeprecated]  # abstract in 0.7
        """Deprecated in AutoGen; the model info's capability flags."""
        return {k: v for k, v in self._info.items() if k in ("vision", "function_calling", "json_output")}  # type: ignore[return-value]  # a ModelCapabilities subset of the info

    @property
    def model_info(self) -> ModelInfo:
        """The wrapped model's info, with function calling (this client provides it)."""
        return self._info


def _single_text_parameter(tools: Sequence[Tool | ToolSchema]) -> tuple[str, str] | None:
    """(tool name, parameter name) when exactly one tool with one string parameter is offered."""
    if len(tools) != 1:
        return None
    schema: ToolSchema = tools[0].schema if isinstance(tools[0], Tool) else tools[0]
    properties = dict(schema.get("parameters", {}).get("properties", {}))
    if len(properties) != 1:
        return None
    ((parameter, spec),) = properties.items()
    return (schema["name"], parameter) if spec.get("type") == "string" else None


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
            model_info=_TEXT_MODEL,
        )
        solver = AssistantAgent(
            "solver",
            model_client=SingleToolTextClient(client, model=model),
            tools=[make_calculator(problem_numbers(problem))],
            system_message=SYSTEM_MESSAGE,
            reflect_on_tool_use=False,  # the calculator's result is the answer
        )
        try:
            result = await solver.run(task=problem)
        finally:
            await client.close()
    return result.messages[-1].to_text()
