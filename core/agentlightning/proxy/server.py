"""Running the LLM proxy: blocking (``agl proxy``), on the caller's event loop (:func:`start_proxy`: trainers, ``agl
dev``), or on a background thread (:class:`ProxyServer`: tests, notebooks)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import uvicorn

from agentlightning._loops import close_loop
from agentlightning.proxy._edge import PROXY_TOKEN_ENV
from agentlightning.proxy.app import DEFAULT_UPSTREAM_TIMEOUT_S, create_proxy_app, proxy_of
from agentlightning.store.base import LightningStore


def resolve_proxy_token(host: str, token: str | None) -> str | None:
    """The token the proxy requires (argument, else ``AGL_PROXY_TOKEN``); refuses a non-loopback bind without one."""
    from agentlightning.server._run import require_bind_token

    return require_bind_token(
        host,
        token,
        env=PROXY_TOKEN_ENV,
        refusal=f"refusing to serve the LLM proxy on {host!r} without a token: anyone who can reach it could spend "
        f"the upstream's quota and write spans into your rollouts. Pass token=... (agl proxy --token ...) or set "
        f"{PROXY_TOKEN_ENV}, or bind to 127.0.0.1.",
    )


async def probe_store(store: LightningStore) -> None:
    """Fail fast with one clear error when the store is unreachable or refuses the proxy's credentials."""
    from agentlightning.client import StoreUnavailableError

    try:
        await store.statistics()
    except PermissionError as exc:
        raise PermissionError(
            f"{exc}; the proxy writes spans with the store token (agl proxy --store-token, or AGENTLIGHTNING_TOKEN)"
        ) from None
    except StoreUnavailableError as exc:
        raise StoreUnavailableError(f"the LLM proxy cannot reach its store: {exc}") from None


def _resolve_store(
    store: LightningStore | None, store_url: str | None, store_token: str | None = None
) -> LightningStore:
    if (store is None) == (store_url is None):
        raise ValueError(
            "give the proxy exactly one store: store_url='http://host:4747' for a running `agl store`, "
            "or store=<a LightningStore> in-process"
        )
    if store is not None:
        return store
    from agentlightning.client import LightningStoreClient

    assert store_url is not None
    return LightningStoreClient(store_url, token=store_token)


def serve_proxy(
    *,
    upstream: str,
    store_url: str | None = None,
    store: LightningStore | None = None,
    host: str = "127.0.0.1",
    port: int = 4748,
    upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S,
    token: str | None = None,
    store_token: str | None = None,
    **options: Any,
) -> None:
    """Serve the LLM proxy until interrupted; spans go to ``store`` or the store server at ``store_url``.

    ``token`` (else ``AGL_PROXY_TOKEN``) is what callers must send; required beyond loopback. ``store_token`` (else
    ``AGENTLIGHTNING_TOKEN``) is how the proxy writes spans to ``store_url``; the store is probed first, so a wrong
    URL or token fails here, before any agent's spans could be lost. ``upstream_timeout_s`` and ``options`` are
    passed to :func:`agentlightning.proxy.create_proxy_app` (``request_token_ids``, ``upstream_api_key``...).
    Agents then use ``http://{host}:{port}/rollout/{rollout_id}/attempt/{attempt_id}/v1`` as their OpenAI base URL
    (``LLM(base_url=..., proxied=True, api_key=token).base_url_for(rollout_id, attempt_id)`` builds it).
    """
    token = resolve_proxy_token(host, token)
    resolved = _resolve_store(store, store_url, store_token)
    if store_url is not None:
        asyncio.run(probe_store(resolved))
    app = create_proxy_app(resolved, upstream, upstream_timeout_s=upstream_timeout_s, token=token, **options)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


