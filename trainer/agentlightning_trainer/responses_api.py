"""The OpenAI Responses API (``POST /v1/responses``) as a view of the policy server's chat completions.

The OpenAI Agents SDK calls the Responses API by default, so the policy server answers it by translating: a request
becomes the chat request it asks for (:func:`chat_request_of`), the chat path generates, and its completion becomes
a Responses ``response`` object (:func:`chat_choice_to_response`) or its stream of events (:func:`response_stream`).

Token ids travel as docs/architecture.md ("Token ids on the wire") and the LLM proxy's ``_record.py`` read them:
with ``return_token_ids: true`` the response object carries top-level ``prompt_token_ids`` and ``token_ids`` (the
sampled ids, call tags and all); on streams they ride on the final event's response. Logprobs (asked for with
``include: ["message.output_text.logprobs"]``, as the proxy does) sit on the ``output_text`` part and cover the
sampled tokens only when the reply is text alone: a reply with function calls has no text part that those tokens
spell, so its part carries none.

The server keeps no state: ``previous_response_id`` and ``conversation`` are refused, the whole transcript comes in
``input`` (the Agents SDK sends it so by default).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

from agentlightning_trainer.tool_calls import validate_tools

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` entry asking for the output text's logprobs."""

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text")
_ITEM_TYPES = "'message', 'function_call' and 'function_call_output'"


