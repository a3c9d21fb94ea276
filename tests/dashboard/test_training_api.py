"""The Training view's endpoint (``GET /v1/dashboard/training``) over a real store, in process over ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from agentlightning.dashboard import _training
from agentlightning.server import create_app
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import MetricsRecord
from tests.dashboard._seed import DROPPED_AT, TRAIN_CURVE, TRAINING_RUN, TRAINING_STEPS, training_metrics


@pytest.fixture
def store() -> InMemoryLightningStore:
    """An empty memory store."""
    return InMemoryLightningStore()


@pytest.fixture
async def api(store: InMemoryLightningStore) -> AsyncIterator[httpx.AsyncClient]:
    """The store app (dashboard included) in process."""
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://store") as client:
        yield client


async def test_no_metrics_yet_is_an_empty_view(api: httpx.AsyncClient) -> None:
    body = (await api.get("/v1/dashboard/training")).json()
    assert (body["runs"], body["run_id"], body["steps"], body["latest"], body["earlier"]) == ([], None, [], {}, 0)
    assert body["refresh_s"] > 0


async def test_latest_run_by_default_with_its_series(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    await store.add_metrics(training_metrics())
    body = (await api.get("/v1/dashboard/training")).json()
    assert [r["run_id"] for r in body["runs"]] == [TRAINING_RUN, "older-run"]
    assert body["run_id"] == TRAINING_RUN and body["earlier"] == 0
    steps = body["steps"]
    assert [st["step"] for st in steps] == list(range(1, TRAINING_STEPS + 1))
    assert [st["reward_mean"] for st in steps] == TRAIN_CURVE
    assert steps[0]["staleness"] == [16.0]  # only the current policy's transitions at the first step
    assert steps[5]["staleness"] == [11.0, 4.0, 1.0]  # staleness/0, /1, /2 of step 6 back as one list
    assert [st["step"] for st in steps if st["stale_groups_dropped"]] == list(DROPPED_AT)
    assert steps[-1]["learner_idle_frac"] == pytest.approx(0.6 - 0.04 * TRAINING_STEPS)
    assert steps[-1]["update_s"] == pytest.approx(0.5 + 0.05 * TRAINING_STEPS)
    assert body["latest"]["staleness/2"] == 1.0 and body["latest"]["reward_mean"] == TRAIN_CURVE[-1]

    older = (await api.get("/v1/dashboard/training", params={"run_id": "older-run"})).json()
    assert older["run_id"] == "older-run" and [st["step"] for st in older["steps"]] == [1, 2, 3]
    assert older["steps"][0]["reward_ema"] is None  # not reported by that run: no point, not a zero
    unknown = (await api.get("/v1/dashboard/training", params={"run_id": "no-such-run"})).json()
    assert unknown["run_id"] == "no-such-run" and unknown["steps"] == [] and len(unknown["runs"]) == 2


async def test_a_long_run_shows_its_latest_steps(
    api: httpx.AsyncClient, store: InMemoryLightningStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_training, "MAX_TRAINING_STEPS", 5)  # the window, small enough to write past it here
    await store.add_metrics([MetricsRecord(run_id="long", step=s, values={"reward_mean": s}) for s in range(12)])
    body = (await api.get("/v1/dashboard/training")).json()
    assert [st["step"] for st in body["steps"]] == [7, 8, 9, 10, 11] and body["earlier"] == 7
    assert body["steps"][0]["staleness"] == [] and body["steps"][0]["stale_groups_dropped"] == 0.0
