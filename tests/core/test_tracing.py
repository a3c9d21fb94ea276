"""The tracing pipeline: rollout context, stamping, batched delivery, failing/hanging sinks, flush, global helpers."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlightning import semconv
from agentlightning.store import InMemoryLightningStore, LightningStore, SqliteLightningStore
from agentlightning.tracing import (
    LightningTracer,
    ListSpanSink,
    RolloutContext,
    StoreSpanSink,
    current_rollout,
    get_lightning_tracer,
    get_tracer,
    init_tracing,
    rollout_context,
    shutdown_tracing,
)
from agentlightning.types import Span


@pytest.fixture
def sink() -> ListSpanSink:
    return ListSpanSink()


@pytest.fixture
def tracer(sink: ListSpanSink) -> Iterator[LightningTracer]:
    tracer = LightningTracer(sink, export_interval_s=0.05)
    yield tracer
    tracer.shutdown()


class RaisingSink:
    """Always fails, like a store that is down."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[Span]) -> None:
        self.calls += 1
        raise ConnectionError("store is down")


class HangingSink:
    """Blocks until released, like a store that stopped answering."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.received: list[Span] = []

    def export(self, spans: Sequence[Span]) -> None:
        self.entered.set()
        self.release.wait(30)
        self.received.extend(spans)


class BatchRecordingSink(ListSpanSink):
    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    def export(self, spans: Sequence[Span]) -> None:
        self.batch_sizes.append(len(spans))
        super().export(spans)


def _drop_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "agentlightning.tracing" and r.levelno == logging.WARNING]


# --- rollout context ----------------------------------------------------------------------------------------------
def test_rollout_context_sets_and_restores() -> None:
    assert current_rollout() is None
    with rollout_context("ro-1", "at-1") as outer:
        assert current_rollout() == outer == RolloutContext("ro-1", "at-1")
        with rollout_context("ro-2", "at-2"):
            assert current_rollout() == RolloutContext("ro-2", "at-2")
        assert current_rollout() == outer
    assert current_rollout() is None


@pytest.mark.parametrize(
    ("rollout_id", "attempt_id", "field"), [("", "at-1", "rollout_id"), ("ro-1", None, "attempt_id")]
)
def test_rollout_context_rejects_bad_ids(rollout_id: str, attempt_id: str, field: str) -> None:
    with pytest.raises(ValueError, match=field), rollout_context(rollout_id, attempt_id):
        pass


def test_rollout_context_follows_copied_context_into_threads() -> None:
    with rollout_context("ro-t", "at-t"):
        ctx = contextvars.copy_context()
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(ctx.run, current_rollout).result() == RolloutContext("ro-t", "at-t")
        assert pool.submit(current_rollout).result() is None  # a plain thread does not inherit it


# --- stamping and delivery ----------------------------------------------------------------------------------------
def test_spans_are_stamped_parented_and_delivered(tracer: LightningTracer, sink: ListSpanSink) -> None:
    otel = tracer.get_tracer("t")
    with rollout_context("ro-1", "at-1"), otel.start_as_current_span("parent"), otel.start_as_current_span("child"):
        pass
    assert tracer.flush(10)
    spans = {s.name: s for s in sink.spans}
    assert {(s.rollout_id, s.attempt_id) for s in spans.values()} == {("ro-1", "at-1")}
    assert spans["child"].parent_id == spans["parent"].span_id
    assert spans["child"].attributes[semconv.ROLLOUT_ID] == "ro-1"
    assert tracer.exported_spans == 2 and tracer.dropped_spans == 0


def test_explicit_ids_are_not_overwritten_and_unattributed_spans_are_dropped(
    tracer: LightningTracer, sink: ListSpanSink
) -> None:
    otel = tracer.get_tracer("t")
    explicit = {semconv.ROLLOUT_ID: "ro-hook", semconv.ATTEMPT_ID: "at-hook"}
    with rollout_context("ro-ambient", "at-ambient"), otel.start_as_current_span("hook", attributes=explicit):
        pass
    with otel.start_as_current_span("outside"):
        pass
    assert tracer.flush(10)
    assert [(s.name, s.rollout_id, s.attempt_id) for s in sink.spans] == [("hook", "ro-hook", "at-hook")]
    assert tracer.unattributed_spans == 1 and tracer.dropped_spans == 1


def test_batches_respect_max_batch_size() -> None:
    sink = BatchRecordingSink()
    tracer = LightningTracer(sink, max_batch_size=10, export_interval_s=60)
    otel = tracer.get_tracer("t")
    with rollout_context("ro-1", "at-1"):
        for i in range(35):
            with otel.start_as_current_span(f"s{i}"):
                pass
    assert tracer.flush(10)
    tracer.shutdown()
    assert max(sink.batch_sizes) <= 10 and sum(sink.batch_sizes) == 35
    assert [s.name for s in sink.spans] == [f"s{i}" for i in range(35)]  # queue order is kept


def test_adds_processor_to_users_provider_without_disturbing_it(sink: ListSpanSink) -> None:
    users_exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(users_exporter))
    tracer = LightningTracer(sink, provider=provider)
    assert tracer.provider is provider
    with rollout_context("ro-1", "at-1"), provider.get_tracer("user").start_as_current_span("work"):
        pass
    with provider.get_tracer("user").start_as_current_span("unrelated"):
        pass
    assert tracer.flush(10)
    tracer.shutdown()
    assert [s.name for s in sink.spans] == ["work"]
    assert [s.name for s in users_exporter.get_finished_spans()] == ["work", "unrelated"]
    # our shutdown leaves the user's provider working; our processor ignores later spans
    with rollout_context("ro-1", "at-1"), provider.get_tracer("user").start_as_current_span("after"):
        pass
    assert [s.name for s in sink.spans] == ["work"]
    after = users_exporter.get_finished_spans()[-1]
    assert after.name == "after" and semconv.ROLLOUT_ID not in (after.attributes or {})  # no longer stamped
    provider.shutdown()


# --- concurrency ----------------------------------------------------------------------------------------------------
def _assert_not_mixed(spans: list[Span], expected_count: int) -> None:
    assert len(spans) == expected_count
    for span in spans:
        owner = span.attributes["owner"]
        assert (span.rollout_id, span.attempt_id) == (f"ro-{owner}", f"at-{owner}"), span.name
    by_id = {s.span_id: s for s in spans}
    for span in spans:
        if span.parent_id is not None:
            assert by_id[span.parent_id].rollout_id == span.rollout_id


def test_concurrent_rollouts_in_threads_never_mix(tracer: LightningTracer, sink: ListSpanSink) -> None:
    otel = tracer.get_tracer("t")
    barrier = threading.Barrier(8)

    def run(worker: int) -> None:
        with rollout_context(f"ro-{worker}", f"at-{worker}"):
            barrier.wait()
            for step in range(25):
                with (
                    otel.start_as_current_span(f"step{step}", attributes={"owner": worker}),
                    otel.start_as_current_span("inner", attributes={"owner": worker}),
                ):
                    time.sleep(0)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tracer.flush(30)
    _assert_not_mixed(sink.spans, 8 * 25 * 2)


async def test_concurrent_rollouts_in_asyncio_tasks_never_mix(tracer: LightningTracer, sink: ListSpanSink) -> None:
    otel = tracer.get_tracer("t")

    async def run(worker: int) -> None:
        with rollout_context(f"ro-{worker}", f"at-{worker}"):
            for step in range(10):
                with otel.start_as_current_span(f"step{step}", attributes={"owner": worker}):
                    await asyncio.sleep(0)
                    # a thread hop with the task's context keeps the rollout
                    await asyncio.to_thread(_child_span, otel, worker)

    await asyncio.gather(*(run(w) for w in range(20)))
    assert await asyncio.to_thread(tracer.flush, 30)
    _assert_not_mixed(sink.spans, 20 * 10 * 2)


def _child_span(otel: object, worker: int) -> None:
    from opentelemetry.trace import Tracer

    assert isinstance(otel, Tracer)
    with otel.start_as_current_span("in-thread", attributes={"owner": worker}):
        pass


# --- failing sinks ------------------------------------------------------------------------------------------------
def test_raising_sink_is_retried_then_dropped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agentlightning.tracing")
    sink = RaisingSink()
    tracer = LightningTracer(
        sink, max_batch_size=5, export_interval_s=0.01, max_export_retries=2, retry_backoff_s=0.001
    )
    otel = tracer.get_tracer("t")
    started = time.monotonic()
    with rollout_context("ro-1", "at-1"):
        for i in range(20):
            with otel.start_as_current_span(f"s{i}"):
                pass
    agent_time = time.monotonic() - started
    assert tracer.flush(10) is False  # everything was processed, but lost
    tracer.shutdown()
    assert agent_time < 2.0
    assert tracer.exported_spans == 0 and tracer.dropped_spans == 20
    assert tracer.failed_exports >= 1 and sink.calls == 3 * tracer.failed_exports  # 1 try + 2 retries per batch
    warnings = _drop_warnings(caplog)
    assert len(warnings) == 1
    assert "ConnectionError: store is down" in warnings[0].getMessage()


def test_hanging_sink_only_fills_the_buffer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agentlightning.tracing")
    sink = HangingSink()
    tracer = LightningTracer(sink, max_queue_size=100, max_batch_size=10, export_interval_s=0.01)
    otel = tracer.get_tracer("t")
    with rollout_context("ro-1", "at-1"):
        with otel.start_as_current_span("first"):
            pass
        assert sink.entered.wait(10)  # the exporter thread is now stuck inside the sink
        started = time.monotonic()
        for i in range(2000):
            with otel.start_as_current_span(f"s{i}"):
                pass
        agent_time = time.monotonic() - started
    # the sink hangs for up to 30 s; the agent must not wait for it
    assert agent_time < 5.0
    assert tracer.dropped_spans == 2000 - 100
    assert tracer.flush(0.2) is False
    warnings = _drop_warnings(caplog)
    assert len(warnings) == 1 and "queue is full" in warnings[0].getMessage()
    sink.release.set()
    tracer.shutdown(timeout_s=10)
    assert tracer.exported_spans == 101 and len(sink.received) == 101


def test_flush_reports_losses_once_then_recovers() -> None:
    sink = HangingSink()
    tracer = LightningTracer(sink, max_queue_size=2, export_interval_s=0.01)
    otel = tracer.get_tracer("t")
    with rollout_context("ro-1", "at-1"):
        with otel.start_as_current_span("first"):
            pass
        assert sink.entered.wait(10)
        for i in range(5):
            with otel.start_as_current_span(f"s{i}"):
                pass
        sink.release.set()
        assert tracer.flush(10) is False  # 3 of them were dropped since the last flush
        with otel.start_as_current_span("later"):
            pass
        assert tracer.flush(10) is True
    tracer.shutdown()
    assert tracer.dropped_spans == 3
    assert [s.name for s in sink.received] == ["first", "s0", "s1", "later"]


def test_shutdown_gives_up_on_a_hanging_sink(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agentlightning.tracing")
    sink = HangingSink()
    tracer = LightningTracer(sink, max_batch_size=1, export_interval_s=0.01)
    otel = tracer.get_tracer("t")
    with rollout_context("ro-1", "at-1"):
        for name in ("stuck", "queued-1", "queued-2"):
            with otel.start_as_current_span(name):
                pass
            assert sink.entered.wait(10)
    started = time.monotonic()
    tracer.shutdown(timeout_s=0.2)
    assert time.monotonic() - started < 10.0
    assert tracer.dropped_spans == 2
    assert "shutdown gave up on 2 spans" in _drop_warnings(caplog)[0].getMessage()
    sink.release.set()  # the span the sink held arrives; the abandoned ones are not waited for
    assert tracer.flush(10) is False
    assert tracer.exported_spans == 1 and [s.name for s in sink.received] == ["stuck"]


def test_shutdown_is_idempotent_and_stops_collection(tracer: LightningTracer, sink: ListSpanSink) -> None:
    otel = tracer.get_tracer("t")
    with rollout_context("ro-1", "at-1"):
        with otel.start_as_current_span("before"):
            pass
        tracer.shutdown()  # delivers what is queued
        tracer.shutdown()
        with otel.start_as_current_span("after"):
            pass
    assert [s.name for s in sink.spans] == ["before"]


def test_invalid_settings_are_rejected(sink: ListSpanSink) -> None:
    with pytest.raises(ValueError, match="max_queue_size"):
        LightningTracer(sink, max_queue_size=0)
    with pytest.raises(ValueError, match="export_interval_s"):
        LightningTracer(sink, export_interval_s=0)


# --- process-global helpers -----------------------------------------------------------------------------------------
def test_get_tracer_without_init_works_but_goes_nowhere() -> None:
    assert get_lightning_tracer() is None
    with rollout_context("ro-1", "at-1"), get_tracer().start_as_current_span("nowhere") as span:
        span.set_attribute("k", "v")
        assert span.is_recording()
        assert span.get_span_context().is_valid


def test_init_tracing_replaces_and_shutdown_clears(sink: ListSpanSink) -> None:
    first_sink = ListSpanSink()
    first = init_tracing(first_sink)
    try:
        assert get_lightning_tracer() is first
        with rollout_context("ro-1", "at-1"), get_tracer("x").start_as_current_span("one"):
            pass
        second = init_tracing(sink)
        assert get_lightning_tracer() is second
        assert [s.name for s in first_sink.spans] == ["one"]  # replaced tracer was flushed on shutdown
        with rollout_context("ro-1", "at-1"), get_tracer("x").start_as_current_span("two"):
            pass
        assert second.flush(10)
        assert [s.name for s in sink.spans] == ["two"]
    finally:
        shutdown_tracing()
    assert get_lightning_tracer() is None


# --- delivery into a real store -------------------------------------------------------------------------------------
async def _running_attempt(store: LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout({"question": "2+2"})
    claimed = await store.claim_rollout("worker-1")
    assert claimed is not None
    await store.start_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


@pytest.fixture(params=["memory", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LightningStore]:
    store: LightningStore = (
        InMemoryLightningStore() if request.param == "memory" else SqliteLightningStore(tmp_path / "store.db")
    )
    yield store
    asyncio.run(store.close())


def test_store_sink_delivers_on_its_own_loop_and_flush_means_stored(any_store: LightningStore) -> None:
    store = any_store
    rollout_id, attempt_id = asyncio.run(_running_attempt(store))
    tracer = LightningTracer(StoreSpanSink(store), export_interval_s=60)  # only flush delivers
    otel = tracer.get_tracer("t")
    with rollout_context(rollout_id, attempt_id):
        for i in range(5):
            with otel.start_as_current_span(f"s{i}"):
                pass
    assert tracer.flush(10)
    stored = asyncio.run(store.query_spans(rollout_id, attempt_id))
    assert [(s.name, s.sequence_id) for s in stored] == [(f"s{i}", i + 1) for i in range(5)]
    assert {(s.rollout_id, s.attempt_id) for s in stored} == {(rollout_id, attempt_id)}
    tracer.shutdown()


async def test_store_sink_on_the_owners_loop_saves_good_spans_of_a_rejected_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "agentlightning.tracing")
    store = InMemoryLightningStore()
    rollout_id, attempt_id = await _running_attempt(store)
    tracer = LightningTracer(StoreSpanSink(store, loop=asyncio.get_running_loop()), export_interval_s=60)
    otel = tracer.get_tracer("t")
    with rollout_context(rollout_id, attempt_id), otel.start_as_current_span("good"):
        pass
    with rollout_context(rollout_id, "at-unknown"), otel.start_as_current_span("bad"):
        pass
    # flush blocks, so it runs in a thread while this loop serves the store's coroutines
    assert await asyncio.to_thread(tracer.flush, 10) is False
    assert [s.name for s in await store.query_spans(rollout_id)] == ["good"]
    assert tracer.exported_spans == 1 and tracer.failed_exports == 1 and tracer.dropped_spans == 1
    (warning,) = _drop_warnings(caplog)
    assert "at-unknown" in warning.getMessage()
    await asyncio.to_thread(tracer.shutdown)
