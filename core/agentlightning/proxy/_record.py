"""What the proxy learns from one LLM call: assembling (streamed) responses, stripping added fields, building the span.

Chat completions follow vLLM >= 0.10.2 (``prompt_token_ids`` top level, ``choices[i].token_ids``; on streams prompt ids
on the first chunk and per-chunk id deltas). Responses API objects carry ``prompt_token_ids`` and ``token_ids`` at the
top level (our policy server and :mod:`agentlightning.testing.fake_openai` do; on streams in ``response.completed``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast

import orjson

from agentlightning import semconv as sc
from agentlightning.types import Attributes, Span, SpanStatus

Json: TypeAlias = dict[str, Any]
Endpoint: TypeAlias = Literal["chat", "responses"]

# Responses API statuses -> chat-style finish reasons, so the adapter reads one vocabulary.
_RESPONSES_FINISH = {"completed": "stop", "incomplete": "length", "failed": "error", "cancelled": "cancelled"}
_RESPONSES_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def as_dict(value: object) -> Json:
    """``value`` if it is a JSON object, else an empty dict (the wire may hold anything)."""
    return cast(Json, value) if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    """``value`` if it is a JSON array, else an empty list."""
    return cast(list[Any], value) if isinstance(value, list) else []


def _ints(value: object) -> list[int]:
    return [v for v in as_list(value) if isinstance(v, int)]


def _text_of(content: object) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = (as_dict(part).get("text") for part in as_list(content))
    return "".join(text for text in texts if isinstance(text, str))


@dataclass(frozen=True)
class Additions:
    """Fields the proxy added to the upstream request that the agent did not ask for (stripped from replies)."""

    token_ids: bool = False
    logprobs: bool = False

    def __bool__(self) -> bool:
        return self.token_ids or self.logprobs


# --- stripping ------------------------------------------------------------------------------------------------------
def strip_chat(payload: Json, added: Additions) -> None:
    """Restore a chat completion (or chunk) to what the upstream sends when not asked for ids/logprobs."""
    if added.token_ids:
        payload.pop("prompt_token_ids", None)
    for choice in as_list(payload.get("choices")):
        choice = as_dict(choice)
        if added.token_ids:
            choice.pop("token_ids", None)
        if added.logprobs and "logprobs" in choice:
            choice["logprobs"] = None


def _strip_response_object(response: Json, added: Additions) -> None:
    if added.token_ids:
        response.pop("prompt_token_ids", None)
        response.pop("token_ids", None)
    if added.logprobs:
        for item in as_list(response.get("output")):
            _strip_output_item(as_dict(item))


def _strip_output_item(item: Json) -> None:
    for part in as_list(item.get("content")):
        part = as_dict(part)
        if "logprobs" in part:
            part["logprobs"] = []


def strip_responses(payload: Json, added: Additions) -> None:
    """Restore a Responses API object or stream event to its shape without the added fields."""
    if payload.get("object") == "response":
        _strip_response_object(payload, added)
        return
    if isinstance(payload.get("response"), dict):
        _strip_response_object(as_dict(payload["response"]), added)
    if added.logprobs:
        if "logprobs" in payload:
            payload["logprobs"] = []
        if isinstance(payload.get("part"), dict) and "logprobs" in payload["part"]:
            as_dict(payload["part"])["logprobs"] = []
        if isinstance(payload.get("item"), dict):
            _strip_output_item(as_dict(payload["item"]))


# --- assembling -----------------------------------------------------------------------------------------------------
@dataclass
class _Choice:
    text: list[str] = field(default_factory=list[str])
    has_text: bool = False
    tool_calls: dict[int, Json] = field(default_factory=dict[int, Json])
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list[int])
    logprobs: list[float] = field(default_factory=list[float])


@dataclass
class _ResponsesOutput:
    """Text, function calls and logprobs read from Responses API output items (copied: the items get stripped)."""

    texts: list[str] = field(default_factory=list[str])
    calls: list[Json] = field(default_factory=list[Json])
    logprobs: list[float] = field(default_factory=list[float])

    def add_item(self, item: Json) -> None:
        """Read one output item (message or function call)."""
        if item.get("type") == "message":
            for part in map(as_dict, as_list(item.get("content"))):
                if isinstance(part.get("text"), str):
                    self.texts.append(part["text"])
                for entry in map(as_dict, as_list(part.get("logprobs"))):
                    if isinstance(entry.get("logprob"), int | float):
                        self.logprobs.append(float(entry["logprob"]))
        elif item.get("type") == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            self.calls.append({"id": item.get("call_id"), "type": "function", "function": function})


@dataclass
class CallRecord:
    """Everything the span of one call needs; filled from a whole response or chunk by chunk."""

    endpoint: Endpoint
    request: Json
    rollout_id: str
    attempt_id: str
    start_time: int
    trace_id: str
    parent_id: str | None
    provider: str = "openai"
    response_id: str | None = None
    response_model: str | None = None
    prompt_ids: list[int] | None = None
    usage: Json | None = None
    policy_version: int | None = None
    choices: dict[int, _Choice] = field(default_factory=dict[int, _Choice])
    output: _ResponsesOutput | None = None
    response_status: str | None = None
    response_ids: list[int] | None = None
    error: str | None = None
    error_type: str | None = None
    chunks: int = 0

    # chat completions ------------------------------------------------------------------------------------------
    def add_chat(self, payload: Json, *, chunk: bool) -> None:
        """Fold a chat completion, or one streamed chunk of it, into the record."""
        self.chunks += chunk
        self.response_id = payload.get("id") or self.response_id
        self.response_model = payload.get("model") or self.response_model
        if "prompt_token_ids" in payload and payload["prompt_token_ids"] is not None:
            self.prompt_ids = _ints(payload["prompt_token_ids"])
        if isinstance(payload.get("usage"), dict):
            self.usage = as_dict(payload["usage"])
        for raw in as_list(payload.get("choices")):
            raw = as_dict(raw)
            index = raw.get("index", 0)
            choice = self.choices.setdefault(index if isinstance(index, int) else 0, _Choice())
            message = as_dict(raw.get("delta") if chunk else raw.get("message"))
            content = _text_of(message.get("content"))
            if content is not None:
                choice.text.append(content)
                choice.has_text = True
            for position, call in enumerate(as_list(message.get("tool_calls"))):
                call = as_dict(call)
                slot = call.get("index", position)
                self._merge_tool_call(choice, slot if isinstance(slot, int) else position, call)
            choice.finish_reason = raw.get("finish_reason") or choice.finish_reason
            choice.token_ids.extend(_ints(raw.get("token_ids")))
            entries = as_list(as_dict(raw.get("logprobs")).get("content"))
            try:  # the shape every OpenAI-compatible server sends, read without per-token checks
                choice.logprobs.extend([float(entry["logprob"]) for entry in entries])
            except (TypeError, KeyError, ValueError):
                for entry in entries:
                    logprob = as_dict(entry).get("logprob")
                    if isinstance(logprob, int | float):
                        choice.logprobs.append(float(logprob))

    @staticmethod
    def _merge_tool_call(choice: _Choice, slot: int, call: Json) -> None:
        merged = choice.tool_calls.setdefault(slot, {"id": None, "type": "function", "name": "", "arguments": ""})
        function = as_dict(call.get("function"))
        merged["id"] = call.get("id") or merged["id"]
        merged["name"] += function.get("name") or ""
        merged["arguments"] += function.get("arguments") or ""

    # responses API ---------------------------------------------------------------------------------------------
    def add_response(self, response: Json) -> None:
        """Fold a whole Responses API object into the record (non-streamed, or from the final stream event)."""
        self.response_id = response.get("id") or self.response_id
        self.response_model = response.get("model") or self.response_model
        self.response_status = response.get("status") or self.response_status
        if isinstance(response.get("usage"), dict):
            self.usage = as_dict(response["usage"])
        if response.get("prompt_token_ids") is not None:
            self.prompt_ids = _ints(response["prompt_token_ids"])
        if response.get("token_ids") is not None:
            self.response_ids = _ints(response["token_ids"])
        if isinstance(response.get("output"), list):
            self.output = _ResponsesOutput()
            for item in as_list(response["output"]):
                self.output.add_item(as_dict(item))
        error = as_dict(response.get("error"))
        if error:
            self.error = str(error.get("message") or error)

    def add_response_event(self, event: Json) -> None:
        """Fold one Responses API stream event into the record."""
        self.chunks += 1
        kind = event.get("type")
        if kind in _RESPONSES_FINAL_EVENTS or kind == "response.created":
            self.add_response(as_dict(event.get("response")))
        elif kind == "response.output_item.done":
            # Kept until the final event replaces them: a cut stream still yields the finished items.
            self.output = self.output or _ResponsesOutput()
            self.output.add_item(as_dict(event.get("item")))
        elif kind == "error":
            self.error = str(event.get("message") or event)

    # span ------------------------------------------------------------------------------------------------------
    def _output(self) -> tuple[list[Json], list[str], list[int] | None, list[float]]:
        """Output messages, finish reasons, response token ids and logprobs, whatever the endpoint."""
        if self.endpoint == "chat":
            messages: list[Json] = []
            reasons: list[str] = []
            for _, choice in sorted(self.choices.items()):
                message: Json = {"role": "assistant", "content": "".join(choice.text) if choice.has_text else None}
                if choice.tool_calls:
                    message["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]},
                        }
                        for _, c in sorted(choice.tool_calls.items())
                    ]
                if choice.finish_reason:
                    message["finish_reason"] = choice.finish_reason
                    reasons.append(choice.finish_reason)
                messages.append(message)
            first = self.choices.get(0)
            ids = first.token_ids if first is not None and first.token_ids else None
            return messages, reasons, ids, first.logprobs if first is not None else []
        output = self.output or _ResponsesOutput()
        texts, calls, logprobs = output.texts, output.calls, output.logprobs
        reason = "tool_calls" if calls and self.response_status == "completed" else None
        reason = reason or _RESPONSES_FINISH.get(self.response_status or "", self.response_status)
        message = {"role": "assistant", "content": "".join(texts) if texts else None}
        if calls:
            message["tool_calls"] = calls
        if reason:
            message["finish_reason"] = reason
        return [message], [reason] if reason else [], self.response_ids, logprobs

    def to_span(self, *, end_time: int | None = None) -> Span:
        """The LLM span of this call (status ERROR when the call failed or was cut)."""
        request = self.request
        model = request.get("model")
        attributes: Attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.SPAN_SOURCE: sc.SOURCE_PROXY,
            sc.GEN_AI_PROVIDER_NAME: self.provider,
            sc.ROLLOUT_ID: self.rollout_id,
            sc.ATTEMPT_ID: self.attempt_id,
        }
        if isinstance(model, str):
            attributes[sc.GEN_AI_REQUEST_MODEL] = model
        if isinstance(request.get("temperature"), int | float):
            attributes[sc.GEN_AI_REQUEST_TEMPERATURE] = float(request["temperature"])
        max_tokens = request.get("max_completion_tokens", request.get("max_tokens", request.get("max_output_tokens")))
        if isinstance(max_tokens, int):
            attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
        if self.endpoint == "chat":
            attributes[sc.GEN_AI_INPUT_MESSAGES] = orjson.dumps(request.get("messages") or []).decode()
        else:
            messages = responses_input_messages(request)
            attributes[sc.GEN_AI_INPUT_MESSAGES] = orjson.dumps(messages).decode()
            if isinstance(request.get("instructions"), str):
                attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS] = orjson.dumps(request["instructions"]).decode()
        if request.get("tools"):
            attributes[sc.GEN_AI_TOOL_DEFINITIONS] = orjson.dumps(request["tools"]).decode()
        if self.response_model:
            attributes[sc.GEN_AI_RESPONSE_MODEL] = str(self.response_model)
        if self.response_id:
            attributes[sc.GEN_AI_RESPONSE_ID] = str(self.response_id)
        messages, reasons, response_ids, logprobs = self._output()
        if self.chunks or self.choices or self.output is not None:
            attributes[sc.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(messages).decode()
        if reasons:
            attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
        self._usage_attributes(attributes, response_ids)
        if self.prompt_ids is not None:
            attributes[sc.PROMPT_TOKEN_IDS] = self.prompt_ids
        if response_ids is not None:
            attributes[sc.RESPONSE_TOKEN_IDS] = response_ids
        if logprobs:
            attributes[sc.RESPONSE_LOGPROBS] = logprobs
        if self.policy_version is not None:
            attributes[sc.POLICY_VERSION] = self.policy_version
        if self.error_type is not None:
            attributes[sc.ERROR_TYPE] = self.error_type
        status = SpanStatus(code="ERROR", message=self.error) if self.error is not None else SpanStatus(code="OK")
        return Span.model_construct(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            sequence_id=0,
            trace_id=self.trace_id,
            span_id=os.urandom(8).hex(),
            parent_id=self.parent_id,
            name=f"{sc.OP_CHAT} {model}" if isinstance(model, str) else sc.OP_CHAT,
            kind="CLIENT",
            start_time=self.start_time,
            end_time=end_time or time.time_ns(),
            status=status,
            attributes=attributes,
            events=[],
            links=[],
            resource={sc.ROLLOUT_ID: self.rollout_id, sc.ATTEMPT_ID: self.attempt_id},
        )

    def _usage_attributes(self, attributes: Attributes, response_ids: list[int] | None) -> None:
        usage = self.usage or {}
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        # Streams without include_usage carry no usage; the token ids count the same thing.
        if not isinstance(prompt, int) and self.prompt_ids is not None:
            prompt = len(self.prompt_ids)
        if not isinstance(completion, int) and response_ids is not None:
            completion = len(response_ids)
        if isinstance(prompt, int):
            attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = prompt
        if isinstance(completion, int):
            attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = completion


def responses_input_messages(request: Json) -> list[Json]:
    """Responses API ``instructions`` + ``input`` items as chat-shaped messages (the span contract's shape)."""
    messages: list[Json] = []
    if isinstance(request.get("instructions"), str):
        messages.append({"role": "system", "content": request["instructions"]})
    items = request.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in map(as_dict, as_list(items)):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role", "user"), "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            call = {"id": item.get("call_id"), "type": "function", "function": function}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else orjson.dumps(output).decode()
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
        else:  # reasoning, web search, ...: kept verbatim so nothing the model saw is lost
            messages.append({"role": "assistant", "content": None, "item": item})
    return messages


def parse_traceparent(value: str | None) -> tuple[str, str | None]:
    """(trace_id, parent span id) from a W3C ``traceparent`` header, or a fresh trace when absent or malformed."""
    if value:
        parts = value.strip().split("-")
        if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
            return parts[1].lower(), parts[2].lower()
    return os.urandom(16).hex(), None
