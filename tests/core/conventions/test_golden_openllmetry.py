"""Golden test: spans of Traceloop's opentelemetry-instrumentation-openai (OpenLLMetry), read back as our calls."""

from __future__ import annotations

import openai
import pytest

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.conventions import CONVENTION, CONVENTION_SCOPE, MISSING, ORIGINAL_PREFIX, OTEL_GENAI
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from tests.core.conventions.conftest import (
    assert_weather_calls,
    loads,
    run_instrumented,
)
from tests.core.conventions.instrumented import TraceloopInstrumentor

# The instrumentor's responses wrapper declares a class-based pydantic Config, deprecated under pydantic 2.
pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config` is deprecated")


async def test_openllmetry_openai_calls_under_an_agent(
    store: InMemoryLightningStore, server: StoreServer, client: openai.OpenAI
) -> None:
    spans, responses = await run_instrumented(store, server, client, TraceloopInstrumentor())
    llm = [s for s in spans if s.name == "openai.chat"]
    # Releases from 0.5x on write GenAI semconv messages as parts, not the indexed gen_ai.prompt.N attributes.
    assert all(s.attributes[CONVENTION] == OTEL_GENAI and MISSING not in s.attributes for s in llm)
    assert all(str(s.attributes[CONVENTION_SCOPE]).startswith("opentelemetry.instrumentation.openai.v1 ") for s in llm)
    original = loads(llm[0].attributes[ORIGINAL_PREFIX + semconv.GEN_AI_INPUT_MESSAGES])
    assert original[0]["parts"][0]["type"] == "text"
    assert_weather_calls(llm, responses)
    (agent_span,) = [s for s in spans if s.name == "invoke_agent weather"]
    assert CONVENTION not in agent_span.attributes
    assert {s.parent_id for s in llm} == {agent_span.span_id}
    calls = find_llm_calls(spans)
    assert [c.response_id for c in calls] == [r.id for r in responses]
    assert all(c.agent_name == "weather" for c in calls)
