"""Foreign OpenTelemetry conventions (OpenInference, OpenLLMetry, GenAI message parts) mapped onto our span contract.

Spans from other instrumentations describe LLM calls, tool calls and agents with their own attributes. This module
adds the attributes our hooks record (see :mod:`agentlightning.semconv`) next to the originals, so that the adapter
reads a foreign call exactly like a native one. It is pure: it only reads and writes attribute dictionaries.

Conventions and the facts each mapping follows (see ``docs/foreign_traces.md`` for the tested package versions):

* ``openinference``: ``openinference.span.kind`` with ``llm.input_messages.{i}.message.*``, ``llm.output_messages``,
  ``llm.model_name``, ``llm.invocation_parameters``, ``llm.token_count.*``, ``llm.tools.{i}.tool.json_schema``,
  ``tool.*``, ``agent.name`` and ``graph.node.*`` (openinference-semantic-conventions ``SpanAttributes``).
* ``openllmetry``: the indexed ``gen_ai.prompt.{i}.*`` / ``gen_ai.completion.{i}.*`` attributes, ``llm.request.type``,
  ``llm.request.functions.{i}.*`` and ``traceloop.span.kind`` / ``traceloop.entity.*``
  (opentelemetry-semantic-conventions-ai ``SpanAttributes``).
* ``otel-genai``: GenAI semconv messages as ``parts`` (``{"role", "parts": [{"type": "text", "content"}, {"type":
  "tool_call", ...}]}``) and flat tool definitions, rewritten into the OpenAI chat shape our adapter reads; the
  originals are kept under :data:`ORIGINAL_PREFIX`.

A span that claims a convention but lacks what a call needs is left unmapped and flagged with :data:`MISSING`.

GenAI message *events* sent as OTLP log records (``POST /v1/logs``) are stored as spans of their own
(:data:`LOG_SOURCE`) and folded into the span they name when the adapter reads the attempt
(:func:`apply_conventions`): the per-message ``gen_ai.{role}.message`` / ``gen_ai.choice`` events
(opentelemetry-instrumentation-openai-v2's default form) and the ``gen_ai.client.inference.operation.details`` event.
The older form's ``gen_ai.content.prompt`` / ``gen_ai.content.completion`` span events are folded the same way
(:func:`fold_content_events`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, cast

from agentlightning import semconv as sc
from agentlightning.types import Attributes, AttributeValue, Span, SpanEvent

CONVENTION: Final = "agentlightning.convention"
"""Name of the foreign convention a span was mapped from: ``openinference``, ``openllmetry`` or ``otel-genai``."""
CONVENTION_SCOPE: Final = "agentlightning.convention.scope"
"""``"<instrumentation scope name> <version>"`` of the span, recorded at OTLP ingest (unknown to the adapter)."""
MISSING: Final = "agentlightning.convention.missing"
"""Attributes a span's claimed convention requires but the span lacks; such a span is stored unmapped."""
ORIGINAL_PREFIX: Final = "agentlightning.convention.original."
"""Prefix under which an attribute rewritten in place (GenAI ``parts`` messages) keeps its original value."""

LOG_SOURCE: Final = "otlp-log"
"""``agentlightning.span.source`` of a span that holds one OTLP log record (parent = the record's span)."""
LOG_EVENT_NAME: Final = "agentlightning.log.event_name"
"""Event name of a stored log record (``LogRecord.event_name``, or its ``event.name`` attribute)."""
LOG_BODY: Final = "agentlightning.log.body"
"""Body of a stored log record as JSON text."""
LOG_RECORDS: Final = "agentlightning.convention.log_records"
"""How many log records the adapter folded into a span (set on its copy, never stored)."""

OPENINFERENCE: Final = "openinference"
OPENLLMETRY: Final = "openllmetry"
OTEL_GENAI: Final = "otel-genai"

