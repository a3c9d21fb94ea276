"""Bad input fails clearly: config errors name the fix, failing reward functions exclude rollouts, empty steps skip."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from agentlightning.types import Transition
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import train_in_process
from agentlightning_trainer.torch_backend.learner import TorchLearner, load_initial_weights
from agentlightning_trainer.torch_backend.policy import Policy


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"samples_per_task": 1}, "samples_per_task >= 2"),
        ({"backend": "verl"}, "verl"),
        ({"lr": 0}, "greater than 0"),
        ({"lerning_rate": 1e-3}, "Extra inputs are not permitted"),
        ({"loss_aggregation": "sum"}, "token-mean"),
        ({"max_prompt_tokens": 250, "max_response_tokens": 16}, "max_seq_len"),
        ({"agents": []}, "train nothing"),
        ({"init_weights": "/nonexistent/weights.pt"}, "does not exist"),
    ],
)
def test_config_errors_are_clear(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LightningRLConfig.model_validate(fields)


def test_config_is_frozen() -> None:
    config = LightningRLConfig()
    with pytest.raises(ValidationError):
        config.lr = 0.5  # type: ignore[misc]  # assigning to a frozen model is the point of the test


def test_unknown_credit_strategy_fails_before_training() -> None:
    from agentlightning_trainer.lightning_rl import LightningRL

    with pytest.raises(ValueError, match="credit"):
        LightningRL(credit="no-such-strategy")


def test_failing_reward_function_excludes_rollouts(tool_spec: PolicySpec, caplog: pytest.LogCaptureFixture) -> None:
    tasks = [*tool_choice.tasks()[:3], {"request": "this task has no answer key"}]
    config = LightningRLConfig(policy=tool_spec, steps=2, tasks_per_step=4, samples_per_task=4)
    with caplog.at_level(logging.WARNING):
        result = train_in_process(config, tasks, None, messages=tool_choice.messages, score=tool_choice.score)
    assert [m.failed_rollouts for m in result.history] == [4, 4]
    assert all(m.transitions == 12 and not m.skipped for m in result.history)
    assert "rollout excluded" in caplog.text


def test_zero_trainable_transitions_skip_the_step(tool_spec: PolicySpec, caplog: pytest.LogCaptureFixture) -> None:
    def always_raises(task: Any, reply: str) -> float:
        raise RuntimeError("reward service down")

    config = LightningRLConfig(policy=tool_spec, steps=2, tasks_per_step=2, samples_per_task=2)
    policy = Policy.build(tool_spec)
    before = [p.clone() for p in policy.module.parameters()]
    with caplog.at_level(logging.WARNING):
        result = train_in_process(
            config, tool_choice.tasks(), None, messages=tool_choice.messages, score=always_raises, policy=policy
        )
    assert all(m.skipped and m.transitions == 0 for m in result.history)
    assert "no trainable transitions" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(before, policy.module.parameters(), strict=True))


def test_learner_rejects_rows_without_token_ids_clearly(tool_spec: PolicySpec) -> None:
    learner = TorchLearner(Policy.build(tool_spec), LightningRLConfig(policy=tool_spec))
    row = Transition(rollout_id="ro-1", attempt_id="at-1", group_id="g", turn_index=0, span_id="s", reward=1.0)
    with pytest.raises(ValueError, match="no token ids"):
        learner.update([row])
    with pytest.raises(ValueError, match="batch is empty"):
        learner.update([])


def test_checkpoint_resume_is_exact(tool_spec: PolicySpec, tmp_path: Path) -> None:
    def run(steps: int, checkpoint_dir: Path | None) -> Policy:
        config = LightningRLConfig(
            policy=tool_spec, steps=steps, tasks_per_step=4, samples_per_task=4, seed=3,
            checkpoint_dir=checkpoint_dir, checkpoint_every=2,
        )  # fmt: skip
        return train_in_process(
            config, tool_choice.tasks(), None, messages=tool_choice.messages, score=tool_choice.score
        ).policy

    straight = run(4, None)
    run(2, tmp_path / "ckpt")  # "crashes" after step 2, leaving a checkpoint
    resumed = run(4, tmp_path / "ckpt")
    for a, b in zip(straight.module.state_dict().values(), resumed.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert (tmp_path / "ckpt" / "latest").read_text() == "step-000004.pt"


def test_init_weights_load_from_a_state_dict_or_a_checkpoint(tool_spec: PolicySpec, tmp_path: Path) -> None:
    trained = Policy.build(tool_spec, seed=1)
    learner = TorchLearner(trained, LightningRLConfig(policy=tool_spec))
    learner.save_weights(tmp_path / "weights.pt")
    checkpoint = learner.save_checkpoint(tmp_path / "ckpt", 3)
    for source in (tmp_path / "weights.pt", checkpoint, tmp_path / "ckpt"):
        fresh = Policy.build(tool_spec, seed=2)
        load_initial_weights(fresh, source)
        for a, b in zip(trained.module.state_dict().values(), fresh.module.state_dict().values(), strict=True):
            assert torch.equal(a, b)
    other = Policy.build(PolicySpec(words=tool_spec.words, d_model=32))
    with pytest.raises(ValueError, match="give the PolicySpec the weights were trained with"):
        load_initial_weights(other, tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="without a checkpoint"):
        load_initial_weights(other, tmp_path)


def test_train_in_process_starts_from_init_weights(tool_spec: PolicySpec, tmp_path: Path) -> None:
    start = Policy.build(tool_spec, seed=7)
    TorchLearner(start, LightningRLConfig(policy=tool_spec)).save_weights(tmp_path / "start.pt")
    config = LightningRLConfig(policy=tool_spec, steps=1, tasks_per_step=2, samples_per_task=2, lr=1e-9)
    from_init = train_in_process(
        config.model_copy(update={"init_weights": tmp_path / "start.pt"}), tool_choice.tasks(), None,
        messages=tool_choice.messages, score=tool_choice.score,
    ).policy  # fmt: skip
    # lr 1e-9: the weights stay (to float precision) where they started, which is the file, not seed 0's init
    first = next(iter(from_init.module.state_dict().values()))
    assert torch.allclose(first, next(iter(start.module.state_dict().values())), atol=1e-6)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_mini_batches_of_short_replies_train(tool_spec: PolicySpec, algorithm: str) -> None:
    """A mini-batch whose replies all end before the step's longest one trains instead of a shape error."""
    config = LightningRLConfig(policy=tool_spec, algorithm=algorithm, mini_batch_size=2, epochs=2)
    learner = TorchLearner(Policy.build(tool_spec), config)
    rows = [
        Transition(
            rollout_id=f"ro-{i}",
            attempt_id=f"at-{i}",
            group_id="g",
            turn_index=0,
            span_id=f"s{i}",
            reward=float(i % 2),
            advantage=1.0 if i % 2 else -1.0,
            prompt_token_ids=[1, 2, 3],
            response_token_ids=[4] * length,
        )
        for i, length in enumerate([1, 2, 1, 2, 1, 8])
    ]
    stats = learner.update(rows)
    assert stats["trained_transitions"] == 6.0
    assert all(torch.isfinite(torch.tensor(value)) for value in stats.values())
