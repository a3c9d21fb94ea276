"""Guided tool calls: with tool_choice "required" or a named function the policy server fixes the call's frame and
the model picks the function (and writes its arguments), as vLLM's guided decoding does.

The model is a 2-layer Llama built from a config with a byte-level BPE tokenizer trained here (no download), so tool
calls are ordinary multi-token text as they are for SmolLM2.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.tool_calls import GUIDED_CALL_OPEN, GUIDED_NAME_END
from agentlightning_trainer.torch_backend.guided import Guide, JsonDepth
from agentlightning_trainer.torch_backend.policy import Policy
from tests.trainer.conftest import build_bpe_llama, serve_policy

transformers: Any = pytest.importorskip("transformers")
tokenizers: Any = pytest.importorskip("tokenizers")

NO_ARGS = {"type": "object", "properties": {}}
TOOLS = [
    {"type": "function", "function": {"name": "calculator", "description": "arithmetic", "parameters": NO_ARGS}},
    {"type": "function", "function": {"name": "calendar", "description": "dates", "parameters": NO_ARGS}},
    {"type": "function", "function": {"name": "search", "description": "the web", "parameters": NO_ARGS}},
]
WITH_ARGS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        },
    }
]
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def bpe_llama(tmp_path_factory: pytest.TempPathFactory) -> Policy:
    """A random 2-layer Llama whose byte-level BPE tokenizer splits tool names into several tokens."""
    # "cal" is learnt as a token but not the whole names, so calculator and calendar share their first token.
    corpus = [GUIDED_CALL_OPEN, "cal culator endar search add", '", "arguments": {}}', "what is 2 plus 2"]
    path = build_bpe_llama(tmp_path_factory.mktemp("bpe-llama"), corpus)
    return Policy.build(PolicySpec(kind="hf", hf_model=str(path), model_name="bpe-llama"))


def test_json_depth_ignores_braces_inside_strings() -> None:
    depth = JsonDepth()
    assert not depth.feed('"a": "}{\\"}", "b": [1, {"c": 2}]')
    assert depth.feed("}")
    assert JsonDepth().feed('"x": 1}, junk')


def test_guided_generation_spells_one_choice_and_stops_where_a_whole_choice_ends(bpe_llama: Policy) -> None:
    tok = bpe_llama.tokenizer
    choices = tuple(tuple(tok.encode(n + GUIDED_NAME_END + "}")) for n in ("calculator", "calendar", "search"))
    assert any(a[0] == b[0] for a in choices for b in choices if a is not b)  # the trie must branch after token 1
    guide = Guide(choices, close_json=True, complete=frozenset(range(3)))
    prompt = tok.encode("what is 2 plus 2") + tok.encode(GUIDED_CALL_OPEN)
    for temperature in (0.0, 1.0):
        gens = bpe_llama.generate(
            [prompt] * 16, temperatures=[temperature] * 16, max_new_tokens=[40] * 16, guides=[guide] * 16
        )
        for g in gens:
            assert tuple(g.token_ids) in choices and g.json_closed and g.finish_reason == "stop"
            assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0.0 for lp in g.logprobs)
    with pytest.raises(ValueError, match="prefix"):
        Guide(((1, 2), (1, 2, 3)))


@contextlib.contextmanager
def _serve(policy: Policy) -> Iterator[openai.OpenAI]:
    with serve_policy(policy) as url, openai.OpenAI(base_url=url, api_key="x", max_retries=0) as client:
        yield client


def test_required_tool_choice_always_returns_a_call_with_the_sampled_ids(bpe_llama: Policy) -> None:
    tok = bpe_llama.tokenizer
    with _serve(bpe_llama) as client:
        for stream in (False, True):
            kwargs: dict[str, Any] = {
                "model": "bpe-llama", "messages": [{"role": "user", "content": "what is 2 plus 2"}],
                "tools": TOOLS, "tool_choice": "required", "n": 6, "max_tokens": 40,
                "extra_body": {"return_token_ids": True},
            }  # fmt: skip
            if not stream:
                reply = client.chat.completions.create(**kwargs).model_dump()
                prompt_ids = reply["prompt_token_ids"]
                choices = reply["choices"]
                for c in choices:
                    assert c["finish_reason"] == "tool_calls"
                    (call,) = c["message"]["tool_calls"]
                    assert call["function"]["name"] in {"calculator", "calendar", "search"}
                    assert json.loads(call["function"]["arguments"]) == {}
                    # What was sampled: the name and the frame's middle; the opening was a prefill in the prompt.
                    assert tok.decode(c["token_ids"]) == call["function"]["name"] + GUIDED_NAME_END + "}"
                assert prompt_ids[-len(tok.encode(GUIDED_CALL_OPEN)) :] == tok.encode(GUIDED_CALL_OPEN)
            else:
                names = set()
                for chunk in client.chat.completions.create(stream=True, **kwargs):
                    for choice in chunk.choices:
                        for delta in choice.delta.tool_calls or []:
                            if delta.function is not None and delta.function.name:
                                names.add(delta.function.name)
                assert names and names <= {"calculator", "calendar", "search"}
        named = client.chat.completions.create(
            model="bpe-llama", messages=[{"role": "user", "content": "what is 2 plus 2"}], tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "search"}}, n=4, max_tokens=40,
        )  # fmt: skip
        assert {c.message.tool_calls[0].function.name for c in named.choices if c.message.tool_calls} == {"search"}


def test_required_call_with_arguments_never_fails_the_request(bpe_llama: Policy) -> None:
    """A random model writes arguments it cannot close within max_tokens: the reply is text, never a 5xx."""
    with _serve(bpe_llama) as client:
        reply = client.chat.completions.create(
            model="bpe-llama", messages=[{"role": "user", "content": "what is 2 plus 2"}], tools=WITH_ARGS,  # type: ignore[arg-type]
            tool_choice="required", n=4, max_tokens=12, temperature=1.0,
        )  # fmt: skip
        for c in reply.choices:
            if c.message.tool_calls:
                assert c.message.tool_calls[0].function.name == "add"
                assert isinstance(json.loads(c.message.tool_calls[0].function.arguments), dict)
            else:
                assert c.message.content and c.message.content.startswith(GUIDED_CALL_OPEN + "add")
