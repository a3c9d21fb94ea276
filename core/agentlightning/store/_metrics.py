"""What every backend's ``add_metrics`` / ``query_metrics`` share: input checks and the stored form of the values.

The model refuses NaN/Infinity when it is validated, but a record built with ``model_construct`` or changed after
validation is not; :func:`checked_records` looks again at the edge of every store (a stored NaN would come back as
``null`` and fail every later read of the run, as it did for spans in issue #26).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import orjson

from agentlightning.types import MetricsRecord, MetricsRun
from agentlightning.types.metrics import nonfinite_metric_error

__all__ = [
    "MetricsRow",
    "checked_query",
    "checked_records",
    "record_from_row",
    "run_from_row",
]

MetricsRow = tuple[str, int, int, bytes]
"""(run_id, step, time, values as JSON bytes): a record as the SQL backends store it."""

_NAMES: Final = "MetricsRecord(run_id=..., step=..., values={...})"


def checked_records(records: Sequence[MetricsRecord]) -> list[MetricsRow]:
    """Rows for ``records``; ValueError naming the record (by position) when one is not storable, nothing written.

    Two records of one ``(run_id, step)`` in a batch are refused: which of them should win is not the store's guess.
    """
    given = cast(object, records)  # callers without a type checker pass anything
    if isinstance(given, MetricsRecord | str | bytes) or not isinstance(given, Sequence):
        raise ValueError(f"add_metrics takes a list of records, e.g. [{_NAMES}]; got {type(given).__name__}")
    rows: list[MetricsRow] = []
    seen: dict[tuple[str, int], int] = {}
    for index, item in enumerate(cast("Sequence[object]", given)):
        if not isinstance(item, MetricsRecord):
            raise ValueError(f"metrics record {index} is a {type(item).__name__}, not a {_NAMES}")
        # A record made with model_construct (or changed after validation) was never checked: look at every field.
        fields: Mapping[str, object] = item.__dict__
        run_id, step, at, values = fields["run_id"], fields["step"], fields["time"], fields["values"]
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"metrics record {index}: run_id must be a non-empty string, got {run_id!r}")
        if not _is_count(step) or not _is_count(at):
            raise ValueError(
                f"metrics record {index} (run {run_id!r}): step and time must be integers >= 0, got {step!r}, {at!r}"
            )
        assert isinstance(step, int)
        if not isinstance(values, dict):
            raise ValueError(f"metrics of run {run_id!r} step {step}: values must be a dict of name -> float")
        for name, value in cast("dict[object, object]", values).items():
            if not isinstance(name, str) or not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"metrics of run {run_id!r} step {step}: {name!r}: {value!r} is not name -> number")
            if not math.isfinite(value):
                raise nonfinite_metric_error(run_id, step, name, value)
        key = (run_id, step)
        if key in seen:
            raise ValueError(
                f"metrics records {seen[key]} and {index} are both run {run_id!r} step {step}; send one record per "
                "(run_id, step) (a later add_metrics call of the same step replaces the stored one)"
            )
        seen[key] = index
        floats = {str(k): float(v) for k, v in cast("dict[str, float]", values).items()}
        rows.append((run_id, step, cast(int, at), orjson.dumps(floats)))
    return rows


def checked_query(run_id: str | None, after_step: int | None, limit: int | None) -> None:
    """ValueError saying what is wrong with ``query_metrics`` arguments."""
    given = cast("tuple[object, object, object]", (run_id, after_step, limit))  # unchecked callers too
    if given[0] is not None and (not isinstance(given[0], str) or not given[0]):
        raise ValueError(f"run_id must be a non-empty string or None (every run), got {run_id!r}")
    if given[1] is not None and not _is_count(given[1]):
        raise ValueError(f"after_step must be an integer >= 0 or None (from the first step), got {after_step!r}")
    if given[2] is not None and not _is_count(given[2]):
        raise ValueError(f"limit must be an integer >= 0 or None (no limit), got {limit!r}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def record_from_row(row: Sequence[Any]) -> MetricsRecord:
    """A record from a stored ``(run_id, step, time, values JSON)`` row (checked on its way in, not validated again)."""
    values: dict[str, float] = orjson.loads(row[3])
    return MetricsRecord.model_construct(run_id=str(row[0]), step=int(row[1]), time=int(row[2]), values=values)


def run_from_row(row: Sequence[Any]) -> MetricsRun:
    """A run summary from a ``(run_id, count, min step, max step, max time)`` row."""
    return MetricsRun(
        run_id=str(row[0]), steps=int(row[1]), first_step=int(row[2]), last_step=int(row[3]), last_time=int(row[4])
    )
