"""The edge of the store server: bearer-token auth, body size limit, request metrics and the last-resort 500."""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any, Final, get_args

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlightning.store.base import StoreStatistics
from agentlightning.types import AttemptStatus, RolloutStatus

logger = logging.getLogger("agentlightning.server")

# Paths answered without a token: load balancers and orchestrators probe liveness without credentials.
OPEN_PATHS: Final = frozenset({"/health"})


class BodyTooLargeError(HTTPException):
    """A request body (or its decompressed form) exceeds the server's ``max_body_bytes``."""

    def __init__(self, limit: int, size: int | None = None, *, what: str = "request body") -> None:
        size_text = f"is {size} bytes" if size is not None else "is larger"
        super().__init__(
            status_code=413,
            detail=(
                f"{what} {size_text}; this server accepts at most {limit} bytes (max_body_bytes). "
                "Send smaller batches or start the server with a larger max_body_bytes."
            ),
        )


class StoreMetrics:
    """Prometheus metrics of one app, in their own registry so that many apps can live in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rollouts = Gauge(
            "agentlightning_store_rollouts",
            "Rollouts in the store per status (queue depth = queuing + requeuing).",
            ["status"],
            registry=self.registry,
        )
        self.attempts = Gauge(
            "agentlightning_store_attempts", "Attempts in the store per status.", ["status"], registry=self.registry
        )
        self.spans_stored = Gauge("agentlightning_store_spans", "Spans held by the store.", registry=self.registry)
        self.spans_ingested = Counter(
            "agentlightning_spans_ingested",
            "Spans accepted by this server, per ingest path (rest, otlp, or otlp-logs: GenAI message log records).",
            ["source"],
            registry=self.registry,
        )
        self.spans_rejected = Counter(
            "agentlightning_spans_rejected",
            "OTLP spans rejected (no rollout/attempt ids, unknown attempt, invalid).",
            registry=self.registry,
        )
        self.latency = Histogram(
            "agentlightning_http_request_duration_seconds",
            "Time to answer a request, per route template.",
            ["method", "route"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        self.responses = Counter(
            "agentlightning_http_responses",
            "Responses per route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        for source in ("rest", "otlp", "otlp-logs"):
            self.spans_ingested.labels(source)

    def observe_store(self, stats: StoreStatistics) -> None:
        """Set the gauges from a statistics snapshot (every known status is exported, zeros included)."""
        for status in get_args(RolloutStatus):
            self.rollouts.labels(status).set(stats.rollouts_by_status.get(status, 0))
        for status in get_args(AttemptStatus):
            self.attempts.labels(status).set(stats.attempts_by_status.get(status, 0))
        self.spans_stored.set(stats.total_spans)


def json_error(status: int, detail: str, headers: dict[str, str] | None = None) -> tuple[Message, Message]:
    """The two ASGI messages of a JSON error answer ``{"detail": ...}``."""
    body = orjson.dumps({"detail": detail})
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return (
        {"type": "http.response.start", "status": status, "headers": raw_headers},
        {"type": "http.response.body", "body": body},
    )


class StoreEdgeMiddleware:
    """Pure ASGI middleware (no per-request task, unlike BaseHTTPMiddleware) guarding every HTTP request."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int, metrics: StoreMetrics) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check auth and size, run the app, turn an unhandled exception into a 500 and record metrics."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "started": False}

        async def send_and_watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["started"] = True
            await send(message)

        try:
            refusal = self._refuse(scope)
            if refusal is not None:
                for message in refusal:
                    await send_and_watch(message)
                return
            await self.app(scope, self._limited(receive), send_and_watch)
        except BodyTooLargeError as exc:  # raised outside FastAPI's routing (e.g. while streaming)
            if not state["started"]:
                for message in json_error(413, str(exc.detail)):
                    await send_and_watch(message)
        except Exception:
            # Internals (paths, SQL, stack) stay in the server log; the caller gets a stable, non-leaking message.
            logger.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
            if not state["started"]:
                detail = "internal error in the store server; the server log has the details"
                for message in json_error(500, detail):
                    await send_and_watch(message)
        finally:
            self._record(scope, state["status"], time.perf_counter() - started)

    def _refuse(self, scope: Scope) -> tuple[Message, Message] | None:
        if self.token is not None and scope["path"] not in OPEN_PATHS:
            supplied = _header(scope, b"authorization")
            if supplied is None:
                return json_error(
                    401,
                    "this store requires a bearer token: send 'Authorization: Bearer <token>' "
                    "(LightningStoreClient(url, token=...) or the AGENTLIGHTNING_TOKEN environment variable)",
                    {"www-authenticate": "Bearer"},
                )
            scheme, _, credentials = supplied.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), self.token):
                return json_error(
                    403,
                    "the bearer token is not valid for this store; use the token the server was started with",
                )
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return json_error(413, str(BodyTooLargeError(self.max_body_bytes, int(length)).detail))
        return None

    def _limited(self, receive: Receive) -> Receive:
        # Content-Length is checked up front; this catches chunked bodies that have no length header.
        seen = 0
        limit = self.max_body_bytes

        async def receive_limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLargeError(limit)
            return message

        return receive_limited

    def _record(self, scope: Scope, status: int, elapsed_s: float) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        key = (scope.get("method", ""), route, status)
        children = self._children.get(key)
        if children is None:  # labels() costs a lock and a dict walk; routes x statuses are few, so keep them
            method = key[0]
            children = (
                self.metrics.latency.labels(method, route),
                self.metrics.responses.labels(method, route, str(status)),
            )
            self._children[key] = children
        children[0].observe(elapsed_s)
        children[1].inc()


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None
