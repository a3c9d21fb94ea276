"""Runner benchmark (not a test): rollouts/s through an in-process Runner at 1, 8 and 32 workers.

Run: ``.venv/bin/python -m bench.runner`` (``--quick`` for a smaller run). Each rollout runs a trivial agent that emits
10 spans (9 messages and the reward it returns), so a rollout is the full cycle: claim, start, agent, 10 spans
through the tracer into the store, flush, finish. Target (issue 5): >= 300 rollouts/s in process on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agentlightning.agent import LitAgent, rollout
from agentlightning.emit import emit_message
from agentlightning.runner import Runner
from agentlightning.store import InMemoryLightningStore, LightningStore, SqliteLightningStore
from agentlightning.types import RolloutRequest

SPANS_PER_ROLLOUT = 10
TARGET_ROLLOUTS_PER_S = 300.0


@rollout
async def ten_spans(task: int) -> float:
    """Nine messages and a reward: ten spans."""
    for step in range(SPANS_PER_ROLLOUT - 1):
        emit_message(f"step {step} of task {task}")
    return 1.0


@rollout
def ten_spans_sync(task: int) -> float:
    """The sync twin (runs on a pooled daemon thread)."""
    for step in range(SPANS_PER_ROLLOUT - 1):
        emit_message(f"step {step} of task {task}")
    return 1.0


async def _one_run(store: LightningStore, agent: LitAgent, workers: int, rollouts: int) -> float:
    try:
        await store.enqueue_rollouts([RolloutRequest(input=i) for i in range(rollouts)])
        runner = Runner(agent, store, n_workers=workers)
        started = time.perf_counter()
        stats = await runner.run(max_rollouts=rollouts)
        elapsed = time.perf_counter() - started
        if stats.succeeded != rollouts:
            raise RuntimeError(f"only {stats.succeeded} of {rollouts} rollouts succeeded: {stats}")
        return rollouts / elapsed
    finally:
        await store.close()


def _median(make_store: Callable[[], LightningStore], agent: LitAgent, workers: int, rollouts: int, runs: int) -> float:
    return statistics.median(asyncio.run(_one_run(make_store(), agent, workers, rollouts)) for _ in range(runs))


def main() -> None:
    """Print rollouts/s per backend, agent kind and worker count."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and runs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rollouts, runs = (200, 1) if args.quick else (600, 3)
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1_000_000))
        backends: dict[str, Callable[[], LightningStore]] = {
            "memory": InMemoryLightningStore,
            "sqlite": lambda: SqliteLightningStore(Path(tmp) / f"bench-{next(counter)}.db"),
        }
        print(f"runner: {rollouts} rollouts x {SPANS_PER_ROLLOUT} spans, median of {runs} run(s), rollouts/s")
        print(f"{'backend':<8} {'agent':<6} {'1 worker':>10} {'8 workers':>10} {'32 workers':>11}")
        worst = float("inf")
        for name, make_store in backends.items():
            for kind, agent in (("async", ten_spans), ("sync", ten_spans_sync)):
                rates = [_median(make_store, agent, workers, rollouts, runs) for workers in (1, 8, 32)]
                worst = min(worst, max(rates))
                print(f"{name:<8} {kind:<6} {rates[0]:>10.0f} {rates[1]:>10.0f} {rates[2]:>11.0f}")
    verdict = "meets" if worst >= TARGET_ROLLOUTS_PER_S else "MISSES"
    target = f"{TARGET_ROLLOUTS_PER_S:.0f}/s"
    print(f"best rate of the slowest configuration: {worst:.0f} rollouts/s — {verdict} the {target} target")


if __name__ == "__main__":
    main()
