"""Agent selection and credit assignment strategies on hand-built multi-agent traces."""

from __future__ import annotations

import re

import pytest

from agentlightning.adapter import (
    CREDIT_STRATEGIES,
    AgentSelector,
    CreditInput,
    TraceAdapter,
    assign_credit,
    find_llm_calls,
    find_reward_events,
    register_credit_strategy,
)
from agentlightning.types import Rollout
from tests.core.adapter.builders import TraceBuilder

ROLLOUT = Rollout(rollout_id="ro-1", input="task", group_id="task-1", enqueue_time=0)


def crew() -> TraceBuilder:
    """planner → writer → critic → writer, with one intermediate reward after the first writer call."""
    b = TraceBuilder()
    root = b.add("crew", {}, start=0, end=10**9)
    planner = b.agent("planner", parent=root)
    b.llm(parent=planner, prompt=[1], response=[2])  # turn 0
    writer = b.agent("writer", parent=root)
    b.llm(parent=writer, prompt=[3], response=[4])  # turn 1
    b.reward(0.3)
    critic = b.agent("critic", parent=root)
    b.llm(parent=critic, prompt=[5], response=[6])  # turn 2
    b.llm(parent=writer, prompt=[7], response=[8])  # turn 3
    b.reward(1.0)  # the returned reward
    return b


def test_two_of_three_agents_selected_others_are_context() -> None:
    rows = TraceAdapter(agents=["planner", "writer"], credit="identical").adapt(ROLLOUT, crew().spans)
    assert [(r.agent_name, r.turn_index) for r in rows] == [("planner", 0), ("writer", 1), ("writer", 3)]
    assert all(r.reward == 1.0 for r in rows)


def test_default_selects_every_agent() -> None:
    rows = TraceAdapter(credit="identical").adapt(ROLLOUT, crew().spans)
    assert [r.agent_name for r in rows] == ["planner", "writer", "critic", "writer"]


@pytest.mark.parametrize(
    ("agents", "expected"),
    [
        ("writer", {"writer"}),
        ("re:(planner|critic)", {"planner", "critic"}),
        (re.compile("c.*"), {"critic"}),
        ("*er", {"planner", "writer"}),
        (["writer", "crit?c"], {"writer", "critic"}),
        (None, {"planner", "writer", "critic", "writeroo", None}),
    ],
)
def test_selector_forms(agents: str | re.Pattern[str] | list[str] | None, expected: set[str | None]) -> None:
    selector = AgentSelector(agents)
    assert {n for n in ("planner", "writer", "critic", "writeroo", None) if selector.matches(n)} == expected


def test_selector_errors_teach() -> None:
    with pytest.raises(ValueError, match="pass None to train every agent"):
        AgentSelector([])
    with pytest.raises(ValueError, match="not a valid regular expression"):
        AgentSelector("re:(")
    assert AgentSelector(["a", re.compile("b.*")]).describe() == "agents 'a', re:'b.*'"


def test_per_call_intermediate_reward_belongs_to_the_call_before_it() -> None:
    rows = TraceAdapter(agents=["planner", "writer"], credit="per_call").adapt(ROLLOUT, crew().spans)
    # planner and the first writer call made up the segment closed by 0.3; the final reward goes to the rest.
    assert [(r.turn_index, r.reward) for r in rows] == [(0, 0.3), (1, 0.3), (3, 1.0)]
    rows = TraceAdapter(agents="writer", credit="per_call").adapt(ROLLOUT, crew().spans)
    assert [(r.turn_index, r.reward) for r in rows] == [(1, 0.3), (3, 1.0)]


def test_per_call_rewards_in_one_gap_add_up_including_a_final_reward_with_no_call_after() -> None:
    b = TraceBuilder()
    b.llm(prompt=[1], response=[2])
    b.reward(0.2)
    b.reward(0.3)
    b.llm(prompt=[3], response=[4])
    b.reward(0.5)
    b.reward(9.0)  # the outcome after the last step reward: same gap, so it adds to that call, never lost
    rows = TraceAdapter(credit="per_call").adapt(ROLLOUT, b.spans)
    assert [r.reward for r in rows] == [0.5, 9.5]


