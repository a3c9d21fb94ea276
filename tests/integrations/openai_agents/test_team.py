"""A triage agent handing off to two specialists with tools: the exact span tree on every model path.

Paths: the SDK's scripted model (a custom ``Model``, recorded by ``LightningRunHooks``), and the real
``OpenAIResponsesModel`` / ``OpenAIChatCompletionsModel`` against the fake upstream, each run and streamed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import openai
import pytest
from agents import Agent, Model, RunHooks, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from openai import AsyncOpenAI

from agentlightning import semconv as sc
from agentlightning.testing import FakeError, FakeOpenAI
from agentlightning.tracing import rollout_context
from agentlightning.types.spans import Span
from agentlightning_openai_agents import LightningRunHooks, instrument
from agentlightning_openai_agents._instrument import instrumented_processor
from tests.integrations.conformance import SpanCapture, assert_ids, assert_span_tree, shape
from tests.integrations.openai_agents.fakes import (
    ANSWERS,
    ARGUMENTS,
    MATH,
    QUESTIONS,
    RESULTS,
    TOOL_OF,
    TRIAGE,
    WEATHER,
    Api,
    Route,
    build_team,
    fake_upstream,
    scripted_models,
    upstream_models,
)

ROUTES: list[Route] = ["weather", "math"]
INSTRUCTIONS: dict[str, str] = {"triage": TRIAGE, "weather": WEATHER, "math": MATH}


async def run_team(
    models: Callable[[str], Model], route: Route, *, stream: bool, hooks: RunHooks[Any] | None = None
) -> str:
    """Run the team on one question, streamed or not; the final answer."""
    agent = build_team(models)
    if not stream:
        return str((await Runner.run(agent, QUESTIONS[route], hooks=hooks)).final_output)
    result = Runner.run_streamed(agent, QUESTIONS[route], hooks=hooks)
    async for _ in result.stream_events():
        pass
    return str(result.final_output)


def by_start(spans: list[Span], operation: str) -> list[Span]:
    """Spans of one GenAI operation in the order they started."""
    chosen = [span for span in spans if span.attributes.get(sc.GEN_AI_OPERATION_NAME) == operation]
    return sorted(chosen, key=lambda span: span.start_time)


def check_team_spans(spans: list[Span], route: Route, llm_name: str, rollout: tuple[str, str]) -> list[Span]:
    """The exact tree, agent names, tool call and handoff of one run; returns its LLM spans in call order."""
    assert_ids(spans, *rollout)
    assert_span_tree(spans)
    assert shape(spans) == sorted(
        [
            ("Agent workflow", None),
            ("invoke_agent triage", "Agent workflow"),
            (f"invoke_agent {route}", "Agent workflow"),
            (llm_name, "invoke_agent triage"),
            (llm_name, f"invoke_agent {route}"),
            (llm_name, f"invoke_agent {route}"),
            (f"execute_tool {TOOL_OF[route]}", f"invoke_agent {route}"),
        ]
    )
    assert all(span.attributes[sc.SPAN_SOURCE] == sc.SOURCE_HOOK for span in spans)
    agents = {str(span.attributes[sc.GEN_AI_AGENT_NAME]): span for span in by_start(spans, sc.OP_INVOKE_AGENT)}
    assert list(agents) == ["triage", route]
    (handoff,) = agents["triage"].events
    assert handoff.name == "handoff"
    assert handoff.attributes == {"handoff.from_agent": "triage", "handoff.to_agent": route}

    llm = by_start(spans, sc.OP_CHAT)
    assert [span.attributes[sc.GEN_AI_AGENT_NAME] for span in llm] == ["triage", route, route]
    outputs = [json.loads(str(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES])) for span in llm]
    handoff_call = outputs[0][0]["tool_calls"][0]["function"]
    assert handoff_call["name"] == f"transfer_to_{route}"
    (tool_call,) = outputs[1][0]["tool_calls"]
    assert outputs[2][0]["content"] == ANSWERS[route]
    assert [span.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] for span in llm] == [
        ["tool_calls"],
        ["tool_calls"],
        ["stop"],
    ]
    for span in llm:
        assert span.attributes.get(sc.GEN_AI_RESPONSE_ID), f"LLM span {span.name} has no response id"
        messages = json.loads(str(span.attributes[sc.GEN_AI_INPUT_MESSAGES]))
        assert {"role": "user", "content": QUESTIONS[route]} in messages

    (tool,) = by_start(spans, sc.OP_EXECUTE_TOOL)
    assert tool.attributes[sc.GEN_AI_TOOL_NAME] == TOOL_OF[route]
    assert tool.attributes[sc.GEN_AI_AGENT_NAME] == route
    assert json.loads(str(tool.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS])) == ARGUMENTS[route]
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == RESULTS[route]
    # The call id the model gave the tool call, and the one the next prompt answers.
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_ID] == tool_call["id"]
    final_prompt = json.loads(str(llm[2].attributes[sc.GEN_AI_INPUT_MESSAGES]))
    assert {"role": "tool", "tool_call_id": tool_call["id"], "content": RESULTS[route]} in final_prompt
    return llm


@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("route", ROUTES)
async def test_scripted_model_with_run_hooks(capture: SpanCapture, route: Route, stream: bool) -> None:
    """A custom Model traces nothing; LightningRunHooks records its calls with the hook's view of each call."""
    instrument()
    rollout = ("ro-scripted", f"at-{route}-{stream}")
    with rollout_context(*rollout):
        answer = await run_team(scripted_models(route), route, stream=stream, hooks=LightningRunHooks())
    assert answer == ANSWERS[route]
    llm = check_team_spans(capture.spans(), route, "chat", rollout)
    (tool,) = by_start(capture.spans(), sc.OP_EXECUTE_TOOL)
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_ID] == f"call-{route}"  # scripted ids, via on_tool_start
    for span, agent in zip(llm, ["triage", route, route], strict=True):
        assert json.loads(str(span.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS])) == INSTRUCTIONS[agent]
    assert [span.attributes[sc.GEN_AI_RESPONSE_ID] for span in llm] == ["resp-789"] * 3  # ScriptedModel's default
    processor = instrumented_processor()
    assert processor is not None and processor.open_spans == 0


