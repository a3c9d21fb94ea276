"""Tool calls in the Hermes format, as vLLM's ``hermes`` tool parser and the Hermes/Qwen chat templates use it.

The policy server renders a request's tools into the prompt and turns what the model writes back into OpenAI
``tool_calls``. The format (the one Hermes 2 Pro, Qwen 2.5 and Qwen 3 are trained on):

* Tool definitions go into one system block (:func:`tool_system_block`), kept short because every prompt of a
  rollout carries it (a 135 M model on a CPU pays for each token)::

      You can call these tools:
      <tools>
      {"name": "add", "description": "...", "parameters": {...}}
      </tools>
      To call one, reply with:
      <tool_call>
      {"name": <function-name>, "arguments": <args-json-object>}
      </tool_call>

  (one JSON line per function, ``json.dumps`` with default separators, as the templates' ``tojson`` writes it). The
  tags and the call's JSON are those of Hermes 2 Pro and Qwen 2.5/3, whose own chat templates render tools (a
  template that does is used instead of this block).
* The model answers with one block per call: ``<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n</tool_call>``;
  text outside the blocks is the message's content (vLLM keeps only the text before the first block).
  :func:`parse_tool_calls` reads them like vLLM does: a missing closing tag at the very end is accepted, and any
  malformed block makes the whole reply plain content.
* Earlier turns of a transcript, for chat templates that know no tools (:func:`messages_for_plain_template`): an
  assistant's ``tool_calls`` become those blocks in its content, and ``role: "tool"`` results become user messages
  ``<tool_response>\\n{result}\\n</tool_response>`` (consecutive results merged into one message).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from jsonschema import SchemaError, validators

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

_BLOCK_HEAD = "You can call these tools:\n<tools>"
_BLOCK_TAIL = (
    '\n</tools>\nTo call one, reply with:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def validate_tools(tools: object) -> list[dict[str, Any]]:
    """Check an OpenAI tool list (chat or Responses API shape) and return it in the chat completions shape."""
    if not isinstance(tools, list):
        raise ValueError(
            f"tools must be a list of {{'type': 'function', 'function': {{...}}}} objects, not {type(tools).__name__}"
        )
    normalised: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, raw in enumerate(cast(list[object], tools)):
        if not isinstance(raw, dict):
            raise ValueError(f"tools[{index}] must be an object, not {type(raw).__name__}")
        tool = cast(dict[str, Any], raw)
        if tool.get("type", "function") != "function":
            raise ValueError(
                f"tools[{index}] has type {tool.get('type')!r}; the policy server serves only 'function' tools"
            )
        # The Responses API puts the function's fields next to "type"; chat completions nest them under "function".
        function = tool.get("function", tool)
        if not isinstance(function, dict):
            raise ValueError(f"tools[{index}].function must be an object with a 'name', not {function!r}")
        function = cast(dict[str, Any], function)
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"tools[{index}] has no function name; give every tool a non-empty 'name'")
        if name in seen:
            raise ValueError(f"tools[{index}] repeats the name {name!r}; tool names must be unique")
        seen.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ValueError(f"tool {name!r} has a description that is not a string: {description!r}")
        if "parameters" in function:
            _check_schema(name, function["parameters"])
        normalised.append(
            {"type": "function", "function": {k: function[k] for k in _FUNCTION_KEYS if function.get(k) is not None}}
        )
    return normalised


def _check_schema(name: str, schema: object) -> None:
    """Raise a ValueError naming the tool when ``schema`` is not a JSON Schema object."""
    if not isinstance(schema, dict):
        raise ValueError(
            f"tool {name!r} has parameters {schema!r}; parameters must be a JSON Schema object such as "
            '{"type": "object", "properties": {...}}'
        )
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise ValueError(
            f"tool {name!r} has parameters that are not a valid JSON Schema at {where}: {exc.message}"
        ) from exc


def _function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The function object of a tool in either shape (chat completions nests it, the Responses API does not)."""
    function = tool.get("function")
    return cast(Mapping[str, Any], function) if isinstance(function, Mapping) else tool


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The function names of a tool list, in order."""
    return [str(_function_of(tool).get("name")) for tool in tools]


def tool_system_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The Hermes system block for ``tools`` (a :func:`validate_tools` result); the module docstring shows it."""
    lines = [json.dumps(dict(_function_of(t)), ensure_ascii=False) for t in tools]
    return _BLOCK_HEAD + "".join("\n" + line for line in lines) + _BLOCK_TAIL


