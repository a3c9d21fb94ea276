"""The store's shortcuts around pydantic and SQL give the same results as the slow, obvious way.

Covers the span JSON codec (orjson in, models built without validation out), the unvalidated model helpers of the
state machine, ids, and the SQLite store's optimistic span insert and per-call row cache.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentlightning.store import SqliteLightningStore
from agentlightning.store._sqlite_schema import span_from_json, span_to_json
from agentlightning.store._statemachine import construct, new_id, replace, span_with_sequence_id
from agentlightning.types import Attempt, Rollout, Span, SpanEvent, SpanLink, SpanStatus
from tests.core.store.fakes import make_span, spans_of


def _span(**changes: Any) -> Span:
    fields: dict[str, Any] = {
        "rollout_id": "ro-1",
        "attempt_id": "at-1",
        "sequence_id": 7,
        "trace_id": f"{3:032x}",
        "span_id": f"{4:016x}",
        "parent_id": f"{5:016x}",
        "name": "chat gpt-4o-mini",
        "kind": "CLIENT",
        "start_time": 1_700_000_000_000_000_000,
        "end_time": 1_700_000_000_100_000_000,
        "status": SpanStatus(code="ERROR", message="boom ☃"),
        "attributes": {
            "text": 'naïve "quoted" \\ \n line',
            "flag": True,
            "count": -3,
            "ratio": 0.1,
            "ids": [1, 2, 3],
            "scores": [0.5, 1e-300, 1e300],
            "words": ["a", "ü"],
            "flags": [True, False],
            "empty": [],
        },
        "events": [SpanEvent(name="exception", timestamp=1_700_000_000_050_000_000, attributes={"x": 1.5})],
        "links": [SpanLink(trace_id=f"{6:032x}", span_id=f"{7:016x}", attributes={"why": "handoff"})],
        "resource": {"service.name": "agent"},
    }
    fields.update(changes)
    return Span(**fields)


SPANS = [
    _span(),
    _span(parent_id=None, end_time=None, status=SpanStatus(), events=[], links=[], attributes={}, resource={}),
    _span(attributes={"nan": float("nan"), "inf": float("inf")}),
    _span(attributes={"huge": 2**64 + 1, "tiny": -(2**63) - 1}),  # beyond 64 bits: orjson cannot, pydantic can
    _span(attributes={"digits": "12345678901234567890123"}),  # 20+ digits in a string: read by pydantic
]


@pytest.mark.parametrize("span", SPANS)
def test_span_json_is_pydantics_json(span: Span) -> None:
    assert orjson.loads(span_to_json(span)) == orjson.loads(span.__pydantic_serializer__.to_json(span))


@pytest.mark.parametrize("span", [s for s in SPANS if "nan" not in s.attributes])
def test_span_json_round_trips_like_validation(span: Span) -> None:
    for data in (span_to_json(span), span.__pydantic_serializer__.to_json(span)):
        read = span_from_json(data)
        validated = Span.model_validate_json(data)
        assert read.model_dump(mode="json") == validated.model_dump(mode="json")
        assert read.model_fields_set == validated.model_fields_set
        assert type(read.status) is SpanStatus
        assert all(type(e) is SpanEvent for e in read.events) and all(type(k) is SpanLink for k in read.links)


def test_non_finite_floats_read_back_as_null() -> None:
    # JSON has no NaN or infinity: both serializers write null, which validation would then refuse to read.
    read = span_from_json(span_to_json(SPANS[2]))
    assert read.attributes["nan"] is None and read.attributes["inf"] is None


def test_big_integers_survive_the_round_trip() -> None:
    stored = span_to_json(SPANS[3])
    assert isinstance(stored, bytes)  # pydantic wrote it, so it is validated when read
    read = span_from_json(stored)
    assert read.attributes["huge"] == 2**64 + 1 and isinstance(read.attributes["huge"], int)


def test_stored_json_missing_a_field_is_validated_with_its_default() -> None:
    data = orjson.loads(span_to_json(SPANS[0]))
    del data["resource"]  # e.g. a row written before a field was added
    read = span_from_json(orjson.dumps(data).decode())
    assert read.resource == {} and "resource" not in read.model_fields_set


def test_construct_and_replace_match_pydantic() -> None:
    attempt = Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, start_time=5)
    built = construct(Attempt, attempt.model_dump())
    assert built == attempt and built.model_fields_set == set(Attempt.model_fields)
    changed = replace(attempt, status="running", last_heartbeat_time=9)
    assert changed == attempt.model_copy(update={"status": "running", "last_heartbeat_time": 9})
    assert changed.model_fields_set == attempt.model_fields_set | {"status", "last_heartbeat_time"}
    assert attempt.status == "preparing" and attempt.model_fields_set == {
        "rollout_id",
        "attempt_id",
        "sequence_id",
        "start_time",
    }
    rollout = Rollout(rollout_id="ro-1", input={"q": 1}, enqueue_time=1, metadata={"a": 1})
    copy = replace(rollout)
    assert copy == rollout and copy is not rollout and copy.model_fields_set is not rollout.model_fields_set


def test_span_with_sequence_id_copies() -> None:
    span = SPANS[0]
    copy = span_with_sequence_id(span, 42)
    assert copy.sequence_id == 42 and span.sequence_id == 7
    assert copy == span.model_copy(update={"sequence_id": 42})
    assert "sequence_id" in copy.model_fields_set
    copy.name = "renamed"  # the copy is a working model: assignment goes to the copy only
    assert span.name == "chat gpt-4o-mini"


def test_new_id_is_a_uuid4() -> None:
    ids = {new_id("ro") for _ in range(1000)}
    assert len(ids) == 1000
    for value in list(ids)[:50]:
        prefix, hex_part = value.split("-", 1)
        assert prefix == "ro" and uuid.UUID(hex_part).version == 4 and uuid.UUID(hex_part).hex == hex_part


async def test_retried_batch_after_a_failed_fast_insert_leaves_no_trace(tmp_path: Path) -> None:
    """A batch with stored spans falls back to the lookup path; the undone fast attempt changes nothing."""
    store = SqliteLightningStore(tmp_path / "retry.db")
    await store.enqueue_rollout(1)
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    await store.add_spans(spans_of(claimed, 3))
    # New spans first, then a stored one: the fast insert writes two rows before the unique index stops it.
    mixed = [make_span(claimed, 5), make_span(claimed, 6), make_span(claimed, 0)]
    stored = await store.add_spans(mixed)
    assert [s.sequence_id for s in stored] == [4, 5, 1]
    assert [s.sequence_id for s in await store.add_spans(spans_of(claimed, 1, start=9))] == [6]
    everything = await store.query_spans(claimed.rollout.rollout_id)
    assert [s.sequence_id for s in everything] == [1, 2, 3, 4, 5, 6]
    assert (await store.statistics()).total_spans == 6
    await store.close()


async def test_spans_written_before_are_still_read(tmp_path: Path) -> None:
    """Rows from before the orjson codec (pydantic's JSON as a BLOB) read as they did; new rows are TEXT."""
    db = tmp_path / "old-rows.db"
    store = SqliteLightningStore(db)
    await store.enqueue_rollout(1)
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    new, old = await store.add_spans([make_span(claimed, 0, name="café"), make_span(claimed, 1)])
    await store.close()
    with sqlite3.connect(db) as conn:
        old_json = old.__pydantic_serializer__.to_json(old.model_copy(update={"name": "naïve"}))
        conn.execute("UPDATE spans SET data = ? WHERE span_id = ?", (old_json, old.span_id))
        kinds = dict(conn.execute("SELECT span_id, typeof(data) FROM spans").fetchall())
    conn.close()
    assert kinds == {new.span_id: "text", old.span_id: "blob"}
    store = SqliteLightningStore(db)
    read = await store.query_spans(claimed.rollout.rollout_id)
    assert read == [new, old.model_copy(update={"name": "naïve"})]
    stats = await store.statistics()
    new_json = span_to_json(new)
    assert isinstance(new_json, str)
    assert stats.span_bytes == len(new_json.encode()) + len(old_json)  # bytes, not characters
    await store.close()


async def test_two_stores_on_one_file_see_each_others_changes(tmp_path: Path) -> None:
    """Rows a store read during one call are not reused in the next: another connection may have changed them."""
    first = SqliteLightningStore(tmp_path / "shared.db")
    second = SqliteLightningStore(tmp_path / "shared.db")
    rollout = await first.enqueue_rollout(1)
    assert (await first.get_rollout(rollout.rollout_id)).status == "queuing"
    claimed = await second.claim_rollout("w")
    assert claimed is not None
    await first.start_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
    assert (await second.get_rollout(rollout.rollout_id)).status == "running"
    await second.add_spans(spans_of(claimed, 2))
    await first.finish_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "succeeded")
    assert [a.status for a in await second.query_attempts(rollout.rollout_id)] == ["succeeded"]
    assert [s.sequence_id for s in await first.query_spans(rollout.rollout_id)] == [1, 2]
    await first.close()
    await second.close()
