"""LightningCallbackHandler on real LangGraph graphs with a scripted fake model: tree, names, messages, usage."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any, cast

import pytest
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.runnables import Runnable
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt
from opentelemetry.trace import NoOpTracer, Span as OtelSpan

from agentlightning import semconv
from agentlightning.tracing import rollout_context
from agentlightning.types.spans import Span
from agentlightning_langchain import LightningCallbackHandler
from tests.integrations.conformance import SpanCapture, assert_ids, assert_isolated, assert_span_tree
from tests.integrations.langchain.fakes import (
    TEAM_TREE,
    ScriptedChatModel,
    ToolFailure,
    build_react_agent,
    build_team,
    make_add_tool,
    react_answers,
    reply,
    scripted_model,
    team_input,
    team_models,
    tree,
)

MODES = ["invoke", "ainvoke", "stream", "astream"]
ADD_TOOL_DEFINITION = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "type": "object",
            },
        },
    }
]
ADD_CALL = {"id": "call_add", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}


def run_graph(graph: Runnable[Any, Any], mode: str, handler: LightningCallbackHandler) -> int:
    """Run ``graph`` once in ``mode``; returns how many message chunks a ``messages`` stream yielded."""
    config: Any = {"callbacks": [handler]}
    if mode == "invoke":
        graph.invoke(team_input(), config)
        return 0
    if mode == "ainvoke":
        asyncio.run(graph.ainvoke(team_input(), config))
        return 0
    if mode == "stream":
        return len(list(graph.stream(team_input(), config, stream_mode="messages")))

    async def consume() -> int:
        return len([item async for item in graph.astream(team_input(), config, stream_mode="messages")])

    return asyncio.run(consume())


def by_name(spans: list[Span], name: str) -> list[Span]:
    """Spans called ``name``, in start order."""
    return sorted((span for span in spans if span.name == name), key=lambda s: s.start_time)


def genai(span: Span) -> dict[str, Any]:
    """The span's attributes with JSON-valued GenAI attributes decoded, for exact comparisons."""
    decoded: dict[str, Any] = dict(span.attributes)
    for key in (semconv.GEN_AI_INPUT_MESSAGES, semconv.GEN_AI_OUTPUT_MESSAGES, semconv.GEN_AI_TOOL_DEFINITIONS):
        if key in decoded:
            decoded[key] = json.loads(str(decoded[key]))
    return decoded


def chat_attributes(agent: str, inputs: list[Any], output: dict[str, Any], **response: Any) -> dict[str, Any]:
    """Everything an LLM span of the scripted model must carry."""
    return {
        semconv.GEN_AI_OPERATION_NAME: "chat",
        semconv.GEN_AI_PROVIDER_NAME: "scriptedchatmodel",
        semconv.GEN_AI_INPUT_MESSAGES: inputs,
        semconv.GEN_AI_OUTPUT_MESSAGES: [output],
        semconv.GEN_AI_AGENT_NAME: agent,
        semconv.GEN_AI_RESPONSE_MODEL: "fake-model",
        semconv.SPAN_SOURCE: "hook",
        semconv.ROLLOUT_ID: "ro-1",
        semconv.ATTEMPT_ID: "at-1",
        **response,
    }


