"""Hand-built span trees for the adapter tests: a tiny builder that keeps ids, times and attributes readable."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from agentlightning import semconv
from agentlightning.types import AttributeValue, Span, SpanStatus

TRACE_ID = "0" * 31 + "1"


@dataclass
class TraceBuilder:
    """Builds the spans of one attempt; ``clock`` advances 10 ns per span so time order equals build order."""

    rollout_id: str = "ro-1"
    attempt_id: str = "at-1"
    clock: int = 1_000
    spans: list[Span] = field(default_factory=list[Span])
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _next_id(self) -> str:
        return f"{next(self._ids):016x}"

    def _tick(self) -> int:
        self.clock += 10
        return self.clock

    def add(
        self,
        name: str,
        attributes: dict[str, AttributeValue],
        *,
        parent: str | None = None,
        start: int | None = None,
        end: int | None = None,
        span_id: str | None = None,
        error: bool = False,
    ) -> str:
        """Add a span; returns its span id."""
        span_id = span_id or self._next_id()
        start = start if start is not None else self._tick()
        end = end if end is not None else self._tick()
        self.spans.append(
            Span(
                rollout_id=self.rollout_id,
                attempt_id=self.attempt_id,
                sequence_id=len(self.spans) + 1,
                trace_id=TRACE_ID,
                span_id=span_id,
                parent_id=parent,
                name=name,
                start_time=start,
                end_time=end,
                status=SpanStatus(code="ERROR" if error else "UNSET"),
                attributes=attributes,
            )
        )
        return span_id

    def agent(self, name: str, *, parent: str | None = None, start: int | None = None, end: int | None = None) -> str:
        """An ``invoke_agent`` span (give start/end to make it enclose later spans)."""
        attributes: dict[str, AttributeValue] = {
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_AGENT,
            semconv.GEN_AI_AGENT_NAME: name,
        }
        return self.add(f"invoke_agent {name}", attributes, parent=parent, start=start, end=end)

    def llm(
        self,
        *,
        parent: str | None = None,
        agent: str | None = None,
        source: str = semconv.SOURCE_PROXY,
        response_id: str | None = None,
        prompt: list[int] | None = None,
        response: list[int] | None = None,
        logprobs: list[float] | None = None,
        version: int | None = None,
        messages: list[dict[str, Any]] | None = None,
        output: list[dict[str, Any]] | None = None,
        start: int | None = None,
        end: int | None = None,
        error: bool = False,
    ) -> str:
        """An LLM (chat) span as the proxy or a hook records it."""
        attributes: dict[str, AttributeValue] = {
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.SPAN_SOURCE: source,
        }
        if agent is not None:
            attributes[semconv.GEN_AI_AGENT_NAME] = agent
        if response_id is not None:
            attributes[semconv.GEN_AI_RESPONSE_ID] = response_id
        if prompt is not None:
            attributes[semconv.PROMPT_TOKEN_IDS] = prompt
        if response is not None:
            attributes[semconv.RESPONSE_TOKEN_IDS] = response
        if logprobs is not None:
            attributes[semconv.RESPONSE_LOGPROBS] = logprobs
        if version is not None:
            attributes[semconv.POLICY_VERSION] = version
        if messages is not None:
            attributes[semconv.GEN_AI_INPUT_MESSAGES] = json.dumps(messages)
        if output is not None:
            attributes[semconv.GEN_AI_OUTPUT_MESSAGES] = json.dumps(output)
        return self.add("chat model", attributes, parent=parent, start=start, end=end, error=error)

    def reward(self, value: float, *, parent: str | None = None, **dimensions: float) -> str:
        """A reward span: ``value`` is the primary dimension ``reward``; keywords add more dimensions."""
        attributes: dict[str, AttributeValue] = {
            semconv.reward_attribute("reward"): value,
            semconv.REWARD_PRIMARY: "reward",
        }
        for name, dim in dimensions.items():
            attributes[semconv.reward_attribute(name)] = dim
        t = self._tick()
        return self.add(semconv.SPAN_REWARD, attributes, parent=parent, start=t, end=t)

    def tool(self, name: str, *, parent: str | None = None) -> str:
        """An ``execute_tool`` span."""
        attributes: dict[str, AttributeValue] = {
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL,
            semconv.GEN_AI_TOOL_NAME: name,
        }
        return self.add(f"execute_tool {name}", attributes, parent=parent)
