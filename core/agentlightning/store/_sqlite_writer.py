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
import logging
import sqlite3
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Generic, TypeVar

from agentlightning.store._sqlite_schema import SqliteTxn

T = TypeVar("T")
_log = logging.getLogger(__name__)
CLOSE_WAIT_S: Final = 10.0  # longest close() waits for the checkpoint thread to finish its current checkpoint
CHECKPOINT_EVERY_S: Final = 0.1  # how long changes gather before a background checkpoint copies them (once each)


class _Write(Generic[T]):
    """One caller's write: the function to run in the transaction, and where its result goes."""

    __slots__ = ("error", "future", "loop", "op", "result")

    def __init__(self, op: Callable[[], T], loop: asyncio.AbstractEventLoop, future: asyncio.Future[T]) -> None:
        self.op = op
        self.loop = loop
        self.future = future
        self.result: Any = None
        self.error: BaseException | None = None


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


class GroupCommitWriter:
    """Applies queued writes in shared transactions on one connection; each caller waits for its commit."""

    def __init__(
        self,
        lock: threading.Lock,
        txn: SqliteTxn,
        connection: Callable[[], sqlite3.Connection],
        committed: Callable[[], None],
    ) -> None:
        """Write through ``txn`` under ``lock``; ``connection`` returns the open connection or raises if closed.

        ``committed`` is called after every commit (the store kicks its checkpointer).
        """
        self._lock = lock
        self._txn = txn
        self._connection = connection
        self._committed = committed
        self._transaction = WriteTransaction(lock, txn, connection)  # no per-use state: one serves every lone write
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
        if alone and not self._pending:
            return self._apply_alone(op)
        write: _Write[T] = _Write(op, loop, loop.create_future())
        with self._queue_lock:
            self._pending.append(write)
            schedule = loop not in self._armed
            if schedule:
                self._armed.add(loop)
        if schedule:
            if alone:
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
        """Nothing is queued and nothing else could run first: one transaction, without the queue's bookkeeping."""
        with self._transaction:
            result = op()
        self._committed()
        return result

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
        """One transaction holding every write of ``batch``, committed unless every write failed."""
        conn = self._connection()
        try:
            self._run(conn, batch, savepoints=False)
        except _PartialWrite:
            self._run(conn, batch, savepoints=True)

    def _run(self, conn: sqlite3.Connection, batch: list[_Write[Any]], *, savepoints: bool) -> None:
        self._txn.reset()
        conn.execute("BEGIN IMMEDIATE")
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

    For work outside group commit (migrations at open). Not re-entrant (the lock is not).
    """

    __slots__ = ()

    def __enter__(self) -> sqlite3.Connection:
        conn = super().__enter__()
        try:
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
