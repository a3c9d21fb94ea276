"""The dashboard's JSON endpoints and asset serving, in process over ASGI (no browser needed)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from agentlightning import semconv
from agentlightning.adapter import CreditInput, TraceAdapter
from agentlightning.dashboard import mount_dashboard
from agentlightning.server import create_app
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import LLM, AttributeValue, PromptTemplate, Span

T0 = 1_700_000_000_000_000_000
_ids = itertools.count(1)


class Clock:
    """A store clock the test moves by hand (ns)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _span(rollout_id: str, attempt_id: str, name: str, at_ms: int, **attributes: AttributeValue) -> Span:
    start = T0 + at_ms * 1_000_000
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id="a" * 32,
        span_id=f"{next(_ids):016x}",
        name=name,
        start_time=start,
        end_time=start + 1_000_000,
        attributes=attributes,
    )


def _chat(rollout_id: str, attempt_id: str, agent: str, at_ms: int) -> Span:
    return _span(
        rollout_id,
        attempt_id,
        "chat",
        at_ms,
        **{
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.GEN_AI_AGENT_NAME: agent,
            semconv.GEN_AI_INPUT_MESSAGES: '[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]',
            semconv.GEN_AI_OUTPUT_MESSAGES: "plain text answer",
        },
    )


def _reward(rollout_id: str, attempt_id: str, value: float, at_ms: int) -> Span:
    return _span(rollout_id, attempt_id, semconv.SPAN_REWARD, at_ms, **{semconv.reward_attribute("value"): value})


@pytest.fixture
def clock() -> Clock:
    """The store's clock."""
    return Clock()


@pytest.fixture
def store(clock: Clock) -> InMemoryLightningStore:
    """An empty in-memory store on the fake clock."""
    return InMemoryLightningStore(clock=clock)


