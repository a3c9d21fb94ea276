"""Selection of the best rollouts and their conversion to examples: engine token ids, chat re-tokenisation, drops."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from agentlightning.types import Rollout, Transition
from agentlightning_trainer.batches import RolloutOutcome
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.sft import SFTConfig, build_examples, fine_tune, select_best
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.policy import Policy

PROMPT = [{"role": "system", "content": "Pick a tool."}, {"role": "user", "content": "add 45 and 98"}]


def _outcome(index: int, group: str, reward: float | None, *, token_ids: bool = True) -> RolloutOutcome:
    rollout = Rollout(
        rollout_id=f"ro-{index}", input={}, group_id=group, status="succeeded", enqueue_time=time.time_ns()
    )
    t = Transition(
        rollout_id=rollout.rollout_id,
        attempt_id="at-1",
        group_id=group,
        turn_index=0,
        span_id=f"{index:016x}",
        prompt_token_ids=[1, 5, 6] if token_ids else [],
        response_token_ids=[7, 8, 2] if token_ids else [],
        reward=reward or 0.0,
        prompt_messages=PROMPT,
        response_messages=[{"role": "assistant", "content": "calculator"}],
    )
    return RolloutOutcome(rollout, reward, [t])


def test_top_k_and_threshold_selection_per_task() -> None:
    outcomes = [
        _outcome(0, "a", 1.0), _outcome(1, "a", 0.5), _outcome(2, "a", 0.9), _outcome(3, "a", None),
        _outcome(4, "b", 0.2), _outcome(5, "b", 0.7),
    ]  # fmt: skip
    top = select_best(outcomes, SFTConfig(selection="top_k", top_k=2, min_reward=0.5))
    assert sorted(o.rollout.rollout_id for o in top) == ["ro-0", "ro-2", "ro-5"]
    kept = select_best(outcomes, SFTConfig(selection="threshold", min_reward=0.5))
    assert sorted(o.rollout.rollout_id for o in kept) == ["ro-0", "ro-1", "ro-2", "ro-5"]
    assert select_best(outcomes, SFTConfig(min_reward=2.0)) == []


def test_engine_token_ids_are_used_as_is_and_chat_is_retokenised(tool_spec: PolicySpec) -> None:
    policy = Policy.build(tool_spec)
    engine = build_examples([_outcome(0, "a", 1.0)], policy, SFTConfig(policy=tool_spec))
    assert [(e.source, e.prompt_ids, e.response_ids) for e in engine] == [("engine", [1, 5, 6], [7, 8, 2])]

    chat = build_examples([_outcome(1, "a", 1.0, token_ids=False)], policy, SFTConfig(policy=tool_spec))
    tokenizer = policy.tokenizer
    assert len(chat) == 1 and chat[0].source == "chat"
    assert chat[0].prompt_ids == tokenizer.encode_chat(PROMPT)
    assert tokenizer.decode(chat[0].response_ids) == "calculator"
    assert chat[0].response_ids[-1] == tokenizer.eos_id  # the model learns to stop

    never = build_examples([_outcome(2, "a", 1.0)], policy, SFTConfig(policy=tool_spec, token_level="never"))
    assert never[0].source == "chat"


def test_dropped_calls_are_logged_with_the_fix(tool_spec: PolicySpec, caplog: pytest.LogCaptureFixture) -> None:
    policy = Policy.build(tool_spec)
    caplog.set_level(logging.WARNING, logger="agentlightning_trainer.sft")
    config = SFTConfig(policy=tool_spec, token_level="always")
    assert build_examples([_outcome(0, "a", 1.0, token_ids=False)], policy, config) == []
    short = SFTConfig(policy=tool_spec, max_prompt_tokens=4, token_level="never")
    assert build_examples([_outcome(1, "a", 1.0)], policy, short) == []
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "no engine token ids" in messages and "route the agent's LLM through the LLM proxy" in messages
    assert "prompt longer than max_prompt_tokens 4" in messages


def test_fine_tune_lowers_the_nll_of_the_examples(tool_spec: PolicySpec) -> None:
    torch.manual_seed(0)
    config = SFTConfig(policy=tool_spec, epochs=20, lr=1e-3)
    policy = Policy.build(tool_spec)
    learner = TorchLearner(policy, config.learner_config())
    examples = build_examples([_outcome(0, "a", 1.0, token_ids=False)], policy, config)
    first = fine_tune(learner, examples, config)
    again = fine_tune(learner, examples, config)
    assert again["nll"] < first["first_nll"] / 2
    prompt = examples[0].prompt_ids
    greedy = policy.generate([prompt], temperatures=[0.0], max_new_tokens=[12])[0]
    assert policy.tokenizer.decode(greedy.token_ids) == "calculator"
