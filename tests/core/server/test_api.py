"""The REST API: routes, status codes, error messages, limits, auth and idempotency (in process, over ASGI)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from agentlightning.server import create_app
from agentlightning.store.base import StoreStatistics
from agentlightning.store.memory import InMemoryLightningStore
from tests.core.server.conftest import MAX_BODY, MAX_SPANS, TOKEN

T0 = 1_700_000_000_000_000_000


def _span(rollout_id: str, attempt_id: str, i: int) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "trace_id": "ab" * 16,
        "span_id": f"{i + 1:016x}",
        "name": f"step-{i}",
        "start_time": T0 + i,
        "end_time": T0 + i + 10,
        "attributes": {"gen_ai.operation.name": "chat", "n": i},
    }


async def _running_attempt(api: httpx.AsyncClient) -> tuple[str, str]:
    enqueued = await api.post("/v1/rollouts", json={"requests": [{"input": {"q": "2+2"}}]})
    assert enqueued.status_code == 200, enqueued.text
    claimed = (await api.post("/v1/rollouts/claim", json={"worker_id": "w"})).json()
    rollout_id, attempt_id = claimed["rollout"]["rollout_id"], claimed["attempt"]["attempt_id"]
    started = await api.post(f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/start")
    assert started.json()["status"] == "running"
    return rollout_id, attempt_id


async def _snapshot(store: InMemoryLightningStore) -> tuple[StoreStatistics, list[Any]]:
    rollouts = await store.query_rollouts()
    return await store.statistics(), [r.model_dump() for r in rollouts]


async def test_full_cycle_over_rest(api: httpx.AsyncClient) -> None:
    rollout_id, attempt_id = await _running_attempt(api)
    stored = await api.post("/v1/spans", json={"spans": [_span(rollout_id, attempt_id, i) for i in range(3)]})
    assert [s["sequence_id"] for s in stored.json()] == [1, 2, 3]
    again = await api.post("/v1/spans", json={"spans": [_span(rollout_id, attempt_id, 0)]})
    assert again.json()[0]["sequence_id"] == 1  # idempotent on span id
    finished = await api.post(f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish", json={"status": "succeeded"})
    assert finished.json()["status"] == "succeeded"
    spans = await api.get(f"/v1/rollouts/{rollout_id}/spans", params={"attempt_id": "latest", "limit": 2})
    assert [s["name"] for s in spans.json()] == ["step-0", "step-1"]
    waited = await api.post("/v1/rollouts/wait", json={"rollout_ids": [rollout_id], "timeout_s": 0})
    assert waited.json()[0]["status"] == "succeeded"
    stats = (await api.get("/v1/statistics")).json()
    assert stats["total_spans"] == 3 and stats["rollouts_by_status"] == {"succeeded": 1}


async def test_resources_routes(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/resources/latest")).json() is None
    llm = {"kind": "llm", "base_url": "http://127.0.0.1:1/v1", "model": "m"}
    snapshot = (await api.post("/v1/resources", json={"resources": {"policy": llm}})).json()
    assert snapshot["version"] == 1
    assert (await api.get(f"/v1/resources/{snapshot['resources_id']}")).json() == snapshot
    assert (await api.get("/v1/resources/latest")).json() == snapshot
    assert [s["resources_id"] for s in (await api.get("/v1/resources")).json()] == [snapshot["resources_id"]]
    missing = await api.get("/v1/resources/rs-missing")
    assert missing.status_code == 404 and "rs-missing" in missing.json()["detail"]


async def test_malformed_json_is_400_and_store_unchanged(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    before = await _snapshot(store)
    response = await api.post("/v1/rollouts", content=b'{"requests": [', headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["detail"]
    assert await _snapshot(store) == before


@pytest.mark.parametrize(
    ("path", "body", "names"),
    [
        ("/v1/rollouts", {"requests": "not a list"}, "requests"),
        ("/v1/rollouts", {"requests": [{"input": 1, "config": {"max_attempts": "many"}}]}, "max_attempts"),
        ("/v1/rollouts", {"requests": [], "extra": 1}, "extra"),
        ("/v1/rollouts/claim", {"timeout_s": -1}, "timeout_s"),
        # strict as the spec says: booleans and numbers are not each other (issue 26 D7)
        ("/v1/rollouts/claim", {"start": 0}, "start"),
        ("/v1/rollouts/claim", {"timeout_s": False}, "timeout_s"),
        ("/v1/rollouts/claim", {"worker_id": 7}, "worker_id"),
        ("/v1/rollouts/query", {"limit": 2**70}, "limit"),
        ("/v1/spans", {"spans": [{"name": 3}]}, "rollout_id"),
    ],
)
async def test_wrong_types_are_422_naming_the_field(
    api: httpx.AsyncClient, store: InMemoryLightningStore, path: str, body: dict[str, Any], names: str
) -> None:
    before = await _snapshot(store)
    response = await api.post(path, json=body)
    assert response.status_code == 422, response.text
    assert names in response.json()["detail"]
    assert await _snapshot(store) == before


async def test_strict_bodies_still_take_ints_for_floats(api: httpx.AsyncClient) -> None:
    response = await api.post("/v1/rollouts/claim", json={"timeout_s": 0, "start": True})
    assert response.status_code == 200, response.text


async def test_unknown_ids_are_404_with_the_id(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    before = await _snapshot(store)
    for response in (
        await api.get("/v1/rollouts/ro-nope"),
        await api.post("/v1/rollouts/ro-nope/cancel"),
        await api.post("/v1/rollouts/ro-nope/attempts/at-nope/start"),
        await api.post("/v1/spans", json={"spans": [_span("ro-nope", "at-nope", 0)]}),
    ):
        assert response.status_code == 404, response.text
        assert "ro-nope" in response.json()["detail"]
        assert response.headers["x-agentlightning-error"] == "NotFoundError"
    assert await _snapshot(store) == before


async def test_illegal_transition_is_409(api: httpx.AsyncClient) -> None:
    rollout_id, attempt_id = await _running_attempt(api)
    path = f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}"
    assert (await api.post(f"{path}/finish", json={"status": "succeeded"})).status_code == 200
    response = await api.post(f"{path}/start")
    assert response.status_code == 409
    assert response.headers["x-agentlightning-error"] == "IllegalTransitionError"
    assert attempt_id in response.json()["detail"] or rollout_id in response.json()["detail"]


async def test_oversize_body_is_413_naming_the_limit(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    before = await _snapshot(store)
    big = orjson.dumps({"requests": [{"input": "x" * MAX_BODY}]})
    response = await api.post("/v1/rollouts", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert str(MAX_BODY) in response.json()["detail"]

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: the streaming guard must catch it
        for _ in range(3):
            yield big[: MAX_BODY // 2]

    streamed = await api.post("/v1/rollouts", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert str(MAX_BODY) in streamed.json()["detail"]
    assert await _snapshot(store) == before


async def test_too_many_spans_is_413_naming_the_limit(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout_id, attempt_id = await _running_attempt(api)
    before = await _snapshot(store)
    spans = [_span(rollout_id, attempt_id, i) for i in range(MAX_SPANS + 1)]
    response = await api.post("/v1/spans", json={"spans": spans})
    assert response.status_code == 413
    assert f"at most {MAX_SPANS}" in response.json()["detail"]
    assert await _snapshot(store) == before


async def test_auth_missing_wrong_and_right_token(store: InMemoryLightningStore) -> None:
    app = create_app(store, token=TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://store") as api:
        missing = await api.post("/v1/rollouts", json={"requests": [{"input": 1}]})
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in missing.json()["detail"]
        wrong = await api.get("/v1/statistics", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 403 and "not valid" in wrong.json()["detail"]
        scheme = await api.get("/v1/statistics", headers={"authorization": f"Basic {TOKEN}"})
        assert scheme.status_code == 403
        assert (await api.get("/metrics")).status_code == 401
        assert (await api.get("/health")).json()["status"] == "ok"
        assert (await store.statistics()).total_rollouts == 0
        right = await api.get("/v1/statistics", headers={"authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200


async def test_idempotency_key_acts_once(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    headers = {"idempotency-key": "k-1"}
    body = {"requests": [{"input": 1}, {"input": 2}]}
    first, second = await asyncio.gather(
        api.post("/v1/rollouts", json=body, headers=headers), api.post("/v1/rollouts", json=body, headers=headers)
    )
    third = await api.post("/v1/rollouts", json=body, headers=headers)
    assert first.json() == second.json() == third.json()
    assert (await store.statistics()).total_rollouts == 2
    other = await api.post("/v1/rollouts", json=body, headers={"idempotency-key": "k-2"})
    assert other.status_code == 200 and (await store.statistics()).total_rollouts == 4


async def test_claim_long_poll_wakes_on_enqueue(api: httpx.AsyncClient) -> None:
    claim = asyncio.ensure_future(api.post("/v1/rollouts/claim", json={"worker_id": "w", "timeout_s": 1.5}))
    await asyncio.sleep(0.1)
    assert not claim.done()
    await api.post("/v1/rollouts", json={"requests": [{"input": "late"}]})
    loop = asyncio.get_running_loop()
    started = loop.time()
    claimed = (await claim).json()
    assert claimed["rollout"]["input"] == "late"
    assert loop.time() - started < 0.5
    empty = await api.post("/v1/rollouts/claim", json={"timeout_s": 0.05})
    assert empty.status_code == 200 and empty.json() is None


class _BrokenStore(InMemoryLightningStore):
    async def statistics(self) -> StoreStatistics:
        raise RuntimeError("secret internals at /srv/store.db")


async def test_unknown_exception_is_500_without_internals() -> None:
    app = create_app(_BrokenStore())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://store") as api:
        response = await api.get("/v1/statistics")
    assert response.status_code == 500
    assert "secret" not in response.text and "server log" in response.json()["detail"]


async def test_openapi_lists_every_operation(api: httpx.AsyncClient) -> None:
    spec = (await api.get("/openapi.json")).json()
    paths = set(spec["paths"])
    for path in (
        "/v1/rollouts",
        "/v1/rollouts/claim",
        "/v1/rollouts/query",
        "/v1/rollouts/wait",
        "/v1/rollouts/{rollout_id}",
        "/v1/rollouts/{rollout_id}/cancel",
        "/v1/rollouts/{rollout_id}/metadata",
        "/v1/rollouts/{rollout_id}/attempts",
        "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/start",
        "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish",
        "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/heartbeat",
        "/v1/rollouts/{rollout_id}/spans",
        "/v1/spans",
        "/v1/resources",
        "/v1/resources/latest",
        "/v1/resources/{resources_id}",
        "/v1/watchdog/check",
        "/v1/statistics",
        "/v1/traces",
        "/health",
        "/metrics",
    ):
        assert path in paths, path


async def test_gzip_rest_body_is_not_silently_accepted(api: httpx.AsyncClient) -> None:
    # REST bodies are plain JSON; a compressed body must fail loudly, not be parsed as garbage.
    body = gzip.compress(orjson.dumps({"requests": [{"input": 1}]}))
    response = await api.post("/v1/rollouts", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400


async def test_compact_span_answer_returns_stored_span_when_it_differs(api: httpx.AsyncClient) -> None:
    rollout_id, attempt_id = await _running_attempt(api)
    spans = [_span(rollout_id, attempt_id, i) for i in range(2)]
    first = await api.post("/v1/spans", params={"response": "sequence_ids"}, json={"spans": spans})
    assert first.json() == [1, 2]
    changed = {**spans[1], "name": "renamed"}
    again = await api.post("/v1/spans", params={"response": "sequence_ids"}, json={"spans": [spans[0], changed]})
    same, stored = again.json()
    assert same == 1
    assert stored["name"] == "step-1" and stored["sequence_id"] == 2  # the store keeps the first version


async def test_lone_surrogates_are_rejected_at_the_edge(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    # Valid JSON for Python's json module, but not UTF-8: it could not be stored or answered later.
    body = b'{"requests": [{"input": "\\ud800"}]}'
    response = await api.post("/v1/rollouts", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["detail"]
    assert (await store.statistics()).total_rollouts == 0


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v1/resources", "GET, POST"),  # two routes on one path: Starlette named only the first (POST)
        ("PUT", "/v1/rollouts", "POST"),
        ("GET", "/v1/traces", "POST"),
        ("PUT", "/v1/resources/rs-1", "GET"),
    ],
)
async def test_405_allow_names_every_method_of_the_path(
    api: httpx.AsyncClient, method: str, path: str, allowed: str
) -> None:
    response = await api.request(method, path)
    assert response.status_code == 405
    assert response.headers.get_list("allow") == [allowed]
