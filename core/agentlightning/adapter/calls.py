"""LLM calls of one attempt, found from proxy and native-hook spans and joined by ``gen_ai.response.id``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias, cast

from agentlightning import semconv
from agentlightning.adapter.tree import CallTree, build_call_tree
from agentlightning.types import Attributes, Span

EventOrder: TypeAlias = Literal["time", "sequence"]
"""How calls and rewards of an attempt are put in order.

``"time"`` (default): by timestamps (a call at its end, a reward at its start), ties by sequence id. Right when the
agent, its hooks and the proxy share a clock (one machine, or NTP-synchronised ones), and immune to batching
tracers delivering spans late. ``"sequence"``: by the store's sequence id, ties by time. Right when clocks disagree
but every span reaches the store as soon as it ends.
"""

# GenAI operation names of model calls; semconv promises "chat" for ours, the others come from plain OTLP senders.
_LLM_OPERATIONS = frozenset({semconv.OP_CHAT, "text_completion", "generate_content"})
_OPERATION = semconv.GEN_AI_OPERATION_NAME
_RESPONSE_ID = semconv.GEN_AI_RESPONSE_ID
_SOURCE = semconv.SPAN_SOURCE
_AGENT_NAME = semconv.GEN_AI_AGENT_NAME
_PROMPT_IDS = semconv.PROMPT_TOKEN_IDS
_RESPONSE_IDS = semconv.RESPONSE_TOKEN_IDS
_LOGPROBS = semconv.RESPONSE_LOGPROBS
_POLICY_VERSION = semconv.POLICY_VERSION
_INPUT_MESSAGES = semconv.GEN_AI_INPUT_MESSAGES
_OUTPUT_MESSAGES = semconv.GEN_AI_OUTPUT_MESSAGES
_SYSTEM_INSTRUCTIONS = semconv.GEN_AI_SYSTEM_INSTRUCTIONS
_TOOL_DEFINITIONS = semconv.GEN_AI_TOOL_DEFINITIONS
_INPUT_TOKENS = semconv.GEN_AI_USAGE_INPUT_TOKENS
_OUTPUT_TOKENS = semconv.GEN_AI_USAGE_OUTPUT_TOKENS
_PROXY = semconv.SOURCE_PROXY
_SPAN_REWARD = semconv.SPAN_REWARD


@dataclass(slots=True)
class LLMCall:
    """One model call of an attempt, merged from every span that recorded it (proxy and native hook)."""

    span_id: str
    """The span that gives the call its place in the tree: the hook's when there is one, else the proxy's."""
    span_ids: tuple[str, ...]
    """Every span that recorded this call (twins share ``gen_ai.response.id``)."""
    response_id: str | None
    agent_name: str | None
    """Own ``gen_ai.agent.name`` of any twin, else the nearest ancestor's (see :meth:`CallTree.agent_name`)."""
    sources: tuple[str, ...]
    """``agentlightning.span.source`` of the twins, e.g. ``("hook", "proxy")``."""
    start_time: int
    end_time: int
    sequence_id: int
    prompt_token_ids: list[int]
    """Empty when no twin carries token ids (the call did not go through the proxy)."""
    response_token_ids: list[int]
    response_logprobs: list[float] | None
    policy_version: int | None
    input_messages: str | None
    """``gen_ai.input.messages`` as recorded (a JSON string); parsed only when a transition needs it."""
    output_messages: str | None
    system_instructions: str | None
    failed: bool
    """True when the span status is ERROR (the call has no usable response)."""
    turn_index: int = 0
    """Position among all calls of the attempt (0-based, every agent), in the adapter's event order."""
    tool_definitions: str | None = None
    """``gen_ai.tool.definitions`` as recorded (a JSON string): the tools the model was offered."""
    input_tokens: int | None = None
    """``gen_ai.usage.input_tokens``: the prompt's length as the serving engine counted it."""
    output_tokens: int | None = None
    """``gen_ai.usage.output_tokens``: the reply's length as the serving engine counted it."""

    @property
    def has_token_ids(self) -> bool:
        """True when both prompt and response token ids are present (required for RL)."""
        return bool(self.prompt_token_ids) and bool(self.response_token_ids)