_OI_KIND = "openinference.span.kind"
_TL_KIND = "traceloop.span.kind"
_TL_REQUEST_TYPE = "llm.request.type"
# Keys an OpenLLMetry span has one of (a prompt or completion is indexed from 0).
_TL_MARKERS = frozenset(
    {
        _TL_KIND,
        _TL_REQUEST_TYPE,
        "traceloop.entity.name",
        "gen_ai.prompt.0.role",
        "gen_ai.prompt.0.content",
        "gen_ai.completion.0.role",
        "gen_ai.completion.0.content",
        "llm.request.functions.0.name",
    }
)
_GENAI_KEYS = frozenset({sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_TOOL_DEFINITIONS})
_NATIVE_SOURCES = frozenset({sc.SOURCE_PROXY, sc.SOURCE_HOOK, sc.SOURCE_EMIT})
_INDEXED = re.compile(r"^(\d+)\.(.+)$")
# GenAI FinishReason says "tool_call"; the OpenAI chat shape our adapter reads says "tool_calls".
_FINISH_REASONS = {"tool_call": "tool_calls"}
_PART_MESSAGES = (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES)


def detect_convention(attributes: Mapping[str, AttributeValue]) -> str | None:
    """The foreign convention a span's attributes follow, or None for native and unrecognised spans."""
    if CONVENTION in attributes or attributes.get(sc.SPAN_SOURCE) in _NATIVE_SOURCES:
        return None
    if _OI_KIND in attributes:
        return OPENINFERENCE
    # Set operations in C, no generators: the adapter asks this of every span it reads.
    if not _TL_MARKERS.isdisjoint(attributes):
        return OPENLLMETRY
    if _GENAI_KEYS.isdisjoint(attributes):
        return None
    if _has_parts(attributes.get(sc.GEN_AI_INPUT_MESSAGES)) or _has_parts(attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)):
        return OTEL_GENAI
    return OTEL_GENAI if _flat_tools(attributes) is not None else None


def map_convention(
    attributes: Mapping[str, AttributeValue], *, span_name: str = "", scope: str | None = None
) -> Attributes:
    """The span's attributes plus our contract's ones mapped from its foreign convention (unchanged copy if none)."""
    result: Attributes = dict(attributes)
    convention = detect_convention(attributes)
    if convention is None:
        return result
    mapped: Attributes = {}
    try:
        missing = _MAPPERS[convention](result, mapped, span_name)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # Foreign input is untrusted: a malformed value flags the span instead of failing the export or the adapter.
        missing = [f"well-formed attributes ({type(exc).__name__}: {exc})"]
    result[CONVENTION] = convention
    if scope:
        result[CONVENTION_SCOPE] = scope
    if missing:
        result[MISSING] = missing
        return result
    for key, value in mapped.items():
        if key.startswith(ORIGINAL_PREFIX) or key in _PART_MESSAGES or key == sc.GEN_AI_TOOL_DEFINITIONS:
            result[key] = value
        else:
            result.setdefault(key, value)
    return result


def apply_convention(span: Span) -> Span:
    """A stored span with its foreign convention mapped: a new span, or the same one when native or already mapped.

    Never changes ``span`` itself: stores (the in-memory one) may hand out the objects they keep.
    """
    if span.events and not _CONTENT_EVENTS.isdisjoint(e.name for e in span.events):
        return fold_content_events(span)
    if detect_convention(span.attributes) is None:
        return span
    return span.model_copy(update={"attributes": map_convention(span.attributes, span_name=span.name)})


_PROMPT_EVENT = "gen_ai.content.prompt"
_COMPLETION_EVENT = "gen_ai.content.completion"
_CONTENT_EVENTS = frozenset({_PROMPT_EVENT, _COMPLETION_EVENT})
# The older GenAI form's operation name for chat completions (llm-spans.md: `chat.completions`, `embeddings`, ...).
_OLD_CHAT_OPERATION = "chat.completions"


