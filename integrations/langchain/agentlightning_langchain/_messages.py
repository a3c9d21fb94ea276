"""Conversion of LangChain messages and results into the GenAI attribute values of the span contract.

Messages are written in the OpenAI chat shape (``role``, ``content``, ``tool_calls``, ``tool_call_id``, ``name``), as
``agentlightning.semconv`` requires, so that hook spans and proxy spans of the same call carry the same JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, Generation, LLMResult

from agentlightning import semconv

# LangChain message ``type`` -> OpenAI chat ``role``.
_ROLES: Mapping[str, str] = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "function",
    "developer": "developer",
    "AIMessageChunk": "assistant",
    "HumanMessageChunk": "user",
    "SystemMessageChunk": "system",
    "ToolMessageChunk": "tool",
}

# LangChain auto-assigns ``lc_run--<run id>`` (older releases: ``run-<run id>``) to messages whose provider gave no
# id; such an id names the LangChain run, not a provider response, so it cannot join hook and proxy spans.
_GENERATED_ID_PREFIXES = ("lc_run-", "run-")


# One encoder for the process: json.dumps with options builds a new encoder per call, a measurable part of the
# per-call budget (bench/integration_langchain.py).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def to_json(value: Any) -> str:
    """Compact JSON for a span attribute; objects JSON cannot encode fall back to ``str``."""
    return _ENCODER.encode(value)


def _tool_calls(message: AIMessage) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = [
        {
            "id": call.get("id"),
            "type": "function",
            "function": {"name": call["name"], "arguments": to_json(call["args"])},
        }
        for call in message.tool_calls
    ]
    # A call the provider sent but LangChain could not parse keeps its raw argument string, so nothing is lost.
    calls.extend(
        {
            "id": bad.get("id"),
            "type": "function",
            "function": {"name": bad.get("name"), "arguments": bad.get("args")},
        }
        for bad in message.invalid_tool_calls
    )
    return calls


def message_dict(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as an OpenAI chat message dict."""
    role = message.role if isinstance(message, ChatMessage) else _ROLES.get(message.type, message.type)
    out: dict[str, Any] = {"role": role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if isinstance(message, AIMessage):
        calls = _tool_calls(message)
        if calls:
            out["tool_calls"] = calls
    elif isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
    return out


def input_messages_json(messages: Sequence[BaseMessage]) -> str:
    """``gen_ai.input.messages`` for a chat model call."""
    return to_json([message_dict(m) for m in messages])


def prompt_messages_json(prompt: str) -> str:
    """``gen_ai.input.messages`` for a completion-style LLM call (a prompt string is one user message)."""
    return to_json([{"role": "user", "content": prompt}])


def _response_id(result: LLMResult, generation: Generation) -> str | None:
    output = result.llm_output or {}
    found = output.get("id")
    if isinstance(found, str) and found:
        return found
    if isinstance(generation, ChatGeneration):
        message = generation.message
        found = message.response_metadata.get("id")
        if isinstance(found, str) and found:
            return found
        if message.id and not message.id.startswith(_GENERATED_ID_PREFIXES):
            return message.id
    return None


def _finish_reason(generation: Generation) -> str | None:
    info = generation.generation_info or {}
    reason = info.get("finish_reason")
    if reason is None and isinstance(generation, ChatGeneration):
        metadata = generation.message.response_metadata
        # OpenAI-style providers say finish_reason, Anthropic says stop_reason.
        reason = metadata.get("finish_reason") or metadata.get("stop_reason")
    return reason if isinstance(reason, str) else None


def _usage(result: LLMResult, generation: Generation) -> tuple[int | None, int | None]:
    if isinstance(generation, ChatGeneration) and isinstance(generation.message, AIMessage):
        usage = generation.message.usage_metadata
        if usage is not None:
            return usage["input_tokens"], usage["output_tokens"]
    output = result.llm_output or {}
    token_usage = output.get("token_usage") or output.get("usage")
    if isinstance(token_usage, Mapping):
        counts = cast(Mapping[str, Any], token_usage)  # provider dicts are untyped; values are checked below
        prompt = counts.get("prompt_tokens", counts.get("input_tokens"))
        completion = counts.get("completion_tokens", counts.get("output_tokens"))
        return (
            prompt if isinstance(prompt, int) else None,
            completion if isinstance(completion, int) else None,
        )
    return None, None


def _response_model(result: LLMResult, generation: Generation) -> str | None:
    model: Any = None
    if isinstance(generation, ChatGeneration):
        model = generation.message.response_metadata.get("model_name") or generation.message.response_metadata.get(
            "model"
        )
    if not model:
        model = (result.llm_output or {}).get("model_name")
    return model if isinstance(model, str) and model else None


def result_attributes(result: LLMResult) -> dict[str, Any]:
    """The GenAI response attributes of an LLM run's result (first prompt of the batch, every choice)."""
    attributes: dict[str, Any] = {}
    choices = result.generations[0] if result.generations else []
    if not choices:
        return attributes
    first = choices[0]
    outputs: list[dict[str, Any]] = []
    reasons: list[str] = []
    for generation in choices:
        if isinstance(generation, ChatGeneration):
            outputs.append(message_dict(generation.message))
        else:
            outputs.append({"role": "assistant", "content": generation.text})
        reason = _finish_reason(generation)
        if reason is not None:
            reasons.append(reason)
    attributes[semconv.GEN_AI_OUTPUT_MESSAGES] = to_json(outputs)
    if reasons:
        attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    response_id = _response_id(result, first)
    if response_id is not None:
        attributes[semconv.GEN_AI_RESPONSE_ID] = response_id
    model = _response_model(result, first)
    if model is not None:
        attributes[semconv.GEN_AI_RESPONSE_MODEL] = model
    input_tokens, output_tokens = _usage(result, first)
    if input_tokens is not None:
        attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    if output_tokens is not None:
        attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
    return attributes


def tool_result_text(output: Any) -> str:
    """``gen_ai.tool.call.result``: a tool's output as text (a ToolMessage's content, JSON for structures)."""
    if isinstance(output, ToolMessage):
        output = output.content
    if isinstance(output, str):
        return output
    return to_json(output)
