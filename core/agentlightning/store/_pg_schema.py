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
    ATTEMPT_FIELDS,
    ROLLOUT_COLUMNS,
    ROLLOUT_FIELDS,
    attempt_from_row,
    dumps_json,
    rollout_from_row,
    rollout_values,
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
    (
        2,
        "rollouts.version: bumped by every state change, for compare-and-set writes without a transaction",
        "ALTER TABLE rollouts ADD COLUMN version BIGINT NOT NULL DEFAULT 0",
    ),
    (
        3,
        "idempotency keys with the answer of their write, committed with it (see _keys)",
        """
        CREATE TABLE idempotency_keys (key TEXT PRIMARY KEY, create_time BIGINT NOT NULL, answer BYTEA NOT NULL);
        CREATE INDEX idempotency_keys_age ON idempotency_keys(create_time)
        """,
    ),
    (
        4,
        "algorithm metrics: one row per (run_id, step), values as JSON; run ids in byte order (see _pg_metrics)",
        """
        CREATE TABLE metrics (
            run_id TEXT COLLATE "C" NOT NULL, step BIGINT NOT NULL, time BIGINT NOT NULL, data BYTEA NOT NULL,
            PRIMARY KEY (run_id, step))
        """,
    ),
)

SELECT_ROLLOUT: Final = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts"
SELECT_ATTEMPT: Final = f"SELECT {ATTEMPT_COLUMNS} FROM attempts"
TERMINAL_SQL: Final = "('succeeded', 'failed', 'cancelled')"
# Oldest claimable rollout nobody else is claiming right now, plus the latest resources id, in one round trip.
# Row layout: the rollout's columns, its version, then the latest resources id.
CLAIM_SQL: Final = (
    f"SELECT {ROLLOUT_COLUMNS}, version, (SELECT resources_id FROM resources ORDER BY version DESC LIMIT 1) "
    "FROM rollouts WHERE status IN ('queuing', 'requeuing') ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED"
)
_N_ROLLOUT: Final = len(ROLLOUT_FIELDS)
# A rollout, its version and all its attempts (one row per attempt, attempt columns NULL when it has none) in one
# statement: one snapshot, so the rows are consistent with each other without a transaction.
_READ_WITH_ATTEMPTS: Final = (
    f"SELECT {', '.join(f'r.{c}' for c in ROLLOUT_FIELDS)}, r.version, {', '.join(f'a.{c}' for c in ATTEMPT_FIELDS)} "
    "FROM rollouts r LEFT JOIN attempts a ON a.rollout_id = r.rollout_id WHERE r.rollout_id = %s "
    "ORDER BY a.sequence_id"
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
    "UPDATE rollouts SET status = %s, metadata = %s, start_time = %s, end_time = %s, num_attempts = %s, "
    "version = version + 1 WHERE rollout_id = %s"
)
_INSERT_ATTEMPT: Final = f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
# GREATEST: a span batch may have moved the heartbeat on since this transaction read the attempt.
_UPDATE_ATTEMPT: Final = (
    "UPDATE attempts SET status = %s, end_time = %s, error = %s, "
    "last_heartbeat_time = GREATEST(last_heartbeat_time, %s) WHERE attempt_id = %s"
)

