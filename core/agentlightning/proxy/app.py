"""The LLM proxy ASGI app: forwards OpenAI-compatible calls upstream and records one LLM span per attributed call."""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import httpx
import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from agentlightning import semconv as sc
from agentlightning.proxy._edge import ProxyTokenMiddleware, health, metrics_endpoint
from agentlightning.proxy._record import (
    Additions,
    CallRecord,
    Endpoint,
    Json,
    as_dict,
    as_list,
    parse_traceparent,
    strip_chat,
    strip_responses,
)
from agentlightning.proxy._sse import split_events
from agentlightning.proxy._transport import REPLAYABLE_EXTENSION, LeanHTTPTransport
from agentlightning.proxy._writer import SpanWriter
from agentlightning.store.base import LightningStore, NotFoundError

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_UPSTREAM_TIMEOUT_S = 600.0

_LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ROLLOUT_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"
# Hop-by-hop headers and ours never travel upstream; httpx negotiates its own encoding.
_DROP_REQUEST_HEADERS = frozenset(
    {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade"}
    | {b"proxy-connection", b"accept-encoding", sc.HEADER_ROLLOUT_ID.encode(), sc.HEADER_ATTEMPT_ID.encode()}
)
# httpx has already decoded the body; uvicorn sets its own date/server; lengths change when fields are stripped.
_DROP_RESPONSE_HEADERS = frozenset(
    {b"content-length", b"content-encoding", b"transfer-encoding", b"connection", b"keep-alive", b"date", b"server"}
)


def _error(status: int, message: str, code: str) -> Response:
    body = {"error": {"message": message, "type": "agentlightning_proxy_error", "param": None, "code": code}}
    return Response(orjson.dumps(body), status, media_type="application/json")


class _Cut(enum.Enum):
    """Why an upstream exchange was cancelled before it finished."""

    HUNG_UP = "the agent disconnected"
    TIMED_OUT = "the upstream timeout passed"


# The upstream took too long (per read, or to take the request): answered like the proxy's own deadline, 504. A
# connect timeout is not among them: an upstream that cannot be reached is a 502, whatever the reason.
_READ_TIMEOUTS = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)
# (upstream response, its body (None: a stream still to relay), the fields the proxy added to the request)
_Exchanged = tuple[httpx.Response, bytes | None, Additions]


async def _guarded(receive: Receive, timeout_s: float, work: Awaitable[T]) -> T | _Cut:
    """Await ``work``, cancelling it when the agent disconnects or ``timeout_s`` passes (then say which).

    Neither uvicorn nor Starlette cancels a handler whose client went away (only a streaming body notices), so
    without this a hung upstream keeps the proxy's socket and task for the whole timeout after the agent gave up.
    The request body must have been read already: from then on the only ASGI message is ``http.disconnect``, sent
    when the client hangs up or once our response is complete (which cannot happen while ``work`` runs).

    Plain asyncio, not an anyio task group: measured ~20 us against ~190 us per call, and this is on every call.
    """
    host = asyncio.current_task()
    assert host is not None, "the proxy runs in an asyncio task"
    hung_up = False

    async def cancel_on_disconnect() -> None:
        nonlocal hung_up
        while (await receive())["type"] != "http.disconnect":
            pass
        hung_up = True
        # The host is suspended in ``work`` (nothing else of ours awaits): the CancelledError lands there, and the
        # transport closes the connection instead of pooling it.
        host.cancel()

    watcher = asyncio.get_running_loop().create_task(cancel_on_disconnect())
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except (TimeoutError, *_READ_TIMEOUTS):
        if hung_up:
            host.uncancel()  # the deadline won the race against the disconnect: take our cancel back
        return _Cut.TIMED_OUT
    except asyncio.CancelledError:
        # Our own cancel is taken back and the call answered (to nobody) and recorded; any other (server shutdown)
        # goes on.
        if not hung_up or host.uncancel() > 0:
            raise
        return _Cut.HUNG_UP
    finally:
        watcher.cancel()


def _error_message(content: bytes) -> str:
    """The upstream's error message (OpenAI shape ``{"error": {"message": ...}}``), else the raw body."""
    try:
        payload: Any = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode(errors="replace")[:2000]
    message = as_dict(as_dict(payload).get("error")).get("message")
    if isinstance(message, str):
        return message
    return content.decode(errors="replace")[:2000]


