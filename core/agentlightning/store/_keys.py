"""Idempotency keys kept in the store: a keyed write records its answer in the transaction of the write itself.

A client that lost an answer (a dropped connection, a server killed after its commit) re-sends the call with the
same key; the store finds the key and answers what it answered the first time instead of acting again. Because the
key and the write commit together, this holds across server restarts and between servers sharing one database: the
write is either done and keyed, or neither.

Keys are scoped by operation (``enqueue``, ``claim``, ...), so one key reused for two different calls does not
collide, and kept for :data:`KEY_TTL_NS` (pruned by age during keyed writes, at most every :data:`PRUNE_EVERY_NS`).
Errors are not recorded: a refused call (4xx) leaves nothing, and its retry runs again.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import TypeAdapter

from agentlightning.types import Attempt, ClaimedRollout, ResourcesSnapshot, Rollout

__all__ = ["KEY_TTL_NS", "MAX_KEY_LENGTH", "PRUNE_EVERY_NS", "KeyedOp", "check_key", "decode", "encode", "scoped"]

KeyedOp = Literal["enqueue", "claim", "start", "finish", "cancel", "resources"]

# A client retries for minutes at most; a day leaves room for a server down overnight.
KEY_TTL_NS: Final = 24 * 3600 * 10**9
PRUNE_EVERY_NS: Final = 60 * 10**9
MAX_KEY_LENGTH: Final = 255

_ADAPTERS: Final[dict[KeyedOp, TypeAdapter[Any]]] = {
    "enqueue": TypeAdapter(list[Rollout]),
    "claim": TypeAdapter(ClaimedRollout),
    "start": TypeAdapter(Attempt),
    "finish": TypeAdapter(Attempt),
    "cancel": TypeAdapter(Rollout),
    "resources": TypeAdapter(ResourcesSnapshot),
}


def check_key(key: str | None) -> None:
    """Refuse an empty or oversized key (ValueError) before anything is written."""
    if key is not None and not 0 < len(key) <= MAX_KEY_LENGTH:
        raise ValueError(f"an idempotency key must be 1 to {MAX_KEY_LENGTH} characters; got {len(key)}")


def scoped(op: KeyedOp, key: str) -> str:
    """The key as stored: one namespace per operation."""
    return f"{op}:{key}"


def encode(op: KeyedOp, answer: Any) -> bytes:
    """The answer of ``op`` as stored next to its key (JSON)."""
    return _ADAPTERS[op].dump_json(answer)


def decode(op: KeyedOp, data: bytes | str) -> Any:
    """The answer recorded for a key, as the operation returned it the first time."""
    return _ADAPTERS[op].validate_json(data)
