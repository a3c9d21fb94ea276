"""Advantage estimators and the loss-aggregation setting, in plain Python (core never imports torch or numpy)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

from agentlightning.adapter._rows import with_updates
from agentlightning.types import Transition


class LossAggregation(StrEnum):
    """How the policy loss averages over tokens; a trainer setting, exported here so every backend agrees."""

    TOKEN_MEAN = "token-mean"
    """Mean over every response token of the batch (verl's default): a rollout with more tokens weighs more."""
    ROLLOUT_MEAN = "rollout-mean"
    """Mean over tokens within each rollout, then over rollouts: every rollout weighs the same."""


def grpo_advantages(
    transitions: Sequence[Transition], *, normalize_std: bool = True, epsilon: float = 1e-6
) -> list[Transition]:
    """GRPO advantages computed once per rollout within its task group; returns copies with ``.advantage`` set.

    Each rollout contributes one score, the mean of its transitions' rewards, to its group's mean and standard
    deviation (unbiased, as verl's ``compute_grpo_outcome_advantage``; a group of one rollout uses mean 0 and std
    1, as verl does). A rollout's advantage is ``(score - mean) / (std + epsilon)`` and each of its calls gets it,
    shifted by the call's own deviation from the rollout's score: ``advantage + (reward - score) / (std +
    epsilon)``. With ``identical`` credit every call of a rollout gets exactly the rollout's advantage, so a rollout
    with five calls weighs the same as one with one call (grouping per call would not: AGL v1's bug). The copies
    share their token lists with the input.
    """
    rollout_rewards: dict[str, list[float]] = {}
    rollout_group: dict[str, str] = {}
    for transition in transitions:
        rollout_rewards.setdefault(transition.rollout_id, []).append(transition.reward)
        group = rollout_group.setdefault(transition.rollout_id, transition.group_id)
        if group != transition.group_id:
            raise ValueError(
                f"rollout {transition.rollout_id} has transitions in groups {group!r} and {transition.group_id!r}; "
                "every transition of a rollout must carry the rollout's group id"
            )
    score = {rid: sum(values) / len(values) for rid, values in rollout_rewards.items()}
    group_scores: dict[str, list[float]] = {}
    for rid, group in rollout_group.items():
        group_scores.setdefault(group, []).append(score[rid])
    stats: dict[str, tuple[float, float]] = {}
    for group, scores in group_scores.items():
        if len(scores) == 1:
            stats[group] = (0.0, 1.0)
            continue
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
        stats[group] = (mean, std + epsilon if normalize_std else 1.0)
    result: list[Transition] = []
    for transition in transitions:
        mean, scale = stats[transition.group_id]
        result.append(with_updates(transition, {"advantage": (transition.reward - mean) / scale}))
    return result


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0, *, bootstrap: float = 0.0) -> list[float]:
    """Discounted returns ``G_t = r_t + gamma * G_{t+1}`` of one rollout's step rewards (critic targets)."""
    returns = [0.0] * len(rewards)
    running = bootstrap
    for index in range(len(rewards) - 1, -1, -1):
        running = rewards[index] + gamma * running
        returns[index] = running
    return returns


def gae_advantages(
    rewards: Sequence[float],
    values: Sequence[float],
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    last_value: float = 0.0,
) -> tuple[list[float], list[float]]:
    """Generalised advantage estimates and returns (``advantages + values``) of one rollout, step by step."""
    if len(rewards) != len(values):
        raise ValueError(f"gae_advantages needs one value per reward; got {len(rewards)} rewards, {len(values)} values")
    advantages = [0.0] * len(rewards)
    running = 0.0
    next_value = last_value
    for index in range(len(rewards) - 1, -1, -1):
        delta = rewards[index] + gamma * next_value - values[index]
        running = delta + gamma * lam * running
        advantages[index] = running
        next_value = values[index]
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


def loss_token_weights(transitions: Sequence[Transition], aggregation: LossAggregation | str) -> list[float]:
    """Per-transition weight of each of its loss tokens so that the weighted token sum is the chosen mean.

    Loss tokens are response tokens with ``response_mask`` 1 (all of them when there is no mask). Under
    ``token-mean`` every token weighs ``1 / total_tokens``; under ``rollout-mean`` a token of rollout ``r`` weighs
    ``1 / (num_rollouts * tokens_of_r)``.
    """
    mode = LossAggregation(aggregation)
    counts = [_loss_tokens(t) for t in transitions]
    if mode is LossAggregation.TOKEN_MEAN:
        total = sum(counts)
        return [1.0 / total if total else 0.0 for _ in transitions]
    per_rollout: dict[str, int] = {}
    for transition, count in zip(transitions, counts, strict=True):
        per_rollout[transition.rollout_id] = per_rollout.get(transition.rollout_id, 0) + count
    rollouts = len(per_rollout)
    return [1.0 / (rollouts * per_rollout[t.rollout_id]) if per_rollout[t.rollout_id] else 0.0 for t in transitions]


def _loss_tokens(transition: Transition) -> int:
    mask = transition.response_mask
    return sum(mask) if mask is not None else len(transition.response_token_ids)
