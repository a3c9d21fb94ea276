"""NaN/Infinity never reach a store, and a stored span that does not validate never fails a query (issue #26).

Every backend keeps spans as JSON, which has no NaN or Infinity: both serializers wrote them as ``null``, which the
Span model refuses, so one such attribute made every later ``query_spans`` of its rollout fail. Now ``add_spans``
refuses them with a ValueError naming the span and attribute, and a stored row that does not validate (written
before, or by other software) is left out of queries with one warning naming it. The rows are damaged by writing
them into the database directly, as an older version or another program would have.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from agentlightning.store import LightningStore, SqliteLightningStore
from agentlightning.store._finite import span_has_nonfinite
from agentlightning.store._sqlite_spans import encode_spans
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.store.postgres import PostgresLightningStore
from agentlightning.testing.postgres import PostgresCluster
from agentlightning.types import ClaimedRollout, Span, SpanEvent, SpanLink
from tests.core.store.fakes import make_span

KEY = "gen_ai.usage.x"
STORE_LOGGER = "agentlightning.store"


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PostgresCluster]:
    """One throwaway PostgreSQL server for this module."""
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LightningStore]:
    """A fresh store of each backend."""
    backend: LightningStore
    if request.param == "memory":
        backend = InMemoryLightningStore()
    elif request.param == "sqlite":
        backend = SqliteLightningStore(tmp_path / "store.db")
    else:
        cluster: PostgresCluster = request.getfixturevalue("pg_cluster")
        backend = PostgresLightningStore(cluster.create_schema())
    yield backend
    await backend.close()


async def _claimed(store: LightningStore) -> ClaimedRollout:
    await store.enqueue_rollout({"task": 1})
    claimed = await store.claim_and_start("w")
    assert claimed is not None
    return claimed


def _with(span: Span, **changes: Any) -> Span:
    """``span`` with ``changes`` validated as the model would (the model itself accepts NaN: JSON is the limit)."""
    return Span.model_validate({**span.model_dump(), **changes})


LINK = {"trace_id": f"{9:032x}", "span_id": f"{9:016x}"}
REFUSED = [
    ({"attributes": {"ok": 1, KEY: math.nan}}, f"attribute '{KEY}' is NaN"),
    ({"attributes": {KEY: math.inf}}, f"attribute '{KEY}' is Infinity"),
    ({"attributes": {"lp": [-0.1, -math.inf]}}, "attribute 'lp' item 1 is -Infinity"),
    (
        {"events": [SpanEvent(name="delta", timestamp=1, attributes={"k": math.nan})]},
        "event 0 ('delta') attribute 'k' is NaN",
    ),
    ({"links": [SpanLink(**LINK, attributes={"w": math.inf})]}, "link 0 attribute 'w' is Infinity"),
    ({"resource": {"service.version": -math.inf}}, "resource attribute 'service.version' is -Infinity"),
]


@pytest.mark.parametrize(("changes", "named"), REFUSED)
async def test_add_spans_refuses_nonfinite_naming_span_and_attribute(
    store: LightningStore, changes: dict[str, Any], named: str
) -> None:
    claimed = await _claimed(store)
    rollout_id = claimed.rollout.rollout_id
    good, bad = make_span(claimed, 0), _with(make_span(claimed, 1, name="chat"), **changes)
    with pytest.raises(ValueError, match="JSON has no NaN/Infinity") as refused:
        await store.add_spans([good, bad])
    assert f"span 1 ({bad.span_id}, 'chat'): {named}" in str(refused.value)
    assert await store.query_spans(rollout_id) == []  # all or none: the good span of the batch is not stored
    assert [s.sequence_id for s in await store.add_spans([good])] == [1]


async def test_finish_with_nonfinite_spans_is_refused_before_the_finish(store: LightningStore) -> None:
    claimed = await _claimed(store)
    rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    bad = _with(make_span(claimed, 0), attributes={KEY: math.nan})
    with pytest.raises(ValueError, match=f"attribute '{KEY}' is NaN"):
        await store.finish_attempt_with_spans(rollout_id, attempt_id, "succeeded", [bad])
    assert (await store.get_rollout(rollout_id)).status == "running"
    assert await store.query_spans(rollout_id) == []


async def test_finite_extremes_are_stored_as_sent(store: LightningStore) -> None:
    claimed = await _claimed(store)
    extremes: dict[str, Any] = {
        "max": 1.7976931348623157e308,
        "tiny": 5e-324,
        "negative_zero": -0.0,
        "overflowing_sum": [1e308, 1e308, -1e308],  # the sum of the items overflows; no item is infinite
        "text": "NaN",  # a string, not a number
        "flags": [True, False],
    }
    span = _with(make_span(claimed, 0), attributes=extremes)
    assert not span_has_nonfinite(span)
    await store.add_spans([span])
    (stored,) = await store.query_spans(claimed.rollout.rollout_id)
    assert stored.attributes == extremes


def test_check_covers_unvalidated_float_subclasses() -> None:
    class Score(float):
        pass

    span = Span.model_construct(
        rollout_id="ro-1",
        attempt_id="at-1",
        trace_id=f"{1:032x}",
        span_id=f"{1:016x}",
        name="x",
        start_time=0,
        attributes={"score": Score("nan")},
    )
    assert span_has_nonfinite(span)


# --- stored rows that do not validate ----------------------------------------------------------------------------
def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STORE_LOGGER and r.levelno == logging.WARNING]


async def test_sqlite_query_leaves_out_damaged_rows_and_logs_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store.db"
    store = SqliteLightningStore(path)
    claimed = await _claimed(store)
    rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    await store.add_spans([make_span(claimed, 0), make_span(claimed, 1)])  # sequence ids 1, 2
    await store.close()

    # As versions before #26 wrote it: orjson turned NaN into null and marked the batch trusted (1); its third span
    # is malformed besides (a status that is not an object).
    nan_span = _with(make_span(claimed, 3), attributes={KEY: math.nan})
    legacy = orjson.loads(encode_spans([make_span(claimed, 2), nan_span, make_span(claimed, 4)])[0])
    legacy[2]["status"] = []
    foreign = orjson.loads(encode_spans([make_span(claimed, 5)])[0])
    foreign[0]["start_time"] = "soon"  # a row another program wrote: validated when read (untrusted, 0), and wrong
    with sqlite3.connect(path) as conn:
        (rollout_seq,) = conn.execute("SELECT seq FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        batches = [(3, 5, 1, orjson.dumps(legacy)), (6, 6, 0, orjson.dumps(foreign)), (7, 7, 2, b"\x00 not JSON")]
        for first, last, trusted, data in batches:
            conn.execute(
                "INSERT INTO span_batches (rollout_seq, attempt_seq, first_seq, last_seq, trusted, data) "
                "VALUES (?, 1, ?, ?, ?, ?)",
                (rollout_seq, first, last, trusted, data),
            )
        conn.execute("UPDATE attempts SET span_count = 7 WHERE attempt_id = ?", (attempt_id,))

    store = SqliteLightningStore(path)
    try:
        assert [s.sequence_id for s in await store.add_spans([make_span(claimed, 7)])] == [8]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
            spans = await store.query_spans(rollout_id)
        assert [s.sequence_id for s in spans] == [1, 2, 3, 8]  # the valid span of the damaged legacy batch stays
        assert spans[2].span_id == f"{3:016x}" and spans[2].attributes == {"index": 2}
        (warning,) = _warnings(caplog)
        assert rollout_id in warning and "4 stored span(s)" in warning
        assert f"span {nan_span.span_id} (attempt {attempt_id}, sequence id 4): attributes.{KEY}" in warning
        assert f"span {5:016x} (attempt {attempt_id}, sequence id 5): status" in warning
        assert f"span {6:016x} (attempt {attempt_id}, sequence id 6): start_time" in warning
        assert "the batch from sequence id 7 (not JSON" in warning
        # Paging counts the spans returned, and every filter still reads past the damage.
        assert [s.sequence_id for s in await store.query_spans(rollout_id, limit=2, offset=1)] == [2, 3]
        assert [s.sequence_id for s in await store.query_spans(rollout_id, offset=3)] == [8]
        assert [s.sequence_id for s in await store.query_spans(rollout_id, "latest", after_sequence_id=2)] == [3, 8]
        assert [s.sequence_id for s in await store.query_spans(rollout_id, name="step")] == [1, 2, 3, 8]
    finally:
        await store.close()


async def test_postgres_query_leaves_out_damaged_rows_and_logs_them(
    pg_cluster: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = pg_cluster.create_schema()
    store = PostgresLightningStore(dsn)
    try:
        claimed = await _claimed(store)
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.add_spans([make_span(claimed, 0), make_span(claimed, 1)])  # sequence ids 1, 2
        # As versions before #26 wrote it (pydantic turned NaN into null), and a row that is not JSON at all.
        nan_span = _with(make_span(claimed, 2), attributes={KEY: math.nan})
        rows = [(3, nan_span.span_id, nan_span.__pydantic_serializer__.to_json(nan_span)), (4, f"{9:016x}", b"{")]
        with psycopg.connect(dsn, autocommit=True) as conn:
            for sequence_id, span_id, data in rows:
                conn.execute(
                    "INSERT INTO spans (rollout_id, attempt_seq, sequence_id, attempt_id, span_id, name, data) "
                    "VALUES (%s, 1, %s, %s, %s, 'step', %s)",
                    (rollout_id, sequence_id, attempt_id, span_id, data),
                )
            conn.execute("UPDATE attempts SET span_count = 4 WHERE attempt_id = %s", (attempt_id,))
        assert [s.sequence_id for s in await store.add_spans([make_span(claimed, 4)])] == [5]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
            spans = await store.query_spans(rollout_id)
        assert [s.sequence_id for s in spans] == [1, 2, 5]
        (warning,) = _warnings(caplog)
        assert rollout_id in warning and "2 stored span(s)" in warning
        assert f"span {nan_span.span_id} (attempt {attempt_id}): attributes.{KEY}" in warning
        assert "a span that is not a JSON object" in warning
        assert [s.sequence_id for s in await store.query_spans(rollout_id, "latest", after_sequence_id=2)] == [5]
    finally:
        await store.close()
