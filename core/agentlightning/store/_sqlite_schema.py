"""SQLite schema (versioned migrations) and row access for :mod:`agentlightning.store.sqlite`."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

import orjson

from agentlightning.store._statemachine import construct
from agentlightning.types import Attempt, Rollout, RolloutConfig

# (version, description, SQL statements separated by ";"). Append new migrations; never edit a released one.
MIGRATIONS: Final[tuple[tuple[int, str, str], ...]] = (
    (
        1,
        "rollouts, attempts, spans, resources",
        """
        CREATE TABLE rollouts (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL UNIQUE, status TEXT NOT NULL,
            mode TEXT, group_id TEXT, resources_id TEXT, input BLOB NOT NULL, config BLOB NOT NULL,
            metadata BLOB NOT NULL, enqueue_time INTEGER NOT NULL, start_time INTEGER, end_time INTEGER,
            num_attempts INTEGER NOT NULL);
        -- partial index in enqueue order: a claim reads its first row instead of sorting the queue
        CREATE INDEX rollouts_claimable ON rollouts(seq) WHERE status IN ('queuing', 'requeuing');
        CREATE INDEX rollouts_status ON rollouts(status);
        CREATE INDEX rollouts_group ON rollouts(group_id);
        CREATE TABLE attempts (
            rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL UNIQUE, sequence_id INTEGER NOT NULL,
            status TEXT NOT NULL, worker_id TEXT, start_time INTEGER NOT NULL, end_time INTEGER,
            last_heartbeat_time INTEGER, error TEXT, resources_id TEXT, span_count INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (rollout_id, sequence_id));
        CREATE INDEX attempts_live ON attempts(status) WHERE status IN ('preparing', 'running');
        CREATE TABLE spans (
            id INTEGER PRIMARY KEY, rollout_id TEXT NOT NULL, attempt_seq INTEGER NOT NULL,
            sequence_id INTEGER NOT NULL, attempt_id TEXT NOT NULL, span_id TEXT NOT NULL, name TEXT NOT NULL,
            data BLOB NOT NULL);
        CREATE UNIQUE INDEX spans_order ON spans(rollout_id, attempt_seq, sequence_id);
        CREATE UNIQUE INDEX spans_key ON spans(attempt_id, span_id);
        CREATE TABLE resources (version INTEGER PRIMARY KEY, resources_id TEXT NOT NULL UNIQUE, data BLOB NOT NULL)
        """,
    ),
    (
        2,
        "spans stored as one row per attempt per add_spans call, plus one key row per span",
        # See _sqlite_spans. Each old row becomes a batch of one; TEXT rows were written by orjson (trusted).
        """
        CREATE TABLE span_batches (
            id INTEGER PRIMARY KEY, rollout_seq INTEGER NOT NULL, attempt_seq INTEGER NOT NULL,
            first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, trusted INTEGER NOT NULL, data BLOB NOT NULL);
        CREATE UNIQUE INDEX span_batches_order ON span_batches(rollout_seq, attempt_seq, first_seq);
        CREATE TABLE span_keys (
            rollout_seq INTEGER NOT NULL, attempt_seq INTEGER NOT NULL, span_id TEXT NOT NULL,
            sequence_id INTEGER NOT NULL, PRIMARY KEY (rollout_seq, attempt_seq, span_id)) WITHOUT ROWID;
        INSERT INTO span_batches (rollout_seq, attempt_seq, first_seq, last_seq, trusted, data)
            SELECT r.seq, s.attempt_seq, s.sequence_id, s.sequence_id, typeof(s.data) = 'text',
                CAST('[' || CAST(s.data AS TEXT) || ']' AS BLOB)
            FROM spans s JOIN rollouts r ON r.rollout_id = s.rollout_id ORDER BY s.id;
        INSERT INTO span_keys (rollout_seq, attempt_seq, span_id, sequence_id)
            SELECT r.seq, s.attempt_seq, s.span_id, s.sequence_id
            FROM spans s JOIN rollouts r ON r.rollout_id = s.rollout_id;
        DROP TABLE spans
        """,
    ),
    (
        3,
        "idempotency keys with the answer of their write, committed with it (see _keys)",
        """
        CREATE TABLE idempotency_keys (key TEXT PRIMARY KEY, create_time INTEGER NOT NULL, answer BLOB NOT NULL);
        CREATE INDEX idempotency_keys_age ON idempotency_keys(create_time)
        """,
    ),
    (
        4,
        "algorithm metrics: one row per (run_id, step), values as JSON (see _sqlite_metrics)",
        """
        CREATE TABLE metrics (
            run_id TEXT NOT NULL, step INTEGER NOT NULL, time INTEGER NOT NULL, data BLOB NOT NULL,
            PRIMARY KEY (run_id, step)) WITHOUT ROWID
        """,
    ),
)

ROLLOUT_FIELDS: Final = (
    "rollout_id", "status", "mode", "group_id", "resources_id", "input", "config", "metadata", "enqueue_time",
    "start_time", "end_time", "num_attempts",
)  # fmt: skip
ATTEMPT_FIELDS: Final = (
    "rollout_id", "attempt_id", "sequence_id", "status", "worker_id", "start_time", "end_time",
    "last_heartbeat_time", "error", "resources_id",
)  # fmt: skip
ROLLOUT_COLUMNS: Final = ", ".join(ROLLOUT_FIELDS)
ATTEMPT_COLUMNS: Final = ", ".join(ATTEMPT_FIELDS)
SELECT_ROLLOUT: Final = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts"
SELECT_ATTEMPT: Final = f"SELECT {ATTEMPT_COLUMNS} FROM attempts"


@functools.lru_cache(maxsize=1024)
def config_from_json(raw: bytes) -> RolloutConfig:
    """Parse a stored RolloutConfig; configs are frozen and few, so parsed ones are shared."""
    return RolloutConfig.model_validate_json(raw)


def dumps_json(value: Any, what: str) -> bytes:
    """JSON bytes of ``value``; ValueError naming ``what`` when it is not JSON-serialisable."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise ValueError(f"{what} must be JSON-serialisable to be stored in SQLite: {exc}") from exc


