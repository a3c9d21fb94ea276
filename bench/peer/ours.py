"""Our side of the comparison (runs in ``.venv``): the default store, its HTTP client and the tracer, as a user would.

- ingest: a fresh default store (``SqliteLightningStore`` on a file, default settings: WAL, synchronous NORMAL, an
  acknowledged write survives kill -9), one attempt, spans added in batches of 100;
- cycle: enqueue -> claim and start (``claim_and_start``) -> finish succeeded with its 10 spans
  (``finish_attempt_with_spans``), the calls ``Runner`` makes, by concurrent asyncio tasks, on a fresh store in
  process, or through one ``LightningStoreClient`` to an ``agl store`` server (three requests per rollout);
- tracer: LLM-call spans (``start_as_current_span`` with GenAI attributes) on the agent's thread inside
  ``rollout_context``, through ``LightningTracer`` with a ``StoreSpanSink`` into the default store.

Run by ``bench.compare``: ``.venv/bin/python -m bench.peer.ours``.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import sqlite3
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.trace import SpanKind

from agentlightning.client import LightningStoreClient
from agentlightning.store import InMemoryLightningStore, LightningStore, SqliteLightningStore
from agentlightning.store._sqlite_spans import encode_spans
from agentlightning.tracing import LightningTracer, StoreSpanSink, rollout_context
from agentlightning.types import Span
from bench._util import (
    INGEST_BATCH,
    LLM_SPAN_ATTRIBUTES,
    LLM_SPAN_NAME,
    SPANS_PER_CYCLE,
    Stopwatch,
    serve_measurements,
)

_scratch = tempfile.TemporaryDirectory(prefix="bench-ours-")
_databases = iter(range(1_000_000))


def _fresh_store() -> SqliteLightningStore:
    return SqliteLightningStore(Path(_scratch.name) / f"store-{next(_databases)}.db")


def llm_spans(rollout_id: str, attempt_id: str, count: int) -> list[Span]:
    """``count`` LLM-call spans of one attempt (one trace, the first span the parent of the others)."""
    now = time.time_ns()
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            trace_id=f"{1:032x}",
            span_id=f"{i + 1:016x}",
            parent_id=None if i == 0 else f"{1:016x}",
            name=LLM_SPAN_NAME,
            kind="CLIENT",
            start_time=now + i,
            end_time=now + 100_000_000 + i,
            attributes=dict(LLM_SPAN_ATTRIBUTES),
        )
        for i in range(count)
    ]


async def _claimed_attempt(store: LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout({"task": "bench"})
    claimed = await store.claim_rollout("bench")
    if claimed is None:
        raise RuntimeError("nothing to claim right after an enqueue")
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def measure_ingest(request: Mapping[str, Any]) -> dict[str, float]:
    """Spans/s added in batches of 100 into one attempt of a fresh default store."""
    total = int(request["spans"])

    async def run() -> dict[str, float]:
        store = _fresh_store()
        try:
            rollout_id, attempt_id = await _claimed_attempt(store)
            spans = llm_spans(rollout_id, attempt_id, total)
            batches = [spans[i : i + INGEST_BATCH] for i in range(0, total, INGEST_BATCH)]
            watch = Stopwatch()
            for batch in batches:
                await store.add_spans(batch)
            return watch.result(total)
        finally:
            await store.close()

    return asyncio.run(run())


async def _cycles(store: LightningStore, total: int, workers: int) -> dict[str, float]:
    template = llm_spans("ro-template", "at-template", SPANS_PER_CYCLE)
    per_worker = total // workers

    async def worker(index: int) -> None:
        for n in range(per_worker):
            await store.enqueue_rollout({"worker": index, "task": n})
            claimed = None
            while claimed is None:  # another worker may have taken ours; the queue is never empty for long
                claimed = await store.claim_and_start(f"w{index}")
            rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
            spans = [span.model_copy(update={"rollout_id": rollout_id, "attempt_id": attempt_id}) for span in template]
            await store.finish_attempt_with_spans(rollout_id, attempt_id, "succeeded", spans)

    watch = Stopwatch()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return watch.result(per_worker * workers)


def measure_cycles(request: Mapping[str, Any]) -> dict[str, float]:
    """Full rollout cycles/s by ``workers`` concurrent tasks, in process (fresh store; ``backend="memory"``: the
    in-memory one, as the peer's) or over HTTP (``url``)."""
    total, workers, url = int(request["cycles"]), int(request["workers"]), request.get("url")

    async def run() -> dict[str, float]:
        store: LightningStore
        if url:
            store = LightningStoreClient(url)
        elif request.get("backend") == "memory":
            store = InMemoryLightningStore()
        else:
            store = _fresh_store()
        try:
            return await _cycles(store, total, workers)
        finally:
            await store.close()

    return asyncio.run(run())


def measure_cycle_floor(request: Mapping[str, Any]) -> dict[str, float]:
    """Cycles/s of the cheapest durable cycle SQLite allows from Python: no store, one worker, no asyncio.

    A cycle is three calls that must each be durable when they return (enqueue; claim and start; finish with the 10
    spans), so three ``BEGIN IMMEDIATE``/``INSERT``/``COMMIT`` appends to one table without indexes, with the same
    WAL/``synchronous=NORMAL`` settings as our store; the spans are re-addressed as in the real cycle and encoded
    with our store's encoder (orjson, ~5 µs for the 10). No state is read or checked: a lower bound on the time of
    any durable SQLite design, not a store.
    """
    total = int(request["cycles"])
    template = llm_spans("ro-template", "at-template", SPANS_PER_CYCLE)
    conn = sqlite3.connect(Path(_scratch.name) / f"floor-{next(_databases)}.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        # Our store checkpoints on a background thread; here no checkpoint runs inside a measured commit either.
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")

        def append(body: bytes) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO log (body) VALUES (?)", (body,))
            conn.execute("COMMIT")

        watch = Stopwatch()
        for n in range(total):
            rollout_id, attempt_id = f"ro-{n:012x}", f"at-{n:012x}"
            append(orjson.dumps({"rollout_id": rollout_id, "input": {"worker": 0, "task": n}, "status": "queuing"}))
            append(orjson.dumps({"rollout_id": rollout_id, "attempt_id": attempt_id, "status": "running"}))
            spans = [span.model_copy(update={"rollout_id": rollout_id, "attempt_id": attempt_id}) for span in template]
            append(encode_spans(spans)[0])
        return watch.result(total)
    finally:
        conn.close()


class _TracerRig:
    """The tracer and its store, built once per worker as a runner process would."""

    def __init__(self) -> None:
        self.store = _fresh_store()
        self.tracer = LightningTracer(StoreSpanSink(self.store))
        self.otel = self.tracer.get_tracer("bench")


_rig: _TracerRig | None = None


def measure_tracer(request: Mapping[str, Any]) -> dict[str, float]:
    """The agent's thread per LLM-call span (wall); CPU also counts the off-thread delivery, up to the flush."""
    global _rig
    count = int(request["spans"])
    if _rig is None:
        _rig = _TracerRig()
    rig = _rig
    rollout_id, attempt_id = asyncio.run(_claimed_attempt(rig.store))
    with rollout_context(rollout_id, attempt_id):
        watch = Stopwatch()
        for _ in range(count):
            with rig.otel.start_as_current_span(LLM_SPAN_NAME, kind=SpanKind.CLIENT, attributes=LLM_SPAN_ATTRIBUTES):
                pass
        watch.stop_wall()
    if not rig.tracer.flush(60):
        raise RuntimeError(f"tracer lost spans: {rig.tracer.dropped_spans} dropped")
    return watch.result(count)


_MEASURES = {
    "ingest": measure_ingest,
    "cycles": measure_cycles,
    "cycle_floor": measure_cycle_floor,
    "tracer": measure_tracer,
}


def profile(request: Mapping[str, Any]) -> str:
    """One run of measure ``of`` under cProfile: the functions with the most cumulative time, as text."""
    measure = _MEASURES[str(request["of"])]
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        result = measure(request)
    finally:
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(25)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    # pstats' header names the profiler's own files; keep the totals line and the table.
    start = next((i for i, line in enumerate(lines) if "function calls" in line), 0)
    figure = f"{result['units']:.0f} units in {result['wall_s']:.3f} s wall under the profiler"
    return figure + "\n" + "\n".join(lines[start:])


def main() -> None:
    """Serve measurement requests from ``bench.compare``."""
    serve_measurements({**_MEASURES, "profile": profile})


if __name__ == "__main__":
    main()
