"""Span ingest for the PostgreSQL store: lock the attempts, skip spans already stored, one multi-row insert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from psycopg import AsyncConnection

from agentlightning.types import Span

# Attempt rows are locked in id order, so two batches touching the same attempts cannot deadlock.
_LOCK_ATTEMPTS: Final = (
    "SELECT attempt_id, rollout_id, sequence_id, span_count, status IN ('preparing', 'running') FROM attempts "
    "WHERE attempt_id = ANY(%s) ORDER BY attempt_id FOR UPDATE"
)
# Batches nearly always come from one attempt: the same statements with scalar parameters, which psycopg sends for
# a fraction of the client CPU of a list (it inspects every list element to choose a dumper).
_LOCK_ATTEMPT: Final = (
    "SELECT attempt_id, rollout_id, sequence_id, span_count, status IN ('preparing', 'running') FROM attempts "
    "WHERE attempt_id = %s FOR UPDATE"
)
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

# Data-modifying CTE: the spans go in and the attempts' counters move in one statement.
_INSERT_THEN_UPDATE_ATTEMPT: Final = f"WITH inserted AS ({_INSERT}) {_UPDATE_ATTEMPT}"
_INSERT_THEN_UPDATE_ATTEMPTS: Final = f"WITH inserted AS ({_INSERT}) {_UPDATE_ATTEMPTS}"


async def store_spans(
    conn: AsyncConnection[Any], spans: Sequence[Span], keys: Sequence[tuple[str, str]], now: int
) -> list[Span] | tuple[str, str]:
    """Store ``spans`` inside the caller's transaction; returns them as stored (with sequence ids).

    Returns the first (rollout_id, attempt_id) of ``keys`` that names no attempt instead, having written nothing.
    """
    attempt_ids = list(dict.fromkeys(attempt_id for _, attempt_id in keys))
    if len(attempt_ids) == 1:
        cursor = await conn.execute(_LOCK_ATTEMPT, (attempt_ids[0],))
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
