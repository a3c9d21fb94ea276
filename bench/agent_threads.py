"""Sync-agent threads benchmark (not a test): the runner's pooled daemon threads against a fresh thread per call and
asyncio's thread pool, with 192 sync agents at once.

Run: ``.venv/bin/python -m bench.agent_threads`` (``--quick``: fewer calls, one run). Each of 192 asyncio workers
awaits ``CALLS`` sync jobs in turn, each job a 2 ms sleep and ~50 µs of Python (an agent waiting on I/O), as the
runner awaits a sync agent. Figures: calls/s over all workers, CPU ms per 1,000 calls, and the event loop's lag (how
late a 1 ms heartbeat wakes: 99th percentile and worst), which is what the runner's own work (claims, spans,
heartbeats) waits for. Baselines measured in the same run: a fresh ``threading.Thread`` per call (the runner before)
and ``loop.run_in_executor`` on a ``ThreadPoolExecutor`` with one thread per worker (the library; the runner does
not use it because its threads are joined at interpreter exit, so a hung agent would keep a stopped runner alive).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentlightning._agent_threads import call_in_thread

WORKERS = 192
JOB_SLEEP_S = 0.002
_ANSWER = sum(range(2_000))  # what every job returns; computed once, not on the event loop per call

Caller = Callable[[Callable[[], Any]], Awaitable[Any]]


def job() -> int:
    """One sync agent call: a short wait on I/O, then a little Python."""
    time.sleep(JOB_SLEEP_S)
    return sum(range(2_000))


async def _fresh_thread(function: Callable[[], Any]) -> Any:
    """A new daemon thread per call, its result handed back to the loop (the runner before the pool)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            loop.call_soon_threadsafe(future.set_result, function())
        except BaseException as exc:  # handed to the awaiting worker
            loop.call_soon_threadsafe(future.set_exception, exc)

    threading.Thread(target=run, daemon=True).start()
    return await future


async def _pooled(function: Callable[[], Any]) -> Any:
    return await call_in_thread(function, [], {})


@dataclass
class Result:
    """One run of one way of calling: throughput, CPU and the event loop's lag."""

    calls_per_s: float
    cpu_ms_per_1000: float
    lag_p99_ms: float
    lag_max_ms: float


async def _heartbeat(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - started - 0.001)


async def _run(call: Caller, calls: int) -> Result:
    lags: list[float] = []
    stop = asyncio.Event()

    async def worker() -> None:
        for _ in range(calls):
            if await call(job) != _ANSWER:
                raise RuntimeError("a job returned the wrong value")

    beat = asyncio.create_task(_heartbeat(lags, stop))
    await asyncio.sleep(0.01)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    stop.set()
    await beat
    total = WORKERS * calls
    lags.sort()
    return Result(total / wall, cpu / total * 1e6, lags[int(0.99 * (len(lags) - 1))] * 1e3, lags[-1] * 1e3)


def measure(name: str, calls: int) -> Result:
    """One run of ``name`` ("pooled", "fresh thread" or "executor") in a fresh event loop."""
    if name == "executor":
        executor = ThreadPoolExecutor(max_workers=WORKERS)

        async def in_executor(function: Callable[[], Any]) -> Any:
            return await asyncio.get_running_loop().run_in_executor(executor, function)

        try:
            return asyncio.run(_run(in_executor, calls))
        finally:
            executor.shutdown()
    return asyncio.run(_run(_pooled if name == "pooled" else _fresh_thread, calls))


def main() -> None:
    """Print each way's median figures and ours against each baseline."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls, one run")
    args = parser.parse_args()
    calls, runs = (20, 1) if args.quick else (50, 3)
    names = ("pooled", "fresh thread", "executor")
    results: dict[str, list[Result]] = {name: [] for name in names}
    for _ in range(runs):  # interleaved, so load from other work reaches every way alike
        for name in names:
            results[name].append(measure(name, calls))
    job_ms = JOB_SLEEP_S * 1e3
    print(f"sync agent threads: {WORKERS} workers x {calls} calls of a {job_ms:.0f} ms job, median of {runs} run(s)")
    print(f"{'way':<14} {'calls/s':>9} {'CPU ms/1k':>10} {'loop lag p99 ms':>16} {'loop lag max ms':>16}")
    median: dict[str, Result] = {}
    for name in names:
        rs = results[name]
        median[name] = Result(*(statistics.median(getattr(r, f) for r in rs) for f in Result.__dataclass_fields__))
        m = median[name]
        lags = f"{m.lag_p99_ms:>16.2f} {m.lag_max_ms:>16.2f}"
        print(f"{name:<14} {m.calls_per_s:>9,.0f} {m.cpu_ms_per_1000:>10.1f} {lags}")
    ours = median["pooled"]
    for name in names[1:]:
        base = median[name]
        print(
            f"pooled vs {name}: {ours.calls_per_s / base.calls_per_s:.2f}x calls/s, "
            f"{base.cpu_ms_per_1000 / ours.cpu_ms_per_1000:.2f}x less CPU per call, "
            f"loop lag p99 {ours.lag_p99_ms:.2f} vs {base.lag_p99_ms:.2f} ms"
        )


if __name__ == "__main__":
    main()