@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("route", ROUTES)
async def test_openai_models_on_fake_upstream(capture: SpanCapture, route: Route, api: Api, stream: bool) -> None:
    """The SDK's own models trace each call; the processor alone records everything (no hooks)."""
    instrument()
    rollout = ("ro-upstream", f"at-{route}-{api}-{stream}")
    with fake_upstream() as (fake, url), rollout_context(*rollout):
        async with AsyncOpenAI(base_url=url, api_key="k", max_retries=0) as client:
            answer = await run_team(upstream_models(client, api), route, stream=stream)
    assert answer == ANSWERS[route]
    assert len(fake.requests) == 3
    llm = check_team_spans(capture.spans(), route, "chat fake-model", rollout)
    prefix = "resp_" if api == "responses" else "chatcmpl-"
    assert all(str(span.attributes[sc.GEN_AI_RESPONSE_ID]).startswith(prefix) for span in llm)
    assert len({str(span.attributes[sc.GEN_AI_RESPONSE_ID]) for span in llm}) == 3
    assert all(span.attributes[sc.GEN_AI_REQUEST_MODEL] == "fake-model" for span in llm)
    if api == "chat":  # the chat request carries the system prompt as its first message
        for span, agent in zip(llm, ["triage", route, route], strict=True):
            assert json.loads(str(span.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS])) == INSTRUCTIONS[agent]
    if not (api == "chat" and stream):  # the SDK asks for no usage on chat streams
        assert all(int(str(span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS])) > 0 for span in llm)


