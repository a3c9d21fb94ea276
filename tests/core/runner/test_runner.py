"""The runner against real stores: many workers, every failure mode, resources, stop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentlightning.emit import final_reward
from agentlightning.runner import Runner
from agentlightning.store import InMemoryLightningStore, Watchdog
from agentlightning.store.base import LightningStore
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.tracing import get_lightning_tracer
from agentlightning.types import LLM, Attempt, PromptTemplate, Rollout, RolloutConfig, RolloutRequest
from tests.core.runner.agents import COUNTING_SPANS, Misbehaving, counting, counting_sync, sleepy_sync


async def assert_each_finished_once(store: LightningStore, expected: int) -> None:
    """Every rollout succeeded with exactly one attempt, all its spans stored, and its reward present."""
    rollouts = await store.query_rollouts()
    assert len(rollouts) == expected
    assert {r.status for r in rollouts} == {"succeeded"}
    for rollout in rollouts:
        attempts = await store.query_attempts(rollout.rollout_id)
        assert [a.status for a in attempts] == ["succeeded"], rollout.rollout_id
        spans = await store.query_spans(rollout.rollout_id, "latest")
        assert len(spans) == COUNTING_SPANS
        assert {s.attempt_id for s in spans} == {attempts[0].attempt_id}
        assert final_reward(spans) == float(rollout.input["i"] % 7)


async def enqueue_counting(store: LightningStore, n: int) -> None:
    await store.enqueue_rollouts([RolloutRequest(input={"i": i}) for i in range(n)])


@pytest.mark.parametrize("agent", [counting, counting_sync], ids=["async", "sync"])
async def test_200_rollouts_8_workers_memory(agent: Any) -> None:
    store = InMemoryLightningStore()
    await enqueue_counting(store, 200)
    stats = await Runner(agent, store, n_workers=8).run(max_rollouts=200)
    assert (stats.claimed, stats.succeeded, stats.lost) == (200, 200, 0)
    await assert_each_finished_once(store, 200)


async def test_200_rollouts_8_workers_sqlite(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "store.db", synchronous="NORMAL")
    try:
        await enqueue_counting(store, 200)
        stats = await Runner(counting, store, n_workers=8).run(max_rollouts=200)
        assert stats.succeeded == 200
        await assert_each_finished_once(store, 200)
        workers = {a.worker_id for r in await store.query_rollouts() for a in await store.query_attempts(r.rollout_id)}
        assert len(workers) > 1  # the work was spread, not done by one worker
    finally:
        await store.close()


async def _attempt_of(store: LightningStore, rollout: Rollout) -> Attempt:
    (attempt,) = await store.query_attempts(rollout.rollout_id)
    return attempt


async def test_failures_are_recorded_and_the_runner_keeps_going() -> None:
    store = InMemoryLightningStore()
    config = RolloutConfig(timeout_s=0.5)
    actions = ["raise", "hang", "string", "nan", "ok"]
    rollouts = await store.enqueue_rollouts([RolloutRequest(input={"do": a}, config=config) for a in actions])
    hung_sync = await store.enqueue_rollout({"sleep": 5.0}, timeout_s=0.3)

    stats = await Runner(Misbehaving(), store, n_workers=2).run(max_rollouts=len(actions))
    assert (stats.succeeded, stats.failed, stats.timed_out) == (1, 3, 1)
    stats = await Runner(sleepy_sync, store, n_workers=1).run(max_rollouts=1)
    assert stats.timed_out == 1

    got = {a: await _attempt_of(store, r) for a, r in zip(actions, rollouts, strict=True)}
    assert got["raise"].status == "failed"
    assert got["raise"].error == "KeyError: 'no such tool: calculator'"
    assert got["hang"].status == "timeout"
    assert "ran past the attempt timeout of 0.5 s" in (got["hang"].error or "")
    assert got["string"].status == "failed"
    assert (got["string"].error or "").startswith("InvalidRewardError: the agent returned '42' (str)")
    assert got["nan"].status == "failed"
    assert "InvalidRewardError" in (got["nan"].error or "") and "nan" in (got["nan"].error or "")
    assert got["ok"].status == "succeeded"
    ok_spans = await store.query_spans(rollouts[-1].rollout_id, "latest")
    assert final_reward(ok_spans) == 0.5  # the dict named "brevity" as its primary dimension
    sync_attempt = await _attempt_of(store, hung_sync)
    assert sync_attempt.status == "timeout"
    # The raising attempt's exception is also a span of the attempt, next to the error on the attempt record.
    raise_spans = await store.query_spans(rollouts[0].rollout_id, "latest")
    assert any("exception" in s.name for s in raise_spans)
    assert {r.status for r in await store.query_rollouts()} == {"succeeded", "failed"}


async def test_resources_are_injected_with_the_attempt_url() -> None:
    store = InMemoryLightningStore()
    await store.add_resources(
        {
            "llm": LLM(base_url="http://127.0.0.1:4748/v1", model="policy", proxied=True),
            "prompt_template": PromptTemplate(template="Q: {question}"),
        }
    )
    pinned = await store.add_resources({"llm": LLM(base_url="http://127.0.0.1:9/v1", model="old")})
    seen: list[tuple[str, str, str]] = []

    async def agent(task: dict[str, str], llm: LLM, rollout: Rollout, prompt_template: PromptTemplate | None = None):
        template = prompt_template.format(question=task["q"]) if prompt_template else "-"
        seen.append((rollout.rollout_id, llm.base_url, template))

    latest = await store.enqueue_rollout({"q": "2+2?"}, resources_id=None)
    old = await store.enqueue_rollout({"q": "3+3?"}, resources_id=pinned.resources_id)
    # Latest is taken at claim time: publishing `pinned` after enqueueing `latest` means it runs with `pinned`
    # too, so enqueue a third one pinned to the first snapshot to see the proxied URL.
    first = (await store.list_resources())[0]
    proxied = await store.enqueue_rollout({"q": "4+4?"}, resources_id=first.resources_id)
    stats = await Runner(agent, store).run(max_rollouts=3)
    assert stats.succeeded == 3
    by_id = {rid: (url, text) for rid, url, text in seen}
    assert by_id[latest.rollout_id] == ("http://127.0.0.1:9/v1", "-")
    assert by_id[old.rollout_id] == ("http://127.0.0.1:9/v1", "-")
    (attempt,) = await store.query_attempts(proxied.rollout_id)
    assert by_id[proxied.rollout_id] == (
        f"http://127.0.0.1:4748/rollout/{proxied.rollout_id}/attempt/{attempt.attempt_id}/v1",
        "Q: 4+4?",
    )


async def test_missing_resource_fails_the_attempt_with_a_fix() -> None:
    store = InMemoryLightningStore()
    rollout = await store.enqueue_rollout({"q": 1})

    def agent(task: Any, llm: LLM) -> float:
        return 1.0

    await Runner(agent, store).run(max_rollouts=1)
    attempt = await _attempt_of(store, rollout)
    assert attempt.status == "failed"
    assert "AgentSignatureError" in (attempt.error or "") and "add_resources" in (attempt.error or "")


async def test_stop_event_ends_idle_workers() -> None:
    store = InMemoryLightningStore()
    runner = Runner(counting, store, n_workers=4, poll_interval_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop_event=stop))
    await enqueue_counting(store, 5)
    ids = [r.rollout_id for r in await store.query_rollouts()]
    assert len(await store.wait_for_rollouts(ids, timeout_s=5)) == 5
    stop.set()
    stats = await asyncio.wait_for(task, 5)
    assert stats.succeeded == 5


async def test_two_runners_in_one_process_share_the_process_tracer() -> None:
    store = InMemoryLightningStore()
    await enqueue_counting(store, 40)
    first, second = Runner(counting, store, n_workers=2), Runner(counting_sync, store, n_workers=2)
    stats = await asyncio.gather(first.run(max_rollouts=20), second.run(max_rollouts=20))
    assert [s.succeeded for s in stats] == [20, 20]
    await assert_each_finished_once(store, 40)
    assert get_lightning_tracer() is None  # the last runner out shut it down


async def test_heartbeats_keep_a_slow_attempt_alive_under_the_watchdog() -> None:
    store = InMemoryLightningStore()
    rollout = await store.enqueue_rollout({"sleep": 1.0}, heartbeat_timeout_s=0.4, max_attempts=1)
    # The runner's own interval (10 s) is far too slow for this rollout: it must beat faster on its own.
    async with Watchdog(store, interval_s=0.05):
        stats = await Runner(sleepy_sync, store, heartbeat_interval_s=10.0).run(max_rollouts=1)
    assert stats.succeeded == 1
    assert [a.status for a in await store.query_attempts(rollout.rollout_id)] == ["succeeded"]


class _WaitCountingStore(InMemoryLightningStore):
    """A real in-memory store that records how many claims are waiting for work at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0
        self.most_waiting = 0

    async def _counted(self, claim: Any, worker_id: str | None, timeout_s: float | None) -> Any:
        if timeout_s is None:
            return await claim(worker_id)
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        try:
            return await claim(worker_id, timeout_s=timeout_s)
        finally:
            self.waiting -= 1

    async def claim_rollout(self, worker_id: str | None = None, *, timeout_s: float | None = None) -> Any:
        return await self._counted(super().claim_rollout, worker_id, timeout_s)

    async def claim_and_start(self, worker_id: str | None = None, *, timeout_s: float | None = None) -> Any:
        return await self._counted(super().claim_and_start, worker_id, timeout_s)


