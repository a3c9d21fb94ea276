"""A policy = causal LM + tokenizer with batched sampling (token ids and logprobs) and training forward passes.

The tiny GPT is built in code; any Hugging Face causal LM works through a lazy ``transformers`` import.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.torch_backend.model import TinyGPT, TinyGPTConfig
from agentlightning_trainer.torch_backend.tokenizer import WordCharTokenizer


class ChatTokenizer(Protocol):
    """What the policy needs from a tokenizer."""

    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of plain ``text``, without special tokens (e.g. a response to imitate)."""
        ...

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Prompt token ids of a chat."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of token ids."""
        ...


@dataclass
class Generation:
    """One sampled completion: generated ids (EOS included when it stopped), their logprobs, finish reason."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class _HFTokenizer:
    """Adapts a HF tokenizer (with its own chat template) to :class:`ChatTokenizer`."""

    def __init__(self, tokenizer: Any) -> None:
        """Wrap a loaded ``transformers`` tokenizer."""
        self._tok = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without the BOS/EOS the tokenizer would add to a whole sequence."""
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Prompt token ids from the model's own chat template, ending where the assistant's reply begins."""
        ids = self._tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # transformers >= 5 may return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of token ids."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special))


class _HFWithValueHead(nn.Module):
    """A HF causal LM returning (logits, values) like :class:`TinyGPT`."""

    def __init__(self, model: Any) -> None:
        """Add a linear value head over the model's last hidden state."""
        super().__init__()
        self.lm = model
        self.value_head = nn.Linear(int(model.config.hidden_size), 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, V]`` and values ``[B, T]``; positions count only attended tokens (left padding)."""
        positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        out = self.lm(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, output_hidden_states=True
        )
        return out.logits, self.value_head(out.hidden_states[-1].float()).squeeze(-1)


def _load_hf(name: str) -> tuple[nn.Module, ChatTokenizer, int]:
    try:
        transformers: Any = importlib.import_module("transformers")
    except ImportError as exc:
        raise ImportError(
            f"policy kind 'hf' (model {name!r}) needs transformers: pip install transformers "
            "(or use kind='tiny_gpt' for the built-in offline model)"
        ) from exc
    tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(name)
    max_len = int(getattr(model.config, "max_position_embeddings", 2048))
    return _HFWithValueHead(model), _HFTokenizer(tokenizer), max_len


def _reply_token_ids(tokenizer: WordCharTokenizer, words: Sequence[str]) -> tuple[int, ...]:
    """The token ids of ``reply_words``; each word must be exactly one token (the end token is ``<|end|>``)."""
    ids: list[int] = []
    for word in words:
        encoded = tokenizer.encode(word)
        if len(encoded) != 1:
            raise ValueError(
                f"reply word {word!r} is {len(encoded)} tokens of the tiny GPT's tokenizer; each reply word must be "
                "one token (add it to the policy's words)"
            )
        ids.append(encoded[0])
    return tuple(dict.fromkeys(ids))


class Policy:
    """A causal LM and its tokenizer: sample completions with logprobs, and score responses for training."""

    def __init__(self, spec: PolicySpec, module: nn.Module, tokenizer: ChatTokenizer, max_seq_len: int) -> None:
        """Wrap an already built module; use :meth:`build` to construct one from a spec."""
        self.spec = spec
        self.module = module
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len

    @classmethod
    def build(cls, spec: PolicySpec, *, seed: int = 0) -> Policy:
        """Build the policy a spec describes; the tiny GPT's initial weights depend only on ``seed``."""
        if spec.kind == "hf":
            if not spec.hf_model:
                raise ValueError("policy kind 'hf' needs hf_model (a HF model id or a local path)")
            module, hf_tok, max_len = _load_hf(spec.hf_model)
            return cls(spec, module, hf_tok, max_len)
        tokenizer = WordCharTokenizer(spec.words)
        config = TinyGPTConfig(
            reply_token_ids=None if spec.reply_words is None else _reply_token_ids(tokenizer, spec.reply_words),
            vocab_size=tokenizer.vocab_size,
            n_layers=spec.n_layers,
            d_model=spec.d_model,
            n_heads=spec.n_heads,
            max_seq_len=spec.max_seq_len,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = TinyGPT(config)
        return cls(spec, module, tokenizer, spec.max_seq_len)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, V]`` and values ``[B, T]``."""
        return self.module(input_ids, attention_mask)

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        temperatures: Sequence[float],
        max_new_tokens: Sequence[int],
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample one completion per prompt in one batch; temperature 0 is greedy; logprobs are at temperature 1."""
        if not prompts:
            return []
        if len(temperatures) != len(prompts) or len(max_new_tokens) != len(prompts):
            raise ValueError("generate needs one temperature and one max_new_tokens per prompt")
        self.module.eval()
        b = len(prompts)
        longest = max(len(p) for p in prompts)
        if longest == 0:
            raise ValueError("generate got an empty prompt; a prompt needs at least one token")
        budget = [min(int(m), self.max_seq_len - len(p)) for m, p in zip(max_new_tokens, prompts, strict=True)]
        if min(budget) <= 0:
            raise ValueError(
                f"prompt of {longest} tokens leaves no room to generate within max_seq_len {self.max_seq_len}"
            )
        pad = self.tokenizer.pad_id
        ids = torch.full((b, longest), pad, dtype=torch.long)
        mask = torch.zeros((b, longest), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding keeps every row's next token at the last column
            ids[i, longest - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, longest - len(p) :] = 1
        temps = torch.tensor([float(t) for t in temperatures])
        greedy = temps <= 0
        out_ids: list[list[int]] = [[] for _ in range(b)]
        out_lps: list[list[float]] = [[] for _ in range(b)]
        finish = ["length"] * b
        finished = [False] * b
        cached = isinstance(self.module, TinyGPT)
        past: list[Any] | None = None
        step_ids = ids
        for _ in range(max(budget)):
            if cached:
                assert isinstance(self.module, TinyGPT)  # narrowed for the type checker
                logits, _, past = self.module.forward_cached(step_ids, mask, past)
                logits = logits[:, -1, :].float()
            else:
                logits = self.forward(ids, mask)[0][:, -1, :].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            scaled = logits / temps.clamp(min=1e-6)[:, None]
            sampled = torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator).squeeze(1)
            token = torch.where(greedy, logits.argmax(dim=-1), sampled)
            token_lp = logprobs.gather(1, token[:, None]).squeeze(1).tolist()
            token_list = token.tolist()
            for i in range(b):
                if finished[i]:
                    continue
                tid = token_list[i]
                out_ids[i].append(tid)
                out_lps[i].append(token_lp[i])
                if tid == self.tokenizer.eos_id:
                    finish[i] = "stop"
                    finished[i] = True
                elif len(out_ids[i]) >= budget[i]:
                    finished[i] = True
            if all(finished):
                break
            done = torch.tensor(finished)
            step_ids = torch.where(done, pad, token)[:, None]
            ids = torch.cat([ids, step_ids], dim=1)
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        return [Generation(out_ids[i], out_lps[i], finish[i]) for i in range(b)]

    def response_scores(
        self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logprobs and values of each response token given its prompt, and the response mask (all ``[B, R]``)."""
        b = len(prompts)
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
        total = max(lengths)
        if total > self.max_seq_len:
            raise ValueError(
                f"a transition has {total} tokens, more than the policy's max_seq_len {self.max_seq_len}; "
                "lower max_prompt_tokens/max_response_tokens in the config"
            )
        r_max = max(len(r) for r in responses)
        ids = torch.full((b, total), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((b, total), dtype=torch.long)
        gather_pos = torch.zeros((b, r_max), dtype=torch.long)
        targets = torch.zeros((b, r_max), dtype=torch.long)
        resp_mask = torch.zeros((b, r_max))
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            seq = [*p, *r]
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, : len(seq)] = 1
            n = len(r)
            # The logits at position j predict token j + 1: response token k is predicted at len(p) - 1 + k.
            gather_pos[i, :n] = torch.arange(len(p) - 1, len(p) - 1 + n)
            targets[i, :n] = torch.tensor(list(r), dtype=torch.long)
            resp_mask[i, :n] = 1.0
        logits, values = self.forward(ids, mask)
        picked = logits.gather(1, gather_pos[:, :, None].expand(-1, -1, logits.shape[-1])).float()
        logprobs = torch.log_softmax(picked, dim=-1).gather(2, targets[:, :, None]).squeeze(2)
        return logprobs, values.gather(1, gather_pos).float(), resp_mask