def _policy_version(response: httpx.Response) -> int | None:
    value = response.headers.get(sc.HEADER_POLICY_VERSION)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        logger.warning("upstream sent %s=%r, which is not an integer; ignored", sc.HEADER_POLICY_VERSION, value)
        return None


def _fold_payload(record: CallRecord, payload: Json, added: Additions, *, chunk: bool) -> bool:
    """Fold an answer (or stream event) into the record and strip what we added; False if that failed.

    On failure the agent gets the upstream's bytes unchanged and the span says why it is incomplete: a surprise in
    the upstream's JSON must never cost the agent its answer.
    """
    try:
        if record.endpoint == "chat":
            record.add_chat(payload, chunk=chunk)
            if added:
                strip_chat(payload, added)
        else:
            if chunk:
                record.add_response_event(payload)
            else:
                record.add_response(payload)
            if added:
                strip_responses(payload, added)
        return True
    except Exception as exc:
        logger.exception("the LLM proxy could not read an upstream answer; passing it through unchanged")
        record.error, record.error_type = f"the proxy could not read the upstream answer: {exc!r}", "proxy_error"
        return False


class _RelayResponse(StreamingResponse):
    """A streaming response that always runs ``on_close``, even when the client disconnects mid-stream."""

    def __init__(self, relay: _StreamRelay, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__(relay.events(), status)
        self.raw_headers = headers
        self._relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._relay.finish("the client disconnected before the stream ended")


class _StreamRelay:
    """Relays one upstream SSE stream to the agent, folding every event into the call's record on the way."""

    def __init__(self, proxy: LLMProxy, upstream: httpx.Response, record: CallRecord | None, added: Additions) -> None:
        self._proxy = proxy
        self._upstream = upstream
        self._record = record
        self._added = added
        self._finished = False

    async def events(self) -> AsyncIterator[bytes]:
        """The bytes the agent receives: verbatim, or event by event with added fields stripped."""
        record, added = self._record, self._added
        pending = b""
        # The latest piece is held back until the next arrives, and the last one until the span is stored: when the
        # agent sees its stream end, the call's span is already in the store (a runner may close the attempt then).
        held: bytes | None = None
        try:
            async for data in self._upstream.aiter_bytes():
                if record is None:
                    yield data
                    continue
                events, pending = split_events(pending + data)
                out = [self._fold(event) + b"\n\n" for event in events]
                # unchanged bytes, as they came, when nothing was added: the agent sees exactly what the upstream sent
                piece = (b"".join(out) if out else None) if added else data
                if piece is not None:
                    if held is not None:
                        yield held
                    held = piece
            if record is not None and pending.strip():
                out_tail = self._fold(pending)
                if added:
                    if held is not None:
                        yield held
                    held = out_tail
        except httpx.ReadTimeout:
            # Headers are sent, so no 504 can reach the agent: its stream is cut, and the span says why.
            silent = self._proxy.upstream_timeout_s
            message = f"the upstream stream sent nothing for {silent:g} s, the LLM proxy's upstream timeout"
            await self.finish(f"{message} (`agl proxy --upstream-timeout SECONDS`)", "upstream_timeout")
            raise
        except httpx.HTTPError as exc:
            await self.finish(f"the upstream stream broke: {exc!r}", type(exc).__name__)
            raise
        await self.finish(None)
        if held is not None:
            yield held

    def _fold(self, event: bytes) -> bytes:
        """Record one SSE event; return it as the agent should see it."""
        assert self._record is not None
        lines = event.split(b"\n")
        data_at = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
        if not data_at:
            return event
        data = b"\n".join(lines[i][6:] if lines[i][5:6] == b" " else lines[i][5:] for i in data_at).rstrip(b"\r")
        if data == b"[DONE]":
            return event
        try:
            payload: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(payload, dict):
            return event
        json_payload: Json = payload  # pyright: ignore[reportUnknownVariableType]  # a JSON object
        if not _fold_payload(self._record, json_payload, self._added, chunk=True) or not self._added:
            return event
        kept = [line for i, line in enumerate(lines) if i not in data_at]
        return b"\n".join([*kept, b"data: " + orjson.dumps(json_payload)])

    async def finish(self, error: str | None, error_type: str | None = None) -> None:
        """Close the upstream stream and record the span once (cut streams get status ERROR with the reason)."""
        if self._finished:
            return
        self._finished = True
        if self._record is not None:
            if error is not None and self._record.error is None:
                self._record.error = error
                self._record.error_type = error_type or "stream_cut"
            await self._proxy.store_span(self._record)
        try:
            await self._upstream.aclose()
        except Exception as exc:  # closing a broken connection is best effort
            logger.debug("closing the upstream stream failed: %r", exc)


class LLMProxy:
    """State of one proxy app: upstream client (pooled), span writer, known-attempt cache, upstream capabilities."""

    def __init__(
        self,
        store: LightningStore,
        upstream_url: str,
        *,
        provider: str,
        request_token_ids: bool,
        request_logprobs: bool,
        upstream_api_key: str | None,
        upstream_timeout_s: float,
        id_cache_ttl_s: float,
        span_batch_size: int,
        forward_agent_auth: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not (math.isfinite(upstream_timeout_s) and upstream_timeout_s > 0):
            raise ValueError(
                f"upstream_timeout_s must be a positive number of seconds, got {upstream_timeout_s!r}; it bounds how "
                f"long the proxy waits for the upstream's answer (default {DEFAULT_UPSTREAM_TIMEOUT_S:g})"
            )
        root = upstream_url.rstrip("/")
        if not root.startswith(("http://", "https://")):
            raise ValueError(f"upstream URL must start with http:// or https://, got {upstream_url!r}")
        self.upstream = root if httpx.URL(root).path not in ("", "/") else root + "/v1"
        self.store = store
        self.provider = provider
        self.writer = SpanWriter(store, batch_size=span_batch_size)
        self._api_key = upstream_api_key
        # False when the agent's Authorization header holds the proxy's own token: it must not reach the upstream.
        self._forward_agent_auth = forward_agent_auth
        self.upstream_timeout_s = upstream_timeout_s
        # Per read: bounds each gap between the chunks of a stream, whose whole length has no limit.
        self._timeout = httpx.Timeout(upstream_timeout_s, connect=min(upstream_timeout_s, 10.0))
        self._extensions: dict[str, Any] = {"timeout": self._timeout.as_dict()}
        # A chat completion, or a Responses call the upstream does not store, changes nothing upstream: the lean
        # transport may re-send it when a pooled connection closes under it (see REPLAYABLE_EXTENSION).
        self._replayable_extensions: dict[str, Any] = {**self._extensions, REPLAYABLE_EXTENSION: True}
        self._urls: dict[str, httpx.URL] = {}
        self._client: httpx.AsyncClient | None = None
        self._transport: httpx.AsyncBaseTransport | None = transport
        self._known: dict[tuple[str, str], float] = {}
        self._ttl = id_cache_ttl_s
        # What to add per endpoint; turned off for good when the upstream rejects a field by name.
        self._wanted: dict[Endpoint, Additions] = {
            "chat": Additions(request_token_ids, request_logprobs),
            "responses": Additions(request_token_ids, request_logprobs),
        }

    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled upstream client, created in the serving loop on first use."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, transport=self.transport)
        return self._client

    @property
    def transport(self) -> httpx.AsyncBaseTransport:
        """The transport given, else a connection pool: lean HTTP/1.1 for ``http://`` upstreams, httpx's own for
        ``https://``."""
        if self._transport is None:
            if self.upstream.startswith("http://"):
                self._transport = LeanHTTPTransport()
            else:
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
                nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
                self._transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=nodelay)
        return self._transport

    def submit(self, record: CallRecord) -> None:
        """Queue the span of a finished call; a failure here is logged, never raised into the agent's call."""
        try:
            self.writer.submit(record.to_span())
        except Exception:
            logger.exception("the LLM proxy could not build the span of a call of rollout %s", record.rollout_id)

    async def store_span(self, record: CallRecord) -> None:
        """Store the span of a finished call before the agent sees the end of the answer; never raises."""
        try:
            span = record.to_span()
        except Exception:
            logger.exception("the LLM proxy could not build the span of a call of rollout %s", record.rollout_id)
            return
        try:
            await self.writer.write(span)
        except Exception:  # the writer retries and counts drops itself; the agent's call must still complete
            logger.exception("the LLM proxy could not store the span of a call of rollout %s", record.rollout_id)

    def _url(self, path: str) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.upstream + path)
        return url

    async def aclose(self) -> None:
        """Write every pending span, then close the upstream connections."""
        await self.writer.aclose()
        if self._client is not None:
            await self._client.aclose()  # closes the transport too
        elif self._transport is not None:
            await self._transport.aclose()
        self._client = self._transport = None

    # --- attribution ---------------------------------------------------------------------------------------------
    async def attribute(self, request: Request) -> tuple[str, str] | Response | None:
        """(rollout_id, attempt_id) from the path or headers; None = no rollout; a Response = reject the call."""
        rollout_id = request.path_params.get("rollout_id")
        attempt_id = request.path_params.get("attempt_id")
        if rollout_id is None:
            rollout_id = request.headers.get(sc.HEADER_ROLLOUT_ID)
            attempt_id = request.headers.get(sc.HEADER_ATTEMPT_ID)
            if rollout_id is None and attempt_id is None:
                return None
            if rollout_id is None or attempt_id is None:
                message = f"send both {sc.HEADER_ROLLOUT_ID} and {sc.HEADER_ATTEMPT_ID} headers, or neither"
                return _error(400, message, "incomplete_attribution")
        key = (str(rollout_id), str(attempt_id))
        now = time.monotonic()
        if self._known.get(key, 0.0) > now:
            return key
        try:
            attempts = await self.store.query_attempts(key[0])
        except NotFoundError:
            message = (
                f"rollout {key[0]} is not in the store this proxy writes to; enqueue it first, or point the agent "
                "at the proxy's plain /v1 URL to forward without recording"
            )
            return _error(404, message, "unknown_rollout")
        except Exception as exc:  # a store outage must not stop the agent: forward, the writer retries the span
            logger.warning("could not check rollout %s in the store (%r); forwarding the call anyway", key[0], exc)
            return key
        ids = [attempt.attempt_id for attempt in attempts]
        if key[1] not in ids:
            return _error(404, f"rollout {key[0]} has no attempt {key[1]}; its attempts are {ids}", "unknown_attempt")
        if len(self._known) > 10_000:
            self._known = {k: t for k, t in self._known.items() if t > now}
        self._known[key] = now + self._ttl
        return key

    # --- forwarding ----------------------------------------------------------------------------------------------
    def _upstream_headers(self, request: Request) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = request.scope["headers"]
        kept = [(k, v) for k, v in headers if k not in _DROP_REQUEST_HEADERS]
        if self._api_key is not None or not self._forward_agent_auth:
            kept = [(k, v) for k, v in kept if k != b"authorization"]
        if self._api_key is not None:
            kept.append((b"authorization", f"Bearer {self._api_key}".encode()))
        return kept

    def _additions(self, endpoint: Endpoint, body: Json) -> tuple[Additions, bytes | None]:
        """What to add for this call and the rewritten body (None = forward the agent's bytes untouched)."""
        wanted = self._wanted[endpoint]
        ids = wanted.token_ids and not body.get("return_token_ids")
        if endpoint == "chat":
            logprobs = wanted.logprobs and not body.get("logprobs")
        else:
            logprobs = wanted.logprobs and _LOGPROBS_INCLUDE not in as_list(body.get("include"))
        added = Additions(ids, logprobs)
        if not added:
            return added, None
        upstream = dict(body)
        if ids:
            upstream["return_token_ids"] = True
        if logprobs and endpoint == "chat":
            upstream["logprobs"] = True
        elif logprobs:
            upstream["include"] = [*as_list(body.get("include")), _LOGPROBS_INCLUDE]
        return added, orjson.dumps(upstream)

    def _learn_rejection(self, endpoint: Endpoint, added: Additions, content: bytes) -> bool:
        """After a 400 naming a field we added, stop adding it (True = retry without it)."""
        text = content.decode(errors="replace")
        wanted = self._wanted[endpoint]
        token_ids = wanted.token_ids and not (added.token_ids and "return_token_ids" in text)
        # Name-based: an unrelated 400 (bad messages, ...) must not switch anything off.
        logprobs = wanted.logprobs and not (added.logprobs and "logprobs" in text)
        if (token_ids, logprobs) == (wanted.token_ids, wanted.logprobs):
            return False
        logger.warning(
            "upstream %s rejected the fields the proxy adds to %s calls (%s); continuing without them, so spans of "
            "these calls carry no %s",
            self.upstream,
            endpoint,
            text[:300],
            "token ids" if not token_ids else "logprobs",
        )
        self._wanted[endpoint] = Additions(token_ids, logprobs)
        return True

    async def forward_call(self, request: Request, endpoint: Endpoint, path: str) -> Response:
        """Forward one chat/responses call, relay the answer, record the span."""
        start_time = time.time_ns()
        raw = await request.body()
        try:
            parsed: Any = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _error(
                400, f"request body is not JSON ({exc}); send the OpenAI request as a JSON object", "bad_json"
            )
        if not isinstance(parsed, dict):
            return _error(400, "request body must be a JSON object, as the OpenAI API expects", "bad_json")
        body: Json = parsed  # pyright: ignore[reportUnknownVariableType]  # a JSON object
        attributed = await self.attribute(request)
        if isinstance(attributed, Response):
            return attributed
        record: CallRecord | None = None
        added, content = Additions(), None
        if attributed is not None:
            trace_id, parent_id = parse_traceparent(request.headers.get("traceparent"))
            record = CallRecord(
                endpoint, body, attributed[0], attributed[1], start_time, trace_id, parent_id, self.provider
            )
            added, content = self._additions(endpoint, body)
        url = self.upstream + path
        stream = bool(body.get("stream"))
        exchange = self._exchange(endpoint, path, body, raw, self._upstream_headers(request), record, added, content)
        outcome = await _guarded(request.receive, self.upstream_timeout_s, exchange)
        if outcome is _Cut.HUNG_UP:
            if record is not None:
                record.error = "the agent disconnected before the upstream answered; the upstream call was cancelled"
                record.error_type = "client_disconnected"
                self.submit(record)
            # Nobody reads this (uvicorn drops sends after a disconnect); 499 is nginx's "client closed request".
            return _error(499, "the agent disconnected before the upstream answered", "client_disconnected")
        if outcome is _Cut.TIMED_OUT:
            message = self._timeout_message(url, stream)
            if record is not None:
                record.error, record.error_type = message, "upstream_timeout"
                await self.store_span(record)
            return _error(504, message, "upstream_timeout")
        if isinstance(outcome, Response):
            return outcome
        response, response_body, added = outcome
        if record is not None:
            record.policy_version = _policy_version(response)
        if response_body is None:
            relay = _StreamRelay(self, response, record, added)
            return _RelayResponse(relay, response.status_code, _response_headers(response))
        return await self._finish_whole(response, response_body, record, added)

    def _timeout_message(self, url: str, stream: bool) -> str:
        waited = "did not start its stream" if stream else "did not answer"
        return (
            f"the upstream {url} {waited} within {self.upstream_timeout_s:g} s, the LLM proxy's upstream timeout; "
            "the proxy gave up and closed its connection. If the model legitimately needs longer, raise it with "
            "`agl proxy --upstream-timeout SECONDS` (upstream_timeout_s= of create_proxy_app / ProxyServer)"
        )

    async def _exchange(
        self,
        endpoint: Endpoint,
        path: str,
        body: Json,
        raw: bytes,
        headers: list[tuple[bytes, bytes]],
        record: CallRecord | None,
        added: Additions,
        content: bytes | None,
    ) -> _Exchanged | Response:
        """Send the call upstream: (response, its body or None for a stream to relay, additions) or an error reply.

        Runs under :func:`_guarded`, so everything here may be cancelled; the span is stored by the caller, outside
        the deadline, so a slow store never turns an answer into a timeout.
        """
        url = self.upstream + path
        while True:
            try:
                # Straight to the client's pooled transport: the client's auth/redirect/cookie steps are not needed
                # on this path and cost measurable time on every call.
                stateless = endpoint == "chat" or body.get("store") is False
                extensions = self._replayable_extensions if stateless else self._extensions
                upstream_request = httpx.Request(
                    "POST", self._url(path), content=content or raw, headers=headers, extensions=extensions
                )
                response = await self.transport.handle_async_request(upstream_request)
            except _READ_TIMEOUTS:
                raise  # _guarded answers 504, like its own deadline
            except httpx.HTTPError as exc:
                message = f"the LLM proxy could not reach the upstream {url}: {exc!r}"
                if record is not None:
                    record.error, record.error_type = message, type(exc).__name__
                    self.submit(record)
                return _error(502, message, "upstream_unreachable")
            if response.status_code != 400 or not added:
                break
            try:
                error_body = await response.aread()
            finally:
                await response.aclose()
            if not self._learn_rejection(endpoint, added, error_body):
                return response, error_body, added
            added, content = self._additions(endpoint, body)  # strictly fewer additions: the loop ends
        if body.get("stream") and response.status_code < 400:
            return response, None, added
        try:
            response_body = await response.aread()
        except _READ_TIMEOUTS:
            raise
        except httpx.HTTPError as exc:
            message = f"the upstream {url} broke off its answer: {exc!r}"
            if record is not None:
                record.error, record.error_type = message, type(exc).__name__
                self.submit(record)
            return _error(502, message, "upstream_broken")
        finally:
            await response.aclose()
        return response, response_body, added

    async def _finish_whole(
        self, response: httpx.Response, content: bytes, record: CallRecord | None, added: Additions
    ) -> Response:
        """Record a non-streamed answer (or an upstream error) and give it to the agent."""
        if record is not None:
            if record.policy_version is None:
                record.policy_version = _policy_version(response)
            if response.status_code >= 400:
                record.error, record.error_type = _error_message(content), str(response.status_code)
            else:
                try:
                    payload: Any = orjson.loads(content)
                except orjson.JSONDecodeError:
                    payload = None
                if isinstance(payload, dict):
                    json_payload: Json = payload  # pyright: ignore[reportUnknownVariableType]  # a JSON object
                    if _fold_payload(record, json_payload, added, chunk=False) and added:
                        content = orjson.dumps(json_payload)
                else:
                    record.error, record.error_type = "the upstream answer is not a JSON object", "bad_upstream_json"
            await self.store_span(record)
        reply = Response(content, response.status_code)
        reply.raw_headers = [*_response_headers(response), (b"content-length", str(len(content)).encode())]
        return reply

    async def forward_plain(self, request: Request, path: str) -> Response:
        """Forward any other call (``GET /v1/models``, embeddings, ...) untouched; no span."""
        attributed = await self.attribute(request)
        if isinstance(attributed, Response):
            return attributed
        url = self.upstream + path + (f"?{request.url.query}" if request.url.query else "")
        send = self.client.request(
            request.method, url, content=await request.body(), headers=self._upstream_headers(request)
        )
        try:
            response = await _guarded(request.receive, self.upstream_timeout_s, send)
        except httpx.HTTPError as exc:
            return _error(502, f"the LLM proxy could not reach the upstream {url}: {exc!r}", "upstream_unreachable")
        if response is _Cut.HUNG_UP:
            return _error(499, "the agent disconnected before the upstream answered", "client_disconnected")
        if response is _Cut.TIMED_OUT:
            return _error(504, self._timeout_message(url, stream=False), "upstream_timeout")
        reply = Response(response.content, response.status_code)
        reply.raw_headers = [*_response_headers(response), (b"content-length", str(len(response.content)).encode())]
        return reply


