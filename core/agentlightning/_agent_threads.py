"""Daemon threads for sync agents, reused across rollouts.

Not ``asyncio.to_thread`` or a ``ThreadPoolExecutor``: their threads are joined at interpreter exit, so one agent
hanging past its timeout would keep a stopped runner process alive forever. Not a fresh thread per rollout either:
``Thread.start`` holds the event loop while the OS creates the thread and then until the new thread first gets the
GIL, which a busy runner process (192 agents) hands out every 5 ms at best. ``bench/agent_threads.py`` compares the
three with 192 sync agents at once (2026-12-06: 2.68x the calls/s of a fresh thread per call at 0.39x its CPU per
call and a fifth of its event-loop lag; 1.22x the executor's calls/s).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

_Job = Callable[[], object]  # its result is dropped


class DaemonThreads:
    """An unbounded pool of daemon threads: a job runs on an idle thread, or on a new one when none is idle.

    A thread idle for ``idle_s`` exits, so a process that once ran 192 agents at once does not keep 192 threads.
    A hung job keeps its thread and never holds up the next job (the pool only grows).
    """

    def __init__(self, idle_s: float = 30.0, name: str = "agl-agent") -> None:
        if idle_s <= 0:
            raise ValueError(f"idle_s must be positive; got {idle_s}")
        self.idle_s = idle_s
        self.name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Threads waiting for a job that no submit has counted on yet. A submit that takes one of them puts exactly
        # one job for it; a thread that times out leaves only if it can take itself out of this count first.
        self._idle = 0
        self._threads = 0

    @property
    def threads(self) -> int:
        """Threads alive in the pool (busy or idle)."""
        return self._threads

    def submit(self, job: _Job) -> None:
        """Run ``job`` on a pooled daemon thread; returns at once. ``job`` must not raise (it is not awaited)."""
        with self._lock:
            spawn = self._idle == 0
            if spawn:
                self._threads += 1
            else:
                self._idle -= 1
        if spawn:
            # Started before its job is queued: a thread that cannot be started leaves no job behind for which no
            # thread is counted (the new thread waits for a job without a timeout).
            try:
                threading.Thread(target=self._serve, name=self.name, daemon=True).start()
            except BaseException:
                with self._lock:
                    self._threads -= 1
                raise
        self._jobs.put(job)

    def _serve(self) -> None:
        owed = True  # a submit put a job for this thread
        while True:
            try:
                job = self._jobs.get(timeout=None if owed else self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody counted on this thread: leave
                        self._idle -= 1
                        self._threads -= 1
                        return
                owed = True  # a submit took this thread's place in the count as it timed out: its job is coming
                continue
            try:
                job()
            except BaseException:  # a job's own error is its caller's business; the thread must stay usable
                logger.exception("agent thread job raised")
            with self._lock:
                self._idle += 1
            owed = False


_pool = DaemonThreads()


async def call_in_thread(function: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Await ``function(*args, **kwargs)`` run on a pooled daemon thread in the caller's context (rollout context
    included)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if future.done():  # timed out and cancelled meanwhile
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def job() -> None:
        try:
            outcome: tuple[bool, Any] = (True, context.run(function, *args, **kwargs))
        except BaseException as exc:  # handed to the awaiting worker, which records it on the attempt
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is gone: the attempt timed out long ago and nobody waits for this result
            logger.debug("agent %r returned after its runner's event loop closed", function)

    _pool.submit(job)
    return await future
