"""Watchdog: an asyncio task that calls :meth:`LightningStore.check_timeouts` periodically.

The store server runs one for its whole life (``agl store --watchdog-interval``), so timeouts hold with no trainer
running; the trainer's algorithm side runs another. Any number of watchdogs may watch one database: each tick is
one call of the store's own atomic ``check_timeouts``, which reads the live attempts and ends them inside one write
transaction (SQLite: ``BEGIN IMMEDIATE``, the database's single write lock; PostgreSQL: the rollouts' row locks,
``FOR UPDATE SKIP LOCKED``, and the attempts read again after locking). A watchdog that comes second finds the
attempt already ended, so every attempt is marked once and its rollout requeued or failed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from agentlightning.store.base import LightningStore

logger = logging.getLogger(__name__)


class Watchdog:
    """Marks timed-out and silent attempts of a store every ``interval_s`` seconds (requeueing per config).

    Use ``async with Watchdog(store):`` or ``start()`` / ``await stop()``. A failing tick is logged, not raised, so
    one bad moment (a locked database, a network blip to a remote store) does not stop later ticks.
    """

    def __init__(self, store: LightningStore, interval_s: float = 1.0) -> None:
        """Watch ``store``; ``interval_s`` is the pause between ticks."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds; got {interval_s}")
        self.store = store
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True while the background task is alive."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start ticking on the running event loop; starting twice is a no-op."""
        if self.running:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="agentlightning-store-watchdog")

    async def stop(self) -> None:
        """Stop ticking and wait for the task to end; stopping twice is a no-op."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def tick(self) -> int:
        """Run one check now; returns how many attempts it changed."""
        changed = await self.store.check_timeouts()
        for attempt in changed:
            logger.info("attempt %s of rollout %s marked %s", attempt.attempt_id, attempt.rollout_id, attempt.status)
        return len(changed)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # keep watching: the next tick may succeed
                logger.exception("store watchdog tick failed; retrying in %.1f s", self.interval_s)
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> Watchdog:
        """Start ticking."""
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop ticking."""
        await self.stop()
