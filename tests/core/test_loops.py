"""agentlightning._loops: loops agentlightning creates are closed as asyncio.run closes its own."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import pytest

from agentlightning import _loops
from agentlightning._loops import close_loop, run_forever_then_close
from agentlightning.store import InMemoryLightningStore, SyncLightningStore


class _Leftovers:
    """A task parked on an event and an async generator suspended mid-iteration, as a connection pool leaves them."""

    def __init__(self) -> None:
        self.task_finally_ran = False
        self.generator_closed = False

    async def _park(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            self.task_finally_ran = True

    async def _generate(self) -> AsyncIterator[int]:
        try:
            yield 1
            await asyncio.Event().wait()
        finally:
            self.generator_closed = True

    async def start(self) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._park())
        generator = self._generate()
        assert await anext(generator) == 1
        self._generator = generator  # kept alive, suspended at its yield
        await asyncio.sleep(0)
        return task


def test_close_loop_cancels_tasks_and_closes_async_generators() -> None:
    loop = asyncio.new_event_loop()
    leftovers = _Leftovers()
    task = loop.run_until_complete(leftovers.start())
    close_loop(loop)
    assert loop.is_closed()
    assert task.cancelled()
    assert leftovers.task_finally_ran
    assert leftovers.generator_closed
    close_loop(loop)  # a closed loop is left as it is


def test_close_loop_does_not_hang_on_a_task_that_ignores_cancellation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_loops, "CANCEL_WAIT_S", 0.05)
    loop = asyncio.new_event_loop()
    release = asyncio.Event()

    async def stubborn() -> None:
        while True:
            try:
                await release.wait()
                return
            except asyncio.CancelledError:
                continue

    async def start() -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0)
        return task

    task = loop.run_until_complete(start())
    with caplog.at_level(logging.WARNING, logger="agentlightning._loops"):
        close_loop(loop)
    assert loop.is_closed()
    assert not task.done()
    assert "ignored cancellation" in caplog.text


def test_a_loop_thread_closes_its_loop_with_its_leftovers() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=run_forever_then_close, args=(loop,), daemon=True)
    thread.start()
    leftovers = _Leftovers()
    task = asyncio.run_coroutine_threadsafe(leftovers.start(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    assert not thread.is_alive()
    assert loop.is_closed()
    assert task.cancelled() and leftovers.task_finally_ran and leftovers.generator_closed


def test_sync_store_close_cancels_what_the_store_left_on_its_loop() -> None:
    sync = SyncLightningStore(InMemoryLightningStore())
    sync.enqueue_rollout({"task": 1})  # starts the loop thread
    leftovers = _Leftovers()
    loop = sync._ensure_loop()  # pyright: ignore[reportPrivateUsage]
    task = asyncio.run_coroutine_threadsafe(leftovers.start(), loop).result(5)
    sync.close()
    assert loop.is_closed()
    assert task.cancelled() and leftovers.task_finally_ran and leftovers.generator_closed


async def test_close_loop_from_a_coroutine_closes_another_loop() -> None:
    # This thread runs the test's loop and cannot run a second one: the close happens on a helper thread instead.
    loop = asyncio.new_event_loop()
    leftovers = _Leftovers()
    tasks: list[asyncio.Task[None]] = []
    starter = threading.Thread(target=lambda: tasks.append(loop.run_until_complete(leftovers.start())))
    starter.start()
    starter.join()
    close_loop(loop)
    assert loop.is_closed()
    assert tasks[0].cancelled() and leftovers.task_finally_ran and leftovers.generator_closed
