"""Watchdog and SyncLightningStore behaviour beyond the conformance suite: symmetry, guards, errors."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agentlightning.store import InMemoryLightningStore, LightningStore, SyncLightningStore, Watchdog
from agentlightning.types import Attempt
from tests.core.store.fakes import NS, FakeClock


async def test_watchdog_start_and_stop_are_idempotent() -> None:
    watchdog = Watchdog(InMemoryLightningStore(), interval_s=0.01)
    await watchdog.stop()  # never started: no-op
    watchdog.start()
    watchdog.start()
    assert watchdog.running
    await watchdog.stop()
    await watchdog.stop()
    assert not watchdog.running


def test_watchdog_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Watchdog(InMemoryLightningStore(), interval_s=0)


async def test_watchdog_tick_counts_changes() -> None:
    clock = FakeClock()
    store = InMemoryLightningStore(clock=clock)
    await store.enqueue_rollout(1, timeout_s=1)
    assert await store.claim_rollout() is not None
    watchdog = Watchdog(store)
    assert await watchdog.tick() == 0
    clock.advance(2)
    assert await watchdog.tick() == 1


class _FailingStore(InMemoryLightningStore):
    """A store whose watchdog tick fails the first time, as a locked database or a network blip would."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("database is locked")
        return await super().check_timeouts(now)


async def test_watchdog_survives_a_failing_tick(caplog: pytest.LogCaptureFixture) -> None:
    store = _FailingStore()
    with caplog.at_level(logging.ERROR, logger="agentlightning.store.watchdog"):
        async with Watchdog(store, interval_s=0.01):
            for _ in range(200):
                if store.calls >= 3:
                    break
                await asyncio.sleep(0.01)
    assert store.calls >= 3
    assert "watchdog tick failed" in caplog.text


async def test_sync_facade_refuses_its_own_loop_and_closes_once() -> None:
    store = InMemoryLightningStore()
    sync = SyncLightningStore(store)
    rollout = await asyncio.to_thread(sync.enqueue_rollout, "x", max_attempts=2)
    assert rollout.config.max_attempts == 2

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="deadlock"):
            sync.get_rollout(rollout.rollout_id)

    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(inside(), sync._ensure_loop()))  # pyright: ignore[reportPrivateUsage]  # reach the facade's own loop
    await asyncio.to_thread(sync.close)
    await asyncio.to_thread(sync.close)


def test_sync_facade_context_manager_closes_store() -> None:
    closed: list[bool] = []

    class Recording(InMemoryLightningStore):
        async def close(self) -> None:
            closed.append(True)

    store: LightningStore = Recording()
    with SyncLightningStore(store) as sync:
        rollout = sync.enqueue_rollout(1)
        assert sync.check_timeouts(now=rollout.enqueue_time + 10 * NS) == []
        assert sync.statistics().total_rollouts == 1
    assert closed == [True]


async def test_a_cancel_that_lands_as_the_change_notifier_fires_is_not_lost() -> None:
    # On Python 3.11 asyncio.wait_for returned the finished future's result instead of raising the cancel that landed
    # in the same loop turn; a waiter polling in a loop (the async trainer's rollout collector) then never ended.
    from agentlightning.store._statemachine import ChangeNotifier

    notifier = ChangeNotifier()

    async def poller() -> None:
        while True:
            await notifier.wait(notifier.generation, 10.0)

    task = asyncio.create_task(poller())
    await asyncio.sleep(0)  # the poller is waiting
    notifier.notify()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert done and task.cancelled()


async def test_the_change_notifier_wakes_on_notify_and_on_timeout() -> None:
    from agentlightning.store._statemachine import ChangeNotifier

    notifier = ChangeNotifier()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await notifier.wait(notifier.generation, 0.05)  # nothing happens: returns at the timeout
    assert 0.04 <= loop.time() - started < 1.0
    waiter = asyncio.create_task(notifier.wait(notifier.generation, 10.0))
    await asyncio.sleep(0)
    notifier.notify()
    await asyncio.wait_for(waiter, 1.0)  # woken by the notify, long before its timeout
    await notifier.wait(notifier.generation - 1, 10.0)  # a notify since that generation: returns at once
