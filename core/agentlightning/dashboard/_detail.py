"""The rollout detail: the span tree of one attempt, annotated with what the adapter turned into transitions."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Final, cast

from agentlightning import semconv
from agentlightning.adapter import AttemptTrace, TraceAdapter, build_call_tree
from agentlightning.dashboard._models import Message, RewardInfo, SpanKindLabel, SpanNode
from agentlightning.emit import find_rewards
from agentlightning.types import Span, Transition

logger = logging.getLogger("agentlightning.dashboard")

# Long strings (a whole prompt in an attribute) are cut: the page stays light, the REST API has the full span.
MAX_TEXT: Final = 20_000
_TOKEN_LISTS: Final = frozenset({semconv.PROMPT_TOKEN_IDS, semconv.RESPONSE_TOKEN_IDS, semconv.RESPONSE_LOGPROBS})
_SHOWN_ELSEWHERE: Final = frozenset(
    {
        semconv.GEN_AI_INPUT_MESSAGES,
        semconv.GEN_AI_OUTPUT_MESSAGES,
        semconv.GEN_AI_SYSTEM_INSTRUCTIONS,
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS,
        semconv.GEN_AI_TOOL_CALL_RESULT,
    }
)
_KINDS: Final[dict[str, SpanKindLabel]] = {
    semconv.OP_CHAT: "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    semconv.OP_EXECUTE_TOOL: "tool",
    semconv.OP_INVOKE_AGENT: "agent",
}


class AdaptedAttempt:
    """The adapter's view of one attempt: its trace (calls, rewards) and transitions, or the error it raised."""

    def __init__(self, trace: AttemptTrace | None, transitions: Sequence[Transition], error: str | None) -> None:
        self.trace = trace
        self.transitions = {row.span_id: row for row in transitions}
        self.error = error


def adapt_attempt(adapter: TraceAdapter, rollout: Any, spans: Sequence[Span]) -> AdaptedAttempt:
    """Run the adapter as a trainer would; a failure becomes a message on the page instead of a 500."""
    try:
        trace = adapter.trace(spans)
        rows = adapter.adapt(rollout, spans)
    except Exception as exc:  # the user's credit strategy or malformed spans: report, keep the tree viewable
        logger.warning("dashboard: adapter failed on rollout %s: %r", rollout.rollout_id, exc)
        return AdaptedAttempt(None, [], f"{type(exc).__name__}: {exc}")
    return AdaptedAttempt(trace, rows, None)


def rewards_of(adapted: AdaptedAttempt) -> list[RewardInfo]:
    """The attempt's rewards as the adapter placed them among the calls."""
    if adapted.trace is None:
        return []
    return [
        RewardInfo(
            span_id=r.span_id,
            value=r.value,
            after_calls=r.after_calls,
            is_final=r.is_final,
            dimensions=dict(r.dimensions),
        )
        for r in adapted.trace.rewards
    ]


