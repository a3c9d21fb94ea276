"""Conversions from the Agents SDK's span data and model items to the span attribute contract (chat-shaped JSON).

The SDK hands over three shapes of LLM data: Chat Completions messages (``GenerationSpanData`` of the non-streamed
Chat Completions model), Responses API objects and items (``ResponseSpanData``, the streamed Chat Completions model's
generation output, ``ModelResponse.output`` in hooks), and Responses input items (``ResponseSpanData.input``, hook
inputs). Everything here accepts both dicts and the ``openai`` pydantic objects, reading fields with :func:`field`,
so no object is dumped whole on the agent's thread. Messages follow the shape the LLM proxy writes, so that the
adapter sees one format whichever recorded the call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import orjson
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv

Json = dict[str, Any]

# Responses API statuses that are not "completed", as chat finish reasons (the proxy maps them the same way).
_FINISH_OF_STATUS = {"incomplete": "length", "failed": "error", "cancelled": "cancelled"}
# The SDK's placeholder id for Responses objects built from Chat Completions (agents.models.fake_id).
_FAKE_RESPONSES_ID = "__fake_id__"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model asked for: the SDK runs it next, as a function span without the call id."""

    call_id: str
    name: str
    arguments: str


def field(item: object, name: str) -> Any:
    """``item[name]`` for mappings, ``item.name`` for objects; None when absent."""
    if isinstance(item, dict):  # the common case, and a much cheaper check than the Mapping ABC
        return cast(dict[str, Any], item).get(name)
    if isinstance(item, Mapping):
        return cast(Mapping[str, Any], item).get(name)
    return getattr(item, name, None)


def to_json(value: object) -> str:
    """Compact JSON for an attribute; objects JSON cannot encode are written with ``str``."""
    # orjson: this runs on the agent's thread for every LLM call, and is ~5x faster than json.dumps here.
    return orjson.dumps(value, default=_jsonable, option=orjson.OPT_NON_STR_KEYS).decode()


def _jsonable(value: object) -> object:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    return str(value)


def _text_of(content: object) -> str | None:
    """Plain text of message content: a string, or the text parts of a content list joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [field(part, "text") for part in cast(list[object], content)]
        texts = [part for part in parts if isinstance(part, str)]
        return "".join(texts) if texts else None
    return str(content)


# --- inputs ---------------------------------------------------------------------------------------------------------
def input_messages(instructions: str | None, items: object) -> list[Json]:
    """Responses-style ``instructions`` + input items as chat-shaped messages (system first, as the proxy does)."""
    messages: list[Json] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list):
        return messages
    for item in cast(list[object], items):
        kind = field(item, "type") or "message"
        if kind == "message":
            messages.append({"role": field(item, "role") or "user", "content": _text_of(field(item, "content"))})
        elif kind == "function_call":
            function = {"name": field(item, "name"), "arguments": field(item, "arguments")}
            call = {"id": field(item, "call_id"), "type": "function", "function": function}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = field(item, "output")
            content = output if isinstance(output, str) else to_json(output)
            messages.append({"role": "tool", "tool_call_id": field(item, "call_id"), "content": content})
        else:  # reasoning, hosted tools...: kept verbatim so nothing the model saw is lost
            messages.append({"role": "assistant", "content": None, "item": item})
    return messages


# --- outputs --------------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class LLMOutput:
    """What one LLM call produced, in the contract's terms."""

    messages: list[Json]
    finish_reasons: list[str]
    calls: list[ToolCall]
    response_id: str | None = None
    response_model: str | None = None


