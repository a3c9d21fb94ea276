"""Loss pieces shared by GRPO and PPO: clipped policy gradient (dual clip, truncated importance weights), k3 KL,
entropy, GAE, and loss aggregation."""

from __future__ import annotations

import torch

from agentlightning_trainer.config import LossAggregationName


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, rollout_index: torch.Tensor, mode: LossAggregationName
) -> torch.Tensor:
    """Reduce per-token ``values`` ``[B, R]`` to a scalar: mean over tokens, or mean per rollout then over rollouts."""
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    # rollout-mean: each row's token mean, then each rollout's row mean, then the mean over rollouts, so a rollout
    # with many calls weighs as much as one with a single call.
    row = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    n_rollouts = int(rollout_index.max().item()) + 1
    per_rollout = torch.zeros(n_rollouts, dtype=row.dtype, device=row.device).index_add(0, rollout_index, row)
    counts = torch.zeros(n_rollouts, dtype=row.dtype, device=row.device).index_add(
        0, rollout_index, torch.ones_like(row)
    )
    present = counts > 0
    return (per_rollout[present] / counts[present]).mean()


def row_weights(mask: torch.Tensor, rollout_index: torch.Tensor, mode: LossAggregationName) -> torch.Tensor:
    """Per-row weights ``w`` with ``aggregate(x) == sum_r w_r * sum_t x[r, t] * mask[r, t]``: they let a batch be
    split into micro-batches (gradient accumulation) with exactly the same loss as in one piece."""
    tokens = mask.sum(dim=1)
    if mode == "token-mean":
        return torch.full_like(tokens, 1.0) / tokens.sum().clamp(min=1.0)
    n_rollouts = int(rollout_index.max().item()) + 1
    rows = torch.zeros(n_rollouts, dtype=tokens.dtype, device=tokens.device).index_add(
        0, rollout_index, torch.ones_like(tokens)
    )
    present = int((rows > 0).sum().item())
    return 1.0 / (tokens.clamp(min=1.0) * rows[rollout_index] * present)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip surrogate loss and a per-token 'was clipped' indicator."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def dual_clip(loss: torch.Tensor, advantages: torch.Tensor, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dual-clip PPO (Ye et al. 2020, verl's ``clip_ratio_c``): cap the per-token loss of negative advantages at
    ``-A * clip_ratio_c``; returns the loss and a per-token 'was capped' indicator."""
    # For A < 0 the PPO-clip max() keeps the unclipped -A * ratio whenever the ratio is large, so one token whose
    # probability rose a lot since sampling would dominate the loss; the cap bounds it (its gradient is then 0).
    cap = -advantages * clip_ratio_c
    negative = advantages < 0
    return torch.where(negative, torch.minimum(loss, cap), loss), (negative & (loss > cap)).float()


def truncated_is_weights(
    recomputed_logprobs: torch.Tensor, served_logprobs: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance-sampling weights ``min(exp(recomputed - served), cap)`` (detached), and a per-token
    'was truncated' indicator: they correct for the serving engine sampling from slightly other probabilities than
    the learner computes (Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL')."""
    raw = torch.exp(recomputed_logprobs.detach() - served_logprobs.detach())
    return raw.clamp(max=cap), (raw > cap).float()


def entropy_of(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each distribution given by ``log_probs`` over the last dimension (``[..., V] -> [...]``)."""
    # The clamp keeps a -inf logprob (a banned token) from giving 0 * -inf = NaN; exp() of it is 0 either way.
    return -(log_probs.exp() * log_probs.clamp(min=torch.finfo(log_probs.dtype).min)).sum(dim=-1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): unbiased, always >= 0."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns per token (``[B, R]``; padding after each row's last token)."""
    b, r = rewards.shape
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(b, device=rewards.device)
    next_value = torch.zeros(b, device=rewards.device)
    for t in reversed(range(r)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        last = last * m  # padding positions carry nothing back
        advantages[:, t] = last
        next_value = values[:, t] * m
    return advantages, advantages + values


def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked (x - mean) / std across the batch."""
    n = mask.sum().clamp(min=1.0)
    mean = (values * mask).sum() / n
    var = (((values - mean) * mask) ** 2).sum() / n
    return (values - mean) / (var.sqrt() + 1e-8) * mask
