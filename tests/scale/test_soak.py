"""Soak: 64 runner workers (2 processes x 32) over HTTP against one store server: no errors, bounded server memory.

CI runs it for 60 s. Full length (10 minutes), as the issue asks:
``AGL_SOAK_SECONDS=600 .venv/bin/python -m pytest tests/scale/test_soak.py``. ``AGL_SOAK_BACKEND=sqlite`` soaks
the SQLite backend instead of PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.store import Watchdog
from agentlightning.testing.store_server import rss_bytes
from agentlightning.types import RolloutRequest
from tests.scale._support import RunnerProcess
from tests.scale.conftest import server_for

SOAK_S = float(os.environ.get("AGL_SOAK_SECONDS", "60"))
BACKEND = os.environ.get("AGL_SOAK_BACKEND", "postgres")
RUNNER_PROCESSES = 2
WORKERS_PER_PROCESS = 32
BATCH = 128
# Growth of the server's RSS from the end of warm-up (a quarter of the run) to the end. A leak of one span or one
# rollout per cycle would pass it within minutes; allocator noise and caches stay well below it.
RSS_GROWTH_BOUND = 64 * 1024 * 1024


@pytest.mark.slow
@pytest.mark.timeout(int(SOAK_S) + 240)
async def test_soak_64_runner_workers_over_http(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    server = server_for(BACKEND, request, tmp_path).start()
    client = LightningStoreClient(server.url)
    runners = [
        RunnerProcess(server.url, "quick", f"soak{i}", workers=WORKERS_PER_PROCESS) for i in range(RUNNER_PROCESSES)
    ]
    samples: list[tuple[float, int]] = []
    began = time.monotonic()
    enqueued = 0
    try:
        async with Watchdog(client, interval_s=1.0):
            in_flight: list[list[str]] = []
            next_sample = began
            while time.monotonic() - began < SOAK_S:
                batch = await client.enqueue_rollouts([RolloutRequest(input={"i": enqueued + i}) for i in range(BATCH)])
                enqueued += BATCH
                in_flight.append([r.rollout_id for r in batch])
                if len(in_flight) > 2:  # two batches queued ahead keep every worker busy
                    oldest = in_flight.pop(0)
                    done = await client.wait_for_rollouts(oldest, timeout_s=120)
                    assert len(done) == len(oldest), "rollouts stalled during the soak"
                if time.monotonic() >= next_sample:
                    samples.append((time.monotonic() - began, rss_bytes(server.pid)))
                    next_sample += 2.0
            for ids in in_flight:
                assert len(await client.wait_for_rollouts(ids, timeout_s=120)) == len(ids)
        elapsed = time.monotonic() - began
        stats = [await asyncio.to_thread(r.finish) for r in runners]
        totals = {key: sum(s[key] for s in stats) for key in stats[0]}
        assert totals["failed"] == 0 and totals["lost"] == 0 and totals["timed_out"] == 0, totals
        assert totals["succeeded"] == enqueued, totals
        store_stats = await client.statistics()
        assert store_stats.rollouts_by_status == {"succeeded": enqueued}
        assert store_stats.attempts_by_status == {"succeeded": enqueued}  # nothing retried: no errors anywhere
        warm = [rss for t, rss in samples if t >= SOAK_S / 4] or [samples[-1][1]]
        baseline, final = statistics.median(warm[: max(1, len(warm) // 5)]), max(warm[-max(1, len(warm) // 5) :])
        mib = 1024 * 1024
        print(
            f"soak {BACKEND}: {enqueued} rollouts in {elapsed:.0f} s ({enqueued / elapsed:.0f}/s), server RSS "
            f"{baseline / mib:.0f} -> {final / mib:.0f} MiB (bound +{RSS_GROWTH_BOUND / mib:.0f} MiB)"
        )
        assert final - baseline <= RSS_GROWTH_BOUND, f"server RSS grew {(final - baseline) / mib:.0f} MiB"
    finally:
        for runner in runners:
            runner.kill_quietly()
        await client.close()
        server.stop()
