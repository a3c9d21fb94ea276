"""Fixtures: the store app in process (ASGI, no sockets) and on a real loopback port (StoreServer)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI

from agentlightning.server import StoreServer, create_app
from agentlightning.store.memory import InMemoryLightningStore

TOKEN = "s3cret-token"
MAX_BODY = 64 * 1024
MAX_SPANS = 50


@pytest.fixture
def store() -> InMemoryLightningStore:
    """An empty memory store."""
    return InMemoryLightningStore()


@pytest.fixture
def app(store: InMemoryLightningStore) -> FastAPI:
    """The app over ``store`` with small limits, so the limit tests stay cheap."""
    return create_app(store, max_body_bytes=MAX_BODY, max_spans_per_request=MAX_SPANS, max_wait_s=2.0)


@pytest.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to ``app`` in process."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://store") as client:
        yield client


@pytest.fixture
def server(store: InMemoryLightningStore) -> Iterator[StoreServer]:
    """``store`` served on an ephemeral loopback port."""
    with StoreServer(store, max_body_bytes=MAX_BODY, max_spans_per_request=MAX_SPANS, max_wait_s=2.0) as running:
        yield running
