"""Connection pools for :class:`~agentlightning.store.postgres.PostgresLightningStore` across event loops.

psycopg's async connections and pool belong to the event loop that opened them, but a store must serve every
thread and loop of a process (the conformance suite claims from six threads, each with its own loop). So the first
loop that uses the store (the server's, in ``agl store``) gets the pool — no hop on the hot path — and calls from
any other loop run on a private loop thread with a pool of its own.

psycopg_pool's maintenance workers do not stop when cancelled in the middle of a task: it counts a CancelledError
raised inside a connect as a failed connect (logs "error connecting", schedules a retry) and the worker goes back to
waiting for work. A pool opened on a loop that is then closed by cancelling its tasks (``asyncio.run``, a span
sink's loop closed by ``agentlightning._loops.close_loop``) while it is still connecting in the background (a fresh
pool always opens a second connection for the client waiting on the first; under load that one is often still in
flight when the work is done) therefore held that close: forever in ``asyncio.run``, ``CANCEL_WAIT_S`` in
``close_loop``, which then left the worker pending ("Event loop is closed" when it was garbage-collected).
:class:`_Pool` makes its workers stop when cancelled, and its ``close`` cancels them instead of waiting for a
connect in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.pool_async import MaintenanceTask, StopWorker

from agentlightning._loops import run_forever_then_close
from agentlightning.store.base import StoreError

T = TypeVar("T")
Work = Callable[[AsyncConnection[Any]], Awaitable[T]]
_CLOSE_WAIT_S = 5.0
logger = logging.getLogger(__name__)
_WORKERS: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()  # the running tasks of _Pool.worker


class _WorkerCancelled(BaseException):
    """A pool worker's connect was cancelled; not a CancelledError, which psycopg_pool catches and logs there."""


class _Pool(AsyncConnectionPool[AsyncConnection[Any]]):
    """psycopg_pool's pool, with maintenance workers that stop when cancelled, and a close that cancels them."""

    @classmethod
    async def worker(cls, q: asyncio.Queue[MaintenanceTask]) -> None:
        """psycopg_pool's worker loop, except that a cancellation ends it, even one arriving inside a task.

        It returns rather than raising, so that the pool's own ``close`` (which gathers its workers) still closes the
        pooled connections after :meth:`close` cancelled them.
        """
        current = asyncio.current_task()
        if current is not None:
            _WORKERS.add(current)
        while True:
            try:
                task = await q.get()
            except asyncio.CancelledError:
                return
            if isinstance(task, StopWorker):
                return
            try:
                await task.run()
            except _WorkerCancelled:
                return
            except (Exception, asyncio.CancelledError) as exc:
                if _cancelling(current):
                    return
                logger.warning("task run %s failed: %s: %s", task, type(exc).__name__, exc)
            if _cancelling(current):
                return  # the task caught the CancelledError itself

    async def _connect(self, timeout: float | None = None) -> AsyncConnection[Any]:  # noqa: ASYNC109 (psycopg's)
        try:
            return await super()._connect(timeout)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current in _WORKERS and _cancelling(current):
                raise _WorkerCancelled from None  # past psycopg_pool's "error connecting" and its retry
            raise

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 (psycopg_pool's signature)
        """Close the pool without waiting for a connect in flight: its workers are cancelled (idle ones too)."""
        if not self.closed:
            for worker in self._workers:
                worker.cancel()
        await super().close(timeout)


def _cancelling(task: asyncio.Task[Any] | None) -> bool:
    return task is not None and task.cancelling() > 0


class LoopPools:
    """A pool on the first loop that calls :meth:`run` ("home"), and one on a private thread for other loops."""

    def __init__(self, dsn: str, *, min_size: int, max_size: int, connect_timeout_s: float, name: str) -> None:
        self._dsn = dsn
        self._min_size = min_size
        self._max_size = max_size
        self._timeout_s = connect_timeout_s
        self._name = name
        self._lock = threading.Lock()
        self._closed = False
        self._home: asyncio.AbstractEventLoop | None = None
        self._home_pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._private: asyncio.AbstractEventLoop | None = None
        self._private_thread: threading.Thread | None = None
        self._private_pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None

    def _new_pool(self, min_size: int) -> AsyncConnectionPool[AsyncConnection[Any]]:
        return _Pool(
            self._dsn,
            min_size=min_size,
            max_size=max(min_size, self._max_size),
            timeout=self._timeout_s,
            kwargs={"autocommit": True},
            open=False,
            name=self._name,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"PostgresLightningStore ({self._name}) is closed; open a new one")

    def _pool_for(self, loop: asyncio.AbstractEventLoop) -> AsyncConnectionPool[AsyncConnection[Any]] | None:
        """The home pool when ``loop`` is (or becomes) home; None for other loops."""
        with self._lock:
            self._check_open()
            if self._home is not None and self._home.is_closed():
                # Its loop is gone (the first user was a short asyncio.run): the next loop becomes home. The old
                # pool's connections are closed when it is garbage-collected.
                self._home, self._home_pool = None, None
            if self._home is None:
                self._home, self._home_pool = loop, self._new_pool(self._min_size)
            return self._home_pool if loop is self._home else None

    async def run(self, work: Work[T]) -> T:
        """Run ``work`` with a pooled connection (autocommit; open a transaction inside when needed)."""
        loop = asyncio.get_running_loop()
        pool = self._pool_for(loop)
        if pool is not None:
            return await _with_connection(pool, work)
        private = self._private_loop()
        future = asyncio.run_coroutine_threadsafe(self._run_private(work), private)
        return await asyncio.wrap_future(future)

    def _private_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            self._check_open()
            if self._private is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=run_forever_then_close, args=(loop,), name=f"agl-postgres:{self._name}", daemon=True
                )
                thread.start()
                self._private, self._private_thread = loop, thread
                self._private_pool = self._new_pool(1)
            return self._private

    async def _run_private(self, work: Work[T]) -> T:
        assert self._private_pool is not None
        return await _with_connection(self._private_pool, work)

    async def close(self) -> None:
        """Close both pools and stop the private thread; closing twice is a no-op."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            home, home_pool = self._home, self._home_pool
            private, thread, private_pool = self._private, self._private_thread, self._private_pool
        current = asyncio.get_running_loop()
        if home is not None and home_pool is not None:
            if home is current:
                await home_pool.close()
            elif home.is_running():
                # Closed from another loop: ask the home loop, but never hang on one that is blocked right now.
                future = asyncio.run_coroutine_threadsafe(home_pool.close(), home)
                with contextlib.suppress(concurrent.futures.TimeoutError, TimeoutError):
                    await asyncio.wait_for(asyncio.wrap_future(future), _CLOSE_WAIT_S)
            # A home loop that is not running (a sink thread's loop between exports) would never take the request;
            # its pool's tasks are cancelled when that loop is closed (asyncio.run, agentlightning._loops).
        if private is not None and thread is not None and private_pool is not None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(private_pool.close(), private))
            private.call_soon_threadsafe(private.stop)
            await asyncio.to_thread(thread.join)  # the thread closes the loop as asyncio.run would


async def _with_connection(pool: AsyncConnectionPool[AsyncConnection[Any]], work: Work[T]) -> T:
    if pool.closed:
        await pool.open()  # opening an open pool is a no-op; the first caller starts its connection workers
    async with pool.connection() as conn:
        return await work(conn)
