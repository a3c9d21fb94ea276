"""Tool calls in the Hermes format: validation, rendering, parsing, and the policy server serving them end to end."""

from __future__ import annotations

import asyncio
import json
import re
import string
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import given, settings, strategies as st

from agentlightning import semconv as sc
from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.tool_calls import (
    format_tool_call,
    messages_for_plain_template,
    parse_tool_calls,
    tool_choice_names,
    tool_system_block,
    validate_tools,
)
from agentlightning_trainer.torch_backend.policy import Policy
from agentlightning_trainer.torch_backend.tokenizer import WordCharTokenizer
from tests.trainer.conftest import claimed_attempt, serve_policy

ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": ADD_SCHEMA}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
]
CALL = format_tool_call("add", {"a": 2, "b": 3}, compact=True)
MESSAGES: list[Any] = [{"role": "user", "content": "add 2 and 3"}]
ID = re.compile(r"^call_[0-9a-f]{24}$")


# --- validate_tools -------------------------------------------------------------------------------------------------
def test_validate_tools_keeps_chat_shape_and_normalises_the_responses_shape() -> None:
    assert validate_tools(TOOLS) == TOOLS
    flat = [{"type": "function", "name": "add", "description": "Add two numbers.", "parameters": ADD_SCHEMA}]
    assert validate_tools(flat) == TOOLS[:1]
    assert validate_tools([]) == []


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ({"type": "function"}, "must be a list"),
        (["add"], r"tools\[0\] must be an object"),
        ([{"type": "function", "function": {"description": "no name"}}], r"tools\[0\] has no function name"),
        ([{"type": "function", "function": {"name": "  "}}], r"tools\[0\] has no function name"),
        ([TOOLS[0], {"type": "function", "name": "add"}], r"tools\[1\] repeats the name 'add'"),
        ([{"type": "retrieval", "name": "x"}], "serves only 'function' tools"),
        ([{"type": "function", "name": "add", "parameters": {"type": "objec"}}], "tool 'add' .* not a valid JSON"),
        ([{"type": "function", "name": "add", "parameters": ["a"]}], "tool 'add' has parameters"),
    ],
)
def test_validate_tools_names_the_bad_tool(tools: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_tools(tools)


def test_tool_choice_names() -> None:
    assert tool_choice_names(None, TOOLS) == tool_choice_names("auto", TOOLS) == ["add", "search"]
    assert tool_choice_names("required", TOOLS) == ["add", "search"]
    assert tool_choice_names("none", TOOLS) is None and tool_choice_names("auto", []) is None
    assert tool_choice_names({"type": "function", "function": {"name": "search"}}, TOOLS) == ["search"]
    assert tool_choice_names({"type": "function", "name": "add"}, TOOLS) == ["add"]
    with pytest.raises(ValueError, match="'mul', which is not among the tools"):
        tool_choice_names({"type": "function", "function": {"name": "mul"}}, TOOLS)
    with pytest.raises(ValueError, match="needs tools"):
        tool_choice_names("required", [])
    with pytest.raises(ValueError, match="is not one of"):
        tool_choice_names("always", TOOLS)


# --- rendering ------------------------------------------------------------------------------------------------------
def test_tool_system_block_is_the_documented_hermes_block() -> None:
    block = tool_system_block(validate_tools(TOOLS[1:]))
    assert block == (
        "You can call these tools:\n<tools>\n"
        '{"name": "search", "parameters": {"type": "object"}}\n</tools>\n'
        "To call one, reply with:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    assert format_tool_call("add", '{"a": 1}') == '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'


def test_messages_for_plain_template_render_tool_turns_as_text() -> None:
    transcript: list[Any] = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": "add 2 and 3, then search"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
                {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "nothing"}]},
        {"role": "assistant", "content": "it is 5"},
    ]
    before = json.dumps(transcript)
    out = messages_for_plain_template(transcript, validate_tools(TOOLS))
    assert json.dumps(transcript) == before  # the caller's messages are not changed
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[0]["content"] == "be brief\n\n" + tool_system_block(validate_tools(TOOLS))
    assert out[2] == {
        "role": "assistant",
        "content": format_tool_call("add", {"a": 2, "b": 3}) + "\n" + format_tool_call("search", {}),
    }
    assert out[3]["content"] == "<tool_response>\n5\n</tool_response>\n<tool_response>\nnothing\n</tool_response>"
    assert out[4] == transcript[5]
    no_system = messages_for_plain_template(MESSAGES, validate_tools(TOOLS))
    assert no_system == [{"role": "system", "content": tool_system_block(validate_tools(TOOLS))}, *MESSAGES]
    assert messages_for_plain_template(transcript, None)[0] == transcript[0]


