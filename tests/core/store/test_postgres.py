"""The conformance suite against PostgresLightningStore on a real PostgreSQL server, plus PostgreSQL specifics.

The server is a throwaway cluster (``agentlightning.testing.postgres``) started once per session; each test gets a
fresh schema. Claims from several processes, migrations and concurrency under SKIP LOCKED are checked here; killing
a store server mid-ingest is in ``tests/scale/test_faults.py``.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, LiteralString, cast

import psycopg
import pytest

from agentlightning._loops import CANCEL_WAIT_S, close_loop
from agentlightning.client import LightningStoreClient
from agentlightning.server import StoreServer
from agentlightning.store import IllegalTransitionError, LightningStore, StoreError, SyncLightningStore
from agentlightning.store._pg_pools import _CLOSE_WAIT_S  # pyright: ignore[reportPrivateUsage]
from agentlightning.store.postgres import MIGRATIONS, PostgresLightningStore
from agentlightning.testing.postgres import PostgresCluster
from agentlightning.tracing import LightningTracer, StoreSpanSink, rollout_context
from agentlightning.types import MetricsRecord, RolloutConfig, RolloutRequest
from tests.core.store.conformance import FakeClock, StoreConformance, spans_of


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """One throwaway PostgreSQL server for the whole session."""
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture
def pg_dsn(pg_cluster: PostgresCluster) -> str:
    """DSN of a fresh, empty schema."""
    return pg_cluster.create_schema()


class TestPostgresStore(StoreConformance):
    """PostgresLightningStore passes the shared suite."""

    @pytest.fixture
    async def store(self, clock: FakeClock, pg_dsn: str) -> AsyncIterator[LightningStore]:
        store = PostgresLightningStore(pg_dsn, clock=clock)
        yield store
        await store.close()


async def test_everything_survives_reopening(pg_dsn: str) -> None:
    store = PostgresLightningStore(pg_dsn)
    await store.enqueue_rollouts([RolloutRequest(input={"i": i}, metadata={"m": i}) for i in range(3)])
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    await store.add_spans(spans_of(claimed, 3))
    snapshot = await store.add_resources({})
    await store.close()
    await store.close()  # idempotent

    again = PostgresLightningStore(pg_dsn)
    assert [r.input for r in await again.query_rollouts()] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert (await again.get_rollout(claimed.rollout.rollout_id)).status == "preparing"
    assert [s.sequence_id for s in await again.query_spans(claimed.rollout.rollout_id)] == [1, 2, 3]
    assert await again.get_resources() == snapshot
    assert [s.sequence_id for s in await again.add_spans(spans_of(claimed, 2, start=3))] == [4, 5]
    assert await again.schema_version() == MIGRATIONS[-1][0]
    await again.close()


async def test_closed_store_says_so(pg_dsn: str) -> None:
    store = PostgresLightningStore(pg_dsn)
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.enqueue_rollout(1)


async def test_newer_schema_is_refused(pg_dsn: str) -> None:
    store = PostgresLightningStore(pg_dsn)
    await store.statistics()
    await store.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_version VALUES (999, 'from the future', 0)")
    newer = PostgresLightningStore(pg_dsn)
    with pytest.raises(StoreError, match=r"schema version 999.*upgrade"):
        await newer.statistics()
    await newer.close()


async def test_unreachable_server_is_explained() -> None:
    store = PostgresLightningStore("postgresql://nobody@127.0.0.1:9/none", connect_timeout_s=0.5)
    with pytest.raises(StoreError, match=r"127\.0\.0\.1:9.*(unreachable|server is up)"):
        await store.statistics()
    await store.close()


def test_bad_arguments_are_explained() -> None:
    with pytest.raises(ValueError, match="DSN"):
        PostgresLightningStore("")
    with pytest.raises(ValueError, match="max_connections"):
        PostgresLightningStore("postgresql://x@127.0.0.1/db", max_connections=0)


async def test_non_json_input_is_refused_and_nothing_written(pg_dsn: str) -> None:
    store = PostgresLightningStore(pg_dsn)
    with pytest.raises(ValueError, match="JSON"):
        await store.enqueue_rollouts([RolloutRequest(input=1), RolloutRequest(input={1, 2})])
    assert await store.query_rollouts() == []
    await store.close()


async def test_servers_starting_together_migrate_once(pg_dsn: str) -> None:
    stores = [PostgresLightningStore(pg_dsn) for _ in range(4)]
    await asyncio.gather(*(s.statistics() for s in stores))
    assert {await s.schema_version() for s in stores} == {MIGRATIONS[-1][0]}
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone() == (len(MIGRATIONS),)
    await asyncio.gather(*(s.close() for s in stores))


_CHILD = """
import asyncio, sys
from agentlightning.store.postgres import PostgresLightningStore

