"""Group commit in SqliteLightningStore: concurrent writes share commits, yet each succeeds or fails on its own.

Commits are counted with SQLite's statement trace on the store's connection (the only way to see that writes were
grouped; everything else is checked through the public interface).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from agentlightning.store import IllegalTransitionError, NotFoundError, SqliteLightningStore, SyncLightningStore
from agentlightning.types import Attempt, ClaimedRollout, RolloutRequest, Span
from tests.core.store.fakes import make_span, spans_of

CHILD = str(Path(__file__).with_name("_sqlite_child.py"))


def _count_commits(store: SqliteLightningStore) -> list[str]:
    """Every COMMIT the store's connection runs from now on is appended to the returned list."""
    commits: list[str] = []
    conn: sqlite3.Connection = getattr(store, "_conn")  # noqa: B009 (private: the test inspects the mechanism)
    conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    return commits


async def _claimed(store: SqliteLightningStore, count: int) -> list[ClaimedRollout]:
    await store.enqueue_rollouts([RolloutRequest(input=i) for i in range(count)])
    claims = [await store.claim_rollout(f"w{i}") for i in range(count)]
    assert all(c is not None for c in claims)
    return [c for c in claims if c is not None]


async def test_concurrent_writes_share_one_commit(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "group.db")
    claims = await _claimed(store, 16)
    commits = _count_commits(store)
    started = await asyncio.gather(*(store.start_attempt(c.rollout.rollout_id, c.attempt.attempt_id) for c in claims))
    assert [a.status for a in started] == ["running"] * 16
    assert len(commits) == 1
    stored = await asyncio.gather(*(store.add_spans(spans_of(c, 3)) for c in claims))
    assert all([s.sequence_id for s in batch] == [1, 2, 3] for batch in stored)
    assert len(commits) == 2
    await store.close()


async def test_a_lone_write_commits_at_once(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "alone.db")
    commits = _count_commits(store)
    await store.enqueue_rollout(1)
    assert commits == ["COMMIT"]  # returned after its own commit, without waiting for company
    await store.close()


async def _ticking(stop: asyncio.Event, gaps: list[float]) -> None:
    """Record how long each turn of the event loop took while ``stop`` is unset."""
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


@pytest.mark.parametrize("company", [1, 16])
async def test_a_write_waits_for_another_process_lock_without_holding_the_loop(tmp_path: Path, company: int) -> None:
    """Another connection's write transaction makes the store's writes wait, not its event loop (SQLite's busy
    handler would sleep inside the call); they all commit once the lock is free."""
    db = tmp_path / "locked.db"
    store = SqliteLightningStore(db)
    await store.enqueue_rollout("warm")  # the schema exists before the other connection locks the file
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    stop, gaps = asyncio.Event(), list[float]()
    ticker = asyncio.create_task(_ticking(stop, gaps))
    writes = asyncio.gather(*(store.enqueue_rollout(i) for i in range(company)))
    await asyncio.sleep(0.3)
    assert not writes.done()  # still waiting for the lock...
    other.execute("COMMIT")  # ...which is released here
    started = time.perf_counter()
    rollouts = await writes
    assert time.perf_counter() - started < 1.0
    stop.set()
    await ticker
    other.close()
    assert len(rollouts) == company
    assert max(gaps) < 0.1  # the loop kept turning: a blocking wait would have held it for the whole 0.3 s
    assert (await store.statistics()).total_rollouts == company + 1
    await store.close()


def test_writes_from_several_loops_wait_out_another_process_lock_and_all_land(tmp_path: Path) -> None:
    """Writes of callers on different threads' loops, queued behind another connection's lock, all commit once it
    is released, whichever loop's flush found them waiting."""
    db = tmp_path / "loops.db"
    store = SqliteLightningStore(db)
    SyncLightningStore(store).enqueue_rollout("warm")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    errors: list[BaseException] = []

    def run(thread: int) -> None:
        async def work() -> None:
            await asyncio.gather(*(store.enqueue_rollout(f"{thread}-{i}") for i in range(8)))

        try:
            asyncio.run(work())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    assert all(thread.is_alive() for thread in threads)  # every caller is still waiting for the lock
    other.execute("COMMIT")
    other.close()
    for thread in threads:
        thread.join(timeout=10)
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    assert SyncLightningStore(store).statistics().total_rollouts == 1 + 4 * 8


