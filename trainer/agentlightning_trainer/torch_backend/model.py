"""A tiny GPT built in code (no downloads): the default policy for offline CPU training and tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn


class TinyGPTConfig(BaseModel):
    """Shape of a :class:`TinyGPT`."""

    model_config = ConfigDict(frozen=True)

    vocab_size: int = Field(gt=0, description="Number of token ids (from the tokenizer).")
    n_layers: int = Field(default=2, gt=0, description="Transformer blocks.")
    d_model: int = Field(default=64, gt=0, description="Hidden width.")
    n_heads: int = Field(default=4, gt=0, description="Attention heads; must divide d_model.")
    max_seq_len: int = Field(default=256, gt=0, description="Longest prompt + response the model can see.")
    reply_token_ids: tuple[int, ...] | None = Field(
        default=None, description="The only token ids the model may predict (the others get a -1e9 logit); None = all."
    )


class _Block(nn.Module):
    """One transformer block of the tiny GPT."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        """Pre-norm self-attention (causal through the caller's mask) and an MLP, each with a residual."""
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The block's output for ``x`` and the keys/values to cache (appended to ``past``)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x)), (k, v)


class TinyGPT(nn.Module):
    """Decoder-only transformer with learned positions and an optional scalar value head (for PPO)."""

    def __init__(self, config: TinyGPTConfig) -> None:
        """Initialise weights the GPT-2 way (normal, std 0.02)."""
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model {config.d_model} must be divisible by n_heads {config.n_heads}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(_Block(config.d_model, config.n_heads) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.value_head = nn.Linear(config.d_model, 1)
        # Not persistent: the restriction comes from the config, so weights stay loadable with or without it.
        banned = torch.zeros(config.vocab_size, dtype=torch.bool)
        if config.reply_token_ids is not None:
            if not config.reply_token_ids or not all(0 <= i < config.vocab_size for i in config.reply_token_ids):
                raise ValueError(f"reply_token_ids must be non-empty ids below vocab_size {config.vocab_size}")
            banned[:] = True
            banned[list(config.reply_token_ids)] = False
        self.register_buffer("banned", banned, persistent=False)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, V]`` and values ``[B, T]``; ``attention_mask`` is 1 on real tokens (padding anywhere)."""
        logits, values, _ = self.forward_cached(input_ids, attention_mask, None)
        return logits, values

    def forward_cached(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, past: list[Any] | None
    ) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
        """Like forward, with a key/value cache: ``attention_mask`` covers cached + new tokens; returns the cache."""
        t = input_ids.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        total = attention_mask.shape[1]
        if total > self.config.max_seq_len:
            raise ValueError(
                f"sequence of {t} tokens exceeds the model's max_seq_len {self.config.max_seq_len}; "
                "lower max_prompt_tokens/max_response_tokens or build the model with a larger max_seq_len"
            )
        valid = attention_mask.bool()
        # Positions count real tokens only, so a left-padded prompt sees the same positions as an unpadded one.
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)[:, total - t :]
        causal = torch.ones(total, total, dtype=torch.bool, device=input_ids.device).tril()[total - t :]
        mask = causal[None, :, :] & valid[:, None, :]
        # A padding query attends to nothing and would produce NaN; let it see itself.
        mask = mask | torch.eye(total, dtype=torch.bool, device=input_ids.device)[total - t :][None]
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        cache: list[Any] = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, mask[:, None, :, :], None if past is None else past[i])
            cache.append(kv)
        h = self.ln_f(x)
        logits = self.lm_head(h)
        if self.config.reply_token_ids is not None:
            # A large finite value, not -inf: a banned target (e.g. in SFT data) then gives a big loss, not NaN.
            logits = logits.masked_fill(self.banned, -1e9)
        return logits, self.value_head(h).squeeze(-1), cache
