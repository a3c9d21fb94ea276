"""Group commit for :mod:`agentlightning.store.sqlite`: concurrent writes share one transaction and one COMMIT.

A store call hands its write (a function run inside a transaction) to :class:`GroupCommitWriter` and returns once
the transaction holding it has committed, exactly as when every call had its own. Writes that arrive while a
transaction is being applied or committed are queued and applied together in the next one, so 16 workers pay for
one ``BEGIN IMMEDIATE``/``COMMIT`` (and write each shared WAL page once) instead of 16: the commit, not the
statements, is most of what a small write costs in SQLite.

Where the waiting happens: a call on an event loop that has nothing else ready to run applies its write at once
(no other task could join it, so waiting would only add latency; one worker is as fast as without group commit).
Otherwise it queues the write, schedules a flush for the loop's next turn and awaits it, so every task that is
ready in this turn joins the same transaction. Writes from other threads and loops join whichever flush runs next;
the connection lock serialises flushes.

Waiting for another process's write lock does not block the event loop: a flush tries ``BEGIN IMMEDIATE`` without
waiting and, when another connection holds the lock, puts its writes back and tries again a moment later (0.5 ms,
doubling to 5 ms), for up to the store's ``busy_timeout_s``; the loop meanwhile runs the caller's other tasks, and
writes that arrive join the waiting transaction. SQLite's own busy handler waits inside the call instead, holding
the loop, and sleeps up to 100 ms between tries: with runner processes, the LLM proxy and the algorithm writing one
database, a runner's loop stood still for up to 330 ms at a time (11% of a benchmark run), its agents' replies and
claims waiting behind it.

Checkpoints (copying the WAL into the database file, with an fsync of each) run in :class:`WalCheckpointer`'s
thread, not in the committing call: a 16 MB checkpoint takes about as long as writing those 16 MB to the WAL did,
and a caller waiting for its commit should not pay for it. Durability does not depend on checkpoints.

Each write still succeeds or fails on its own. The state machine validates before it writes, so a write that raises
has usually changed nothing (``total_changes`` tells) and the others simply carry on; if a failing write did change
rows, the transaction is rolled back and the batch is applied again with a SAVEPOINT around each write.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Generic, TypeVar

from agentlightning.store._sqlite_schema import SqliteTxn

T = TypeVar("T")
_log = logging.getLogger(__name__)
CLOSE_WAIT_S: Final = 10.0  # longest close() waits for the checkpoint thread to finish its current checkpoint
CHECKPOINT_EVERY_S: Final = 0.1  # how long changes gather before a background checkpoint copies them (once each)
LOCKED_RETRY_S: Final = (0.0005, 0.005)  # first and longest pause before trying another process's write lock again


class _Write(Generic[T]):
    """One caller's write: the function to run in the transaction, and where its result goes."""

    __slots__ = ("error", "future", "locked_since", "loop", "op", "result")

    def __init__(self, op: Callable[[], T], loop: asyncio.AbstractEventLoop, future: asyncio.Future[T]) -> None:
        self.op = op
        self.loop = loop
        self.future = future
        self.result: Any = None
        self.error: BaseException | None = None
        self.locked_since: float | None = None  # monotonic time a flush first found the write lock taken


def _deliver(write: _Write[Any]) -> None:
    """Resolve a write's future on its own loop (a cancelled caller has stopped listening)."""
    if write.future.done():
        return
    if write.error is not None:
        write.future.set_exception(write.error)
    else:
        write.future.set_result(write.result)


class _PartialWrite(Exception):
    """A write failed after changing rows: the batch must be applied again with savepoints."""