def rollout_values(r: Rollout) -> tuple[Any, ...]:
    """One new rollout's column values, in ``ROLLOUT_COLUMNS`` order (both SQL backends insert these)."""
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


def rollout_from_row(row: Sequence[Any]) -> Rollout:
    """A Rollout from a ``SELECT ROLLOUT_COLUMNS`` row (validated on its way in, so not validated again)."""
    return construct(
        Rollout,
        {
            "rollout_id": row[0],
            "status": row[1],
            "mode": row[2],
            "group_id": row[3],
            "resources_id": row[4],
            "input": orjson.loads(row[5]),
            "config": config_from_json(row[6]),
            "metadata": orjson.loads(row[7]),
            "enqueue_time": row[8],
            "start_time": row[9],
            "end_time": row[10],
            "num_attempts": row[11],
        },
    )


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    """An Attempt from a ``SELECT ATTEMPT_COLUMNS`` row (validated on its way in)."""
    return construct(Attempt, dict(zip(ATTEMPT_FIELDS, row, strict=True)))


# --- state machine rows ------------------------------------------------------------------------------------------
_ROLLOUT_WITH_ATTEMPTS: Final = (
    f"SELECT {', '.join(f'r.{c}' for c in ROLLOUT_FIELDS)}, {', '.join(f'a.{c}' for c in ATTEMPT_FIELDS)} "
    "FROM rollouts r LEFT JOIN attempts a ON a.rollout_id = r.rollout_id WHERE r.rollout_id = ? ORDER BY a.sequence_id"
)
# The latest snapshot comes with the claimed rollout: a claim without resources_id records it.
_FIRST_CLAIMABLE: Final = (
    f"SELECT {ROLLOUT_COLUMNS}, (SELECT resources_id FROM resources ORDER BY version DESC LIMIT 1) FROM rollouts "
    "WHERE status IN ('queuing', 'requeuing') ORDER BY seq LIMIT 1"
)
_INSERT_ROLLOUT: Final = f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
_UPDATE_ROLLOUT: Final = (
    "UPDATE rollouts SET status = ?, metadata = ?, start_time = ?, end_time = ?, num_attempts = ? WHERE rollout_id = ?"
)
_INSERT_ATTEMPT: Final = f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
_UPDATE_ATTEMPT: Final = (
    "UPDATE attempts SET status = ?, end_time = ?, last_heartbeat_time = ?, error = ? WHERE attempt_id = ?"
)


