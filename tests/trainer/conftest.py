"""Shared fixtures of the trainer tests: one torch thread (the CI machine has 2 cores), the tool-choice policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import PolicySpec


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tool_spec() -> PolicySpec:
    """The tiny GPT with the tool-choice task's word tokens."""
    return PolicySpec(words=tool_choice.vocabulary())


# --- HF models built from a config (no download) ---------------------------------------------------------------
WORDS = ["<pad>", "<eos>", "<unk>", "system:", "user:", "assistant:", "pick", "a", "tool", "search", "calculator"]
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}assistant:"


def save_word_tokenizer(path: Path, *, template: str | None = TEMPLATE) -> None:
    """A word-level HF tokenizer over :data:`WORDS` with ``template`` as its chat template, saved at ``path``."""
    transformers: Any = pytest.importorskip("transformers")
    tokenizers: Any = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(path)


@pytest.fixture
def llama_dir(tmp_path: Path) -> Path:
    """A 2-layer Llama (SmolLM2's architecture) with attention dropout 0.1, saved as a HF folder."""
    transformers: Any = pytest.importorskip("transformers")
    path = tmp_path / "llama"
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.1, pad_token_id=0, eos_token_id=1,
        bos_token_id=None, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    save_word_tokenizer(path)
    return path