async def test_run_hooks_with_a_tracing_model_record_no_duplicate(capture: SpanCapture) -> None:
    """With a model that traces itself, the hooks add the system prompt and call id but no second LLM span."""
    instrument()
    rollout = ("ro-both", "at-both")
    with fake_upstream() as (_, url), rollout_context(*rollout):
        async with AsyncOpenAI(base_url=url, api_key="k", max_retries=0) as client:
            await run_team(upstream_models(client, "responses"), "weather", stream=False, hooks=LightningRunHooks())
    llm = check_team_spans(capture.spans(), "weather", "chat fake-model", rollout)
    # The fake upstream does not echo instructions back (OpenAI does); the hook's system prompt fills them in.
    assert [json.loads(str(span.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS])) for span in llm] == [
        TRIAGE,
        WEATHER,
        WEATHER,
    ]


async def test_model_error_is_recorded_and_reraised(capture: SpanCapture) -> None:
    """An upstream failure reaches the caller unchanged and marks the LLM and agent spans as failed."""
    instrument()
    fake = FakeOpenAI(reply=[FakeError(500, "upstream exploded")])
    with fake.serve() as server, rollout_context("ro-error", "at-error"):
        async with AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as client:
            with pytest.raises(openai.InternalServerError, match="upstream exploded"):
                await run_team(upstream_models(client, "responses"), "weather", stream=False)
    spans = capture.spans()
    assert_span_tree(spans)
    failed = {span.name for span in spans if span.status.code == "ERROR"}
    assert {"chat", "invoke_agent triage"} <= failed
    (llm,) = by_start(spans, sc.OP_CHAT)
    assert llm.attributes[sc.GEN_AI_AGENT_NAME] == "triage"
    assert llm.attributes[sc.ERROR_TYPE] == "InternalServerError"
    assert any(event.name == "exception" for event in llm.events)


async def test_runs_outside_a_rollout_record_nothing(capture: SpanCapture) -> None:
    """Without a rollout context there is nothing to attribute spans to, so the processor stays idle."""
    instrument()
    await run_team(scripted_models("math"), "math", stream=False, hooks=LightningRunHooks())
    assert capture.spans() == []
    processor = instrumented_processor()
    assert processor is not None and processor.open_spans == 0


def test_run_sync(capture: SpanCapture) -> None:
    """``Runner.run_sync`` (the SDK's blocking entry point) records the same tree."""
    instrument()
    rollout = ("ro-sync", "at-sync")
    try:
        with rollout_context(*rollout):
            agent = build_team(scripted_models("math"))
            result = Runner.run_sync(agent, QUESTIONS["math"], hooks=LightningRunHooks())
    finally:
        # run_sync deliberately leaves the thread's default loop open for reuse; this test owns the thread.
        policy = asyncio.get_event_loop_policy()
        policy.get_event_loop().close()
        policy.set_event_loop(None)
    assert result.final_output == ANSWERS["math"]
    check_team_spans(capture.spans(), "math", "chat", rollout)


async def test_tool_error_sent_to_the_model_is_recorded(capture: SpanCapture) -> None:
    """With the SDK's default tool error handling the run goes on; the tool span still records the failure."""
    instrument()

    @function_tool
    def lookup_weather(city: str) -> str:
        """Look up today's weather in a city."""
        raise ConnectionError(f"weather service for {city} is down")

    model = ScriptedModel(
        [[function_call("lookup_weather", {"city": "Paris"}, call_id="call-1")], [assistant_message("Sorry.")]]
    )
    agent = Agent(name="weather", instructions=WEATHER, model=model, tools=[lookup_weather])
    with rollout_context("ro-tool-error", "at-tool-error"):
        result = await Runner.run(agent, QUESTIONS["weather"], hooks=LightningRunHooks())
    assert result.final_output == "Sorry."
    (tool,) = by_start(capture.spans(), sc.OP_EXECUTE_TOOL)
    assert tool.status.code == "ERROR"
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_ID] == "call-1"
    # The SDK catches the exception and keeps only a (redacted) message, which is what the event can say.
    (event,) = [event for event in tool.events if event.name == "exception"]
    assert event.attributes["exception.type"] == tool.attributes[sc.ERROR_TYPE] == "agents.SpanError"
    assert str(event.attributes["exception.message"]).startswith("Error running tool")
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_RESULT]  # the error message the model was given
