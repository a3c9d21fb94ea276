"""LightningStoreClient: error types, retries with backoff, idempotent retries, many loops and threads."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import pytest

from agentlightning.client import LightningStoreClient, StoreUnavailableError
from agentlightning.server import StoreServer, create_app
from agentlightning.store.base import IllegalTransitionError, NotFoundError, StoreStatistics
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.store.sync import SyncLightningStore
from agentlightning.types import RolloutRequest
from tests.core.server.conftest import TOKEN


async def test_errors_carry_the_store_type_and_message(server: StoreServer) -> None:
    client = LightningStoreClient(server.url)
    try:
        with pytest.raises(NotFoundError, match="ro-nope"):
            await client.get_rollout("ro-nope")
        with pytest.raises(NotFoundError, match="no route"):
            await client.get_rollout("")
        with pytest.raises(NotFoundError):
            await client.query_attempts("a/b")  # ids are quoted: a slash cannot reach another operation
        with pytest.raises(NotFoundError):
            await client.get_resources("rs-nope")
        rollout = await client.enqueue_rollout("task")
        claimed = await client.claim_rollout("w")
        assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
        await client.finish_attempt(rollout.rollout_id, claimed.attempt.attempt_id, "succeeded")
        with pytest.raises(IllegalTransitionError):
            await client.start_attempt(rollout.rollout_id, claimed.attempt.attempt_id)
        with pytest.raises(ValueError, match="retry_on"):
            await client.enqueue_rollout("x", retry_on=("succeeded",))
        spans = await client.query_spans(rollout.rollout_id, "latest")
        assert spans == []
    finally:
        await client.close()


async def test_token_is_sent_and_refusals_explain(store: InMemoryLightningStore) -> None:
    with StoreServer(store, token=TOKEN) as running:
        good = LightningStoreClient(running.url, token=TOKEN)
        missing = LightningStoreClient(running.url)
        wrong = LightningStoreClient(running.url, token="nope")
        try:
            assert (await good.statistics()).total_rollouts == 0
            with pytest.raises(PermissionError, match="bearer token"):
                await missing.statistics()
            with pytest.raises(PermissionError, match="not valid"):
                await wrong.enqueue_rollout(1)
        finally:
            for client in (good, missing, wrong):
                await client.close()
    assert (await store.statistics()).total_rollouts == 0


async def test_unreachable_server_fails_after_retries() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = LightningStoreClient(f"http://127.0.0.1:{port}", max_retries=2, backoff_s=0.01)
    try:
        with pytest.raises(StoreUnavailableError, match="after 3 tries"):
            await client.statistics()
    finally:
        await client.close()


class _FlakyStore(InMemoryLightningStore):
    """Fails the first ``failures`` statistics calls, as a store whose database is briefly locked would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    async def statistics(self) -> StoreStatistics:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("database is locked")
        return await super().statistics()


async def test_5xx_is_retried_with_backoff_4xx_is_not() -> None:
    store = _FlakyStore(failures=2)
    app = create_app(store)
    client = LightningStoreClient(
        "http://store", backoff_s=0.01, transport_factory=lambda: httpx.ASGITransport(app=app)
    )
    try:
        assert (await client.statistics()).total_rollouts == 0
        assert store.calls == 3
        store.failures, store.calls = 10, 0
        with pytest.raises(StoreUnavailableError, match="HTTP 500"):
            await client.statistics()
        assert store.calls == client.max_retries + 1
    finally:
        await client.close()


class _LosingTransport(httpx.AsyncBaseTransport):
    """Delivers each request but loses the first answer of every POST, like a connection dropped mid-response."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.lost: set[str] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        key = request.headers.get("idempotency-key")
        if request.method == "POST" and key is not None and key not in self.lost:
            self.lost.add(key)
            await response.aread()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


async def test_retried_writes_act_once(store: InMemoryLightningStore) -> None:
    app = create_app(store)
    client = LightningStoreClient(
        "http://store", backoff_s=0.01, transport_factory=lambda: _LosingTransport(httpx.ASGITransport(app=app))
    )
    try:
        rollouts = await client.enqueue_rollouts([RolloutRequest(input=i) for i in range(3)])
        assert (await store.statistics()).total_rollouts == 3
        claimed = await client.claim_rollout("w")
        assert claimed is not None and claimed.rollout.rollout_id == rollouts[0].rollout_id
        assert (await store.statistics()).rollouts_by_status["queuing"] == 2  # one claim, not two
        ids = (claimed.rollout.rollout_id, claimed.attempt.attempt_id)
        assert (await client.start_attempt(*ids)).status == "running"  # the retry does not hit 409
        assert (await client.finish_attempt(*ids, "succeeded")).status == "succeeded"
        assert (await client.cancel_rollout(rollouts[1].rollout_id)).status == "cancelled"
    finally:
        await client.close()


async def test_long_poll_claim_and_wait(server: StoreServer, store: InMemoryLightningStore) -> None:
    client = LightningStoreClient(server.url, long_poll_s=0.3)  # several polls per call
    try:
        assert await client.claim_rollout("w", timeout_s=0.4) is None
        waiting = asyncio.ensure_future(client.claim_rollout("w", timeout_s=5))
        await asyncio.sleep(0.5)
        rollout = await store.enqueue_rollout("late")
        claimed = await waiting
        assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
        waiter = asyncio.ensure_future(client.wait_for_rollouts([rollout.rollout_id], timeout_s=5))
        await asyncio.sleep(0.5)
        assert not waiter.done()
        await store.finish_attempt(rollout.rollout_id, claimed.attempt.attempt_id, "failed", error="boom")
        (done,) = await waiter
        assert done.status == "failed"
        assert await client.wait_for_rollouts([], timeout_s=1) == []
    finally:
        await client.close()


def test_usable_from_many_threads_and_loops(server: StoreServer) -> None:
    client = LightningStoreClient(server.url)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        async def run() -> None:
            for i in range(5):
                await client.enqueue_rollout({"worker": n, "i": i})

        try:
            asyncio.run(run())  # each thread: its own loop, its own pool, closed when the loop ends
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with SyncLightningStore(client) as sync:
        assert sync.statistics().total_rollouts == 20
        assert len(sync.query_rollouts(limit=7)) == 7


async def test_first_calls_racing_share_one_pool(server: StoreServer) -> None:
    client = LightningStoreClient(server.url)
    try:
        await asyncio.gather(*(client.statistics() for _ in range(8)))
        assert len(client._clients) == 1  # pyright: ignore[reportPrivateUsage] -- the per-loop pool registry
    finally:
        await client.close()
    assert client._clients == {}  # pyright: ignore[reportPrivateUsage]
