"""Conversion of AutoGen model-client inputs and results into the GenAI attribute values of the span contract.

Messages are written in the OpenAI chat shape (``role``, ``content``, ``tool_calls``, ``tool_call_id``, ``name``), as
``agentlightning.semconv`` requires, so that hook spans and proxy spans of the same call carry comparable JSON.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, cast

from autogen_core import FunctionCall, Image
from autogen_core.models import (
    AssistantMessage,
    CreateResult,
    FunctionExecutionResultMessage,
    SystemMessage,
    UserMessage,
)
from autogen_core.tools import BaseTool
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv

# One encoder for the process: json.dumps with options builds a new encoder per call, a measurable part of the
# per-call budget (bench/integration_autogen.py).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)

# AutoGen normalises OpenAI's finish reasons; the span contract uses OpenAI's names (as the proxy records them).
_FINISH_REASONS: Mapping[str, str] = {"function_calls": "tool_calls", "content_filter": "content_filter"}


def to_json(value: Any) -> str:
    """Compact JSON for a span attribute; objects JSON cannot encode fall back to ``str``."""
    return _ENCODER.encode(value)


def _tool_calls(calls: Sequence[FunctionCall]) -> list[dict[str, Any]]:
    return [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for call in calls
    ]


def _user_content(content: str | list[str | Image]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": part}
        if isinstance(part, str)
        else {"type": "image_url", "image_url": {"url": part.data_uri}}
        for part in content
    ]


def _message_dicts(message: object) -> list[dict[str, Any]]:
    """One AutoGen ``LLMMessage`` as OpenAI chat messages (a tool-result message holds one per call)."""
    if isinstance(message, SystemMessage):
        return [{"role": "system", "content": message.content}]
    if isinstance(message, UserMessage):
        return [{"role": "user", "content": _user_content(message.content), "name": message.source}]
    if isinstance(message, AssistantMessage):
        if isinstance(message.content, str):
            return [{"role": "assistant", "content": message.content, "name": message.source}]
        # OpenAI carries a model's thought next to its tool calls as the message content.
        return [
            {
                "role": "assistant",
                "content": message.thought,
                "tool_calls": _tool_calls(message.content),
                "name": message.source,
            }
        ]
    if isinstance(message, FunctionExecutionResultMessage):
        return [
            {"role": "tool", "tool_call_id": result.call_id, "content": result.content} for result in message.content
        ]
    return [{"role": "user", "content": str(message)}]  # an LLMMessage type newer than this integration


def input_messages_json(messages: Sequence[object]) -> str:
    """``gen_ai.input.messages`` for a model call."""
    out: list[dict[str, Any]] = []
    for message in messages:
        out.extend(_message_dicts(message))
    return to_json(out)


def _tool_definition(tool: object) -> str:
    schema: Mapping[str, Any] = {}
    if isinstance(tool, Mapping):
        schema = cast(Mapping[str, Any], tool)  # a ToolSchema TypedDict
    else:
        # Not isinstance(tool, Tool): Tool is a runtime-checkable Protocol, and checking it evaluates the ``schema``
        # property, which builds a pydantic JSON schema (about a millisecond).
        found = getattr(tool, "schema", None)
        if isinstance(found, Mapping):
            schema = cast(Mapping[str, Any], found)
    function: dict[str, Any] = {"name": schema.get("name")}
    if "description" in schema:
        function["description"] = schema["description"]
    if "parameters" in schema:
        function["parameters"] = schema["parameters"]
    return to_json({"type": "function", "function": function})


# A tool's definition is built once per tool object: agents pass the same tools to every model call.
_definitions: weakref.WeakKeyDictionary[BaseTool[Any, Any], str] = weakref.WeakKeyDictionary()


def tool_definitions_json(tools: Sequence[object]) -> str:
    """``gen_ai.tool.definitions`` in the OpenAI ``tools`` shape, from AutoGen tools or tool schemas."""
    parts: list[str] = []
    for tool in tools:
        if isinstance(tool, BaseTool):
            known = cast(BaseTool[Any, Any], tool)
            definition = _definitions.get(known)
            if definition is None:
                definition = _definitions[known] = _tool_definition(known)
        else:
            definition = _tool_definition(tool)
        parts.append(definition)
    return "[" + ",".join(parts) + "]"


def result_attributes(result: CreateResult) -> dict[str, AttributeValue]:
    """The GenAI response attributes of a ``CreateResult``: output message, finish reason and usage."""
    reason = _FINISH_REASONS.get(result.finish_reason, result.finish_reason)
    message: dict[str, Any] = {"role": "assistant"}
    if isinstance(result.content, str):
        message["content"] = result.content
    else:
        message["content"] = result.thought
        message["tool_calls"] = _tool_calls(result.content)
    message["finish_reason"] = reason
    return {
        semconv.GEN_AI_OUTPUT_MESSAGES: to_json([message]),
        semconv.GEN_AI_RESPONSE_FINISH_REASONS: [reason],
        semconv.GEN_AI_USAGE_INPUT_TOKENS: result.usage.prompt_tokens,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: result.usage.completion_tokens,
    }


def tool_arguments_json(arguments: Mapping[str, Any]) -> str:
    """``gen_ai.tool.call.arguments``: the arguments the model gave the tool, as JSON."""
    return to_json(dict(arguments))
