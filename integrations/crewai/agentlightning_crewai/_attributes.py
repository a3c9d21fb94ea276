"""Span attributes from CrewAI events, in the GenAI names of ``agentlightning.semconv``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from crewai.events.types.llm_events import LLMCallCompletedEvent, LLMCallStartedEvent
from crewai.events.types.tool_usage_events import ToolUsageEvent
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_NAME = 80


def time_ns(moment: datetime) -> int:
    """Nanoseconds since the Unix epoch of an event timestamp (CrewAI stamps them in UTC; naive ones are local)."""
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def to_json(value: Any) -> str:
    """A compact JSON string of ``value``; what JSON cannot hold is written as its ``str``."""
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


def short(text: str) -> str:
    """A span-name-sized version of ``text`` (task descriptions can be paragraphs)."""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_NAME else text[: _MAX_NAME - 1] + "…"


def _messages(messages: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if messages is None:
        return []
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return list(messages)


def llm_start_attributes(event: LLMCallStartedEvent, source: Any) -> dict[str, AttributeValue]:
    """Request attributes of an LLM call: messages, tool definitions, model, provider, sampling parameters."""
    attributes: dict[str, AttributeValue] = {
        semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
        semconv.GEN_AI_INPUT_MESSAGES: to_json(_messages(event.messages)),
    }
    if event.model:
        attributes[semconv.GEN_AI_REQUEST_MODEL] = event.model
    provider = getattr(source, "provider", None)
    if isinstance(provider, str) and provider:
        attributes[semconv.GEN_AI_PROVIDER_NAME] = provider
    if event.temperature is not None:
        attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] = float(event.temperature)
    if isinstance(event.max_tokens, int) and not isinstance(event.max_tokens, bool):
        attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] = event.max_tokens
    if event.tools:
        attributes[semconv.GEN_AI_TOOL_DEFINITIONS] = to_json(event.tools)
    return attributes


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI-shaped tool call from a native function-calling response (CrewAI serialises it to a dict)."""
    function: Mapping[str, Any] = call.get("function") or {}
    arguments: Any = function.get("arguments", call.get("arguments", ""))
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {
            "name": function.get("name", call.get("name")),
            "arguments": arguments if isinstance(arguments, str) else to_json(arguments),
        },
    }


def _output_message(response: Any) -> dict[str, Any]:
    # Native function calling answers with the list of tool calls instead of text.
    items: list[Any] = cast(list[Any], response) if isinstance(response, list) else []
    calls = [cast(Mapping[str, Any], item) for item in items if isinstance(item, Mapping)]
    if items and len(calls) == len(items) and all("function" in call or "name" in call for call in calls):
        return {"role": "assistant", "content": None, "tool_calls": [_tool_call(call) for call in calls]}
    return {"role": "assistant", "content": response if isinstance(response, str) else to_json(response)}


def tool_call_ids(response: Any) -> list[tuple[str, str]]:
    """(tool name, call id) of each native tool call in an LLM response, in order (none for text answers)."""
    calls = _output_message(response).get("tool_calls") or []
    found: list[tuple[str, str]] = []
    for call in calls:
        name, call_id = call["function"]["name"], call["id"]
        if isinstance(name, str) and isinstance(call_id, str) and call_id:
            found.append((name, call_id))
    return found


def _usage(usage: Mapping[str, Any]) -> dict[str, AttributeValue]:
    # Providers name the counts differently (OpenAI prompt/completion, Anthropic input/output).
    found: dict[str, AttributeValue] = {}
    for key, names in (
        (semconv.GEN_AI_USAGE_INPUT_TOKENS, ("prompt_tokens", "input_tokens")),
        (semconv.GEN_AI_USAGE_OUTPUT_TOKENS, ("completion_tokens", "output_tokens")),
    ):
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                found[key] = value
                break
    return found


def llm_end_attributes(event: LLMCallCompletedEvent) -> dict[str, AttributeValue]:
    """Response attributes of an LLM call: output message (text or tool calls), usage, finish reason, response id."""
    attributes: dict[str, AttributeValue] = {semconv.GEN_AI_OUTPUT_MESSAGES: to_json([_output_message(event.response)])}
    if event.response_id:
        attributes[semconv.GEN_AI_RESPONSE_ID] = event.response_id
    if event.finish_reason:
        attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = (event.finish_reason,)
    if event.model:
        attributes[semconv.GEN_AI_RESPONSE_MODEL] = event.model
    if event.usage:
        attributes.update(_usage(event.usage))
    return attributes


def tool_start_attributes(event: ToolUsageEvent) -> dict[str, AttributeValue]:
    """Tool name and arguments (CrewAI passes them as a dict or as the model's JSON string)."""
    args = event.tool_args
    return {
        semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL,
        semconv.GEN_AI_TOOL_NAME: event.tool_name,
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: args if isinstance(args, str) else to_json(args),
    }


def tool_result(output: Any) -> str:
    """The tool's result as text, the way the agent reads it."""
    return output if isinstance(output, str) else to_json(output)
