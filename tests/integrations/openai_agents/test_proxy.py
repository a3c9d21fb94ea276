"""Through the LLM proxy: each LLM call has a hook span and a proxy span sharing ``gen_ai.response.id``, joined."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI

from agentlightning.tracing import rollout_context
from agentlightning_openai_agents import instrument
from tests.integrations.openai_agents.fakes import ANSWERS, Api, reply, upstream_models
from tests.integrations.openai_agents.test_team import run_team
from tests.integrations.proxy_rig import ProxyRig, assert_joined, serve_proxy_rig


@pytest.fixture
def rig() -> Iterator[ProxyRig]:
    """Store, fake upstream (the team's scripted replies) and proxy on loopback."""
    with serve_proxy_rig(reply) as rig:
        yield rig


@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_hook_and_proxy_spans_join(rig: ProxyRig, api: Api, stream: bool) -> None:
    """The team via the proxy: three calls, each a hook twin (agent name) joined to a proxy twin (token ids)."""
    instrument()
    rollout_id, attempt_id = rig.new_attempt()

    async def run() -> str:
        async with AsyncOpenAI(base_url=rig.proxy.url_for(rollout_id, attempt_id), api_key="k") as client:
            with rollout_context(rollout_id, attempt_id):
                return await run_team(upstream_models(client, api), "weather", stream=stream)

    assert asyncio.run(run()) == ANSWERS["weather"]
    calls = assert_joined(rig.spans(rollout_id), 3)
    assert [call.agent_name for call in calls] == ["triage", "weather", "weather"]
