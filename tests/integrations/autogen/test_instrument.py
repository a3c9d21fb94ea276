"""instrument()/uninstrument(): exact inverses, idempotent, late client classes, delegation, switches, providers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.teams import BaseGroupChat
from autogen_core.models import ChatCompletionClient, CreateResult, LLMMessage, UserMessage
from autogen_core.tools import BaseStreamTool, BaseTool
from autogen_ext.models.replay import ReplayChatCompletionClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import agentlightning_autogen
from agentlightning import semconv
from agentlightning.tracing import ListSpanSink, init_tracing, rollout_context, shutdown_tracing
from tests.integrations.autogen.fakes import MODEL_INFO, ScriptedClient, calculator_agent, round_robin_team, run_task
from tests.integrations.conformance import SpanCapture, assert_span_tree, shape

_PATCHED: list[tuple[type, str]] = [
    (ReplayChatCompletionClient, "create"),
    (ReplayChatCompletionClient, "create_stream"),
    (ScriptedClient, "create"),
    (BaseTool, "run_json"),
    (BaseStreamTool, "run_json_stream"),
    (BaseGroupChat, "run_stream"),
    (ChatCompletionClient, "__init_subclass__"),
]


def _own_attributes() -> list[Any]:
    return [owner.__dict__.get(name) for owner, name in _PATCHED]


def test_uninstrument_restores_every_original_and_instrument_twice_is_once() -> None:
    """Each patched attribute is replaced once and gets exactly its original object back."""
    before = _own_attributes()
    agentlightning_autogen.instrument()
    try:
        during = _own_attributes()
        assert all(now is not then for now, then in zip(during, before, strict=True))
        agentlightning_autogen.instrument()
        assert _own_attributes() == during
    finally:
        agentlightning_autogen.uninstrument()
    assert _own_attributes() == before
    assert "__init_subclass__" not in ChatCompletionClient.__dict__
    agentlightning_autogen.uninstrument()  # a second uninstrument is a no-op
    assert _own_attributes() == before


class _Delegating(ReplayChatCompletionClient):
    """A client that forwards to another client (as ChatCompletionCache does): one model call, one span."""

    def __init__(self, inner: ChatCompletionClient) -> None:
        super().__init__([], model_info=MODEL_INFO)
        self._inner = inner

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        """Ask the inner client."""
        return await self._inner.create(messages, **kwargs)

    async def create_stream(self, messages: Sequence[LLMMessage], **kwargs: Any) -> AsyncGenerator[Any]:
        """Stream from the inner client."""
        async for item in self._inner.create_stream(messages, **kwargs):
            yield item


@pytest.mark.usefixtures("instrumented")
@pytest.mark.parametrize("stream", [False, True])
async def test_client_class_defined_later_and_delegation(capture: SpanCapture, stream: bool) -> None:
    """A client class defined after instrument() is wrapped; a client calling another records one span."""

    class LateClient(ReplayChatCompletionClient):
        async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
            return await super().create(messages, **kwargs)

    assert getattr(LateClient.__dict__["create"], "__wrapped__", None) is not None
    rollout_id = f"ro-{uuid.uuid4().hex}"
    client = _Delegating(LateClient(["hello"], model_info=MODEL_INFO))
    with rollout_context(rollout_id, f"at-{uuid.uuid4().hex}"):
        if stream:
            items = [item async for item in client.create_stream([UserMessage(content="hi", source="user")])]
            assert isinstance(items[-1], CreateResult)
        else:
            await client.create([UserMessage(content="hi", source="user")])
    (span,) = capture.spans(rollout_id)
    assert span.name == "chat"
    assert span.parent_id is None
    assert span.attributes[semconv.GEN_AI_AGENT_NAME] == "autogen"  # no agent around the call
    agentlightning_autogen.uninstrument()
    assert "__wrapped__" not in LateClient.__dict__["create"].__dict__


async def test_keep_runtime_spans(capture: SpanCapture) -> None:
    """With keep_runtime_spans=True the runtime's messaging spans are stored too, still as one tree per trace."""
    agentlightning_autogen.instrument(keep_runtime_spans=True)
    try:
        rollout_id = f"ro-{uuid.uuid4().hex}"
        with rollout_context(rollout_id, f"at-{uuid.uuid4().hex}"):
            await run_task(round_robin_team(), stream=False)
    finally:
        agentlightning_autogen.uninstrument()
    spans = capture.spans(rollout_id)
    assert_span_tree(spans)
    names = {name for name, _ in shape(spans)}
    assert any(name.startswith("autogen publish") for name in names)
    assert any(name.startswith("autogen process") for name in names)
    # Every runtime span of the run is under the team's span; agent creation spans are kept as their own traces.
    roots = sorted(span.name for span in spans if span.parent_id is None)
    assert roots == [
        "create_agent critic",
        "create_agent planner",
        "create_agent solver",
        "invoke_agent RoundRobinGroupChat",
    ]


