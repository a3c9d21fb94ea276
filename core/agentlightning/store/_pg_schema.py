"""PostgreSQL schema (versioned migrations) and the row access the shared state machine runs on.

The state machine (:mod:`agentlightning.store._statemachine`) reads and writes rows synchronously, while psycopg's
async connections need ``await``. :class:`PrefetchedTxn` bridges the two: a backend op first loads (and locks,
``FOR UPDATE``) every row the state machine will read, the state machine runs on those rows in memory and records
its writes, and :meth:`PrefetchedTxn.flush` writes them back, all in one database transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, LiteralString

from psycopg import AsyncConnection, AsyncCursor

from agentlightning.store._sqlite_schema import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    attempt_from_row,
    dumps_json,
    rollout_from_row,
)
from agentlightning.types import Attempt, Rollout

# (version, description, SQL). Append new migrations; never edit a released one.
MIGRATIONS: Final[tuple[tuple[int, str, str], ...]] = (
    (
        1,
        "PostgreSQL tables: rollouts, attempts, spans, resources",
        """
        CREATE TABLE rollouts (
            seq BIGSERIAL PRIMARY KEY, rollout_id TEXT NOT NULL UNIQUE, status TEXT NOT NULL,
            mode TEXT, group_id TEXT, resources_id TEXT, input BYTEA NOT NULL, config BYTEA NOT NULL,
            metadata BYTEA NOT NULL, enqueue_time BIGINT NOT NULL, start_time BIGINT, end_time BIGINT,
            num_attempts INTEGER NOT NULL);
        -- partial index in enqueue order: a claim reads its first unlocked row instead of sorting the queue
        CREATE INDEX rollouts_claimable ON rollouts(seq) WHERE status IN ('queuing', 'requeuing');
        CREATE INDEX rollouts_status ON rollouts(status);
        CREATE INDEX rollouts_group ON rollouts(group_id);
        CREATE TABLE attempts (
            rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL UNIQUE, sequence_id INTEGER NOT NULL,
            status TEXT NOT NULL, worker_id TEXT, start_time BIGINT NOT NULL, end_time BIGINT,
            last_heartbeat_time BIGINT, error TEXT, resources_id TEXT, span_count INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (rollout_id, sequence_id));
        CREATE INDEX attempts_live ON attempts(status) WHERE status IN ('preparing', 'running');
        CREATE TABLE spans (
            rollout_id TEXT NOT NULL, attempt_seq INTEGER NOT NULL, sequence_id INTEGER NOT NULL,
            attempt_id TEXT NOT NULL, span_id TEXT NOT NULL, name TEXT NOT NULL, data BYTEA NOT NULL,
            PRIMARY KEY (attempt_id, span_id));
        CREATE UNIQUE INDEX spans_order ON spans(rollout_id, attempt_seq, sequence_id);
        CREATE TABLE resources (version INTEGER PRIMARY KEY, resources_id TEXT NOT NULL UNIQUE, data BYTEA NOT NULL)
        """,
    ),
)

SELECT_ROLLOUT: Final = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts"
SELECT_ATTEMPT: Final = f"SELECT {ATTEMPT_COLUMNS} FROM attempts"
TERMINAL_SQL: Final = "('succeeded', 'failed', 'cancelled')"
# Oldest claimable rollout nobody else is claiming right now, plus the latest resources id, in one round trip.
CLAIM_SQL: Final = (
    f"SELECT {ROLLOUT_COLUMNS}, (SELECT resources_id FROM resources ORDER BY version DESC LIMIT 1) FROM rollouts "
    "WHERE status IN ('queuing', 'requeuing') ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED"
)
_INSERT_ROLLOUTS: Final = (
    f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) "
    "SELECT r, s, m, g, res, i, c, md, et, st, en, n FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::bytea[], %s::bytea[], %s::bytea[], "
    "%s::bigint[], %s::bigint[], %s::bigint[], %s::int[]) "
    "WITH ORDINALITY AS u(r, s, m, g, res, i, c, md, et, st, en, n, o) ORDER BY o"
)
# The same insert for one rollout (the common case): scalar parameters, because psycopg inspects every element of
# every list parameter to choose its dumper, and twelve one-element arrays cost more client CPU than the statement.
_INSERT_ROLLOUT: Final = (
    f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_UPDATE_ROLLOUT: Final = (
    "UPDATE rollouts SET status = %s, metadata = %s, start_time = %s, end_time = %s, num_attempts = %s "
    "WHERE rollout_id = %s"
)
_INSERT_ATTEMPT: Final = f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
# GREATEST: a span batch may have moved the heartbeat on since this transaction read the attempt.
_UPDATE_ATTEMPT: Final = (
    "UPDATE attempts SET status = %s, end_time = %s, error = %s, "
    "last_heartbeat_time = GREATEST(last_heartbeat_time, %s) WHERE attempt_id = %s"
)

# Data-modifying CTEs: both writes run (on the same snapshot, on different tables) in one statement.
_INSERT_ATTEMPT_WITH_ROLLOUT: Final = f"WITH a AS ({_INSERT_ATTEMPT}) {_UPDATE_ROLLOUT}"
_UPDATE_ATTEMPT_WITH_ROLLOUT: Final = f"WITH a AS ({_UPDATE_ATTEMPT}) {_UPDATE_ROLLOUT}"

_ONE_ROLLOUT: Final = f"{SELECT_ROLLOUT} WHERE rollout_id = %s"
_ONE_ROLLOUT_LOCKED: Final = f"{_ONE_ROLLOUT} FOR UPDATE"
_ATTEMPTS_OF_ONE: Final = f"{SELECT_ATTEMPT} WHERE rollout_id = %s ORDER BY sequence_id"


class PrefetchedTxn:
    """The state machine's row access over rows loaded before it runs; writes are kept until :meth:`flush`.

    Reading a row that was not loaded is a bug in the calling op, so it raises instead of guessing.
    """

    def __init__(self) -> None:
        self.rollouts: dict[str, Rollout | None] = {}
        self.attempts: dict[str, list[Attempt]] = {}
        self.claimable: Rollout | None = None
        self.live: list[Attempt] = []
        self.known_resources: set[str] = set()
        self.latest_resources: str | None = None
        self._new_rollouts: list[Rollout] = []
        self._changed_rollouts: dict[str, Rollout] = {}
        self._new_attempts: list[Attempt] = []
        self._changed_attempts: dict[str, Attempt] = {}

    # --- loading -------------------------------------------------------------------------------------------------
    async def load_rollouts(self, conn: AsyncConnection[Any], rollout_ids: Sequence[str], *, lock: bool) -> None:
        """Load rollouts (locked ``FOR UPDATE`` in enqueue order when ``lock``) and all their attempts."""
        ids = list(dict.fromkeys(rollout_ids))
        # Both queries go out before either result is read: one round trip in pipeline mode. The attempts query
        # runs after the rollout rows are locked, so it sees every attempt committed before the lock.
        if len(ids) == 1:  # every single-rollout op: a scalar parameter is far cheaper to send than a list
            rollout_rows = await conn.execute(_ONE_ROLLOUT_LOCKED if lock else _ONE_ROLLOUT, (ids[0],), binary=True)
            attempt_rows = await conn.execute(_ATTEMPTS_OF_ONE, (ids[0],))
        else:
            suffix = " ORDER BY seq FOR UPDATE" if lock else ""
            rollout_rows = await conn.execute(
                f"{SELECT_ROLLOUT} WHERE rollout_id = ANY(%s){suffix}", (ids,), binary=True
            )
            attempt_rows = await conn.execute(
                f"{SELECT_ATTEMPT} WHERE rollout_id = ANY(%s) ORDER BY rollout_id, sequence_id", (ids,)
            )
        found = {row[0]: rollout_from_row(row) for row in await rollout_rows.fetchall()}
        for rollout_id in ids:
            self.rollouts[rollout_id] = found.get(rollout_id)
            self.attempts[rollout_id] = []
        for row in await attempt_rows.fetchall():
            self.attempts[row[0]].append(attempt_from_row(row))

    # --- StoreTxn ------------------------------------------------------------------------------------------------
    def get_rollout(self, rollout_id: str) -> Rollout | None:
        if rollout_id not in self.rollouts:
            raise RuntimeError(f"bug: rollout {rollout_id} was read by the state machine but not loaded first")
        return self.rollouts[rollout_id]

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        self._new_rollouts.extend(rollouts)
        for rollout in rollouts:
            self.rollouts[rollout.rollout_id] = rollout
            self.attempts[rollout.rollout_id] = []

    def update_rollout(self, rollout: Rollout) -> None:
        self.rollouts[rollout.rollout_id] = rollout
        self._changed_rollouts[rollout.rollout_id] = rollout

    def first_claimable(self) -> Rollout | None:
        return self.claimable

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        return next((a for a in self.list_attempts(rollout_id) if a.attempt_id == attempt_id), None)

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        if rollout_id not in self.attempts:
            raise RuntimeError(f"bug: attempts of {rollout_id} were read by the state machine but not loaded first")
        return list(self.attempts[rollout_id])

    def insert_attempt(self, attempt: Attempt) -> None:
        self._new_attempts.append(attempt)
        self.attempts.setdefault(attempt.rollout_id, []).append(attempt)

    def update_attempt(self, attempt: Attempt) -> None:
        attempts = self.attempts.setdefault(attempt.rollout_id, [])
        for index, known in enumerate(attempts):
            if known.attempt_id == attempt.attempt_id:
                attempts[index] = attempt
        self._changed_attempts[attempt.attempt_id] = attempt

    def live_attempts(self) -> list[Attempt]:
        return list(self.live)

    def resources_exist(self, resources_id: str) -> bool:
        return resources_id in self.known_resources

    def latest_resources_id(self) -> str | None:
        return self.latest_resources

    # --- writing -------------------------------------------------------------------------------------------------
    async def flush(self, conn: AsyncConnection[Any]) -> None:
        """Write every recorded change (inside the caller's transaction)."""
        async with conn.cursor() as cursor:
            inserted = {r.rollout_id for r in self._new_rollouts}  # written whole by the insert below
            changed = [r for r in self._changed_rollouts.values() if r.rollout_id not in inserted]
            attempts = [*self._new_attempts, *self._changed_attempts.values()]
            if not self._new_rollouts and len(changed) == 1 and len(attempts) == 1:
                # A claim, start, finish or heartbeat: the attempt and rollout writes as one statement (each
                # statement costs a round of client and server work, more than these small writes themselves).
                sql = _INSERT_ATTEMPT_WITH_ROLLOUT if self._new_attempts else _UPDATE_ATTEMPT_WITH_ROLLOUT
                params = (
                    _insert_attempt_values(attempts[0]) if self._new_attempts else _update_attempt_values(attempts[0])
                )
                await cursor.execute(sql, (*params, *_update_rollout_values(changed[0])))
                return
            if len(self._new_rollouts) == 1:
                await cursor.execute(_INSERT_ROLLOUT, _rollout_values(self._new_rollouts[0]))
            elif self._new_rollouts:
                await cursor.execute(_INSERT_ROLLOUTS, _rollout_columns(self._new_rollouts))
            # One row per statement is the common case: execute() costs less client CPU than executemany().
            await _execute_each(cursor, _INSERT_ATTEMPT, [_insert_attempt_values(a) for a in self._new_attempts])
            await _execute_each(
                cursor, _UPDATE_ATTEMPT, [_update_attempt_values(a) for a in self._changed_attempts.values()]
            )
            await _execute_each(cursor, _UPDATE_ROLLOUT, [_update_rollout_values(r) for r in changed])


def _insert_attempt_values(a: Attempt) -> tuple[Any, ...]:
    return (
        a.rollout_id, a.attempt_id, a.sequence_id, a.status, a.worker_id, a.start_time, a.end_time,
        a.last_heartbeat_time, a.error, a.resources_id,
    )  # fmt: skip


def _update_attempt_values(a: Attempt) -> tuple[Any, ...]:
    return (a.status, a.end_time, a.error, a.last_heartbeat_time, a.attempt_id)


def _update_rollout_values(r: Rollout) -> tuple[Any, ...]:
    metadata = dumps_json(r.metadata, f"metadata of rollout {r.rollout_id}")
    return (r.status, metadata, r.start_time, r.end_time, r.num_attempts, r.rollout_id)


async def _execute_each(cursor: AsyncCursor[Any], sql: LiteralString, rows: Sequence[tuple[Any, ...]]) -> None:
    """Run ``sql`` once per row: plain execute() for one row, executemany() for more, nothing for none."""
    if len(rows) == 1:
        await cursor.execute(sql, rows[0])
    elif rows:
        await cursor.executemany(sql, rows)


def _rollout_columns(rollouts: Sequence[Rollout]) -> tuple[list[Any], ...]:
    """Column arrays of new rollouts for the ``unnest`` insert (one statement for any batch size)."""
    columns: tuple[list[Any], ...] = tuple([] for _ in range(12))
    for r in rollouts:
        for column, value in zip(columns, _rollout_values(r), strict=True):
            column.append(value)
    return columns


def _rollout_values(r: Rollout) -> tuple[Any, ...]:
    """One new rollout's column values, in ``ROLLOUT_COLUMNS`` order."""
    return (
        r.rollout_id,
        r.status,
        r.mode,
        r.group_id,
        r.resources_id,
        dumps_json(r.input, f"input of rollout {r.rollout_id}"),
        r.config.__pydantic_serializer__.to_json(r.config),
        dumps_json(r.metadata, f"metadata of rollout {r.rollout_id}"),
        r.enqueue_time,
        r.start_time,
        r.end_time,
        r.num_attempts,
    )