def _text_of(content: object, where: str) -> str:
    """The text of a Responses content: a string or a list of text parts (anything else is refused)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a string or a list of input_text parts, not {type(content).__name__}")
    texts: list[str] = []
    for index, raw in enumerate(cast(list[object], content)):
        part = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
        if part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            kind = part.get("type") if part else type(raw).__name__
            raise ValueError(
                f"{where}[{index}] is {kind!r}; the policy server reads text only: parts of type "
                "'input_text' or 'output_text' with a string 'text'"
            )
        texts.append(part["text"])
    return "".join(texts)


def _string_field(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where} needs a string {key!r}, not {value!r}")
    return value


def _input_messages(items: object) -> list[dict[str, Any]]:
    """Responses ``input`` as chat messages: calls join the assistant turn before them, outputs are tool turns."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ValueError("input must be a string or a non-empty list of items (messages, function calls and outputs)")
    messages: list[dict[str, Any]] = []
    for index, raw in enumerate(cast(list[object], items)):
        where = f"input[{index}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be an object, not {type(raw).__name__}")
        item = cast(dict[str, Any], raw)
        kind = item.get("type", "message")  # an "easy" message has only role and content
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise ValueError(f"{where} has role {role!r}; expected one of {', '.join(_ROLES)}")
            messages.append({"role": role, "content": _text_of(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            function = {
                "name": _string_field(item, "name", where),
                "arguments": _string_field(item, "arguments", where),
            }
            call = {"id": _string_field(item, "call_id", where), "type": "function", "function": function}
            # One model turn is its text then its calls, which the Responses API lists as separate items; rendered
            # as one assistant message the prompt shows what the model wrote (as the Agents SDK's chat converter).
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _text_of(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": _string_field(item, "call_id", where), "content": output})
        else:
            raise ValueError(
                f"{where} is a {kind!r} item; the policy server reads only {_ITEM_TYPES} items (it keeps no "
                "state and runs no built-in tools)"
            )
    return messages


def _function_tools(tools: object) -> list[dict[str, Any]] | None:
    """The request's tools in the chat completions shape; built-in tools (web_search, ...) are refused."""
    if tools is None:
        return None
    if isinstance(tools, list):
        for index, raw in enumerate(cast(list[object], tools)):
            kind = cast(dict[str, Any], raw).get("type", "function") if isinstance(raw, dict) else "function"
            if kind != "function":
                raise ValueError(
                    f"tools[{index}] is the built-in tool {kind!r}; the policy server runs none: define it as a "
                    "'function' tool that your agent executes"
                )
    return validate_tools(tools) or None


def responses_to_chat(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, object]:
    """(chat messages, chat-shaped tools or None, tool_choice) of a Responses API request; ValueError if malformed."""
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise ValueError(
                f"{key} is not supported: the policy server keeps no responses; send the whole transcript in 'input'"
            )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError(f"instructions must be a string, not {type(instructions).__name__}")
    messages = _input_messages(body.get("input"))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    return messages, _function_tools(body.get("tools")), body.get("tool_choice")


def chat_request_of(body: object) -> dict[str, Any]:
    """The chat completions request that a Responses API request asks the policy to generate."""
    if not isinstance(body, dict):
        raise ValueError("a Responses API request must be a JSON object with 'input'")
    request = cast(dict[str, Any], body)
    messages, tools, tool_choice = responses_to_chat(request)
    max_output_tokens = request.get("max_output_tokens")
    if max_output_tokens is not None and (
        not isinstance(max_output_tokens, int) or isinstance(max_output_tokens, bool) or max_output_tokens < 1
    ):
        raise ValueError(f"max_output_tokens must be a positive integer, not {max_output_tokens!r}")
    temperature = request.get("temperature")
    if temperature is not None and (not isinstance(temperature, int | float) or isinstance(temperature, bool)):
        raise ValueError(f"temperature must be a number, not {temperature!r}")
    include = request.get("include")
    if include is not None and not isinstance(include, list):
        raise ValueError(f"include must be a list of strings such as [{LOGPROBS_INCLUDE!r}], not {include!r}")
    chat: dict[str, Any] = {
        "model": request.get("model"),
        "messages": messages,
        "temperature": temperature,
        "max_tokens": max_output_tokens,
        "parallel_tool_calls": request.get("parallel_tool_calls"),
        "return_token_ids": bool(request.get("return_token_ids")),
        # docs/architecture.md promises the chat fields work here too; OpenAI's own way is the include entry.
        "logprobs": bool(request.get("logprobs")) or LOGPROBS_INCLUDE in cast(list[object], include or []),
    }
    if tools is not None:
        chat["tools"] = tools
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    return chat


def _flat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-shaped tool in the Responses API's flat shape (as a response echoes it)."""
    function = cast(Mapping[str, Any], tool["function"])
    return {
        "type": "function",
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
        "strict": function.get("strict"),
    }


def _part_logprobs(choice: Mapping[str, Any]) -> list[dict[str, Any]]:
    entries = cast(list[dict[str, Any]], (choice.get("logprobs") or {}).get("content") or [])
    return [
        {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode()), "top_logprobs": []}
        for e in entries
    ]


def chat_choice_to_response(
    completion: Mapping[str, Any], request: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any]:
    """The Responses API ``response`` object of a chat completion's first choice.

    ``request`` is the Responses request (echoed as OpenAI does), ``tools`` its tools in the chat shape. A reply cut
    by its token budget is ``incomplete`` (reason ``max_output_tokens``); one whose calls parsed is ``completed``,
    as chat calls it ``tool_calls`` whatever stopped it.
    """
    choice = cast(Mapping[str, Any], completion["choices"][0])
    message = cast(Mapping[str, Any], choice["message"])
    calls = cast(list[dict[str, Any]], message.get("tool_calls") or [])
    incomplete = choice["finish_reason"] == "length" and not calls
    status = "incomplete" if incomplete else "completed"
    output: list[dict[str, Any]] = []
    text = message.get("content") or ""
    # A reply without calls is a message even when empty: an output list with nothing in it answers nothing.
    if text or not calls:
        part = {
            "type": "output_text",
            "text": text,
            "annotations": [],
            "logprobs": [] if calls else _part_logprobs(choice),
        }
        output.append(
            {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "status": status,
             "content": [part]}
        )  # fmt: skip
    for call in calls:
        function = cast(Mapping[str, Any], call["function"])
        output.append(
            {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
             "name": function["name"], "arguments": function["arguments"], "status": "completed"}
        )  # fmt: skip
    usage = cast(Mapping[str, int], completion["usage"])
    response: dict[str, Any] = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": completion["created"],
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": completion["model"],
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "temperature": request.get("temperature"),
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": [_flat_tool(t) for t in tools or []],
        "top_p": request.get("top_p"),
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }
    if "prompt_token_ids" in completion:
        response["prompt_token_ids"] = completion["prompt_token_ids"]
        response["token_ids"] = choice["token_ids"]
    return response


def response_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stream events of a finished response, in OpenAI's order, each with its ``type`` and ``sequence_number``.

    ``response.created`` and ``response.in_progress`` carry the response without output; per message item its
    added/part/delta/done events, per function call its added/arguments/done events; then ``response.completed``
    (``response.incomplete`` for an incomplete one, as OpenAI sends it) with the whole response, token ids included.
    """
    pending = {k: v for k, v in response.items() if k not in ("prompt_token_ids", "token_ids")}
    pending |= {"status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for index, item in enumerate(cast(list[dict[str, Any]], response["output"])):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = cast(dict[str, Any], item["content"][0])
            empty = part | {"text": "", "logprobs": []}
            text = {"content_index": 0, "logprobs": part["logprobs"]}
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": item | {"status": "in_progress", "content": []}},
                {"type": "response.content_part.added", **at, "content_index": 0, "part": empty},
                {"type": "response.output_text.delta", **at, **text, "delta": part["text"]},
                {"type": "response.output_text.done", **at, **text, "text": part["text"]},
                {"type": "response.content_part.done", **at, "content_index": 0, "part": part},
            ]  # fmt: skip
        else:
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": item | {"status": "in_progress", "arguments": ""}},
                {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **at, "name": item["name"],
                 "arguments": item["arguments"]},
            ]  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": dict(response)})
    return [{"type": e["type"], "sequence_number": n} | e for n, e in enumerate(events)]


async def response_stream(response: Mapping[str, Any]) -> AsyncIterator[bytes]:
    """:func:`response_events` as server-sent events: ``event: <type>`` and ``data: <json>`` per event."""
    for event in response_events(response):
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
