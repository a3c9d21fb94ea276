"""The torch learner: GRPO/PPO updates on transitions, AdamW, and exact-resume checkpoints."""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentlightning.types import Transition
from agentlightning_trainer.config import LightningRLConfig
from agentlightning_trainer.torch_backend.losses import (
    clipped_policy_loss,
    dual_clip,
    gae,
    k3_kl,
    row_weights,
    truncated_is_weights,
    whiten,
)
from agentlightning_trainer.torch_backend.policy import Policy

logger = logging.getLogger(__name__)


class TorchLearner:
    """Owns the policy's optimizer and turns batches of transitions into parameter updates."""

    def __init__(self, policy: Policy, config: LightningRLConfig) -> None:
        """Create AdamW over the policy (and a frozen reference copy when kl_coef > 0)."""
        self.policy = policy
        self.config = config
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        # The KL reference: a LoRA policy scores it with its adapters off; any other policy needs a frozen copy.
        builtin = policy.has_builtin_reference
        self.reference = copy.deepcopy(policy.module).eval() if config.kl_coef > 0 and not builtin else None
        if self.reference is not None:
            self.reference.requires_grad_(False)
        self.sampler = torch.Generator().manual_seed(config.seed)

    def trainable(self, transitions: Sequence[Transition]) -> tuple[list[Transition], list[str]]:
        """The transitions an update can use, and one reason per transition it cannot."""
        keep: list[Transition] = []
        reasons: list[str] = []
        for t in transitions:
            if not t.has_token_ids:
                reasons.append(f"{t.rollout_id}/{t.span_id}: no token ids (the upstream must return token ids)")
            elif len(t.prompt_token_ids) > self.config.max_prompt_tokens:
                reasons.append(
                    f"{t.rollout_id}/{t.span_id}: prompt of {len(t.prompt_token_ids)} tokens > max_prompt_tokens "
                    f"{self.config.max_prompt_tokens}"
                )
            elif len(t.prompt_token_ids) + len(t.response_token_ids) > self.policy.max_seq_len:
                reasons.append(f"{t.rollout_id}/{t.span_id}: longer than the policy's max_seq_len")
            elif self.config.algorithm == "grpo" and t.advantage is None:
                reasons.append(f"{t.rollout_id}/{t.span_id}: no advantage (run grpo_advantages first)")
            elif self.policy.spec.adapters and t.agent_name not in self.policy.spec.adapters:
                reasons.append(
                    f"{t.rollout_id}/{t.span_id}: a call of agent {t.agent_name!r}, which has no weights of its own "
                    f"(per-agent weights: {list(self.policy.spec.adapters)})"
                )
            else:
                keep.append(t)
        return keep, reasons

    def update(self, transitions: Sequence[Transition]) -> dict[str, float]:
        """One training step on ``transitions`` (GRPO uses each transition's advantage; PPO computes GAE)."""
        batch, reasons = self.trainable(transitions)
        if not batch:
            raise ValueError(f"no trainable transitions in this batch: {'; '.join(reasons[:3]) or 'batch is empty'}")
        cfg = self.config
        prompts = [t.prompt_token_ids for t in batch]
        responses = [t.response_token_ids for t in batch]
        rollout_ids = {rid: i for i, rid in enumerate(dict.fromkeys(t.rollout_id for t in batch))}
        device = self.policy.device
        adapters = [self._adapter_of(t) for t in batch]
        rollout_index = torch.tensor([rollout_ids[t.rollout_id] for t in batch], device=device)
        # Old and reference logprobs are scored in eval mode; the base model's dropout is off in any mode.
        self.policy.module.eval()
        with torch.no_grad():
            old_lp, old_values, mask = self._behaviour_scores(batch, adapters)
            served_lp = torch.zeros_like(old_lp)
            has_served = torch.zeros(len(batch), dtype=torch.bool, device=device)
            for i, t in enumerate(batch):
                if t.response_logprobs is not None and len(t.response_logprobs) == len(t.response_token_ids):
                    served_lp[i, : len(t.response_logprobs)] = torch.tensor(t.response_logprobs, device=device)
                    has_served[i] = True
                if t.response_mask is not None and len(t.response_mask) == len(t.response_token_ids):
                    mask[i, : len(t.response_mask)] = torch.tensor(t.response_mask, dtype=mask.dtype, device=device)
            served = (served_lp, has_served) if bool(has_served.any()) else None
            tis: torch.Tensor | None = None
            tis_truncated_frac = 0.0
            if served is not None and cfg.tis_cap is not None:
                # The ratio starts from the learner's own (recomputed) logprobs; the truncated weight carries the
                # serving engine's share of the off-policyness (sampler numerics and policy lag).
                weights, truncated = truncated_is_weights(old_lp, served_lp, cfg.tis_cap)
                tis = torch.where(has_served[:, None], weights, torch.ones_like(weights))
                loss_tokens = mask * has_served[:, None]
                tis_truncated_frac = float((truncated * loss_tokens).sum() / loss_tokens.sum().clamp(min=1.0))
            elif served is not None:
                # The serving engine's logprobs are the behaviour policy's; they make the ratio correct under lag.
                old_lp = torch.where(has_served[:, None], served_lp, old_lp)
            ref_lp = self._reference_logprobs(prompts, responses) if cfg.kl_coef > 0 else None
            if cfg.algorithm == "ppo":
                rewards = torch.zeros_like(mask)
                last = (mask.sum(dim=1) - 1).clamp(min=0).long()
                rewards[torch.arange(len(batch), device=device), last] = torch.tensor(
                    [t.reward for t in batch], device=device
                )
                advantages, returns = gae(rewards, old_values * mask, mask, cfg.gamma, cfg.gae_lambda)
                advantages = whiten(advantages, mask)
            else:
                advantages = torch.tensor([float(t.advantage or 0.0) for t in batch], device=device)[:, None] * mask
                for i, t in enumerate(batch):  # merged trajectories: each call's tokens keep their call's advantage
                    if t.response_advantages is not None:
                        per_token = torch.tensor(t.response_advantages, device=device, dtype=advantages.dtype)
                        advantages[i, : len(per_token)] = per_token * mask[i, : len(per_token)]
                returns = torch.zeros_like(mask)
        stats: dict[str, list[float]] = {"loss": [], "pg_loss": [], "kl": [], "clip_frac": [], "grad_norm": []}
        first_step = True  # the first optimizer step scores the weights that made the batch: the mismatch is free
        size = cfg.mini_batch_size or len(batch)
        self.policy.module.train()  # only LoRA dropout (when configured) differs from eval; checkpointing needs it
        for _ in range(cfg.epochs):
            order = (
                torch.randperm(len(batch), generator=self.sampler) if size < len(batch) else torch.arange(len(batch))
            ).to(device)
            for start in range(0, len(batch), size):
                idx = order[start : start + size]
                chosen = [responses[i] for i in idx.tolist()]
                # The step's tensors are as wide as its longest reply; the policy scores only this mini-batch's.
                width = max(len(r) for r in chosen)
                self._step(
                    [adapters[i] for i in idx.tolist()],
                    [prompts[i] for i in idx.tolist()],
                    chosen,
                    old_lp[idx, :width],
                    advantages[idx, :width],
                    returns[idx, :width],
                    mask[idx, :width],
                    torch.unique(rollout_index[idx], return_inverse=True)[1],
                    None if ref_lp is None else ref_lp[idx, :width],
                    None if tis is None else tis[idx, :width],
                    None if served is None or not first_step else (served[0][idx, :width], served[1][idx]),
                    stats,
                )
                first_step = False
        self.policy.module.eval()
        out = {k: float(np.mean(v)) for k, v in stats.items() if v}
        if tis is not None:
            out["tis_truncated_frac"] = tis_truncated_frac
        out["trained_transitions"] = float(len(batch))
        out["dropped_transitions"] = float(len(reasons))
        return out

    def _adapter_of(self, transition: Transition) -> str | None:
        """Whose weights made (and train on) a call: its agent's, for a policy with per-agent weights."""
        return transition.agent_name if self.policy.spec.adapters else None

    def _scores(
        self, adapters: list[str | None], prompts: list[list[int]], responses: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``response_scores`` of rows that may belong to different agents' weights (one pass per agent)."""
        if len(set(adapters)) <= 1:
            return self.policy.response_scores(
                prompts, responses, temperature=self.config.temperature, adapter=adapters[0] if adapters else None
            )
        r_max = max(len(r) for r in responses)
        device = self.policy.device
        out = [torch.zeros((len(prompts), r_max), device=device) for _ in range(3)]
        for adapter in dict.fromkeys(adapters):
            rows = [i for i, a in enumerate(adapters) if a == adapter]
            parts = self.policy.response_scores(
                [prompts[i] for i in rows], [responses[i] for i in rows], temperature=self.config.temperature,
                adapter=adapter,
            )  # fmt: skip
            index = torch.tensor(rows, device=device)
            for full, part in zip(out, parts, strict=True):
                full[index, : part.shape[1]] = part
        return out[0], out[1], out[2]

    def _behaviour_scores(
        self, batch: list[Transition], adapters: list[str | None]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Old logprobs, values and response mask; skips a forward pass when the sampler's logprobs suffice."""
        responses = [t.response_token_ids for t in batch]
        have_logprobs = all(
            t.response_logprobs is not None and len(t.response_logprobs) == len(t.response_token_ids) for t in batch
        )
        # TIS compares the served logprobs with the learner's own, so it needs the forward pass.
        if self.config.algorithm == "grpo" and have_logprobs and self.config.tis_cap is None:
            r_max = max(len(r) for r in responses)
            mask = torch.zeros((len(batch), r_max), device=self.policy.device)
            for i, r in enumerate(responses):
                mask[i, : len(r)] = 1.0
            return torch.zeros_like(mask), torch.zeros_like(mask), mask
        return self._scores(adapters, [t.prompt_token_ids for t in batch], responses)

    def _step(
        self,
        adapters: list[str | None],
        prompts: list[list[int]],
        responses: list[list[int]],
        old_lp: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor,
        rollout_index: torch.Tensor,
        ref_lp: torch.Tensor | None,
        tis: torch.Tensor | None,
        served: tuple[torch.Tensor, torch.Tensor] | None,
        stats: dict[str, list[float]],
    ) -> None:
        """One optimizer step on a mini-batch; ``served`` (logprobs, row has them) is given to measure the
        served-vs-learner mismatch, on the update's first step, before any weight has moved."""
        cfg = self.config
        weights = row_weights(mask, rollout_index, cfg.loss_aggregation)
        micro = cfg.micro_batch_size or len(prompts)
        totals = {
            "loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "value_loss": 0.0, "clipped": 0.0, "dual_clipped": 0.0,
            "entropy": 0.0, "mismatch": 0.0, "mismatch_tokens": 0.0,
        }  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        # Micro-batches never mix agents' weights: each is scored under its one agent's adapter (or the policy).
        by_agent: dict[str | None, list[int]] = {}
        for i, adapter in enumerate(adapters):
            by_agent.setdefault(adapter, []).append(i)
        chunks = [(a, rows[j : j + micro]) for a, rows in by_agent.items() for j in range(0, len(rows), micro)]
        for adapter, chunk in chunks:
            rows = torch.tensor(chunk, device=mask.device)
            chosen = [responses[i] for i in chunk]
            width = max(len(r) for r in chosen)  # each micro-batch is scored only as wide as its longest reply
            m, w = mask[rows, :width], weights[rows]

            def weighted(x: torch.Tensor, m: torch.Tensor = m, w: torch.Tensor = w) -> torch.Tensor:
                return ((x * m).sum(dim=1) * w).sum()

            chunk_prompts = [prompts[i] for i in chunk]
            entropy: torch.Tensor | None = None
            if cfg.entropy_coef > 0:  # the full-vocabulary entropy costs memory: only computed when it is used
                logprobs, values, _, entropy = self.policy.response_scores_with_entropy(
                    chunk_prompts, chosen, temperature=cfg.temperature, adapter=adapter
                )
            else:
                logprobs, values, _ = self.policy.response_scores(
                    chunk_prompts, chosen, temperature=cfg.temperature, adapter=adapter
                )
            if served is not None:
                served_tokens = m * served[1][rows, None]
                gap = (logprobs.detach() - served[0][rows, :width]).abs()
                totals["mismatch"] += float((gap * served_tokens).sum())
                totals["mismatch_tokens"] += float(served_tokens.sum())
            chunk_advantages = advantages[rows, :width]
            per_token, clipped = clipped_policy_loss(
                logprobs, old_lp[rows, :width], chunk_advantages, cfg.clip_ratio, cfg.clip_high
            )
            if cfg.clip_ratio_c is not None:
                per_token, dual_clipped = dual_clip(per_token, chunk_advantages, cfg.clip_ratio_c)
                totals["dual_clipped"] += float((dual_clipped * m).sum())
            if tis is not None:
                per_token = per_token * tis[rows, :width]
            pg_loss = weighted(per_token)
            loss = pg_loss
            if entropy is not None:
                mean_entropy = weighted(entropy)
                loss = loss - cfg.entropy_coef * mean_entropy
                totals["entropy"] += mean_entropy.item()
            if ref_lp is not None:
                kl = weighted(k3_kl(logprobs, ref_lp[rows, :width]))
                loss = loss + cfg.kl_coef * kl
                totals["kl"] += kl.item()
            if cfg.algorithm == "ppo":
                value_loss = 0.5 * weighted((values - returns[rows, :width]) ** 2)
                loss = loss + cfg.vf_coef * value_loss
                totals["value_loss"] += value_loss.item()
            loss.backward()  # gradients add up over micro-batches: one optimizer step for the whole mini-batch
            totals["loss"] += loss.item()
            totals["pg_loss"] += pg_loss.item()
            totals["clipped"] += float((clipped * m).sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        stats["loss"].append(totals["loss"])
        stats["pg_loss"].append(totals["pg_loss"])
        if ref_lp is not None:
            stats["kl"].append(totals["kl"])
        if cfg.algorithm == "ppo":
            stats.setdefault("value_loss", []).append(totals["value_loss"])
        stats["clip_frac"].append(totals["clipped"] / max(1.0, float(mask.sum())))
        stats["grad_norm"].append(float(grad_norm))
        if cfg.clip_ratio_c is not None:
            stats.setdefault("dual_clip_frac", []).append(totals["dual_clipped"] / max(1.0, float(mask.sum())))
        if cfg.entropy_coef > 0:
            stats.setdefault("entropy", []).append(totals["entropy"])
        if totals["mismatch_tokens"] > 0:
            stats.setdefault("logprob_mismatch", []).append(totals["mismatch"] / totals["mismatch_tokens"])

    @torch.no_grad()
    def _reference_logprobs(self, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        temperature = self.config.temperature
        if self.reference is None:  # a LoRA policy: the frozen base is the same module with its adapters off
            with self.policy.reference_weights():
                return self.policy.response_scores(prompts, responses, temperature=temperature)[0]
        live = self.policy.module
        self.policy.module = self.reference
        try:
            return self.policy.response_scores(prompts, responses, temperature=temperature)[0]
        finally:
            self.policy.module = live

    # --- weights and checkpoints ---------------------------------------------------------------------------------
    def save_weights(self, path: Path) -> None:
        """Write what the policy trains (LoRA: the adapters only) atomically; the policy server loads it."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.policy.trainable_state_dict(), tmp)
        tmp.replace(path)

    def save_checkpoint(self, directory: Path, step: int, extra: dict[str, Any] | None = None) -> Path:
        """Save model, optimizer, RNG states and ``extra`` so that :meth:`load_checkpoint` resumes exactly."""
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "model": self.policy.trainable_state_dict(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "sampler_rng": self.sampler.get_state(),
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "extra": extra or {},
        }
        path = directory / f"step-{step:06d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
        (directory / "latest").write_text(path.name)
        return path

    def load_checkpoint(self, directory: Path) -> tuple[int, dict[str, Any]] | None:
        """Restore the latest checkpoint in ``directory``; returns (step, extra), or None when there is none."""
        pointer = directory / "latest"
        if not pointer.exists():
            return None
        path = directory / pointer.read_text().strip()
        # Our own file: it holds RNG states, not only tensors.
        state = torch.load(path, weights_only=False, map_location="cpu")
        self.policy.load_trainable_state_dict(state["model"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        self.sampler.set_state(state["sampler_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
        logger.info("resumed from %s (step %d)", path, state["step"])
        return int(state["step"]), dict(state["extra"])


def load_initial_weights(policy: Policy, path: Path) -> None:
    """Load weights into ``policy`` from a state dict file, a checkpoint file, or a checkpoint directory."""
    path = Path(path)
    if path.is_dir():
        pointer = path / "latest"
        if not pointer.exists():
            raise ValueError(f"init_weights {str(path)!r} is a directory without a checkpoint ('latest' is missing)")
        path = path / pointer.read_text().strip()
    state = torch.load(path, weights_only=False, map_location="cpu")  # our own files; checkpoints hold RNG states
    if isinstance(state, dict) and "model" in state and "optimizer" in state:  # a checkpoint: its model only
        state = state["model"]
    try:
        policy.load_trainable_state_dict(state)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(
            f"init_weights {str(path)!r} does not fit the policy {policy.spec.kind!r} ({policy.spec.model_name}); "
            f"give the PolicySpec the weights were trained with: {exc}"
        ) from exc
    logger.info("initial weights loaded from %s", path)