def content_text(content: object) -> str:
    """The text of a message's content: a string, None, or a list of text parts (other parts are skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in cast(list[object], content) if isinstance(content, list) else []:
        if isinstance(part, dict):
            part = cast(dict[str, Any], part)
            if part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
    return "".join(parts)


def _arguments_value(arguments: object) -> object:
    """A call's arguments as a JSON value: a JSON string is decoded, anything unparsable stays the string it is."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return arguments


def format_tool_call(name: str, arguments: object, *, compact: bool = False) -> str:
    """One call as the model writes it: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

    ``arguments`` is an object or its JSON string; ``compact`` drops the two newlines (the tiny GPT's format, one
    vocabulary word per call).
    """
    payload = json.dumps({"name": name, "arguments": _arguments_value(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_START}{payload}{TOOL_CALL_END}" if compact else f"{TOOL_CALL_START}\n{payload}\n{TOOL_CALL_END}"


def has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a transcript holds assistant tool calls or tool results (templates without tools choke on them)."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def assistant_calls(message: Mapping[str, Any]) -> list[tuple[str, object]]:
    """(name, arguments) of each entry of an assistant message's ``tool_calls``."""
    calls: list[tuple[str, object]] = []
    for call in cast(list[object], message.get("tool_calls") or []):
        function = _function_of(cast(Mapping[str, Any], call)) if isinstance(call, Mapping) else {}
        calls.append((str(function.get("name", "")), function.get("arguments", {})))
    return calls


def messages_for_plain_template(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """Messages a template without tool support renders: tool block in the system message, tool turns as text."""
    out: list[dict[str, Any]] = []
    previous_role: object = None
    for message in messages:
        role = message.get("role")
        if role == "tool":
            response = f"{TOOL_RESPONSE_START}\n{content_text(message.get('content'))}\n{TOOL_RESPONSE_END}"
            if previous_role == "tool":  # the results of one turn's parallel calls share one user message
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
        elif role == "assistant" and message.get("tool_calls"):
            text = content_text(message.get("content"))
            blocks = [format_tool_call(name, args) for name, args in assistant_calls(message)]
            out.append({"role": "assistant", "content": "\n".join([text, *blocks] if text else blocks)})
        else:
            out.append(dict(message))
        previous_role = role
    if tools:
        block = tool_system_block(tools)
        if out and out[0].get("role") in ("system", "developer"):
            system = content_text(out[0].get("content"))
            out[0]["content"] = f"{system}\n\n{block}" if system else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def messages_for_tool_template(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that renders tools: call arguments as objects (templates ``tojson`` them, as vLLM
    passes them), text parts joined into strings."""
    out: list[dict[str, Any]] = []
    for message in messages:
        copy = dict(message)
        if isinstance(copy.get("content"), list):
            copy["content"] = content_text(copy["content"])
        if message.get("tool_calls"):
            calls: list[dict[str, Any]] = []
            for raw in cast(list[object], message["tool_calls"]):
                call = dict(cast(Mapping[str, Any], raw)) if isinstance(raw, Mapping) else {}
                function = dict(cast(Mapping[str, Any], call.get("function") or {}))
                value = _arguments_value(function.get("arguments", {}))
                if isinstance(value, dict):  # a non-object stays the string it was: the template shows it as is
                    function["arguments"] = value
                calls.append(call | {"function": function})
            copy["tool_calls"] = calls
        out.append(copy)
    return out


def _reject_constant(name: str) -> object:
    """JSON's NaN/Infinity extensions are no JSON: arguments holding them would not reach the agent intact."""
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _as_call(value: object, tool_names: Collection[str]) -> dict[str, Any] | None:
    """One block's JSON as an OpenAI tool call, or None when it is not a call of a known tool with object args."""
    if not isinstance(value, dict):
        return None
    call = cast(dict[str, Any], value)
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(name, str) or name not in tool_names:
        return None
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as the OpenAI API does
        try:
            arguments = _DECODER.decode(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    encoded = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return {"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": {"name": name, "arguments": encoded}}


def parse_tool_calls(text: str, tool_names: Collection[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool calls) of a reply; ``(text, [])`` when it holds no call or any block is malformed.

    Each ``<tool_call>`` must hold one JSON object and then ``</tool_call>`` (or the end of the text, as vLLM
    accepts). The JSON is read with a JSON decoder rather than vLLM's non-greedy regex, so a ``</tool_call>`` inside
    an argument string does not cut the call. Content is the text outside the blocks, stripped; None if empty.
    """
    if TOOL_CALL_START not in text:
        return text, []
    calls: list[dict[str, Any]] = []
    outside: list[str] = []
    position = 0
    while (start := text.find(TOOL_CALL_START, position)) != -1:
        outside.append(text[position:start])
        body = _JSON_SPACE.match(text, start + len(TOOL_CALL_START))
        try:
            value, end = _DECODER.raw_decode(text, body.end() if body else start)
        except (ValueError, RecursionError):  # like vLLM: a reply with a broken call is returned whole
            return text, []
        tail = _JSON_SPACE.match(text, end)
        end = tail.end() if tail else end
        if text.startswith(TOOL_CALL_END, end):
            end += len(TOOL_CALL_END)
        elif end != len(text):
            return text, []
        call = _as_call(value, tool_names)
        if call is None:
            return text, []
        calls.append(call)
        position = end
    outside.append(text[position:])
    content = "".join(outside).strip()
    return (content or None), calls


def tool_choice_names(tool_choice: object, tools: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The tool names a reply may call under an OpenAI ``tool_choice``; None when no call is to be parsed.

    ``"none"`` (or no tools) → None; absent, ``"auto"`` or ``"required"`` → every tool; a named function
    (``{"type": "function", "function": {"name": ...}}``, or the Responses API's flat ``{"type": "function",
    "name": ...}``) → that one. Under ``"auto"`` nothing is enforced while sampling: a reply without a call stays
    plain content; ``"required"`` and a named function are enforced (:func:`forces_a_call`, the policy server's
    guided decoding).
    """
    names = tool_names(tools)
    if tool_choice == "none":
        return None
    if tool_choice is None or tool_choice == "auto":
        return names or None
    if tool_choice == "required":
        if not names:
            raise ValueError("tool_choice 'required' needs tools; send the tool definitions in 'tools'")
        return names
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        choice = cast(Mapping[str, Any], tool_choice)
        name = _function_of(choice).get("name")
        if isinstance(name, str) and name in names:
            return [name]
        raise ValueError(
            f"tool_choice names function {name!r}, which is not among the tools ({', '.join(names) or 'none sent'})"
        )
    raise ValueError(
        f"tool_choice {tool_choice!r} is not one of 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}'
    )


GUIDED_CALL_OPEN = TOOL_CALL_START + '\n{"name": "'
"""What a forced call starts with: the policy server appends it to the prompt (a prefill, so it is not sampled)."""
GUIDED_NAME_END = '", "arguments": {'
"""What follows the function name in a forced call; the model then writes the arguments object's members freely,
until the object closes."""
GUIDED_CALL_CLOSE = "}\n" + TOOL_CALL_END
"""What the policy server appends (not sampled) once a forced call's arguments object has closed."""


def forces_a_call(tool_choice: object) -> bool:
    """Whether ``tool_choice`` obliges the reply to be a tool call (``"required"`` or a named function), which the
    policy server enforces as vLLM's guided decoding does: the call's frame is fixed, the model picks the name among
    the allowed ones and writes the arguments."""
    return tool_choice == "required" or (isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function")


def takes_no_arguments(tool: Mapping[str, Any]) -> bool:
    """Whether a tool's parameters schema admits only ``{}`` usefully (no properties): a forced call to it is fixed."""
    parameters = _function_of(tool).get("parameters")
    if not isinstance(parameters, Mapping):
        return True
    schema = cast(Mapping[str, Any], parameters)
    return not schema.get("properties") and not schema.get("required")
