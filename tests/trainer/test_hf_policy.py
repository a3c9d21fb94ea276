"""HF causal LMs work as policies (runs only where ``transformers`` is installed; built from code, offline)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.torch_backend.policy import Policy


def test_missing_transformers_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def no_transformers(name: str, package: str | None = None) -> object:
        if name == "transformers":
            raise ImportError("No module named 'transformers'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_transformers)
    with pytest.raises(ImportError, match="pip install transformers"):
        Policy.build(PolicySpec(kind="hf", hf_model="some/model"))


@pytest.fixture
def hf_spec(tmp_path: Path) -> PolicySpec:
    """A one-layer GPT-2 with a word-level tokenizer and a chat template, saved where ``Policy.build`` loads it."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<pad>", "<eos>", "<unk>", "user:", "assistant:", "pick", "a", "tool", "search", "calculator"]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}assistant:"
    config = transformers.GPT2Config(vocab_size=len(words), n_embd=32, n_layer=1, n_head=2, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    return PolicySpec(kind="hf", hf_model=str(tmp_path), model_name="tiny-hf")


def test_hf_policy_samples_and_scores_consistently(hf_spec: PolicySpec) -> None:
    policy = Policy.build(hf_spec)
    prompts = [policy.tokenizer.encode_chat([{"role": "user", "content": "pick a tool"}])] * 4
    gens = policy.generate(prompts, temperatures=[1.0] * 4, max_new_tokens=[4] * 4)
    responses = [g.token_ids for g in gens]
    logprobs, _, mask = policy.response_scores(prompts, responses)
    for i, g in enumerate(gens):
        assert torch.allclose(logprobs[i, : len(g.logprobs)], torch.tensor(g.logprobs), atol=1e-4)
    assert mask.sum() == sum(len(r) for r in responses)
    assert LightningRLConfig(policy=hf_spec).policy.kind == "hf"


def test_sft_examples_from_chat_messages_with_an_hf_tokenizer(hf_spec: PolicySpec) -> None:
    from agentlightning.types import Rollout, Transition
    from agentlightning_trainer.batches import RolloutOutcome
    from agentlightning_trainer.sft import SFTConfig, build_examples

    policy = Policy.build(hf_spec)
    assert policy.tokenizer.encode("pick a tool") == [5, 6, 7]
    prompt = [{"role": "user", "content": "pick a tool"}]
    rollout = Rollout(rollout_id="ro-1", input={}, group_id="g", status="succeeded", enqueue_time=time.time_ns())
    call = Transition(
        rollout_id="ro-1", attempt_id="at-1", group_id="g", turn_index=0, span_id="0" * 16, reward=1.0,
        prompt_messages=prompt, response_messages=[{"role": "assistant", "content": "calculator"}],
    )  # fmt: skip
    examples = build_examples([RolloutOutcome(rollout, 1.0, [call])], policy, SFTConfig(policy=hf_spec))
    assert [(e.source, e.response_ids) for e in examples] == [("chat", [9, policy.tokenizer.eos_id])]
    assert examples[0].prompt_ids == policy.tokenizer.encode_chat(prompt)
