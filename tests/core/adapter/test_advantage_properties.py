"""Property tests of GRPO advantages over random groups and every built-in credit strategy (hypothesis).

The definition is in :func:`agentlightning.adapter.grpo_advantages`: call advantages are deviations from the group's
mean rollout score in units of the pooled std of the same deviations, which bounds them by ``sqrt((R - 1) * n_r)``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from agentlightning.adapter import LossAggregation, grpo_advantages, loss_token_weights
from agentlightning.adapter.calls import LLMCall
from agentlightning.adapter.credit import CREDIT_STRATEGIES, RewardEvent, assign_credit
from agentlightning.types import Transition

STRATEGIES = sorted(CREDIT_STRATEGIES)


def _call(turn: int) -> LLMCall:
    return LLMCall(
        span_id=f"{turn:016x}",
        span_ids=(f"{turn:016x}",),
        response_id=None,
        agent_name=None,
        sources=("proxy",),
        start_time=turn,
        end_time=turn,
        sequence_id=turn,
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=None,
        policy_version=None,
        input_messages=None,
        output_messages=None,
        system_instructions=None,
        failed=False,
        turn_index=turn,
    )


# One rollout: its number of calls, and its rewards as (after how many calls, value); the last one is the final.
reward_value = st.sampled_from([0.0, 0.0, 1.0, 0.5, -1.0]) | st.floats(-3.0, 3.0, allow_nan=False)
rollout_shape = st.integers(1, 5).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.tuples(st.integers(0, n), reward_value), max_size=4),
        reward_value,
        st.integers(1, 4),  # response tokens of each call
    )
)
group_shape = st.lists(rollout_shape, min_size=1, max_size=6)


def _rows(groups: list[list[tuple[int, list[tuple[int, float]], float, int]]], credit: str) -> list[Transition]:
    rows: list[Transition] = []
    for g, group in enumerate(groups):
        for r, (n_calls, intermediate, final, tokens) in enumerate(group):
            calls = [_call(turn) for turn in range(n_calls)]
            events = [RewardEvent(value, after) for after, value in sorted(intermediate)]
            events.append(RewardEvent(final, n_calls, True))
            credits = assign_credit(calls, events, credit, gamma=0.9)
            for call, reward in zip(calls, credits, strict=True):
                rows.append(
                    Transition(
                        rollout_id=f"g{g}-r{r}",
                        attempt_id=f"g{g}-r{r}-a",
                        group_id=f"g{g}",
                        turn_index=call.turn_index,
                        span_id=call.span_id,
                        prompt_token_ids=[1],
                        response_token_ids=[2] * tokens,
                        reward=reward,
                    )
                )
    return rows


def _by_rollout(rows: list[Transition]) -> dict[str, list[Transition]]:
    out: dict[str, list[Transition]] = {}
    for row in rows:
        out.setdefault(row.rollout_id, []).append(row)
    return out


@pytest.mark.parametrize("credit", STRATEGIES)
@settings(max_examples=150, deadline=None)
@given(groups=st.lists(group_shape, min_size=1, max_size=3), normalize=st.booleans())
def test_advantages_are_finite_bounded_and_zero_sum(
    credit: str, groups: list[list[tuple[int, list[tuple[int, float]], float, int]]], normalize: bool
) -> None:
    rows = grpo_advantages(_rows(groups, credit), normalize_std=normalize)
    by_group: dict[str, dict[str, list[Transition]]] = {}
    for rid, rollout in _by_rollout(rows).items():
        by_group.setdefault(rollout[0].group_id, {})[rid] = rollout
    for rollouts in by_group.values():
        size = len(rollouts)
        weighted_sum = 0.0
        for rollout in rollouts.values():
            for row in rollout:
                assert row.advantage is not None and math.isfinite(row.advantage)
                if size == 1:  # no baseline: mean 0, std 1 (verl)
                    assert row.advantage == pytest.approx(row.reward / (1 + 1e-6 if normalize else 1))
                elif normalize:
                    assert abs(row.advantage) <= math.sqrt((size - 1) * len(rollout)) + 1e-9
                else:  # a deviation from a mean of rewards is bounded by their range
                    spread = max(r.reward for rs in rollouts.values() for r in rs) - min(
                        r.reward for rs in rollouts.values() for r in rs
                    )
                    assert abs(row.advantage) <= spread + 1e-9
            weighted_sum += sum(row.advantage or 0.0 for row in rollout) / len(rollout)
        if size > 1:
            assert weighted_sum == pytest.approx(0.0, abs=1e-6 * size * 10)


@settings(max_examples=150, deadline=None)
@given(groups=st.lists(group_shape, min_size=1, max_size=3))
def test_identical_credit_gives_one_advantage_per_rollout(
    groups: list[list[tuple[int, list[tuple[int, float]], float, int]]],
) -> None:
    for rollout in _by_rollout(grpo_advantages(_rows(groups, "identical"))).values():
        assert len({row.advantage for row in rollout}) == 1


@settings(max_examples=150, deadline=None)
@given(groups=st.lists(group_shape, min_size=1, max_size=3))
def test_rollout_mean_gives_every_rollout_the_same_weight(
    groups: list[list[tuple[int, list[tuple[int, float]], float, int]]],
) -> None:
    rows = _rows(groups, "per_call")
    weights = loss_token_weights(rows, LossAggregation.ROLLOUT_MEAN)
    per_rollout: dict[str, float] = {}
    for row, weight in zip(rows, weights, strict=True):
        per_rollout[row.rollout_id] = per_rollout.get(row.rollout_id, 0.0) + weight * len(row.response_token_ids)
    assert all(total == pytest.approx(1 / len(per_rollout)) for total in per_rollout.values())


def _tied_group() -> list[Transition]:
    """A rag-like tied group: every rollout scores 0.5 overall, but per-call credit split it 1/0 or 0/1."""
    rows: list[Transition] = []
    for r, split in enumerate([(1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]):
        for turn, reward in enumerate(split):
            rows.append(
                Transition(
                    rollout_id=f"r{r}",
                    attempt_id=f"a{r}",
                    group_id="task",
                    turn_index=turn,
                    span_id=f"{turn:016x}",
                    prompt_token_ids=[1],
                    response_token_ids=[2],
                    reward=reward,
                )
            )
    return rows


def test_a_tied_group_with_per_call_credit_stays_bounded() -> None:
    """Dividing call deviations by the std of the (tied) rollout scores gave |A| = 5e5 here (a rag run, issue 25)."""
    rows = grpo_advantages(_tied_group())
    advantages = [row.advantage or 0.0 for row in rows]
    assert max(abs(a) for a in advantages) <= math.sqrt(3 * 2)
    # Hand-computed: mean 0.5; pooled var = (3 rollouts * 2 calls * 0.25 / 2 + 0) / 3 = 0.25 -> std 0.5.
    expected = [1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 1.0, -1.0]
    assert advantages == pytest.approx([e * 0.5 / (0.5 + 1e-6) for e in expected])


def test_a_group_where_every_call_scored_the_same_gets_zero() -> None:
    rows = [row.model_copy(update={"reward": 0.25}) for row in _tied_group()]
    assert [row.advantage for row in grpo_advantages(rows)] == [0.0] * len(rows)
