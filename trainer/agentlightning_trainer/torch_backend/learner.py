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
from agentlightning_trainer.torch_backend.losses import aggregate, clipped_policy_loss, gae, k3_kl, whiten
from agentlightning_trainer.torch_backend.policy import Policy

logger = logging.getLogger(__name__)


class TorchLearner:
    """Owns the policy's optimizer and turns batches of transitions into parameter updates."""

    def __init__(self, policy: Policy, config: LightningRLConfig) -> None:
        """Create AdamW over the policy (and a frozen reference copy when kl_coef > 0)."""
        self.policy = policy
        self.config = config
        self.optimizer = torch.optim.AdamW(policy.module.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.reference = copy.deepcopy(policy.module).eval() if config.kl_coef > 0 else None
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
        rollout_index = torch.tensor([rollout_ids[t.rollout_id] for t in batch])
        self.policy.module.train()
        with torch.no_grad():
            old_lp, old_values, mask = self._behaviour_scores(batch)
            for i, t in enumerate(batch):
                # The serving engine's logprobs are the behaviour policy's; they make the ratio correct under lag.
                if t.response_logprobs is not None and len(t.response_logprobs) == len(t.response_token_ids):
                    old_lp[i, : len(t.response_logprobs)] = torch.tensor(t.response_logprobs)
                if t.response_mask is not None and len(t.response_mask) == len(t.response_token_ids):
                    mask[i, : len(t.response_mask)] = torch.tensor(t.response_mask, dtype=mask.dtype)
            ref_lp = self._reference_logprobs(prompts, responses) if self.reference is not None else None
            if cfg.algorithm == "ppo":
                rewards = torch.zeros_like(mask)
                last = (mask.sum(dim=1) - 1).clamp(min=0).long()
                rewards[torch.arange(len(batch)), last] = torch.tensor([t.reward for t in batch])
                advantages, returns = gae(rewards, old_values * mask, mask, cfg.gamma, cfg.gae_lambda)
                advantages = whiten(advantages, mask)
            else:
                advantages = torch.tensor([float(t.advantage or 0.0) for t in batch])[:, None] * mask
                returns = torch.zeros_like(mask)
        stats: dict[str, list[float]] = {"loss": [], "pg_loss": [], "kl": [], "clip_frac": [], "grad_norm": []}
        size = cfg.mini_batch_size or len(batch)
        for _ in range(cfg.epochs):
            order = (
                torch.randperm(len(batch), generator=self.sampler) if size < len(batch) else torch.arange(len(batch))
            )
            for start in range(0, len(batch), size):
                idx = order[start : start + size]
                chosen = [responses[i] for i in idx.tolist()]
                # The step's tensors are as wide as its longest reply; the policy scores only this mini-batch's.
                width = max(len(r) for r in chosen)
                self._step(
                    [prompts[i] for i in idx.tolist()],
                    chosen,
                    old_lp[idx, :width],
                    advantages[idx, :width],
                    returns[idx, :width],
                    mask[idx, :width],
                    torch.unique(rollout_index[idx], return_inverse=True)[1],
                    None if ref_lp is None else ref_lp[idx, :width],
                    stats,
                )
        self.policy.module.eval()
        out = {k: float(np.mean(v)) for k, v in stats.items() if v}
        out["trained_transitions"] = float(len(batch))
        out["dropped_transitions"] = float(len(reasons))
        return out

    def _behaviour_scores(self, batch: list[Transition]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Old logprobs, values and response mask; skips a forward pass when the sampler's logprobs suffice."""
        responses = [t.response_token_ids for t in batch]
        have_logprobs = all(
            t.response_logprobs is not None and len(t.response_logprobs) == len(t.response_token_ids) for t in batch
        )
        if self.config.algorithm == "grpo" and have_logprobs:
            r_max = max(len(r) for r in responses)
            mask = torch.zeros((len(batch), r_max))
            for i, r in enumerate(responses):
                mask[i, : len(r)] = 1.0
            return torch.zeros_like(mask), torch.zeros_like(mask), mask
        return self.policy.response_scores([t.prompt_token_ids for t in batch], responses)

    def _step(
        self,
        prompts: list[list[int]],
        responses: list[list[int]],
        old_lp: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor,
        rollout_index: torch.Tensor,
        ref_lp: torch.Tensor | None,
        stats: dict[str, list[float]],
    ) -> None:
        cfg = self.config
        logprobs, values, _ = self.policy.response_scores(prompts, responses)
        per_token, clipped = clipped_policy_loss(logprobs, old_lp, advantages, cfg.clip_ratio, cfg.clip_high)
        pg_loss = aggregate(per_token, mask, rollout_index, cfg.loss_aggregation)
        loss = pg_loss
        if ref_lp is not None:
            kl = aggregate(k3_kl(logprobs, ref_lp), mask, rollout_index, cfg.loss_aggregation)
            loss = loss + cfg.kl_coef * kl
            stats["kl"].append(kl.item())
        if cfg.algorithm == "ppo":
            value_loss = 0.5 * aggregate((values - returns) ** 2, mask, rollout_index, cfg.loss_aggregation)
            loss = loss + cfg.vf_coef * value_loss
            stats.setdefault("value_loss", []).append(value_loss.item())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.module.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        stats["loss"].append(loss.item())
        stats["pg_loss"].append(pg_loss.item())
        stats["clip_frac"].append(float((clipped * mask).sum() / mask.sum().clamp(min=1.0)))
        stats["grad_norm"].append(float(grad_norm))

    @torch.no_grad()
    def _reference_logprobs(self, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        assert self.reference is not None  # only called when kl_coef > 0
        live = self.policy.module
        self.policy.module = self.reference
        try:
            return self.policy.response_scores(prompts, responses)[0]
        finally:
            self.policy.module = live

    # --- weights and checkpoints ---------------------------------------------------------------------------------
    def save_weights(self, path: Path) -> None:
        """Write the policy's state dict atomically (the policy server loads it)."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.policy.module.state_dict(), tmp)
        tmp.replace(path)

    def save_checkpoint(self, directory: Path, step: int, extra: dict[str, Any] | None = None) -> Path:
        """Save model, optimizer, RNG states and ``extra`` so that :meth:`load_checkpoint` resumes exactly."""
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "model": self.policy.module.state_dict(),
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
        state = torch.load(path, weights_only=False)  # our own file: it holds RNG states, not only tensors
        self.policy.module.load_state_dict(state["model"])
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
        policy.module.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(
            f"init_weights {str(path)!r} does not fit the policy {policy.spec.kind!r} ({policy.spec.model_name}); "
            f"give the PolicySpec the weights were trained with: {exc}"
        ) from exc
    logger.info("initial weights loaded from %s", path)
