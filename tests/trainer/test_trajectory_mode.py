"""``transitions="trajectory"``: one sequence per agent trajectory, trained exactly as its calls would be."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError

from agentlightning.types import Transition
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import with_advantages
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.policy import Policy


def _two_turn_rollouts(policy: Policy) -> list[Transition]:
    """Four rollouts of one task, each two calls where the second prompt extends the first prompt + reply + a tool
    result; per-call credit differs between the calls (a step reward after the first)."""
    words = policy.tokenizer.encode
    prompt = policy.tokenizer.encode_chat([{"role": "user", "content": "pick a tool"}])
    rows: list[Transition] = []
    replies = [("search", "calculator"), ("calculator", "search"), ("search", "search"), ("calculator", "calculator")]
    for r, (first, second) in enumerate([(1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.0, 0.0)]):
        reply1, tool_result, reply2 = words(replies[r][0]), words("tool"), words(replies[r][1])
        for turn, (p, reply, reward) in enumerate(
            [(prompt, reply1, first), ([*prompt, *reply1, *tool_result], reply2, second)]
        ):
            rows.append(
                Transition(
                    rollout_id=f"r{r}",
                    attempt_id=f"a{r}",
                    group_id="task",
                    turn_index=turn,
                    span_id=f"{turn:016x}",
                    prompt_token_ids=p,
                    response_token_ids=reply,
                    reward=reward,
                )
            )
    return rows


def test_a_merged_trajectory_trains_exactly_as_its_calls_under_token_mean(tool_spec: PolicySpec) -> None:
    """Same tokens, same conditioning, same per-token advantages, observation tokens masked: the same update."""
    policy = Policy.build(tool_spec)
    rows = _two_turn_rollouts(policy)
    updated: dict[str, dict[str, torch.Tensor]] = {}
    for mode in ("call", "trajectory"):
        config = LightningRLConfig(policy=tool_spec, samples_per_task=4, lr=1e-2, transitions=mode)
        batch, _ = with_advantages(rows, config)
        assert len(batch) == (8 if mode == "call" else 4)
        copied = copy.deepcopy(policy)
        stats = TorchLearner(copied, config).update(batch)
        assert stats["grad_norm"] > 1e-2  # a real gradient: Adam would blow float noise up to a full step
        updated[mode] = {k: v.clone() for k, v in copied.trainable_state_dict().items()}
    assert any(not torch.equal(updated["call"][k], v) for k, v in policy.trainable_state_dict().items())
    for key, value in updated["call"].items():
        # Equal gradients (same norm to float precision); Adam divides float noise of near-zero entries by their
        # tiny second moment, so entries agree to ~1e-5 of a ~1e-2 step.
        assert torch.allclose(value, updated["trajectory"][key], atol=1e-4), key


def test_trajectory_rows_keep_every_calls_advantage(tool_spec: PolicySpec) -> None:
    policy = Policy.build(tool_spec)
    rows, _ = with_advantages(
        _two_turn_rollouts(policy), LightningRLConfig(policy=tool_spec, samples_per_task=4, transitions="trajectory")
    )
    first = rows[0]  # rollout r0 credited [1.0, 0.0]: its first reply is pushed up, its second down
    assert first.response_mask == [1, 0, 1]
    assert first.response_advantages is not None
    up, observation, down = first.response_advantages
    assert up > 0 > down and observation == 0.0


def test_trajectory_mode_needs_grpo() -> None:
    with pytest.raises(ValidationError, match="GRPO only"):
        LightningRLConfig(algorithm="ppo", transitions="trajectory")


def _group(group: str, rewards: list[float]) -> list[Transition]:
    return [
        Transition(
            rollout_id=f"{group}-{i}",
            attempt_id=f"{group}-{i}-a",
            group_id=group,
            turn_index=0,
            span_id="0" * 16,
            prompt_token_ids=[1],
            response_token_ids=[2],
            reward=reward,
        )
        for i, reward in enumerate(rewards)
    ]


def test_drop_tied_groups_removes_groups_with_no_signal_and_reports_the_fraction() -> None:
    rows = [*_group("tied", [1.0, 1.0, 1.0]), *_group("mixed", [1.0, 0.0]), *_group("zero", [0.0, 0.0]),
            *_group("alone", [0.5])]  # fmt: skip
    kept, stats = with_advantages(rows, LightningRLConfig(drop_tied_groups=True, samples_per_task=2))
    # Ties of two or more rollouts go; a group of one keeps its (baseline-free) advantage.
    assert sorted({t.group_id for t in kept}) == ["alone", "mixed"]
    assert stats == {"tied_groups_dropped": 0.5}
    everything, stats = with_advantages(rows, LightningRLConfig(samples_per_task=2))
    assert len(everything) == len(rows) and stats == {}
    assert all(t.advantage == 0.0 for t in everything if t.group_id in ("tied", "zero"))
