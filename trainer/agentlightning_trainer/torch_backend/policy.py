"""A policy = causal LM + tokenizer with batched sampling (token ids and logprobs) and training forward passes.

The tiny GPT is built in code; any Hugging Face causal LM works through a lazy ``transformers`` import
(:mod:`agentlightning_trainer.torch_backend.hf`), on the spec's device and dtype, with LoRA adapters by default.
Both generate with a key/value cache. Logprobs are those of the distribution sampled from (the logits divided by the
temperature), and the learner scores at the same temperature, so a temperature other than 1 stays on-policy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.torch_backend.guided import END, Guide, JsonDepth
from agentlightning_trainer.torch_backend.losses import entropy_of
from agentlightning_trainer.torch_backend.model import TinyGPT, TinyGPTConfig
from agentlightning_trainer.torch_backend.tokenizer import WordCharTokenizer


class ChatTokenizer(Protocol):
    """What the policy needs from a tokenizer."""

    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of plain ``text``, without special tokens (e.g. a response to imitate)."""
        ...

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt token ids of a chat (with the tool definitions rendered when ``tools`` is given)."""
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
    json_closed: bool = False
    """A :class:`Guide` with ``close_json`` stopped the reply where its JSON object closed."""


_BASE = "base"  # the frozen base's prefix in the published state of per-agent copies


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

    def __init__(
        self,
        spec: PolicySpec,
        module: nn.Module,
        tokenizer: ChatTokenizer,
        max_seq_len: int,
        device: torch.device | None = None,
    ) -> None:
        """Wrap an already built module; use :meth:`build` to construct one from a spec."""
        self.spec = spec
        self.module = module
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.device = device or torch.device("cpu")
        self.stop_ids: frozenset[int] = frozenset(getattr(tokenizer, "stop_ids", (tokenizer.eos_id,)))
        # Per-agent weights of a fully trained model (the tiny GPT): a copy per agent; `module` stays the frozen
        # base. A LoRA model keeps its per-agent adapters inside `module` instead.
        self.agent_modules: dict[str, nn.Module] = {}
        if spec.adapters and not spec.uses_lora:
            for agent in spec.adapters:
                self.agent_modules[agent] = copy.deepcopy(module)
            module.requires_grad_(False)

    @classmethod
    def build(cls, spec: PolicySpec, *, seed: int = 0) -> Policy:
        """Build the policy a spec describes; weights not loaded from files (tiny GPT, LoRA init) follow ``seed``."""
        if spec.kind == "hf":
            from agentlightning_trainer.torch_backend.hf import load_hf

            module, hf_tok, max_len, device = load_hf(spec, seed=seed)
            return cls(spec, module, hf_tok, max_len, device)
        from agentlightning_trainer.torch_backend.hf import resolve_device

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
        device = resolve_device(spec)
        module.to(device)
        module.eval()
        return cls(spec, module, tokenizer, spec.max_seq_len, device)

    # --- what is trained and published ----------------------------------------------------------------------------
    def _trainable_named(self) -> list[tuple[str, nn.Parameter]]:
        if self.agent_modules:
            return [(f"{a}.{n}", p) for a, m in self.agent_modules.items() for n, p in m.named_parameters()]
        if self.spec.uses_lora:  # by name: peft's set_adapter toggles requires_grad of the inactive adapters
            return [(n, p) for n, p in self.module.named_parameters() if "lora_" in n or n.startswith("value_head")]
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def _published_named(self) -> list[tuple[str, nn.Parameter]]:
        """What a new version carries: the trainable tensors, plus the frozen base of per-agent copies (a small
        model whose base may come from initial weights the server never saw)."""
        if self.agent_modules:
            base = [(f"{_BASE}.{n}", p) for n, p in self.module.named_parameters()]
            return base + self._trainable_named()
        return self._trainable_named()

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an update changes: LoRA adapters (+ value head) for a LoRA policy, each agent's copy with
        per-agent weights, else every weight."""
        return [p for _, p in self._trainable_named()]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """What a new policy version consists of: only the trainable tensors for LoRA and per-agent weights (the
        base never changes), else the whole state dict."""
        # A snapshot: on the CPU .cpu() would alias the live parameters, which the next update changes.
        if not self.spec.uses_lora and not self.agent_modules:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}
        return {name: p.detach().to("cpu", copy=True) for name, p in self._published_named()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load what :meth:`trainable_state_dict` returned (adapters and per-agent weights only; nothing else)."""
        if not self.spec.uses_lora and not self.agent_modules:
            self.module.load_state_dict(state)
            return
        params = dict(self._published_named())
        if self.agent_modules and set(state) == set(self.module.state_dict()):
            # A plain state dict of the model (initial weights, e.g. SFT's): the base and every agent start there.
            for module in (self.module, *self.agent_modules.values()):
                module.load_state_dict(state)
            return
        if set(state) != set(params):
            missing, unknown = sorted(set(params) - set(state))[:3], sorted(set(state) - set(params))[:3]
            raise ValueError(
                f"weights do not fit this policy (missing {missing}, unknown {unknown}); were they trained with the "
                "same PolicySpec (adapters, lora_rank, lora_target_modules)?"
            )
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value.to(params[name].device, params[name].dtype))

    @contextmanager
    def serving(self, adapter: str | None) -> Iterator[None]:
        """Run as agent ``adapter``'s weights, or as the frozen base (None) when the policy has per-agent weights;
        a policy without them is always itself (``adapter`` must then be None)."""
        if not self.spec.adapters:
            if adapter is not None:
                raise ValueError(f"this policy has no per-agent weights; got adapter {adapter!r}")
            yield
            return
        if adapter is not None and adapter not in self.spec.adapters:
            raise ValueError(f"no weights for agent {adapter!r}; the policy has {list(self.spec.adapters)}")
        if self.spec.uses_lora:
            module: Any = self.module
            if adapter is None:
                with module.base_weights():
                    yield
            else:
                module.use_adapter(adapter)
                yield
            return
        base = self.module
        self.module = base if adapter is None else self.agent_modules[adapter]
        try:
            yield
        finally:
            self.module = base

    @property
    def has_builtin_reference(self) -> bool:
        """Whether the frozen initial model is part of the policy (LoRA: adapters off; per-agent copies: the base),
        so that a KL penalty needs no copy of the model."""
        return bool(self.spec.adapters) or (self.spec.uses_lora and hasattr(self.module, "base_weights"))

    @contextmanager
    def reference_weights(self) -> Iterator[bool]:
        """Score with the built-in frozen initial model (:attr:`has_builtin_reference`); yields whether there is
        one (without, the policy scores as itself and a caller keeps its own frozen copy)."""
        if self.spec.adapters:
            with self.serving(None):
                yield True
        elif self.has_builtin_reference:
            module: Any = self.module
            with module.base_weights():
                yield True
        else:
            yield False

    # --- forward passes ---------------------------------------------------------------------------------------------
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
        guides: Sequence[Guide | None] | None = None,
        adapters: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        """Sample one completion per prompt in one batch with a KV cache; temperature 0 is greedy.

        Logprobs are of the sampled distribution (logits / temperature; greedy rows at temperature 1). ``guides``:
        one optional :class:`Guide` per prompt; ``adapters``: the agent whose weights answer each prompt (None =
        the frozen base), for a policy with per-agent weights.
        """
        if not prompts:
            return []
        if len(temperatures) != len(prompts) or len(max_new_tokens) != len(prompts):
            raise ValueError("generate needs one temperature and one max_new_tokens per prompt")
        if guides is not None and len(guides) != len(prompts):
            raise ValueError("generate needs one guide (or None) per prompt")
        rows_of: dict[str | None, list[int]] = {}
        for i, adapter in enumerate(adapters or [None] * len(prompts)):
            rows_of.setdefault(adapter, []).append(i)
        out: list[Generation | None] = [None] * len(prompts)
        for adapter, rows in rows_of.items():  # one batch per agent's weights
            with self.serving(adapter):
                was_training = self.module.training
                self.module.eval()
                try:
                    gens = self._generate(
                        [prompts[i] for i in rows],
                        [temperatures[i] for i in rows],
                        [max_new_tokens[i] for i in rows],
                        generator,
                        None if guides is None else [guides[i] for i in rows],
                    )
                finally:
                    self.module.train(was_training)
            for i, g in zip(rows, gens, strict=True):
                out[i] = g
        return [g for g in out if g is not None]

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        temperatures: Sequence[float],
        max_new_tokens: Sequence[int],
        generator: torch.Generator | None,
        guides: Sequence[Guide | None] | None,
    ) -> list[Generation]:
        b = len(prompts)
        longest = max(len(p) for p in prompts)
        if min(len(p) for p in prompts) == 0:
            raise ValueError("generate got an empty prompt; a prompt needs at least one token")
        budget = [min(int(m), self.max_seq_len - len(p)) for m, p in zip(max_new_tokens, prompts, strict=True)]
        if min(budget) <= 0:
            raise ValueError(
                f"prompt of {longest} tokens leaves no room to generate within max_seq_len {self.max_seq_len}"
            )
        device = self.device
        pad = self.tokenizer.pad_id
        ids = torch.full((b, longest), pad, dtype=torch.long)
        mask = torch.zeros((b, longest), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding keeps every row's next token at the last column
            ids[i, longest - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, longest - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        temps = torch.tensor([float(t) for t in temperatures], device=device)
        greedy = temps <= 0
        scale = torch.where(greedy, torch.ones_like(temps), temps.clamp(min=1e-6))[:, None]
        # Sampling draws from `generator`; on another device than the logits it samples there (the CPU) instead.
        sample_device = generator.device if generator is not None else device
        stop = torch.tensor(sorted(self.stop_ids), device=device)
        out_ids: list[list[int]] = [[] for _ in range(b)]
        out_lps: list[list[float]] = [[] for _ in range(b)]
        finish = ["length"] * b
        finished = [False] * b
        forward_cached: Any = getattr(self.module, "forward_cached")  # noqa: B009  # TinyGPT and HFCausalLM have it
        # A guided row walks its trie while `nodes[i]` is a non-empty subtree; `None` = free (or unguided).
        nodes: list[dict[int, Any] | None] = [g.trie() if g is not None else None for g in guides or [None] * b]
        stop_texts = [g.stop_text if g is not None else None for g in guides or [None] * b]
        # JSON depth of rows with close_json once their trie is done (their choices leave them one object deep).
        depth: list[JsonDepth | None] = [
            JsonDepth() if g is not None and g.close_json else None for g in guides or [None] * b
        ]
        closed = [False] * b
        past: Any = None
        step_ids = ids
        logits = self._prefill(forward_cached, prompts, ids, mask)
        if logits is not None:  # each distinct prompt ran once; `past` is its cache, one row per reply
            logits, past = logits
        for _ in range(max(budget)):
            if logits is None:
                logits, _, past = forward_cached(step_ids, mask, past)
            logprobs = torch.log_softmax(logits[:, -1, :].float() / scale, dim=-1)
            logits = None
            choose = logprobs
            if any(nodes):
                allowed = torch.ones_like(logprobs, dtype=torch.bool)
                for i, node in enumerate(nodes):
                    if node:
                        allowed[i] = False
                        allowed[i, [t for t in node if t != END]] = True
                choose = logprobs.masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(choose, dim=-1).to(sample_device)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(device)
            token = torch.where(greedy, choose.argmax(dim=-1), sampled)
            token_lp = logprobs.gather(1, token[:, None]).squeeze(1).tolist()
            token_list = token.tolist()
            is_stop = torch.isin(token, stop).tolist()
            for i in range(b):
                if finished[i]:
                    continue
                out_ids[i].append(token_list[i])
                out_lps[i].append(token_lp[i])
                node = nodes[i]
                scanner = depth[i]
                if node:
                    child = node[token_list[i]]
                    closed[i] = END in child
                    nodes[i] = None if closed[i] else (child or None)
                elif scanner is not None and scanner.feed(self.tokenizer.decode([token_list[i]])):
                    closed[i] = True
                stop_text = stop_texts[i]
                if (
                    closed[i]
                    or is_stop[i]
                    or (stop_text is not None and not nodes[i] and stop_text in self.tokenizer.decode(out_ids[i][-8:]))
                ):
                    finish[i] = "stop"
                    finished[i] = True
                elif len(out_ids[i]) >= budget[i]:
                    finished[i] = True
            if all(finished):
                break
            done = torch.tensor(finished, device=device)
            step_ids = torch.where(done, pad, token)[:, None]
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        return [Generation(out_ids[i], out_lps[i], finish[i], closed[i]) for i in range(b)]

    @staticmethod
    def _prefill(
        forward_cached: Any, prompts: Sequence[Sequence[int]], ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, Any] | None:
        """Run each distinct prompt once and copy its KV cache to every row that repeats it (K samples of one
        task arrive together); None when every prompt is distinct (the plain first step does the same work)."""
        first: dict[tuple[int, ...], int] = {}
        rows = [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
        if len(first) == len(prompts):
            return None
        unique = torch.tensor(sorted(first.values()), device=ids.device)
        position = {row: j for j, row in enumerate(sorted(first.values()))}
        index = torch.tensor([position[r] for r in rows], device=ids.device)
        logits, _, past = forward_cached(ids[unique], mask[unique], None)
        if isinstance(past, list):  # the tiny GPT's cache: (keys, values) per block
            past = [(k[index], v[index]) for k, v in past]
        else:  # a transformers Cache
            past.reorder_cache(index)
        return logits[index], past

    def response_scores(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        adapter: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logprobs (at ``temperature``) and values of each response token given its prompt, and the response mask
        (all ``[B, R]``, on the policy's device), under agent ``adapter``'s weights (per-agent policies)."""
        with self.serving(adapter):
            logprobs, values, mask, _ = self._response_scores(prompts, responses, temperature, with_entropy=False)
        return logprobs, values, mask

    def response_scores_with_entropy(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        adapter: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`response_scores` plus the entropy ``[B, R]`` of the (tempered) next-token distribution at each
        response position, from the same forward pass (an entropy bonus needs its gradient)."""
        with self.serving(adapter):
            logprobs, values, mask, entropy = self._response_scores(prompts, responses, temperature, with_entropy=True)
        assert entropy is not None  # with_entropy=True always computes it
        return logprobs, values, mask, entropy

    def _response_scores(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        temperature: float,
        *,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        b = len(prompts)
        total = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
        if total > self.max_seq_len:
            raise ValueError(
                f"a transition has {total} tokens, more than the policy's max_seq_len {self.max_seq_len}; "
                "lower max_prompt_tokens/max_response_tokens in the config"
            )
        score_group = getattr(self.module, "score_group", None)
        if score_group is not None and not self.spec.gradient_checkpointing:
            return self._scores_by_prompt(score_group, prompts, responses, temperature, with_entropy=with_entropy)
        if isinstance(self.module, TinyGPT):
            shared = self._tiny_scores_shared(prompts, responses, temperature, with_entropy=with_entropy)
            if shared is not None:
                return shared
        r_max = max(len(r) for r in responses)
        # Left padding ends every response at the last column, so only the last r_max + 1 positions' logits are
        # needed: for a 49k-token vocabulary the full [B, T, V] logits would dominate the memory of a step.
        keep = r_max + 1
        ids = torch.full((b, total), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((b, total), dtype=torch.long)
        targets = torch.zeros((b, r_max), dtype=torch.long)
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            seq = [*p, *r]
            ids[i, total - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[i, total - len(seq) :] = 1
            n = len(r)
            # Responses are right-aligned to column r_max here, as in the sequence; the logits at kept column c
            # (absolute total - keep + c) predict the token at column c + 1.
            targets[i, r_max - n :] = torch.tensor(list(r), dtype=torch.long)
        device = self.device
        ids, mask, targets = ids.to(device), mask.to(device), targets.to(device)
        if isinstance(self.module, TinyGPT):
            logits, values = self.module(ids, mask)
            logits, values = logits[:, -keep:], values[:, -keep:]
        else:
            logits, values = self.module(ids, mask, keep)
        picked = logits[:, :-1].float()
        if temperature > 0 and temperature != 1.0:
            picked = picked / temperature
        log_probs = torch.log_softmax(picked, dim=-1)
        logprobs = log_probs.gather(2, targets[:, :, None]).squeeze(2)
        # Back to the left-aligned layout callers use (row i's tokens at [i, :len(r_i)]), zero past the end.
        shift = torch.tensor([r_max - len(r) for r in responses], device=device)
        cols = (torch.arange(r_max, device=device)[None, :] + shift[:, None]).clamp(max=r_max - 1)
        left_mask = torch.zeros((b, r_max), device=device)
        for i, r in enumerate(responses):
            left_mask[i, : len(r)] = 1.0
        entropy = entropy_of(log_probs).gather(1, cols) * left_mask if with_entropy else None
        return (
            logprobs.gather(1, cols) * left_mask,
            values[:, :-1].float().gather(1, cols) * left_mask,
            left_mask,
            entropy,
        )

    def _tiny_scores_shared(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        temperature: float,
        *,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """:meth:`_response_scores` of the tiny GPT in two batched passes: each distinct prompt once, then every
        reply on a copy of its prompt's KV cache; None when no prompt repeats (or the padded rows would not fit).

        GRPO scores K replies per prompt: with 35-token prompts and <= 8-token replies the full-sequence pass
        computes ~4x the tokens. Gradients flow through the copied cache, so the result equals the full pass.
        """
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        p_max, r_max = max(len(p) for p in distinct), max(len(r) for r in responses)
        if len(distinct) == len(prompts) or r_max == 0 or p_max + r_max > self.max_seq_len:
            return None
        pad, device = self.tokenizer.pad_id, self.device
        p_ids = torch.full((len(distinct), p_max), pad, dtype=torch.long)
        p_mask = torch.zeros((len(distinct), p_max), dtype=torch.long)
        for j, p in enumerate(distinct):  # left-padded: every prompt ends at the last column
            p_ids[j, p_max - len(p) :] = torch.tensor(p, dtype=torch.long)
            p_mask[j, p_max - len(p) :] = 1
        r_ids = torch.full((len(prompts), r_max), pad, dtype=torch.long)
        r_mask = torch.zeros((len(prompts), r_max), dtype=torch.long)
        for i, r in enumerate(responses):  # right-padded: reply token j at column j, the callers' layout
            r_ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            r_mask[i, : len(r)] = 1
        index = torch.tensor(rows, device=device)
        p_ids, p_mask, r_ids, r_mask = p_ids.to(device), p_mask.to(device), r_ids.to(device), r_mask.to(device)
        module: TinyGPT = self.module  # type: ignore[assignment]  # checked by the caller
        p_logits, p_values, past = module.forward_cached(p_ids, p_mask, None)
        past = [(k[index], v[index]) for k, v in past]
        r_logits, r_values, _ = module.forward_cached(r_ids, torch.cat([p_mask[index], r_mask], dim=1), past)
        # The prompt's last position predicts reply token 0; reply position j predicts token j + 1.
        picked = torch.cat([p_logits[index, -1:], r_logits[:, :-1]], dim=1).float()
        values = torch.cat([p_values[index, -1:], r_values[:, :-1]], dim=1).float()
        if temperature > 0 and temperature != 1.0:
            picked = picked / temperature
        log_probs = torch.log_softmax(picked, dim=-1)
        mask = r_mask.float()
        logprobs = log_probs.gather(2, r_ids[:, :, None]).squeeze(2) * mask
        entropy = entropy_of(log_probs) * mask if with_entropy else None
        return logprobs, values * mask, mask, entropy

    def _scores_by_prompt(
        self,
        score_group: Any,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        temperature: float,
        *,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """:meth:`response_scores` with one prompt pass per distinct prompt (its replies share the KV cache)."""
        b, r_max, device = len(prompts), max(len(r) for r in responses), self.device
        entropy = torch.zeros((b, r_max), device=device) if with_entropy else None
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(tuple(p), []).append(i)
        logprobs = torch.zeros((b, r_max), device=device)
        values = torch.zeros((b, r_max), device=device)
        mask = torch.zeros((b, r_max), device=device)
        for prompt, rows in groups.items():
            replies = [list(responses[i]) for i in rows]
            logits, vals = score_group(list(prompt), replies, self.tokenizer.pad_id)
            width = logits.shape[1]
            targets = torch.zeros((len(rows), width), dtype=torch.long, device=device)
            for j, r in enumerate(replies):
                targets[j, : len(r)] = torch.tensor(r, dtype=torch.long, device=device)
            picked = logits.float()
            if temperature > 0 and temperature != 1.0:
                picked = picked / temperature
            log_probs = torch.log_softmax(picked, dim=-1)
            lp = log_probs.gather(2, targets[:, :, None]).squeeze(2)
            index = torch.tensor(rows, device=device)
            row_mask = torch.zeros((len(rows), r_max), device=device)
            for j, r in enumerate(replies):
                row_mask[j, : len(r)] = 1.0
            # index_put keeps the graph: the rows of each group land in their places of the batch.
            logprobs = logprobs.index_put((index,), torch.nn.functional.pad(lp, (0, r_max - width)))
            values = values.index_put((index,), torch.nn.functional.pad(vals.float(), (0, r_max - width)))
            if entropy is not None:
                group_entropy = torch.nn.functional.pad(entropy_of(log_probs), (0, r_max - width))
                entropy = entropy.index_put((index,), group_entropy)
            mask[index] = row_mask
        return logprobs * mask, values * mask, mask, None if entropy is None else entropy * mask