def is_llm_span(span: Span) -> bool:
    """True for spans that record a model call (``gen_ai.operation.name`` is ``chat`` or another GenAI model op)."""
    return span.attributes.get(_OPERATION) in _LLM_OPERATIONS


def call_order_key(call: LLMCall, order: EventOrder) -> tuple[int, int, int]:
    """Sort key of a call in the attempt's event order (a call counts at its end: its response exists then)."""
    if order == "sequence":
        return (call.sequence_id, call.end_time, 0)
    return (call.end_time, 0, call.sequence_id)


def find_llm_calls(spans: Sequence[Span], *, tree: CallTree | None = None, order: EventOrder = "time") -> list[LLMCall]:
    """The model calls of one attempt in event order, proxy/hook twins joined into one call by response id."""
    return scan_attempt(tree if tree is not None else build_call_tree(spans), order)[0]


def scan_attempt(tree: CallTree, order: EventOrder = "time") -> tuple[list[LLMCall], list[Span]]:
    """(LLM calls in event order, reward spans) of one attempt, in a single pass over its spans."""
    groups: dict[str, list[Span]] = {}
    singles: list[Span] = []
    rewards: list[Span] = []
    for span in tree.spans.values():
        attributes = span.attributes
        if attributes.get(_OPERATION) not in _LLM_OPERATIONS:
            if span.name == _SPAN_REWARD:
                rewards.append(span)
            continue
        response_id = attributes.get(_RESPONSE_ID)
        if isinstance(response_id, str) and response_id:
            group = groups.get(response_id)
            if group is None:
                groups[response_id] = [span]
            else:
                group.append(span)
        else:
            singles.append(span)
    twin_lists = _join_by_containment(list(groups.values()), singles)
    calls = [_merge(twins, tree) for twins in twin_lists]
    if order == "sequence":
        calls.sort(key=lambda call: (call.sequence_id, call.end_time))
    else:
        calls.sort(key=lambda call: (call.end_time, call.sequence_id))
    for index, call in enumerate(calls):
        call.turn_index = index
    return calls, rewards


def _join_by_containment(groups: list[list[Span]], singles: list[Span]) -> list[list[Span]]:
    """Join hook spans that lack a response id with the lone proxy span recorded inside their time window.

    Some clients drop the response id (langchain-openai discards it when streaming chat completions), so the hook
    span cannot be joined by id. The proxy span of the same call starts and ends within the hook span's window;
    the earliest unclaimed such span is its twin. Both spans come from one machine's clock in that setup.
    """
    hooks = [s for s in singles if s.attributes.get(_SOURCE) != _PROXY]
    if not hooks:
        return [*groups, *([s] for s in singles)]
    lone_proxies = [g[0] for g in groups if len(g) == 1 and g[0].attributes.get(_SOURCE) == _PROXY]
    lone_proxies.extend(s for s in singles if s.attributes.get(_SOURCE) == _PROXY)
    if not lone_proxies:
        return [*groups, *([s] for s in singles)]
    lone_proxies.sort(key=lambda s: s.start_time)
    claimed: dict[str, Span] = {}  # proxy span_id -> hook span
    for hook in sorted(hooks, key=lambda s: s.start_time):
        hook_end = hook.end_time if hook.end_time is not None else hook.start_time
        for proxy in lone_proxies:
            proxy_end = proxy.end_time if proxy.end_time is not None else proxy.start_time
            if proxy.span_id not in claimed and hook.start_time <= proxy.start_time and proxy_end <= hook_end:
                claimed[proxy.span_id] = hook
                break
    if not claimed:
        return [*groups, *([s] for s in singles)]
    joined_hooks = {id(h) for h in claimed.values()}
    result: list[list[Span]] = []
    for group in groups:
        if len(group) == 1 and group[0].span_id in claimed:
            result.append([group[0], claimed[group[0].span_id]])
        else:
            result.append(group)
    for span in singles:
        if span.span_id in claimed and span.attributes.get(_SOURCE) == _PROXY:
            result.append([span, claimed[span.span_id]])
        elif id(span) not in joined_hooks:
            result.append([span])
    return result


