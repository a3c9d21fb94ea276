"""Shared fixtures of the trainer tests: one torch thread (the CI machine has 2 cores), the tool-choice policy."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence
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


def build_bpe_llama(path: Path, corpus: Sequence[str]) -> Path:
    """A random 2-layer Llama with a byte-level BPE tokenizer trained on ``corpus`` (x20), saved at ``path``:
    tool calls are ordinary multi-token text for it, as they are for SmolLM2."""
    transformers: Any = pytest.importorskip("transformers")
    tokenizers: Any = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(list(corpus) * 20, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
    tokenizer.save_pretrained(path)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0, eos_token_id=1, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@contextlib.contextmanager
def serve_policy(policy: Any) -> Iterator[str]:
    """The policy server of ``policy`` on a loopback port (uvicorn on a thread, lifespan on); yields its OpenAI
    base URL."""
    import uvicorn

    from agentlightning_trainer.policy_server import create_policy_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_policy_app(policy), log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the policy server did not start; see the log above"
            time.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def claimed_attempt(store: Any) -> tuple[str, str]:
    """Enqueue and claim one rollout of ``store``; its (rollout id, attempt id), for calls through the LLM proxy."""
    import asyncio

    async def attempt() -> tuple[str, str]:
        await store.enqueue_rollout({"task": "add"})
        claimed = await store.claim_rollout("worker")
        assert claimed is not None
        return claimed.rollout.rollout_id, claimed.attempt.attempt_id

    return asyncio.run(attempt())
