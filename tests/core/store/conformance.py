"""The LightningStore conformance suite: one set of behaviours every backend must show.

Import it as ``tests.core.store.conformance`` and subclass :class:`StoreConformance` (see its docstring).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from agentlightning.store import (
    IllegalTransitionError,
    LightningStore,
    NotFoundError,
    SyncLightningStore,
    Watchdog,
)
from agentlightning.types import LLM, ClaimedRollout, PromptTemplate, RolloutConfig, RolloutRequest
from tests.core.store.conformance_combined import CombinedCallsConformance
from tests.core.store.conformance_keyed import KeyedCallsConformance
from tests.core.store.conformance_metrics import MetricsConformance
from tests.core.store.fakes import NS, FakeClock, make_span, spans_of

__all__ = ["NS", "FakeClock", "StoreConformance", "make_span", "spans_of"]


class StoreConformance(CombinedCallsConformance, KeyedCallsConformance, MetricsConformance):
    """Behaviours every :class:`LightningStore` backend must pass. Subclass it in a ``test_*.py`` file.

    A subclass must provide one fixture::

        @pytest.fixture
        async def store(self, clock: FakeClock) -> AsyncIterator[LightningStore]:
            s = MyStore(..., clock=clock)   # a fresh, empty store that reads time from ``clock``
            yield s
            await s.close()

    The base class provides ``clock`` (a :class:`FakeClock` starting at the real time); override it only to change
    the start time. The store must be usable from several threads, each running its own event loop, and
    ``close()`` must be idempotent.

    Time: tests that need the store to *read* the fake clock (heartbeats at chosen times, the :class:`Watchdog`)
    run only when ``supports_fake_clock = True`` (the default). A backend that cannot take a clock (e.g. a remote
    server using its own time) sets ``supports_fake_clock = False``: those tests are skipped, and every other
    time-dependent test still runs because it derives ``check_timeouts(now=...)`` from the timestamps the store
    returned (an attempt's ``start_time`` / ``last_heartbeat_time``), never from the fake clock.
    """

    supports_fake_clock: ClassVar[bool] = True

    @pytest.fixture
    def clock(self) -> FakeClock:
        """The fake clock the ``store`` fixture must be built with."""
        return FakeClock()

    def needs_fake_clock(self) -> None:
        """Skip the calling test on backends that cannot read a fake clock."""
        if not self.supports_fake_clock:
            pytest.skip("backend cannot take a fake clock (supports_fake_clock = False)")

    async def claim(self, store: LightningStore, worker_id: str = "w1") -> ClaimedRollout:
        """Claim, failing the test if nothing is claimable."""
        claimed = await store.claim_rollout(worker_id)
        assert claimed is not None, "expected a claimable rollout"
        return claimed

    async def running(self, store: LightningStore, **config: Any) -> ClaimedRollout:
        """Enqueue one rollout, claim it and start its attempt."""
        await store.enqueue_rollout({"q": 1}, **config)
        claimed = await self.claim(store)
        await store.start_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
        return claimed

    # --- enqueue and claim ---------------------------------------------------------------------------------------
    async def test_enqueue_batch_keeps_order_and_assigns_ids(self, store: LightningStore) -> None:
        requests = [RolloutRequest(input={"i": i}, mode="train", group_id=f"g{i % 2}") for i in range(5)]
        rollouts = await store.enqueue_rollouts(requests)
        assert [r.input for r in rollouts] == [{"i": i} for i in range(5)]
        assert all(re.fullmatch(r"ro-[0-9a-f]{32}", r.rollout_id) for r in rollouts)
        assert len({r.rollout_id for r in rollouts}) == 5
        assert all(r.status == "queuing" and r.num_attempts == 0 for r in rollouts)
        listed = await store.query_rollouts()
        assert [r.rollout_id for r in listed] == [r.rollout_id for r in rollouts]
        got = await store.get_rollout(rollouts[2].rollout_id)
        assert got.input == {"i": 2} and got.mode == "train" and got.group_id == "g0"

    async def test_enqueue_rollout_takes_config_keywords(self, store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task", metadata={"k": 1}, timeout_s=5, max_attempts=3)
        stored = await store.get_rollout(rollout.rollout_id)
        assert stored.config == RolloutConfig(timeout_s=5, max_attempts=3)
        assert stored.metadata == {"k": 1} and stored.input == "task"

    async def test_enqueue_with_unknown_resources_writes_nothing(self, store: LightningStore) -> None:
        requests = [RolloutRequest(input=1), RolloutRequest(input=2, resources_id="rs-missing")]
        with pytest.raises(NotFoundError, match="rs-missing"):
            await store.enqueue_rollouts(requests)
        assert await store.query_rollouts() == []

    async def test_claim_takes_oldest_and_creates_attempt(self, store: LightningStore) -> None:
        first, _second = await store.enqueue_rollouts([RolloutRequest(input=1), RolloutRequest(input=2)])
        claimed = await self.claim(store, "worker-a")
        assert claimed.rollout.rollout_id == first.rollout_id
        assert claimed.rollout.status == "preparing" and claimed.rollout.num_attempts == 1
        assert claimed.rollout.start_time is not None
        attempt = claimed.attempt
        assert re.fullmatch(r"at-[0-9a-f]{32}", attempt.attempt_id)
        assert (attempt.status, attempt.sequence_id, attempt.worker_id) == ("preparing", 1, "worker-a")
        assert (await store.get_rollout(first.rollout_id)).status == "preparing"
        assert [a.attempt_id for a in await store.query_attempts(first.rollout_id)] == [attempt.attempt_id]

    async def test_claim_on_empty_queue_returns_none(self, store: LightningStore) -> None:
        assert await store.claim_rollout() is None

    async def test_full_success_path(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        assert (await store.get_rollout(rid)).status == "running"
        done = await store.finish_attempt(rid, aid, "succeeded")
        assert done.status == "succeeded" and done.end_time is not None
        rollout = await store.get_rollout(rid)
        assert rollout.status == "succeeded" and rollout.end_time is not None and rollout.is_terminal
        assert await store.claim_rollout() is None

    async def test_finish_from_preparing_is_allowed(self, store: LightningStore) -> None:
        await store.enqueue_rollout(1)
        claimed = await self.claim(store)
        await store.finish_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "failed", error="boom")
        attempts = await store.query_attempts(claimed.rollout.rollout_id)
        assert attempts[0].status == "failed" and attempts[0].error == "boom"
        assert (await store.get_rollout(claimed.rollout.rollout_id)).status == "failed"

    # --- illegal transitions and unknown ids ---------------------------------------------------------------------
    async def test_succeeded_attempt_cannot_run_again(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.finish_attempt(rid, aid, "succeeded")
        with pytest.raises(IllegalTransitionError, match=rf"{aid}.*succeeded.*running.*allowed"):
            await store.start_attempt(rid, aid)
        with pytest.raises(IllegalTransitionError, match=aid):
            await store.finish_attempt(rid, aid, "failed")
        attempts = await store.query_attempts(rid)
        assert attempts[0].status == "succeeded" and attempts[0].error is None
        assert (await store.get_rollout(rid)).status == "succeeded"

    async def test_start_twice_is_illegal(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        with pytest.raises(IllegalTransitionError, match="running"):
            await store.start_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id)

    async def test_finish_needs_terminal_status(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        with pytest.raises(ValueError, match="terminal status"):
            await store.finish_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "running")
        assert (await store.query_attempts(claimed.rollout.rollout_id))[0].status == "running"

    async def test_unknown_ids_are_named(self, store: LightningStore) -> None:
        with pytest.raises(NotFoundError, match="ro-nope"):
            await store.get_rollout("ro-nope")
        with pytest.raises(NotFoundError, match="ro-nope"):
            await store.start_attempt("ro-nope", "at-nope")
        with pytest.raises(NotFoundError, match="ro-nope"):
            await store.query_attempts("ro-nope")
        with pytest.raises(NotFoundError, match="ro-nope"):
            await store.cancel_rollout("ro-nope")
        with pytest.raises(NotFoundError, match="ro-nope"):
            await store.update_rollout_metadata("ro-nope", {"a": 1})
        claimed = await self.running(store)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        # The message lists the attempts that do exist, so the caller can see the mix-up.
        with pytest.raises(NotFoundError, match=rf"at-nope.*{aid}"):
            await store.finish_attempt(rid, "at-nope", "succeeded")
        with pytest.raises(NotFoundError, match="at-nope"):
            await store.heartbeat(rid, "at-nope")
        with pytest.raises(NotFoundError, match="at-nope"):
            await store.query_spans(rid, "at-nope")
        assert (await store.get_rollout(rid)).status == "running"

    # --- retries -------------------------------------------------------------------------------------------------
    async def test_failure_requeues_when_retry_on_and_attempts_remain(self, store: LightningStore) -> None:
        claimed = await self.running(store, max_attempts=2, retry_on=("failed",))
        rid, first = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.finish_attempt(rid, first, "failed", error="flaky")
        rollout = await store.get_rollout(rid)
        assert rollout.status == "requeuing" and rollout.end_time is None
        again = await self.claim(store)
        assert again.rollout.rollout_id == rid and again.attempt.sequence_id == 2
        assert again.attempt.attempt_id != first
        await store.finish_attempt(rid, again.attempt.attempt_id, "failed")
        assert (await store.get_rollout(rid)).status == "failed"  # max_attempts reached
        assert [a.status for a in await store.query_attempts(rid)] == ["failed", "failed"]

    async def test_requeued_rollout_keeps_its_place_in_the_queue(self, store: LightningStore) -> None:
        first, second = await store.enqueue_rollouts(
            [RolloutRequest(input=i, config=RolloutConfig(max_attempts=2, retry_on=("failed",))) for i in range(2)]
        )
        claimed = await self.claim(store)
        await store.finish_attempt(first.rollout_id, claimed.attempt.attempt_id, "failed")
        assert [(await self.claim(store)).rollout.rollout_id for _ in range(2)] == [first.rollout_id, second.rollout_id]

    async def test_failure_not_in_retry_on_fails_at_once(self, store: LightningStore) -> None:
        claimed = await self.running(store, max_attempts=3)  # default retry_on: timeout, unresponsive
        await store.finish_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "failed")
        assert (await store.get_rollout(claimed.rollout.rollout_id)).status == "failed"
        assert await store.claim_rollout() is None

    async def test_superseded_attempt_cannot_change_the_rollout(self, store: LightningStore) -> None:
        claimed = await self.running(store, max_attempts=2, timeout_s=10)
        rid, old = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        changed = await store.check_timeouts(now=claimed.attempt.start_time + 11 * NS)
        assert [(a.attempt_id, a.status) for a in changed] == [(old, "timeout")]
        newer = await self.claim(store)
        await store.start_attempt(rid, newer.attempt.attempt_id)
        # The late runner of the first attempt reports success: refused, the newer attempt keeps the rollout.
        with pytest.raises(IllegalTransitionError, match=rf"{old}.*(superseded|timeout)"):
            await store.finish_attempt(rid, old, "succeeded")
        with pytest.raises(IllegalTransitionError, match=old):
            await store.start_attempt(rid, old)
        with pytest.raises(IllegalTransitionError, match=old):
            await store.heartbeat(rid, old)
        attempts = await store.query_attempts(rid)
        assert [a.status for a in attempts] == ["timeout", "running"]
        assert (await store.get_rollout(rid)).status == "running"
        await store.finish_attempt(rid, newer.attempt.attempt_id, "succeeded")
        assert (await store.get_rollout(rid)).status == "succeeded"

    # --- watchdog: timeouts and heartbeats -------------------------------------------------------------------------
    async def test_timeout_requeues_then_fails(self, store: LightningStore) -> None:
        claimed = await self.running(store, timeout_s=10, max_attempts=2)
        rid, start = claimed.rollout.rollout_id, claimed.attempt.start_time
        assert await store.check_timeouts(now=start + 9 * NS) == []
        changed = await store.check_timeouts(now=start + 11 * NS)
        assert [a.status for a in changed] == ["timeout"] and changed[0].error
        assert (await store.get_rollout(rid)).status == "requeuing"
        assert await store.check_timeouts(now=start + 20 * NS) == []  # nothing live: nothing to change
        second = await self.claim(store)
        assert second.attempt.sequence_id == 2
        changed = await store.check_timeouts(now=second.attempt.start_time + 11 * NS)
        assert [a.attempt_id for a in changed] == [second.attempt.attempt_id]
        rollout = await store.get_rollout(rid)
        assert rollout.status == "failed" and rollout.end_time is not None

    async def test_timeout_not_retried_when_not_in_retry_on(self, store: LightningStore) -> None:
        claimed = await self.running(store, timeout_s=1, max_attempts=5, retry_on=("failed",))
        await store.check_timeouts(now=claimed.attempt.start_time + 2 * NS)
        assert (await store.get_rollout(claimed.rollout.rollout_id)).status == "failed"

    async def test_preparing_attempt_can_time_out(self, store: LightningStore) -> None:
        await store.enqueue_rollout(1, heartbeat_timeout_s=5, max_attempts=2)
        claimed = await self.claim(store)
        changed = await store.check_timeouts(now=claimed.attempt.start_time + 6 * NS)
        assert [a.status for a in changed] == ["unresponsive"]
        assert (await store.get_rollout(claimed.rollout.rollout_id)).status == "requeuing"

    async def test_heartbeat_keeps_attempt_alive(self, store: LightningStore, clock: FakeClock) -> None:
        claimed = await self.running(store, heartbeat_timeout_s=10, max_attempts=1)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        clock.advance(8)
        beat = await store.heartbeat(rid, aid)
        assert beat.last_heartbeat_time is not None and beat.last_heartbeat_time >= claimed.attempt.start_time
        assert await store.check_timeouts(now=beat.last_heartbeat_time + 9 * NS) == []
        changed = await store.check_timeouts(now=beat.last_heartbeat_time + 11 * NS)
        assert [(a.attempt_id, a.status) for a in changed] == [(aid, "unresponsive")]
        assert (await store.get_rollout(rid)).status == "failed"  # max_attempts=1

    async def test_spans_count_as_heartbeat(self, store: LightningStore, clock: FakeClock) -> None:
        claimed = await self.running(store, heartbeat_timeout_s=10)
        clock.advance(8)
        await store.add_spans([make_span(claimed, 0)])
        attempt = (await store.query_attempts(claimed.rollout.rollout_id))[0]
        assert attempt.last_heartbeat_time is not None
        assert await store.check_timeouts(now=attempt.last_heartbeat_time + 9 * NS) == []
        if self.supports_fake_clock:
            assert attempt.last_heartbeat_time == claimed.attempt.start_time + 8 * NS

    async def test_watchdog_marks_silent_attempts(self, store: LightningStore, clock: FakeClock) -> None:
        self.needs_fake_clock()
        claimed = await self.running(store, heartbeat_timeout_s=5, max_attempts=2)
        async with Watchdog(store, interval_s=0.01) as watchdog:
            assert watchdog.running
            clock.advance(6)
            for _ in range(300):
                if (await store.get_rollout(claimed.rollout.rollout_id)).status == "requeuing":
                    break
                await asyncio.sleep(0.01)
        assert not watchdog.running
        assert [a.status for a in await store.query_attempts(claimed.rollout.rollout_id)] == ["unresponsive"]
        assert (await store.get_rollout(claimed.rollout.rollout_id)).status == "requeuing"

    # --- cancel --------------------------------------------------------------------------------------------------
    async def test_cancel_queued_rollout_stops_claims(self, store: LightningStore) -> None:
        rollout = await store.enqueue_rollout(1)
        cancelled = await store.cancel_rollout(rollout.rollout_id)
        assert cancelled.status == "cancelled" and cancelled.end_time is not None
        assert await store.claim_rollout() is None
        with pytest.raises(IllegalTransitionError, match=rf"{rollout.rollout_id}.*cancelled"):
            await store.cancel_rollout(rollout.rollout_id)

    async def test_cancel_running_rollout_ends_its_attempt(self, store: LightningStore) -> None:
        claimed = await self.running(store, max_attempts=3, retry_on=("failed",), timeout_s=1)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.cancel_rollout(rid)
        assert (await store.query_attempts(rid))[0].status == "failed"
        with pytest.raises(IllegalTransitionError, match=aid):
            await store.finish_attempt(rid, aid, "succeeded")
        with pytest.raises(IllegalTransitionError, match=aid):
            await store.heartbeat(rid, aid)
        assert await store.check_timeouts(now=claimed.attempt.start_time + 100 * NS) == []
        assert await store.claim_rollout() is None
        assert (await store.get_rollout(rid)).status == "cancelled"

    async def test_terminal_rollout_cannot_be_cancelled(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        await store.finish_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "succeeded")
        with pytest.raises(IllegalTransitionError, match="succeeded"):
            await store.cancel_rollout(claimed.rollout.rollout_id)
        assert (await store.get_rollout(claimed.rollout.rollout_id)).status == "succeeded"

    async def test_update_metadata_merges(self, store: LightningStore) -> None:
        rollout = await store.enqueue_rollout(1, metadata={"a": 1, "b": 2})
        updated = await store.update_rollout_metadata(rollout.rollout_id, {"b": 3, "c": [1, 2]})
        assert updated.metadata == {"a": 1, "b": 3, "c": [1, 2]}
        assert (await store.get_rollout(rollout.rollout_id)).metadata == {"a": 1, "b": 3, "c": [1, 2]}

    # --- spans ---------------------------------------------------------------------------------------------------
    async def test_add_spans_assigns_sequence_ids_and_is_idempotent(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        stored = await store.add_spans(spans_of(claimed, 3))
        assert [s.sequence_id for s in stored] == [1, 2, 3]
        again = await store.add_spans([*spans_of(claimed, 2, start=1), make_span(claimed, 3)])
        assert [s.sequence_id for s in again] == [2, 3, 4]
        assert again[0].attributes == {"index": 1}
        dupes = await store.add_spans([make_span(claimed, 9), make_span(claimed, 9)])
        assert [s.sequence_id for s in dupes] == [5, 5]
        spans = await store.query_spans(claimed.rollout.rollout_id)
        assert [s.sequence_id for s in spans] == [1, 2, 3, 4, 5]
        assert [s.span_id for s in spans] == [f"{i:016x}" for i in (1, 2, 3, 4, 10)]
        assert (await store.statistics()).total_spans == 5

    async def test_span_batch_with_unknown_attempt_writes_nothing(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        good = make_span(claimed, 0)
        bad = good.model_copy(update={"attempt_id": "at-ghost", "span_id": f"{7:016x}"})
        with pytest.raises(NotFoundError, match="at-ghost"):
            await store.add_spans([good, bad])
        unknown_rollout = good.model_copy(update={"rollout_id": "ro-ghost"})
        with pytest.raises(NotFoundError, match="ro-ghost"):
            await store.add_spans([good, unknown_rollout])
        assert await store.query_spans(claimed.rollout.rollout_id) == []
        assert (await store.statistics()).total_spans == 0

    async def test_span_without_ids_is_rejected(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        orphan = make_span(claimed, 0).model_copy(update={"rollout_id": ""})
        with pytest.raises(ValueError, match="rollout_id"):
            await store.add_spans([make_span(claimed, 1), orphan])
        assert await store.query_spans(claimed.rollout.rollout_id) == []

    async def test_spans_from_superseded_attempt_are_kept_but_change_nothing(self, store: LightningStore) -> None:
        claimed = await self.running(store, heartbeat_timeout_s=10, max_attempts=2)
        rid = claimed.rollout.rollout_id
        await store.check_timeouts(now=claimed.attempt.start_time + 11 * NS)
        newer = await self.claim(store)
        await store.start_attempt(rid, newer.attempt.attempt_id)
        before = await store.query_attempts(rid)
        late = await store.add_spans(spans_of(claimed, 2))
        assert [s.sequence_id for s in late] == [1, 2]
        assert await store.query_attempts(rid) == before
        assert len(await store.query_spans(rid, claimed.attempt.attempt_id)) == 2
        assert await store.query_spans(rid, "latest") == []

    async def test_query_spans_order_filters_and_paging(self, store: LightningStore) -> None:
        claimed = await self.running(store, max_attempts=2, retry_on=("failed",))
        rid = claimed.rollout.rollout_id
        await store.add_spans(spans_of(claimed, 3, name="a"))
        await store.add_spans(spans_of(claimed, 2, start=3, name="b"))
        await store.finish_attempt(rid, claimed.attempt.attempt_id, "failed")
        second = await self.claim(store)
        await store.add_spans(spans_of(second, 4, name="a"))
        everything = await store.query_spans(rid)
        keys = [(s.attempt_id == second.attempt.attempt_id, s.sequence_id) for s in everything]
        assert keys == [
            (False, 1),
            (False, 2),
            (False, 3),
            (False, 4),
            (False, 5),
            (True, 1),
            (True, 2),
            (True, 3),
            (True, 4),
        ]
        latest = await store.query_spans(rid, "latest")
        assert [s.attempt_id for s in latest] == [second.attempt.attempt_id] * 4
        first = await store.query_spans(rid, claimed.attempt.attempt_id)
        assert [s.sequence_id for s in first] == [1, 2, 3, 4, 5]
        assert [s.sequence_id for s in await store.query_spans(rid, claimed.attempt.attempt_id, name="b")] == [4, 5]
        assert len(await store.query_spans(rid, name="a")) == 7
        after = await store.query_spans(rid, claimed.attempt.attempt_id, after_sequence_id=3)
        assert [s.sequence_id for s in after] == [4, 5]
        pages = [await store.query_spans(rid, limit=4, offset=o) for o in (0, 4, 8)]
        assert [len(p) for p in pages] == [4, 4, 1]
        assert [s for p in pages for s in p] == everything

    async def test_query_spans_of_unknown_rollout(self, store: LightningStore) -> None:
        with pytest.raises(NotFoundError, match="ro-none"):
            await store.query_spans("ro-none")

    # --- queries -------------------------------------------------------------------------------------------------
    async def test_query_rollouts_filters_sort_and_paging(self, store: LightningStore) -> None:
        rollouts = await store.enqueue_rollouts(
            [RolloutRequest(input=i, mode="train" if i % 2 else "val", group_id=f"g{i % 3}") for i in range(6)]
        )
        ids = [r.rollout_id for r in rollouts]
        claimed = await self.claim(store)
        assert claimed.rollout.rollout_id == ids[0]

        async def query(**kw: Any) -> list[str]:
            return [r.rollout_id for r in await store.query_rollouts(**kw)]

        assert await query(status=["preparing"]) == ids[:1]
        assert await query(status=["queuing", "preparing"]) == ids
        assert await query(mode="train") == ids[1::2]
        assert await query(group_id="g1") == [ids[1], ids[4]]
        assert await query(rollout_ids=[ids[3], ids[1], "ro-unknown"]) == [ids[1], ids[3]]
        assert await query(sort="desc") == ids[::-1]
        assert await query(limit=2, offset=1) == ids[1:3]
        assert await query(sort="desc", limit=2) == [ids[5], ids[4]]
        assert await query(mode="val", status=["queuing"], limit=1) == [ids[2]]
        assert await query(status=[]) == []

    async def test_statistics(self, store: LightningStore) -> None:
        await store.enqueue_rollouts([RolloutRequest(input=i) for i in range(3)])
        claimed = await self.running(store)
        await store.add_spans(spans_of(claimed, 4))
        await store.finish_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "succeeded")
        await store.add_resources({"p": PromptTemplate(template="{x}")})
        stats = await store.statistics()
        assert stats.rollouts_by_status == {"succeeded": 1, "queuing": 3}
        assert stats.attempts_by_status == {"succeeded": 1}
        assert (stats.total_rollouts, stats.total_attempts, stats.total_spans, stats.total_resources) == (4, 1, 4, 1)
        assert stats.span_bytes > 4 * 100

    # --- waiting -------------------------------------------------------------------------------------------------
    async def test_wait_for_rollouts_returns_when_they_finish(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        other = await store.enqueue_rollout(2)
        rid = claimed.rollout.rollout_id

        async def finish_later() -> None:
            await asyncio.sleep(0.05)
            await store.finish_attempt(rid, claimed.attempt.attempt_id, "succeeded")
            await asyncio.sleep(0.05)
            await store.cancel_rollout(other.rollout_id)

        began = time.monotonic()
        task = asyncio.create_task(finish_later())
        done = await store.wait_for_rollouts([rid, other.rollout_id], timeout_s=10)
        elapsed = time.monotonic() - began
        await task
        assert sorted(r.status for r in done) == ["cancelled", "succeeded"]
        assert 0.09 <= elapsed < 2, elapsed

    async def test_wait_for_rollouts_honours_timeout(self, store: LightningStore) -> None:
        claimed = await self.running(store)
        finished = await self.running(store)
        await store.finish_attempt(finished.rollout.rollout_id, finished.attempt.attempt_id, "succeeded")
        began = time.monotonic()
        done = await store.wait_for_rollouts([claimed.rollout.rollout_id, finished.rollout.rollout_id], timeout_s=0.2)
        assert 0.15 <= time.monotonic() - began < 2
        assert [r.rollout_id for r in done] == [finished.rollout.rollout_id]
        assert await store.wait_for_rollouts([], timeout_s=5) == []
        with pytest.raises(NotFoundError, match="ro-missing"):
            await store.wait_for_rollouts(["ro-missing"], timeout_s=0.1)

    async def test_waiting_claim_returns_when_work_arrives(self, store: LightningStore) -> None:
        async def enqueue_later() -> str:
            await asyncio.sleep(0.05)
            return (await store.enqueue_rollout("late")).rollout_id

        began = time.monotonic()
        task = asyncio.create_task(enqueue_later())
        claimed = await store.claim_rollout("w", timeout_s=10)
        elapsed = time.monotonic() - began
        assert claimed is not None and claimed.rollout.rollout_id == await task
        assert elapsed < 2, elapsed

    async def test_waiting_claim_wakes_on_enqueue_from_another_thread(self, store: LightningStore) -> None:
        def enqueue_from_thread() -> None:
            time.sleep(0.05)
            asyncio.run(store.enqueue_rollout("from-thread"))

        thread = threading.Thread(target=enqueue_from_thread)
        began = time.monotonic()
        thread.start()
        claimed = await store.claim_rollout("w", timeout_s=10)
        thread.join()
        assert claimed is not None and claimed.rollout.input == "from-thread"
        assert time.monotonic() - began < 2

    async def test_waiting_claim_honours_timeout(self, store: LightningStore) -> None:
        began = time.monotonic()
        assert await store.claim_rollout("w", timeout_s=0.2) is None
        assert 0.15 <= time.monotonic() - began < 2

    async def test_waiting_claim_sees_requeued_rollout(self, store: LightningStore) -> None:
        claimed = await self.running(store, max_attempts=2, retry_on=("failed",))

        async def fail_later() -> None:
            await asyncio.sleep(0.05)
            await store.finish_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "failed")

        task = asyncio.create_task(fail_later())
        again = await store.claim_rollout("w2", timeout_s=10)
        await task
        assert again is not None and again.attempt.sequence_id == 2

    # --- concurrency ---------------------------------------------------------------------------------------------
    def claim_all_in_threads(self, store: LightningStore, threads: int) -> list[list[str]]:
        """Claim until empty from ``threads`` threads, each with its own event loop; ids claimed per thread."""
        results: list[list[str]] = [[] for _ in range(threads)]
        barrier = threading.Barrier(threads)

        def work(index: int) -> None:
            async def loop() -> None:
                barrier.wait()
                while (claimed := await store.claim_rollout(f"t{index}")) is not None:
                    results[index].append(claimed.rollout.rollout_id)

            asyncio.run(loop())

        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return results

    async def test_concurrent_claimers_in_threads_never_share(self, store: LightningStore) -> None:
        rollouts = await store.enqueue_rollouts([RolloutRequest(input=i) for i in range(120)])
        results = await asyncio.to_thread(self.claim_all_in_threads, store, 6)
        claimed = [rid for ids in results for rid in ids]
        assert sorted(claimed) == sorted(r.rollout_id for r in rollouts)
        assert len(set(claimed)) == len(claimed)

    async def test_spans_from_many_threads_get_unique_sequence_ids(self, store: LightningStore) -> None:
        claimed = await self.running(store)

        def add(start: int) -> None:
            async def go() -> None:
                for i in range(start, start + 40, 4):
                    await store.add_spans(spans_of(claimed, 4, start=i))

            asyncio.run(go())

        threads = [threading.Thread(target=add, args=(n * 40,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        spans = await store.query_spans(claimed.rollout.rollout_id)
        assert [s.sequence_id for s in spans] == list(range(1, 161))
        assert len({s.span_id for s in spans}) == 160

    # --- resources -----------------------------------------------------------------------------------------------
    async def test_resources_latest_by_id_and_list(self, store: LightningStore) -> None:
        assert await store.get_resources() is None
        assert await store.list_resources() == []
        llm = LLM(base_url="http://127.0.0.1:1/v1", model="m", weights_version=1)
        first = await store.add_resources({"llm": llm})
        second = await store.add_resources({"llm": llm, "prompt": PromptTemplate(template="{{ q }}", engine="jinja2")})
        assert re.fullmatch(r"rs-[0-9a-f]{32}", first.resources_id)
        assert (first.version, second.version) == (1, 2)
        assert await store.get_resources() == second
        assert await store.get_resources(first.resources_id) == first
        assert [s.resources_id for s in await store.list_resources()] == [first.resources_id, second.resources_id]
        assert (await store.get_resources(second.resources_id)).get_prompt_template().engine == "jinja2"  # type: ignore[union-attr]  # known id
        with pytest.raises(NotFoundError, match=rf"rs-missing.*{first.resources_id}"):
            await store.get_resources("rs-missing")

    async def test_attempt_records_resources_it_ran_with(self, store: LightningStore) -> None:
        await store.enqueue_rollout("none yet")
        assert (await self.claim(store)).attempt.resources_id is None
        pinned = await store.add_resources({"p": PromptTemplate(template="{a}")})
        latest = await store.add_resources({"p": PromptTemplate(template="{b}")})
        await store.enqueue_rollouts(
            [RolloutRequest(input=1), RolloutRequest(input=2, resources_id=pinned.resources_id)]
        )
        assert (await self.claim(store)).attempt.resources_id == latest.resources_id
        assert (await self.claim(store)).attempt.resources_id == pinned.resources_id

    # --- sync facade ---------------------------------------------------------------------------------------------
    async def test_sync_facade_from_plain_threads(self, store: LightningStore) -> None:
        def cycle(sync: SyncLightningStore) -> Sequence[str]:
            rollout = sync.enqueue_rollout({"sync": True})
            claimed = sync.claim_rollout("sync-worker", timeout_s=1)
            assert claimed is not None
            rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
            sync.start_attempt(rid, aid)
            sync.heartbeat(rid, aid)
            sync.add_spans(spans_of(claimed, 2))
            sync.finish_attempt(rid, aid, "succeeded")
            assert [s.sequence_id for s in sync.query_spans(rid)] == [1, 2]
            assert [r.status for r in sync.wait_for_rollouts([rid], timeout_s=1)] == ["succeeded"]
            return [rollout.rollout_id]

        sync = SyncLightningStore(store)
        try:
            ids = await asyncio.to_thread(cycle, sync)
            assert (await store.get_rollout(ids[0])).status == "succeeded"
        finally:
            await asyncio.to_thread(sync.close)  # closes the store too; the fixture's second close is a no-op
