"""Span trees, agent names, LLM and tool attributes recorded from AutoGen agents and teams (replayed models)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from autogen_core.models import UserMessage

from agentlightning import semconv
from agentlightning.tracing import rollout_context
from agentlightning.types.spans import Span
from agentlightning_autogen import _processor
from tests.integrations.autogen.fakes import (
    TEAM,
    ScriptedClient,
    calculator_agent,
    round_robin_team,
    run_task,
    selector_team,
)
from tests.integrations.conformance import SpanCapture, assert_ids, assert_isolated, assert_span_tree, shape

pytestmark = pytest.mark.usefixtures("instrumented")


def _ids() -> tuple[str, str]:
    return f"ro-{uuid.uuid4().hex}", f"at-{uuid.uuid4().hex}"


async def _record(capture: SpanCapture, make: Any, *, stream: bool) -> list[Span]:
    rollout_id, attempt_id = _ids()
    with rollout_context(rollout_id, attempt_id):
        await run_task(make(), stream=stream)
    spans = capture.spans(rollout_id)
    assert_ids(spans, rollout_id, attempt_id)
    assert_span_tree(spans)
    return spans


def _by_op(spans: list[Span], op: str) -> list[Span]:
    return sorted(
        (span for span in spans if span.attributes.get(semconv.GEN_AI_OPERATION_NAME) == op),
        key=lambda span: span.start_time,
    )


CALCULATOR_TREE = [
    ("chat", "invoke_agent calculator"),
    ("chat", "invoke_agent calculator"),
    ("execute_tool add", "invoke_agent calculator"),
    ("invoke_agent calculator", None),
]


@pytest.mark.parametrize(("stream_run", "stream_model"), [(False, False), (True, False), (True, True)])
async def test_calculator_agent_tree(capture: SpanCapture, stream_run: bool, stream_model: bool) -> None:
    """run / run_stream, with and without a streaming model: agent span over two LLM calls and the tool call."""
    spans = await _record(capture, lambda: calculator_agent(stream=stream_model), stream=stream_run)
    assert shape(spans) == CALCULATOR_TREE
    assert all(span.attributes[semconv.SPAN_SOURCE] == semconv.SOURCE_HOOK for span in spans)
    assert all(span.attributes[semconv.GEN_AI_AGENT_NAME] == "calculator" for span in spans)

    first, reflection = _by_op(spans, semconv.OP_CHAT)
    assert json.loads(str(first.attributes[semconv.GEN_AI_INPUT_MESSAGES]))[-1] == {
        "role": "user",
        "content": "What is 2 + 3?",
        "name": "user",
    }
    tools = json.loads(str(first.attributes[semconv.GEN_AI_TOOL_DEFINITIONS]))
    assert [tool["function"]["name"] for tool in tools] == ["add"]
    assert tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert json.loads(str(first.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_add", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}
            ],
            "finish_reason": "tool_calls",
        }
    ]
    assert first.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]
    assert first.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 7
    assert isinstance(first.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS], int)

    # The reflection call sees the tool call and its result, and answers in text.
    history = json.loads(str(reflection.attributes[semconv.GEN_AI_INPUT_MESSAGES]))
    assert history[-1] == {"role": "tool", "tool_call_id": "call_add", "content": "5"}
    assert history[-2]["tool_calls"][0]["id"] == "call_add"
    output = json.loads(str(reflection.attributes[semconv.GEN_AI_OUTPUT_MESSAGES]))
    assert output[0]["content"] == "The sum is 5."

    (tool,) = _by_op(spans, semconv.OP_EXECUTE_TOOL)
    assert tool.attributes[semconv.GEN_AI_TOOL_NAME] == "add"
    assert tool.attributes[semconv.GEN_AI_TOOL_CALL_ID] == "call_add"
    assert json.loads(str(tool.attributes[semconv.GEN_AI_TOOL_CALL_ARGUMENTS])) == {"a": 2, "b": 3}
    assert tool.attributes[semconv.GEN_AI_TOOL_CALL_RESULT] == "5"
    # Order: the first model call, then the tool, then the reflection.
    assert first.end_time is not None and tool.end_time is not None
    assert first.end_time <= tool.start_time and tool.end_time <= reflection.start_time


async def test_tool_exception_recorded_on_tool_span(capture: SpanCapture) -> None:
    """AutoGen reports a failing tool to the model; its span still has status ERROR, the exception and arguments."""
    error = ValueError("calculator is broken")
    spans = await _record(capture, lambda: calculator_agent(tool_fails_with=error), stream=False)
    (tool,) = _by_op(spans, semconv.OP_EXECUTE_TOOL)
    assert tool.status.code == "ERROR"
    # one event per failure: AutoGen's tool span records the exception and its context manager recorded it again
    [event] = [event for event in tool.events if event.name == "exception"]
    assert event.attributes is not None and event.attributes["exception.message"] == "calculator is broken"
    assert json.loads(str(tool.attributes[semconv.GEN_AI_TOOL_CALL_ARGUMENTS])) == {"a": 2, "b": 3}
    assert semconv.GEN_AI_TOOL_CALL_RESULT not in tool.attributes


def _team_tree(team: str, turns: list[str], selector_calls: int = 0) -> list[tuple[str, str | None]]:
    tree: list[tuple[str, str | None]] = [(f"invoke_agent {team}", None)]
    for name in turns:
        tree += [(f"invoke_agent {name}", f"invoke_agent {team}"), ("chat", f"invoke_agent {name}")]
    tree += [("chat", f"invoke_agent {team}")] * selector_calls
    return sorted(tree)


@pytest.mark.parametrize("stream", [False, True])
async def test_round_robin_team_tree(capture: SpanCapture, stream: bool) -> None:
    """One trace per team run: team span over each member's agent span over its LLM call; runtime noise dropped."""
    spans = await _record(capture, lambda: round_robin_team(stream=stream), stream=stream)
    assert shape(spans) == _team_tree("RoundRobinGroupChat", list(TEAM))
    assert len({span.trace_id for span in spans}) == 1
    for span in _by_op(spans, semconv.OP_CHAT):
        parent = next(p for p in spans if p.span_id == span.parent_id)
        assert span.attributes[semconv.GEN_AI_AGENT_NAME] == parent.attributes[semconv.GEN_AI_AGENT_NAME]
        answer = json.loads(str(span.attributes[semconv.GEN_AI_OUTPUT_MESSAGES]))[0]["content"]
        assert answer == f"{span.attributes[semconv.GEN_AI_AGENT_NAME]} has spoken."