def _response_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in _DROP_RESPONSE_HEADERS]


def create_proxy_app(
    store: LightningStore,
    upstream_url: str,
    *,
    provider: str = "openai",
    request_token_ids: bool = True,
    request_logprobs: bool = True,
    upstream_api_key: str | None = None,
    upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S,
    id_cache_ttl_s: float = 10.0,
    span_batch_size: int = 256,
    token: str | None = None,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The LLM proxy as an ASGI app forwarding to ``upstream_url`` and recording LLM spans into ``store``.

    Routes (each also under ``/rollout/{rollout_id}/attempt/{attempt_id}``): ``POST /v1/chat/completions``,
    ``POST /v1/responses`` (streaming or not), ``GET /v1/models`` and any other ``/v1/...`` call (forwarded, no span).
    Calls on the plain ``/v1`` routes are attributed by the ``x-agentlightning-rollout-id`` and
    ``x-agentlightning-attempt-id`` headers, or to no rollout: then they are forwarded untouched and no span is kept.

    For attributed calls the proxy asks the upstream for token ids (``return_token_ids: true``) and logprobs
    (``logprobs: true`` on chat; ``include: ["message.output_text.logprobs"]`` on responses), and strips what the
    agent did not ask for from the answer, so it reads exactly what the upstream would have sent it. An upstream
    that rejects one of these fields with a 400 naming it (as api.openai.com does for ``return_token_ids``) is asked
    once more without it, and never again: its spans then lack that field.

    ``upstream_url`` is the upstream's OpenAI base URL (``http://host:8000/v1``; a bare ``http://host:8000`` gets
    ``/v1``). ``upstream_api_key`` replaces the agent's ``Authorization`` header when set. A call's span is stored
    before the agent sees the end of the answer (so a runner that closes the attempt right after never races it);
    concurrent calls share store writes in batches of up to ``span_batch_size``.

    ``upstream_timeout_s`` (> 0, default 600) bounds the wait for the upstream: the whole answer of a non-streamed
    call, the start of a stream and then each gap between its chunks. A call past it gets a 504 in the OpenAI error
    shape (code ``upstream_timeout``) and its span status ERROR. When the agent disconnects first, the upstream call
    is cancelled and its connection closed at once, and the span says so (``client_disconnected``).

    ``token`` makes every route but ``GET /health`` require ``Authorization: Bearer <token>`` (agents pass it as
    their OpenAI API key); the agent's header is then never forwarded, and the upstream gets ``upstream_api_key``.
    ``GET /metrics`` serves Prometheus counters of spans written and dropped.

    ``upstream_transport`` carries the calls to ``upstream_url`` instead of the proxy's own HTTP/1.1 pool: a server
    that hosts the proxy in the upstream's process passes one that calls the upstream's handlers directly (the
    policy server's ``PolicyAppTransport``). It gets requests for ``upstream_url``'s URLs, as the pool would, and is
    closed with the app.
    """
    proxy = LLMProxy(
        store,
        upstream_url,
        provider=provider,
        request_token_ids=request_token_ids,
        request_logprobs=request_logprobs,
        upstream_api_key=upstream_api_key,
        upstream_timeout_s=upstream_timeout_s,
        id_cache_ttl_s=id_cache_ttl_s,
        span_batch_size=span_batch_size,
        forward_agent_auth=token is None,
        transport=upstream_transport,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncGenerator[None]:
        yield
        await proxy.aclose()

    app = FastAPI(title="Agent Lightning LLM proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.llm_proxy = proxy
    if token is not None:
        app.add_middleware(ProxyTokenMiddleware, token=token)
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/metrics", metrics_endpoint(proxy.writer), methods=["GET"])

    async def chat(request: Request) -> Response:
        return await proxy.forward_call(request, "chat", "/chat/completions")

    async def responses(request: Request) -> Response:
        return await proxy.forward_call(request, "responses", "/responses")

    async def other(request: Request) -> Response:
        return await proxy.forward_plain(request, "/" + str(request.path_params["path"]))

    # Plain Starlette routes: FastAPI's dependency machinery would cost latency on every call and adds nothing here.
    for prefix in ("", _ROLLOUT_PREFIX):
        app.add_route(f"{prefix}/v1/chat/completions", chat, methods=["POST"])
        app.add_route(f"{prefix}/v1/responses", responses, methods=["POST"])
        app.add_route(f"{prefix}/v1/{{path:path}}", other, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    return app


def proxy_of(app: FastAPI) -> LLMProxy:
    """The :class:`LLMProxy` behind an app made by :func:`create_proxy_app`."""
    proxy = getattr(app.state, "llm_proxy", None)
    if not isinstance(proxy, LLMProxy):
        raise TypeError("this app was not made by agentlightning.proxy.create_proxy_app")
    return proxy


async def flush_proxy_spans(app: FastAPI) -> None:
    """Wait until every span the proxy app has recorded so far is in the store."""
    await proxy_of(app).writer.flush()