def responses_output(items: object, status: object = "completed") -> LLMOutput:
    """Responses API output items (and the response status) as one assistant message with its tool calls."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    response_id: str | None = None
    for item in cast(list[object], items) if isinstance(items, list) else []:
        kind = field(item, "type")
        if kind == "message":
            text = _text_of(field(item, "content"))
            if text is not None:
                texts.append(text)
        elif kind == "function_call":
            calls.append(ToolCall(str(field(item, "call_id")), str(field(item, "name")), str(field(item, "arguments"))))
        provider_data = field(item, "provider_data")
        if response_id is None and isinstance(provider_data, Mapping):
            # Chat Completions items converted by the SDK keep the completion's id here (the Response's own id is a
            # placeholder).
            found = cast(Mapping[str, Any], provider_data).get("response_id")
            response_id = found if isinstance(found, str) else None
    reason = "tool_calls" if calls and status in ("completed", None) else None
    reason = reason or _FINISH_OF_STATUS.get(str(status), "stop" if status in ("completed", None) else str(status))
    message: Json = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = [_call_json(call) for call in calls]
    message["finish_reason"] = reason
    return LLMOutput([message], [reason], calls, response_id)


def response_object_output(response: object) -> LLMOutput:
    """A whole Responses API object: its output plus response id and model."""
    output = responses_output(field(response, "output"), field(response, "status"))
    response_id = field(response, "id")
    if isinstance(response_id, str) and response_id != _FAKE_RESPONSES_ID:
        output.response_id = response_id
    model = field(response, "model")
    output.response_model = model if isinstance(model, str) else None
    return output


def generation_output(output: object) -> LLMOutput:
    """``GenerationSpanData.output``: Chat Completions messages, or Responses objects the SDK built from a stream."""
    entries = cast(list[object], output) if isinstance(output, list) else []
    if entries and field(entries[0], "object") == "response":
        return response_object_output(entries[0])
    messages: list[Json] = []
    reasons: list[str] = []
    calls: list[ToolCall] = []
    for entry in entries:
        message: Json = {"role": field(entry, "role") or "assistant", "content": _text_of(field(entry, "content"))}
        raw_calls = field(entry, "tool_calls")
        if isinstance(raw_calls, list):
            mine: list[ToolCall] = []
            for raw in cast(list[object], raw_calls):
                function = field(raw, "function")
                mine.append(
                    ToolCall(str(field(raw, "id")), str(field(function, "name")), str(field(function, "arguments")))
                )
            message["tool_calls"] = [_call_json(call) for call in mine]
            calls.extend(mine)
        reason = "tool_calls" if message.get("tool_calls") else "stop"
        message["finish_reason"] = reason
        reasons.append(reason)
        messages.append(message)
    return LLMOutput(messages, reasons, calls)


def _call_json(call: ToolCall) -> Json:
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


# --- attributes -----------------------------------------------------------------------------------------------------
def usage_attributes(usage: object, attributes: dict[str, AttributeValue]) -> None:
    """Input/output token counts from an SDK usage dict or ``Usage`` object."""
    prompt = field(usage, "input_tokens")
    completion = field(usage, "output_tokens")
    if not prompt and not completion:
        # The SDK writes zeros when the provider reported no usage (e.g. a stream without include_usage); a real
        # call always has input tokens, so zeros mean "unknown", not "free".
        return
    if isinstance(prompt, int) and not isinstance(prompt, bool):
        attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = prompt
    if isinstance(completion, int) and not isinstance(completion, bool):
        attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = completion


def output_attributes(output: LLMOutput, attributes: dict[str, AttributeValue]) -> None:
    """Output messages, finish reasons, response id and model."""
    attributes[semconv.GEN_AI_OUTPUT_MESSAGES] = to_json(output.messages)
    if output.finish_reasons:
        attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = output.finish_reasons
    if output.response_id:
        attributes[semconv.GEN_AI_RESPONSE_ID] = output.response_id
    if output.response_model:
        attributes[semconv.GEN_AI_RESPONSE_MODEL] = output.response_model


def request_settings_attributes(settings: object, attributes: dict[str, AttributeValue]) -> None:
    """Temperature and max tokens from ``GenerationSpanData.model_config`` or ``ModelSettings``."""
    temperature = field(settings, "temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool):
        attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] = float(temperature)
    max_tokens = field(settings, "max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens


def tool_definitions(tools: Iterable[object] | None) -> list[Json]:
    """Tool definitions of a Responses object (function tools as chat-style ``{"type": "function", ...}``)."""
    definitions: list[Json] = []
    for tool in tools or ():
        if field(tool, "type") == "function":
            function = {"name": field(tool, "name"), "description": field(tool, "description")}
            function["parameters"] = field(tool, "parameters")
            definitions.append({"type": "function", "function": function})
        else:
            definitions.append({"type": str(field(tool, "type"))})
    return definitions


def result_text(value: object) -> str:
    """A tool's result as the text the model sees."""
    return value if isinstance(value, str) else to_json(value)