# --- parsing --------------------------------------------------------------------------------------------------------
def _calls(reply: str, names: tuple[str, ...] = ("add", "search")) -> tuple[str | None, list[tuple[str, Any]]]:
    content, calls = parse_tool_calls(reply, names)
    for call in calls:
        assert ID.match(call["id"]) and call["type"] == "function"
        arguments = json.loads(call["function"]["arguments"])
        assert call["function"]["arguments"] == json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_parse_a_call_and_the_content_around_it() -> None:
    assert _calls('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>') == (
        None,
        [("add", {"a": 2, "b": 3})],
    )
    reply = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>  '
    assert _calls(reply) == ("Let me add.", [("add", {"a": 1})])
    assert _calls("no call here") == ("no call here", [])


def test_parse_several_calls_string_arguments_and_a_missing_close_tag() -> None:
    reply = (
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"q": "</tool_call> inside a string"}}</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {}}\n'
    )
    assert _calls(reply) == (None, [("add", {"a": 1}), ("search", {"q": "</tool_call> inside a string"}), ("add", {})])


@pytest.mark.parametrize(
    "reply",
    [
        'x <tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',  # bad JSON
        '<tool_call>{"name": "mul", "arguments": {}}</tool_call>',  # unknown name
        '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "add", "arguments": "[1]"}</tool_call>',  # a JSON string that is no object
        '<tool_call>{"name": "add"}</tool_call>',  # no arguments
        '<tool_call>{"name": "add", "arguments": {"a": NaN}}</tool_call>',  # not JSON
        '<tool_call>{"name": "add", "arguments": {}} and more</tool_call>',  # text after the JSON
        '<tool_call>["add", {}]</tool_call>',
        '<tool_call>{"name": "add", "arguments": {}}</tool_call><tool_call>oops',  # one good, one broken
        "<tool_call>" + "[" * 100_000,  # deeper than the JSON decoder's recursion limit
    ],
)
def test_a_malformed_block_makes_the_whole_reply_content(reply: str) -> None:
    assert parse_tool_calls(reply, ["add"]) == (reply, [])


_FRAGMENTS = st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"name"', '"add"', ":", ",", '"arguments"', " "])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(_FRAGMENTS | st.text(max_size=3)).map("".join)))
def test_parse_never_raises(text: str) -> None:
    content, calls = parse_tool_calls(text, ["add"])
    assert calls or content == text


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["add", "search"]), st.dictionaries(st.text(), _JSON, max_size=4)), min_size=1),
    st.text(string.ascii_letters + " ", max_size=20),
    st.booleans(),
)
def test_rendered_calls_parse_back(calls: list[tuple[str, dict[str, Any]]], prefix: str, compact: bool) -> None:
    reply = prefix + "".join(format_tool_call(name, args, compact=compact) for name, args in calls)
    assert _calls(reply) == (prefix.strip() or None, calls)


# --- tokenizers -----------------------------------------------------------------------------------------------------
def test_word_char_tokenizer_renders_tools_compactly_and_keeps_plain_chats() -> None:
    tokenizer = WordCharTokenizer(["add", "search", CALL])
    plain: list[Any] = [{"role": "system", "content": "s"}, *MESSAGES]
    assert tokenizer.render_chat(plain) == "<|bos|><|system|>s<|end|><|user|>add 2 and 3<|end|><|assistant|>"
    assert tokenizer.encode_chat(plain, None) == tokenizer.encode_chat(plain)
    transcript: list[Any] = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
        },
        {"role": "tool", "content": "5"},
    ]
    rendered = tokenizer.render_chat(transcript, validate_tools(TOOLS))
    assert rendered == (
        f"<|bos|><|system|>tools: add, search<|end|><|user|>add 2 and 3<|end|><|assistant|>{CALL}<|end|>"
        "<|user|>5<|end|><|assistant|>"
    )
    assert len(tokenizer.encode(CALL)) == 1  # a whole call is one token of the tiny GPT: it can learn to emit it


