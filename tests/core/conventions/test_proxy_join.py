"""Golden tests: a foreign-instrumented agent whose model calls also go through our LLM proxy yields one call each.

The proxy span brings the engine's token ids; the foreign span brings the agent's place in the tree (parent, agent
name). The adapter joins the two by ``gen_ai.response.id``, streamed or not.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from agentlightning import semconv
from agentlightning.adapter.calls import find_llm_calls
from agentlightning.adapter.tree import build_call_tree
from agentlightning.proxy import ProxyServer
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, call_offered_tools
from tests.core.conventions.conftest import new_attempt, weather_turns
from tests.core.conventions.instrumented import INSTRUMENTATIONS, run_convention

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config` is deprecated")


@pytest.fixture
def proxy(store: InMemoryLightningStore) -> Iterator[ProxyServer]:
    """The LLM proxy in front of the fake upstream, writing its spans to ``store``."""
    with FakeOpenAI(reply=call_offered_tools).serve() as upstream, ProxyServer(store, upstream.base_url) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("name", list(INSTRUMENTATIONS))
async def test_foreign_and_proxy_spans_join_into_one_call(
    store: InMemoryLightningStore, server: StoreServer, proxy: ProxyServer, name: str, stream: bool
) -> None:
    attempt = await new_attempt(store)
    with openai.OpenAI(base_url=proxy.url_for(*attempt), api_key="fake", max_retries=0) as client:
        _, responses = await run_convention(
            store, server, client, name, lambda c: weather_turns(c, lambda a: "sunny", stream=stream), attempt=attempt
        )
    proxy.flush()
    spans = await store.query_spans(*attempt)
    proxy_spans = [s for s in spans if s.attributes.get(semconv.SPAN_SOURCE) == semconv.SOURCE_PROXY]
    assert len(proxy_spans) == 2

    calls = find_llm_calls(spans)
    assert [c.response_id for c in calls] == [r.id for r in responses]  # one call per model call, not two
    tree = build_call_tree(spans)
    (agent,) = [s for s in spans if s.name == "invoke_agent weather"]
    for call in calls:
        assert set(call.sources) == {semconv.SOURCE_PROXY, semconv.SOURCE_OTLP}
        foreign = tree.spans[call.span_id]
        assert foreign.attributes[semconv.SPAN_SOURCE] == semconv.SOURCE_OTLP  # the call sits where the agent was
        assert foreign.parent_id == agent.span_id and call.agent_name == "weather"
        twin = next(s for s in proxy_spans if s.span_id in call.span_ids)
        assert call.prompt_token_ids == twin.attributes[semconv.PROMPT_TOKEN_IDS]
        assert call.response_token_ids == twin.attributes[semconv.RESPONSE_TOKEN_IDS] and call.has_token_ids
        assert call.input_messages and call.output_messages
