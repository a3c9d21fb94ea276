"""Offline CrewAI pieces: a scripted custom ``BaseLLM`` that emits its own LLM events, a tool, and the 3-agent crew.

``bench/integration_crewai.py`` measures the listener on :class:`ScriptedLLM` too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from crewai import Agent, Crew, Process, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import BaseLLM, llm_call_context
from crewai.tools import BaseTool
from crewai.tools.tool_failure import ToolFailure
from pydantic import Field

Rule = Callable[[list[dict[str, Any]]], str]

PLAN = "Plan how to add two numbers."
COMPUTE = "Compute the sum of 2 and 3 with the add tool."
REVIEW = "Review the computed sum."

# (span name, parent span name) of one sequential run of the crew below with scripted models.
SEQUENTIAL_SHAPE = sorted(
    [
        ("crew crew", None),
        (f"task {PLAN}", "crew crew"),
        (f"task {COMPUTE}", "crew crew"),
        (f"task {REVIEW}", "crew crew"),
        ("invoke_agent planner", f"task {PLAN}"),
        ("invoke_agent specialist", f"task {COMPUTE}"),
        ("invoke_agent critic", f"task {REVIEW}"),
        ("chat scripted", "invoke_agent planner"),
        ("chat scripted", "invoke_agent specialist"),
        ("chat scripted", "invoke_agent specialist"),
        ("execute_tool add", "invoke_agent specialist"),
        ("chat scripted", "invoke_agent critic"),
    ]
)


def _text(messages: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)


def _has_observation(messages: list[dict[str, Any]]) -> bool:
    # CrewAI's ReAct loop appends the tool result to the conversation as "Observation: ...".
    return any("Observation:" in str(message.get("content", "")) for message in messages[1:])


def final(answer: str) -> Rule:
    """A model that answers at once."""
    return lambda messages: f"Thought: I know the answer.\nFinal Answer: {answer}"


def tool_then_final(tool: str, arguments: dict[str, Any], answer: str) -> Rule:
    """A model that calls ``tool`` once (ReAct text), then answers once the observation is in the conversation."""

    def rule(messages: list[dict[str, Any]]) -> str:
        if _has_observation(messages):
            return f"Thought: I have the result.\nFinal Answer: {answer}"
        return f"Thought: I should use the tool.\nAction: {tool}\nAction Input: {json.dumps(arguments)}"

    return rule


class ScriptedLLM(BaseLLM):
    """A custom CrewAI model: answers by ``rule`` and, as custom models must, emits its own LLM call events."""

    rule: Any = Field(description="messages -> answer text")
    fail_with: Any = Field(default=None, description="an exception the call raises after its started event")

    def supports_function_calling(self) -> bool:
        """ReAct text, not native tool calls."""
        return False

    def call(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str:
        """Answer by the rule, emitting LLMCallStarted/Completed (or Failed) events as CrewAI's own models do."""
        with llm_call_context():
            self._emit_call_started_event(
                messages=messages, tools=tools, callbacks=callbacks, from_task=from_task, from_agent=from_agent
            )
            if self.fail_with is not None:
                self._emit_call_failed_event(error=str(self.fail_with), from_task=from_task, from_agent=from_agent)
                raise self.fail_with
            conversation = _text(messages)
            answer: str = self.rule(conversation)
            digest = hashlib.sha256(json.dumps(conversation, default=str).encode()).hexdigest()[:16]
            self._emit_call_completed_event(
                response=answer,
                call_type=LLMCallType.LLM_CALL,
                from_task=from_task,
                from_agent=from_agent,
                messages=messages,
                usage={"prompt_tokens": len(str(messages)) // 4, "completion_tokens": len(answer) // 4},
                finish_reason="stop",
                response_id=f"resp-{digest}",
            )
            return answer

    async def acall(self, *args: Any, **kwargs: Any) -> str:
        """The same, for CrewAI's native async path (same parameters as :meth:`call`)."""
        return self.call(*args, **kwargs)


class AddTool(BaseTool):
    """Adds two integers; raises ``fail_with`` instead when set (CrewAI catches it and tells the agent).

    With ``report_failure`` it returns a ``ToolFailure``: the tool ran but says it did not do its job.
    """

    name: str = "add"
    description: str = "Add two integers a and b."
    fail_with: Any = None
    report_failure: bool = False

    def _run(self, a: int, b: int) -> str | ToolFailure:
        if self.fail_with is not None:
            raise self.fail_with
        if self.report_failure:
            return ToolFailure(message="the adder is offline", code="offline")
        return str(a + b)


def build_crew(
    *,
    process: Process = Process.sequential,
    tool_error: BaseException | None = None,
    callback_error: BaseException | None = None,
    tool_reports_failure: bool = False,
    llms: dict[str, BaseLLM] | None = None,
) -> Crew:
    """The planner → specialist (with the add tool) → critic crew, with fresh models, so runs can go in parallel.

    ``callback_error`` is raised by the specialist task's callback: the user's code whose exception CrewAI lets
    through unchanged (a tool's exception it catches and shows to the model). ``llms`` replaces the scripted models.
    """
    models: dict[str, BaseLLM] = llms or {
        "planner": ScriptedLLM(model="scripted", rule=final("add 2 and 3 with the add tool")),
        "specialist": ScriptedLLM(model="scripted", rule=tool_then_final("add", {"a": 2, "b": 3}, "5")),
        "critic": ScriptedLLM(model="scripted", rule=final("correct")),
    }
    planner = Agent(role="planner", goal="Plan the work.", backstory="A careful planner.", llm=models["planner"])
    specialist = Agent(
        role="specialist",
        goal="Compute sums.",
        backstory="Good with numbers.",
        tools=[AddTool(fail_with=tool_error, report_failure=tool_reports_failure)],
        llm=models["specialist"],
    )
    critic = Agent(role="critic", goal="Check the work.", backstory="Hard to please.", llm=models["critic"])

    def fail(output: Any) -> None:
        if callback_error is not None:
            raise callback_error

    tasks = [
        Task(description=PLAN, expected_output="a plan", agent=planner),
        Task(description=COMPUTE, expected_output="a number", agent=specialist, callback=fail),
        Task(description=REVIEW, expected_output="a verdict", agent=critic),
    ]
    if process == Process.hierarchical:
        for task in tasks:
            task.agent = None
        manager = ScriptedLLM(model="scripted-manager", rule=delegate_by_task())
        return Crew(agents=[planner, specialist, critic], tasks=tasks, process=process, manager_llm=manager)
    return Crew(agents=[planner, specialist, critic], tasks=tasks, process=process)


def delegate_by_task() -> Rule:
    """The hierarchical manager: delegates each task to the agent named for it, then answers with the result."""
    owners = {PLAN: "planner", COMPUTE: "specialist", REVIEW: "critic"}

    def rule(messages: list[dict[str, Any]]) -> str:
        if _has_observation(messages):
            return "Thought: the coworker answered.\nFinal Answer: done"
        prompt = str(messages[-1].get("content", ""))
        coworker = next(owner for description, owner in owners.items() if description in prompt)
        arguments = {"task": prompt.split("Current Task:")[-1][:60].strip() or "work", "context": "none"}
        arguments["coworker"] = coworker
        return f"Thought: delegate.\nAction: Delegate work to coworker\nAction Input: {json.dumps(arguments)}"

    return rule
