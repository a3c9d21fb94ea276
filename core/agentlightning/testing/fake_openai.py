"""A deterministic fake OpenAI-compatible server with engine token ids, for offline tests of anything that calls an LLM.

It speaks ``POST /v1/chat/completions`` and ``POST /v1/responses`` (streaming SSE and not) and ``GET /v1/models``,
in the shapes the official ``openai`` client, LangChain and the OpenAI Agents SDK parse. Like vLLM >= 0.10.2 it returns
token ids when asked (``return_token_ids: true``): top-level ``prompt_token_ids`` and ``choices[i].token_ids`` on chat
completions (on streams: prompt ids on the first chunk, per-chunk deltas), top-level ``prompt_token_ids`` and
``token_ids`` on Responses API objects (on streams: in the final ``response.completed`` event). Every response carries
the header ``x-agentlightning-policy-version``.

Tokenisation is a character vocabulary: one token per Unicode character, id = code point. The prompt is rendered as
``<|role|>content`` per message followed by ``<|assistant|>``. The logprob of token id ``t`` is
``-((t % 10) + 1) / 20``; chat logprobs cover every generated token, tool-call tokens included (as vLLM's do);
Responses API logprobs sit on ``output_text`` parts and so cover text tokens only. Ids and timestamps are derived
from the request content, so the same request always gets a byte-identical response.

``latency_s`` delays every answer, ``chunk_delay_s`` spaces stream events, ``supports_token_ids=False`` rejects
``return_token_ids`` with a 400 as api.openai.com does, and ``FakeError`` answers with any status and body.
``requests`` holds every request body received; ``reply`` and ``policy_version`` may be changed between calls.

Behaviour is scripted by ``reply``: a callable ``FakeRequest -> FakeReply | FakeError``, a list of them served in call
order (then the default), or a fixed string. The default answers ``"echo: <last user text>"``::

    fake = FakeOpenAI(reply=lambda req: FakeReply(tool_calls=[FakeToolCall("add", '{"a": 1}')])
                      if not req.has_tool_results else FakeReply(text="done"))
    with fake.serve() as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agentlightning.semconv import HEADER_POLICY_VERSION

__all__ = [
    "FakeError",
    "FakeOpenAI",
    "FakeOpenAIServer",
    "FakeReply",
    "FakeRequest",
    "FakeToolCall",
    "ReplyRule",
    "call_offered_tools",
    "logprob_of",
    "tokenize",
]

Endpoint: TypeAlias = Literal["chat.completions", "responses"]


@dataclass(frozen=True)
class FakeToolCall:
    """A function call the fake model makes; ``arguments`` is a JSON string."""

    name: str
    arguments: str = "{}"
    id: str | None = None


@dataclass(frozen=True)
class FakeReply:
    """What the fake model answers: text and/or tool calls; finish reason defaults to stop / tool_calls / length."""

    text: str = ""
    tool_calls: Sequence[FakeToolCall] = ()
    finish_reason: str | None = None


@dataclass(frozen=True)
class FakeError:
    """An upstream error: the HTTP status and JSON body (a str becomes an OpenAI-shaped error message)."""

    status: int
    body: dict[str, Any] | str = "fake upstream error"

    def content(self) -> bytes:
        """The response body as bytes."""
        if isinstance(self.body, str):
            return orjson.dumps({"error": {"message": self.body, "type": "fake_error", "param": None, "code": None}})
        return orjson.dumps(self.body)


@dataclass(frozen=True)
class FakeRequest:
    """A request as the reply rule sees it: endpoint, raw JSON body, and messages normalised to the chat shape."""

    endpoint: Endpoint
    body: dict[str, Any]
    messages: list[dict[str, Any]]

    @property
    def last_user_text(self) -> str:
        """Text of the last user message ('' if none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""

    @property
    def has_tool_results(self) -> bool:
        """True when the conversation already holds a tool result (useful to end a tool loop)."""
        return any(m.get("role") == "tool" for m in self.messages)


ReplyRule: TypeAlias = Callable[[FakeRequest], "FakeReply | FakeError"]


def _placeholder(schema: object) -> object:
    """A value of the JSON-schema type ``schema`` names: its first enum member, else a fixed one per type."""
    spec = _as_dict(schema)
    enum = _as_list(spec.get("enum"))
    if enum:
        return enum[0]
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = next((k for k in cast("list[object]", kind) if k != "null"), "string")
    defaults: dict[object, object] = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}
    return defaults.get(kind, "test")