class SqliteTxn:
    """SQL row access for the shared state machine, inside one transaction (or one read under the store lock).

    A rollout is read together with its attempts in one query and kept until :meth:`reset` (the store calls it when
    it takes its lock), so an op that reads the rollout, its attempt and the attempt list costs one statement.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._rollouts: dict[str, Rollout | None] = {}
        self._attempts: dict[str, list[Attempt]] = {}
        self._latest_resources: tuple[str | None] | None = None

    def reset(self) -> None:
        """Forget rows read so far: another connection may change them once this transaction ends."""
        if self._rollouts:
            self._rollouts = {}
            self._attempts = {}
        self._latest_resources = None

    def _load(self, rollout_id: str) -> Rollout | None:
        rows = self.conn.execute(_ROLLOUT_WITH_ATTEMPTS, (rollout_id,)).fetchall()
        if not rows:
            self._rollouts[rollout_id] = None
            self._attempts[rollout_id] = []
            return None
        split = len(ROLLOUT_FIELDS)
        rollout = rollout_from_row(rows[0])
        self._rollouts[rollout_id] = rollout
        self._attempts[rollout_id] = [attempt_from_row(row[split:]) for row in rows if row[split] is not None]
        return rollout

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        if rollout_id in self._rollouts:
            return self._rollouts[rollout_id]
        return self._load(rollout_id)

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        rows = [rollout_values(r) for r in rollouts]
        self.conn.executemany(_INSERT_ROLLOUT, rows)
        if self._rollouts:
            for r in rollouts:
                self._rollouts.pop(r.rollout_id, None)
                self._attempts.pop(r.rollout_id, None)

    def update_rollout(self, rollout: Rollout) -> None:
        self.conn.execute(
            _UPDATE_ROLLOUT,
            (
                rollout.status,
                dumps_json(rollout.metadata, f"metadata of rollout {rollout.rollout_id}"),
                rollout.start_time,
                rollout.end_time,
                rollout.num_attempts,
                rollout.rollout_id,
            ),
        )
        if rollout.rollout_id in self._rollouts:
            self._rollouts[rollout.rollout_id] = rollout

    def first_claimable(self) -> Rollout | None:
        row = self.conn.execute(_FIRST_CLAIMABLE).fetchone()
        if row is None:
            return None
        self._latest_resources = (row[-1],)
        return rollout_from_row(row)

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        for attempt in self.list_attempts(rollout_id):
            if attempt.attempt_id == attempt_id:
                return attempt
        return None

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        if rollout_id not in self._attempts:
            self._load(rollout_id)
        return list(self._attempts[rollout_id])

    def insert_attempt(self, attempt: Attempt) -> None:
        d = attempt.__dict__
        self.conn.execute(_INSERT_ATTEMPT, tuple(d[field] for field in ATTEMPT_FIELDS))
        attempts = self._attempts.get(attempt.rollout_id)
        if attempts is not None:
            attempts.append(attempt)

    def update_attempt(self, attempt: Attempt) -> None:
        self.conn.execute(
            _UPDATE_ATTEMPT,
            (attempt.status, attempt.end_time, attempt.last_heartbeat_time, attempt.error, attempt.attempt_id),
        )
        attempts = self._attempts.get(attempt.rollout_id)
        if attempts is not None:
            for index, known in enumerate(attempts):
                if known.attempt_id == attempt.attempt_id:
                    attempts[index] = attempt

    def live_attempts(self) -> list[Attempt]:
        rows = self.conn.execute(f"{SELECT_ATTEMPT} WHERE status IN ('preparing', 'running')")
        return [attempt_from_row(row) for row in rows]

    def resources_exist(self, resources_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM resources WHERE resources_id = ?", (resources_id,)).fetchone() is not None
        )

    def latest_resources_id(self) -> str | None:
        if self._latest_resources is not None:
            return self._latest_resources[0]
        row = self.conn.execute("SELECT resources_id FROM resources ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else str(row[0])
