"""Algorithm metrics: one flat record of named floats per training step of a run, kept in the store.

A trainer writes one :class:`MetricsRecord` per step (``LightningStore.add_metrics``); the dashboard's Training view
reads them back. Values are flat floats: a histogram is flattened into one key per bucket (``staleness/0``,
``staleness/1``, ...), as the console and TensorBoard name them. Times are nanoseconds since the Unix epoch, as on
spans.
"""

from __future__ import annotations

import math
from time import time_ns
from typing import Final

from pydantic import BaseModel, Field, field_validator

MAX_METRIC_NAME: Final = 256
"""Longest metric name a store keeps (names are keys, not text)."""
MAX_METRICS_PER_RECORD: Final = 4096
"""Most values one record may hold: a step reports tens, a flattened histogram a few hundred."""
_MAX_INT64: Final = 2**63 - 1


def nonfinite_metric_error(run_id: str, step: int, name: str, value: float) -> ValueError:
    """The error for a NaN/Infinity metric value, naming the run, step and metric and saying what to send instead."""
    kind = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return ValueError(
        f"metrics of run {run_id!r} step {step}: value {name!r} is {kind}; metrics are stored as JSON, which has no "
        "NaN/Infinity: leave the value out for this step (the dashboard shows a gap) or send a finite number"
    )


class MetricsRecord(BaseModel):
    """The metrics of one training step of one run: stored once per ``(run_id, step)``, a rewrite replaces it."""

    run_id: str = Field(min_length=1, max_length=256, description="One id per training run (stable across resumes).")
    step: int = Field(ge=0, le=_MAX_INT64, description="The training step (0 = before the first update).")
    time: int = Field(
        default_factory=time_ns, ge=0, le=_MAX_INT64, description="When the step ended: nanoseconds since the epoch."
    )
    values: dict[str, float] = Field(
        default_factory=dict[str, float],
        description="Metric name -> finite value; histograms flattened as '<name>/<bucket>' keys.",
    )

    @field_validator("values")
    @classmethod
    def _finite_named_values(cls, values: dict[str, float]) -> dict[str, float]:
        if len(values) > MAX_METRICS_PER_RECORD:
            raise ValueError(
                f"{len(values)} values in one record; at most {MAX_METRICS_PER_RECORD}: flatten fewer histogram "
                "buckets (e.g. cap the bucket index) or split the metrics into several runs"
            )
        for name, value in values.items():
            if not name or len(name) > MAX_METRIC_NAME:
                raise ValueError(f"metric name {name[:40]!r} must have 1 to {MAX_METRIC_NAME} characters")
            if not math.isfinite(value):
                # The run and step are not known inside a field validator; the store's check names them.
                kind = "NaN" if math.isnan(value) else "Infinity"
                raise ValueError(
                    f"value {name!r} is {kind}; metrics are stored as JSON, which has no NaN/Infinity: leave the "
                    "value out for this step or send a finite number"
                )
        return values


class MetricsRun(BaseModel):
    """A run that has metrics in the store: how many steps and when its latest step was written."""

    run_id: str
    steps: int = Field(description="Records stored for the run.")
    first_step: int
    last_step: int
    last_time: int = Field(description="Latest record time of the run, nanoseconds since the epoch.")
