"""The store server enforces timeouts itself: its watchdog marks a kill -9'd runner's attempts with no trainer running.

Several watchdogs on one database (two servers, plus a trainer's over HTTP) race over the same timed-out attempts;
the store's atomic ``check_timeouts`` lets each attempt be marked once and each rollout requeued or failed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import httpx
import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.server import DEFAULT_WATCHDOG_INTERVAL_S, StoreServer
from agentlightning.store import InMemoryLightningStore, LightningStore, SqliteLightningStore, Watchdog
from agentlightning.testing.postgres import PostgresCluster, find_postgres_bin, free_port
from agentlightning.types import Attempt, RolloutConfig, RolloutRequest
from tests.core.store.fakes import FakeClock

REPO = Path(__file__).resolve().parents[3]
HEARTBEAT_TIMEOUT_S = 1.0
WATCHDOG_INTERVAL_S = 0.5
# Room for a loaded CI machine (two busy cores here): polling, a slow tick, the runner's last heartbeat timing.
SLACK_S = 5.0
LIVE = ("preparing", "running")


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Poll ``condition`` every 50 ms until true; returns the seconds it took, fails after ``timeout_s``."""
    began = time.monotonic()
    while not await condition():
        assert time.monotonic() - began < timeout_s, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - began


def agl(*args: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``agl ARGS`` in a fresh interpreter at the repository root (so ``tests.…`` agents import)."""
    # A file, not a pipe, takes the output: nobody reads it while the test runs, and a full pipe would block.
    return subprocess.Popen(
        [sys.executable, "-m", "agentlightning.cli", *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
    )


def runner_args(url: str, worker_id: str, workers: int) -> list[str]:
    """``agl runner`` arguments for the agent that hangs on a first attempt and succeeds on a retry."""
    return [
        "runner", "--store", url, "--agent", "tests.core.runner.agents:hang_first_attempt",
        "--workers", str(workers), "--heartbeat-interval", "0.2", "--worker-id", worker_id, "--quiet",
    ]  # fmt: skip


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started; any still alive at the end are killed (only these, by their handle)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


async def test_agl_store_alone_requeues_a_killed_runners_attempts(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]], record_property: Callable[[str, object], None]
) -> None:
    """Store + runners, no trainer: the server's watchdog marks the dead runner's attempts and requeues them."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    output = tmp_path / "agl.log"
    with output.open("wb") as log:
        store_args = ["store", "--path", str(tmp_path / "store.db"), "--port", str(port)]
        server = agl(*store_args, "--watchdog-interval", str(WATCHDOG_INTERVAL_S), log=log)
        processes.append(server)

        async def serving() -> bool:
            assert server.poll() is None, output.read_text()
            with contextlib.suppress(httpx.TransportError):
                async with httpx.AsyncClient() as http:
                    return (await http.get(f"{url}/health")).status_code == 200
            return False

        await until(serving, 30, "agl store to serve")
        client = LightningStoreClient(url)
        try:
            config = RolloutConfig(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, max_attempts=2)
            rollouts = await client.enqueue_rollouts([RolloutRequest(input={"i": i}, config=config) for i in range(3)])
            ids = [r.rollout_id for r in rollouts]
            victim = agl(*runner_args(url, "victim", workers=3), log=log)
            processes.append(victim)

            async def inside_the_agent() -> bool:  # each attempt has sent its first span: the agent now hangs
                assert victim.poll() is None, output.read_text()
                return all([await client.query_spans(rid, "latest") for rid in ids])

            await until(inside_the_agent, 30, "the victim runner to start every attempt")
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)

            async def requeued() -> bool:
                for rid in ids:
                    attempts = await client.query_attempts(rid)
                    if [a.status for a in attempts] != ["unresponsive"]:
                        return False
                    assert (await client.get_rollout(rid)).status == "requeuing"
                return True

            limit = HEARTBEAT_TIMEOUT_S + WATCHDOG_INTERVAL_S + SLACK_S
            recovery_s = await until(requeued, limit, "the server's watchdog to mark the dead runner's attempts")
            record_property("recovery_s", round(recovery_s, 2))
            print(f"kill -9 to requeued: {recovery_s:.2f} s", file=sys.stderr)  # shown with pytest -s

            rescuer = agl(*runner_args(url, "rescuer", workers=3), "--max-rollouts", "3", log=log)
            processes.append(rescuer)
            done = await client.wait_for_rollouts(ids, timeout_s=60)
            assert [r.status for r in done] == ["succeeded"] * 3
            assert rescuer.wait(timeout=30) == 0, output.read_text()
            for rid in ids:  # each rollout: the dead runner's attempt, then exactly one success
                attempts = await client.query_attempts(rid)
                assert [a.status for a in attempts] == ["unresponsive", "succeeded"]
                assert (attempts[0].worker_id or "").startswith("victim-w")
                assert (attempts[1].worker_id or "").startswith("rescuer-w")
            assert (await client.statistics()).rollouts_by_status == {"succeeded": 3}
        finally:
            await client.close()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0, output.read_text()
    assert f"watchdog every {WATCHDOG_INTERVAL_S:g} s" in output.read_text()


