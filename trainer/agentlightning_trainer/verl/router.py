"""A small OpenAI-compatible router in front of verl's vLLM replicas: the LLM proxy's one upstream.

The proxy forwards to a single URL; verl starts one vLLM HTTP server per replica (``LLMServerManager
.get_addresses()``). The router sends each call to the replica with the fewest calls in flight, replaces the
``model`` the agent asked for with the name vLLM serves (the model path), and stamps the policy version
(``x-agentlightning-policy-version``) on every answer so spans record which weights produced them. Bodies stream
through unchanged otherwise (``return_token_ids`` and ``logprobs`` added by the proxy reach vLLM as sent).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import httpx
import orjson
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agentlightning.semconv import HEADER_POLICY_VERSION

logger = logging.getLogger(__name__)

# Hop-by-hop and length headers never cross the router; httpx and uvicorn set their own.
_DROP_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}
)
_DROP_RESPONSE_HEADERS = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection", "date"})


class ReplicaRouter:
    """Least-in-flight routing over vLLM replicas, with the served model name and the policy version."""

    def __init__(self, addresses: Sequence[str], *, served_model: str, timeout_s: float = 600.0) -> None:
        """``addresses`` are ``host:port`` (as verl reports them) or full ``http://`` base URLs."""
        if not addresses:
            raise ValueError("the router needs at least one vLLM replica address")
        self.bases = [a.rstrip("/") if a.startswith(("http://", "https://")) else f"http://{a}" for a in addresses]
        self.served_model = served_model
        self.policy_version = 0
        self.in_flight = [0] * len(self.bases)
        self.routed = [0] * len(self.bases)
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled upstream client, created in the serving loop on first use."""
        if self._client is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self._timeout_s), limits=limits)
        return self._client

    async def aclose(self) -> None:
        """Close the upstream connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def discover_served_model(self) -> str:
        """Ask the first replica which model it serves (``GET /v1/models``) and route to that name from now on."""
        answer = await self.client.get(f"{self.bases[0]}/v1/models")
        answer.raise_for_status()
        models = answer.json().get("data") or []
        if models and isinstance(models[0], dict) and isinstance(models[0].get("id"), str):
            self.served_model = models[0]["id"]
        return self.served_model

    def pick(self) -> int:
        """Index of the replica with the fewest calls in flight (ties: the one routed to least)."""
        return min(range(len(self.bases)), key=lambda i: (self.in_flight[i], self.routed[i]))

    def rewrite_body(self, body: bytes) -> bytes:
        """The request body with ``model`` set to the served name (other JSON and non-JSON bodies unchanged)."""
        if not body:
            return body
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(payload, dict) or "model" not in payload:
            return body
        payload["model"] = self.served_model
        return orjson.dumps(payload)

    async def forward(self, request: Request) -> Response:
        """Relay one call to a replica, streaming the answer back."""
        index = self.pick()
        self.in_flight[index] += 1
        self.routed[index] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight[index] -= 1

        try:
            body = self.rewrite_body(await request.body())
            headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS]
            url = self.bases[index] + request.url.path + (f"?{request.url.query}" if request.url.query else "")
            upstream_request = self.client.build_request(request.method, url, headers=headers, content=body)
            upstream = await self.client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            release()
            logger.warning("vLLM replica %s failed: %r", self.bases[index], exc)
            message = {"error": {"message": f"vLLM replica {self.bases[index]} failed: {exc!r}", "code": "replica"}}
            return Response(orjson.dumps(message), 502, media_type="application/json")
        except BaseException:
            release()
            raise
        response_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}
        response_headers[HEADER_POLICY_VERSION] = str(self.policy_version)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_bytes():
                    yield chunk
            finally:
                release()

        async def close() -> None:
            await upstream.aclose()
            release()

        return StreamingResponse(
            relay(), status_code=upstream.status_code, headers=response_headers, background=BackgroundTask(close)
        )


def create_router_app(router: ReplicaRouter) -> Starlette:
    """The router as an ASGI app: every ``/v1/...`` route goes to a replica."""

    async def route(request: Request) -> Response:
        return await router.forward(request)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await router.aclose()

    app = Starlette(routes=[Route("/v1/{path:path}", route, methods=["GET", "POST"])], lifespan=lifespan)
    app.state.replica_router = router
    return app
