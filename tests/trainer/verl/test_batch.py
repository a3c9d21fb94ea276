"""Our transitions → verl's DataProto, checked against verl's own layout helpers (shapes, masks, padding, reward)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl is not installed: the verl suite runs in .venv-verl (requirements-verl.txt)")

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_response_mask
from verl.utils.model import compute_position_id_with_mask
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from agentlightning.adapter import aggregate_trajectories
from agentlightning_trainer.verl.batch import PAD_UID, build_batch_tensors, transitions_to_batch
from tests.trainer.verl._rows import make_transition

PAD = 0


def _rows() -> list:
    return [
        make_transition("ro-a", "task-1", prompt=[5, 6, 7, 8], response=[30, 31], reward=1.0, advantage=0.5),
        make_transition("ro-b", "task-1", prompt=[5, 6], response=[40, 41, 42, 43], reward=0.0, advantage=-0.5),
        make_transition("ro-c", "task-2", prompt=[9], response=[50], reward=2.0, advantage=0.0),
    ]


def test_layout_matches_verl() -> None:
    batch = transitions_to_batch(_rows(), pad_token_id=PAD, temperature=0.7)
    assert isinstance(batch, DataProto)
    batch.check_consistency()
    b = batch.batch
    assert len(batch) == 3
    assert b["prompts"].shape == (3, 4) and b["responses"].shape == (3, 4)
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (3, 8)
    # prompts left-padded, responses right-padded, input_ids their concatenation
    assert b["prompts"].tolist() == [[5, 6, 7, 8], [PAD, PAD, 5, 6], [PAD, PAD, PAD, 9]]
    assert b["responses"].tolist() == [[30, 31, PAD, PAD], [40, 41, 42, 43], [50, PAD, PAD, PAD]]
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    assert b["attention_mask"].tolist() == [
        [1, 1, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 0, 0, 0],
    ]
    assert torch.equal(b["position_ids"], compute_position_id_with_mask(b["attention_mask"]))
    # without observation tokens the response mask is verl's own default (the response part of the attention mask)
    assert torch.equal(b["response_mask"], compute_response_mask(batch))
    for key in ("input_ids", "attention_mask", "position_ids", "response_mask", "prompts", "responses"):
        assert b[key].dtype == torch.long, key
    assert batch.meta_info["temperature"] == 0.7
    assert batch.meta_info["global_token_num"] == [6, 6, 2]


def test_reward_sits_on_the_last_response_token() -> None:
    batch = transitions_to_batch(_rows(), pad_token_id=PAD)
    b = batch.batch
    # verl's agent loop places rm_scores at attention_mask[:, prompt_len:].sum(1) - 1; so do we
    last = b["attention_mask"][:, b["prompts"].shape[1] :].sum(dim=1) - 1
    expected = torch.zeros_like(b["token_level_scores"])
    expected[torch.arange(3), last] = torch.tensor([1.0, 0.0, 2.0])
    assert torch.equal(b["token_level_scores"], expected)
    assert torch.equal(b["token_level_rewards"], b["token_level_scores"])
    assert b["token_level_scores"].sum(-1).tolist() == [1.0, 0.0, 2.0]


def test_advantages_are_placed_on_loss_tokens_only() -> None:
    b = transitions_to_batch(_rows(), pad_token_id=PAD).batch
    assert b["advantages"].tolist() == [[0.5, 0.5, 0, 0], [-0.5, -0.5, -0.5, -0.5], [0, 0, 0, 0]]
    assert torch.equal(b["returns"], b["advantages"])


def test_uid_per_task_groups_rows() -> None:
    batch = transitions_to_batch(_rows(), pad_token_id=PAD)
    assert batch.non_tensor_batch["uid"].tolist() == ["task-1", "task-1", "task-2"]
    assert batch.non_tensor_batch["uid"].dtype == object
    assert batch.non_tensor_batch["rollout_id"].tolist() == ["ro-a", "ro-b", "ro-c"]
    # the split verl uses to hand rows to data-parallel ranks keeps uids with their rows
    first, second = batch.chunk(2) if len(batch) % 2 == 0 else (batch[:2], batch[2:])
    assert first.non_tensor_batch["uid"].tolist() == ["task-1", "task-1"]
    assert second.non_tensor_batch["uid"].tolist() == ["task-2"]


def test_observation_tokens_attend_but_do_not_train() -> None:
    # two calls of one rollout whose second prompt extends the first prompt + response: merged, tool output masked
    first = make_transition("ro-a", "task-1", turn=0, prompt=[1, 2], response=[3, 4], reward=0.0, logprobs=[-0.1, -0.2])
    second = make_transition("ro-a", "task-1", turn=1, prompt=[1, 2, 3, 4, 90, 91], response=[5], reward=1.0,
                             logprobs=[-0.3])  # fmt: skip
    merged = aggregate_trajectories([first, second])
    assert len(merged) == 1
    row = merged[0].model_copy(update={"advantage": 1.0})
    b = transitions_to_batch([row], pad_token_id=PAD).batch
    assert b["responses"].tolist() == [[3, 4, 90, 91, 5]]
    assert b["attention_mask"][0, 2:].tolist() == [1, 1, 1, 1, 1]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0, 1]]
    assert b["advantages"].tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0]]
    # the merged row's reward is the mean of its calls' credit (0.0 and 1.0), on its last token
    assert b["token_level_scores"].tolist() == [[0.0, 0.0, 0.0, 0.0, 0.5]]
    assert b["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3])


def test_verl_recovers_response_positions_from_our_padding() -> None:
    """verl's worker unpads by attention mask and slices responses back out; our rows must survive the round trip."""
    batch = transitions_to_batch(_rows(), pad_token_id=PAD)
    td = left_right_2_no_padding(batch.to_tensordict())
    # log-probs of response token j are read at the position before it: the last prompt token, then response[:-1]
    shifted = no_padding_2_padding(td["input_ids"], td)
    b = batch.batch
    for row, t in enumerate(_rows()):
        n = len(t.response_token_ids)
        expected = [t.prompt_token_ids[-1], *t.response_token_ids[:-1]]
        assert shifted[row, :n].tolist() == expected
    assert torch.equal(td["loss_mask"], b["response_mask"])


