"""A triage agent handing off to two specialists with tools, on the SDK's scripted model or the fake OpenAI upstream."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from agents import Agent, FunctionTool, Model, OpenAIChatCompletionsModel, OpenAIResponsesModel, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from openai import AsyncOpenAI

from agentlightning.testing import FakeOpenAI, FakeReply, FakeRequest, FakeToolCall

Api = Literal["responses", "chat"]
Route = Literal["weather", "math"]

TRIAGE = "You are the triage agent: hand off to the right specialist."
WEATHER = "You are the weather specialist: use lookup_weather."
MATH = "You are the math specialist: use add."

QUESTIONS: dict[Route, str] = {"weather": "What is the weather in Paris?", "math": "What is 2 + 3?"}
TOOL_OF: dict[Route, str] = {"weather": "lookup_weather", "math": "add"}
ARGUMENTS: dict[Route, dict[str, Any]] = {"weather": {"city": "Paris"}, "math": {"a": 2, "b": 3}}
RESULTS: dict[Route, str] = {"weather": "sunny in Paris", "math": "5"}
ANSWERS: dict[Route, str] = {"weather": "It is sunny in Paris.", "math": "2 + 3 = 5."}


class ToolFailure:
    """Makes the specialists' tools raise the user's exception when set."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def check(self) -> None:
        """Raise the configured exception, if any."""
        if self.error is not None:
            raise self.error


def make_tools(failure: ToolFailure) -> tuple[FunctionTool, FunctionTool]:
    """The specialists' tools; failures reach the caller (``failure_error_function=None``), as a user's would."""

    @function_tool(failure_error_function=None)
    def lookup_weather(city: str) -> str:
        """Look up today's weather in a city."""
        failure.check()
        return f"sunny in {city}"

    @function_tool(failure_error_function=None)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        failure.check()
        return a + b

    return lookup_weather, add


def build_team(models: Callable[[str], Model], failure: ToolFailure | None = None) -> Agent[Any]:
    """Triage agent with handoffs to a weather and a math specialist; ``models(agent_name)`` gives each its model."""
    lookup_weather, add = make_tools(failure or ToolFailure())
    weather = Agent(name="weather", instructions=WEATHER, model=models("weather"), tools=[lookup_weather])
    math = Agent(name="math", instructions=MATH, model=models("math"), tools=[add])
    return Agent(name="triage", instructions=TRIAGE, model=models("triage"), handoffs=[weather, math])


# --- the SDK's scripted model (a custom Model: it traces nothing itself) -------------------------------------------
def scripted_models(route: Route, *, emit_traces: bool = False) -> Callable[[str], Model]:
    """Fresh scripted models for one run that goes triage → ``route`` specialist → tool → answer."""
    scripts: dict[str, list[Any]] = {
        "triage": [[function_call(f"transfer_to_{route}", {}, call_id="call-handoff")]],
        route: [
            [function_call(TOOL_OF[route], ARGUMENTS[route], call_id=f"call-{route}")],
            [assistant_message(ANSWERS[route])],
        ],
    }

    def model(name: str) -> Model:
        return ScriptedModel(scripts.get(name, []), emit_traces=emit_traces)

    return model


# --- the fake OpenAI upstream, for the real OpenAIResponsesModel / OpenAIChatCompletionsModel -----------------------
def _system_prompt(request: FakeRequest) -> str:
    first = request.messages[0] if request.messages else {}
    return str(first.get("content") or "") if first.get("role") == "system" else ""


def _called(request: FakeRequest, tool: str) -> bool:
    return any(
        call.get("function", {}).get("name") == tool
        for message in request.messages
        for call in message.get("tool_calls") or []
    )


def reply(request: FakeRequest) -> FakeReply:
    """The team's behaviour, decided from the request alone (so concurrent runs cannot disturb each other)."""
    system = _system_prompt(request)
    question = next((str(m.get("content")) for m in request.messages if m.get("role") == "user"), "")
    route: Route = "weather" if "weather" in question else "math"
    if system == TRIAGE:
        return FakeReply(tool_calls=[FakeToolCall(f"transfer_to_{route}", "{}")])
    if not _called(request, TOOL_OF[route]):
        return FakeReply(tool_calls=[FakeToolCall(TOOL_OF[route], json.dumps(ARGUMENTS[route]))])
    return FakeReply(text=ANSWERS[route])


def upstream_models(client: AsyncOpenAI, api: Api) -> Callable[[str], Model]:
    """The SDK's real OpenAI models on ``client`` (model name ``fake-model``)."""

    def model(name: str) -> Model:
        if api == "responses":
            return OpenAIResponsesModel("fake-model", client)
        return OpenAIChatCompletionsModel("fake-model", client)

    return model


@contextmanager
def fake_upstream() -> Iterator[tuple[FakeOpenAI, str]]:
    """The fake OpenAI server playing the team; yields (fake, base URL)."""
    fake = FakeOpenAI(reply=reply)
    with fake.serve() as server:
        yield fake, server.base_url
