"""Running the store server: ``serve_store`` (blocking, what ``agl store`` calls) and ``StoreServer`` (a thread)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Final

import uvicorn

from agentlightning.client import TOKEN_ENV
from agentlightning.server._app import create_app
from agentlightning.store import LightningStore, open_store
from agentlightning.store.watchdog import Watchdog

logger = logging.getLogger("agentlightning.server")

BACKENDS: Final = ("sqlite", "memory", "postgres")
# Seconds between the server's own watchdog ticks: an attempt is marked at most this long after its timeout. A tick
# is one write transaction (SQLite) or one row-locking query over the live rollouts (PostgreSQL, SKIP LOCKED), so
# every 2 s per server is one write per server against one per runner worker every 5 s (the heartbeat default).
DEFAULT_WATCHDOG_INTERVAL_S: Final = 2.0


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_bind_token(host: str, token: str | None, *, env: str, refusal: str) -> str | None:
    """``token``, else the environment variable ``env``; a ValueError starting with ``refusal`` when there is none
    and ``host`` accepts connections from other machines (the store and the LLM proxy share this rule)."""
    token = token or os.environ.get(env) or None
    if token is None and not is_loopback(host):
        raise ValueError(refusal)
    return token


def resolve_token(host: str, token: str | None) -> str | None:
    """The token to require (argument, else ``AGENTLIGHTNING_TOKEN``); refuses a non-loopback bind without one."""
    return require_bind_token(
        host,
        token,
        env=TOKEN_ENV,
        refusal=f"refusing to serve the store on {host!r} without a token: anyone who can reach it could read and "
        f"change every rollout. Pass token=... (agl store --token ...) or set {TOKEN_ENV}, or bind to 127.0.0.1.",
    )


def _check_watchdog_interval(interval_s: float) -> float:
    """``interval_s`` if it is a usable watchdog interval (0 = off); a teaching ValueError otherwise."""
    if not (math.isfinite(interval_s) and interval_s >= 0):
        raise ValueError(
            f"watchdog_interval_s must be a number of seconds >= 0 (0 turns the server's watchdog off); "
            f"got {interval_s}. Pass e.g. agl store --watchdog-interval {DEFAULT_WATCHDOG_INTERVAL_S:g}"
        )
    return interval_s


def _start_watchdog(store: LightningStore, interval_s: float) -> Watchdog | None:
    """The server's watchdog, ticking on the running loop; None when ``interval_s`` is 0."""
    if interval_s == 0:
        return None
    watchdog = Watchdog(store, interval_s)
    watchdog.start()
    return watchdog


def _store_spec(backend: str, path: str | None, dsn: str | None) -> str:
    """``agl store``'s ``--backend``/``--path``/``--dsn`` as the spec :func:`agentlightning.store.open_store` takes."""
    if backend == "sqlite":
        if path is None:
            raise ValueError("the sqlite backend needs a path, e.g. path='runs/store.db'")
        return f"sqlite:///{path}"
    if backend == "memory":
        return "memory:"
    if backend in ("postgres", "postgresql"):
        if not dsn:
            raise ValueError("the postgres backend needs a dsn, e.g. dsn='postgresql://user@host/agentlightning'")
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"dsn {dsn!r} is not a PostgreSQL URL; use postgresql://user@host/db")
        return dsn
    raise ValueError(f"unknown store backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def _uvicorn_config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    # http="auto": httptools (a dependency of the server extra; about twice h11's speed), h11 when it is missing.
    # Writes are not corked: gathering an answer's head and body into one send measured 0.99x the full-cycle rate
    # of uvicorn's own protocol (bench.store_http, 5 runs, 2026-12-04), so it went. Lifespan off: the store's life is
    # managed here, around the server. Proxy headers off: nothing here reads the client address (no access log),
    # so rewriting it from X-Forwarded-For on every request is waste.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        loop="asyncio",
        http="auto",
        proxy_headers=False,
    )