# Compare-and-set writes of one rollout and at most one attempt, as one statement (atomic without a transaction):
# the rollout row moves to the next version only if it is still at the version read, and the attempt write runs
# only if it did. The statement returns how many rollout rows moved (0: someone else changed it first).
_CAS_ROLLOUT: Final = (
    "UPDATE rollouts SET status = %s, metadata = %s, start_time = %s, end_time = %s, num_attempts = %s, "
    "version = version + 1 WHERE rollout_id = %s AND version = %s RETURNING 1"
)
_CAS_TOUCH: Final = "UPDATE rollouts SET version = version + 1 WHERE rollout_id = %s AND version = %s RETURNING 1"
_GATED_INSERT_ATTEMPT: Final = (
    f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) SELECT %s::text, %s::text, %s::int, %s::text, %s::text, "
    "%s::bigint, %s::bigint, %s::bigint, %s::text, %s::text WHERE EXISTS (SELECT 1 FROM r)"
)
_GATED_UPDATE_ATTEMPT: Final = (
    "UPDATE attempts SET status = %s, end_time = %s, error = %s, "
    "last_heartbeat_time = GREATEST(last_heartbeat_time, %s) WHERE attempt_id = %s AND EXISTS (SELECT 1 FROM r)"
)
_CAS_ROLLOUT_ONLY: Final = f"WITH r AS ({_CAS_ROLLOUT}) SELECT COUNT(*) FROM r"
_CAS_WITH_INSERT: Final = f"WITH r AS ({_CAS_ROLLOUT}), a AS ({_GATED_INSERT_ATTEMPT}) SELECT COUNT(*) FROM r"
_CAS_WITH_UPDATE: Final = f"WITH r AS ({_CAS_ROLLOUT}), a AS ({_GATED_UPDATE_ATTEMPT}) SELECT COUNT(*) FROM r"
_TOUCH_WITH_UPDATE: Final = f"WITH r AS ({_CAS_TOUCH}), a AS ({_GATED_UPDATE_ATTEMPT}) SELECT COUNT(*) FROM r"

_ONE_ROLLOUT: Final = f"SELECT {ROLLOUT_COLUMNS}, version FROM rollouts WHERE rollout_id = %s"
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
        self.versions: dict[str, int] = {}  # rollout id -> version as loaded
        self._new_rollouts: list[Rollout] = []
        self._changed_rollouts: dict[str, Rollout] = {}
        self._new_attempts: list[Attempt] = []
        self._changed_attempts: dict[str, Attempt] = {}

    # --- loading -------------------------------------------------------------------------------------------------
    async def load_rollouts(self, conn: AsyncConnection[Any], rollout_ids: Sequence[str], *, lock: bool) -> None:
        """Load rollouts (locked ``FOR UPDATE`` in enqueue order when ``lock``) and all their attempts."""
        ids = list(dict.fromkeys(rollout_ids))
        # The attempts query runs after the rollout rows are locked, so it sees every attempt committed before.
        if len(ids) == 1:  # every single-rollout op: a scalar parameter is far cheaper to send than a list
            rollout_rows = await conn.execute(_ONE_ROLLOUT_LOCKED if lock else _ONE_ROLLOUT, (ids[0],), binary=True)
            attempt_rows = await conn.execute(_ATTEMPTS_OF_ONE, (ids[0],))
        else:
            suffix = " ORDER BY seq FOR UPDATE" if lock else ""
            rollout_rows = await conn.execute(
                f"SELECT {ROLLOUT_COLUMNS}, version FROM rollouts WHERE rollout_id = ANY(%s){suffix}",
                (ids,),
                binary=True,
            )
            attempt_rows = await conn.execute(
                f"{SELECT_ATTEMPT} WHERE rollout_id = ANY(%s) ORDER BY rollout_id, sequence_id", (ids,)
            )
        found: dict[str, Rollout] = {}
        for row in await rollout_rows.fetchall():
            found[row[0]] = rollout_from_row(row[:_N_ROLLOUT])
            if len(row) > _N_ROLLOUT:
                self.versions[row[0]] = row[_N_ROLLOUT]
        for rollout_id in ids:
            self.rollouts[rollout_id] = found.get(rollout_id)
            self.attempts[rollout_id] = []
        for row in await attempt_rows.fetchall():
            self.attempts[row[0]].append(attempt_from_row(row))

    async def read_rollout(self, conn: AsyncConnection[Any], rollout_id: str) -> None:
        """Load one rollout, its version and its attempts without locking (one statement, one snapshot)."""
        cursor = await conn.execute(_READ_WITH_ATTEMPTS, (rollout_id,), binary=True)
        rows = await cursor.fetchall()
        self.rollouts[rollout_id] = rollout_from_row(rows[0][:_N_ROLLOUT]) if rows else None
        self.attempts[rollout_id] = [
            attempt_from_row(row[_N_ROLLOUT + 1 :]) for row in rows if row[_N_ROLLOUT + 1] is not None
        ]
        if rows:
            self.versions[rollout_id] = rows[0][_N_ROLLOUT]

    def claimed_row(self, row: Sequence[Any]) -> None:
        """Take the row of :data:`CLAIM_SQL` (locked) as the claimable rollout."""
        self.claimable = rollout_from_row(row[:_N_ROLLOUT])
        self.versions[self.claimable.rollout_id] = row[_N_ROLLOUT]
        self.latest_resources = row[_N_ROLLOUT + 1]

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
    async def flush(self, conn: AsyncConnection[Any], *, compare_and_set: bool = False) -> bool:
        """Write every recorded change; False when nothing was written because the rollout changed meanwhile.

        Inside a transaction that locked the rows, pass ``compare_and_set=False``: the writes always apply. With
        ``compare_and_set=True`` (rows read by :meth:`read_rollout`, no transaction) the change must touch one
        rollout and at most one attempt of it, and goes in as one statement only if the rollout is still at the
        version read; every such change moves the version on, so a concurrent change makes the other one fail.
        """
        inserted = {r.rollout_id for r in self._new_rollouts}  # written whole by the insert below
        changed = [r for r in self._changed_rollouts.values() if r.rollout_id not in inserted]
        attempts = [*self._new_attempts, *self._changed_attempts.values()]
        if not (self._new_rollouts or changed or attempts):
            return True
        single = _single_rollout_change(changed, attempts) if not self._new_rollouts else None
        version = self.versions.get(single) if single is not None else None
        if single is not None and version is not None:
            # A claim, start, finish, cancel, heartbeat or metadata update: all its writes as one statement (each
            # statement costs a round of client and server work, more than these small writes themselves).
            sql, params = _cas_statement(changed[0] if changed else None, single, version, attempts, self._new_attempts)
            cursor = await conn.execute(sql, params)
            if not compare_and_set:
                return True  # the rows are locked: it applies (its result is not read, so no extra round trip)
            row = await cursor.fetchone()
            return row is not None and row[0] == 1
        if compare_and_set:
            raise RuntimeError("bug: a compare-and-set flush changes one rollout and at most one attempt of it")
        async with conn.cursor() as cursor:
            if len(self._new_rollouts) == 1:
                await cursor.execute(_INSERT_ROLLOUT, rollout_values(self._new_rollouts[0]))
            elif self._new_rollouts:
                await cursor.execute(_INSERT_ROLLOUTS, _rollout_columns(self._new_rollouts))
            # One row per statement is the common case: execute() costs less client CPU than executemany().
            await _execute_each(cursor, _INSERT_ATTEMPT, [_insert_attempt_values(a) for a in self._new_attempts])
            await _execute_each(
                cursor, _UPDATE_ATTEMPT, [_update_attempt_values(a) for a in self._changed_attempts.values()]
            )
            await _execute_each(cursor, _UPDATE_ROLLOUT, [_update_rollout_values(r) for r in changed])
        return True


