"""SqliteLightningStore: the embedded default backend — one WAL file, durable, shared by processes on one machine.

Durability: every write is one transaction committed before the method returns. In WAL mode a commit appends the
transaction's frames to the ``-wal`` file with ``write()`` before ``sqlite3_step(COMMIT)`` returns (SQLite keeps no
user-space write buffer), so once a method has returned its data is in the kernel's page cache, which outlives the
process: an acknowledged write survives ``kill -9`` with ``synchronous="NORMAL"`` (the default; SQLite documents
WAL+NORMAL as durable except across power loss or an OS crash, where it may drop the last commits but never corrupts
the file). ``synchronous="FULL"`` also fsyncs the WAL on every commit, so an acknowledged write survives power loss
too, at the price of one fsync per call (about 3x fewer rollout cycles per second here).
``tests/core/store/test_sqlite.py`` kills a writer with SIGKILL after acknowledgements to check both settings.

Processes: every write transaction starts with ``BEGIN IMMEDIATE``, which takes the database's single write lock
before reading, so a claim's "find the oldest claimable rollout, then mark it preparing" is atomic across threads
and processes. Readers never block writers (WAL). Within a process one connection, guarded by a lock, serves all
threads and event loops.

Schema: versioned in code (:data:`MIGRATIONS`, applied in order, recorded in ``schema_version``).

Speed: the cost of a call is mostly SQLite's (statements, and the WAL frames a commit writes: one 4 KiB page per
table or index page changed), so each op uses few statements: a rollout is read with its attempts in one query
(:class:`~agentlightning.store._sqlite_schema.SqliteTxn`), new spans go in with one reservation per attempt and one
insert (duplicates are caught by the unique index, not looked up first), and rows written by the store are read
back into models without validating them again.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Literal

import orjson

from agentlightning.store._sqlite_schema import (
    CHUNK,
    MIGRATIONS,
    SELECT_ROLLOUT,
    SqliteTxn,
    rollout_from_row,
    span_from_json,
    span_to_json,
)
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
    span_with_sequence_id,
    wait_until,
)
from agentlightning.store.base import LightningStore, NotFoundError, SortOrder, StoreError, StoreStatistics
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

__all__ = ["MIGRATIONS", "SqliteLightningStore"]

# Stores on the same file in one process share a notifier, so a waiting claim wakes at once; other processes'
# changes are seen by polling every POLL_S.
_NOTIFIERS: dict[str, ChangeNotifier] = {}
_NOTIFIERS_LOCK = threading.Lock()
POLL_S: Final = 0.02
WAL_CHECKPOINT_PAGES: Final = 4000  # 16 MB of WAL with 4 KiB pages; durability does not depend on it
_ANY_CLAIMABLE: Final = "SELECT 1 FROM rollouts WHERE status IN ('queuing', 'requeuing') LIMIT 1"
_INSERT_SPAN: Final = (
    "INSERT INTO spans (rollout_id, attempt_seq, sequence_id, attempt_id, span_id, name, data) VALUES (?,?,?,?,?,?,?)"
)
# Reserves sequence ids for a batch of new spans of one attempt and counts the batch as a heartbeat when the attempt
# is live (a superseded, terminal one keeps its state); returns the attempt's sequence and its new span count.
_RESERVE_SPANS: Final = (
    "UPDATE attempts SET span_count = span_count + ?, last_heartbeat_time = CASE WHEN status IN "
    "('preparing', 'running') THEN ? ELSE last_heartbeat_time END WHERE attempt_id = ? AND rollout_id = ? "
    "RETURNING sequence_id, span_count"
)


class SqliteLightningStore(LightningStore):
    """A LightningStore in one SQLite file (WAL): durable on return, safe for threads, loops and processes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], int] | None = None,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_s: float = 30.0,
    ) -> None:
        """Open (creating and migrating if needed) the database at ``path``.

        ``clock`` returns nanoseconds since the epoch (tests pass a fake one). ``synchronous``: NORMAL survives a
        killed process, FULL also power loss (see the module docstring).
        ``busy_timeout_s`` is how long a write waits for another process's transaction.
        """
        self.path = os.fspath(path)
        if self.path == ":memory:" or self.path.startswith("file:"):
            raise ValueError(
                f"SqliteLightningStore needs a file path, got {self.path!r}; use InMemoryLightningStore for a "
                "throwaway store"
            )
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(
                f"synchronous must be 'NORMAL' (survives kill -9) or 'FULL' (also power loss); got {synchronous!r}"
            )
        self._clock: Callable[[], int] = clock or time.time_ns
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._txn = SqliteTxn(self._conn)
        self._queue_looked_empty = True  # see _claim_now
        self._writing = _WriteTransaction(self._lock, self._txn, self._connection)
        self._reading = _Reading(self._lock, self._txn, self._connection)
        with _NOTIFIERS_LOCK:
            self._notifier = _NOTIFIERS.setdefault(os.path.realpath(self.path), ChangeNotifier())
        try:
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(f"PRAGMA synchronous = {synchronous}")
            # Checkpoint (copy the WAL into the database file, with two fsyncs) every WAL_CHECKPOINT_PAGES instead
            # of SQLite's 1000: state transitions rewrite the same few pages, which a checkpoint then copies once.
            self._conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    # --- plumbing ------------------------------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._write() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version "
                "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_time INTEGER NOT NULL)"
            )
            current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
            latest = MIGRATIONS[-1][0]
            if current > latest:
                raise StoreError(
                    f"{self.path} has schema version {current}, newer than this agentlightning knows ({latest}); "
                    "upgrade agentlightning-core to open it"
                )
            for version, description, statements in MIGRATIONS:
                if version <= current:
                    continue
                for statement in statements.split(";"):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, description, applied_time) VALUES (?, ?, ?)",
                    (version, description, time.time_ns()),
                )

    @property
    def schema_version(self) -> int:
        """The schema version of the open database."""
        with self._read() as conn:
            return int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"SqliteLightningStore({self.path!r}) is closed; open a new one")
        return self._conn

    def _write(self) -> _WriteTransaction:
        """One write transaction (``with``), committed (durably) on exit or rolled back entirely on error."""
        return self._writing

    def _read(self) -> _Reading:
        """Reads under the store lock (``with``); each statement sees one committed snapshot."""
        return self._reading

    # --- rollout queue -------------------------------------------------------------------------------------------
    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Enqueue rollouts in order, in one transaction; returns them in ``queuing``."""
        with self._write():
            rollouts = op_enqueue(self._txn, requests, self._clock())
        self._notifier.notify()
        return rollouts

    def _claim_now(self, worker_id: str | None) -> ClaimedRollout | None:
        if self._queue_looked_empty:
            # A read first: idle runners polling an empty queue must not queue up for the write lock. Skipped while
            # claims succeed (the read would cost a busy queue a statement per claim and find a rollout anyway).
            with self._read() as conn:
                if conn.execute(_ANY_CLAIMABLE).fetchone() is None:
                    return None
        with self._write():
            claimed = op_claim(self._txn, worker_id, self._clock())
        self._queue_looked_empty = claimed is None
        return claimed

    async def claim_rollout(
        self, worker_id: str | None = None, *, timeout_s: float | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout, waiting up to ``timeout_s`` for one."""
        if timeout_s is None:
            return self._claim_now(worker_id)
        result: ClaimedRollout | None = await wait_until(
            self._notifier, lambda: self._claim_now(worker_id), timeout_s, time.monotonic, POLL_S
        )
        return result

    async def start_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Mark a claimed attempt and its rollout ``running``."""
        with self._write():
            return op_start(self._txn, rollout_id, attempt_id, self._clock())

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, *, error: str | None = None
    ) -> Attempt:
        """Record the attempt's terminal status; the rollout succeeds, is requeued, or fails."""
        with self._write():
            attempt = op_finish(self._txn, rollout_id, attempt_id, status, error, self._clock())
        self._notifier.notify()
        return attempt

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a non-terminal rollout so it is never claimed again."""
        with self._write():
            rollout = op_cancel(self._txn, rollout_id, self._clock())
        self._notifier.notify()
        return rollout

    async def update_rollout_metadata(self, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
        """Merge keys into a rollout's metadata."""
        with self._write():
            return op_update_metadata(self._txn, rollout_id, metadata)

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record that a live attempt is alive."""
        with self._write():
            return op_heartbeat(self._txn, rollout_id, attempt_id, self._clock())

    # --- spans ---------------------------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans idempotently with per-attempt sequence ids, in one transaction."""
        keys = span_attempt_keys(spans)
        if not spans:
            return []
        with self._write() as conn:
            now = self._clock()
            try:
                return self._add_new_spans(conn, spans, keys, now)
            except sqlite3.IntegrityError:
                # The unique (attempt_id, span_id) index caught a span stored before (a retried batch) or repeated
                # in the batch: start over and look the stored ones up. Looking first would cost every batch.
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                self._txn.reset()
            return self._add_spans_looked_up(conn, spans, keys, now)

    def _add_new_spans(
        self, conn: sqlite3.Connection, spans: Sequence[Span], keys: list[tuple[str, str]], now: int
    ) -> list[Span]:
        """Insert the batch assuming every span is new: one statement per attempt plus the insert."""
        counts: dict[tuple[str, str], int]
        if len(keys) == 1:
            counts = {keys[0]: len(spans)}
        else:
            counts = dict.fromkeys(keys, 0)
            for span in spans:
                counts[(span.rollout_id, span.attempt_id)] += 1
        # (rollout_id, attempt_id) -> [attempt sequence, last span sequence id given out]
        state: dict[tuple[str, str], list[int]] = {}
        for key, count in counts.items():
            reserved = conn.execute(_RESERVE_SPANS, (count, now, key[1], key[0])).fetchall()
            if not reserved:
                raise span_attempt_not_found(self._txn, *key)
            attempt_seq, span_count = reserved[0]
            state[key] = [attempt_seq, span_count - count]
        stored: list[Span] = []
        rows: list[tuple[Any, ...]] = []
        for span in spans:
            entry = state[(span.rollout_id, span.attempt_id)]
            entry[1] = sequence_id = entry[1] + 1
            copy = span_with_sequence_id(span, sequence_id)
            stored.append(copy)
            rows.append(
                (span.rollout_id, entry[0], sequence_id, span.attempt_id, span.span_id, span.name, span_to_json(copy))
            )
        conn.executemany(_INSERT_SPAN, rows)
        return stored

    def _add_spans_looked_up(
        self, conn: sqlite3.Connection, spans: Sequence[Span], keys: list[tuple[str, str]], now: int
    ) -> list[Span]:
        """Insert the spans not stored yet; the stored ones are returned as stored."""
        # attempt_id -> [attempt sequence, spans stored so far, live?]
        state: dict[str, list[Any]] = {}
        for rollout_id, attempt_id in keys:
            row = conn.execute(
                "SELECT sequence_id, span_count, status IN ('preparing', 'running') FROM attempts "
                "WHERE attempt_id = ? AND rollout_id = ?",
                (attempt_id, rollout_id),
            ).fetchone()
            if row is None:
                raise span_attempt_not_found(self._txn, rollout_id, attempt_id)
            state[attempt_id] = list(row)
        existing = self._existing_spans(conn, spans)
        stored: list[Span] = []
        rows: list[tuple[Any, ...]] = []
        for span in spans:
            key = (span.attempt_id, span.span_id)
            found = existing.get(key)
            if found is None:
                entry = state[span.attempt_id]
                entry[1] += 1
                found = span_with_sequence_id(span, entry[1])
                existing[key] = found
                rows.append(
                    (span.rollout_id, entry[0], entry[1], span.attempt_id, span.span_id, span.name, span_to_json(found))
                )
            stored.append(found)
        conn.executemany(_INSERT_SPAN, rows)
        # A span proves life only for its own attempt; a superseded (terminal) one keeps its state.
        conn.executemany(
            "UPDATE attempts SET span_count = ?, "
            "last_heartbeat_time = CASE WHEN ? THEN ? ELSE last_heartbeat_time END WHERE attempt_id = ?",
            [(entry[1], entry[2], now, attempt_id) for attempt_id, entry in state.items()],
        )
        return stored

    @staticmethod
    def _existing_spans(conn: sqlite3.Connection, spans: Sequence[Span]) -> dict[tuple[str, str], Span]:
        by_attempt: dict[str, list[str]] = {}
        for span in spans:
            by_attempt.setdefault(span.attempt_id, []).append(span.span_id)
        found: dict[tuple[str, str], Span] = {}
        for attempt_id, span_ids in by_attempt.items():
            for i in range(0, len(span_ids), CHUNK):
                chunk = span_ids[i : i + CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT span_id, data FROM spans WHERE attempt_id = ? AND span_id IN ({marks})",
                    (attempt_id, *chunk),
                )
                for span_id, data in rows:
                    found[(attempt_id, span_id)] = span_from_json(data)
        return found

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
        """Spans of a rollout in (attempt, sequence_id) order, filtered and paged."""
        sql = "SELECT data FROM spans WHERE rollout_id = ? AND sequence_id > ?"
        params: list[Any] = [rollout_id, after_sequence_id]
        with self._read():
            rollout = self._txn.get_rollout(rollout_id)
            if rollout is None:
                raise rollout_not_found(rollout_id)
            if attempt_id == "latest":
                sql += " AND attempt_seq = ?"
                params.append(rollout.num_attempts)
            elif attempt_id is not None:
                attempt = self._txn.get_attempt(rollout_id, attempt_id)
                if attempt is None:
                    known = (a.attempt_id for a in self._txn.list_attempts(rollout_id))
                    raise attempt_not_found(rollout_id, attempt_id, known)
                sql += " AND attempt_seq = ?"
                params.append(attempt.sequence_id)
            if name is not None:
                sql += " AND name = ?"
                params.append(name)
            sql += " ORDER BY attempt_seq, sequence_id LIMIT ? OFFSET ?"
            params += [-1 if limit is None else limit, offset]
            rows = self._txn.conn.execute(sql, params).fetchall()
        return [span_from_json(row[0]) for row in rows]

    # --- queries -------------------------------------------------------------------------------------------------
    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; NotFoundError if unknown."""
        with self._read():
            rollout = self._txn.get_rollout(rollout_id)
        if rollout is None:
            raise rollout_not_found(rollout_id)
        return rollout

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
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append(f"status IN ({','.join('?' * len(status))})")
            params += status
        if mode is not None:
            where.append("mode = ?")
            params.append(mode)
        if group_id is not None:
            where.append("group_id = ?")
            params.append(group_id)
        if rollout_ids is not None:
            # json_each keeps any number of ids within SQLite's bound-parameter limit.
            where.append("rollout_id IN (SELECT value FROM json_each(?))")
            params.append(orjson.dumps(list(rollout_ids)).decode())
        sql = SELECT_ROLLOUT
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY seq {'DESC' if sort == 'desc' else 'ASC'} LIMIT ? OFFSET ?"
        params += [-1 if limit is None else limit, offset]
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [rollout_from_row(row) for row in rows]

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, oldest first."""
        with self._read():
            if self._txn.get_rollout(rollout_id) is None:
                raise rollout_not_found(rollout_id)
            return self._txn.list_attempts(rollout_id)

    def _terminal(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        with self._read() as conn:
            rows = conn.execute(
                f"{SELECT_ROLLOUT} WHERE rollout_id IN (SELECT value FROM json_each(?))",
                (orjson.dumps(list(rollout_ids)).decode(),),
            ).fetchall()
        by_id = {row[0]: row for row in rows}
        missing = [rid for rid in rollout_ids if rid not in by_id]
        if missing:
            raise rollout_not_found(missing[0])
        return [rollout_from_row(by_id[rid]) for rid in rollout_ids if by_id[rid][1] in ROLLOUT_TERMINAL]

    def _all_terminal(self, ids_json: str, count: int) -> bool:
        """True when all ``count`` distinct rollouts are terminal; counts in SQL so polling parses no rows."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?)) "
                "AND status IN ('succeeded', 'failed', 'cancelled')",
                (ids_json,),
            ).fetchone()
        return row[0] == count

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Wait until every rollout is terminal or the timeout passes; returns the terminal ones."""
        self._terminal(rollout_ids)  # NotFoundError for unknown ids before any waiting
        unique = list(dict.fromkeys(rollout_ids))
        ids_json = orjson.dumps(unique).decode()
        await wait_until(
            self._notifier, lambda: self._all_terminal(ids_json, len(unique)), timeout_s, time.monotonic, POLL_S
        )
        return self._terminal(rollout_ids)

    # --- resources -----------------------------------------------------------------------------------------------
    async def add_resources(self, resources: Mapping[str, Resource]) -> ResourcesSnapshot:
        """Store a new immutable snapshot; it becomes the latest (versions 1, 2, 3, ...)."""
        with self._write() as conn:
            version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()[0]
            snapshot = ResourcesSnapshot(
                resources_id=new_id("rs"), version=version, create_time=self._clock(), resources=dict(resources)
            )
            conn.execute(
                "INSERT INTO resources (version, resources_id, data) VALUES (?, ?, ?)",
                (version, snapshot.resources_id, snapshot.model_dump_json()),
            )
        return snapshot

    async def get_resources(self, resources_id: str | None = None) -> ResourcesSnapshot | None:
        """A snapshot by id, or the latest when id is None."""
        with self._read() as conn:
            if resources_id is None:
                row = conn.execute("SELECT data FROM resources ORDER BY version DESC LIMIT 1").fetchone()
                return None if row is None else ResourcesSnapshot.model_validate_json(row[0])
            row = conn.execute("SELECT data FROM resources WHERE resources_id = ?", (resources_id,)).fetchone()
            if row is None:
                known = [r[0] for r in conn.execute("SELECT resources_id FROM resources ORDER BY version")]
                has = ", ".join(known) or "none yet (add_resources() creates one)"
                raise NotFoundError(f"resources {resources_id!r} not found; known snapshots: {has}")
        return ResourcesSnapshot.model_validate_json(row[0])

    async def list_resources(self) -> list[ResourcesSnapshot]:
        """All snapshots, oldest first."""
        with self._read() as conn:
            rows = conn.execute("SELECT data FROM resources ORDER BY version").fetchall()
        return [ResourcesSnapshot.model_validate_json(row[0]) for row in rows]

    # --- operations ----------------------------------------------------------------------------------------------
    async def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        """Watchdog tick: end attempts past their timeout or heartbeat timeout."""
        with self._write():
            changed = op_check_timeouts(self._txn, self._clock() if now is None else now)
        if changed:
            self._notifier.notify()
        return changed

    async def statistics(self) -> StoreStatistics:
        """Counts per status, spans and stored span bytes."""
        with self._read() as conn:
            rollouts = dict(conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall())
            attempts = dict(conn.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status").fetchall())
            # CAST: LENGTH counts characters of TEXT (new rows) and bytes of BLOBs (older rows).
            spans, span_bytes = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(data AS BLOB))), 0) FROM spans"
            ).fetchone()
            resources = conn.execute("SELECT COUNT(*) FROM resources").fetchone()[0]
        return StoreStatistics(
            rollouts_by_status=rollouts,
            attempts_by_status=attempts,
            total_rollouts=sum(rollouts.values()),
            total_attempts=sum(attempts.values()),
            total_spans=spans,
            span_bytes=span_bytes,
            total_resources=resources,
        )

    async def close(self) -> None:
        """Close the connection; closing twice is a no-op."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _WriteTransaction:
    """``BEGIN IMMEDIATE`` under the store lock on enter; ``COMMIT`` on a clean exit, ``ROLLBACK`` on an error.

    A class rather than a ``contextlib`` generator, made once per store: every store call opens one, and this costs
    a third as much. Not re-entrant (the lock is not).
    """

    __slots__ = ("_connection", "_lock", "_txn")

    def __init__(self, lock: threading.Lock, txn: SqliteTxn, connection: Callable[[], sqlite3.Connection]) -> None:
        self._lock = lock
        self._txn = txn
        self._connection = connection

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            conn = self._connection()
            self._txn.reset()
            conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        return conn

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        conn = self._txn.conn
        try:
            if kind is None:
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:  # a failed COMMIT leaves it open
                        conn.execute("ROLLBACK")
                    raise
            elif conn.in_transaction:
                conn.execute("ROLLBACK")
        finally:
            self._lock.release()


class _Reading:
    """The store lock for reads, with the rows the state machine's access remembered forgotten (made once per store)."""

    __slots__ = ("_connection", "_lock", "_txn")

    def __init__(self, lock: threading.Lock, txn: SqliteTxn, connection: Callable[[], sqlite3.Connection]) -> None:
        self._lock = lock
        self._txn = txn
        self._connection = connection

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            conn = self._connection()
            self._txn.reset()
        except BaseException:
            self._lock.release()
            raise
        return conn

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._lock.release()
