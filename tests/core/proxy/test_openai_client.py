"""The real openai client through the proxy: byte-identical answers, spans with the upstream's token ids."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai

from agentlightning import semconv as sc
from agentlightning.testing import FakeReply, FakeToolCall, logprob_of, tokenize
from agentlightning.types import LLM
from tests.core.proxy.conftest import ProxyRig

MESSAGES: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
TOOLS: list[Any] = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def _direct_ids(rig: ProxyRig, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the upstream sends when asked for ids and logprobs directly (the ground truth for spans)."""
    return httpx.post(f"{rig.upstream_url}{path}", json={**body, "return_token_ids": True}).json()


def test_sync_chat_identical_and_span_has_upstream_ids(rig: ProxyRig) -> None:
    rollout_id, attempt_id = rig.new_attempt()
    direct = rig.client(rig.upstream_url)
    proxied = rig.client(rig.proxy.url_for(rollout_id, attempt_id))
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "temperature": 0.5, "tools": TOOLS}
    want = direct.chat.completions.with_raw_response.create(**kwargs)
    got = proxied.chat.completions.with_raw_response.create(**kwargs)
    assert got.http_response.content == want.http_response.content
    assert got.headers[sc.HEADER_POLICY_VERSION] == "1"
    # the proxy asked the upstream for ids and logprobs, the agent saw none of it
    assert rig.fake.requests[-1]["return_token_ids"] is True and rig.fake.requests[-1]["logprobs"] is True

    truth = _direct_ids(rig, "/chat/completions", kwargs)
    [span] = rig.spans(rollout_id)
    attrs = span.attributes
    assert (span.attempt_id, span.kind, span.status.code, span.name) == (attempt_id, "CLIENT", "OK", "chat m")
    assert attrs[sc.PROMPT_TOKEN_IDS] == truth["prompt_token_ids"]
    assert attrs[sc.RESPONSE_TOKEN_IDS] == truth["choices"][0]["token_ids"]
    assert attrs[sc.RESPONSE_LOGPROBS] == [logprob_of(t) for t in truth["choices"][0]["token_ids"]]
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat" and attrs[sc.SPAN_SOURCE] == "proxy"
    assert attrs[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == attrs[sc.GEN_AI_RESPONSE_MODEL] == "m"
    assert attrs[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert attrs[sc.GEN_AI_RESPONSE_ID] == truth["id"]
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == truth["usage"]["prompt_tokens"]
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == truth["usage"]["completion_tokens"]
    assert json.loads(str(attrs[sc.GEN_AI_INPUT_MESSAGES])) == MESSAGES
    assert json.loads(str(attrs[sc.GEN_AI_TOOL_DEFINITIONS])) == TOOLS
    output = json.loads(str(attrs[sc.GEN_AI_OUTPUT_MESSAGES]))
    assert output == [{"role": "assistant", "content": "echo: hello there", "finish_reason": "stop"}]
    assert attrs[sc.POLICY_VERSION] == 1
    assert span.end_time is not None and span.end_time > span.start_time


def test_agent_that_asks_for_ids_and_logprobs_gets_them(rig: ProxyRig) -> None:
    rollout_id, attempt_id = rig.new_attempt()
    body = {"model": "m", "messages": MESSAGES, "logprobs": True, "return_token_ids": True}
    want = httpx.post(f"{rig.upstream_url}/chat/completions", json=body)
    got = httpx.post(f"{rig.proxy.url_for(rollout_id, attempt_id)}/chat/completions", json=body)
    assert got.content == want.content and "prompt_token_ids" in got.json()


async def test_async_streaming_chat_with_tool_calls(rig: ProxyRig) -> None:
    rig.fake.reply = lambda r: FakeReply(text="let me add", tool_calls=[FakeToolCall("add", '{"a": 1, "b": 2}')])
    rollout_id, attempt_id = await asyncio.to_thread(rig.new_attempt)
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True}
    async with (
        openai.AsyncOpenAI(base_url=rig.upstream_url, api_key="k") as direct,
        openai.AsyncOpenAI(base_url=rig.proxy.url_for(rollout_id, attempt_id), api_key="k") as proxied,
    ):
        want = await direct.chat.completions.with_raw_response.create(**kwargs)
        got = await proxied.chat.completions.with_raw_response.create(**kwargs)
        want_bytes = b"".join([chunk async for chunk in want.http_response.aiter_bytes()])
        got_bytes = b"".join([chunk async for chunk in got.http_response.aiter_bytes()])
        assert got_bytes == want_bytes
        stream = await proxied.chat.completions.create(**kwargs)
        chunks = [chunk async for chunk in stream]
    assert all(not (chunk.model_extra or {}).get("prompt_token_ids") for chunk in chunks)

    truth = await asyncio.to_thread(_direct_ids, rig, "/chat/completions", {**kwargs, "stream": False})
    spans = await asyncio.to_thread(rig.spans, rollout_id)
    assert len(spans) == 2
    for span in spans:
        attrs = span.attributes
        assert attrs[sc.PROMPT_TOKEN_IDS] == truth["prompt_token_ids"]
        assert attrs[sc.RESPONSE_TOKEN_IDS] == truth["choices"][0]["token_ids"]
        assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]
        [message] = json.loads(str(attrs[sc.GEN_AI_OUTPUT_MESSAGES]))
        assert message["content"] == "let me add"
        assert message["tool_calls"] == truth["choices"][0]["message"]["tool_calls"]
        assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == len(truth["choices"][0]["token_ids"])
        ids = truth["choices"][0]["token_ids"]
        assert attrs[sc.RESPONSE_LOGPROBS] == [logprob_of(t) for t in ids]  # aligned with the ids, tool call too