def _single_rollout_change(changed: Sequence[Rollout], attempts: Sequence[Attempt]) -> str | None:
    """The rollout id when the writes are one rollout (changed or not) and at most one attempt of it, else None."""
    if len(changed) > 1 or len(attempts) > 1 or not (changed or attempts):
        return None
    rollout_id = changed[0].rollout_id if changed else attempts[0].rollout_id
    if attempts and attempts[0].rollout_id != rollout_id:
        return None
    return rollout_id


def _cas_statement(
    rollout: Rollout | None, rollout_id: str, version: int, attempts: Sequence[Attempt], new: Sequence[Attempt]
) -> tuple[LiteralString, tuple[Any, ...]]:
    """The compare-and-set statement of :meth:`PrefetchedTxn.flush` and its parameters."""
    if rollout is None:  # an attempt-only change (heartbeat): the rollout's version still moves on
        return _TOUCH_WITH_UPDATE, (rollout_id, version, *_update_attempt_values(attempts[0]))
    head = (*_update_rollout_values(rollout), version)
    if not attempts:
        return _CAS_ROLLOUT_ONLY, head
    if new:
        return _CAS_WITH_INSERT, (*head, *_insert_attempt_values(attempts[0]))
    return _CAS_WITH_UPDATE, (*head, *_update_attempt_values(attempts[0]))


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
        for column, value in zip(columns, rollout_values(r), strict=True):
            column.append(value)
    return columns
