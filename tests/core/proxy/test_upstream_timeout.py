"""A hung upstream: the proxy's timeout answers 504, and an agent that gives up makes the proxy let go of the socket."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentlightning import semconv as sc
from agentlightning.cli import app as cli_app
from agentlightning.proxy import ProxyServer, create_proxy_app
from agentlightning.proxy._transport import LeanHTTPTransport
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import Span

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
# Generous on purpose: the CI machines are shared with training runs; the proxy itself reacts in milliseconds.
SLACK_S = 2.5


class HungUpstream:
    """An upstream on loopback that takes the request and never answers; it sees every socket close (EOF/reset).

    With ``stream_headers`` it first sends the headers of an SSE stream, then no event ever.
    """

    def __init__(self, *, stream_headers: bool = False) -> None:
        self._stream_headers = stream_headers
        self._changed = threading.Condition()
        self.opened = 0
        self.closed_at: list[float] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hung-upstream")
        self._thread.start()
        self._ready.wait(10)
        assert self._server is not None
        self.base_url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    def _run(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.add(writer)
        with self._changed:
            self.opened += 1
            self._changed.notify_all()
        try:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass  # the request's headers; its body, and anything after, is read below until the socket closes
            if self._stream_headers:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                await writer.drain()
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
        finally:
            writer.close()
        with self._changed:
            self.closed_at.append(time.monotonic())
            self._changed.notify_all()

    @property
    def open_sockets(self) -> int:
        """Connections from the proxy that are still up."""
        with self._changed:
            return self.opened - len(self.closed_at)

    def wait_for(self, *, opened: int = 0, closed: int = 0, timeout_s: float) -> bool:
        """Wait until at least ``opened`` connections came and ``closed`` of them went."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self.opened >= opened and len(self.closed_at) >= closed, timeout=timeout_s
            )

    def stop(self) -> None:
        """Close the server and every connection still open."""

        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for writer in self._writers:
                writer.close()  # the handler then reads EOF and ends (cancelling it would log an asyncio error)
            await asyncio.gather(*self._handlers)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def hung() -> Iterator[HungUpstream]:
    upstream = HungUpstream()
    yield upstream
    upstream.stop()


@pytest.fixture
def hung_stream() -> Iterator[HungUpstream]:
    upstream = HungUpstream(stream_headers=True)
    yield upstream
    upstream.stop()


def _attempt(store: InMemoryLightningStore) -> tuple[str, str]:
    async def make() -> tuple[str, str]:
        await store.enqueue_rollout({"task": "t"})
        claimed = await store.claim_rollout("worker")
        assert claimed is not None
        return claimed.rollout.rollout_id, claimed.attempt.attempt_id

    return asyncio.run(make())


def _span(proxy: ProxyServer, store: InMemoryLightningStore, rollout_id: str) -> Span:
    deadline = time.monotonic() + 10
    while True:
        proxy.flush()
        spans = asyncio.run(store.query_spans(rollout_id))
        if spans or time.monotonic() > deadline:
            [span] = spans
            return span
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_upstream_timeout_answers_504_closes_the_socket_and_records_the_span(hung: HungUpstream, stream: bool) -> None:
    store = InMemoryLightningStore()
    with ProxyServer(store, hung.base_url, upstream_timeout_s=1) as proxy:
        rollout_id, attempt_id = _attempt(store)
        started = time.monotonic()
        reply = httpx.post(
            f"{proxy.url_for(rollout_id, attempt_id)}/chat/completions", json={**BODY, "stream": stream}, timeout=30
        )
        elapsed = time.monotonic() - started
        assert reply.status_code == 504
        assert 0.9 < elapsed < 1 + SLACK_S
        error = reply.json()["error"]
        assert error["code"] == "upstream_timeout"
        assert "1 s" in error["message"] and "--upstream-timeout" in error["message"]
        assert hung.wait_for(opened=1, closed=1, timeout_s=SLACK_S), "the proxy kept the hung upstream's socket"
        assert hung.closed_at[0] - started < 1 + SLACK_S
        span = _span(proxy, store, rollout_id)
    assert span.status.code == "ERROR" and "--upstream-timeout" in (span.status.message or "")
    assert span.attributes[sc.ERROR_TYPE] == "upstream_timeout"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_agent_giving_up_closes_the_upstream_socket_at_once(hung: HungUpstream, stream: bool) -> None:
    store = InMemoryLightningStore()
    with ProxyServer(store, hung.base_url) as proxy:  # the default timeout: 600 s
        rollout_id, attempt_id = _attempt(store)
        url = f"{proxy.url_for(rollout_id, attempt_id)}/chat/completions"
        with pytest.raises(httpx.ReadTimeout):
            if stream:
                with httpx.stream("POST", url, json={**BODY, "stream": True}, timeout=0.5) as reply:
                    reply.read()
            else:
                httpx.post(url, json=BODY, timeout=0.5)
        gave_up = time.monotonic()
        assert hung.opened == 1
        assert hung.wait_for(closed=1, timeout_s=SLACK_S), "the proxy kept the hung upstream's socket"
        assert hung.closed_at[0] - gave_up < SLACK_S
        assert hung.open_sockets == 0
        span = _span(proxy, store, rollout_id)
    assert span.status.code == "ERROR" and "disconnected" in (span.status.message or "")
    assert span.attributes[sc.ERROR_TYPE] == "client_disconnected"