def test_responses_api_streaming_and_not(rig: ProxyRig) -> None:
    rollout_id, attempt_id = rig.new_attempt()
    direct = rig.client(rig.upstream_url)
    proxied = rig.client(rig.proxy.url_for(rollout_id, attempt_id))
    kwargs: dict[str, Any] = {"model": "m", "instructions": "be brief", "input": "what is up"}
    want = direct.responses.with_raw_response.create(**kwargs).http_response.content
    assert proxied.responses.with_raw_response.create(**kwargs).http_response.content == want
    want_stream = direct.responses.with_raw_response.create(**kwargs, stream=True).http_response.read()
    got_stream = proxied.responses.with_raw_response.create(**kwargs, stream=True).http_response.read()
    assert got_stream == want_stream
    assert rig.fake.requests[-1]["include"] == ["message.output_text.logprobs"]
    with proxied.responses.stream(**kwargs) as stream:
        assert stream.get_final_response().output_text == "echo: what is up"

    truth = _direct_ids(rig, "/responses", kwargs)
    spans = rig.spans(rollout_id)
    assert len(spans) == 3
    for span in spans:
        attrs = span.attributes
        assert attrs[sc.PROMPT_TOKEN_IDS] == truth["prompt_token_ids"]
        assert attrs[sc.RESPONSE_TOKEN_IDS] == truth["token_ids"] == tokenize("echo: what is up")
        assert attrs[sc.RESPONSE_LOGPROBS] == [logprob_of(t) for t in truth["token_ids"]]
        assert attrs[sc.GEN_AI_RESPONSE_ID] == truth["id"]
        assert json.loads(str(attrs[sc.GEN_AI_SYSTEM_INSTRUCTIONS])) == "be brief"
        assert json.loads(str(attrs[sc.GEN_AI_INPUT_MESSAGES]))[-1] == {"role": "user", "content": "what is up"}


