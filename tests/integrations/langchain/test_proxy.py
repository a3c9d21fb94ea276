"""Through the LLM proxy: the hook's spans and the proxy's spans of each call join into one call with token ids."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_openai import ChatOpenAI

from agentlightning.tracing import rollout_context
from agentlightning_langchain import LightningCallbackHandler
from tests.integrations.langchain.fakes import build_react_agent, make_add_tool, team_input
from tests.integrations.proxy_rig import ProxyRig, add_then_answer, assert_joined, serve_proxy_rig


@pytest.fixture
def rig() -> Iterator[ProxyRig]:
    """Store, fake upstream (a tool loop) and proxy on loopback."""
    with serve_proxy_rig(add_then_answer) as rig:
        yield rig


# langchain-openai 1.7 drops the ``chat.completion.chunk`` id when it streams Chat Completions (it never reads
# ``chunk["id"]``; the merged message keeps LangChain's own ``lc_run--`` id), so no callback can learn the response
# id of a streamed Chat Completions call. The Responses API keeps it (``response_metadata["id"]``) in both modes.


@pytest.mark.parametrize(
    ("mode", "api"),
    [
        ("invoke", "chat"),
        ("invoke", "responses"),
        ("stream", "responses"),
        ("astream", "responses"),
        ("stream", "chat"),
        ("astream", "chat"),
    ],
)
def test_hook_and_proxy_spans_join(mode: str, api: str, rig: ProxyRig) -> None:
    """A prebuilt agent on ChatOpenAI via the proxy: every LLM call has a hook twin and a proxy twin, joined."""
    rollout_id, attempt_id = rig.new_attempt()
    model: Any = ChatOpenAI(
        model="policy",
        base_url=rig.proxy.url_for(rollout_id, attempt_id),
        api_key="k",  # pyright: ignore[reportArgumentType]  # langchain-openai types it as SecretStr
        streaming=mode != "invoke",
        use_responses_api=api == "responses",
    )
    graph = build_react_agent(model, [make_add_tool()])
    config: Any = {"callbacks": [LightningCallbackHandler()]}
    with rollout_context(rollout_id, attempt_id):
        if mode == "invoke":
            result = graph.invoke(team_input(), config)
            assert result["messages"][-1].text == "The sum is 5."
        elif mode == "stream":
            assert list(graph.stream(team_input(), config, stream_mode="messages"))
        else:

            async def consume() -> int:
                return len([item async for item in graph.astream(team_input(), config, stream_mode="messages")])

            assert asyncio.run(consume()) > 0

    # Streamed Chat Completions: langchain-openai discards the chat.completion id, so the hook span has none; the
    # adapter joins it with the proxy span recorded inside its time window instead.
    calls = assert_joined(rig.spans(rollout_id), 2, by_response_id=not (api == "chat" and mode != "invoke"))
    assert all(call.agent_name == "mathbot" for call in calls)  # the prebuilt graph's name, not its node's
