"""/metrics in Prometheus text format, /health, and the rules for starting a server (loopback or token)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentlightning.server import StoreServer, create_app, serve_store
from agentlightning.server._run import resolve_token
from agentlightning.store.memory import InMemoryLightningStore


async def test_metrics_parse_and_count(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    await api.post("/v1/rollouts", json={"requests": [{"input": 1}, {"input": 2}]})
    claimed = (await api.post("/v1/rollouts/claim", json={})).json()
    span = {
        "rollout_id": claimed["rollout"]["rollout_id"],
        "attempt_id": claimed["attempt"]["attempt_id"],
        "trace_id": "cd" * 16,
        "span_id": "00000000000000aa",
        "name": "chat",
        "start_time": 1,
    }
    await api.post("/v1/spans", json={"spans": [span]})
    await api.get("/v1/rollouts/ro-unknown")
    response = await api.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    depth = {s.labels["status"]: s.value for s in families["agentlightning_store_rollouts"].samples}
    assert depth["queuing"] == 1 and depth["preparing"] == 1 and depth["succeeded"] == 0
    ingested = {
        s.labels["source"]: s.value
        for s in families["agentlightning_spans_ingested"].samples
        if s.name.endswith("_total")
    }
    assert ingested == {"rest": 1.0, "otlp": 0.0, "otlp-logs": 0.0}
    latency = families["agentlightning_http_request_duration_seconds"]
    routes = {s.labels["route"] for s in latency.samples if s.name.endswith("_count")}
    assert {"/v1/rollouts", "/v1/spans", "/v1/rollouts/{rollout_id}"} <= routes
    statuses = {
        (s.labels["route"], s.labels["status"])
        for s in families["agentlightning_http_responses"].samples
        if s.name.endswith("_total")
    }
    assert ("/v1/rollouts/{rollout_id}", "404") in statuses


def test_many_apps_in_one_process() -> None:
    # Each app has its own registry: a second app must not clash with the first's metric names.
    apps = [create_app(InMemoryLightningStore()) for _ in range(3)]
    assert len({id(a.state.metrics.registry) for a in apps}) == 3


def test_health_is_open(store: InMemoryLightningStore) -> None:
    with StoreServer(store, token="t") as running:
        health = httpx.get(f"{running.url}/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert httpx.get(f"{running.url}/v1/statistics").status_code == 401


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "store.example.com"])
def test_non_loopback_without_token_is_refused(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLIGHTNING_TOKEN", raising=False)
    with pytest.raises(ValueError, match="without a token"):
        serve_store(backend="memory", host=host, port=1)
    with pytest.raises(ValueError, match="AGENTLIGHTNING_TOKEN"):
        StoreServer(InMemoryLightningStore(), host=host)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_token(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLIGHTNING_TOKEN", raising=False)
    assert resolve_token(host, None) is None


def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLIGHTNING_TOKEN", "from-env")
    assert resolve_token("0.0.0.0", None) == "from-env"
    assert resolve_token("0.0.0.0", "explicit") == "explicit"


def test_unknown_backend_is_explained() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        serve_store(backend="mongo", port=1)


def test_store_server_port_zero_gets_a_real_port(store: InMemoryLightningStore) -> None:
    with StoreServer(store) as running:
        assert running.port > 0 and running.url.endswith(f":{running.port}")
        url = running.url
        assert httpx.get(f"{url}/health").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")


def test_serve_store_prints_url_and_serves_sqlite(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    db = tmp_path / "nested" / "store.db"
    code = f"from agentlightning.server import serve_store; serve_store(path={str(db)!r}, port={port}, token='t')"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line and "token required" in line
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/v1/statistics", headers={"authorization": "Bearer t"})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve_store did not start listening"
                time.sleep(0.05)
        assert response.json()["total_rollouts"] == 0
        assert db.exists()  # the parent folder was created
    finally:
        child.terminate()
        assert child.wait(timeout=20) == 0  # SIGTERM: uvicorn drains, the store is closed, exit 0
        if child.stdout is not None:
            child.stdout.close()
