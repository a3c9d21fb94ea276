"""The metrics routes over a real loopback server: round trip through the project's client, and the edge's refusals.

The store conformance suite already runs every metrics behaviour through ``LightningStoreClient → server → SQLite``
(``test_conformance_http.py``); these tests check what only the HTTP edge does: limits, auth, NaN in a raw body,
the OpenAPI spec, and that a retried write (the client's retry after a lost answer) stores one record.
"""

from __future__ import annotations

import httpx
import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import MetricsRecord
from tests.core.server.conftest import MAX_SPANS, TOKEN

T0 = 1_700_000_000_000_000_000


def _records(run_id: str, steps: range) -> list[MetricsRecord]:
    return [
        MetricsRecord(run_id=run_id, step=s, time=T0 + s, values={"reward_mean": s / 10, "staleness/0": 4.0})
        for s in steps
    ]


async def test_client_round_trip_and_paging(server: StoreServer, store: InMemoryLightningStore) -> None:
    client = LightningStoreClient(server.url)
    try:
        await client.add_metrics(_records("run-1", range(1, 6)))
        await client.add_metrics(_records("run-1", range(3, 4)))  # a resumed run logs step 3 again: replaced
        assert [r.step for r in await client.query_metrics("run-1", after_step=2, limit=2)] == [3, 4]
        assert await client.query_metrics("run-1") == await store.query_metrics("run-1")  # what the store holds
        [run] = await client.list_metric_runs()
        assert (run.run_id, run.steps, run.last_step, run.last_time) == ("run-1", 5, 5, T0 + 5)
        assert await client.query_metrics("no-such-run") == []
    finally:
        await client.close()


async def test_raw_bodies_are_checked_at_the_edge(server: StoreServer, store: InMemoryLightningStore) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        nan = b'{"records": [{"run_id": "r", "step": 1, "values": {"loss": NaN}}]}'
        answer = await http.post("/v1/metrics", content=nan, headers={"content-type": "application/json"})
        assert answer.status_code == 400
        assert "records[0].values.loss is NaN" in answer.json()["detail"]
        twice = {"records": [{"run_id": "r", "step": 1}, {"run_id": "r", "step": 1}]}
        answer = await http.post("/v1/metrics", json=twice)
        assert answer.status_code == 422 and "records 0 and 1 are both run 'r' step 1" in answer.json()["detail"]
        negative = await http.post("/v1/metrics", json={"records": [{"run_id": "r", "step": -1}]})
        assert negative.status_code == 422 and "records.0.step" in negative.json()["detail"]
        many = {"records": [{"run_id": "r", "step": s} for s in range(MAX_SPANS + 1)]}
        answer = await http.post("/v1/metrics", json=many)
        assert answer.status_code == 413 and "smaller batches" in answer.json()["detail"]
        bad_query = await http.get("/v1/metrics", params={"after_step": -1})
        assert bad_query.status_code == 422
        ok = await http.post("/v1/metrics", json={"records": [{"run_id": "r", "step": 2, "values": {"x": 1}}]})
        assert ok.status_code == 200 and ok.json() == {"stored": 1}
    assert [(r.step, r.values) for r in await store.query_metrics()] == [(2, {"x": 1.0})]


def test_metrics_routes_need_the_token_and_are_in_the_spec() -> None:
    with StoreServer(InMemoryLightningStore(), token=TOKEN) as server:
        body = {"records": [{"run_id": "r", "step": 0}]}
        assert httpx.post(f"{server.url}/v1/metrics", json=body).status_code == 401
        assert httpx.get(f"{server.url}/v1/metrics/runs").status_code == 401
        headers = {"authorization": f"Bearer {TOKEN}"}
        assert httpx.post(f"{server.url}/v1/metrics", json=body, headers=headers).status_code == 200
        runs = httpx.get(f"{server.url}/v1/metrics/runs", headers=headers).json()
        assert [r["run_id"] for r in runs] == ["r"]
        spec = httpx.get(f"{server.url}/openapi.json", headers=headers).json()
        assert {"/v1/metrics", "/v1/metrics/runs"} <= set(spec["paths"])
        assert set(spec["paths"]["/v1/metrics"]) == {"get", "post"}


class _LosesFirstAnswer(httpx.AsyncBaseTransport):
    """Forwards every request, but answers the first POST with a connection error after the server acted on it."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.posts = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST":
            self.posts += 1
            if self.posts == 1:
                await response.aclose()
                raise httpx.ReadError("connection dropped after the write", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_write_retried_after_a_lost_answer_stores_one_record(
    server: StoreServer, store: InMemoryLightningStore
) -> None:
    transport = _LosesFirstAnswer()
    client = LightningStoreClient(server.url, transport_factory=lambda: transport, backoff_s=0.01)
    try:
        await client.add_metrics(_records("r", range(2)))
    finally:
        await client.close()
    assert transport.posts == 2  # the client sent it again ...
    assert [(r.run_id, r.step) for r in await store.query_metrics()] == [("r", 0), ("r", 1)]  # ... stored once


@pytest.mark.parametrize("limit", [0, 1])
async def test_limit_is_passed_through(server: StoreServer, limit: int) -> None:
    client = LightningStoreClient(server.url)
    try:
        await client.add_metrics(_records("r", range(3)))
        assert len(await client.query_metrics(limit=limit)) == limit
    finally:
        await client.close()
