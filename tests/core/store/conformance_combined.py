"""Conformance of the combined calls a runner makes (claim + start, last spans + finish), mixed into the suite.

:class:`CombinedCallsConformance` is a base of ``StoreConformance``: every backend (and the HTTP client) runs these
tests. The combined calls must act exactly like their parts made one after the other.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentlightning.store import IllegalTransitionError, LightningStore, NotFoundError
from agentlightning.types import ClaimedRollout
from tests.core.store.fakes import make_span, spans_of


class CombinedCallsConformance:
    """``claim_and_start`` and ``finish_attempt_with_spans`` on every backend."""

    async def started(self, store: LightningStore, **config: Any) -> ClaimedRollout:
        """Enqueue one rollout and take it with ``claim_and_start``, failing the test if nothing is claimable."""
        await store.enqueue_rollout({"q": 1}, **config)
        claimed = await store.claim_and_start("w1")
        assert claimed is not None, "expected a claimable rollout"
        return claimed

    async def test_claim_and_start_returns_both_running(self, store: LightningStore) -> None:
        queued = await store.enqueue_rollout("a")
        await store.enqueue_rollout("b")
        claimed = await store.claim_and_start("worker-a")
        assert claimed is not None and claimed.rollout.rollout_id == queued.rollout_id
        assert claimed.rollout.status == "running" and claimed.rollout.num_attempts == 1
        attempt = claimed.attempt
        assert (attempt.status, attempt.sequence_id, attempt.worker_id) == ("running", 1, "worker-a")
        assert attempt.last_heartbeat_time is not None
        assert await store.get_rollout(queued.rollout_id) == claimed.rollout
        assert await store.query_attempts(queued.rollout_id) == [attempt]

    async def test_claim_and_start_of_a_requeued_rollout_starts_its_next_attempt(self, store: LightningStore) -> None:
        first = await self.started(store, max_attempts=2, retry_on=("failed",))
        rid = first.rollout.rollout_id
        await store.finish_attempt(rid, first.attempt.attempt_id, "failed", error="flaky tool")
        again = await store.claim_and_start("w2")
        assert again is not None and again.rollout.rollout_id == rid
        assert (again.rollout.status, again.rollout.num_attempts) == ("running", 2)
        assert again.rollout.start_time == first.rollout.start_time  # the rollout started with its first attempt
        assert (again.attempt.status, again.attempt.sequence_id, again.attempt.worker_id) == ("running", 2, "w2")
        assert [a.status for a in await store.query_attempts(rid)] == ["failed", "running"]
        assert await store.get_rollout(rid) == again.rollout

    async def test_claim_and_start_on_empty_queue_returns_none(self, store: LightningStore) -> None:
        assert await store.claim_and_start() is None
        began = time.monotonic()
        assert await store.claim_and_start("w", timeout_s=0.2) is None
        assert 0.15 <= time.monotonic() - began < 2

    async def test_claim_and_start_waits_for_work(self, store: LightningStore) -> None:
        async def enqueue_later() -> str:
            await asyncio.sleep(0.05)
            return (await store.enqueue_rollout("late")).rollout_id

        task = asyncio.create_task(enqueue_later())
        claimed = await store.claim_and_start("w", timeout_s=10)
        assert claimed is not None and claimed.rollout.rollout_id == await task
        assert claimed.attempt.status == "running"

    async def test_finish_with_spans_stores_them_first(self, store: LightningStore) -> None:
        claimed = await self.started(store)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.add_spans(spans_of(claimed, 2))
        done = await store.finish_attempt_with_spans(rid, aid, "succeeded", spans_of(claimed, 3, start=1))
        assert done.status == "succeeded" and done.end_time is not None and done.error is None
        assert (await store.get_rollout(rid)).status == "succeeded"
        spans = await store.query_spans(rid)
        assert [s.span_id for s in spans] == [f"{i:016x}" for i in (1, 2, 3, 4)]  # span 2 was not stored twice
        assert [s.sequence_id for s in spans] == [1, 2, 3, 4]

    async def test_finish_with_no_spans_is_a_finish(self, store: LightningStore) -> None:
        claimed = await self.started(store, max_attempts=2, retry_on=("failed",))
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        done = await store.finish_attempt_with_spans(rid, aid, "failed", [], error="boom")
        assert (done.status, done.error) == ("failed", "boom")
        assert (await store.get_rollout(rid)).status == "requeuing"
        assert await store.query_spans(rid) == []

    async def test_finish_with_spans_of_another_attempt_writes_nothing(self, store: LightningStore) -> None:
        claimed = await self.started(store)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        stranger = make_span(claimed, 5).model_copy(update={"attempt_id": "at-other"})
        with pytest.raises(ValueError, match=f"{stranger.span_id}.*add_spans"):
            await store.finish_attempt_with_spans(rid, aid, "succeeded", [make_span(claimed, 0), stranger])
        assert (await store.query_attempts(rid))[0].status == "running"
        assert await store.query_spans(rid) == []

    async def test_refused_finish_keeps_the_spans(self, store: LightningStore) -> None:
        claimed = await self.started(store)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.finish_attempt(rid, aid, "succeeded")
        with pytest.raises(IllegalTransitionError, match=aid):
            await store.finish_attempt_with_spans(rid, aid, "failed", spans_of(claimed, 2), error="late")
        attempts = await store.query_attempts(rid)
        assert (attempts[0].status, attempts[0].error) == ("succeeded", None)
        assert len(await store.query_spans(rid)) == 2

    async def test_finish_with_spans_of_unknown_attempt(self, store: LightningStore) -> None:
        claimed = await self.started(store)
        ghost = make_span(claimed, 0).model_copy(update={"attempt_id": "at-ghost"})
        with pytest.raises(NotFoundError, match="at-ghost"):
            await store.finish_attempt_with_spans(claimed.rollout.rollout_id, "at-ghost", "succeeded", [ghost])
        assert await store.query_spans(claimed.rollout.rollout_id) == []