def fold_content_events(span: Span) -> Span:
    """A copy of ``span`` with the messages of the older GenAI form's span events as our message attributes.

    That form (semantic-conventions ``docs/gen-ai/llm-spans.md``, "Events"; deprecated since) puts the prompt on a
    ``gen_ai.content.prompt`` event (attribute ``gen_ai.prompt``) and the reply on a ``gen_ai.content.completion``
    event (``gen_ai.completion``), each a JSON string in the OpenAI messages format; the spec's own examples are
    Python literals (``[{'role': 'user', ...}]``), read too. The span's own message attributes win.
    """
    if span.attributes.get(sc.SPAN_SOURCE) in _NATIVE_SOURCES:
        return span
    attributes = map_convention(span.attributes, span_name=span.name)
    events = {e.name: e for e in span.events if e.name in _CONTENT_EVENTS}
    attributes[CONVENTION] = OTEL_GENAI
    try:
        prompt = _event_messages(events.get(_PROMPT_EVENT), "gen_ai.prompt")
        completion = _event_messages(events.get(_COMPLETION_EVENT), "gen_ai.completion")
    except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
        # Foreign input is untrusted: a malformed value flags the span instead of failing the adapter.
        attributes[MISSING] = [f"well-formed gen_ai.content.* events ({type(exc).__name__}: {exc})"]
        return span.model_copy(update={"attributes": attributes})
    if prompt is None and sc.GEN_AI_INPUT_MESSAGES not in attributes:
        attributes[MISSING] = ["gen_ai.prompt on a gen_ai.content.prompt event"]
        return span.model_copy(update={"attributes": attributes})
    if prompt is not None:
        attributes.setdefault(sc.GEN_AI_INPUT_MESSAGES, _dumps(prompt))
    if completion is not None:
        reasons = attributes.get("gen_ai.response.finish_reasons")
        if completion and isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
            completion[0].setdefault("finish_reason", _FINISH_REASONS.get(reasons[0], reasons[0]))
        attributes.setdefault(sc.GEN_AI_OUTPUT_MESSAGES, _dumps(completion))
    operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
    if operation is None or operation == _OLD_CHAT_OPERATION:
        if operation is not None:
            attributes[ORIGINAL_PREFIX + sc.GEN_AI_OPERATION_NAME] = operation
        attributes[sc.GEN_AI_OPERATION_NAME] = sc.OP_CHAT
    # That form's usage names (llm-spans.md): gen_ai.usage.prompt_tokens / completion_tokens.
    _copy_int(attributes, "gen_ai.usage.prompt_tokens", attributes, sc.GEN_AI_USAGE_INPUT_TOKENS)
    _copy_int(attributes, "gen_ai.usage.completion_tokens", attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    _copy_str(attributes, "gen_ai.system", attributes, sc.GEN_AI_PROVIDER_NAME)
    return span.model_copy(update={"attributes": attributes})


def _event_messages(event: SpanEvent | None, key: str) -> list[dict[str, Any]] | None:
    """The OpenAI chat messages of a ``gen_ai.content.*`` event's ``key`` attribute; None when absent."""
    raw = None if event is None else event.attributes.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise TypeError(f"{key} is {type(raw).__name__}, not a string")
    value: object
    try:
        value = json.loads(raw)
    except ValueError:
        value = ast.literal_eval(raw)  # the spec's examples: a Python literal (literals only, never code)
    if isinstance(value, dict):
        value = [cast(dict[str, Any], value)]
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in cast(list[Any], value)):
        raise TypeError(f"{key} is not a list of messages")
    return [dict(cast(dict[str, Any], m)) for m in cast(list[Any], value)]


def apply_conventions(spans: Sequence[Span]) -> list[Span]:
    """An attempt's spans as the adapter reads them: conventions mapped, GenAI log records folded into their span.

    Log-record spans leave the result: those whose span is present become its messages (on a copy), the others
    (their span never arrived) stay in the store only. Spans are never changed in place.
    """
    records: dict[str, list[Span]] = {}
    result: list[Span] = []
    for span in spans:
        if span.attributes.get(sc.SPAN_SOURCE) == LOG_SOURCE:
            if span.parent_id is not None:
                records.setdefault(span.parent_id, []).append(span)
            continue
        result.append(apply_convention(span))
    if records:
        for index, span in enumerate(result):
            own = records.get(span.span_id)
            if own is not None:
                result[index] = fold_log_records(span, [r for r in own if r.trace_id == span.trace_id] or own)
    return result


