"""Conformance of the algorithm-metrics operations (``add_metrics``, ``query_metrics``, ``list_metric_runs``).

:class:`MetricsConformance` is a base of ``StoreConformance``: every backend (and the HTTP client) runs these tests.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from pydantic import ValidationError

from agentlightning.store import LightningStore, SyncLightningStore
from agentlightning.types import MetricsRecord

T0 = 1_700_000_000_000_000_000


def _record(run_id: str, step: int, **values: float) -> MetricsRecord:
    return MetricsRecord(run_id=run_id, step=step, time=T0 + step * 10**9, values=values)


class MetricsConformance:
    """Per-step training metrics on every backend."""

    async def test_metrics_round_trip_in_run_and_step_order(self, store: LightningStore) -> None:
        written = [_record("run-b", 2, reward_mean=0.5), _record("run-b", 1, reward_mean=0.25)]
        written += [_record("run-a", step, **{"staleness/0": 3, "runner_idle_frac": 0.1 * step}) for step in (3, 0)]
        await store.add_metrics(written)
        got = await store.query_metrics()
        assert [(r.run_id, r.step) for r in got] == [("run-a", 0), ("run-a", 3), ("run-b", 1), ("run-b", 2)]
        assert got[1] == _record("run-a", 3, **{"staleness/0": 3.0, "runner_idle_frac": 0.30000000000000004})
        assert all(isinstance(v, float) for r in got for v in r.values.values())  # an int value comes back a float
        assert [r.step for r in await store.query_metrics("run-b")] == [1, 2]
        assert (await store.query_metrics("run-b"))[0].time == T0 + 10**9

    async def test_writing_a_step_again_replaces_it(self, store: LightningStore) -> None:
        await store.add_metrics([_record("r", 1, loss=2.0, kl=0.5), _record("r", 2, loss=1.0)])
        again = MetricsRecord(run_id="r", step=1, time=T0 + 99, values={"loss": 1.5})
        await store.add_metrics([again])
        await store.add_metrics([again])  # a retry of the same write changes nothing more
        got = await store.query_metrics("r")
        assert got == [again, _record("r", 2, loss=1.0)]  # replaced whole: "kl" is gone
        [run] = await store.list_metric_runs()
        assert (run.run_id, run.steps, run.first_step, run.last_step) == ("r", 2, 1, 2)

    async def test_after_step_pages_through_a_run(self, store: LightningStore) -> None:
        await store.add_metrics([_record("r", step, x=float(step)) for step in range(7)])
        await store.add_metrics([_record("other", 3, x=1.0)])
        pages: list[list[int]] = []
        after: int | None = None
        while True:
            page = await store.query_metrics("r", after_step=after, limit=3)
            if not page:
                break
            pages.append([r.step for r in page])
            after = page[-1].step
        assert pages == [[0, 1, 2], [3, 4, 5], [6]]
        assert [r.step for r in await store.query_metrics("r", after_step=5)] == [6]
        assert await store.query_metrics("r", limit=0) == []
        assert [(r.run_id, r.step) for r in await store.query_metrics(after_step=4)] == [("r", 5), ("r", 6)]

    async def test_unknown_run_has_no_metrics(self, store: LightningStore) -> None:
        assert await store.query_metrics("never-ran") == []
        assert await store.query_metrics() == []
        assert await store.list_metric_runs() == []
        await store.add_metrics([])  # an empty batch writes nothing and is not an error
        assert await store.list_metric_runs() == []

    async def test_runs_are_listed_newest_first(self, store: LightningStore) -> None:
        await store.add_metrics([_record("old", 0), _record("old", 1), _record("new", 5), _record("mid", 2)])
        runs = await store.list_metric_runs()
        assert [r.run_id for r in runs] == ["new", "mid", "old"]
        assert runs[2].model_dump() == {
            "run_id": "old", "steps": 2, "first_step": 0, "last_step": 1, "last_time": T0 + 10**9,
        }  # fmt: skip

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    async def test_non_finite_values_are_refused_naming_run_step_and_metric(
        self, store: LightningStore, bad: float
    ) -> None:
        with pytest.raises(ValidationError, match=r"'loss' is (NaN|Infinity)"):
            MetricsRecord(run_id="r", step=1, values={"loss": bad})  # refused when the record is made ...
        sneaked = MetricsRecord.model_construct(run_id="r", step=4, time=T0, values={"ok": 1.0, "loss": bad})
        with pytest.raises(ValueError, match=r"run 'r' step 4: value 'loss' is -?(NaN|Infinity); .*JSON"):
            await store.add_metrics([_record("r", 3, ok=1.0), sneaked])  # ... and by the store, whole batch
        assert await store.query_metrics("r") == []

    async def test_bad_batches_are_refused_and_nothing_is_written(self, store: LightningStore) -> None:
        with pytest.raises(ValueError, match="records 0 and 2 are both run 'r' step 1"):
            await store.add_metrics([_record("r", 1), _record("r", 2), _record("r", 1)])
        negative = MetricsRecord.model_construct(run_id="r", step=-1, time=T0, values={})
        with pytest.raises(ValueError, match="step and time must be integers >= 0"):
            await store.add_metrics([negative])
        with pytest.raises(ValueError, match="takes a list of records"):
            await store.add_metrics(_record("r", 1))  # type: ignore[arg-type]  # one record, not a list: refused
        with pytest.raises(ValueError, match="after_step must be an integer >= 0"):
            await store.query_metrics("r", after_step=-2)
        with pytest.raises(ValueError, match="limit must be an integer >= 0"):
            await store.query_metrics("r", limit=-1)
        assert await store.query_metrics() == []

    async def test_sync_facade_has_the_metrics_operations(self, store: LightningStore) -> None:
        sync = SyncLightningStore(store)

        def use() -> list[MetricsRecord]:
            sync.add_metrics([_record("s", 0, reward_mean=1.0)])
            assert [r.run_id for r in sync.list_metric_runs()] == ["s"]
            return sync.query_metrics("s", after_step=None, limit=10)

        try:
            assert [r.values for r in await asyncio.to_thread(use)] == [{"reward_mean": 1.0}]
        finally:
            await asyncio.to_thread(sync.close)  # closes the store too; the fixture's second close is a no-op