async def main():
    store = PostgresLightningStore(sys.argv[1])
    ids = []
    while (claimed := await store.claim_rollout("p")) is not None:
        ids.append(claimed.rollout.rollout_id)
    await store.close()
    print(" ".join(ids))

asyncio.run(main())
"""


def test_claimers_in_separate_processes_never_share(pg_dsn: str) -> None:
    store = SyncLightningStore(PostgresLightningStore(pg_dsn))
    rollouts = store.enqueue_rollouts([RolloutRequest(input=i) for i in range(150)])
    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, pg_dsn], stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    outputs = [child.communicate(timeout=120)[0].split() for child in children]
    assert all(child.returncode == 0 for child in children)
    claimed = [rid for out in outputs for rid in out]
    assert len(claimed) == len(set(claimed)) == 150
    assert set(claimed) == {r.rollout_id for r in rollouts}
    assert store.statistics().attempts_by_status == {"preparing": 150}
    store.close()


async def test_concurrent_span_batches_and_finishes_do_not_deadlock(pg_dsn: str) -> None:
    store = PostgresLightningStore(pg_dsn, max_connections=8)
    await store.enqueue_rollouts([RolloutRequest(input=i) for i in range(4)])
    claims = [c for c in [await store.claim_rollout("w") for _ in range(4)] if c is not None]
    batches = [[*spans_of(a, 5, start=10 * n), *spans_of(b, 5, start=10 * n)] for n in range(6) for a, b in
               [(claims[0], claims[1]), (claims[1], claims[0]), (claims[2], claims[3])]]  # fmt: skip
    await asyncio.gather(*(store.add_spans(batch) for batch in batches))
    for claimed in claims:
        spans = await store.query_spans(claimed.rollout.rollout_id)
        assert [s.sequence_id for s in spans] == list(range(1, len(spans) + 1))
    await store.close()


async def test_racing_changes_of_one_rollout_apply_once(pg_dsn: str) -> None:
    # Changes of one rollout are compare-and-set writes without a transaction: of racing finishes exactly one wins,
    # and racing heartbeats (each moves the version on) all get through, by re-reading or by locking the row.
    store = PostgresLightningStore(pg_dsn, max_connections=8)
    await store.enqueue_rollout("race")
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    await store.start_attempt(rid, aid)
    beats = await asyncio.gather(*(store.heartbeat(rid, aid) for _ in range(40)))
    assert {b.status for b in beats} == {"running"}
    outcomes = await asyncio.gather(
        *(store.finish_attempt(rid, aid, "succeeded") for _ in range(8)), return_exceptions=True
    )
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
    assert all(isinstance(o, IllegalTransitionError) for o in outcomes if isinstance(o, BaseException))
    assert (await store.get_rollout(rid)).status == "succeeded"
    assert [a.status for a in await store.query_attempts(rid)] == ["succeeded"]
    with psycopg.connect(pg_dsn) as conn:  # claim, start, 40 heartbeats, one finish
        assert conn.execute("SELECT version FROM rollouts WHERE rollout_id = %s", (rid,)).fetchone() == (43,)
    await store.close()


async def test_racing_batches_of_one_attempt_store_each_span_once(pg_dsn: str) -> None:
    # Batches of one attempt go in without a transaction, gated on its span count: overlapping batches sent at once
    # must still store every span once, with sequence ids 1..n and no gap.
    store = PostgresLightningStore(pg_dsn, max_connections=8)
    await store.enqueue_rollout("spans")
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    spans = spans_of(claimed, 30)
    batches = [spans[n : n + 10] for n in range(0, 21, 5)] * 2  # every span in two to four batches
    results = await asyncio.gather(*(store.add_spans(batch) for batch in batches))
    stored = await store.query_spans(claimed.rollout.rollout_id)
    assert sorted(s.span_id for s in stored) == sorted(s.span_id for s in spans)
    assert [s.sequence_id for s in stored] == list(range(1, 31))
    by_id = {s.span_id: s.sequence_id for s in stored}
    assert all(by_id[s.span_id] == s.sequence_id for batch in results for s in batch)
    await store.close()


async def test_a_version_1_database_is_migrated(pg_dsn: str) -> None:
    # A database made by a release with schema version 1 (no rollouts.version) opens and keeps its rollouts.
    version, description, statements = MIGRATIONS[0]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_version "
            "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_time BIGINT NOT NULL)"
        )
        for statement in statements.split(";"):
            conn.execute(cast("LiteralString", statement))  # MIGRATIONS: constants in code
        conn.execute("INSERT INTO schema_version VALUES (%s, %s, 0)", (version, description))
        conn.execute(
            "INSERT INTO rollouts (rollout_id, status, input, config, metadata, enqueue_time, num_attempts) "
            "VALUES ('ro-old', 'queuing', %s, %s, '{}', 1, 0)",
            (b'"before"', RolloutConfig().model_dump_json().encode()),
        )
    store = PostgresLightningStore(pg_dsn)
    assert await store.schema_version() == MIGRATIONS[-1][0]
    claimed = await store.claim_rollout("w")
    assert claimed is not None and claimed.rollout.rollout_id == "ro-old" and claimed.rollout.input == "before"
    await store.finish_attempt("ro-old", claimed.attempt.attempt_id, "succeeded")
    assert (await store.get_rollout("ro-old")).status == "succeeded"
    await store.add_metrics([MetricsRecord(run_id="r", step=0, values={"x": 1.0})])  # the metrics table came too
    assert [r.values for r in await store.query_metrics("r")] == [{"x": 1.0}]
    await store.close()


class TestPostgresStoreOverHttp(StoreConformance):
    """client → store server → PostgreSQL passes the shared suite (the server's loop owns the pool)."""

    @pytest.fixture
    async def store(self, clock: FakeClock, pg_dsn: str) -> AsyncIterator[LightningStore]:
        with StoreServer(lambda: PostgresLightningStore(pg_dsn, clock=clock), max_wait_s=5.0) as server:
            client = LightningStoreClient(server.url, long_poll_s=2.0)
            yield client
            await client.close()


def test_one_store_across_successive_event_loops(pg_dsn: str) -> None:
    # Scripts often call asyncio.run() once per step: the pool moves to the next loop when the last one closed.
    store = PostgresLightningStore(pg_dsn)
    rollout = asyncio.run(store.enqueue_rollout("first loop"))
    claimed = asyncio.run(store.claim_rollout("w"))
    assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
    assert asyncio.run(store.statistics()).rollouts_by_status == {"preparing": 1}
    asyncio.run(store.close())


@pytest.mark.parametrize("store_first", [True, False], ids=["store-closed-first", "tracer-closed-first"])
def test_a_span_sink_loop_as_the_pools_home_closes_cleanly(
    pg_dsn: str, store_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tracer's sink runs the store on its own loop, idle between exports; that loop owns the pool here. Closing
    # it used to leave the pool's workers pending ("Event loop is closed" from each at garbage collection), and
    # closing the store first waited _CLOSE_WAIT_S for a loop that was not running, leaving a never-awaited close.
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}"))
    store = PostgresLightningStore(pg_dsn)

    async def claim(store: PostgresLightningStore) -> tuple[str, str]:
        await store.enqueue_rollout("traced")
        claimed = await store.claim_rollout("w")
        assert claimed is not None
        return claimed.rollout.rollout_id, claimed.attempt.attempt_id

    rollout_id, attempt_id = asyncio.run(claim(store))  # this loop closes: the sink's becomes home
    tracer = LightningTracer(StoreSpanSink(store))
    with rollout_context(rollout_id, attempt_id):
        for _ in range(3):
            with tracer.get_tracer("test").start_as_current_span("step"):
                pass
    assert tracer.flush(10)
    assert len(asyncio.run(store.query_spans(rollout_id))) == 3
    began = time.monotonic()
    if store_first:
        asyncio.run(store.close())
        tracer.shutdown()
    else:
        tracer.shutdown()
        asyncio.run(store.close())
    assert time.monotonic() - began < _CLOSE_WAIT_S
    del tracer, store
    gc.collect()
    assert unraisable == []


@pytest.mark.parametrize("order", ["store-closed-first", "loop-closed-first", "store-closed-on-its-loop"])
def test_closing_while_the_pool_connects_is_prompt_and_leaves_no_task(
    pg_dsn: str, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh pool opens its first connection and, for the client already waiting, a second one in the background;
    # under load that second connect is still in flight when the work is done and the loop goes idle (a span sink's
    # loop between exports). psycopg_pool's worker counted the CancelledError that closing the loop sends into that
    # connect as a failed connect and went on waiting for work: the loop's close waited CANCEL_WAIT_S, then left the
    # worker pending ("Event loop is closed" when it was garbage-collected); the pool's own close waited 5 s for it.
    # Here the second connect never finishes by itself.
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}"))
    connect = psycopg.AsyncConnection.connect
    connects = 0
    second_connect = asyncio.Event()

    async def first_connect_only(cls: type[psycopg.AsyncConnection[Any]], *args: Any, **kwargs: Any) -> Any:
        nonlocal connects
        connects += 1
        if connects > 1:
            second_connect.set()
            await asyncio.Event().wait()  # still connecting when the store and its loop close
        return await connect.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined]

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(first_connect_only))
    store = PostgresLightningStore(pg_dsn)
    loop = asyncio.new_event_loop()  # the pool's home, idle once the work is done
    assert loop.run_until_complete(store.statistics()).rollouts_by_status == {}

    # the background connect is in flight (the pool's worker may start it a loop turn after the work is done)
    loop.run_until_complete(asyncio.wait_for(second_connect.wait(), 10))
    began = time.monotonic()
    if order == "store-closed-first":
        asyncio.run(store.close())
        close_loop(loop)
    elif order == "loop-closed-first":
        close_loop(loop)
        asyncio.run(store.close())
    else:
        loop.run_until_complete(store.close())
        assert [task for task in asyncio.all_tasks(loop) if not task.done()] == []
        close_loop(loop)
    assert time.monotonic() - began < CANCEL_WAIT_S / 2
    assert [task for task in asyncio.all_tasks(loop) if not task.done()] == []
    del store, loop
    gc.collect()
    assert unraisable == []


