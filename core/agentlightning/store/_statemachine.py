"""The rollout/attempt state machine, written once and run by every backend inside its own transaction.

A backend supplies a :class:`StoreTxn` (row access inside one atomic unit: a lock for memory, ``BEGIN IMMEDIATE``
for SQLite); the ``op_*`` functions here decide every status change. Each op validates everything before its first
write, so an error leaves the store untouched. :class:`ChangeNotifier` wakes waiting claims and waits across
threads and event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from agentlightning.store._finite import nonfinite_span_error, span_has_nonfinite
from agentlightning.store.base import IllegalTransitionError, NotFoundError
from agentlightning.types import (
    ATTEMPT_TERMINAL,
    ATTEMPT_TRANSITIONS,
    ROLLOUT_TERMINAL,
    ROLLOUT_TRANSITIONS,
    Attempt,
    AttemptStatus,
    ClaimedRollout,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    Span,
)

NS_PER_S: Final = 1_000_000_000
CLAIMABLE: Final[tuple[RolloutStatus, ...]] = ("queuing", "requeuing")
LIVE_ATTEMPT: Final[tuple[AttemptStatus, ...]] = ("preparing", "running")
CANCELLED_ERROR: Final = "rollout cancelled"

ModelT = TypeVar("ModelT", bound=BaseModel)
_set_slot = object.__setattr__  # BaseModel.__setattr__ would validate and track the assignment


def construct(cls: type[ModelT], fields: dict[str, Any]) -> ModelT:
    """A model from a complete dict of already-valid fields, without validation; ``fields`` becomes its ``__dict__``.

    What ``model_construct`` does when every field is given, minus its per-field default and alias lookups (about
    four times faster; the store builds several models per state transition from rows it validated when writing).
    Pass a fresh dict holding every field of ``cls``, nested models already built.
    """
    model = cls.__new__(cls)
    _set_slot(model, "__dict__", fields)
    _set_slot(model, "__pydantic_fields_set__", set(fields))
    _set_slot(model, "__pydantic_extra__", None)
    _set_slot(model, "__pydantic_private__", None)
    return model


def replace(model: ModelT, **changes: Any) -> ModelT:
    """A shallow copy of ``model`` with ``changes`` applied unvalidated: ``model_copy(update=changes)``, faster."""
    cls = type(model)
    copy = cls.__new__(cls)
    _set_slot(copy, "__dict__", {**model.__dict__, **changes})
    _set_slot(copy, "__pydantic_fields_set__", model.__pydantic_fields_set__ | changes.keys())
    extra = model.__pydantic_extra__
    _set_slot(copy, "__pydantic_extra__", None if extra is None else dict(extra))
    _set_slot(copy, "__pydantic_private__", model.__pydantic_private__)
    return copy


_SEQUENCE_ID: Final = frozenset({"sequence_id"})


def span_with_sequence_id(span: Span, sequence_id: int) -> Span:
    """A shallow copy of ``span`` carrying its store-assigned ``sequence_id`` (``replace``, unrolled for ingest)."""
    fields = span.__dict__.copy()
    fields["sequence_id"] = sequence_id
    cls = type(span)
    copy = cls.__new__(cls)
    _set_slot(copy, "__dict__", fields)
    _set_slot(copy, "__pydantic_fields_set__", span.__pydantic_fields_set__ | _SEQUENCE_ID)
    _set_slot(copy, "__pydantic_extra__", span.__pydantic_extra__)
    _set_slot(copy, "__pydantic_private__", span.__pydantic_private__)
    return copy


def new_id(prefix: str) -> str:
    """A fresh id such as ``ro-<uuid4 hex>``."""
    # uuid.uuid4().hex without building a UUID object (a fifth of the cost): 122 random bits, version 4 marks.
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return f"{prefix}-{raw.hex()}"


class StoreTxn(Protocol):
    """Row access a backend offers the state machine inside one atomic unit of work."""

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout, or None."""
        ...

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        """Add new rollouts after every existing one, in order."""
        ...

    def update_rollout(self, rollout: Rollout) -> None:
        """Overwrite the mutable fields (status, times, num_attempts, metadata) of an existing rollout."""
        ...

    def first_claimable(self) -> Rollout | None:
        """The earliest-enqueued rollout in ``queuing`` or ``requeuing``."""
        ...

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        """The attempt, or None when the rollout has no such attempt."""
        ...

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, oldest first."""
        ...

    def insert_attempt(self, attempt: Attempt) -> None:
        """Add a new attempt (its sequence_id is the rollout's num_attempts)."""
        ...

    def update_attempt(self, attempt: Attempt) -> None:
        """Overwrite the mutable fields (status, end/heartbeat time, error) of an existing attempt."""
        ...

    def live_attempts(self) -> list[Attempt]:
        """Every attempt in ``preparing`` or ``running``."""
        ...

    def resources_exist(self, resources_id: str) -> bool:
        """True when a snapshot with this id exists."""
        ...

    def latest_resources_id(self) -> str | None:
        """Id of the newest snapshot, or None."""
        ...


# --- error messages ----------------------------------------------------------------------------------------------
def rollout_not_found(rollout_id: str) -> NotFoundError:
    """The error for an unknown rollout id."""
    return NotFoundError(
        f"rollout {rollout_id!r} not found; enqueue it first or check the id (query_rollouts() lists rollouts)"
    )


def attempt_not_found(rollout_id: str, attempt_id: str, known: Iterable[str]) -> NotFoundError:
    """The error for an attempt id the rollout does not have, listing the ones it has."""
    ids = list(known)
    has = ", ".join(ids) if ids else "none (claim_rollout() creates attempts)"
    return NotFoundError(f"rollout {rollout_id} has no attempt {attempt_id!r}; its attempts are: {has}")


def span_attempt_not_found(txn: StoreTxn, rollout_id: str, attempt_id: str) -> NotFoundError:
    """The error for a span naming an attempt that does not exist (or a rollout that does not)."""
    if txn.get_rollout(rollout_id) is None:
        return NotFoundError(f"span names an unknown attempt: {rollout_not_found(rollout_id)}")
    return attempt_not_found(rollout_id, attempt_id, (a.attempt_id for a in txn.list_attempts(rollout_id)))


def _allowed(statuses: Iterable[str]) -> str:
    ordered = sorted(statuses)
    return ", ".join(ordered) if ordered else "none: it is terminal"


def _check_rollout_move(rollout: Rollout, to: RolloutStatus) -> None:
    if to not in ROLLOUT_TRANSITIONS[rollout.status]:
        raise IllegalTransitionError(
            f"rollout {rollout.rollout_id} is {rollout.status} and cannot become {to}; "
            f"allowed from {rollout.status}: {_allowed(ROLLOUT_TRANSITIONS[rollout.status])}"
        )


def _check_attempt_move(attempt: Attempt, to: AttemptStatus) -> None:
    if to not in ATTEMPT_TRANSITIONS[attempt.status]:
        hint = f" ({attempt.error})" if attempt.error else ""
        raise IllegalTransitionError(
            f"attempt {attempt.attempt_id} of rollout {attempt.rollout_id} is {attempt.status}{hint} and cannot "
            f"become {to}; allowed from {attempt.status}: {_allowed(ATTEMPT_TRANSITIONS[attempt.status])}"
        )


def _load(txn: StoreTxn, rollout_id: str, attempt_id: str) -> tuple[Rollout, Attempt]:
    """The rollout and attempt, or NotFoundError naming what is missing."""
    rollout = txn.get_rollout(rollout_id)
    if rollout is None:
        raise rollout_not_found(rollout_id)
    attempt = txn.get_attempt(rollout_id, attempt_id)
    if attempt is None:
        raise attempt_not_found(rollout_id, attempt_id, (a.attempt_id for a in txn.list_attempts(rollout_id)))
    return rollout, attempt


def _check_latest(rollout: Rollout, attempt: Attempt, txn: StoreTxn) -> None:
    """A superseded attempt must never change the rollout: a newer attempt owns it now."""
    if attempt.sequence_id != rollout.num_attempts:
        latest = txn.list_attempts(rollout.rollout_id)[-1]
        raise IllegalTransitionError(
            f"attempt {attempt.attempt_id} of rollout {rollout.rollout_id} was superseded by attempt "
            f"{latest.attempt_id} ({latest.status}); only the latest attempt can change the rollout"
        )


# --- operations --------------------------------------------------------------------------------------------------
def op_enqueue(txn: StoreTxn, requests: Sequence[RolloutRequest], now: int) -> list[Rollout]:
    """Create rollouts in ``queuing``; unknown resources ids are rejected before anything is written."""
    for request in requests:
        if request.resources_id is not None and not txn.resources_exist(request.resources_id):
            raise NotFoundError(
                f"resources {request.resources_id!r} not found; add_resources() first, "
                "or pass resources_id=None to run with the latest snapshot"
            )
    # construct: the request fields were validated when the RolloutRequest was built.
    rollouts = [
        construct(
            Rollout,
            {
                "rollout_id": new_id("ro"),
                "input": request.input,
                "mode": request.mode,
                "group_id": request.group_id,
                "resources_id": request.resources_id,
                "status": "queuing",
                "config": request.config,
                "metadata": dict(request.metadata),
                "enqueue_time": now,
                "start_time": None,
                "end_time": None,
                "num_attempts": 0,
            },
        )
        for request in requests
    ]
    txn.insert_rollouts(rollouts)
    return rollouts


def op_claim(txn: StoreTxn, worker_id: str | None, now: int, *, start: bool = False) -> ClaimedRollout | None:
    """Move the oldest claimable rollout to ``preparing`` with a new attempt; None when nothing is claimable.

    ``start``: claim and start in one step, the rollout and its new attempt straight to ``running`` (what
    :func:`op_start` right after would write, without reading back the rows just written).
    """
    rollout = txn.first_claimable()
    if rollout is None:
        return None
    status: AttemptStatus = "running" if start else "preparing"
    attempt = construct(
        Attempt,
        {
            "rollout_id": rollout.rollout_id,
            "attempt_id": new_id("at"),
            "sequence_id": rollout.num_attempts + 1,
            "status": status,
            "worker_id": worker_id,
            "start_time": now,
            "end_time": None,
            "last_heartbeat_time": now,
            "error": None,
            "resources_id": rollout.resources_id or txn.latest_resources_id(),
        },
    )
    rollout = replace(
        rollout,
        status=status,
        num_attempts=attempt.sequence_id,
        start_time=rollout.start_time if rollout.start_time is not None else now,
    )
    txn.insert_attempt(attempt)
    txn.update_rollout(rollout)
    return construct(ClaimedRollout, {"rollout": rollout, "attempt": attempt})


def op_start(txn: StoreTxn, rollout_id: str, attempt_id: str, now: int) -> Attempt:
    """Move a claimed attempt and its rollout to ``running``."""
    rollout, attempt = _load(txn, rollout_id, attempt_id)
    _check_latest(rollout, attempt, txn)
    _check_attempt_move(attempt, "running")
    _check_rollout_move(rollout, "running")
    attempt = replace(attempt, status="running", last_heartbeat_time=now)
    txn.update_attempt(attempt)
    txn.update_rollout(replace(rollout, status="running"))
    return attempt


def _end_attempt(
    txn: StoreTxn, rollout: Rollout, attempt: Attempt, status: AttemptStatus, error: str | None, now: int
) -> Attempt:
    """Write an attempt's terminal status and move its rollout: succeeded, requeued for a retry, or failed."""
    next_rollout: RolloutStatus
    if status == "succeeded":
        next_rollout = "succeeded"
    elif status in rollout.config.retry_on and rollout.num_attempts < rollout.config.max_attempts:
        next_rollout = "requeuing"
    else:
        next_rollout = "failed"
    _check_rollout_move(rollout, next_rollout)
    attempt = replace(attempt, status=status, end_time=now, error=error)
    end_time = now if next_rollout in ROLLOUT_TERMINAL else None
    txn.update_attempt(attempt)
    txn.update_rollout(replace(rollout, status=next_rollout, end_time=end_time))
    return attempt


def op_finish(
    txn: StoreTxn, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None, now: int
) -> Attempt:
    """Record the latest attempt's terminal status; the rollout follows its retry policy."""
    if status not in ATTEMPT_TERMINAL:
        raise ValueError(
            f"finish_attempt({rollout_id}, {attempt_id}) needs a terminal status, one of "
            f"{_allowed(ATTEMPT_TERMINAL)}; got {status!r} (use start_attempt() for running)"
        )
    rollout, attempt = _load(txn, rollout_id, attempt_id)
    _check_latest(rollout, attempt, txn)
    _check_attempt_move(attempt, status)
    return _end_attempt(txn, rollout, attempt, status, error, now)


def op_cancel(txn: StoreTxn, rollout_id: str, now: int) -> Rollout:
    """Cancel a rollout; its live attempt (if any) ends as ``failed`` so no watchdog or runner revives it."""
    rollout = txn.get_rollout(rollout_id)
    if rollout is None:
        raise rollout_not_found(rollout_id)
    _check_rollout_move(rollout, "cancelled")
    if rollout.num_attempts:
        latest = txn.list_attempts(rollout_id)[-1]
        if latest.status in LIVE_ATTEMPT:
            txn.update_attempt(replace(latest, status="failed", end_time=now, error=CANCELLED_ERROR))
    rollout = replace(rollout, status="cancelled", end_time=now)
    txn.update_rollout(rollout)
    return rollout


def op_heartbeat(txn: StoreTxn, rollout_id: str, attempt_id: str, now: int) -> Attempt:
    """Record that a live attempt is alive."""
    _rollout, attempt = _load(txn, rollout_id, attempt_id)
    if attempt.status not in LIVE_ATTEMPT:
        hint = f" ({attempt.error})" if attempt.error else ""
        raise IllegalTransitionError(
            f"attempt {attempt_id} of rollout {rollout_id} is {attempt.status}{hint}; only preparing or running "
            "attempts take heartbeats. Stop working on it (claim_rollout() gives a fresh attempt)"
        )
    attempt = replace(attempt, last_heartbeat_time=now)
    txn.update_attempt(attempt)
    return attempt


def op_update_metadata(txn: StoreTxn, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
    """Merge keys into a rollout's metadata (allowed in every status: metadata is not state)."""
    rollout = txn.get_rollout(rollout_id)
    if rollout is None:
        raise rollout_not_found(rollout_id)
    rollout = replace(rollout, metadata={**rollout.metadata, **metadata})
    txn.update_rollout(rollout)
    return rollout


def op_check_timeouts(txn: StoreTxn, now: int) -> list[Attempt]:
    """Mark live attempts past ``timeout_s`` as timeout and silent ones as unresponsive; requeue per config."""
    changed: list[Attempt] = []
    for attempt in txn.live_attempts():
        rollout = txn.get_rollout(attempt.rollout_id)
        if rollout is None or rollout.status in ROLLOUT_TERMINAL:
            continue
        config = rollout.config
        status: AttemptStatus
        if config.timeout_s is not None and now - attempt.start_time > config.timeout_s * NS_PER_S:
            status, error = "timeout", f"ran longer than timeout_s={config.timeout_s}"
        elif config.heartbeat_timeout_s is not None and (
            now - (attempt.last_heartbeat_time or attempt.start_time) > config.heartbeat_timeout_s * NS_PER_S
        ):
            status, error = "unresponsive", f"no span or heartbeat for heartbeat_timeout_s={config.heartbeat_timeout_s}"
        else:
            continue
        changed.append(_end_attempt(txn, rollout, attempt, status, error, now))
    return changed


# --- spans -------------------------------------------------------------------------------------------------------
def span_attempt_keys(spans: Sequence[Span]) -> list[tuple[str, str]]:
    """Distinct (rollout_id, attempt_id) of a batch in first-seen order.

    ValueError if a span lacks them, or holds NaN/Infinity: every backend stores JSON, which has neither, so such a
    span would be stored as something the model refuses (checked here because every ``add_spans`` calls this first).
    """
    keys: dict[tuple[str, str], None] = {}
    for index, span in enumerate(spans):
        if not span.rollout_id or not span.attempt_id:
            raise ValueError(
                f"span {span.span_id} ({span.name!r}) has no rollout_id/attempt_id; every span must name the "
                "attempt it belongs to (set them, or emit it inside agentlightning.rollout_context)"
            )
        if span_has_nonfinite(span):
            raise nonfinite_span_error(span, index)
        keys[(span.rollout_id, span.attempt_id)] = None
    return list(keys)


_UNREADABLE_SHOWN: Final = 5
_log = logging.getLogger("agentlightning.store")


def validation_summary(exc: ValidationError) -> str:
    """A validation error in one line: where and what, for at most three of its errors."""
    errors = exc.errors(include_url=False)
    parts = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors[:3]]
    return "; ".join(parts) + (f" (and {len(errors) - 3} more)" if len(errors) > 3 else "")


def warn_unreadable_spans(rollout_id: str, unreadable: Sequence[str]) -> None:
    """One warning for the stored spans a query of ``rollout_id`` left out because they do not validate."""
    shown = "; ".join(unreadable[:_UNREADABLE_SHOWN])
    more = f" (and {len(unreadable) - _UNREADABLE_SHOWN} more)" if len(unreadable) > _UNREADABLE_SHOWN else ""
    _log.warning(
        "query_spans(%s) left out %d stored span(s) that do not validate as a Span (written before NaN/Infinity "
        "were refused, or by other software): %s%s",
        rollout_id,
        len(unreadable),
        shown,
        more,
    )


# --- waiting -----------------------------------------------------------------------------------------------------
class ChangeNotifier:
    """Wakes coroutines on any thread's event loop when the store changes (claims, finishes, enqueues)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def generation(self) -> int:
        """A counter that grows on every notify; read it before checking the condition you wait for."""
        return self._generation

    def notify(self) -> None:
        """Wake every waiter (safe from any thread)."""
        with self._lock:
            self._generation += 1
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            # RuntimeError: the waiter's loop is closed, so nobody is left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future)

    async def wait(self, generation: int, timeout_s: float) -> None:
        """Return after a notify newer than ``generation`` or after ``timeout_s``, whichever comes first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with self._lock:
            if self._generation != generation:
                return
            self._waiters.append(entry)
        # The timeout resolves the same future. Not asyncio.wait_for: on Python 3.11 it swallows a cancel that lands
        # as the future resolves (gh-86296), and a waiter polling in a loop then never ends (a trainer's shutdown
        # hung on its cancelled rollout collector).
        timer = loop.call_later(max(timeout_s, 0.0), _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_until(
    notifier: ChangeNotifier,
    attempt: Callable[[], Any],
    timeout_s: float | None,
    clock: Callable[[], float],
    poll_s: float,
) -> Any:
    """Call ``attempt`` until it returns a truthy value or ``timeout_s`` passes; returns its last value.

    Sleeps on ``notifier`` between tries, at most ``poll_s`` so changes made by other processes are seen too.
    """
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        generation = notifier.generation
        result = attempt()
        if result:
            return result
        remaining = poll_s if deadline is None else min(poll_s, deadline - clock())
        if remaining <= 0:
            return result
        await notifier.wait(generation, remaining)
