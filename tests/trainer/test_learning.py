"""The in-process loop learns the tool-choice task (GRPO in CI; PPO marked slow), with the measured settings."""

from __future__ import annotations

import time

import pytest
import torch

from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import evaluate_greedy, train_in_process


def _train(spec: PolicySpec, **overrides: object) -> tuple[float, float, int]:
    config = LightningRLConfig.model_validate(
        {"policy": spec, "steps": 300, "seed": 0, "val_every": 1000, "stop_at_reward": 0.8, **overrides}
    )
    result = train_in_process(config, tool_choice.tasks(), None, messages=tool_choice.messages, score=tool_choice.score)
    greedy = evaluate_greedy(result.policy, tool_choice.tasks(), tool_choice.messages, tool_choice.score, 6)
    return result.history[-1].reward_ema, greedy, len(result.history)


@pytest.mark.timeout(90)
def test_grpo_learns_tool_choice_in_process(tool_spec: PolicySpec) -> None:
    started = time.perf_counter()
    ema, greedy, steps = _train(tool_spec)
    assert ema >= 0.8, f"reward EMA {ema:.2f} after {steps} steps"
    assert greedy >= 0.9, f"greedy accuracy {greedy:.2f} after {steps} steps"
    assert time.perf_counter() - started < 90


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ppo_learns_tool_choice_in_process(tool_spec: PolicySpec) -> None:
    ema, greedy, steps = _train(tool_spec, algorithm="ppo")
    assert ema >= 0.8, f"reward EMA {ema:.2f} after {steps} steps"
    assert greedy >= 0.9, f"greedy accuracy {greedy:.2f} after {steps} steps"


def test_rollout_mean_and_kl_settings_train(tool_spec: PolicySpec) -> None:
    config = LightningRLConfig(
        policy=tool_spec, steps=3, loss_aggregation="rollout-mean", kl_coef=0.05, epochs=2, mini_batch_size=64
    )
    result = train_in_process(config, tool_choice.tasks(), None, messages=tool_choice.messages, score=tool_choice.score)
    assert [m.step for m in result.history] == [1, 2, 3]
    assert all("kl" in m.extra and m.extra["kl"] >= 0 for m in result.history)


def test_row_weights_reproduce_both_aggregations() -> None:
    """The per-row weights used for micro-batches give exactly aggregate()'s token-mean and rollout-mean."""
    from agentlightning_trainer.torch_backend.losses import aggregate, row_weights

    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        rows, width = int(torch.randint(1, 9, (1,), generator=gen)), int(torch.randint(1, 6, (1,), generator=gen))
        values = torch.randn(rows, width, generator=gen)
        lengths = torch.randint(1, width + 1, (rows,), generator=gen)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
        rollout_index = torch.unique(torch.randint(0, 4, (rows,), generator=gen), return_inverse=True)[1]
        for mode in ("token-mean", "rollout-mean"):
            expected = aggregate(values, mask, rollout_index, mode)
            got = ((values * mask).sum(dim=1) * row_weights(mask, rollout_index, mode)).sum()
            assert torch.allclose(got, expected, atol=1e-6), mode
