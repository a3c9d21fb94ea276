"""The store conformance suite, unchanged, against ``LightningStoreClient → store server → SQLite``.

The server runs in this process on a loopback port (a background thread), so the SQLite store behind it can read
the suite's fake clock: the time-dependent behaviours are checked over HTTP too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.server import StoreServer
from agentlightning.store import LightningStore, SqliteLightningStore
from tests.core.store.conformance import FakeClock, StoreConformance


class TestStoreOverHttp(StoreConformance):
    """client → server → SQLite passes the shared suite."""

    @pytest.fixture
    async def store(self, clock: FakeClock, tmp_path: Path) -> AsyncIterator[LightningStore]:
        def open_sqlite() -> LightningStore:
            return SqliteLightningStore(tmp_path / "store.db", clock=clock, synchronous="NORMAL")

        with StoreServer(open_sqlite, max_wait_s=5.0) as server:
            client = LightningStoreClient(server.url, long_poll_s=2.0)
            yield client
            await client.close()
