"""Soak benchmark (not a test): 64 clients doing full rollout cycles while the store server is killed with SIGKILL.

Run: ``.venv/bin/python -m bench.soak`` (10 minutes, a kill -9 every minute, SQLite) or ``--quick`` (45 s, a kill
every 15 s); ``--backend postgres`` uses a throwaway PostgreSQL cluster. Everything listens on 127.0.0.1 only.
Each of ``--clients`` clients (its own LightningStoreClient) repeats: enqueue one rollout, claim and start the
oldest, add two spans, finish succeeded with two more. Each call carries the client's own idempotency key and is
repeated with the same key until it is acknowledged, however long the server is down: what a runner does. The server
is killed at random points of those calls and started again on the same database.

At the end it checks and prints, against the physical limit of "nothing lost, nothing twice":
- every acknowledged enqueue is one rollout, and there are no others (no retried enqueue made a second);
- every rollout succeeded, with exactly one attempt (no retried claim claimed a second rollout or a second attempt;
  no retried finish was refused);
- every acknowledged span is stored exactly once (total count, and each sampled rollout's span ids);
- the server's RSS during each life, from the end of its first quarter to its end (flat: a leak grows it).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from agentlightning.client import LightningStoreClient
from agentlightning.store import StoreError
from agentlightning.testing.store_server import StoreServerProcess, rss_bytes
from agentlightning.types import Span

T = TypeVar("T")
SAMPLE_S = 2.0
SPOT_CHECKS = 200


@dataclass
class Tally:
    """What the clients were told was done."""

    enqueued: set[str] = field(default_factory=set)
    finished: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    spans: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    retried_calls: int = 0
    cycles: int = 0


async def until_acked(tally: Tally, call: Callable[[], Awaitable[T]]) -> T:
    """Repeat ``call`` (same arguments, same key) until the store acknowledges it."""
    while True:
        try:
            return await call()
        except StoreError:  # StoreUnavailableError: the server stayed down through the client's own retries
            tally.retried_calls += 1
            await asyncio.sleep(0.2)


def spans_for(rollout_id: str, attempt_id: str, client: int, cycle: int) -> list[Span]:
    """Four small spans with ids unique per (client, cycle)."""
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            trace_id=f"{client + 1:032x}",
            span_id=f"{client:04x}{cycle:08x}{k:04x}",
            name="soak",
            start_time=k,
            end_time=k + 1,
            attributes={"client": client, "cycle": cycle},
        )
        for k in range(4)
    ]


async def client_loop(url: str, n: int, tally: Tally, stop: asyncio.Event) -> None:
    """One client's cycles until ``stop``; then it claims and finishes what is left until the queue is empty."""
    client = LightningStoreClient(url, max_retries=10, backoff_s=0.05, max_backoff_s=0.5)
    cycle = 0
    try:
        while True:
            key = f"c{n}-{cycle}"
            if not stop.is_set():
                rollout = await until_acked(tally, partial(client.enqueue_rollout, {"c": n}, idempotency_key=key + "e"))
                tally.enqueued.add(rollout.rollout_id)
            claimed = await until_acked(tally, partial(client.claim_and_start, f"c{n}", idempotency_key=key + "c"))
            if claimed is None:
                if stop.is_set():
                    return
                await asyncio.sleep(0.01)  # others took the queue: the replayed enqueue adds nothing, so wait
                continue
            rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
            spans = spans_for(rid, aid, n, cycle)
            await until_acked(tally, partial(client.add_spans, spans[:2]))
            tally.spans[rid].update(s.span_id for s in spans[:2])
            await until_acked(
                tally,
                partial(client.finish_attempt_with_spans, rid, aid, "succeeded", spans[2:], idempotency_key=key + "f"),
            )
            tally.spans[rid].update(s.span_id for s in spans[2:])
            tally.finished[rid] += 1
            tally.cycles += 1
            cycle += 1
    finally:
        await client.close()


