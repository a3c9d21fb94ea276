"""The proxy's own token, its store token, the start-up probe, and dropped spans counted and logged (#26 D4)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentlightning.cli import app as cli_app
from agentlightning.client import LightningStoreClient
from agentlightning.proxy import ProxyServer, serve_proxy
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI

REPO = Path(__file__).resolve().parents[3]
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
PROXY_TOKEN = "proxy-secret"
STORE_TOKEN = "store-secret"


class RecordingUpstream(FakeOpenAI):
    """The fake upstream, remembering the Authorization header of every call it gets."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.authorization: list[str | None] = []
        inner = self.app

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                header = dict(scope["headers"]).get(b"authorization")
                self.authorization.append(None if header is None else header.decode())
            await inner(scope, receive, send)

        self.app = app  # pyright: ignore[reportAttributeAccessIssue]  # any ASGI app serves


async def _attempt(store: InMemoryLightningStore) -> tuple[str, str]:
    await store.enqueue_rollout({"task": "t"})
    claimed = await store.claim_rollout("worker")
    assert claimed is not None
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def test_proxy_token_guards_every_route_but_health_and_never_reaches_the_upstream() -> None:
    store = InMemoryLightningStore()
    upstream = RecordingUpstream()
    rollout_id, attempt_id = asyncio.run(_attempt(store))
    with upstream.serve() as served, ProxyServer(store, served.base_url, token=PROXY_TOKEN) as proxy:
        url = f"{proxy.url_for(rollout_id, attempt_id)}/chat/completions"
        missing = httpx.post(url, json=BODY)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["code"] == "missing_token"
        wrong = httpx.post(url, json=BODY, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "bad_token"
        assert httpx.get(f"{proxy.url}/v1/models").status_code == 401
        assert httpx.get(f"{proxy.url}/metrics").status_code == 401
        assert httpx.get(f"{proxy.url}/health").json() == {"status": "ok"}
        assert upstream.authorization == []  # nothing refused got through

        good = {"authorization": f"Bearer {PROXY_TOKEN}"}
        assert httpx.post(url, json=BODY, headers=good).status_code == 200
        assert upstream.authorization == [None]  # the proxy's token is not the upstream's key
        metrics = httpx.get(f"{proxy.url}/metrics", headers=good).text
        assert "agentlightning_proxy_spans_written_total 1.0" in metrics
        assert "agentlightning_proxy_spans_dropped_total 0.0" in metrics
    assert len(asyncio.run(store.query_spans(rollout_id))) == 1


def test_with_a_proxy_token_the_upstream_gets_only_the_upstream_key() -> None:
    store = InMemoryLightningStore()
    upstream = RecordingUpstream()
    with (
        upstream.serve() as served,
        ProxyServer(store, served.base_url, token=PROXY_TOKEN, upstream_api_key="sk-up") as proxy,
    ):
        answer = httpx.post(
            f"{proxy.base_url}/chat/completions", json=BODY, headers={"authorization": f"Bearer {PROXY_TOKEN}"}
        )
        assert answer.status_code == 200
    assert upstream.authorization == ["Bearer sk-up"]


def test_without_a_proxy_token_the_agents_key_still_goes_upstream() -> None:
    store = InMemoryLightningStore()
    upstream = RecordingUpstream()
    with upstream.serve() as served, ProxyServer(store, served.base_url) as proxy:
        httpx.post(f"{proxy.base_url}/chat/completions", json=BODY, headers={"authorization": "Bearer agent-key"})
    assert upstream.authorization == ["Bearer agent-key"]


def test_a_dropped_span_is_logged_at_error_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryLightningStore()
    rollout_id, attempt_id = asyncio.run(_attempt(store))

    async def reject(spans: Any) -> Any:
        raise ValueError("the store rejects this span")

    store.add_spans = reject  # type: ignore[method-assign]
    with FakeOpenAI().serve() as served, ProxyServer(store, served.base_url) as proxy:
        with caplog.at_level(logging.ERROR, logger="agentlightning.proxy._writer"):
            answer = httpx.post(f"{proxy.url_for(rollout_id, attempt_id)}/chat/completions", json=BODY)
        assert answer.status_code == 200  # the agent's call is not failed by the store
        assert "agentlightning_proxy_spans_dropped_total 1.0" in httpx.get(f"{proxy.url}/metrics").text
    assert [r.levelname for r in caplog.records if "dropped 1 span" in r.getMessage()] == ["ERROR"]


def test_beyond_loopback_the_proxy_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_PROXY_TOKEN", raising=False)
    with pytest.raises(ValueError, match="without a token"):
        serve_proxy(upstream="http://127.0.0.1:9/v1", store=InMemoryLightningStore(), host="0.0.0.0")
    result = CliRunner().invoke(
        cli_app,
        ["proxy", "--upstream", "http://127.0.0.1:9/v1", "--store", "http://127.0.0.1:9", "--host", "0.0.0.0"],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2
    assert "without a token" in result.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _agl_proxy(store_url: str, upstream: str, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "agentlightning.cli", "proxy", "--store", store_url, "--upstream", upstream]
    return subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "core"), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_agl_proxy_probes_a_token_store_and_writes_with_the_store_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLIGHTNING_TOKEN", raising=False)
    store = InMemoryLightningStore()
    with StoreServer(store, token=STORE_TOKEN) as server, FakeOpenAI().serve() as upstream:
        # No store token: one line and exit 1 before serving, not a 200 to the agent and every span dropped.
        refused = _agl_proxy(server.url, upstream.base_url, _free_port(), {})
        output, _ = refused.communicate(timeout=60)
        assert refused.returncode == 1, output
        assert "Traceback" not in output and "store token" in output, output

        port = _free_port()
        proxy = _agl_proxy(server.url, upstream.base_url, port, {"AGENTLIGHTNING_TOKEN": STORE_TOKEN})
        try:
            client = LightningStoreClient(server.url, token=STORE_TOKEN)

            async def attempt() -> tuple[str, str]:
                await client.enqueue_rollout({"task": "t"})
                claimed = await client.claim_rollout("worker")
                assert claimed is not None
                return claimed.rollout.rollout_id, claimed.attempt.attempt_id

            rollout_id, attempt_id = asyncio.run(attempt())
            url = f"http://127.0.0.1:{port}/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"
            deadline = time.monotonic() + 30
            while True:
                try:
                    answer = httpx.post(url, json=BODY, timeout=10)
                    break
                except httpx.TransportError:
                    assert proxy.poll() is None and time.monotonic() < deadline, "agl proxy did not start"
                    time.sleep(0.1)
            assert answer.status_code == 200
            spans = asyncio.run(store.query_spans(rollout_id))
            assert [s.attributes.get("gen_ai.request.model") for s in spans] == ["m"]
        finally:
            proxy.terminate()
            proxy.communicate(timeout=30)


def test_the_store_client_takes_its_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLIGHTNING_TOKEN", "from-env")
    assert LightningStoreClient("http://127.0.0.1:9").token == "from-env"
    assert LightningStoreClient("http://127.0.0.1:9", token="given").token == "given"
    assert LightningStoreClient("http://127.0.0.1:9", token="").token is None