async def test_the_store_servers_watchdog_lives_and_stops_with_the_server() -> None:
    """StoreServer ticks by default, ``watchdog_interval_s=0`` turns it off, and stopping the server stops it."""
    clock = FakeClock()
    store = InMemoryLightningStore(clock=clock)
    with StoreServer(store, watchdog_interval_s=0) as quiet:
        assert not quiet.watchdog_running
    with StoreServer(store) as server:
        assert server.watchdog_interval_s == DEFAULT_WATCHDOG_INTERVAL_S and server.watchdog_running
    assert not server.watchdog_running
    rollout = await store.enqueue_rollout("x", heartbeat_timeout_s=5)
    assert await store.claim_rollout("w") is not None
    clock.advance(6)
    with StoreServer(store, watchdog_interval_s=0.02) as server:

        async def marked() -> bool:
            return (await store.get_rollout(rollout.rollout_id)).status == "failed"

        await until(marked, 10, "the server's watchdog to mark the silent attempt")
    assert not server.watchdog_running
    assert [a.status for a in await store.query_attempts(rollout.rollout_id)] == ["unresponsive"]


@pytest.mark.parametrize("interval", [-1.0, float("nan"), float("inf")])
def test_a_bad_watchdog_interval_is_refused_before_anything_starts(interval: float) -> None:
    with pytest.raises(ValueError, match=r"watchdog_interval_s must be a number of seconds >= 0 \(0 turns"):
        StoreServer(InMemoryLightningStore(), watchdog_interval_s=interval)


