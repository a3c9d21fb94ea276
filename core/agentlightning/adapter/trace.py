"""TraceAdapter: the spans of a rollout's attempt → its selected LLM calls with credit → ``Transition`` rows."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from agentlightning.adapter._rows import new_transition, with_updates
from agentlightning.adapter.calls import EventOrder, LLMCall, scan_attempt
from agentlightning.adapter.credit import (
    CreditStrategy,
    RewardEvent,
    assign_credit,
    find_reward_events,
    resolve_credit_strategy,
)
from agentlightning.adapter.retokenize import RetokenizeCounts, RetokenizeMode, Retokenizer
from agentlightning.adapter.selection import AgentSelector, AgentSpec
from agentlightning.adapter.tree import CallTree, build_call_tree
from agentlightning.types import Rollout, Span, Transition

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class AttemptTrace:
    """What the adapter found in one attempt, before credit: the tree, every call, the selected ones, rewards."""

    attempt_id: str | None
    tree: CallTree
    calls: list[LLMCall]
    """Every LLM call of the attempt, in event order (``turn_index`` = position)."""
    selected: list[LLMCall]
    """The calls of the selected agents (the others are context only)."""
    rewards: list[RewardEvent]
    """Rewards in event order; the last is final. Empty when the attempt has none and no override was given."""


class TraceAdapter:
    """Turns the spans of one rollout attempt into training rows, one per selected LLM call (or merged trajectory).

    ``agents``: which agents to train (see :class:`AgentSelector`; default all). ``credit``: a registered strategy
    name (``identical``, ``per_call``, ``discounted``, ...) or a callable ``(CreditInput) -> Sequence[float]``.
    ``gamma``: discount of the ``discounted`` strategy (passed to every strategy). ``aggregate_trajectories``:
    merge successive calls whose prompt extends the previous prompt + response exactly into one row with
    observation tokens masked out (``response_mask`` 0). ``order``: how calls and rewards are ordered (see
    :data:`~agentlightning.adapter.calls.EventOrder`). ``default_reward``: the reward of an attempt that recorded
    none (e.g. ``0.0`` to train on timeouts as failures); None drops such attempts (logged). ``include_messages``:
    parse the calls' chat messages into the rows (text algorithms need them; RL does not). ``retokenizer``: gives
    calls recorded without token ids re-tokenised ids (see :mod:`agentlightning.adapter.retokenize`), used as
    ``retokenize`` says; :attr:`retokenize_counts` counts them until :meth:`take_retokenize_counts`.
    """

    def __init__(
        self,
        agents: AgentSpec = None,
        credit: str | CreditStrategy = "per_call",
        gamma: float = 1.0,
        aggregate_trajectories: bool = False,
        *,
        order: EventOrder = "time",
        default_reward: float | None = None,
        include_messages: bool = True,
        retokenizer: Retokenizer | None = None,
        retokenize: RetokenizeMode = "matching",
    ) -> None:
        """Configure the adapter; a bad ``credit`` name or ``gamma`` fails here, before any rollout is read."""
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be within [0, 1]; got {gamma}")
        if order not in ("time", "sequence"):
            raise ValueError(f"order must be 'time' or 'sequence'; got {order!r}")
        self.selector = AgentSelector.of(agents)
        self.credit = credit
        self._strategy = resolve_credit_strategy(credit)
        self.gamma = gamma
        self.aggregate_trajectories = aggregate_trajectories
        self.order: EventOrder = order
        self.default_reward = default_reward
        self.include_messages = include_messages
        self.retokenizer = retokenizer
        self.retokenize: RetokenizeMode = retokenize
        self.retokenize_counts = RetokenizeCounts()

    def take_retokenize_counts(self) -> RetokenizeCounts:
        """The re-tokenisation counts since the last call (one training step's), and start counting afresh."""
        counts, self.retokenize_counts = self.retokenize_counts, RetokenizeCounts()
        return counts

    def trace(self, spans: Sequence[Span], *, final_reward: float | None = None) -> AttemptTrace:
        """Tree, calls, selected calls and rewards of the latest attempt among ``spans``."""
        attempt_id, spans = _latest_attempt(spans)
        tree = build_call_tree(spans)
        calls, reward_spans = scan_attempt(tree, self.order)
        matches = self.selector.matches
        selected = [call for call in calls if matches(call.agent_name)]
        rewards = find_reward_events(reward_spans, calls, order=self.order, final_reward=final_reward)
        if not rewards and self.default_reward is not None:
            rewards = [RewardEvent(float(self.default_reward), len(calls), True)]
        return AttemptTrace(attempt_id, tree, calls, selected, rewards)

    def adapt(self, rollout: Rollout, spans: Sequence[Span], *, final_reward: float | None = None) -> list[Transition]:
        """Training rows of the rollout's latest attempt in ``spans`` (query spans with ``attempt_id="latest"``).

        ``final_reward`` overrides the final reward (see :mod:`agentlightning.adapter.credit`). An attempt with no
        reward yields no rows unless ``default_reward`` is set; calls without token ids still yield rows (text
        algorithms use their messages) — RL trainers keep rows with ``has_token_ids``.
        """
        trace = self.trace(spans, final_reward=final_reward)
        if not trace.selected:
            return []
        if not trace.rewards:
            logger.warning(
                "rollout %s has no reward; its %d selected calls are skipped (return a float from the rollout "
                "function, call emit_reward(...), or set TraceAdapter(default_reward=0.0))",
                rollout.rollout_id,
                len(trace.selected),
            )
            return []
        rewards = assign_credit(
            trace.selected, trace.rewards, self._strategy, num_calls=len(trace.calls), gamma=self.gamma
        )
        rows = [
            self._transition(rollout, trace.attempt_id, call, reward)
            for call, reward in zip(trace.selected, rewards, strict=True)
        ]
        if self.aggregate_trajectories:
            rows = aggregate_trajectories(rows)
        return rows

    def _transition(self, rollout: Rollout, attempt_id: str | None, call: LLMCall, reward: float) -> Transition:
        prompt_messages = response_messages = None
        if self.include_messages:
            prompt_messages = _messages(call.input_messages)
            system = _messages(call.system_instructions, role="system")
            if system:
                prompt_messages = system + (prompt_messages or [])
            response_messages = _messages(call.output_messages, role="assistant")
        prompt_ids, response_ids = call.prompt_token_ids, call.response_token_ids
        if self.retokenizer is not None and self.retokenize != "off" and not call.has_token_ids:
            result = self.retokenizer(call)
            if self.retokenize_counts.add(result, self.retokenize):
                prompt_ids, response_ids = result.prompt_token_ids, result.response_token_ids
        # Plain construction: every value already has its field's type; validation would triple the adapter's cost.
        return new_transition(
            {
                "rollout_id": rollout.rollout_id,
                "attempt_id": attempt_id or "",
                "group_id": rollout.group_id or rollout.rollout_id,
                "agent_name": call.agent_name,
                "turn_index": call.turn_index,
                "span_id": call.span_id,
                "prompt_token_ids": prompt_ids,
                "response_token_ids": response_ids,
                "response_logprobs": call.response_logprobs,
                "reward": reward,
                "advantage": None,
                "response_advantages": None,
                "policy_version": call.policy_version,
                "prompt_messages": prompt_messages,
                "response_messages": response_messages,
                "response_mask": None,
            }
        )


def aggregate_trajectories(transitions: Sequence[Transition]) -> list[Transition]:
    """Merge successive rows of one rollout whose prompt extends the previous prompt + response exactly.

    The merged row keeps the first row's prompt; its response is every response with the observation tokens
    between them (tool results, new user turns), and ``response_mask`` is 0 on those. Only rows of the same
    rollout, agent and policy version merge. No call's credit is dropped: the merged row's ``reward`` is the mean of
    its calls' rewards (the rollout score GRPO uses), and when the rows carry advantages (merging after
    :func:`~agentlightning.adapter.grpo_advantages`, as the trainer's ``transitions="trajectory"`` does) every token
    keeps its own call's advantage in ``response_advantages`` (0 on observation tokens) and ``advantage`` is their
    mean over calls. Logprobs are 0.0 on observation tokens, or None if any merged call lacks them.
    """
    result: list[Transition] = []
    current: Transition | None = None
    full: list[int] = []  # the current row's prompt + response, to test the next prompt against
    rewards: list[float] = []  # the current row's calls' rewards
    advantages: list[float | None] = []  # and their advantages
    for row in transitions:
        prompt = row.prompt_token_ids
        if (
            current is not None
            and row.rollout_id == current.rollout_id
            and row.agent_name == current.agent_name
            and row.policy_version == current.policy_version
            and row.response_token_ids
            and len(prompt) >= len(full)
            and prompt[: len(full)] == full
        ):
            observation = prompt[len(full) :]
            response = row.response_token_ids
            mask = current.response_mask or [1] * len(current.response_token_ids)
            logprobs = current.response_logprobs
            if logprobs is not None and row.response_logprobs is not None:
                logprobs = [*logprobs, *([0.0] * len(observation)), *row.response_logprobs]
            else:
                logprobs = None
            response_messages = row.response_messages
            if current.prompt_messages is not None and row.prompt_messages is not None:
                response_messages = row.prompt_messages[len(current.prompt_messages) :] + (response_messages or [])
            rewards.append(row.reward)
            advantages.append(row.advantage)
            update: dict[str, object] = {
                "response_token_ids": [*current.response_token_ids, *observation, *response],
                "response_mask": [*mask, *([0] * len(observation)), *([1] * len(response))],
                "response_logprobs": logprobs,
                "reward": sum(rewards) / len(rewards),
                "response_messages": response_messages,
            }
            if all(a is not None for a in advantages):
                per_token = current.response_advantages or [current.advantage or 0.0] * len(current.response_token_ids)
                update["response_advantages"] = [
                    *per_token,
                    *([0.0] * len(observation)),
                    *([row.advantage or 0.0] * len(response)),
                ]
                update["advantage"] = sum(a or 0.0 for a in advantages) / len(advantages)
            current = with_updates(current, update)
            result[-1] = current
            full = [*prompt, *response]
            continue
        current = row
        rewards, advantages = [row.reward], [row.advantage]
        result.append(row)
        full = [*row.prompt_token_ids, *row.response_token_ids] if row.has_token_ids else []
        if not full:
            current = None  # a row without token ids cannot be extended
    return result


def call_messages(call: LLMCall) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any] | None]:
    """(prompt messages with the system instructions first, tool definitions, the reply message) of a recorded call,
    in the OpenAI chat shape a request has; empty/None for what was not recorded."""
    prompt = _messages(call.input_messages) or []
    system = _messages(call.system_instructions, role="system")
    if system:
        prompt = system + prompt
    tools: list[dict[str, Any]] | None = None
    if call.tool_definitions:
        try:
            value: object = json.loads(call.tool_definitions)
        except ValueError:
            value = None
        if isinstance(value, list):
            tools = [cast(dict[str, Any], t) for t in cast(list[object], value) if isinstance(t, dict)]
    replies = _messages(call.output_messages, role="assistant") or []
    return prompt, tools, replies[0] if replies else None


