"""The policy server: serves the current weights over the OpenAI chat completions and Responses APIs, in its own
process.

Tools: a request with ``tools`` is rendered through the model's chat template (or one Hermes-style block) and
replies holding ``<tool_call>`` blocks come back as OpenAI tool calls (``tool_calls.py``); ``tool_choice="required"``
or a named function is enforced by guided decoding. Per-agent weights: with ``PolicySpec.adapters`` agent A is served
as model ``<model_name>@A`` and the plain name is the frozen base; the answer's ``model`` says which served it.

It answers like vLLM >= 0.10.2 (see docs/architecture.md, "Token ids on the wire"): with ``return_token_ids`` the
response carries ``prompt_token_ids`` and ``choices[i].token_ids``; with ``logprobs`` OpenAI-shaped logprobs; every
response has the header ``x-agentlightning-policy-version``. Concurrent requests are batched into one generate call.
The trainer publishes new weights with ``POST /admin/weights`` (a state-dict file and its version); the swap happens
between batches, so no response mixes two versions. Bind it to loopback only: the admin endpoint loads files.

With ``--proxy-store`` the same process also serves the LLM proxy (on ``--proxy-port``, forwarding to this server)
and records its spans into that SQLite store: the proxy's per-call work (parsing, span building, store writes) then
runs beside generation instead of in the trainer's process, whose one interpreter also runs the runners and the
learner (bench/learning.py: the HTTP loop is bound by that process's CPU). The proxy calls the generating routes in
process (policy_transport.py; ``--proxy-over-http`` sends them over loopback instead, for comparison).

Run: ``python -m agentlightning_trainer.policy_server --spec spec.json --weights w.pt --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from agentlightning.semconv import HEADER_POLICY_VERSION
from agentlightning_trainer.batches import agent_model_name
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.policy_transport import BodyHandler, PolicyAppTransport
from agentlightning_trainer.responses_api import chat_choice_to_response, chat_request_of, response_stream
from agentlightning_trainer.tool_calls import (
    GUIDED_CALL_CLOSE,
    GUIDED_CALL_OPEN,
    GUIDED_NAME_END,
    TOOL_CALL_END,
    forces_a_call,
    parse_tool_calls,
    takes_no_arguments,
    tool_choice_names,
    validate_tools,
)
from agentlightning_trainer.torch_backend.guided import Guide
from agentlightning_trainer.torch_backend.policy import Policy

logger = logging.getLogger(__name__)


class WeightsUpdate(BaseModel):
    """Body of ``POST /admin/weights``."""

    path: str = Field(description="A torch state-dict file written by the trainer.")
    version: int = Field(ge=0, description="The policy version these weights are.")


@dataclass
class _Pending:
    prompt: list[int]
    temperature: float
    max_tokens: int
    guide: Guide | None
    adapter: str | None
    future: asyncio.Future[Any] = field(repr=False)


class _Batcher:
    """Collects concurrent requests and runs them as one batched generate in a worker thread."""

    def __init__(self, policy: Policy, version: int, *, max_batch: int, wait_s: float, seed: int) -> None:
        """Batch at most ``max_batch`` requests, waiting up to ``wait_s`` for more; sample with ``seed``."""
        self.policy = policy
        self.version = version
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.lock = asyncio.Lock()  # held by a generate or a weight swap, never both
        self.task: asyncio.Task[None] | None = None
        self.batches = 0

    async def submit(
        self,
        prompt: list[int],
        temperature: float,
        max_tokens: int,
        guide: Guide | None = None,
        adapter: str | None = None,
    ) -> tuple[Any, int]:
        """Queue one completion (by agent ``adapter``'s weights, or the base) and wait for it; returns the
        generation and the policy version that made it."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(prompt, temperature, max_tokens, guide, adapter, future))
        return await future

    async def run(self) -> None:
        """Serve batches until cancelled."""
        while True:
            batch = [await self.queue.get()]
            # Let concurrent requests join: keep waiting while more keep arriving (agents of one training step
            # call together), but never longer than 20 waits.
            for _ in range(20):
                seen = self.queue.qsize()
                await asyncio.sleep(self.wait_s)
                if self.queue.qsize() == seen or self.queue.qsize() + 1 >= self.max_batch:
                    break
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            async with self.lock:
                version = self.version
                try:
                    gens = await asyncio.to_thread(
                        self.policy.generate,
                        [p.prompt for p in batch],
                        temperatures=[p.temperature for p in batch],
                        max_new_tokens=[p.max_tokens for p in batch],
                        generator=self.generator,
                        guides=[p.guide for p in batch],
                        adapters=[p.adapter for p in batch] if self.policy.spec.adapters else None,
                    )
                except Exception as exc:  # one bad batch must not kill the server; every caller gets the error
                    for p in batch:
                        if not p.future.done():
                            p.future.set_exception(exc)
                    continue
            self.batches += 1
            for p, gen in zip(batch, gens, strict=True):
                if not p.future.done():
                    p.future.set_result((gen, version))

    async def load_weights(self, path: str, version: int) -> None:
        """Swap in new weights between batches."""
        state = await asyncio.to_thread(torch.load, path, weights_only=True, map_location="cpu")
        async with self.lock:
            # A LoRA policy receives only its adapters (a few MB); the frozen base was loaded once at startup.
            self.policy.load_trainable_state_dict(state)
            self.version = version


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}, status
    )


