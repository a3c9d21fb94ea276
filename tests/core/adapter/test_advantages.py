"""GRPO at rollout level, PPO-style returns/GAE, loss weights, and trajectory aggregation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentlightning.adapter import (
    LossAggregation,
    TraceAdapter,
    aggregate_trajectories,
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    loss_token_weights,
)
from agentlightning.types import Rollout, Transition
from tests.core.adapter.builders import TraceBuilder


def rollout_rows(rollout_id: str, group: str, calls: int, reward: float) -> list[Transition]:
    b = TraceBuilder(rollout_id=rollout_id)
    for i in range(calls):
        b.llm(prompt=[i], response=[i, i])
    b.reward(reward)
    rollout = Rollout(rollout_id=rollout_id, input=None, group_id=group, enqueue_time=0)
    return TraceAdapter(credit="identical").adapt(rollout, b.spans)


def test_grpo_same_outcome_same_advantage_regardless_of_call_count() -> None:
    # Group A: a 1-call success against a 5-call failure; group B: a 5-call success against a 1-call failure.
    rows = [
        *rollout_rows("a-win", "A", 1, 1.0),
        *rollout_rows("a-lose", "A", 5, 0.0),
        *rollout_rows("b-win", "B", 5, 1.0),
        *rollout_rows("b-lose", "B", 1, 0.0),
    ]
    out = grpo_advantages(rows)
    by_rollout: dict[str, set[float]] = {}
    for t in out:
        assert t.advantage is not None
        by_rollout.setdefault(t.rollout_id, set()).add(round(t.advantage, 9))
    assert all(len(values) == 1 for values in by_rollout.values())  # one advantage per rollout
    # std of [1, 0] (unbiased) = 0.7071: +/-0.7071 in both groups, whatever the number of calls
    assert by_rollout["a-win"] == by_rollout["b-win"] == {round(0.5 / (0.5**0.5 + 1e-6), 9)}
    assert by_rollout["a-lose"] == by_rollout["b-lose"] == {round(-0.5 / (0.5**0.5 + 1e-6), 9)}
    assert all(t.advantage is None for t in rows)  # inputs are untouched copies


def test_grpo_without_std_and_single_rollout_group() -> None:
    rows = [*rollout_rows("r1", "g", 2, 1.0), *rollout_rows("r2", "g", 3, 0.0), *rollout_rows("solo", "s", 2, 0.4)]
    out = {t.rollout_id: t.advantage for t in grpo_advantages(rows, normalize_std=False)}
    assert out == {"r1": 0.5, "r2": -0.5, "solo": 0.4}


def test_grpo_rejects_mixed_groups_within_a_rollout() -> None:
    rows = rollout_rows("r1", "g", 2, 1.0)
    rows[1] = rows[1].model_copy(update={"group_id": "other"})
    with pytest.raises(ValueError, match="every transition of a rollout must carry"):
        grpo_advantages(rows)


def test_grpo_per_call_credit_shifts_calls_around_the_rollout_advantage() -> None:
    rows = [*rollout_rows("r1", "g", 1, 1.0), *rollout_rows("r2", "g", 1, 0.0)]
    varied = rows[0].model_copy(update={"reward": 0.5, "turn_index": 1})
    out = grpo_advantages([rows[0], varied, rows[1]], normalize_std=False)
    # rollout scores: r1 = 0.75, r2 = 0.0 -> mean 0.375; calls keep their own deviation
    assert [t.advantage for t in out] == [pytest.approx(0.625), pytest.approx(0.125), pytest.approx(-0.375)]


def test_discounted_returns_and_gae() -> None:
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    advantages, returns = gae_advantages([0.0, 1.0], [0.5, 0.5], gamma=1.0, lam=1.0)
    assert advantages == [0.5, 0.5] and returns == [1.0, 1.0]
    advantages, _ = gae_advantages([0.0, 1.0], [0.5, 0.5], gamma=0.9, lam=0.0)
    assert advantages == [pytest.approx(0.9 * 0.5 - 0.5), pytest.approx(0.5)]
    with pytest.raises(ValueError, match="one value per reward"):
        gae_advantages([1.0], [])


def test_loss_token_weights() -> None:
    rows = [*rollout_rows("r1", "g", 1, 1.0), *rollout_rows("r2", "g", 3, 0.0)]  # 2 tokens vs 6 tokens
    assert loss_token_weights(rows, LossAggregation.TOKEN_MEAN) == [1 / 8] * 4
    weights = loss_token_weights(rows, "rollout-mean")
    assert weights == [1 / 4, 1 / 12, 1 / 12, 1 / 12]
    assert sum(w * len(t.response_token_ids) for w, t in zip(weights, rows, strict=True)) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        loss_token_weights(rows, "sequence-sum")


def test_trajectory_aggregation_masks_observation_tokens() -> None:
    b = TraceBuilder()
    b.llm(
        agent="w",
        prompt=[1, 2],
        response=[3, 4],
        logprobs=[-0.3, -0.4],
        messages=[{"role": "user", "content": "q"}],
        output=[{"role": "assistant", "content": "a1"}],
    )
    # prompt = previous prompt + response + tool result [9, 9]
    b.llm(
        agent="w",
        prompt=[1, 2, 3, 4, 9, 9],
        response=[5],
        logprobs=[-0.5],
        messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a1"},
            {"role": "tool", "content": "r"},
        ],
        output=[{"role": "assistant", "content": "a2"}],
    )
    b.reward(0.5)
    b.llm(agent="w", prompt=[1, 2, 3, 4, 9, 9, 5, 7], response=[6], logprobs=[-0.6])
    b.llm(agent="w", prompt=[42], response=[43])  # a fresh context: starts a new row
    b.reward(1.0)
    rollout = Rollout(rollout_id="ro-1", input=None, enqueue_time=0)
    rows = TraceAdapter(credit="per_call", aggregate_trajectories=True).adapt(rollout, b.spans)
    assert len(rows) == 2
    merged, fresh = rows
    assert merged.prompt_token_ids == [1, 2]
    assert merged.response_token_ids == [3, 4, 9, 9, 5, 7, 6]
    assert merged.response_mask == [1, 1, 0, 0, 1, 0, 1]
    assert merged.response_logprobs == [-0.3, -0.4, 0.0, 0.0, -0.5, 0.0, -0.6]
    # per_call credit: 0.5 to the first two calls, 1.0 to the third; no credit is dropped: the row's reward is their
    # mean, the rollout score GRPO uses
    assert merged.reward == pytest.approx((0.5 + 0.5 + 1.0) / 3) and merged.turn_index == 0
    assert merged.advantage is None and merged.response_advantages is None  # merged before advantages: none
    assert fresh.prompt_token_ids == [42] and fresh.response_mask is None
    assert len(merged.response_token_ids) == len(merged.response_mask or [])


def test_merging_after_advantages_keeps_each_calls_advantage_per_token() -> None:
    """The trainer's transitions="trajectory": advantages on the per-call rows, then one sequence per trajectory."""

    def attempt(rollout_id: str, first: float, second: float) -> list[Transition]:
        b = TraceBuilder(rollout_id=rollout_id)
        b.llm(prompt=[1], response=[2, 3])
        b.reward(first)
        b.llm(prompt=[1, 2, 3, 8], response=[4])  # observation [8] (a tool result) between the replies
        b.reward(second)
        rollout = Rollout(rollout_id=rollout_id, input=None, group_id="g", enqueue_time=0)
        return TraceAdapter(credit="per_call").adapt(rollout, b.spans)

    calls = grpo_advantages([*attempt("r1", 1.0, 0.0), *attempt("r2", 0.0, 0.0)], normalize_std=False)
    # scores: r1 = 0.5, r2 = 0 -> mean 0.25; call advantages r1: [0.75, -0.25], r2: [-0.25, -0.25]
    assert [t.advantage for t in calls] == pytest.approx([0.75, -0.25, -0.25, -0.25])
    r1, r2 = aggregate_trajectories(calls)
    assert r1.response_token_ids == [2, 3, 8, 4] and r1.response_mask == [1, 1, 0, 1]
    assert r1.response_advantages == pytest.approx([0.75, 0.75, 0.0, -0.25])
    assert r1.advantage == pytest.approx(0.25) and r1.reward == pytest.approx(0.5)
    assert r2.response_advantages == pytest.approx([-0.25, -0.25, 0.0, -0.25])
    with pytest.raises(ValueError, match="compute advantages on the per-call rows"):
        grpo_advantages([r1, r2])


