"""Algorithm metrics in PostgreSQL: the ``metrics`` table (schema version 4) and the store's three metrics operations.

:class:`PostgresMetricsStore` is a base of :class:`~agentlightning.store.postgres.PostgresLightningStore`, kept apart
so that module stays small; it runs its statements through the store's ``_run`` (pooled connection, migrated
schema, connection errors turned into StoreError). A batch is one ``INSERT … SELECT FROM unnest(…) ON CONFLICT DO
UPDATE``: one statement, atomic without a transaction. ``run_id`` is collated "C" (byte order), so runs sort as in
the other backends whatever the database's locale.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, LiteralString, TypeVar

from psycopg import AsyncConnection

from agentlightning.store._metrics import checked_query, checked_records, record_from_row, run_from_row
from agentlightning.store.base import LightningStore
from agentlightning.types import MetricsRecord, MetricsRun

__all__ = ["PostgresMetricsStore"]

T = TypeVar("T")

_UPSERT: Final = (
    "INSERT INTO metrics (run_id, step, time, data) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bytea[]) "
    "ON CONFLICT (run_id, step) DO UPDATE SET time = EXCLUDED.time, data = EXCLUDED.data"
)
_RUNS: Final = (
    "SELECT run_id, COUNT(*), MIN(step), MAX(step), MAX(time) FROM metrics GROUP BY run_id "
    "ORDER BY MAX(time) DESC, run_id"
)


class PostgresMetricsStore(LightningStore):
    """The metrics operations on PostgreSQL, for a store that provides ``_run``."""

    @abstractmethod
    async def _run(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``work`` on a pooled connection of the migrated database (the store's own plumbing)."""

    async def add_metrics(self, records: Sequence[MetricsRecord]) -> None:
        """Store per-step metrics in one statement, replacing records of the same ``(run_id, step)``."""
        rows = checked_records(records)
        if not rows:
            return
        columns = [list(column) for column in zip(*rows, strict=True)]

        async def write(conn: AsyncConnection[Any]) -> None:
            await conn.execute(_UPSERT, columns)

        await self._run(write)

    async def query_metrics(
        self, run_id: str | None = None, *, after_step: int | None = None, limit: int | None = None
    ) -> list[MetricsRecord]:
        """Metrics records in ``(run_id, step)`` order, after ``after_step``, at most ``limit``."""
        checked_query(run_id, after_step, limit)
        where: list[LiteralString] = []
        params: list[Any] = []
        if run_id is not None:
            where.append("run_id = %s")
            params.append(run_id)
        if after_step is not None:
            where.append("step > %s")
            params.append(after_step)
        sql: LiteralString = "SELECT run_id, step, time, data FROM metrics"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY run_id, step LIMIT %s"
        params.append(limit)  # LIMIT NULL: no limit

        async def read(conn: AsyncConnection[Any]) -> list[MetricsRecord]:
            cursor = await conn.execute(sql, params, binary=True)
            return [record_from_row(row) for row in await cursor.fetchall()]

        return await self._run(read)

    async def list_metric_runs(self) -> list[MetricsRun]:
        """Every run with metrics, the most recently written first."""

        async def read(conn: AsyncConnection[Any]) -> list[MetricsRun]:
            cursor = await conn.execute(_RUNS)
            return [run_from_row(row) for row in await cursor.fetchall()]

        return await self._run(read)