def fold_log_records(span: Span, records: Sequence[Span]) -> Span:
    """A copy of ``span`` with the GenAI messages its log records carry; the span's own attributes win."""
    attributes: Attributes = dict(span.attributes)
    ordered = sorted(records, key=lambda r: (r.start_time, r.sequence_id))
    try:
        mapped, missing = _messages_from_records(ordered)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # Foreign input is untrusted: a malformed record flags the span instead of failing the adapter.
        mapped, missing = {}, [f"well-formed log records ({type(exc).__name__}: {exc})"]
    attributes[LOG_RECORDS] = len(ordered)
    if not mapped and not missing:
        return span.model_copy(update={"attributes": attributes})  # records of another kind: nothing to fold
    attributes.setdefault(CONVENTION, OTEL_GENAI)
    if missing and sc.GEN_AI_INPUT_MESSAGES not in attributes:
        attributes[MISSING] = missing
    for key, value in mapped.items():
        attributes.setdefault(key, value)
    _copy_str(attributes, "gen_ai.system", attributes, sc.GEN_AI_PROVIDER_NAME)
    return span.model_copy(update={"attributes": attributes})


_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_DETAILS_KEYS = (
    sc.GEN_AI_INPUT_MESSAGES,
    sc.GEN_AI_OUTPUT_MESSAGES,
    sc.GEN_AI_SYSTEM_INSTRUCTIONS,
    sc.GEN_AI_TOOL_DEFINITIONS,
)


def _messages_from_records(records: Sequence[Span]) -> tuple[Attributes, list[str]]:
    """(mapped message attributes, what is missing) from a span's GenAI event records, in emission order."""
    inputs: list[dict[str, Any]] = []
    choices: list[tuple[int, dict[str, Any]]] = []
    details: Attributes = {}
    captured = False  # whether any message event carries content (the instrumentation's capture switch was on)
    for record in records:
        name = record.attributes.get(LOG_EVENT_NAME, record.name)
        if name == _DETAILS_EVENT:
            for key in _DETAILS_KEYS:
                if key in record.attributes and key not in details:
                    details[key] = record.attributes[key]
        elif name == "gen_ai.choice":
            body = _event_body(record, "gen_ai.choice")
            inner = body.get("message")
            captured = captured or (isinstance(inner, dict) and "content" in inner)
            choices.append(_choice_from_event(body))
        elif isinstance(name, str) and name.startswith("gen_ai.") and name.endswith(".message"):
            body = _event_body(record, name)
            captured = captured or "content" in body
            inputs.append(_message_from_event(name[len("gen_ai.") : -len(".message")], body))
    mapped: Attributes = {}
    if details:
        # The details event carries the span attribute form's keys (as arrays of maps): map them the same way.
        converted = map_convention(details)
        mapped.update({key: value for key, value in converted.items() if not key.startswith("agentlightning.")})
        mapped.update({key: value for key, value in converted.items() if key.startswith(ORIGINAL_PREFIX)})
        if MISSING in converted:
            return {}, cast(list[str], converted[MISSING])
    if (inputs or choices) and not captured and not mapped:
        # Without content capture the events hold roles and tool names only: nothing to train on.
        return {}, ["content in gen_ai.*.message records (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)"]
    if inputs and sc.GEN_AI_INPUT_MESSAGES not in mapped:
        mapped[sc.GEN_AI_INPUT_MESSAGES] = _dumps(inputs)
    if choices and sc.GEN_AI_OUTPUT_MESSAGES not in mapped:
        mapped[sc.GEN_AI_OUTPUT_MESSAGES] = _dumps([message for _, message in sorted(choices, key=lambda c: c[0])])
    return mapped, []


