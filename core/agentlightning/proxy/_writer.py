"""Batched, retried delivery of proxy spans to the store: concurrent calls share one write."""

from __future__ import annotations

import asyncio
import logging

from agentlightning.store.base import LightningStore, StoreError
from agentlightning.types import Span

logger = logging.getLogger(__name__)


class SpanWriter:
    """Queues spans and writes them to the store in batches from one background task of the serving loop.

    A batch the store rejects as a whole (a span naming an attempt that no longer exists) is retried span by span
    so one bad span does not take the others with it. Connection-type failures are retried with backoff, then the
    spans are dropped with a counted warning: a store outage must not grow memory without bound.
    """

    def __init__(self, store: LightningStore, *, batch_size: int = 256, max_retries: int = 5) -> None:
        self._store = store
        self._batch_size = batch_size
        self._max_retries = max_retries
        self._pending: list[Span] = []
        # Futures of callers waiting for their span to be stored, keyed by id(span); resolved once its batch is done.
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._busy = False
        self._wakeup: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        """Spans queued and not yet written or dropped."""
        return len(self._pending)

    def submit(self, span: Span) -> None:
        """Queue one span; never blocks and never raises (safe in ``finally`` blocks of cancelled requests)."""
        self._pending.append(span)
        if self._wakeup is None or self._drained is None or self._task is None or self._task.done():
            self._wakeup, self._drained = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="agentlightning-proxy-spans")
        self._drained.clear()
        self._wakeup.set()

    async def write(self, span: Span) -> None:
        """Queue one span and wait until it is stored (or dropped); concurrent callers share one batch."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[id(span)] = future
        self.submit(span)
        await asyncio.shield(future)

    async def flush(self) -> None:
        """Wait until every queued span has been written (or dropped)."""
        while (self._pending or self._busy) and self._drained is not None:
            if self._task is None or self._task.done():
                await self._write_pending()  # the loop that owned the task is gone; write from here
                break
            await self._drained.wait()

    async def aclose(self) -> None:
        """Flush, then stop the background task."""
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        assert self._wakeup is not None and self._drained is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self._write_pending()
            if not self._pending:
                self._drained.set()

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self._batch_size], self._pending[self._batch_size :]
            self._busy = True
            try:
                await self._write(batch)
            finally:
                self._busy = False
                if self._waiters:
                    for span in batch:
                        future = self._waiters.pop(id(span), None)
                        if future is not None and not future.done():
                            future.set_result(None)

    async def _write(self, batch: list[Span]) -> None:
        for attempt in range(self._max_retries + 1):
            try:
                await self._store.add_spans(batch)
                self.written += len(batch)
                return
            except (StoreError, ValueError) as exc:
                if len(batch) == 1:
                    self._drop(batch, f"the store rejected it: {exc}")
                    return
                for span in batch:  # isolate the bad span; the others are fine
                    await self._write([span])
                return
            except Exception as exc:  # store unreachable or failing: back off and retry
                if attempt == self._max_retries:
                    self._drop(batch, f"the store failed {attempt + 1} times, last with {exc!r}")
                    return
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))

    def _drop(self, batch: list[Span], why: str) -> None:
        self.dropped += len(batch)
        first = batch[0]
        # ERROR: each dropped span is a training sample lost for good (also counted in the proxy's /metrics).
        logger.error(
            "LLM proxy dropped %d span(s) (rollout %s, attempt %s) because %s; %d dropped so far",
            len(batch),
            first.rollout_id,
            first.attempt_id,
            why,
            self.dropped,
        )