def serve_store(
    *,
    backend: str = "sqlite",
    path: str | None = "runs/store.db",
    dsn: str | None = None,
    host: str = "127.0.0.1",
    port: int = 4747,
    token: str | None = None,
    watchdog_interval_s: float = DEFAULT_WATCHDOG_INTERVAL_S,
    **app_options: Any,
) -> None:
    """Serve a store over HTTP until interrupted (blocking); ``app_options`` go to :func:`create_app`.

    The server runs the store's watchdog every ``watchdog_interval_s`` seconds (0: never), so attempts past their
    ``timeout_s`` or silent for ``heartbeat_timeout_s`` are ended and requeued with no trainer running.
    """
    token = resolve_token(host, token)
    _check_watchdog_interval(watchdog_interval_s)
    store = open_store(_store_spec(backend, path, dsn))
    app = create_app(store, token=token, **app_options)
    where = f"{backend}:{path}" if backend == "sqlite" else backend
    auth = "bearer token required" if token else "no token (loopback only)"
    timeouts = f"watchdog every {watchdog_interval_s:g} s" if watchdog_interval_s else "watchdog off"
    url = f"http://{_url_host(host)}:{port}"
    print(f"Agent Lightning store ({where}) serving at {url} — {auth}, {timeouts}", flush=True)

    async def run() -> None:
        watchdog = _start_watchdog(store, watchdog_interval_s)
        try:
            await uvicorn.Server(_uvicorn_config(app, host, port, "info")).serve()
        finally:
            if watchdog is not None:  # before the store closes: a tick must not run on a closed store
                await watchdog.stop()
            await store.close()

    # uvicorn drains on SIGINT/SIGTERM, then re-raises the signal. With the default SIGTERM action that kills the
    # process before the store is closed; as SystemExit it unwinds through the ``finally`` above.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main else None
    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass  # Ctrl-C is the normal way to stop a foreground server
    finally:
        if previous is not None:  # None: not the main thread, or a handler installed outside Python
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


class StoreServer:
    """A store server on a background thread, for tests and embedding: ``with StoreServer(store) as s: s.url``.

    ``store`` may be a factory, called on the server thread: backends holding thread-bound handles (sqlite3
    connections) are then created where they are used. The store is closed on exit when ``close_store`` is true
    (the default for factories). Like :func:`serve_store` it runs the store's watchdog every
    ``watchdog_interval_s`` seconds (0: never) while it serves.
    """

    def __init__(
        self,
        store: LightningStore | Callable[[], LightningStore],
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        close_store: bool | None = None,
        startup_timeout_s: float = 10.0,
        watchdog_interval_s: float = DEFAULT_WATCHDOG_INTERVAL_S,
        **app_options: Any,
    ) -> None:
        """Prepare (not start) a server of ``store``; ``app_options`` go to :func:`create_app`."""
        self._store_or_factory = store
        self.host = host
        self.token = resolve_token(host, token)
        self._close_store = (not isinstance(store, LightningStore)) if close_store is None else close_store
        self._startup_timeout_s = startup_timeout_s
        self.watchdog_interval_s = _check_watchdog_interval(watchdog_interval_s)
        self._watchdog: Watchdog | None = None
        self._app_options = app_options
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.store: LightningStore | None = store if isinstance(store, LightningStore) else None
        self.port = port

    @property
    def watchdog_running(self) -> bool:
        """True while the server's watchdog is ticking."""
        return self._watchdog is not None and self._watchdog.running

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. ``http://127.0.0.1:53411``."""
        if self._thread is None:
            raise RuntimeError("StoreServer is not running; use it as a context manager or call start()")
        return f"http://{_url_host(self.host)}:{self.port}"

    def start(self) -> StoreServer:
        """Bind, start the server thread and wait until it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("StoreServer is already running")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on such sockets, and without it every small
        # answer waits ~40 ms for Nagle + delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host.strip("[]"), self.port))
        self.port = sock.getsockname()[1]  # port 0 -> the ephemeral port the OS chose
        self._socket = sock
        self._thread = threading.Thread(target=self._run, name=f"agl-store-server:{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(self._startup_timeout_s) or self._error is not None:
            self.stop()
            raise RuntimeError(f"store server on {self.host}:{self.port} did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        """Ask the server to finish open requests, stop it and join its thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(); the thread must not die silently
            self._error = exc
            self._ready.set()
            logger.exception("store server thread failed")

    async def _serve(self) -> None:
        store = self._store_or_factory if isinstance(self._store_or_factory, LightningStore) else None
        if store is None:
            factory = self._store_or_factory
            assert callable(factory)
            store = factory()
        self.store = store
        app = create_app(store, token=self.token, **self._app_options)
        server = uvicorn.Server(_uvicorn_config(app, self.host, self.port, "warning"))
        self._server = server
        assert self._socket is not None
        serving = asyncio.ensure_future(server.serve(sockets=[self._socket]))
        self._watchdog = _start_watchdog(store, self.watchdog_interval_s)
        try:
            while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn offers a flag, no event
                await asyncio.sleep(0.005)
            self._ready.set()
            await serving
        finally:
            if self._watchdog is not None:  # before the store closes: a tick must not run on a closed store
                await self._watchdog.stop()
            if self._close_store:
                await store.close()

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
