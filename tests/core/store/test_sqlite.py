"""The conformance suite against SqliteLightningStore, plus durability, processes and schema versions."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentlightning.store import LightningStore, SqliteLightningStore, StoreError, SyncLightningStore
from agentlightning.store._sqlite_schema import ROLLOUT_COLUMNS, rollout_values
from agentlightning.store.sqlite import MIGRATIONS
from agentlightning.types import MetricsRecord, Rollout, RolloutRequest
from tests.core.store.conformance import FakeClock, StoreConformance, spans_of

CHILD = str(Path(__file__).with_name("_sqlite_child.py"))


class TestSqliteStore(StoreConformance):
    """SqliteLightningStore passes the shared suite."""

    @pytest.fixture
    async def store(self, clock: FakeClock, tmp_path: Path) -> AsyncIterator[LightningStore]:
        store = SqliteLightningStore(tmp_path / "store.db", clock=clock)
        yield store
        await store.close()


async def test_everything_survives_reopening(tmp_path: Path) -> None:
    db = tmp_path / "reopen.db"
    store = SqliteLightningStore(db)
    await store.enqueue_rollouts([RolloutRequest(input={"i": i}, metadata={"m": i}) for i in range(3)])
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    await store.add_spans(spans_of(claimed, 3))
    snapshot = await store.add_resources({})
    await store.close()
    await store.close()  # idempotent

    again = SqliteLightningStore(db)
    assert [r.input for r in await again.query_rollouts()] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert (await again.get_rollout(claimed.rollout.rollout_id)).status == "preparing"
    assert [s.sequence_id for s in await again.query_spans(claimed.rollout.rollout_id)] == [1, 2, 3]
    assert await again.get_resources() == snapshot
    more = await again.add_spans(spans_of(claimed, 2, start=3))
    assert [s.sequence_id for s in more] == [4, 5]
    assert again.schema_version == MIGRATIONS[-1][0]
    await again.close()


async def test_a_version_3_database_gets_the_metrics_table_and_keeps_its_rows(tmp_path: Path) -> None:
    # A store.db written before algorithm metrics existed (schema version 3) opens, migrates, and keeps its rollouts.
    db = tmp_path / "v3.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description TEXT, applied_time INTEGER)")
    for version, description, statements in MIGRATIONS[:3]:
        for statement in statements.split(";"):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (version, description))
    old = Rollout(rollout_id="ro-old", input={"before": True}, enqueue_time=1)
    conn.execute(f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rollout_values(old))
    conn.close()

    store = SqliteLightningStore(db)
    assert store.schema_version == 4 == MIGRATIONS[-1][0]
    assert await store.query_rollouts() == [old]
    await store.add_metrics([MetricsRecord(run_id="r", step=1, values={"reward_mean": 0.5})])
    await store.close()
    reopened = SqliteLightningStore(db)  # the migration ran once: reopening neither repeats it nor loses the row
    assert [(r.run_id, r.step, r.values) for r in await reopened.query_metrics()] == [("r", 1, {"reward_mean": 0.5})]
    await reopened.close()


async def test_closed_store_says_so(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "closed.db")
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.enqueue_rollout(1)


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "future.db"
    await SqliteLightningStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_version VALUES (999, 'from the future', 0)")
    conn.close()
    with pytest.raises(StoreError, match=r"schema version 999.*upgrade"):
        SqliteLightningStore(db)


def test_memory_path_is_refused() -> None:
    with pytest.raises(ValueError, match="InMemoryLightningStore"):
        SqliteLightningStore(":memory:")


async def test_non_json_input_is_refused_and_nothing_written(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "json.db")
    with pytest.raises(ValueError, match="JSON"):
        await store.enqueue_rollouts([RolloutRequest(input=1), RolloutRequest(input={1, 2})])
    assert await store.query_rollouts() == []
    await store.close()


def test_claimers_in_separate_processes_never_share(tmp_path: Path) -> None:
    db = str(tmp_path / "procs.db")
    store = SyncLightningStore(SqliteLightningStore(db))
    rollouts = store.enqueue_rollouts([RolloutRequest(input=i) for i in range(150)])
    ready = tmp_path / "ready"
    ready.mkdir()
    children = [
        subprocess.Popen([sys.executable, CHILD, "claim", db, str(ready), "3"], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [child.communicate(timeout=60)[0].split() for child in children]
    assert all(child.returncode == 0 for child in children)
    claimed = [rid for out in outputs for rid in out]
    assert len(claimed) == len(set(claimed)) == 150
    assert set(claimed) == {r.rollout_id for r in rollouts}
    # Claims interleaved: more than one process got work (they started together behind a barrier).
    assert sum(1 for out in outputs if out) >= 2
    assert store.statistics().attempts_by_status == {"preparing": 150}
    store.close()


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_acknowledged_spans_survive_kill_9(tmp_path: Path, synchronous: str) -> None:
    db = str(tmp_path / "durable.db")
    store = SyncLightningStore(SqliteLightningStore(db))
    store.enqueue_rollout("durable")
    claimed = store.claim_rollout("w")
    assert claimed is not None
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    store.close()

    cmd = [sys.executable, CHILD, "spans", db, rid, aid, synchronous]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked = 0
    try:
        for line in child.stdout:
            acked = int(line.split()[1])
            if acked >= 200:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)  # right after an acknowledgement, while it keeps writing
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert acked >= 200

    reopened = SyncLightningStore(SqliteLightningStore(db))
    stored = reopened.query_spans(rid, aid)
    assert {f"{i:016x}" for i in range(1, acked + 1)} <= {s.span_id for s in stored}
    assert [s.sequence_id for s in stored] == list(range(1, len(stored) + 1))
    reopened.close()


async def test_waits_and_id_queries_look_rollouts_up_by_id_not_by_status(tmp_path: Path) -> None:
    # Through the status index SQLite read every terminal rollout of the store on each poll of a wait: its cost grew
    # with the store (5.4 ms for 384 ids in a 12,672-rollout store against 0.3 ms by key), and an async trainer polls
    # its rollouts in flight many times a second.
    store = SqliteLightningStore(tmp_path / "plans.db")
    try:
        rollouts = await store.enqueue_rollouts([RolloutRequest(input={"i": i}) for i in range(200)])
        for rollout in rollouts[:150]:
            await store.cancel_rollout(rollout.rollout_id)
        ids = [r.rollout_id for r in rollouts[140:160]]
        statements: list[str] = []
        with store._read() as conn:  # pyright: ignore[reportPrivateUsage]  # the test reads the store's plans
            conn.set_trace_callback(statements.append)
        try:
            assert len(await store.wait_for_rollouts(ids, timeout_s=0.0)) == 10
            found = await store.query_rollouts(rollout_ids=ids, status=["cancelled"], mode="train")
            assert found == []
            assert len(await store.query_rollouts(rollout_ids=ids, status=["cancelled"])) == 10
        finally:
            with store._read() as conn:  # pyright: ignore[reportPrivateUsage]
                conn.set_trace_callback(None)
        by_ids = [sql for sql in statements if "json_each" in sql and sql.lstrip().upper().startswith("SELECT")]
        assert by_ids, statements
        with store._read() as conn:  # pyright: ignore[reportPrivateUsage]
            for sql in by_ids:
                plan = " | ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
                assert "rollouts_status" not in plan and "rollout_id=?" in plan, (sql, plan)
    finally:
        await store.close()
