"""The LightningStore interface: the only contract between agents (runners) and algorithms.

Every backend (in-memory, SQLite, PostgreSQL, and the HTTP client) implements this class and passes the shared
conformance suite in ``tests/core/store/``. Errors: an unknown id raises :class:`NotFoundError`, an illegal state
change raises :class:`IllegalTransitionError`, malformed input raises :class:`ValueError`; each message names the id
and the allowed alternatives. Nothing is partially written when an error is raised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

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


class StoreError(Exception):
    """Base class of store errors whose message explains what to do."""


class NotFoundError(StoreError, ValueError):
    """An id (rollout, attempt, resources) does not exist in the store."""


class IllegalTransitionError(StoreError, ValueError):
    """A status change the state machine does not allow (e.g. succeeded -> running)."""


class StoreStatistics(BaseModel):
    """Counts for dashboards, metrics and benchmarks."""

    rollouts_by_status: dict[str, int] = Field(default_factory=dict)
    attempts_by_status: dict[str, int] = Field(default_factory=dict)
    total_rollouts: int = 0
    total_attempts: int = 0
    total_spans: int = 0
    span_bytes: int = Field(default=0, description="Approximate stored size of all spans, in bytes.")
    total_resources: int = 0


SortOrder = Literal["asc", "desc"]


def check_spans_of_attempt(rollout_id: str, attempt_id: str, spans: Sequence[Span]) -> None:
    """ValueError naming the first stray span ids unless every span belongs to this attempt."""
    strangers = [s.span_id for s in spans if s.rollout_id != rollout_id or s.attempt_id != attempt_id]
    if strangers:
        raise ValueError(
            f"finish_attempt_with_spans({rollout_id}, {attempt_id}) got spans of other attempts "
            f"(span ids {', '.join(strangers[:5])}); send those with add_spans"
        )


class LightningStore(ABC):
    """Async interface of every store backend. See :class:`agentlightning.store.SyncLightningStore` for sync use."""

    # --- rollout queue -------------------------------------------------------------------------------------------
    @abstractmethod
    async def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        """Enqueue rollouts in the given order (one transaction); returns them with ids, status ``queuing``.

        Every write that can act twice takes an ``idempotency_key``: a repeated call with the same key (a retry
        after a lost answer, even across a restart) acts once and returns the first answer. The key is stored with
        the write, in its transaction, and kept for a day; see :mod:`agentlightning.store._keys`.
        """

    async def enqueue_rollout(
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
        """Enqueue one rollout; keyword ``config`` fields (timeout_s, max_attempts, ...) form its RolloutConfig."""
        from agentlightning.types import RolloutConfig

        request = RolloutRequest(
            input=input,
            mode=mode,
            group_id=group_id,
            resources_id=resources_id,
            config=RolloutConfig(**config),
            metadata=dict(metadata or {}),
        )
        return (await self.enqueue_rollouts([request], idempotency_key=idempotency_key))[0]

    @abstractmethod
    async def claim_rollout(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout and create its next attempt (``preparing``).

        ``timeout_s=None`` does not wait (returns None when the queue is empty); a positive value waits up to that
        long for a rollout to become claimable. Two concurrent claimers never get the same rollout.
        """

    @abstractmethod
    async def start_attempt(self, rollout_id: str, attempt_id: str, *, idempotency_key: str | None = None) -> Attempt:
        """Mark a claimed attempt (and its rollout) ``running``."""

    async def claim_and_start(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout and start its new attempt: both come back ``running``.

        What a runner does first with every rollout, as one call (one request over HTTP). Waits like
        :meth:`claim_rollout`. If the attempt stops being startable in between (a cancel, the watchdog), the claim
        stands and the start's IllegalTransitionError is raised: the attempt is already terminal, nothing leaks.
        """
        claimed = await self.claim_rollout(worker_id, timeout_s=timeout_s, idempotency_key=idempotency_key)
        if claimed is None:
            return None
        attempt = await self.start_attempt(
            claimed.rollout.rollout_id, claimed.attempt.attempt_id, idempotency_key=idempotency_key
        )
        # start_attempt changes nothing on the rollout but its status, so the claimed copy is brought up to date.
        return ClaimedRollout(rollout=claimed.rollout.model_copy(update={"status": "running"}), attempt=attempt)

    async def finish_attempt_with_spans(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        spans: Sequence[Span],
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Store an attempt's last spans, then record its terminal status (one request over HTTP).

        Every span must belong to this attempt (ValueError, nothing written, otherwise). The spans are stored
        first, so whoever sees the rollout finish can read all of them; they stay stored when the finish is
        refused (IllegalTransitionError), exactly as ``add_spans`` then ``finish_attempt`` would leave them.
        """
        check_spans_of_attempt(rollout_id, attempt_id, spans)
        if spans:
            await self.add_spans(spans)
        return await self.finish_attempt(rollout_id, attempt_id, status, error=error, idempotency_key=idempotency_key)

    @abstractmethod
    async def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Record an attempt's terminal status and move the rollout accordingly.

        ``succeeded`` -> rollout succeeded. Any failure -> rollout ``requeuing`` when the status is in the rollout's
        ``retry_on`` and attempts remain, else ``failed``. A superseded attempt (not the rollout's latest) or an
        already-terminal attempt is not changed: IllegalTransitionError, nothing written.
        """

    @abstractmethod
    async def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        """Cancel a non-terminal rollout: it is no longer claimable and its live attempt stops counting."""

    @abstractmethod
    async def update_rollout_metadata(self, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
        """Merge keys into a rollout's metadata."""

    @abstractmethod
    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Prove an attempt is alive (spans do this too)."""

    # --- spans ---------------------------------------------------------------------------------------------------
    @abstractmethod
    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans (one transaction) and return them with their ``sequence_id``.

        Idempotent on ``(rollout_id, attempt_id, span_id)``: a span already stored is returned as stored, not
        duplicated. Every span must name an existing attempt; a span counts as a heartbeat for its attempt. A float
        that is NaN or ±Infinity (in attributes, events, links or resource) is refused with a ValueError naming the
        span and attribute: spans are kept as JSON, which has no such numbers.
        """

    @abstractmethod
    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Spans of a rollout ordered by (attempt sequence, span sequence_id); ``"latest"`` = newest attempt only.

        A stored span that no longer validates (written by an older version or other software) is left out with a
        warning naming it, so the rest of the rollout stays readable.
        """

    # --- queries -------------------------------------------------------------------------------------------------
    @abstractmethod
    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; NotFoundError if unknown."""

    @abstractmethod
    async def query_rollouts(
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
        """Rollouts matching all given filters, ordered by enqueue order."""

    @abstractmethod
    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, oldest first; NotFoundError if the rollout is unknown."""

    @abstractmethod
    async def wait_for_rollouts(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Wait until every given rollout is terminal or the timeout passes; returns those that are terminal."""

    # --- resources -----------------------------------------------------------------------------------------------
    @abstractmethod
    async def add_resources(
        self, resources: Mapping[str, Resource], *, idempotency_key: str | None = None
    ) -> ResourcesSnapshot:
        """Store a new immutable snapshot; it becomes the latest."""

    @abstractmethod
    async def get_resources(self, resources_id: str | None = None) -> ResourcesSnapshot | None:
        """A snapshot by id (NotFoundError if unknown), or the latest when id is None (None if there is none)."""

    @abstractmethod
    async def list_resources(self) -> list[ResourcesSnapshot]:
        """All snapshots, oldest first."""

    # --- algorithm metrics ---------------------------------------------------------------------------------------
    @abstractmethod
    async def add_metrics(self, records: Sequence[MetricsRecord]) -> None:
        """Store per-step metrics of training runs (one transaction); idempotent on ``(run_id, step)``.

        A record of a ``(run_id, step)`` already stored replaces it (a resumed run logs its step again), so a retry
        acts once with no idempotency key. Refused with a ValueError naming the record, nothing written: a value
        that is NaN or ±Infinity (stored as JSON, which has none), and two records of one ``(run_id, step)`` in
        one batch.
        """

    @abstractmethod
    async def query_metrics(
        self, run_id: str | None = None, *, after_step: int | None = None, limit: int | None = None
    ) -> list[MetricsRecord]:
        """Metrics records ordered by ``(run_id, step)``: of one run, or of every run when ``run_id`` is None.

        ``after_step`` keeps steps greater than it (page through a run with the last step read); ``limit`` caps
        the answer. An unknown run has no records: the answer is empty, not an error.
        """

    @abstractmethod
    async def list_metric_runs(self) -> list[MetricsRun]:
        """Every run with metrics, the most recently written first (ties by run id)."""

    # --- operations ----------------------------------------------------------------------------------------------
    @abstractmethod
    async def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        """Watchdog tick: mark attempts past timeout_s as ``timeout`` and silent ones as ``unresponsive``.

        Returns the attempts it changed. ``now`` (ns) defaults to the store clock; tests pass a fake time.
        """

    @abstractmethod
    async def statistics(self) -> StoreStatistics:
        """Counts per status, spans and bytes."""

    async def close(self) -> None:
        """Release connections and background tasks."""
        return None
