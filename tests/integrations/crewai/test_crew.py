"""The 3-agent crew recorded span by span: structure, agents, tools, errors, flush, and events out of order."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from typing import Any

import pytest
from crewai import Process
from crewai.events.base_events import BaseEvent
from crewai.events.event_bus import crewai_event_bus

import agentlightning_crewai
from agentlightning import semconv as sc
from agentlightning.tracing import rollout_context
from agentlightning.types.spans import Span
from agentlightning_crewai import LightningEventListener
from tests.integrations.conformance import SpanCapture, assert_ids, assert_isolated, assert_span_tree, shape
from tests.integrations.crewai.fakes import SEQUENTIAL_SHAPE, ScriptedLLM, build_crew, final

RO, AT = "ro-crew", "at-crew"


def _run(capture: SpanCapture, **crew: Any) -> list[Span]:
    with rollout_context(RO, AT):
        build_crew(**crew).kickoff()
    assert agentlightning_crewai.flush()
    return capture.spans(RO)


def _llm_agents(spans: list[Span]) -> Counter[str]:
    return Counter(
        str(span.attributes[sc.GEN_AI_AGENT_NAME])
        for span in spans
        if span.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_CHAT
    )


def test_sequential_crew_spans(capture: SpanCapture) -> None:
    """Exactly one crew, three tasks, three agents, their LLM calls and the specialist's tool call."""
    agentlightning_crewai.instrument()
    spans = _run(capture)
    assert shape(spans) == SEQUENTIAL_SHAPE
    assert_ids(spans, RO, AT)
    assert_span_tree(spans)
    assert _llm_agents(spans) == {"planner": 1, "specialist": 2, "critic": 1}
    by_id = {span.span_id: span for span in spans}
    for span in spans:
        assert span.attributes[sc.SPAN_SOURCE] == sc.SOURCE_HOOK
        parent = by_id.get(span.parent_id or "")
        if parent is not None:  # event timestamps: children start within their parent
            assert parent.start_time <= span.start_time
    agents = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_INVOKE_AGENT]
    assert sorted(str(s.attributes[sc.GEN_AI_AGENT_NAME]) for s in agents) == ["critic", "planner", "specialist"]

    (tool,) = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_EXECUTE_TOOL]
    assert tool.attributes[sc.GEN_AI_TOOL_NAME] == "add"
    assert json.loads(str(tool.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS])) == {"a": 2, "b": 3}
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "5"
    assert tool.attributes[sc.GEN_AI_AGENT_NAME] == "specialist"

    for chat in (s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_CHAT):
        messages = json.loads(str(chat.attributes[sc.GEN_AI_INPUT_MESSAGES]))
        assert messages[0]["role"] == "system"
        (output,) = json.loads(str(chat.attributes[sc.GEN_AI_OUTPUT_MESSAGES]))
        assert output["role"] == "assistant" and "Thought:" in output["content"]
        assert str(chat.attributes[sc.GEN_AI_RESPONSE_ID]).startswith("resp-")
        assert chat.attributes[sc.GEN_AI_REQUEST_MODEL] == "scripted"
        assert chat.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
        assert isinstance(chat.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS], int)


def test_hierarchical_crew_spans(capture: SpanCapture) -> None:
    """The manager's delegations are tool spans; each coworker's agent span nests under the delegation."""
    agentlightning_crewai.instrument()
    spans = _run(capture, process=Process.hierarchical)
    assert_ids(spans, RO, AT)
    assert_span_tree(spans)
    assert _llm_agents(spans) == {"Crew Manager": 6, "planner": 1, "specialist": 2, "critic": 1}
    names = {span.span_id: span for span in spans}
    delegations = [s for s in spans if s.attributes.get(sc.GEN_AI_TOOL_NAME) == "Delegate work to coworker"]
    assert len(delegations) == 3
    for delegation in delegations:
        assert names[delegation.parent_id or ""].name == "invoke_agent Crew Manager"
    coworkers = {
        str(s.attributes[sc.GEN_AI_AGENT_NAME]): names[s.parent_id or ""]
        for s in spans
        if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_INVOKE_AGENT and s.name != "invoke_agent Crew Manager"
    }
    assert sorted(coworkers) == ["critic", "planner", "specialist"]
    for role, parent in coworkers.items():
        assert parent in delegations
        assert json.loads(str(parent.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]))["coworker"] == role
    (add,) = [s for s in spans if s.attributes.get(sc.GEN_AI_TOOL_NAME) == "add"]
    assert names[add.parent_id or ""].attributes[sc.GEN_AI_AGENT_NAME] == "specialist"


def test_tool_exception_recorded_on_the_tool_span(capture: SpanCapture) -> None:
    """CrewAI catches a tool's exception and shows it to the model; the tool span records it and the crew goes on."""
    agentlightning_crewai.instrument()
    error = ValueError("add is broken")
    spans = _run(capture, tool_error=error)
    failed = [s for s in spans if s.status.code == "ERROR"]
    assert failed and all(s.attributes.get(sc.GEN_AI_TOOL_NAME) == "add" for s in failed)
    for span in failed:
        assert span.attributes[sc.ERROR_TYPE] == "ValueError"
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes["exception.message"] == "add is broken"
    assert_span_tree(spans)


