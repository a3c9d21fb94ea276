"""HF causal LMs work as policies (runs only where ``transformers`` is installed; built from code, offline)."""

from __future__ import annotations

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


def test_hf_policy_samples_and_scores_consistently(tmp_path: Path) -> None:
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

    spec = PolicySpec(kind="hf", hf_model=str(tmp_path), model_name="tiny-hf")
    policy = Policy.build(spec)
    prompts = [policy.tokenizer.encode_chat([{"role": "user", "content": "pick a tool"}])] * 4
    gens = policy.generate(prompts, temperatures=[1.0] * 4, max_new_tokens=[4] * 4)
    responses = [g.token_ids for g in gens]
    logprobs, _, mask = policy.response_scores(prompts, responses)
    for i, g in enumerate(gens):
        assert torch.allclose(logprobs[i, : len(g.logprobs)], torch.tensor(g.logprobs), atol=1e-4)
    assert mask.sum() == sum(len(r) for r in responses)
    assert LightningRLConfig(policy=spec).policy.kind == "hf"
