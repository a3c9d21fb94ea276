"""Credit assignment: how an attempt's rewards become one reward per selected LLM call.

A strategy is any callable ``(CreditInput) -> Sequence[float]`` returning one reward per call in
``CreditInput.calls``. Built in (see :data:`CREDIT_STRATEGIES`):

- ``identical``: the final reward to every selected call (AGL v0.3's only behaviour).
- ``per_call``: an intermediate reward belongs to the selected calls made since the previous intermediate reward
  (so a reward emitted right after a call belongs to that call; rewards emitted together add up); the final reward
  goes to the calls after the last intermediate reward. Without intermediate rewards it equals ``identical``.
- ``discounted``: every reward is a step reward of the last selected call before it, and each call gets its
  discounted return ``G_k = r_k + gamma * G_{k+1}``; with a final reward only, call ``k`` of ``n`` gets
  ``gamma ** (n - 1 - k) * final``.

The *final* reward is the attempt's last reward span (the runner emits the rollout function's return value as one)
or the explicit ``final_reward`` override; every earlier reward span is intermediate.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, cast

from agentlightning.adapter.calls import EventOrder, LLMCall, call_order_key
from agentlightning.emit import Reward, find_rewards
from agentlightning.types import Span


@dataclass(frozen=True, slots=True)
class RewardEvent:
    """One reward of an attempt, placed among its LLM calls."""

    value: float
    """The primary dimension's value."""
    after_calls: int
    """How many calls of the attempt (every agent) came before it: it follows the call with ``turn_index ==
    after_calls - 1``."""
    is_final: bool = False
    span_id: str | None = None
    """The reward span, or None for a ``final_reward`` override with no span."""
    dimensions: Mapping[str, float] = field(default_factory=dict[str, float])


@dataclass(frozen=True, slots=True)
class CreditInput:
    """Everything a credit strategy may use."""

    calls: Sequence[LLMCall]
    """The selected calls, in event order (``turn_index`` increasing)."""
    rewards: Sequence[RewardEvent]
    """The attempt's rewards in event order; never empty; the last one is the final reward."""
    num_calls: int
    """Calls of the attempt across every agent (selected or not)."""
    gamma: float = 1.0


CreditStrategy: TypeAlias = Callable[[CreditInput], Sequence[float]]
"""A credit strategy: one reward per call of ``CreditInput.calls``, in the same order."""


def identical_credit(data: CreditInput) -> list[float]:
    """The final reward to every selected call."""
    return [data.rewards[-1].value] * len(data.calls)


def per_call_credit(data: CreditInput) -> list[float]:
    """Each intermediate reward to the calls since the previous one; the final reward to the calls after the last.

    When no call follows the last intermediate reward, the final reward is added to that reward's calls.
    """
    calls = data.calls
    credit = [0.0] * len(calls)
    turns = [call.turn_index for call in calls]
    *intermediate, final = data.rewards
    # Sum the rewards emitted in the same gap between calls: they all follow the same call.
    by_gap: dict[int, float] = {}
    for reward in intermediate:
        by_gap[reward.after_calls] = by_gap.get(reward.after_calls, 0.0) + reward.value
    start = 0  # index into calls of the first call not yet credited
    last_segment = range(0)  # the calls credited by the latest intermediate reward
    for gap in sorted(by_gap):
        stop = bisect_left(turns, gap)
        for index in range(start, stop):
            credit[index] = by_gap[gap]
        if stop > start:
            last_segment = range(start, stop)
        start = max(start, stop)
    if start < len(calls):
        for index in range(start, len(calls)):
            credit[index] = final.value
    else:
        # No call follows the last intermediate reward: the final reward sits in the same gap, and rewards in one gap
        # add up, so it joins the credit of the calls that gap rewards instead of being lost.
        for index in last_segment:
            credit[index] += final.value
    return credit


def discounted_credit(data: CreditInput) -> list[float]:
    """Discounted return of each selected call, every reward a step reward of the last selected call before it."""
    calls = data.calls
    if not calls:
        return []
    turns = [call.turn_index for call in calls]
    step = [0.0] * len(calls)
    for reward in data.rewards:
        index = bisect_left(turns, reward.after_calls) - 1
        # A reward before the first selected call has no call to credit; it rewards context, not the policy.
        if index >= 0:
            step[index] += reward.value
    returns = [0.0] * len(calls)
    running = 0.0
    for index in range(len(calls) - 1, -1, -1):
        running = step[index] + data.gamma * running
        returns[index] = running
    return returns