def response(response_id: str, finish_reason: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The response attributes of an LLM span: id, finish reason and token usage."""
    return {
        semconv.GEN_AI_RESPONSE_ID: response_id,
        semconv.GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason],
        semconv.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
    }


# --- prebuilt agent -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_prebuilt_agent_spans(mode: str, capture: SpanCapture) -> None:
    """create_react_agent with a tool: the exact tree, messages, tool call, usage and response ids, in every mode."""
    handler = LightningCallbackHandler()
    graph = build_react_agent(scripted_model(*react_answers()), [make_add_tool()])
    with rollout_context("ro-1", "at-1"):
        chunks = run_graph(graph, mode, handler)
    if mode in ("stream", "astream"):
        # "The sum is 5." streams as 7 word/space chunks; more chunks than calls proves the streaming path ran.
        assert chunks > 7
    spans = capture.spans()

    # The prebuilt's nodes ("agent", "tools") carry no lc_agent_name: they take the graph's name, so
    # agents="mathbot" selects its calls (they used to be recorded as agent "agent", a name the user never wrote).
    assert tree(spans) == [
        "mathbot",
        "  invoke_agent mathbot",
        "    chat ScriptedChatModel",
        "  invoke_agent mathbot",
        "    execute_tool add",
        "  invoke_agent mathbot",
        "    chat ScriptedChatModel",
    ]
    assert_ids(spans, "ro-1", "at-1")
    assert_span_tree(spans)
    first, second = by_name(spans, "chat ScriptedChatModel")
    user = {"role": "user", "content": "What is 2 + 3?"}
    tools = {semconv.GEN_AI_TOOL_DEFINITIONS: ADD_TOOL_DEFINITION}
    assert genai(first) == chat_attributes(
        "mathbot",
        [user],
        {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
        **tools,
        **response("resp-1", "tool_calls", 12, 7),
    )
    assert genai(second) == chat_attributes(
        "mathbot",
        [
            user,
            {"role": "assistant", "content": "", "name": "mathbot", "tool_calls": [ADD_CALL]},
            {"role": "tool", "content": "5", "name": "add", "tool_call_id": "call_add"},
        ],
        {"role": "assistant", "content": "The sum is 5."},
        **tools,
        **response("resp-2", "stop", 30, 6),
    )
    assert first.kind == "CLIENT"
    (tool,) = by_name(spans, "execute_tool add")
    assert genai(tool) == {
        semconv.GEN_AI_OPERATION_NAME: "execute_tool",
        semconv.GEN_AI_TOOL_NAME: "add",
        semconv.GEN_AI_TOOL_CALL_ID: "call_add",
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: '{"a":2,"b":3}',
        semconv.GEN_AI_TOOL_CALL_RESULT: "5",
        semconv.GEN_AI_AGENT_NAME: "mathbot",
        semconv.SPAN_SOURCE: "hook",
        semconv.ROLLOUT_ID: "ro-1",
        semconv.ATTEMPT_ID: "at-1",
    }
    for agent in by_name(spans, "invoke_agent mathbot"):
        assert agent.attributes[semconv.GEN_AI_OPERATION_NAME] == "invoke_agent"
        assert agent.attributes[semconv.GEN_AI_AGENT_NAME] == "mathbot"
    assert handler.open_runs == 0


def test_prebuilt_agent_names_unnamed_and_mapped(capture: SpanCapture) -> None:
    """An unnamed prebuilt keeps its node names; an explicit mapping of a node still wins over the graph's name."""
    cases = [(None, {}, {"agent", "tools"}), ("mathbot", {"agent": "solver"}, {"solver", "mathbot"})]
    for i, (name, mapping, expected) in enumerate(cases):
        handler = LightningCallbackHandler(agent_names=mapping)
        graph = build_react_agent(scripted_model(*react_answers()), [make_add_tool()], name=name)
        with rollout_context(f"ro-{i}", "at-1"):
            run_graph(graph, "invoke", handler)
        spans = capture.spans(f"ro-{i}")
        names = {
            str(s.attributes[semconv.GEN_AI_AGENT_NAME]) for s in spans if semconv.GEN_AI_AGENT_NAME in s.attributes
        }
        assert names == expected, (name, tree(spans))
        calls = by_name(spans, "chat ScriptedChatModel")
        assert len(calls) == 2
        assert {str(c.attributes[semconv.GEN_AI_AGENT_NAME]) for c in calls} == {"agent" if name is None else "solver"}


# --- hand-written multi-agent graph --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_multi_agent_graph_spans(mode: str, capture: SpanCapture) -> None:
    """Three nodes, three agents (one renamed by the mapping): each LLM span names its agent, under its agent span."""
    handler = LightningCallbackHandler(agent_names={"researcher": "research_agent"})
    with rollout_context("ro-1", "at-1"):
        run_graph(build_team(*team_models()), mode, handler)
    spans = capture.spans()

    assert tree(spans) == TEAM_TREE
    plan, research, write = by_name(spans, "chat ScriptedChatModel")
    user = {"role": "user", "content": "What is 2 + 3?"}
    planned = {"role": "assistant", "content": "Plan: add 2 and 3."}
    call = {"id": "call_r", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}
    assert genai(plan) == chat_attributes(
        "planner",
        [user],
        planned,
        **response("plan", "stop", 8, 5),
    )
    assert genai(research) == chat_attributes(
        "research_agent",
        [user, planned],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        **{semconv.GEN_AI_TOOL_DEFINITIONS: ADD_TOOL_DEFINITION},
        **response("res", "tool_calls", 20, 9),
    )
    assert genai(write)[semconv.GEN_AI_INPUT_MESSAGES] == [
        user,
        planned,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "5", "name": "add", "tool_call_id": "call_r"},
    ]
    assert write.attributes[semconv.GEN_AI_AGENT_NAME] == "writer"
    assert write.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    (tool,) = by_name(spans, "execute_tool add")
    assert tool.attributes[semconv.GEN_AI_AGENT_NAME] == "research_agent"
    assert tool.attributes[semconv.GEN_AI_TOOL_CALL_ID] == "call_r"
    assert handler.open_runs == 0


