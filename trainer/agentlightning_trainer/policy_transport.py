"""The co-hosted LLM proxy's way to the policy: an httpx transport that hands chat and Responses calls to the policy
app's handlers in the same process, instead of a loopback HTTP round trip.

With ``--proxy-store`` the policy server process also serves the LLM proxy (policy_server.py). Over loopback each
call then crossed HTTP twice inside that one process: the proxy's client wrote the request, uvicorn parsed it, and
FastAPI's middleware and routing ran before the handler, then all of that again for the answer. Here the handler
gets the request's body and its answer (a Starlette response) becomes the httpx response the proxy reads: the same
status, headers and bytes as over HTTP (``tests/trainer/test_policy_transport.py``). ``python -m
bench.cohosted_proxy`` measures both paths in one run. Any other request (``GET /v1/models``, an admin route) goes
over HTTP as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping

import httpx
from starlette.responses import Response, StreamingResponse

__all__ = ["BodyHandler", "PolicyAppTransport"]

logger = logging.getLogger(__name__)

BodyHandler = Callable[[bytes], Awaitable[Response]]
"""A generating route's handler: the request body in, the route's response out."""


class _Chunks(httpx.AsyncByteStream):
    """A streamed answer's chunks, as the proxy reads an upstream's stream."""

    def __init__(self, chunks: AsyncIterable[str | bytes | memoryview]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)

    async def aclose(self) -> None:
        """Stop the generator when the reader leaves early (an agent that disconnected)."""
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


class PolicyAppTransport(httpx.AsyncBaseTransport):
    """Calls the policy app's generating routes in process (``handlers`` by URL path); any other request over HTTP."""

    def __init__(self, handlers: Mapping[str, BodyHandler], fallback: httpx.AsyncBaseTransport | None = None) -> None:
        """``fallback`` carries the other requests (default: httpx's HTTP transport)."""
        self._handlers = dict(handlers)
        self._fallback = fallback

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The handler's answer for a POST to one of its paths; the fallback's for anything else."""
        handler = self._handlers.get(request.url.path) if request.method == "POST" else None
        if handler is None:
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        try:
            answer = await handler(await request.aread())
        except Exception:
            # What the HTTP route answers (Starlette's ServerErrorMiddleware); the proxy relays it as any upstream 500.
            logger.exception("the policy failed to answer %s", request.url.path)
            return httpx.Response(500, text="Internal Server Error")
        if isinstance(answer, StreamingResponse):
            return httpx.Response(answer.status_code, headers=answer.raw_headers, stream=_Chunks(answer.body_iterator))
        return httpx.Response(answer.status_code, headers=answer.raw_headers, content=bytes(answer.body))

    async def aclose(self) -> None:
        """Close the fallback's connections."""
        if self._fallback is not None:
            await self._fallback.aclose()
