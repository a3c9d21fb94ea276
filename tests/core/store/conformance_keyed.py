"""Conformance of idempotency keys, mixed into the suite: a repeated keyed call acts once and answers the same.

:class:`KeyedCallsConformance` is a base of ``StoreConformance``, so every backend (and the HTTP client over a
server) runs these tests. Across a restart of the process: ``tests/scale/test_keyed_restart.py``.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

from agentlightning.store import IllegalTransitionError, LightningStore
from agentlightning.store._keys import KEY_TTL_NS, MAX_KEY_LENGTH, PRUNE_EVERY_NS
from agentlightning.types import RolloutRequest
from tests.core.store.fakes import FakeClock, make_span, spans_of


class KeyedCallsConformance:
    """Every keyed write of :class:`LightningStore` on every backend."""

    supports_fake_clock: ClassVar[bool] = True

    async def test_enqueue_with_a_key_acts_once(self, store: LightningStore) -> None:
        requests = [RolloutRequest(input=1), RolloutRequest(input=2)]
        first = await store.enqueue_rollouts(requests, idempotency_key="enq-1")
        again = await store.enqueue_rollouts(requests, idempotency_key="enq-1")
        assert again == first
        assert [r.rollout_id for r in await store.query_rollouts()] == [r.rollout_id for r in first]
        other = await store.enqueue_rollouts(requests, idempotency_key="enq-2")
        assert {r.rollout_id for r in other}.isdisjoint(r.rollout_id for r in first)
        assert len(await store.query_rollouts()) == 4
        one = await store.enqueue_rollout("solo", idempotency_key="enq-3")
        assert await store.enqueue_rollout("solo", idempotency_key="enq-3") == one

    async def test_claim_and_start_with_a_key_claims_one_rollout(self, store: LightningStore) -> None:
        a = await store.enqueue_rollout("a")
        b = await store.enqueue_rollout("b")
        first = await store.claim_and_start("w", idempotency_key="claim-1")
        again = await store.claim_and_start("w", idempotency_key="claim-1")
        assert first is not None and again == first and first.rollout.rollout_id == a.rollout_id
        assert (await store.get_rollout(b.rollout_id)).status == "queuing"
        assert len(await store.query_attempts(a.rollout_id)) == 1

    async def test_keyed_claim_of_the_last_rollout_answers_it_again(self, store: LightningStore) -> None:
        queued = await store.enqueue_rollout("only")
        first = await store.claim_rollout("w", idempotency_key="claim-last")
        # The queue is empty now: a repeat must not answer "nothing to claim" and leave the first claim orphaned.
        again = await store.claim_rollout("w", idempotency_key="claim-last")
        assert first is not None and again == first and first.rollout.rollout_id == queued.rollout_id

    async def test_keyed_claim_that_found_nothing_records_nothing(self, store: LightningStore) -> None:
        assert await store.claim_and_start("w", idempotency_key="claim-empty") is None
        queued = await store.enqueue_rollout("late")
        claimed = await store.claim_and_start("w", idempotency_key="claim-empty")
        assert claimed is not None and claimed.rollout.rollout_id == queued.rollout_id

    async def test_keyed_claim_that_waits_claims_once(self, store: LightningStore) -> None:
        async def enqueue_later() -> None:
            await asyncio.sleep(0.1)
            await store.enqueue_rollouts([RolloutRequest(input=1), RolloutRequest(input=2)])

        claimed, _ = await asyncio.gather(
            store.claim_and_start("w", timeout_s=5.0, idempotency_key="claim-wait"), enqueue_later()
        )
        again = await store.claim_and_start("w", timeout_s=5.0, idempotency_key="claim-wait")
        assert claimed is not None and again == claimed
        statuses = sorted(r.status for r in await store.query_rollouts())
        assert statuses == ["queuing", "running"]

    async def test_start_with_a_key_answers_its_success_again(self, store: LightningStore) -> None:
        await store.enqueue_rollout("a")
        claimed = await store.claim_rollout("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        first = await store.start_attempt(rid, aid, idempotency_key="start-1")
        assert await store.start_attempt(rid, aid, idempotency_key="start-1") == first
        with pytest.raises(IllegalTransitionError):  # without the key the repeat is the illegal move it is
            await store.start_attempt(rid, aid)

    async def test_finish_with_a_key_answers_its_success_again(self, store: LightningStore) -> None:
        await store.enqueue_rollout("a", max_attempts=3, retry_on=["failed"])
        claimed = await store.claim_and_start("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        first = await store.finish_attempt(rid, aid, "succeeded", idempotency_key="fin-1")
        again = await store.finish_attempt(rid, aid, "succeeded", idempotency_key="fin-1")
        assert again == first and first.status == "succeeded"
        assert (await store.get_rollout(rid)).status == "succeeded"
        assert len(await store.query_attempts(rid)) == 1

    async def test_finish_with_spans_and_a_key_stores_them_once(self, store: LightningStore) -> None:
        await store.enqueue_rollout("a")
        claimed = await store.claim_and_start("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        spans = spans_of(claimed, 3)
        first = await store.finish_attempt_with_spans(rid, aid, "succeeded", spans, idempotency_key="fws-1")
        again = await store.finish_attempt_with_spans(rid, aid, "succeeded", spans, idempotency_key="fws-1")
        assert again == first
        assert [s.sequence_id for s in await store.query_spans(rid)] == [1, 2, 3]
        assert (await store.get_rollout(rid)).status == "succeeded"

    async def test_cancel_with_a_key_answers_its_success_again(self, store: LightningStore) -> None:
        queued = await store.enqueue_rollout("a")
        first = await store.cancel_rollout(queued.rollout_id, idempotency_key="cancel-1")
        assert await store.cancel_rollout(queued.rollout_id, idempotency_key="cancel-1") == first
        assert first.status == "cancelled"

    async def test_add_resources_with_a_key_makes_one_version(self, store: LightningStore) -> None:
        first = await store.add_resources({}, idempotency_key="res-1")
        again = await store.add_resources({}, idempotency_key="res-1")
        assert again == first and [s.version for s in await store.list_resources()] == [1]
        assert (await store.add_resources({}, idempotency_key="res-2")).version == 2

    async def test_one_key_on_different_operations_does_not_collide(self, store: LightningStore) -> None:
        rollout = (await store.enqueue_rollouts([RolloutRequest(input=1)], idempotency_key="shared"))[0]
        snapshot = await store.add_resources({}, idempotency_key="shared")
        claimed = await store.claim_and_start("w", idempotency_key="shared")
        assert snapshot.version == 1 and claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id

    async def test_a_refused_keyed_call_is_not_recorded(self, store: LightningStore) -> None:
        await store.enqueue_rollout("a")
        claimed = await store.claim_and_start("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.finish_attempt(rid, aid, "failed")
        for _ in range(2):  # refused both times: a refusal is not an answer to replay
            with pytest.raises(IllegalTransitionError):
                await store.finish_attempt(rid, aid, "succeeded", idempotency_key="fin-refused")

    async def test_a_refused_finish_with_spans_keeps_its_spans_and_records_nothing(self, store: LightningStore) -> None:
        await store.enqueue_rollout("a")
        claimed = await store.claim_and_start("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.finish_attempt(rid, aid, "failed")
        spans = [make_span(claimed, i) for i in range(2)]
        for _ in range(2):
            with pytest.raises(IllegalTransitionError):
                await store.finish_attempt_with_spans(rid, aid, "succeeded", spans, idempotency_key="fws-refused")
        assert len(await store.query_spans(rid)) == 2

    @pytest.mark.parametrize("key", ["", "k" * (MAX_KEY_LENGTH + 1)])
    async def test_a_key_out_of_bounds_is_refused_before_any_write(self, store: LightningStore, key: str) -> None:
        with pytest.raises(ValueError, match="idempotency key must be 1 to 255"):
            await store.enqueue_rollout("a", idempotency_key=key)
        assert await store.query_rollouts() == []
        assert await store.enqueue_rollout("b", idempotency_key="k" * MAX_KEY_LENGTH) is not None

    async def test_concurrent_duplicates_act_once(self, store: LightningStore) -> None:
        requests = [RolloutRequest(input=1)]
        answers = await asyncio.gather(*(store.enqueue_rollouts(requests, idempotency_key="dup") for _ in range(8)))
        assert all(a == answers[0] for a in answers) and len(await store.query_rollouts()) == 1
        claims = await asyncio.gather(*(store.claim_and_start("w", idempotency_key="dup-c") for _ in range(8)))
        assert claims[0] is not None and all(c == claims[0] for c in claims)
        rid, aid = claims[0].rollout.rollout_id, claims[0].attempt.attempt_id
        finishes = await asyncio.gather(
            *(store.finish_attempt(rid, aid, "succeeded", idempotency_key="dup-f") for _ in range(8))
        )
        assert all(f == finishes[0] for f in finishes) and finishes[0].status == "succeeded"

    async def test_keys_older_than_a_day_are_pruned(self, store: LightningStore, clock: FakeClock) -> None:
        if not self.supports_fake_clock:
            pytest.skip("needs a store that reads the fake clock")
        first = await store.enqueue_rollout("old", idempotency_key="aged")
        clock.advance((KEY_TTL_NS + PRUNE_EVERY_NS) / 1e9 + 1)
        await store.enqueue_rollout("trigger", idempotency_key="fresh")  # a keyed write prunes what has aged
        again = await store.enqueue_rollout("old", idempotency_key="aged")
        assert again.rollout_id != first.rollout_id  # the key was forgotten: it acts again
        assert await store.enqueue_rollout("trigger", idempotency_key="fresh") is not None
        assert len(await store.query_rollouts()) == 3
