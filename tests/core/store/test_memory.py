"""The conformance suite against InMemoryLightningStore, plus memory-only behaviour."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentlightning.store import InMemoryLightningStore, LightningStore
from tests.core.store.conformance import FakeClock, StoreConformance


class TestInMemoryStore(StoreConformance):
    """InMemoryLightningStore passes the shared suite."""

    @pytest.fixture
    async def store(self, clock: FakeClock) -> AsyncIterator[LightningStore]:
        store = InMemoryLightningStore(clock=clock)
        yield store
        await store.close()


async def test_store_times_come_from_the_clock() -> None:
    clock = FakeClock(start_ns=5_000)
    store = InMemoryLightningStore(clock=clock)
    rollout = await store.enqueue_rollout(1)
    clock.advance(1)
    claimed = await store.claim_rollout()
    assert claimed is not None
    assert rollout.enqueue_time == 5_000
    assert claimed.attempt.start_time == claimed.rollout.start_time == 5_000 + 1_000_000_000