def test_aggregation_keeps_agents_and_versions_apart() -> None:
    b = TraceBuilder()
    b.llm(agent="w", prompt=[1], response=[2], version=1)
    b.llm(agent="w", prompt=[1, 2, 3], response=[4], version=2)
    b.llm(agent="c", prompt=[1, 2, 3, 4], response=[5], version=2)
    b.reward(1.0)
    rows = TraceAdapter(credit="identical").adapt(Rollout(rollout_id="ro-1", input=None, enqueue_time=0), b.spans)
    assert len(aggregate_trajectories(rows)) == 3


def test_core_adapter_does_not_import_torch_or_numpy() -> None:
    code = (
        "import sys, agentlightning.adapter; "
        "bad = [m for m in ('torch', 'numpy', 'verl') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fast_rows_equal_validated_transitions() -> None:
    from agentlightning.adapter._rows import new_transition, with_updates

    values = rollout_rows("r1", "g", 1, 1.0)[0].model_dump()
    fast = new_transition(dict(values))
    assert fast == Transition.model_validate(values)
    assert Transition.model_validate_json(fast.model_dump_json()) == fast
    updated = with_updates(fast, {"advantage": 0.25})
    assert updated.advantage == 0.25 and fast.advantage is None
    updated.reward = 2.0  # assignment on one row leaves the other alone
    assert fast.reward == 1.0 and fast.model_fields_set == set(Transition.model_fields)