class _Locked(Exception):
    """Another connection holds the database's write lock: nothing was applied."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for another connection's lock (SQLITE_BUSY, any extended code)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


class GroupCommitWriter:
    """Applies queued writes in shared transactions on one connection; each caller waits for its commit."""

    def __init__(
        self,
        lock: threading.Lock,
        txn: SqliteTxn,
        connection: Callable[[], sqlite3.Connection],
        committed: Callable[[], None],
        busy_timeout_s: float = 30.0,
    ) -> None:
        """Write through ``txn`` under ``lock``; ``connection`` returns the open connection or raises if closed.

        ``committed`` is called after every commit (the store kicks its checkpointer). ``busy_timeout_s``: how long
        a write waits for another process's write lock (the connection's own busy timeout, which it restores).
        """
        self._lock = lock
        self._txn = txn
        self._connection = connection
        self._committed = committed
        self._busy_timeout_s = busy_timeout_s
        self._busy_pragma = f"PRAGMA busy_timeout = {max(0, round(busy_timeout_s * 1000))}"
        self._locked_flushes = 0  # flushes in a row that found the write lock taken (the next pause doubles)
        # No per-use state: one serves every lone write; it begins without waiting for another process's lock.
        self._transaction = WriteTransaction(lock, txn, connection, begin=functools.partial(self._begin, wait=False))
        self._queue_lock = threading.Lock()
        self._pending: list[_Write[Any]] = []
        # Loops with a flush scheduled; weak, so a loop closed before its flush ran is not kept alive.
        self._armed: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    async def write(self, op: Callable[[], T]) -> T:
        """Run ``op`` inside a write transaction and return its result once that transaction has committed."""
        loop = asyncio.get_running_loop()
        # asyncio's ready queue is private but stable since 3.4; loops without one (uvloop) always wait a turn.
        ready = getattr(loop, "_ready", None)
        alone = ready is not None and not ready
        locked = False
        if alone and not self._pending:
            try:
                return self._apply_alone(op)
            except _Locked:
                locked = True  # another process is writing: wait for its lock below, without holding the loop
        write: _Write[T] = _Write(op, loop, loop.create_future())
        if locked:
            write.locked_since = time.monotonic()
        with self._queue_lock:
            self._pending.append(write)
            schedule = loop not in self._armed
            if schedule:
                self._armed.add(loop)
        if schedule:
            if locked:
                loop.call_later(self._pause(), self._flush, loop)
            elif alone:
                self._flush(loop)
            else:
                loop.call_soon(self._flush, loop)
        try:
            return await write.future
        except asyncio.CancelledError:
            with self._queue_lock:  # not applied yet: never apply it (applied: it stays, like a sent request)
                if write in self._pending:
                    self._pending.remove(write)
            raise

    def _apply_alone(self, op: Callable[[], T]) -> T:
        """Nothing is queued and nothing else could run first: one transaction, without the queue's bookkeeping.

        Raises :class:`_Locked`, having done nothing, when another connection holds the write lock."""
        with self._transaction:
            result = op()
        self._locked_flushes = 0
        self._committed()
        return result

    def _begin(self, conn: sqlite3.Connection, *, wait: bool) -> None:
        """``BEGIN IMMEDIATE``; without ``wait``, raise :class:`_Locked` at once if another connection writes."""
        if wait:
            conn.execute("BEGIN IMMEDIATE")
            return
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise _Locked() from exc
            raise
        finally:
            conn.execute(self._busy_pragma)

    def _pause(self) -> float:
        """Seconds until the next try for a write lock another connection holds."""
        first, longest = LOCKED_RETRY_S
        return min(longest, first * 2 ** min(self._locked_flushes, 16))

    def _wait_for_lock(self, batch: list[_Write[Any]], loop: asyncio.AbstractEventLoop) -> None:
        """Put ``batch`` back in front of the queue and try again shortly; writes that have waited longer than the
        busy timeout fail instead, as SQLite's own busy handler would have failed them."""
        now = time.monotonic()
        keep: list[_Write[Any]] = []
        expired: list[_Write[Any]] = []
        for write in batch:
            if write.locked_since is None:
                write.locked_since = now
            (expired if now - write.locked_since >= self._busy_timeout_s else keep).append(write)
        for write in expired:
            write.error = sqlite3.OperationalError(
                f"database is locked: another connection held its write lock for over {self._busy_timeout_s:g} s"
            )
        self._locked_flushes += 1
        pause = self._pause()
        with self._queue_lock:
            self._pending[:0] = keep
            # Every waiting caller's loop retries, so no write depends on another thread's loop still running.
            idle = {w.loop for w in self._pending if w.loop not in self._armed}
            self._armed.update(idle)
        for other in idle:
            if other is loop:
                loop.call_later(pause, self._flush, loop)
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed: its callers stopped listening
                    other.call_soon_threadsafe(other.call_later, pause, self._flush, other)
        self._tell(expired, loop)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Apply every queued write in one transaction and resolve the callers' futures."""
        with self._queue_lock:
            self._armed.discard(loop)
        with self._lock:
            # Taken under the connection lock: writes queued while another flush held it go in this transaction.
            with self._queue_lock:
                batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                self._apply(batch)
            except _Locked:
                self._wait_for_lock(batch, loop)
                return
            except BaseException as exc:  # BEGIN or COMMIT failed (or the store is closed): none of it is stored
                for write in batch:
                    write.error = exc
                if not isinstance(exc, Exception):
                    self._tell(batch, loop)
                    raise
        self._tell(batch, loop)

    @staticmethod
    def _tell(batch: list[_Write[Any]], loop: asyncio.AbstractEventLoop) -> None:
        """Resolve each caller's future, on its own loop."""
        for write in batch:
            if write.loop is loop:
                _deliver(write)
            else:
                with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody to tell
                    write.loop.call_soon_threadsafe(_deliver, write)

    def _apply(self, batch: list[_Write[Any]]) -> None:
        """One transaction holding every write of ``batch``, committed unless every write failed; raises
        :class:`_Locked`, having applied nothing, when another connection holds the write lock."""
        conn = self._connection()
        try:
            self._run(conn, batch, savepoints=False)
        except _PartialWrite:
            # Rare (a write failed after changing rows): this second pass waits for the lock inside the call.
            self._run(conn, batch, savepoints=True)
        self._locked_flushes = 0

    def _run(self, conn: sqlite3.Connection, batch: list[_Write[Any]], *, savepoints: bool) -> None:
        self._txn.reset()
        self._begin(conn, wait=savepoints)
        try:
            applied = 0
            for write in batch:
                write.error = None
                if savepoints:
                    conn.execute("SAVEPOINT write")
                before = conn.total_changes
                try:
                    write.result = write.op()
                    applied += 1
                except Exception as exc:
                    write.error = exc
                    self._txn.reset()  # rows it read or wrote may have been changed by its partial work
                    if savepoints:
                        conn.execute("ROLLBACK TO write")
                    elif conn.total_changes != before and len(batch) > 1:
                        raise _PartialWrite() from exc
                    elif conn.total_changes != before:
                        conn.execute("ROLLBACK")
                        return
                if savepoints:
                    conn.execute("RELEASE write")
            if applied:
                conn.execute("COMMIT")
                self._committed()
            else:
                conn.execute("ROLLBACK")
        except BaseException:
            if conn.in_transaction:  # a failed COMMIT leaves it open
                conn.execute("ROLLBACK")
            raise


