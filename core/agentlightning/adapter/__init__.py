"""Spans → call tree → selected LLM calls → credit assignment → ``Transition`` rows; advantages; ``agl check``.

Typical use by an algorithm::

    adapter = TraceAdapter(agents="writer", credit="per_call")
    rows = adapter.adapt(rollout, await store.query_spans(rollout.rollout_id, "latest"))
    rows = grpo_advantages(rows_of_the_whole_batch)
"""

from agentlightning.adapter.advantages import (
    LossAggregation,
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    loss_token_weights,
)
from agentlightning.adapter.calls import EventOrder, LLMCall, find_llm_calls, is_llm_span
from agentlightning.adapter.check import CheckReport, RolloutCheck, check_store
from agentlightning.adapter.credit import (
    CREDIT_STRATEGIES,
    CreditInput,
    CreditStrategy,
    RewardEvent,
    assign_credit,
    discounted_credit,
    find_reward_events,
    identical_credit,
    per_call_credit,
    register_credit_strategy,
)
from agentlightning.adapter.retokenize import RetokenizeCounts, Retokenized, RetokenizeMode, Retokenizer
from agentlightning.adapter.selection import AgentSelector, AgentSpec
from agentlightning.adapter.trace import AttemptTrace, TraceAdapter, aggregate_trajectories, call_messages
from agentlightning.adapter.tree import CallTree, build_call_tree

__all__ = [
    "CREDIT_STRATEGIES",
    "AgentSelector",
    "AgentSpec",
    "AttemptTrace",
    "CallTree",
    "CheckReport",
    "CreditInput",
    "CreditStrategy",
    "EventOrder",
    "LLMCall",
    "LossAggregation",
    "RetokenizeCounts",
    "RetokenizeMode",
    "Retokenized",
    "Retokenizer",
    "RewardEvent",
    "RolloutCheck",
    "TraceAdapter",
    "aggregate_trajectories",
    "assign_credit",
    "build_call_tree",
    "call_messages",
    "check_store",
    "discounted_credit",
    "discounted_returns",
    "find_llm_calls",
    "find_reward_events",
    "gae_advantages",
    "grpo_advantages",
    "identical_credit",
    "is_llm_span",
    "loss_token_weights",
    "per_call_credit",
    "register_credit_strategy",
]
