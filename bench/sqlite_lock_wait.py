"""SQLite lock-wait benchmark (not a test): what another connection's write lock costs the writer's event loop.

Run: ``.venv/bin/python -m bench.sqlite_lock_wait`` (``--quick``: shorter, one run). Another connection (a thread
with its own connection, as another process would have) holds the database's write lock for ``HOLD_S`` at a time,
then lets go for ``GAP_S``, over and over. Meanwhile 16 asyncio tasks on one loop write a rollout each in turn, and a
1 ms heartbeat measures how late the loop wakes it (its lag: what every other task on the loop, such as the LLM
proxy's requests or a runner's claims, waits for). Ours: ``SqliteLightningStore``, whose group commit waits for the
lock without holding the loop. Baseline, measured in the same run: the same writes through ``sqlite3`` alone, the
way SQLite's busy handler waits (inside the call, sleeping up to 100 ms between tries), which is how the store waited
before. Figures: loop lag p99 and worst, and writes per second (ours also shares commits between the 16 tasks,
which the baseline does not: that figure is the store's, not the lock wait's alone).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agentlightning.store.sqlite import SqliteLightningStore

WRITERS = 16
HOLD_S = 0.05  # how long the other connection keeps the write lock each time
GAP_S = 0.01  # how long it lets go in between


@dataclass
class Result:
    """One side's figures."""

    lag_p99_ms: float
    lag_max_ms: float
    writes_per_s: float


def _hold_lock(path: Path, stop: threading.Event) -> None:
    """Another connection taking the write lock for HOLD_S, every HOLD_S + GAP_S."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    while not stop.is_set():
        conn.execute("BEGIN IMMEDIATE")
        time.sleep(HOLD_S)
        conn.execute("COMMIT")
        time.sleep(GAP_S)
    conn.close()


async def _measure(write: Callable[[int], Awaitable[object]], seconds: float) -> Result:
    """Run WRITERS writing tasks and the heartbeat for ``seconds``."""
    lags: list[float] = []
    writes = 0
    deadline = time.perf_counter() + seconds

    async def heartbeat() -> None:
        while time.perf_counter() < deadline:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - before - 0.001)

    async def writer(n: int) -> None:
        nonlocal writes
        i = 0
        while time.perf_counter() < deadline:
            await write(n * 1_000_000 + i)
            writes += 1
            i += 1

    started = time.perf_counter()
    await asyncio.gather(heartbeat(), *(writer(n) for n in range(WRITERS)))
    lags.sort()
    return Result(
        lag_p99_ms=lags[int(len(lags) * 0.99)] * 1e3,
        lag_max_ms=lags[-1] * 1e3,
        writes_per_s=writes / (time.perf_counter() - started),
    )


async def _ours(path: Path, seconds: float) -> Result:
    store = SqliteLightningStore(path / "ours.db")
    await store.enqueue_rollout("warm")
    try:
        return await _run_held(path / "ours.db", lambda i: store.enqueue_rollout(i), seconds)
    finally:
        await store.close()


async def _sqlite_alone(path: Path, seconds: float) -> Result:
    db = path / "baseline.db"
    conn = sqlite3.connect(db, isolation_level=None, timeout=30.0, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE rollouts (id INTEGER PRIMARY KEY, input TEXT)")

    async def write(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")  # SQLite's busy handler waits here, on the loop
        conn.execute("INSERT INTO rollouts (input) VALUES (?)", (str(i),))
        conn.execute("COMMIT")
        await asyncio.sleep(0)  # hand the loop over after each write, as an awaited store call does

    try:
        return await _run_held(db, write, seconds)
    finally:
        conn.close()


async def _run_held(db: Path, write: Callable[[int], Awaitable[object]], seconds: float) -> Result:
    stop = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(db, stop), daemon=True)
    holder.start()
    try:
        return await _measure(write, seconds)
    finally:
        stop.set()
        holder.join()


def main() -> None:
    """Both sides, alternating, a median per figure; prints the lag ratio against the baseline."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one 3 s run per side instead of three 5 s runs")
    args = parser.parse_args()
    runs, seconds = (1, 3.0) if args.quick else (3, 5.0)
    results: dict[str, list[Result]] = {"ours (group commit)": [], "sqlite3 busy handler (baseline)": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="bench-lock-") as tmp:
            results["ours (group commit)"].append(asyncio.run(_ours(Path(tmp), seconds)))
            results["sqlite3 busy handler (baseline)"].append(asyncio.run(_sqlite_alone(Path(tmp), seconds)))
    print(
        f"another connection holds the write lock {HOLD_S * 1e3:.0f} ms of every {(HOLD_S + GAP_S) * 1e3:.0f} ms; "
        f"{WRITERS} writing tasks on one loop; median of {runs} run(s) of {seconds:.0f} s"
    )
    print(f"{'':34s}{'loop lag p99':>14s}{'loop lag max':>14s}{'writes/s':>10s}")
    medians: dict[str, tuple[float, float, float]] = {}
    for name, rs in results.items():
        m = (
            statistics.median(r.lag_p99_ms for r in rs),
            statistics.median(r.lag_max_ms for r in rs),
            statistics.median(r.writes_per_s for r in rs),
        )
        medians[name] = m
        print(f"{name:34s}{m[0]:11.1f} ms{m[1]:11.1f} ms{m[2]:10.0f}")
    ours, base = medians["ours (group commit)"], medians["sqlite3 busy handler (baseline)"]
    print(
        f"ratio: the baseline's loop lag is {base[0] / max(ours[0], 1e-3):.1f}x ours at p99 and "
        f"{base[1] / max(ours[1], 1e-3):.1f}x at worst; writes/s {ours[2] / max(base[2], 1e-9):.2f}x the baseline's"
    )


if __name__ == "__main__":
    main()
