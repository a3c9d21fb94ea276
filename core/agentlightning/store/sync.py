"""SyncLightningStore: the same operations as :class:`LightningStore`, blocking, for plain threads and scripts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

from agentlightning._loops import run_forever_then_close
from agentlightning.store.base import LightningStore, SortOrder, StoreStatistics
from agentlightning.types import (
    Attempt,
    AttemptStatus,
    ClaimedRollout,
    MetricsRecord,
    MetricsRun,
    Resource,
    ResourcesSnapshot,
    Rollout,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
    Span,
)

T = TypeVar("T")


class SyncLightningStore:
    """A blocking facade over any async store, callable from any number of threads.

    Calls run on one private event loop in a daemon thread, so a store bound to a loop (such as an HTTP client) is
    always used from the same loop. Do not call it from a coroutine running on the store's own loop; from any other
    thread, including one running its own event loop, it is fine (that loop blocks for the call).
    """

    def __init__(self, store: LightningStore) -> None:
        """Wrap ``store``; its loop thread starts on the first call."""
        self.store = store
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=run_forever_then_close, args=(loop,), name="agentlightning-sync-store", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "SyncLightningStore was called from its own event loop thread and would deadlock; "
                "await the async store (SyncLightningStore.store) there instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # --- rollout queue -------------------------------------------------------------------------------------------
    def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        """Enqueue rollouts in the given order; returns them in ``queuing``."""
        return self._call(self.store.enqueue_rollouts(requests, idempotency_key=idempotency_key))

    def enqueue_rollout(
        self,
        input: Any,
        *,
        mode: RolloutMode | None = None,
        group_id: str | None = None,
        resources_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **config: Any,
    ) -> Rollout:
        """Enqueue one rollout; keyword ``config`` fields form its RolloutConfig."""
        return self._call(
            self.store.enqueue_rollout(
                input,
                mode=mode,
                group_id=group_id,
                resources_id=resources_id,
                metadata=metadata,
                idempotency_key=idempotency_key,
                **config,
            )
        )

    def claim_rollout(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout, waiting up to ``timeout_s``."""
        return self._call(self.store.claim_rollout(worker_id, timeout_s=timeout_s, idempotency_key=idempotency_key))

    def start_attempt(self, rollout_id: str, attempt_id: str, *, idempotency_key: str | None = None) -> Attempt:
        """Mark a claimed attempt ``running``."""
        return self._call(self.store.start_attempt(rollout_id, attempt_id, idempotency_key=idempotency_key))

    def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Record an attempt's terminal status."""
        return self._call(
            self.store.finish_attempt(rollout_id, attempt_id, status, error=error, idempotency_key=idempotency_key)
        )

    def claim_and_start(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout and start its attempt, waiting up to ``timeout_s``."""
        return self._call(self.store.claim_and_start(worker_id, timeout_s=timeout_s, idempotency_key=idempotency_key))

    def finish_attempt_with_spans(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        spans: Sequence[Span],
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Store an attempt's last spans, then record its terminal status."""
        return self._call(
            self.store.finish_attempt_with_spans(
                rollout_id, attempt_id, status, spans, error=error, idempotency_key=idempotency_key
            )
        )

    def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        """Cancel a non-terminal rollout."""
        return self._call(self.store.cancel_rollout(rollout_id, idempotency_key=idempotency_key))

    def update_rollout_metadata(self, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
        """Merge keys into a rollout's metadata."""
        return self._call(self.store.update_rollout_metadata(rollout_id, metadata))

    def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Prove an attempt is alive."""
        return self._call(self.store.heartbeat(rollout_id, attempt_id))

    # --- spans ---------------------------------------------------------------------------------------------------
    def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans idempotently; returns them with sequence ids."""
        return self._call(self.store.add_spans(spans))

    def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Spans of a rollout in (attempt, sequence_id) order."""
        return self._call(
            self.store.query_spans(
                rollout_id, attempt_id, name=name, after_sequence_id=after_sequence_id, limit=limit, offset=offset
            )
        )

    # --- queries -------------------------------------------------------------------------------------------------
    def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout."""
        return self._call(self.store.get_rollout(rollout_id))

    def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        mode: RolloutMode | None = None,
        rollout_ids: Sequence[str] | None = None,
        group_id: str | None = None,
        sort: SortOrder = "asc",
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts matching every given filter, in enqueue order."""
        return self._call(
            self.store.query_rollouts(
                status=status,
                mode=mode,
                rollout_ids=rollout_ids,
                group_id=group_id,
                sort=sort,
                limit=limit,
                offset=offset,
            )
        )

    def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, oldest first."""
        return self._call(self.store.query_attempts(rollout_id))

    def wait_for_rollouts(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Block until the rollouts are terminal or the timeout passes; returns the terminal ones."""
        return self._call(self.store.wait_for_rollouts(rollout_ids, timeout_s=timeout_s))

    # --- resources -----------------------------------------------------------------------------------------------
    def add_resources(
        self, resources: Mapping[str, Resource], *, idempotency_key: str | None = None
    ) -> ResourcesSnapshot:
        """Store a new immutable snapshot."""
        return self._call(self.store.add_resources(resources, idempotency_key=idempotency_key))

    def get_resources(self, resources_id: str | None = None) -> ResourcesSnapshot | None:
        """A snapshot by id, or the latest."""
        return self._call(self.store.get_resources(resources_id))

    def list_resources(self) -> list[ResourcesSnapshot]:
        """All snapshots, oldest first."""
        return self._call(self.store.list_resources())

    # --- algorithm metrics ---------------------------------------------------------------------------------------
    def add_metrics(self, records: Sequence[MetricsRecord]) -> None:
        """Store per-step metrics, replacing records of the same ``(run_id, step)``."""
        self._call(self.store.add_metrics(records))

    def query_metrics(
        self, run_id: str | None = None, *, after_step: int | None = None, limit: int | None = None
    ) -> list[MetricsRecord]:
        """Metrics records in ``(run_id, step)`` order."""
        return self._call(self.store.query_metrics(run_id, after_step=after_step, limit=limit))

    def list_metric_runs(self) -> list[MetricsRun]:
        """Every run with metrics, the most recently written first."""
        return self._call(self.store.list_metric_runs())

    # --- operations ----------------------------------------------------------------------------------------------
    def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        """Watchdog tick."""
        return self._call(self.store.check_timeouts(now))

    def statistics(self) -> StoreStatistics:
        """Counts per status, spans and bytes."""
        return self._call(self.store.statistics())

    def close(self) -> None:
        """Close the store and stop the loop thread; closing twice is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self.store.close())
        finally:
            with self._lock:
                loop, thread = self._loop, self._thread
                self._loop = self._thread = None
            if loop is not None and thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join()  # the thread closes the loop, cancelling what the store left running on it

    def __enter__(self) -> SyncLightningStore:
        """Use as a context manager that closes on exit."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the store."""
        self.close()