async def test_selector_team_names_each_call(capture: SpanCapture) -> None:
    """The selector's model calls are named for the team, each member's call for the member."""
    spans = await _record(capture, selector_team, stream=False)
    assert shape(spans) == _team_tree("SelectorGroupChat", ["solver", "critic"], selector_calls=2)
    names = [str(span.attributes[semconv.GEN_AI_AGENT_NAME]) for span in _by_op(spans, semconv.OP_CHAT)]
    assert names == ["SelectorGroupChat", "solver", "SelectorGroupChat", "critic"]


async def test_concurrent_team_runs_never_cross_link(capture: SpanCapture) -> None:
    """Teams running at once as asyncio tasks each get exactly their own spans, in their own trace."""
    ids = [_ids() for _ in range(4)]

    async def one(rollout_id: str, attempt_id: str) -> None:
        with rollout_context(rollout_id, attempt_id):
            await run_task(round_robin_team(), stream=True)

    await asyncio.gather(*(one(*pair) for pair in ids))
    by_rollout = assert_isolated([span for span in capture.spans() if span.rollout_id in dict(ids)])
    for rollout_id, attempt_id in ids:
        assert_ids(by_rollout[rollout_id], rollout_id, attempt_id)
        assert shape(by_rollout[rollout_id]) == _team_tree("RoundRobinGroupChat", list(TEAM))


async def test_outside_a_rollout_nothing_is_stored(capture: SpanCapture) -> None:
    """Spans of runs outside any rollout cannot be attributed, so none reach the sink."""
    await run_task(calculator_agent(), stream=False)
    assert capture.spans() == []


async def test_model_failure_recorded_on_llm_and_agent_spans(capture: SpanCapture) -> None:
    """The user's model client raising: the LLM span and the agent span record it; the caller gets it unchanged."""
    error = ConnectionError("model endpoint unreachable")
    rollout_id, attempt_id = _ids()
    with rollout_context(rollout_id, attempt_id), pytest.raises(ConnectionError) as raised:
        await run_task(calculator_agent(fail_with=error), stream=False)
    assert raised.value is error
    spans = capture.spans(rollout_id)
    assert_span_tree(spans)
    failed = {span.name for span in spans if span.status.code == "ERROR"}
    assert failed == {"chat", "invoke_agent calculator"}
    (llm,) = [span for span in _by_op(spans, semconv.OP_CHAT) if span.status.code == "ERROR"]
    assert llm.attributes[semconv.ERROR_TYPE] == "ConnectionError"
    assert semconv.GEN_AI_OUTPUT_MESSAGES not in llm.attributes


async def test_stream_closed_early_is_not_an_error(capture: SpanCapture) -> None:
    """A consumer that stops a model stream early: the span ends, without an error, with no output."""
    client = ScriptedClient(["one two three four"])
    rollout_id, attempt_id = _ids()
    with rollout_context(rollout_id, attempt_id):
        stream = client.create_stream([UserMessage(content="count", source="user")])
        assert await anext(stream) == "one "
        await stream.aclose()
    (span,) = capture.spans(rollout_id)
    assert span.status.code != "ERROR"
    assert semconv.GEN_AI_OUTPUT_MESSAGES not in span.attributes


async def test_no_span_left_open(capture: SpanCapture) -> None:
    """After runs of every kind the processor holds no open span and no tool span waiting for its result."""
    with rollout_context(*_ids()):
        await run_task(calculator_agent(stream=True), stream=True)
        await run_task(round_robin_team(), stream=False)
        await run_task(selector_team(), stream=False)
    state = _processor.active_state()
    assert state is not None
    assert state.processor.open_spans == 0