def _event_body(record: Span, name: str) -> dict[str, Any]:
    raw = record.attributes.get(LOG_BODY)
    if raw is None:
        return {}
    body = json.loads(str(raw))
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise TypeError(f"{name} body is {type(body).__name__}, not a map")
    return cast(dict[str, Any], body)


def _message_from_event(role: str, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message from a ``gen_ai.{role}.message`` event body (GenAI events spec, v1.28-1.36)."""
    message: dict[str, Any] = {"role": str(body.get("role") or role)}
    if "content" in body:
        message["content"] = body["content"]
    calls = body.get("tool_calls")
    if calls is not None:
        message["tool_calls"] = [_event_tool_call(call) for call in cast(list[Any], calls)]
        message.setdefault("content", None)
    if body.get("id") is not None and message["role"] == "tool":
        message["tool_call_id"] = str(body["id"])
    return message


def _choice_from_event(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(index, OpenAI chat message) of a ``gen_ai.choice`` event body."""
    raw = body.get("message")
    inner = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
    message: dict[str, Any] = {"role": str(inner.get("role") or "assistant"), "content": inner.get("content")}
    calls = inner.get("tool_calls")
    if calls is not None:
        message["tool_calls"] = [_event_tool_call(call) for call in cast(list[Any], calls)]
        message["content"] = message["content"] or None  # a streamed tool call's "" reads as the non-streamed None
    reason = body.get("finish_reason")
    if isinstance(reason, str) and reason:
        message["finish_reason"] = _FINISH_REASONS.get(reason, reason)
    index = body.get("index", 0)
    return (index if isinstance(index, int) else 0), message


def _event_tool_call(call: object) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise TypeError(f"a tool call is {type(call).__name__}, not a map")
    fields = cast(dict[str, Any], call)
    function = fields.get("function")
    function = cast(dict[str, Any], function) if isinstance(function, dict) else {}
    return _openai_tool_call(fields.get("id"), function.get("name"), function.get("arguments"))


# --- OpenInference ------------------------------------------------------------------------------------------------
def _map_openinference(attributes: Attributes, out: Attributes, span_name: str) -> list[str]:
    kind = str(attributes.get(_OI_KIND, "")).upper()
    agent = attributes.get("agent.name")
    if kind == "AGENT" and not agent:
        # openinference-instrumentation's @tracer.agent names the span after the agent and sets no agent.name.
        agent = attributes.get("graph.node.name") or span_name
    if isinstance(agent, str) and agent:
        out[sc.GEN_AI_AGENT_NAME] = agent
    if kind == "LLM":
        return _map_openinference_llm(attributes, out)
    if kind == "TOOL":
        if not attributes.get("tool.name"):
            return ["tool.name"]
        out[sc.GEN_AI_OPERATION_NAME] = sc.OP_EXECUTE_TOOL
        out[sc.GEN_AI_TOOL_NAME] = str(attributes["tool.name"])
        _copy_str(attributes, "tool.id", out, sc.GEN_AI_TOOL_CALL_ID)
        _copy_str(attributes, "input.value", out, sc.GEN_AI_TOOL_CALL_ARGUMENTS)
        _copy_str(attributes, "output.value", out, sc.GEN_AI_TOOL_CALL_RESULT)
    elif kind == "AGENT":
        if sc.GEN_AI_AGENT_NAME not in out:
            return ["agent.name"]
        out[sc.GEN_AI_OPERATION_NAME] = sc.OP_INVOKE_AGENT
    return []


def _map_openinference_llm(attributes: Attributes, out: Attributes) -> list[str]:
    inputs = _indexed(attributes, "llm.input_messages.")
    if not inputs:
        return ["llm.input_messages.0.message.role"]
    out[sc.GEN_AI_OPERATION_NAME] = sc.OP_CHAT
    out[sc.GEN_AI_INPUT_MESSAGES] = _dumps([_oi_message(fields) for fields in inputs])
    outputs = [_oi_message(fields) for fields in _indexed(attributes, "llm.output_messages.")]
    if outputs:
        reason = attributes.get("llm.finish_reason")
        if isinstance(reason, str) and reason:
            outputs[0].setdefault("finish_reason", reason)
        out[sc.GEN_AI_OUTPUT_MESSAGES] = _dumps(outputs)
    _copy_str(attributes, "llm.model_name", out, sc.GEN_AI_REQUEST_MODEL)
    _copy_str(attributes, "llm.provider", out, sc.GEN_AI_PROVIDER_NAME)
    _copy_str(attributes, "llm.system", out, sc.GEN_AI_PROVIDER_NAME)
    _copy_int(attributes, "llm.token_count.prompt", out, sc.GEN_AI_USAGE_INPUT_TOKENS)
    _copy_int(attributes, "llm.token_count.completion", out, sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    _invocation_parameters(attributes.get("llm.invocation_parameters"), out)
    tools = [_loads(fields.get("tool.json_schema")) for fields in _indexed(attributes, "llm.tools.")]
    if tools:
        schemas = [cast(dict[str, Any], tool) for tool in tools if isinstance(tool, dict)]
        out[sc.GEN_AI_TOOL_DEFINITIONS] = _dumps([_openai_tool(schema) for schema in schemas])
    # OpenInference has no response-id attribute; the JSON response body carries it, and the proxy join needs it.
    if attributes.get("output.mime_type") == "application/json":
        body = _loads(attributes.get("output.value"))
        response_id = cast(dict[str, Any], body).get("id") if isinstance(body, dict) else None
        if isinstance(response_id, str) and response_id:
            out[sc.GEN_AI_RESPONSE_ID] = response_id
    return []


def _oi_message(fields: dict[str, AttributeValue]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": str(fields.get("message.role", "user"))}
    contents = _indexed(fields, "message.contents.")
    if "message.content" in fields:
        message["content"] = fields["message.content"]
    elif contents:
        parts = [_oi_content(part) for part in contents]
        # All-text contents (the Responses API's output_text parts) read as one string, as OpenAI's output_text does.
        texts = [part["text"] for part in parts if part["type"] == "text"]
        message["content"] = "".join(map(str, texts)) if len(texts) == len(parts) else parts
    calls = _indexed(fields, "message.tool_calls.")
    if calls:
        message["tool_calls"] = [
            _openai_tool_call(
                call.get("tool_call.id"), call.get("tool_call.function.name"), call.get("tool_call.function.arguments")
            )
            for call in calls
        ]
    _copy_str(fields, "message.tool_call_id", message, "tool_call_id")
    _copy_str(fields, "message.name", message, "name")
    return message


def _oi_content(part: dict[str, AttributeValue]) -> dict[str, Any]:
    if "message_content.image.image.url" in part:
        return {"type": "image_url", "image_url": {"url": part["message_content.image.image.url"]}}
    return {"type": "text", "text": part.get("message_content.text", "")}


def _invocation_parameters(raw: AttributeValue | None, out: Attributes) -> None:
    params = _loads(raw)
    if not isinstance(params, dict):
        return
    params = cast(dict[str, Any], params)
    if isinstance(params.get("model"), str):
        out.setdefault(sc.GEN_AI_REQUEST_MODEL, params["model"])
    temperature = params.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool):
        out[sc.GEN_AI_REQUEST_TEMPERATURE] = float(temperature)
    max_tokens = params.get("max_completion_tokens", params.get("max_tokens"))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        out[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens


# --- OpenLLMetry / Traceloop --------------------------------------------------------------------------------------
def _map_openllmetry(attributes: Attributes, out: Attributes, span_name: str) -> list[str]:
    kind = attributes.get(_TL_KIND)
    entity = attributes.get("traceloop.entity.name")
    if kind == "agent":
        if not isinstance(entity, str) or not entity:
            return ["traceloop.entity.name"]
        out[sc.GEN_AI_OPERATION_NAME] = sc.OP_INVOKE_AGENT
        out[sc.GEN_AI_AGENT_NAME] = entity
    elif kind == "tool":
        if not isinstance(entity, str) or not entity:
            return ["traceloop.entity.name"]
        out[sc.GEN_AI_OPERATION_NAME] = sc.OP_EXECUTE_TOOL
        out[sc.GEN_AI_TOOL_NAME] = entity
        _copy_str(attributes, "traceloop.entity.input", out, sc.GEN_AI_TOOL_CALL_ARGUMENTS)
        _copy_str(attributes, "traceloop.entity.output", out, sc.GEN_AI_TOOL_CALL_RESULT)
    request_type = attributes.get(_TL_REQUEST_TYPE)
    prompts = _indexed(attributes, "gen_ai.prompt.")
    if request_type not in ("chat", "completion") and not prompts:
        return _map_otel_genai(attributes, out, span_name)
    if not prompts and sc.GEN_AI_INPUT_MESSAGES not in attributes:
        return ["gen_ai.prompt.0.role"]
    out[sc.GEN_AI_OPERATION_NAME] = "text_completion" if request_type == "completion" else sc.OP_CHAT
    if prompts:
        out[sc.GEN_AI_INPUT_MESSAGES] = _dumps([_tl_message(fields) for fields in prompts])
    completions = _indexed(attributes, "gen_ai.completion.")
    if completions:
        out[sc.GEN_AI_OUTPUT_MESSAGES] = _dumps([_tl_message(fields) for fields in completions])
    functions = _indexed(attributes, "llm.request.functions.")
    if functions:
        out[sc.GEN_AI_TOOL_DEFINITIONS] = _dumps([_tl_function(fields) for fields in functions])
    # Releases before the GenAI usage names recorded gen_ai.usage.prompt_tokens / completion_tokens.
    _copy_int(attributes, "gen_ai.usage.prompt_tokens", out, sc.GEN_AI_USAGE_INPUT_TOKENS)
    _copy_int(attributes, "gen_ai.usage.completion_tokens", out, sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    _copy_str(attributes, "gen_ai.system", out, sc.GEN_AI_PROVIDER_NAME)
    return _map_otel_genai(attributes, out, span_name)


def _tl_message(fields: dict[str, AttributeValue]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": str(fields.get("role", "user"))}
    if "content" in fields:
        message["content"] = fields["content"]
    calls = _indexed(fields, "tool_calls.")
    if calls:
        message["tool_calls"] = [_openai_tool_call(c.get("id"), c.get("name"), c.get("arguments")) for c in calls]
    _copy_str(fields, "tool_call_id", message, "tool_call_id")
    reason = fields.get("finish_reason")
    if isinstance(reason, str) and reason:
        message["finish_reason"] = _FINISH_REASONS.get(reason, reason)
    return message


def _tl_function(fields: dict[str, AttributeValue]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": str(fields.get("name", ""))}
    if isinstance(fields.get("description"), str):
        function["description"] = fields["description"]
    parameters = _loads(fields.get("parameters"))
    if isinstance(parameters, dict):
        function["parameters"] = parameters
    return {"type": "function", "function": function}


# --- GenAI semconv message parts ----------------------------------------------------------------------------------
def _map_otel_genai(attributes: Attributes, out: Attributes, span_name: str) -> list[str]:
    for key in _PART_MESSAGES:
        raw = attributes.get(key)
        if not _has_parts(raw):
            continue
        value = _loads(raw)
        out[ORIGINAL_PREFIX + key] = cast(str, raw)
        messages = [_chat_from_parts(cast(dict[str, Any], m)) for m in cast(list[Any], value) if isinstance(m, dict)]
        out[key] = _dumps([m for message in messages for m in message])
    tools = _flat_tools(attributes)
    if tools is not None:
        out[ORIGINAL_PREFIX + sc.GEN_AI_TOOL_DEFINITIONS] = cast(str, attributes[sc.GEN_AI_TOOL_DEFINITIONS])
        out[sc.GEN_AI_TOOL_DEFINITIONS] = _dumps([_openai_tool(tool) for tool in tools])
    _copy_str(attributes, "gen_ai.system", out, sc.GEN_AI_PROVIDER_NAME)
    return []


def _chat_from_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI chat messages of one GenAI message: a tool message per tool_call_response part, else one message."""
    role = str(message.get("role", "user"))
    parts = [cast(dict[str, Any], p) for p in cast(list[Any], message.get("parts") or []) if isinstance(p, dict)]
    texts = [str(p.get("content", "")) for p in parts if p.get("type") == "text"]
    calls = [
        _openai_tool_call(p.get("id"), p.get("name"), p.get("arguments")) for p in parts if p.get("type") == "tool_call"
    ]
    responses = [p for p in parts if p.get("type") == "tool_call_response"]
    result: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": str(p.get("id", "")), "content": _text(p.get("response", p.get("result")))}
        for p in responses
    ]
    if texts or calls or not responses:
        # A streamed tool call carries an empty text part; the non-streamed one has no content: both read as None.
        content = "\n".join(texts) if texts and (any(texts) or not calls) else None
        chat: dict[str, Any] = {"role": role, "content": content}
        if calls:
            chat["tool_calls"] = calls
        if isinstance(message.get("finish_reason"), str):
            chat["finish_reason"] = _FINISH_REASONS.get(message["finish_reason"], message["finish_reason"])
        result.append(chat)
    return result


def _has_parts(raw: AttributeValue | None) -> bool:
    if not isinstance(raw, str) or '"parts"' not in raw:
        return False
    value = _loads(raw)
    return isinstance(value, list) and any(isinstance(m, dict) and "parts" in m for m in cast(list[Any], value))


def _flat_tools(attributes: Mapping[str, AttributeValue]) -> list[dict[str, Any]] | None:
    """GenAI's flat tool definitions (``{"type": "function", "name": ...}``), None when absent or already nested."""
    value = _loads(attributes.get(sc.GEN_AI_TOOL_DEFINITIONS))
    if not isinstance(value, list):
        return None
    tools = [cast(dict[str, Any], t) for t in cast(list[Any], value) if isinstance(t, dict)]
    if not any("name" in tool and "function" not in tool for tool in tools):
        return None
    return tools


# --- shared helpers -----------------------------------------------------------------------------------------------
def _indexed(attributes: Mapping[str, AttributeValue], prefix: str) -> list[dict[str, AttributeValue]]:
    """``prefix{i}.rest`` attributes grouped by ``i`` in index order, each as ``{rest: value}``."""
    groups: dict[int, dict[str, AttributeValue]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        match = _INDEXED.match(key[len(prefix) :])
        if match is not None:
            groups.setdefault(int(match.group(1)), {})[match.group(2)] = value
    return [groups[index] for index in sorted(groups)]


def _openai_tool_call(call_id: object, name: object, arguments: object) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {})
    return {
        "id": "" if call_id is None else str(call_id),
        "type": "function",
        "function": {"name": "" if name is None else str(name), "arguments": arguments},
    }


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if "function" in tool:
        return tool
    function = {key: value for key, value in tool.items() if key != "type"}
    return {"type": "function", "function": function}


def _copy_str(source: Mapping[str, Any], key: str, target: dict[str, Any], as_key: str) -> None:
    value = source.get(key)
    if isinstance(value, str) and value and as_key not in target:
        target[as_key] = value


def _copy_int(source: Mapping[str, AttributeValue], key: str, target: Attributes, as_key: str) -> None:
    value = source.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and as_key not in target:
        target[as_key] = value


def _loads(raw: object) -> object:
    if not isinstance(raw, str):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


_MAPPERS: dict[str, Callable[[Attributes, Attributes, str], list[str]]] = {
    OPENINFERENCE: _map_openinference,
    OPENLLMETRY: _map_openllmetry,
    OTEL_GENAI: _map_otel_genai,
}
