"""A retry after a lost answer and a kill -9 of the store server acts once (issue #26, D1), on SQLite and PostgreSQL.

Each keyed call is made once and its answer thrown away (the lost acknowledgement: the write committed, the client
never heard), the server process is killed with SIGKILL and started again on the same database, and the call is
repeated with the same idempotency key, as the client's retry loop does. The repeat must answer what the first call
answered and change nothing. Span batches carry no key: they are idempotent on (attempt, span id).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.testing.store_server import StoreServerProcess
from agentlightning.types import RolloutRequest
from tests.scale.test_faults import span


async def restart(server: StoreServerProcess) -> None:
    """kill -9 the server and start it again on the same database and port."""
    server.kill9()
    await asyncio.to_thread(server.start)


async def test_every_keyed_call_acts_once_across_a_kill_9(server: StoreServerProcess) -> None:
    server.start()
    client = LightningStoreClient(server.url, max_retries=20, max_backoff_s=0.5)
    try:
        # enqueue
        requests = [RolloutRequest(input={"task": i}) for i in range(2)]
        enqueued = await client.enqueue_rollouts(requests, idempotency_key="enqueue-1")
        await restart(server)
        assert await client.enqueue_rollouts(requests, idempotency_key="enqueue-1") == enqueued
        assert [r.rollout_id for r in await client.query_rollouts()] == [r.rollout_id for r in enqueued]

        # claim and start
        claimed = await client.claim_and_start("runner-1", idempotency_key="claim-1")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await restart(server)
        assert await client.claim_and_start("runner-1", idempotency_key="claim-1") == claimed
        statuses = {r.rollout_id: r.status for r in await client.query_rollouts()}
        assert statuses == {rid: "running", enqueued[1].rollout_id: "queuing"}, "a second rollout was claimed"
        assert [a.attempt_id for a in await client.query_attempts(rid)] == [aid]

        # span batch (idempotent by span id)
        batch = [span(rid, aid, 0, i) for i in range(5)]
        stored = await client.add_spans(batch)
        await restart(server)
        assert await client.add_spans(batch) == stored
        assert [s.sequence_id for s in await client.query_spans(rid)] == [1, 2, 3, 4, 5]

        # finish, with the attempt's last spans
        last = [span(rid, aid, 1, i) for i in range(3)]
        finished = await client.finish_attempt_with_spans(rid, aid, "succeeded", last, idempotency_key="finish-1")
        await restart(server)
        again = await client.finish_attempt_with_spans(rid, aid, "succeeded", last, idempotency_key="finish-1")
        assert again == finished and again.status == "succeeded"  # not 409 for its own committed success
        assert len(await client.query_spans(rid)) == 8

        # a plain finish, and a cancel
        other = await client.claim_and_start("runner-2")
        assert other is not None
        oid = other.rollout.rollout_id
        failed = await client.finish_attempt(oid, other.attempt.attempt_id, "failed", idempotency_key="finish-2")
        await restart(server)
        assert (
            await client.finish_attempt(oid, other.attempt.attempt_id, "failed", idempotency_key="finish-2") == failed
        )
        queued = await client.enqueue_rollout("to cancel")
        cancelled = await client.cancel_rollout(queued.rollout_id, idempotency_key="cancel-1")
        await restart(server)
        assert await client.cancel_rollout(queued.rollout_id, idempotency_key="cancel-1") == cancelled

        # resources
        snapshot = await client.add_resources({}, idempotency_key="resources-1")
        await restart(server)
        assert await client.add_resources({}, idempotency_key="resources-1") == snapshot
        assert [s.version for s in await client.list_resources()] == [1]
    finally:
        await client.close()


async def test_the_http_retry_of_a_lost_answer_replays_it(server: StoreServerProcess) -> None:
    """The wire form: the same ``Idempotency-Key`` header after a restart gets the first body back, byte for byte."""
    server.start()
    headers = {"idempotency-key": "wire-1"}
    body = {"requests": [{"input": "wire"}]}
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        first = await http.post("/v1/rollouts", json=body, headers=headers)
        assert first.status_code == 200
        await restart(server)
        second = await http.post("/v1/rollouts", json=body, headers=headers)
        assert (second.status_code, second.content) == (200, first.content)
        assert len((await http.post("/v1/rollouts/query", json={})).json()) == 1
        too_long = await http.post("/v1/rollouts", json=body, headers={"idempotency-key": "k" * 256})
        assert too_long.status_code == 422 and "idempotency" in too_long.text


@pytest.mark.slow
def test_soak_with_a_kill_9_every_few_seconds_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    """``bench/soak.py``, short: 16 clients, the server killed every 4 s; every check it prints must pass."""
    run = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--seconds", "14", "--kill-every", "4", "--clients", "16"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    checks = [line for line in run.stdout.splitlines() if line.strip().startswith(("ok", "FAIL"))]
    assert len(checks) == 6 and all(line.strip().startswith("ok") for line in checks), run.stdout
    assert "lost or extra items 0, finished twice 0" in run.stdout
