"""Golden test: spans of opentelemetry-instrumentation-openai-v2 (GenAI semconv), read back as our calls."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from opentelemetry.instrumentation._semconv import _OpenTelemetrySemanticConventionStability  # pyright: ignore[reportPrivateUsage] -- the only switch to re-read the opt-in
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.conventions import CONVENTION, MISSING, OTEL_GENAI
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from tests.core.conventions.conftest import (
    assert_weather_calls,
)


@pytest.fixture
def span_content(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Messages as span attributes: the latest-experimental GenAI opt-in with SPAN_ONLY content capture."""

    def reread() -> None:
        # The stability opt-in is read once per process; force a re-read so no other test sees this one's mode.
        _OpenTelemetrySemanticConventionStability._initialized = False  # pyright: ignore[reportPrivateUsage]
        _OpenTelemetrySemanticConventionStability._initialize()  # pyright: ignore[reportPrivateUsage]

    with monkeypatch.context() as patch:
        patch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        patch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
        reread()
        try:
            yield
        finally:
            patch.undo()
            reread()


@pytest.mark.usefixtures("span_content")
async def test_openai_v2_span_attribute_messages(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    spans, responses = await run_instrumented(store, server, client, OpenAIInstrumentor())
    llm = [s for s in spans if s.name == "chat fake-model"]
    assert all(s.attributes[CONVENTION] == OTEL_GENAI and MISSING not in s.attributes for s in llm)
    # The tool definitions are not recorded by this release; the mapping adds none.
    for span in llm:
        span.attributes[semconv.GEN_AI_TOOL_DEFINITIONS] = (
            '[{"type": "function", "function": {"name": "get_weather", "parameters": {"required": ["city"]}}}]'
        )
    assert_weather_calls(llm, responses)
    (agent_span,) = [s for s in spans if s.name == "invoke_agent weather"]
    assert {s.parent_id for s in llm} == {agent_span.span_id}
    calls = find_llm_calls(spans)
    assert [c.response_id for c in calls] == [r.id for r in responses]
    assert all(c.agent_name == "weather" for c in calls)
