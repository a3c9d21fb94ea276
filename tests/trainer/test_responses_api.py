"""The policy server's Responses API: request translation, the SDK's view of answers and streams, the LLM proxy's spans,
and the OpenAI Agents SDK running a tool-calling agent on it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from agentlightning import semconv as sc
from agentlightning.proxy import ProxyServer
from agentlightning.semconv import HEADER_POLICY_VERSION
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.responses_api import (
    chat_choice_to_response,
    chat_request_of,
    response_events,
    responses_to_chat,
)
from agentlightning_trainer.tool_calls import GUIDED_NAME_END, format_tool_call, validate_tools
from agentlightning_trainer.torch_backend.policy import Policy
from tests.trainer.conftest import build_bpe_llama, claimed_attempt, serve_policy

ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
TOOLS: list[Any] = [  # the Responses API's flat shape
    {"type": "function", "name": "add", "description": "Add two numbers.", "parameters": ADD_SCHEMA},
    {"type": "function", "name": "search", "parameters": {"type": "object"}},
]
CHAT_TOOLS = validate_tools(TOOLS)
CALL = format_tool_call("add", {"a": 2, "b": 3}, compact=True)
MESSAGES: list[Any] = [{"role": "user", "content": "add 2 and 3"}]
STREAM_TYPES = {
    "message": [
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
    ],
    "function_call": [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ],
}  # fmt: skip


# --- translating requests -------------------------------------------------------------------------------------------
def test_a_string_input_after_instructions_is_a_system_then_a_user_message() -> None:
    body = {"instructions": "be brief", "input": "add 2 and 3", "tools": TOOLS, "tool_choice": "required"}
    assert responses_to_chat(body) == (
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add 2 and 3"}],
        CHAT_TOOLS,
        "required",
    )
    assert responses_to_chat({"input": "hi", "tools": []}) == ([{"role": "user", "content": "hi"}], None, None)


def test_calls_join_the_assistant_turn_before_them_and_outputs_become_tool_messages() -> None:
    call = {"type": "function_call", "name": "add", "arguments": '{"a":2,"b":3}'}
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "add 2 and 3, "},
                                     {"type": "input_text", "text": "twice"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "sure"}]},
        call | {"call_id": "call_1"},
        call | {"call_id": "call_2", "id": "fc_2", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "5"}]},
        call | {"call_id": "call_3"},
    ]  # fmt: skip
    messages, tools, tool_choice = responses_to_chat({"input": items})
    function = {"name": "add", "arguments": '{"a":2,"b":3}'}
    assert messages == [
        {"role": "user", "content": "add 2 and 3, twice"},
        {
            "role": "assistant",
            "content": "sure",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": function},
                {"id": "call_2", "type": "function", "function": function},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_3", "type": "function", "function": function}]},
    ]  # fmt: skip
    assert (tools, tool_choice) == (None, None)


def test_chat_request_of_maps_the_sampling_fields() -> None:
    body = {
        "model": "tiny-gpt", "input": "hi", "temperature": 0, "max_output_tokens": 7, "parallel_tool_calls": False,
        "return_token_ids": True, "include": ["message.output_text.logprobs"], "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "add"},
    }  # fmt: skip
    assert chat_request_of(body) == {
        "model": "tiny-gpt", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 7,
        "parallel_tool_calls": False, "return_token_ids": True, "logprobs": True, "tools": CHAT_TOOLS,
        "tool_choice": {"type": "function", "name": "add"},
    }  # fmt: skip
    plain = chat_request_of({"input": "hi"})
    assert (plain["max_tokens"], plain["logprobs"], plain["return_token_ids"]) == (None, False, False)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({}, "input must be a string or a non-empty list"),
        ({"input": []}, "input must be a string or a non-empty list"),
        ({"input": ["hi"]}, r"input\[0\] must be an object, not str"),
        ({"input": [{"role": "robot", "content": "hi"}]}, r"input\[0\] has role 'robot'"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "reads text only"),
        ({"input": [{"role": "user", "content": 3}]}, r"input\[0\].content must be a string or a list"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "a 'reasoning' item; the policy server reads only"),
        ({"input": [{"type": "function_call", "name": "add", "arguments": "{}"}]}, "needs a string 'call_id'"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": {"sum": 5}}]}, "output must be"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "built-in tool 'web_search'; the policy server runs none"),
        ({"input": "hi", "tools": [{"type": "function"}]}, r"tools\[0\] has no function name"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "keeps no responses; send the whole transcript"),
        ({"input": "hi", "instructions": ["be brief"]}, "instructions must be a string"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens must be a positive integer"),
        ({"input": "hi", "temperature": "hot"}, "temperature must be a number"),
        ({"input": "hi", "include": "message.output_text.logprobs"}, "include must be a list"),
    ],
)
def test_malformed_requests_say_what_is_wrong(body: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chat_request_of(body)


def _completion(message: dict[str, Any], finish_reason: str, *, ids: bool = True) -> dict[str, Any]:
    choice = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None, "token_ids": [7, 8]}
    completion: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "tiny-gpt",
        "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }  # fmt: skip
    if ids:
        completion["prompt_token_ids"] = [1, 2, 3]
    return completion


def test_a_cut_reply_is_incomplete_and_a_reply_with_calls_lists_text_then_calls() -> None:
    cut = chat_choice_to_response(_completion({"role": "assistant", "content": "hel"}, "length"), {}, None)
    assert (cut["status"], cut["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert [item["content"][0]["text"] for item in cut["output"]] == ["hel"]
    assert (cut["prompt_token_ids"], cut["token_ids"]) == ([1, 2, 3], [7, 8])
    assert cut["usage"] | {"input_tokens_details": None, "output_tokens_details": None} == {
        "input_tokens": 3, "output_tokens": 2, "total_tokens": 5,
        "input_tokens_details": None, "output_tokens_details": None,
    }  # fmt: skip
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    message = {"role": "assistant", "content": "let me add", "tool_calls": [call]}
    # The call's budget ran out right at its end: the call is whole, so the response is completed.
    both = chat_choice_to_response(_completion(message, "tool_calls", ids=False), {"tools": TOOLS}, CHAT_TOOLS)
    assert both["status"] == "completed" and both["incomplete_details"] is None
    assert [item["type"] for item in both["output"]] == ["message", "function_call"]
    assert {k: both["output"][1][k] for k in ("call_id", "name", "arguments", "status")} == {
        "call_id": "call_1", "name": "add", "arguments": "{}", "status": "completed"
    }  # fmt: skip
    assert both["tools"][0] == {"type": "function", "name": "add", "description": "Add two numbers.",
                                "parameters": ADD_SCHEMA, "strict": None}  # fmt: skip
    assert "prompt_token_ids" not in both and "token_ids" not in both
    types = [e["type"] for e in response_events(both)]
    assert types == [
        "response.created", "response.in_progress", *STREAM_TYPES["message"], *STREAM_TYPES["function_call"],
        "response.completed",
    ]  # fmt: skip
    assert [e["type"] for e in response_events(cut)][-1] == "response.incomplete"
    assert [e["sequence_number"] for e in response_events(cut)] == list(range(len(response_events(cut))))


# --- the policy server ----------------------------------------------------------------------------------------------
def _policy(*reply: str, adapters: tuple[str, ...] = ()) -> Policy:
    """A tiny GPT that can say only the ``reply`` words (one token each)."""
    return Policy.build(PolicySpec(words=("add", "search", *reply), reply_words=reply, adapters=adapters), seed=0)


@pytest.fixture
def call_server() -> Iterator[tuple[Policy, openai.OpenAI]]:
    """A served policy whose every token is the call add(a=2, b=3), and an OpenAI client of it."""
    policy = _policy(CALL)
    with serve_policy(policy) as url, openai.OpenAI(base_url=url, api_key="k", max_retries=0) as client:
        yield policy, client


def test_sdk_reads_a_function_call_with_the_sampled_token_ids(call_server: tuple[Policy, openai.OpenAI]) -> None:
    policy, client = call_server
    raw = client.responses.with_raw_response.create(
        model="tiny-gpt", input="add 2 and 3", tools=TOOLS, max_output_tokens=1, extra_body={"return_token_ids": True}
    )
    assert raw.headers[HEADER_POLICY_VERSION] == "0"
    response = raw.parse()
    assert response.status == "completed" and response.model == "tiny-gpt" and response.id.startswith("resp_")
    [call] = response.output
    assert call.type == "function_call" and call.call_id.startswith("call_") and (call.id or "").startswith("fc_")
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 2, "b": 3})
    extra = response.model_extra or {}
    assert extra["token_ids"] == policy.tokenizer.encode(CALL)
    assert extra["prompt_token_ids"] == policy.tokenizer.encode_chat(MESSAGES, CHAT_TOOLS)
    assert response.usage is not None and (response.usage.input_tokens, response.usage.output_tokens) == (
        len(extra["prompt_token_ids"]), 1
    )  # fmt: skip

    # The next turn sends the call back with its output: the prompt is the chat transcript of the same turns.
    turns: list[Any] = [
        {"role": "user", "content": "add 2 and 3"},
        call.model_dump(exclude_none=True),  # the item as the SDK parsed it, id and status included
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
    ]
    follow_up = client.responses.create(
        model="tiny-gpt", input=turns, tools=TOOLS, max_output_tokens=1, extra_body={"return_token_ids": True}
    )
    transcript = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": "add", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "5"},
    ]  # fmt: skip
    assert (follow_up.model_extra or {})["prompt_token_ids"] == policy.tokenizer.encode_chat(transcript, CHAT_TOOLS)
    assert "token_ids" not in (client.responses.create(model="tiny-gpt", input="hi", tools=TOOLS).model_extra or {})

    # A named choice in the Responses shape allows only that tool: the call of add is then text, cut at 1 token.
    named = client.responses.create(
        model="tiny-gpt", input="add 2 and 3", tools=TOOLS, max_output_tokens=1,
        tool_choice={"type": "function", "name": "search"},
    )  # fmt: skip
    assert (named.output_text, named.status) == (CALL, "incomplete")
    assert named.incomplete_details is not None and named.incomplete_details.reason == "max_output_tokens"


def test_a_streamed_function_call_comes_as_openai_events(call_server: tuple[Policy, openai.OpenAI]) -> None:
    policy, client = call_server
    events = list(
        client.responses.create(
            model="tiny-gpt", input="add 2 and 3", tools=TOOLS, max_output_tokens=2, stream=True,
            extra_body={"return_token_ids": True},
        )
    )  # fmt: skip
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", *STREAM_TYPES["function_call"] * 2, "response.completed"
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert [json.loads(d.delta) for d in deltas] == [{"a": 2, "b": 3}] * 2
    final = events[-1]
    assert final.type == "response.completed"
    assert [(c.type, getattr(c, "name", None)) for c in final.response.output] == [("function_call", "add")] * 2
    assert (final.response.model_extra or {})["token_ids"] == policy.tokenizer.encode(CALL) * 2
    # The SDK's stream helper assembles the same response from the events.
    with client.responses.stream(model="tiny-gpt", input="add 2 and 3", tools=TOOLS, max_output_tokens=1) as stream:
        assembled = stream.get_final_response()
    [call] = assembled.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"a": 2, "b": 3}


def test_a_text_reply_is_output_text_and_a_cut_one_is_incomplete() -> None:
    policy = _policy("hello", "<|end|>")
    with serve_policy(policy) as url, openai.OpenAI(base_url=url, api_key="k", max_retries=0) as client:
        # Sampled replies: some stop at once (an empty text is still a message), some say hello first.
        replies = [
            client.responses.create(
                model="tiny-gpt", input="greet", instructions="be kind", max_output_tokens=64, temperature=1.0,
                include=["message.output_text.logprobs"], extra_body={"return_token_ids": True},
            )
            for _ in range(6)
        ]  # fmt: skip
    assert any(r.output_text for r in replies)
    prompt = [{"role": "system", "content": "be kind"}, {"role": "user", "content": "greet"}]
    for done in replies:
        assert done.status == "completed" and set(done.output_text.split("hello")) == {""}
        [message] = done.output
        assert message.type == "message" and message.status == "completed"
        [part] = message.content
        extra = done.model_extra or {}
        # The text is the sampled ids' decode: its logprobs line up with those ids, the end token included.
        assert part.type == "output_text" and len(part.logprobs or []) == len(extra["token_ids"])
        assert policy.tokenizer.decode(extra["token_ids"]) == done.output_text
        assert extra["token_ids"][-1] == policy.tokenizer.eos_id
        assert extra["prompt_token_ids"] == policy.tokenizer.encode_chat(prompt)

    with serve_policy(_policy("hello")) as url, openai.OpenAI(base_url=url, api_key="k", max_retries=0) as client:
        cut = client.responses.create(model="tiny-gpt", input="greet", max_output_tokens=2)
        stream = list(client.responses.create(model="tiny-gpt", input="greet", max_output_tokens=2, stream=True))
    assert (cut.status, cut.output_text) == ("incomplete", "hellohello") and cut.incomplete_details is not None
    assert [e.type for e in stream] == [
        "response.created", "response.in_progress", *STREAM_TYPES["message"], "response.incomplete"
    ]  # fmt: skip
    deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert deltas == cut.output_text and stream[-1].type == "response.incomplete"
    assert stream[-1].response.output_text == cut.output_text


def test_agent_model_names_and_bad_requests_are_answered_as_chat_answers_them() -> None:
    policy = _policy(CALL, adapters=("solver",))
    with serve_policy(policy) as url, openai.OpenAI(base_url=url, api_key="k", max_retries=0) as client:
        own = client.responses.create(model="tiny-gpt@solver", input="add 2 and 3", tools=TOOLS, max_output_tokens=1)
        assert own.model == "tiny-gpt@solver" and own.output[0].type == "function_call"
        with pytest.raises(openai.NotFoundError, match="'gpt-4o' is not served here") as missing:
            client.responses.create(model="gpt-4o", input="hi")
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError, match="built-in tool 'web_search'") as bad:
            client.responses.create(model="tiny-gpt", input="hi", tools=[{"type": "web_search"}])
        assert bad.value.code == "invalid_request"
        with pytest.raises(openai.BadRequestError, match="not among the tools") as choice:
            client.responses.create(
                model="tiny-gpt", input="hi", tools=TOOLS, tool_choice={"type": "function", "name": "mul"}
            )
        assert choice.value.code == "invalid_tool_choice"
        not_json = httpx.post(url + "/responses", content=b"{", headers={"content-type": "application/json"})
        assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"


def test_the_llm_proxy_records_token_ids_and_calls_of_streamed_and_whole_responses() -> None:
    store = InMemoryLightningStore()
    policy = _policy(CALL)

    rollout_id, attempt_id = claimed_attempt(store)
    with serve_policy(policy) as url, ProxyServer(store, url) as proxy:
        with openai.OpenAI(base_url=proxy.url_for(rollout_id, attempt_id), api_key="k", max_retries=0) as client:
            events = list(
                client.responses.create(
                    model="tiny-gpt", input="add 2 and 3", tools=TOOLS, max_output_tokens=1, stream=True
                )
            )
            completed = events[-1]
            assert completed.type == "response.completed"
            whole = client.responses.create(model="tiny-gpt", input="add 2 and 3", tools=TOOLS, max_output_tokens=1)
        proxy.flush()
    # The proxy asked for the ids, recorded them and took them off what the agent sees.
    for response in (completed.response, whole):
        assert not {"prompt_token_ids", "token_ids"} & set(response.model_extra or {})
    call_ids = [c.call_id for r in (completed.response, whole) for c in r.output if c.type == "function_call"]
    spans = sorted(asyncio.run(store.query_spans(rollout_id)), key=lambda s: s.start_time)
    assert len(spans) == 2
    for span, call_id in zip(spans, call_ids, strict=True):
        attrs = span.attributes
        [message] = json.loads(str(attrs[sc.GEN_AI_OUTPUT_MESSAGES]))
        assert message["content"] is None and message["finish_reason"] == "tool_calls"
        [call] = message["tool_calls"]
        assert call["id"] == call_id and call["function"]["name"] == "add"
        assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
        assert attrs[sc.RESPONSE_TOKEN_IDS] == policy.tokenizer.encode(CALL)
        assert attrs[sc.PROMPT_TOKEN_IDS] == policy.tokenizer.encode_chat(MESSAGES, CHAT_TOOLS)
        assert attrs[sc.POLICY_VERSION] == 0 and attrs[sc.GEN_AI_RESPONSE_MODEL] == "tiny-gpt"
        assert json.loads(str(attrs[sc.GEN_AI_INPUT_MESSAGES])) == MESSAGES


def test_an_openai_agents_sdk_agent_calls_its_tool_through_the_responses_api(
    call_server: tuple[Policy, openai.OpenAI],
) -> None:
    agents = pytest.importorskip("agents")
    _, client = call_server
    calls: list[tuple[int, int]] = []

    @agents.function_tool
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        calls.append((a, b))
        return str(a + b)

    async def run(streamed: bool) -> str:
        async with openai.AsyncOpenAI(base_url=str(client.base_url), api_key="k", max_retries=0) as aclient:
            agent = agents.Agent(
                name="adder", instructions="add", tools=[add], tool_use_behavior="stop_on_first_tool",
                model=agents.OpenAIResponsesModel(model="tiny-gpt", openai_client=aclient),
                model_settings=agents.ModelSettings(max_tokens=1),
            )  # fmt: skip
            config = agents.RunConfig(tracing_disabled=True)
            if not streamed:
                return str((await agents.Runner.run(agent, "add 2 and 3", run_config=config)).final_output)
            result = agents.Runner.run_streamed(agent, "add 2 and 3", run_config=config)
            async for _ in result.stream_events():
                pass
            return str(result.final_output)

    assert [asyncio.run(run(False)), asyncio.run(run(True))] == ["5", "5"]
    assert calls == [(2, 3), (2, 3)]


# --- guided calls ---------------------------------------------------------------------------------------------------
def test_required_tool_choice_is_a_guided_call_of_an_allowed_tool(tmp_path: Any) -> None:
    """A random 2-layer Llama with a byte-level BPE tokenizer (calls are many tokens) must still answer with a call."""
    corpus = ['<tool_call>\n{"name": "', "clock search", GUIDED_NAME_END + "}}"]
    build_bpe_llama(tmp_path, corpus)
    policy = Policy.build(PolicySpec(kind="hf", hf_model=str(tmp_path), model_name="bpe-llama"))
    no_args: list[Any] = [
        {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
        for name in ("clock", "search")
    ]
    with serve_policy(policy) as url, openai.OpenAI(base_url=url, api_key="k", max_retries=0) as client:
        choices: list[tuple[Any, set[str]]] = [
            ("required", {"clock", "search"}),
            ({"type": "function", "name": "search"}, {"search"}),
        ]
        for tool_choice, names in choices:
            for _ in range(3):
                response = client.responses.create(
                    model="bpe-llama", input="what time is it", tools=no_args, tool_choice=tool_choice,
                    max_output_tokens=40, temperature=1.0,
                )  # fmt: skip
                [call] = response.output
                assert call.type == "function_call" and call.name in names and json.loads(call.arguments) == {}
                assert response.status == "completed"