async def soak(server: StoreServerProcess, clients: int, seconds: float, kill_every_s: float) -> None:
    """Run the soak against ``server`` (started here) and print the verdict."""
    server.start()
    tally = Tally()
    stop = asyncio.Event()
    lives: list[list[float]] = [[]]  # RSS samples (MiB) per server life
    kills = 0
    began = time.monotonic()
    tasks = [asyncio.create_task(client_loop(server.url, n, tally, stop)) for n in range(clients)]
    next_kill = began + kill_every_s
    try:
        while (now := time.monotonic()) - began < seconds:
            lives[-1].append(rss_bytes(server.pid) / 2**20)
            if now >= next_kill:
                await asyncio.sleep(random.random() * 0.5)  # somewhere in the middle of the calls in flight
                server.kill9()
                kills += 1
                await asyncio.sleep(0.2)
                await asyncio.to_thread(server.start)
                lives.append([])
                next_kill += kill_every_s
            await asyncio.sleep(SAMPLE_S)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
    elapsed = time.monotonic() - began
    await verify(server, tally, lives, kills, clients, elapsed)


async def verify(
    server: StoreServerProcess, tally: Tally, lives: list[list[float]], kills: int, clients: int, elapsed: float
) -> None:
    """Compare the store with what the clients were told, and print one line per check."""
    client = LightningStoreClient(server.url)
    try:
        stats = await client.statistics()
        unfinished = await client.query_rollouts(status=["queuing", "requeuing", "preparing", "running", "failed"])
        sample = random.sample(sorted(tally.spans), min(SPOT_CHECKS, len(tally.spans)))
        mismatched = 0
        for rid in sample:
            stored = [s.span_id for s in await client.query_spans(rid)]
            if len(stored) != len(set(stored)) or set(stored) != tally.spans[rid]:
                mismatched += 1
    finally:
        await client.close()
    acked_spans = sum(len(ids) for ids in tally.spans.values())
    twice = sum(1 for count in tally.finished.values() if count != 1)
    growth = [life[-1] - life[len(life) // 4] for life in lives if len(life) >= 4]
    checks = [
        ("rollouts stored = enqueues acknowledged", stats.total_rollouts == len(tally.enqueued)),
        ("every rollout succeeded", stats.rollouts_by_status.get("succeeded", 0) == stats.total_rollouts),
        ("one attempt per rollout", stats.total_attempts == stats.total_rollouts),
        ("each rollout finished once by its client", twice == 0 and len(tally.finished) == stats.total_rollouts),
        ("spans stored = spans acknowledged", stats.total_spans == acked_spans),
        (f"{len(sample)} sampled rollouts: exactly their acked spans", mismatched == 0),
    ]
    print(
        f"soak: {clients} clients, {elapsed:.0f} s, {kills} kill -9 of the store server, "
        f"{tally.cycles:,} full cycles ({tally.cycles / elapsed:,.0f}/s), {tally.retried_calls} calls repeated "
        "after the client's own retries ran out"
    )
    print(
        f"  store: {stats.total_rollouts:,} rollouts, {stats.total_attempts:,} attempts, {stats.total_spans:,} spans; "
        f"acknowledged: {len(tally.enqueued):,} enqueues, {acked_spans:,} spans; not succeeded: {len(unfinished)}"
    )
    for label, ok in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {label}")
    if growth:
        print(
            "  server RSS per life (MiB, from 1/4 of the life to its end): "
            f"median growth {statistics.median(growth):+.1f}, "
            f"max {max(growth):+.1f}; peak {max(max(life) for life in lives if life):.0f} MiB"
        )
    lost = len(tally.enqueued) - stats.total_rollouts + acked_spans - stats.total_spans
    print(f"  vs the limit (0 lost, 0 twice): lost or extra items {abs(lost)}, finished twice {twice}")


def main() -> None:
    """Parse the options, start the backend and run the soak."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="45 s with a kill every 15 s")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between kill -9 of the server")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    seconds, kill_every = (45.0, 15.0) if args.quick else (args.seconds, args.kill_every)
    with tempfile.TemporaryDirectory() as tmp:
        if args.backend == "sqlite":
            server = StoreServerProcess("sqlite", path=str(Path(tmp) / "soak.db"))
            try:
                asyncio.run(soak(server, args.clients, seconds, kill_every))
            finally:
                server.stop()
            return
        from agentlightning.testing.postgres import PostgresCluster

        with PostgresCluster() as cluster:
            server = StoreServerProcess("postgres", dsn=cluster.create_schema())
            try:
                asyncio.run(soak(server, args.clients, seconds, kill_every))
            finally:
                server.stop()


if __name__ == "__main__":
    main()