def create_policy_app(
    policy: Policy, *, version: int = 0, max_batch: int = 512, batch_wait_s: float = 0.005, seed: int = 0
) -> FastAPI:
    """The policy server as an ASGI app (run it with uvicorn; :class:`PolicyServerProcess` does that)."""
    batcher = _Batcher(policy, version, max_batch=max_batch, wait_s=batch_wait_s, seed=seed)
    model_name = policy.spec.model_name

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.task = asyncio.create_task(batcher.run())
        try:
            yield
        finally:
            batcher.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await batcher.task

    app = FastAPI(title="Agent Lightning policy server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher

    def headers() -> dict[str, str]:
        return {HEADER_POLICY_VERSION: str(batcher.version)}

    @app.get("/health")
    async def health() -> JSONResponse:
        body: dict[str, Any] = {
            "status": "ok",
            "model": model_name,
            "policy_version": batcher.version,
            "batches": batcher.batches,
            "device": policy.device.type,
        }
        proxy_server = getattr(app.state, "proxy_server", None)
        if proxy_server is not None:
            body["proxy_ready"] = bool(proxy_server.started)
        return JSONResponse(body, headers=headers())

    # Per-agent weights are served under their own model names; the plain name is the frozen base.
    served_models: dict[str, str | None] = {model_name: None} | {
        agent_model_name(model_name, agent): agent for agent in policy.spec.adapters
    }

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        data = [
            {"id": name, "object": "model", "owned_by": "agentlightning", "policy_version": batcher.version}
            for name in served_models
        ]
        return JSONResponse({"object": "list", "data": data}, headers=headers())

    @app.post("/admin/weights")
    async def weights(update: WeightsUpdate) -> JSONResponse:
        try:
            await batcher.load_weights(update.path, update.version)
        except FileNotFoundError:
            return _error(400, f"weights file {update.path} does not exist on the policy server", "no_weights")
        return JSONResponse({"policy_version": batcher.version}, headers=headers())

    async def complete_chat(body: dict[str, Any]) -> Response | tuple[dict[str, Any], int]:
        """Generate the chat completion a request (with non-empty messages) asks for, and the version that made it;
        an error response for a request it cannot serve. Both the chat and the Responses API routes answer with it."""
        tools: list[dict[str, Any]] | None = None
        if body.get("tools") is not None:
            try:
                tools = validate_tools(body["tools"]) or None
            except ValueError as exc:
                return _error(400, str(exc), "invalid_tools")
        try:
            callable_names = tool_choice_names(body.get("tool_choice"), tools or [])
        except ValueError as exc:
            return _error(400, str(exc), "invalid_tool_choice")
        if callable_names is None:  # tool_choice "none": the model is not shown the tools, its reply is text
            tools = None
        parallel_calls = body.get("parallel_tool_calls")
        if parallel_calls is not None and not isinstance(parallel_calls, bool):
            return _error(400, f"parallel_tool_calls must be true or false, not {parallel_calls!r}", "invalid_tools")
        requested = body.get("model")
        adapter: str | None = None
        if policy.spec.adapters:
            if requested not in served_models:
                return _error(
                    404,
                    f"model {requested!r} is not served here; models: {', '.join(served_models)} (an agent with "
                    f"weights of its own sends LLM.model_for(agent))",
                    "model_not_found",
                )
            adapter = served_models[str(requested)]
        try:
            prompt = policy.tokenizer.encode_chat(body["messages"], tools)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_messages")
        # tool_choice "required" or a named function: guided decoding of the call (the tiny GPT with reply_words
        # is constrained by its own reply set instead).
        guide: Guide | None = None
        reply_prefix = ""
        if callable_names and forces_a_call(body.get("tool_choice")) and policy.spec.reply_words is None:
            reply_prefix = GUIDED_CALL_OPEN
            prompt = prompt + policy.tokenizer.encode(GUIDED_CALL_OPEN)
            by_name = {str(t["function"]["name"]): t for t in tools or []}
            # A tool without parameters gets its whole call fixed ("arguments": {}); others write their arguments.
            fixed = [takes_no_arguments(by_name[name]) for name in callable_names]
            choices_ids = tuple(
                tuple(policy.tokenizer.encode(name + GUIDED_NAME_END + ("}" if whole else "")))
                for name, whole in zip(callable_names, fixed, strict=True)
            )
            complete = frozenset(i for i, whole in enumerate(fixed) if whole)
            guide = Guide(choices_ids, stop_text=TOOL_CALL_END, close_json=True, complete=complete)
        raw_temperature = body.get("temperature")
        temperature = 1.0 if raw_temperature is None else float(raw_temperature)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        n = int(body.get("n") or 1)
        if len(prompt) + 1 > policy.max_seq_len:
            return _error(
                400,
                f"prompt of {len(prompt)} tokens does not fit the model's context of {policy.max_seq_len}",
                "context_length_exceeded",
            )
        results = await asyncio.gather(
            *(batcher.submit(prompt, temperature, max_tokens, guide, adapter) for _ in range(n))
        )
        version = results[0][1]
        want_ids = bool(body.get("return_token_ids"))
        want_logprobs = bool(body.get("logprobs"))
        choices: list[dict[str, Any]] = []
        for index, (gen, _) in enumerate(results):
            text = reply_prefix + policy.tokenizer.decode(gen.token_ids)
            if gen.json_closed:  # a forced call's arguments closed: the frame's end is written, not sampled
                text += GUIDED_CALL_CLOSE
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish_reason = gen.finish_reason
            if callable_names:
                # Parsed like vLLM's hermes parser; token_ids and logprobs below stay those sampled, tags and all.
                content, calls = parse_tool_calls(text, callable_names)
                if calls:
                    # parallel_tool_calls=false: the first call only (nothing stops the model writing more).
                    tool_calls = calls[:1] if parallel_calls is False else calls
                    message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
                    finish_reason = "tool_calls"
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
            if want_logprobs:
                choice["logprobs"] = {
                    "content": [
                        {
                            "token": policy.tokenizer.decode([t], skip_special=False),
                            "logprob": lp,
                            "bytes": None,
                            "top_logprobs": [],
                        }
                        for t, lp in zip(gen.token_ids, gen.logprobs, strict=True)
                    ]
                }
            if want_ids:
                choice["token_ids"] = gen.token_ids
            choices.append(choice)
        completion: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            # The served model's own name: the proxy records it (gen_ai.response.model), so a span says whose
            # weights answered (with the version header, which version).
            "model": model_name if adapter is None else agent_model_name(model_name, adapter),
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": sum(len(g.token_ids) for g, _ in results),
                "total_tokens": len(prompt) + sum(len(g.token_ids) for g, _ in results),
            },
        }
        if want_ids:
            completion["prompt_token_ids"] = prompt
        return completion, version

    async def answer_chat(raw: bytes) -> Response:
        """The answer to a chat completions request body."""
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "request body is not JSON", "invalid_json")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "chat completions need a non-empty 'messages' list", "invalid_messages")
        result = await complete_chat(cast(dict[str, Any], body))
        if isinstance(result, Response):
            return result
        completion, version = result
        out_headers = {HEADER_POLICY_VERSION: str(version)}
        if body.get("stream"):
            return StreamingResponse(_as_stream(completion), media_type="text/event-stream", headers=out_headers)
        return JSONResponse(completion, headers=out_headers)

    async def answer_responses(raw: bytes) -> Response:
        """The answer to a Responses API request body (the OpenAI Agents SDK's default), generated as the chat
        request it amounts to."""
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "request body is not JSON", "invalid_json")
        try:
            chat_request = chat_request_of(body)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request")
        result = await complete_chat(chat_request)
        if isinstance(result, Response):
            return result
        completion, version = result
        answer = chat_choice_to_response(completion, body, chat_request.get("tools"))
        out_headers = {HEADER_POLICY_VERSION: str(version)}
        if body.get("stream"):
            return StreamingResponse(response_stream(answer), media_type="text/event-stream", headers=out_headers)
        return JSONResponse(answer, headers=out_headers)

    # The generating routes by path, for the co-hosted LLM proxy's in-process transport (policy_transport.py).
    answers: dict[str, BodyHandler] = {"/v1/chat/completions": answer_chat, "/v1/responses": answer_responses}
    app.state.answers = answers

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await answer_chat(await request.body())

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        """The Responses API (the OpenAI Agents SDK's default)."""
        return await answer_responses(await request.body())

    return app