async def test_a_write_locked_out_past_the_busy_timeout_fails_and_the_next_one_lands(tmp_path: Path) -> None:
    db = tmp_path / "timeout.db"
    store = SqliteLightningStore(db, busy_timeout_s=0.2)
    await store.enqueue_rollout("warm")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    started = time.perf_counter()
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        await store.enqueue_rollout("blocked")
    assert 0.2 <= time.perf_counter() - started < 2.0
    other.execute("COMMIT")
    other.close()
    await store.enqueue_rollout("after")
    inputs = [r.input for r in await store.query_rollouts()]
    assert inputs == ["warm", "after"]  # the failed write left nothing behind
    await store.close()


async def test_combined_calls_commit_once(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "combined.db")
    await store.enqueue_rollout(1)
    commits = _count_commits(store)
    claimed = await store.claim_and_start("w")
    assert claimed is not None and claimed.attempt.status == "running"
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    finished = await store.finish_attempt_with_spans(rid, aid, "succeeded", spans_of(claimed, 3))
    assert finished.status == "succeeded" and len(commits) == 2
    # A refused finish keeps the spans, committed with the refusal, as add_spans then finish_attempt would.
    with pytest.raises(IllegalTransitionError):
        await store.finish_attempt_with_spans(rid, aid, "failed", spans_of(claimed, 2, start=3))
    assert len(commits) == 3 and len(await store.query_spans(rid)) == 5
    await store.close()


async def test_one_failing_write_does_not_fail_the_others(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "errors.db")
    first, second, third = await _claimed(store, 3)
    await store.add_spans(spans_of(third, 2))
    commits = _count_commits(store)
    results = await asyncio.gather(
        store.start_attempt(first.rollout.rollout_id, first.attempt.attempt_id),
        store.start_attempt(second.rollout.rollout_id, "at-ghost"),
        store.finish_attempt(third.rollout.rollout_id, third.attempt.attempt_id, "succeeded"),
        store.finish_attempt(third.rollout.rollout_id, third.attempt.attempt_id, "failed"),
        store.add_spans([*spans_of(third, 3), make_span(second, 0)]),  # two stored before: looked up, not doubled
        store.enqueue_rollouts([RolloutRequest(input=1), RolloutRequest(input={1, 2})]),  # not JSON
        store.add_spans([make_span(second, 5), make_span(first, 0).model_copy(update={"attempt_id": "at-ghost"})]),
        return_exceptions=True,
    )
    assert len(commits) == 1
    started, ghost, finished, twice, spans, not_json, half_known = results
    assert isinstance(started, Attempt) and started.status == "running"
    assert isinstance(ghost, NotFoundError)
    assert isinstance(finished, Attempt) and finished.status == "succeeded"
    assert isinstance(twice, IllegalTransitionError)
    assert isinstance(spans, list) and [s.sequence_id for s in cast("list[Span]", spans)] == [1, 2, 3, 1]
    assert isinstance(not_json, ValueError)
    assert isinstance(half_known, NotFoundError)
    assert [s.span_id for s in await store.query_spans(second.rollout.rollout_id)] == [make_span(second, 0).span_id]
    assert len(await store.query_spans(third.rollout.rollout_id)) == 3
    assert (await store.statistics()).total_rollouts == 3
    await store.close()


