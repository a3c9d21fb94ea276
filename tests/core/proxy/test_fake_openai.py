"""The fake upstream itself: deterministic, token ids and logprobs on request, scripting, errors."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import openai
import pytest

from agentlightning.testing import FakeError, FakeOpenAI, FakeReply, FakeToolCall, logprob_of, tokenize


def test_deterministic_with_token_ids_and_logprobs() -> None:
    fake = FakeOpenAI()
    with fake.serve() as server, ExitStack() as stack:
        client = stack.enter_context(openai.OpenAI(base_url=server.base_url, api_key="k"))
        messages = [{"role": "user", "content": "hi"}]
        first = client.chat.completions.with_raw_response.create(model="m", messages=messages)  # type: ignore[arg-type]
        second = client.chat.completions.with_raw_response.create(model="m", messages=messages)  # type: ignore[arg-type]
        assert first.http_response.content == second.http_response.content
        assert first.headers["x-agentlightning-policy-version"] == "1"
        raw = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "m", "messages": messages, "return_token_ids": True, "logprobs": True},
        ).json()
    assert raw["choices"][0]["message"]["content"] == "echo: hi"
    assert raw["choices"][0]["token_ids"] == tokenize("echo: hi")
    assert raw["prompt_token_ids"] == tokenize("<|user|>hi<|assistant|>")
    logprobs = [entry["logprob"] for entry in raw["choices"][0]["logprobs"]["content"]]
    assert logprobs == [logprob_of(t) for t in tokenize("echo: hi")]
    assert "prompt_token_ids" not in first.parse().model_dump()


def test_script_list_tool_calls_errors_and_max_tokens() -> None:
    script = [
        FakeReply(tool_calls=[FakeToolCall("add", '{"a": 1}')]),
        FakeError(429, "slow down"),
        FakeReply(text="abcdefgh"),
    ]
    with FakeOpenAI(reply=script).serve() as server, ExitStack() as stack:
        client = stack.enter_context(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
        messages = [{"role": "user", "content": "x"}]
        call = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        assert call.choices[0].finish_reason == "tool_calls"
        assert call.choices[0].message.tool_calls is not None
        with pytest.raises(openai.RateLimitError, match="slow down"):
            client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        cut = client.chat.completions.create(model="m", messages=messages, max_tokens=3)  # type: ignore[arg-type]
        assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == ("abc", "length")
        assert client.models.list().data[0].id == "fake-model"


def test_responses_api_with_function_call_and_rule() -> None:
    fake = FakeOpenAI(
        reply=lambda r: FakeReply(text="done") if r.has_tool_results else FakeReply(tool_calls=[FakeToolCall("f")])
    )
    with fake.serve() as server, ExitStack() as stack:
        client = stack.enter_context(openai.OpenAI(base_url=server.base_url, api_key="k"))
        first = client.responses.create(model="m", input="go")
        call = first.output[0]
        assert call.type == "function_call"
        follow = [{"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
        with client.responses.stream(model="m", input=follow) as stream:  # type: ignore[arg-type]
            final = stream.get_final_response()
    assert final.output_text == "done"
    assert final.usage is not None and final.usage.output_tokens == len("done")
