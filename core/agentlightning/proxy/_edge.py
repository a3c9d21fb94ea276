"""The LLM proxy's edge: a bearer token for its own callers, ``/health`` and Prometheus ``/metrics``."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Final

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from agentlightning.proxy._writer import SpanWriter

PROXY_TOKEN_ENV: Final = "AGL_PROXY_TOKEN"
"""Environment variable holding the token the proxy requires from its callers (``agl proxy --token``)."""
# Liveness answers without credentials, as the store's /health does.
OPEN_PATHS: Final = frozenset({"/health"})


def _openai_error(status: int, message: str, code: str, headers: list[tuple[bytes, bytes]]) -> list[object]:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
    }
    return [start, {"type": "http.response.body", "body": body}]


class ProxyTokenMiddleware:
    """Answers 401 (no token) or 403 (wrong token) in the OpenAI error shape unless ``Authorization: Bearer <token>``.

    The agent's ``Authorization`` header then carries the proxy's token, so it is never forwarded upstream: the
    upstream gets ``upstream_api_key`` or no key at all.
    """

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if not token:
            raise ValueError("the proxy token must be a non-empty string")
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the bearer token of every HTTP request but ``/health``."""
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if header is None:
            answer = _openai_error(
                401,
                "this LLM proxy requires a bearer token: use it as the OpenAI API key "
                "(OpenAI(api_key=<token>), LLM(api_key=<token>)) or send 'Authorization: Bearer <token>'",
                "missing_token",
                [(b"www-authenticate", b"Bearer")],
            )
        else:
            scheme, _, credentials = header.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token):
                await self.app(scope, receive, send)
                return
            answer = _openai_error(
                403,
                "the bearer token is not valid for this LLM proxy; use the token it was started with",
                "bad_token",
                [],
            )
        for message in answer:
            await send(message)  # pyright: ignore[reportArgumentType]  # ASGI messages are plain dicts


class _WriterCollector(Collector):
    """Reads the span writer's counters at scrape time (no bookkeeping on the request path)."""

    def __init__(self, writer: SpanWriter) -> None:
        self.writer = writer

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The proxy's span counters."""
        yield CounterMetricFamily(
            "agentlightning_proxy_spans_written", "LLM spans the proxy stored.", value=self.writer.written
        )
        yield CounterMetricFamily(
            "agentlightning_proxy_spans_dropped",
            "LLM spans the proxy dropped (the store rejected them or stayed unreachable through every retry).",
            value=self.writer.dropped,
        )
        yield GaugeMetricFamily(
            "agentlightning_proxy_spans_pending", "LLM spans queued for the store.", value=self.writer.pending
        )


def metrics_endpoint(writer: SpanWriter) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint serving the proxy's metrics as Prometheus text (a registry of its own per app)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_WriterCollector(writer))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


async def health(_: Request) -> Response:
    """Liveness of the proxy itself (no store or upstream call, no token)."""
    return Response(b'{"status":"ok"}', media_type="application/json")