CREDIT_STRATEGIES: dict[str, CreditStrategy] = {
    "identical": identical_credit,
    "per_call": per_call_credit,
    "discounted": discounted_credit,
}
"""Credit strategies by name; add yours with :func:`register_credit_strategy`."""


def register_credit_strategy(name: str, strategy: CreditStrategy, *, replace: bool = False) -> None:
    """Make ``strategy`` available by ``name`` (e.g. ``TraceAdapter(credit=name)``, ``agl check``)."""
    if name in CREDIT_STRATEGIES and not replace:
        raise ValueError(f"credit strategy {name!r} is already registered; pass replace=True to override it")
    CREDIT_STRATEGIES[name] = strategy


def resolve_credit_strategy(credit: str | CreditStrategy) -> CreditStrategy:
    """The strategy for a registered name, or the callable itself."""
    if callable(credit):
        return credit
    strategy = CREDIT_STRATEGIES.get(credit)
    if strategy is None:
        raise ValueError(
            f"unknown credit strategy {credit!r}; registered: {', '.join(sorted(CREDIT_STRATEGIES))} "
            "(or pass a callable (CreditInput) -> Sequence[float], or register_credit_strategy(name, fn))"
        )
    return strategy


def assign_credit(
    calls: Sequence[LLMCall],
    rewards: Sequence[RewardEvent],
    credit: str | CreditStrategy = "per_call",
    *,
    num_calls: int | None = None,
    gamma: float = 1.0,
) -> list[float]:
    """One reward per selected call (in order) from the attempt's rewards, by the given strategy."""
    if not rewards:
        raise ValueError(
            "cannot assign credit without a reward: return a float from the rollout function or call "
            "emit_reward(...), or pass final_reward="
        )
    strategy = resolve_credit_strategy(credit)
    total = num_calls if num_calls is not None else (max((c.turn_index for c in calls), default=-1) + 1)
    result = strategy(CreditInput(calls=calls, rewards=rewards, num_calls=total, gamma=gamma))
    if len(result) != len(calls):
        name = credit if isinstance(credit, str) else getattr(credit, "__name__", repr(credit))
        raise ValueError(f"credit strategy {name} returned {len(result)} rewards for {len(calls)} calls; need one each")
    return [float(value) for value in result]


def find_reward_events(
    spans: Sequence[Span] | Mapping[str, Span],
    calls: Sequence[LLMCall],
    *,
    order: EventOrder = "time",
    final_reward: float | None = None,
) -> list[RewardEvent]:
    """The attempt's rewards in event order, placed among ``calls`` (all calls of the attempt, in event order).

    ``final_reward`` replaces the value of the final (last) reward, or is appended after the last call when the
    attempt has no reward span.
    """
    values = spans.values() if isinstance(spans, Mapping) else spans
    found: list[tuple[tuple[int, int, int], Reward]] = []
    sequence_first = order == "sequence"
    for reward in find_rewards(values):
        if reward.value is None:  # several dimensions and no primary: `agl check` reports it
            continue
        span = reward.span
        key = (span.sequence_id, span.start_time, 1) if sequence_first else (span.start_time, 1, span.sequence_id)
        found.append((key, reward))
    found.sort(key=lambda item: item[0])
    call_keys = [call_order_key(call, order) for call in calls]
    events = [
        RewardEvent(
            value=cast(float, reward.value),
            after_calls=bisect_left(call_keys, key),
            span_id=reward.span.span_id,
            dimensions=reward.dimensions,
        )
        for key, reward in found
    ]
    if final_reward is not None:
        if events:
            last = events[-1]
            events[-1] = RewardEvent(float(final_reward), last.after_calls, True, last.span_id, last.dimensions)
        else:
            events.append(RewardEvent(float(final_reward), len(calls), True, None, {}))
    elif events:
        last = events[-1]
        events[-1] = RewardEvent(last.value, last.after_calls, True, last.span_id, last.dimensions)
    return events
