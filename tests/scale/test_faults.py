"""Faults at scale, on loopback: a store server killed mid-ingest, runners killed mid-rollout, a stalled network.

Every test is bounded in time: waits have deadlines, and the processes it started are killed on the way out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from agentlightning.client import LightningStoreClient
from agentlightning.store import StoreError, Watchdog
from agentlightning.testing.store_server import StoreServerProcess
from agentlightning.types import RolloutConfig, RolloutRequest, Span
from tests.scale._support import RunnerProcess, StallProxy

SENDERS = 4
BATCH = 20


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll ``condition`` every 50 ms; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


def span(rollout_id: str, attempt_id: str, sender: int, index: int) -> Span:
    """A small span with an id unique per (sender, index)."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id=f"{sender + 1:032x}",
        span_id=f"{sender:02x}{index:014x}",
        name="ingest",
        start_time=index,
        end_time=index + 1,
        attributes={"sender": sender, "index": index},
    )


async def test_acknowledged_spans_survive_store_server_kill_9(server: StoreServerProcess) -> None:
    server.start()
    client = LightningStoreClient(server.url, max_retries=20, max_backoff_s=0.5)
    try:
        await client.enqueue_rollout({"task": "ingest"})
        claimed = await client.claim_rollout("ingest")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await client.start_attempt(rid, aid)
        acked: set[str] = set()
        failures: list[str] = []
        stop = asyncio.Event()

        async def sender(n: int) -> None:
            index = 0
            while not stop.is_set():
                batch = [span(rid, aid, n, index + i) for i in range(BATCH)]
                try:
                    await client.add_spans(batch)
                except StoreError as exc:  # the server stayed down through every retry: resend the same batch
                    failures.append(str(exc))
                    await asyncio.sleep(0.1)
                    continue
                acked.update(s.span_id for s in batch)
                index += BATCH

        async def acked_at_least(n: int) -> bool:
            return len(acked) >= n

        senders = [asyncio.create_task(sender(n)) for n in range(SENDERS)]
        try:
            await until(lambda: acked_at_least(400), 60, "400 acknowledged spans before the kill")
            server.kill9()  # requests are in flight: four senders keep one batch each on the wire
            at_kill = len(acked)
            await asyncio.sleep(0.2)
            await asyncio.to_thread(server.start)  # same port; the senders keep retrying meanwhile
            await until(lambda: acked_at_least(at_kill + 400), 60, "400 more acknowledged spans after the restart")
        finally:
            stop.set()
            await asyncio.gather(*senders)
        stored = await client.query_spans(rid, aid)
        stored_ids = [s.span_id for s in stored]
        assert acked <= set(stored_ids), f"{len(acked - set(stored_ids))} acknowledged spans lost"
        assert len(stored_ids) == len(set(stored_ids)), "a retried batch was stored twice"
        assert [s.sequence_id for s in stored] == list(range(1, len(stored) + 1))
        # The clients resumed on their own: the attempt is still live and takes its end.
        await client.finish_attempt(rid, aid, "succeeded")
        assert (await client.get_rollout(rid)).status == "succeeded"
    finally:
        await client.close()


async def test_killed_runners_rollouts_are_retried_and_finish_once(pg_server: StoreServerProcess) -> None:
    client = LightningStoreClient(pg_server.url)
    runners = [RunnerProcess(pg_server.url, "slow", f"victim{i}", workers=4) for i in range(2)]
    try:
        config = RolloutConfig(heartbeat_timeout_s=1.5, max_attempts=3)
        requests = [RolloutRequest(input={"i": i, "sleep_s": 0.4}, config=config) for i in range(40)]
        rollouts = await client.enqueue_rollouts(requests)
        ids = [r.rollout_id for r in rollouts]

        async def running_attempts(n: int) -> bool:
            return (await client.statistics()).attempts_by_status.get("running", 0) >= n

        await until(lambda: running_attempts(6), 60, "both victim runners to run attempts")
        for victim in runners:
            victim.kill9()
        survivor = RunnerProcess(pg_server.url, "slow", "survivor", workers=8)
        runners.append(survivor)
        async with Watchdog(client, interval_s=0.2):
            done = await client.wait_for_rollouts(ids, timeout_s=90)
        assert len(done) == len(ids), f"{len(ids) - len(done)} rollouts never finished"
        stats = await asyncio.to_thread(survivor.finish)
        assert stats["failed"] == 0 and stats["lost"] == 0, stats
        retried = 0
        for rollout in done:
            assert rollout.status == "succeeded", rollout
            statuses = [a.status for a in await client.query_attempts(rollout.rollout_id)]
            assert statuses.count("succeeded") == 1 and statuses[-1] == "succeeded", statuses
            assert set(statuses[:-1]) <= {"unresponsive"}, statuses
            retried += len(statuses) > 1
        assert retried >= 6, "the killed runners' attempts should have been retried"
    finally:
        for runner in runners:
            runner.kill_quietly()
        await client.close()


async def test_network_stall_times_out_heartbeats_and_requeues(pg_server: StoreServerProcess) -> None:
    proxy = await StallProxy(pg_server.port).start()
    client = LightningStoreClient(pg_server.url)
    stalled = RunnerProcess(proxy.url, "slow", "stalled", workers=1, max_rollouts=1)
    rescuer: RunnerProcess | None = None
    try:
        rollout = await client.enqueue_rollout({"i": 0, "sleep_s": 2.5}, heartbeat_timeout_s=1.0, max_attempts=2)
        rid = rollout.rollout_id

        async def attempt_running() -> bool:
            attempts = await client.query_attempts(rid)
            return bool(attempts) and attempts[-1].status == "running"

        await until(attempt_running, 60, "the runner behind the proxy to start the attempt")
        proxy.pause()  # heartbeats, spans and the final result of the stalled runner now hang on the wire
        async with Watchdog(client, interval_s=0.2):

            async def requeued() -> bool:
                return (await client.get_rollout(rid)).status in ("requeuing", "preparing", "running")

            await until(lambda: _first_attempt_is(client, rid, "unresponsive"), 15, "the heartbeat timeout")
            assert await requeued()
            rescuer = RunnerProcess(pg_server.url, "slow", "rescuer", workers=1, max_rollouts=1)
            done = await client.wait_for_rollouts([rid], timeout_s=60)
        assert [r.status for r in done] == ["succeeded"]
        proxy.resume()  # the stalled runner's late result arrives now, and is refused
        stalled_stats = await asyncio.to_thread(stalled.finish)  # the proxy runs on this loop: do not block it
        assert stalled_stats["lost"] == 1 and stalled_stats["succeeded"] == 0, stalled_stats
        assert (await asyncio.to_thread(rescuer.finish))["succeeded"] == 1
        attempts = await client.query_attempts(rid)
        assert [a.status for a in attempts] == ["unresponsive", "succeeded"]
        assert [a.worker_id for a in attempts] == ["stalled-w0", "rescuer-w0"]
        assert (await client.get_rollout(rid)).status == "succeeded"
    finally:
        proxy.resume()
        stalled.kill_quietly()
        if rescuer is not None:
            rescuer.kill_quietly()
        await proxy.close()
        await client.close()


async def _first_attempt_is(client: LightningStoreClient, rollout_id: str, status: str) -> bool:
    attempts = await client.query_attempts(rollout_id)
    return bool(attempts) and attempts[0].status == status