def _bound_socket(host: str, port: int) -> socket.socket:
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only then; without it Nagle +
    # delayed ACK add ~40 ms to every response uvicorn writes in two sends.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class ServedApp:
    """An ASGI app served by uvicorn on the caller's event loop (so it can share a store object with the runners)."""

    app: Any
    url: str
    task: asyncio.Task[None]
    server: uvicorn.Server

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@dataclass
class ServedProxy(ServedApp):
    """The LLM proxy served on the caller's event loop."""

    async def flush(self) -> None:
        """Wait until every call recorded so far is in the store."""
        await proxy_of(self.app).writer.flush()


async def serve_app(
    app: Any, *, name: str, host: str = "127.0.0.1", port: int = 0, url_host: str | None = None
) -> ServedApp:
    """Serve ``app`` on ``port`` of ``host`` (0: a free one) on this event loop; its URL names ``url_host``."""
    sock = _bound_socket(host, port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            sock.close()

    task = asyncio.create_task(serve(), name=name)
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"{name} failed to start on {host}:{sock.getsockname()[1]}")
        await asyncio.sleep(0.01)
    return ServedApp(app, f"http://{url_host or host}:{sock.getsockname()[1]}", task, server)


async def start_proxy(
    store: LightningStore,
    upstream: str,
    *,
    request_token_ids: bool = True,
    upstream_api_key: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    url_host: str | None = None,
    upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S,
) -> ServedProxy:
    """Serve the LLM proxy in front of ``upstream`` on this event loop (loopback and a free port by default).

    ``request_token_ids`` asks the upstream for token ids and logprobs (vLLM, the policy server, the fake); turn it
    off for a server that rejects them (the proxy also learns that from the first 400 and stops asking).
    """
    app = create_proxy_app(
        store,
        upstream,
        request_token_ids=request_token_ids,
        request_logprobs=request_token_ids,
        upstream_api_key=upstream_api_key,
        upstream_timeout_s=upstream_timeout_s,
    )
    served = await serve_app(app, name="agl-llm-proxy", host=host, port=port, url_host=url_host)
    return ServedProxy(served.app, served.url, served.task, served.server)


class ProxyServer:
    """The LLM proxy on a background thread, as a context manager: ``with ProxyServer(store, url) as proxy: ...``.

    The store's async methods are called on the proxy thread's event loop. Leaving the block writes every pending
    span and stops the server. ``upstream_timeout_s`` and ``options`` go to
    :func:`agentlightning.proxy.create_proxy_app`.
    """

    def __init__(
        self,
        store: LightningStore,
        upstream_url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S,
        **options: Any,
    ) -> None:
        self.app = create_proxy_app(store, upstream_url, upstream_timeout_s=upstream_timeout_s, **options)
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.url = ""

    @property
    def base_url(self) -> str:
        """OpenAI base URL of the unattributed routes (calls are attributed by header or not at all)."""
        return f"{self.url}/v1"

    def url_for(self, rollout_id: str, attempt_id: str) -> str:
        """OpenAI base URL that attributes every call to the given attempt."""
        return f"{self.url}/rollout/{rollout_id}/attempt/{attempt_id}/v1"

    def start(self) -> None:
        """Bind the port and start serving; returns once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError(f"the proxy is already running at {self.url}")
        sock = _bound_socket(self._host, self._port)
        self.url = f"http://{self._host}:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on")
        server = self._server = uvicorn.Server(config)
        loop = self._loop = asyncio.new_event_loop()

        def run() -> None:
            try:
                loop.run_until_complete(server.serve(sockets=[sock]))
            finally:
                sock.close()
                close_loop(loop)  # the span writer's store may have left tasks on it (a PostgreSQL pool's workers)

        self._thread = threading.Thread(target=run, daemon=True, name="agentlightning-proxy")
        self._thread.start()
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the LLM proxy failed to start on {self.url}; see the log above")
            threading.Event().wait(0.005)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every span recorded so far is in the store."""
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(proxy_of(self.app).writer.flush(), self._loop)
        future.result(timeout=timeout_s)

    def stop(self) -> None:
        """Write pending spans and stop the server (lifespan shutdown does the flush)."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._server = self._thread = self._loop = None

    def __enter__(self) -> ProxyServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
