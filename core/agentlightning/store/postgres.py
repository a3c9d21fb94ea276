"""PostgresLightningStore: the multi-node backend — any number of store servers (and processes) on one database.

Install with ``pip install "agentlightning-core[postgres]"`` (psycopg 3 and psycopg_pool). Claims take the oldest
claimable rollout with ``SELECT … FOR UPDATE SKIP LOCKED`` in a transaction, so concurrent claimers on any number of
servers never block on each other or share a rollout. Every change of one rollout (start, finish, heartbeat,
cancel, metadata) reads the rollout and its attempts in one statement, runs the shared state machine
(:mod:`agentlightning.store._statemachine`) on them, so all backends change states the same way, and writes the
result back in one statement only if the rollout's ``version`` is still the one read (compare-and-set; a lost race
reads again, and a few lost races in a row lock the row instead). No BEGIN, row lock or COMMIT: on the store
server those statements cost more CPU than the change itself. Span batches of one attempt go in the same way,
gated on the attempt's span count; batches of several attempts lock them (in id order, so concurrent batches cannot
deadlock). Spans go in with one multi-row ``INSERT … SELECT FROM unnest(…)``. An acknowledged write is committed
(durable as the server's settings make it).

Times come from this process's ``clock`` (nanoseconds), as in every backend: keep the clocks of several store
servers in sync (NTP) when heartbeat timeouts are short. Waiting claims and waits are woken at once by changes made
through the same store object and see other processes' changes within :data:`POLL_S`.

Schema: versioned in code (:data:`MIGRATIONS`, applied in order under an advisory lock, recorded in ``schema_version``).
Tables live in the first schema of the connection's ``search_path``, so several stores can share a database:
``postgresql://host/db?options=-csearch_path%3Dteam_a``."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, LiteralString, TypeVar, cast

try:
    import psycopg
    from psycopg import AsyncConnection
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import PoolTimeout
except ImportError as exc:  # the extra is missing: say which one
    raise ImportError(
        f'the PostgreSQL store needs psycopg 3 and psycopg_pool ({exc}); pip install "agentlightning-core[postgres]"'
    ) from exc

from agentlightning.store._keys import PRUNE_EVERY_NS
from agentlightning.store._pg_metrics import PostgresMetricsStore
from agentlightning.store._pg_pools import LoopPools
from agentlightning.store._pg_schema import CLAIM_SQL, MIGRATIONS, SELECT_ROLLOUT, TERMINAL_SQL, PrefetchedTxn
from agentlightning.store._pg_spans import decode_stored_spans, store_spans
from agentlightning.store._pg_txn import AnsweredBefore, Key, answer, key_of, locked, prune, recorded, take
from agentlightning.store._sqlite_schema import rollout_from_row
from agentlightning.store._statemachine import (
    ChangeNotifier,
    attempt_not_found,
    new_id,
    op_cancel,
    op_check_timeouts,
    op_claim,
    op_enqueue,
    op_finish,
    op_heartbeat,
    op_start,
    op_update_metadata,
    rollout_not_found,
    span_attempt_keys,
    span_attempt_not_found,
)
from agentlightning.store.base import NotFoundError, SortOrder, StoreError, StoreStatistics
from agentlightning.types import (
    ROLLOUT_TERMINAL,
    Attempt,
    AttemptStatus,
    ClaimedRollout,
    Resource,
    ResourcesSnapshot,
    Rollout,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
    Span,
)

__all__ = ["MIGRATIONS", "POLL_S", "PostgresLightningStore"]

T = TypeVar("T")
POLL_S: Final = 0.05
# Advisory lock keys (any constants unique to us): schema migrations, resource versions.
_MIGRATION_LOCK: Final = 0x61676C_01
_RESOURCES_LOCK: Final = 0x61676C_02
_OPTIMISTIC_TRIES: Final = 3  # compare-and-set attempts of a one-rollout change before it takes the row lock


class PostgresLightningStore(PostgresMetricsStore):
    """A LightningStore in PostgreSQL: claims with SKIP LOCKED, shared by any number of processes and machines."""

    def __init__(
        self,
        dsn: str,
        *,
        clock: Callable[[], int] | None = None,
        min_connections: int = 1,
        max_connections: int = 16,
        connect_timeout_s: float = 30.0,
    ) -> None:
        """Connect lazily to ``dsn`` (``postgresql://user:password@host:5432/db``); tables are created on first use.

        ``clock`` returns nanoseconds since the epoch (tests pass a fake one). ``max_connections`` bounds this
        process's pool; ``connect_timeout_s`` is how long an operation waits for a connection before failing.
        """
        if not dsn:
            raise ValueError(
                f"PostgresLightningStore needs a DSN such as 'postgresql://user@127.0.0.1:5432/agentlightning'; "
                f"got {dsn!r}"
            )
        if min_connections < 0 or max_connections < max(1, min_connections):
            raise ValueError(
                f"need 0 <= min_connections <= max_connections and max_connections >= 1; "
                f"got {min_connections} and {max_connections}"
            )
        self.dsn = dsn
        self._clock: Callable[[], int] = clock or time.time_ns
        self._pools = LoopPools(
            dsn,
            min_size=min_connections,
            max_size=max_connections,
            connect_timeout_s=connect_timeout_s,
            name=_redacted(dsn),
        )
        self._notifier = ChangeNotifier()
        self._migrated = False
        self._pruned_at = 0  # when idempotency keys were last pruned (clock ns)

    # --- plumbing ------------------------------------------------------------------------------------------------
    async def _run(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``work`` on a pooled connection, migrating the schema first (once per store)."""
        try:
            if not self._migrated:
                await self._pools.run(self._migrate)
            return await self._pools.run(work)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreError(
                f"PostgreSQL at {_redacted(self.dsn)} is unreachable or dropped the connection ({exc}); "
                "check that the server is up and the DSN is right — the operation may be retried"
            ) from exc

    async def _migrate(self, conn: AsyncConnection[Any]) -> None:
        if self._migrated:
            return
        async with conn.transaction():
            # Many servers may start at once on an empty database: one migrates, the others wait, then see it done.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version "
                "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_time BIGINT NOT NULL)"
            )
            row = await (await conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")).fetchone()
            current = int(row[0]) if row else 0
            latest = MIGRATIONS[-1][0]
            if current > latest:
                raise StoreError(
                    f"database {_redacted(self.dsn)} has schema version {current}, newer than this agentlightning "
                    f"knows ({latest}); upgrade agentlightning-core to open it"
                )
            for version, description, statements in MIGRATIONS:
                if version > current:
                    for statement in statements.split(";"):
                        await conn.execute(cast("LiteralString", statement))  # MIGRATIONS: constants in code
                    await conn.execute(
                        "INSERT INTO schema_version (version, description, applied_time) VALUES (%s, %s, %s)",
                        (version, description, time.time_ns()),
                    )
        self._migrated = True

    async def schema_version(self) -> int:
        """The schema version of the database."""

        async def read(conn: AsyncConnection[Any]) -> int:
            row = await (await conn.execute("SELECT MAX(version) FROM schema_version")).fetchone()
            return int(row[0]) if row else 0

        return await self._run(read)

    async def _transact(
        self,
        load: Callable[[AsyncConnection[Any], PrefetchedTxn], Awaitable[None]],
        op: Callable[[PrefetchedTxn], T],
        key: Key | None = None,
    ) -> T:
        """One transaction: ``load`` reads (and locks) rows, ``op`` runs the state machine on them, then flush."""

        async def work(conn: AsyncConnection[Any]) -> T:
            return await self._locked(conn, load, op, key)

        return await self._run(work)

    async def _locked(
        self,
        conn: AsyncConnection[Any],
        load: Callable[[AsyncConnection[Any], PrefetchedTxn], Awaitable[None]],
        op: Callable[[PrefetchedTxn], T],
        key: Key | None,
    ) -> T:
        """:func:`~agentlightning.store._pg_txn.locked` at this store's time; old idempotency keys pruned."""
        now = self._clock()
        result = await locked(conn, load, op, key, now)
        if key is not None and now - self._pruned_at >= PRUNE_EVERY_NS:
            self._pruned_at = now
            await prune(conn, now)
        return result

    async def _change(self, rollout_id: str, op: Callable[[PrefetchedTxn], T], key: Key | None = None) -> T:
        """A change of one rollout: read it, run ``op`` on it, write the change back if nobody changed it meanwhile.

        Two statements and no transaction: BEGIN, a row lock and COMMIT cost the store server more CPU than the
        change itself, and compare-and-set on the rollout's version keeps the change atomic. A lost race reads
        again; after a few lost races in a row the rollout is locked instead, so a change always gets through.
        A keyed change takes the locked path at once: its key must commit with it, in one transaction.
        """

        async def work(conn: AsyncConnection[Any]) -> T:
            if key is not None:
                return await self._locked(conn, self._rows_of(rollout_id), op, key)
            for _ in range(_OPTIMISTIC_TRIES):
                txn = PrefetchedTxn()
                await txn.read_rollout(conn, rollout_id)
                result = op(txn)  # raises on a missing row or an illegal change: nothing is written
                if await txn.flush(conn, compare_and_set=True):
                    return result
            return await self._locked(conn, self._rows_of(rollout_id), op, None)

        return await self._run(work)

    def _rows_of(self, *rollout_ids: str) -> Callable[[AsyncConnection[Any], PrefetchedTxn], Awaitable[None]]:
        async def load(conn: AsyncConnection[Any], txn: PrefetchedTxn) -> None:
            await txn.load_rollouts(conn, rollout_ids, lock=True)

        return load

    async def _wait(self, probe: Callable[[], Awaitable[T]], timeout_s: float | None) -> T:
        """Re-run ``probe`` on every change notification (and every POLL_S) until it is truthy or time is up."""
        deadline = time.monotonic() + (timeout_s or 0.0)
        while True:
            seen = self._notifier.generation  # read first: a change during the probe must not be missed
            outcome = await probe()
            left = deadline - time.monotonic()
            if outcome or left <= 0:
                return outcome
            await self._notifier.wait(seen, min(POLL_S, left))

    # --- rollout queue -------------------------------------------------------------------------------------------
    async def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        """Enqueue rollouts in order, in one transaction; returns them in ``queuing``."""
        key = key_of("enqueue", idempotency_key)
        wanted = list({r.resources_id for r in requests if r.resources_id is not None})

        async def load(conn: AsyncConnection[Any], txn: PrefetchedTxn) -> None:
            if wanted:
                cursor = await conn.execute(
                    "SELECT resources_id FROM resources WHERE resources_id = ANY(%s)", (wanted,)
                )
                txn.known_resources = {row[0] for row in await cursor.fetchall()}

        async def work(conn: AsyncConnection[Any]) -> list[Rollout]:
            if key is not None:
                return await self._locked(conn, load, lambda txn: op_enqueue(txn, requests, self._clock()), key)
            # No transaction: resources are never deleted, so the check stays true, and the rollouts go in with
            # one INSERT (atomic on its own). BEGIN and COMMIT would double the statements, the costly part here.
            txn = PrefetchedTxn()
            await load(conn, txn)
            rollouts = op_enqueue(txn, requests, self._clock())
            await txn.flush(conn)
            return rollouts

        rollouts = await self._run(work)
        self._notifier.notify()
        return rollouts

    async def _claim_now(self, worker_id: str | None, start: bool, key: Key | None) -> ClaimedRollout | None:
        async def load(conn: AsyncConnection[Any], txn: PrefetchedTxn) -> None:
            row = await (await conn.execute(CLAIM_SQL, binary=True)).fetchone()
            if row is not None:
                txn.claimed_row(row)

        return await self._transact(load, lambda txn: op_claim(txn, worker_id, self._clock(), start=start), key)

    async def claim_rollout(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout (SKIP LOCKED), waiting up to ``timeout_s`` for one."""
        key = key_of("claim", idempotency_key)
        return await self._wait(lambda: self._claim_now(worker_id, False, key), timeout_s)

    async def claim_and_start(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout and start its attempt in one transaction (both come back ``running``)."""
        key = key_of("claim", idempotency_key)
        return await self._wait(lambda: self._claim_now(worker_id, True, key), timeout_s)

    async def start_attempt(self, rollout_id: str, attempt_id: str, *, idempotency_key: str | None = None) -> Attempt:
        """Mark a claimed attempt and its rollout ``running``."""
        key = key_of("start", idempotency_key)
        return await self._change(rollout_id, lambda txn: op_start(txn, rollout_id, attempt_id, self._clock()), key)

    async def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Record the attempt's terminal status; the rollout succeeds, is requeued, or fails."""
        key = key_of("finish", idempotency_key)
        attempt = await self._change(
            rollout_id, lambda txn: op_finish(txn, rollout_id, attempt_id, status, error, self._clock()), key
        )
        self._notifier.notify()
        return attempt

    async def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        """Cancel a non-terminal rollout so it is never claimed again."""
        key = key_of("cancel", idempotency_key)
        rollout = await self._change(rollout_id, lambda txn: op_cancel(txn, rollout_id, self._clock()), key)
        self._notifier.notify()
        return rollout

    async def update_rollout_metadata(self, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
        """Merge keys into a rollout's metadata."""
        return await self._change(rollout_id, lambda txn: op_update_metadata(txn, rollout_id, metadata))

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record that a live attempt is alive."""
        return await self._change(rollout_id, lambda txn: op_heartbeat(txn, rollout_id, attempt_id, self._clock()))

    # --- spans ---------------------------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans idempotently with per-attempt sequence ids, all or none."""
        keys = span_attempt_keys(spans)
        if not spans:
            return []

        async def work(conn: AsyncConnection[Any]) -> list[Span]:
            stored: list[Span] | tuple[str, str] | None = None
            for _ in range(_OPTIMISTIC_TRIES):  # without a transaction: see _pg_spans
                stored = await store_spans(conn, spans, keys, self._clock(), lock=False)
                if stored is not None:
                    break
            if stored is None:  # several attempts, or lost races: lock the attempts
                async with conn.transaction():
                    stored = await store_spans(conn, spans, keys, self._clock(), lock=True)
            if isinstance(stored, tuple):  # (rollout_id, attempt_id) that does not exist
                txn = PrefetchedTxn()
                await txn.load_rollouts(conn, [stored[0]], lock=False)
                raise span_attempt_not_found(txn, *stored)
            assert stored is not None  # the locked path always stores
            return stored

        return await self._run(work)

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Spans of a rollout in (attempt, sequence_id) order, filtered and paged.

        A stored row that does not validate is left out with a warning; limit and offset count rows, so its page
        holds one span fewer.
        """

        async def read(conn: AsyncConnection[Any]) -> list[Span]:
            txn = PrefetchedTxn()
            await txn.load_rollouts(conn, [rollout_id], lock=False)
            rollout = txn.get_rollout(rollout_id)
            if rollout is None:
                raise rollout_not_found(rollout_id)
            sql = "SELECT data FROM spans WHERE rollout_id = %s AND sequence_id > %s"
            params: list[Any] = [rollout_id, after_sequence_id]
            if attempt_id == "latest":
                sql += " AND attempt_seq = %s"
                params.append(rollout.num_attempts)
            elif attempt_id is not None:
                attempt = txn.get_attempt(rollout_id, attempt_id)
                if attempt is None:
                    raise attempt_not_found(
                        rollout_id, attempt_id, (a.attempt_id for a in txn.list_attempts(rollout_id))
                    )
                sql += " AND attempt_seq = %s"
                params.append(attempt.sequence_id)
            if name is not None:
                sql += " AND name = %s"
                params.append(name)
            sql += " ORDER BY attempt_seq, sequence_id LIMIT %s OFFSET %s"
            params += [limit, offset]  # LIMIT NULL = no limit
            cursor = await conn.execute(sql, params, binary=True)
            # A row that does not validate is left out (with a warning) rather than failing the whole query.
            return decode_stored_spans(rollout_id, await cursor.fetchall())

        return await self._run(read)

    # --- queries -------------------------------------------------------------------------------------------------
    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; NotFoundError if unknown."""

        async def read(conn: AsyncConnection[Any]) -> Rollout:
            cursor = await conn.execute(f"{SELECT_ROLLOUT} WHERE rollout_id = %s", (rollout_id,), binary=True)
            row = await cursor.fetchone()
            if row is None:
                raise rollout_not_found(rollout_id)
            return rollout_from_row(row)

        return await self._run(read)

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        mode: RolloutMode | None = None,
        rollout_ids: Sequence[str] | None = None,
        group_id: str | None = None,
        sort: SortOrder = "asc",
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts matching every given filter, in enqueue order (or reversed)."""
        where: list[LiteralString] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = ANY(%s)")
            params.append(list(status))
        if rollout_ids is not None:
            where.append("rollout_id = ANY(%s)")
            params.append(list(rollout_ids))
        if mode is not None:
            where.append("mode = %s")
            params.append(mode)
        if group_id is not None:
            where.append("group_id = %s")
            params.append(group_id)
        sql = SELECT_ROLLOUT + (" WHERE " + " AND ".join(where) if where else "")
        sql += f" ORDER BY seq {'DESC' if sort == 'desc' else 'ASC'} LIMIT %s OFFSET %s"
        params += [limit, offset]

        async def read(conn: AsyncConnection[Any]) -> list[Rollout]:
            cursor = await conn.execute(sql, params, binary=True)
            return [rollout_from_row(row) for row in await cursor.fetchall()]

        return await self._run(read)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, oldest first."""

        async def read(conn: AsyncConnection[Any]) -> list[Attempt]:
            txn = PrefetchedTxn()
            await txn.load_rollouts(conn, [rollout_id], lock=False)
            if txn.get_rollout(rollout_id) is None:
                raise rollout_not_found(rollout_id)
            return txn.list_attempts(rollout_id)

        return await self._run(read)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Wait until every rollout is terminal or the timeout passes; returns the terminal ones."""
        unique = list(dict.fromkeys(rollout_ids))

        async def terminal(conn: AsyncConnection[Any]) -> list[Rollout]:
            cursor = await conn.execute(f"{SELECT_ROLLOUT} WHERE rollout_id = ANY(%s)", (unique,), binary=True)
            by_id = {row[0]: row for row in await cursor.fetchall()}
            missing = [rid for rid in unique if rid not in by_id]
            if missing:
                raise rollout_not_found(missing[0])
            return [rollout_from_row(by_id[rid]) for rid in rollout_ids if by_id[rid][1] in ROLLOUT_TERMINAL]

        async def count(conn: AsyncConnection[Any]) -> bool:
            # Counted in SQL, so polling parses no rows.
            cursor = await conn.execute(
                f"SELECT COUNT(*) FROM rollouts WHERE rollout_id = ANY(%s) AND status IN {TERMINAL_SQL}", (unique,)
            )
            row = await cursor.fetchone()
            return row is not None and row[0] == len(unique)

        await self._run(terminal)  # NotFoundError for unknown ids before any waiting
        await self._wait(lambda: self._run(count), math.inf if timeout_s is None else timeout_s)
        return await self._run(terminal)

    # --- resources -----------------------------------------------------------------------------------------------
    async def add_resources(
        self, resources: Mapping[str, Resource], *, idempotency_key: str | None = None
    ) -> ResourcesSnapshot:
        """Store a new immutable snapshot; it becomes the latest (versions 1, 2, 3, ...)."""
        key = key_of("resources", idempotency_key)

        async def write(conn: AsyncConnection[Any]) -> ResourcesSnapshot:
            try:
                return await versioned(conn)
            except AnsweredBefore:
                assert key is not None
                snapshot: ResourcesSnapshot = await recorded(conn, key)
                return snapshot

        async def versioned(conn: AsyncConnection[Any]) -> ResourcesSnapshot:
            async with conn.transaction():
                if key is not None and not await take(conn, key, self._clock()):
                    raise AnsweredBefore
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_RESOURCES_LOCK,))  # one version at a time
                row = await (await conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources")).fetchone()
                snapshot = ResourcesSnapshot(
                    resources_id=new_id("rs"),
                    version=int(row[0]) if row else 1,
                    create_time=self._clock(),
                    resources=dict(resources),
                )
                await conn.execute(
                    "INSERT INTO resources (version, resources_id, data) VALUES (%s, %s, %s)",
                    (snapshot.version, snapshot.resources_id, snapshot.model_dump_json().encode()),
                )
                if key is not None:
                    await answer(conn, key, snapshot)
            return snapshot

        return await self._run(write)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesSnapshot | None:
        """A snapshot by id, or the latest when id is None."""

        async def read(conn: AsyncConnection[Any]) -> ResourcesSnapshot | None:
            if resources_id is None:
                cursor = await conn.execute("SELECT data FROM resources ORDER BY version DESC LIMIT 1", binary=True)
                row = await cursor.fetchone()
                return None if row is None else ResourcesSnapshot.model_validate_json(row[0])
            cursor = await conn.execute(
                "SELECT data FROM resources WHERE resources_id = %s", (resources_id,), binary=True
            )
            row = await cursor.fetchone()
            if row is None:
                known = [
                    r[0]
                    for r in await (
                        await conn.execute("SELECT resources_id FROM resources ORDER BY version")
                    ).fetchall()
                ]
                has = ", ".join(known) or "none yet (add_resources() creates one)"
                raise NotFoundError(f"resources {resources_id!r} not found; known snapshots: {has}")
            return ResourcesSnapshot.model_validate_json(row[0])

        return await self._run(read)

    async def list_resources(self) -> list[ResourcesSnapshot]:
        """All snapshots, oldest first."""

        async def read(conn: AsyncConnection[Any]) -> list[ResourcesSnapshot]:
            cursor = await conn.execute("SELECT data FROM resources ORDER BY version", binary=True)
            return [ResourcesSnapshot.model_validate_json(row[0]) for row in await cursor.fetchall()]

        return await self._run(read)

    # --- operations ----------------------------------------------------------------------------------------------
    async def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        """Watchdog tick: end attempts past their timeout or heartbeat timeout.

        Rollouts another transaction holds right now are skipped (SKIP LOCKED): they are being changed, and the
        next tick sees them, so watchdogs on several servers never wait on each other.
        """

        async def load(conn: AsyncConnection[Any], txn: PrefetchedTxn) -> None:
            cursor = await conn.execute(
                "SELECT rollout_id FROM rollouts WHERE rollout_id IN "
                "(SELECT rollout_id FROM attempts WHERE status IN ('preparing', 'running')) "
                "ORDER BY seq FOR UPDATE SKIP LOCKED"
            )
            ids = [row[0] for row in await cursor.fetchall()]
            await txn.load_rollouts(conn, ids, lock=False)  # already locked above
            txn.live = [a for rid in ids for a in txn.attempts[rid] if a.status in ("preparing", "running")]

        changed = await self._transact(load, lambda txn: op_check_timeouts(txn, self._clock() if now is None else now))
        if changed:
            self._notifier.notify()
        return changed

    async def statistics(self) -> StoreStatistics:
        """Counts per status, spans and stored span bytes."""

        async def read(conn: AsyncConnection[Any]) -> StoreStatistics:
            rollouts = await (await conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status")).fetchall()
            attempts = await (await conn.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status")).fetchall()
            spans = await (
                await conn.execute("SELECT COUNT(*), COALESCE(SUM(octet_length(data)), 0) FROM spans")
            ).fetchone()
            resources = await (await conn.execute("SELECT COUNT(*) FROM resources")).fetchone()
            by_rollout = {str(s): int(n) for s, n in rollouts}
            by_attempt = {str(s): int(n) for s, n in attempts}
            return StoreStatistics(
                rollouts_by_status=by_rollout,
                attempts_by_status=by_attempt,
                total_rollouts=sum(by_rollout.values()),
                total_attempts=sum(by_attempt.values()),
                total_spans=int(spans[0]) if spans else 0,
                span_bytes=int(spans[1]) if spans else 0,
                total_resources=int(resources[0]) if resources else 0,
            )

        return await self._run(read)

    async def close(self) -> None:
        """Close the connection pools; closing twice is a no-op."""
        await self._pools.close()


def _redacted(dsn: str) -> str:
    """The DSN without its password, for messages and pool names."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    host, port, db = info.get("host", "localhost"), info.get("port", "5432"), info.get("dbname", "")
    return f"postgresql://{info.get('user', '')}@{host}:{port}/{db}"
