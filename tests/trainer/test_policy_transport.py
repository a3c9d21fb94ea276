"""The co-hosted proxy's in-process transport answers exactly as the policy app's HTTP routes, and the proxy records
the same spans through it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from agentlightning import semconv as sc
from agentlightning.proxy import create_proxy_app, flush_proxy_spans
from agentlightning.semconv import HEADER_POLICY_VERSION
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import RolloutRequest
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.policy_server import create_policy_app
from agentlightning_trainer.policy_transport import PolicyAppTransport
from agentlightning_trainer.torch_backend.policy import Policy

BASE = "http://policy.test"
VOLATILE = {"id", "item_id", "created", "created_at", "call_id"}  # random or clock-dependent in every answer


def _chat(task: dict[str, str], **extra: object) -> dict[str, Any]:
    return {"model": "tiny-gpt", "messages": tool_choice.messages(task), "max_tokens": 6, "temperature": 0, **extra}


def _stable(value: Any) -> Any:
    """``value`` with the answer's random ids and timestamps blanked."""
    if isinstance(value, dict):
        return {k: "*" if k in VOLATILE else _stable(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        return [_stable(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


def _events(body: bytes) -> list[Any]:
    """A server-sent event stream's data lines, parsed (``[DONE]`` kept as is)."""
    lines = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else _stable(json.loads(line)) for line in lines]


@asynccontextmanager
async def _clients(app: FastAPI) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """(the app over its HTTP routes, the app through the in-process transport), with the app's batcher running."""
    over_http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
    fallback = httpx.ASGITransport(app=app)  # stands in for the loopback HTTP the other routes take
    direct = httpx.AsyncClient(transport=PolicyAppTransport(app.state.answers, fallback), base_url=BASE)
    async with app.router.lifespan_context(app), over_http, direct:
        yield over_http, direct


async def _both(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], method: str, path: str, **kw: Any
) -> tuple[httpx.Response, httpx.Response]:
    over_http, direct = clients
    return await over_http.request(method, path, **kw), await direct.request(method, path, **kw)


def _same_head(a: httpx.Response, b: httpx.Response) -> None:
    assert (a.status_code, a.headers.get("content-type")) == (b.status_code, b.headers.get("content-type"))
    assert a.headers.get(HEADER_POLICY_VERSION) == b.headers.get(HEADER_POLICY_VERSION)
    for response in (a, b):
        if "content-length" in response.headers:
            assert int(response.headers["content-length"]) == len(response.content)


def test_chat_answers_match_the_http_route(tool_spec: PolicySpec) -> None:
    app = create_policy_app(Policy.build(tool_spec, seed=0), version=4)
    task = tool_choice.tasks()[0]

    async def main() -> None:
        async with _clients(app) as clients:
            a, b = await _both(
                clients, "POST", "/v1/chat/completions", json=_chat(task, return_token_ids=True, logprobs=True)
            )
            _same_head(a, b)
            assert a.status_code == 200 and b.headers[HEADER_POLICY_VERSION] == "4"
            assert _stable(a.json()) == _stable(b.json())
            assert b.json()["choices"][0]["token_ids"] and b.json()["prompt_token_ids"]
            a, b = await _both(clients, "POST", "/v1/chat/completions", json=_chat(task, stream=True))
            _same_head(a, b)
            assert b.headers["content-type"].startswith("text/event-stream")
            assert _events(a.content) == _events(b.content) and _events(b.content)[-1] == "[DONE]"
            a, b = await _both(clients, "GET", "/v1/models")  # not a generating route: the fallback carries it
            _same_head(a, b)
            assert a.json() == b.json() and b.json()["data"][0]["policy_version"] == 4

    asyncio.run(main())


def test_responses_api_answers_match_the_http_route(tool_spec: PolicySpec) -> None:
    app = create_policy_app(Policy.build(tool_spec, seed=0))
    task = tool_choice.tasks()[1]
    body = {"model": "tiny-gpt", "input": tool_choice.messages(task), "max_output_tokens": 6, "temperature": 0}

    async def main() -> None:
        async with _clients(app) as clients:
            a, b = await _both(clients, "POST", "/v1/responses", json=body)
            _same_head(a, b)
            assert a.status_code == 200 and b.json()["object"] == "response"
            assert _stable(a.json()) == _stable(b.json())
            a, b = await _both(clients, "POST", "/v1/responses", json={**body, "stream": True})
            _same_head(a, b)
            assert _events(a.content) == _events(b.content) and len(_events(b.content)) > 3

    asyncio.run(main())


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b""),
        ("/v1/chat/completions", json.dumps({"model": "tiny-gpt", "messages": []}).encode()),
        (
            "/v1/chat/completions",
            json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}).encode(),
        ),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [1]}).encode()),
        ("/v1/responses", b"[1, 2]"),
        ("/v1/responses", json.dumps({"model": "m"}).encode()),
    ],
    ids=[
        "not-json",
        "empty-body",
        "no-messages",
        "too-long",
        "bad-tools",
        "responses-not-object",
        "responses-no-input",
    ],
)
def test_bad_requests_get_the_same_error_bytes(tool_spec: PolicySpec, path: str, content: bytes) -> None:
    app = create_policy_app(Policy.build(tool_spec, seed=0))

    async def main() -> None:
        async with _clients(app) as clients:
            a, b = await _both(clients, "POST", path, content=content, headers={"content-type": "application/json"})
            _same_head(a, b)
            assert a.status_code == 400 and a.content == b.content

    asyncio.run(main())


def test_a_failing_handler_is_a_500_like_the_http_route() -> None:
    async def fails(_: bytes) -> Any:
        raise RuntimeError("generation failed")

    async def main() -> None:
        transport = PolicyAppTransport({"/v1/chat/completions": fails})
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            response = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert (response.status_code, response.text) == (500, "Internal Server Error")

    asyncio.run(main())


def test_the_proxy_records_token_ids_through_the_in_process_transport(tool_spec: PolicySpec) -> None:
    policy = Policy.build(tool_spec, seed=0)
    app = create_policy_app(policy, version=2)
    store = InMemoryLightningStore()
    proxy_app = create_proxy_app(store, BASE + "/v1", upstream_transport=PolicyAppTransport(app.state.answers))
    task = tool_choice.tasks()[2]

    async def main() -> None:
        await store.enqueue_rollouts([RolloutRequest(input=task)])
        claimed = await store.claim_and_start("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        agent = httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy_app), base_url=BASE)
        async with app.router.lifespan_context(app), proxy_app.router.lifespan_context(proxy_app), agent:
            response = await agent.post(f"/rollout/{rid}/attempt/{aid}/v1/chat/completions", json=_chat(task))
            assert response.status_code == 200, response.text
            assert response.headers[HEADER_POLICY_VERSION] == "2"
            answer = response.json()
            assert "token_ids" not in answer["choices"][0]  # the agent did not ask for them: stripped
            await flush_proxy_spans(proxy_app)
        spans = await store.query_spans(rid)
        (span,) = [s for s in spans if s.attributes.get(sc.SPAN_SOURCE) == sc.SOURCE_PROXY]
        prompt_ids = policy.tokenizer.encode_chat(tool_choice.messages(task))
        assert list(span.attributes[sc.PROMPT_TOKEN_IDS]) == prompt_ids  # type: ignore[arg-type]
        reply = policy.tokenizer.decode(list(span.attributes[sc.RESPONSE_TOKEN_IDS]))  # type: ignore[arg-type]
        assert reply == answer["choices"][0]["message"]["content"]
        assert span.attributes[sc.POLICY_VERSION] == 2

    asyncio.run(main())
