"""SQLite schema (versioned migrations) and row access for :mod:`agentlightning.store.sqlite`."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

import orjson

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
CHUNK: Final = 500  # bound parameters per IN (...) query, well under SQLite's limit


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


def rollout_from_row(row: tuple[Any, ...]) -> Rollout:
    """A Rollout from a ``SELECT ROLLOUT_COLUMNS`` row."""
    # model_construct: every row was validated on its way in.
    fields = dict(zip(ROLLOUT_FIELDS, row, strict=True))
    fields["input"] = orjson.loads(row[5])
    fields["config"] = config_from_json(row[6])
    fields["metadata"] = orjson.loads(row[7])
    return Rollout.model_construct(**fields)


def attempt_from_row(row: tuple[Any, ...]) -> Attempt:
    """An Attempt from a ``SELECT ATTEMPT_COLUMNS`` row (validated on its way in)."""
    return Attempt.model_construct(**dict(zip(ATTEMPT_FIELDS, row, strict=True)))


class SqliteTxn:
    """SQL row access for the shared state machine, inside a ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        row = self.conn.execute(f"{SELECT_ROLLOUT} WHERE rollout_id = ?", (rollout_id,)).fetchone()
        return None if row is None else rollout_from_row(row)

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        rows = [
            (
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
            for r in rollouts
        ]
        self.conn.executemany(f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)

    def update_rollout(self, rollout: Rollout) -> None:
        self.conn.execute(
            "UPDATE rollouts SET status = ?, metadata = ?, start_time = ?, end_time = ?, num_attempts = ? "
            "WHERE rollout_id = ?",
            (
                rollout.status,
                dumps_json(rollout.metadata, f"metadata of rollout {rollout.rollout_id}"),
                rollout.start_time,
                rollout.end_time,
                rollout.num_attempts,
                rollout.rollout_id,
            ),
        )

    def first_claimable(self) -> Rollout | None:
        row = self.conn.execute(
            f"{SELECT_ROLLOUT} WHERE status IN ('queuing', 'requeuing') ORDER BY seq LIMIT 1"
        ).fetchone()
        return None if row is None else rollout_from_row(row)

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        row = self.conn.execute(
            f"{SELECT_ATTEMPT} WHERE attempt_id = ? AND rollout_id = ?", (attempt_id, rollout_id)
        ).fetchone()
        return None if row is None else attempt_from_row(row)

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        rows = self.conn.execute(f"{SELECT_ATTEMPT} WHERE rollout_id = ? ORDER BY sequence_id", (rollout_id,))
        return [attempt_from_row(row) for row in rows]

    def insert_attempt(self, attempt: Attempt) -> None:
        self.conn.execute(
            f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
            tuple(getattr(attempt, field) for field in ATTEMPT_FIELDS),
        )

    def update_attempt(self, attempt: Attempt) -> None:
        self.conn.execute(
            "UPDATE attempts SET status = ?, end_time = ?, last_heartbeat_time = ?, error = ? WHERE attempt_id = ?",
            (attempt.status, attempt.end_time, attempt.last_heartbeat_time, attempt.error, attempt.attempt_id),
        )

    def live_attempts(self) -> list[Attempt]:
        rows = self.conn.execute(f"{SELECT_ATTEMPT} WHERE status IN ('preparing', 'running')")
        return [attempt_from_row(row) for row in rows]

    def resources_exist(self, resources_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM resources WHERE resources_id = ?", (resources_id,)).fetchone() is not None
        )

    def latest_resources_id(self) -> str | None:
        row = self.conn.execute("SELECT resources_id FROM resources ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else str(row[0])