async def test_idle_workers_take_turns_waiting_for_work() -> None:
    store = _WaitCountingStore()
    runner = Runner(counting, store, n_workers=8, poll_interval_s=0.05)
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0.3)  # every worker is idle: one waits in the store, the others sleep in the runner
    await enqueue_counting(store, 20)
    ids = [r.rollout_id for r in await store.query_rollouts()]
    assert len(await store.wait_for_rollouts(ids, timeout_s=10)) == 20
    runner.stop()
    stats = await asyncio.wait_for(task, 5)
    assert stats.succeeded == 20
    assert store.most_waiting == 1
    await assert_each_finished_once(store, 20)


class _RoundTripStore(InMemoryLightningStore):
    """A memory store whose claims take a round trip, as a remote store's do; records how many claims overlapped
    until ``burst`` rollouts were claimed."""

    def __init__(self, burst: int) -> None:
        super().__init__()
        self.burst = burst
        self.claimed = 0
        self.in_flight = 0
        self.most_in_flight = 0

    async def claim_and_start(self, worker_id: str | None = None, *, timeout_s: float | None = None) -> Any:
        if timeout_s is not None:  # the one idle poller
            claimed = await super().claim_and_start(worker_id, timeout_s=timeout_s)
        else:
            self.in_flight += 1
            if self.claimed < self.burst:
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(0.01)
                claimed = await super().claim_and_start(worker_id)
            finally:
                self.in_flight -= 1
        self.claimed += claimed is not None
        return claimed