async def test_keyed_duplicates_on_two_servers_act_once(pg_dsn: str) -> None:
    """Two stores on one database (two store servers) given the same keyed calls at once: each acts once."""
    one, two = PostgresLightningStore(pg_dsn), PostgresLightningStore(pg_dsn)
    try:
        stores = [one, two] * 4
        requests = [RolloutRequest(input=i) for i in range(2)]
        enqueued = await asyncio.gather(*(s.enqueue_rollouts(requests, idempotency_key="e") for s in stores))
        assert all(e == enqueued[0] for e in enqueued) and len(await one.query_rollouts()) == 2
        claims = await asyncio.gather(*(s.claim_and_start("w", idempotency_key="c") for s in stores))
        assert claims[0] is not None and all(c == claims[0] for c in claims)
        rid, aid = claims[0].rollout.rollout_id, claims[0].attempt.attempt_id
        finished = await asyncio.gather(*(s.finish_attempt(rid, aid, "succeeded", idempotency_key="f") for s in stores))
        assert all(f == finished[0] for f in finished)
        snapshots = await asyncio.gather(*(s.add_resources({}, idempotency_key="r") for s in stores))
        assert all(x == snapshots[0] for x in snapshots) and len(await two.list_resources()) == 1
        assert sorted(r.status for r in await two.query_rollouts()) == ["queuing", "succeeded"]
    finally:
        await one.close()
        await two.close()
