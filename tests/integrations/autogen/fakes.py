"""Offline AutoGen agents for the integration tests: replayed model answers, a calculator tool, a 3-agent team."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import ChatAgent, TaskResult, Team
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import CreateResult, LLMMessage, ModelInfo, RequestUsage
from autogen_core.tools import FunctionTool
from autogen_ext.models.replay import ReplayChatCompletionClient

MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)
TEAM = ("planner", "solver", "critic")
ADD_CALL = FunctionCall(id="call_add", name="add", arguments='{"a":2,"b":3}')


def add_call_result() -> CreateResult:
    """The model's first answer in the calculator run: call add(2, 3)."""
    return CreateResult(finish_reason="function_calls", content=[ADD_CALL], usage=RequestUsage(12, 7), cached=False)


class ScriptedClient(ReplayChatCompletionClient):
    """A user's own model client (a replay client) that can fail on a chosen call with the user's exception."""

    def __init__(
        self, answers: Sequence[str | CreateResult], *, fail_with: BaseException | None = None, fail_at: int = 1
    ) -> None:
        super().__init__(list(answers), model_info=MODEL_INFO)
        self._fail_with = fail_with
        self._fail_at = fail_at
        self._calls = 0

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        """Replay the next answer, or raise the user's exception on call number ``fail_at``."""
        self._calls += 1
        if self._fail_with is not None and self._calls - 1 == self._fail_at:
            raise self._fail_with
        return await super().create(messages, **kwargs)


def make_add_tool(fail_with: BaseException | None = None) -> FunctionTool:
    """The calculator tool (``add``); with ``fail_with`` it raises (AutoGen reports that to the model as text)."""

    async def add(a: int, b: int) -> int:
        """Add two integers."""
        if fail_with is not None:
            raise fail_with
        return a + b

    return FunctionTool(add, description="Add two integers.", name="add")


def calculator_agent(
    *, fail_with: BaseException | None = None, tool_fails_with: BaseException | None = None, stream: bool = False
) -> AssistantAgent:
    """One AssistantAgent with the calculator tool and reflect_on_tool_use: two LLM calls around one tool call."""
    client = ScriptedClient([add_call_result(), "The sum is 5."], fail_with=fail_with)
    return AssistantAgent(
        "calculator",
        client,
        tools=[make_add_tool(tool_fails_with)],
        reflect_on_tool_use=True,
        model_client_stream=stream,
    )


def _member(name: str, stream: bool) -> AssistantAgent:
    client = ScriptedClient([f"{name} has spoken."])
    return AssistantAgent(name, client, description=f"The {name}.", model_client_stream=stream)


def round_robin_team(*, stream: bool = False) -> RoundRobinGroupChat:
    """Planner, solver and critic taking one turn each."""
    members: list[ChatAgent | Team] = [_member(name, stream) for name in TEAM]
    return RoundRobinGroupChat(members, termination_condition=MaxMessageTermination(len(TEAM) + 1))


def selector_team() -> SelectorGroupChat:
    """The same three agents; a selector model picks solver, then critic."""
    members: list[ChatAgent | Team] = [_member(name, False) for name in TEAM]
    selector = ReplayChatCompletionClient(["solver", "critic"], model_info=MODEL_INFO)
    return SelectorGroupChat(members, model_client=selector, termination_condition=MaxMessageTermination(3))


async def run_task(runnable: AssistantAgent | RoundRobinGroupChat | SelectorGroupChat, *, stream: bool) -> TaskResult:
    """Run an agent or team on the task, with ``run`` or by draining ``run_stream``."""
    if not stream:
        return await runnable.run(task="What is 2 + 3?", cancellation_token=CancellationToken())
    result: TaskResult | None = None
    async for item in runnable.run_stream(task="What is 2 + 3?"):
        if isinstance(item, TaskResult):
            result = item
    assert result is not None
    return result


def run_sync(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine to completion from sync code, in this thread or (inside a running loop) in a helper thread.

    The helper thread runs in a copy of the caller's context, so the rollout context carries over.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(asyncio.run(make()))
        except BaseException as error:  # re-raised on the caller's thread
            failure.append(error)

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(target,))
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