def test_responses_function_calls_recorded(rig: ProxyRig) -> None:
    rig.fake.reply = [FakeReply(tool_calls=[FakeToolCall("lookup", '{"q": "x"}', id="call_1")])]
    rollout_id, attempt_id = rig.new_attempt()
    proxied = rig.client(rig.proxy.url_for(rollout_id, attempt_id))
    with proxied.responses.stream(model="m", input="find x") as stream:
        final = stream.get_final_response()
    assert final.output[0].type == "function_call"
    [span] = rig.spans(rollout_id)
    [message] = json.loads(str(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES]))
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    assert message["tool_calls"] == [call]
    assert span.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]


def test_header_attribution_and_unattributed_calls(rig: ProxyRig) -> None:
    rollout_id, attempt_id = rig.new_attempt()
    headers = {sc.HEADER_ROLLOUT_ID: rollout_id, sc.HEADER_ATTEMPT_ID: attempt_id}
    by_header = rig.client(rig.proxy.base_url, default_headers=headers)
    plain = rig.client(rig.proxy.base_url)
    by_header.chat.completions.create(model="m", messages=MESSAGES)
    before = len(rig.fake.requests)
    plain.chat.completions.create(model="m", messages=MESSAGES)
    assert "return_token_ids" not in rig.fake.requests[before]  # unattributed: forwarded untouched
    assert plain.models.list().data[0].id == "fake-model"
    spans = rig.spans(rollout_id)
    assert [s.attempt_id for s in spans] == [attempt_id]


async def test_concurrent_calls_of_many_attempts_do_not_cross_link(rig: ProxyRig) -> None:
    attempts = [await asyncio.to_thread(rig.new_attempt) for _ in range(3)]

    async def agent(rollout_id: str, attempt_id: str) -> None:
        async with openai.AsyncOpenAI(base_url=rig.proxy.url_for(rollout_id, attempt_id), api_key="k") as client:
            calls = [
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"{rollout_id} {i}"}], stream=i % 2 == 0
                )
                for i in range(5)
            ]
            for result in await asyncio.gather(*calls):
                if isinstance(result, openai.AsyncStream):
                    async for _ in result:
                        pass

    await asyncio.gather(*(agent(*ids) for ids in attempts))
    for rollout_id, attempt_id in attempts:
        spans = await asyncio.to_thread(rig.spans, rollout_id)
        assert len(spans) == 5 and {s.attempt_id for s in spans} == {attempt_id}
        for span in spans:
            [message] = json.loads(str(span.attributes[sc.GEN_AI_INPUT_MESSAGES]))
            assert message["content"].startswith(rollout_id)
            assert span.attributes[sc.RESPONSE_TOKEN_IDS] == tokenize(f"echo: {message['content']}")


def test_llm_resource_base_url_for_points_at_the_attempt_routes(rig: ProxyRig) -> None:
    rollout_id, attempt_id = rig.new_attempt()
    llm = LLM(base_url=rig.proxy.url, model="m", proxied=True)
    assert llm.base_url_for(rollout_id, attempt_id) == rig.proxy.url_for(rollout_id, attempt_id)
    client = rig.client(llm.base_url_for(rollout_id, attempt_id))
    client.chat.completions.create(model=llm.model, messages=MESSAGES)
    assert [span.attempt_id for span in rig.spans(rollout_id)] == [attempt_id]
    assert LLM(base_url=rig.proxy.url, model="m", proxied=True).base_url_for(None, None) == rig.proxy.base_url


def test_span_is_stored_before_the_agent_sees_the_answer_end(rig: ProxyRig) -> None:
    # A runner closes the attempt as soon as the agent returns; the call's span must already be in the store then.
    rollout_id, attempt_id = rig.new_attempt()
    client = rig.client(rig.proxy.url_for(rollout_id, attempt_id))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}])
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "two"}], stream=True)
    assert list(stream)
    stored = asyncio.run(rig.store.query_spans(rollout_id))  # no flush on purpose
    assert len(stored) == 2
    assert all(s.attributes.get(sc.RESPONSE_TOKEN_IDS) for s in stored)