def _offered_tools(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters schema) of each function tool of a chat or Responses request, in order."""
    offered: list[tuple[str, dict[str, Any]]] = []
    for tool in _as_list(body.get("tools")):
        spec = _as_dict(tool)
        function = _as_dict(spec.get("function")) or spec  # chat nests the function; Responses does not
        name = function.get("name")
        if isinstance(name, str):
            offered.append((name, _as_dict(function.get("parameters"))))
    return offered


def call_offered_tools(request: FakeRequest) -> FakeReply:
    """A reply rule for tool-calling agents: call the first offered tool until a tool result is in the conversation.

    The call's arguments hold every required parameter of the tool's JSON schema, each set to a placeholder of its
    type (the first enum member, else ``"test"``, ``1`` or ``true``). Without tools, or once a tool has answered,
    it echoes the last user message as the default reply does.
    """
    tools = _offered_tools(request.body)
    if tools and not request.has_tool_results:
        name, parameters = tools[0]
        properties = _as_dict(parameters.get("properties"))
        arguments = {key: _placeholder(properties.get(key)) for key in _as_list(parameters.get("required"))}
        return FakeReply(tool_calls=[FakeToolCall(name, orjson.dumps(arguments).decode())])
    return FakeReply(text=f"echo: {request.last_user_text}")


def tokenize(text: str) -> list[int]:
    """The fake vocabulary: one token per character, id = code point."""
    return [ord(ch) for ch in text]


def logprob_of(token_id: int) -> float:
    """The deterministic logprob the fake model reports for a token id."""
    return -((token_id % 10) + 1) / 20


def _as_dict(value: object) -> dict[str, Any]:
    return cast(dict[str, Any], value) if isinstance(value, dict) else {}


def _as_list(value: object) -> list[Any]:
    return cast(list[Any], value) if isinstance(value, list) else []


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    texts = (_as_dict(part).get("text") for part in _as_list(content))
    return "".join(text for text in texts if isinstance(text, str))


def _responses_input_to_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses API ``instructions`` + ``input`` items, in the chat shape."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in map(_as_dict, _as_list(items)):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role", "user"), "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            call = {"id": item.get("call_id"), "type": "function", "function": function}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _text_of(item.get("output"))
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
    return messages


def _render_prompt(messages: list[dict[str, Any]]) -> str:
    parts = [f"<|{m.get('role')}|>{_text_of(m.get('content'))}" for m in messages]
    for m in messages:
        for call in map(_as_dict, _as_list(m.get("tool_calls"))):
            function = _as_dict(call.get("function"))
            parts.append(f"{function.get('name')}({function.get('arguments')})")
    return "".join(parts) + "<|assistant|>"


def _digest(*values: Any) -> str:
    return hashlib.sha1(orjson.dumps(values, option=orjson.OPT_SORT_KEYS)).hexdigest()[:24]


@dataclass
class _Generation:
    """One fully decided answer, shared by every output shape."""

    response_id: str
    model: str
    text: str
    tool_calls: list[tuple[str, FakeToolCall]]  # (call id, call)
    finish_reason: str
    prompt_ids: list[int]
    text_ids: list[int]
    tool_ids: list[list[int]]
    want_ids: bool
    want_logprobs: bool
    include_usage: bool

    @property
    def output_ids(self) -> list[int]:
        return self.text_ids + [i for ids in self.tool_ids for i in ids]


def _logprob_content(ids: list[int]) -> list[dict[str, Any]]:
    """Chat logprob entries for generated token ids (tool-call tokens included, as vLLM reports them)."""
    return [
        {"token": chr(t), "logprob": logprob_of(t), "bytes": list(chr(t).encode()), "top_logprobs": []} for t in ids
    ]


@dataclass
class FakeOpenAI:
    """A deterministic fake OpenAI-compatible upstream; ``.app`` is the ASGI app, ``.serve()`` runs it on loopback."""

    reply: ReplyRule | Sequence[FakeReply | FakeError] | str | None = None
    model: str = "fake-model"
    policy_version: int | None = 1
    latency_s: float = 0.0
    chunk_delay_s: float = 0.0
    supports_token_ids: bool = True
    stream_chunk_chars: int = 4
    created: int = 1_700_000_000
    requests: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    """Bodies of all chat/responses requests received, in arrival order (tests check what a proxy sent)."""

    def __post_init__(self) -> None:
        self._script_index = 0
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    @contextmanager
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> Generator[FakeOpenAIServer]:
        """Run the app with uvicorn in a background thread; port 0 picks a free port."""
        with _serve_in_thread(self.app, host, port) as url:
            yield FakeOpenAIServer(url=url, fake=self)

    # --- behaviour -------------------------------------------------------------------------------------------------
    def _decide(self, request: FakeRequest) -> FakeReply | FakeError:
        rule = self.reply
        if callable(rule):
            return rule(request)
        if isinstance(rule, str):
            return FakeReply(text=rule)
        if rule is not None:
            with self._lock:
                index = self._script_index
                self._script_index += 1
            if index < len(rule):
                return rule[index]
        return FakeReply(text=f"echo: {request.last_user_text}")

    def _generate(self, request: FakeRequest, reply: FakeReply, max_tokens: Any) -> _Generation:
        body = request.body
        response_id = _digest(request.endpoint, body.get("model"), request.messages, body.get("tools"))
        text, finish = reply.text, reply.finish_reason
        calls = [(call.id or f"call_{_digest(response_id, i)}", call) for i, call in enumerate(reply.tool_calls)]
        if isinstance(max_tokens, int) and max_tokens < len(text):
            text, calls, finish = text[:max_tokens], [], finish or "length"
        finish = finish or ("tool_calls" if calls else "stop")
        want_logprobs = bool(body.get("logprobs")) or "message.output_text.logprobs" in _as_list(body.get("include"))
        return _Generation(
            response_id=response_id,
            model=str(body.get("model") or self.model),
            text=text,
            tool_calls=calls,
            finish_reason=finish,
            prompt_ids=tokenize(_render_prompt(request.messages)),
            text_ids=tokenize(text),
            tool_ids=[tokenize(f"{c.name}({c.arguments})") for _, c in calls],
            want_ids=bool(body.get("return_token_ids")),
            want_logprobs=want_logprobs,
            include_usage=bool(_as_dict(body.get("stream_options")).get("include_usage")),
        )

    async def _prepare(self, http: Request, endpoint: Endpoint) -> Response | tuple[_Generation, bool]:
        try:
            parsed: object = orjson.loads(await http.body())
        except orjson.JSONDecodeError as exc:
            return self._error(FakeError(400, f"body is not JSON: {exc}"))
        if not isinstance(parsed, dict):
            return self._error(FakeError(400, "body must be a JSON object"))
        body = cast(dict[str, Any], parsed)
        self.requests.append(body)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if body.get("return_token_ids") and not self.supports_token_ids:
            error = {
                "message": "Unrecognized request argument supplied: return_token_ids",
                "type": "invalid_request_error",
                "param": "return_token_ids",
                "code": None,
            }
            return self._error(FakeError(400, {"error": error}))
        if endpoint == "chat.completions":
            messages = [_as_dict(m) for m in _as_list(body.get("messages"))]
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            messages = _responses_input_to_messages(body)
            max_tokens = body.get("max_output_tokens")
        request = FakeRequest(endpoint=endpoint, body=body, messages=messages)
        decided = self._decide(request)
        if isinstance(decided, FakeError):
            return self._error(decided)
        return self._generate(request, decided, max_tokens), bool(body.get("stream"))

    def _headers(self) -> dict[str, str]:
        return {} if self.policy_version is None else {HEADER_POLICY_VERSION: str(self.policy_version)}

    def _error(self, error: FakeError) -> Response:
        return Response(error.content(), error.status, headers=self._headers(), media_type="application/json")

    def _json(self, payload: dict[str, Any]) -> Response:
        return Response(orjson.dumps(payload), headers=self._headers(), media_type="application/json")

    def _sse(self, events: Iterator[bytes]) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for index, event in enumerate(events):
                if index and self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                yield event

        return StreamingResponse(body(), headers=self._headers(), media_type="text/event-stream")

    async def _models(self, http: Request) -> Response:
        model = {"id": self.model, "object": "model", "created": self.created, "owned_by": "agentlightning"}
        return self._json({"object": "list", "data": [model]})

    # --- chat completions ------------------------------------------------------------------------------------------
    async def _chat(self, http: Request) -> Response:
        prepared = await self._prepare(http, "chat.completions")
        if isinstance(prepared, Response):
            return prepared
        gen, stream = prepared
        if stream:
            return self._sse(self._chat_chunks(gen))
        message: dict[str, Any] = {"role": "assistant", "content": gen.text or None, "refusal": None}
        if gen.tool_calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for cid, c in gen.tool_calls
            ]
        logprobs = {"content": _logprob_content(gen.output_ids), "refusal": None} if gen.want_logprobs else None
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": gen.finish_reason,
        }
        if gen.want_ids:
            choice["token_ids"] = gen.output_ids
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{gen.response_id}",
            "object": "chat.completion",
            "created": self.created,
            "model": gen.model,
            "choices": [choice],
            "usage": _chat_usage(gen),
        }
        if gen.want_ids:
            payload["prompt_token_ids"] = gen.prompt_ids
        return self._json(payload)

    def _chat_chunks(self, gen: _Generation) -> Iterator[bytes]:
        head = {"id": f"chatcmpl-{gen.response_id}", "object": "chat.completion.chunk", "created": self.created}
        head["model"] = gen.model

        def chunk(delta: dict[str, Any], ids: list[int] | None = None, finish: str | None = None,
                  first: bool = False) -> bytes:  # fmt: skip
            logprobs = {"content": _logprob_content(ids), "refusal": None} if gen.want_logprobs and ids else None
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            if gen.want_ids:
                choice["token_ids"] = ids or []
            payload: dict[str, Any] = {**head, "choices": [choice]}
            if gen.want_ids and first:
                payload["prompt_token_ids"] = gen.prompt_ids
            return b"data: " + orjson.dumps(payload) + b"\n\n"

        yield chunk({"role": "assistant", "content": ""}, first=True)
        size = max(1, self.stream_chunk_chars)
        for start in range(0, len(gen.text), size):
            piece = gen.text[start : start + size]
            yield chunk({"content": piece}, gen.text_ids[start : start + size])
        for index, ((cid, call), ids) in enumerate(zip(gen.tool_calls, gen.tool_ids, strict=True)):
            head_call = {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            yield chunk({"tool_calls": [head_call]})
            args = {"index": index, "function": {"arguments": call.arguments}}
            yield chunk({"tool_calls": [args]}, ids=ids)
        yield chunk({}, finish=gen.finish_reason)
        if gen.include_usage:
            yield b"data: " + orjson.dumps({**head, "choices": [], "usage": _chat_usage(gen)}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    # --- responses API ---------------------------------------------------------------------------------------------
    async def _responses(self, http: Request) -> Response:
        prepared = await self._prepare(http, "responses")
        if isinstance(prepared, Response):
            return prepared
        gen, stream = prepared
        if stream:
            return self._sse(self._response_events(gen))
        return self._json(self._response_object(gen, "completed"))

    def _response_object(self, gen: _Generation, status: str, *, done: bool = True) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if done and gen.text:
            output.append(self._message_item(gen, "completed"))
        if done:
            output.extend(self._call_item(gen, i, "completed") for i in range(len(gen.tool_calls)))
        payload: dict[str, Any] = {
            "id": f"resp_{gen.response_id}",
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": gen.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": _responses_usage(gen) if done else None,
        }
        if gen.want_ids and done:
            payload["prompt_token_ids"] = gen.prompt_ids
            payload["token_ids"] = gen.output_ids
        return payload

    def _message_item(self, gen: _Generation, status: str, text: str | None = None) -> dict[str, Any]:
        shown = gen.text if text is None else text
        part = {"type": "output_text", "text": shown, "annotations": [], "logprobs": self._rlogprobs(gen, shown)}
        return {"type": "message", "id": f"msg_{gen.response_id}", "status": status, "role": "assistant",
                "content": [part] if text is None else []}  # fmt: skip

    def _call_item(self, gen: _Generation, index: int, status: str, arguments: str | None = None) -> dict[str, Any]:
        cid, call = gen.tool_calls[index]
        return {"type": "function_call", "id": f"fc_{gen.response_id}_{index}", "call_id": cid, "name": call.name,
                "arguments": call.arguments if arguments is None else arguments, "status": status}  # fmt: skip

    @staticmethod
    def _rlogprobs(gen: _Generation, text: str) -> list[dict[str, Any]]:
        if not gen.want_logprobs:
            return []
        return [{"token": ch, "logprob": logprob_of(ord(ch)), "bytes": list(ch.encode()), "top_logprobs": []}
                for ch in text]  # fmt: skip

    def _response_events(self, gen: _Generation) -> Iterator[bytes]:
        sequence = 0

        def event(kind: str, **data: Any) -> bytes:
            nonlocal sequence
            payload = {"type": kind, "sequence_number": sequence, **data}
            sequence += 1
            return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

        yield event("response.created", response=self._response_object(gen, "in_progress", done=False))
        yield event("response.in_progress", response=self._response_object(gen, "in_progress", done=False))
        index = 0
        if gen.text:
            item_id = f"msg_{gen.response_id}"
            yield event("response.output_item.added", output_index=0, item=self._message_item(gen, "in_progress", ""))
            empty: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield event("response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=empty)
            size = max(1, self.stream_chunk_chars)
            for start in range(0, len(gen.text), size):
                piece = gen.text[start : start + size]
                yield event("response.output_text.delta", item_id=item_id, output_index=0, content_index=0,
                            delta=piece, logprobs=self._rlogprobs(gen, piece))  # fmt: skip
            yield event("response.output_text.done", item_id=item_id, output_index=0, content_index=0,
                        text=gen.text, logprobs=self._rlogprobs(gen, gen.text))  # fmt: skip
            part = self._message_item(gen, "completed")["content"][0]
            yield event("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=part)
            yield event("response.output_item.done", output_index=0, item=self._message_item(gen, "completed"))
            index = 1
        for i in range(len(gen.tool_calls)):
            item = self._call_item(gen, i, "in_progress", "")
            yield event("response.output_item.added", output_index=index + i, item=item)
            arguments = gen.tool_calls[i][1].arguments
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index + i,
                        delta=arguments)  # fmt: skip
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index + i,
                        arguments=arguments, name=gen.tool_calls[i][1].name)  # fmt: skip
            yield event("response.output_item.done", output_index=index + i, item=self._call_item(gen, i, "completed"))
        yield event("response.completed", response=self._response_object(gen, "completed"))


def _chat_usage(gen: _Generation) -> dict[str, int]:
    prompt, completion = len(gen.prompt_ids), len(gen.output_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _responses_usage(gen: _Generation) -> dict[str, Any]:
    prompt, completion = len(gen.prompt_ids), len(gen.output_ids)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


@dataclass(frozen=True)
class FakeOpenAIServer:
    """A running fake upstream: ``base_url`` (ends in ``/v1``) is what an OpenAI client takes."""

    url: str
    fake: FakeOpenAI

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of the server."""
        return f"{self.url}/v1"


@contextmanager
def _serve_in_thread(app: Any, host: str, port: int) -> Generator[str]:
    """Run an ASGI app with uvicorn on a background thread; yields its ``http://host:port`` root."""
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only then; without it Nagle +
    # delayed ACK add ~40 ms to every response uvicorn writes in two sends.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="fake-openai")
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"fake OpenAI server failed to start on {host}:{bound_port}; see the log above")
            threading.Event().wait(0.005)
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
