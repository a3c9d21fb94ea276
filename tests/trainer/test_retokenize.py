"""Re-tokenisation of calls recorded without token ids: the ids equal the policy server's own, drift is flagged,
skipped by default and trained when configured, counted, and reported by ``agl check`` with its fix."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from agentlightning import semconv
from agentlightning.adapter import LLMCall, TraceAdapter, check_store, find_llm_calls
from agentlightning.adapter.retokenize import FIX_DRIFT
from agentlightning.store import InMemoryLightningStore, LightningStore
from agentlightning.types import Rollout
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.policy_server import create_policy_app
from agentlightning_trainer.retokenize import ChatRetokenizer, retokenizer_for_spec
from agentlightning_trainer.torch_backend.policy import Policy
from tests.core.adapter.builders import TraceBuilder
from tests.trainer.conftest import build_bpe_llama

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for name in tool_choice.TOOLS
]
REPLY_WORDS = tool_choice.TOOLS


def _call_of(messages: list[dict[str, Any]], body: dict[str, Any], *, tools: Any = None) -> LLMCall:
    """The call a foreign trace records for one chat completion: messages, tools, reply, usage; no token ids."""
    choice = body["choices"][0]
    usage = body["usage"]
    return LLMCall(
        span_id="1" * 16, span_ids=("1" * 16,), response_id=body["id"], agent_name=None, sources=("otlp",),
        start_time=0, end_time=1, sequence_id=1, prompt_token_ids=[], response_token_ids=[], response_logprobs=None,
        policy_version=None, input_messages=json.dumps(messages),
        output_messages=json.dumps([{**choice["message"], "finish_reason": choice["finish_reason"]}]),
        system_instructions=None, failed=False, tool_definitions=None if tools is None else json.dumps(tools),
        input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"],
    )  # fmt: skip


def test_retokenised_ids_equal_the_tiny_gpt_servers_own() -> None:
    spec = PolicySpec(words=tool_choice.vocabulary(), reply_words=REPLY_WORDS)
    policy = Policy.build(spec, seed=0)
    retokenize = ChatRetokenizer.for_policy(policy)
    with TestClient(create_policy_app(policy, version=0)) as client:
        for task in tool_choice.tasks()[:4]:
            messages = tool_choice.messages(task)
            for extra in ({"max_tokens": 1}, {"max_tokens": 2, "tools": TOOLS}):
                request = {"model": "tiny-gpt", "messages": messages, "return_token_ids": True, **extra}
                body = client.post("/v1/chat/completions", json=request).json()
                result = retokenize(_call_of(messages, body, tools=extra.get("tools")))
                assert result.prompt_token_ids == body["prompt_token_ids"]
                assert result.response_token_ids == body["choices"][0]["token_ids"]
                assert result.verdict == "match", result.lengths()


def test_retokenised_prompt_equals_an_hf_servers_own_with_tools_and_tool_turns(tmp_path: Path) -> None:
    path = build_bpe_llama(tmp_path / "bpe", ["pick a tool", '<tool_call>{"name": "search"}</tool_call>', "sunny"])
    policy = Policy.build(PolicySpec(kind="hf", hf_model=str(path), model_name="bpe", finetune="full"), seed=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "pick a tool"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"q":"P"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    with TestClient(create_policy_app(policy, version=0)) as client:
        request = {"model": "bpe", "messages": messages, "tools": TOOLS, "max_tokens": 4, "return_token_ids": True}
        body = client.post("/v1/chat/completions", json=request).json()
    result = ChatRetokenizer.for_policy(policy)(_call_of(messages, body, tools=TOOLS))
    assert result.prompt_token_ids == body["prompt_token_ids"]
    assert result.recorded_input_tokens == len(result.prompt_token_ids)
    # The reply of a random model need not re-encode to the ids it sampled; when its length agrees, it is a match.
    same = len(result.response_token_ids) == len(body["choices"][0]["token_ids"])
    assert result.verdict == ("match" if same else "drift")
    # agl check --policy loads the tokenizer alone: the same ids.
    spec = PolicySpec(kind="hf", hf_model=str(path), model_name="bpe")
    assert retokenizer_for_spec(spec)(_call_of(messages, body, tools=TOOLS)) == result


# --- drift: flagged, skipped by default, trained when configured, counted, reported ------------------------------
WORDS = ("hello", "world")
SPEC = PolicySpec(words=WORDS)
MESSAGES = [{"role": "user", "content": "hello world"}]
PROMPT_LEN = len(ChatRetokenizer(Policy.build(SPEC).tokenizer).tokenizer.encode_chat(MESSAGES))
REPLY = [{"role": "assistant", "content": "hello", "finish_reason": "stop"}]  # "hello" + <|end|>: 2 tokens


def _foreign_trace(input_tokens: int | None, output_tokens: int | None) -> TraceBuilder:
    """One OpenInference-like call (messages and usage, no token ids) with a reward."""
    b = TraceBuilder()
    span_id = b.llm(source="otlp", messages=MESSAGES, output=REPLY)
    attributes = b.spans[-1].attributes
    assert b.spans[-1].span_id == span_id
    if input_tokens is not None:
        attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    if output_tokens is not None:
        attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
    b.reward(1.0)
    return b


def _rollout() -> Rollout:
    return Rollout(rollout_id="ro-1", input={}, status="succeeded", enqueue_time=0)


def test_matching_counts_train_drift_is_skipped_by_default_and_trained_when_configured() -> None:
    retokenize = retokenizer_for_spec(SPEC)
    exact = _foreign_trace(PROMPT_LEN, 2)
    (call,) = find_llm_calls(exact.spans)
    assert (call.input_tokens, call.output_tokens) == (PROMPT_LEN, 2) and not call.has_token_ids
    assert retokenize(call).verdict == "match"

    default = TraceAdapter(retokenizer=retokenize, include_messages=False)
    (row,) = default.adapt(_rollout(), exact.spans)
    assert row.has_token_ids and len(row.prompt_token_ids) == PROMPT_LEN and len(row.response_token_ids) == 2
    (drifting,) = default.adapt(_rollout(), _foreign_trace(PROMPT_LEN + 3, 2).spans)
    assert not drifting.has_token_ids  # the trainer's batch drops rows without ids
    (unverified,) = default.adapt(_rollout(), _foreign_trace(None, None).spans)
    assert not unverified.has_token_ids
    counts = default.take_retokenize_counts()
    assert counts.metrics() == {
        "retokenized": 3.0,
        "retokenized_trained": 1.0,
        "retokenize_drift": 1.0,
        "retokenize_skipped_drift": 1.0,
        "retokenize_skipped_no_usage": 1.0,
        "retokenize_failed": 0.0,
    }
    assert default.take_retokenize_counts().retokenized == 0  # counted afresh per step

    train_all = TraceAdapter(retokenizer=retokenize, retokenize="all")
    (trained,) = train_all.adapt(_rollout(), _foreign_trace(PROMPT_LEN + 3, 2).spans)
    assert trained.has_token_ids and trained.prompt_token_ids == row.prompt_token_ids
    assert train_all.retokenize_counts.skipped_drift == 0 and train_all.retokenize_counts.drift == 1
    off = TraceAdapter(retokenizer=retokenize, retokenize="off")
    (untouched,) = off.adapt(_rollout(), exact.spans)
    assert not untouched.has_token_ids and off.retokenize_counts.retokenized == 0


def test_lightning_rl_config_skips_drift_by_default() -> None:
    assert LightningRLConfig().retokenize == "matching"
    with pytest.raises(ValueError):
        LightningRLConfig(retokenize="sometimes")  # pyright: ignore[reportArgumentType]  # the bad value is the test


async def _record(store: LightningStore, build: TraceBuilder, resources_id: str | None = None) -> str:
    rollout = await store.enqueue_rollout({"task": 1}, resources_id=resources_id)
    claimed = await store.claim_rollout("worker-1")
    assert claimed is not None
    await store.start_attempt(rollout.rollout_id, claimed.attempt.attempt_id)
    for span in build.spans:
        span.rollout_id, span.attempt_id = rollout.rollout_id, claimed.attempt.attempt_id
    await store.add_spans(build.spans)
    await store.finish_attempt(rollout.rollout_id, claimed.attempt.attempt_id, "succeeded")
    return rollout.rollout_id


async def test_agl_check_reports_drift_with_the_fix() -> None:
    store = InMemoryLightningStore()
    exact = await _record(store, _foreign_trace(PROMPT_LEN, 2))
    drift = await _record(store, _foreign_trace(PROMPT_LEN + 3, 2))
    bare = await _record(store, _foreign_trace(None, None))

    report = await check_store(store, retokenizer=retokenizer_for_spec(SPEC))
    by_id = {r.rollout_id: r for r in report.rollouts}
    assert by_id[exact].problems == [] and by_id[exact].trainable and by_id[exact].calls_retokenized == 1
    assert by_id[drift].problems == [
        f"re-tokenisation drift in 1 call without token ids (recorded {PROMPT_LEN + 3}+2 tokens, re-tokenised "
        f"{PROMPT_LEN}+2): skipped; route the model through the LLM proxy (LLM.base_url_for) so the engine's token "
        "ids are recorded, or set LightningRLConfig(retokenize='all') to train them anyway"
    ]
    assert not by_id[drift].trainable and by_id[drift].calls_drifting == 1
    assert by_id[bare].problems == [
        "no recorded usage for 1 re-tokenised call (gen_ai.usage.input_tokens/output_tokens), so drift cannot be "
        f"ruled out: skipped; {FIX_DRIFT}"
    ]
    assert report.summary() == "1 of 3 rollouts trainable (1 call) for all agents"
    console = Console(file=io.StringIO(), width=250, record=True, color_system=None)
    report.render(console)
    assert "0/1 +1 re-tokenised" in console.export_text()

    everything = await check_store(store, retokenizer=retokenizer_for_spec(SPEC), retokenize="all")
    assert all(r.trainable for r in everything.rollouts)
    assert "trained anyway (retokenize='all')" in {r.rollout_id: r for r in everything.rollouts}[drift].problems[0]
    # Without a tokenizer check says how to find out.
    plain = await check_store(store)
    assert plain.rollouts[0].problems[0].endswith("agl check --policy SPEC says whether that drifts")


def test_troubleshooting_page_covers_the_retokenisation_diagnoses() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    for head in ("re-tokenisation drift in", "no recorded usage for", "cannot be re-tokenised", "--policy SPEC"):
        assert head in page, head


def test_agl_check_policy_option_re_tokenises_with_the_named_model(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentlightning.cli import app
    from agentlightning.store.sqlite import SqliteLightningStore

    async def seed() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            await _record(store, _foreign_trace(PROMPT_LEN + 3, 2))
        finally:
            await store.close()

    asyncio.run(seed())
    spec = tmp_path / "policy_spec.json"
    spec.write_text(SPEC.model_dump_json(), encoding="utf-8")
    wide = {"COLUMNS": "400"}
    checked = CliRunner().invoke(app, ["check", "--store", str(tmp_path / "store.db"), "--policy", str(spec)], env=wide)
    assert checked.exit_code == 1, checked.output  # the one call drifts: nothing trainable
    assert "re-tokenisation drift in 1 call without token ids" in checked.output
    assert "route the model through the LLM proxy" in checked.output
    bad = CliRunner().invoke(app, ["check", "--store", str(tmp_path / "store.db"), "--policy", "nowhere"], env=wide)
    assert bad.exit_code == 2 and "names no policy" in bad.output


def test_every_retokenisation_step_metric_is_described() -> None:
    from agentlightning.adapter.retokenize import RetokenizeCounts
    from agentlightning_trainer.metrics import UPDATE_METRICS

    assert set(RetokenizeCounts().metrics()) <= set(UPDATE_METRICS)


async def test_retokenised_rows_carry_the_version_their_rollout_was_served() -> None:
    from agentlightning.types import LLM
    from agentlightning_trainer.async_rollouts import group_staleness
    from agentlightning_trainer.batches import collect_batch, served_version

    store = InMemoryLightningStore()
    snapshot = await store.add_resources({"llm": LLM(base_url="http://p/v1", model="m", weights_version=3)})
    recorded = _foreign_trace(PROMPT_LEN, 2)
    recorded.spans[0].attributes[semconv.POLICY_VERSION] = 2  # a span that says which weights served it wins
    ids = [await _record(store, _foreign_trace(PROMPT_LEN, 2), snapshot.resources_id)]
    ids.append(await _record(store, recorded, snapshot.resources_id))
    ids.append(await _record(store, _foreign_trace(PROMPT_LEN, 2)))  # enqueued without a snapshot: no version
    adapter = TraceAdapter(retokenizer=retokenizer_for_spec(SPEC), include_messages=False)
    batch = await collect_batch(store, await store.query_rollouts(rollout_ids=ids), adapter)
    versions = {t.rollout_id: t.policy_version for t in batch.transitions}
    assert [versions[rid] for rid in ids] == [3, 2, None]
    # Async mode's staleness filter reads the same field: 5 - 3, 5 - 2, and the group's issue version for None.
    assert sorted(group_staleness(batch, 5, 1)) == [2, 3, 4]
    assert served_version(None) is None
    two = await store.add_resources(
        {"a": LLM(base_url="u", model="a", weights_version=1), "b": LLM(base_url="u", model="b")}
    )
    assert served_version(two) == 1  # the only LLM with a version