def test_per_call_without_intermediate_rewards_equals_identical() -> None:
    b = TraceBuilder()
    for i in range(3):
        b.llm(prompt=[i], response=[i])
    b.reward(0.7)
    assert [r.reward for r in TraceAdapter(credit="per_call").adapt(ROLLOUT, b.spans)] == [0.7] * 3


def test_discounted_from_the_end() -> None:
    b = TraceBuilder()
    for i in range(3):
        b.llm(prompt=[i], response=[i])
    b.reward(1.0)
    rows = TraceAdapter(credit="discounted", gamma=0.5).adapt(ROLLOUT, b.spans)
    assert [r.reward for r in rows] == [0.25, 0.5, 1.0]
    rows = TraceAdapter(agents="writer", credit="discounted", gamma=0.5).adapt(ROLLOUT, crew().spans)
    # writer calls at turns 1 and 3: step rewards 0.3 (after turn 1) and 1.0 (after turn 3)
    assert [r.reward for r in rows] == [pytest.approx(0.3 + 0.5 * 1.0), 1.0]


def test_user_defined_strategy_callable_and_registered() -> None:
    def last_call_only(data: CreditInput) -> list[float]:
        return [data.rewards[-1].value if c is data.calls[-1] else 0.0 for c in data.calls]

    rows = TraceAdapter(agents="writer", credit=last_call_only).adapt(ROLLOUT, crew().spans)
    assert [r.reward for r in rows] == [0.0, 1.0]
    register_credit_strategy("last_call_only_test", last_call_only)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_credit_strategy("last_call_only_test", last_call_only)
        rows = TraceAdapter(agents="writer", credit="last_call_only_test").adapt(ROLLOUT, crew().spans)
        assert [r.reward for r in rows] == [0.0, 1.0]
    finally:
        del CREDIT_STRATEGIES["last_call_only_test"]


def test_bad_strategy_errors_teach() -> None:
    with pytest.raises(ValueError, match="registered: discounted, identical, per_call"):
        TraceAdapter(credit="nope")
    with pytest.raises(ValueError, match="returned 0 rewards for 2 calls"):
        TraceAdapter(agents="writer", credit=lambda data: []).adapt(ROLLOUT, crew().spans)
    with pytest.raises(ValueError, match="gamma must be within"):
        TraceAdapter(gamma=1.5)


def test_final_reward_override_and_missing_reward() -> None:
    spans = crew().spans
    rows = TraceAdapter(agents="writer", credit="per_call").adapt(ROLLOUT, spans, final_reward=0.0)
    assert [r.reward for r in rows] == [0.3, 0.0]
    b = TraceBuilder()
    b.llm(prompt=[1], response=[2])
    assert TraceAdapter().adapt(ROLLOUT, b.spans) == []
    assert [r.reward for r in TraceAdapter().adapt(ROLLOUT, b.spans, final_reward=0.5)] == [0.5]
    assert [r.reward for r in TraceAdapter(default_reward=0.0).adapt(ROLLOUT, b.spans)] == [0.0]


def test_assign_credit_directly() -> None:
    b = crew()
    calls = find_llm_calls(b.spans)
    rewards = find_reward_events(b.spans, calls)
    assert [(r.after_calls, r.is_final) for r in rewards] == [(2, False), (4, True)]
    selected = [c for c in calls if c.agent_name == "writer"]
    assert assign_credit(selected, rewards, "identical") == [1.0, 1.0]
    with pytest.raises(ValueError, match="emit_reward"):
        assign_credit(selected, [], "identical")


def test_multi_dimension_reward_uses_primary() -> None:
    b = TraceBuilder()
    b.llm(prompt=[1], response=[2])
    b.reward(0.8, brevity=0.1)
    rewards = find_reward_events(b.spans, find_llm_calls(b.spans))
    assert rewards[0].value == 0.8 and rewards[0].dimensions == {"reward": 0.8, "brevity": 0.1}