def test_lc_agent_name_wins_over_node(capture: SpanCapture) -> None:
    """A run tagged with lc_agent_name (as create_agent tags its runs) opens a sub-agent span under the node."""
    model = scripted_model(reply("hi"))

    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.with_config(metadata={"lc_agent_name": "critic"}).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("review", node)
    graph.add_edge(START, "review")
    graph.add_edge("review", END)
    with rollout_context("ro-1", "at-1"):
        graph.compile(name="g").invoke(team_input(), {"callbacks": [LightningCallbackHandler()]})
    spans = capture.spans()
    assert tree(spans) == ["g", "  invoke_agent review", "    chat ScriptedChatModel"]
    (chat,) = by_name(spans, "chat ScriptedChatModel")
    assert chat.attributes[semconv.GEN_AI_AGENT_NAME] == "critic"


def test_with_config_one_line(capture: SpanCapture) -> None:
    """``graph.with_config(callbacks=[handler])`` records the same tree as passing the callback per call."""
    graph = build_team(*team_models()).with_config(
        callbacks=[LightningCallbackHandler(agent_names={"researcher": "research_agent"})]
    )
    with rollout_context("ro-1", "at-1"):
        graph.invoke(team_input())
    assert tree(capture.spans()) == TEAM_TREE


def test_bare_model_and_completion_llm(capture: SpanCapture) -> None:
    """Outside any graph, an LLM span is a root whose agent name falls back to the run's name (mappable)."""
    handler = LightningCallbackHandler(agent_names={"FakeListLLM": "completer"})
    with rollout_context("ro-1", "at-1"):
        scripted_model(reply("pong", response_id="r-9")).invoke("ping", {"callbacks": [handler]})
        FakeListLLM(responses=["done"]).invoke("finish this", {"callbacks": [handler]})
    chat, completion = sorted(capture.spans(), key=lambda s: s.start_time)
    assert (chat.name, chat.parent_id) == ("chat ScriptedChatModel", None)
    assert chat.attributes[semconv.GEN_AI_AGENT_NAME] == "ScriptedChatModel"
    assert chat.attributes[semconv.GEN_AI_RESPONSE_ID] == "r-9"
    assert genai(completion)[semconv.GEN_AI_INPUT_MESSAGES] == [{"role": "user", "content": "finish this"}]
    assert genai(completion)[semconv.GEN_AI_OUTPUT_MESSAGES] == [{"role": "assistant", "content": "done"}]
    assert completion.attributes[semconv.GEN_AI_AGENT_NAME] == "completer"
    assert semconv.GEN_AI_RESPONSE_ID not in completion.attributes


# --- errors --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_user_exception_recorded_and_unchanged(mode: str, capture: SpanCapture) -> None:
    """A tool's exception reaches the caller as the same object and marks the tool, agent and graph spans."""
    error = KeyError("no such account")
    handler = LightningCallbackHandler(agent_names={"researcher": "research_agent"})
    graph = build_team(*team_models(), failure=ToolFailure(error))
    with rollout_context("ro-1", "at-1"), pytest.raises(KeyError) as raised:
        run_graph(graph, mode, handler)
    assert raised.value is error
    spans = capture.spans()
    assert tree(spans) == TEAM_TREE[:-2]
    failed = [span for span in spans if span.status.code == "ERROR"]
    assert sorted(span.name for span in failed) == ["execute_tool add", "invoke_agent research_agent", "team"]
    for span in failed:
        assert span.attributes[semconv.ERROR_TYPE] == "KeyError"
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "KeyError"
    assert handler.open_runs == 0


def test_model_exception_recorded_on_llm_span(capture: SpanCapture) -> None:
    """A model that raises (an API error, say) marks its LLM span ERROR; the caller gets the same exception."""
    error = ConnectionError("upstream refused")

    def exhausted() -> Iterator[AIMessage]:
        raise error
        yield AIMessage("unreachable")  # makes this a generator, so the raise happens on the model's first call

    handler = LightningCallbackHandler()
    with rollout_context("ro-1", "at-1"), pytest.raises(ConnectionError) as raised:
        ScriptedChatModel(messages=exhausted()).invoke("hi", {"callbacks": [handler]})
    assert raised.value is error
    (span,) = capture.spans()
    assert span.name == "chat ScriptedChatModel"
    assert span.status.code == "ERROR"
    assert span.status.message == "ConnectionError: upstream refused"
    assert span.attributes[semconv.ERROR_TYPE] == "ConnectionError"
    assert semconv.GEN_AI_OUTPUT_MESSAGES not in span.attributes
    assert handler.open_runs == 0


