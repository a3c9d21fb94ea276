"""Running the LLM proxy: blocking (``agl proxy``) or on a background thread (tests, notebooks, one-process runs)."""

from __future__ import annotations

import asyncio
import socket
import threading
from types import TracebackType
from typing import Any

import uvicorn

from agentlightning._loops import close_loop
from agentlightning.proxy.app import DEFAULT_UPSTREAM_TIMEOUT_S, create_proxy_app, proxy_of
from agentlightning.store.base import LightningStore


def _resolve_store(store: LightningStore | None, store_url: str | None) -> LightningStore:
    if (store is None) == (store_url is None):
        raise ValueError(
            "give the proxy exactly one store: store_url='http://host:4747' for a running `agl store`, "
            "or store=<a LightningStore> in-process"
        )
    if store is not None:
        return store
    from agentlightning.client import LightningStoreClient

    assert store_url is not None
    return LightningStoreClient(store_url)


def serve_proxy(
    *,
    upstream: str,
    store_url: str | None = None,
    store: LightningStore | None = None,
    host: str = "127.0.0.1",
    port: int = 4748,
    upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S,
    **options: Any,
) -> None:
    """Serve the LLM proxy until interrupted; spans go to ``store`` or the store server at ``store_url``.

    ``upstream_timeout_s`` and ``options`` are passed to :func:`agentlightning.proxy.create_proxy_app`
    (``request_token_ids``, ``provider``...).
    Agents then use ``http://{host}:{port}/rollout/{rollout_id}/attempt/{attempt_id}/v1`` as their OpenAI base URL
    (``LLM(base_url=..., proxied=True).base_url_for(rollout_id, attempt_id)`` builds it).
    """
    app = create_proxy_app(_resolve_store(store, store_url), upstream, upstream_timeout_s=upstream_timeout_s, **options)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


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
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only then; without it Nagle +
        # delayed ACK add ~40 ms to every response uvicorn writes in two sends.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
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