async def _as_stream(completion: dict[str, Any]) -> AsyncIterator[bytes]:
    """A finished completion as chat-completion chunks: prompt ids first, then per choice its content (one chunk)
    or its tool calls (OpenAI's shape: a chunk with id and name, then one with the arguments, then the finish),
    then usage and [DONE]. Each choice's token ids and logprobs ride on its finishing chunk."""
    base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    # A tool-call choice without text starts with content None, as OpenAI streams it: a recorder joining the deltas
    # (the LLM proxy) then gets the same message from the stream as from the whole completion.
    first: dict[str, Any] = base | {
        "choices": [
            {
                "index": c["index"],
                "delta": {
                    "role": "assistant",
                    "content": None if c["message"].get("tool_calls") and c["message"]["content"] is None else "",
                },
                "finish_reason": None,
            }
            for c in completion["choices"]
        ]
    }
    if "prompt_token_ids" in completion:
        first["prompt_token_ids"] = completion["prompt_token_ids"]
    yield f"data: {json.dumps(first)}\n\n".encode()
    for c in completion["choices"]:
        message = c["message"]
        calls: list[dict[str, Any]] = message.get("tool_calls") or []
        deltas: list[dict[str, Any]] = []
        if not calls:
            deltas.append({"content": message["content"]})
        else:
            if message["content"] is not None:
                deltas.append({"content": message["content"]})
            for i, call in enumerate(calls):
                head = {"index": i, "id": call["id"], "type": "function"}
                deltas.append(
                    {"tool_calls": [head | {"function": {"name": call["function"]["name"], "arguments": ""}}]}
                )
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
            deltas.append({})
        for delta in deltas[:-1]:
            chunk = {"index": c["index"], "delta": delta, "finish_reason": None, "logprobs": None}
            yield f"data: {json.dumps(base | {'choices': [chunk]})}\n\n".encode()
        choice: dict[str, Any] = {
            "index": c["index"],
            "delta": deltas[-1],
            "finish_reason": c["finish_reason"],
            "logprobs": c["logprobs"],
        }
        if "token_ids" in c:
            choice["token_ids"] = c["token_ids"]
        yield f"data: {json.dumps(base | {'choices': [choice]})}\n\n".encode()
    yield f"data: {json.dumps(base | {'choices': [], 'usage': completion['usage']})}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _uvicorn_server(app: Any, host: str, port: int) -> Any:
    """A uvicorn server that leaves signals to :func:`_serve_all` (two servers share one process and loop)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # _serve_all stops every server of the process on SIGTERM/SIGINT

    return _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))


async def _serve_all(servers: list[Any], parent_pid: int | None = None) -> None:
    """Serve every uvicorn server on this loop until SIGTERM/SIGINT (or, with ``parent_pid``, until that process is
    gone), then shut them all down (lifespans run)."""
    loop = asyncio.get_running_loop()

    def stop_all() -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_all)
    watch = asyncio.create_task(_exit_with_parent(parent_pid, stop_all)) if parent_pid is not None else None
    try:
        await asyncio.gather(*(server.serve() for server in servers))
    finally:
        if watch is not None:
            watch.cancel()


async def _exit_with_parent(parent_pid: int, stop_all: Callable[[], None], poll_s: float = 0.5) -> None:
    """Stop serving once the trainer that started this process is gone: a trainer killed with SIGKILL runs no
    cleanup, and its policy server would otherwise hold its port and the model's memory until someone noticed."""
    # Polled: no event or signal tells a process that its parent died (PR_SET_PDEATHSIG is Linux-only).
    while os.getppid() == parent_pid:  # noqa: ASYNC110
        await asyncio.sleep(poll_s)
    logger.warning("policy server: the trainer process %d is gone; shutting down", parent_pid)
    stop_all()


