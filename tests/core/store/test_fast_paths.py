"""The store's shortcuts around pydantic and SQL give the same results as the slow, obvious way.

Covers the span batch codec (orjson in, models built without validation out), the unvalidated model helpers of the
state machine, ids, the SQLite store's optimistic span insert and per-call row cache, and the migration of spans
stored one row each (schema version 1) to batches.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentlightning.store import SqliteLightningStore
from agentlightning.store._sqlite_schema import ROLLOUT_COLUMNS, rollout_values
from agentlightning.store._sqlite_spans import decode_spans, encode_spans
from agentlightning.store._statemachine import construct, new_id, replace, span_with_sequence_id
from agentlightning.store.sqlite import MIGRATIONS
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


def _one(data: bytes, trusted: bool) -> Span:
    """The only span of a stored batch."""
    (span,) = decode_spans(data, trusted, 7)
    return span


@pytest.mark.parametrize("span", SPANS)
def test_span_json_is_pydantics_json(span: Span) -> None:
    data, _trusted = encode_spans([span])
    assert orjson.loads(data) == [orjson.loads(span.__pydantic_serializer__.to_json(span))]


@pytest.mark.parametrize("span", [s for s in SPANS if "nan" not in s.attributes])
def test_span_json_round_trips_like_validation(span: Span) -> None:
    pydantic_batch = b"[" + span.__pydantic_serializer__.to_json(span) + b"]"
    for data, trusted in (encode_spans([span]), (pydantic_batch, False)):
        read = _one(data, trusted)
        validated = Span.model_validate_json(data[1:-1])
        assert read.model_dump(mode="json") == validated.model_dump(mode="json")
        assert read.model_fields_set == validated.model_fields_set
        assert type(read.status) is SpanStatus
        assert all(type(e) is SpanEvent for e in read.events) and all(type(k) is SpanLink for k in read.links)


def test_batch_numbers_its_spans_from_first_seq() -> None:
    data, trusted = encode_spans(SPANS[:2])
    assert trusted
    assert [s.sequence_id for s in decode_spans(data, trusted, 41)] == [41, 42]
    assert [s.span_id for s in decode_spans(data, trusted, 41)] == [s.span_id for s in SPANS[:2]]


def test_non_finite_floats_read_back_as_null() -> None:
    # JSON has no NaN or infinity: both serializers write null, which validation would then refuse to read.
    read = _one(*encode_spans([SPANS[2]]))
    assert read.attributes["nan"] is None and read.attributes["inf"] is None


def test_big_integers_survive_the_round_trip() -> None:
    data, trusted = encode_spans([SPANS[0], SPANS[3]])
    assert not trusted  # pydantic wrote the batch, so it is validated when read
    read = decode_spans(data, trusted, 1)[1]
    assert read.attributes["huge"] == 2**64 + 1 and isinstance(read.attributes["huge"], int)


def test_stored_json_missing_a_field_is_validated_with_its_default() -> None:
    data = orjson.loads(encode_spans([SPANS[0]])[0])
    del data[0]["resource"]  # e.g. a row written before a field was added
    read = _one(orjson.dumps(data), True)
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


def _version_1_database(path: Path, spans: list[Span]) -> None:
    """A database as schema version 1 left it: one row per span, TEXT from orjson or pydantic's BLOB."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description TEXT, applied_time INTEGER)")
    version, description, statements = MIGRATIONS[0]
    for statement in statements.split(";"):
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (version, description))
    rollout = Rollout(rollout_id="ro-old", input={"q": 1}, enqueue_time=1, status="running", num_attempts=2)
    conn.execute(f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rollout_values(rollout))
    for seq, status in ((1, "failed"), (2, "running")):
        conn.execute(
            "INSERT INTO attempts (rollout_id, attempt_id, sequence_id, status, start_time, span_count) "
            "VALUES ('ro-old', ?, ?, ?, 1, ?)",
            (f"at-{seq}", seq, status, sum(1 for s in spans if s.attempt_id == f"at-{seq}")),
        )
    for span in spans:
        attempt_seq = int(span.attempt_id.split("-")[1])
        data = span.__pydantic_serializer__.to_json(span)
        stored: str | bytes = data if span.name == "blob" else orjson.dumps(orjson.loads(data)).decode()
        conn.execute(
            "INSERT INTO spans (rollout_id, attempt_seq, sequence_id, attempt_id, span_id, name, data) "
            "VALUES (?,?,?,?,?,?,?)",
            (span.rollout_id, attempt_seq, span.sequence_id, span.attempt_id, span.span_id, span.name, stored),
        )
    conn.close()


async def test_spans_stored_one_row_each_are_migrated_to_batches(tmp_path: Path) -> None:
    """Schema version 1 databases open with their spans: order, 'latest', duplicates and counts as before."""
    old = [
        _span(rollout_id="ro-old", attempt_id="at-1", sequence_id=1, span_id=f"{1:016x}", name="text"),
        _span(rollout_id="ro-old", attempt_id="at-2", sequence_id=1, span_id=f"{2:016x}", name="blob"),
        _span(rollout_id="ro-old", attempt_id="at-2", sequence_id=2, span_id=f"{3:016x}", name="text"),
    ]
    db = tmp_path / "v1.db"
    _version_1_database(db, old)
    store = SqliteLightningStore(db)
    assert store.schema_version == MIGRATIONS[-1][0]
    assert await store.query_spans("ro-old") == old
    assert await store.query_spans("ro-old", "latest") == old[1:]
    assert await store.query_spans("ro-old", "at-2", name="blob") == [old[1]]
    # A retried old span is returned as stored; a new one follows the old ones.
    new = _span(rollout_id="ro-old", attempt_id="at-2", span_id=f"{9:016x}")
    again = await store.add_spans([old[2].model_copy(update={"sequence_id": 0}), new])
    assert again == [old[2], new.model_copy(update={"sequence_id": 3})]
    assert [s.sequence_id for s in await store.query_spans("ro-old", "at-2")] == [1, 2, 3]
    stats = await store.statistics()
    assert stats.total_spans == 4 and stats.span_bytes > 4 * 300
    await store.close()
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert "spans" not in tables and {"span_batches", "span_keys"} <= tables


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
