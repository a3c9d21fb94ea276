"""From rollouts to fine-tuning examples: pick the best rollouts per task, turn their calls into token sequences."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from agentlightning.types import Transition
from agentlightning_trainer.batches import RolloutOutcome
from agentlightning_trainer.sft.config import SFTConfig
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.policy import Policy
from agentlightning_trainer.torch_backend.tokenizer import message_text

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One supervised example: the prompt tokens, the response tokens to imitate, and where they came from."""

    prompt_ids: list[int]
    response_ids: list[int]
    source: Literal["engine", "chat"]
    rollout_id: str


def select_best(outcomes: Sequence[RolloutOutcome], config: SFTConfig) -> list[RolloutOutcome]:
    """The rollouts to imitate: per task group, all >= min_reward ('threshold') or the k best of those ('top_k')."""
    groups: dict[str, list[RolloutOutcome]] = {}
    for outcome in outcomes:
        if outcome.reward is not None and outcome.reward >= config.min_reward:
            groups.setdefault(outcome.rollout.group_id or outcome.rollout.rollout_id, []).append(outcome)
    chosen: list[RolloutOutcome] = []
    for members in groups.values():
        if config.selection == "top_k":
            members = sorted(members, key=lambda o: -(o.reward or 0.0))[: config.top_k]
        chosen.extend(members)
    return chosen


def build_examples(outcomes: Sequence[RolloutOutcome], policy: Policy, config: SFTConfig) -> list[Example]:
    """Examples of the selected agents' calls: engine token ids when present (no retokenisation drift), else chat."""
    examples: list[Example] = []
    dropped: dict[str, int] = {}
    for outcome in outcomes:
        for t in outcome.transitions:
            example, problem = _example(t, policy, config)
            if example is None:
                dropped[problem] = dropped.get(problem, 0) + 1
            else:
                examples.append(example)
    for problem, count in dropped.items():
        logger.warning("SFT dropped %d call(s): %s", count, problem)
    return examples


def _example(t: Transition, policy: Policy, config: SFTConfig) -> tuple[Example | None, str]:
    if config.token_level != "never" and t.has_token_ids:
        prompt, response, source = list(t.prompt_token_ids), list(t.response_token_ids), "engine"
    elif config.token_level == "always":
        return None, "no engine token ids (token_level='always'; route the agent's LLM through the LLM proxy)"
    else:
        if not t.prompt_messages or not t.response_messages:
            return None, "no messages recorded for the call (the adapter needs gen_ai.input/output.messages)"
        text = "".join(message_text(m) for m in t.response_messages if m.get("role", "assistant") == "assistant")
        prompt = policy.tokenizer.encode_chat(t.prompt_messages)
        response, source = [*policy.tokenizer.encode(text), policy.tokenizer.eos_id], "chat"
    if len(prompt) > config.max_prompt_tokens:
        return None, f"prompt longer than max_prompt_tokens {config.max_prompt_tokens}"
    if len(prompt) + len(response) > policy.max_seq_len:
        return None, f"prompt + response longer than the policy's max_seq_len {policy.max_seq_len}"
    return Example(prompt, response, source, t.rollout_id), ""


def fine_tune(learner: TorchLearner, examples: Sequence[Example], config: SFTConfig) -> dict[str, float]:
    """Minimise the token-mean negative log-likelihood of the responses with the learner's own AdamW."""
    policy = learner.policy
    losses: list[float] = []
    policy.module.train()
    try:
        for _ in range(config.epochs):
            order = torch.randperm(len(examples), generator=learner.sampler).tolist()
            for start in range(0, len(order), config.mini_batch_size):
                batch = [examples[i] for i in order[start : start + config.mini_batch_size]]
                logprobs, _, mask = policy.response_scores(
                    [e.prompt_ids for e in batch], [e.response_ids for e in batch]
                )
                loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
                learner.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.module.parameters(), config.max_grad_norm)
                learner.optimizer.step()
                losses.append(loss.item())
    finally:
        policy.module.eval()
    return {"nll": sum(losses) / max(1, len(losses)), "first_nll": losses[0] if losses else 0.0}
