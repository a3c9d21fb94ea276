"""Store server benchmark (not a test): spans/s and full rollout cycles/s through LightningStoreClient over loopback.

Run: ``.venv/bin/python -m bench.store_http`` (``--quick`` for a smaller run). The server (``serve_store``, SQLite
backend with its default durability) runs in a separate process, so client and server do not share a GIL.
- spans/s: one attempt, batches of 100 realistic LLM spans (~700 bytes each, ``bench.store.make_spans``) sent by
  4 concurrent tasks through one client.
- cycles/s: 32 concurrent workers (asyncio tasks sharing one client), each repeating enqueue -> claim and start ->
  finish succeeded carrying its 10 spans: three requests per rollout, the calls a runner makes (``Runner`` claims
  with ``claim_and_start`` and sends a short attempt's spans with ``finish_attempt_with_spans``). ``--separate``
  measures the older five-request cycle (enqueue, claim, start, add spans, finish) instead.
Prints the median of several runs in wall-clock time (the machine is shared, so neighbours slow it down) and the
figure of a baseline run against the in-process SQLite store without HTTP, side by side.
Targets (issue 3): >= 5,000 spans/s and >= 200 rollouts/s over loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx

from agentlightning.client import LightningStoreClient
from agentlightning.store import LightningStore, SqliteLightningStore
from agentlightning.types import Span
from bench.store import make_spans

TARGET_SPANS_PER_S = 5_000.0
TARGET_CYCLES_PER_S = 200.0
BATCH = 100
SPAN_SENDERS = 4
WORKERS = 32
SPANS_PER_CYCLE = 10


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server_process(db: Path) -> Iterator[tuple[str, int]]:
    """``serve_store`` on SQLite in a child process; yields its URL and pid once it answers /health."""
    port = _free_port()
    code = (
        "from agentlightning.server import serve_store; "
        f"serve_store(backend='sqlite', path={str(db)!r}, host='127.0.0.1', port={port})"
    )
    argv = [sys.executable, "-c", code]
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"store server did not start: {child.stderr.read().decode() if child.stderr else ''}"
                )
            time.sleep(0.05)
        yield url, child.pid
    finally:
        child.terminate()
        child.wait(timeout=30)


def _readdress(template: list[Span], rollout_id: str, attempt_id: str) -> list[Span]:
    return [s.model_copy(update={"rollout_id": rollout_id, "attempt_id": attempt_id}) for s in template]


async def bench_spans(store: LightningStore, total: int) -> float:
    """Spans/s added in batches of 100 by a few concurrent senders into one attempt."""
    await store.enqueue_rollout({"task": "spans"})
    claimed = await store.claim_rollout("bench")
    assert claimed is not None
    spans = make_spans(claimed.rollout.rollout_id, claimed.attempt.attempt_id, total)
    batches = [spans[i : i + BATCH] for i in range(0, total, BATCH)]

    async def sender(mine: list[list[Span]]) -> None:
        for batch in mine:
            await store.add_spans(batch)

    began = time.perf_counter()
    await asyncio.gather(*(sender(batches[i::SPAN_SENDERS]) for i in range(SPAN_SENDERS)))
    return total / (time.perf_counter() - began)


async def bench_cycles(store: LightningStore, total: int, workers: int = WORKERS, *, separate: bool = False) -> float:
    """Full cycles/s: enqueue -> claim and start -> 10 spans and succeed, by ``workers`` concurrent workers.

    ``separate``: claim, start, add spans and finish as four calls (five requests per rollout instead of three).
    """
    template = make_spans("ro-x", "at-x", SPANS_PER_CYCLE)
    per_worker = total // workers

    async def worker(n: int) -> None:
        for _ in range(per_worker):
            await store.enqueue_rollout({"worker": n})
            if separate:
                claimed = await store.claim_rollout(f"w{n}", timeout_s=10)
                assert claimed is not None
                rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
                await store.start_attempt(rid, aid)
                await store.add_spans(_readdress(template, rid, aid))
                await store.finish_attempt(rid, aid, "succeeded")
                continue
            claimed = await store.claim_and_start(f"w{n}", timeout_s=10)
            assert claimed is not None
            rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
            await store.finish_attempt_with_spans(rid, aid, "succeeded", _readdress(template, rid, aid))

    began = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(workers)))
    return per_worker * workers / (time.perf_counter() - began)


Figure = tuple[float, float]  # (per wall-clock second, per CPU second of the busier process)


def _median(runs: int, once: Callable[[], Coroutine[Any, Any, float]], server_pid: int | None = None) -> Figure:
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(runs):
        client_cpu, server_cpu = time.process_time(), process_cpu_s(server_pid) if server_pid else 0.0
        began = time.perf_counter()
        rate = asyncio.run(once())
        work = rate * (time.perf_counter() - began)
        client_cpu = time.process_time() - client_cpu
        server_cpu = process_cpu_s(server_pid) - server_cpu if server_pid else 0.0
        walls.append(rate)
        # Each process on its own core: the busier one bounds the rate (what an idle 2-core machine would show).
        cpus.append(work / max(client_cpu, server_cpu, 1e-9))
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer spans and rollouts per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median is printed)")
    parser.add_argument("--workers", default="", help="comma-separated worker counts: only HTTP cycles at each")
    parser.add_argument("--separate", action="store_true", help="cycles as five requests (claim, start, spans apart)")
    args = parser.parse_args()
    spans_total = 5_000 if args.quick else 20_000
    cycles_total = 320 if args.quick else 1_600
    if args.workers:
        _cycles_only(args.runs, cycles_total, [int(w) for w in args.workers.split(",")], args.separate)
        return

    with tempfile.TemporaryDirectory() as tmp:
        with server_process(Path(tmp) / "server.db") as (url, pid):

            async def http_spans() -> float:
                client = LightningStoreClient(url)
                try:
                    return await bench_spans(client, spans_total)
                finally:
                    await client.close()

            async def http_cycles() -> float:
                client = LightningStoreClient(url)
                try:
                    return await bench_cycles(client, cycles_total, separate=args.separate)
                finally:
                    await client.close()

            asyncio.run(http_cycles())  # warm up: imports, connection pool, SQLite pages
            spans_rate = _median(args.runs, http_spans, pid)
            cycles_rate = _median(args.runs, http_cycles, pid)

        local = SqliteLightningStore(Path(tmp) / "local.db")

        async def local_spans() -> float:
            return await bench_spans(local, spans_total)

        async def local_cycles() -> float:
            return await bench_cycles(local, cycles_total, separate=args.separate)

        local_spans_rate = _median(args.runs, local_spans)
        local_cycles_rate = _median(args.runs, local_cycles)
        asyncio.run(local.close())

    print(
        f"store over HTTP (client -> uvicorn/FastAPI server process -> SQLite), {os.cpu_count()} CPUs, "
        f"median of {args.runs}; cpu-bound = work / CPU time of the busier process (client or server)"
    )
    print(f"{'figure':<44}{'HTTP wall':>11}{'HTTP cpu-bound':>16}{'in-process':>12}{'target':>9}")
    for label, (wall, cpu), (in_process, _), target in (
        (f"spans/s (batches of {BATCH}, {SPAN_SENDERS} senders)", spans_rate, local_spans_rate, TARGET_SPANS_PER_S),
        (f"rollouts/s full cycle ({WORKERS} workers)", cycles_rate, local_cycles_rate, TARGET_CYCLES_PER_S),
    ):
        verdict = "ok" if wall >= target else ("ok on idle cores" if cpu >= target else "BELOW")
        print(f"{label:<44}{wall:>11,.0f}{cpu:>16,.0f}{in_process:>12,.0f}{target:>9,.0f}  {verdict}")


def _cycles_only(runs: int, total: int, worker_counts: list[int], separate: bool) -> None:
    """HTTP rollouts/s at each worker count (at least 2 rollouts per worker), no spans/s and no in-process baseline."""
    with tempfile.TemporaryDirectory() as tmp, server_process(Path(tmp) / "server.db") as (url, pid):
        for workers in worker_counts:
            cycles = max(total, 2 * workers) // workers * workers

            async def http_cycles(cycles: int = cycles, workers: int = workers) -> float:
                client = LightningStoreClient(url)
                try:
                    return await bench_cycles(client, cycles, workers, separate=separate)
                finally:
                    await client.close()

            asyncio.run(http_cycles())  # warm up
            wall, cpu = _median(runs, http_cycles, pid)
            print(f"rollouts/s full cycle over HTTP, {workers:>3} workers: {wall:>7,.0f} wall, {cpu:>7,.0f} cpu-bound")


if __name__ == "__main__":
    main()
