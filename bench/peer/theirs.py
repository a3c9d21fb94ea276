"""The peer's side of the comparison (runs in ``.venv-peer``: Microsoft agentlightning 0.3.0 from PyPI).

Each workload is the one ``bench/peer/ours.py`` runs, through the peer's public API the way its own runner uses it
(``agentlightning/runner/agent.py``, ``agentlightning/tracer/otel.py`` of 0.3.0):

- ingest: a fresh ``InMemoryLightningStore()`` (its default store; nothing is durable), one attempt,
  ``add_many_spans`` in batches of 100. Its spans carry caller-assigned ``sequence_id``s; they are numbered locally,
  which saves the ``get_many_span_sequence_ids`` round trip its runner makes (the cheapest correct use).
- cycle: ``enqueue_rollout`` -> ``dequeue_rollout`` -> ``add_many_spans`` (10 spans; the store marks the attempt
  running on the first span, so its runner makes no separate start call) -> ``update_attempt(status="succeeded")``,
  by concurrent asyncio tasks, on a fresh store in process or through one ``LightningStoreClient`` to its
  ``agl store`` server.
- tracer: ``OtelTracer`` after ``init_worker(store=InMemoryLightningStore())``; LLM-call spans
  (``start_as_current_span`` with the same attributes) inside ``trace_context(rollout_id=…, attempt_id=…)``.

Run by ``bench.compare``: ``.venv-peer/bin/python -m bench.peer.theirs``. Imports nothing from our package (it is not
installed there); ``bench._util`` is standard library only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import SpanKind

from agentlightning.store import InMemoryLightningStore, LightningStore, LightningStoreClient
from agentlightning.tracer.otel import OtelTracer
from agentlightning.types import OtelResource, Span, SpanContext, TraceStatus
from bench._util import (
    INGEST_BATCH,
    LLM_SPAN_ATTRIBUTES,
    LLM_SPAN_NAME,
    SPANS_PER_CYCLE,
    Stopwatch,
    serve_measurements,
)


def llm_spans(rollout_id: str, attempt_id: str, count: int) -> list[Span]:
    """``count`` LLM-call spans of one attempt in the peer's model (same ids and attributes as ours)."""
    now = time.time()
    trace_id = f"{1:032x}"
    root = SpanContext(trace_id=trace_id, span_id=f"{1:016x}", is_remote=False, trace_state={})
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=i + 1,
            trace_id=trace_id,
            span_id=f"{i + 1:016x}",
            parent_id=None if i == 0 else root.span_id,
            name=LLM_SPAN_NAME,
            status=TraceStatus(status_code="OK"),
            attributes=dict(LLM_SPAN_ATTRIBUTES),
            events=[],
            links=[],
            start_time=now + i * 1e-9,
            end_time=now + 0.1 + i * 1e-9,
            context=SpanContext(trace_id=trace_id, span_id=f"{i + 1:016x}", is_remote=False, trace_state={}),
            parent=None if i == 0 else root,
            resource=OtelResource(attributes={}, schema_url=""),
        )
        for i in range(count)
    ]


async def _claimed_attempt(store: LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout(input={"task": "bench"})
    attempted = await store.dequeue_rollout(worker_id="bench")
    if attempted is None:
        raise RuntimeError("nothing to dequeue right after an enqueue")
    return attempted.rollout_id, attempted.attempt.attempt_id


def measure_ingest(request: Mapping[str, Any]) -> dict[str, float]:
    """Spans/s added in batches of 100 into one attempt of a fresh default (in-memory) store."""
    total = int(request["spans"])

    async def run() -> dict[str, float]:
        store = InMemoryLightningStore()
        rollout_id, attempt_id = await _claimed_attempt(store)
        spans = llm_spans(rollout_id, attempt_id, total)
        batches = [spans[i : i + INGEST_BATCH] for i in range(0, total, INGEST_BATCH)]
        watch = Stopwatch()
        for batch in batches:
            await store.add_many_spans(batch)
        return watch.result(total)

    return asyncio.run(run())


async def _cycles(store: LightningStore, total: int, workers: int) -> dict[str, float]:
    template = llm_spans("ro-template", "at-template", SPANS_PER_CYCLE)
    per_worker = total // workers

    async def worker(index: int) -> None:
        for n in range(per_worker):
            await store.enqueue_rollout(input={"worker": index, "task": n})
            attempted = None
            while attempted is None:  # another worker may have taken ours; the queue is never empty for long
                attempted = await store.dequeue_rollout(worker_id=f"w{index}")
            rollout_id, attempt_id = attempted.rollout_id, attempted.attempt.attempt_id
            await store.add_many_spans(
                [span.model_copy(update={"rollout_id": rollout_id, "attempt_id": attempt_id}) for span in template]
            )
            await store.update_attempt(rollout_id, attempt_id, status="succeeded")

    watch = Stopwatch()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return watch.result(per_worker * workers)


def measure_cycles(request: Mapping[str, Any]) -> dict[str, float]:
    """Full rollout cycles/s by ``workers`` concurrent tasks, in process (fresh store) or over HTTP (``url``)."""
    total, workers, url = int(request["cycles"]), int(request["workers"]), request.get("url")

    async def run() -> dict[str, float]:
        if not url:
            return await _cycles(InMemoryLightningStore(), total, workers)
        client = LightningStoreClient(url)
        try:
            return await _cycles(client, total, workers)
        finally:
            await client.close()

    return asyncio.run(run())


class _TracerRig:
    """The tracer and its store, set up once per worker as the peer's runner does (``init_worker``)."""

    def __init__(self) -> None:
        self.store = InMemoryLightningStore()
        self.tracer = OtelTracer()
        self.tracer.init_worker(0, self.store)


_rig: _TracerRig | None = None


def measure_tracer(request: Mapping[str, Any]) -> dict[str, float]:
    """The agent's thread per LLM-call span (wall, including the store write ``on_end`` waits for)."""
    global _rig
    count = int(request["spans"])
    if _rig is None:
        _rig = _TracerRig()
    rig = _rig

    async def run() -> dict[str, float]:
        rollout_id, attempt_id = await _claimed_attempt(rig.store)
        async with rig.tracer.trace_context("bench", rollout_id=rollout_id, attempt_id=attempt_id) as otel:
            watch = Stopwatch()
            for _ in range(count):
                with otel.start_as_current_span(LLM_SPAN_NAME, kind=SpanKind.CLIENT, attributes=LLM_SPAN_ATTRIBUTES):
                    pass
            result = watch.result(count)  # each span was stored before its end() returned: nothing to flush
        stored = await rig.store.query_spans(rollout_id, attempt_id)
        if len(stored) != count:
            raise RuntimeError(f"the peer's tracer stored {len(stored)} of {count} spans")
        return result

    return asyncio.run(run())


def main() -> None:
    """Serve measurement requests from ``bench.compare``."""
    serve_measurements({"ingest": measure_ingest, "cycles": measure_cycles, "tracer": measure_tracer})


if __name__ == "__main__":
    main()