def test_interrupt_is_not_an_error(capture: SpanCapture) -> None:
    """LangGraph's interrupt() is control flow: the spans close without an error status."""

    def ask(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"messages": [reply(str(answer))]}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    compiled = graph.compile(checkpointer=InMemorySaver(), name="approval")
    handler = LightningCallbackHandler()
    with rollout_context("ro-1", "at-1"):
        result = compiled.invoke(team_input(), {"callbacks": [handler], "configurable": {"thread_id": "t1"}})
    assert "__interrupt__" in result
    spans = capture.spans()
    assert tree(spans) == ["approval", "  invoke_agent ask"]
    assert all(span.status.code != "ERROR" for span in spans)
    assert handler.open_runs == 0


def test_stopping_a_stream_early_closes_every_span(capture: SpanCapture) -> None:
    """A caller that stops iterating graph.stream() leaves no open span and no error status (it is not a failure)."""
    handler = LightningCallbackHandler()
    with rollout_context("ro-1", "at-1"):
        # Pregel.stream is a generator (typed as Iterator); closing it is how a caller stops early.
        stream = cast(
            Generator[Any],
            build_team(*team_models()).stream(team_input(), {"callbacks": [handler]}, stream_mode="messages"),
        )
        next(stream)
        stream.close()
    assert handler.open_runs == 0
    spans = capture.spans()
    assert tree(spans) == ["team", "  invoke_agent planner", "    chat ScriptedChatModel"]
    assert all(span.status.code == "UNSET" for span in spans)


class _BrokenTracer(NoOpTracer):
    def start_span(self, *args: Any, **kwargs: Any) -> OtelSpan:
        raise RuntimeError("tracer broken")


def test_hook_failure_never_breaks_the_graph(caplog: pytest.LogCaptureFixture) -> None:
    """If recording fails the graph still returns its normal result, and the failure is logged once."""
    handler = LightningCallbackHandler(tracer=_BrokenTracer())
    with caplog.at_level(logging.DEBUG, logger="agentlightning_langchain"):
        for _ in range(2):
            result = build_team(*team_models()).invoke(team_input(), {"callbacks": [handler]})
            assert result["messages"][-1].content == "Answer: 5"
    warnings = [r for r in caplog.records if r.name == "agentlightning_langchain" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "on_chain_start failed" in warnings[0].getMessage()


# --- concurrency ----------------------------------------------------------------------------------------------------
def _team_runner(handler: LightningCallbackHandler, tag: str) -> Callable[[], None]:
    def run() -> None:
        build_team(*team_models(tag)).invoke(team_input(), {"callbacks": [handler]})

    return run


def _assert_independent_teams(capture: SpanCapture, rollouts: list[str]) -> None:
    spans = [span for span in capture.spans() if span.rollout_id in rollouts]
    by_rollout = assert_isolated(spans)
    for index, rollout_id in enumerate(rollouts):
        mine = by_rollout[rollout_id]
        assert tree(mine) == TEAM_TREE
        # Each rollout's model answered with ids tagged by the rollout: none may show up in another rollout.
        response_ids = {
            str(span.attributes[semconv.GEN_AI_RESPONSE_ID]) for span in mine if span.name.startswith("chat")
        }
        assert response_ids == {f"plan{index}", f"res{index}", f"write{index}"}


def test_one_handler_concurrent_threads(capture: SpanCapture) -> None:
    """One handler shared by rollouts on several threads: each rollout gets its own complete tree."""
    handler = LightningCallbackHandler(agent_names={"researcher": "research_agent"})
    rollouts = [f"ro-{index}" for index in range(4)]
    barrier = threading.Barrier(len(rollouts))
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            with rollout_context(rollouts[index], f"at-{index}"):
                _team_runner(handler, str(index))()
        except BaseException as error:  # surfaced on the test thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(len(rollouts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    _assert_independent_teams(capture, rollouts)
    assert handler.open_runs == 0


async def test_one_handler_concurrent_tasks(capture: SpanCapture) -> None:
    """One handler shared by rollouts running as asyncio tasks on one loop: no cross-links."""
    handler = LightningCallbackHandler(agent_names={"researcher": "research_agent"})
    rollouts = [f"ro-{index}" for index in range(4)]

    async def one(index: int) -> None:
        with rollout_context(rollouts[index], f"at-{index}"):
            graph = build_team(*team_models(str(index)))
            async for _ in graph.astream(team_input(), {"callbacks": [handler]}, stream_mode="messages"):
                await asyncio.sleep(0)  # interleave the tasks at every chunk

    await asyncio.gather(*(one(index) for index in range(len(rollouts))))
    _assert_independent_teams(capture, rollouts)
    assert handler.open_runs == 0


def test_streamed_chunks_are_message_chunks() -> None:
    """The scripted model really streams on the ``messages`` stream mode (so streaming paths are exercised)."""
    graph = build_react_agent(scripted_model(*react_answers()), [make_add_tool()])
    items = list(graph.stream(team_input(), stream_mode="messages"))
    assert sum(isinstance(message, AIMessageChunk) for message, _ in items) > 7
