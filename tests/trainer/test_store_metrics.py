"""LightningRL writes one metrics record per step to the store it trains against (issue 28 item 3): real short runs,
the record's flat form, the run id, and a failing store that must not stop training."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from agentlightning.store import InMemoryLightningStore
from agentlightning.trainer import Trainer
from agentlightning.types import MetricsRecord
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.metrics import StepMetrics, StoreMetricsSink, metrics_record, metrics_run_id
from agentlightning_trainer.quickstart.agent import tool_choice_agent

FLOW_KEYS = {"runner_idle_frac", "learner_idle_frac", "stale_groups_dropped", "stale_rollouts_dropped"}


@pytest.mark.timeout(120)
def test_a_short_run_leaves_one_record_per_step_in_its_store(tool_spec: PolicySpec, tmp_path: Path) -> None:
    store = InMemoryLightningStore()
    config = LightningRLConfig(policy=tool_spec, steps=3, tasks_per_step=2, samples_per_task=2, val_every=2, seed=0)
    algorithm = LightningRL(config, run_dir=tmp_path / "run", show_progress=False)
    tasks = tool_choice.tasks()
    Trainer(algorithm, store=store, n_runners=4).fit(tool_choice_agent, tasks[:8], tasks[8:10])

    [run] = asyncio.run(store.list_metric_runs())
    assert (run.steps, run.first_step, run.last_step) == (3, 1, 3)
    records = asyncio.run(store.query_metrics(run.run_id))
    assert [r.step for r in records] == [1, 2, 3] == [m.step for m in algorithm.history]
    for record, step in zip(records, algorithm.history, strict=True):
        assert record.values.keys() >= FLOW_KEYS, sorted(record.values)
        assert any(k.startswith("staleness/") for k in record.values), sorted(record.values)
        assert {"reward_mean", "reward_ema", "rollout_s", "update_s", "policy_version"} <= record.values.keys()
        assert record.values["reward_mean"] == step.reward_mean
        assert record.values["update_s"] == step.update_s
        # The histogram is flattened: its buckets count the step's trained transitions.
        buckets = {k: v for k, v in record.values.items() if k.startswith("staleness/")}
        assert sum(buckets.values()) == sum(step.staleness.values()) > 0
        assert list(buckets) == ["staleness/0"]  # the synchronous loop trains only on the current policy's calls
        assert 0.0 <= record.values["learner_idle_frac"] <= 1.0 and 0.0 <= record.values["runner_idle_frac"] <= 1.0
    assert records[0].time < records[1].time < records[2].time
    # Validated steps (every 2nd, and the last) carry their greedy validation reward; the others none.
    assert [r.values.get("val_reward") for r in records] == [None, *(v for _, v in algorithm.val_history[1:])]
    assert [step for step, _ in algorithm.val_history] == [0, 2, 3]


@pytest.mark.timeout(120)
def test_an_async_run_records_its_staleness_buckets(tool_spec: PolicySpec, tmp_path: Path) -> None:
    store = InMemoryLightningStore()
    config = LightningRLConfig(
        policy=tool_spec, steps=4, tasks_per_step=2, samples_per_task=2, val_every=100, seed=0, mode="async",
        max_staleness=1,
    )  # fmt: skip
    algorithm = LightningRL(config, run_dir=tmp_path / "run", show_progress=False)
    Trainer(algorithm, store=store, n_runners=4).fit(tool_choice_agent, tool_choice.tasks())

    [run] = asyncio.run(store.list_metric_runs())
    records = asyncio.run(store.query_metrics(run.run_id))
    assert [r.step for r in records] == [1, 2, 3, 4]
    for record, step in zip(records, algorithm.history, strict=True):
        buckets = {int(k.split("/")[1]): v for k, v in record.values.items() if k.startswith("staleness/")}
        assert buckets == {lag: float(n) for lag, n in step.staleness.items()} and max(buckets) <= 1
        assert record.values.keys() >= FLOW_KEYS
    # Two steps of groups are issued up front: the second step trains on samples one version old.
    assert 1 in {int(k.split("/")[1]) for r in records for k in r.values if k.startswith("staleness/")}


def _step(step: int, **changes: object) -> StepMetrics:
    fields: dict[str, object] = {
        "step": step, "reward_mean": 0.5, "reward_ema": 0.4, "all_same_frac": 0.0, "transitions": 8, "rollouts": 8,
        "failed_rollouts": 1, "policy_version": step, "policy_lag": 0.5, "rollout_s": 1.5, "update_s": 0.25,
        "staleness": {0: 5, 2: 3}, "stale_groups_dropped": 1, "stale_rollouts_dropped": 2,
        "runner_idle_frac": 0.2, "learner_idle_frac": None,
    }  # fmt: skip
    return StepMetrics(**(fields | changes))  # type: ignore[arg-type]  # the dataclass's own field names


def test_a_step_becomes_one_flat_record_without_non_finite_values() -> None:
    record = metrics_record("run-x", _step(4, extra={"loss": math.nan, "kl": 0.01}, skipped=True), time_ns=123)
    assert (record.run_id, record.step, record.time) == ("run-x", 4, 123)
    values = record.values
    assert values["staleness/0"] == 5.0 and values["staleness/2"] == 3.0 and "staleness/1" not in values
    assert values["update/kl"] == 0.01 and "update/loss" not in values  # NaN left out: a gap, not a lost step
    assert values["skipped"] == 1.0 and values["stale_groups_dropped"] == 1.0
    assert "learner_idle_frac" not in values  # None: not measured this step
    assert values["runner_idle_frac"] == 0.2 and values["update_s"] == 0.25


def test_the_run_id_follows_the_checkpoint_folder(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    assert metrics_run_id(checkpoints) == metrics_run_id(tmp_path / "." / "ckpt")  # a resumed run keeps its id
    assert metrics_run_id(checkpoints).startswith("ckpt-")
    assert metrics_run_id(checkpoints) != metrics_run_id(tmp_path / "other" / "ckpt")
    assert metrics_run_id(None) != metrics_run_id(None)  # without checkpoints, every run is new


class _RefusingStore(InMemoryLightningStore):
    """A store whose metrics writes fail, as an older store server without /v1/metrics answers."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def add_metrics(self, records: Sequence[MetricsRecord]) -> None:
        self.calls += 1
        raise ValueError("POST /v1/metrics matches no route of the server")


