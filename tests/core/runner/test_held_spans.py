"""Held spans: a runner on a remote store sends an attempt's spans with its heartbeats and finish (fewer requests)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import httpx
import pytest

from agentlightning._held_spans import HeldSpanSink
from agentlightning.agent import rollout
from agentlightning.client import LightningStoreClient
from agentlightning.emit import emit_message
from agentlightning.runner import Runner
from agentlightning.server import StoreServer
from agentlightning.store import InMemoryLightningStore
from agentlightning.tracing import ListSpanSink, current_rollout
from agentlightning.types import RolloutRequest, Span
from tests.core.runner.agents import COUNTING_SPANS, counting


def _span(attempt_id: str, index: int) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id=attempt_id,
        trace_id=f"{1:032x}",
        span_id=f"{index + 1:016x}",
        name=f"s{index}",
        start_time=1,
        end_time=2,
    )


class _FailingSink:
    def __init__(self) -> None:
        self.fail = True

    def export(self, spans: Any) -> None:
        if self.fail:
            raise ConnectionError("store down")


def test_held_attempts_keep_their_spans_others_pass() -> None:
    inner = ListSpanSink()
    sink = HeldSpanSink(inner)
    sink.hold("ro-1", "at-held")
    sink.export([_span("at-held", 0), _span("at-other", 1), _span("at-held", 2)])
    assert [s.name for s in inner.spans] == ["s1"]
    taken = sink.take("ro-1", "at-held")
    assert [s.name for s in taken] == ["s0", "s2"] and sink.take("ro-1", "at-held") == []
    sink.export([_span("at-held", 3)])
    assert sink.put_back("ro-1", "at-held", taken)
    assert [s.name for s in sink.release("ro-1", "at-held")] == ["s0", "s2", "s3"]
    assert not sink.put_back("ro-1", "at-held", taken)  # released: nothing is held any more
    sink.export([_span("at-held", 4)])
    assert [s.name for s in inner.spans] == ["s1", "s4"]


def test_overfull_attempt_is_sent_at_once_and_kept_when_that_fails() -> None:
    inner = ListSpanSink()
    sink = HeldSpanSink(inner, max_held=3)
    sink.hold("ro-1", "at-1")
    sink.export([_span("at-1", i) for i in range(2)])
    assert inner.spans == []
    sink.export([_span("at-1", 2)])
    assert [s.name for s in inner.spans] == ["s0", "s1", "s2"] and sink.release("ro-1", "at-1") == []

    failing = _FailingSink()
    sink = HeldSpanSink(failing, max_held=2)
    sink.hold("ro-1", "at-1")
    sink.export([_span("at-1", 0)])
    with pytest.raises(ConnectionError):
        sink.export([_span("at-1", 1)])
    assert [s.name for s in sink.release("ro-1", "at-1")] == ["s0", "s1"]  # none lost; the tracer retries the rest
    with pytest.raises(ValueError, match="max_held"):
        HeldSpanSink(inner, max_held=0)


def test_a_bucket_older_than_max_hold_s_goes_out_with_the_next_export() -> None:
    inner = ListSpanSink()
    sink = HeldSpanSink(inner, max_hold_s=0.05)
    sink.hold("ro-1", "at-1")
    sink.export([_span("at-1", 0)])
    assert inner.spans == []
    time.sleep(0.06)
    sink.export([_span("at-1", 1)])  # a killed runner loses at most max_hold_s of trace, not a heartbeat's worth
    assert [s.name for s in inner.spans] == ["s0", "s1"]
    sink.export([_span("at-1", 2)])  # the bucket's clock restarts with its next span
    assert [s.name for s in inner.spans] == ["s0", "s1"] and [s.name for s in sink.release("ro-1", "at-1")] == ["s2"]
    with pytest.raises(ValueError, match="max_hold_s"):
        HeldSpanSink(inner, max_hold_s=0)


class _CountingTransport(httpx.AsyncHTTPTransport):
    """Loopback transport that counts requests per last path segment ("claim", "finish", "spans", ...)."""

    def __init__(self, counts: collections.Counter[str]) -> None:
        super().__init__()
        self.counts = counts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.counts[request.url.path.rsplit("/", 1)[-1]] += 1
        return await super().handle_async_request(request)


async def test_runner_over_http_makes_two_requests_per_short_rollout() -> None:
    store = InMemoryLightningStore()
    counts: collections.Counter[str] = collections.Counter()
    with StoreServer(store) as server:
        client = LightningStoreClient(server.url, transport_factory=lambda: _CountingTransport(counts))
        try:
            rollouts = await store.enqueue_rollouts([RolloutRequest(input={"i": i}) for i in range(12)])
            stats = await Runner(counting, client, n_workers=3).run(max_rollouts=12)
        finally:
            await client.close()
    assert stats.succeeded == 12
    for queued in rollouts:
        assert (await store.get_rollout(queued.rollout_id)).status == "succeeded"
        assert len(await store.query_spans(queued.rollout_id)) == COUNTING_SPANS
    assert counts["finish"] == 12 and 12 <= counts["claim"] <= 15, counts
    assert counts["start"] == counts["spans"] == counts["heartbeat"] == 0, counts


async def test_held_spans_reach_the_store_with_heartbeats() -> None:
    store = InMemoryLightningStore()

    @rollout
    async def waits_to_be_seen(task: dict[str, Any]) -> float:
        emit_message("early")
        context = current_rollout()
        assert context is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the early span must arrive while the agent still runs
            if await store.query_spans(context.rollout_id):
                return 1.0
            await asyncio.sleep(0.02)
        return 0.0

    with StoreServer(store) as server:
        client = LightningStoreClient(server.url)
        try:
            queued = await store.enqueue_rollout({})
            stats = await Runner(waits_to_be_seen, client, heartbeat_interval_s=0.05).run(max_rollouts=1)
        finally:
            await client.close()
    assert stats.succeeded == 1
    rewards = [s for s in await store.query_spans(queued.rollout_id) if s.name != "early"]
    assert any(span.attributes.get("agentlightning.reward.value") == 1.0 for span in rewards), rewards