def test_agent_giving_up_on_a_silent_stream_closes_the_upstream_socket(hung_stream: HungUpstream) -> None:
    store = InMemoryLightningStore()
    with ProxyServer(store, hung_stream.base_url) as proxy:
        rollout_id, attempt_id = _attempt(store)
        url = f"{proxy.url_for(rollout_id, attempt_id)}/chat/completions"
        with (
            pytest.raises(httpx.ReadTimeout),
            httpx.stream("POST", url, json={**BODY, "stream": True}, timeout=0.5) as reply,
        ):
            assert reply.status_code == 200  # the stream started; no event comes
            reply.read()
        gave_up = time.monotonic()
        assert hung_stream.wait_for(opened=1, closed=1, timeout_s=SLACK_S)
        assert hung_stream.closed_at[0] - gave_up < SLACK_S
        span = _span(proxy, store, rollout_id)
    assert span.status.code == "ERROR" and "disconnected" in (span.status.message or "")


def test_unattributed_calls_let_go_too(hung: HungUpstream) -> None:
    with ProxyServer(InMemoryLightningStore(), hung.base_url, upstream_timeout_s=1) as proxy:
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{proxy.base_url}/models", timeout=0.5)
        assert hung.wait_for(opened=1, closed=1, timeout_s=SLACK_S)
        reply = httpx.post(f"{proxy.base_url}/embeddings", json={"input": "x"}, timeout=30)
        assert reply.status_code == 504 and reply.json()["error"]["code"] == "upstream_timeout"
        assert hung.wait_for(opened=2, closed=2, timeout_s=SLACK_S)


async def test_cancelled_request_closes_its_connection(hung: HungUpstream) -> None:
    transport = LeanHTTPTransport()
    request = httpx.Request("POST", f"{hung.base_url}/chat/completions", content=b"{}")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await transport.handle_async_request(request)
    assert await asyncio.to_thread(hung.wait_for, opened=1, closed=1, timeout_s=SLACK_S)
    await transport.aclose()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_upstream_timeout_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="upstream_timeout_s must be a positive number of seconds"):
        create_proxy_app(InMemoryLightningStore(), "http://127.0.0.1:1/v1", upstream_timeout_s=bad)


def test_cli_rejects_a_non_positive_upstream_timeout() -> None:
    args = ["proxy", "--upstream", "http://127.0.0.1:1/v1", "--store", "http://127.0.0.1:1", "--upstream-timeout", "0"]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 2
    assert "--upstream-timeout" in result.output and "positive" in result.output


def test_a_stream_silent_past_the_timeout_is_cut_and_recorded(hung_stream: HungUpstream) -> None:
    store = InMemoryLightningStore()
    with ProxyServer(store, hung_stream.base_url, upstream_timeout_s=1) as proxy:
        rollout_id, attempt_id = _attempt(store)
        url = f"{proxy.url_for(rollout_id, attempt_id)}/chat/completions"
        with httpx.stream("POST", url, json={**BODY, "stream": True}, timeout=30) as reply:
            assert reply.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):  # the proxy ends the chunked body unfinished
                reply.read()
        assert hung_stream.wait_for(opened=1, closed=1, timeout_s=SLACK_S)
        span = _span(proxy, store, rollout_id)
    assert span.status.code == "ERROR" and "--upstream-timeout" in (span.status.message or "")
    assert span.attributes[sc.ERROR_TYPE] == "upstream_timeout"