@pytest.fixture
async def api(store: InMemoryLightningStore) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the store app (dashboard included), in process."""
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://store") as client:
        yield client


async def _finished(store: InMemoryLightningStore, spans: Any, mode: Any = "train", worker: str = "w1") -> str:
    rollout = await store.enqueue_rollout({"q": 1}, mode=mode)
    claimed = await store.claim_rollout(worker)
    assert claimed is not None
    rid, aid = rollout.rollout_id, claimed.attempt.attempt_id
    await store.start_attempt(rid, aid)
    await store.add_spans(spans(rid, aid))
    await store.finish_attempt(rid, aid, "succeeded")
    return rid


async def test_pages_are_served_without_a_token_and_data_is_not() -> None:
    app = create_app(InMemoryLightningStore(), token="secret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://store") as client:
        index = await client.get("/")
        assert index.status_code == 200 and "text/html" in index.headers["content-type"]
        assert "script-src 'self'" in index.headers["content-security-policy"]
        script = await client.get("/dashboard/js/main.js")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        assert (await client.get("/dashboard/../_api.py")).status_code == 401  # not an asset: the store answers
        assert (await client.get("/v1/dashboard/rollouts")).status_code == 401
        authorized = await client.get("/v1/dashboard/rollouts", headers={"Authorization": "Bearer secret"})
        assert authorized.status_code == 200 and authorized.json()["rows"] == []
        assert (await client.post("/")).status_code == 401  # only GET and HEAD are assets


async def test_detail_marks_transitions_and_credit(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rid = await _finished(
        store,
        lambda r, a: [
            _chat(r, a, "writer", 0),
            _reward(r, a, 0.25, 5),
            _chat(r, a, "checker", 10),
            _reward(r, a, 1.0, 20),
        ],
    )
    detail = (await api.get(f"/v1/dashboard/rollouts/{rid}")).json()
    assert (detail["llm_calls"], detail["transitions"], detail["credit"]) == (2, 2, "per_call")
    calls = [n for n in detail["spans"] if n["kind"] == "llm"]
    assert [(c["agent_name"], c["credit"], c["turn_index"]) for c in calls] == [
        ("writer", 0.25, 0),
        ("checker", 1.0, 1),
    ]
    assert calls[0]["input_messages"] == [{"role": "user", "content": "hi", "tool_calls": [], "tool_call_id": None}]
    assert calls[0]["output_messages"][0]["content"] == "plain text answer"
    assert [(r["value"], r["after_calls"], r["is_final"]) for r in detail["rewards"]] == [
        (0.25, 1, False),
        (1.0, 2, True),
    ]

    only_writer = (
        await api.get(f"/v1/dashboard/rollouts/{rid}", params={"agents": "writer", "credit": "identical"})
    ).json()
    calls = [n for n in only_writer["spans"] if n["kind"] == "llm"]
    assert [(c["transition"], c["selected"], c["credit"]) for c in calls] == [(True, True, 1.0), (False, False, None)]

    bad = await api.get(f"/v1/dashboard/rollouts/{rid}", params={"credit": "nope"})
    assert bad.status_code == 422 and "registered" in bad.json()["detail"]
    assert (await api.get("/v1/dashboard/rollouts/ro-missing")).status_code == 404
    assert (await api.get(f"/v1/dashboard/rollouts/{rid}", params={"attempt_id": "at-x"})).status_code == 404


async def test_adapter_failure_is_reported_not_raised(store: InMemoryLightningStore) -> None:
    def broken(data: CreditInput) -> list[float]:
        raise RuntimeError("credit exploded")

    app = FastAPI()
    mount_dashboard(app, store, adapter=TraceAdapter(credit=broken))
    rid = await _finished(store, lambda r, a: [_chat(r, a, "writer", 0), _reward(r, a, 1.0, 5)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://store") as client:
        detail = (await client.get(f"/v1/dashboard/rollouts/{rid}")).json()
    assert detail["adapter_error"] == "RuntimeError: credit exploded"
    assert len(detail["spans"]) == 2  # the tree is still shown


async def test_table_follows_new_spans_and_retries(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout = await store.enqueue_rollout({"q": 1}, mode="val", max_attempts=2, retry_on=("failed",))
    claimed = await store.claim_rollout("w1")
    assert claimed is not None
    rid, aid = rollout.rollout_id, claimed.attempt.attempt_id
    await store.add_spans([_chat(rid, aid, "planner", 0)])
    row = (await api.get("/v1/dashboard/rollouts")).json()["rows"][0]
    assert (row["agents"], row["reward"], row["spans"], row["llm_calls"]) == (["planner"], None, 1, 1)
    await store.add_spans([_reward(rid, aid, 0.5, 5)])
    row = (await api.get("/v1/dashboard/rollouts")).json()["rows"][0]
    assert (row["reward"], row["spans"]) == (0.5, 2)

    await store.finish_attempt(rid, aid, "failed")  # requeued: the second attempt starts from nothing
    retry = await store.claim_rollout("w2")
    assert retry is not None
    page = (await api.get("/v1/dashboard/rollouts", params={"agent": "planner"})).json()
    assert page["rows"] == []  # the new attempt has no planner span yet
    await store.add_spans([_chat(rid, retry.attempt.attempt_id, "solver", 10)])
    row = (await api.get("/v1/dashboard/rollouts", params={"agent": "solver", "mode": "val"})).json()["rows"][0]
    assert (row["attempts"], row["worker_id"], row["reward"], row["agents"]) == (2, "w2", None, ["solver"])
    assert (await api.get("/v1/dashboard/rollouts", params={"mode": "train"})).json()["rows"] == []
    assert (await api.get("/v1/dashboard/rollouts", params={"status": "bogus"})).status_code == 422


async def test_paging_newest_first(api: httpx.AsyncClient, store: InMemoryLightningStore, clock: Clock) -> None:
    ids: list[str] = []
    for i in range(5):
        clock.now += 1_000
        ids.append((await store.enqueue_rollout({"i": i})).rollout_id)
    first = (await api.get("/v1/dashboard/rollouts", params={"limit": 2})).json()
    second = (await api.get("/v1/dashboard/rollouts", params={"limit": 2, "offset": 4})).json()
    assert [r["rollout_id"] for r in first["rows"]] == ids[::-1][:2] and first["has_more"]
    assert [r["rollout_id"] for r in second["rows"]] == [ids[0]] and not second["has_more"]


async def test_curve_resources_and_workers(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    v1 = await store.add_resources(
        {"p": PromptTemplate(template="a\nb"), "llm": LLM(base_url="http://x/v1", model="m", api_key="sk-hidden")}
    )
    await store.add_resources({"p": PromptTemplate(template="a\nc"), "llm": LLM(base_url="http://x/v1", model="m")})
    await _finished(store, lambda r, a: [_reward(r, a, 0.1, 0)], mode="train")
    await _finished(store, lambda r, a: [_reward(r, a, 0.9, 0)], mode="val", worker="w2")
    await _finished(store, lambda r, a: [_chat(r, a, "x", 0)], mode="train")  # no reward: no point
    stuck = await store.enqueue_rollout({"q": 2})
    assert (await store.claim_rollout("w3")) is not None

    curve = (await api.get("/v1/dashboard/curve", params={"points": "true"})).json()
    assert [(p["mode"], p["reward"], p["resources_version"]) for p in curve["points"]] == [
        ("train", 0.1, 2),
        ("val", 0.9, 2),
    ]
    assert [(s["mode"], [(st["version"], st["count"], st["mean"]) for st in s["steps"]]) for s in curve["series"]] == [
        ("train", [(2, 1, 0.1)]),
        ("val", [(2, 1, 0.9)]),
    ]
    assert (curve["rewarded"], curve["scanned"], curve["unread"]) == (2, 4, 0)
    assert (await api.get("/v1/dashboard/curve")).json()["points"] == []  # raw points only on demand

    history = await api.get("/v1/dashboard/resources")
    assert "sk-hidden" not in history.text
    versions = history.json()["versions"]
    assert [v["version"] for v in versions] == [2, 1] and versions[1]["resources_id"] == v1.resources_id
    prompt = next(i for i in versions[0]["items"] if i["name"] == "p")
    assert prompt["changed"] and prompt["diff"] == ["@@ -1,2 +1,2 @@", " a", "-b", "+c"]
    assert versions[0]["rollouts"] == 4
    assert versions[0]["changed"] == ["llm", "p"] and versions[1]["changed"] == ["llm", "p"]
    llm = next(i for i in versions[0]["items"] if i["name"] == "llm")
    assert llm["field_changes"] == [{"field": "api_key", "before": "(hidden)", "after": "(hidden, changed)"}]

    # The store clock stands in 2023, so w3's live attempt has been silent for years by the wall clock.
    workers = {w["worker_id"]: w for w in (await api.get("/v1/dashboard/workers")).json()["workers"]}
    assert workers["w3"]["state"] == "silent" and workers["w3"]["current_rollouts"] == [stuck.rollout_id]
    assert (workers["w1"]["succeeded"], workers["w1"]["state"]) == (2, "idle")