def _merge(twins: list[Span], tree: CallTree) -> LLMCall:
    """One call from the spans that recorded it: token ids from the proxy, place and agent from the hook."""
    if len(twins) == 1:
        structural = data = twins[0]
        ordered = twins
        data_attrs = struct_attrs = data.attributes
        failed = data.status.code == "ERROR"
    else:
        # Proxy spans first for data (engine token ids), the others first for structure (the agent's own tree).
        proxies = [s for s in twins if s.attributes.get(_SOURCE) == _PROXY]
        others = [s for s in twins if s.attributes.get(_SOURCE) != _PROXY]
        ordered = proxies + others
        data = ordered[0]
        structural = others[0] if others else data
        # Later updates win: data_attrs prefers the proxy's values, struct_attrs the hook's.
        data_attrs: Attributes = {}
        for twin in reversed(ordered):
            data_attrs.update(twin.attributes)
        struct_attrs: Attributes = {}
        for twin in [*proxies, *reversed(others)]:
            struct_attrs.update(twin.attributes)
        failed = any(twin.status.code == "ERROR" for twin in twins)
    agent_name = struct_attrs.get(_AGENT_NAME)
    if not isinstance(agent_name, str) or not agent_name:
        agent_name = tree.agent_name(structural.span_id)
        if agent_name is None and structural is not data:
            agent_name = tree.agent_name(data.span_id)
    response_id = data_attrs.get(_RESPONSE_ID)
    version = data_attrs.get(_POLICY_VERSION)
    input_messages = struct_attrs.get(_INPUT_MESSAGES)
    output_messages = struct_attrs.get(_OUTPUT_MESSAGES)
    system = struct_attrs.get(_SYSTEM_INSTRUCTIONS)
    tools = struct_attrs.get(_TOOL_DEFINITIONS)
    end_time = structural.end_time
    return LLMCall(
        span_id=structural.span_id,
        span_ids=tuple(s.span_id for s in ordered),
        response_id=response_id if isinstance(response_id, str) else None,
        agent_name=agent_name,
        sources=tuple(str(s.attributes.get(_SOURCE, "unknown")) for s in ordered),
        start_time=structural.start_time,
        end_time=end_time if end_time is not None else structural.start_time,
        sequence_id=structural.sequence_id,
        prompt_token_ids=_ints(data_attrs.get(_PROMPT_IDS)),
        response_token_ids=_ints(data_attrs.get(_RESPONSE_IDS)),
        response_logprobs=_floats(data_attrs.get(_LOGPROBS)),
        policy_version=version if isinstance(version, int) and not isinstance(version, bool) else None,
        input_messages=input_messages if isinstance(input_messages, str) else None,
        output_messages=output_messages if isinstance(output_messages, str) else None,
        system_instructions=system if isinstance(system, str) else None,
        failed=failed,
        tool_definitions=tools if isinstance(tools, str) else None,
        input_tokens=_count(data_attrs.get(_INPUT_TOKENS)),
        output_tokens=_count(data_attrs.get(_OUTPUT_TOKENS)),
    )


def _ints(value: object) -> list[int]:
    # The contract types these attributes list[int]; anything else (a string from a lossy exporter) counts as absent.
    if isinstance(value, list) and value:
        return cast(list[int], value)
    return []


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _floats(value: object) -> list[float] | None:
    if isinstance(value, list) and value:
        return cast(list[float], value)
    return None
