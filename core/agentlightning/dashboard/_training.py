"""The Training view's data: one run's per-step metrics records (``LightningStore.query_metrics``) as chart series.

A trainer writes flat records (``reward_mean``, ``staleness/<n>``, ``runner_idle_frac``, ...); this module picks
the series the page draws and turns the flattened staleness histogram back into a list per step.
"""

from __future__ import annotations

from typing import Final

from agentlightning.dashboard._models import TrainingRun, TrainingStep, TrainingView
from agentlightning.store.base import LightningStore
from agentlightning.types import MetricsRecord, MetricsRun

__all__ = ["MAX_TRAINING_STEPS", "training_view"]

MAX_TRAINING_STEPS: Final = 2_000
"""Most steps the view returns, the latest ones: a chart of more has no pixel per step at 1400 px anyway."""
_STALENESS: Final = "staleness/"
# A staleness bucket past this is a misnamed key, not a version lag: the bars would be unreadable long before.
_MAX_LAG: Final = 64


def _staleness(values: dict[str, float]) -> list[float]:
    """Counts by versions behind from ``staleness/<n>`` keys (missing buckets are 0)."""
    buckets: dict[int, float] = {}
    for name, value in values.items():
        suffix = name[len(_STALENESS) :] if name.startswith(_STALENESS) else ""
        if suffix.isdigit() and int(suffix) <= _MAX_LAG:
            buckets[int(suffix)] = value
    return [buckets.get(lag, 0.0) for lag in range(max(buckets) + 1)] if buckets else []


def _step(record: MetricsRecord) -> TrainingStep:
    v = record.values
    return TrainingStep(
        step=record.step,
        time_ms=record.time / 1e6,
        reward_mean=v.get("reward_mean"),
        reward_ema=v.get("reward_ema"),
        val_reward=v.get("val_reward"),
        runner_idle_frac=v.get("runner_idle_frac"),
        learner_idle_frac=v.get("learner_idle_frac"),
        rollout_s=v.get("rollout_s"),
        update_s=v.get("update_s"),
        policy_version=v.get("policy_version"),
        staleness=_staleness(v),
        stale_groups_dropped=v.get("stale_groups_dropped", 0.0),
        stale_rollouts_dropped=v.get("stale_rollouts_dropped", 0.0),
    )


def _run(run: MetricsRun) -> TrainingRun:
    return TrainingRun(
        run_id=run.run_id,
        steps=run.steps,
        first_step=run.first_step,
        last_step=run.last_step,
        last_ms=run.last_time / 1e6,
    )


async def training_view(store: LightningStore, run_id: str | None, refresh_s: float) -> TrainingView:
    """The latest :data:`MAX_TRAINING_STEPS` steps of ``run_id`` (default: the most recently written run)."""
    runs = await store.list_metric_runs()
    chosen = next((r for r in runs if r.run_id == run_id), None) if run_id else (runs[0] if runs else None)
    records: list[MetricsRecord] = []
    if chosen is not None:
        # The window ends at the last step; a run with gaps in its steps shows fewer steps, never more.
        window_start = chosen.last_step - MAX_TRAINING_STEPS
        after = window_start if window_start >= chosen.first_step else None
        records = await store.query_metrics(chosen.run_id, after_step=after, limit=MAX_TRAINING_STEPS)
    return TrainingView(
        runs=[_run(r) for r in runs],
        run_id=chosen.run_id if chosen is not None else run_id,
        steps=[_step(r) for r in records],
        earlier=(chosen.steps - len(records)) if chosen is not None else 0,
        latest=dict(records[-1].values) if records else {},
        refresh_s=refresh_s,
    )