def test_tool_reported_failure_recorded(capture: SpanCapture) -> None:
    """A tool that returns ToolFailure ran but failed: its span says so (status ERROR, error.type ToolFailure)."""
    agentlightning_crewai.instrument()
    spans = _run(capture, tool_reports_failure=True)
    (tool,) = [s for s in spans if s.attributes.get(sc.GEN_AI_TOOL_NAME) == "add"]
    assert tool.status.code == "ERROR"
    assert tool.attributes[sc.ERROR_TYPE] == "ToolFailure"
    assert "the adder is offline" in (tool.status.message or "")


def test_concurrent_sequential_and_hierarchical_crews(capture: SpanCapture) -> None:
    """Crews of both processes at once on threads: each rollout gets exactly its own crew's spans."""
    agentlightning_crewai.instrument()
    runs = {f"ro-{i}": Process.hierarchical if i % 2 else Process.sequential for i in range(4)}
    errors: list[BaseException] = []

    def one(rollout_id: str, process: Process) -> None:
        try:
            with rollout_context(rollout_id, f"at-{rollout_id}"):
                build_crew(process=process).kickoff()
        except BaseException as error:  # reported on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=one, args=item) for item in runs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert agentlightning_crewai.flush()
    by_rollout = assert_isolated([s for s in capture.spans() if s.rollout_id in runs])
    for rollout_id, process in runs.items():
        spans = by_rollout[rollout_id]
        assert_ids(spans, rollout_id, f"at-{rollout_id}")
        assert len({span.trace_id for span in spans}) == 1
        expected = {"planner": 1, "specialist": 2, "critic": 1}
        if process == Process.hierarchical:
            expected["Crew Manager"] = 6
        else:
            assert shape(spans) == SEQUENTIAL_SHAPE
        assert _llm_agents(spans) == expected


def test_failed_llm_call_recorded(capture: SpanCapture) -> None:
    """An LLM call that fails (LLMCallFailedEvent) ends its span with status ERROR and the error text."""
    agentlightning_crewai.instrument()
    broken = ScriptedLLM(model="scripted", rule=final("never"), fail_with=ConnectionError("upstream down"))
    with rollout_context(RO, AT):
        try:
            broken.call("hello")
        except ConnectionError:
            pass
        else:
            pytest.fail("the model's exception did not propagate")
    assert agentlightning_crewai.flush()
    (span,) = capture.spans(RO)
    assert span.status.code == "ERROR" and "upstream down" in (span.status.message or "")
    assert span.attributes[sc.GEN_AI_AGENT_NAME] == "crewai"  # no agent made the call; the contract wants a name


def test_spans_complete_after_the_rollout_ends(capture: SpanCapture) -> None:
    """After flush() every span of the finished crew is closed and delivered, with none left open."""
    listener = agentlightning_crewai.instrument()
    with rollout_context(RO, AT):
        build_crew().kickoff()
    # The rollout is over; CrewAI may still be handing events to the listener on its thread pool.
    assert agentlightning_crewai.flush()
    assert listener.open_spans == 0
    spans = capture.spans(RO)
    assert len(spans) == len(SEQUENTIAL_SHAPE)
    assert all(span.end_time is not None for span in spans)


def test_crew_outside_a_rollout_records_nothing(capture: SpanCapture) -> None:
    """Crews kicked off outside rollouts are not recorded, and leave nothing behind in the listener."""
    listener = agentlightning_crewai.instrument()
    build_crew().kickoff()
    assert agentlightning_crewai.flush()
    assert capture.spans() == []
    assert listener._nodes == {}  # pyright: ignore[reportPrivateUsage]  # leak check


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_events_out_of_order_build_the_same_tree(capture: SpanCapture, order: str) -> None:
    """CrewAI's pool may hand a child's (or an end's) event over before its parent's: the tree must not care."""
    events: list[tuple[Any, BaseEvent]] = []
    recorder = agentlightning_crewai.instrument()
    registered = recorder._registered  # pyright: ignore[reportPrivateUsage]  # the event classes it listens to
    classes = [event_class for event_class, _ in registered]

    def record(source: Any, event: BaseEvent) -> None:
        events.append((source, event))

    for event_class in classes:
        crewai_event_bus.on(event_class)(record)
    try:
        in_order = _run(capture)
    finally:
        for event_class in classes:
            crewai_event_bus.off(event_class, record)
    agentlightning_crewai.uninstrument()
    events.sort(key=lambda pair: pair[1].emission_sequence or 0)
    replay = list(reversed(events)) if order == "reversed" else random.Random(7).sample(events, len(events))

    listener = LightningEventListener()
    handlers = dict(listener._registered)  # pyright: ignore[reportPrivateUsage]  # drive the handlers directly
    listener.remove()
    capture.sink.clear()  # type: ignore[union-attr]  # the capture fixture always delivers to a ListSpanSink
    with rollout_context(RO, AT):
        for source, event in replay:
            handlers[type(event)](source, event)
    assert listener.flush()
    assert listener.open_spans == 0
    replayed = capture.spans(RO)
    assert shape(replayed) == shape(in_order) == SEQUENTIAL_SHAPE
    assert sorted((s.name, s.start_time, s.end_time) for s in replayed) == sorted(
        (s.name, s.start_time, s.end_time) for s in in_order
    )