class Reading:
    """The store lock for reads, with the rows the state machine's access remembered forgotten (made once per store).

    A class rather than a ``contextlib`` generator: every read call opens one, and this costs a third as much.
    """

    __slots__ = ("_connection", "_lock", "_txn")

    def __init__(self, lock: threading.Lock, txn: SqliteTxn, connection: Callable[[], sqlite3.Connection]) -> None:
        """Read through ``txn`` under ``lock``."""
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


class WriteTransaction(Reading):
    """``BEGIN IMMEDIATE`` under the store lock on enter; ``COMMIT`` on a clean exit, ``ROLLBACK`` on an error.

    For migrations at open and group commit's lone writes, whose ``begin`` (run instead of the plain statement) does
    not wait for another process's lock. Not re-entrant (the lock is not).
    """

    __slots__ = ("_begin",)

    def __init__(
        self,
        lock: threading.Lock,
        txn: SqliteTxn,
        connection: Callable[[], sqlite3.Connection],
        begin: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """Write through ``txn`` under ``lock``, starting each transaction with ``begin`` (default ``BEGIN
        IMMEDIATE``, waiting up to the connection's busy timeout)."""
        super().__init__(lock, txn, connection)
        self._begin = begin

    def __enter__(self) -> sqlite3.Connection:
        conn = super().__enter__()
        try:
            if self._begin is None:
                conn.execute("BEGIN IMMEDIATE")
            else:
                self._begin(conn)
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
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            elif conn.in_transaction:
                conn.execute("ROLLBACK")
        finally:
            self._lock.release()


class WalCheckpointer:
    """Copies committed WAL frames into the database file from a daemon thread with its own connection.

    A PASSIVE checkpoint never blocks writers or readers; it copies what was committed when it began. The store keeps
    SQLite's own automatic checkpoint as a backstop at a higher size, for when this thread falls behind.
    """

    def __init__(self, path: str, busy_timeout_s: float) -> None:
        """Checkpoint the database at ``path``; the thread starts on the first :meth:`kick`."""
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def kick(self) -> None:
        """Note that a commit happened: a checkpoint follows within about CHECKPOINT_EVERY_S."""
        if self._wake.is_set():
            return
        if self._thread is None:
            with self._start_lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(
                        target=self._run, name=f"agentlightning-sqlite-checkpoint {self._path}", daemon=True
                    )
                    self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread after its current checkpoint; closing twice is a no-op."""
        with self._start_lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            # Bounded: this also runs from a finalizer at interpreter exit, which must never hang on a stuck
            # checkpoint; the thread is a daemon and its connection only reads committed frames.
            thread.join(timeout=CLOSE_WAIT_S)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, timeout=self._busy_timeout_s, isolation_level=None)
        except sqlite3.Error:
            _log.warning(
                "no background checkpoints for %s; SQLite checkpoints when committing", self._path, exc_info=True
            )
            return
        try:
            while True:
                self._wake.wait()
                if self._stop.wait(CHECKPOINT_EVERY_S):
                    return
                self._wake.clear()
                if self._stop.is_set():  # closed between the wait and the clear, which dropped its wake-up
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:  # e.g. the file was removed; the committing side's backstop still works
                    _log.debug("background checkpoint of %s failed", self._path, exc_info=True)
        finally:
            conn.close()
