"""Transactions of the PostgreSQL store: one locked transaction (retried on deadlocks), keyed or not.

Idempotency keys (see :mod:`agentlightning.store._keys`) are taken, recorded and pruned in SQL here.

A keyed write runs in one transaction that first takes its key (``INSERT … ON CONFLICT DO NOTHING``, an empty
answer), then reads, runs the state machine and writes as an unkeyed one does, and last stores its answer in the
key's row. Taking the key first serialises duplicates on any servers: the second INSERT waits for the first
transaction and conflicts once it commits (or goes ahead if it rolled back). A key taken before means the call was
made before: the transaction rolls back and the committed answer is returned. A call that ends with nothing to
record (a claim finding nothing, a refused transition) rolls back, key included, so its retry runs again. Taking
the key after the claim would be a statement cheaper, but a duplicate arriving meanwhile would find the first's
rollout locked (SKIP LOCKED), see nothing to claim, and answer "nothing" while its twin claims.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple, TypeVar, cast

import psycopg
from psycopg import AsyncConnection, errors

from agentlightning.store._keys import KEY_TTL_NS, KeyedOp, check_key, decode, encode, scoped
from agentlightning.store._pg_schema import PrefetchedTxn

__all__ = ["AnsweredBefore", "Key", "answer", "key_of", "locked", "prune", "recorded", "take"]

T = TypeVar("T")
_RETRIES: Final = 5  # deadlock / serialization failures are retried: the whole transaction is re-run

_ANSWER: Final = "SELECT answer FROM idempotency_keys WHERE key = %s"
_ANSWERED: Final = "UPDATE idempotency_keys SET answer = %s WHERE key = %s"
_TAKE: Final = (
    "INSERT INTO idempotency_keys (key, create_time, answer) VALUES (%s, %s, %s) ON CONFLICT (key) DO NOTHING"
)


class Key(NamedTuple):
    """A keyed operation: which one, and the caller's key."""

    op: KeyedOp
    key: str


def key_of(op: KeyedOp, key: str | None) -> Key | None:
    """The checked key of ``op``, or None when the call carries none."""
    if key is None:
        return None
    check_key(key)
    return Key(op, key)


async def recorded(conn: AsyncConnection[Any], key: Key) -> Any:
    """The answer committed for ``key``, or None."""
    row = await (await conn.execute(_ANSWER, (scoped(*key),), binary=True)).fetchone()
    return None if row is None else decode(key.op, bytes(row[0]))


async def take(conn: AsyncConnection[Any], key: Key, now: int) -> bool:
    """Take ``key`` in the open transaction (waiting for a duplicate holding it); False if it was taken before."""
    cursor = await conn.execute(_TAKE, (scoped(*key), now, b""))
    return cursor.rowcount == 1


async def answer(conn: AsyncConnection[Any], key: Key, result: Any) -> None:
    """Store the answer in the key's row, taken by this transaction."""
    await conn.execute(_ANSWERED, (encode(key.op, result), scoped(*key)))


async def prune(conn: AsyncConnection[Any], now: int) -> None:
    """Delete keys older than the TTL (its own statement, outside any transaction)."""
    await conn.execute("DELETE FROM idempotency_keys WHERE create_time < %s", (now - KEY_TTL_NS,))


async def locked(
    conn: AsyncConnection[Any],
    load: Callable[[AsyncConnection[Any], PrefetchedTxn], Awaitable[None]],
    op: Callable[[PrefetchedTxn], T],
    key: Key | None = None,
    now: int = 0,
) -> T:
    """One transaction on ``conn``: ``load`` reads (and locks) rows, ``op`` runs on them, then the writes go in.

    With a ``key``, the call acts once per key: the key is taken first (at ``now``) and gets the answer with the
    writes; a key taken before answers with what it recorded (:mod:`agentlightning.store._pg_txn`).
    """
    for attempt in range(_RETRIES):
        try:
            # No pipeline mode: it saves round trips but costs psycopg more client CPU per statement than a round
            # trip on a nearby server (12 event-loop waits for a claim instead of 5; ~480 vs ~370 us of CPU).
            async with conn.transaction() as tx:
                if key is not None and not await take(conn, key, now):
                    raise AnsweredBefore
                txn = PrefetchedTxn()
                await load(conn, txn)
                result = op(txn)  # raises on a refused change: the key goes with the rollback
                if key is not None:
                    if result is None:  # a claim that found nothing: nothing to record, its retry may claim
                        raise psycopg.Rollback(tx)
                    await answer(conn, key, result)
                await txn.flush(conn)
            return result
        except AnsweredBefore:
            assert key is not None
            return cast(T, await recorded(conn, key))
        except (errors.DeadlockDetected, errors.SerializationFailure):
            if attempt == _RETRIES - 1:
                raise
            await asyncio.sleep(0.001 * 2**attempt)
    raise AssertionError("unreachable")


class AnsweredBefore(Exception):
    """The call's idempotency key was taken by an earlier call: roll back and answer with its recorded answer."""
