"""The in-process fast path: sample, score and update with no HTTP, using the same GRPO/PPO code as LightningRL."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning.types import Transition
from agentlightning_trainer.config import LightningRLConfig
from agentlightning_trainer.metrics import MetricsLogger, StepMetrics, group_summary
from agentlightning_trainer.torch_backend.learner import TorchLearner, load_initial_weights
from agentlightning_trainer.torch_backend.policy import Policy

logger = logging.getLogger(__name__)

MessagesFn = Callable[[Any], list[dict[str, Any]]]
ScoreFn = Callable[[Any, str], float]


def with_advantages(
    transitions: list[Transition], config: LightningRLConfig
) -> tuple[list[Transition], dict[str, float]]:
    """The rows an update trains on, with GRPO advantages (rollout-level, within each task group), and what was done.

    ``drop_tied_groups`` removes every group whose calls all got the same reward (every advantage 0, DAPO's dynamic
    sampling): such rows add no gradient, but under token-mean they dilute every other row's weight, and they cost a
    forward and backward pass. The returned stats hold the dropped fraction of groups. With
    ``transitions="trajectory"`` the per-call rows are merged after their advantages are computed, so the
    statistics are those of per-call training and each call's tokens keep their call's advantage. PPO needs no
    advantages here (the learner computes GAE).
    """
    if config.algorithm != "grpo" or not transitions:
        return transitions, {}
    from agentlightning.adapter import aggregate_trajectories, grpo_advantages

    result = grpo_advantages(transitions, normalize_std=config.normalize_std)
    stats: dict[str, float] = {}
    if config.drop_tied_groups:
        rewards_by_group: dict[str, set[float]] = {}
        for row in result:
            rewards_by_group.setdefault(row.group_id, set()).add(row.reward)
        # A group of one rollout has no baseline; its advantage is its reward, not 0, so only ties of 2+ go.
        sizes: dict[str, set[str]] = {}
        for row in result:
            sizes.setdefault(row.group_id, set()).add(row.rollout_id)
        tied = {g for g, values in rewards_by_group.items() if len(values) == 1 and len(sizes[g]) > 1}
        result = [row for row in result if row.group_id not in tied]
        stats["tied_groups_dropped"] = len(tied) / len(rewards_by_group)
    if config.transitions == "trajectory":
        result = aggregate_trajectories(result)
    return result, stats


@dataclass
class TrainResult:
    """What a training run produced: the trained policy and per-step metrics."""

    policy: Policy
    history: list[StepMetrics] = field(default_factory=list)
    val_history: list[tuple[int, float]] = field(default_factory=list)

    def steps_to(self, threshold: float) -> int | None:
        """First step whose reward EMA reached ``threshold``, or None."""
        return next((m.step for m in self.history if m.reward_ema >= threshold), None)


def evaluate_greedy(
    policy: Policy, tasks: Sequence[Any], messages: MessagesFn, score: ScoreFn, max_tokens: int
) -> float:
    """Mean score of greedy (temperature 0) replies over ``tasks``."""
    prompts = [policy.tokenizer.encode_chat(messages(task)) for task in tasks]
    gens = policy.generate(prompts, temperatures=[0.0] * len(prompts), max_new_tokens=[max_tokens] * len(prompts))
    scores = [score(task, policy.tokenizer.decode(g.token_ids)) for task, g in zip(tasks, gens, strict=True)]
    return sum(scores) / max(1, len(scores))


def train_in_process(
    config: LightningRLConfig,
    train_tasks: Sequence[Any],
    val_tasks: Sequence[Any] | None,
    *,
    messages: MessagesFn,
    score: ScoreFn,
    metrics: MetricsLogger | None = None,
    policy: Policy | None = None,
) -> TrainResult:
    """Train ``config.steps`` steps by sampling the policy directly (no store, no HTTP)."""
    if not train_tasks:
        raise ValueError("train_in_process needs at least one training task")
    rng = random.Random(config.seed)
    policy = policy or Policy.build(config.policy, seed=config.seed)
    if config.init_weights is not None:  # before the learner copies the reference policy for the KL penalty
        load_initial_weights(policy, config.init_weights)
    learner = TorchLearner(policy, config)
    result = TrainResult(policy)
    ema = 0.0
    start_step = 0
    if config.checkpoint_dir is not None and config.resume:
        restored = learner.load_checkpoint(config.checkpoint_dir)
        if restored is not None:
            start_step, extra = restored
            ema = float(extra.get("ema", 0.0))
            rng.setstate(as_rng_state(extra["task_rng"]))
    started = time.perf_counter()
    for step in range(start_step + 1, config.steps + 1):
        t0 = time.perf_counter()
        chosen = pick_tasks(rng, train_tasks, config.tasks_per_step)
        batch_tasks = [(g, task) for g, task in enumerate(chosen) for _ in range(config.samples_per_task)]
        prompts = [policy.tokenizer.encode_chat(messages(task)) for _, task in batch_tasks]
        gens = policy.generate(
            prompts,
            temperatures=[config.temperature] * len(prompts),
            max_new_tokens=[config.max_response_tokens] * len(prompts),
            generator=learner.sampler,
        )
        transitions: list[Transition] = []
        rewards_by_group: dict[str, list[float]] = {}
        failed = 0
        for i, ((g, task), prompt, gen) in enumerate(zip(batch_tasks, prompts, gens, strict=True)):
            try:
                reward = float(score(task, policy.tokenizer.decode(gen.token_ids)))
            except Exception as exc:  # a failing reward function fails that rollout only, as in the HTTP path
                logger.warning("reward function raised on task %r: %s; rollout excluded", task, exc)
                failed += 1
                continue
            group_id = f"s{step}-g{g}"
            rewards_by_group.setdefault(group_id, []).append(reward)
            transitions.append(
                Transition(
                    rollout_id=f"ro-s{step}-{i}",
                    attempt_id="at-0",
                    group_id=group_id,
                    turn_index=0,
                    span_id=f"{i:016x}",
                    prompt_token_ids=prompt,
                    response_token_ids=gen.token_ids,
                    response_logprobs=gen.logprobs,
                    reward=reward,
                    policy_version=step - 1,
                )
            )
        rollout_s = time.perf_counter() - t0
        reward_mean, all_same = group_summary(rewards_by_group)
        ema = (
            reward_mean
            if step == start_step + 1 and ema == 0.0
            else config.ema_decay * ema + (1 - config.ema_decay) * reward_mean
        )
        t1 = time.perf_counter()
        extra: dict[str, float] = {}
        skipped = not transitions
        if skipped:
            _warn(metrics, f"step {step}: no trainable transitions (all {failed} rollouts failed); step skipped")
        else:
            rows, extra = with_advantages(transitions, config)
            if rows:
                extra = learner.update(rows) | extra
        record = StepMetrics(
            step=step,
            reward_mean=reward_mean,
            reward_ema=ema,
            all_same_frac=all_same,
            transitions=len(transitions),
            rollouts=len(batch_tasks),
            failed_rollouts=failed,
            policy_version=step,
            policy_lag=0.0,
            rollout_s=rollout_s,
            update_s=time.perf_counter() - t1,
            skipped=skipped,
            wall_s=time.perf_counter() - started,
            extra=extra,
        )
        result.history.append(record)
        if metrics is not None:
            metrics.log(record)
        if val_tasks and (step % config.val_every == 0 or step == config.steps):
            val = evaluate_greedy(policy, val_tasks, messages, score, config.max_response_tokens)
            record.val_reward = val
            result.val_history.append((step, val))
            if metrics is not None:
                metrics.log_validation(step, val)
        if config.checkpoint_dir is not None and step % config.checkpoint_every == 0:
            learner.save_checkpoint(config.checkpoint_dir, step, {"ema": ema, "task_rng": rng.getstate()})
        if config.stop_at_reward is not None and ema >= config.stop_at_reward:
            break
    return result


def pick_tasks(rng: random.Random, tasks: Sequence[Any], n: int) -> list[Any]:
    """``n`` tasks: whole shuffled passes over the set, so every task is seen equally often."""
    chosen: list[Any] = []
    while len(chosen) < n:
        order = list(tasks)
        rng.shuffle(order)
        chosen.extend(order[: n - len(chosen)])
    return chosen


def as_rng_state(state: Any) -> tuple[Any, ...]:
    """A random.Random state restored from a checkpoint (torch.load may hand tuples back as lists)."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _warn(metrics: MetricsLogger | None, message: str) -> None:
    if metrics is not None:
        metrics.warn(message)
    else:
        logger.warning(message)
