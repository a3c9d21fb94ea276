"""Agents → our LLM proxy → the replica router → vLLM-like replicas (the fake OpenAI upstream), on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from agentlightning.adapter import TraceAdapter
from agentlightning.proxy.server import serve_app, start_proxy
from agentlightning.semconv import HEADER_POLICY_VERSION
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, FakeOpenAIServer
from agentlightning_trainer.verl.router import ReplicaRouter, create_router_app

SERVED = "/models/Qwen2.5-0.5B-Instruct"


@pytest.fixture
def replicas() -> Iterator[list[FakeOpenAIServer]]:
    with ExitStack() as stack:
        yield [stack.enter_context(FakeOpenAI(policy_version=None, latency_s=0.05).serve()) for _ in range(2)]


def _chat(text: str) -> dict[str, object]:
    return {"model": "policy", "messages": [{"role": "user", "content": text}], "max_tokens": 8}


async def test_calls_reach_the_replicas_through_the_proxy_with_token_ids(replicas: list[FakeOpenAIServer]) -> None:
    store = InMemoryLightningStore()
    router = ReplicaRouter([r.url.removeprefix("http://") for r in replicas], served_model=SERVED)
    router.policy_version = 7
    served_router = await serve_app(create_router_app(router), name="router")
    proxy = await start_proxy(store, served_router.url)
    try:
        await store.enqueue_rollout({"task": "t"}, group_id="task-1")
        claimed = await store.claim_rollout("worker")
        assert claimed is not None
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        async with httpx.AsyncClient(base_url=f"{proxy.url}/rollout/{rollout_id}/attempt/{attempt_id}/v1") as client:
            answers = await asyncio.gather(*(client.post("/chat/completions", json=_chat(f"q{i}")) for i in range(4)))
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert answer.headers[HEADER_POLICY_VERSION] == "7"
            assert "prompt_token_ids" not in answer.json()  # the proxy strips what the agent did not ask for
        await proxy.flush()
        # both replicas served (least in flight), each saw the served model name and the proxy's token-id request
        bodies = [body for replica in replicas for body in replica.fake.requests]
        assert all(len(replica.fake.requests) == 2 for replica in replicas)
        assert {body["model"] for body in bodies} == {SERVED}
        assert all(body.get("return_token_ids") is True for body in bodies)
        assert router.in_flight == [0, 0]
        rollout = (await store.query_rollouts(rollout_ids=[rollout_id]))[0]
        rows = TraceAdapter(default_reward=0.0).adapt(rollout, await store.query_spans(rollout_id, "latest"))
        assert len(rows) == 4
        assert all(row.has_token_ids and row.policy_version == 7 for row in rows)
        assert all(row.response_logprobs is not None for row in rows)
    finally:
        await proxy.stop()
        await served_router.stop()


async def test_the_served_name_comes_from_the_replica(replicas: list[FakeOpenAIServer]) -> None:
    router = ReplicaRouter([r.url for r in replicas], served_model="guess")
    try:
        assert await router.discover_served_model() == "fake-model"
        assert router.served_model == "fake-model"
    finally:
        await router.aclose()


async def test_a_dead_replica_is_a_502_that_names_it() -> None:
    router = ReplicaRouter(["127.0.0.1:9"], served_model=SERVED)
    served = await serve_app(create_router_app(router), name="router")
    try:
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"{served.url}/v1/chat/completions", json=_chat("hi"))
        assert answer.status_code == 502
        assert "127.0.0.1:9" in answer.json()["error"]["message"]
        assert router.in_flight == [0]
    finally:
        await served.stop()


def test_router_needs_a_replica_and_rewrites_only_json_models() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ReplicaRouter([], served_model=SERVED)
    router = ReplicaRouter(["http://h:1/", "h:2"], served_model=SERVED)
    assert router.bases == ["http://h:1", "http://h:2"]
    assert router.rewrite_body(b'{"model": "x", "n": 1}') == b'{"model":"' + SERVED.encode() + b'","n":1}'
    assert router.rewrite_body(b"not json") == b"not json"
    assert router.rewrite_body(b'{"input": 1}') == b'{"input": 1}'
