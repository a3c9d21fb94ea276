"""Store benchmark (not a test): span ingest and full rollout cycles for the memory and SQLite backends.

Run: ``.venv/bin/python -m bench.store`` (``--quick`` for a smaller run). Prints the median of several runs: the
wall-clock rate, and the CPU-bound rate (work / this process's CPU time), which is what the rate would be on an idle
machine for the in-memory store and SQLite NORMAL; for SQLite FULL it leaves out the fsync waits.
SQLite NORMAL is the default and survives kill -9; FULL also survives power loss (see agentlightning.store.sqlite).
Targets (issue 18): >= 100,000 spans/s memory, >= 50,000 spans/s SQLite (durable); >= 5,000 cycles/s memory,
>= 1,000 cycles/s SQLite. For scale: Microsoft agentlightning 0.3.0's in-memory store did ~10,700 spans/s and
~670-800 cycles/s on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from agentlightning.store import InMemoryLightningStore, LightningStore, SqliteLightningStore
from agentlightning.types import Span


def make_spans(rollout_id: str, attempt_id: str, count: int, start: int = 0) -> list[Span]:
    """Realistic LLM-call spans (~700 bytes each as JSON) for one attempt."""
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            trace_id=f"{i + start:032x}",
            span_id=f"{i + start:016x}",
            parent_id=None if i == 0 else f"{start:016x}",
            name="chat gpt-4o-mini",
            kind="CLIENT",
            start_time=1_700_000_000_000_000_000 + i,
            end_time=1_700_000_000_100_000_000 + i,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.usage.input_tokens": 120,
                "gen_ai.usage.output_tokens": 40,
                "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "What is 2+2?"}]}]',
                "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "4"}]}]',
                "agentlightning.prompt_token_ids": list(range(32)),
                "agentlightning.response_token_ids": list(range(8)),
            },
        )
        for i in range(count)
    ]


Rates = tuple[float, float]  # (per wall-clock second, per CPU second of this process)


def _rates(count: int, wall_began: float, cpu_began: float) -> Rates:
    return count / (time.perf_counter() - wall_began), count / max(time.process_time() - cpu_began, 1e-9)


async def bench_spans(store: LightningStore, total: int) -> Rates:
    """Spans/s ingested in batches of 100 into one attempt."""
    rollout = await store.enqueue_rollout({"task": 0})
    claimed = await store.claim_rollout("bench")
    assert claimed is not None
    spans = make_spans(rollout.rollout_id, claimed.attempt.attempt_id, total)
    batches = [spans[i : i + 100] for i in range(0, total, 100)]
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        await store.add_spans(batch)
    return _rates(total, wall, cpu)


async def bench_cycles(store: LightningStore, total: int, workers: int) -> Rates:
    """Full cycles/s: enqueue -> claim -> start -> 10 spans (one batch) -> succeed, ``workers`` concurrent tasks."""
    per_worker = total // workers
    # Spans are built once and re-addressed per cycle, so the figure measures the store, not span construction.
    template = make_spans("ro-template", "at-template", 10)

    async def worker(index: int) -> None:
        for n in range(per_worker):
            rollout = await store.enqueue_rollout({"task": n})
            claimed = await store.claim_rollout(f"w{index}")
            assert claimed is not None
            rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
            await store.start_attempt(rid, aid)
            await store.add_spans([s.model_copy(update={"rollout_id": rid, "attempt_id": aid}) for s in template])
            await store.finish_attempt(rid, aid, "succeeded")
            del rollout

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return _rates(per_worker * workers, wall, cpu)


def run(name: str, factory: Callable[[], LightningStore], spans: int, cycles: int, repeats: int) -> list[str]:
    """Median figures for one backend, one fresh store per run: wall-clock and CPU-bound rates."""

    async def once(kind: str, workers: int) -> Rates:
        store = factory()
        try:
            if kind == "spans":
                return await bench_spans(store, spans)
            return await bench_cycles(store, cycles, workers)
        finally:
            await store.close()

    rows: list[str] = []
    for label, kind, workers in (
        ("spans/s (batches of 100)", "spans", 1),
        ("cycles/s, 1 worker", "cycles", 1),
        ("cycles/s, 16 workers", "cycles", 16),
    ):
        results = [asyncio.run(once(kind, workers)) for _ in range(repeats)]
        walls = [wall for wall, _ in results]
        cpu_bound = statistics.median(cpu for _, cpu in results)
        runs = ", ".join(f"{w:,.0f}" for w in walls)
        rows.append(
            f"{name:<14} {label:<26} {statistics.median(walls):>10,.0f} {cpu_bound:>12,.0f}   wall runs: {runs}"
        )
    return rows


def main() -> None:
    """Run every backend and print a table."""
    parser = argparse.ArgumentParser(description="LightningStore benchmark: span ingest and full rollout cycles.")
    parser.add_argument("--quick", action="store_true", help="smaller runs (a smoke check)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spans, cycles = (2_000, 160) if args.quick else (20_000, 1_600)
    with tempfile.TemporaryDirectory() as tmp:
        counter = itertools.count()

        def sqlite(synchronous: Literal["NORMAL", "FULL"]) -> Callable[[], LightningStore]:
            return lambda: SqliteLightningStore(Path(tmp) / f"bench-{next(counter)}.db", synchronous=synchronous)

        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; 'cpu-bound' = work / process CPU time")
        print(f"{'backend':<14} {'measure':<26} {'wall':>10} {'cpu-bound':>12}")
        for name, factory in (
            ("memory", InMemoryLightningStore),
            ("sqlite NORMAL", sqlite("NORMAL")),
            ("sqlite FULL", sqlite("FULL")),
        ):
            for row in run(name, factory, spans, cycles, args.repeats):
                print(row, flush=True)


if __name__ == "__main__":
    main()