async def test_a_burst_is_claimed_by_idle_workers_at_once_not_one_by_one() -> None:
    store = _RoundTripStore(burst=32)
    runner = Runner(sleepy_sync, store, n_workers=32, poll_interval_s=0.05)
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0.3)  # all 32 idle: one polls, 31 sleep
    store.most_in_flight = 0
    await store.enqueue_rollouts([RolloutRequest(input={"sleep": 0.2}) for _ in range(32)])
    ids = [r.rollout_id for r in await store.query_rollouts()]
    assert len(await store.wait_for_rollouts(ids, timeout_s=20)) == 32
    runner.stop()
    stats = await asyncio.wait_for(task, 5)
    assert stats.succeeded == 32
    # Each claim that succeeds wakes two sleepers, so the burst's claims overlap in doubling rounds; through the
    # idle gate they went one at a time (at most 1 in flight until all 32 were claimed).
    assert store.most_in_flight >= 8


class _FlakyStore(InMemoryLightningStore):
    """A memory store whose claims fail while ``down`` is set, as a restarting store server's would."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed_claims = 0
        self.failed_often = asyncio.Event()  # every worker failed, some more than once

    async def claim_and_start(self, worker_id: str | None = None, *, timeout_s: float | None = None) -> Any:
        if self.down:
            self.failed_claims += 1
            if self.failed_claims >= 8:
                self.failed_often.set()
            raise ConnectionError("cannot connect to 127.0.0.1:4747")
        return await super().claim_and_start(worker_id, timeout_s=timeout_s)


async def test_a_store_outage_logs_once_when_it_goes_and_once_when_it_is_back(caplog: pytest.LogCaptureFixture) -> None:
    store = _FlakyStore()
    store.down = True
    runner = Runner(counting, store, n_workers=4, poll_interval_s=0.05)
    with caplog.at_level("WARNING", logger="agentlightning"):
        task = asyncio.create_task(runner.run(max_rollouts=3))
        await asyncio.wait_for(store.failed_often.wait(), 30)
        store.down = False
        await enqueue_counting(store, 3)
        stats = await asyncio.wait_for(task, 30)
    assert stats.succeeded == 3 and runner.gave_up is None
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("agentlightning")]
    assert [line.split(",")[0].split(" after")[0] for line in lines] == ["store unreachable", "store reachable again"]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback per try


async def test_the_runner_gives_up_past_max_store_outage() -> None:
    store = _FlakyStore()
    store.down = True
    runner = Runner(counting, store, n_workers=2, max_store_outage_s=0.5)
    stats = await asyncio.wait_for(runner.run(), 30)
    assert stats.claimed == 0
    assert runner.gave_up is not None and "store unreachable for" in runner.gave_up
    assert "max_store_outage_s=0.5" in runner.gave_up and "cannot connect" in runner.gave_up
    with pytest.raises(ValueError, match="max_store_outage_s must be positive"):
        Runner(counting, store, max_store_outage_s=0)
