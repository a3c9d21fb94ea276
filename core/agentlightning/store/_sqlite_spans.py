"""Span storage for :mod:`agentlightning.store.sqlite`: one row per attempt per ``add_spans`` call.

Layout (schema version 2): ``span_batches`` holds the JSON array of the spans one call added to one attempt, which
got consecutive sequence ids ``first_seq..last_seq``; ``span_keys`` holds one small row per span,
``(rollout_seq, attempt_seq, span_id) -> sequence_id``, whose primary key rejects a span stored before. Against a
row per span with two text indexes this writes a third of the B-tree entries and a fraction of the statements: a
batch of 100 spans is three statements (reserve sequence ids, insert keys from one JSON array, insert the batch).
Rollouts are referred to by their integer ``rollouts.seq``, which is stable (an INTEGER PRIMARY KEY survives VACUUM).

Codec: a batch is the JSON of its spans' fields written by orjson, which writes what pydantic's serializer would for
a validated span (the models have no aliases or custom serializers; tests/core/store/test_fast_paths.py checks) in
a fraction of the time; reading it back builds models without validating them again, several times cheaper than
``model_validate_json``. Such batches are marked ``trusted`` (2). orjson writes integers only within 64 bits, so a
batch it refuses is written by pydantic, untrusted (0), and validated when read (as are rows migrated from schema
version 1 that pydantic wrote). Batches marked 1 were written by orjson before ``add_spans`` refused NaN/Infinity
(issue #26), which both serializers write as ``null``, so they are validated when read too. The stored
``sequence_id`` field is ignored: a span's sequence id is its batch's ``first_seq`` plus its position.

A stored span that does not validate (such a ``null``, a row written by other software) is left out of
``query_spans`` with one warning per query, instead of failing it: the rest of the rollout stays readable.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Final, cast

import orjson
from pydantic import TypeAdapter, ValidationError

from agentlightning.store._sqlite_schema import SqliteTxn
from agentlightning.store._statemachine import (
    construct,
    span_attempt_not_found,
    span_with_sequence_id,
    validation_summary,
    warn_unreadable_spans,
)
from agentlightning.types import Span, SpanEvent, SpanLink, SpanStatus

__all__ = ["add_spans", "decode_spans", "encode_spans", "query_spans"]

_SPAN_KEYS: Final = frozenset(Span.model_fields)
_STATUS_KEYS: Final = frozenset(SpanStatus.model_fields)
_EVENT_KEYS: Final = frozenset(SpanEvent.model_fields)
_LINK_KEYS: Final = frozenset(SpanLink.model_fields)
_NESTED_MODELS: Final = frozenset({SpanStatus, SpanEvent, SpanLink})
_SPAN_LIST: Final = TypeAdapter(list[Span])
# span_batches.trusted: who wrote a batch, and so whether it is validated when read (see the module docstring).
_UNTRUSTED: Final = 0
_TRUSTED_BEFORE_FINITE: Final = 1
_TRUSTED: Final = 2

_ROLLOUT_SEQ: Final = "(SELECT seq FROM rollouts WHERE rollout_id = attempts.rollout_id)"
# Reserves sequence ids for a batch of new spans of one attempt and counts the batch as a heartbeat when the attempt
# is live (a superseded, terminal one keeps its state); returns where the batch goes and its last sequence id.
_RESERVE: Final = (
    "UPDATE attempts SET span_count = span_count + ?, last_heartbeat_time = CASE WHEN status IN "
    "('preparing', 'running') THEN ? ELSE last_heartbeat_time END WHERE attempt_id = ? AND rollout_id = ? "
    f"RETURNING {_ROLLOUT_SEQ}, sequence_id, span_count"
)
_ATTEMPT_STATE: Final = (
    f"SELECT {_ROLLOUT_SEQ}, sequence_id, span_count, status IN ('preparing', 'running') FROM attempts "
    "WHERE attempt_id = ? AND rollout_id = ?"
)
# json_each's key is the array index: the keys of a batch go in with one statement.
_INSERT_KEYS: Final = (
    "INSERT INTO span_keys (rollout_seq, attempt_seq, span_id, sequence_id) "
    "SELECT ?1, ?2, value, ?3 + key FROM json_each(?4)"
)
_INSERT_BATCH: Final = (
    "INSERT INTO span_batches (rollout_seq, attempt_seq, first_seq, last_seq, trusted, data) VALUES (?,?,?,?,?,?)"
)
_STORED_KEYS: Final = (
    "SELECT span_id, sequence_id FROM span_keys WHERE rollout_seq = ? AND attempt_seq = ? "
    "AND span_id IN (SELECT value FROM json_each(?))"
)
_BATCH_HOLDING: Final = (
    "SELECT first_seq, trusted, data FROM span_batches WHERE rollout_seq = ? AND attempt_seq = ? AND first_seq <= ? "
    "ORDER BY first_seq DESC LIMIT 1"
)


# --- codec -------------------------------------------------------------------------------------------------------
def _model_fields(value: object) -> dict[str, Any]:
    """orjson's hook for the nested models of a span (status, events, links); anything else goes to pydantic."""
    if type(value) in _NESTED_MODELS:
        return vars(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def encode_spans(spans: Sequence[Span]) -> tuple[bytes, bool]:
    """The stored JSON array of ``spans`` and whether it is trusted (orjson wrote it: read without validation)."""
    try:
        return orjson.dumps([span.__dict__ for span in spans], default=_model_fields), True
    except TypeError:  # e.g. an integer beyond 64 bits
        return _SPAN_LIST.dump_json(list(spans)), False


def _trusted_span(fields: dict[str, Any]) -> Span | None:
    """A Span built without validation from fields orjson wrote, or None when their keys are not the model's."""
    status: dict[str, Any] = fields.get("status") or {}
    events: list[dict[str, Any]] = fields.get("events") or []
    links: list[dict[str, Any]] = fields.get("links") or []
    if (
        fields.keys() == _SPAN_KEYS
        and status.keys() == _STATUS_KEYS
        and all(event.keys() == _EVENT_KEYS for event in events)
        and all(link.keys() == _LINK_KEYS for link in links)
    ):
        fields["status"] = construct(SpanStatus, status)
        fields["events"] = [construct(SpanEvent, event) for event in events]
        fields["links"] = [construct(SpanLink, link) for link in links]
        return construct(Span, fields)
    return None


def decode_spans(data: bytes | str, trusted: int, first_seq: int) -> list[Span]:
    """The spans of one stored batch, numbered from ``first_seq``; a trusted batch is not validated."""
    if not trusted:
        return [span_with_sequence_id(span, first_seq + i) for i, span in enumerate(_SPAN_LIST.validate_json(data))]
    spans: list[Span] = []
    for i, fields in enumerate(orjson.loads(data)):
        fields["sequence_id"] = first_seq + i
        span = _trusted_span(fields)
        # Keys that are not the model's (a field added since it was written): validation fills in defaults.
        spans.append(span if span is not None else Span.model_validate(fields))
    return spans


def _stored_items(data: bytes | str) -> object:
    """A stored batch as parsed JSON: orjson, or the stdlib for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _holds_null(fields: dict[str, Any]) -> bool:
    """Whether a stored span's attribute maps hold a null: where a NaN/Infinity went before add_spans refused them."""
    maps: list[Any] = [fields.get("attributes"), fields.get("resource")]
    for name in ("events", "links"):
        holders = fields.get(name)
        if isinstance(holders, list):
            maps += [cast(dict[str, Any], h).get("attributes") for h in cast(list[Any], holders) if isinstance(h, dict)]
    for attributes in maps:
        if not isinstance(attributes, dict):
            continue  # absent (filled in by validation) or malformed (refused by it)
        for value in cast(dict[str, Any], attributes).values():
            if value is None:
                return True
            # A float list (logprobs) may hold one; integer lists (token ids, long) cannot and are not scanned.
            if type(value) is list:
                items = cast("list[Any]", value)
                if items and (items[0] is None or type(items[0]) is float) and None in items:
                    return True
    return False


def decode_readable_spans(data: bytes | str, trusted: int, first_seq: int, unreadable: list[str]) -> list[Span]:
    """The spans of one stored batch that validate, for a query; each one that does not is described in ``unreadable``.

    A batch written before NaN/Infinity were refused is read span by span: a span whose attributes hold a null is
    validated (and so refused), the others are built as from any trusted batch. A batch that is not a JSON array
    cannot be split into spans, so it is described whole and reads as empty.
    """
    if trusted != _TRUSTED_BEFORE_FINITE:
        try:  # the whole batch in one call, as add_spans wrote it
            return decode_spans(data, trusted, first_seq)
        except Exception:  # whatever a damaged row raises, it is read span by span below and reported
            pass
    try:
        items = _stored_items(data)
    except ValueError as exc:
        unreadable.append(f"the batch from sequence id {first_seq} (not JSON: {exc})")
        return []
    if not isinstance(items, list):
        unreadable.append(f"the batch from sequence id {first_seq} (not a JSON array)")
        return []
    spans: list[Span] = []
    for index, fields in enumerate(cast(list[Any], items)):
        sequence_id = first_seq + index
        if not isinstance(fields, dict):
            unreadable.append(f"the span at sequence id {sequence_id} (a JSON {type(fields).__name__}, not an object)")
            continue
        known = cast(dict[str, Any], fields)
        known["sequence_id"] = sequence_id
        if trusted and not _holds_null(known):
            try:
                span = _trusted_span(known)
            except (AttributeError, TypeError):  # a nested field of the wrong JSON type: validation says which
                span = None
            if span is not None:
                spans.append(span)
                continue
        try:
            spans.append(Span.model_validate(known))
        except ValidationError as exc:
            where = f"attempt {known.get('attempt_id', '?')}, sequence id {sequence_id}"
            unreadable.append(f"span {known.get('span_id', '?')} ({where}): {validation_summary(exc)}")
    return spans


# --- writing -----------------------------------------------------------------------------------------------------
def _group(spans: Sequence[Span], keys: list[tuple[str, str]]) -> dict[tuple[str, str], list[Span]]:
    """The spans of each (rollout_id, attempt_id), in order."""
    if len(keys) == 1:
        return {keys[0]: list(spans)}
    groups: dict[tuple[str, str], list[Span]] = {key: [] for key in keys}
    for span in spans:
        groups[(span.rollout_id, span.attempt_id)].append(span)
    return groups


def _insert(conn: sqlite3.Connection, rollout_seq: int, attempt_seq: int, first: int, spans: list[Span]) -> None:
    """Write the keys and the batch row of new spans numbered from ``first``."""
    conn.execute(_INSERT_KEYS, (rollout_seq, attempt_seq, first, orjson.dumps([s.span_id for s in spans]).decode()))
    data, trusted = encode_spans(spans)
    # add_spans refused NaN/Infinity before any write, so an orjson batch holds no null in their place.
    mark = _TRUSTED if trusted else _UNTRUSTED
    conn.execute(_INSERT_BATCH, (rollout_seq, attempt_seq, first, first + len(spans) - 1, mark, data))


def add_spans(txn: SqliteTxn, spans: Sequence[Span], keys: list[tuple[str, str]], now: int) -> list[Span]:
    """Store spans idempotently inside the open transaction; returns them with their sequence ids, as stored."""
    # The span_keys primary key catches a span stored before (a retried batch) or repeated in the batch; then the
    # stored ones are looked up. Looking first would cost every batch.
    if len(keys) == 1:
        try:
            stored = _add_new(txn, spans, keys, now)
        except sqlite3.IntegrityError:
            # Only the reservation was written (SQLite undoes the failed key insert, one statement): the lookup
            # path takes its count back and writes the same heartbeat, so no savepoint is needed.
            stored = _add_looked_up(txn, spans, keys, now, reserved=len(spans))
    else:
        stored = _add_in_savepoint(txn, spans, keys, now)
    # The attempts' heartbeats changed behind the row cache: a later write of this transaction must not put back
    # what the cache remembers.
    txn.reset()
    return stored


def _add_in_savepoint(txn: SqliteTxn, spans: Sequence[Span], keys: list[tuple[str, str]], now: int) -> list[Span]:
    """Spans of several attempts: a duplicate found for one attempt undoes the rows written for the others."""
    conn = txn.conn
    conn.execute("SAVEPOINT spans")
    try:
        try:
            stored = _add_new(txn, spans, keys, now)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO spans")
            txn.reset()
            stored = _add_looked_up(txn, spans, keys, now)
    except BaseException:
        if conn.in_transaction:  # e.g. spans of a known and an unknown attempt: the first one's rows go too
            conn.execute("ROLLBACK TO spans")
            conn.execute("RELEASE spans")
        raise
    conn.execute("RELEASE spans")
    return stored


def _add_new(txn: SqliteTxn, spans: Sequence[Span], keys: list[tuple[str, str]], now: int) -> list[Span]:
    """Insert the batch assuming every span is new: three statements per attempt."""
    conn = txn.conn
    groups = _group(spans, keys)
    numbered: dict[int, int] = {}  # id(span) -> sequence id, for spans of several attempts in one call
    for (rollout_id, attempt_id), members in groups.items():
        reserved = conn.execute(_RESERVE, (len(members), now, attempt_id, rollout_id)).fetchall()
        if not reserved:
            raise span_attempt_not_found(txn, rollout_id, attempt_id)
        rollout_seq, attempt_seq, last = reserved[0]
        first = last - len(members) + 1
        _insert(conn, rollout_seq, attempt_seq, first, members)
        if len(groups) == 1:
            return [span_with_sequence_id(span, first + i) for i, span in enumerate(members)]
        for i, span in enumerate(members):
            numbered[id(span)] = first + i
    return [span_with_sequence_id(span, numbered[id(span)]) for span in spans]


def _stored_spans(
    conn: sqlite3.Connection, rollout_seq: int, attempt_seq: int, sequence_ids: Iterable[int]
) -> dict[int, Span]:
    """Stored spans of one attempt by sequence id, each batch read once."""
    found: dict[int, Span] = {}
    for sequence_id in sorted(set(sequence_ids)):
        if sequence_id in found:
            continue
        first, trusted, data = conn.execute(_BATCH_HOLDING, (rollout_seq, attempt_seq, sequence_id)).fetchone()
        for span in decode_spans(data, trusted, first):
            found[span.sequence_id] = span
    return found


def _add_looked_up(
    txn: SqliteTxn, spans: Sequence[Span], keys: list[tuple[str, str]], now: int, *, reserved: int = 0
) -> list[Span]:
    """Insert the spans not stored yet; the stored ones (and repeats within the batch) are returned as stored.

    ``reserved``: sequence ids a failed fast insert reserved for the (single) attempt, given back here.
    """
    conn = txn.conn
    stored: dict[tuple[str, str], Span] = {}  # (attempt_id, span_id) -> span as stored
    heartbeats: list[tuple[int, bool, int, str]] = []
    for (rollout_id, attempt_id), members in _group(spans, keys).items():
        row = conn.execute(_ATTEMPT_STATE, (attempt_id, rollout_id)).fetchone()
        if row is None:
            raise span_attempt_not_found(txn, rollout_id, attempt_id)
        rollout_seq, attempt_seq, count, live = row
        count -= reserved
        ids = orjson.dumps(list({s.span_id: None for s in members})).decode()
        known = dict(conn.execute(_STORED_KEYS, (rollout_seq, attempt_seq, ids)).fetchall())
        for span in _stored_spans(conn, rollout_seq, attempt_seq, known.values()).values():
            stored[(attempt_id, span.span_id)] = span
        new: list[Span] = []
        for span in members:
            key = (attempt_id, span.span_id)
            if key not in stored:
                stored[key] = span_with_sequence_id(span, count + len(new) + 1)
                new.append(span)
        if new:
            _insert(conn, rollout_seq, attempt_seq, count + 1, new)
        # A span proves life only for its own attempt; a superseded (terminal) one keeps its state.
        heartbeats.append((count + len(new), bool(live), now, attempt_id))
    conn.executemany(
        "UPDATE attempts SET span_count = ?, "
        "last_heartbeat_time = CASE WHEN ? THEN ? ELSE last_heartbeat_time END WHERE attempt_id = ?",
        heartbeats,
    )
    return [stored[(span.attempt_id, span.span_id)] for span in spans]


# --- reading -----------------------------------------------------------------------------------------------------
def query_spans(
    conn: sqlite3.Connection,
    rollout_id: str,
    attempt_seq: int | None,
    name: str | None,
    after_sequence_id: int,
    limit: int | None,
    offset: int,
) -> list[Span]:
    """Spans of a rollout (one attempt's when ``attempt_seq`` is given) in (attempt, sequence_id) order, paged.

    A stored span that does not validate is left out with a warning; offset and limit count the spans returned.
    """
    unreadable: list[str] = []
    try:
        return _query_spans(conn, rollout_id, attempt_seq, name, after_sequence_id, limit, offset, unreadable)
    finally:
        if unreadable:
            warn_unreadable_spans(rollout_id, unreadable)


def _query_spans(
    conn: sqlite3.Connection,
    rollout_id: str,
    attempt_seq: int | None,
    name: str | None,
    after_sequence_id: int,
    limit: int | None,
    offset: int,
    unreadable: list[str],
) -> list[Span]:
    sql = (
        "SELECT first_seq, last_seq, trusted, data FROM span_batches "
        "WHERE rollout_seq = (SELECT seq FROM rollouts WHERE rollout_id = ?) AND last_seq > ?"
    )
    params: list[Any] = [rollout_id, after_sequence_id]
    if attempt_seq is not None:
        sql += " AND attempt_seq = ?"
        params.append(attempt_seq)
    sql += " ORDER BY attempt_seq, first_seq"
    skip = offset
    found: list[Span] = []
    if limit is not None and limit <= 0:
        return found
    for first, last, trusted, data in conn.execute(sql, params):
        if name is None and trusted == _TRUSTED:
            # Pages of unfiltered spans skip whole batches without decoding them; only batches known to be readable,
            # so that the offset counts the same spans either way.
            count = last - max(first, after_sequence_id + 1) + 1
            if skip >= count:
                skip -= count
                continue
        for span in decode_readable_spans(data, trusted, first, unreadable):
            if span.sequence_id <= after_sequence_id or (name is not None and span.name != name):
                continue
            if skip:
                skip -= 1
                continue
            found.append(span)
            if limit is not None and len(found) >= limit:
                return found
    return found
