"""Whole-run reward curves and resource counts: per-step statistics computed on the server, incrementally."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from typing import Literal

import httpx
import pytest

from agentlightning import semconv
from agentlightning.dashboard import _digest
from agentlightning.dashboard._curves import RawPoint, RawSample, RewardStats, RunIndex
from agentlightning.dashboard._digest import DigestCache
from agentlightning.server import create_app
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import LLM, PromptTemplate, RolloutMode, Span

T0 = 1_700_000_000_000_000_000
_ids = itertools.count(1)


class Clock:
    """A store clock the test moves by hand (ns)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


class SpanCountingStore(InMemoryLightningStore):
    """The in-memory store, counting span reads (how the tests see that settled rollouts are not read again)."""

    span_reads = 0

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Count the read, then answer as the in-memory store does."""
        self.span_reads += 1
        return await super().query_spans(
            rollout_id, attempt_id, name=name, after_sequence_id=after_sequence_id, limit=limit, offset=offset
        )


@pytest.fixture
def clock() -> Clock:
    """The store's clock, in 2023: every finished rollout has settled by the wall clock."""
    return Clock()


@pytest.fixture
def store(clock: Clock) -> SpanCountingStore:
    """An empty store on the fake clock."""
    return SpanCountingStore(clock=clock)


@pytest.fixture
async def api(store: SpanCountingStore) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the store app (dashboard included), in process."""
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://store") as client:
        yield client


async def _finish_all(store: InMemoryLightningStore, rewards: Sequence[float]) -> None:
    """Run the oldest queued rollouts, one per reward, each ending with one reward span."""
    for value in rewards:
        claimed = await store.claim_and_start("w1")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        span = Span(
            rollout_id=rid,
            attempt_id=aid,
            trace_id="a" * 32,
            span_id=f"{next(_ids):016x}",
            name=semconv.SPAN_REWARD,
            start_time=T0,
            end_time=T0,
            attributes={semconv.reward_attribute("value"): value},
        )
        await store.finish_attempt_with_spans(rid, aid, "succeeded", [span])


async def _rollouts(
    store: InMemoryLightningStore, rewards: Sequence[float], mode: RolloutMode, resources_id: str | None = None
) -> None:
    """Enqueue one rollout per reward and finish them all."""
    for _ in rewards:
        await store.enqueue_rollout({"q": 1}, mode=mode, resources_id=resources_id)
    await _finish_all(store, rewards)


async def test_curve_is_per_step_over_the_whole_run(api: httpx.AsyncClient, store: SpanCountingStore) -> None:
    v1 = await store.add_resources({"p": PromptTemplate(template="a")})
    baseline = [0.0, 1.0, 0.0, 1.0]
    await _rollouts(store, baseline, "val", v1.resources_id)  # the baseline validation, first in the run
    v2 = await store.add_resources({"p": PromptTemplate(template="b")})
    train = [float(i % 2) for i in range(2_010)]  # more than the newest 2,000 the old page looked at
    await _rollouts(store, train, "train", v2.resources_id)
    await store.add_resources({"p": PromptTemplate(template="c")})
    for _ in range(3):
        await store.enqueue_rollout({"q": 2}, mode="train")  # queued, no snapshot yet: on no card, not on the curve

    curve = (await api.get("/v1/dashboard/curve")).json()
    assert (curve["rewarded"], curve["scanned"], curve["unread"]) == (2_014, 2_017, 0)
    assert curve["band"] == "mean ± 1 standard error"
    series = {s["mode"]: s for s in curve["series"]}
    assert [s["mode"] for s in curve["series"]] == ["train", "val"]
    (val,) = series["val"]["steps"]
    assert (val["version"], val["count"], val["mean"], val["low"], val["high"]) == (1, 4, 0.5, 0.0, 1.0)
    assert val["stderr"] == pytest.approx(statistics.stdev(baseline) / math.sqrt(4))
    (step,) = series["train"]["steps"]
    assert (step["version"], step["count"], step["mean"]) == (2, 2_010, 0.5)
    assert step["stderr"] == pytest.approx(statistics.stdev(train) / math.sqrt(len(train)))

    cards = {v["version"]: v["rollouts"] for v in (await api.get("/v1/dashboard/resources")).json()["versions"]}
    assert cards == {3: 0, 2: 2_010, 1: 4}  # every rollout, not the newest 500

    # Settled rollouts are folded once: later refreshes list rollouts but read no spans again.
    reads = store.span_reads
    again = (await api.get("/v1/dashboard/curve")).json()
    assert store.span_reads == reads and again["series"] == curve["series"]


async def test_a_long_first_read_is_partial_and_says_so(store: SpanCountingStore) -> None:
    await _rollouts(store, [1.0] * 30, "train")
    index = RunIndex(store, DigestCache(store), max_reads=10)
    first = await index.view()
    assert first.unread > 0 and first.scanned + first.unread == 30
    views = [await index.view() for _ in range(5)]
    assert views[-1].unread == 0 and views[-1].scanned == 30
    assert views[-1].stats[("train", None)].count == 30  # nothing counted twice across the partial reads


async def test_live_rollouts_are_counted_once_until_they_settle(
    store: SpanCountingStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock.now = time.time_ns()  # finished "now": within SETTLE_S, so not folded yet
    await _rollouts(store, [0.25, 0.75], "train")
    await store.enqueue_rollout({"q": 3}, mode="train")
    index = RunIndex(store, DigestCache(store))
    for _ in range(2):
        view = await index.view()
        assert view.stats[("train", None)].count == 2 and len(view.points) == 2
    monkeypatch.setattr(_digest, "SETTLE_S", 0.0)
    for _ in range(2):
        view = await index.view()
        assert view.stats[("train", None)].count == 2 and view.stats[("train", None)].mean == 0.5
        assert len(view.points) == 2 and view.points_total == 2


async def test_raw_points_are_sampled_evenly_and_the_page_is_told(api: httpx.AsyncClient) -> None:
    sample = RawSample(cap=8)
    for i in range(40):
        sample.add(RawPoint(f"ro-{i}", "train", None, float(i), "succeeded"))
    assert sample.stride == 8 and [p.reward for p in sample.points] == [0.0, 8.0, 16.0, 24.0, 32.0]
    assert sample.seen == 40

    merged = RewardStats()
    halves = (RewardStats(), RewardStats())
    for i, value in enumerate([0.0, 1.0, 1.0, 0.5, 0.25]):
        merged.add(value)
        halves[i % 2].add(value)
    combined = halves[0].merged(halves[1])
    assert (combined.count, combined.low, combined.high) == (5, 0.0, 1.0)
    assert combined.mean == pytest.approx(merged.mean) and combined.stderr == pytest.approx(merged.stderr)

    curve = (await api.get("/v1/dashboard/curve", params={"points": "true"})).json()
    assert (curve["series"], curve["points"], curve["points_stride"]) == ([], [], 1)


async def test_llm_changes_are_listed_field_by_field(api: httpx.AsyncClient, store: SpanCountingStore) -> None:
    await store.add_resources({"llm": LLM(base_url="http://a/v1", model="m", weights_version=0)})
    await store.add_resources(
        {"llm": LLM(base_url="http://b/v1", model="m", weights_version=1, sampling={"temperature": 0.7})}
    )
    await store.add_resources(
        {"llm": LLM(base_url="http://b/v1", model="m", weights_version=1, sampling={"temperature": 0.7})}
    )
    versions = (await api.get("/v1/dashboard/resources")).json()["versions"]
    assert [v["changed"] for v in versions] == [[], ["llm"], ["llm"]]
    changes = versions[1]["items"][0]["field_changes"]
    assert [(c["field"], c["before"], c["after"]) for c in changes] == [
        ("base_url", "http://a/v1", "http://b/v1"),
        ("weights_version", "0", "1"),
        ("sampling", "{}", '{"temperature": 0.7}'),
    ]