async def test_a_failing_store_costs_one_warning_not_the_run(caplog: pytest.LogCaptureFixture) -> None:
    store = _RefusingStore()
    sink = StoreMetricsSink(store, "run-f")
    with caplog.at_level(logging.DEBUG, logger="agentlightning_trainer.metrics"):
        assert [await sink.send(_step(s)) for s in (1, 2, 3)] == [False, False, False]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step 1: metrics not written" in warnings[0].getMessage()
    assert "training continues" in warnings[0].getMessage()
    assert store.calls == 3 and sink.failures == 3
    healthy = StoreMetricsSink(InMemoryLightningStore(), "run-ok")
    assert await healthy.send(_step(1)) and healthy.failures == 0


class _HangingStore(InMemoryLightningStore):
    """A store whose metrics write never answers (a server that accepted the connection and stalled)."""

    async def add_metrics(self, records: Sequence[MetricsRecord]) -> None:
        await asyncio.Event().wait()


async def test_a_hanging_store_costs_at_most_the_timeout(caplog: pytest.LogCaptureFixture) -> None:
    sink = StoreMetricsSink(_HangingStore(), "run-h", timeout_s=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.WARNING, logger="agentlightning_trainer.metrics"):
        assert await sink.send(_step(1)) is False
    assert loop.time() - started < 2.0
    assert "TimeoutError" in caplog.records[0].getMessage()
