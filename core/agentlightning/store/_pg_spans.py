"""Span ingest for the PostgreSQL store: read the attempts, skip spans already stored, one multi-row insert.

A batch of one attempt (nearly all of them) needs no transaction: the insert is gated on the attempt's span count
still being the one read (compare-and-set), so two batches can never take the same sequence ids. Other batches
lock their attempts in a transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, cast

import orjson
from psycopg import AsyncConnection
from pydantic import ValidationError

from agentlightning.store._statemachine import validation_summary, warn_unreadable_spans
from agentlightning.types import Span

# Attempt rows are locked in id order, so two batches touching the same attempts cannot deadlock.
_LOCK_ATTEMPTS: Final = (
    "SELECT attempt_id, rollout_id, sequence_id, span_count, status IN ('preparing', 'running') FROM attempts "
    "WHERE attempt_id = ANY(%s) ORDER BY attempt_id FOR UPDATE"
)
# Batches nearly always come from one attempt: the same statements with scalar parameters, which psycopg sends for
# a fraction of the client CPU of a list (it inspects every list element to choose a dumper).
_READ_ATTEMPT: Final = (
    "SELECT attempt_id, rollout_id, sequence_id, span_count, status IN ('preparing', 'running') FROM attempts "
    "WHERE attempt_id = %s"
)
_LOCK_ATTEMPT: Final = f"{_READ_ATTEMPT} FOR UPDATE"
_EXISTING: Final = (
    "SELECT s.attempt_id, s.span_id, s.data FROM spans s "
    "JOIN unnest(%s::text[], %s::text[]) AS k(a, i) ON s.attempt_id = k.a AND s.span_id = k.i"
)
_INSERT: Final = (
    "INSERT INTO spans (rollout_id, attempt_seq, sequence_id, attempt_id, span_id, name, data) "
    "SELECT * FROM unnest(%s::text[], %s::int[], %s::int[], %s::text[], %s::text[], %s::text[], %s::bytea[])"
)
# A span proves life only for its own live attempt; a superseded (terminal) one keeps its state.
_UPDATE_ATTEMPTS: Final = (
    "UPDATE attempts AS a SET span_count = u.c, "
    "last_heartbeat_time = CASE WHEN u.live THEN GREATEST(a.last_heartbeat_time, %s) ELSE a.last_heartbeat_time END "
    "FROM unnest(%s::text[], %s::int[], %s::bool[]) AS u(id, c, live) WHERE a.attempt_id = u.id"
)

_UPDATE_ATTEMPT: Final = (
    "UPDATE attempts SET span_count = %s, "
    "last_heartbeat_time = CASE WHEN %s THEN GREATEST(last_heartbeat_time, %s) ELSE last_heartbeat_time END "
    "WHERE attempt_id = %s"
)

# Compare-and-set: the counter moves (and a live attempt's heartbeat) only if no other batch moved it since it was
# read, and the spans go in only if it did; the statement returns how many attempts moved (1, or 0 on a lost race).
_CAS_ATTEMPT: Final = (
    "UPDATE attempts SET span_count = %s, last_heartbeat_time = CASE WHEN status IN ('preparing', 'running') "
    "THEN GREATEST(last_heartbeat_time, %s) ELSE last_heartbeat_time END "
    "WHERE attempt_id = %s AND span_count = %s RETURNING 1"
)
# A batch whose spans were all stored before (a retry) still proves life, if its attempt is still live.
_TOUCH_ATTEMPT: Final = (
    "UPDATE attempts SET last_heartbeat_time = GREATEST(last_heartbeat_time, %s) "
    "WHERE attempt_id = %s AND status IN ('preparing', 'running')"
)
_CAS_INSERT: Final = (
    f"WITH u AS ({_CAS_ATTEMPT}), i AS ({_INSERT} WHERE EXISTS (SELECT 1 FROM u)) SELECT COUNT(*) FROM u"
)

# Data-modifying CTE: the spans go in and the attempts' counters move in one statement.
_INSERT_THEN_UPDATE_ATTEMPT: Final = f"WITH inserted AS ({_INSERT}) {_UPDATE_ATTEMPT}"
_INSERT_THEN_UPDATE_ATTEMPTS: Final = f"WITH inserted AS ({_INSERT}) {_UPDATE_ATTEMPTS}"


async def store_spans(
    conn: AsyncConnection[Any], spans: Sequence[Span], keys: Sequence[tuple[str, str]], now: int, *, lock: bool
) -> list[Span] | tuple[str, str] | None:
    """Store ``spans``; returns them as stored (with sequence ids).

    With ``lock``, inside the caller's transaction (attempt rows locked). Without, no transaction: a compare-and-set
    write, and None when it lost a race or the batch spans several attempts (nothing written; retry or lock).
    Returns the first (rollout_id, attempt_id) of ``keys`` that names no attempt instead, having written nothing.
    """
    attempt_ids = list(dict.fromkeys(attempt_id for _, attempt_id in keys))
    if len(attempt_ids) == 1:
        cursor = await conn.execute(_LOCK_ATTEMPT if lock else _READ_ATTEMPT, (attempt_ids[0],))
    elif not lock:
        return None
    else:
        cursor = await conn.execute(_LOCK_ATTEMPTS, (attempt_ids,))
    # attempt_id -> [attempt sequence, spans stored so far, live?]
    state: dict[str, list[Any]] = {}
    owners: dict[str, str] = {}
    for attempt_id, rollout_id, sequence_id, span_count, live in await cursor.fetchall():
        state[attempt_id] = [sequence_id, span_count, live]
        owners[attempt_id] = rollout_id
    for rollout_id, attempt_id in keys:
        if owners.get(attempt_id) != rollout_id:
            return rollout_id, attempt_id
    existing: dict[tuple[str, str], Span] = {}
    if any(entry[1] for entry in state.values()):  # a fresh attempt has nothing to deduplicate against
        cursor = await conn.execute(_EXISTING, ([s.attempt_id for s in spans], [s.span_id for s in spans]), binary=True)
        for attempt_id, span_id, data in await cursor.fetchall():
            existing[(attempt_id, span_id)] = Span.model_validate_json(data)
    columns: tuple[list[Any], ...] = ([], [], [], [], [], [], [])
    result: list[Span] = []
    read_counts = {attempt_id: entry[1] for attempt_id, entry in state.items()}
    for incoming in spans:
        known = existing.get((incoming.attempt_id, incoming.span_id))
        if known is None:
            # New span: the next sequence id of its attempt, and one more row for the insert.
            attempt_seq, count, _live = state[incoming.attempt_id]
            count += 1
            state[incoming.attempt_id][1] = count
            known = incoming.model_copy(update={"sequence_id": count})
            existing[(incoming.attempt_id, incoming.span_id)] = known
            values = (incoming.rollout_id, attempt_seq, count, incoming.attempt_id, incoming.span_id, incoming.name)
            for column, value in zip(columns, (*values, known.__pydantic_serializer__.to_json(known)), strict=True):
                column.append(value)
        result.append(known)
    ids = list(state)
    if not lock:
        (attempt_id,) = ids
        if not columns[0]:  # every span was stored before: a re-sent batch
            await conn.execute(_TOUCH_ATTEMPT, (now, attempt_id))
            return result
        params = (state[attempt_id][1], now, attempt_id, read_counts[attempt_id], *columns)
        row = await (await conn.execute(_CAS_INSERT, params)).fetchone()
        return result if row is not None and row[0] == 1 else None
    if len(ids) == 1:
        update, with_insert = _UPDATE_ATTEMPT, _INSERT_THEN_UPDATE_ATTEMPT
        params: tuple[Any, ...] = (state[ids[0]][1], bool(state[ids[0]][2]), now, ids[0])
    else:
        update, with_insert = _UPDATE_ATTEMPTS, _INSERT_THEN_UPDATE_ATTEMPTS
        params = (now, ids, [state[i][1] for i in ids], [bool(state[i][2]) for i in ids])
    async with conn.cursor() as writer:
        # The insert and the counters' update as one statement: each statement costs a round of client work.
        if columns[0]:
            await writer.execute(with_insert, (*columns, *params))
        else:
            await writer.execute(update, params)
    return result


def decode_stored_spans(rollout_id: str, rows: Sequence[Sequence[Any]]) -> list[Span]:
    """The spans of query rows (each row's first column is the stored JSON), leaving out those that do not validate.

    A row that does not validate (a NaN/Infinity that pydantic wrote as ``null`` before ``add_spans`` refused them,
    a row written by other software) would otherwise fail every query of its rollout; it is reported in one warning.
    """
    validate = Span.model_validate_json
    try:
        return [validate(row[0]) for row in rows]
    except ValidationError:
        pass  # some row is damaged: read them one by one (the usual query pays nothing for this)
    spans: list[Span] = []
    unreadable: list[str] = []
    for row in rows:
        try:
            spans.append(validate(row[0]))
        except ValidationError as exc:
            unreadable.append(f"{_stored_ids(row[0])}: {validation_summary(exc)}")
    warn_unreadable_spans(rollout_id, unreadable)
    return spans


def _stored_ids(data: bytes) -> str:
    """``span <id> (attempt <id>)`` as far as a damaged stored span still tells them."""
    try:
        fields: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        fields = None
    if not isinstance(fields, dict):
        return "a span that is not a JSON object"
    known = cast(dict[str, Any], fields)
    return f"span {known.get('span_id', '?')} (attempt {known.get('attempt_id', '?')})"