def _add_proxy(app: FastAPI, store_path: str, upstream: str, *, in_process: bool = True) -> Any:
    """The LLM proxy app in front of ``app`` (served at ``upstream``) recording into the SQLite store at
    ``store_path``, calling ``app``'s generating routes in process unless ``in_process`` is False (then over HTTP);
    ``app`` gets ``POST /admin/proxy/flush`` and reports ``proxy_ready`` on ``/health`` once the proxy serves."""
    from agentlightning.proxy import create_proxy_app, flush_proxy_spans
    from agentlightning.store.sqlite import SqliteLightningStore

    transport = PolicyAppTransport(app.state.answers) if in_process else None
    proxy_app = create_proxy_app(SqliteLightningStore(store_path), upstream, upstream_transport=transport)

    @app.post("/admin/proxy/flush")
    async def flush_proxy() -> JSONResponse:
        await flush_proxy_spans(proxy_app)
        return JSONResponse({"flushed": True})

    return proxy_app


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point of the policy server process."""
    parser = argparse.ArgumentParser(description="Serve a policy over the OpenAI chat completions API.")
    parser.add_argument("--spec", required=True, help="PolicySpec JSON file")
    parser.add_argument("--weights", help="state-dict file to load at startup")
    parser.add_argument("--version", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--proxy-store", help="also serve the LLM proxy, recording into this SQLite store file")
    parser.add_argument("--proxy-port", type=int, default=4748, help="port of the LLM proxy (with --proxy-store)")
    parser.add_argument(
        "--proxy-over-http",
        action="store_true",
        help="the proxy calls the policy over loopback HTTP, not in process (to compare: bench.cohosted_proxy)",
    )
    parser.add_argument("--parent-pid", type=int, help="exit when this process (the trainer) is gone")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = PolicySpec.model_validate_json(Path(args.spec).read_text())
    policy = Policy.build(spec, seed=args.seed)
    if args.weights:
        policy.load_trainable_state_dict(torch.load(args.weights, weights_only=True, map_location="cpu"))
    policy.module.eval()
    # One line the trainer's run directory keeps (policy_server.log): where the served weights live.
    print(f"policy server device: {policy.device.type}", flush=True)
    app = create_policy_app(policy, version=args.version, seed=args.seed)
    servers = [_uvicorn_server(app, args.host, args.port)]
    if args.proxy_store:
        upstream = f"http://127.0.0.1:{args.port}/v1"
        proxy_app = _add_proxy(app, args.proxy_store, upstream, in_process=not args.proxy_over_http)
        servers.append(_uvicorn_server(proxy_app, "127.0.0.1", args.proxy_port))
        app.state.proxy_server = servers[1]
    asyncio.run(_serve_all(servers, args.parent_pid))


if __name__ == "__main__":
    main()
