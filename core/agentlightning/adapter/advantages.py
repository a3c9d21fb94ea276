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
    """GRPO advantages within each task group, with the rollout as the sample; returns copies with ``.advantage``.

    Definition. Rollout ``r`` of a group has ``n_r`` transitions (calls) with credited rewards ``x_rc`` and the score
    ``s_r = mean_c x_rc``. The group has ``R`` rollouts, mean score ``mu = mean_r s_r``, and the pooled standard
    deviation of its calls with every rollout weighing 1 (each of its calls ``1 / n_r``)::

        sigma**2 = sum_r (1 / n_r) * sum_c (x_rc - mu)**2 / (R - 1)

    A call's advantage is ``(x_rc - mu) / (sigma + epsilon)`` (``x_rc - mu`` without ``normalize_std``).

    Properties (tested): with ``identical`` credit every call of a rollout gets ``(s_r - mu) / (sigma + epsilon)``
    and ``sigma`` is the unbiased std of the scores, i.e. verl's GRPO with the rollout (not the call) as the sample,
    so a rollout with five calls weighs the same as one with one call (grouping per call would not: AGL v1's bug).
    Each group is zero-sum with the rollout weights (``sum_r (1 / n_r) sum_c A_rc = 0``). Because the deviations are
    measured in the std *of the same deviations*, ``|A_rc| <= sqrt((R - 1) * n_r)`` for every group shape: a tied
    group (every score equal) whose calls got different credit stays bounded (dividing within-rollout deviations by
    the std of the scores alone gave |A| = 5e5 there), and a group where every call scored the same gets 0. A group
    of one rollout has no baseline: mean 0 and std 1 as verl does, so its calls get their own reward. The copies share
    their token lists with the input.
    """
    rollout_rewards: dict[str, list[float]] = {}
    rollout_group: dict[str, str] = {}
    for transition in transitions:
        if transition.response_advantages is not None:
            raise ValueError(
                f"rollout {transition.rollout_id} has a merged trajectory row with per-token advantages; compute "
                "advantages on the per-call rows, then merge them (aggregate_trajectories)"
            )
        rollout_rewards.setdefault(transition.rollout_id, []).append(transition.reward)
        group = rollout_group.setdefault(transition.rollout_id, transition.group_id)
        if group != transition.group_id:
            raise ValueError(
                f"rollout {transition.rollout_id} has transitions in groups {group!r} and {transition.group_id!r}; "
                "every transition of a rollout must carry the rollout's group id"
            )
    group_rollouts: dict[str, list[list[float]]] = {}
    for rid, group in rollout_group.items():
        group_rollouts.setdefault(group, []).append(rollout_rewards[rid])
    stats: dict[str, tuple[float, float]] = {}
    for group, rollouts in group_rollouts.items():
        if len(rollouts) == 1:  # no baseline: mean 0 and std 1, divided by std + epsilon as verl does
            stats[group] = (0.0, 1.0 + epsilon if normalize_std else 1.0)
            continue
        mean = sum(sum(values) / len(values) for values in rollouts) / len(rollouts)
        pooled = sum(sum((x - mean) ** 2 for x in values) / len(values) for values in rollouts)
        std = math.sqrt(pooled / (len(rollouts) - 1))
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
