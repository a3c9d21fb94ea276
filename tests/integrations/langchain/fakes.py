"""Offline agents for the LangChain tests: a scripted fake chat model with tools, usage and streaming, and graphs."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agentlightning.types.spans import Span


class ScriptedChatModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` that binds tools and streams tool calls, usage and finish reason, as real models do.

    The parent streams only text (tool calls and usage are lost on its streaming path), so ``_stream`` is replaced:
    the text word by word, then one last chunk with the tool calls, usage and finish reason.
    """

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools the way OpenAI-style models do (they appear in the run's invocation params)."""
        kwargs.pop("tool_choice", None)
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        message = self._generate(messages, stop=stop, run_manager=None, **kwargs).generations[0].message
        assert isinstance(message, AIMessage)
        text = message.content if isinstance(message.content, str) else ""
        for token in (piece for piece in re.split(r"(\s)", text) if piece):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=token, id=message.id))
            if run_manager is not None:
                run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk
        last = AIMessageChunk(
            content="",
            id=message.id,
            tool_call_chunks=[
                {"name": call["name"], "args": json.dumps(call["args"]), "id": call["id"], "index": index}
                for index, call in enumerate(message.tool_calls)
            ],
            usage_metadata=message.usage_metadata,
            response_metadata=dict(message.response_metadata),
            chunk_position="last",
        )
        yield ChatGenerationChunk(message=last)


def reply(
    text: str = "",
    *,
    calls: Sequence[tuple[str, dict[str, Any], str]] = (),
    usage: tuple[int, int] = (10, 5),
    response_id: str | None = None,
) -> AIMessage:
    """One scripted model answer: text and/or tool calls ``(name, args, call_id)``, usage and a response id."""
    return AIMessage(
        content=text,
        id=response_id,
        tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"} for name, args, call_id in calls],
        usage_metadata={"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": usage[0] + usage[1]},
        response_metadata={"finish_reason": "tool_calls" if calls else "stop", "model_name": "fake-model"},
    )


def scripted_model(*answers: AIMessage) -> ScriptedChatModel:
    """A fresh fake model serving ``answers`` in order (one per call)."""
    return ScriptedChatModel(messages=iter(answers))


class ToolFailure:
    """Holds the exception a tool raises when a test injects a failure (per agent, so concurrent runs are safe)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def make_add_tool(failure: ToolFailure | None = None) -> BaseTool:
    """The ``add`` tool; raises ``failure.error`` when set."""

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        if failure is not None and failure.error is not None:
            raise failure.error
        return a + b

    return add


def react_answers(tag: str = "") -> list[AIMessage]:
    """The script of one prebuilt-agent run: call ``add(2, 3)``, then answer."""
    return [
        reply(calls=[("add", {"a": 2, "b": 3}, f"call_add{tag}")], usage=(12, 7), response_id=f"resp-1{tag}"),
        reply("The sum is 5.", usage=(30, 6), response_id=f"resp-2{tag}"),
    ]


def build_react_agent(
    model: ScriptedChatModel, tools: Sequence[BaseTool], name: str | None = "mathbot"
) -> Runnable[Any, Any]:
    """LangGraph's prebuilt ReAct agent (nodes ``agent`` and ``tools``) around ``model``."""
    from langgraph.prebuilt import create_react_agent
    from langgraph.warnings import LangGraphDeprecatedSinceV10

    # create_react_agent is deprecated in favour of langchain.agents.create_agent, which needs the `langchain`
    # package; this environment has only langchain-core + langgraph, where create_react_agent is the prebuilt.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        return create_react_agent(model, list(tools), name=name)


def build_team(
    planner: ScriptedChatModel,
    researcher: ScriptedChatModel,
    writer: ScriptedChatModel,
    failure: ToolFailure | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A hand-written multi-agent graph: planner -> researcher (calls ``add`` itself) -> writer."""
    add = make_add_tool(failure)
    researcher_with_tools = researcher.bind_tools([add])

    def plan(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [planner.invoke(state["messages"], config)]}

    def research(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        answer = researcher_with_tools.invoke(state["messages"], config)
        results = [add.invoke(call, config) for call in answer.tool_calls]
        return {"messages": [answer, *results]}

    def write(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [writer.invoke(state["messages"], config)]}

    graph = StateGraph(MessagesState)
    graph.add_node("planner", plan)
    graph.add_node("researcher", research)
    graph.add_node("writer", write)
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "researcher")
    graph.add_edge("researcher", "writer")
    graph.add_edge("writer", END)
    return graph.compile(name="team")


def team_models(tag: str = "") -> tuple[ScriptedChatModel, ScriptedChatModel, ScriptedChatModel]:
    """Fresh fake models for one run of the team graph."""
    return (
        scripted_model(reply("Plan: add 2 and 3.", usage=(8, 5), response_id=f"plan{tag}")),
        scripted_model(
            reply(calls=[("add", {"a": 2, "b": 3}, f"call_r{tag}")], usage=(20, 9), response_id=f"res{tag}")
        ),
        scripted_model(reply("Answer: 5", usage=(40, 3), response_id=f"write{tag}")),
    )


def team_input(question: str = "What is 2 + 3?") -> MessagesState:
    """The input state of the team graph."""
    return {"messages": [HumanMessage(question)]}


# The span tree of one team run (researcher renamed to research_agent by the handler's agent_names).
TEAM_TREE = [
    "team",
    "  invoke_agent planner",
    "    chat ScriptedChatModel",
    "  invoke_agent research_agent",
    "    chat ScriptedChatModel",
    "    execute_tool add",
    "  invoke_agent writer",
    "    chat ScriptedChatModel",
]


def tree(spans: list[Span]) -> list[str]:
    """The span tree as indented names, children in start order."""
    children: dict[str | None, list[Span]] = {}
    for span in sorted(spans, key=lambda s: s.start_time):
        children.setdefault(span.parent_id, []).append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children.get(parent, []):
            lines.append("  " * depth + span.name)
            walk(span.span_id, depth + 1)

    walk(None, 0)
    return lines
