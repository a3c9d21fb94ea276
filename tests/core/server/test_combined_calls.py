"""The combined REST calls a runner makes: claim with ``start``, finish carrying the last ``spans`` (over ASGI)."""

from __future__ import annotations

import httpx
import pytest

from agentlightning.store.memory import InMemoryLightningStore
from tests.core.server.conftest import MAX_SPANS
from tests.core.server.test_api import _span  # pyright: ignore[reportPrivateUsage] -- one span shape for the API


async def _claimed_and_started(api: httpx.AsyncClient) -> tuple[str, str]:
    assert (await api.post("/v1/rollouts", json={"requests": [{"input": 1}]})).status_code == 200
    claimed = await api.post("/v1/rollouts/claim", json={"worker_id": "w", "start": True})
    assert claimed.status_code == 200, claimed.text
    body = claimed.json()
    assert body["rollout"]["status"] == "running" and body["attempt"]["status"] == "running"
    return body["rollout"]["rollout_id"], body["attempt"]["attempt_id"]


async def test_claim_with_start_then_finish_with_spans(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout_id, attempt_id = await _claimed_and_started(api)
    spans = [_span(rollout_id, attempt_id, i) for i in range(3)]
    finish = f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish"
    response = await api.post(finish, json={"status": "succeeded", "spans": spans})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"
    assert [s.name for s in await store.query_spans(rollout_id)] == ["step-0", "step-1", "step-2"]
    assert (await store.get_rollout(rollout_id)).status == "succeeded"
    metrics = (await api.get("/metrics")).text
    assert 'agentlightning_spans_ingested_total{source="rest"} 3.0' in metrics


async def test_claim_with_start_on_empty_queue_is_null(api: httpx.AsyncClient) -> None:
    response = await api.post("/v1/rollouts/claim", json={"start": True})
    assert response.status_code == 200 and response.json() is None


async def test_finish_with_too_many_spans_is_413_and_finishes_nothing(
    api: httpx.AsyncClient, store: InMemoryLightningStore
) -> None:
    rollout_id, attempt_id = await _claimed_and_started(api)
    spans = [_span(rollout_id, attempt_id, i) for i in range(MAX_SPANS + 1)]
    response = await api.post(
        f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish", json={"status": "succeeded", "spans": spans}
    )
    assert response.status_code == 413 and f"at most {MAX_SPANS}" in response.json()["detail"]
    assert (await store.get_rollout(rollout_id)).status == "running"
    assert await store.query_spans(rollout_id) == []


@pytest.mark.parametrize(
    ("body", "names"),
    [({"status": "succeeded", "spans": [{"name": 3}]}, "rollout_id"), ({"status": "done"}, "status")],
)
async def test_bad_finish_body_is_422_naming_the_field(
    api: httpx.AsyncClient, store: InMemoryLightningStore, body: dict[str, object], names: str
) -> None:
    rollout_id, attempt_id = await _claimed_and_started(api)
    response = await api.post(f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish", json=body)
    assert response.status_code == 422, response.text
    assert names in response.json()["detail"]
    assert (await store.get_rollout(rollout_id)).status == "running"


async def test_finish_with_spans_is_idempotent_under_a_key(
    api: httpx.AsyncClient, store: InMemoryLightningStore
) -> None:
    rollout_id, attempt_id = await _claimed_and_started(api)
    body = {"status": "succeeded", "spans": [_span(rollout_id, attempt_id, 0)]}
    path = f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish"
    first = await api.post(path, json=body, headers={"idempotency-key": "k1"})
    again = await api.post(path, json=body, headers={"idempotency-key": "k1"})
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    assert len(await store.query_spans(rollout_id)) == 1