# --- several watchdogs on one database -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL server for this module's PostgreSQL case (skipped where it is not installed)."""
    if find_postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (scripts/ensure_postgres.sh installs it)")
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "postgres"])
def open_shared(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Callable[[], LightningStore]:
    """Opens a new handle (own connections, as another server has) on one database that reads ``clock``."""
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        return lambda: SqliteLightningStore(path, clock=clock)
    from agentlightning.store.postgres import PostgresLightningStore

    dsn = request.getfixturevalue("pg_cluster").create_schema()
    return lambda: PostgresLightningStore(dsn, clock=clock)


@pytest.fixture
def clock() -> FakeClock:
    """The time every handle of the shared database reads; it moves only when the test says."""
    return FakeClock()


@pytest.fixture
async def shared(open_shared: Callable[[], LightningStore]) -> AsyncIterator[LightningStore]:
    """The test's own handle on the shared database."""
    store = open_shared()
    yield store
    await store.close()


async def test_two_servers_and_a_trainers_watchdog_mark_each_attempt_once(
    open_shared: Callable[[], LightningStore],
    shared: LightningStore,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two store servers on one database tick every 20 ms, and a trainer-style watchdog ticks through one of them."""
    n = 30
    # Even inputs may retry once, odd ones may not: round 1 requeues the even and fails the odd.
    requests = [
        RolloutRequest(input=i, config=RolloutConfig(heartbeat_timeout_s=5, max_attempts=2 - i % 2)) for i in range(n)
    ]
    rollouts = await shared.enqueue_rollouts(requests)
    retried = {r.rollout_id for r in rollouts if r.input % 2 == 0}

    async def claim_all(count: int) -> None:
        for _ in range(count):
            assert await shared.claim_rollout("w") is not None
        assert await shared.claim_rollout("w") is None

    async def none_live() -> bool:
        by_status = (await shared.statistics()).attempts_by_status
        return not any(by_status.get(status, 0) for status in LIVE)

    await claim_all(n)
    with (
        caplog.at_level(logging.INFO, logger="agentlightning.store.watchdog"),
        StoreServer(open_shared, watchdog_interval_s=0.02) as first,
        StoreServer(open_shared, watchdog_interval_s=0.02) as second,
    ):
        client = LightningStoreClient(first.url)
        try:
            async with Watchdog(client, interval_s=0.02):  # what the trainer's algorithm side runs
                clock.advance(6)  # every attempt is now silent past its heartbeat timeout, for all three at once
                await until(none_live, 30, "the first attempts to be marked")
                await asyncio.sleep(0.2)  # ~10 more ticks each, with nothing left to change
                statuses = {r.rollout_id: r.status for r in await shared.query_rollouts()}
                assert statuses == {rid: "requeuing" if rid in retried else "failed" for rid in statuses}
                await claim_all(len(retried))  # the retries: second attempts, silent in turn
                clock.advance(6)
                await until(none_live, 30, "the second attempts to be marked")
                await asyncio.sleep(0.2)
        finally:
            await client.close()
        assert first.watchdog_running and second.watchdog_running  # alive until the servers stop
    assert not first.watchdog_running and not second.watchdog_running

    marks = Counter(
        str(record.args[0])
        for record in caplog.records
        if record.name == "agentlightning.store.watchdog" and record.getMessage().endswith(" marked unresponsive")
        and isinstance(record.args, tuple)
    )  # fmt: skip
    attempts = {rid: await shared.query_attempts(rid) for rid in statuses}
    every_attempt = [a.attempt_id for listed in attempts.values() for a in listed]
    assert len(every_attempt) == n + len(retried)
    assert marks == dict.fromkeys(every_attempt, 1), "an attempt was marked twice, or never"
    for rollout in await shared.query_rollouts():
        expected = ["unresponsive"] * (2 if rollout.rollout_id in retried else 1)
        assert [a.status for a in attempts[rollout.rollout_id]] == expected
        assert rollout.status == "failed" and rollout.num_attempts == len(expected)


def tick_at_once(open_store: Callable[[], LightningStore], handles: int) -> list[Attempt]:
    """One ``check_timeouts`` on each of ``handles`` handles (threads, own loops), released together; all changes."""
    start_line = threading.Barrier(handles, timeout=30)

    async def tick() -> list[Attempt]:
        store = open_store()
        try:
            await store.statistics()  # connected before the start line, so the ticks really overlap
            start_line.wait()
            return await store.check_timeouts()
        finally:
            await store.close()

    with ThreadPoolExecutor(handles) as pool:
        ticks = [pool.submit(asyncio.run, tick()) for _ in range(handles)]
        return [attempt for done in ticks for attempt in done.result()]


async def test_simultaneous_ticks_on_one_database_end_each_attempt_once(
    open_shared: Callable[[], LightningStore], shared: LightningStore, clock: FakeClock
) -> None:
    """Four ticks released at the same instant (a tighter race than servers ticking on their own schedules)."""
    n = 20
    requests = [
        RolloutRequest(input=i, config=RolloutConfig(heartbeat_timeout_s=5, max_attempts=2 - i % 2)) for i in range(n)
    ]
    rollouts = await shared.enqueue_rollouts(requests)
    retried = {r.rollout_id for r in rollouts if r.input % 2 == 0}
    for _ in range(n):
        assert await shared.claim_rollout("w") is not None
    clock.advance(6)
    changed = await asyncio.to_thread(tick_at_once, open_shared, 4)
    assert sorted(a.rollout_id for a in changed) == sorted(r.rollout_id for r in rollouts)  # each once
    statuses = {r.rollout_id: r.status for r in await shared.query_rollouts()}
    assert statuses == {rid: "requeuing" if rid in retried else "failed" for rid in statuses}
    for _ in retried:
        assert await shared.claim_rollout("w") is not None
    clock.advance(6)
    changed = await asyncio.to_thread(tick_at_once, open_shared, 4)
    assert sorted(a.rollout_id for a in changed) == sorted(retried)
    assert {a.sequence_id for a in changed} == {2}
    assert (await shared.statistics()).rollouts_by_status == {"failed": n}