def span_nodes(spans: Sequence[Span], adapted: AdaptedAttempt) -> tuple[float | None, list[SpanNode]]:
    """(first span start in ms, the spans depth-first with parents before children and the adapter's verdicts)."""
    if not spans:
        return None, []
    tree = build_call_tree(spans)
    t0 = min(span.start_time for span in tree.spans.values())
    calls = adapted.trace.calls if adapted.trace is not None else []
    selected = {call.span_id for call in adapted.trace.selected} if adapted.trace is not None else set[str]()
    turn_of = {call.span_id: call.turn_index for call in calls}
    twin_of = {twin: call.span_id for call in calls for twin in call.span_ids if twin != call.span_id}
    rewards = {reward.span.span_id: reward for reward in find_rewards(tree.spans.values())}
    orphans = tree.orphans
    nodes: list[SpanNode] = []
    for depth, span in tree.walk():
        a = span.attributes
        kind = _kind(span)
        reward = rewards.get(span.span_id)
        row = adapted.transitions.get(span.span_id)
        nodes.append(
            SpanNode(
                span_id=span.span_id,
                parent_id=span.parent_id,
                depth=depth,
                orphan=span.span_id in orphans,
                name=span.name,
                kind=kind,
                sequence_id=span.sequence_id,
                start_ms=(span.start_time - t0) / 1e6,
                duration_ms=None if span.end_time is None else (span.end_time - span.start_time) / 1e6,
                status=span.status.code,
                status_message=span.status.message,
                agent_name=_text(a.get(semconv.GEN_AI_AGENT_NAME)) or tree.agent_name(span.span_id),
                model=_text(a.get(semconv.GEN_AI_RESPONSE_MODEL)) or _text(a.get(semconv.GEN_AI_REQUEST_MODEL)),
                input_tokens=_int(a.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)),
                output_tokens=_int(a.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)),
                prompt_token_ids=_length(a.get(semconv.PROMPT_TOKEN_IDS)),
                response_token_ids=_length(a.get(semconv.RESPONSE_TOKEN_IDS)),
                system=_clip(_text(a.get(semconv.GEN_AI_SYSTEM_INSTRUCTIONS))),
                input_messages=_messages(a.get(semconv.GEN_AI_INPUT_MESSAGES), "user"),
                output_messages=_messages(a.get(semconv.GEN_AI_OUTPUT_MESSAGES), "assistant"),
                tool_name=_text(a.get(semconv.GEN_AI_TOOL_NAME)),
                tool_arguments=_clip(_text(a.get(semconv.GEN_AI_TOOL_CALL_ARGUMENTS))),
                tool_result=_clip(_text(a.get(semconv.GEN_AI_TOOL_CALL_RESULT))),
                reward=reward.value if reward is not None else None,
                reward_dimensions=dict(reward.dimensions) if reward is not None else {},
                turn_index=turn_of.get(span.span_id),
                twin_of=twin_of.get(span.span_id),
                selected=span.span_id in selected,
                transition=row is not None,
                credit=row.reward if row is not None else None,
                attributes=_other_attributes(span),
                events=[
                    {"name": e.name, "at_ms": (e.timestamp - t0) / 1e6, "attributes": _plain(e.attributes)}
                    for e in span.events
                ],
            )
        )
    return t0 / 1e6, nodes


def _kind(span: Span) -> SpanKindLabel:
    if span.name == semconv.SPAN_REWARD:
        return "reward"
    operation = span.attributes.get(semconv.GEN_AI_OPERATION_NAME)
    return _KINDS.get(operation, "other") if isinstance(operation, str) else "other"


def _other_attributes(span: Span) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for key, value in span.attributes.items():
        if key in _SHOWN_ELSEWHERE:
            continue
        if key in _TOKEN_LISTS and isinstance(value, list):
            shown[key] = f"[{len(value)} values]"
        else:
            shown[key] = _clip(value) if isinstance(value, str) else value
    return shown


def _plain(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: _clip(v) if isinstance(v, str) else v for k, v in attributes.items()}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _length(value: object) -> int:
    return len(cast(list[object], value)) if isinstance(value, list) else 0


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT:
        return text
    return f"{text[:MAX_TEXT]}… [{len(text) - MAX_TEXT} more characters]"


def _messages(raw: object, role: str) -> list[Message]:
    """Messages of a recorded JSON attribute; a bare string or GenAI part list becomes one message of ``role``."""
    if not isinstance(raw, str) or not raw:
        return []
    try:
        value: object = json.loads(raw)
    except ValueError:
        return [Message(role=role, content=_clip(raw) or "")]
    items = cast(list[object], value) if isinstance(value, list) else [value]
    if not all(isinstance(item, dict) and "role" in item for item in items):
        return [Message(role=role, content=_content(cast(object, value)))]
    messages: list[Message] = []
    for item in items:
        message = cast(dict[str, Any], item)
        calls = message.get("tool_calls")
        call_id = message.get("tool_call_id")
        messages.append(
            Message(
                role=str(message.get("role")),
                content=_content(message.get("content")),
                tool_calls=[cast(dict[str, Any], c) for c in cast(list[object], calls) if isinstance(c, dict)]
                if isinstance(calls, list)
                else [],
                tool_call_id=call_id if isinstance(call_id, str) else None,
            )
        )
    return messages


def _content(content: object) -> str:
    """Message content as text: strings as they are, part lists joined, anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _clip(content) or ""
    if isinstance(content, list):
        texts: list[str] = []
        for part in cast(list[object], content):
            if isinstance(part, dict):
                p = cast(dict[str, Any], part)
                text = p.get("text", p.get("content"))
                texts.append(text if isinstance(text, str) else json.dumps(p))
            else:
                texts.append(str(part))
        return _clip("\n".join(texts)) or ""
    return _clip(json.dumps(content)) or ""