async def test_a_write_that_fails_after_writing_is_undone_alone(tmp_path: Path) -> None:
    """Spans for a known then an unknown attempt: the first attempt's rows were written before the error."""
    store = SqliteLightningStore(tmp_path / "partial.db")
    first, second = await _claimed(store, 2)
    ghost = make_span(second, 1).model_copy(update={"attempt_id": "at-ghost"})
    results = await asyncio.gather(
        store.add_spans(spans_of(first, 2)),
        store.add_spans([make_span(second, 0), ghost]),
        store.add_spans(spans_of(first, 2, start=2)),
        return_exceptions=True,
    )
    assert isinstance(results[1], NotFoundError)
    assert [s.sequence_id for s in await store.query_spans(first.rollout.rollout_id)] == [1, 2, 3, 4]
    assert await store.query_spans(second.rollout.rollout_id) == []
    again = await store.add_spans([make_span(second, 0)])
    assert [s.sequence_id for s in again] == [1]  # the undone write's reservation left no gap
    await store.close()


async def test_a_span_heartbeat_is_kept_by_a_later_write_in_the_same_transaction(tmp_path: Path) -> None:
    """Rows one write read are not reused by a later one after spans changed them behind the row cache."""
    ticks = itertools.count(1_000_000)
    store = SqliteLightningStore(tmp_path / "cache.db", clock=lambda: next(ticks))  # every call a later time
    (claimed,) = await _claimed(store, 1)
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    commits = _count_commits(store)
    started, spans, _finished = await asyncio.gather(
        store.start_attempt(rid, aid),  # reads the attempt into the row cache
        store.add_spans(spans_of(claimed, 1)),  # a heartbeat, later
        store.finish_attempt(rid, aid, "succeeded"),
    )
    assert len(commits) == 1
    (attempt,) = await store.query_attempts(rid)
    assert attempt.last_heartbeat_time is not None and started.last_heartbeat_time is not None
    assert attempt.status == "succeeded" and attempt.last_heartbeat_time > started.last_heartbeat_time
    assert spans[0].sequence_id == 1
    await store.close()


def test_checkpoints_run_in_the_background_and_stop_with_the_store(tmp_path: Path) -> None:
    db = tmp_path / "checkpoint.db"
    store = SyncLightningStore(SqliteLightningStore(db))
    store.enqueue_rollouts([RolloutRequest(input="x" * 1000) for _ in range(300)])
    assert f"agentlightning-sqlite-checkpoint {db}" in {t.name for t in threading.enumerate()}
    # Committed to the WAL; only a checkpoint copies pages into the file, and SQLite's own (the backstop) would not
    # start before 64 MB.
    for _ in range(200):
        if os.path.getsize(db) >= 300_000:
            break
        time.sleep(0.01)
    assert os.path.getsize(db) >= 300_000
    store.close()
    assert not [t for t in threading.enumerate() if t.name == f"agentlightning-sqlite-checkpoint {db}"]
    again = SyncLightningStore(SqliteLightningStore(db))
    assert len(again.query_rollouts()) == 300
    again.close()


def test_writes_from_many_threads_and_loops_all_land(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "threads.db")
    errors: list[BaseException] = []

    def run() -> None:
        async def work() -> None:
            for _ in range(20):
                await asyncio.gather(*(store.enqueue_rollout(i) for i in range(4)))

        try:
            asyncio.run(work())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert SyncLightningStore(store).statistics().total_rollouts == 6 * 20 * 4


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_acknowledged_grouped_writes_survive_kill_9(tmp_path: Path, synchronous: str) -> None:
    db = str(tmp_path / "grouped.db")
    store = SyncLightningStore(SqliteLightningStore(db))
    store.enqueue_rollout("durable")
    claimed = store.claim_rollout("w")
    assert claimed is not None
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    store.close()

    child = subprocess.Popen(
        [sys.executable, CHILD, "grouped", db, rid, aid, synchronous], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    acked: set[str] = set()
    try:
        for line in child.stdout:
            acked.add(f"{int(line.split()[1]):016x}")
            if len(acked) >= 200:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)  # right after an acknowledgement, while the other tasks keep writing
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    reopened = SyncLightningStore(SqliteLightningStore(db))
    stored = reopened.query_spans(rid, aid)
    assert acked <= {s.span_id for s in stored}
    assert [s.sequence_id for s in stored] == list(range(1, len(stored) + 1))
    reopened.close()
