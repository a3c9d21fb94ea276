"""The store routes' direct argument binding: used for ordinary JSON requests, and answering like FastAPI's solver."""

from __future__ import annotations

from typing import Any

import fastapi.routing
import httpx
import pytest

from tests.core.server.test_api import _running_attempt, _span  # pyright: ignore[reportPrivateUsage] -- shared shapes

# FastAPI parses "+json" media types as JSON too, but only "application/json" takes the direct path: the same body
# sent both ways must get the same answer.
DIRECT = {"content-type": "application/json"}
GENERIC = {"content-type": "application/vnd.agentlightning+json"}


async def test_ordinary_requests_skip_fastapis_solver(api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    async def solver_must_not_run(**_: Any) -> Any:
        raise AssertionError("FastAPI's dependency solver ran for an ordinary request")

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", solver_must_not_run)
    rollout_id, attempt_id = await _running_attempt(api)  # enqueue, claim, start: body, header and path params
    spans = await api.post(
        "/v1/spans", params={"response": "sequence_ids"}, json={"spans": [_span(rollout_id, attempt_id, 0)]}
    )
    assert spans.json() == [1]
    queried = await api.get(f"/v1/rollouts/{rollout_id}/spans", params={"limit": 1, "attempt_id": "latest"})
    assert [s["sequence_id"] for s in queried.json()] == [1]
    finished = await api.post(f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish", json={"status": "succeeded"})
    assert finished.json()["status"] == "succeeded"


@pytest.mark.parametrize(
    ("path", "body", "status", "names"),
    [
        ("/v1/rollouts", b'{"requests": [', 400, "not valid JSON"),
        ("/v1/rollouts", b'{"requests": [{"input": "\\ud800"}]}', 400, "not valid JSON"),
        ("/v1/rollouts", b'{"requests": "not a list"}', 422, "requests"),
        ("/v1/rollouts", b'{"requests": [], "extra": 1}', 422, "extra"),
        ("/v1/rollouts/claim", b'{"timeout_s": -1}', 422, "timeout_s"),
        ("/v1/rollouts/query", b'{"limit": 1180591620717411303424}', 422, "limit"),
        ("/v1/spans", b'{"spans": [{"name": 3}]}', 422, "rollout_id"),
        ("/v1/spans?response=everything", b'{"spans": []}', 422, "response"),
    ],
)
async def test_direct_and_generic_paths_answer_alike(
    api: httpx.AsyncClient, path: str, body: bytes, status: int, names: str
) -> None:
    direct = await api.post(path, content=body, headers=DIRECT)
    generic = await api.post(path, content=body, headers=GENERIC)
    assert direct.status_code == generic.status_code == status, (direct.text, generic.text)
    assert names in direct.json()["detail"] and names in generic.json()["detail"]
    if status == 422:  # the same fields; JSON-mode wording and error types may differ ("array" for "list")

        def where(errors: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
            return [tuple(e["loc"]) for e in errors]

        assert where(direct.json()["errors"]) == where(generic.json()["errors"])


async def test_bad_query_value_is_422_naming_it(api: httpx.AsyncClient) -> None:
    rollout_id, _ = await _running_attempt(api)
    response = await api.get(f"/v1/rollouts/{rollout_id}/spans", params={"limit": -1})
    assert response.status_code == 422 and "limit" in response.json()["detail"]


async def test_empty_or_untyped_body_takes_the_generic_path(api: httpx.AsyncClient) -> None:
    missing = await api.post("/v1/rollouts/claim", content=b"", headers=DIRECT)
    assert missing.status_code == 422 and "body" in missing.json()["detail"]
    untyped = await api.post("/v1/rollouts/claim", content=b'{"worker_id": "w"}')
    assert untyped.status_code == 422  # FastAPI does not parse a body without a JSON content type