def test_provider_errors_teach() -> None:
    """A non-SDK provider, or a provider other than the global one AutoGen records into, is refused with the fix."""
    with pytest.raises(TypeError, match="SDK TracerProvider"):
        agentlightning_autogen.instrument(tracer_provider=object())  # type: ignore[arg-type]  # the wrong type is the test
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        with pytest.raises(ValueError, match="global TracerProvider"):
            agentlightning_autogen.instrument(tracer_provider=TracerProvider())
    assert "__init_subclass__" not in ChatCompletionClient.__dict__


_USER_PROVIDER_SCRIPT = textwrap.dedent(
    """
    import asyncio
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import agentlightning_autogen
    from agentlightning.tracing import ListSpanSink, init_tracing, rollout_context
    from tests.integrations.autogen.fakes import calculator_agent, run_task

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agentlightning_autogen.instrument(tracer_provider=provider)
    sink = ListSpanSink()
    tracer = init_tracing(sink)
    with rollout_context("ro-user", "at-user"):
        asyncio.run(run_task(calculator_agent(), stream=False))
    tracer.flush()
    ours = sorted(span.name for span in sink.spans)
    theirs = sorted(span.name for span in exporter.get_finished_spans() if not span.name.startswith("autogen "))
    print(ours == ["chat", "chat", "execute_tool add", "invoke_agent calculator"], "create_agent calculator" in theirs,
          [name for name in theirs if name != "create_agent calculator"] == ours)
    """
)


def test_users_provider_gets_autogen_and_our_spans() -> None:
    """In a fresh process: the user's provider becomes AutoGen's, their exporter sees our spans, our sink too."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", _USER_PROVIDER_SCRIPT], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"], done.stdout + done.stderr


@pytest.mark.usefixtures("instrumented")
async def test_single_agent_run_is_unchanged(capture: SpanCapture) -> None:
    """The agent's result is what it is without instrumentation."""
    with rollout_context(f"ro-{uuid.uuid4().hex}", f"at-{uuid.uuid4().hex}"):
        result = await run_task(calculator_agent(), stream=False)
    assert [message.to_text() for message in result.messages][-1] == "The sum is 5."


async def test_lightning_tracer_on_the_same_provider_stores_each_span_once() -> None:
    """init_tracing on AutoGen's own provider: its processor sees every span directly, ours forwards none."""
    agentlightning_autogen.instrument()
    try:
        provider = trace.get_tracer_provider()
        assert isinstance(provider, TracerProvider)
        sink = ListSpanSink()
        tracer = init_tracing(sink, provider=provider)
        rollout_id = f"ro-{uuid.uuid4().hex}"
        with rollout_context(rollout_id, f"at-{uuid.uuid4().hex}"):
            await run_task(calculator_agent(), stream=False)
        assert tracer.flush(timeout_s=10.0)
        spans = [span for span in sink.spans if span.rollout_id == rollout_id]
        assert len({span.span_id for span in spans}) == len(spans)
        assert {"chat", "execute_tool add", "invoke_agent calculator"} <= {span.name for span in spans}
    finally:
        shutdown_tracing()
        agentlightning_autogen.uninstrument()
