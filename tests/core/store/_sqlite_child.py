"""Child process for the SQLite tests: ``claim DB READY_DIR N`` or ``spans|grouped DB ROLLOUT ATTEMPT SYNCHRONOUS``.

``claim``: wait until N children are ready, then claim until the queue is empty, printing each claimed rollout id.
``spans``: add spans one batch at a time forever, printing ``ack <last span index>`` after each add_spans returns.
``grouped``: the same from 8 concurrent tasks (their writes share commits), one span per call, printing
``ack <span index>`` after each call returns.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from pathlib import Path

from agentlightning.store import SqliteLightningStore
from agentlightning.types import Span


def barrier(ready_dir: str, children: int) -> None:
    """Wait until every child has started, so their claims really race."""
    Path(ready_dir, str(os.getpid())).touch()
    while len(os.listdir(ready_dir)) < children:
        time.sleep(0.005)


async def claim(store: SqliteLightningStore) -> None:
    while (claimed := await store.claim_rollout(f"pid-{os.getpid()}")) is not None:
        print(claimed.rollout.rollout_id, flush=True)
        await asyncio.sleep(0.001)  # a runner works between claims; lets the other processes interleave
    await store.close()


async def spans(db: str, rollout_id: str, attempt_id: str, synchronous: str) -> None:
    store = SqliteLightningStore(db, synchronous="FULL" if synchronous == "FULL" else "NORMAL")
    index = 0
    while True:
        batch = [
            Span(
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                trace_id=f"{1:032x}",
                span_id=f"{index + i + 1:016x}",
                name="durable",
                start_time=index + i,
            )
            for i in range(5)
        ]
        await store.add_spans(batch)
        index += 5
        print(f"ack {index}", flush=True)


async def grouped(db: str, rollout_id: str, attempt_id: str, synchronous: str) -> None:
    store = SqliteLightningStore(db, synchronous="FULL" if synchronous == "FULL" else "NORMAL")

    async def task(first: int) -> None:
        for index in itertools.count(first, 8):
            span = Span(
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                trace_id=f"{1:032x}",
                span_id=f"{index:016x}",
                name="grouped",
                start_time=index,
            )
            await store.add_spans([span])
            print(f"ack {index}", flush=True)

    await asyncio.gather(*(task(first) for first in range(1, 9)))


if __name__ == "__main__":
    if sys.argv[1] == "claim":
        opened = SqliteLightningStore(sys.argv[2])
        barrier(sys.argv[3], int(sys.argv[4]))
        asyncio.run(claim(opened))
    elif sys.argv[1] == "grouped":
        asyncio.run(grouped(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))
    else:
        asyncio.run(spans(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))