def _char_tokenizer(template: str, *, special_tags: bool) -> Any:
    """A character-level HF tokenizer built in code: its ids decode back to exactly the rendered prompt."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *chars])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    if special_tags:  # as Hermes 2 Pro's tokenizer has them: decode(skip_special_tokens=True) would drop them
        tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    tokenizer.chat_template = template
    return tokenizer


PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
TOOL_TEMPLATE = (  # transformers renders with trim_blocks: a newline right after a block tag is dropped
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}"
    "{{ '\\n' }}{% endfor %}assistant:"
)
TRANSCRIPT: list[Any] = [
    *MESSAGES,
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 2}'}}]},
    {"role": "tool", "content": "5"},
]


@pytest.mark.parametrize("special_tags", [False, True])
def test_hf_tokenizer_without_tool_support_gets_the_hermes_block(special_tags: bool) -> None:
    from agentlightning_trainer.torch_backend.hf_tokenizer import HFChatTokenizer

    tokenizer = HFChatTokenizer(_char_tokenizer(PLAIN_TEMPLATE, special_tags=special_tags))
    assert not tokenizer.supports_tools and tokenizer.tool_tags_are_special() == special_tags
    tools = validate_tools(TOOLS)
    rendered = tokenizer.decode(tokenizer.encode_chat(TRANSCRIPT, tools), skip_special=False)
    assert rendered == (
        f"system: {tool_system_block(tools)}\nuser: add 2 and 3\n"
        f"assistant: {format_tool_call('add', {'a': 2})}\nuser: <tool_response>\n5\n</tool_response>\nassistant:"
    )
    # Without tools the transcript's tool turns still render (a plain template cannot show "tool_calls").
    assert tokenizer.decode(tokenizer.encode_chat(TRANSCRIPT), skip_special=False).startswith("user: add 2 and 3\n")
    assert tokenizer.encode_chat(MESSAGES) == tokenizer.encode_chat(MESSAGES, None)
    # Decoding keeps the tags even when they are special tokens: the server parses the decoded text.
    reply = [*tokenizer.encode(f"ok {CALL}"), tokenizer.eos_id]
    assert tokenizer.decode(reply) == f"ok {CALL}"
    assert parse_tool_calls(tokenizer.decode(reply), ["add"])[1][0]["function"]["arguments"] == '{"a":2,"b":3}'


def test_hf_tokenizer_with_tool_support_hands_tools_to_the_template() -> None:
    from agentlightning_trainer.torch_backend.hf_tokenizer import HFChatTokenizer

    tokenizer = HFChatTokenizer(_char_tokenizer(TOOL_TEMPLATE, special_tags=False))
    assert tokenizer.supports_tools
    rendered = tokenizer.decode(tokenizer.encode_chat(TRANSCRIPT, validate_tools(TOOLS)), skip_special=False)
    # The template got the tools, and the call's arguments as an object (tojson of a string would quote it).
    assert rendered == 'tools: add search\nuser: add 2 and 3\nassistant: [add {"a": 2}]\ntool: 5\nassistant:'
    assert tokenizer.decode(tokenizer.encode_chat(MESSAGES), skip_special=False) == "user: add 2 and 3\nassistant:"


# --- the policy server ----------------------------------------------------------------------------------------------
def _policy(reply: str) -> Policy:
    """A tiny GPT that can say only ``reply`` (one token): every sample is that reply, repeated up to max_tokens."""
    return Policy.build(PolicySpec(words=("add", "search", reply), reply_words=(reply,)), seed=0)


@pytest.fixture
def call_server() -> Iterator[tuple[Policy, openai.OpenAI]]:
    """A served policy whose every token is the call add(a=2, b=3), and an OpenAI client of it."""
    policy = _policy(CALL)
    with serve_policy(policy) as url, openai.OpenAI(base_url=url, api_key="k") as client:
        yield policy, client


def test_sdk_sees_tool_calls_and_the_sampled_token_ids(call_server: tuple[Policy, openai.OpenAI]) -> None:
    policy, client = call_server
    completion = client.chat.completions.create(
        model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=1, extra_body={"return_token_ids": True}
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and ID.match(call.id)
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
    assert (choice.model_extra or {})["token_ids"] == policy.tokenizer.encode(CALL)
    assert (completion.model_extra or {})["prompt_token_ids"] == policy.tokenizer.encode_chat(MESSAGES, TOOLS)

    two = client.chat.completions.create(model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=2, n=2)
    assert all(len(c.message.tool_calls or []) == 2 for c in two.choices)
    one = client.chat.completions.create(
        model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=2, parallel_tool_calls=False
    )
    assert len(one.choices[0].message.tool_calls or []) == 1

    # tool_choice "none": no tools in the prompt, the reply stays text; a named choice accepts only that tool.
    none = client.chat.completions.create(
        model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=1, tool_choice="none"
    )
    assert (none.choices[0].message.content, none.choices[0].finish_reason) == (CALL, "length")
    named = client.chat.completions.create(
        model="tiny-gpt",
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=1,
        tool_choice={"type": "function", "function": {"name": "search"}},
    )
    assert named.choices[0].message.content == CALL and not named.choices[0].message.tool_calls


def test_streamed_tool_calls_come_as_openai_chunks(call_server: tuple[Policy, openai.OpenAI]) -> None:
    policy, client = call_server
    stream = client.chat.completions.create(
        model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=1, stream=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    chunks = list(stream)
    assert (chunks[0].model_extra or {})["prompt_token_ids"] == policy.tokenizer.encode_chat(MESSAGES, TOOLS)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    head, args = deltas[1].tool_calls or [], deltas[2].tool_calls or []
    assert head[0].index == 0 and head[0].function is not None and head[0].function.name == "add"
    assert head[0].function.arguments == "" and head[0].id is not None and ID.match(head[0].id)
    assert args[0].function is not None and json.loads(args[0].function.arguments or "") == {"a": 2, "b": 3}
    last = [c for c in chunks if c.choices][-1].choices[0]
    assert last.finish_reason == "tool_calls" and (last.model_extra or {})["token_ids"] == policy.tokenizer.encode(CALL)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 1
    with client.chat.completions.stream(model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=1) as helper:
        final = helper.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}


def test_a_malformed_call_is_plain_text_and_bad_tools_are_a_400() -> None:
    bad = '<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>'
    with serve_policy(_policy(bad)) as url, openai.OpenAI(base_url=url, api_key="k") as client:
        completion = client.chat.completions.create(model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=1)
        assert completion.choices[0].message.content == bad and not completion.choices[0].message.tool_calls
        assert completion.choices[0].finish_reason == "length"
        broken: list[Any] = [{"type": "function", "function": {"name": "add", "parameters": {"type": 3}}}]
        with pytest.raises(openai.BadRequestError, match="tool 'add' has parameters") as error:
            client.chat.completions.create(model="tiny-gpt", messages=MESSAGES, tools=broken)
        assert error.value.code == "invalid_tools"
        with pytest.raises(openai.BadRequestError, match="not among the tools") as error:
            client.chat.completions.create(
                model="tiny-gpt",
                messages=MESSAGES,
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "mul"}},
            )
        assert error.value.code == "invalid_tool_choice"


def test_the_llm_proxy_records_tool_calls_of_streamed_and_whole_answers() -> None:
    store = InMemoryLightningStore()
    policy = _policy(CALL)

    rollout_id, attempt_id = claimed_attempt(store)
    with serve_policy(policy) as url, ProxyServer(store, url) as proxy:
        with openai.OpenAI(base_url=proxy.url_for(rollout_id, attempt_id), api_key="k") as client:
            streamed = client.chat.completions.create(
                model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=1, stream=True
            )
            ids = [d.id for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or [] if d.id]
            whole = client.chat.completions.create(model="tiny-gpt", messages=MESSAGES, tools=TOOLS, max_tokens=1)
            ids += [c.id for c in whole.choices[0].message.tool_calls or []]
        proxy.flush()
    spans = asyncio.run(store.query_spans(rollout_id))
    assert len(spans) == 2
    for span, call_id in zip(sorted(spans, key=lambda s: s.start_time), ids, strict=True):
        attrs = span.attributes
        [message] = json.loads(str(attrs[sc.GEN_AI_OUTPUT_MESSAGES]))
        assert message["content"] is None and message["finish_reason"] == "tool_calls"
        [call] = message["tool_calls"]
        assert call["id"] == call_id and call["function"]["name"] == "add"
        assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
        assert attrs[sc.RESPONSE_TOKEN_IDS] == policy.tokenizer.encode(CALL)
        assert attrs[sc.PROMPT_TOKEN_IDS] == policy.tokenizer.encode_chat(MESSAGES, TOOLS)
        assert json.loads(str(attrs[sc.GEN_AI_TOOL_DEFINITIONS])) == TOOLS