def test_rollout_log_probs_only_when_every_row_has_them() -> None:
    with_lp = [
        make_transition("ro-a", "g", response=[1, 2], logprobs=[-1.0, -2.0], advantage=0.0),
        make_transition("ro-b", "g", response=[3], logprobs=[-3.0], advantage=0.0),
    ]
    b = transitions_to_batch(with_lp, pad_token_id=PAD).batch
    assert b["rollout_log_probs"].tolist() == [[-1.0, -2.0], [-3.0, 0.0]]
    assert b["rollout_log_probs"].dtype == torch.float32
    mixed = [*with_lp, make_transition("ro-c", "g", response=[4], advantage=0.0)]
    assert "rollout_log_probs" not in set(transitions_to_batch(mixed, pad_token_id=PAD).batch.keys())


def test_filler_rows_divide_the_batch_and_train_nothing() -> None:
    batch = transitions_to_batch(_rows(), pad_token_id=PAD, size_multiple=4)
    assert len(batch) == 4
    assert batch.non_tensor_batch["uid"].tolist()[-1] == PAD_UID
    b = batch.batch
    assert b["response_mask"][3].sum().item() == 0
    assert b["advantages"][3].abs().sum().item() == 0
    assert b["token_level_scores"][3].abs().sum().item() == 0
    assert b["attention_mask"][3].sum().item() > 0  # a real-looking row: verl unpads it without empty sequences
    assert batch.meta_info["agentlightning_real_rows"] == 3
    assert len(transitions_to_batch(_rows(), pad_token_id=PAD, size_multiple=3)) == 3


def test_fixed_widths_truncate_responses_and_reject_long_prompts() -> None:
    built = build_batch_tensors(_rows(), pad_token_id=PAD, prompt_length=6, response_length=3)
    assert built.tensors["prompts"].shape == (3, 6)
    assert built.tensors["responses"].shape == (3, 3)
    assert built.truncated_responses == 1
    assert built.tensors["token_level_scores"][1].tolist() == [0.0, 0.0, 0.0]
    assert built.tensors["response_mask"][1].tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="exceed prompt_length 3"):
        build_batch_tensors(_rows(), pad_token_id=PAD, prompt_length=3)


def test_rows_need_advantages_and_token_ids() -> None:
    with pytest.raises(ValueError, match="grpo_advantages"):
        build_batch_tensors([make_transition("ro-a", "g")], pad_token_id=PAD)
    with pytest.raises(ValueError, match="return_token_ids"):
        build_batch_tensors([make_transition("ro-a", "g", response=[], advantage=1.0)], pad_token_id=PAD)
    with pytest.raises(ValueError, match="no transitions"):
        build_batch_tensors([], pad_token_id=PAD)


def test_rollout_mean_scales_advantages_so_token_mean_weighs_rollouts_equally() -> None:
    rows = [
        make_transition("ro-long", "g", response=[1, 2, 3, 4, 5, 6], advantage=1.0),
        make_transition("ro-long", "g", turn=1, response=[1, 2], advantage=1.0),
        make_transition("ro-short", "g", response=[7], advantage=-1.0),
    ]
    token_mean = build_batch_tensors(rows, pad_token_id=PAD, loss_aggregation="token-mean").tensors
    rollout_mean = build_batch_tensors(rows, pad_token_id=PAD, loss_aggregation="rollout-mean").tensors
    mask = token_mean["response_mask"].to(torch.float32)
    # verl's token-mean of the unscaled advantages: the 8 tokens of ro-long outweigh ro-short's 1
    assert (token_mean["advantages"].sum() / mask.sum()).item() == pytest.approx((8 - 1) / 9)
    # with our scaling, verl's token-mean equals the mean over rollouts of each rollout's token mean: (1 + -1) / 2
    assert (rollout_mean["advantages"].sum() / mask.sum()).item() == pytest.approx(0.0, abs=1e-6)
    per_token = rollout_mean["advantages"][mask.bool()]
    assert np.allclose(per_token[:8].numpy(), 9 / (2 * 8)) and per_token[8].item() == pytest.approx(-9 / 2)
