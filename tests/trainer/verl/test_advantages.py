"""Our rollout-level GRPO advantages against verl's ``compute_grpo_outcome_advantage``.

Single-call rollouts: the two agree token for token. Multi-call rollouts: ours give a rollout the same advantage
however many calls it made (the rollout is the sample); verl, fed one row per call, groups calls and so does not.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl is not installed: the verl suite runs in .venv-verl (requirements-verl.txt)")

import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from agentlightning.adapter import grpo_advantages
from agentlightning.types import Transition
from agentlightning_trainer.verl.batch import transitions_to_batch
from tests.trainer.verl._rows import make_transition


def _verl_advantages(rows: list[Transition], *, normalize_std: bool = True) -> torch.Tensor:
    """verl's GRPO on the batch we build (one row per transition, uid = task)."""
    placeholder = [t.model_copy(update={"advantage": 0.0}) for t in rows]
    batch = transitions_to_batch(placeholder, pad_token_id=0)
    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards=batch.batch["token_level_rewards"],
        response_mask=batch.batch["response_mask"],
        index=batch.non_tensor_batch["uid"],
        norm_adv_by_std_in_grpo=normalize_std,
    )
    assert torch.equal(advantages, returns)
    return advantages


def _ours(rows: list[Transition], *, normalize_std: bool = True) -> torch.Tensor:
    return transitions_to_batch(grpo_advantages(rows, normalize_std=normalize_std), pad_token_id=0).batch["advantages"]


def _single_call_batch() -> list[Transition]:
    rewards = {"task-1": [1.0, 0.0, 0.0, 1.0, 1.0], "task-2": [0.2, 0.9, 0.4], "task-3": [1.0, 1.0]}
    rows = []
    for group, values in rewards.items():
        for index, reward in enumerate(values):
            response = list(range(1, 2 + (index % 3)))  # responses of different lengths
            rows.append(make_transition(f"ro-{group}-{index}", group, response=response, reward=reward))
    return rows


@pytest.mark.parametrize("normalize_std", [True, False])
def test_single_call_rollouts_match_verl(normalize_std: bool) -> None:
    rows = _single_call_batch()
    ours = _ours(rows, normalize_std=normalize_std)
    theirs = _verl_advantages(rows, normalize_std=normalize_std)
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_a_group_of_one_rollout_gets_verls_mean_0_std_1() -> None:
    rows = [make_transition("ro-1", "alone", reward=0.75)]
    assert torch.allclose(_ours(rows), _verl_advantages(rows))
    assert _ours(rows)[0, 0].item() == pytest.approx(0.75 / (1 + 1e-6))


def _rollout(rollout: str, group: str, calls: int, reward: float) -> list[Transition]:
    """A rollout of ``calls`` LLM calls, each credited the rollout's reward (identical/broadcast credit)."""
    return [make_transition(rollout, group, turn=i, response=[1, 2], reward=reward) for i in range(calls)]


def test_multi_call_rollouts_ours_do_not_depend_on_the_call_count() -> None:
    """Same outcome (one win, one loss per task); the winner made 1 call in task A and 5 calls in task B."""
    rows = [
        *_rollout("ro-a-win", "task-A", 1, 1.0),
        *_rollout("ro-a-loss", "task-A", 1, 0.0),
        *_rollout("ro-b-win", "task-B", 5, 1.0),
        *_rollout("ro-b-loss", "task-B", 1, 0.0),
    ]
    ours = _ours(rows)[:, 0].tolist()  # first response token of each row = the row's advantage
    theirs = _verl_advantages(rows)[:, 0].tolist()
    win_a, loss_a, win_b, loss_b = ours[0], ours[1], ours[2:7], ours[7]
    # ours: the rollout is the sample, so the 5-call winner gets exactly the 1-call winner's advantage
    assert all(value == pytest.approx(win_a) for value in win_b)
    assert loss_b == pytest.approx(loss_a)
    assert win_a == pytest.approx(2**-0.5, rel=1e-5) and loss_a == pytest.approx(-(2**-0.5), rel=1e-5)
    # verl, one row per call: task B looks like 5 wins and 1 loss, so the same outcome gets other advantages
    assert theirs[0] == pytest.approx(win_a, rel=1e-5)  # task A has one call per rollout: no difference
    assert theirs[2] != pytest.approx(win_a, rel=1e-3)
    assert theirs[7] != pytest.approx(loss_a, rel=1e-3)
    assert theirs[2] == pytest.approx((1 - 5 / 6) / (1 / 6) ** 0.5, rel=1e-4)


def test_multi_call_ours_equal_verl_applied_to_one_row_per_rollout() -> None:
    """Ours is verl's GRPO with the rollout (not the call) as the sample."""
    rows = [
        *_rollout("ro-1", "task", 3, 1.0),
        *_rollout("ro-2", "task", 1, 0.0),
        *_rollout("ro-3", "task", 4, 0.5),
        *_rollout("ro-4", "task", 2, 0.0),
    ]
    per_rollout = [rows[0], rows[3], rows[4], rows[8]]
    theirs = _verl_advantages(per_rollout)[:, 0].tolist()
    by_rollout = {t.rollout_id: t.advantage for t in grpo_advantages(rows)}
    assert [by_rollout[t.rollout_id] for t in per_rollout] == pytest.approx(theirs, rel=1e-5)
