"""InMemoryLightningStore: the fastest backend, for tests and single-process runs (nothing survives the process)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from agentlightning.store._keys import KEY_TTL_NS, KeyedOp, check_key, decode, encode, scoped
from agentlightning.store._metrics import checked_query, checked_records, record_from_row
from agentlightning.store._statemachine import (
    CLAIMABLE,
    LIVE_ATTEMPT,
    ChangeNotifier,
    attempt_not_found,
    new_id,
    op_cancel,
    op_check_timeouts,
    op_claim,
    op_enqueue,
    op_finish,
    op_heartbeat,
    op_start,
    op_update_metadata,
    replace,
    rollout_not_found,
    span_attempt_keys,
    span_attempt_not_found,
    span_with_sequence_id,
    wait_until,
)
from agentlightning.store.base import LightningStore, NotFoundError, SortOrder, StoreStatistics
from agentlightning.types import (
    ROLLOUT_TERMINAL,
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


class _AttemptSpans:
    """Spans of one attempt: by span_id for idempotence, and in sequence order for queries."""

    __slots__ = ("by_id", "ordered")

    def __init__(self) -> None:
        self.by_id: dict[str, Span] = {}
        self.ordered: list[Span] = []


class _MemoryTxn:
    """All rows of the memory store, offered to the shared state machine; callers hold the store lock."""

    def __init__(self) -> None:
        self.rollouts: dict[str, Rollout] = {}
        self.enqueue_index: dict[str, int] = {}
        self.attempts: dict[str, list[Attempt]] = {}
        self.claimable: dict[str, None] = {}  # ordered by enqueue order once sorted
        self.claimable_sorted = True
        self.live: dict[tuple[str, str], None] = {}
        self.resources: dict[str, ResourcesSnapshot] = {}

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        return self.rollouts.get(rollout_id)

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        for rollout in rollouts:
            self.rollouts[rollout.rollout_id] = rollout
            self.enqueue_index[rollout.rollout_id] = len(self.enqueue_index)
            self.attempts[rollout.rollout_id] = []
            self.claimable[rollout.rollout_id] = None

    def update_rollout(self, rollout: Rollout) -> None:
        self.rollouts[rollout.rollout_id] = rollout
        if rollout.status in CLAIMABLE:
            # A requeued rollout keeps its enqueue position: claim order is enqueue order.
            self.claimable[rollout.rollout_id] = None
            self.claimable_sorted = False
        else:
            self.claimable.pop(rollout.rollout_id, None)

    def first_claimable(self) -> Rollout | None:
        if not self.claimable_sorted:
            self.claimable = dict.fromkeys(sorted(self.claimable, key=self.enqueue_index.__getitem__))
            self.claimable_sorted = True
        for rollout_id in self.claimable:
            return self.rollouts[rollout_id]
        return None

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        for attempt in reversed(self.attempts.get(rollout_id, ())):
            if attempt.attempt_id == attempt_id:
                return attempt
        return None

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        return list(self.attempts.get(rollout_id, ()))

    def insert_attempt(self, attempt: Attempt) -> None:
        self.attempts[attempt.rollout_id].append(attempt)
        self.live[(attempt.rollout_id, attempt.attempt_id)] = None

    def update_attempt(self, attempt: Attempt) -> None:
        self.attempts[attempt.rollout_id][attempt.sequence_id - 1] = attempt
        if attempt.status not in LIVE_ATTEMPT:
            self.live.pop((attempt.rollout_id, attempt.attempt_id), None)

    def live_attempts(self) -> list[Attempt]:
        return [a for rid, aid in self.live for a in self.attempts[rid] if a.attempt_id == aid]

    def resources_exist(self, resources_id: str) -> bool:
        return resources_id in self.resources

    def latest_resources_id(self) -> str | None:
        return next(reversed(self.resources), None)


class InMemoryLightningStore(LightningStore):
    """A LightningStore in process memory, safe for many threads and event loops (one lock guards all state).

    Stored spans share their nested containers (attributes, events) with the caller's objects, which keeps ingest
    fast: do not mutate a span after handing it to :meth:`add_spans`.
    """

    def __init__(self, *, clock: Callable[[], int] | None = None) -> None:
        """Create an empty store; ``clock`` returns nanoseconds since the epoch (tests pass a fake one)."""
        self._clock: Callable[[], int] = clock or time.time_ns
        self._lock = threading.Lock()
        self._notifier = ChangeNotifier()
        self._txn = _MemoryTxn()
        self._rollouts = self._txn.rollouts
        self._attempts = self._txn.attempts
        self._spans: dict[tuple[str, str], _AttemptSpans] = {}
        self._all_spans: list[Span] = []
        self._measured_spans = 0
        self._span_bytes = 0
        self._resources = self._txn.resources
        self._keys: dict[str, tuple[int, bytes]] = {}  # scoped idempotency key -> (time, answer), oldest first
        self._metrics: dict[str, dict[int, MetricsRecord]] = {}  # run_id -> step -> record

    def _keyed(self, op: KeyedOp, key: str | None, now: int, write: Callable[[], T]) -> T:
        """``write()`` once per key (the caller holds the lock); a repeated key gets the first answer back."""
        if key is None:
            return write()
        check_key(key)
        stored = self._keys.get(scoped(op, key))
        if stored is not None:
            answer: T = decode(op, stored[1])
            return answer
        result = write()
        if result is not None:  # a claim that found nothing wrote nothing: its retry may claim
            self._keys[scoped(op, key)] = (now, encode(op, result))
        while self._keys:
            oldest = next(iter(self._keys))
            if self._keys[oldest][0] >= now - KEY_TTL_NS:
                break
            del self._keys[oldest]
        return result

    # --- rollout queue -------------------------------------------------------------------------------------------
    async def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        """Enqueue rollouts in order, all or none; returns them in ``queuing``."""
        with self._lock:
            now = self._clock()
            rollouts = self._keyed("enqueue", idempotency_key, now, lambda: op_enqueue(self._txn, requests, now))
        self._notifier.notify()
        return [replace(r) for r in rollouts]

    def _claim_now(self, worker_id: str | None, start: bool, key: str | None) -> ClaimedRollout | None:
        with self._lock:
            now = self._clock()
            claimed = self._keyed("claim", key, now, lambda: op_claim(self._txn, worker_id, now, start=start))
        return claimed

    async def _claim(
        self, worker_id: str | None, timeout_s: float | None, start: bool, key: str | None
    ) -> ClaimedRollout | None:
        if timeout_s is None:
            return self._claim_now(worker_id, start, key)
        result: ClaimedRollout | None = await wait_until(
            self._notifier, lambda: self._claim_now(worker_id, start, key), timeout_s, time.monotonic, timeout_s
        )
        return result

    async def claim_rollout(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout, waiting up to ``timeout_s`` for one."""
        return await self._claim(worker_id, timeout_s, False, idempotency_key)

    async def claim_and_start(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout and start its attempt in one step (both come back ``running``)."""
        return await self._claim(worker_id, timeout_s, True, idempotency_key)

    async def start_attempt(self, rollout_id: str, attempt_id: str, *, idempotency_key: str | None = None) -> Attempt:
        """Mark a claimed attempt and its rollout ``running``."""
        with self._lock:
            now = self._clock()
            return self._keyed("start", idempotency_key, now, lambda: op_start(self._txn, rollout_id, attempt_id, now))

    async def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Record the attempt's terminal status; the rollout succeeds, is requeued, or fails."""
        with self._lock:
            now = self._clock()
            attempt = self._keyed(
                "finish",
                idempotency_key,
                now,
                lambda: op_finish(self._txn, rollout_id, attempt_id, status, error, now),
            )
        self._notifier.notify()
        return attempt

    async def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        """Cancel a non-terminal rollout so it is never claimed again."""
        with self._lock:
            now = self._clock()
            rollout = self._keyed("cancel", idempotency_key, now, lambda: op_cancel(self._txn, rollout_id, now))
        self._notifier.notify()
        return replace(rollout)

    async def update_rollout_metadata(self, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
        """Merge keys into a rollout's metadata."""
        with self._lock:
            return replace(op_update_metadata(self._txn, rollout_id, metadata))

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record that a live attempt is alive."""
        with self._lock:
            return op_heartbeat(self._txn, rollout_id, attempt_id, self._clock())

    # --- spans ---------------------------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans idempotently with per-attempt sequence ids; all or none."""
        keys = span_attempt_keys(spans)
        with self._lock:
            now = self._clock()
            attempts: dict[tuple[str, str], Attempt] = {}
            for rollout_id, attempt_id in keys:
                attempt = self._txn.get_attempt(rollout_id, attempt_id)
                if attempt is None:
                    raise span_attempt_not_found(self._txn, rollout_id, attempt_id)
                attempts[(rollout_id, attempt_id)] = attempt
            stored: list[Span] = []
            for span in spans:
                key = (span.rollout_id, span.attempt_id)
                bucket = self._spans.get(key)
                if bucket is None:
                    bucket = self._spans[key] = _AttemptSpans()
                existing = bucket.by_id.get(span.span_id)
                if existing is None:
                    existing = span_with_sequence_id(span, len(bucket.ordered) + 1)
                    bucket.by_id[span.span_id] = existing
                    bucket.ordered.append(existing)
                    self._all_spans.append(existing)
                stored.append(existing)
            for attempt in attempts.values():
                # A span proves life only for its own attempt; a superseded (terminal) one changes nothing.
                if attempt.status in LIVE_ATTEMPT:
                    self._txn.update_attempt(replace(attempt, last_heartbeat_time=now))
        return stored

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
        """Spans of a rollout in (attempt, sequence_id) order, filtered and paged."""
        with self._lock:
            attempts = self._attempts.get(rollout_id)
            if attempts is None:
                raise rollout_not_found(rollout_id)
            if attempt_id == "latest":
                chosen = attempts[-1:]
            elif attempt_id is None:
                chosen = list(attempts)
            else:
                chosen = [a for a in attempts if a.attempt_id == attempt_id]
                if not chosen:
                    raise attempt_not_found(rollout_id, attempt_id, (a.attempt_id for a in attempts))
            result: list[Span] = []
            for attempt in chosen:
                bucket = self._spans.get((rollout_id, attempt.attempt_id))
                if bucket is None:
                    continue
                result.extend(s for s in bucket.ordered[after_sequence_id:] if name is None or s.name == name)
        end = None if limit is None else offset + limit
        return result[offset:end]

    # --- queries -------------------------------------------------------------------------------------------------
    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; NotFoundError if unknown."""
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise rollout_not_found(rollout_id)
        return replace(rollout)

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
        """Rollouts matching every given filter, in enqueue order (or reversed)."""
        statuses = None if status is None else frozenset(status)
        wanted = None if rollout_ids is None else frozenset(rollout_ids)
        with self._lock:
            rollouts = list(self._rollouts.values())
        if sort == "desc":
            rollouts.reverse()
        matched = [
            r
            for r in rollouts
            if (statuses is None or r.status in statuses)
            and (mode is None or r.mode == mode)
            and (wanted is None or r.rollout_id in wanted)
            and (group_id is None or r.group_id == group_id)
        ]
        end = None if limit is None else offset + limit
        return [replace(r) for r in matched[offset:end]]

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, oldest first."""
        with self._lock:
            attempts = self._attempts.get(rollout_id)
            if attempts is None:
                raise rollout_not_found(rollout_id)
            return list(attempts)

    def _terminal(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        with self._lock:
            missing = [rid for rid in rollout_ids if rid not in self._rollouts]
            if missing:
                raise rollout_not_found(missing[0])
            return [r for r in (self._rollouts[rid] for rid in rollout_ids) if r.status in ROLLOUT_TERMINAL]

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Wait until every rollout is terminal or the timeout passes; returns the terminal ones."""
        await wait_until(
            self._notifier,
            lambda: len(self._terminal(rollout_ids)) == len(rollout_ids),
            timeout_s,
            time.monotonic,
            60.0 if timeout_s is None else timeout_s,
        )
        return [replace(r) for r in self._terminal(rollout_ids)]

    # --- resources -----------------------------------------------------------------------------------------------
    async def add_resources(
        self, resources: Mapping[str, Resource], *, idempotency_key: str | None = None
    ) -> ResourcesSnapshot:
        """Store a new immutable snapshot; it becomes the latest."""
        with self._lock:
            now = self._clock()

            def add() -> ResourcesSnapshot:
                snapshot = ResourcesSnapshot(
                    resources_id=new_id("rs"),
                    version=len(self._resources) + 1,
                    create_time=now,
                    resources=dict(resources),
                )
                self._resources[snapshot.resources_id] = snapshot
                return snapshot

            return self._keyed("resources", idempotency_key, now, add)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesSnapshot | None:
        """A snapshot by id, or the latest when id is None."""
        with self._lock:
            if resources_id is None:
                return next(reversed(self._resources.values()), None)
            snapshot = self._resources.get(resources_id)
            if snapshot is None:
                known = ", ".join(self._resources) or "none yet (add_resources() creates one)"
                raise NotFoundError(f"resources {resources_id!r} not found; known snapshots: {known}")
            return snapshot

    async def list_resources(self) -> list[ResourcesSnapshot]:
        """All snapshots, oldest first."""
        with self._lock:
            return list(self._resources.values())

    # --- algorithm metrics ---------------------------------------------------------------------------------------
    async def add_metrics(self, records: Sequence[MetricsRecord]) -> None:
        """Store per-step metrics, replacing records of the same ``(run_id, step)``; all or none."""
        # Kept as read back from their stored form, so every backend answers the same floats.
        stored = [record_from_row(row) for row in checked_records(records)]
        with self._lock:
            for record in stored:
                self._metrics.setdefault(record.run_id, {})[record.step] = record

    async def query_metrics(
        self, run_id: str | None = None, *, after_step: int | None = None, limit: int | None = None
    ) -> list[MetricsRecord]:
        """Metrics records in ``(run_id, step)`` order, after ``after_step``, at most ``limit``."""
        checked_query(run_id, after_step, limit)
        with self._lock:
            runs = sorted(self._metrics) if run_id is None else [run_id] if run_id in self._metrics else []
            found = [
                record
                for rid in runs
                for step, record in sorted(self._metrics[rid].items())
                if after_step is None or step > after_step
            ]
        return [r.model_copy() for r in found[:limit]]

    async def list_metric_runs(self) -> list[MetricsRun]:
        """Every run with metrics, the most recently written first."""
        with self._lock:
            runs = [
                MetricsRun(
                    run_id=rid,
                    steps=len(steps),
                    first_step=min(steps),
                    last_step=max(steps),
                    last_time=max(r.time for r in steps.values()),
                )
                for rid, steps in self._metrics.items()
            ]
        return sorted(runs, key=lambda run: (-run.last_time, run.run_id))

    # --- operations ----------------------------------------------------------------------------------------------
    async def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        """Watchdog tick: end attempts past their timeout or heartbeat timeout."""
        with self._lock:
            changed = op_check_timeouts(self._txn, self._clock() if now is None else now)
        if changed:
            self._notifier.notify()
        return changed

    async def statistics(self) -> StoreStatistics:
        """Counts per status, spans and approximate span bytes."""
        with self._lock:
            # Sizes are measured lazily here, not on ingest, to keep add_spans fast; each span is measured once.
            for span in self._all_spans[self._measured_spans :]:
                self._span_bytes += len(span.__pydantic_serializer__.to_json(span))
            self._measured_spans = len(self._all_spans)
            rollouts: dict[str, int] = {}
            for r in self._rollouts.values():
                rollouts[r.status] = rollouts.get(r.status, 0) + 1
            attempts: dict[str, int] = {}
            for attempt_list in self._attempts.values():
                for a in attempt_list:
                    attempts[a.status] = attempts.get(a.status, 0) + 1
            return StoreStatistics(
                rollouts_by_status=rollouts,
                attempts_by_status=attempts,
                total_rollouts=len(self._rollouts),
                total_attempts=sum(attempts.values()),
                total_spans=len(self._all_spans),
                span_bytes=self._span_bytes,
                total_resources=len(self._resources),
            )