def _latest_attempt(spans: Sequence[Span]) -> tuple[str | None, Sequence[Span]]:
    """The spans of the attempt that started last (a requeued rollout's earlier attempts are superseded)."""
    if not spans:
        return None, spans
    first = spans[0].attempt_id
    if all(span.attempt_id == first for span in spans):
        return first, spans
    began: dict[str, int] = {}
    for span in spans:
        if span.attempt_id not in began or span.start_time < began[span.attempt_id]:
            began[span.attempt_id] = span.start_time
    latest = max(began, key=lambda attempt: began[attempt])
    return latest, [span for span in spans if span.attempt_id == latest]


def _messages(raw: str | None, *, role: str | None = None) -> list[dict[str, Any]] | None:
    """Chat messages from a recorded JSON attribute; a bare string or part list becomes one message of ``role``."""
    if not raw:
        return None
    try:
        value: object = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in cast(list[object], value)):
        return cast(list[dict[str, Any]], value)
    if isinstance(value, dict) and "role" in value:
        return [cast(dict[str, Any], value)]
    if role is None:
        return [{"role": "user", "content": value if isinstance(value, str) else raw}]
    if isinstance(value, list):  # GenAI parts: [{"type": "text", "content": "..."}]
        parts = [cast(dict[str, Any], p) for p in cast(list[Any], value) if isinstance(p, dict)]
        texts = [str(p.get("content", "")) for p in parts]
        return [{"role": role, "content": "\n".join(texts)}]
    return [{"role": role, "content": value if isinstance(value, str) else raw}]
