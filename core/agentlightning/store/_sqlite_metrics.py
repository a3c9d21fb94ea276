"""Algorithm metrics in SQLite: one row per ``(run_id, step)`` in the ``metrics`` table (schema version 4).

The table is ``WITHOUT ROWID`` with ``(run_id, step)`` as its key, so a run's records are stored in step order and
a query of one run, or a page of it after a step, reads one contiguous range of the key. A rewrite of a step is an
upsert (``ON CONFLICT DO UPDATE``): one statement, whatever was stored before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from agentlightning.store._metrics import MetricsRow, record_from_row, run_from_row
from agentlightning.types import MetricsRecord, MetricsRun

__all__ = ["list_metric_runs", "query_metrics", "upsert_metrics"]

_UPSERT: Final = (
    "INSERT INTO metrics (run_id, step, time, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (run_id, step) DO UPDATE SET time = excluded.time, data = excluded.data"
)
_RUNS: Final = (
    "SELECT run_id, COUNT(*), MIN(step), MAX(step), MAX(time) FROM metrics GROUP BY run_id "
    "ORDER BY MAX(time) DESC, run_id"
)


def upsert_metrics(conn: sqlite3.Connection, rows: Sequence[MetricsRow]) -> None:
    """Write checked rows inside the caller's transaction; a stored ``(run_id, step)`` is replaced."""
    conn.executemany(_UPSERT, rows)


def query_metrics(
    conn: sqlite3.Connection, run_id: str | None, after_step: int | None, limit: int | None
) -> list[MetricsRecord]:
    """Records in ``(run_id, step)`` order (SQLite compares TEXT bytewise: code point order, as Python does)."""
    where: list[str] = []
    params: list[Any] = []
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if after_step is not None:
        where.append("step > ?")
        params.append(after_step)
    sql = "SELECT run_id, step, time, data FROM metrics"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY run_id, step LIMIT ?"
    params.append(-1 if limit is None else limit)
    return [record_from_row(row) for row in conn.execute(sql, params).fetchall()]


def list_metric_runs(conn: sqlite3.Connection) -> list[MetricsRun]:
    """Every run with metrics, the most recently written first."""
    return [run_from_row(row) for row in conn.execute(_RUNS).fetchall()]
